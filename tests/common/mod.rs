//! Helpers shared by the CLI tests.

// Each test binary compiles this module and uses only its own part of it.
#![allow(dead_code)]

pub mod interrupt;

use assert_cmd::Command;
use serde_json::Value;
use std::path::Path;

/// The peerlink binary under test.
pub fn peerlink() -> Command {
    Command::cargo_bin("peerlink").unwrap()
}

/// Runs peerlink with `args`, expecting success, and parses stdout as exactly one JSON document.
#[allow(dead_code)] // each test binary compiles this module; the golden test does not use it
pub fn json_of(args: &[&str]) -> Value {
    let out = peerlink().args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is exactly one JSON document")
}

/// Runs `command`, expecting success (else fails with its stderr): what it printed.
pub fn succeeds(command: &mut Command) -> std::process::Output {
    let out = command.output().unwrap();
    assert!(
        out.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The two-GPU committed run, for `compare`.
pub const BENCH: &str = "benchmarks/h200-x2/bench.json";
pub const BENCH_AGAIN: &str = "benchmarks/h200-x2/bench-2.json";

/// Every verb and mode, quick on the simulated PCIe pair (compare on two committed runs): its
/// arguments, and the schema of what it writes. `dir` takes tune's profile.
pub fn every_kind(dir: &Path) -> Vec<(Vec<String>, &'static str)> {
    let profile = dir.join("profile.json").display().to_string();
    let sim = |args: &[&str]| {
        let mut all = vec!["--sim", "pcie-2gpu-switch"];
        all.extend_from_slice(args);
        all.into_iter().map(String::from).collect::<Vec<_>>()
    };
    vec![
        (sim(&["topo"]), "peerlink.topo/1"),
        (sim(&["bench", "--size", "64KiB"]), "peerlink.bench/1"),
        (
            sim(&["bench", "--sizes", "4B..64KiB", "--tests", "ce-write"]),
            "peerlink.bench/1",
        ),
        (
            sim(&["explain", "--src", "0", "--dst", "1", "--size", "4KiB"]),
            "peerlink.explain/1",
        ),
        (
            sim(&[
                "plan", "--src", "0", "--dst", "1", "--size", "64KiB", "--prove",
            ]),
            "peerlink.plan/1",
        ),
        (
            sim(&["plan", "--src", "0", "--dst", "1", "--sizes", "4KiB,64KiB"]),
            "peerlink.plan-sweep/1",
        ),
        (
            sim(&[
                "plan",
                "--src",
                "0",
                "--dst",
                "1",
                "--size",
                "4KiB",
                "--messages",
                "10",
                "--prove",
            ]),
            "peerlink.plan-batch/1",
        ),
        (
            sim(&["plan", "--concurrent", "shift", "--size", "64KiB"]),
            "peerlink.plan-concurrent/1",
        ),
        (
            sim(&["tune", "--quick", "--out", &profile]),
            "peerlink.profile/1",
        ),
        (
            sim(&["workload", "all-reduce", "--max-size", "16KiB"]),
            "peerlink.workload/1",
        ),
        (
            ["compare", BENCH, BENCH_AGAIN].map(String::from).to_vec(),
            "peerlink.compare/1",
        ),
        (sim(&["doctor"]), "peerlink.doctor/1"),
        // The shipped references cover the H200 (pcie-2gpu-switch's GPUs have none).
        (
            ["--sim", "h200-pair", "check"].map(String::from).to_vec(),
            "peerlink.check/1",
        ),
    ]
}

/// A `bench --json` document made `pct` percent faster: every bandwidth times 1 + pct/100, every
/// time times 1 − pct/100, in its cells, matrices and per-GPU values alike (what
/// `scripts/faster-baseline.py` does on the GPU host). A healthy host checked against it fails.
pub fn made_faster(doc: &mut Value, pct: f64) {
    for test in doc["tests"].as_array_mut().expect("a bench document") {
        let factor = if test["unit"] == "GB/s" {
            1.0 + pct / 100.0
        } else {
            1.0 - pct / 100.0
        };
        let scale = |v: &mut Value| {
            if let Some(x) = v.as_f64() {
                *v = (x * factor).into();
            }
        };
        // get_mut, not indexing: indexing a missing key mutably would add it as null.
        for cell in test["cells"].as_array_mut().into_iter().flatten() {
            for key in ["value", "total"] {
                if let Some(v) = cell.get_mut(key) {
                    scale(v);
                }
            }
        }
        for key in ["matrix", "total_matrix"] {
            let rows = test.get_mut(key).and_then(Value::as_array_mut);
            for row in rows.into_iter().flatten() {
                row.as_array_mut().into_iter().flatten().for_each(scale);
            }
        }
        let values = test.get_mut("values").and_then(Value::as_array_mut);
        values.into_iter().flatten().for_each(scale);
    }
}
