//! `peerlink tune` on the simulator: the profile it writes, how `plan` uses it, the exported preset.

mod common;

use common::{json_of, peerlink};
use peerlink::backend::sim::Preset;
use predicates::prelude::*;
use serde_json::Value;
use std::path::Path;

/// Runs peerlink with `--json` and `args`, expecting one JSON document.
fn json(args: &[&str]) -> Value {
    json_of(&[&["--json"], args].concat())
}

fn tune(dir: &Path, args: &[&str]) -> Value {
    let out = dir.join("profile.json");
    let mut all = vec!["tune", "--quick", "--out", out.to_str().unwrap()];
    all.extend_from_slice(args);
    let printed = json(&all);
    let written: Value = serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(printed, written, "--json prints the profile it writes");
    written
}

fn beta(profile: &Value, kind: &str, src: u64, dst: u64) -> f64 {
    profile["hops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["kind"] == kind && h["src"] == src && h["dst"] == dst)
        .unwrap_or_else(|| panic!("no {kind} {src}→{dst} in the profile"))["beta_gbps"]
        .as_f64()
        .unwrap()
}

#[test]
fn dgx1_profile_loads_and_plan_picks_as_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let profile = tune(dir.path(), &["--sim", "dgx1-v100"]);
    assert_eq!(profile["schema"], "peerlink.profile/1");
    assert_eq!(profile["source"], "sim:dgx1-v100");
    assert_eq!(profile["gpus"].as_array().unwrap().len(), 8);
    // 0–3 is NV2, 0–1 NV1: twice the links, twice the rate.
    let ratio = beta(&profile, "peer-ce", 0, 3) / beta(&profile, "peer-ce", 0, 1);
    assert!((ratio - 2.0).abs() < 0.05, "NV2/NV1 = {ratio}");
    assert!(profile["issue"]["copy_us"].as_f64().unwrap() > 0.0);

    let path = dir.path().join("profile.json");
    // NV1, NV2, and SYS pairs (no P2P: staged, relayed or split).
    for (src, dst) in [("0", "1"), ("0", "3"), ("0", "5")] {
        for size in ["4K", "1MiB", "64MiB"] {
            let args = [
                "plan",
                "--sim",
                "dgx1-v100",
                "--src",
                src,
                "--dst",
                dst,
                "--size",
                size,
            ];
            let without = json(&args);
            let mut with_args = args.to_vec();
            with_args.extend(["--profile", path.to_str().unwrap()]);
            let with = json(&with_args);
            assert_eq!(
                with["strategy"], without["strategy"],
                "{src}→{dst} at {size}"
            );
            assert!(with["model"].as_str().unwrap().contains("measured profile"));
        }
    }
}

#[test]
fn text_output_names_the_profile_file_and_json_goes_to_stdout_alone() {
    let dir = tempfile::tempdir().unwrap();
    peerlink()
        .current_dir(dir.path())
        .args(["tune", "--quick", "--sim", "pcie-2gpu-switch"])
        .assert()
        .success()
        .stdout(predicate::str::contains("SIMULATED"))
        .stdout(predicate::str::contains("Copy engine write, row → column"))
        .stdout(predicate::str::contains("profile written to"))
        .stdout(predicate::str::contains("peerlink-profile.json"));
    // The default file lands in the working directory.
    let text = std::fs::read_to_string(dir.path().join("peerlink-profile.json")).unwrap();
    assert!(text.contains("\"schema\": \"peerlink.profile/1\""));

    peerlink()
        .current_dir(dir.path())
        .args(["tune", "--quick", "--sim", "pcie-2gpu-switch", "--json"])
        .assert()
        .success()
        .stderr(predicate::str::contains("profile written to"))
        .stdout(predicate::str::starts_with("{"));
}

#[test]
fn a_profile_from_another_host_is_refused_with_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    tune(dir.path(), &["--sim", "pcie-2gpu-switch"]);
    let path = dir.path().join("profile.json");
    peerlink()
        .args(["plan", "--sim", "dgx-h100", "--src", "0", "--dst", "1"])
        .args(["--size", "1MiB", "--profile", path.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("measured on GPUs"))
        .stderr(predicate::str::contains("peerlink tune"));
}

#[test]
fn the_profile_replaces_an_existing_file_whole_and_leaves_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("profile.json");
    std::fs::write(&path, "an older file, longer than nothing at all").unwrap();
    let profile = tune(dir.path(), &["--sim", "pcie-2gpu-switch"]);
    assert_eq!(profile["source"], "sim:pcie-2gpu-switch");
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    assert_eq!(names, ["profile.json"], "no temporary file left behind");
}

