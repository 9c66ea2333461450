//! `peerlink plan` on the simulator: the JSON contract, the picks on the presets, bad input.

mod common;

use common::{json_of, peerlink};
use predicates::prelude::*;
use serde_json::Value;

fn plan_json(args: &[&str]) -> Value {
    json_of(&[&["plan", "--json"], args].concat())
}

const STRATEGIES: [&str; 5] = ["direct-ce", "direct-sm", "staged", "relay", "split"];

#[test]
fn json_follows_the_contract() {
    let doc = plan_json(&[
        "--sim",
        "dgx1-v100",
        "--src",
        "0",
        "--dst",
        "5",
        "--size",
        "64MiB",
    ]);
    assert_eq!(doc["schema"], "peerlink.plan/1");
    assert_eq!(doc["source"], "sim:dgx1-v100");
    assert_eq!(doc["simulated"], true);
    assert_eq!(doc["bytes"], 64 << 20);
    let pick = doc["strategy"].as_str().unwrap();
    assert!(STRATEGIES.contains(&pick), "{pick}");
    let predicted = doc["predicted_us"].as_f64().unwrap();
    assert!(predicted > 0.0);
    let alternatives = doc["alternatives"].as_array().unwrap();
    assert!(!alternatives.is_empty());
    for alt in alternatives {
        let name = alt["strategy"].as_str().unwrap();
        assert!(STRATEGIES.contains(&name) && name != pick, "{alt}");
        assert!(alt["predicted_us"].as_f64().unwrap() >= predicted, "{alt}");
    }
    // Every strategy appears once: the pick, an alternative, or unusable with a reason.
    let unusable = doc["unusable"].as_array().unwrap();
    assert_eq!(1 + alternatives.len() + unusable.len(), STRATEGIES.len());
    assert!(unusable
        .iter()
        .all(|u| !u["reason"].as_str().unwrap().is_empty()));
    // The paths cover the transfer.
    let carried: u64 = doc["paths"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["bytes"].as_u64().unwrap())
        .sum();
    assert_eq!(carried, 64 << 20);
}

#[test]
fn picks_on_the_presets() {
    let pick = |preset: &str, src: &str, dst: &str, size: &str| {
        plan_json(&["--sim", preset, "--src", src, "--dst", dst, "--size", size])["strategy"]
            .as_str()
            .unwrap()
            .to_string()
    };
    for size in ["64K", "1MiB", "256MiB"] {
        let dgx1 = pick("dgx1-v100", "0", "5", size);
        assert!(dgx1 == "relay" || dgx1 == "split", "{size}: {dgx1}");
        assert_eq!(pick("pcie-4gpu-2socket", "0", "3", size), "staged");
    }
    // NVSwitch and NVLink peers go direct up to tens of MiB; beyond, the host-staged route (PCIe
    // links and copy engines of its own) joins the NVLink copy in a split.
    for (preset, dst) in [("dgx-h100", "5"), ("h200-pair", "1")] {
        assert_eq!(pick(preset, "0", dst, "1MiB"), "direct-ce");
        assert_eq!(pick(preset, "0", dst, "256MiB"), "split");
    }
}

#[test]
fn text_output_says_it_is_simulated() {
    peerlink()
        .args([
            "plan",
            "--sim",
            "pcie-4gpu-2socket",
            "--src",
            "0",
            "--dst",
            "3",
        ])
        .args(["--size", "8M"])
        .assert()
        .success()
        .stdout(predicate::str::starts_with("*** SIMULATED"))
        .stdout(predicate::str::contains("pick: staged"))
        .stdout(predicate::str::contains("not usable: direct-ce"));
}

#[test]
fn prove_measures_every_strategy_and_reports_the_regret() {
    let doc = plan_json(&[
        "--sim",
        "dgx1-v100",
        "--src",
        "0",
        "--dst",
        "1",
        "--size",
        "4MiB",
        "--prove",
    ]);
    let proof = &doc["proof"];
    let measured = proof["measured"].as_array().unwrap();
    assert_eq!(
        measured.len(),
        1 + doc["alternatives"].as_array().unwrap().len()
    );
    assert!(measured
        .iter()
        .all(|m| m["measured_us"].as_f64().unwrap() > 0.0));
    assert!(proof["regret"].as_f64().unwrap() <= 0.05, "{proof}");
}

