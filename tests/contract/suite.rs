//! The backend contract: every behaviour a backend promises, written once against `&dyn Backend`
//! and run on each implementation: the simulator's presets in `tests/contract.rs`, real GPUs in
//! `tests/gpu.rs` (ignored without one). Each check is named for the behaviour it proves — every
//! method, its error paths, every resource's release — and [`contract_tests!`] stamps one test per
//! check for a backend.
//!
//! Collectives (all-reduce, the stand-in compute kernel, NCCL) are in `collective.rs`, the pattern
//! calls (device memory filled and checked on its GPU) in `patterns.rs`. Checks work
//! on one GPU (GPU 0 as its own peer) and on many; a check about a pair of GPUs that
//! the host lacks (two GPUs, a pair without P2P) passes without checking anything, and says so.

use peerlink::backend::{
    Backend, BufferCopy, BufferId, CopyMethod, EventId, GraphId, Memory, StreamId,
};
use peerlink::{Error, Result};

#[path = "collective.rs"]
mod collective;
pub use collective::*;
#[path = "resident.rs"]
mod resident;
pub use resident::*;
#[path = "managed.rs"]
mod managed;
pub use managed::*;
#[path = "patterns.rs"]
mod patterns;
pub use patterns::*;
#[path = "sharing.rs"]
mod sharing;
pub use sharing::*;

