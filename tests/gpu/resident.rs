//! Resident workers on real GPUs (part of the `gpu` test binary): issue 14's goals, measured and
//! printed, and what only real GPUs can show — no driver call per transfer, the watchdog, a worker
//! that dies with its process, Ctrl-C. The contract's resident checks (every byte, order, threads,
//! back-pressure, wrap-around, doorbells, stop and restart) run here too, as `cuda_contract::…`.
//!
//! Run them one at a time, so that no other test's kernels share the GPUs:
//!
//! ```text
//! gpu-carry/gpu-tests --ignored --test-threads=1 --nocapture resident
//! ```
//!
//! Every figure printed is measured on the host's clock (`Instant`) unless it says "GPU time"
//! (events). Transfers go from GPU 0 to GPU 1 (push, the worker on GPU 0), or within GPU 0 on a
//! one-GPU host; each test says which. Goals are printed as met or missed; the tests fail only on
//! wrong bytes, a driver call where none belongs, or a worker that outlives what should stop it.

use peerlink::backend::cuda::CudaBackend;
use peerlink::backend::resident::{DispatcherTimes, WorkerExit, DEFAULT_COPY_BLOCKS};
use peerlink::backend::{Backend, BufferCopy, BufferId, CopyMethod, Memory, Worker, WorkerConfig};
use peerlink::bench::stats::Stats;
use peerlink::engine::{BatchStrategy, Fabric};
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::contract::{contents, pattern, random_transfers_from_four_threads};

/// The copy engine's plateau between the two H200s of the lent machine (BENCHMARKS.md), GB/s: the
/// bandwidth goals are fractions of it. The tests measure this host's own plateau beside it.
const H200_COPY_ENGINE_GBPS: f64 = 396.0;

/// GPU 0 and its peer (GPU 1 where the two have P2P, else GPU 0), with peer access both ways.
fn pair(b: &dyn Backend) -> (usize, usize) {
    let peer = usize::from(b.topology().pair(0, 1).is_some_and(|p| p.p2p));
    b.enable_peer_access(0, peer).unwrap();
    b.enable_peer_access(peer, 0).unwrap();
    (0, peer)
}

fn filled(b: &dyn Backend, memory: Memory, data: &[u8]) -> BufferId {
    let id = b.alloc(memory, data.len()).unwrap();
    b.write(id, 0, data).unwrap();
    id
}

/// `len` bytes of the pattern for `seed`, and a buffer of GPU `device` holding them.
fn source(b: &dyn Backend, device: usize, len: usize, seed: u8) -> (BufferId, Vec<u8>) {
    let data = pattern(len, seed);
    (filled(b, Memory::Device(device), &data), data)
}

/// Median, 10th and 99th percentile and minimum of samples in µs, as one line.
fn spread(samples: &[f64]) -> String {
    let stats = Stats::of(samples).expect("samples");
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    let p10 = sorted[sorted.len() / 10];
    format!(
        "median {:.3} µs (min {:.3}, p10 {p10:.3}, p99 {:.3}; {} samples)",
        stats.median, stats.min, stats.p99, stats.samples
    )
}

fn verdict(met: bool) -> &'static str {
    if met {
        "MET"
    } else {
        "MISSED"
    }
}

/// Host µs from submitting `copy` until the host sees it complete, `samples` times after a
/// warm-up.
fn call_to_complete_us(worker: &Worker, copy: &BufferCopy, samples: usize) -> Vec<f64> {
    for _ in 0..samples / 10 {
        worker.wait(worker.submit(copy).unwrap()).unwrap();
    }
    (0..samples)
        .map(|_| {
            let start = Instant::now();
            let ticket = worker.submit(copy).unwrap();
            worker.wait(ticket).unwrap();
            start.elapsed().as_secs_f64() * 1e6
        })
        .collect()
}

/// GPU µs per dependent load through pinned host memory: one PCIe round trip, what a worker's
/// poll of its ring costs.
fn pcie_round_trip_us(b: &dyn Backend) -> f64 {
    let chain = filled(
        b,
        Memory::PinnedHost { numa_node: None },
        &0u64.to_le_bytes(),
    );
    let result = b.alloc(Memory::Device(0), 8).unwrap();
    let stream = b.create_stream(0).unwrap();
    let steps = 2000;
    let mut times = Vec::new();
    for _ in 0..5 {
        let start = b.record(stream).unwrap();
        b.probes()
            .pointer_chase(stream, chain, steps, result)
            .unwrap();
        let end = b.record(stream).unwrap();
        b.event_synchronize(end).unwrap();
        times.push(b.elapsed_us(start, end).unwrap() / f64::from(steps));
    }
    Stats::of(&times).unwrap().median
}