#[test]
fn devices_limit_the_relays() {
    let doc = plan_json(&[
        "--sim",
        "dgx1-v100",
        "--devices",
        "0,4,5",
        "--src",
        "0",
        "--dst",
        "5",
        "--size",
        "64MiB",
    ]);
    for path in doc["paths"].as_array().unwrap() {
        if path["route"] == "relay" {
            assert_eq!(path["via"], 4, "{doc}");
        }
    }
}

/// A GPU is its own peer: one-GPU hosts plan (and prove) a device-local transfer.
#[test]
fn a_gpu_to_itself_plans_a_direct_copy_and_proves_it() {
    let out = peerlink()
        .args([
            "plan", "--json", "--sim", "dgx-h100", "--src", "2", "--dst", "2", "--size", "4MiB",
            "--prove",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["strategy"], "direct-ce", "{doc}");
    let alternatives: Vec<&str> = doc["alternatives"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["strategy"].as_str().unwrap())
        .collect();
    assert!(alternatives.contains(&"direct-sm"), "{alternatives:?}");
    assert!(alternatives.contains(&"staged"), "{alternatives:?}");
}

#[test]
fn bad_input_exits_2_with_a_sentence() {
    let cases: [(&[&str], &str); 5] = [
        (&["--src", "0", "--dst", "1", "--size", "0"], "zero"),
        (&["--src", "0", "--dst", "1", "--size", "lots"], "bad size"),
        (
            &["--src", "0", "--dst", "9", "--size", "1M"],
            "GPU 9 does not exist",
        ),
        (
            &["--src", "8", "--dst", "0", "--size", "1M"],
            "GPU 8 does not exist",
        ),
        (
            &[
                "--src",
                "0",
                "--dst",
                "1",
                "--size",
                "1M",
                "--devices",
                "0,2",
            ],
            "GPU 1 is not one of the GPUs in use",
        ),
    ];
    for (args, needle) in cases {
        peerlink()
            .args(["plan", "--sim", "dgx1-v100"])
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(needle))
            .stderr(predicate::str::contains("panicked").not());
    }
}

#[test]
fn a_profile_from_another_host_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("other.json");
    std::fs::write(
        &path,
        r#"{"schema":"peerlink.profile/1","source":"cuda","driver_version":"580.1",
            "gpus":["GPU-elsewhere-0","GPU-elsewhere-1"],
            "hops":[{"kind":"peer-ce","src":0,"dst":1,"alpha_us":3.0,"beta_gbps":20.0}],
            "batch_message_us":null,
            "graph_node_us":null,"issue":null}"#,
    )
    .unwrap();
    peerlink()
        .args([
            "plan",
            "--sim",
            "dgx1-v100",
            "--src",
            "0",
            "--dst",
            "5",
            "--size",
            "1M",
        ])
        .arg("--profile")
        .arg(&path)
        .assert()
        .code(2)
        .stderr(predicate::str::contains(
            "measured on GPUs [GPU-elsewhere-0",
        ));
}

