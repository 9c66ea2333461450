//! Several hosts, on the simulator only: presets of two hosts with NICs and a network, `topo`
//! showing hosts and NICs, `plan` choosing between GPUDirect RDMA and a staged network route,
//! workloads across hosts (NCCL's rows, labelled simulated), and what is refused with a sentence.

mod common;

use common::{json_of, peerlink};
use predicates::prelude::*;
use serde_json::Value;

const DUMP: &str = "tests/fixtures/nccl/dgx-h100-topo.xml";

/// Two PCIe hosts, one NIC each on the first socket.
const PCIE_HOSTS: &str = "2x-pcie-4gpu-2socket";

/// peerlink on [`PCIE_HOSTS`] with the words of `command`.
fn on_pcie_hosts(command: &str) -> assert_cmd::assert::Assert {
    peerlink()
        .args(["--sim", PCIE_HOSTS])
        .args(command.split_whitespace())
        .assert()
}

fn plan(preset: &str, src: &str, dst: &str, size: &str) -> Value {
    json_of(&[
        "--sim", preset, "plan", "--src", src, "--dst", dst, "--size", size, "--json",
    ])
}

#[test]
fn two_dgx_h100_hosts_show_their_gpus_nics_and_network() {
    let doc = json_of(&["--sim", "2x-dgx-h100", "topo", "--json"]);
    assert_eq!(doc["simulated"], true);
    assert_eq!(doc["devices"].as_array().unwrap().len(), 16);
    let across = doc["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["src"] == 7 && p["dst"] == 8)
        .unwrap();
    assert_eq!(
        (across["link"].as_str(), across["p2p"].as_bool()),
        (Some("NET"), Some(false))
    );
    let net = &doc["network"];
    assert_eq!(net["hosts"].as_array().unwrap().len(), 2);
    assert_eq!(net["hosts"][1]["gpus"][0], 8);
    assert_eq!(net["nics"].as_array().unwrap().len(), 16);
    assert_eq!(net["nics"][0]["rate_gbit"], 400.0);
    assert_eq!(net["fabric"]["kind"], "rail");
    for nearest in net["nearest"].as_array().unwrap() {
        assert_eq!(nearest["link"], "PIX", "{nearest}");
        assert_eq!(nearest["gpudirect_benefit"], true);
    }
    let warnings: Vec<&str> = doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w["code"].as_str().unwrap())
        .collect();
    assert!(warnings.is_empty(), "{warnings:?}");

    peerlink()
        .args(["--sim", "2x-dgx-h100", "topo"])
        .assert()
        .success()
        .stdout(predicate::str::starts_with("*** SIMULATED"))
        .stdout(predicate::str::contains(
            "Hosts: host0 (GPUs 0-7, NICs 0-7); host1 (GPUs 8-15, NICs 8-15)",
        ))
        .stdout(predicate::str::contains("RDMA NICs (preset)"))
        .stdout(predicate::str::contains("NET  = different hosts"))
        .stdout(predicate::str::contains("Network: rail-optimised"));
}

