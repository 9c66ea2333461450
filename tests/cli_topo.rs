//! `peerlink topo` and the CLI's global contract, on the simulator (no GPU needed).

mod common;

use common::{json_of, peerlink};
use predicates::prelude::*;
use serde_json::Value;

fn topo_json(preset: &str) -> Value {
    json_of(&["topo", "--json", "--sim", preset])
}

fn link(doc: &Value, src: u64, dst: u64) -> (String, bool) {
    let pair = doc["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["src"] == src && p["dst"] == dst)
        .unwrap_or_else(|| panic!("no pair {src}->{dst}"));
    (
        pair["link"].as_str().unwrap().to_string(),
        pair["p2p"].as_bool().unwrap(),
    )
}

/// DGX-1's hybrid cube-mesh as `nvidia-smi topo -m` prints it (docs/reference.md).
const DGX1: [[&str; 8]; 8] = [
    ["X", "NV1", "NV1", "NV2", "NV2", "SYS", "SYS", "SYS"],
    ["NV1", "X", "NV2", "NV1", "SYS", "NV2", "SYS", "SYS"],
    ["NV1", "NV2", "X", "NV2", "SYS", "SYS", "NV1", "SYS"],
    ["NV2", "NV1", "NV2", "X", "SYS", "SYS", "SYS", "NV1"],
    ["NV2", "SYS", "SYS", "SYS", "X", "NV1", "NV1", "NV2"],
    ["SYS", "NV2", "SYS", "SYS", "NV1", "X", "NV2", "NV1"],
    ["SYS", "SYS", "NV1", "SYS", "NV1", "NV2", "X", "NV2"],
    ["SYS", "SYS", "SYS", "NV1", "NV2", "NV1", "NV2", "X"],
];

#[test]
fn dgx1_v100_shows_the_hybrid_cube_mesh() {
    let doc = topo_json("dgx1-v100");
    assert_eq!(doc["schema"], "peerlink.topo/1");
    assert_eq!(doc["source"], "sim:dgx1-v100");
    assert_eq!(doc["devices"].as_array().unwrap().len(), 8);
    assert_eq!(doc["pairs"].as_array().unwrap().len(), 56);
    for (src, row) in DGX1.iter().enumerate() {
        for (dst, want) in row.iter().enumerate() {
            if src == dst {
                continue;
            }
            let (got, p2p) = link(&doc, src as u64, dst as u64);
            assert_eq!(&got, want, "GPU{src}->GPU{dst}");
            assert_eq!(p2p, *want != "SYS", "P2P of GPU{src}->GPU{dst}");
        }
    }
}

#[test]
fn two_socket_pcie_host_has_no_p2p_across_sockets() {
    let doc = topo_json("pcie-4gpu-2socket");
    let numa: Vec<i64> = doc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["numa_node"].as_i64().unwrap())
        .collect();
    for pair in doc["pairs"].as_array().unwrap() {
        let (s, d) = (pair["src"].as_u64().unwrap(), pair["dst"].as_u64().unwrap());
        if numa[s as usize] != numa[d as usize] {
            assert_eq!(pair["link"], "SYS", "{pair}");
            assert_eq!(pair["p2p"], false, "{pair}");
        } else {
            assert_eq!(pair["p2p"], true, "{pair}");
        }
    }
    let codes: Vec<&str> = doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["code"].as_str().unwrap())
        .collect();
    assert!(codes.contains(&"no-p2p"), "{codes:?}");
}

#[test]
fn every_preset_satisfies_the_json_contract() {
    for preset in [
        "dgx-h100",
        "dgx1-v100",
        "pcie-4gpu-2socket",
        "pcie-2gpu-switch",
        "h200-pair",
    ] {
        let doc = topo_json(preset);
        let n = doc["devices"].as_array().unwrap().len();
        for d in doc["devices"].as_array().unwrap() {
            for key in ["index", "name", "pci_bus_id", "numa_node"] {
                assert!(d.get(key).is_some(), "{preset}: device lacks {key}");
            }
        }
        let pairs = doc["pairs"].as_array().unwrap();
        assert_eq!(
            pairs.len(),
            n * (n - 1),
            "{preset}: one pair per ordered pair"
        );
        for p in pairs {
            assert_ne!(p["src"], p["dst"], "{preset}");
            for key in ["src", "dst", "link", "p2p", "perf_rank", "atomics"] {
                assert!(p.get(key).is_some(), "{preset}: pair lacks {key}");
            }
        }
    }
}