/// The copy engine's bandwidth from GPU `from` to GPU `to` at 256 MiB, GPU time, GB/s.
fn copy_engine_gbps(b: &dyn Backend, from: usize, to: usize) -> f64 {
    let len = 256 << 20;
    let src = b.alloc(Memory::Device(from), len).unwrap();
    let dst = b.alloc(Memory::Device(to), len).unwrap();
    let stream = b.create_stream(from).unwrap();
    let copy = BufferCopy::from_start(src, dst, len);
    let mut rates = Vec::new();
    for _ in 0..6 {
        let start = b.record(stream).unwrap();
        b.copy(stream, CopyMethod::CopyEngine, &copy).unwrap();
        let end = b.record(stream).unwrap();
        b.event_synchronize(end).unwrap();
        rates.push(len as f64 / b.elapsed_us(start, end).unwrap() / 1e3);
    }
    b.free(src).unwrap();
    b.free(dst).unwrap();
    Stats::of(&rates[1..]).unwrap().median
}

#[test]
#[ignore = "needs a GPU"]
fn resident_transfers_cost_no_launch_copy_or_event() {
    let b = crate::open();
    let (from, to) = pair(&b);
    let worker = Worker::start(&b, &WorkerConfig::on(from)).unwrap();
    let (count, len) = (1000, 4096);
    let (src, data) = source(&b, from, count * len, 61);
    let singles = b.alloc(Memory::Device(to), count * len).unwrap();
    let batched = b.alloc(Memory::Device(to), count * len).unwrap();
    let large = b.alloc(Memory::Device(to), count * len).unwrap();
    let message = |dst, i: usize| BufferCopy {
        dst,
        dst_offset: i * len,
        src,
        src_offset: i * len,
        len,
    };
    let before = b.issued();
    for i in 0..count {
        worker.submit(&message(singles, i)).unwrap();
    }
    let list: Vec<BufferCopy> = (0..count).map(|i| message(batched, i)).collect();
    worker.submit_batch(&list).unwrap();
    // Transfers large enough for the copy blocks: 1 MiB each.
    let mebibytes = (count * len) >> 20;
    let mut last = None;
    for i in 0..mebibytes {
        let at = i << 20;
        let copy = BufferCopy {
            dst: large,
            dst_offset: at,
            src,
            src_offset: at,
            len: 1 << 20,
        };
        last = Some(worker.submit(&copy).unwrap());
    }
    worker.wait(last.unwrap()).unwrap();
    let after = b.issued();
    println!(
        "GPU {from} -> GPU {to}: {count} single 4 KiB transfers, one batch of {count}, {} of 1 MiB: \
         driver work issued {before:?} before, {after:?} after",
        mebibytes
    );
    assert_eq!(after, before, "a resident transfer issued driver work");
    for dst in [singles, batched] {
        assert!(contents(&b, dst) == data, "wrong bytes");
    }
    let moved = mebibytes << 20;
    assert!(contents(&b, large)[..moved] == data[..moved]);
    // The worker's own start is one launch.
    let started = b.issued();
    let second = Worker::start(&b, &WorkerConfig::on(from)).unwrap();
    assert_eq!(b.issued().launches, started.launches + 1);
    drop(second);
}

