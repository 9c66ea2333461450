//! The library serving ncclAllReduce for ranks that are each a process of this host, as torchrun
//! starts them: this test starts 2, 4 and 8 processes (this binary again, running the ignored
//! `one_rank_of_a_job` alone), each one rank on its own simulated GPU, with the stand-in NCCL
//! meeting through a directory; every element is checked in every process, and each says on
//! stderr how its communicator was served. Then NCCL's waiting contract: a rank 30 s late (in
//! simulated time) is waited for, a rank that dies is reported by `ncclCommGetAsyncError` and its
//! peer's waiting call released, and `ncclCommAbort` releases a call waiting for a peer that never
//! comes; a group setting up two communicators, held in crossed orders by the two processes,
//! meets at once; a symmetric window of each process is shared and summed in place.

mod standin;

use std::ffi::c_int;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use peerlink_nccl::ffi::typed::{
    ncclCommAbort, ncclCommDestroy, ncclCommGetAsyncError, ncclCommInitRank,
    ncclCommWindowDeregister, ncclComm_t, ncclGroupEnd, ncclGroupStart,
};
use standin::ranks::{
    capture_stream_of, captured_sum_replays, in_group, reduce_at_counts, register_window,
    replays_after_the_shared_buffers_grow, stream_of, sum_f32, sums_in_a_window, Reduce, AVG, SUM,
    SYMMETRIC,
};

/// Which rank of how many this process is, and what the job does, set by the parent test for
/// its children.
const RANK: &str = "SERVE_PROCESSES_RANK";
const RANKS: &str = "SERVE_PROCESSES_RANKS";
const SCENARIO: &str = "SERVE_PROCESSES_SCENARIO";

/// ncclRemoteError.
const REMOTE_ERROR: c_int = 6;

/// Starts `ranks` processes of one job doing `scenario` and waits for them all.
fn job(ranks: usize, scenario: &str) -> Vec<Output> {
    let meeting = tempfile::tempdir().unwrap();
    let children: Vec<_> = (0..ranks)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "one_rank_of_a_job", "--nocapture"])
                .env(RANK, rank.to_string())
                .env(RANKS, ranks.to_string())
                .env(SCENARIO, scenario)
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

/// Fails unless rank `rank`'s process of a job of `ranks` passed its part (the harness runs no
/// test where the filter misses: "1 passed" shows the rank ran); returns its stderr.
fn passed(rank: usize, ranks: usize, output: &Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr);
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "rank {rank} of {ranks} failed:\n{stdout}\n{stderr}"
    );
    stderr.into_owned()
}

#[test]
fn a_job_of_one_rank_is_served_by_every_kernel() {
    let output = &job(1, "alone")[0];
    let stderr = passed(0, 1, output);
    let said = "rank 0 of 1, GPU 0; served by peerlink (one rank: its kernel sums with no one)";
    assert!(stderr.contains(said), "{stderr}");
    assert!(
        stderr.contains("window of 16777216 bytes is summed in place"),
        "{stderr}"
    );
    // The summary: the calls served, and how many each kernel summed (every one some:
    // two-shot in the window, one-shot in other memory beyond the packets' 256 KiB).
    let kernels = stderr
        .lines()
        .find_map(|l| l.split("served calls by peerlink's kernel: ").nth(1))
        .unwrap_or_else(|| panic!("no kernels in the summary:\n{stderr}"));
    for part in kernels.split(", ") {
        let (kernel, count) = part.rsplit_once(' ').unwrap();
        assert!(count.parse::<u64>().unwrap() > 0, "{kernel}: {kernels}");
    }
    assert!(stderr.contains("0 forwarded to NCCL"), "{stderr}");
}

#[test]
fn ranks_that_are_each_a_process_of_this_host_are_served() {
    for ranks in [2, 4, 8] {
        for (rank, output) in job(ranks, "sums").iter().enumerate() {
            let stderr = passed(rank, ranks, output);
            let said = format!("rank {rank} of {ranks}, GPU {rank}; served by peerlink ({ranks} ranks, a process each on this host)");
            assert!(stderr.contains(&said), "rank {rank} of {ranks}:\n{stderr}");
        }
    }
}

