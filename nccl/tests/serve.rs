//! The library serving ncclAllReduce on the simulator (PEERLINK_NCCL_SIM), driven through its C
//! API from test threads, one thread per rank (or one thread for all, as nccl-tests -g N), with
//! a stand-in "real NCCL" (tests/standin) that records what reaches it: served calls never reach
//! it, and every element is checked either way.
// A rank's index picks its buffers, communicator and stream from several lists at once.
#![allow(clippy::needless_range_loop)]

mod standin;

use std::ffi::{c_int, c_void};

use peerlink_nccl::ffi::typed::{
    ncclBroadcast, ncclCommAbort, ncclCommDestroy, ncclCommInitRank, ncclCommSplit,
    ncclCommWindowDeregister, ncclComm_t, ncclGroupEnd, ncclGroupStart,
};
use standin::ranks::{
    capture_stream_of, captured_sum_replays, in_group, init_all, on_ranks, reduce_at_counts,
    register_window, replays_after_the_shared_buffers_grow, stream_of, sum_f32, sums_in_a_window,
    Reduce, AVG, BF16, F32, SUM, SYMMETRIC,
};

fn setup() {
    standin::install("all", None);
}

#[test]
fn lone_calls_on_2_4_and_8_ranks_are_served_in_place_or_not_at_any_count() {
    setup();
    for ranks in [2, 4, 8] {
        on_ranks(ranks, |rank, comm| {
            reduce_at_counts(rank, ranks, comm, SUM, &[1, 3, 1023, 70_001, 300_000]);
            // Served: no all-reduce reached NCCL; the set-up's one all-gather did.
            assert_eq!(
                standin::count_of_this_thread("ncclAllReduce"),
                0,
                "{ranks} ranks"
            );
            assert_eq!(
                standin::count_of_this_thread("ncclAllGather"),
                1,
                "{ranks} ranks"
            );
        });
    }
}

#[test]
fn averages_on_2_4_and_8_ranks_are_served_and_on_one_rank_too() {
    setup();
    for ranks in [2, 4, 8] {
        on_ranks(ranks, |rank, comm| {
            // Means of small integers over 2, 4 and 8 ranks are exact in bf16 too.
            reduce_at_counts(rank, ranks, comm, AVG, &[1, 37, 70_001]);
            assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0);
        });
    }
    on_ranks(1, |rank, comm| {
        for (op, in_place) in [(AVG, false), (SUM, true), (SUM, false)] {
            let reduce = Reduce {
                dtype: BF16,
                op,
                count: 1023,
                in_place,
            };
            let buffers = reduce.buffers(rank, rank);
            assert_eq!(reduce.call(buffers, comm, stream_of(9)), 0);
            reduce.check(buffers.1, rank, stream_of(9), &[0]);
        }
        // One rank: no set-up to gather, nothing forwarded.
        assert_eq!(
            standin::calls_of_this_thread()
                .iter()
                .filter(|(n, _)| *n != "ncclCommInitRank")
                .count(),
            0
        );
    });
}

#[test]
fn one_thread_driving_every_rank_in_a_group_is_served_all_ranks_at_once() {
    setup();
    for ranks in [2, 4, 8] {
        let gpus: Vec<c_int> = (0..ranks as c_int).collect();
        let comms = init_all(&gpus);
        for (count, in_place, dtype) in [
            (1, false, F32),
            (1023, true, BF16),
            (70_001, false, F32),
            (300_000, true, F32),
        ] {
            let reduce = Reduce {
                dtype,
                op: SUM,
                count,
                in_place,
            };
            let buffers: Vec<(u64, u64)> = (0..ranks).map(|r| reduce.buffers(r, r)).collect();
            // SAFETY: a group around the calls, as nccl-tests -g N makes it.
            assert_eq!(unsafe { ncclGroupStart() }, 0);
            for (rank, comm) in comms.iter().enumerate() {
                assert_eq!(reduce.call(buffers[rank], *comm, stream_of(rank)), 0);
            }
            assert_eq!(unsafe { ncclGroupEnd() }, 0);
            let everyone: Vec<usize> = (0..ranks).collect();
            for rank in 0..ranks {
                reduce.check(buffers[rank].1, rank, stream_of(rank), &everyone);
            }
        }
        let calls = standin::calls_of_this_thread();
        assert!(
            !calls
                .iter()
                .any(|(name, comm)| *name == "ncclAllReduce"
                    && comms.contains(&(*comm as ncclComm_t)))
        );
        for comm in comms {
            // SAFETY: made above.
            assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
        }
    }
}