#[test]
#[ignore = "needs a GPU"]
fn resident_latency_of_a_4_byte_transfer() {
    let b = crate::open();
    let (from, to) = pair(&b);
    let src = filled(&b, Memory::Device(from), &pattern(64, 62));
    let local = b.alloc(Memory::Device(from), 64).unwrap();
    let peer = b.alloc(Memory::Device(to), 64).unwrap();
    let samples = 20_000;
    // A worker of its own for each case, so that its dispatcher's times are that case's alone.
    let case = |copy: BufferCopy| {
        let worker = Worker::start(&b, &WorkerConfig::on(from)).unwrap();
        let took = call_to_complete_us(&worker, &copy, samples);
        let report = worker.stop().unwrap();
        (
            took,
            report
                .dispatcher
                .expect("a real worker times its dispatcher"),
        )
    };
    let (nothing, nothing_times) = case(BufferCopy::from_start(src, peer, 0));
    let (here, _) = case(BufferCopy::from_start(src, local, 4));
    let (there, there_times) = case(BufferCopy::from_start(src, peer, 4));
    assert!(contents(&b, peer)[..4] == pattern(64, 62)[..4]);
    let round_trip = pcie_round_trip_us(&b);
    let median = |s: &[f64]| Stats::of(s).unwrap().median;
    println!("Resident worker on GPU {from} ({DEFAULT_COPY_BLOCKS} copy blocks), call until the host sees the ticket complete:");
    println!(
        "  0 B (ring, poll, completion, host poll): {}",
        spread(&nothing)
    );
    println!(
        "  4 B within GPU {from}:                   {}",
        spread(&here)
    );
    println!(
        "  4 B GPU {from} -> GPU {to}:                 {}",
        spread(&there)
    );
    println!(
        "  goal: 4 B to the peer <= 3 µs median (the copy engine: 10.3-11.7 µs): {} ({:.3} µs)",
        verdict(median(&there) <= 3.0),
        median(&there)
    );
    println!("Where the time goes (medians):");
    println!(
        "  one PCIe round trip, a dependent load through pinned memory (GPU time): {round_trip:.3} µs; \
         the worker's poll costs one, and a descriptor written just after a poll left waits up to one more"
    );
    println!(
        "  the ring and the completion (0 B): {:.3} µs = host write visible + poll + completion \
         store + host poll",
        median(&nothing)
    );
    println!(
        "  the copy and its fence: {:.3} µs within GPU {from}, {:.3} µs to GPU {to} (4 B minus 0 B)",
        median(&here) - median(&nothing),
        median(&there) - median(&nothing)
    );
    for (what, times, took) in [
        ("0 B", nothing_times, &nothing),
        (&*format!("4 B GPU {from} -> GPU {to}"), there_times, &there),
    ] {
        dispatcher_split(what, &times, Stats::of(took).unwrap().mean);
    }
}

/// Prints where a worker's dispatcher spent its time (GPU clock, means per round) beside the mean
/// call-to-complete time `call_us` of its transfers, and what is left for the host's side.
fn dispatcher_split(what: &str, t: &DispatcherTimes, call_us: f64) {
    let per = |ns: u64, n: u64| ns as f64 / n.max(1) as f64 / 1000.0;
    let period = per(t.run_ns, t.rounds);
    let poll = per(t.poll_ns, t.rounds);
    let working_poll = per(t.working_poll_ns, t.working_rounds);
    let idle_poll = per(t.poll_ns - t.working_poll_ns, t.rounds - t.working_rounds);
    let copy = per(t.copy_ns, t.working_rounds);
    let publish = per(t.publish_ns, t.working_rounds);
    println!(
        "  {what}, the dispatcher by the GPU's clock: {} rounds in {:.1} ms, a round every {period:.3} µs \
         (its poll {poll:.3} µs: {idle_poll:.3} finding nothing, {working_poll:.3} finding \
         tickets; the rest of it {:.3}); {} rounds took tickets: copy {copy:.3} µs, publish \
         {publish:.3} µs",
        t.rounds,
        t.run_ns as f64 / 1e6,
        period - poll,
        t.working_rounds,
    );
    // A ticket waits for the round in flight to end (half a period on average, its phase random),
    // then one round sees it; the rest of the call is the host's side and the flights.
    let gpu = period / 2.0 + poll + copy + publish;
    println!(
        "  {what}: mean call {call_us:.3} µs = GPU side {gpu:.3} µs (half a round's wait {:.3}, poll \
         {poll:.3}, copy {copy:.3}, publish {publish:.3}) + host write visible, completion flight \
         and host poll {:.3} µs",
        period / 2.0,
        call_us - gpu
    );
}

