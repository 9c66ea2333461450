//! `peerlink compare`: two `bench --json` documents side by side, test by test.
//!
//! Made for the questions a second run raises: how far a simulator preset (say, one `tune
//! --export-sim` wrote) is from the machine it was calibrated on, or whether today's run of a host
//! moved from yesterday's. Every figure the two documents share is paired — a matrix cell by its
//! (source, destination), a per-GPU value by its GPU, a sweep point by its test, pair and size —
//! and reported as the second over the first.

use super::table::plain;
use crate::bench::stats::median;
use crate::units::format_bytes;
use crate::{Error, Result};
use comfy_table::CellAlignment;
use serde::Serialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::fmt::Write;

/// JSON schema name of the `compare` document.
pub const SCHEMA: &str = "peerlink.compare/1";
/// What `compare` reads.
const BENCH_SCHEMA: &str = "peerlink.bench/1";

/// One figure both documents hold.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Pair {
    /// The test and its message size (`ce-write 64 MiB`), or `<test> sweep` for a sweep point.
    pub test: String,
    pub unit: String,
    /// `0→1`, `GPU 0`, or `0→1 4 KiB` for a sweep point.
    pub place: String,
    pub base: f64,
    pub other: f64,
}

impl Pair {
    /// other / base.
    pub fn ratio(&self) -> f64 {
        self.other / self.base
    }
}

/// Everything paired, in the first document's order, and what only one of them has.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Comparison {
    pub base_source: String,
    pub other_source: String,
    pub pairs: Vec<Pair>,
    /// Tests (at their sizes) and sweeps in only one of the two documents.
    pub unmatched: Vec<String>,
}

/// Pairs every figure of two `bench --json` documents; `name_*` say which file each came from.
pub fn compare(
    base: &Value,
    other: &Value,
    name_base: &str,
    name_other: &str,
) -> Result<Comparison> {
    for (doc, name) in [(base, name_base), (other, name_other)] {
        if doc["schema"] != BENCH_SCHEMA {
            return Err(Error::usage(format!(
                "{name} is not a `peerlink bench --json` document (schema {}, expected \
                 {BENCH_SCHEMA})",
                doc["schema"]
            )));
        }
    }
    let (base_figures, other_figures) = (figures(base), figures(other));
    // An eight-GPU run holds thousands of sweep points: look each up, don't scan for it.
    let other_values: HashMap<&(String, String), f64> = other_figures
        .iter()
        .map(|(key, (_, value))| (key, *value))
        .collect();
    let pairs = base_figures
        .iter()
        .filter_map(|(key, (unit, value))| {
            other_values.get(key).map(|&other| Pair {
                test: key.0.clone(),
                unit: unit.clone(),
                place: key.1.clone(),
                base: *value,
                other,
            })
        })
        .collect();
    let tests = |figures: &[Key]| -> Vec<String> {
        let mut names: Vec<String> = figures.iter().map(|((test, _), _)| test.clone()).collect();
        names.dedup();
        names
    };
    let (base_tests, other_tests) = (tests(&base_figures), tests(&other_figures));
    let unmatched = base_tests
        .iter()
        .filter(|t| !other_tests.contains(t))
        .map(|t| format!("{t} (only in {name_base})"))
        .chain(
            other_tests
                .iter()
                .filter(|t| !base_tests.contains(t))
                .map(|t| format!("{t} (only in {name_other})")),
        )
        .collect();
    Ok(Comparison {
        base_source: base["source"].as_str().unwrap_or("unknown").to_string(),
        other_source: other["source"].as_str().unwrap_or("unknown").to_string(),
        pairs,
        unmatched,
    })
}

/// ((test, place), (unit, value)) of one document, in its order.
type Key = ((String, String), (String, f64));