#[test]
fn a_mixed_group_is_forwarded_whole_in_the_callers_order() {
    setup();
    let comms = init_all(&[0, 1]);
    let reduce = Reduce {
        dtype: F32,
        op: SUM,
        count: 100,
        in_place: false,
    };
    let buffers: Vec<(u64, u64)> = (0..2).map(|r| reduce.buffers(r, r)).collect();
    let targets: Vec<u64> = (0..2).map(|r| standin::device_buffer(r, 400).1).collect();
    let before = standin::calls_of_this_thread().len();
    // SAFETY: the buffers are the simulator's, of each rank's GPU.
    unsafe {
        assert_eq!(ncclGroupStart(), 0);
        for rank in 0..2 {
            assert_eq!(reduce.call(buffers[rank], comms[rank], stream_of(rank)), 0);
        }
        for rank in 0..2 {
            let (send, recv) = (
                buffers[rank].0 as *const c_void,
                targets[rank] as *mut c_void,
            );
            assert_eq!(
                ncclBroadcast(
                    send,
                    recv,
                    100,
                    F32,
                    0,
                    comms[rank],
                    stream_of(rank) as *mut c_void
                ),
                0
            );
        }
        assert_eq!(ncclGroupEnd(), 0);
    }
    let calls: Vec<(&str, usize)> = standin::calls_of_this_thread()[before..].to_vec();
    let c = |rank: usize| comms[rank] as usize;
    assert_eq!(
        calls,
        [
            ("ncclGroupStart", 0),
            ("ncclAllReduce", c(0)),
            ("ncclAllReduce", c(1)),
            ("ncclBroadcast", c(0)),
            ("ncclBroadcast", c(1)),
            ("ncclGroupEnd", 0)
        ]
    );
    for rank in 0..2 {
        reduce.check(buffers[rank].1, rank, stream_of(rank), &[0, 1]);
    }
    // Two all-reduces on one communicator in a group: forwarded whole, as a group.
    let before = standin::calls_of_this_thread().len();
    unsafe {
        assert_eq!(ncclGroupStart(), 0);
        for _ in 0..2 {
            for rank in 0..2 {
                assert_eq!(reduce.call(buffers[rank], comms[rank], stream_of(rank)), 0);
            }
        }
        assert_eq!(ncclGroupEnd(), 0);
    }
    let names: Vec<&str> = standin::calls_of_this_thread()[before..]
        .iter()
        .map(|(n, _)| *n)
        .collect();
    assert_eq!(
        names.iter().filter(|n| **n == "ncclAllReduce").count(),
        4,
        "{names:?}"
    );
    assert_eq!(names.last(), Some(&"ncclGroupEnd"));
}

#[test]
fn communicators_split_from_one_are_served_each_over_its_own_ranks() {
    setup();
    on_ranks(4, |rank, comm| {
        let mut half: ncclComm_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; every rank splits.
        assert_eq!(
            unsafe {
                ncclCommSplit(
                    comm,
                    (rank % 2) as c_int,
                    rank as c_int,
                    &mut half,
                    std::ptr::null_mut(),
                )
            },
            0
        );
        let reduce = Reduce {
            dtype: BF16,
            op: SUM,
            count: 1023,
            in_place: true,
        };
        let buffers = reduce.buffers(rank, rank);
        assert_eq!(reduce.call(buffers, half, stream_of(rank)), 0);
        let mine: Vec<usize> = (0..4).filter(|r| r % 2 == rank % 2).collect();
        reduce.check(buffers.1, rank, stream_of(rank), &mine);
        assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0);
        // SAFETY: made above.
        assert_eq!(unsafe { ncclCommDestroy(half) }, 0);
    });
}