#[test]
#[ignore = "needs a GPU"]
fn resident_host_cpu_time_per_submit_and_per_poll() {
    let b = crate::open();
    let (from, to) = pair(&b);
    let config = WorkerConfig {
        ring_slots: 1 << 17,
        ..WorkerConfig::on(from)
    };
    let worker = Worker::start(&b, &config).unwrap();
    let count = 100_000;
    let src = filled(&b, Memory::Device(from), &pattern(4 * count, 63));
    let dst = b.alloc(Memory::Device(to), 4 * count).unwrap();
    let copy = |i: usize| BufferCopy {
        dst,
        dst_offset: 4 * i,
        src,
        src_offset: 4 * i,
        len: 4,
    };
    // Warm: the first submissions fault in the host's view of the ring.
    worker.wait(worker.submit(&copy(0)).unwrap()).unwrap();
    let start = Instant::now();
    let mut last = None;
    for i in 0..count {
        last = Some(worker.submit(&copy(i)).unwrap());
    }
    let per_submit = start.elapsed().as_secs_f64() * 1e6 / count as f64;
    worker.wait(last.unwrap()).unwrap();
    assert!(contents(&b, dst) == pattern(4 * count, 63));
    // Four threads at once, each its own quarter.
    let quarter = count / 4;
    let start = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..4 {
            let (worker, copy) = (&worker, &copy);
            scope.spawn(move || {
                for i in t * quarter..(t + 1) * quarter {
                    worker.submit(&copy(i)).unwrap();
                }
            });
        }
    });
    let per_submit_4 = start.elapsed().as_secs_f64() * 1e6 / count as f64;
    // Polling: a ticket that cannot complete yet (behind a held stream's doorbell).
    let stream = b.create_stream(from).unwrap();
    let gate = b.hold(stream).unwrap();
    let held = worker.submit_after(stream, &copy(0)).unwrap();
    let polls = 1_000_000;
    let start = Instant::now();
    for _ in 0..polls {
        assert!(!worker.is_complete(held).unwrap());
    }
    let per_poll = start.elapsed().as_secs_f64() * 1e6 / polls as f64;
    b.release(gate).unwrap();
    worker.wait(held).unwrap();
    println!(
        "Host CPU time, 4 B transfers GPU {from} -> GPU {to} (ring of {} slots, never full):",
        config.ring_slots
    );
    println!(
        "  per submit, one thread: {per_submit:.4} µs; goal <= 0.2 µs: {}",
        verdict(per_submit <= 0.2)
    );
    println!("  per submit, four threads at once (wall time / submissions): {per_submit_4:.4} µs");
    println!(
        "  per poll of an incomplete ticket (is_complete): {per_poll:.4} µs, a load of the completion \
         word from the CPU's cache; wait() spins on it, so waiting costs a core while it waits"
    );
}

