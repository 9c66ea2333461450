//! The contract of resident workers (`peerlink::backend::resident`): transfers move exactly their
//! bytes, tickets complete in order, several threads submit at once, a full ring holds submitters
//! back and wraps round, doorbells and stream waits order transfers against a stream's work, and
//! a worker stops, restarts and stops when its guard is dropped. Every byte is checked.
//!
//! The checks that compute-sanitizer runs (scripts/sanitize.sh) allocate every buffer before the
//! worker starts: memcheck judges a kernel's accesses against the allocations that existed at its
//! launch, so a persistent kernel's reads of a later buffer are reported out of bounds.

use super::{buffer, contents, invalid, p2p, pattern, peer_of_0, says, usage, FILL};
use peerlink::backend::resident::{StopReport, WorkerExit};
use peerlink::backend::{
    Backend, BufferCopy, BufferId, CopyMethod, Memory, Ticket, Worker, WorkerConfig,
};

/// A small worker, quick to start everywhere: two copy blocks.
fn config(device: usize) -> WorkerConfig {
    WorkerConfig {
        copy_blocks: 2,
        ..WorkerConfig::on(device)
    }
}

/// GPU 0's peer with peer access enabled both ways (GPU 0 itself on a host without one).
fn peer(b: &dyn Backend) -> usize {
    let peer = peer_of_0(b);
    b.enable_peer_access(0, peer).unwrap();
    b.enable_peer_access(peer, 0).unwrap();
    peer
}

/// Checks that `dst` holds `want`, naming the first wrong byte.
#[track_caller]
fn holds(b: &dyn Backend, dst: BufferId, want: &[u8], what: &str) {
    super::same_bytes(what, &contents(b, dst), want);
}

/// A tiny xorshift generator: the same sequence on every backend.
struct Random(u64);