/// Stamps one `#[test]` per check, each on a backend of its own from `open` (an expression), with
/// the attributes given first (`#[ignore = "needs a GPU"]`). The module including this file must be
/// named `contract`.
macro_rules! contract_tests {
    ($(#[$attr:meta])* open = $open:expr) => {
        contract_tests!(@one [$(#[$attr])*] ($open)
            source_and_topology_describe_the_host,
            the_host_clock_never_runs_backwards,
            free_memory_is_reported_for_every_gpu,
            a_missing_gpu_is_refused_everywhere,
            peer_access_is_idempotent_and_a_gpu_is_its_own_peer,
            peer_access_without_p2p_is_refused_naming_the_pair,
            writes_read_back_byte_for_byte_in_device_and_pinned_memory,
            pattern_fills_equal_the_host_pattern_at_any_offset_and_length,
            pattern_checks_find_one_wrong_byte_wherever_it_is_and_report_it,
            host_and_gpu_check_each_others_patterns,
            pattern_calls_refuse_pinned_memory_ranges_outside_and_released_buffers,
            pinned_memory_placed_on_a_numa_node_reads_back,
            len_is_the_size_allocated,
            an_empty_allocation_is_refused,
            allocating_more_than_is_free_fails,
            freeing_returns_device_memory,
            a_freed_buffer_is_released,
            reads_and_writes_outside_a_buffer_are_refused,
            streams_are_made_on_every_gpu_and_destroyed_once,
            a_destroyed_stream_still_finishes_its_queued_work,
            copy_engine_copies_move_exactly_their_range,
            sm_copies_move_exactly_their_range,
            peer_copies_move_bytes_pushed_and_pulled,
            copies_move_bytes_to_and_from_pinned_memory,
            a_zero_byte_copy_moves_nothing,
            a_copy_outside_either_buffer_is_refused,
            a_copy_onto_its_own_source_range_is_refused,
            a_kernel_copy_needs_peer_access,
            a_copy_engine_copy_needs_peer_access_where_the_pair_has_p2p,
            copy_engines_stage_between_gpus_without_p2p_where_kernels_cannot_go,
            released_handles_are_refused_by_every_call,
            copy_batch_moves_every_message,
            memcpy_batch_moves_every_message,
            batches_move_messages_between_gpus,
            an_empty_batch_queues_nothing,
            a_refused_batch_writes_nothing,
            a_batch_needs_peer_access_where_the_pair_has_p2p,
            events_mark_work_and_time_it,
            waits_order_work_across_streams,
            a_mark_orders_work_across_gpus_and_keeps_no_time,
            a_wait_outlives_the_event_it_waited_on,
            elapsed_time_needs_both_events_complete,
            elapsed_time_needs_events_of_one_gpu,
            a_destroyed_event_is_released,
            a_gate_keeps_work_back_until_its_release,
            a_released_gate_is_gone,
            a_captured_graph_replays_its_work_and_the_capture_runs_none,
            a_capturing_stream_refuses_what_a_capture_cannot_record,
            ending_a_capture_that_never_began_is_refused,
            a_graph_replays_only_on_a_stream_of_its_gpu,
            a_graph_whose_buffer_was_freed_is_not_replayed,
            a_destroyed_graph_is_released,
            a_graph_destroyed_with_replays_queued_still_runs_them,
            a_pointer_chase_ends_where_a_host_walk_does,
            a_pointer_chase_refuses_short_buffers_and_unreachable_chains,
            a_ping_pong_leaves_both_flags_at_the_round_count,
            a_ping_pong_refuses_one_stream_and_misplaced_flags,
            all_reduce_sums_every_input_into_every_output,
            all_reduce_averages_every_input_into_every_output,
            fifty_all_reduces_in_a_row_on_the_same_flags_each_sum_their_own_inputs,
            packet_all_reduces_of_changing_sizes_read_only_their_own_packets,
            a_captured_all_reduce_replays_on_every_rank_and_the_capture_runs_none,
            all_reduce_refuses_what_its_kernels_cannot_take,
            rank_all_reduce_refuses_what_it_cannot_take,
            one_rank_across_processes_writes_its_input_as_its_sum,
            two_shot_and_packet_all_reduces_sum_in_place,
            a_rank_later_than_a_bounded_wait_is_waited_for_with_a_release_word,
            busy_keeps_its_stream_for_at_least_its_duration,
            nccl_all_reduce_sums_in_place_and_out_of_place,
            nccl_send_recv_moves_every_byte_one_way_both_ways_and_round_a_ring,
            nccl_refuses_what_it_cannot_take,
            nccl_one_rank_of_a_communicator_across_processes,
            resident_transfers_move_exactly_their_range,
            resident_tickets_complete_in_order_and_zero_bytes_take_their_turn,
            resident_transfers_from_four_threads_move_every_byte,
            a_full_ring_holds_submitters_back_and_wraps_round,
            a_batch_moves_every_message_as_one_ticket,
            a_doorbell_holds_a_transfer_until_its_stream_gets_there,
            a_stream_waits_for_a_ticket_without_the_host,
            a_worker_stops_restarts_and_its_guard_stops_it,
            memory_freed_while_a_worker_runs_is_released_when_the_last_stops,
            resident_calls_refuse_what_they_cannot_take,
            managed_memory_reads_back_and_every_gpu_copies_it_without_peer_access,
            prefetches_and_advice_move_pages_but_never_bytes,
            advice_and_prefetches_take_only_managed_memory_and_gpus_that_exist,
            managed_memory_past_a_gpus_free_memory_is_refused,
            shared_host_memory_reads_back_and_gpus_copy_to_and_from_it,
            exports_refuse_managed_private_pinned_empty_and_released_buffers,
            imports_refuse_descriptors_of_other_backends_gpus_files_and_handles,
        );
        #[test]
        $(#[$attr])*
        fn handles_from_another_backend_are_refused() {
            let (mine, theirs) = ($open, $open);
            crate::contract::handles_from_another_backend_are_refused(&mine, &theirs);
        }
    };
    (@one [$(#[$attr:meta])*] ($open:expr) $name:ident $(, $rest:ident)* $(,)?) => {
        #[test]
        $(#[$attr])*
        fn $name() {
            let backend = $open;
            crate::contract::$name(&backend);
        }
        contract_tests!(@one [$(#[$attr])*] ($open) $($rest),*);
    };
    (@one [$(#[$attr:meta])*] ($open:expr)) => {};
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// The crate's data pattern (a shifted, truncated or stale copy shows), with every byte made odd so
/// that none equals the zero fill: a byte a copy failed to write cannot pass for a written one.
pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    let mut bytes = peerlink::pattern::bytes(u64::from(seed), len);
    bytes.iter_mut().for_each(|b| *b |= 1);
    bytes
}

const FILL: u8 = 0;

pub(crate) fn buffer(b: &dyn Backend, memory: Memory, bytes: &[u8]) -> BufferId {
    let id = b.alloc(memory, bytes.len()).unwrap();
    b.write(id, 0, bytes).unwrap();
    id
}

pub fn contents(b: &dyn Backend, id: BufferId) -> Vec<u8> {
    let mut out = vec![0; b.len(id).unwrap()];
    b.read(id, 0, &mut out).unwrap();
    out
}

pub(crate) fn gpus(b: &dyn Backend) -> usize {
    b.topology().devices.len()
}

fn p2p(b: &dyn Backend, a: usize, c: usize) -> bool {
    a == c || b.topology().pair(a, c).is_some_and(|p| p.p2p)
}

/// GPU 0's peer for copies: GPU 1 where the two have P2P, else GPU 0 itself.
fn peer_of_0(b: &dyn Backend) -> usize {
    usize::from(gpus(b) > 1 && p2p(b, 0, 1))
}

/// Two distinct GPUs with P2P, if the host has them.
fn p2p_pair(b: &dyn Backend) -> Option<(usize, usize)> {
    let pair = b.topology().pairs.iter().find(|p| p.p2p)?;
    Some((pair.src, pair.dst))
}

/// Two distinct GPUs without P2P, if the host has them.
fn pair_without_p2p(b: &dyn Backend) -> Option<(usize, usize)> {
    let pair = b.topology().pairs.iter().find(|p| !p.p2p)?;
    Some((pair.src, pair.dst))
}

fn not_here(check: &str, lacking: &str) {
    eprintln!("{check}: nothing to check, this host has {lacking}");
}

/// The message of a usage error (a call the backend cannot take); anything else fails the check.
#[track_caller]
pub(crate) fn usage<T: std::fmt::Debug>(result: Result<T>) -> String {
    match result {
        Err(Error::Usage(message)) => message,
        other => panic!("expected a usage error, got {other:?}"),
    }
}

/// The message of an invalid-handle error; anything else fails the check.
#[track_caller]
pub(crate) fn invalid<T: std::fmt::Debug>(result: Result<T>) -> String {
    match result {
        Err(Error::InvalidHandle(message)) => message,
        other => panic!("expected an invalid-handle error, got {other:?}"),
    }
}

#[track_caller]
pub(crate) fn says(message: &str, what: &str) {
    assert!(message.contains(what), "{message:?} should say {what:?}");
}

/// Copies `len` bytes between fresh buffers with `method` on a stream of `issuer`, and checks that
/// exactly the destination range changed, to the right bytes.
#[allow(clippy::too_many_arguments)]
fn check_copy(
    b: &dyn Backend,
    issuer: usize,
    method: CopyMethod,
    src_memory: Memory,
    dst_memory: Memory,
    shape: (usize, usize, usize),
) {
    let stream = b.create_stream(issuer).unwrap();
    let what = format!("{method:?} on GPU {issuer}");
    check_moved(b, src_memory, dst_memory, shape, &what, |copy| {
        b.copy(stream, method, copy).unwrap();
        b.synchronize(stream).unwrap();
    });
    b.destroy_stream(stream).unwrap();
}

/// Moves `len` bytes between fresh buffers by `move_bytes` (which returns once they have moved),
/// and checks that exactly the destination range changed, to the right bytes; `what` names the
/// mover in a failure.
pub fn check_moved(
    b: &dyn Backend,
    src_memory: Memory,
    dst_memory: Memory,
    (src_offset, dst_offset, len): (usize, usize, usize),
    what: &str,
    move_bytes: impl FnOnce(&BufferCopy),
) {
    let size = len + 64;
    let data = pattern(size, 7);
    let src = buffer(b, src_memory, &data);
    let dst = buffer(b, dst_memory, &vec![FILL; size]);
    let copy = BufferCopy {
        dst,
        dst_offset,
        src,
        src_offset,
        len,
    };
    move_bytes(&copy);
    let got = contents(b, dst);
    let mut want = vec![FILL; size];
    want[dst_offset..dst_offset + len].copy_from_slice(&data[src_offset..src_offset + len]);
    if let Some(at) = (0..size).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: {src_memory:?}+{src_offset} -> {dst_memory:?}+{dst_offset}, {len} bytes: \
             first wrong byte at {at} (want {:#04x}, got {:#04x})",
            want[at], got[at]
        );
    }
    b.free(src).unwrap();
    b.free(dst).unwrap();
}

/// (source offset, destination offset, length): aligned, unaligned alike, mismatched, tiny, odd.
const SHAPES: [(usize, usize, usize); 7] = [
    (0, 0, 1 << 20),
    (1, 1, 1_000_003),
    (1, 3, 1_000_003),
    (16, 0, 4096),
    (5, 5, 17),
    (0, 0, 1),
    (7, 9, 15),
];

// ---------------------------------------------------------------------------------------------
// The host

pub fn source_and_topology_describe_the_host(b: &dyn Backend) {
    let t = b.topology();
    // The source names what the figures come from, and says whether they are simulated.
    assert_eq!(b.source(), &t.source);
    assert_eq!(b.source().is_simulated(), t.is_simulated());
    let named = b.source().to_string();
    assert!(named == "cuda" || named.starts_with("sim:"), "{named}");
    let n = t.devices.len();
    assert!(n >= 1, "a host has a GPU");
    for (i, d) in t.devices.iter().enumerate() {
        assert_eq!(d.index, i);
        assert!(d.memory_bytes > 0);
    }
    assert_eq!(t.pairs.len(), n * (n - 1), "every ordered pair, once");
    for a in 0..n {
        for c in (0..n).filter(|&c| c != a) {
            assert!(t.pair(a, c).is_some(), "pair {a} -> {c}");
        }
    }
    for notice in b.notices() {
        assert!(!notice.trim().is_empty(), "a notice is a sentence");
    }
}

pub fn the_host_clock_never_runs_backwards(b: &dyn Backend) {
    let stream = b.create_stream(0).unwrap();
    let before = b.host_time_us();
    let event = b.record(stream).unwrap();
    b.event_synchronize(event).unwrap();
    let after = b.host_time_us();
    assert!(before.is_finite() && before >= 0.0, "{before}");
    assert!(after >= before, "{before} then {after}");
}

pub fn free_memory_is_reported_for_every_gpu(b: &dyn Backend) {
    for (i, d) in b.topology().devices.iter().enumerate() {
        let free = b.free_memory(i).unwrap();
        assert!(free > 0 && free <= d.memory_bytes, "GPU {i}: {free} free");
    }
}

pub fn a_missing_gpu_is_refused_everywhere(b: &dyn Backend) {
    let n = gpus(b);
    says(&usage(b.free_memory(n)), &format!("GPU {n} does not exist"));
    usage(b.alloc(Memory::Device(n), 16));
    usage(b.create_stream(n));
    usage(b.enable_peer_access(0, n));
    usage(b.enable_peer_access(n, 0));
}

// ---------------------------------------------------------------------------------------------
// Peer access

pub fn peer_access_is_idempotent_and_a_gpu_is_its_own_peer(b: &dyn Backend) {
    b.enable_peer_access(0, 0).unwrap();
    b.enable_peer_access(0, 0).unwrap();
    let Some((a, c)) = p2p_pair(b) else {
        return not_here("peer access between GPUs", "no two GPUs with P2P");
    };
    b.enable_peer_access(a, c).unwrap();
    b.enable_peer_access(a, c).unwrap();
}

pub fn peer_access_without_p2p_is_refused_naming_the_pair(b: &dyn Backend) {
    let Some((a, c)) = pair_without_p2p(b) else {
        return not_here("peer access without P2P", "no pair without P2P");
    };
    match b.enable_peer_access(a, c) {
        Err(Error::PeerAccess { src, dst, message }) => {
            assert_eq!((src, dst), (a, c));
            assert!(!message.is_empty());
        }
        other => panic!("expected a peer-access error, got {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// Memory

pub fn writes_read_back_byte_for_byte_in_device_and_pinned_memory(b: &dyn Backend) {
    for memory in [Memory::Device(0), Memory::PinnedHost { numa_node: None }] {
        let data = pattern(3 << 20, 3);
        let id = buffer(b, memory, &data);
        assert!(contents(b, id) == data, "{memory:?}");
        let mut middle = vec![0; 1001];
        b.read(id, 12_345, &mut middle).unwrap();
        assert_eq!(middle, data[12_345..13_346], "{memory:?}");
        b.write(id, 7, &[0xAB; 5]).unwrap();
        let mut around = [0; 7];
        b.read(id, 6, &mut around).unwrap();
        assert_eq!(around, [data[6], 0xAB, 0xAB, 0xAB, 0xAB, 0xAB, data[12]]);
        b.free(id).unwrap();
    }
}

pub fn pinned_memory_placed_on_a_numa_node_reads_back(b: &dyn Backend) {
    let node = b.topology().devices[0].numa_node.or(Some(0));
    let data = pattern(1 << 20, 4);
    let id = buffer(b, Memory::PinnedHost { numa_node: node }, &data);
    assert!(contents(b, id) == data);
    b.free(id).unwrap();
}

pub fn len_is_the_size_allocated(b: &dyn Backend) {
    for bytes in [1, 4097, 3 << 20] {
        let id = b.alloc(Memory::Device(0), bytes).unwrap();
        assert_eq!(b.len(id).unwrap(), bytes);
        b.free(id).unwrap();
    }
}

pub fn an_empty_allocation_is_refused(b: &dyn Backend) {
    says(&usage(b.alloc(Memory::Device(0), 0)), "0 bytes");
    usage(b.alloc(Memory::PinnedHost { numa_node: None }, 0));
}

pub fn allocating_more_than_is_free_fails(b: &dyn Backend) {
    let free = b.free_memory(0).unwrap() as usize;
    let err = b.alloc(Memory::Device(0), free + (1 << 30)).unwrap_err();
    assert_eq!(err.exit_code(), 1, "a runtime failure: {err}");
}

pub fn freeing_returns_device_memory(b: &dyn Backend) {
    let bytes = 256 << 20;
    let before = b.free_memory(0).unwrap();
    let id = b.alloc(Memory::Device(0), bytes).unwrap();
    let during = b.free_memory(0).unwrap();
    assert!(before - during >= bytes as u64, "{before} then {during}");
    b.free(id).unwrap();
    let after = b.free_memory(0).unwrap();
    // Real drivers keep a little for themselves after the first allocation.
    assert!(after + (64 << 20) >= before, "{before} then {after}");
}

pub fn a_freed_buffer_is_released(b: &dyn Backend) {
    let id = b.alloc(Memory::Device(0), 64).unwrap();
    b.free(id).unwrap();
    says(&invalid(b.len(id)), "released");
    invalid(b.read(id, 0, &mut [0; 4]));
    invalid(b.write(id, 0, &[1]));
    invalid(b.free(id));
    let other = b.alloc(Memory::Device(0), 64).unwrap();
    let stream = b.create_stream(0).unwrap();
    invalid(b.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(id, other, 8),
    ));
    invalid(b.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(other, id, 8),
    ));
    invalid(b.copy_batch(stream, &[BufferCopy::from_start(other, id, 8)]));
    invalid(b.memcpy_batch(stream, &[BufferCopy::from_start(id, other, 8)]));
    invalid(b.probes().pointer_chase(stream, id, 1, other));
}

pub fn reads_and_writes_outside_a_buffer_are_refused(b: &dyn Backend) {
    let id = buffer(b, Memory::Device(0), &[9; 100]);
    says(&usage(b.write(id, 99, &[1, 2])), "outside");
    usage(b.read(id, 99, &mut [0; 2]));
    usage(b.write(id, usize::MAX, &[1]));
    usage(b.read(id, usize::MAX, &mut [0; 1]));
    usage(b.write(id, 101, &[]));
    // Nothing was written, and an empty range at the end is inside.
    b.write(id, 100, &[]).unwrap();
    b.read(id, 100, &mut []).unwrap();
    assert_eq!(contents(b, id), [9; 100]);
}

// ---------------------------------------------------------------------------------------------
// Streams

pub fn streams_are_made_on_every_gpu_and_destroyed_once(b: &dyn Backend) {
    for device in 0..gpus(b) {
        let stream = b.create_stream(device).unwrap();
        b.synchronize(stream).unwrap();
        b.destroy_stream(stream).unwrap();
        says(&invalid(b.destroy_stream(stream)), "released");
        invalid(b.synchronize(stream));
        invalid(b.record(stream));
        invalid(b.hold(stream));
        invalid(b.begin_capture(stream));
    }
}

pub fn a_destroyed_stream_still_finishes_its_queued_work(b: &dyn Backend) {
    let data = pattern(4 << 20, 5);
    let src = buffer(b, Memory::Device(0), &data);
    let dst = buffer(b, Memory::Device(0), &vec![FILL; data.len()]);
    let stream = b.create_stream(0).unwrap();
    b.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, dst, data.len()),
    )
    .unwrap();
    let done = b.record(stream).unwrap();
    b.destroy_stream(stream).unwrap();
    b.event_synchronize(done).unwrap();
    assert!(contents(b, dst) == data);
}

// ---------------------------------------------------------------------------------------------
// Copies

pub fn copy_engine_copies_move_exactly_their_range(b: &dyn Backend) {
    for shape in SHAPES {
        let local = Memory::Device(0);
        check_copy(b, 0, CopyMethod::CopyEngine, local, local, shape);
    }
}

pub fn sm_copies_move_exactly_their_range(b: &dyn Backend) {
    for shape in SHAPES {
        let local = Memory::Device(0);
        check_copy(b, 0, CopyMethod::SmKernel, local, local, shape);
    }
}

pub fn peer_copies_move_bytes_pushed_and_pulled(b: &dyn Backend) {
    let (a, c) = (0, peer_of_0(b));
    b.enable_peer_access(a, c).unwrap();
    b.enable_peer_access(c, a).unwrap();
    for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
        for issuer in [a, c] {
            for shape in SHAPES {
                let (from, to) = (Memory::Device(a), Memory::Device(c));
                check_copy(b, issuer, method, from, to, shape);
                check_copy(b, issuer, method, to, from, shape);
            }
        }
    }
}

pub fn copies_move_bytes_to_and_from_pinned_memory(b: &dyn Backend) {
    // Unplaced, and placed on the GPU's own NUMA node.
    let near = b.topology().devices[0].numa_node.or(Some(0));
    for numa_node in [None, near] {
        let host = Memory::PinnedHost { numa_node };
        for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
            for shape in SHAPES {
                check_copy(b, 0, method, Memory::Device(0), host, shape);
                check_copy(b, 0, method, host, Memory::Device(0), shape);
            }
        }
    }
}

pub fn a_zero_byte_copy_moves_nothing(b: &dyn Backend) {
    let src = buffer(b, Memory::Device(0), &[1; 64]);
    let dst = buffer(b, Memory::Device(0), &[2; 64]);
    let stream = b.create_stream(0).unwrap();
    for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
        let empty = BufferCopy {
            dst_offset: 64,
            ..BufferCopy::from_start(src, dst, 0)
        };
        b.copy(stream, method, &empty).unwrap();
        b.copy(stream, method, &BufferCopy::from_start(src, dst, 0))
            .unwrap();
    }
    b.synchronize(stream).unwrap();
    assert_eq!(contents(b, dst), [2; 64]);
}

pub fn a_copy_outside_either_buffer_is_refused(b: &dyn Backend) {
    let src = buffer(b, Memory::Device(0), &[1; 100]);
    let dst = buffer(b, Memory::Device(0), &[2; 100]);
    let stream = b.create_stream(0).unwrap();
    for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
        let past_dst = BufferCopy {
            dst_offset: 1,
            ..BufferCopy::from_start(src, dst, 100)
        };
        says(&usage(b.copy(stream, method, &past_dst)), "destination");
        let past_src = BufferCopy {
            src_offset: 1,
            ..BufferCopy::from_start(src, dst, 100)
        };
        says(&usage(b.copy(stream, method, &past_src)), "source");
        let wrapping = BufferCopy {
            dst_offset: usize::MAX,
            ..BufferCopy::from_start(src, dst, 2)
        };
        usage(b.copy(stream, method, &wrapping));
        let empty_past_end = BufferCopy {
            src_offset: 101,
            ..BufferCopy::from_start(src, dst, 0)
        };
        usage(b.copy(stream, method, &empty_past_end));
    }
    b.synchronize(stream).unwrap();
    assert_eq!(contents(b, dst), [2; 100], "a refused copy wrote bytes");
}

pub fn a_copy_onto_its_own_source_range_is_refused(b: &dyn Backend) {
    let data = pattern(100, 8);
    let id = buffer(b, Memory::Device(0), &data);
    let stream = b.create_stream(0).unwrap();
    for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
        let overlapping = BufferCopy {
            dst: id,
            dst_offset: 10,
            src: id,
            src_offset: 0,
            len: 20,
        };
        says(&usage(b.copy(stream, method, &overlapping)), "overlap");
    }
    // Disjoint ranges of one buffer are two places.
    let within = BufferCopy {
        dst: id,
        dst_offset: 50,
        src: id,
        src_offset: 0,
        len: 50,
    };
    b.copy(stream, CopyMethod::CopyEngine, &within).unwrap();
    b.synchronize(stream).unwrap();
    let got = contents(b, id);
    assert_eq!(got[..50], data[..50]);
    assert_eq!(got[50..], data[..50]);
}

/// A copy by `method` on a stream of `a` that pulls from `c`'s memory: refused, naming the call
/// that allows it, until peer access from `a` to `c` is enabled.
fn check_refused_until_peer_access(b: &dyn Backend, method: CopyMethod, (a, c): (usize, usize)) {
    let src = buffer(b, Memory::Device(c), &[1; 64]);
    let dst = buffer(b, Memory::Device(a), &[2; 64]);
    let stream = b.create_stream(a).unwrap();
    let refused = usage(b.copy(stream, method, &BufferCopy::from_start(src, dst, 64)));
    says(&refused, &format!("enable_peer_access({a}, {c})"));
    b.enable_peer_access(a, c).unwrap();
    b.copy(stream, method, &BufferCopy::from_start(src, dst, 64))
        .unwrap();
    b.synchronize(stream).unwrap();
    assert_eq!(contents(b, dst), [1; 64]);
}

pub fn a_kernel_copy_needs_peer_access(b: &dyn Backend) {
    match p2p_pair(b) {
        Some(pair) => check_refused_until_peer_access(b, CopyMethod::SmKernel, pair),
        None => not_here("kernel copies between GPUs", "no two GPUs with P2P"),
    }
}

pub fn a_copy_engine_copy_needs_peer_access_where_the_pair_has_p2p(b: &dyn Backend) {
    match p2p_pair(b) {
        Some(pair) => check_refused_until_peer_access(b, CopyMethod::CopyEngine, pair),
        None => not_here("copy-engine copies between GPUs", "no two GPUs with P2P"),
    }
}

pub fn copy_engines_stage_between_gpus_without_p2p_where_kernels_cannot_go(b: &dyn Backend) {
    let Some((a, c)) = pair_without_p2p(b) else {
        return not_here("staged copies", "no pair without P2P");
    };
    let data = pattern(1 << 20, 6);
    let src = buffer(b, Memory::Device(a), &data);
    let dst = buffer(b, Memory::Device(c), &vec![FILL; data.len()]);
    let stream = b.create_stream(a).unwrap();
    let all = BufferCopy::from_start(src, dst, data.len());
    usage(b.copy(stream, CopyMethod::SmKernel, &all));
    usage(b.copy_batch(stream, &[all]));
    b.copy(stream, CopyMethod::CopyEngine, &all).unwrap();
    b.synchronize(stream).unwrap();
    assert!(contents(b, dst) == data, "staged copy");
    b.write(dst, 0, &vec![FILL; data.len()]).unwrap();
    b.memcpy_batch(stream, &[all]).unwrap();
    b.synchronize(stream).unwrap();
    assert!(contents(b, dst) == data, "staged batch");
}

pub fn released_handles_are_refused_by_every_call(b: &dyn Backend) {
    let buf = buffer(b, Memory::Device(0), &[0; 64]);
    let stream = b.create_stream(0).unwrap();
    let dead_stream = b.create_stream(0).unwrap();
    b.destroy_stream(dead_stream).unwrap();
    let event = b.record(stream).unwrap();
    let dead_event = b.record(stream).unwrap();
    b.synchronize(stream).unwrap();
    b.destroy_event(dead_event).unwrap();
    let local = BufferCopy::from_start(buf, buf, 0);
    invalid(b.copy(dead_stream, CopyMethod::CopyEngine, &local));
    invalid(b.copy_batch(dead_stream, &[local]));
    invalid(b.memcpy_batch(dead_stream, &[local]));
    invalid(b.wait(dead_stream, event));
    invalid(b.wait(stream, dead_event));
    invalid(b.event_done(dead_event));
    invalid(b.event_synchronize(dead_event));
    invalid(b.elapsed_us(event, dead_event));
    invalid(b.elapsed_us(dead_event, event));
    invalid(b.destroy_event(dead_event));
    invalid(b.end_capture(dead_stream));
    invalid(b.destroy_stream(dead_stream));
    invalid(b.probes().pointer_chase(dead_stream, buf, 1, buf));
    let other = b.create_stream(0).unwrap();
    invalid(b.probes().ping_pong(dead_stream, other, buf, buf, 1));
}

// ---------------------------------------------------------------------------------------------
// Batches

type BatchCall = fn(&dyn Backend, StreamId, &[BufferCopy]) -> Result<()>;

/// The two ways to queue a batch: one copy kernel, and copy-engine copies in one driver call.
const BATCH_CALLS: [(&str, BatchCall); 2] = [
    ("copy_batch", |b, s, c| b.copy_batch(s, c)),
    ("memcpy_batch", |b, s, c| b.memcpy_batch(s, c)),
];

/// 1000 messages of odd sizes at odd offsets from `src`, packed without overlap into `dst`.
fn messages(src: BufferId, dst: BufferId) -> Vec<BufferCopy> {
    let mut at = 0;
    (0..1000usize)
        .map(|i| {
            let len = 1 + (i * 37) % 700;
            let copy = BufferCopy {
                dst,
                dst_offset: at + i % 3,
                src,
                src_offset: (i * 997) % ((1 << 20) - 800),
                len,
            };
            at += len + 3;
            copy
        })
        .collect()
}

/// Runs `batch` three times (blocks of copy lists are reused), then checks every message landed
/// and no byte between them changed.
fn check_batch(b: &dyn Backend, name: &str, batch: BatchCall, issuer: usize, to: usize) {
    let data = pattern(1 << 20, 11);
    let src = buffer(b, Memory::Device(issuer), &data);
    let dst = buffer(b, Memory::Device(to), &vec![FILL; 1 << 20]);
    let copies = messages(src, dst);
    let stream = b.create_stream(issuer).unwrap();
    for _ in 0..3 {
        batch(b, stream, &copies).unwrap();
    }
    b.synchronize(stream).unwrap();
    let mut want = vec![FILL; 1 << 20];
    for c in &copies {
        want[c.dst_offset..c.dst_offset + c.len]
            .copy_from_slice(&data[c.src_offset..c.src_offset + c.len]);
    }
    assert!(
        contents(b, dst) == want,
        "{name} GPU {issuer} -> GPU {to}: wrong bytes"
    );
}

pub fn copy_batch_moves_every_message(b: &dyn Backend) {
    let (name, batch) = BATCH_CALLS[0];
    check_batch(b, name, batch, 0, 0);
}

pub fn memcpy_batch_moves_every_message(b: &dyn Backend) {
    let (name, batch) = BATCH_CALLS[1];
    check_batch(b, name, batch, 0, 0);
}

pub fn batches_move_messages_between_gpus(b: &dyn Backend) {
    let (a, c) = (0, peer_of_0(b));
    b.enable_peer_access(a, c).unwrap();
    for (name, batch) in BATCH_CALLS {
        check_batch(b, name, batch, a, c);
    }
}

pub fn an_empty_batch_queues_nothing(b: &dyn Backend) {
    let stream = b.create_stream(0).unwrap();
    for (_, batch) in BATCH_CALLS {
        batch(b, stream, &[]).unwrap();
    }
    b.synchronize(stream).unwrap();
}

pub fn a_refused_batch_writes_nothing(b: &dyn Backend) {
    let src = buffer(b, Memory::Device(0), &pattern(1 << 16, 1));
    let dst = buffer(b, Memory::Device(0), &pattern(1 << 16, 2));
    let stream = b.create_stream(0).unwrap();
    let before = contents(b, dst);
    for (name, batch) in BATCH_CALLS {
        let overlapping = [
            BufferCopy::from_start(src, dst, 100),
            BufferCopy {
                dst_offset: 99,
                src_offset: 200,
                ..BufferCopy::from_start(src, dst, 10)
            },
        ];
        let refused = usage(batch(b, stream, &overlapping));
        says(&refused, "overlapping");
        says(&refused, name);
        // The second message reads past its buffer's end: the first must not run either.
        let past_end = [
            BufferCopy {
                dst_offset: 1000,
                ..BufferCopy::from_start(src, dst, 64)
            },
            BufferCopy {
                src_offset: (1 << 16) - 10,
                ..BufferCopy::from_start(src, dst, 64)
            },
        ];
        says(&usage(batch(b, stream, &past_end)), "message 1: source");
        // Empty messages overlap nothing.
        let empty = [
            BufferCopy::from_start(src, dst, 0),
            BufferCopy::from_start(src, dst, 0),
        ];
        batch(b, stream, &empty).unwrap();
    }
    b.synchronize(stream).unwrap();
    assert!(contents(b, dst) == before, "a refused batch wrote bytes");
}

pub fn a_batch_needs_peer_access_where_the_pair_has_p2p(b: &dyn Backend) {
    let Some((a, c)) = p2p_pair(b) else {
        return not_here("batches between GPUs", "no two GPUs with P2P");
    };
    let src = buffer(b, Memory::Device(a), &[1; 64]);
    let dst = buffer(b, Memory::Device(c), &[2; 64]);
    let stream = b.create_stream(a).unwrap();
    for (_, batch) in BATCH_CALLS {
        let refused = usage(batch(b, stream, &[BufferCopy::from_start(src, dst, 64)]));
        says(&refused, &format!("enable_peer_access({a}, {c})"));
    }
}

// ---------------------------------------------------------------------------------------------
// Events

pub fn events_mark_work_and_time_it(b: &dyn Backend) {
    let data = pattern(8 << 20, 3);
    let src = buffer(b, Memory::Device(0), &data);
    let dst = b.alloc(Memory::Device(0), data.len()).unwrap();
    let stream = b.create_stream(0).unwrap();
    let start = b.record(stream).unwrap();
    b.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, dst, data.len()),
    )
    .unwrap();
    let end = b.record(stream).unwrap();
    b.event_synchronize(end).unwrap();
    assert!(b.event_done(end).unwrap());
    assert!(
        b.event_done(start).unwrap(),
        "earlier work on a stream is done first"
    );
    let us = b.elapsed_us(start, end).unwrap();
    assert!(us.is_finite() && us > 0.0, "{us} µs for an 8 MiB copy");
    assert_eq!(b.elapsed_us(start, start).unwrap(), 0.0);
    assert!(contents(b, dst) == data);
}

pub fn waits_order_work_across_streams(b: &dyn Backend) {
    let data = pattern(16 << 20, 9);
    let src = buffer(b, Memory::Device(0), &data);
    let mid = b.alloc(Memory::Device(0), data.len()).unwrap();
    let dst = b.alloc(Memory::Device(0), data.len()).unwrap();
    let (first, second) = (b.create_stream(0).unwrap(), b.create_stream(0).unwrap());
    relay(b, [first, second], [src, mid, dst], data.len());
    b.synchronize(second).unwrap();
    assert!(contents(b, dst) == data);
}

/// Copies `len` bytes `src → mid` on the first stream and `mid → dst` on the second, the second
/// stream waiting for the first's event; returns that event.
fn relay(
    b: &dyn Backend,
    streams: [StreamId; 2],
    [src, mid, dst]: [BufferId; 3],
    len: usize,
) -> EventId {
    let [first, second] = streams;
    b.copy(
        first,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, mid, len),
    )
    .unwrap();
    let landed = b.record(first).unwrap();
    b.wait(second, landed).unwrap();
    b.copy(
        second,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(mid, dst, len),
    )
    .unwrap();
    landed
}

/// A staged route's two hops (GPU 0 → pinned host → GPU 1, or GPU 0 again on one GPU), ordered by a
/// mark: the second waits for the first while that is held back, and no time can be read off it.
pub fn a_mark_orders_work_across_gpus_and_keeps_no_time(b: &dyn Backend) {
    let other = usize::from(gpus(b) > 1);
    let data = pattern(4 << 20, 21);
    let src = buffer(b, Memory::Device(0), &data);
    let mid = b
        .alloc(Memory::PinnedHost { numa_node: None }, data.len())
        .unwrap();
    let dst = buffer(b, Memory::Device(other), &vec![FILL; data.len()]);
    let (first, second) = (b.create_stream(0).unwrap(), b.create_stream(other).unwrap());
    for round in 0..2 {
        let gate = b.hold(first).unwrap();
        let copy = |stream, from, to| {
            b.copy(
                stream,
                CopyMethod::CopyEngine,
                &BufferCopy::from_start(from, to, data.len()),
            )
            .unwrap()
        };
        copy(first, src, mid);
        let filled = b.mark(first).unwrap();
        b.wait(second, filled).unwrap();
        copy(second, mid, dst);
        let end = b.record(second).unwrap();
        assert!(
            !b.event_done(end).unwrap(),
            "round {round}: the second hop waits for the held first"
        );
        b.release(gate).unwrap();
        b.synchronize(second).unwrap();
        assert!(contents(b, dst) == data, "round {round}");
        says(&usage(b.elapsed_us(filled, end)), "only orders work");
        says(&usage(b.elapsed_us(end, filled)), "only orders work");
        // Destroyed marks may be kept and recorded again: the second round uses one.
        b.destroy_event(filled).unwrap();
        b.destroy_event(end).unwrap();
        b.write(dst, 0, &vec![FILL; data.len()]).unwrap();
    }
}

pub fn a_wait_outlives_the_event_it_waited_on(b: &dyn Backend) {
    let data = pattern(1 << 20, 10);
    let src = buffer(b, Memory::Device(0), &data);
    let mid = b.alloc(Memory::Device(0), data.len()).unwrap();
    let dst = buffer(b, Memory::Device(0), &vec![FILL; data.len()]);
    let (first, second) = (b.create_stream(0).unwrap(), b.create_stream(0).unwrap());
    let gate = b.hold(first).unwrap();
    let landed = relay(b, [first, second], [src, mid, dst], data.len());
    b.destroy_event(landed).unwrap();
    b.release(gate).unwrap();
    b.synchronize(second).unwrap();
    assert!(contents(b, dst) == data);
}

pub fn elapsed_time_needs_both_events_complete(b: &dyn Backend) {
    let stream = b.create_stream(0).unwrap();
    let gate = b.hold(stream).unwrap();
    let (start, end) = (b.record(stream).unwrap(), b.record(stream).unwrap());
    says(&usage(b.elapsed_us(start, end)), "not both completed");
    b.release(gate).unwrap();
    b.synchronize(stream).unwrap();
    assert!(b.elapsed_us(start, end).unwrap() >= 0.0);
}

pub fn elapsed_time_needs_events_of_one_gpu(b: &dyn Backend) {
    if gpus(b) < 2 {
        return not_here("events of two GPUs", "one GPU");
    }
    let (s0, s1) = (b.create_stream(0).unwrap(), b.create_stream(1).unwrap());
    let (a, c) = (b.record(s0).unwrap(), b.record(s1).unwrap());
    b.synchronize(s0).unwrap();
    b.synchronize(s1).unwrap();
    says(&usage(b.elapsed_us(a, c)), "different GPUs");
}

pub fn a_destroyed_event_is_released(b: &dyn Backend) {
    let stream = b.create_stream(0).unwrap();
    let event = b.record(stream).unwrap();
    b.synchronize(stream).unwrap();
    b.destroy_event(event).unwrap();
    says(&invalid(b.event_done(event)), "released");
    invalid(b.event_synchronize(event));
    invalid(b.wait(stream, event));
    invalid(b.destroy_event(event));
    // Events made since do not answer for it.
    let next = b.record(stream).unwrap();
    invalid(b.event_done(event));
    b.event_synchronize(next).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Gates

pub fn a_gate_keeps_work_back_until_its_release(b: &dyn Backend) {
    let data = pattern(4 << 20, 12);
    let src = buffer(b, Memory::Device(0), &data);
    let dst = buffer(b, Memory::Device(0), &vec![FILL; data.len()]);
    let stream = b.create_stream(0).unwrap();
    let gate = b.hold(stream).unwrap();
    let start = b.record(stream).unwrap();
    b.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, dst, data.len()),
    )
    .unwrap();
    let end = b.record(stream).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert!(!b.event_done(start).unwrap(), "work ran before the release");
    assert!(!b.event_done(end).unwrap(), "work ran before the release");
    b.release(gate).unwrap();
    b.event_synchronize(end).unwrap();
    assert!(contents(b, dst) == data);
    // The 50 ms the host waited are not inside the window.
    let us = b.elapsed_us(start, end).unwrap();
    assert!(us > 0.0 && us < 40_000.0, "{us} µs");
}

pub fn a_released_gate_is_gone(b: &dyn Backend) {
    let stream = b.create_stream(0).unwrap();
    let gate = b.hold(stream).unwrap();
    b.release(gate).unwrap();
    says(&invalid(b.release(gate)), "released");
    b.synchronize(stream).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Graphs

pub fn a_captured_graph_replays_its_work_and_the_capture_runs_none(b: &dyn Backend) {
    let size = 1 << 16;
    let src = b.alloc(Memory::Device(0), size).unwrap();
    let dst = buffer(b, Memory::Device(0), &vec![FILL; size]);
    let stream = b.create_stream(0).unwrap();
    let half = size / 2;
    let first = BufferCopy::from_start(src, dst, half);
    let second = BufferCopy {
        dst_offset: half + 1,
        src_offset: half + 1,
        len: half - 1,
        ..first
    };
    let third = BufferCopy {
        dst_offset: half,
        src_offset: half,
        len: 1,
        ..first
    };
    assert!(!b.is_capturing(stream).unwrap());
    b.begin_capture(stream).unwrap();
    assert!(
        b.is_capturing(stream).unwrap(),
        "a capture begun here is seen"
    );
    b.copy(stream, CopyMethod::CopyEngine, &first).unwrap();
    b.copy(stream, CopyMethod::SmKernel, &second).unwrap();
    b.copy_batch(stream, &[third]).unwrap();
    let graph = b.end_capture(stream).unwrap();
    assert!(!b.is_capturing(stream).unwrap(), "the capture ended");
    b.synchronize(stream).unwrap();
    assert!(contents(b, dst) == vec![FILL; size], "the capture ran work");
    for seed in [1, 2] {
        let data = pattern(size, seed);
        b.write(src, 0, &data).unwrap();
        b.replay(graph, stream).unwrap();
        b.synchronize(stream).unwrap();
        assert!(contents(b, dst) == data, "replay {seed}");
    }
    b.destroy_graph(graph).unwrap();
}

pub fn a_capturing_stream_refuses_what_a_capture_cannot_record(b: &dyn Backend) {
    let buf = buffer(b, Memory::Device(0), &[1; 64]);
    let other = b.create_stream(0).unwrap();
    let elsewhere = b.record(other).unwrap();
    let stream = b.create_stream(0).unwrap();
    b.begin_capture(stream).unwrap();
    b.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(buf, buf, 0),
    )
    .unwrap();
    let inside = BufferCopy::from_start(buf, buf, 32);
    b.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy {
            dst_offset: 32,
            ..inside
        },
    )
    .unwrap();
    says(&usage(b.record(stream)), "captures a graph");
    usage(b.wait(stream, elsewhere));
    usage(b.hold(stream));
    usage(b.synchronize(stream));
    says(&usage(b.begin_capture(stream)), "already captures");
    says(&usage(b.destroy_stream(stream)), "end the capture");
    let flag = buffer(b, Memory::Device(0), &[0; 4]);
    let flag2 = buffer(b, Memory::Device(0), &[0; 4]);
    usage(b.probes().ping_pong(stream, other, flag, flag2, 1));
    let graph = b.end_capture(stream).unwrap();
    b.destroy_graph(graph).unwrap();
    b.synchronize(stream).unwrap();
    b.destroy_stream(stream).unwrap();
}

/// A graph of one copy-engine copy of `len` bytes from `src` to `dst`, captured on `stream`.
fn captured_copy(
    b: &dyn Backend,
    stream: StreamId,
    src: BufferId,
    dst: BufferId,
    len: usize,
) -> GraphId {
    b.begin_capture(stream).unwrap();
    b.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, dst, len),
    )
    .unwrap();
    b.end_capture(stream).unwrap()
}

