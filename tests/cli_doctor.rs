//! `peerlink doctor` on the simulator: exit 1 exactly when a check fails, its JSON document
//! against its published schema, the fake host tree read with `--root`, bad input refused.

mod common;

use common::peerlink;
use predicates::prelude::*;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/doctor")
        .join(name)
        .display()
        .to_string()
}

fn schema() -> Value {
    let path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/schemas/peerlink.doctor-1.schema.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// Runs `doctor --json` on `sim`, checks the exit status and the schema, returns the document.
fn doctor_json(sim: &str, extra: &[&str], exit: i32) -> Value {
    let out = peerlink()
        .args(["--sim", sim, "doctor", "--json"])
        .args(extra)
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(exit),
        "{sim}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document on stdout");
    let validator = jsonschema::validator_for(&schema()).unwrap();
    let errors: Vec<String> = validator.iter_errors(&doc).map(|e| e.to_string()).collect();
    assert!(errors.is_empty(), "{sim}: {errors:?}");
    doc
}

fn failed_checks(doc: &Value) -> Vec<(String, String)> {
    doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["verdict"] == "fail")
        .map(|c| {
            (
                c["check"].as_str().unwrap().to_string(),
                c["subject"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[test]
fn healthy_hosts_exit_0_with_a_schema_valid_document() {
    for sim in [
        "dgx-h100",
        "pcie-4gpu-2socket",
        &fixture("healthy-nvlink.json"),
    ] {
        let doc = doctor_json(sim, &[], 0);
        assert_eq!(doc["schema"], "peerlink.doctor/1");
        assert_eq!(doc["simulated"], true);
        assert_eq!(doc["failed"], false);
        assert_eq!(doc["summary"]["fail"], 0);
        assert!(doc["burst"]["interval_s"].as_f64().unwrap() > 0.0, "{sim}");
    }
}

#[test]
fn each_fault_fails_its_check_and_exits_1() {
    for (preset, check, subject) in [
        ("p2p-off.json", "p2p", "GPU 0 ↔ GPU 1"),
        ("pcie-downgraded.json", "pcie-link", "GPU 1"),
        ("rising-counters.json", "error-counters", "GPU 1"),
    ] {
        let doc = doctor_json(&fixture(preset), &[], 1);
        assert_eq!(doc["failed"], true);
        assert_eq!(
            failed_checks(&doc),
            [(check.to_string(), subject.to_string())],
            "{preset}"
        );
    }
    let doc = doctor_json(&fixture("nvlink-down.json"), &[], 1);
    assert_eq!(doc["summary"]["fail"], 2, "a dead link shows at both ends");
}

#[test]
fn warnings_alone_exit_0() {
    for preset in ["mig-on.json", "slow-clocks.json"] {
        let doc = doctor_json(&fixture(preset), &[], 0);
        assert_eq!(doc["summary"]["warn"], 2, "{preset}");
        assert_eq!(doc["failed"], false);
    }
}

#[test]
fn the_text_shows_evidence_and_fix_and_stderr_names_the_failed_checks() {
    peerlink()
        .args(["--sim", &fixture("p2p-off.json"), "doctor"])
        .assert()
        .code(1)
        .stdout(predicate::str::starts_with("*** SIMULATED host"))
        .stdout(predicate::str::contains(
            "FAIL  p2p             GPU 0 ↔ GPU 1   P2P is off over NV18, where it should work",
        ))
        .stdout(predicate::str::contains(
            "      · the driver's P2P: 0→1 no; 1→0 no",
        ))
        .stdout(predicate::str::contains("      fix: "))
        .stdout(predicate::str::contains("1 fail, 0 warn"))
        .stderr(predicate::str::contains(
            "peerlink: error: 1 check failed: p2p (GPU 0 ↔ GPU 1)",
        ));
}

#[test]
fn root_reads_the_host_tree() {
    let doc = doctor_json(
        &fixture("pcie-p2p-off.json"),
        &["--root", &fixture("host")],
        1,
    );
    let p2p = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "p2p")
        .unwrap();
    let finding = p2p["finding"].as_str().unwrap();
    assert!(
        finding.contains("IOMMU") && finding.contains("ACS"),
        "{finding}"
    );
    let vm = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["check"] == "virtual-machine")
        .unwrap();
    assert!(vm["finding"]
        .as_str()
        .unwrap()
        .contains("µs here (simulated)"));
}

#[test]
fn devices_select_the_gpus_checked() {
    // GPU 1's end of the dead link is down whichever GPUs are checked; only its checks are made.
    let doc = doctor_json(&fixture("nvlink-down.json"), &["--devices", "1"], 1);
    assert_eq!(doc["devices"], serde_json::json!([1]));
    assert_eq!(failed_checks(&doc), [("nvlink".into(), "GPU 1".into())]);
    assert!(doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["devices"] == serde_json::json!([1]) || c["subject"] == "host"));
    // Without its pair, GPU 1 alone has nothing wrong.
    let doc = doctor_json(&fixture("p2p-off.json"), &["--devices", "1"], 0);
    assert_eq!(doc["summary"]["fail"], 0);
}

#[test]
fn bad_input_is_refused_with_exit_2() {
    let missing: PathBuf = std::env::temp_dir().join("peerlink-no-such-root-dir");
    peerlink()
        .args(["--sim", "h200-pair", "doctor", "--root"])
        .arg(&missing)
        .assert()
        .code(2)
        .stderr(predicate::str::contains("not a directory"));
    peerlink()
        .args(["--sim", "h200-pair", "--devices", "5", "doctor"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("GPU 5 does not exist"));
    let broken = tempfile::tempdir().unwrap();
    let preset = broken.path().join("broken.json");
    let mut value: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("p2p-off.json")).unwrap()).unwrap();
    value["faults"]["p2p_off"] = serde_json::json!([[0, 9]]);
    std::fs::write(&preset, value.to_string()).unwrap();
    peerlink()
        .args(["--sim", preset.to_str().unwrap(), "doctor"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "faults.p2p_off[0]: GPU 9 does not exist",
        ));
}

#[test]
fn all_nvlinks_down_fails_as_one_link_down_does() {
    // Issue 34, class 7: all 18 NVLinks of a GPU down is at least as bad as one down.
    let tmp = tempfile::tempdir().unwrap();
    let mut all_down: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("nvlink-down.json")).unwrap())
            .unwrap();
    all_down["faults"]["nvlinks_down"][0]["links"] = (0..18).collect::<Vec<u32>>().into();
    let preset = tmp.path().join("all-down.json");
    std::fs::write(&preset, all_down.to_string()).unwrap();
    let preset = preset.to_str().unwrap();
    let doc = doctor_json(preset, &[], 1);
    let nvlink: Vec<&Value> = doc["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["check"] == "nvlink")
        .collect();
    assert_eq!(nvlink.len(), 2, "{doc}");
    for check in nvlink {
        assert_eq!(check["verdict"], "fail", "{check}");
        assert!(check["finding"]
            .as_str()
            .unwrap()
            .starts_with("none of its 18 NVLinks is up"));
    }
    // One GPU selected: its links are down all the same, as with one link down.
    let doc = doctor_json(preset, &["--devices", "1"], 1);
    assert_eq!(failed_checks(&doc), [("nvlink".into(), "GPU 1".into())]);
}
