//! `peerlink workload` on the simulator: every workload on an NVSwitch host and a PCIe pair, its
//! text (labelled simulated), its JSON (valid against the published schema, every row verified),
//! and bad input.

mod common;

use common::{json_of, peerlink};
use peerlink::backend::collective::PACKET_MAX_BYTES;
use peerlink::document::schemas::file_name;
use peerlink::report::schemas::published;
use predicates::prelude::*;
use serde_json::Value;

/// The two presets: eight GPUs behind NVSwitch, and two under one PCIe switch.
const PRESETS: [&str; 2] = ["dgx-h100", "pcie-2gpu-switch"];

fn workload_json(preset: &str, args: &[&str]) -> Value {
    json_of(&[&["--json", "--sim", preset, "workload"], args].concat())
}

/// Checks a document against the published `peerlink.workload/1` schema and the rules every row
/// keeps; returns its rows.
fn valid_rows(doc: &Value, workload: &str) -> Vec<Value> {
    assert_eq!(doc["schema"], "peerlink.workload/1");
    let schema = published()
        .into_iter()
        .find(|p| p.file == file_name("peerlink.workload/1"))
        .expect("the workload schema is published")
        .schema;
    let validator = jsonschema::validator_for(&schema).unwrap();
    let errors: Vec<String> = validator.iter_errors(doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(doc["simulated"], true);
    assert_eq!(doc["workload"], workload);
    let rows = doc["rows"].as_array().unwrap().clone();
    assert!(!rows.is_empty(), "{doc}");
    for row in &rows {
        assert_eq!(row["verified"], true, "{row}");
        assert_eq!(row["simulated"], true, "{row}");
        assert_eq!(row["workload"], workload, "{row}");
        let time = row["time_us"].as_f64().unwrap();
        assert!(time.is_finite() && time > 0.0, "{row}");
        assert!(row["algbw_gbps"].as_f64().unwrap() > 0.0, "{row}");
    }
    rows
}

/// The rows of one contender.
fn of<'a>(rows: &'a [Value], contender: &str) -> Vec<&'a Value> {
    rows.iter()
        .filter(|r| r["contender"] == contender)
        .collect()
}

#[test]
fn all_reduce_measures_every_kernel_that_takes_the_size_and_the_pick_at_every_size() {
    for preset in PRESETS {
        for dtype in ["f32", "bf16"] {
            let doc = workload_json(
                preset,
                &["all-reduce", "--max-size", "256KiB", "--dtype", dtype],
            );
            let rows = valid_rows(&doc, "all-reduce");
            let sizes: Vec<u64> = of(&rows, "peerlink-pick")
                .iter()
                .map(|r| r["bytes"].as_u64().unwrap())
                .collect();
            assert_eq!(
                sizes,
                [4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144],
                "{preset}"
            );
            for row in &rows {
                assert_eq!(row["dtype"], dtype);
            }
            for pick in of(&rows, "peerlink-pick") {
                let bytes = &pick["bytes"];
                let measured: Vec<&Value> = of(&rows, "peerlink")
                    .into_iter()
                    .filter(|r| &r["bytes"] == bytes)
                    .collect();
                let algorithms: Vec<&str> = measured
                    .iter()
                    .map(|r| r["algorithm"].as_str().unwrap())
                    .collect();
                // The packet kernel takes at most PACKET_MAX_BYTES.
                let want: &[&str] = if bytes.as_u64().unwrap() <= PACKET_MAX_BYTES as u64 {
                    &["one-shot", "two-shot", "one-shot-packets"]
                } else {
                    &["one-shot", "two-shot"]
                };
                assert_eq!(algorithms, want, "{pick}");
                assert!(algorithms.contains(&pick["algorithm"].as_str().unwrap()));
                let kernels: Vec<f64> = measured
                    .iter()
                    .map(|r| r["time_us"].as_f64().unwrap())
                    .collect();
                let fastest = kernels.iter().copied().fold(f64::INFINITY, f64::min);
                let regret = pick["regret"].as_f64().unwrap();
                let time = pick["time_us"].as_f64().unwrap();
                assert!((time / fastest - 1.0 - regret).abs() < 1e-9, "{pick}");
                assert!(pick["predicted_us"].as_f64().unwrap() > 0.0);
            }
            // busbw = algbw × 2(n−1)/n.
            let n = doc["devices"].as_array().unwrap().len() as f64;
            for row in &rows {
                let (alg, bus) = (
                    row["algbw_gbps"].as_f64().unwrap(),
                    row["busbw_gbps"].as_f64().unwrap(),
                );
                assert!(
                    (bus - alg * 2.0 * (n - 1.0) / n).abs() <= 1e-9 * bus.max(1.0),
                    "{row}"
                );
            }
        }
    }
}

