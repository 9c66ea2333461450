//! `peerlink check` on simulated hosts: against a baseline of the same host (healthy, run after
//! run), against one doctored 10% faster (a regression, named), within a wider tolerance, and
//! against the reference figures of the GPU a preset names (labelled simulated).

mod common;

use common::{json_of, made_faster, peerlink};
use predicates::prelude::*;
use serde_json::Value;
use std::path::Path;

/// A default `bench --json` of `preset`, written to `dir/name`; its path.
fn baseline(dir: &Path, preset: &str, name: &str) -> String {
    let path = dir.join(name);
    let doc = json_of(&["--sim", preset, "bench", "--json"]);
    std::fs::write(&path, doc.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

/// `baseline` made 10% faster, as `scripts/gpu-run.sh`'s `check` step doctors it on the GPU host.
fn faster(dir: &Path, baseline: &str) -> String {
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(baseline).unwrap()).unwrap();
    made_faster(&mut doc, 10.0);
    let path = dir.join("faster.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    path.to_str().unwrap().to_string()
}

/// A default bench of the simulated H200 pair made 10% faster, in `dir`; its path.
fn faster_baseline(dir: &Path) -> String {
    let base = baseline(dir, "h200-pair", "base.json");
    faster(dir, &base)
}

/// `peerlink --sim h200-pair check --baseline BASELINE EXTRA..`.
fn check_against(baseline: &str, extra: &[&str]) -> std::process::Output {
    let args = ["--sim", "h200-pair", "check", "--baseline", baseline];
    peerlink().args(args).args(extra).output().unwrap()
}

#[test]
fn a_baseline_of_the_same_simulated_host_passes_run_after_run() {
    let dir = tempfile::tempdir().unwrap();
    let base = baseline(dir.path(), "h200-pair", "base.json");
    for _ in 0..3 {
        let doc = json_of(&["--sim", "h200-pair", "check", "--baseline", &base, "--json"]);
        assert_eq!(doc["schema"], "peerlink.check/1");
        assert_eq!(doc["source"], "sim:h200-pair");
        assert_eq!(doc["simulated"], true);
        assert_eq!(doc["healthy"], true);
        assert_eq!(doc["against"]["kind"], "baseline");
        assert_eq!(doc["against"]["source"], "sim:h200-pair");
        assert_eq!(doc["tolerance_pct"], 5.0);
        let figures = doc["figures"].as_array().unwrap();
        assert_eq!(figures.len(), 10);
        // The simulator repeats its figures, but for rounding on a clock that started elsewhere.
        assert!(
            figures
                .iter()
                .all(|f| f["slower_pct"].as_f64().unwrap().abs() < 1e-6),
            "{figures:?}"
        );
        assert!(doc["regressed"].as_array().unwrap().is_empty());
        // The latency tests a baseline holds are named, with why they are not compared.
        let left: Vec<&str> = doc["not_checked"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["test"].as_str().unwrap())
            .collect();
        assert!(
            left.contains(&"e2e-latency") && left.contains(&"issue-cost"),
            "{left:?}"
        );
        assert_eq!(doc["fleet_gpus"], 8);
        assert!(doc["fleet_wall_s"].as_f64().unwrap() > doc["wall_s"].as_f64().unwrap());
    }
    peerlink()
        .args(["--sim", "h200-pair", "check", "--baseline", &base])
        .assert()
        .success()
        .stdout(predicate::str::starts_with(
            "*** SIMULATED host `h200-pair`",
        ))
        .stdout(predicate::str::contains(
            "HEALTHY: all 10 figures within their tolerance",
        ))
        .stdout(predicate::str::contains("on 8 GPUs of this kind"));
}

#[test]
fn a_baseline_made_10_percent_faster_fails_naming_tests_and_places() {
    let dir = tempfile::tempdir().unwrap();
    let faster = faster_baseline(dir.path());
    let out = check_against(&faster, &["--json"]);
    assert_eq!(out.status.code(), Some(1));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("the document, still");
    assert_eq!(doc["healthy"], false);
    let regressed: Vec<&str> = doc["regressed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap())
        .collect();
    // Bandwidths 9.1% short of the baseline (tolerance 5%), copy-latency 11.1% longer (10%).
    assert_eq!(
        regressed,
        [
            "ce-write 8 MiB 0→1",
            "ce-write 8 MiB 1→0",
            "h2d 8 MiB GPU 0",
            "h2d 8 MiB GPU 1",
            "d2h 8 MiB GPU 0",
            "d2h 8 MiB GPU 1",
            "local 8 MiB GPU 0",
            "local 8 MiB GPU 1",
            "copy-latency 4 B 0→1",
            "copy-latency 4 B 1→0",
        ]
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("check failed: 10 of 10 figures slower than their tolerance allows"),
        "{stderr}"
    );
    assert!(
        stderr.contains("ce-write 8 MiB 0→1 (9.1% slower; tolerance 5%)"),
        "{stderr}"
    );
    peerlink()
        .args(["--sim", "h200-pair", "check", "--baseline", &faster])
        .assert()
        .code(1)
        .stdout(predicate::str::contains("REGRESSED: 10 of 10 figures"));
}

#[test]
fn the_tolerance_decides() {
    let dir = tempfile::tempdir().unwrap();
    let faster = faster_baseline(dir.path());
    let run = |tolerance: &str| {
        check_against(&faster, &[&format!("--tolerance={tolerance}")])
            .status
            .code()
    };
    // 9.1% slower bandwidths and 11.1% longer copies: inside 12% (24% for copy-latency)...
    assert_eq!(run("12"), Some(0));
    // ...outside 9% (copy-latency at 18% passes, the bandwidths do not).
    assert_eq!(run("9%"), Some(1));
    let out = check_against(&faster, &["--tolerance", "9", "--json"]);
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["regressed"].as_array().unwrap().len(), 8);
    for bad in ["100", "0", "-1", "five"] {
        peerlink()
            .args(["--sim", "h200-pair", "check", &format!("--tolerance={bad}")])
            .assert()
            .code(2)
            .stderr(predicate::str::contains("--tolerance"));
    }
}

#[test]
fn a_simulated_preset_is_checked_against_its_gpus_references_and_labelled_simulated() {
    // One GPU of the simulated DGX H100: the H100 SXM's published host-link figures apply (its
    // pair figures need two GPUs); 64 MiB copies, quick on the simulator.
    let doc = json_of(&["--sim", "dgx-h100", "--devices", "0", "check", "--json"]);
    assert_eq!(doc["simulated"], true);
    assert_eq!(doc["source"], "sim:dgx-h100");
    assert_eq!(doc["against"]["kind"], "reference");
    assert_eq!(doc["against"]["gpus"][0], "NVIDIA H100 SXM");
    assert_eq!(doc["healthy"], true);
    let figures = doc["figures"].as_array().unwrap();
    let tests: Vec<&str> = figures
        .iter()
        .map(|f| f["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["h2d", "d2h"]);
    assert!(figures
        .iter()
        .all(|f| f["reference"].as_str().unwrap().contains("nvbandwidth")));
    assert!(doc["notes"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n.as_str().unwrap().starts_with("SIMULATED host `dgx-h100`")));
    peerlink()
        .args(["--sim", "dgx-h100", "--devices", "0", "check"])
        .assert()
        .success()
        .stdout(predicate::str::starts_with("*** SIMULATED host `dgx-h100`"))
        .stdout(predicate::str::contains("not any hardware"))
        .stdout(predicate::str::contains(
            "against the reference figures of NVIDIA H100 SXM shipped with peerlink",
        ));
}

#[test]
fn hosts_and_files_check_cannot_use_are_refused_in_one_sentence() {
    let dir = tempfile::tempdir().unwrap();
    let h200 = baseline(dir.path(), "h200-pair", "h200.json");
    let topo = dir.path().join("topo.json");
    std::fs::write(
        &topo,
        json_of(&["--sim", "h200-pair", "topo", "--json"]).to_string(),
    )
    .unwrap();
    let missing = dir.path().join("missing.json");
    for (args, says) in [
        (
            vec!["--sim", "dgx1-v100", "check"],
            "peerlink ships no reference figures for Tesla V100-SXM2-16GB",
        ),
        (
            vec!["--sim", "dgx-h100", "check", "--baseline", &h200],
            "measured on `sim:h200-pair` and this host is `sim:dgx-h100`",
        ),
        (
            vec![
                "--sim",
                "h200-pair",
                "check",
                "--baseline",
                topo.to_str().unwrap(),
            ],
            "is not a `peerlink.bench/1` document",
        ),
        (
            vec![
                "--sim",
                "h200-pair",
                "check",
                "--baseline",
                missing.to_str().unwrap(),
            ],
            "does not exist",
        ),
    ] {
        let out = peerlink().args(&args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(stderr.lines().count(), 1, "{stderr}");
    }
}

/// The fault fixtures of peerlink doctor's tests (tests/fixtures/doctor/) that slow or remove a
/// figure check measures, each with what check must say is wrong.
const FAULTY: &[(&str, &str)] = &[
    (
        "nvlink-down",
        "GPU 0 and GPU 1 are joined by NV17, where two NVIDIA H200 (SXM)",
    ),
    ("p2p-off", "no P2P between GPU 0 and GPU 1"),
    ("pcie-p2p-off", "no P2P between GPU 0 and GPU 1"),
    ("mig-on", "no P2P between GPU 0 and GPU 1"),
    ("pcie-downgraded", "h2d 64 MiB GPU 1"),
];

/// The fixtures whose faults move none of check's figures (error counters, persistence, clock
/// event reasons: doctor's to find), and the healthy one.
const UNMOVED: &[&str] = &["healthy-nvlink", "rising-counters", "slow-clocks"];

fn fixture(name: &str) -> String {
    format!(
        "{}/tests/fixtures/doctor/{name}.json",
        env!("CARGO_MANIFEST_DIR")
    )
}

/// Check's tests at 1 MiB on a fixture: every figure and what was not measured, as JSON.
fn checked_figures(preset: &str) -> Value {
    let tests = "ce-write,h2d,d2h,local,copy-latency";
    let args = [
        "--sim", preset, "bench", "--tests", tests, "--size", "1MiB", "--json",
    ];
    json_of(&args)["tests"].clone()
}

#[test]
fn every_fault_fixture_that_moves_a_checked_figure_fails_the_check_naming_what_is_wrong() {
    // Every fixture is classified: a new one must say whether check should catch it.
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/doctor");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let Some(name) = path.file_stem().and_then(|s| s.to_str()) else {
            continue;
        };
        if path.extension().is_some_and(|e| e == "json") {
            let known = FAULTY.iter().any(|(f, _)| *f == name) || UNMOVED.contains(&name);
            assert!(known, "{name}: add it to FAULTY or UNMOVED");
        }
    }
    // The unmoved ones give the healthy fixture's figures exactly: nothing for check to catch.
    let healthy = checked_figures(&fixture("healthy-nvlink"));
    for name in UNMOVED {
        assert_eq!(checked_figures(&fixture(name)), healthy, "{name}");
    }
    // All 18 NVLinks of GPU 0 down, made from nvlink-down.
    let tmp = tempfile::tempdir().unwrap();
    let mut all_down: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("nvlink-down")).unwrap()).unwrap();
    all_down["name"] = "nvlinks-all-down".into();
    all_down["faults"]["nvlinks_down"][0]["links"] = (0..18).collect::<Vec<u32>>().into();
    let all_down_path = tmp.path().join("all-down.json");
    std::fs::write(&all_down_path, all_down.to_string()).unwrap();
    let all_down_path = all_down_path.to_str().unwrap().to_string();

    let cases = FAULTY
        .iter()
        .map(|&(name, says)| (fixture(name), says))
        .chain([(all_down_path, "no P2P between GPU 0 and GPU 1")]);
    for (preset, says) in cases {
        let out = peerlink()
            .args(["--sim", &preset, "check"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{preset}: {stdout}{stderr}");
        assert!(stdout.contains(says), "{preset}: no `{says}` in {stdout}");
        assert!(
            stderr.starts_with("peerlink: error: check failed: ") && stderr.contains(says),
            "{preset}: {stderr}"
        );
        assert!(!stdout.contains("HEALTHY"), "{preset}: {stdout}");
    }
}