#[test]
fn a_rank_30_s_late_in_simulated_time_is_waited_for_and_summed() {
    for (rank, output) in job(2, "late").iter().enumerate() {
        passed(rank, 2, output);
    }
}

#[test]
fn a_rank_that_dies_is_reported_by_get_async_error_and_its_peers_call_released() {
    let outputs = job(2, "dies");
    let stderr = passed(0, 2, &outputs[0]);
    assert!(stderr.contains("a peer is lost"), "{stderr}");
}

#[test]
fn a_lone_call_captured_into_a_graph_is_served_and_every_replay_sums_across_processes() {
    // Replays after the shared buffers grew too (`replays_after_the_shared_buffers_grow`).
    for ranks in [2, 4] {
        for (rank, output) in job(ranks, "graphs").iter().enumerate() {
            passed(rank, ranks, output);
        }
    }
}

#[test]
fn a_group_setting_up_two_communicators_in_crossed_orders_meets_at_once_and_serves_both() {
    let started = Instant::now();
    for (rank, output) in job(2, "crossed").iter().enumerate() {
        passed(rank, 2, output);
    }
    // A crossed meeting would wait out the 60 s rendezvous, then forward both.
    let took = started.elapsed();
    assert!(took < Duration::from_secs(30), "the job took {took:?}");
}

#[test]
fn a_symmetric_window_of_each_process_is_shared_and_summed_in_place_even_captured() {
    for ranks in [2, 4] {
        for (rank, output) in job(ranks, "windows").iter().enumerate() {
            let said = passed(rank, ranks, output);
            assert!(
                said.contains("symmetric window of 16777216 bytes is summed in place"),
                "{said}"
            );
        }
    }
}

#[test]
fn an_abort_releases_a_call_waiting_for_a_peer_that_never_comes() {
    for (rank, output) in job(2, "abort").iter().enumerate() {
        passed(rank, 2, output);
    }
}

/// A communicator handle that a watching thread may hold (NCCL's calls on it are thread-safe
/// where the tests use them).
#[derive(Clone, Copy)]
struct Handle(usize);

impl Handle {
    fn get(self) -> ncclComm_t {
        self.0 as ncclComm_t
    }
}

/// One all-reduce of 1001 f32 elements on rank `rank`'s GPU and stream: its result code, and the
/// reduce and output to check.
fn call_1001(rank: usize, comm: ncclComm_t) -> (c_int, Reduce, u64) {
    let (code, reduce, buffers) = sum_f32(rank, comm, 1001, stream_of(rank));
    (code, reduce, buffers.1)
}

/// Both ranks' first call: the set-up, and a sum checked.
fn meet_once(rank: usize, comm: ncclComm_t) {
    let (code, reduce, recv) = call_1001(rank, comm);
    assert_eq!(code, 0);
    reduce.check(recv, rank, stream_of(rank), &[0, 1]);
}

/// Every rank's first call sets the communicator up (and sizes the shared buffers); the next,
/// captured into a graph, is served into it (nothing reaches NCCL), and each of 3 replays meets
/// the other processes' replays and sums anew.
fn graphs(rank: usize, ranks: usize, comm: ncclComm_t) {
    let everyone: Vec<usize> = (0..ranks).collect();
    let (code, reduce, (_, recv)) = sum_f32(rank, comm, 1001, capture_stream_of(rank));
    assert_eq!(code, 0);
    reduce.check(recv, rank, capture_stream_of(rank), &everyone);
    assert_eq!(captured_sum_replays(rank, comm, 1001, 3, &everyone), 0);
    replays_after_the_shared_buffers_grow(rank, comm, capture_stream_of(rank), &everyone);
    assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0, "served");
    // SAFETY: the communicator made by the caller.
    assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
}

