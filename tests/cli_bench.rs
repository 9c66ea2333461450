//! `peerlink bench` and `peerlink explain` from the command line, on the simulator.

mod common;

use common::{json_of, peerlink};
use predicates::prelude::*;

#[test]
fn bench_json_follows_the_contract() {
    let doc = json_of(&[
        "bench",
        "--json",
        "--sim",
        "dgx1-v100",
        "--tests",
        "ce-write,h2d",
        "--size",
        "1MiB",
    ]);
    assert_eq!(doc["schema"], "peerlink.bench/1");
    assert_eq!(doc["source"], "sim:dgx1-v100");
    let tests = doc["tests"].as_array().unwrap();
    assert_eq!(tests.len(), 2);
    let ce = &tests[0];
    assert_eq!(ce["name"], "ce-write");
    assert_eq!(ce["unit"], "GB/s");
    assert_eq!(ce["size_bytes"], 1 << 20);
    let matrix = ce["matrix"].as_array().unwrap();
    assert_eq!(matrix.len(), 8);
    assert!(matrix[0][1].as_f64().unwrap() > 0.0, "NV1 pair measured");
    assert!(matrix[0][5].is_null(), "SYS pair without P2P is null");
    let reason = ce["not_measured"]
        .as_array()
        .unwrap()
        .iter()
        .find(|n| n["src"] == 0 && n["dst"] == 5)
        .unwrap();
    assert!(reason["reason"].as_str().unwrap().starts_with("no P2P"));
    assert_eq!(tests[1]["values"].as_array().unwrap().len(), 8);
    assert!(doc["sweeps"].as_array().unwrap().is_empty());
}

#[test]
fn bench_text_shows_matrices_na_reasons_and_the_simulated_banner() {
    peerlink()
        .args([
            "bench",
            "--sim",
            "pcie-4gpu-2socket",
            "--tests",
            "ce-write",
            "--size",
            "64K",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("SIMULATED"))
        .stdout(predicate::str::contains(
            "ce-write — 64 KiB per message, GB/s",
        ))
        .stdout(predicate::str::contains("N/A 0→2, 0→3"))
        .stdout(predicate::str::contains("no P2P over SYS"));
}

#[test]
fn bench_csv_has_one_row_per_cell_and_reason() {
    let out = peerlink()
        .args([
            "bench",
            "--csv",
            "--sim",
            "pcie-2gpu-switch",
            "--tests",
            "ce-write,d2h",
            "--size",
            "4K",
        ])
        .output()
        .unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let mut lines = text.lines();
    let header = lines.next().unwrap();
    assert!(header.starts_with("kind,test,unit,size_bytes,src,dst,device,value"));
    let columns = header.split(',').count();
    let rows: Vec<&str> = lines.collect();
    // ce-write: 2 measured pairs + 2 diagonal reasons; d2h: 2 GPUs.
    assert_eq!(rows.len(), 6, "{text}");
    for row in &rows {
        if !row.contains('"') {
            assert_eq!(row.split(',').count(), columns, "{row}");
        }
    }
}

#[test]
fn bench_sweep_reports_points_and_a_fit() {
    let doc = json_of(&[
        "bench",
        "--json",
        "--sim",
        "dgx-h100",
        "--devices",
        "0,1",
        "--sizes",
        "4K,64K,1M,16M",
    ]);
    let sweeps = doc["sweeps"].as_array().unwrap();
    assert_eq!(sweeps.len(), 2);
    let points = sweeps[0]["points"].as_array().unwrap();
    assert_eq!(points.len(), 4);
    for key in ["bytes", "median_us", "p99_us", "gbps"] {
        assert!(points[0].get(key).is_some(), "point lacks {key}");
    }
    for key in [
        "alpha_us",
        "beta_gbps",
        "half_beta_bytes",
        "ninety_beta_bytes",
    ] {
        assert!(sweeps[0]["fit"][key].as_f64().is_some(), "fit lacks {key}");
    }
}

#[test]
fn size_plateau_runs_each_test_at_its_plateau_and_every_test_tells_its_wall_time() {
    let doc = json_of(&[
        "bench",
        "--json",
        "--sim",
        "pcie-2gpu-switch",
        "--tests",
        "h2d,copy-latency",
        "--size",
        "plateau",
    ]);
    let tests = doc["tests"].as_array().unwrap();
    assert_eq!(tests[0]["name"], "h2d");
    assert_eq!(tests[0]["size_bytes"], 64 << 20);
    assert_eq!(
        tests[1]["size_bytes"], 4,
        "latency tests keep their own size"
    );
    for t in tests {
        let wall = t["wall_s"].as_f64().unwrap();
        assert!(wall > 0.0 && wall < 10.0, "{}: {wall}", t["name"]);
    }
}

#[test]
fn warmup_and_rotation_can_be_set_for_experiments() {
    let args = [
        "bench",
        "--sim",
        "dgx-h100",
        "--devices",
        "0,1",
        "--tests",
        "ce-read",
        "--size",
        "64K",
        "--warmup",
        "0",
        "--rotation",
        "1MiB",
    ];
    let doc = json_of(&[&args[..], &["--json"]].concat());
    assert_eq!(doc["timing"]["warmup"], 0);
    assert_eq!(doc["timing"]["rotation_bytes"], 1 << 20);
    peerlink()
        .args(args)
        .assert()
        .success()
        .stdout(predicate::str::contains("buffers rotated over 1 MiB"));
}

#[test]
fn bad_input_exits_2_with_a_message() {
    for (args, says) in [
        (vec!["--size", "0"], "zero"),
        (vec!["--size", "12parsecs"], "bad size"),
        (vec!["--size", "1TiB"], "free: choose a smaller --size"),
        (vec!["--tests", "ce-write,nope"], "known tests"),
        (vec!["--devices", "0,9"], "GPU 9 does not exist"),
        (vec!["--sizes", "1M..4K"], "larger than the end"),
        (vec!["--samples", "0"], "at least 1"),
        (vec!["--rotation", "lots"], "bad size"),
    ] {
        let mut all = vec!["bench", "--sim", "dgx-h100"];
        all.extend(args.iter().copied());
        peerlink()
            .args(&all)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(says))
            .stdout(predicate::str::is_empty());
    }
}

