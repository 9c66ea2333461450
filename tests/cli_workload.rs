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

/// Runs `peerlink --sim <preset> workload <args>` and returns its exit code and stderr.
fn workload_outcome(preset: &str, args: &[&str]) -> (Option<i32>, String) {
    let out = peerlink()
        .args([&["--sim", preset, "workload"], args].concat())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out.status.code(), stderr)
}

#[test]
fn sizes_that_do_not_fit_are_refused_up_front_saying_what_is_needed_and_free() {
    // Issue 34, class 7: refused before anything is allocated, with bench's sentence (exit 2).
    // Each needs more than one simulated H100's 80 GiB on GPU 0.
    for args in [
        &["all-reduce", "--size", "200GiB"][..],
        &["all-reduce", "--sizes", "1MiB,200GiB"],
        &["send-recv", "--size", "100GiB"],
        &["pipeline", "--size", "40GiB"],
        &["halo", "--size", "64GiB"],
        &["halo", "--size", "64GiB", "--dims", "2"],
    ] {
        let started = std::time::Instant::now();
        let (code, stderr) = workload_outcome("dgx-h100", args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(&format!("peerlink: error: workload {} at ", args[0]))
                && stderr.contains(" needs ")
                && stderr.contains(" on GPU 0, which has ")
                && stderr.contains(" free: choose a smaller --size"),
            "{args:?}: {stderr}"
        );
        assert_eq!(stderr.trim().lines().count(), 1, "{args:?}: {stderr}");
        assert!(started.elapsed().as_secs() < 30, "{args:?}: refused late");
    }
}

#[test]
fn the_simulator_refuses_what_its_host_cannot_hold_and_runs_what_fits() {
    // The simulator keeps every GPU's memory in host memory: a 4 GiB halo face on eight GPUs is
    // a 16 GiB domain on each, 128 GiB of host memory.
    let available = std::fs::read_to_string("/proc/meminfo").ok().and_then(|m| {
        let line = m
            .lines()
            .find(|l| l.starts_with("MemAvailable:"))?
            .to_string();
        line.split_whitespace().nth(1)?.parse::<u64>().ok()
    });
    if available.is_some_and(|kib| kib < 100 << 20) {
        let (code, stderr) = workload_outcome("dgx-h100", &["halo", "--size", "4GiB"]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(
            stderr.contains("workload halo at 4 GiB needs ")
                && stderr.contains("of host memory (")
                && stderr.contains("the simulated GPUs' memory"),
            "{stderr}"
        );
    }
    // What fits runs, every byte verified.
    for workload in ["all-reduce", "send-recv", "pipeline", "halo"] {
        let doc = workload_json("pcie-2gpu-switch", &[workload, "--size", "1MiB"]);
        valid_rows(&doc, workload);
    }
}

#[test]
fn absurd_compute_times_are_refused_with_the_range() {
    for value in ["1e308", "1000001", "inf", "NaN"] {
        let (code, stderr) = workload_outcome(
            "pcie-2gpu-switch",
            &["pipeline", "--size", "4KiB", "--compute-us", value],
        );
        assert_eq!(code, Some(2), "{value}: {stderr}");
        assert!(
            stderr.contains("--compute-us must be a positive number of microseconds up to 1000000"),
            "{value}: {stderr}"
        );
    }
    // The top of the range runs.
    let doc = workload_json(
        "pcie-2gpu-switch",
        &["pipeline", "--size", "4KiB", "--compute-us", "1000000"],
    );
    valid_rows(&doc, "pipeline");
}

#[test]
fn nccl_lib_on_the_simulator_says_it_is_not_used() {
    let out = peerlink()
        .args([
            "--sim",
            "pcie-2gpu-switch",
            "workload",
            "send-recv",
            "--size",
            "4KiB",
            "--nccl-lib",
            "/nonexistent/libnccl.so.2",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(
        stderr.contains("peerlink: note: --nccl-lib is not used on the simulator"),
        "{stderr}"
    );
    // Without it, no such note.
    let (code, stderr) = workload_outcome("pcie-2gpu-switch", &["send-recv", "--size", "4KiB"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("--nccl-lib"), "{stderr}");
}