pub fn ending_a_capture_that_never_began_is_refused(b: &dyn Backend) {
    let stream = b.create_stream(0).unwrap();
    says(&usage(b.end_capture(stream)), "not capturing");
}

pub fn a_graph_replays_only_on_a_stream_of_its_gpu(b: &dyn Backend) {
    if gpus(b) < 2 {
        return not_here("replays on another GPU", "one GPU");
    }
    let src = buffer(b, Memory::Device(0), &[1; 64]);
    let dst = b.alloc(Memory::Device(0), 64).unwrap();
    let stream = b.create_stream(0).unwrap();
    let graph = captured_copy(b, stream, src, dst, 64);
    let elsewhere = b.create_stream(1).unwrap();
    says(&usage(b.replay(graph, elsewhere)), "captured on GPU 0");
}

pub fn a_graph_whose_buffer_was_freed_is_not_replayed(b: &dyn Backend) {
    let src = buffer(b, Memory::Device(0), &[1; 64]);
    let dst = b.alloc(Memory::Device(0), 64).unwrap();
    let stream = b.create_stream(0).unwrap();
    let graph = captured_copy(b, stream, src, dst, 64);
    b.free(dst).unwrap();
    says(&usage(b.replay(graph, stream)), "freed");
    b.destroy_graph(graph).unwrap();
}