#[test]
fn explain_json_adds_up_and_computes_fixes() {
    let doc = json_of(&[
        "explain", "--json", "--sim", "dgx-h100", "--src", "1", "--dst", "6", "--size", "64K",
    ]);
    assert_eq!(doc["schema"], "peerlink.explain/1");
    assert_eq!(doc["source"], "sim:dgx-h100");
    assert_eq!(doc["adds_up_within_10_percent"], true);
    let parts = doc["parts"].as_array().unwrap();
    let sum: f64 = parts.iter().map(|p| p["us"].as_f64().unwrap()).sum();
    assert!((sum - doc["sum_us"].as_f64().unwrap()).abs() < 1e-9);
    assert!(doc["fixes"].as_array().unwrap().len() >= 4);
}

#[test]
fn explain_text_and_bad_input() {
    peerlink()
        .args(["explain", "--sim", "dgx-h100", "--src", "0", "--dst", "0"])
        .assert()
        .success()
        .stdout(predicate::str::contains("launch overhead"))
        .stdout(predicate::str::contains("receiver side"))
        .stdout(predicate::str::contains("gap:"));
    peerlink()
        .args(["explain", "--sim", "dgx-h100", "--src", "0", "--dst", "8"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("GPU 8 does not exist"));
    peerlink()
        .args([
            "explain", "--sim", "dgx-h100", "--src", "0", "--dst", "1", "--size", "0",
        ])
        .assert()
        .code(2);
    // --devices is honoured: a GPU outside it is refused, not silently measured.
    peerlink()
        .args(["explain", "--sim", "dgx-h100", "--src", "0", "--dst", "1"])
        .args(["--devices", "2,3"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "GPU 0 is not one of the GPUs in use (2, 3)",
        ));
}

/// A preset file of 1024 GPUs in `dir`: `2x-dgx-h100`'s host 128 times.
fn preset_of_1024_gpus(dir: &std::path::Path) -> String {
    let text = std::fs::read_to_string("src/topology/presets/2x-dgx-h100.json").unwrap();
    let mut preset: serde_json::Value = serde_json::from_str(&text).unwrap();
    preset["hosts"] = 128.into();
    let path = dir.join("128x-dgx-h100.json");
    std::fs::write(&path, preset.to_string()).unwrap();
    path.display().to_string()
}

#[test]
fn two_of_1024_gpus_are_measured_and_explained_as_quickly_as_on_one_host() {
    let dir = tempfile::tempdir().unwrap();
    let preset = preset_of_1024_gpus(dir.path());
    let started = std::time::Instant::now();
    let out = common::succeeds(
        peerlink()
            .args(["--sim", &preset])
            .args("--devices 0,1 bench --tests ce-write --size 1MiB".split_whitespace()),
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("GPUs 0,1;"), "{text}");
    let doc = json_of(&[
        "--sim", &preset, "explain", "--src", "0", "--dst", "1", "--size", "1MiB", "--json",
    ]);
    assert_eq!(doc["host_gpus"].as_array().unwrap().len(), 1024);
    // The simulator holds the pairs of the GPUs in use, not a million: each run is quick.
    let took = started.elapsed();
    assert!(took < std::time::Duration::from_secs(5), "{took:?}");
}
