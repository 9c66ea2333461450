//! Issue 34, class 5: the first Ctrl-C ends every long run within a second, keeping what it
//! measured before. Each `interrupt` row of `tests/catalog/bad-inputs.tsv` is started, sent SIGINT
//! at a random moment after it began measuring (seeded: the seed is printed, and
//! `PEERLINK_INTERRUPT_SEED=<n>` replays it), and timed to its exit, one row at a time.
//!
//! A row passes where it exits 130 within [`BUDGET`] plus a margin for a loaded two-core CI
//! machine ([`LIMIT`]), and its output is what its `says` column asks: `partial`, a JSON document on
//! stdout marked `"partial": true`; `none`, nothing on stdout and stderr saying it was interrupted;
//! `either`, one or the other (a run whose output is whole or nothing).

mod common;

use common::interrupt::{interrupt, next, seed, wrong, BUDGET, LIMIT};
use std::path::Path;
use std::time::Duration;

const CATALOG: &str = include_str!("catalog/bad-inputs.tsv");

/// When a row is sent SIGINT: between these many milliseconds after it started (the simulator
/// starts measuring within a tenth of a second).
const EARLIEST_MS: u64 = 400;
const LATEST_MS: u64 = 2500;

struct Row {
    id: String,
    says: String,
    args: Vec<String>,
}

fn interrupt_rows() -> Vec<Row> {
    CATALOG
        .lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let fields: Vec<&str> = line.split('\t').collect();
            match fields[..] {
                [id, "interrupt", "130", says, args] => Some(Row {
                    id: id.to_string(),
                    says: says.to_string(),
                    args: args.split_whitespace().map(str::to_string).collect(),
                }),
                _ => None,
            }
        })
        .collect()
}

/// The row's arguments, `OUT/<name>` put in `out`.
fn concrete(args: &[String], out: &Path) -> Vec<String> {
    args.iter()
        .map(|a| match a.strip_prefix("OUT/") {
            Some(name) => out.join(name).display().to_string(),
            None => a.clone(),
        })
        .collect()
}

#[test]
fn the_first_ctrl_c_ends_every_long_run_within_a_second() {
    let rows = interrupt_rows();
    assert!(rows.len() >= 4, "the catalog has its interrupt rows");
    let seed = seed();
    println!("seed {seed} (PEERLINK_INTERRUPT_SEED={seed} replays these moments)");
    let mut state = seed;
    let mut failures = Vec::new();
    for row in &rows {
        let dir = tempfile::tempdir().unwrap();
        let args = concrete(&row.args, dir.path());
        let delay_ms = EARLIEST_MS + next(&mut state) % (LATEST_MS - EARLIEST_MS);
        let stopped = interrupt(&args, Duration::from_millis(delay_ms))
            .unwrap_or_else(|| panic!("{args:?} ended before the signal: it is not a long run"));
        println!(
            "{}: SIGINT at {delay_ms} ms, exit {:?} {:.3} s later (budget {} s, limit {} s)",
            row.id,
            stopped.code,
            stopped.took.as_secs_f64(),
            BUDGET.as_secs(),
            LIMIT.as_secs()
        );
        let wrong = wrong(&row.says, &stopped);
        if !wrong.is_empty() {
            failures.push(format!("{}: {}", row.id, wrong.join("; ")));
        }
    }
    assert!(failures.is_empty(), "seed {seed}:\n{}", failures.join("\n"));
}

/// What a stopped `plan --concurrent` keeps is what a whole run measures: every flow and every way
/// of its partial document is the whole run's, figure for figure (the simulator is deterministic),
/// and a flow measured alone but not yet together says so by leaving `together_us` out.
#[test]
fn a_stopped_concurrent_plan_keeps_only_what_it_measured_whole() {
    let args: Vec<String> = [
        "--sim",
        "dgx-h100",
        "plan",
        "--concurrent",
        "shift",
        "--size",
        "64MiB",
        "--json",
    ]
    .map(String::from)
    .to_vec();
    let whole = std::process::Command::new(env!("CARGO_BIN_EXE_peerlink"))
        .args(&args)
        .output()
        .unwrap();
    assert!(whole.status.success());
    let whole: serde_json::Value = serde_json::from_slice(&whole.stdout).unwrap();
    let flows_of = |doc: &serde_json::Value| doc["flows"].as_array().cloned().unwrap_or_default();
    let ways_of = |doc: &serde_json::Value| doc["ways"].as_array().cloned().unwrap_or_default();
    let mut stopped_any = false;
    for delay_ms in [1200, 4000] {
        let Some(stopped) = interrupt(&args, Duration::from_millis(delay_ms)) else {
            continue;
        };
        stopped_any = true;
        let problems = wrong("partial", &stopped);
        assert!(
            problems.is_empty(),
            "stopped at {delay_ms} ms: {problems:?}"
        );
        let partial: serde_json::Value = serde_json::from_slice(&stopped.stdout).unwrap();
        for flow in flows_of(&partial) {
            let same = flows_of(&whole)
                .into_iter()
                .find(|f| f["src"] == flow["src"] && f["dst"] == flow["dst"])
                .unwrap_or_else(|| panic!("a flow the whole run has not: {flow}"));
            assert_eq!(flow["alone_us"], same["alone_us"], "{flow}");
            if !flow["together_us"].is_null() {
                assert_eq!(flow["together_us"], same["together_us"], "{flow}");
            }
        }
        for way in ways_of(&partial) {
            assert!(
                ways_of(&whole).contains(&way),
                "a way the whole run has not: {way}"
            );
        }
        assert!(ways_of(&partial).len() < ways_of(&whole).len() || flows_of(&partial).len() < 8);
    }
    assert!(stopped_any, "every run ended before its signal");
}