pub fn a_destroyed_graph_is_released(b: &dyn Backend) {
    let buf = buffer(b, Memory::Device(0), &[1; 64]);
    let stream = b.create_stream(0).unwrap();
    b.begin_capture(stream).unwrap();
    b.copy_batch(
        stream,
        &[BufferCopy {
            dst_offset: 32,
            ..BufferCopy::from_start(buf, buf, 32)
        }],
    )
    .unwrap();
    let graph = b.end_capture(stream).unwrap();
    b.replay(graph, stream).unwrap();
    b.synchronize(stream).unwrap();
    b.destroy_graph(graph).unwrap();
    says(&invalid(b.replay(graph, stream)), "released");
    invalid(b.destroy_graph(graph));
}

pub fn a_graph_destroyed_with_replays_queued_still_runs_them(b: &dyn Backend) {
    let data = pattern(1 << 20, 13);
    let src = buffer(b, Memory::Device(0), &data);
    let dst = buffer(b, Memory::Device(0), &vec![FILL; data.len()]);
    let stream = b.create_stream(0).unwrap();
    let graph = captured_copy(b, stream, src, dst, data.len());
    let gate = b.hold(stream).unwrap();
    b.replay(graph, stream).unwrap();
    b.destroy_graph(graph).unwrap();
    b.release(gate).unwrap();
    b.synchronize(stream).unwrap();
    assert!(contents(b, dst) == data);
}