#[test]
#[ignore = "needs a GPU"]
fn resident_bandwidth_of_back_to_back_submissions() {
    let b = crate::open();
    let (from, to) = pair(&b);
    let plateau = copy_engine_gbps(&b, from, to);
    // The default share, more, and every SM but the dispatcher's on an H200 (132 SMs); a share the
    // GPU has not the SMs for is left out.
    let shares: Vec<u32> = [DEFAULT_COPY_BLOCKS, 32, 64, 131]
        .into_iter()
        .filter(|&copy_blocks| {
            let config = WorkerConfig {
                copy_blocks,
                ..WorkerConfig::on(from)
            };
            Worker::start(&b, &config).is_ok()
        })
        .collect();
    let sizes: Vec<usize> = (0..8).map(|i| 4096 << (2 * i)).collect(); // 4 KiB .. 64 MiB
    let src_len = 64 << 20;
    let data = pattern(src_len, 64);
    let src = filled(&b, Memory::Device(from), &data);
    let dst = b.alloc(Memory::Device(to), 1 << 30).unwrap();
    println!(
        "Back-to-back submissions of one size, GPU {from} -> GPU {to}, first call until the last \
         ticket is complete (host clock), best of 3; the copy engine's plateau here: {plateau:.1} GB/s \
         at 256 MiB (GPU time); goals against {H200_COPY_ENGINE_GBPS} GB/s"
    );
    println!(
        "  size       | {}",
        shares
            .iter()
            .map(|s| format!("{s:>3} copy blocks"))
            .collect::<Vec<_>>()
            .join(" | ")
    );
    let mut table: Vec<Vec<f64>> = Vec::new();
    for &size in &sizes {
        let count = ((256usize << 20) / size)
            .clamp(16, 4096)
            .min((1 << 30) / size);
        let mut row = Vec::new();
        for &copy_blocks in &shares {
            let worker = Worker::start(
                &b,
                &WorkerConfig {
                    copy_blocks,
                    ..WorkerConfig::on(from)
                },
            )
            .unwrap();
            let copy = |i: usize| BufferCopy {
                dst,
                dst_offset: i * size,
                src,
                src_offset: (i * size) % src_len,
                len: size,
            };
            worker.wait(worker.submit(&copy(0)).unwrap()).unwrap();
            let mut best = 0.0f64;
            for _ in 0..3 {
                let start = Instant::now();
                let mut last = None;
                for i in 0..count {
                    last = Some(worker.submit(&copy(i)).unwrap());
                }
                worker.wait(last.unwrap()).unwrap();
                let gbps = (count * size) as f64 / start.elapsed().as_secs_f64() / 1e9;
                best = best.max(gbps);
            }
            let lastly = copy(count - 1);
            let mut got = vec![0; size];
            b.read(dst, lastly.dst_offset, &mut got).unwrap();
            assert!(
                got[..] == data[lastly.src_offset..lastly.src_offset + size],
                "wrong bytes"
            );
            row.push(best);
        }
        println!(
            "  {:>7} KiB | {}",
            size / 1024,
            row.iter()
                .map(|g| format!("{g:>9.1} GB/s"))
                .collect::<Vec<_>>()
                .join(" | ")
        );
        table.push(row);
    }
    let first_reaching = |column: usize, gbps: f64| {
        sizes
            .iter()
            .zip(&table)
            .find(|(_, row)| row[column] >= gbps)
            .map(|(size, _)| *size)
    };
    let half = first_reaching(0, H200_COPY_ENGINE_GBPS / 2.0);
    println!(
        "  goal: half of {H200_COPY_ENGINE_GBPS} GB/s at <= 256 KiB with the default {DEFAULT_COPY_BLOCKS} copy \
         blocks: {} (first reached at {})",
        verdict(half.is_some_and(|s| s <= 256 << 10)),
        half.map_or("no size".into(), |s| format!("{} KiB", s / 1024))
    );
    for (column, share) in shares.iter().enumerate() {
        let ninety = first_reaching(column, 0.9 * H200_COPY_ENGINE_GBPS);
        println!(
            "  goal: 90% of {H200_COPY_ENGINE_GBPS} GB/s at <= 4 MiB, {share} copy blocks: {} (first reached at {})",
            verdict(ninety.is_some_and(|s| s <= 4 << 20)),
            ninety.map_or("no size".into(), |s| format!("{} KiB", s / 1024))
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn resident_thousand_messages_of_4_kib_in_one_call() {
    let b = crate::open();
    let (from, to) = pair(&b);
    let worker = Worker::start(&b, &WorkerConfig::on(from)).unwrap();
    let (count, len) = (1000, 4096);
    let (src, data) = source(&b, from, count * len, 65);
    let dst = b.alloc(Memory::Device(to), count * len).unwrap();
    let (mut calls, mut totals) = (Vec::new(), Vec::new());
    for round in 0..220 {
        // Unprepared: the list is built and checked in every call.
        let start = Instant::now();
        let list: Vec<BufferCopy> = (0..count)
            .map(|i| BufferCopy {
                dst,
                dst_offset: i * len,
                src,
                src_offset: i * len,
                len,
            })
            .collect();
        let ticket = worker.submit_batch(&list).unwrap();
        let called = start.elapsed();
        worker.wait(ticket).unwrap();
        if round >= 20 {
            calls.push(called.as_secs_f64() * 1e6 / count as f64);
            totals.push(start.elapsed().as_secs_f64() * 1e6 / count as f64);
        }
    }
    assert!(contents(&b, dst) == data);
    // The engine below opens a backend of its own, whose frees would wait for this worker.
    drop(worker);
    let total = Stats::of(&totals).unwrap().median;
    let engine = engine_batch_us_per_message(from, to, count, len);
    println!("{count} x 4 KiB GPU {from} -> GPU {to} in one submit_batch, building the list each time, per message:");
    println!(
        "  the call (list, checks, pinned list, one slot): {}",
        spread(&calls)
    );
    println!("  call until complete: {}", spread(&totals));
    println!(
        "  goal <= 0.03 µs per message all-in (the engine's unprepared batch: 0.086): {}",
        verdict(total <= 0.03)
    );
    println!(
        "  through the engine (Fabric::resident, BatchStrategy::Resident, the batch checked and \
         planned in every call, one stream wait and one event): {}",
        spread(&engine)
    );
    let engine = Stats::of(&engine).unwrap().median;
    println!(
        "  goal <= 0.03 µs per message in one engine call, unprepared: {} ({engine:.4} µs)",
        verdict(engine <= 0.03)
    );
}

/// Per-message µs of `count` × `len` B from GPU `from` to GPU `to` in one engine call with a
/// resident worker (the batch prepared, that is checked and planned, in each call), call until
/// the host sees it complete; 200 calls after 20 thrown away. Every byte checked.
fn engine_batch_us_per_message(from: usize, to: usize, count: usize, len: usize) -> Vec<f64> {
    let backend: Arc<dyn Backend> = Arc::new(crate::open());
    let fabric = Fabric::builder(backend)
        .resident(DEFAULT_COPY_BLOCKS)
        .open()
        .unwrap();
    let data = pattern(count * len, 67);
    let src = fabric.alloc(from, count * len).unwrap();
    let dst = fabric.alloc(to, count * len).unwrap();
    src.write(0, &data).unwrap();
    let mut per_message = Vec::new();
    for round in 0..220 {
        let start = Instant::now();
        let messages: Vec<_> = (0..count)
            .map(|i| {
                (
                    src.range(i * len..(i + 1) * len),
                    dst.range(i * len..(i + 1) * len),
                )
            })
            .collect();
        fabric
            .prepare_batch_with(&messages, 1, BatchStrategy::Resident)
            .unwrap()
            .run(&[])
            .unwrap()
            .wait()
            .unwrap();
        if round >= 20 {
            per_message.push(start.elapsed().as_secs_f64() * 1e6 / count as f64);
        }
    }
    assert!(dst.to_vec().unwrap() == data);
    per_message
}

#[test]
#[ignore = "needs a GPU"]
fn resident_hundred_thousand_random_transfers_from_four_threads() {
    let b = crate::open();
    let start = Instant::now();
    random_transfers_from_four_threads(&b, 25_000);
    println!(
        "100000 random transfers (1 B to 64 KiB) from 4 threads through one worker, every byte \
         checked: {:.2} s",
        start.elapsed().as_secs_f64()
    );
}

#[test]
#[ignore = "needs a GPU"]
fn resident_cost_to_the_users_compute() {
    let b = crate::open();
    let (from, to) = pair(&b);
    // The stand-in for the user's work: an SM copy of 2 GiB within GPU 0, on every SM (4 blocks
    // per SM), timed with events (GPU time).
    let len = 2 << 30;
    let a = b.alloc(Memory::Device(from), len).unwrap();
    let c = b.alloc(Memory::Device(from), len).unwrap();
    let stream = b.create_stream(from).unwrap();
    let compute = |b: &CudaBackend| {
        let mut times = Vec::new();
        for _ in 0..6 {
            let start = b.record(stream).unwrap();
            b.copy(
                stream,
                CopyMethod::SmKernel,
                &BufferCopy::from_start(a, c, len),
            )
            .unwrap();
            let end = b.record(stream).unwrap();
            b.event_synchronize(end).unwrap();
            times.push(b.elapsed_us(start, end).unwrap());
        }
        Stats::of(&times[1..]).unwrap().median
    };
    let alone = compute(&b);
    println!("An SM copy of 2 GiB within GPU {from} on every SM, GPU time, median of 5: {alone:.0} µs alone");
    for copy_blocks in [DEFAULT_COPY_BLOCKS, 32] {
        let worker = Worker::start(
            &b,
            &WorkerConfig {
                copy_blocks,
                ..WorkerConfig::on(from)
            },
        )
        .unwrap();
        let idle = compute(&b);
        // And while the worker moves 1 MiB transfers to the peer, back to back.
        let src = b.alloc(Memory::Device(from), 1 << 20).unwrap();
        let dst = b.alloc(Memory::Device(to), 64 << 20).unwrap();
        let stop = std::sync::atomic::AtomicBool::new(false);
        let busy = std::thread::scope(|scope| {
            let (worker, stop) = (&worker, &stop);
            scope.spawn(move || {
                let mut i = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let copy = BufferCopy {
                        dst_offset: (i % 64) << 20,
                        ..BufferCopy::from_start(src, dst, 1 << 20)
                    };
                    let ticket = worker.submit(&copy).unwrap();
                    if i % 64 == 63 {
                        worker.wait(ticket).unwrap();
                    }
                    i += 1;
                }
            });
            let busy = compute(&b);
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            busy
        });
        drop(worker);
        println!(
            "  with a worker of {copy_blocks} copy blocks ({} SMs held): {idle:.0} µs idle ({:+.1}%), \
             {busy:.0} µs while it moves 1 MiB transfers ({:+.1}%)",
            copy_blocks + 1,
            100.0 * (idle / alone - 1.0),
            100.0 * (busy / alone - 1.0)
        );
        b.free(src).unwrap();
        b.free(dst).unwrap();
    }
}

// ---------------------------------------------------------------------------------------------
// A worker's end: its process killed, frozen, or interrupted. Each test runs this binary again as
// a child process holding a worker (the test below, told its part by an environment variable).

/// Names the child's part: `die`, `freeze` or `interrupt`.
const CHILD_PART: &str = "PEERLINK_RESIDENT_CHILD";
/// What the child prints, with its process id, once its worker runs.
const READY: &str = "resident worker running in process";
/// The child's watchdog.
const CHILD_WATCHDOG_MS: u64 = 500;

#[test]
#[ignore = "run by the three tests below as their child process; on its own it does nothing"]
fn child_process_with_a_worker() {
    let Ok(part) = std::env::var(CHILD_PART) else {
        eprintln!("{CHILD_PART} is not set: nothing to do (the process tests run this as a child)");
        return;
    };
    let b = crate::open();
    let config = WorkerConfig {
        watchdog_ms: CHILD_WATCHDOG_MS,
        ..WorkerConfig::on(0)
    };
    let worker = Worker::start(&b, &config).unwrap();
    let src = filled(&b, Memory::Device(0), &[1; 64]);
    let nothing = BufferCopy::from_start(src, src, 0);
    println!("{READY} {}", std::process::id());
    std::io::stdout().flush().unwrap();
    match part.as_str() {
        "die" => loop {
            // Killed by the parent.
            std::thread::sleep(Duration::from_secs(1));
        },
        "freeze" => {
            let mut line = String::new();
            std::io::stdin().read_line(&mut line).unwrap();
            let waited = worker.submit(&nothing).and_then(|t| worker.wait(t));
            println!("after the freeze: {waited:?}");
        }
        "interrupt" => {
            peerlink::interrupt::request();
            let asked = Instant::now();
            while worker.submit(&nothing).and_then(|t| worker.wait(t)).is_ok() {
                assert!(
                    asked.elapsed() < Duration::from_secs(5),
                    "Ctrl-C did not stop the worker"
                );
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        other => panic!("unknown part {other}"),
    }
    let report = worker.stop().unwrap();
    println!("exit {}", report.exit.name());
}

/// This binary again, running [`child_process_with_a_worker`] as `part`; killed when dropped.
struct Child {
    process: std::process::Child,
    output: BufReader<std::process::ChildStdout>,
    pid: u32,
}

impl Child {
    /// Starts the child and returns once its worker runs.
    fn start(part: &str) -> Child {
        let mut process = Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "--nocapture",
                "--test-threads=1",
                "resident::child_process_with_a_worker",
            ])
            .env(CHILD_PART, part)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let output = BufReader::new(process.stdout.take().expect("piped"));
        let mut child = Child {
            pid: process.id(),
            process,
            output,
        };
        let mut line = String::new();
        // The test harness has printed "test … … " on the same line before the child's words.
        while !line.contains(READY) {
            line.clear();
            let read = child.output.read_line(&mut line).unwrap();
            assert!(read > 0, "the child ended before its worker ran");
        }
        child
    }

    /// Sends a signal (`STOP`, `CONT`) by kill(1).
    fn signal(&self, signal: &str) {
        let sent = Command::new("kill")
            .args([format!("-{signal}"), self.pid.to_string()])
            .status()
            .unwrap();
        assert!(sent.success(), "kill -{signal} {}", self.pid);
    }

    /// Everything the child prints from here until it ends, which it must do successfully.
    fn rest(&mut self) -> String {
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut self.output, &mut rest).unwrap();
        let status = self.process.wait().unwrap();
        assert!(status.success(), "the child failed ({status}):\n{rest}");
        rest
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        // A test that failed midway leaves no child behind (a finished one is only reaped).
        let _ = self.process.kill();
        let _ = self.process.wait();
    }
}

/// GPU 0's utilisation (%) and whether `pid` holds a context on it, as NVML sees them; `None`
/// where NVML cannot say.
fn gpu_view(pid: u32) -> Option<(u32, bool)> {
    let nvml = nvml_wrapper::Nvml::init().ok()?;
    let device = nvml.device_by_index(0).ok()?;
    let busy = device.utilization_rates().ok()?.gpu;
    let listed = device
        .running_compute_processes()
        .ok()?
        .iter()
        .any(|p| p.pid == pid);
    Some((busy, listed))
}

#[test]
#[ignore = "needs a GPU"]
fn resident_worker_dies_with_its_process() {
    let mut child = Child::start("die");
    std::thread::sleep(Duration::from_secs(2));
    println!(
        "a child process {} runs a worker on GPU 0: NVML (busy %, listed) {:?}",
        child.pid,
        gpu_view(child.pid)
    );
    child.process.kill().unwrap();
    child.process.wait().unwrap();
    let killed = Instant::now();
    // The driver tears the context down: the process leaves NVML's list and the GPU goes idle
    // (NVML's utilisation is the share of its last sample period in which a kernel ran).
    let lingers =
        |view: Option<(u32, bool)>| view.is_some_and(|(busy, listed)| listed || busy >= 50);
    let mut after = gpu_view(child.pid);
    while lingers(after) && killed.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
        after = gpu_view(child.pid);
    }
    println!(
        "after SIGKILL, {:?} later: (busy %, listed) {after:?}",
        killed.elapsed()
    );
    match after {
        Some((busy, listed)) => {
            assert!(!listed, "the killed process still holds GPU 0");
            assert!(
                busy < 50,
                "GPU 0 still {busy}% busy after the worker's process was killed"
            );
        }
        None => println!("NVML cannot say here: only the new worker below is checked"),
    }
    // And a worker of this process runs there at once.
    let b = crate::open();
    let started = Instant::now();
    let worker = Worker::start(&b, &WorkerConfig::on(0)).unwrap();
    let data = pattern(4096, 66);
    let src = filled(&b, Memory::Device(0), &data);
    let dst = b.alloc(Memory::Device(0), 4096).unwrap();
    worker
        .wait(
            worker
                .submit(&BufferCopy::from_start(src, dst, 4096))
                .unwrap(),
        )
        .unwrap();
    assert!(contents(&b, dst) == data);
    println!(
        "a new worker started and moved 4 KiB in {:?}",
        started.elapsed()
    );
}