#[test]
fn a_call_on_new_buffers_after_many_keeps_both_its_buffers() {
    // More buffers than a communicator keeps borrowed (64): the table starts over between calls,
    // never between a call's input and its output (a GPU run once lost the output that way).
    setup();
    on_ranks(2, |rank, comm| {
        // One call in place (one buffer) first, so that the table fills up between a call's two.
        for count in 1..=40 {
            let reduce = Reduce {
                dtype: F32,
                op: SUM,
                count,
                in_place: count == 1,
            };
            let buffers = reduce.buffers(rank, rank);
            assert_eq!(
                reduce.call(buffers, comm, stream_of(rank)),
                0,
                "call {count}"
            );
            reduce.check(buffers.1, rank, stream_of(rank), &[0, 1]);
        }
        assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0);
    });
}

#[test]
fn calls_on_more_streams_than_a_communicator_keeps_borrowed_stay_in_order() {
    // A new stream per call, past the 64 a communicator keeps borrowed: the table starts over,
    // yet the all-reduce still orders each call after the last one's stream.
    setup();
    on_ranks(2, |rank, comm| {
        for call in 0..70u64 {
            let reduce = Reduce {
                dtype: F32,
                op: SUM,
                count: 257,
                in_place: call % 2 == 0,
            };
            let stream = 0x9000 + 0x100 * call + rank as u64;
            let buffers = reduce.buffers(rank, rank);
            assert_eq!(reduce.call(buffers, comm, stream), 0, "call {call}");
            reduce.check(buffers.1, rank, stream, &[0, 1]);
        }
        assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0);
    });
}

/// One all-reduce of 1001 f32 elements on rank `rank`'s GPU and stream, its code asserted: the
/// reduce and its buffers.
fn call_1001(rank: usize, comm: ncclComm_t) -> (Reduce, (u64, u64)) {
    let (code, reduce, buffers) = sum_f32(rank, comm, 1001, stream_of(rank));
    assert_eq!(code, 0, "rank {rank}");
    (reduce, buffers)
}

/// Keeps rank `rank`'s stream busy for 30 s of simulated time: three times a bounded wait's limit.
fn make_late(rank: usize) {
    let backend = standin::backend();
    let stream = backend.borrow_stream(rank, stream_of(rank)).unwrap();
    backend.collectives().busy(stream, 30e6).unwrap();
}

/// Simulated µs from `start` (an event of rank 0's stream) to the end of its work so far.
fn rank_0_took_us(start: peerlink::backend::EventId) -> f64 {
    let backend = standin::backend();
    let stream = backend.borrow_stream(0, stream_of(0)).unwrap();
    let end = backend.record(stream).unwrap();
    backend.synchronize(stream).unwrap();
    backend.elapsed_us(start, end).unwrap()
}

fn rank_0_mark() -> peerlink::backend::EventId {
    let backend = standin::backend();
    let stream = backend.borrow_stream(0, stream_of(0)).unwrap();
    backend.record(stream).unwrap()
}

