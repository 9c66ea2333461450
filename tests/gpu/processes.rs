//! Across processes on real GPUs (issue 17.2): CUDA IPC handles and shared pinned host memory
//! between two processes, every byte checked on both sides; `peerlink launch -n 2 -- bench` between
//! the two GPUs; `peerlink launch -n 2 -- workload send-recv`, the engine beside NCCL through a
//! communicator across the processes; a rank killed mid-run. The launched tests run the `peerlink` binary found as
//! `PEERLINK_BIN`, else `gpu-carry/peerlink` (scripts/gpu-build.sh; run from the repository root),
//! else cargo's build of it.

#[path = "../processes/share.rs"]
mod share;

#[path = "../processes/group_reduce.rs"]
mod group_reduce;

use peerlink::engine::Strategy;
use serde_json::Value;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

#[test]
#[ignore = "needs a GPU"]
fn a_child_process_moves_bytes_into_gpu_memory_exported_here() {
    let strategies = [Strategy::DirectCe, Strategy::DirectSm];
    share::export_to_a_child_process(
        "cuda",
        "processes::child_imports",
        &strategies,
        share::DeviceMemory::Own,
    );
}

#[test]
#[ignore = "needs a GPU"]
fn a_child_process_moves_bytes_into_another_librarys_memory_borrowed_and_exported_here() {
    // A range inside each allocation (not at its start): cudaMalloc's memory travels as its
    // allocation's IPC handle and the offset, ncclMemAlloc's (mapped) as a file descriptor.
    let strategies = [Strategy::DirectCe, Strategy::DirectSm];
    let offset = 4096 + 13;
    share::export_to_a_child_process(
        "cuda",
        "processes::child_imports",
        &strategies,
        share::DeviceMemory::Borrowed { offset },
    );
    match peerlink::backend::open(&peerlink::backend::Choice::Gpu)
        .map(|opened| opened.backend.collectives().nccl().map(|_| ()))
    {
        Ok(Ok(())) => share::export_to_a_child_process(
            "cuda",
            "processes::child_imports",
            &strategies,
            share::DeviceMemory::BorrowedFromNccl { offset },
        ),
        Ok(Err(why)) => eprintln!("no NCCL, so no ncclMemAlloc memory to export: {why}"),
        Err(e) => panic!("{e}"),
    }
}

#[test]
#[ignore = "needs a GPU"]
fn child_imports() {
    share::child();
}