#[test]
#[ignore = "needs a GPU"]
fn resident_watchdog_stops_the_worker_of_a_frozen_process() {
    let mut child = Child::start("freeze");
    std::thread::sleep(Duration::from_millis(300));
    child.signal("STOP");
    // Frozen: the heartbeat stops, and the kernel must end by itself after the watchdog's period.
    std::thread::sleep(Duration::from_millis(4 * CHILD_WATCHDOG_MS + 1000));
    let frozen = gpu_view(child.pid);
    child.signal("CONT");
    writeln!(child.process.stdin.as_mut().unwrap(), "go").unwrap();
    let rest = child.rest();
    println!("child, frozen for {} ms with a {CHILD_WATCHDOG_MS} ms watchdog: NVML while frozen (busy %, listed) {frozen:?}; it said:\n{rest}", 4 * CHILD_WATCHDOG_MS + 1000);
    assert!(
        rest.contains("watchdog"),
        "the transfer after the freeze did not fail for the watchdog"
    );
    assert!(rest.contains(&format!("exit {}", WorkerExit::Watchdog.name())));
    if let Some((busy, _)) = frozen {
        assert!(
            busy < 50,
            "GPU 0 {busy}% busy while the worker's process was frozen"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn resident_ctrl_c_stops_a_worker() {
    let mut child = Child::start("interrupt");
    let rest = child.rest();
    println!("child after interrupt::request(): {rest}");
    assert!(rest.contains(&format!("exit {}", WorkerExit::Interrupted.name())));
}

/// The doorbell path rung by a stream whose work is a copy-engine copy alone, no kernel: what
/// compute-sanitizer can check, as its tools run one kernel at a time on a GPU (the contract's
/// doorbell check holds its stream with a spinning gate kernel, which could not start beside the
/// worker's under memcheck; scripts/experiments/concurrent.cu). The stream writes the sources with
/// a 64 MiB copy (tens of µs) after which it rings the doorbells of a transfer and of a batch:
/// taken before the stream got there, they would move the sources' old bytes.
#[test]
#[ignore = "needs a GPU"]
fn resident_doorbells_rung_behind_a_copy_engine_copy() {
    let b = crate::open();
    let (from, to) = pair(&b);
    let (bulk, len) = (64 << 20, 1 << 20);
    let (written, data) = source(&b, from, bulk, 66);
    let src = filled(&b, Memory::Device(from), &vec![0; bulk]);
    let dst = b.alloc(Memory::Device(to), len).unwrap();
    let batched = b.alloc(Memory::Device(to), len).unwrap();
    let stream = b.create_stream(from).unwrap();
    let worker = Worker::start(&b, &WorkerConfig::on(from)).unwrap();
    for round in 0..20 {
        let at = round * len;
        b.copy(
            stream,
            CopyMethod::CopyEngine,
            &BufferCopy::from_start(written, src, bulk),
        )
        .unwrap();
        let single = BufferCopy {
            src_offset: at,
            ..BufferCopy::from_start(src, dst, len)
        };
        let ticket = worker.submit_after(stream, &single).unwrap();
        let halves: Vec<BufferCopy> = (0..2)
            .map(|h| BufferCopy {
                dst_offset: h * len / 2,
                src_offset: at + h * len / 2,
                len: len / 2,
                ..BufferCopy::from_start(src, batched, len)
            })
            .collect();
        let batch = worker.submit_batch_after(stream, &halves).unwrap();
        worker.wait(ticket).unwrap();
        worker.wait(batch).unwrap();
        b.synchronize(stream).unwrap();
        let want = &data[at..at + len];
        assert!(
            contents(&b, dst) == want,
            "round {round}: a transfer ran before its doorbell"
        );
        assert!(
            contents(&b, batched) == want,
            "round {round}: a batch ran before its doorbell"
        );
        // The sources go back to zeros before the next round's copy writes them again.
        b.write(src, 0, &vec![0; bulk]).unwrap();
    }
}