/// Both ranks meet once (the set-up); rank 1's stream is then busy for 30 s of simulated time
/// before its next call: rank 0's kernel waits that long, beyond a bounded wait's 10 s, and sums.
fn late(rank: usize, comm: ncclComm_t) {
    meet_once(rank, comm);
    let backend = standin::backend();
    let stream = backend.borrow_stream(rank, stream_of(rank)).unwrap();
    if rank == 1 {
        backend.collectives().busy(stream, 30e6).unwrap();
    }
    let start = backend.record(stream).unwrap();
    let (code, reduce, recv) = call_1001(rank, comm);
    assert_eq!(code, 0);
    let end = backend.record(stream).unwrap();
    reduce.check(recv, rank, stream_of(rank), &[0, 1]);
    let waited_us = backend.elapsed_us(start, end).unwrap();
    if rank == 0 {
        assert!(waited_us >= 30e6, "rank 0's call took {waited_us} µs");
    }
}

/// After the set-up, rank 1 exits without a word; rank 0's next call waits for it until a
/// watchdog thread (as PyTorch's) asks ncclCommGetAsyncError, which says ncclRemoteError and
/// releases the wait; later calls fail so, and the communicator aborts.
fn dies(rank: usize, comm: ncclComm_t) {
    meet_once(rank, comm);
    if rank == 1 {
        std::thread::sleep(Duration::from_secs(1));
        std::process::exit(0);
    }
    let handle = Handle(comm as usize);
    let watchdog = std::thread::spawn(move || {
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(30) {
            let mut error: c_int = 0;
            // SAFETY: the live communicator and an out-pointer.
            assert_eq!(
                unsafe { ncclCommGetAsyncError(handle.get(), &mut error) },
                0
            );
            if error != 0 {
                return error;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        0
    });
    assert_eq!(call_1001(rank, comm).0, 0, "the waiting call was queued");
    assert_eq!(watchdog.join().unwrap(), REMOTE_ERROR);
    assert_eq!(call_1001(rank, comm).0, REMOTE_ERROR, "a later call");
    // SAFETY: the communicator made by the caller, not used after.
    assert_eq!(unsafe { ncclCommAbort(comm) }, 0);
}

/// After the set-up, rank 1 makes no further call; rank 0's next call waits for it until another
/// thread aborts the communicator, well before rank 1 destroys its own.
fn abort(rank: usize, comm: ncclComm_t) {
    meet_once(rank, comm);
    if rank == 1 {
        std::thread::sleep(Duration::from_secs(3));
        // SAFETY: the communicator made by the caller.
        assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
        return;
    }
    let handle = Handle(comm as usize);
    let started = Instant::now();
    let aborter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        // SAFETY: the live communicator; the waiting call does not use it after it returns.
        unsafe { ncclCommAbort(handle.get()) }
    });
    assert_eq!(call_1001(rank, comm).0, 0, "the waiting call was queued");
    assert_eq!(aborter.join().unwrap(), 0);
    let took = started.elapsed();
    assert!(took < Duration::from_secs(2), "released after {took:?}");
}