#[test]
fn a_rank_30_s_late_is_waited_for_on_2_4_and_8_thread_ranks_and_in_one_threads_group() {
    setup();
    for ranks in [2, 4, 8] {
        let everyone: Vec<usize> = (0..ranks).collect();
        // The thread ranks share one simulator and its host clock: rank 0 marks its start before
        // the last rank's busy stream moves that clock on, and the last rank waits a moment so
        // that the others are waiting in their calls when it arrives 30 s late (were they to
        // arrive after it, on the clock it moved, they would not wait; the sums and rank 0's
        // time are the same either way).
        let marked = std::sync::Barrier::new(ranks);
        on_ranks(ranks, |rank, comm| {
            let (reduce, buffers) = call_1001(rank, comm);
            reduce.check(buffers.1, rank, stream_of(rank), &everyone);
            let start = (rank == 0).then(rank_0_mark);
            marked.wait();
            if rank == ranks - 1 {
                std::thread::sleep(std::time::Duration::from_millis(100));
                make_late(rank);
            }
            let (reduce, buffers) = call_1001(rank, comm);
            reduce.check(buffers.1, rank, stream_of(rank), &everyone);
            if let Some(start) = start {
                let took = rank_0_took_us(start);
                assert!(took >= 30e6, "{ranks} ranks: rank 0 took {took} µs");
            }
        });
        // One thread driving every rank: all ranks' kernels queued at once, the last one late.
        let gpus: Vec<c_int> = (0..ranks as c_int).collect();
        let comms = init_all(&gpus);
        make_late(ranks - 1);
        let start = rank_0_mark();
        let reduce = Reduce {
            dtype: F32,
            op: SUM,
            count: 1001,
            in_place: true,
        };
        let buffers: Vec<(u64, u64)> = (0..ranks).map(|r| reduce.buffers(r, r)).collect();
        // SAFETY: a group around one call per rank, as nccl-tests -g N makes it.
        assert_eq!(unsafe { ncclGroupStart() }, 0);
        for (rank, comm) in comms.iter().enumerate() {
            assert_eq!(reduce.call(buffers[rank], *comm, stream_of(rank)), 0);
        }
        assert_eq!(unsafe { ncclGroupEnd() }, 0);
        for rank in 0..ranks {
            reduce.check(buffers[rank].1, rank, stream_of(rank), &everyone);
        }
        let took = rank_0_took_us(start);
        assert!(
            took >= 30e6,
            "{ranks} ranks in a group: rank 0 took {took} µs"
        );
        for comm in comms {
            // SAFETY: made above.
            assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
        }
    }
}

#[test]
fn an_abort_releases_thread_ranks_waiting_for_one_that_never_comes_on_2_4_and_8_ranks() {
    setup();
    for ranks in [2, 4, 8] {
        let id = standin::unique_id(0);
        let started = std::time::Instant::now();
        std::thread::scope(|scope| {
            for rank in 0..ranks {
                scope.spawn(move || {
                    let mut comm: ncclComm_t = std::ptr::null_mut();
                    // SAFETY: a valid out-pointer; the id is the stand-in's.
                    let made =
                        unsafe { ncclCommInitRank(&mut comm, ranks as c_int, id, rank as c_int) };
                    assert_eq!(made, 0);
                    let everyone: Vec<usize> = (0..ranks).collect();
                    let (reduce, buffers) = call_1001(rank, comm);
                    reduce.check(buffers.1, rank, stream_of(rank), &everyone);
                    if rank == ranks - 1 {
                        // The last rank never makes the second call: it aborts instead.
                        std::thread::sleep(std::time::Duration::from_millis(300));
                        // SAFETY: the communicator made above, not used after.
                        assert_eq!(unsafe { ncclCommAbort(comm) }, 0);
                        return;
                    }
                    call_1001(rank, comm);
                    // SAFETY: the communicator made above.
                    assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
                });
            }
        });
        let took = started.elapsed();
        assert!(
            took < std::time::Duration::from_secs(5),
            "{ranks} ranks: released after {took:?}"
        );
    }
}

#[test]
fn lone_calls_captured_into_graphs_on_2_4_and_8_thread_ranks_are_served_and_replays_sum() {
    setup();
    for ranks in [2, 4, 8] {
        let everyone: Vec<usize> = (0..ranks).collect();
        on_ranks(ranks, |rank, comm| {
            let (code, reduce, (_, recv)) = sum_f32(rank, comm, 1001, capture_stream_of(rank));
            assert_eq!(code, 0);
            reduce.check(recv, rank, capture_stream_of(rank), &everyone);
            assert_eq!(captured_sum_replays(rank, comm, 1001, 2, &everyone), 0);
            assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0, "served");
        });
    }
}

