//! `peerlink bench` and `peerlink workload send-recv` as several real processes on one simulated
//! host, one per GPU: started by `peerlink launch`, or by hand with the variables a launcher sets
//! (torchrun's, which `peerlink launch` sets too, so that a test can kill one rank), meeting at a
//! rendezvous on the loopback. Every byte a writer pushes into the other process's buffer is
//! checked by the process that owns it; a rank killed mid-run stops the others within the timeout.
//! Every wait is bounded.

mod common;

use common::json_of;
use serde_json::Value;
use std::net::TcpListener;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A port nobody listens on now, for the rendezvous.
fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().port()
}

/// Starts `world` ranks of `peerlink --sim <preset> <args>`, rank r on GPU r, waiting `timeout_s`
/// for each other.
fn start_ranks(world: usize, preset: &str, args: &[&str], timeout_s: u32) -> Vec<Child> {
    let port = free_port().to_string();
    (0..world)
        .map(|rank| {
            Command::new(assert_cmd::cargo::cargo_bin("peerlink"))
                .args(["--sim", preset])
                .args(args)
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", &port)
                .env("PEERLINK_TIMEOUT", timeout_s.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect()
}

/// Each rank's output, once all have ended; a rank still running after `limit` is killed and
/// fails the test.
fn finish(ranks: Vec<Child>, limit: Duration) -> Vec<Output> {
    let deadline = Instant::now() + limit;
    let mut ranks: Vec<Option<Child>> = ranks.into_iter().map(Some).collect();
    while ranks
        .iter_mut()
        .flatten()
        .any(|child| child.try_wait().unwrap().is_none())
    {
        if Instant::now() > deadline {
            for child in ranks.iter_mut().flatten() {
                let _ = child.kill();
            }
            panic!("some rank still ran after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ranks
        .iter_mut()
        .map(|child| child.take().unwrap().wait_with_output().unwrap())
        .collect()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `world` ranks of `args` (a verb and its options) to success and returns rank 0's document
/// (the others print nothing).
fn across(world: usize, preset: &str, args: &[&str]) -> Value {
    let mut all = args.to_vec();
    all.push("--json");
    let outs = finish(
        start_ranks(world, preset, &all, 20),
        Duration::from_secs(120),
    );
    for (rank, out) in outs.iter().enumerate() {
        assert!(out.status.success(), "rank {rank}: {}", stderr(out));
    }
    for out in &outs[1..] {
        assert!(out.stdout.is_empty(), "only rank 0 prints");
    }
    serde_json::from_slice(&outs[0].stdout).expect("rank 0 prints one JSON document")
}

/// The matrix of the test named `name`.
fn matrix<'a>(doc: &'a Value, name: &str) -> &'a Vec<Value> {
    let test = doc["tests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no test {name}"));
    test["matrix"].as_array().unwrap()
}

#[test]
fn two_processes_measure_every_pair_as_one_process_does_and_rank_0_prints_one_document() {
    let args = [
        "--tests",
        "ce-write,ce-read,sm-write,sm-read,staged",
        "--size",
        "1MiB",
    ];
    let mut launched = vec![
        "launch",
        "-n",
        "2",
        "--",
        "--sim",
        "pcie-2gpu-switch",
        "bench",
    ];
    launched.extend(["--json"].iter().chain(&args));
    let doc = json_of(&launched);
    assert_eq!(doc["schema"], "peerlink.bench/1");
    assert_eq!(doc["simulated"], true);
    let notes = doc["notes"].to_string();
    assert!(notes.contains("across 2 processes"), "{notes}");
    let mut single = vec!["bench", "--json", "--sim", "pcie-2gpu-switch"];
    single.extend(args);
    let alone = json_of(&single);
    for name in ["ce-write", "ce-read", "sm-write", "sm-read", "staged"] {
        let (across, one) = (matrix(&doc, name), matrix(&alone, name));
        for (src, dst) in [(0, 1), (1, 0)] {
            let figure = across[src][dst].as_f64().unwrap();
            assert!(figure > 0.0, "{name} {src}->{dst}");
            // The same copies on the same simulated links: the same figure (but for rounding: each
            // process's virtual clock reads other times).
            let alone = one[src][dst].as_f64().unwrap();
            assert!(
                (figure / alone - 1.0).abs() < 1e-9,
                "{name} {src}->{dst}: {figure} {alone}"
            );
        }
    }
}

#[test]
fn three_processes_measure_the_six_pairs_of_their_gpus_and_no_other() {
    let doc = across(
        3,
        "dgx-h100",
        &["bench", "--tests", "ce-write", "--size", "1MiB"],
    );
    let m = matrix(&doc, "ce-write");
    for (src, row) in m.iter().enumerate() {
        for (dst, cell) in row.as_array().unwrap().iter().enumerate() {
            let ours = src < 3 && dst < 3 && src != dst;
            assert_eq!(cell.as_f64().is_some_and(|v| v > 0.0), ours, "{src}->{dst}");
        }
    }
    assert_eq!(doc["devices"], serde_json::json!([0, 1, 2]));
}

/// Starts 3 ranks of `args` (long enough that a kill lands inside a measurement, where a rank
/// calls no collective until it is done), kills rank 1 after 3 s, and checks that the others stop
/// within the timeout, with status 3, naming rank 1 and printing no partial document.
fn a_rank_killed_mid_run_stops_the_others(args: &[&str]) {
    let timeout_s = 5;
    let mut ranks = start_ranks(3, "dgx-h100", args, timeout_s);
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        ranks[1].try_wait().unwrap().is_none(),
        "rank 1 ended before the kill: make the run longer"
    );
    ranks[1].kill().unwrap();
    let killed_at = Instant::now();
    let outs = finish(ranks, Duration::from_secs(u64::from(timeout_s) + 60));
    let took = killed_at.elapsed();
    assert!(
        took < Duration::from_secs(u64::from(timeout_s) + 2),
        "the others took {took:?} to stop (timeout {timeout_s} s)"
    );
    for rank in [0, 2] {
        let out = &outs[rank];
        let text = stderr(out);
        assert_eq!(out.status.code(), Some(3), "rank {rank}: {text}");
        assert!(
            text.contains("rank 1"),
            "rank {rank} should name rank 1: {text}"
        );
        assert!(
            out.stdout.is_empty(),
            "rank {rank} printed a partial document"
        );
    }
}

#[test]
fn a_rank_killed_mid_run_stops_the_others_within_the_timeout() {
    // Many seconds per pair, far more than the timeout.
    a_rank_killed_mid_run_stops_the_others(&[
        "bench",
        "--tests",
        "ce-write",
        "--size",
        "64MiB",
        "--iterations",
        "400",
    ]);
}

/// Runs `world` ranks of `args` and checks that every rank refuses them (exit 2) saying `says`.
fn refused_on_every_rank(world: usize, preset: &str, args: &[&str], says: &str) {
    let outs = finish(
        start_ranks(world, preset, args, 20),
        Duration::from_secs(60),
    );
    for (rank, out) in outs.iter().enumerate() {
        let text = stderr(out);
        assert_eq!(out.status.code(), Some(2), "rank {rank}: {text}");
        assert!(text.contains(says), "rank {rank}: {text}");
    }
}

#[test]
fn a_test_that_does_not_run_across_processes_is_refused_on_every_rank() {
    refused_on_every_rank(
        2,
        "pcie-2gpu-switch",
        &["bench", "--tests", "ce-bidir-write"],
        "ce-write, ce-read, sm-write",
    );
}

#[test]
fn more_ranks_than_gpus_are_refused_on_every_rank() {
    refused_on_every_rank(
        3,
        "h200-pair",
        &["workload", "all-reduce", "--sizes", "4096"],
        "rank 2 has LOCAL_RANK 2 but this host has 2 GPUs: launch at most one process per GPU",
    );
}

/// The peerlink rows of a workload document: (variant, bytes, algorithm, µs per operation).
fn engine_rows(doc: &Value) -> Vec<(String, u64, String, f64)> {
    doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["contender"] == "peerlink")
        .map(|r| {
            assert_eq!(r["verified"], true, "{r}");
            (
                r["variant"].as_str().unwrap().to_string(),
                r["bytes"].as_u64().unwrap(),
                r["algorithm"].as_str().unwrap().to_string(),
                r["time_us"].as_f64().unwrap(),
            )
        })
        .collect()
}

/// Checks that `across` (a run over processes) has the rows of `alone` (the same run in one
/// process), every figure the same: the same transfers on the same simulated links.
fn same_engine_rows(across: &Value, alone: &Value) {
    let (across, alone) = (engine_rows(across), engine_rows(alone));
    assert_eq!(across.len(), alone.len(), "{across:?} {alone:?}");
    assert!(!across.is_empty());
    for (a, b) in across.iter().zip(&alone) {
        assert_eq!((&a.0, a.1, &a.2), (&b.0, b.1, &b.2));
        assert!(a.3 > 0.0 && (a.3 / b.3 - 1.0).abs() < 1e-9, "{a:?} {b:?}");
    }
}

#[test]
fn send_recv_over_two_processes_moves_every_byte_as_one_process_does() {
    let args = ["workload", "send-recv", "--sizes", "4KiB,1MiB", "--json"];
    let mut launched = vec!["launch", "-n", "2", "--", "--sim", "h200-pair"];
    launched.extend(args);
    let doc = json_of(&launched);
    assert_eq!(doc["schema"], "peerlink.workload/1");
    assert_eq!(doc["simulated"], true);
    assert_eq!(doc["process_layout"], "rank-per-process");
    let notices = doc["notices"].to_string();
    assert!(
        notices.contains("across 2 processes, one per GPU"),
        "{notices}"
    );
    // NCCL across processes is not simulated: its rows are left out, and the document says why.
    assert!(
        notices.contains("NCCL across processes is not simulated"),
        "{notices}"
    );
    assert!(doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["contender"] != "nccl"));
    let mut single = vec!["--sim", "h200-pair"];
    single.extend(args);
    let alone = json_of(&single);
    assert_eq!(alone["process_layout"], "one-process");
    same_engine_rows(&doc, &alone);
}

#[test]
fn send_recv_over_three_processes_matches_one_process_on_their_gpus() {
    let doc = across(
        3,
        "dgx-h100",
        &["workload", "send-recv", "--sizes", "64KiB,4MiB"],
    );
    assert_eq!(doc["devices"], serde_json::json!([0, 1, 2]));
    let alone = json_of(&[
        "--sim",
        "dgx-h100",
        "--devices",
        "0,1,2",
        "workload",
        "send-recv",
        "--sizes",
        "64KiB,4MiB",
        "--json",
    ]);
    same_engine_rows(&doc, &alone);
}

#[test]
fn a_rank_killed_mid_workload_stops_the_others_within_the_timeout() {
    a_rank_killed_mid_run_stops_the_others(&[
        "workload",
        "send-recv",
        "--sizes",
        "64MiB",
        "--iters",
        "400",
    ]);
}

#[test]
fn a_workload_that_does_not_run_across_processes_is_refused_on_every_rank() {
    refused_on_every_rank(
        2,
        "pcie-2gpu-switch",
        &["workload", "halo"],
        "across processes: all-reduce, send-recv",
    );
}

/// The all-reduce rows of a document across `world` processes: every kernel that takes each
/// size, and the pick, all verified; NCCL's left out on the simulator, with the reason.
fn all_reduce_across(world: usize, preset: &str, sizes: &[u64]) {
    let list: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let doc = across(
        world,
        preset,
        &["workload", "all-reduce", "--sizes", &list.join(",")],
    );
    let notices = doc["notices"].to_string();
    assert!(
        notices.contains(&format!("across {world} processes, one per GPU")),
        "{notices}"
    );
    assert!(
        notices.contains("engine::all_reduce::GroupAllReduce"),
        "{notices}"
    );
    assert!(
        notices.contains("NCCL across processes is not simulated"),
        "{notices}"
    );
    let rows = doc["rows"].as_array().unwrap();
    for &bytes in sizes {
        let at: Vec<&Value> = rows.iter().filter(|r| r["bytes"] == bytes).collect();
        let kernels: Vec<&str> = at
            .iter()
            .filter(|r| r["contender"] == "peerlink")
            .map(|r| r["algorithm"].as_str().unwrap())
            .collect();
        let takers = if bytes <= 256 << 10 { 3 } else { 2 };
        assert_eq!(kernels.len(), takers, "{bytes} B: {kernels:?}");
        let pick = at
            .iter()
            .find(|r| r["contender"] == "peerlink-pick")
            .expect("the pick's row");
        assert!(kernels.contains(&pick["algorithm"].as_str().unwrap()));
        assert!(pick["regret"].as_f64().unwrap() >= 0.0);
        for r in &at {
            assert_eq!(r["verified"], true, "{r}");
            assert!(r["time_us"].as_f64().unwrap() > 0.0, "{r}");
            assert_ne!(r["contender"], "nccl", "{r}");
        }
    }
}

#[test]
fn all_reduce_over_two_processes_sums_every_element_by_every_kernel() {
    all_reduce_across(2, "h200-pair", &[4 << 10, 1 << 20]);
}

#[test]
fn all_reduce_over_three_processes_grows_its_shared_buffers() {
    all_reduce_across(3, "dgx-h100", &[64 << 10, 4 << 20]);
}

/// Issue 34: the first Ctrl-C of a workload across processes prints every size finished before it,
/// marked partial, as in one process. The small sizes are done well before the signal; the last
/// takes seconds (send-recv) to minutes (all-reduce), so the stop always falls in it.
#[test]
fn a_stop_across_processes_keeps_every_size_finished_before_it() {
    use common::interrupt::{interrupt, wrong};
    for workload in ["all-reduce", "send-recv"] {
        let args: Vec<String> = [
            "launch",
            "-n",
            "2",
            "--",
            "--sim",
            "h200-pair",
            "workload",
            workload,
            "--sizes",
            "4KiB,64KiB,256MiB",
            "--iters",
            "50",
            "--json",
        ]
        .map(String::from)
        .to_vec();
        let stopped = interrupt(&args, Duration::from_millis(SMALL_SIZES_DONE_MS))
            .unwrap_or_else(|| panic!("{workload} ended before the signal"));
        println!(
            "{workload}: exit {:?} {:.3} s after SIGINT",
            stopped.code,
            stopped.took.as_secs_f64()
        );
        let wrong = wrong("partial", &stopped);
        assert!(wrong.is_empty(), "{workload}: {wrong:?}");
        let doc: Value = serde_json::from_slice(&stopped.stdout).unwrap();
        let sizes: Vec<u64> = doc["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["bytes"].as_u64().unwrap())
            .collect();
        for finished in [4 << 10, 64 << 10] {
            assert!(
                sizes.contains(&finished),
                "{workload}: {finished} B lost: {sizes:?}"
            );
        }
        assert!(!sizes.contains(&(256 << 20)), "{workload}: {sizes:?}");
    }
}

/// When the small sizes of the test above are done on a loaded two-core machine (0.15 s idle,
/// start-up included).
const SMALL_SIZES_DONE_MS: u64 = 1500;
