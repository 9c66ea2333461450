//! The library serving ncclAllReduce for ranks that are each a process of this host, as torchrun
//! starts them: this test starts 2, 4 and 8 processes (this binary again, running the ignored
//! `one_rank_of_a_job` alone), each one rank on its own simulated GPU, with the stand-in NCCL
//! meeting through a directory; every element is checked in every process, and each says on
//! stderr how its communicator was served.

mod standin;

use std::ffi::c_int;
use std::process::{Command, Output};

use peerlink_nccl::ffi::typed::{ncclCommDestroy, ncclCommInitRank, ncclComm_t};
use standin::ranks::{reduce_at_counts, AVG, SUM};

/// Which rank of how many this process is, set by the parent test for its children.
const RANK: &str = "SERVE_PROCESSES_RANK";
const RANKS: &str = "SERVE_PROCESSES_RANKS";

/// Starts `ranks` processes of one job and waits for them all.
fn job(ranks: usize) -> Vec<Output> {
    let meeting = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..ranks)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "one_rank_of_a_job", "--nocapture"])
                .env(RANK, rank.to_string())
                .env(RANKS, ranks.to_string())
                .env(standin::MEETING_DIR, meeting.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    children
        .into_iter()
        .map(|child| child.wait_with_output().unwrap())
        .collect()
}

#[test]
fn ranks_that_are_each_a_process_of_this_host_are_served() {
    for ranks in [2, 4, 8] {
        for (rank, output) in job(ranks).into_iter().enumerate() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let stdout = String::from_utf8_lossy(&output.stdout);
            assert!(
                output.status.success(),
                "rank {rank} of {ranks} failed:\n{stdout}\n{stderr}"
            );
            // The harness runs no test where the filter misses: make sure the rank ran.
            assert!(
                stdout.contains("1 passed"),
                "rank {rank} of {ranks}:\n{stdout}"
            );
            let said = format!("rank {rank} of {ranks}, GPU {rank}; served by peerlink ({ranks} ranks, a process each on this host)");
            assert!(stderr.contains(&said), "rank {rank} of {ranks}:\n{stderr}");
        }
    }
}

/// One rank of [`ranks_that_are_each_a_process_of_this_host_are_served`]'s job.
#[test]
#[ignore = "one rank of a job that ranks_that_are_each_a_process_of_this_host_are_served starts"]
fn one_rank_of_a_job() {
    let var = |name: &str| -> usize { std::env::var(name).unwrap().parse().unwrap() };
    let (rank, ranks) = (var(RANK), var(RANKS));
    standin::install("all", None);
    let mut comm: ncclComm_t = std::ptr::null_mut();
    // Every process's first family: the same id in all of them.
    let id = standin::unique_id(0);
    // SAFETY: a valid out-pointer; the id is the stand-in's.
    assert_eq!(
        unsafe { ncclCommInitRank(&mut comm, ranks as c_int, id, rank as c_int) },
        0
    );
    for op in [SUM, AVG] {
        reduce_at_counts(rank, ranks, comm, op, &[1, 3, 1023, 70_001]);
    }
    assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0);
    assert_eq!(standin::count_of_this_thread("ncclAllGather"), 1);
    // SAFETY: the communicator made above.
    assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
}
