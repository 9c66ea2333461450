//! Collectives on real GPUs (part of the `gpu` test binary): peerlink's all-reduce kernels on 2 to
//! all GPUs, their flags over many calls and in captured graphs, NCCL's all-reduce and send/recv,
//! and the busy kernel's clock. Every output byte is checked against sums (and averages) made on
//! the host; the inputs are small integers, so every sum is exact in bf16 as in f32, and an average
//! is the host's f32 arithmetic, rounded as the kernels round.

use peerlink::backend::collective::{
    AllReduceKernel, BufferRange, DataType, PeerTransfer, Rank, Reduction, Waiting, FLAG_BYTES,
    MAX_RANKS, PACKET_MAX_BYTES, RELEASE_WORD_BYTES,
};
use peerlink::backend::cuda::CudaBackend;
use peerlink::backend::{Backend, BufferCopy, BufferId, CopyMethod, Memory, Nccl, StreamId};
use peerlink::bench::stats::median;
use peerlink::pattern;

const KERNELS: [AllReduceKernel; 3] = AllReduceKernel::ALL;
const DTYPES: [DataType; 2] = [DataType::F32, DataType::Bf16];

/// What an output holds before a call: bytes past `len` must keep it.
const SENTINEL: u8 = 0xa5;

/// A backend with every pair of its first GPUs (up to [`MAX_RANKS`]) enabled for peer access, and
/// how many GPUs that is; `None`, said on stderr, where there are fewer than two or a pair lacks P2P.
/// NCCL on this host, or `None` after saying why the test is skipped.
fn nccl_or_skip(b: &CudaBackend) -> Option<&dyn Nccl> {
    b.collectives()
        .nccl()
        .map_err(|why| eprintln!("skipped: {why}"))
        .ok()
}

fn several_gpus() -> Option<(CudaBackend, usize)> {
    let b = CudaBackend::open().unwrap_or_else(|e| panic!("this test needs a GPU: {e}"));
    let gpus = b.topology().devices.len().min(MAX_RANKS);
    if gpus < 2 {
        eprintln!("skipped: needs two GPUs, this host has {gpus}");
        return None;
    }
    for a in 0..gpus {
        for c in (0..gpus).filter(|&c| c != a) {
            if let Err(e) = b.enable_peer_access(a, c) {
                eprintln!("skipped: peerlink's all-reduce needs P2P between every two GPUs: {e}");
                return None;
            }
        }
    }
    Some((b, gpus))
}