#[test]
fn a_graph_captured_before_a_larger_call_grows_the_shared_buffers_still_sums_when_replayed() {
    setup();
    for ranks in [2, 4, 8] {
        let everyone: Vec<usize> = (0..ranks).collect();
        on_ranks(ranks, |rank, comm| {
            let handle = 0x7300 + rank as u64;
            replays_after_the_shared_buffers_grow(rank, comm, handle, &everyone);
            assert_eq!(standin::count_of_this_thread("ncclAllReduce"), 0, "served");
        });
    }
}

/// A stream handle of rank `rank` for the captured groups alone (the captured lone calls have
/// theirs, `capture_stream_of`: tests run at once, and a capture records all its stream runs).
fn group_capture_stream(rank: usize) -> u64 {
    0x7100 + rank as u64
}

#[test]
fn one_thread_driving_every_rank_is_served_into_cuda_graphs_once_set_up_and_replays_sum() {
    setup();
    let backend = standin::backend();
    for ranks in [2, 4, 8] {
        let gpus: Vec<c_int> = (0..ranks as c_int).collect();
        let comms = init_all(&gpus);
        let everyone: Vec<usize> = (0..ranks).collect();
        for in_place in [false, true] {
            let reduce = Reduce {
                dtype: F32,
                op: SUM,
                count: 1001,
                in_place,
            };
            let buffers: Vec<(u64, u64)> = (0..ranks).map(|r| reduce.buffers(r, r)).collect();
            let group = || {
                // SAFETY: a group around one call per rank, as nccl-tests -g N makes it.
                assert_eq!(unsafe { ncclGroupStart() }, 0);
                for (rank, comm) in comms.iter().enumerate() {
                    assert_eq!(
                        reduce.call(buffers[rank], *comm, group_capture_stream(rank)),
                        0
                    );
                }
                assert_eq!(unsafe { ncclGroupEnd() }, 0);
            };
            // Eager first (the set-up, the flags, the scratch), as nccl-tests' warm-up runs.
            if !in_place {
                group();
                for rank in 0..ranks {
                    reduce.check(buffers[rank].1, rank, group_capture_stream(rank), &everyone);
                }
            }
            let streams: Vec<_> = (0..ranks)
                .map(|r| backend.borrow_stream(r, group_capture_stream(r)).unwrap())
                .collect();
            if in_place {
                // In place, a warm-up call would sum the inputs away: warm up on other buffers
                // of the same size and place.
                let spare: Vec<(u64, u64)> = (0..ranks).map(|r| reduce.buffers(r, r)).collect();
                assert_eq!(unsafe { ncclGroupStart() }, 0);
                for (rank, comm) in comms.iter().enumerate() {
                    assert_eq!(
                        reduce.call(spare[rank], *comm, group_capture_stream(rank)),
                        0
                    );
                }
                assert_eq!(unsafe { ncclGroupEnd() }, 0);
                for &s in &streams {
                    backend.synchronize(s).unwrap();
                }
            }
            let before = standin::count_of_this_thread("ncclAllReduce");
            for &s in &streams {
                backend.begin_capture(s).unwrap();
            }
            group();
            let graphs: Vec<_> = streams
                .iter()
                .map(|&s| backend.end_capture(s).unwrap())
                .collect();
            assert_eq!(
                standin::count_of_this_thread("ncclAllReduce"),
                before,
                "{ranks} ranks, in place {in_place}: the captured calls were served"
            );
            // In place, each replay sums the last one's sums: ranks^k times the inputs.
            let replays = if in_place { 1 } else { 3 };
            for _ in 0..replays {
                if !in_place {
                    // Outputs zeroed, so that only the replay can have summed into them.
                    for (rank, &(_, recv)) in buffers.iter().enumerate() {
                        let bytes = reduce.count * 4;
                        let out = backend.borrow_memory(rank, recv, bytes).unwrap();
                        backend.write(out, 0, &vec![0; bytes]).unwrap();
                        backend.free(out).unwrap();
                    }
                }
                for (&graph, &s) in graphs.iter().zip(&streams) {
                    backend.replay(graph, s).unwrap();
                }
                for rank in 0..ranks {
                    reduce.check(buffers[rank].1, rank, group_capture_stream(rank), &everyone);
                }
            }
            for graph in graphs {
                backend.destroy_graph(graph).unwrap();
            }
        }
        for comm in comms {
            // SAFETY: made above.
            assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
        }
    }
}