#[test]
#[ignore = "needs a GPU"]
fn group_all_reduce_sums_and_averages_every_element_across_two_gpu_processes() {
    if gpu_count() < 2 {
        eprintln!("one GPU: the all-reduce across processes needs two");
        return;
    }
    let sizes = [4, 4 << 10, 256 << 10, 1 << 20, 4 << 20, 64 << 20, 256 << 20];
    for out in group_reduce::launch("cuda", "processes::group_reduce_rank", 2, &sizes) {
        for line in out.lines().filter(|l| l.contains("CHECKED")) {
            eprintln!("{line}");
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn group_reduce_rank() {
    group_reduce::rank();
}

/// The peerlink binary to launch.
fn peerlink_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("PEERLINK_BIN") {
        return path.into();
    }
    let carried = PathBuf::from("gpu-carry/peerlink");
    if carried.exists() {
        return carried;
    }
    assert_cmd::cargo::cargo_bin("peerlink")
}

/// How many GPUs this host has, as the backend sees them.
fn gpu_count() -> usize {
    peerlink::backend::cuda::CudaBackend::open()
        .map(|b| peerlink::backend::Backend::topology(&b).devices.len())
        .unwrap_or(0)
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
#[ignore = "needs a GPU"]
fn launched_bench_pushes_every_byte_between_two_gpu_processes() {
    if gpu_count() < 2 {
        eprintln!("launched bench: nothing to check, this host has fewer than 2 GPUs");
        return;
    }
    let out = Command::new(peerlink_binary())
        .args(["launch", "-n", "2", "--timeout", "120", "--"])
        .args([
            "--gpu",
            "bench",
            "--json",
            "--tests",
            "ce-write,ce-read,sm-write,sm-read,staged",
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["source"], "cuda");
    assert!(doc["notes"].to_string().contains("across 2 processes"));
    for test in doc["tests"].as_array().unwrap() {
        let m = &test["matrix"];
        for (src, dst) in [(0, 1), (1, 0)] {
            let gbps = m[src][dst].as_f64().unwrap_or_else(|| {
                panic!(
                    "{} {src}->{dst} not measured: {}",
                    test["name"], test["not_measured"]
                )
            });
            println!(
                "{} GPU {src} -> GPU {dst} across processes: {gbps:.1} GB/s",
                test["name"]
            );
            assert!(gbps > 1.0, "{} {src}->{dst}: {gbps} GB/s", test["name"]);
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn a_gpu_rank_killed_mid_bench_stops_the_other() {
    if gpu_count() < 2 {
        eprintln!("killed rank: nothing to check, this host has fewer than 2 GPUs");
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
        .to_string();
    let timeout_s = 10;
    // 2000 copies of 512 MiB a sample: seconds per pair on NVLink, so the kill lands while rank 0
    // writes into rank 1's memory (the first pair).
    let mut ranks: Vec<_> = (0..2)
        .map(|rank: usize| {
            Command::new(peerlink_binary())
                .args([
                    "--gpu",
                    "bench",
                    "--tests",
                    "ce-write",
                    "--iterations",
                    "2000",
                ])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", "2")
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", "2")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("PEERLINK_TIMEOUT", timeout_s.to_string())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::sleep(Duration::from_secs(6));
    assert!(
        ranks[1].try_wait().unwrap().is_none(),
        "rank 1 ended before the kill"
    );
    ranks[1].kill().unwrap();
    let killed = Instant::now();
    // A rank busy in a measurement stops too (its group's watcher ends it), within the timeout.
    let limit = Duration::from_secs(timeout_s + 2);
    while ranks[0].try_wait().unwrap().is_none() {
        if killed.elapsed() > limit {
            let _ = ranks[0].kill();
            panic!("rank 0 still ran {limit:?} after rank 1 was killed");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let survivor = ranks.remove(0).wait_with_output().unwrap();
    let _ = ranks[0].wait();
    let said = text(&survivor);
    println!(
        "rank 0 stopped {:?} after the kill, status {:?}: {said}",
        killed.elapsed(),
        survivor.status.code()
    );
    // Expected: status 3, naming rank 1. Writing into a dead process's memory may instead end in a
    // CUDA error first (status 1): still a stop, which the print above shows.
    match survivor.status.code() {
        Some(3) => assert!(said.contains("rank 1"), "{said}"),
        Some(1) => assert!(said.contains("failed"), "{said}"),
        other => panic!("rank 0 ended with {other:?}: {said}"),
    }
}

#[test]
#[ignore = "needs a GPU"]
fn ranks_that_each_see_one_gpu_are_refused_with_what_to_launch_instead() {
    // As a launcher that gives each rank its own GPU alone: both ranks see GPU 0 only.
    let out = Command::new(peerlink_binary())
        .args(["launch", "-n", "2", "--timeout", "60", "--"])
        .args(["--gpu", "workload", "all-reduce", "--sizes", "4096"])
        .env("CUDA_VISIBLE_DEVICES", "0")
        .output()
        .unwrap();
    let said = text(&out);
    assert_eq!(out.status.code(), Some(2), "{said}");
    assert!(
        said.contains(
            "rank 1 has LOCAL_RANK 1 but this process sees 1 GPU(s) (CUDA_VISIBLE_DEVICES=0)"
        ) && said.contains("--gpu-bind=none"),
        "{said}"
    );
}

/// `peerlink launch -n 2 -- --gpu workload <workload> --json --sizes <sizes>`: the document, and
/// whether NCCL's rows are there to check (they need NCCL on the host; without it the notice says
/// it was not found, and nothing else may keep them out).
fn launched_workload(workload: &str, sizes: &[&str]) -> (Value, bool) {
    let out = Command::new(peerlink_binary())
        .args(["launch", "-n", "2", "--timeout", "120", "--"])
        .args(["--gpu", "workload", workload, "--json", "--sizes"])
        .arg(sizes.join(","))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out));
    let doc: Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(doc["source"], "cuda");
    let notices = doc["notices"].to_string();
    assert!(notices.contains("across 2 processes"), "{notices}");
    let nccl = !notices.contains("NCCL was not found");
    (doc, nccl)
}

#[test]
#[ignore = "needs a GPU"]
fn launched_send_recv_pushes_every_byte_and_nccl_runs_across_the_processes_beside_it() {
    if gpu_count() < 2 {
        eprintln!("launched send-recv: nothing to check, this host has fewer than 2 GPUs");
        return;
    }
    let sizes = ["4", "65536", "16777216"];
    let (doc, nccl) = launched_workload("send-recv", &sizes);
    let notices = doc["notices"].to_string();
    let rows = doc["rows"].as_array().unwrap();
    for variant in ["one-way", "both"] {
        for bytes in sizes {
            let bytes: u64 = bytes.parse().unwrap();
            let of = |contender: &str| {
                rows.iter()
                    .filter(|r| {
                        r["variant"] == variant
                            && r["bytes"] == bytes
                            && r["contender"] == contender
                    })
                    .collect::<Vec<_>>()
            };
            let expected = [("peerlink", true), ("nccl", nccl)];
            for (contender, wanted) in expected {
                let found = of(contender);
                assert_eq!(
                    !found.is_empty(),
                    wanted,
                    "{contender} {variant} {bytes} B: {notices}"
                );
                for row in found {
                    assert_eq!(row["verified"], true);
                    let us = row["time_us"].as_f64().unwrap();
                    println!(
                        "send-recv {variant} {bytes} B across processes: {contender} {} {us:.2} \
                         µs/op",
                        row["algorithm"]
                    );
                    assert!(us > 0.0, "{row}");
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn launched_all_reduce_sums_every_element_and_nccl_runs_across_the_processes_beside_it() {
    if gpu_count() < 2 {
        eprintln!("launched all-reduce: nothing to check, this host has fewer than 2 GPUs");
        return;
    }
    let sizes = ["4", "65536", "1048576", "16777216", "268435456"];
    let (doc, nccl) = launched_workload("all-reduce", &sizes);
    let notices = doc["notices"].to_string();
    let rows = doc["rows"].as_array().unwrap();
    for bytes in sizes {
        let bytes: u64 = bytes.parse().unwrap();
        let at: Vec<&Value> = rows.iter().filter(|r| r["bytes"] == bytes).collect();
        for contender in ["peerlink", "peerlink-pick"] {
            assert!(
                at.iter().any(|r| r["contender"] == contender),
                "{contender} at {bytes} B"
            );
        }
        assert_eq!(
            at.iter().any(|r| r["contender"] == "nccl"),
            nccl,
            "{notices}"
        );
        for row in at {
            assert_eq!(row["verified"], true);
            let us = row["time_us"].as_f64().unwrap();
            println!(
                "all-reduce {bytes} B across processes: {} {} {us:.2} µs/op",
                row["contender"], row["algorithm"]
            );
            assert!(us > 0.0, "{row}");
        }
    }
}