#[test]
fn a_matching_profile_changes_the_prediction() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("mine.json");
    let topo: Value = serde_json::from_slice(
        &peerlink()
            .args(["topo", "--json", "--sim", "pcie-4gpu-2socket"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let uuids: Vec<&str> = topo["devices"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["uuid"].as_str().unwrap())
        .collect();
    let profile = serde_json::json!({
        "schema": "peerlink.profile/1", "source": "sim:pcie-4gpu-2socket",
        "driver_version": topo["driver_version"], "gpus": uuids,
        "hops": [{"kind": "peer-ce", "src": 0, "dst": 1, "alpha_us": 100.0, "beta_gbps": 1.0}],
        "batch_message_us": null, "graph_node_us": null, "issue": null
    });
    std::fs::write(&path, profile.to_string()).unwrap();
    let args = [
        "--sim",
        "pcie-4gpu-2socket",
        "--src",
        "0",
        "--dst",
        "1",
        "--size",
        "1M",
    ];
    let default = plan_json(&args);
    assert_eq!(default["strategy"], "direct-ce");
    let mut with_profile: Vec<&str> = args.to_vec();
    with_profile.extend(["--profile", path.to_str().unwrap()]);
    let measured = plan_json(&with_profile);
    // The profile says the direct path is slow here, so the planner goes another way.
    assert_ne!(measured["strategy"], "direct-ce", "{measured}");
    assert!(measured["model"]
        .as_str()
        .unwrap()
        .contains("measured profile"));
}

#[test]
fn a_batch_of_small_messages_beats_plain_copies_a_hundredfold_on_the_simulator() {
    let doc = json_of(&[
        "plan",
        "--json",
        "--sim",
        "dgx-h100",
        "--src",
        "0",
        "--dst",
        "1",
        "--size",
        "4KiB",
        "--messages",
        "1000",
        "--prove",
    ]);
    assert_eq!(doc["schema"], "peerlink.plan-batch/1");
    assert_eq!(doc["simulated"], true);
    assert_eq!(doc["strategy"], "kernel", "{doc}");
    let proof = &doc["proof"];
    let plain = proof["plain_copies"]["per_message_us"].as_f64().unwrap();
    let engine = proof["engine_one_call"]["per_message_us"].as_f64().unwrap();
    assert!(plain > 100.0 * engine, "plain {plain} vs engine {engine}");
    let names: Vec<&str> = proof["prepared"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    for way in ["kernel", "gather-scatter", "separate", "graph"] {
        assert!(names.contains(&way), "{names:?}");
    }
}

#[test]
fn the_engine_benchmark_sweeps_sizes_with_regret_and_a_plain_copy_baseline() {
    let doc = json_of(&[
        "plan",
        "--json",
        "--sim",
        "dgx1-v100",
        "--src",
        "0",
        "--dst",
        "5",
        "--sizes",
        "4K,1M,16M",
    ]);
    assert_eq!(doc["schema"], "peerlink.plan-sweep/1");
    let points = doc["points"].as_array().unwrap();
    assert_eq!(points.len(), 3);
    for p in points {
        assert!(p["regret"].as_f64().unwrap() <= 0.05, "{p}");
        assert!(p["plain_copy"]["gpu_us"].as_f64().unwrap() > 0.0, "{p}");
        // Without NVLink the engine's relay or split must beat the driver's staged plain copy.
        if p["bytes"].as_u64().unwrap() >= 1 << 20 {
            assert!(p["engine_overhead"].as_f64().unwrap() < 0.0, "{p}");
        }
    }
    assert!(doc["worst_regret"].as_f64().unwrap() <= 0.05);
}

#[test]
fn batch_and_sweep_bad_input_exit_2() {
    for args in [
        vec!["--size", "4K", "--messages", "0"],
        vec!["--sizes", "4K..1K"],
        vec!["--size", "4K", "--sizes", "4K,8K"],
    ] {
        peerlink()
            .args(["plan", "--sim", "dgx-h100", "--src", "0", "--dst", "1"])
            .args(&args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("panicked").not());
    }
}

#[test]
fn concurrent_traffic_reports_each_flow_and_each_way() {
    let doc = plan_json(&[
        "--sim",
        "dgx1-v100",
        "--concurrent",
        "shift:2",
        "--size",
        "1MiB",
    ]);
    assert_eq!(doc["schema"], "peerlink.plan-concurrent/1");
    assert_eq!(doc["source"], "sim:dgx1-v100");
    assert_eq!(doc["traffic"], "shift:2");
    let flows = doc["flows"].as_array().unwrap();
    let pairs: Vec<(u64, u64)> = flows
        .iter()
        .map(|f| (f["src"].as_u64().unwrap(), f["dst"].as_u64().unwrap()))
        .collect();
    assert_eq!(pairs, (0..8).map(|i| (i, (i + 2) % 8)).collect::<Vec<_>>());
    for f in flows {
        assert!(STRATEGIES.contains(&f["pick"].as_str().unwrap()), "{f}");
        assert!(f["alone_us"].as_f64().unwrap() > 0.0, "{f}");
        assert!(f["together_us"].as_f64().unwrap() > 0.0, "{f}");
    }
    let ways = doc["ways"].as_array().unwrap();
    assert!(ways[0]["strategy"].is_null(), "the picks come first");
    assert!(ways.len() >= 2, "{ways:?}");
    assert!(doc["regret"].as_f64().unwrap() >= 0.0);
}

#[test]
fn concurrent_traffic_needs_two_gpus_a_known_pattern_and_no_pair() {
    for args in [
        &[
            "--sim",
            "dgx-h100",
            "plan",
            "--concurrent",
            "ring",
            "--size",
            "1MiB",
        ][..],
        &[
            "--sim",
            "dgx-h100",
            "--devices",
            "3",
            "plan",
            "--concurrent",
            "shift",
            "--size",
            "1MiB",
        ],
        &[
            "--sim",
            "dgx-h100",
            "plan",
            "--concurrent",
            "shift:8",
            "--size",
            "1MiB",
        ],
        &["--sim", "dgx-h100", "plan", "--concurrent", "shift"],
        &[
            "--sim",
            "dgx-h100",
            "plan",
            "--concurrent",
            "shift",
            "--size",
            "1MiB",
            "--src",
            "0",
        ],
    ] {
        peerlink()
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains("panicked").not());
    }
}

#[test]
fn resident_workers_are_offered_with_resident_and_picked_only_for_small_transfers() {
    // A profile in which the worker was measured faster than a copy for a few bytes (unmeasured,
    // it costs what it took on the lent H200 pair, and loses).
    use peerlink::backend::{sim::SimBackend, Backend};
    use peerlink::model::{profile::Measured, Cost, Hop, Profile};
    let sim = SimBackend::open("h200-pair").unwrap();
    let mut profile = Profile::for_host(sim.topology());
    profile.hops = vec![Measured {
        hop: Hop::Resident { src: 0, dst: 1 },
        cost: Cost {
            alpha_us: 1.0,
            beta_gbps: 300.0,
        },
    }];
    let dir = tempfile::tempdir().unwrap();
    let profile_path = dir.path().join("fast-worker.json");
    std::fs::write(&profile_path, serde_json::to_string(&profile).unwrap()).unwrap();
    let profile_path = profile_path.to_str().unwrap();
    let pick = |size: &str, resident: bool| {
        let mut args = vec![
            "--sim",
            "h200-pair",
            "--src",
            "0",
            "--dst",
            "1",
            "--size",
            size,
            "--profile",
            profile_path,
        ];
        if resident {
            args.push("--resident");
        }
        let doc = plan_json(&args);
        let offered = doc["alternatives"]
            .as_array()
            .unwrap()
            .iter()
            .chain(doc["unusable"].as_array().unwrap())
            .any(|s| s["strategy"] == "resident");
        (doc["strategy"].as_str().unwrap().to_string(), offered)
    };
    assert_eq!(pick("4B", true).0, "resident");
    // Large transfers are planned as without workers, where the worker is still offered.
    let (large, offered) = pick("256MiB", true);
    assert_eq!(large, pick("256MiB", false).0);
    assert!(offered);
    // Without workers the strategy is not offered, nor listed as unusable.
    assert!(!pick("4B", false).1);
    assert_ne!(pick("4B", false).0, "resident");
    // The worker's cost is said, on stderr, and the proof runs it and checks its bytes.
    peerlink()
        .args([
            "--sim",
            "h200-pair",
            "plan",
            "--src",
            "0",
            "--dst",
            "1",
            "--size",
            "4KiB",
            "--profile",
            profile_path,
        ])
        .args(["--resident", "--prove"])
        .assert()
        .success()
        .stderr(predicate::str::contains(
            "device-wide synchronisation does not return",
        ))
        .stdout(predicate::str::contains("resident (pick)"));
}