// ---------------------------------------------------------------------------------------------
// Probes

/// A single cycle through `elements` u64 indices, with a stride that defeats simple prefetching.
fn chain(elements: u64) -> (Vec<u64>, Vec<u8>) {
    let next: Vec<u64> = (0..elements).map(|i| (i + 1237) % elements).collect();
    let bytes = next.iter().flat_map(|v| v.to_le_bytes()).collect();
    (next, bytes)
}

pub fn a_pointer_chase_ends_where_a_host_walk_does(b: &dyn Backend) {
    let peer = peer_of_0(b);
    b.enable_peer_access(0, peer).unwrap();
    let (next, bytes) = chain(1 << 12);
    let steps = 10_007;
    let end = (0..steps).fold(0u64, |at, _| next[at as usize]);
    let places = [
        Memory::Device(0),
        Memory::Device(peer),
        Memory::PinnedHost { numa_node: None },
    ];
    for memory in places {
        let on = buffer(b, memory, &bytes);
        let result = buffer(b, Memory::Device(0), &[0xff; 8]);
        let stream = b.create_stream(0).unwrap();
        b.probes().pointer_chase(stream, on, steps, result).unwrap();
        b.synchronize(stream).unwrap();
        let mut reached = [0; 8];
        b.read(result, 0, &mut reached).unwrap();
        assert_eq!(u64::from_le_bytes(reached), end, "{memory:?}");
        b.probes().pointer_chase(stream, on, 0, result).unwrap();
        b.synchronize(stream).unwrap();
        b.read(result, 0, &mut reached).unwrap();
        assert_eq!(u64::from_le_bytes(reached), 0, "no step stays on element 0");
    }
}