#[test]
fn gpus_whose_only_nic_is_across_the_sockets_are_flagged() {
    let doc = json_of(&["--sim", "2x-pcie-4gpu-2socket", "topo", "--json"]);
    let far = doc["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["code"] == "nic-across-cpu")
        .expect("a nic-across-cpu warning");
    assert_eq!(far["devices"], serde_json::json!([2, 3, 6, 7]));
    // The GPUs asked for only.
    let some = json_of(&[
        "--sim",
        "2x-pcie-4gpu-2socket",
        "topo",
        "--devices",
        "0,1",
        "--json",
    ]);
    assert!(some["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .all(|w| w["code"] != "nic-across-cpu"));
    assert_eq!(some["network"]["nearest"].as_array().unwrap().len(), 2);
}

#[test]
fn plan_takes_gpudirect_rdma_next_to_the_nic_and_stages_across_the_sockets() {
    let near = plan("2x-dgx-h100", "0", "8", "64MiB");
    assert_eq!(near["simulated"], true);
    assert_eq!(near["strategy"], "gpudirect-rdma");
    assert_eq!(near["paths"][0]["route"], "gpudirect-rdma");
    assert_eq!(near["alternatives"][0]["strategy"], "net-staged");
    assert!(near["predicted_gbps"].as_f64().unwrap() > 40.0, "{near}");

    let far = plan("2x-pcie-4gpu-2socket", "2", "6", "64MiB");
    assert_eq!(far["strategy"], "net-staged");
    assert_eq!(far["paths"][0]["route"], "net-staged");
    let rdma = far["alternatives"][0]["predicted_us"].as_f64().unwrap();
    assert!(rdma > far["predicted_us"].as_f64().unwrap(), "{far}");
    // A few bytes go in one RDMA operation even there; next to the NIC it wins at every size.
    assert_eq!(
        plan("2x-pcie-4gpu-2socket", "2", "6", "4KiB")["strategy"],
        "gpudirect-rdma"
    );
    assert_eq!(
        plan("2x-pcie-4gpu-2socket", "1", "4", "64MiB")["strategy"],
        "gpudirect-rdma"
    );

    on_pcie_hosts("plan --src 2 --dst 6 --size 64MiB")
        .success()
        .stdout(predicate::str::contains("pick: net-staged"))
        .stdout(predicate::str::contains(
            "network: GPU 2 → mlx5_0 of host0 (SYS) → mlx5_0 of host1 (SYS) → GPU 6",
        ));
}

#[test]
fn all_reduce_across_hosts_runs_nccls_model_labelled_simulated() {
    let doc = json_of(&[
        "--sim",
        "2x-dgx-h100",
        "workload",
        "all-reduce",
        "--sizes",
        "4KiB,64KiB",
        "--json",
    ]);
    assert_eq!(doc["simulated"], true);
    assert_eq!(doc["devices"].as_array().unwrap().len(), 16);
    let rows = doc["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "NCCL's two rows: {rows:?}");
    for row in rows {
        assert_eq!(row["contender"], "nccl", "{row}");
        assert_eq!(row["simulated"], true);
        assert_eq!(row["verified"], true);
    }
    let notices = doc["notices"].to_string();
    assert!(notices.contains("different hosts"), "{notices}");
    // Each host alone is faster than both together: the network steps cost more than NVLink's.
    let one_host = json_of(&[
        "--sim",
        "2x-dgx-h100",
        "workload",
        "all-reduce",
        "--sizes",
        "4KiB",
        "--devices",
        "0,1,2,3,4,5,6,7",
        "--json",
    ]);
    let nccl_us = |doc: &Value| {
        doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["contender"] == "nccl")
            .unwrap()["time_us"]
            .as_f64()
            .unwrap()
    };
    assert!(nccl_us(&one_host) < nccl_us(&doc));
}

#[test]
fn send_recv_across_hosts_leaves_the_engine_out_and_says_why() {
    on_pcie_hosts("workload send-recv --sizes 4KiB --direction one-way")
        .success()
        .stdout(predicate::str::contains("ncclSend/ncclRecv"))
        .stdout(predicate::str::contains("engine").not())
        .stderr(predicate::str::contains(
            "the engine's transfers move data within one host",
        ));
}

#[test]
fn what_runs_within_one_host_only_is_refused_across_hosts() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("profile.json");
    let preset = dir.path().join("preset.json");
    let (out, preset) = (out.to_str().unwrap(), preset.to_str().unwrap());
    for (args, needle) in [
        (
            &["workload", "pipeline", "--size", "4KiB"][..],
            "workload pipeline runs within one host",
        ),
        (
            &["workload", "halo", "--size", "4KiB"],
            "workload halo runs within one host",
        ),
        (
            &[
                "plan", "--src", "0", "--dst", "4", "--size", "1MiB", "--prove",
            ],
            "are on different hosts",
        ),
        (
            &["explain", "--src", "1", "--dst", "5"],
            "are on different hosts",
        ),
        (&["topo", "--nccl"], "needs real GPUs"),
        (&["tune", "--quick", "--out", out], "tune measures one host"),
        (
            &[
                "tune",
                "--quick",
                "--devices",
                "4,5",
                "--out",
                out,
                "--export-sim",
                preset,
            ],
            "--export-sim writes a preset of one host",
        ),
    ] {
        peerlink()
            .args(["--sim", "2x-pcie-4gpu-2socket"])
            .args(args)
            .assert()
            .code(2)
            .stderr(predicate::str::contains(needle));
    }
    // Within one host of them, as on any host.
    on_pcie_hosts("workload pipeline --size 4KiB --devices 4,5").success();
}

#[test]
fn nccls_dump_is_compared_with_the_hosts_nics() {
    // Host 0 of two DGX H100s, beside a canned dump of such a host.
    let host0 = [
        "--sim",
        "2x-dgx-h100",
        "topo",
        "--devices",
        "0,1,2,3,4,5,6,7",
    ];
    let args = [&host0[..], &["--nccl-xml", DUMP]].concat();
    let doc = json_of(&[&args[..], &["--json"]].concat());
    let view = &doc["nccl"];
    assert_eq!(view["gpus"].as_array().unwrap().len(), 8);
    let differs = view["disagreements"].as_array().unwrap();
    assert_eq!(differs.len(), 3, "{differs:?}");
    peerlink()
        .args(&args)
        .assert()
        .success()
        .stdout(predicate::str::contains("NCCL's view"))
        .stdout(predicate::str::contains("PHB≠PIX"))
        .stdout(predicate::str::contains(
            "NCCL does not use the RDMA NIC mlx5_7",
        ));
    peerlink()
        .args(host0)
        .args(["--nccl-xml", "tests/fixtures/nccl/README.md"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("is not an NCCL topology dump"));
}

#[test]
fn a_preset_of_several_hosts_without_a_network_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let mut preset: Value =
        serde_json::from_str(include_str!("../src/topology/presets/2x-dgx-h100.json")).unwrap();
    preset.as_object_mut().unwrap().remove("network");
    let path = dir.path().join("no-network.json");
    std::fs::write(&path, preset.to_string()).unwrap();
    peerlink()
        .args(["--sim", path.to_str().unwrap(), "topo"])
        .assert()
        .code(2)
        .stderr(predicate::str::contains("no `network` section"));
}