#[test]
fn dgx_h100_text_has_banner_and_nv18_matrix() {
    peerlink()
        .args(["topo", "--sim", "dgx-h100"])
        .assert()
        .success()
        .stdout(predicate::str::starts_with("*** SIMULATED host `dgx-h100`"))
        .stdout(predicate::str::contains("NV18"))
        .stdout(predicate::str::contains("No problems found."));
}

#[test]
fn devices_restrict_the_report() {
    let out = peerlink()
        .args(["topo", "--json", "--sim", "dgx-h100", "--devices", "1,3"])
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    let indices: Vec<u64> = doc["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["index"].as_u64().unwrap())
        .collect();
    assert_eq!(indices, [1, 3]);
    assert_eq!(doc["pairs"].as_array().unwrap().len(), 2);
}

#[test]
fn devices_out_of_range_exit_2_with_a_sentence() {
    peerlink()
        .args(["topo", "--sim", "pcie-2gpu-switch", "--devices", "0,5"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("GPU 5 does not exist"))
        .stderr(predicate::str::contains("panicked").not());
}

#[test]
fn unknown_preset_exits_2_and_lists_the_known_ones() {
    peerlink()
        .args(["topo", "--sim", "dgx-b300"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("dgx-h100"))
        .stderr(predicate::str::contains("dgx1-v100"))
        .stderr(predicate::str::contains("pcie-4gpu-2socket"));
}

#[test]
fn preset_file_that_is_not_json_exits_2_with_line_and_column() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.json");
    std::fs::write(&path, "{\n  \"name\": \"x\",\n  oops\n}\n").unwrap();
    peerlink()
        .args(["topo", "--sim", path.to_str().unwrap()])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("line 3"))
        .stderr(predicate::str::contains("column"));
}

/// docs/sim-format.md's example, so the inconsistent variants below differ from a valid preset in
/// exactly one place.
fn documented_example() -> Value {
    let doc = std::fs::read_to_string("docs/sim-format.md").unwrap();
    let json = doc
        .split("```json")
        .nth(1)
        .and_then(|rest| rest.split("```").next())
        .expect("docs/sim-format.md has a JSON example");
    serde_json::from_str(json).unwrap()
}

fn topo_with_preset(preset: &Value) -> assert_cmd::assert::Assert {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("host.json");
    std::fs::write(&path, serde_json::to_string_pretty(preset).unwrap()).unwrap();
    peerlink()
        .args(["topo", "--sim", path.to_str().unwrap()])
        .assert()
}

#[test]
fn documented_preset_example_works() {
    topo_with_preset(&documented_example())
        .success()
        .stdout(predicate::str::contains("*** SIMULATED host `my-3gpu`"))
        .stdout(predicate::str::contains("NV2"));
}

#[test]
fn inconsistent_presets_exit_2_saying_what_is_wrong() {
    let mut dangling = documented_example();
    dangling["links"][0]["gpus"] = serde_json::json!([0, 7]);
    topo_with_preset(&dangling)
        .code(2)
        .stderr(predicate::str::contains("simulator preset"))
        .stderr(predicate::str::contains("7"))
        .stderr(predicate::str::contains("panicked").not());

    let mut negative = documented_example();
    negative["pcie"]["host_gbps"] = serde_json::json!(-26);
    topo_with_preset(&negative)
        .code(2)
        .stderr(predicate::str::contains("host_gbps"))
        .stderr(predicate::str::contains("panicked").not());
}

#[test]
fn missing_preset_file_exits_2() {
    peerlink()
        .args(["topo", "--sim", "/nonexistent/host.json"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("/nonexistent/host.json"));
}

#[test]
fn unknown_flag_exits_2() {
    peerlink()
        .args(["topo", "--frobnicate"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("--frobnicate"));
}

/// CI machines have no NVIDIA driver: the default falls back to the simulator and says so in one line.
#[test]
fn no_driver_falls_back_to_simulated_dgx_h100() {
    if std::path::Path::new("/proc/driver/nvidia").exists() {
        return; // a GPU host: the fallback does not apply
    }
    let out = peerlink().args(["topo", "--json"]).output().unwrap();
    assert!(out.status.success());
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["source"], "sim:dgx-h100");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("SIMULATED"), "{stderr}");

    peerlink()
        .args(["--gpu", "topo"])
        .assert()
        .code(1)
        .stderr(predicate::str::contains("no NVIDIA GPU can be used"));
}
