//! `peerlink compare`: two bench documents side by side, figure by figure, and the
//! `peerlink.compare/1` document that says how far apart they are.
//!
//! Made for the questions a second run raises: how far a simulator preset (say, one `tune
//! --export-sim` wrote) is from the machine it was calibrated on, or whether today's run of a host
//! moved from yesterday's. Every figure the two documents share is paired — a matrix cell by its
//! (source, destination), a per-GPU value by its GPU, a sweep point by its test, pair and size —
//! and reported as the second over the first.

use super::document::BenchDocument;
use super::result::Unit;
use super::stats::median;
use crate::document::{impl_document, Header};
use crate::topology::{Source, MAX_GPUS};
use crate::units::{format_bytes, shown_figure, LARGEST_FIGURE};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};

/// One figure both documents hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Pair {
    /// The test and its message size (`ce-write 64 MiB`), or `<test> sweep` for a sweep point.
    pub test: String,
    pub unit: Unit,
    /// `0→1`, `GPU 0`, or `0→1 4 KiB` for a sweep point.
    pub place: String,
    pub base: f64,
    pub other: f64,
    /// other / base.
    pub ratio: f64,
}

impl Pair {
    fn new(test: &str, unit: Unit, place: &str, base: f64, other: f64) -> Pair {
        Pair {
            test: test.to_string(),
            unit,
            place: place.to_string(),
            base,
            other,
            ratio: other / base,
        }
    }

    /// How far the ratio is from 1, either way.
    fn distance(&self) -> f64 {
        self.ratio.max(1.0 / self.ratio)
    }

    /// How the figure is named in a sentence: `ce-write 512 MiB 0→1 (×0.901)`.
    pub fn named(&self) -> String {
        format!("{} {} (×{:.3})", self.test, self.place, self.ratio)
    }
}

/// Everything paired, in the first document's order, and what only one of them has.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    /// The two files as the user named them: the base, then the compared one.
    pub files: (String, String),
    pub base_source: Source,
    /// The compared document's header: the comparison's is made from it.
    pub other: Header,
    pub pairs: Vec<Pair>,
    /// Tests (at their sizes) and sweeps in only one of the two documents.
    pub unmatched: Vec<String>,
}

/// The paired figures of one test: how many, the median ratio, the one furthest from 1.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct TestSummary {
    pub test: String,
    pub unit: Unit,
    /// Figures paired.
    pub paired: usize,
    pub median_ratio: f64,
    /// The figure furthest from the base, whichever way.
    pub worst: Furthest,
}

/// The figure of a test furthest from the base.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Furthest {
    pub place: String,
    pub base: f64,
    pub other: f64,
    pub ratio: f64,
}

/// `compare --threshold`: how far a figure may move, and the figures that moved further.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Threshold {
    /// How far, in percent of the base figure, either way.
    pub pct: f64,
    /// The paired figures whose ratio is further than that from 1.
    pub beyond: Vec<Pair>,
}

/// Two bench documents compared: per test the median ratio and the furthest figure, then every
/// paired figure. The header's `source` (and GPUs) are the compared document's.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CompareDocument {
    #[serde(flatten)]
    pub header: Header,
    /// The source of the document compared against.
    pub base_source: Source,
    pub tests: Vec<TestSummary>,
    pub pairs: Vec<Pair>,
    pub unmatched: Vec<String>,
    /// With `--threshold` only.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<Threshold>,
    /// The two files as the user named them (the base, then the compared one): the text says
    /// them; the JSON has never held them, so they are not read back.
    #[serde(skip)]
    #[schemars(skip)]
    pub files: (String, String),
}

impl_document!(CompareDocument, "peerlink.compare/1");

impl CompareDocument {
    /// The document of comparison `c`, with the figures beyond `threshold_pct` where one is given.
    pub fn new(c: &Comparison, threshold_pct: Option<f64>) -> CompareDocument {
        CompareDocument {
            header: Header::after(<Self as crate::document::Document>::SCHEMA, &c.other),
            base_source: c.base_source.clone(),
            tests: c.summaries(),
            pairs: c.pairs.clone(),
            unmatched: c.unmatched.clone(),
            threshold: threshold_pct.map(|pct| Threshold {
                pct,
                beyond: c.beyond(pct).into_iter().cloned().collect(),
            }),
            files: c.files.clone(),
        }
    }
}