impl Random {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

pub fn resident_transfers_move_exactly_their_range(b: &dyn Backend) {
    let peer = peer(b);
    // Push to the peer, within GPU 0, into pinned memory; aligned, unaligned, tiny, and larger
    // than the warp's share, so both the dispatcher and the copy blocks move bytes.
    let places = [
        Memory::Device(peer),
        Memory::Device(0),
        Memory::PinnedHost { numa_node: None },
    ];
    let shapes = [
        (0, 0, 4),
        (0, 0, 4096),
        (1, 3, 4099),
        (16, 48, 300_000),
        (5, 5, 1 << 20),
    ];
    // (source, destination, what the destination must hold, the copy, what it is)
    let cases: Vec<_> = places
        .iter()
        .flat_map(|&place| shapes.iter().map(move |&shape| (place, shape)))
        .map(|(place, (src_offset, dst_offset, len))| {
            let size = len + 64;
            let data = pattern(size, 7);
            let src = buffer(b, Memory::Device(0), &data);
            let dst = buffer(b, place, &vec![FILL; size]);
            let mut want = vec![FILL; size];
            want[dst_offset..dst_offset + len].copy_from_slice(&data[src_offset..src_offset + len]);
            let copy = BufferCopy {
                dst,
                dst_offset,
                src,
                src_offset,
                len,
            };
            let what = format!(
                "a resident worker on GPU 0 into {place:?}: +{src_offset} -> +{dst_offset}, \
                 {len} bytes"
            );
            (copy, want, what)
        })
        .collect();
    let worker = Worker::start(b, &config(0)).unwrap();
    for (copy, want, what) in &cases {
        let ticket = worker.submit(copy).unwrap();
        worker.wait(ticket).unwrap();
        assert!(worker.is_complete(ticket).unwrap());
        holds(b, copy.dst, want, what);
    }
    let report = worker.stop().unwrap();
    assert_eq!(report.submitted, cases.len() as u64);
    assert_eq!(report.completed, report.submitted, "{report:?}");
    assert_eq!(report.exit, WorkerExit::Stopped);
    for (copy, _, _) in cases {
        b.free(copy.src).unwrap();
        b.free(copy.dst).unwrap();
    }
}

pub fn resident_tickets_complete_in_order_and_zero_bytes_take_their_turn(b: &dyn Backend) {
    let len = 64 << 10;
    let data = pattern(len * 16, 22);
    // Allocated before the worker starts: compute-sanitizer's memcheck judges a kernel by the
    // allocations at its launch.
    let src = buffer(b, Memory::Device(0), &data);
    let dst = buffer(b, Memory::Device(0), &vec![FILL; data.len()]);
    let worker = Worker::start(b, &config(0)).unwrap();
    let mut tickets: Vec<Ticket> = (0..16)
        .map(|i| {
            let copy = BufferCopy {
                dst,
                dst_offset: i * len,
                src,
                src_offset: i * len,
                len,
            };
            worker.submit(&copy).unwrap()
        })
        .collect();
    tickets.push(worker.submit(&BufferCopy::from_start(src, dst, 0)).unwrap());
    let indices: Vec<u64> = tickets.iter().map(|t| t.index).collect();
    assert_eq!(
        indices,
        (0..17).collect::<Vec<u64>>(),
        "tickets are 0, 1, 2, …"
    );
    let last = *tickets.last().unwrap();
    worker.wait(last).unwrap();
    for ticket in &tickets {
        assert!(
            worker.is_complete(*ticket).unwrap(),
            "{ticket} after the last"
        );
    }
    holds(b, dst, &data, "sixteen transfers in a row");
}

/// `per_thread` random transfers from each of four threads through one worker on GPU 0 into its
/// peer, every byte checked at the end: each thread writes a region of its own, from a source of
/// its own, eight transfers in flight at once in eight disjoint slots, waiting for the eighth
/// before it reuses a slot.
pub fn random_transfers_from_four_threads(b: &dyn Backend, per_thread: usize) {
    const THREADS: usize = 4;
    const IN_FLIGHT: usize = 8;
    const SLOT: usize = 64 << 10;
    let peer = peer(b);
    let region = IN_FLIGHT * SLOT;
    let dst = buffer(b, Memory::Device(peer), &vec![FILL; THREADS * region]);
    let sources: Vec<(BufferId, Vec<u8>)> = (0..THREADS)
        .map(|t| {
            let data = pattern(2 * SLOT, 40 + t as u8);
            (buffer(b, Memory::Device(0), &data), data)
        })
        .collect();
    // Started after the allocations, as memcheck wants (see the in-order check).
    let worker = Worker::start(b, &WorkerConfig::on(0)).unwrap_or_else(|_| {
        Worker::start(b, &config(0)).expect("a worker with two copy blocks starts anywhere")
    });
    let expected: Vec<Vec<u8>> = std::thread::scope(|scope| {
        let threads: Vec<_> = sources
            .iter()
            .enumerate()
            .map(|(t, (src, data))| {
                let worker = &worker;
                scope.spawn(move || {
                    let mut random = Random(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                    let mut shadow = vec![FILL; region];
                    let base = t * region;
                    let mut last = None;
                    for i in 0..per_thread {
                        let slot = i % IN_FLIGHT;
                        if slot == 0 {
                            if let Some(ticket) = last.take() {
                                worker.wait(ticket).unwrap();
                            }
                        }
                        // Lengths from 1 byte to a whole slot, small ones more often.
                        let len = match random.below(4) {
                            0 => 1 + random.below(64),
                            1 => 1 + random.below(4096),
                            _ => 1 + random.below(SLOT),
                        };
                        let at = slot * SLOT + random.below(SLOT - len + 1);
                        let from = random.below(data.len() - len + 1);
                        let copy = BufferCopy {
                            dst,
                            dst_offset: base + at,
                            src: *src,
                            src_offset: from,
                            len,
                        };
                        last = Some(worker.submit(&copy).unwrap());
                        shadow[at..at + len].copy_from_slice(&data[from..from + len]);
                    }
                    if let Some(ticket) = last {
                        worker.wait(ticket).unwrap();
                    }
                    shadow
                })
            })
            .collect();
        threads.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let report = worker.stop().unwrap();
    assert_eq!(report.submitted, (THREADS * per_thread) as u64);
    assert_eq!(report.completed, report.submitted, "{report:?}");
    holds(b, dst, &expected.concat(), "four threads' random transfers");
    for (src, _) in sources {
        b.free(src).unwrap();
    }
    b.free(dst).unwrap();
}

pub fn resident_transfers_from_four_threads_move_every_byte(b: &dyn Backend) {
    random_transfers_from_four_threads(b, 200);
}

pub fn a_full_ring_holds_submitters_back_and_wraps_round(b: &dyn Backend) {
    let ring_slots = 32;
    let laps = 5;
    let len = 4096;
    let count = ring_slots as usize * laps;
    let data = pattern(count * len, 23);
    let src = buffer(b, Memory::Device(0), &data);
    let dst = buffer(b, Memory::Device(0), &vec![FILL; data.len()]);
    let worker = Worker::start(
        b,
        &WorkerConfig {
            ring_slots,
            ..config(0)
        },
    )
    .unwrap();
    // Never waited for: the ring fills and every submission past it waits for room.
    let mut last = None;
    for i in 0..count {
        let at = i * len;
        let copy = BufferCopy {
            dst,
            dst_offset: at,
            src,
            src_offset: at,
            len,
        };
        let ticket = worker.submit(&copy).unwrap();
        assert_eq!(ticket.index, i as u64);
        if i >= ring_slots as usize {
            let lap_before = Ticket {
                index: (i - ring_slots as usize) as u64,
                ..ticket
            };
            assert!(
                worker.is_complete(lap_before).unwrap(),
                "ticket {i} took slot {} before its previous ticket was complete",
                i % ring_slots as usize
            );
        }
        last = Some(ticket);
    }
    worker.wait(last.unwrap()).unwrap();
    holds(b, dst, &data, "five laps round a 32-slot ring");
    let report = worker.stop().unwrap();
    assert_eq!(report.completed, count as u64);
}

pub fn a_batch_moves_every_message_as_one_ticket(b: &dyn Backend) {
    let peer = peer(b);
    // Small messages in one list, large ones (over the list's limit) in slots of their own, an
    // empty one moving nothing.
    let sizes = [4096, 1, 100_000, 17, 0, 300_000, 4096, 65_536];
    let total: usize = sizes.iter().sum::<usize>() + 16 * sizes.len();
    let data = pattern(total, 24);
    let src = buffer(b, Memory::Device(0), &data);
    let dst = buffer(b, Memory::Device(peer), &vec![FILL; total]);
    let worker = Worker::start(b, &config(0)).unwrap();
    let mut want = vec![FILL; total];
    let mut at = 0;
    let copies: Vec<BufferCopy> = sizes
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            // Destinations in reverse order, each shifted: nothing lines up by accident.
            let to = total - at - len - i;
            want[to..to + len].copy_from_slice(&data[at..at + len]);
            let copy = BufferCopy {
                dst,
                dst_offset: to,
                src,
                src_offset: at,
                len,
            };
            at += len + 16;
            copy
        })
        .collect();
    let ticket = worker.submit_batch(&copies).unwrap();
    worker.wait(ticket).unwrap();
    holds(b, dst, &want, "a batch of eight messages");
    let empty = worker.submit_batch(&[]).unwrap();
    worker.wait(empty).unwrap();
    let overlapping = [copies[0], copies[0]];
    says(&usage(worker.submit_batch(&overlapping)), "overlapping");
}

pub fn a_doorbell_holds_a_transfer_until_its_stream_gets_there(b: &dyn Backend) {
    let len = 1 << 20;
    let data = pattern(len, 25);
    let staged = buffer(b, Memory::Device(0), &data);
    let src = buffer(b, Memory::Device(0), &vec![FILL; len]);
    let dst = buffer(b, Memory::Device(0), &vec![FILL; len]);
    let batched_dst = buffer(b, Memory::Device(0), &vec![FILL; len]);
    let stream = b.create_stream(0).unwrap();
    let worker = Worker::start(b, &config(0)).unwrap();
    // The stream writes the transfer's source, behind a gate; the transfer must see it.
    let gate = b.hold(stream).unwrap();
    let copy = BufferCopy::from_start(staged, src, len);
    b.copy(stream, CopyMethod::CopyEngine, &copy).unwrap();
    let ticket = worker
        .submit_after(stream, &BufferCopy::from_start(src, dst, len))
        .unwrap();
    // A batch behind the same stream sees the source written too.
    let halves = [
        BufferCopy {
            len: len / 2,
            ..BufferCopy::from_start(src, batched_dst, len)
        },
        BufferCopy {
            dst_offset: len / 2,
            src_offset: len / 2,
            len: len / 2,
            ..BufferCopy::from_start(src, batched_dst, len)
        },
    ];
    let batched = worker.submit_batch_after(stream, &halves).unwrap();
    // A later transfer waits behind the doorbell too.
    let after = worker
        .submit(&BufferCopy::from_start(staged, src, 0))
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(
        !worker.is_complete(ticket).unwrap(),
        "ran before its stream got there"
    );
    assert!(
        !worker.is_complete(batched).unwrap(),
        "a batch ran before its stream got there"
    );
    assert!(
        !worker.is_complete(after).unwrap(),
        "overtook a transfer behind a doorbell"
    );
    b.release(gate).unwrap();
    worker.wait(after).unwrap();
    holds(b, dst, &data, "a transfer after its stream's copy");
    holds(b, batched_dst, &data, "a batch after its stream's copy");
    b.synchronize(stream).unwrap();
}

pub fn a_stream_waits_for_a_ticket_without_the_host(b: &dyn Backend) {
    let peer = peer(b);
    let len = 4 << 20;
    let data = pattern(len, 26);
    let src = buffer(b, Memory::Device(0), &data);
    let mid = buffer(b, Memory::Device(peer), &vec![FILL; len]);
    let dst = buffer(b, Memory::Device(peer), &vec![FILL; len]);
    let worker = Worker::start(b, &config(0)).unwrap();
    // A stream on the destination GPU copies what the worker delivered, once it is delivered.
    let stream = b.create_stream(peer).unwrap();
    let ticket = worker
        .submit(&BufferCopy::from_start(src, mid, len))
        .unwrap();
    worker.wait_on_stream(stream, ticket).unwrap();
    let onward = BufferCopy::from_start(mid, dst, len);
    b.copy(stream, CopyMethod::CopyEngine, &onward).unwrap();
    b.synchronize(stream).unwrap();
    holds(b, dst, &data, "a stream's copy after a ticket");
    assert!(worker.is_complete(ticket).unwrap());
}

pub fn a_worker_stops_restarts_and_its_guard_stops_it(b: &dyn Backend) {
    let data = pattern(4096, 27);
    let src = buffer(b, Memory::Device(0), &data);
    let dst = buffer(b, Memory::Device(0), &vec![FILL; 4096]);
    let copy = BufferCopy::from_start(src, dst, 4096);
    let first = b.resident().start_worker(&config(0)).unwrap();
    let ticket = b.resident().submit(first, &copy).unwrap();
    let report: StopReport = b.resident().stop_worker(first).unwrap();
    assert_eq!(
        (report.submitted, report.completed),
        (1, 1),
        "stop finishes what was submitted"
    );
    holds(b, dst, &data, "a transfer finished by the stop");
    says(&invalid(b.resident().submit(first, &copy)), "released");
    says(&invalid(b.resident().is_complete(ticket)), "released");
    says(&invalid(b.resident().stop_worker(first)), "released");
    // Another starts at once, on the same GPU.
    let second = Worker::start(b, &config(0)).unwrap();
    let id = second.id();
    let again = second.submit(&copy).unwrap();
    assert_eq!(again.index, 0, "a new worker counts its own tickets");
    second.wait(again).unwrap();
    drop(second);
    says(&invalid(b.resident().stop_worker(id)), "released");
    // Two at once, one per GPU where there are two, both moving GPU 0's bytes.
    let peer = peer(b);
    let (a, c) = (
        Worker::start(b, &config(0)).unwrap(),
        Worker::start(b, &config(peer)).unwrap(),
    );
    let (ta, tc) = (a.submit(&copy).unwrap(), c.submit(&copy).unwrap());
    a.wait(ta).unwrap();
    c.wait(tc).unwrap();
    holds(b, dst, &data, "two workers at once");
}

/// Releasing GPU memory waits for its device to idle, which never happens while a worker runs:
/// a buffer freed then loses its handle at once and its memory when the last worker stops (one
/// per GPU here where there are two, stopped one at a time, so the first's own memory waits too).
pub fn memory_freed_while_a_worker_runs_is_released_when_the_last_stops(b: &dyn Backend) {
    const BYTES: usize = 256 << 20;
    // Allocation granularity and the driver's own bookkeeping move the free figure a little.
    const SLACK: u64 = 16 << 20;
    let peer = peer(b);
    // What the worker moves exists before it starts (memcheck judges a persistent kernel by the
    // allocations at its launch); the big buffer, which it never touches, comes after.
    let held = buffer(b, Memory::Device(0), &pattern(4096, 31));
    let pinned = buffer(
        b,
        Memory::PinnedHost { numa_node: None },
        &pattern(4096, 32),
    );
    let first = Worker::start(b, &config(0)).unwrap();
    let second = (peer != 0).then(|| Worker::start(b, &config(peer)).unwrap());
    let before = b.free_memory(0).unwrap();
    let big = b.alloc(Memory::Device(0), BYTES).unwrap();
    let copy = BufferCopy::from_start(held, pinned, 4096);
    first.wait(first.submit(&copy).unwrap()).unwrap();
    for freed in [big, held, pinned] {
        b.free(freed).unwrap();
        says(&invalid(b.len(freed)), "released");
    }
    let while_running = b.free_memory(0).unwrap();
    assert!(
        while_running + (BYTES as u64) <= before + SLACK,
        "the memory waits while a worker runs: {while_running} B free, {before} B before the \
         {BYTES} B buffer"
    );
    first.stop().unwrap();
    if let Some(second) = second {
        let one_left = b.free_memory(0).unwrap();
        assert!(
            one_left + (BYTES as u64) <= before + SLACK,
            "one worker still runs, so the memory still waits: {one_left} B free"
        );
        second.stop().unwrap();
    }
    let after = b.free_memory(0).unwrap();
    assert!(
        after + SLACK >= before,
        "released once no worker runs: {after} B free, {before} B before"
    );
}

pub fn resident_calls_refuse_what_they_cannot_take(b: &dyn Backend) {
    let r = b.resident();
    let gpus = b.topology().devices.len();
    says(
        &usage(r.start_worker(&config(gpus))),
        &format!("GPU {gpus}"),
    );
    let odd_ring = WorkerConfig {
        ring_slots: 100,
        ..config(0)
    };
    says(&usage(r.start_worker(&odd_ring)), "power of two");
    let no_watchdog = WorkerConfig {
        watchdog_ms: 0,
        ..config(0)
    };
    says(&usage(r.start_worker(&no_watchdog)), "watchdog");
    let worker = Worker::start(b, &config(0)).unwrap();
    let src = buffer(b, Memory::Device(0), &pattern(4096, 28));
    let outside = BufferCopy {
        src_offset: 1,
        ..BufferCopy::from_start(src, src, 4096)
    };
    says(&usage(worker.submit(&outside)), "outside");
    let onto_itself = BufferCopy {
        dst_offset: 16,
        ..BufferCopy::from_start(src, src, 64)
    };
    says(&usage(worker.submit(&onto_itself)), "overlap");
    let never = Ticket {
        worker: worker.id(),
        index: 5,
    };
    says(&usage(worker.is_complete(never)), "never issued");
    says(&usage(worker.wait(never)), "never issued");
    // Another GPU's memory needs peer access, as for any kernel of the worker's GPU.
    if let Some(other) = (1..gpus).find(|&d| p2p(b, 0, d)) {
        let far = b.alloc(Memory::Device(other), 4096).unwrap();
        says(
            &usage(worker.submit(&BufferCopy::from_start(src, far, 4096))),
            "enable_peer_access(0,",
        );
    }
    // Managed memory would fault inside the worker's kernel, holding up every later ticket.
    let managed = b.alloc(Memory::Managed(0), 4096).unwrap();
    says(
        &usage(worker.submit(&BufferCopy::from_start(src, managed, 4096))),
        "managed memory",
    );
    let into_managed = [BufferCopy::from_start(managed, src, 64)];
    says(&usage(worker.submit_batch(&into_managed)), "managed memory");
    let stream = b.create_stream(0).unwrap();
    b.begin_capture(stream).unwrap();
    let capturing = worker.submit_after(stream, &BufferCopy::from_start(src, src, 0));
    says(&usage(capturing), "captures a graph");
    b.end_capture(stream).unwrap();
}