pub fn a_pointer_chase_refuses_short_buffers_and_unreachable_chains(b: &dyn Backend) {
    let stream = b.create_stream(0).unwrap();
    let short = buffer(b, Memory::Device(0), &[0; 4]);
    let chain = buffer(b, Memory::Device(0), &[0; 8]);
    let result = buffer(b, Memory::Device(0), &[0; 8]);
    says(
        &usage(b.probes().pointer_chase(stream, short, 1, result)),
        "less than one u64",
    );
    says(
        &usage(b.probes().pointer_chase(stream, chain, 1, short)),
        "pointer-chase result",
    );
    let Some((a, c)) = p2p_pair(b) else {
        return not_here("a chain on a peer", "no two GPUs with P2P");
    };
    let far = buffer(b, Memory::Device(c), &[0; 8]);
    let near = buffer(b, Memory::Device(a), &[0; 8]);
    let on_a = b.create_stream(a).unwrap();
    says(
        &usage(b.probes().pointer_chase(on_a, far, 1, near)),
        &format!("enable_peer_access({a}, {c})"),
    );
}

fn check_ping_pong(b: &dyn Backend, ping_gpu: usize, pong_gpu: usize, rounds: u32) {
    let (ping, pong) = (
        b.create_stream(ping_gpu).unwrap(),
        b.create_stream(pong_gpu).unwrap(),
    );
    let ping_flag = buffer(b, Memory::Device(ping_gpu), &[0; 4]);
    let pong_flag = buffer(b, Memory::Device(pong_gpu), &[0; 4]);
    b.probes()
        .ping_pong(ping, pong, ping_flag, pong_flag, rounds)
        .unwrap();
    b.synchronize(ping).unwrap();
    b.synchronize(pong).unwrap();
    for flag in [ping_flag, pong_flag] {
        assert_eq!(
            contents(b, flag),
            rounds.to_le_bytes(),
            "GPU {ping_gpu} <-> GPU {pong_gpu}"
        );
    }
}