/// A stream handle of rank `rank` for the windows' test alone.
fn window_stream(rank: usize) -> u64 {
    0x7200 + rank as u64
}

#[test]
fn a_symmetric_window_is_summed_in_place_even_by_a_call_captured_larger_than_any_before() {
    setup();
    for ranks in [2, 4, 8] {
        let everyone: Vec<usize> = (0..ranks).collect();
        on_ranks(ranks, |rank, comm| {
            let on = (comm, window_stream(rank));
            let alone = sums_in_a_window(rank, on, false, &everyone);
            // Registered inside a group, as nccl-tests -R 2 registers (each thread its rank's).
            let grouped = sums_in_a_window(rank, on, true, &everyone);
            // A window without the symmetric flag stays NCCL's alone.
            let (_, other) = standin::device_buffer(rank, 4096);
            let plain = register_window(comm, (other, 4096), 0);
            let server = peerlink_nccl::serve::server();
            assert_eq!(server.windows_of(comm as usize), 2, "{ranks} ranks");
            for window in [alone, grouped, plain] {
                // SAFETY: windows registered above on the live communicator.
                assert_eq!(unsafe { ncclCommWindowDeregister(comm, window) }, 0);
            }
            assert_eq!(server.windows_of(comm as usize), 0, "{ranks} ranks");
        });
    }
}

#[test]
fn windows_one_thread_registers_for_every_rank_stay_nccls_and_its_groups_are_served() {
    setup();
    let ranks = 4;
    let gpus: Vec<c_int> = (0..ranks as c_int).collect();
    let comms = init_all(&gpus);
    let reduce = Reduce::f32_sum(70_001, false);
    let buffers: Vec<(u64, u64)> = (0..ranks).map(|r| reduce.buffers(r, r)).collect();
    // As nccl-tests -g N -R 2 registers: one thread, one group, every rank's send and receive
    // buffer. The calls go through LocalAllReduce, which sums the caller's buffers directly.
    let windows: Vec<_> = in_group(true, || {
        let bytes = reduce.count * 4;
        let each = comms.iter().zip(&buffers);
        each.flat_map(|(&comm, &(send, recv))| {
            [send, recv].map(|address| register_window(comm, (address, bytes), SYMMETRIC))
        })
        .collect()
    });
    let server = peerlink_nccl::serve::server();
    assert!(comms
        .iter()
        .all(|&comm| server.windows_of(comm as usize) == 0));
    in_group(true, || {
        for (rank, comm) in comms.iter().enumerate() {
            assert_eq!(reduce.call(buffers[rank], *comm, stream_of(rank)), 0);
        }
    });
    let everyone: Vec<usize> = (0..ranks).collect();
    for rank in 0..ranks {
        reduce.check(buffers[rank].1, rank, stream_of(rank), &everyone);
    }
    let reached = standin::calls_of_this_thread();
    let forwarded = |comm: &ncclComm_t| reached.contains(&("ncclAllReduce", *comm as usize));
    assert!(!comms.iter().any(forwarded), "served");
    for (i, window) in windows.into_iter().enumerate() {
        // SAFETY: the windows registered above, each on its rank's live communicator.
        assert_eq!(unsafe { ncclCommWindowDeregister(comms[i / 2], window) }, 0);
    }
    for comm in comms {
        // SAFETY: made above.
        assert_eq!(unsafe { ncclCommDestroy(comm) }, 0);
    }
}
