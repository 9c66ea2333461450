//! Helpers shared by the CLI tests.

// Each test binary compiles this module and uses only its own part of it.
#![allow(dead_code)]

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
    ]
}