pub fn a_ping_pong_leaves_both_flags_at_the_round_count(b: &dyn Backend) {
    check_ping_pong(b, 0, 0, 100);
    if let Some((a, c)) = p2p_pair(b) {
        b.enable_peer_access(a, c).unwrap();
        b.enable_peer_access(c, a).unwrap();
        check_ping_pong(b, a, c, 100);
    }
}

pub fn a_ping_pong_refuses_one_stream_and_misplaced_flags(b: &dyn Backend) {
    let (ping, pong) = (b.create_stream(0).unwrap(), b.create_stream(0).unwrap());
    let flag = buffer(b, Memory::Device(0), &[0; 4]);
    let other = buffer(b, Memory::Device(0), &[0; 4]);
    let short = buffer(b, Memory::Device(0), &[0; 2]);
    let pinned = buffer(b, Memory::PinnedHost { numa_node: None }, &[0; 4]);
    says(
        &usage(b.probes().ping_pong(ping, ping, flag, other, 1)),
        "two different streams",
    );
    says(
        &usage(b.probes().ping_pong(ping, pong, pinned, other, 1)),
        "must be memory of GPU 0",
    );
    usage(b.probes().ping_pong(ping, pong, flag, short, 1));
    let Some((a, c)) = p2p_pair(b) else {
        return not_here("a ping-pong between GPUs", "no two GPUs with P2P");
    };
    let (on_a, on_c) = (b.create_stream(a).unwrap(), b.create_stream(c).unwrap());
    let (flag_a, flag_c) = (
        buffer(b, Memory::Device(a), &[0; 4]),
        buffer(b, Memory::Device(c), &[0; 4]),
    );
    says(
        &usage(b.probes().ping_pong(on_a, on_c, flag_c, flag_a, 1)),
        &format!("must be memory of GPU {a}"),
    );
    says(
        &usage(b.probes().ping_pong(on_a, on_c, flag_a, flag_c, 1)),
        "peer access",
    );
}