fn figures(doc: &Value) -> Vec<Key> {
    let mut out = Vec::new();
    for test in doc["tests"].as_array().into_iter().flatten() {
        // A test at another message size is another figure: pair like with like only.
        let name = match test["size_bytes"].as_u64() {
            Some(bytes) => format!(
                "{} {}",
                test["name"].as_str().unwrap_or_default(),
                format_bytes(bytes)
            ),
            None => test["name"].as_str().unwrap_or_default().to_string(),
        };
        let unit = test["unit"].as_str().unwrap_or_default().to_string();
        for cell in test["cells"].as_array().into_iter().flatten() {
            let Some(value) = cell["value"].as_f64() else {
                continue;
            };
            let place = match (
                cell["src"].as_u64(),
                cell["dst"].as_u64(),
                cell["device"].as_u64(),
            ) {
                (Some(s), Some(d), _) => format!("{s}→{d}"),
                (_, _, Some(g)) => format!("GPU {g}"),
                _ => continue,
            };
            out.push(((name.clone(), place), (unit.clone(), value)));
        }
    }
    for sweep in doc["sweeps"].as_array().into_iter().flatten() {
        let name = format!("{} sweep", sweep["test"].as_str().unwrap_or_default());
        let (src, dst) = (sweep["src"].as_u64(), sweep["dst"].as_u64());
        let (Some(src), Some(dst)) = (src, dst) else {
            continue;
        };
        for point in sweep["points"].as_array().into_iter().flatten() {
            if let (Some(bytes), Some(us)) = (point["bytes"].as_u64(), point["median_us"].as_f64())
            {
                let place = format!("{src}→{dst} {}", format_bytes(bytes));
                out.push(((name.clone(), place), ("us".to_string(), us)));
            }
        }
    }
    out
}

/// The paired figures of one test: how many, the median ratio, the one furthest from 1.
struct Summary<'a> {
    test: &'a str,
    unit: &'a str,
    count: usize,
    median: f64,
    worst: &'a Pair,
}

fn summaries(c: &Comparison) -> Vec<Summary<'_>> {
    let mut out: Vec<Summary<'_>> = Vec::new();
    let mut start = 0;
    while start < c.pairs.len() {
        let test = &c.pairs[start].test;
        let end = start
            + c.pairs[start..]
                .iter()
                .take_while(|p| &p.test == test)
                .count();
        let group = &c.pairs[start..end];
        let ratios: Vec<f64> = group.iter().map(Pair::ratio).collect();
        let distance = |p: &Pair| p.ratio().max(1.0 / p.ratio());
        out.push(Summary {
            test,
            unit: &group[0].unit,
            count: group.len(),
            median: median(&ratios).expect("a group has a pair"),
            worst: group
                .iter()
                .max_by(|a, b| distance(a).total_cmp(&distance(b)))
                .expect("a group has a pair"),
        });
        start = end;
    }
    out
}

/// The `compare --json` document.
pub fn json(c: &Comparison) -> Value {
    let tests: Vec<Value> = summaries(c)
        .iter()
        .map(|s| {
            json!({
                "test": s.test,
                "unit": s.unit,
                "paired": s.count,
                "median_ratio": s.median,
                "worst": {"place": s.worst.place, "base": s.worst.base, "other": s.worst.other,
                          "ratio": s.worst.ratio()},
            })
        })
        .collect();
    json!({
        "schema": SCHEMA,
        "source": c.other_source,
        "base_source": c.base_source,
        "tests": tests,
        "pairs": c.pairs.iter().map(|p| json!({
            "test": p.test, "unit": p.unit, "place": p.place, "base": p.base, "other": p.other,
            "ratio": p.ratio(),
        })).collect::<Vec<_>>(),
        "unmatched": c.unmatched,
    })
}