#[test]
fn send_recv_runs_one_way_and_both_ways_on_every_preset() {
    for preset in PRESETS {
        let doc = workload_json(
            preset,
            &["send-recv", "--max-size", "16KiB", "--issue", "both"],
        );
        let rows = valid_rows(&doc, "send-recv");
        for variant in ["one-way", "both"] {
            let engine: Vec<_> = of(&rows, "peerlink")
                .into_iter()
                .filter(|r| r["variant"] == variant)
                .collect();
            assert_eq!(engine.len(), 7, "{preset} {variant}: one row per size");
            assert!(engine
                .iter()
                .all(|r| r["algorithm"].as_str().unwrap().starts_with("engine ")));
            // The engine cannot be captured: its rows are issued from the host.
            assert!(engine.iter().all(|r| r["issue"] == "stream"));
        }
        let notices = doc["notices"].as_array().unwrap();
        assert!(
            notices
                .iter()
                .any(|n| n.as_str().unwrap().contains("engine")),
            "{notices:?}"
        );
    }
}

#[test]
fn pipeline_reports_the_exposed_communication() {
    for preset in PRESETS {
        let doc = workload_json(
            preset,
            &["pipeline", "--max-size", "64KiB", "--compute-us", "50"],
        );
        for row in valid_rows(&doc, "pipeline") {
            let step = row["time_us"].as_f64().unwrap();
            let compute = row["compute_us"].as_f64().unwrap();
            let exposed = row["exposed_us"].as_f64().unwrap();
            assert!((step - compute - exposed).abs() < 1e-9, "{row}");
            // The simulated busy kernel runs for what it was asked, and a launch.
            assert!((50.0..55.0).contains(&compute), "{row}");
            assert!(step >= compute - 1e-9, "{row}");
        }
    }
}

#[test]
fn halo_exchanges_rows_and_columns_in_both_decompositions() {
    for preset in PRESETS {
        let doc = workload_json(preset, &["halo", "--max-size", "1KiB", "--graphs"]);
        let rows = valid_rows(&doc, "halo");
        for variant in ["1-d", "2-d"] {
            let peerlink: Vec<_> = of(&rows, "peerlink")
                .into_iter()
                .filter(|r| r["variant"] == variant)
                .collect();
            assert!(!peerlink.is_empty(), "{preset} {variant}");
            assert!(peerlink.iter().all(|r| r["issue"] == "graphs"));
        }
        let two_d = rows.iter().find(|r| r["variant"] == "2-d").unwrap();
        assert!(
            two_d["algorithm"].as_str().unwrap().contains("columns"),
            "{two_d}"
        );
    }
}

#[test]
fn text_says_simulated_and_shows_a_table_per_variant() {
    peerlink()
        .args([
            "--sim",
            "pcie-2gpu-switch",
            "workload",
            "send-recv",
            "--max-size",
            "64B",
        ])
        .assert()
        .success()
        .stdout(predicate::str::contains("SIMULATED"))
        .stdout(predicate::str::contains("send-recv one-way:"))
        .stdout(predicate::str::contains("send-recv both:"))
        .stdout(predicate::str::contains("µs/op"))
        .stderr(predicate::str::contains("simulator defaults"));
}

#[test]
fn bad_input_exits_2_with_one_sentence() {
    let cases: &[(&[&str], &str)] = &[
        (&["--devices", "0", "workload", "all-reduce"], "at least 2"),
        (&["workload", "all-gather"], "unknown workload `all-gather`"),
        (&["workload", "halo", "--sizes", "4x"], "bad size `4x`"),
        (&["workload", "halo", "--size", "6"], "whole f32 cells"),
        (
            &["workload", "all-reduce", "--size", "6"],
            "whole f32 elements",
        ),
        (
            &["workload", "all-reduce", "--max-size", "2B"],
            "--max-size",
        ),
        (
            &["workload", "halo", "--dtype", "bf16"],
            "--dtype applies to the all-reduce",
        ),
        (
            &["workload", "send-recv", "--issue", "threads"],
            "unknown issue mode",
        ),
        (
            &["workload", "pipeline", "--compute-us", "0"],
            "--compute-us",
        ),
        (&["workload", "all-reduce", "--iters", "0"], "--iters"),
        (
            &["workload", "halo", "--warmup", "100001"],
            "at most 100000",
        ),
    ];
    for (args, says) in cases {
        let out = peerlink()
            .args([&["--sim", "pcie-2gpu-switch"], *args].concat())
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
    }
}