// ---------------------------------------------------------------------------------------------
// Two backends

pub fn handles_from_another_backend_are_refused(mine: &dyn Backend, theirs: &dyn Backend) {
    let buf = buffer(mine, Memory::Device(0), &[0; 64]);
    let stream = mine.create_stream(0).unwrap();
    let event = mine.record(stream).unwrap();
    mine.begin_capture(stream).unwrap();
    mine.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(buf, buf, 0),
    )
    .unwrap();
    mine.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy {
            dst_offset: 32,
            ..BufferCopy::from_start(buf, buf, 32)
        },
    )
    .unwrap();
    let graph = mine.end_capture(stream).unwrap();
    let gate = mine.hold(stream).unwrap();
    says(&invalid(theirs.len(buf)), "another backend");
    invalid(theirs.free(buf));
    says(&invalid(theirs.destroy_stream(stream)), "another backend");
    says(&invalid(theirs.event_done(event)), "another backend");
    says(&invalid(theirs.release(gate)), "another backend");
    says(&invalid(theirs.destroy_graph(graph)), "another backend");
    let their_stream = theirs.create_stream(0).unwrap();
    invalid(theirs.replay(graph, their_stream));
    invalid(theirs.copy(
        their_stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(buf, buf, 0),
    ));
    // All still mine.
    mine.release(gate).unwrap();
    mine.replay(graph, stream).unwrap();
    mine.synchronize(stream).unwrap();
    mine.destroy_graph(graph).unwrap();
    mine.destroy_event(event).unwrap();
    mine.destroy_stream(stream).unwrap();
    mine.free(buf).unwrap();
}