/// Two communicators of the same two processes, first called in one group each, rank 0 holding
/// `first` then `second` and rank 1 the other way round (the group is forwarded whole, but sets
/// both up); then a lone call on each is served; then a window on each is registered in one
/// group, in the same crossed orders, and adopted.
fn crossed(rank: usize, first: ncclComm_t) {
    let mut second: ncclComm_t = std::ptr::null_mut();
    let id = standin::unique_id(0);
    // SAFETY: a valid out-pointer; the id is the stand-in's, the same in both processes.
    assert_eq!(
        unsafe { ncclCommInitRank(&mut second, 2, id, rank as c_int) },
        0
    );
    let order = if rank == 0 {
        [first, second]
    } else {
        [second, first]
    };
    // SAFETY: group calls around calls on live communicators.
    assert_eq!(unsafe { ncclGroupStart() }, 0);
    let held: Vec<_> = order
        .iter()
        .map(|&comm| {
            let reduce = Reduce::f32_sum(1001, false);
            let buffers = reduce.buffers(rank, rank);
            assert_eq!(reduce.call(buffers, comm, stream_of(rank)), 0);
            (reduce, buffers.1)
        })
        .collect();
    // SAFETY: closes the group opened above.
    assert_eq!(unsafe { ncclGroupEnd() }, 0);
    for (reduce, recv) in held {
        reduce.check(recv, rank, stream_of(rank), &[0, 1]);
    }
    assert_eq!(
        standin::count_of_this_thread("ncclAllReduce"),
        2,
        "the group"
    );
    for comm in [first, second] {
        meet_once(rank, comm);
    }
    assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 2, "served");
    // Symmetric windows on both, registered in one group in the same crossed orders: adopted,
    // each communicator's ranks meeting in one order.
    let windows: Vec<_> = in_group(true, || {
        order.map(|comm| {
            let (_, address) = standin::device_buffer(rank, 4096);
            (comm, register_window(comm, (address, 4096), SYMMETRIC))
        })
    })
    .into();
    let server = peerlink_nccl::serve::server();
    for (comm, window) in windows {
        assert_eq!(server.windows_of(comm as usize), 1);
        // SAFETY: the window registered above on this rank's live communicator.
        assert_eq!(unsafe { ncclCommWindowDeregister(comm, window) }, 0);
    }
    for comm in [first, second] {
        // SAFETY: the communicators made by this rank, not used after.
        assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
    }
}

/// Every rank's window of 16 MiB, registered alone and again inside a group, is shared with the
/// other processes and summed in place (`sums_in_a_window`), then deregistered.
fn windows(rank: usize, ranks: usize, comm: ncclComm_t) {
    let everyone: Vec<usize> = (0..ranks).collect();
    let on = (comm, capture_stream_of(rank));
    let windows = [false, true].map(|grouped| sums_in_a_window(rank, on, grouped, &everyone));
    // SAFETY: the windows registered above; then the communicator made by the caller.
    unsafe {
        for window in windows {
            assert_eq!(ncclCommWindowDeregister(comm, window), 0);
        }
        assert_eq!(ncclCommDestroy(comm), 0);
    }
}

/// A job of one rank: its calls run peerlink's kernels, which sum with no one — in a
/// symmetric window (captured, then out of place), captured after an eager call on the stream,
/// and eager at every type and count — and nothing reaches NCCL (no set-up to gather either).
fn alone(comm: ncclComm_t) {
    let on = (comm, capture_stream_of(0));
    let window = sums_in_a_window(0, on, false, &[0]);
    let (code, reduce, (_, recv)) = sum_f32(0, comm, 1001, capture_stream_of(0));
    assert_eq!(code, 0);
    reduce.check(recv, 0, capture_stream_of(0), &[0]);
    assert_eq!(captured_sum_replays(0, comm, 1001, 3, &[0]), 0);
    for op in [SUM, AVG] {
        reduce_at_counts(0, 1, comm, op, &[1, 1023, 70_001]);
    }
    assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0);
    assert_eq!(standin::count_of_this_thread("ncclAllGather"), 0);
    // SAFETY: the window registered above; then the communicator made by the caller.
    unsafe {
        assert_eq!(ncclCommWindowDeregister(comm, window), 0);
        assert_eq!(ncclCommDestroy(comm), 0);
    }
    // The summary the library prints at exit where it loaded a real NCCL (the stand-in was
    // installed instead).
    for line in peerlink_nccl::ffi::COUNTERS.summary() {
        eprintln!("{line}");
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
    match std::env::var(SCENARIO).unwrap().as_str() {
        "graphs" => return graphs(rank, ranks, comm),
        "late" => return late(rank, comm),
        "dies" => return dies(rank, comm),
        "abort" => return abort(rank, comm),
        "crossed" => return crossed(rank, comm),
        "windows" => return windows(rank, ranks, comm),
        "alone" => return alone(comm),
        _ => {}
    }
    for op in [SUM, AVG] {
        reduce_at_counts(rank, ranks, comm, op, &[1, 3, 1023, 70_001]);
    }
    assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0);
    assert_eq!(standin::count_of_this_thread("ncclAllGather"), 1);
    // SAFETY: the communicator made above.
    assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
}