#[test]
fn one_gpu_is_measured_as_its_own_peer_and_says_what_it_could_not() {
    let dir = tempfile::tempdir().unwrap();
    let mut preset = Preset::load("pcie-2gpu-switch").unwrap();
    preset.name = "one-gpu".into();
    preset.devices.truncate(1);
    let file = dir.path().join("one-gpu.json");
    std::fs::write(&file, serde_json::to_string(&preset).unwrap()).unwrap();
    let profile = tune(dir.path(), &["--sim", file.to_str().unwrap()]);
    let kinds: Vec<&str> = profile["hops"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["kind"].as_str().unwrap())
        .collect();
    // Its copies to itself are priced by the local copy and the SM-kernel sweep within it.
    assert_eq!(
        kinds,
        [
            "host-to-device",
            "device-to-host",
            "local",
            "peer-ce",
            "peer-sm"
        ]
    );
    let lone: Vec<(&str, u64, u64)> = profile["lone"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            assert!(l["lone_us"].as_f64().unwrap() > 0.0, "{l}");
            (
                l["kind"].as_str().unwrap(),
                l["src"].as_u64().unwrap(),
                l["dst"].as_u64().unwrap(),
            )
        })
        .collect();
    // Both direct methods and a resident worker, the GPU to itself.
    assert_eq!(
        lone,
        [("peer-ce", 0, 0), ("peer-sm", 0, 0), ("resident", 0, 0)]
    );
    assert!(profile["graph_node_us"].as_f64().unwrap() > 0.0);
    let notes = profile["notes"].to_string();
    assert!(notes.contains("no peer pairs"), "{notes}");
}

/// `(src, dst) → (link, p2p)` of a `topo --json` document.
fn links(topo: &Value) -> Vec<(u64, u64, String, bool)> {
    topo["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["src"].as_u64().unwrap(),
                p["dst"].as_u64().unwrap(),
                p["link"].as_str().unwrap().to_string(),
                p["p2p"].as_bool().unwrap(),
            )
        })
        .collect()
}

/// Every measured cell of the `ce-write` matrix, row-major.
fn ce_write(sim: &str) -> Vec<Option<f64>> {
    let doc = json(&["bench", "--sim", sim, "--tests", "ce-write"]);
    doc["tests"][0]["matrix"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|row| row.as_array().unwrap().iter().map(Value::as_f64))
        .collect()
}

#[test]
fn exported_preset_round_trips_the_pcie_host() {
    let dir = tempfile::tempdir().unwrap();
    let exported = dir.path().join("tuned-pcie.json");
    let exported = exported.to_str().unwrap();
    tune(
        dir.path(),
        &["--sim", "pcie-4gpu-2socket", "--export-sim", exported],
    );
    let original_topo = json(&["topo", "--sim", "pcie-4gpu-2socket"]);
    let exported_topo = json(&["topo", "--sim", exported]);
    assert_eq!(exported_topo["source"], "sim:tuned-pcie");
    assert_eq!(links(&exported_topo), links(&original_topo));

    let (was, now) = (ce_write("pcie-4gpu-2socket"), ce_write(exported));
    assert_eq!(
        was.iter().map(Option::is_some).collect::<Vec<_>>(),
        now.iter().map(Option::is_some).collect::<Vec<_>>(),
        "the same pairs are measured"
    );
    for (a, b) in was.iter().zip(&now) {
        if let (Some(a), Some(b)) = (a, b) {
            assert!((b - a).abs() <= 0.1 * a, "{b} GB/s against {a}");
        }
    }
}

#[test]
fn an_unusable_export_name_is_refused_before_measuring() {
    peerlink()
        .args(["tune", "--sim", "pcie-2gpu-switch", "--export-sim", ""])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--export-sim"));
}

#[test]
fn an_output_in_a_missing_directory_exits_2_before_measuring() {
    for flag in ["--out", "--export-sim"] {
        peerlink()
            .args(["tune", "--sim", "pcie-2gpu-switch", "--quick", flag])
            .arg("/nonexistent/peerlink-dir/host.json")
            .assert()
            .code(2)
            .stderr(predicate::str::contains("/nonexistent/peerlink-dir"))
            .stderr(predicate::str::contains("does not exist"));
    }
}