/// Pairs every figure of two bench documents; `name_*` say which file each came from.
pub fn compare(
    base: &BenchDocument,
    other: &BenchDocument,
    name_base: &str,
    name_other: &str,
) -> Comparison {
    let (base_figures, other_figures) = (figures(base), figures(other));
    // An eight-GPU run holds thousands of sweep points: look each up, don't scan for it.
    let other_values: HashMap<(&str, &str), f64> = other_figures
        .iter()
        .map(|f| ((f.test.as_str(), f.place.as_str()), f.value))
        .collect();
    let pairs = base_figures
        .iter()
        .filter_map(|f| {
            other_values
                .get(&(f.test.as_str(), f.place.as_str()))
                .map(|&other| Pair::new(&f.test, f.unit, &f.place, f.value, other))
        })
        .collect();
    let tests = |figures: &[Figure]| -> Vec<String> {
        let mut names: Vec<String> = figures.iter().map(|f| f.test.clone()).collect();
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
    Comparison {
        files: (name_base.to_string(), name_other.to_string()),
        base_source: base.header.source.clone(),
        other: other.header.clone(),
        pairs,
        unmatched,
    }
}

/// The bench document in `text` as `compare` takes it: JSON of the bench schema whose every figure
/// could have been measured; else a usage error (exit 2) that starts with `name`.
pub fn bench_input(text: &str, name: &str) -> crate::Result<BenchDocument> {
    read_bench(text, name, "two `peerlink bench --json` outputs")
}

/// The bench document in `text`, as [`bench_input`] reads it; the usage error says to give `wanted`.
pub fn read_bench(text: &str, name: &str, wanted: &str) -> crate::Result<BenchDocument> {
    let doc: BenchDocument = crate::document::read(text)
        .map_err(|why| crate::Error::usage(format!("{name} is {why}; give {wanted}")))?;
    check_figures(&doc).map_err(|why| {
        crate::Error::usage(format!(
            "{name} {why}; give {wanted} as peerlink wrote them"
        ))
    })?;
    Ok(doc)
}

/// Ok where every figure of `doc` could have been measured (within [`plausible`] for its unit,
/// between GPUs the document lists, of at most [`MAX_GPUS`] GPUs); else which one could not, as
/// a sentence's end.
pub fn check_figures(doc: &BenchDocument) -> Result<(), String> {
    if doc.results.devices.len() > MAX_GPUS {
        return Err(format!(
            "lists {} GPUs, and a host has at most {MAX_GPUS}",
            doc.results.devices.len()
        ));
    }
    let listed: HashSet<usize> = doc.results.devices.iter().copied().collect();
    let places = doc
        .results
        .tests
        .iter()
        .flat_map(|t| t.cells.iter().map(|c| (t.name.as_str(), c.place.pair())))
        .chain(
            doc.results
                .sweeps
                .iter()
                .map(|s| (s.test.as_str(), (s.src, s.dst))),
        );
    for (test, (src, dst)) in places {
        if let Some(gpu) = [src, dst].into_iter().find(|g| !listed.contains(g)) {
            return Err(format!(
                "holds a {test} figure of GPU {src} → GPU {dst}, but GPU {gpu} is not among its \
                 `devices`"
            ));
        }
    }
    let implausible = |f: &Figure| {
        let (least, most) = plausible(f.unit);
        !(f.value >= least && f.value < most)
    };
    match figures(doc).into_iter().find(implausible) {
        None => Ok(()),
        Some(f) => {
            let (least, most) = plausible(f.unit);
            Err(format!(
                "holds {} = {} {} at {}, which no measurement gives (a figure in {} is from \
                 {least:e} to below {most:e})",
                f.test,
                shown_figure(f.value),
                f.unit.name(),
                f.place,
                f.unit.name()
            ))
        }
    }
}

/// The figures a measurement can give in `unit`, from the first up to the second: rates from
/// 1 B/s (1e-9 GB/s) to 1 EB/s (1e9 GB/s: a thousand simulated GPUs at the fastest rate a preset
/// may give, both ways), times from a picosecond to [`LARGEST_FIGURE`] µs (eleven days).
pub fn plausible(unit: Unit) -> (f64, f64) {
    match unit {
        Unit::Gbps => (1e-9, 1e9),
        Unit::Micros => (1e-6, LARGEST_FIGURE),
        Unit::Nanos => (1e-3, LARGEST_FIGURE * 1e3),
    }
}

/// One figure of a document: which test, where, in what unit.
struct Figure {
    test: String,
    place: String,
    unit: Unit,
    value: f64,
}

/// Every figure of a document, in its order.
fn figures(doc: &BenchDocument) -> Vec<Figure> {
    let mut out = Vec::new();
    for test in &doc.results.tests {
        // A test at another message size is another figure: pair like with like only.
        let name = format!("{} {}", test.name, format_bytes(test.size_bytes));
        for cell in &test.cells {
            out.push(Figure {
                test: name.clone(),
                place: cell.place.to_string(),
                unit: test.unit,
                value: cell.value,
            });
        }
    }
    for sweep in &doc.results.sweeps {
        let name = format!("{} sweep", sweep.test);
        for point in &sweep.points {
            out.push(Figure {
                test: name.clone(),
                place: format!("{}→{} {}", sweep.src, sweep.dst, format_bytes(point.bytes)),
                unit: Unit::Micros,
                value: point.median_us,
            });
        }
    }
    out
}

impl Comparison {
    /// Ok where the two documents share at least one figure; else the usage error (exit 2) that
    /// says they share none, `name_*` naming them: a comparison of nothing says nothing.
    pub fn check_paired(&self, name_base: &str, name_other: &str) -> crate::Result<()> {
        if !self.pairs.is_empty() {
            return Ok(());
        }
        Err(crate::Error::usage(format!(
            "{name_base} and {name_other} share no figure (no test at the same message size on the \
             same GPU or pair), so there is nothing to compare: run both with the same --tests, \
             --size and --devices (on the simulator, `bench --size plateau` takes a GPU's default \
             sizes)"
        )))
    }

    /// The paired figures that moved by more than `pct` percent of the base figure, either way.
    pub fn beyond(&self, pct: f64) -> Vec<&Pair> {
        self.pairs
            .iter()
            .filter(|p| (p.ratio - 1.0).abs() * 100.0 > pct)
            .collect()
    }

    /// One summary per test, in the first document's order.
    pub fn summaries(&self) -> Vec<TestSummary> {
        self.pairs
            .chunk_by(|a, b| a.test == b.test)
            .map(|group| {
                let ratios: Vec<f64> = group.iter().map(|p| p.ratio).collect();
                let worst = group
                    .iter()
                    .max_by(|a, b| a.distance().total_cmp(&b.distance()))
                    .expect("a group has a pair");
                TestSummary {
                    test: group[0].test.clone(),
                    unit: group[0].unit,
                    paired: group.len(),
                    median_ratio: median(&ratios).expect("a group has a pair"),
                    worst: Furthest {
                        place: worst.place.clone(),
                        base: worst.base,
                        other: worst.other,
                        ratio: worst.ratio,
                    },
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::result::{BenchReport, Cell, Place, Sweep, SweepPoint, TestResult};
    use crate::bench::stats::Stats;
    use crate::bench::timing::Sampling;
    use crate::topology::Topology;

    fn test(name: &str, size_bytes: u64, cells: Vec<(Place, f64)>) -> TestResult {
        let time_us = Stats::of(&[1.0]).unwrap();
        TestResult {
            wall_s: 0.0,
            name: name.into(),
            unit: Unit::Gbps,
            size_bytes,
            measures: String::new(),
            matrix: None,
            total_matrix: None,
            values: None,
            cells: cells
                .into_iter()
                .map(|(place, value)| Cell {
                    place,
                    value,
                    total: None,
                    time_us,
                })
                .collect(),
            not_measured: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn doc(source: &str, write: [f64; 4], h2d: f64, sweep_us: f64) -> BenchDocument {
        let pair = |src, dst| Place::Pair { src, dst };
        let host = Topology {
            source: source.parse().unwrap(),
            driver_version: None,
            cuda_version: None,
            visible_devices: None,
            devices: Vec::new(),
            pairs: Vec::new(),
            network: None,
        };
        BenchDocument::new(
            &host,
            BenchReport {
                devices: vec![0, 1],
                timing: Sampling {
                    warmup: 1,
                    iterations: 1,
                    samples: 1,
                    rotation_bytes: 0,
                },
                notes: Vec::new(),
                tests: vec![
                    test(
                        "ce-write",
                        1 << 20,
                        vec![
                            (pair(0, 0), write[0]),
                            (pair(0, 1), write[1]),
                            (pair(1, 0), write[2]),
                            (pair(1, 1), write[3]),
                        ],
                    ),
                    test("h2d", 1 << 20, vec![(Place::Device { device: 0 }, h2d)]),
                ],
                sweeps: vec![Sweep {
                    test: "ce-write".into(),
                    src: 0,
                    dst: 1,
                    measures: String::new(),
                    points: vec![SweepPoint {
                        bytes: 4096,
                        median_us: sweep_us,
                        p99_us: sweep_us,
                        gbps: 1.0,
                    }],
                    fit: None,
                    not_measured: None,
                }],
            },
        )
    }

    #[test]
    fn every_shared_figure_is_paired_and_summarised_per_test() {
        let real = doc("cuda", [2000.0, 400.0, 400.0, 2000.0], 55.0, 8.0);
        let sim = doc("sim:exported", [2000.0, 360.0, 420.0, 2000.0], 55.0, 6.0);
        let c = compare(&real, &sim, "real.json", "sim.json");
        assert_eq!(c.pairs.len(), 6);
        assert!(c.unmatched.is_empty());
        let s = c.summaries();
        assert_eq!(s.len(), 3);
        assert_eq!((s[0].test.as_str(), s[0].paired), ("ce-write 1 MiB", 4));
        // The furthest figure from the base, whichever way: 360/400 = 0.9 against 420/400.
        assert_eq!(s[0].worst.place, "0→1");
        assert!((s[0].worst.ratio - 0.9).abs() < 1e-12);
        assert_eq!(
            (s[1].test.as_str(), s[1].worst.place.as_str()),
            ("h2d 1 MiB", "GPU 0")
        );
        assert_eq!(s[2].test, "ce-write sweep");
        assert_eq!(s[2].unit, Unit::Micros);
        assert_eq!(s[2].worst.place, "0→1 4 KiB");
        assert!((s[2].median_ratio - 0.75).abs() < 1e-12);
        let doc = serde_json::to_value(CompareDocument::new(&c, None)).unwrap();
        assert!(
            doc.get("threshold").is_none(),
            "written only with --threshold"
        );
        assert_eq!(doc["schema"], "peerlink.compare/1");
        assert_eq!(doc["source"], "sim:exported");
        assert_eq!(doc["simulated"], true);
        assert_eq!(doc["base_source"], "cuda");
        assert_eq!(doc["pairs"].as_array().unwrap().len(), 6);
        assert_eq!(doc["pairs"][0]["unit"], "GB/s");
    }

    #[test]
    fn figures_beyond_the_threshold_are_those_further_than_it_either_way() {
        let base = doc("cuda", [2000.0, 400.0, 400.0, 2000.0], 55.0, 8.0);
        // 0→1 10% slower, 1→0 4% faster, h2d 1% slower, the sweep point 6% longer.
        let other = doc("cuda", [2000.0, 360.0, 416.0, 2000.0], 54.45, 8.48);
        let c = compare(&base, &other, "a", "b");
        let named = |pct| -> Vec<String> { c.beyond(pct).iter().map(|p| p.named()).collect() };
        assert_eq!(
            named(5.0),
            [
                "ce-write 1 MiB 0→1 (×0.900)",
                "ce-write sweep 0→1 4 KiB (×1.060)"
            ]
        );
        assert_eq!(named(3.0).len(), 3);
        assert_eq!(named(0.5).len(), 4);
        // Unchanged figures never move, however small the threshold.
        assert_eq!(named(0.0).len(), 4);
        assert!(named(12.0).is_empty());
        let doc = serde_json::to_value(CompareDocument::new(&c, Some(5.0))).unwrap();
        assert_eq!(doc["threshold"]["pct"], 5.0);
        assert_eq!(doc["threshold"]["beyond"].as_array().unwrap().len(), 2);
        assert_eq!(doc["threshold"]["beyond"][0]["place"], "0→1");
    }

    #[test]
    fn documents_that_share_no_figure_are_refused_in_one_sentence() {
        let base = doc("cuda", [1.0; 4], 1.0, 1.0);
        let mut other = doc("sim:h200-pair", [1.0; 4], 1.0, 1.0);
        assert!(compare(&base, &other, "a", "b")
            .check_paired("a", "b")
            .is_ok());
        // Other sizes, and a sweep of another pair: every test differs or sits elsewhere.
        for test in &mut other.results.tests {
            test.size_bytes = 8 << 20;
        }
        other.results.sweeps[0].src = 1;
        let c = compare(&base, &other, "gpu.json", "sim.json");
        assert!(c.pairs.is_empty());
        let err = c.check_paired("gpu.json", "sim.json").unwrap_err();
        assert_eq!(err.exit_code(), 2);
        let text = err.to_string();
        assert!(
            text.starts_with("gpu.json and sim.json share no figure"),
            "{text}"
        );
        assert_eq!(text.matches(". ").count(), 0, "one sentence: {text}");
    }

    #[test]
    fn figures_no_measurement_gives_are_named() {
        assert_eq!(check_figures(&doc("sim:a", [300.0; 4], 50.0, 10.0)), Ok(()));
        for bad in [0.0, -1.0, 1e308, f64::INFINITY, 1e-300, 2e9] {
            let why =
                check_figures(&doc("sim:a", [300.0, bad, 300.0, 300.0], 50.0, 10.0)).unwrap_err();
            assert!(why.contains(&shown_figure(bad)), "{why}");
            assert!(why.contains("from 1e-9 to below 1e9"), "{why}");
        }
        assert!(check_figures(&doc("sim:a", [300.0; 4], 50.0, -3.0)).is_err());
    }

    #[test]
    fn figures_of_gpus_the_document_does_not_list_are_named() {
        let mut stray = doc("sim:a", [300.0; 4], 50.0, 10.0);
        stray.results.tests[0].cells[1].place = Place::Pair { src: 0, dst: 99 };
        let why = check_figures(&stray).unwrap_err();
        assert!(why.contains("GPU 99 is not among its `devices`"), "{why}");
        let mut stray = doc("sim:a", [300.0; 4], 50.0, 10.0);
        stray.results.sweeps[0].src = 7;
        assert!(check_figures(&stray).unwrap_err().contains("GPU 7"));
    }

    #[test]
    fn tests_in_one_document_only_are_named() {
        let mut base = doc("cuda", [1.0; 4], 1.0, 1.0);
        base.results.tests.push(test(
            "ping-pong",
            4,
            vec![(Place::Pair { src: 0, dst: 1 }, 1.7)],
        ));
        let mut other = doc("cuda", [1.0; 4], 1.0, 1.0);
        // The same test at another size is not the same figure.
        other.results.tests[1].size_bytes = 8 << 20;
        let c = compare(&base, &other, "a", "b");
        assert_eq!(
            c.unmatched,
            [
                "h2d 1 MiB (only in a)",
                "ping-pong 4 B (only in a)",
                "h2d 8 MiB (only in b)"
            ]
        );
    }
}