/// Rank `rank`'s element `index` in `round`: an integer in −32..=31, so that the sum of up to eight
/// ranks (|sum| ≤ 256) is exact in bf16 and f16. Mixed so that an element moved to another place, another
/// rank's element or another round's would differ.
fn value(round: u64, rank: usize, index: usize) -> f32 {
    let mixed = (index as u64 ^ (round << 40)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (rank as u64 + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    ((mixed.wrapping_mul(0x94d0_49bb_1331_11eb) >> 58) as i32 - 32) as f32
}

/// Values as the GPU holds them; bf16 is the upper half of the f32, rounded to nearest, ties to
/// even (exact for the integers and sums).
fn encode(dtype: DataType, values: impl Iterator<Item = f32>) -> Vec<u8> {
    match dtype {
        DataType::F32 => values.flat_map(f32::to_le_bytes).collect(),
        DataType::Bf16 => values
            .flat_map(|v| {
                let bits = v.to_bits();
                (((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16).to_le_bytes()
            })
            .collect(),
        // The library's rounding (the kernels' F16Half::round), checked on every f16 in its tests.
        DataType::F16 => {
            let mut out = Vec::new();
            values.for_each(|v| DataType::F16.push_rounded(v, &mut out));
            out
        }
    }
}

fn input(dtype: DataType, round: u64, rank: usize, elements: usize) -> Vec<u8> {
    encode(dtype, (0..elements).map(|j| value(round, rank, j)))
}

/// What every rank's output must hold after an all-reduce (`op`) of `ranks` ranks' inputs of
/// `round`, as NCCL defines it: the f32 sum, for an average times the f32 1/ranks, rounded once.
fn reduced(dtype: DataType, op: Reduction, round: u64, ranks: usize, elements: usize) -> Vec<u8> {
    let scale = match op {
        Reduction::Sum => 1.0,
        Reduction::Average => 1.0 / ranks as f32,
    };
    encode(
        dtype,
        (0..elements).map(|j| (0..ranks).map(|r| value(round, r, j)).sum::<f32>() * scale),
    )
}

/// Checks a whole buffer: `want` from its start, the sentinel after it.
fn check_output(b: &CudaBackend, buffer: BufferId, want: &[u8], what: &str) {
    let mut got = vec![0; b.len(buffer).unwrap()];
    b.read(buffer, 0, &mut got).unwrap();
    if let Some(at) = (0..want.len()).find(|&i| got[i] != want[i]) {
        panic!(
            "{what}: first wrong byte at {at} of {} (expected {:#04x}, found {:#04x})",
            want.len(),
            want[at],
            got[at]
        );
    }
    if let Some(at) = (want.len()..got.len()).find(|&i| got[i] != SENTINEL) {
        panic!("{what}: wrote byte {at}, past the {} reduced", want.len());
    }
}

/// One stream, input, output and zeroed flag block on each of GPUs 0..count, buffers of
/// `capacity` bytes.
struct Ranks {
    streams: Vec<StreamId>,
    inputs: Vec<BufferId>,
    outputs: Vec<BufferId>,
    flags: Vec<BufferId>,
}

impl Ranks {
    fn new(b: &CudaBackend, count: usize, capacity: usize) -> Ranks {
        let on_each = |bytes: usize| -> Vec<BufferId> {
            (0..count)
                .map(|gpu| b.alloc(Memory::Device(gpu), bytes).unwrap())
                .collect()
        };
        let flags = on_each(FLAG_BYTES);
        for &flag in &flags {
            b.write(flag, 0, &vec![0; FLAG_BYTES]).unwrap();
        }
        Ranks {
            streams: (0..count)
                .map(|gpu| b.create_stream(gpu).unwrap())
                .collect(),
            inputs: on_each(capacity),
            outputs: on_each(capacity),
            flags,
        }
    }

    /// Every rank, reducing into `outputs`.
    fn with_outputs(&self, outputs: &[BufferId]) -> Vec<Rank> {
        (0..self.streams.len())
            .map(|r| Rank {
                stream: self.streams[r],
                input: self.inputs[r],
                output: outputs[r],
            })
            .collect()
    }

    fn ranks(&self) -> Vec<Rank> {
        self.with_outputs(&self.outputs)
    }

    fn write_inputs(&self, b: &CudaBackend, dtype: DataType, round: u64, elements: usize) {
        for (r, &buffer) in self.inputs.iter().enumerate() {
            b.write(buffer, 0, &input(dtype, round, r, elements))
                .unwrap();
        }
    }

    fn fill_outputs(&self, b: &CudaBackend, outputs: &[BufferId]) {
        for &buffer in outputs {
            b.write(buffer, 0, &vec![SENTINEL; b.len(buffer).unwrap()])
                .unwrap();
        }
    }

    fn synchronize(&self, b: &CudaBackend) {
        for &stream in &self.streams {
            b.synchronize(stream)
                .unwrap_or_else(|e| panic!("an all-reduce failed on the GPU: {e}"));
        }
    }
}

/// Element counts `kernel` takes: one element, odd counts, the packet kernel's largest and one
/// less, 1 MiB and some, 64 MiB.
fn element_counts(kernel: AllReduceKernel, dtype: DataType) -> Vec<usize> {
    let size = dtype.size();
    [
        1,
        4 / size,
        7,
        4097,
        PACKET_MAX_BYTES / size - 1,
        PACKET_MAX_BYTES / size,
        (1 << 20) / size + 5,
        (64 << 20) / size,
    ]
    .into_iter()
    .filter(|elements| elements * size <= kernel.max_len())
    .collect()
}

#[test]
#[ignore = "needs a GPU"]
fn all_reduce_kernels_sum_and_average_every_byte_on_2_to_all_gpus() {
    let Some((b, gpus)) = several_gpus() else {
        return;
    };
    // Room past the largest reduction, where the sentinel must survive.
    let capacity = (64 << 20) + 64;
    for count in 2..=gpus {
        let set = Ranks::new(&b, count, capacity);
        let mut round = 0;
        let ops = [Reduction::Sum, Reduction::Average];
        for (kernel, op) in KERNELS.into_iter().flat_map(|k| ops.map(|op| (k, op))) {
            for dtype in [DataType::F32, DataType::Bf16, DataType::F16] {
                for elements in element_counts(kernel, dtype) {
                    round += 1;
                    let len = elements * dtype.size();
                    set.write_inputs(&b, dtype, round, elements);
                    set.fill_outputs(&b, &set.outputs);
                    b.collectives()
                        .all_reduce(
                            kernel,
                            dtype,
                            op,
                            &set.ranks(),
                            &set.flags,
                            Waiting::Bounded,
                            len,
                        )
                        .unwrap();
                    set.synchronize(&b);
                    let want = reduced(dtype, op, round, count, elements);
                    for (r, &output) in set.outputs.iter().enumerate() {
                        let what = format!(
                            "{} ({op}) {dtype} on {count} GPUs, {elements} elements, rank {r}",
                            kernel.name()
                        );
                        check_output(&b, output, &want, &what);
                    }
                    eprintln!(
                        "{} ({op}) {dtype} on {count} GPUs: {elements} elements checked",
                        kernel.name()
                    );
                }
            }
        }
    }
}

/// 200 calls back to back on the same flags, never reset: every kernel, both element types and
/// several lengths (so grids of different sizes) in turn, each rank's input rewritten on its stream
/// before every call, so a rank that ran ahead of a peer's reads or writes would leave wrong sums.
/// Every call has an output of its own, checked at the end.
#[test]
#[ignore = "needs a GPU"]
fn all_reduce_flags_serve_200_calls_without_reset() {
    serve_200_calls_without_reset(&KERNELS);
}

/// The same with the packet kernel alone: no barrier kernel between two calls, so only its
/// parities keep a rank that runs a call ahead from overwriting packets a peer still waits for.
/// Rank 0's stream is held until every call is queued, so the others start ahead of it.
#[test]
#[ignore = "needs a GPU"]
fn packet_all_reduce_serves_200_calls_back_to_back() {
    serve_200_calls_without_reset(&[AllReduceKernel::OneShotPackets]);
}

fn serve_200_calls_without_reset(kernels: &[AllReduceKernel]) {
    let Some((b, count)) = several_gpus() else {
        return;
    };
    let calls = 200;
    let lengths = [1, 3, 4097, 70_001, (1 << 18) + 3];
    let capacity = lengths.iter().max().unwrap() * 4 + 16;
    let rounds: u64 = 3;
    let set = Ranks::new(&b, count, capacity);
    // stages[r][dtype][round]: rank r's input of that round, copied into its input before a call.
    let stages: Vec<Vec<Vec<BufferId>>> = (0..count)
        .map(|r| {
            DTYPES
                .iter()
                .map(|&dtype| {
                    (0..rounds)
                        .map(|round| {
                            let stage = b.alloc(Memory::Device(r), capacity).unwrap();
                            let elements = capacity / dtype.size();
                            b.write(stage, 0, &input(dtype, round, r, elements))
                                .unwrap();
                            stage
                        })
                        .collect()
                })
                .collect()
        })
        .collect();
    let outputs: Vec<Vec<BufferId>> = (0..calls)
        .map(|_| {
            (0..count)
                .map(|r| b.alloc(Memory::Device(r), capacity).unwrap())
                .collect()
        })
        .collect();
    for call_outputs in &outputs {
        set.fill_outputs(&b, call_outputs);
    }
    let plan = |call: usize| {
        let dtype = DTYPES[call / 2 % 2];
        let kernel = kernels[call % kernels.len()];
        let elements = lengths[call % lengths.len()].min(kernel.max_len() / dtype.size());
        (kernel, dtype, call as u64 % rounds, elements)
    };
    let gate = b.hold(set.streams[0]).unwrap();
    for (call, call_outputs) in outputs.iter().enumerate() {
        let (kernel, dtype, round, elements) = plan(call);
        let len = elements * dtype.size();
        let kind = DTYPES.iter().position(|&d| d == dtype).unwrap();
        for (r, rank_stages) in stages.iter().enumerate() {
            let copy =
                BufferCopy::from_start(rank_stages[kind][round as usize], set.inputs[r], len);
            b.copy(set.streams[r], CopyMethod::CopyEngine, &copy)
                .unwrap();
        }
        b.collectives()
            .all_reduce(
                kernel,
                dtype,
                Reduction::Sum,
                &set.with_outputs(call_outputs),
                &set.flags,
                Waiting::Bounded,
                len,
            )
            .unwrap();
    }
    b.release(gate).unwrap();
    set.synchronize(&b);
    for (call, call_outputs) in outputs.iter().enumerate() {
        let (kernel, dtype, round, elements) = plan(call);
        let want = reduced(dtype, Reduction::Sum, round, count, elements);
        for (r, &output) in call_outputs.iter().enumerate() {
            let what = format!(
                "call {call} ({} {dtype}, {elements} elements) on {count} GPUs, rank {r}",
                kernel.name()
            );
            check_output(&b, output, &want, &what);
        }
    }
    eprintln!(
        "{calls} all-reduce calls ({}) on {count} GPUs on one set of flags: every byte right",
        kernels
            .iter()
            .map(|k| k.name())
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// Each rank's stream captures the same three calls (one-shot into one output, two-shot into
/// another, the packet kernel into a third, over as much of the input as it takes); the graphs are
/// replayed together several times, with new inputs each time, then a direct call follows on the
/// same flags.
#[test]
#[ignore = "needs a GPU"]
fn all_reduce_replays_from_captured_graphs() {
    let Some((b, count)) = several_gpus() else {
        return;
    };
    let dtype = DataType::F32;
    let elements = 100_003;
    let len = elements * dtype.size();
    let set = Ranks::new(&b, count, len + 16);
    let extra_outputs = || -> Vec<BufferId> {
        (0..count)
            .map(|r| b.alloc(Memory::Device(r), len + 16).unwrap())
            .collect()
    };
    let (second, third) = (extra_outputs(), extra_outputs());
    let packet_elements = PACKET_MAX_BYTES / dtype.size() - 1;
    for &stream in &set.streams {
        b.begin_capture(stream).unwrap();
    }
    let c = b.collectives();
    c.all_reduce(
        AllReduceKernel::OneShot,
        dtype,
        Reduction::Sum,
        &set.ranks(),
        &set.flags,
        Waiting::Bounded,
        len,
    )
    .unwrap();
    c.all_reduce(
        AllReduceKernel::TwoShot,
        dtype,
        Reduction::Sum,
        &set.with_outputs(&second),
        &set.flags,
        Waiting::Bounded,
        len,
    )
    .unwrap();
    c.all_reduce(
        AllReduceKernel::OneShotPackets,
        dtype,
        Reduction::Sum,
        &set.with_outputs(&third),
        &set.flags,
        Waiting::Bounded,
        packet_elements * dtype.size(),
    )
    .unwrap();
    let graphs: Vec<_> = set
        .streams
        .iter()
        .map(|&stream| b.end_capture(stream).unwrap())
        .collect();
    for round in 1..=5 {
        set.write_inputs(&b, dtype, round, elements);
        set.fill_outputs(&b, &set.outputs);
        set.fill_outputs(&b, &second);
        set.fill_outputs(&b, &third);
        for (&graph, &stream) in graphs.iter().zip(&set.streams) {
            b.replay(graph, stream).unwrap();
        }
        set.synchronize(&b);
        let want = reduced(dtype, Reduction::Sum, round, count, elements);
        for (r, (&one_shot, &two_shot)) in set.outputs.iter().zip(&second).enumerate() {
            let what = format!("replay {round} on {count} GPUs, rank {r}");
            check_output(&b, one_shot, &want, &format!("{what}, one-shot"));
            check_output(&b, two_shot, &want, &format!("{what}, two-shot"));
            let packets = &want[..packet_elements * dtype.size()];
            check_output(&b, third[r], packets, &format!("{what}, one-shot-packets"));
        }
    }
    for (round, kernel) in (99..).zip(KERNELS) {
        let elements = elements.min(kernel.max_len() / dtype.size());
        set.write_inputs(&b, dtype, round, elements);
        set.fill_outputs(&b, &set.outputs);
        let len = elements * dtype.size();
        c.all_reduce(
            kernel,
            dtype,
            Reduction::Sum,
            &set.ranks(),
            &set.flags,
            Waiting::Bounded,
            len,
        )
        .unwrap();
        set.synchronize(&b);
        let want = reduced(dtype, Reduction::Sum, round, count, elements);
        for (r, &output) in set.outputs.iter().enumerate() {
            let what = format!("direct {} call after replays, rank {r}", kernel.name());
            check_output(&b, output, &want, &what);
        }
    }
    for graph in graphs {
        b.destroy_graph(graph).unwrap();
    }
}

#[test]
#[ignore = "needs a GPU"]
fn nccl_all_reduce_sums_every_byte() {
    let Some((b, gpus)) = several_gpus() else {
        return;
    };
    let Some(nccl) = nccl_or_skip(&b) else {
        return;
    };
    eprintln!("{}", nccl.describe());
    for count in 2..=gpus {
        let devices: Vec<usize> = (0..count).collect();
        let comm = nccl.communicator(&devices).unwrap();
        let set = Ranks::new(&b, count, (1 << 20) + 64);
        let mut round = 100;
        for dtype in DTYPES {
            for elements in [1, 7, 4097, (1 << 20) / dtype.size() - 3] {
                round += 1;
                let len = elements * dtype.size();
                set.write_inputs(&b, dtype, round, elements);
                set.fill_outputs(&b, &set.outputs);
                nccl.all_reduce(comm, dtype, &set.ranks(), len).unwrap();
                set.synchronize(&b);
                let want = reduced(dtype, Reduction::Sum, round, count, elements);
                for (r, &output) in set.outputs.iter().enumerate() {
                    let what = format!(
                        "ncclAllReduce {dtype} on {count} GPUs, {elements} elements, rank {r}"
                    );
                    check_output(&b, output, &want, &what);
                }
            }
        }
        // In place: each input is its own output.
        let elements = 4099;
        set.write_inputs(&b, DataType::F32, 7, elements);
        nccl.all_reduce(
            comm,
            DataType::F32,
            &set.with_outputs(&set.inputs),
            elements * 4,
        )
        .unwrap();
        set.synchronize(&b);
        let want = reduced(DataType::F32, Reduction::Sum, 7, count, elements);
        for (r, &buffer) in set.inputs.iter().enumerate() {
            let mut got = vec![0; want.len()];
            b.read(buffer, 0, &mut got).unwrap();
            assert!(
                got == want,
                "in-place ncclAllReduce on {count} GPUs, rank {r}"
            );
        }
        nccl.destroy_communicator(comm).unwrap();
    }
}

/// Every rank sends to the next and to the previous rank at once (on two GPUs: both ways at once),
/// from and to offsets inside its buffers, in one group.
#[test]
#[ignore = "needs a GPU"]
fn nccl_send_recv_moves_every_byte_both_ways_at_once() {
    let Some((b, count)) = several_gpus() else {
        return;
    };
    let Some(nccl) = nccl_or_skip(&b) else {
        return;
    };
    let devices: Vec<usize> = (0..count).collect();
    let comm = nccl.communicator(&devices).unwrap();
    let streams: Vec<StreamId> = devices
        .iter()
        .map(|&d| b.create_stream(d).unwrap())
        .collect();
    for len in [1, 4099, (8 << 20) + 3] {
        let size = 2 * len + 16;
        let sources: Vec<BufferId> = devices
            .iter()
            .map(|&d| b.alloc(Memory::Device(d), size).unwrap())
            .collect();
        let targets: Vec<BufferId> = devices
            .iter()
            .map(|&d| b.alloc(Memory::Device(d), size).unwrap())
            .collect();
        let data: Vec<Vec<u8>> = (0..count)
            .map(|r| pattern::bytes(r as u64 + 40, size))
            .collect();
        for r in 0..count {
            b.write(sources[r], 0, &data[r]).unwrap();
            b.write(targets[r], 0, &vec![SENTINEL; size]).unwrap();
        }
        let range = |buffer, offset| BufferRange {
            buffer,
            offset,
            len,
        };
        // To the next rank: source bytes 1.., landing at 3..; to the previous: len + 5.., landing
        // at len + 7...
        let transfers: Vec<PeerTransfer> = (0..count)
            .flat_map(|r| {
                let (next, previous) = ((r + 1) % count, (r + count - 1) % count);
                [
                    PeerTransfer {
                        from: r,
                        to: next,
                        src: range(sources[r], 1),
                        dst: range(targets[next], 3),
                    },
                    PeerTransfer {
                        from: r,
                        to: previous,
                        src: range(sources[r], len + 5),
                        dst: range(targets[previous], len + 7),
                    },
                ]
            })
            .collect();
        nccl.send_recv(comm, &streams, &transfers).unwrap();
        for &stream in &streams {
            b.synchronize(stream).unwrap();
        }
        for (r, &target) in targets.iter().enumerate() {
            let (next, previous) = ((r + 1) % count, (r + count - 1) % count);
            let mut want = vec![SENTINEL; size];
            want[3..3 + len].copy_from_slice(&data[previous][1..1 + len]);
            want[len + 7..2 * len + 7].copy_from_slice(&data[next][len + 5..2 * len + 5]);
            let mut got = vec![0; size];
            b.read(target, 0, &mut got).unwrap();
            if let Some(at) = (0..size).find(|&i| got[i] != want[i]) {
                panic!(
                    "ncclSend/ncclRecv of {len} B on {count} GPUs: rank {r}'s byte {at} is wrong"
                );
            }
        }
        for buffer in sources.into_iter().chain(targets) {
            b.free(buffer).unwrap();
        }
    }
    nccl.destroy_communicator(comm).unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn busy_kernel_runs_for_the_time_asked() {
    let b = CudaBackend::open().unwrap_or_else(|e| panic!("this test needs a GPU: {e}"));
    let stream = b.create_stream(0).unwrap();
    let asked = 100.0;
    b.collectives().busy(stream, 0.0).unwrap(); // loads the kernel
    let mut times = Vec::new();
    for _ in 0..21 {
        let start = b.record(stream).unwrap();
        b.collectives().busy(stream, asked).unwrap();
        let end = b.record(stream).unwrap();
        b.synchronize(stream).unwrap();
        times.push(b.elapsed_us(start, end).unwrap());
        b.destroy_event(start).unwrap();
        b.destroy_event(end).unwrap();
    }
    let took = median(&times).unwrap();
    eprintln!("busy for {asked} µs took {took:.1} µs of GPU time (median of 21)");
    assert!(
        (took - asked).abs() <= asked * 0.1,
        "busy for {asked} µs took {took:.1} µs"
    );
}

/// NCCL with symmetric windows on this host, or `None` after saying why the test is skipped. An
/// NCCL of 2.27 or newer must have them (its version is the second word of `describe`).
fn symmetric_or_skip(nccl: &dyn Nccl) -> Option<()> {
    let description = nccl.describe();
    eprintln!("{description}");
    match nccl.symmetric_windows() {
        Ok(()) => Some(()),
        Err(why) => {
            let version: Vec<u32> = description
                .split_whitespace()
                .nth(1)
                .unwrap_or("")
                .split('.')
                .filter_map(|part| part.parse().ok())
                .collect();
            let turned_off = why.contains("in the environment");
            assert!(
                turned_off || version.as_slice() < [2, 27].as_slice(),
                "{description} should have symmetric windows: {why}"
            );
            eprintln!("skipped: {why}");
            None
        }
    }
}

/// One window buffer (ncclMemAlloc) of `bytes` on each of GPUs 0..count.
fn window_memory(nccl: &dyn Nccl, count: usize, bytes: usize) -> Vec<BufferId> {
    (0..count)
        .map(|gpu| nccl.alloc_window_memory(gpu, bytes).unwrap())
        .collect()
}

/// Every rank's all-reduce over `inputs` into `outputs` on `streams`.
fn window_ranks(streams: &[StreamId], inputs: &[BufferId], outputs: &[BufferId]) -> Vec<Rank> {
    (0..streams.len())
        .map(|r| Rank {
            stream: streams[r],
            input: inputs[r],
            output: outputs[r],
        })
        .collect()
}

/// What the lead runs on one GPU: NCCL's window functions load, a one-rank communicator registers
/// two windows (collectively, in one group) and reduces through them — out of place, in place and
/// replayed from a captured graph — and the checked layer refuses what NCCL's symmetric kernels
/// cannot take. One rank says nothing of speed between GPUs: the two-GPU test below does the sums.
#[test]
#[ignore = "needs a GPU"]
fn nccl_symmetric_windows_register_and_reduce_on_one_gpu() {
    let b = CudaBackend::open().unwrap_or_else(|e| panic!("this test needs a GPU: {e}"));
    let Some(nccl) = nccl_or_skip(&b) else {
        return;
    };
    if symmetric_or_skip(nccl).is_none() {
        return;
    }
    let comm = nccl.communicator(&[0]).unwrap();
    let capacity = (1 << 20) + 64;
    let (inputs, outputs) = (
        window_memory(nccl, 1, capacity),
        window_memory(nccl, 1, capacity),
    );
    let plain = b.alloc(Memory::Device(0), capacity).unwrap();
    let refused = nccl.register_window(comm, &[plain]).unwrap_err();
    assert!(refused.to_string().contains("ncclMemAlloc"), "{refused}");
    let in_window = nccl.register_window(comm, &inputs).unwrap();
    let out_window = nccl.register_window(comm, &outputs).unwrap();
    let again = nccl.register_window(comm, &inputs).unwrap_err();
    assert!(again.to_string().contains("in a window already"), "{again}");
    let stream = b.create_stream(0).unwrap();
    let streams = [stream];
    let not_in_window = window_ranks(&streams, &[plain], &outputs);
    let refused = nccl
        .window_all_reduce(comm, DataType::F32, &not_in_window, 4)
        .unwrap_err();
    assert!(refused.to_string().contains("window"), "{refused}");
    for (round, dtype) in DTYPES.into_iter().enumerate() {
        let elements = (1 << 20) / dtype.size() - 3;
        let want = reduced(dtype, Reduction::Sum, round as u64, 1, elements);
        b.write(inputs[0], 0, &input(dtype, round as u64, 0, elements))
            .unwrap();
        b.write(outputs[0], 0, &vec![SENTINEL; capacity]).unwrap();
        let ranks = window_ranks(&streams, &inputs, &outputs);
        nccl.window_all_reduce(comm, dtype, &ranks, want.len())
            .unwrap();
        b.synchronize(stream).unwrap();
        check_output(
            &b,
            outputs[0],
            &want,
            &format!("{dtype} in windows, 1 rank"),
        );
    }
    // In place, and replayed from a graph into a poisoned output.
    let elements = 4099;
    let want = reduced(DataType::F32, Reduction::Sum, 9, 1, elements);
    b.write(inputs[0], 0, &input(DataType::F32, 9, 0, elements))
        .unwrap();
    let in_place = window_ranks(&streams, &inputs, &inputs);
    nccl.window_all_reduce(comm, DataType::F32, &in_place, want.len())
        .unwrap();
    b.synchronize(stream).unwrap();
    let mut got = vec![0; want.len()];
    b.read(inputs[0], 0, &mut got).unwrap();
    assert!(got == want, "in-place all-reduce in a window, 1 rank");
    b.begin_capture(stream).unwrap();
    let ranks = window_ranks(&streams, &inputs, &outputs);
    nccl.window_all_reduce(comm, DataType::F32, &ranks, want.len())
        .unwrap();
    let graph = b.end_capture(stream).unwrap();
    b.write(outputs[0], 0, &vec![SENTINEL; capacity]).unwrap();
    b.replay(graph, stream).unwrap();
    b.synchronize(stream).unwrap();
    check_output(
        &b,
        outputs[0],
        &want,
        "all-reduce in windows replayed, 1 rank",
    );
    b.destroy_graph(graph).unwrap();
    let busy = nccl.destroy_communicator(comm).unwrap_err();
    assert!(busy.to_string().contains("windows"), "{busy}");
    nccl.deregister_window(in_window).unwrap();
    nccl.deregister_window(out_window).unwrap();
    nccl.destroy_communicator(comm).unwrap();
    for buffer in inputs.into_iter().chain(outputs).chain([plain]) {
        b.free(buffer).unwrap();
    }
}

/// NCCL with symmetric windows on 2 to all GPUs (every rank's buffers registered in one group):
/// every byte of every rank's output is the host's sum, out of place and in place, on streams and
/// replayed from graphs.
#[test]
#[ignore = "needs a GPU"]
fn nccl_symmetric_window_all_reduce_sums_every_byte() {
    let Some((b, gpus)) = several_gpus() else {
        return;
    };
    let Some(nccl) = nccl_or_skip(&b) else {
        return;
    };
    if symmetric_or_skip(nccl).is_none() {
        return;
    }
    for count in 2..=gpus {
        let devices: Vec<usize> = (0..count).collect();
        let comm = nccl.communicator(&devices).unwrap();
        let capacity = (1 << 20) + 64;
        let (inputs, outputs) = (
            window_memory(nccl, count, capacity),
            window_memory(nccl, count, capacity),
        );
        let windows = [
            nccl.register_window(comm, &inputs).unwrap(),
            nccl.register_window(comm, &outputs).unwrap(),
        ];
        let streams: Vec<StreamId> = devices
            .iter()
            .map(|&gpu| b.create_stream(gpu).unwrap())
            .collect();
        let write_inputs = |dtype: DataType, round: u64, elements: usize| {
            for (r, &buffer) in inputs.iter().enumerate() {
                b.write(buffer, 0, &input(dtype, round, r, elements))
                    .unwrap();
            }
        };
        let poison = |buffers: &[BufferId]| {
            for &buffer in buffers {
                b.write(buffer, 0, &vec![SENTINEL; capacity]).unwrap();
            }
        };
        let wait = || {
            for &stream in &streams {
                b.synchronize(stream)
                    .unwrap_or_else(|e| panic!("an all-reduce in windows failed: {e}"));
            }
        };
        let mut round = 200;
        for dtype in DTYPES {
            for elements in [1, 7, 4097, (1 << 20) / dtype.size() - 3] {
                round += 1;
                let want = reduced(dtype, Reduction::Sum, round, count, elements);
                write_inputs(dtype, round, elements);
                poison(&outputs);
                let ranks = window_ranks(&streams, &inputs, &outputs);
                nccl.window_all_reduce(comm, dtype, &ranks, want.len())
                    .unwrap();
                wait();
                for (r, &output) in outputs.iter().enumerate() {
                    let what = format!(
                        "ncclAllReduce in windows, {dtype} on {count} GPUs, {elements} \
                         elements, rank {r}"
                    );
                    check_output(&b, output, &want, &what);
                }
            }
        }
        // Captured once on every rank's stream, replayed three times into poisoned outputs.
        let elements = 65_537;
        let want = reduced(DataType::Bf16, Reduction::Sum, 7, count, elements);
        write_inputs(DataType::Bf16, 7, elements);
        for &stream in &streams {
            b.begin_capture(stream).unwrap();
        }
        let ranks = window_ranks(&streams, &inputs, &outputs);
        nccl.window_all_reduce(comm, DataType::Bf16, &ranks, want.len())
            .unwrap();
        let graphs: Vec<_> = streams
            .iter()
            .map(|&stream| b.end_capture(stream).unwrap())
            .collect();
        for replay in 0..3 {
            poison(&outputs);
            for (&graph, &stream) in graphs.iter().zip(&streams) {
                b.replay(graph, stream).unwrap();
            }
            wait();
            for (r, &output) in outputs.iter().enumerate() {
                let what = format!("replay {replay} in windows on {count} GPUs, rank {r}");
                check_output(&b, output, &want, &what);
            }
        }
        // In place: each rank's input window is its output too.
        write_inputs(DataType::F32, 8, 4099);
        let in_place = window_ranks(&streams, &inputs, &inputs);
        nccl.window_all_reduce(comm, DataType::F32, &in_place, 4099 * 4)
            .unwrap();
        wait();
        let want = reduced(DataType::F32, Reduction::Sum, 8, count, 4099);
        for (r, &buffer) in inputs.iter().enumerate() {
            let mut got = vec![0; want.len()];
            b.read(buffer, 0, &mut got).unwrap();
            assert!(got == want, "in place in windows on {count} GPUs, rank {r}");
        }
        for graph in graphs {
            b.destroy_graph(graph).unwrap();
        }
        for window in windows {
            nccl.deregister_window(window).unwrap();
        }
        nccl.destroy_communicator(comm).unwrap();
        for buffer in inputs.iter().chain(&outputs) {
            b.free(*buffer).unwrap();
        }
        for stream in streams {
            b.destroy_stream(stream).unwrap();
        }
    }
}

/// A wait with a release word ends when the host raises it: rank 1's stream is busy for 12 s (past
/// a bounded wait's 10 s), rank 0's kernel waits for it until the host raises the word after 1 s,
/// then ends without a trap; rank 1's kernel, when it runs, ends at once; the context is healthy
/// afterwards (an all-reduce on the same GPUs sums again, on fresh flags).
#[test]
#[ignore = "needs a GPU"]
fn a_released_wait_ends_when_the_host_raises_its_word_and_leaves_the_gpus_healthy() {
    let Some((b, _)) = several_gpus() else {
        return;
    };
    let elements = 1001;
    let len = elements * DataType::F32.size();
    let word = b
        .alloc(Memory::PinnedHost { numa_node: None }, RELEASE_WORD_BYTES)
        .unwrap();
    b.write(word, 0, &[0; RELEASE_WORD_BYTES]).unwrap();
    let set = Ranks::new(&b, 2, len);
    set.write_inputs(&b, DataType::F32, 1, elements);
    b.collectives().busy(set.streams[1], 12e6).unwrap();
    let started = std::time::Instant::now();
    b.collectives()
        .all_reduce(
            AllReduceKernel::OneShot,
            DataType::F32,
            Reduction::Sum,
            &set.ranks(),
            &set.flags,
            Waiting::Released(word),
            len,
        )
        .unwrap();
    std::thread::sleep(std::time::Duration::from_secs(1));
    b.write(word, 0, &1u32.to_le_bytes()).unwrap();
    b.synchronize(set.streams[0])
        .unwrap_or_else(|e| panic!("rank 0's released kernel failed: {e}"));
    let released_after = started.elapsed();
    eprintln!("rank 0's wait ended {released_after:?} after its launch (released at 1 s)");
    assert!(
        released_after < std::time::Duration::from_secs(5),
        "{released_after:?}"
    );
    set.synchronize(&b);
    let fresh = Ranks::new(&b, 2, len);
    fresh.write_inputs(&b, DataType::F32, 2, elements);
    b.collectives()
        .all_reduce(
            AllReduceKernel::OneShot,
            DataType::F32,
            Reduction::Sum,
            &fresh.ranks(),
            &fresh.flags,
            Waiting::Bounded,
            len,
        )
        .unwrap();
    fresh.synchronize(&b);
    let want = reduced(DataType::F32, Reduction::Sum, 2, 2, elements);
    for (r, &output) in fresh.outputs.iter().enumerate() {
        check_output(&b, output, &want, &format!("rank {r} after a release"));
    }
}
