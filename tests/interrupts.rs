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