/// One row per test: the median ratio and the figure furthest from the base.
pub fn text(c: &Comparison, name_base: &str, name_other: &str) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{name_other} ({}) against {name_base} ({}): other / base per figure\n",
        c.other_source, c.base_source
    );
    let mut table = plain(
        [
            "test",
            "unit",
            "paired",
            "median ratio",
            "furthest",
            "base",
            "other",
            "ratio",
        ]
        .map(String::from)
        .to_vec(),
    );
    for s in summaries(c) {
        table.add_row(vec![
            s.test.to_string(),
            s.unit.to_string(),
            s.count.to_string(),
            format!("{:.3}", s.median),
            s.worst.place.clone(),
            format!("{:.2}", s.worst.base),
            format!("{:.2}", s.worst.other),
            format!("{:.3}", s.worst.ratio()),
        ]);
    }
    for column in table.column_iter_mut().skip(2) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "{table}");
    if !c.unmatched.is_empty() {
        let _ = writeln!(out, "\nnot compared: {}", c.unmatched.join(", "));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn doc(source: &str, write: [f64; 4], h2d: f64, sweep_us: f64) -> Value {
        json!({
            "schema": BENCH_SCHEMA,
            "source": source,
            "tests": [
                {"name": "ce-write", "unit": "GB/s", "size_bytes": 1 << 20, "cells": [
                    {"src": 0, "dst": 0, "value": write[0]}, {"src": 0, "dst": 1, "value": write[1]},
                    {"src": 1, "dst": 0, "value": write[2]}, {"src": 1, "dst": 1, "value": write[3]},
                ]},
                {"name": "h2d", "unit": "GB/s", "size_bytes": 1 << 20,
                 "cells": [{"device": 0, "value": h2d}]},
            ],
            "sweeps": [{"test": "ce-write", "src": 0, "dst": 1,
                        "points": [{"bytes": 4096, "median_us": sweep_us}]}],
        })
    }

    #[test]
    fn every_shared_figure_is_paired_and_summarised_per_test() {
        let real = doc("cuda", [2000.0, 400.0, 400.0, 2000.0], 55.0, 8.0);
        let sim = doc("sim:exported", [2000.0, 360.0, 420.0, 2000.0], 55.0, 6.0);
        let c = compare(&real, &sim, "real.json", "sim.json").unwrap();
        assert_eq!(c.pairs.len(), 6);
        assert!(c.unmatched.is_empty());
        let s = summaries(&c);
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].test, s[0].count), ("ce-write 1 MiB", 4));
        // The furthest figure from the base, whichever way: 360/400 = 0.9 against 420/400.
        assert_eq!(s[0].worst.place, "0→1");
        assert!((s[0].worst.ratio() - 0.9).abs() < 1e-12);
        assert_eq!(
            (s[1].test, s[1].worst.place.as_str()),
            ("h2d 1 MiB", "GPU 0")
        );
        assert_eq!(s[2].test, "ce-write sweep");
        assert_eq!(s[2].worst.place, "0→1 4 KiB");
        assert!((s[2].median - 0.75).abs() < 1e-12);
        let doc = json(&c);
        assert_eq!(doc["schema"], SCHEMA);
        assert_eq!(doc["source"], "sim:exported");
        assert_eq!(doc["pairs"].as_array().unwrap().len(), 6);
        assert!(text(&c, "real.json", "sim.json").contains("ce-write sweep"));
    }

    #[test]
    fn tests_in_one_document_only_are_named_and_other_documents_refused() {
        let mut base = doc("cuda", [1.0; 4], 1.0, 1.0);
        base["tests"].as_array_mut().unwrap().push(json!({
            "name": "ping-pong", "unit": "us", "cells": [{"src": 0, "dst": 1, "value": 1.7}],
        }));
        let mut other = doc("cuda", [1.0; 4], 1.0, 1.0);
        // The same test at another size is not the same figure.
        other["tests"][1]["size_bytes"] = json!(8 << 20);
        let c = compare(&base, &other, "a", "b").unwrap();
        assert_eq!(
            c.unmatched,
            [
                "h2d 1 MiB (only in a)",
                "ping-pong (only in a)",
                "h2d 8 MiB (only in b)"
            ]
        );
        let topo = json!({"schema": "peerlink.topo/1", "source": "cuda"});
        let err = compare(&base, &topo, "a", "topo.json").unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("topo.json is not"), "{err}");
    }
}
