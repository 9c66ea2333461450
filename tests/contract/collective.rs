//! The contract of work over several GPUs: peerlink's all-reduce kernels, the stand-in compute
//! kernel, and NCCL where the host has it. Every sum and average is checked byte for byte against
//! the host's; the inputs are small integers, so every order of additions gives the same bytes in
//! f32 and bf16, and an average's one rounding is the host's too.

use super::{gpus, not_here, says, usage, FILL};
use peerlink::backend::collective::{
    AllReduceKernel, BufferRange, CommRank, DataType, Nccl, PeerOp, PeerTransfer, Rank,
    RankBuffers, Reduction, UniqueId, Waiting, FLAG_BYTES, MAX_RANKS, PACKET_MAX_BYTES,
    PEER_TIMEOUT_NS, RELEASE_WORD_BYTES,
};
use peerlink::backend::{Backend, BufferId, Memory, StreamId};
use peerlink::Error;

const KERNELS: [AllReduceKernel; 3] = AllReduceKernel::ALL;
const DTYPES: [DataType; 3] = [DataType::F32, DataType::Bf16, DataType::F16];

/// Element `e` of rank `r`'s input: an integer in −16..=16, so sums of up to 8 are exact in bf16
/// and f16.
fn value(r: usize, e: usize) -> f32 {
    ((e * 7 + r * 13) % 33) as f32 - 16.0
}

/// Little-endian elements, each value rounded to `dtype` (to nearest, ties to even).
fn encode(dtype: DataType, values: impl Iterator<Item = f32>) -> Vec<u8> {
    match dtype {
        DataType::F32 => values.flat_map(f32::to_le_bytes).collect(),
        DataType::Bf16 => values.flat_map(|v| bf16_bits(v).to_le_bytes()).collect(),
        // The library's rounding, checked against every f16 in its own tests.
        DataType::F16 => {
            let mut out = Vec::new();
            values.for_each(|v| DataType::F16.push_rounded(v, &mut out));
            out
        }
    }
}

/// The bf16 nearest `v` (not a NaN), ties to even: an f32's upper half, rounded.
fn bf16_bits(v: f32) -> u16 {
    let bits = v.to_bits();
    ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// GPU 0 and every later GPU with P2P to all those already taken, at most [`MAX_RANKS`].
fn p2p_clique(b: &dyn Backend) -> Vec<usize> {
    let mut taken = vec![0];
    for d in 1..gpus(b) {
        let linked = |&t: &usize| b.topology().pair(t, d).is_some_and(|p| p.p2p);
        if taken.len() < MAX_RANKS && taken.iter().all(linked) {
            taken.push(d);
        }
    }
    taken
}

fn enable_peer_access(b: &dyn Backend, devices: &[usize]) {
    for &a in devices {
        for &c in devices {
            b.enable_peer_access(a, c).unwrap();
        }
    }
}

/// One stream, input, output and flag block per rank; inputs hold [`value`]s, outputs [`FILL`].
struct Ranks {
    devices: Vec<usize>,
    streams: Vec<StreamId>,
    inputs: Vec<BufferId>,
    outputs: Vec<BufferId>,
    flags: Vec<BufferId>,
    dtype: DataType,
    len: usize,
}

impl Ranks {
    fn new(b: &dyn Backend, devices: &[usize], dtype: DataType, elements: usize) -> Ranks {
        let len = elements * dtype.size();
        let filled = |d: usize, bytes: &[u8]| {
            let id = b.alloc(Memory::Device(d), bytes.len()).unwrap();
            b.write(id, 0, bytes).unwrap();
            id
        };
        let inputs = devices
            .iter()
            .enumerate()
            .map(|(r, &d)| filled(d, &encode(dtype, (0..elements).map(|e| value(r, e)))))
            .collect();
        Ranks {
            devices: devices.to_vec(),
            streams: devices
                .iter()
                .map(|&d| b.create_stream(d).unwrap())
                .collect(),
            inputs,
            outputs: devices
                .iter()
                .map(|&d| filled(d, &vec![FILL; len]))
                .collect(),
            // Zeroed once after allocation, as the kernels expect.
            flags: devices
                .iter()
                .map(|&d| filled(d, &vec![0; FLAG_BYTES]))
                .collect(),
            dtype,
            len,
        }
    }

    fn ranks(&self) -> Vec<Rank> {
        (0..self.devices.len())
            .map(|r| Rank {
                stream: self.streams[r],
                input: self.inputs[r],
                output: self.outputs[r],
            })
            .collect()
    }

    fn all_reduce(
        &self,
        b: &dyn Backend,
        kernel: AllReduceKernel,
        op: Reduction,
    ) -> peerlink::Result<()> {
        let ranks = self.ranks();
        b.collectives().all_reduce(
            kernel,
            self.dtype,
            op,
            &ranks,
            &self.flags,
            Waiting::Bounded,
            self.len,
        )
    }

    fn synchronize(&self, b: &dyn Backend) {
        for &s in &self.streams {
            b.synchronize(s).unwrap();
        }
    }

    /// The element-wise `op` of the inputs as written, computed on the host as NCCL defines it:
    /// the sum in f32, for an average times the f32 1/ranks, then one rounding to the element type.
    fn want(&self, op: Reduction) -> Vec<u8> {
        let elements = self.len / self.dtype.size();
        let n = self.devices.len();
        let scale = match op {
            Reduction::Sum => 1.0,
            Reduction::Average => 1.0 / n as f32,
        };
        encode(
            self.dtype,
            (0..elements).map(|e| (0..n).map(|r| value(r, e)).sum::<f32>() * scale),
        )
    }

    /// Fails naming the first wrong byte of any of `buffers` (one per rank) against `want`.
    #[track_caller]
    fn check(&self, b: &dyn Backend, what: &str, buffers: &[BufferId], want: &[u8]) {
        for (r, &buffer) in buffers.iter().enumerate() {
            let got = super::contents(b, buffer);
            if let Some(at) = (0..want.len()).find(|&i| got[i] != want[i]) {
                panic!(
                    "{what}, {} over GPUs {:?}, {} bytes: rank {r} (GPU {}) differs first at byte \
                     {at} (want {:#04x}, got {:#04x})",
                    self.dtype, self.devices, self.len, self.devices[r], want[at], got[at]
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// peerlink's all-reduce

pub fn all_reduce_sums_every_input_into_every_output(b: &dyn Backend) {
    every_output_holds(b, Reduction::Sum);
}

pub fn all_reduce_averages_every_input_into_every_output(b: &dyn Backend) {
    every_output_holds(b, Reduction::Average);
}

/// Every kernel and element type, over 2 ranks, 3 (an average's 1/3 is inexact) and every rank of
/// the clique: every element of every output is `op` of the inputs, as the host computes it.
fn every_output_holds(b: &dyn Backend, op: Reduction) {
    let clique = p2p_clique(b);
    if clique.len() < 2 {
        return not_here("an all-reduce", "no two GPUs with P2P");
    }
    enable_peer_access(b, &clique);
    let mut counts = vec![2, 3.min(clique.len()), clique.len()];
    counts.dedup();
    for devices in counts.into_iter().map(|n| &clique[..n]) {
        for dtype in DTYPES {
            for kernel in KERNELS {
                // One element; a size that splits unevenly into slices; a larger one (for the
                // packet kernel, the largest it takes).
                let larger = ((1 << 20) / dtype.size() + 3).min(kernel.max_len() / dtype.size());
                for elements in [1, 1001, larger] {
                    let r = Ranks::new(b, devices, dtype, elements);
                    r.all_reduce(b, kernel, op).unwrap();
                    r.synchronize(b);
                    let what = format!("{} all-reduce ({op})", kernel.name());
                    r.check(b, &what, &r.outputs, &r.want(op));
                    let first = encode(dtype, (0..elements).map(|e| value(0, e)));
                    r.check(b, "the inputs stay", &r.inputs[..1], &first);
                }
            }
        }
    }
}

/// A rank later than a bounded wait's limit ([`PEER_TIMEOUT_NS`]: its stream busy for a second
/// longer) is waited for where the kernels have a release word, and the sum is whole; a release
/// word that is not pinned host memory is refused. (On a GPU this takes 11 s.)
pub fn a_rank_later_than_a_bounded_wait_is_waited_for_with_a_release_word(b: &dyn Backend) {
    let clique = p2p_clique(b);
    if clique.len() < 2 {
        return not_here("a late rank's all-reduce", "no two GPUs with P2P");
    }
    enable_peer_access(b, &clique[..2]);
    let r = Ranks::new(b, &clique[..2], DataType::F32, 1001);
    let device_word = b.alloc(Memory::Device(clique[0]), 4).unwrap();
    let refused = usage(b.collectives().all_reduce(
        AllReduceKernel::OneShot,
        DataType::F32,
        Reduction::Sum,
        &r.ranks(),
        &r.flags,
        Waiting::Released(device_word),
        r.len,
    ));
    says(&refused, "pinned host memory");
    let word = b
        .alloc(Memory::PinnedHost { numa_node: None }, RELEASE_WORD_BYTES)
        .unwrap();
    b.write(word, 0, &[0; RELEASE_WORD_BYTES]).unwrap();
    let late_us = PEER_TIMEOUT_NS as f64 / 1e3 + 1e6;
    b.collectives().busy(r.streams[1], late_us).unwrap();
    let start = b.record(r.streams[0]).unwrap();
    for kernel in [AllReduceKernel::OneShot, AllReduceKernel::OneShotPackets] {
        b.collectives()
            .all_reduce(
                kernel,
                DataType::F32,
                Reduction::Sum,
                &r.ranks(),
                &r.flags,
                Waiting::Released(word),
                r.len,
            )
            .unwrap();
    }
    let end = b.record(r.streams[0]).unwrap();
    r.synchronize(b);
    r.check(
        b,
        "a late rank's all-reduce",
        &r.outputs,
        &r.want(Reduction::Sum),
    );
    let waited = b.elapsed_us(start, end).unwrap();
    assert!(
        waited >= late_us,
        "rank 0 waited {waited} µs for a rank {late_us} µs late"
    );
}

/// The ranks of `r` with each output its own input.
fn in_place(r: &Ranks) -> Vec<Rank> {
    r.ranks()
        .into_iter()
        .map(|rank| Rank {
            output: rank.input,
            ..rank
        })
        .collect()
}

/// Two-shot and packets reduce in place (each rank's output is its input, the same handle), as the
/// Python package's `all_reduce_` runs them on the caller's tensors; one-shot is refused so.
pub fn two_shot_and_packet_all_reduces_sum_in_place(b: &dyn Backend) {
    let clique = p2p_clique(b);
    if clique.len() < 2 {
        return not_here("an in-place all-reduce", "no two GPUs with P2P");
    }
    enable_peer_access(b, &clique);
    for dtype in DTYPES {
        for kernel in [AllReduceKernel::TwoShot, AllReduceKernel::OneShotPackets] {
            let larger = ((1 << 20) / dtype.size() + 3).min(kernel.max_len() / dtype.size());
            for elements in [1, 1001, larger] {
                let r = Ranks::new(b, &clique, dtype, elements);
                b.collectives()
                    .all_reduce(
                        kernel,
                        dtype,
                        Reduction::Sum,
                        &in_place(&r),
                        &r.flags,
                        Waiting::Bounded,
                        r.len,
                    )
                    .unwrap();
                r.synchronize(b);
                let what = format!("{} all-reduce in place", kernel.name());
                r.check(b, &what, &r.inputs, &r.want(Reduction::Sum));
            }
        }
    }
    let r = Ranks::new(b, &clique[..2], DataType::F32, 16);
    let refused = b.collectives().all_reduce(
        AllReduceKernel::OneShot,
        DataType::F32,
        Reduction::Sum,
        &in_place(&r),
        &r.flags,
        Waiting::Bounded,
        r.len,
    );
    says(
        &usage(refused),
        "use two-shot or packets, which reduce in place",
    );
}

pub fn fifty_all_reduces_in_a_row_on_the_same_flags_each_sum_their_own_inputs(b: &dyn Backend) {
    let clique = p2p_clique(b);
    if clique.len() < 2 {
        return not_here("all-reduces in a row", "no two GPUs with P2P");
    }
    enable_peer_access(b, &clique[..2]);
    // Each call sums the last one's outputs into the other buffers: a call that ran ahead of its
    // partners, or read a peer's buffer before the peer's last call was done, shows. The kernels
    // take turns on one flag block, then the packet kernel runs alone (its parities alternate).
    let turns = |call: usize| KERNELS[call % KERNELS.len()];
    let packets = |_| AllReduceKernel::OneShotPackets;
    let orders: [&dyn Fn(usize) -> AllReduceKernel; 2] = [&turns, &packets];
    for (dtype, order) in DTYPES.into_iter().flat_map(|d| orders.map(|o| (d, o))) {
        let elements = 4099;
        let r = Ranks::new(b, &clique[..2], dtype, elements);
        let (mut from, mut to) = (r.inputs.clone(), r.outputs.clone());
        for call in 0..50 {
            let ranks: Vec<Rank> = (0..2)
                .map(|i| Rank {
                    stream: r.streams[i],
                    input: from[i],
                    output: to[i],
                })
                .collect();
            b.collectives()
                .all_reduce(
                    order(call),
                    dtype,
                    Reduction::Sum,
                    &ranks,
                    &r.flags,
                    Waiting::Bounded,
                    r.len,
                )
                .unwrap();
            std::mem::swap(&mut from, &mut to);
        }
        r.synchronize(b);
        // The first call sums two inputs; each later one doubles: 2^49 times the first sum.
        let scale = 2f32.powi(49);
        let want = encode(
            dtype,
            (0..elements).map(|e| (value(0, e) + value(1, e)) * scale),
        );
        r.check(b, "the 50th chained all-reduce", &from, &want);
    }
}

pub fn packet_all_reduces_of_changing_sizes_read_only_their_own_packets(b: &dyn Backend) {
    let clique = p2p_clique(b);
    if clique.len() < 2 {
        return not_here("packet all-reduces", "no two GPUs with P2P");
    }
    enable_peer_access(b, &clique);
    // A word's packets stay in its slot from call to call; the inputs change every call, so a
    // packet of an earlier call taken for the current one shows. Sizes from one word to the
    // largest, in an order that moves words between few and many blocks.
    let elements = PACKET_MAX_BYTES / 4;
    let r = Ranks::new(b, &clique, DataType::F32, elements);
    let n = clique.len();
    for (call, words) in [
        1,
        elements,
        513,
        3,
        elements,
        1,
        2049,
        elements - 1,
        512,
        elements,
    ]
    .into_iter()
    .enumerate()
    {
        let scale = (call + 1) as f32;
        for (k, &input) in r.inputs.iter().enumerate() {
            let values = encode(DataType::F32, (0..words).map(|e| scale * value(k, e)));
            b.write(input, 0, &values).unwrap();
        }
        let ranks = r.ranks();
        b.collectives()
            .all_reduce(
                AllReduceKernel::OneShotPackets,
                DataType::F32,
                Reduction::Sum,
                &ranks,
                &r.flags,
                Waiting::Bounded,
                4 * words,
            )
            .unwrap();
        r.synchronize(b);
        let want = encode(
            DataType::F32,
            (0..words).map(|e| scale * (0..n).map(|k| value(k, e)).sum::<f32>()),
        );
        r.check(
            b,
            &format!("packet call {call} of {words} words"),
            &r.outputs,
            &want,
        );
    }
}

pub fn a_captured_all_reduce_replays_on_every_rank_and_the_capture_runs_none(b: &dyn Backend) {
    let clique = p2p_clique(b);
    if clique.len() < 2 {
        return not_here("a captured all-reduce", "no two GPUs with P2P");
    }
    enable_peer_access(b, &clique);
    for kernel in KERNELS {
        let elements = 70_001.min(kernel.max_len() / 4);
        let r = Ranks::new(b, &clique, DataType::F32, elements);
        for &s in &r.streams {
            b.begin_capture(s).unwrap();
        }
        r.all_reduce(b, kernel, Reduction::Sum).unwrap();
        let graphs: Vec<_> = r
            .streams
            .iter()
            .map(|&s| b.end_capture(s).unwrap())
            .collect();
        r.synchronize(b);
        r.check(b, "after the capture", &r.outputs, &vec![FILL; r.len]);
        for replay in 0..2 {
            if replay == 1 {
                // New inputs: the replay reads the buffers as they are now.
                let doubled = encode(DataType::F32, (0..elements).map(|e| 2.0 * value(0, e)));
                b.write(r.inputs[0], 0, &doubled).unwrap();
            }
            for (&g, &s) in graphs.iter().zip(&r.streams) {
                b.replay(g, s).unwrap();
            }
            r.synchronize(b);
            let n = r.devices.len();
            let first = if replay == 1 { 2.0 } else { 1.0 };
            let want = encode(
                DataType::F32,
                (0..elements)
                    .map(|e| first * value(0, e) + (1..n).map(|k| value(k, e)).sum::<f32>()),
            );
            r.check(
                b,
                &format!("{} replay {replay}", kernel.name()),
                &r.outputs,
                &want,
            );
        }
        for g in graphs {
            b.destroy_graph(g).unwrap();
        }
    }
}

pub fn all_reduce_refuses_what_its_kernels_cannot_take(b: &dyn Backend) {
    let clique = p2p_clique(b);
    let one = Ranks::new(b, &[0], DataType::F32, 16);
    says(
        &usage(one.all_reduce(b, AllReduceKernel::OneShot, Reduction::Sum)),
        "2 to 8 ranks",
    );
    if clique.len() < 2 {
        return not_here("all-reduce refusals between GPUs", "no two GPUs with P2P");
    }
    let pair = &clique[..2];
    let r = Ranks::new(b, pair, DataType::F32, 16);
    let kernel = AllReduceKernel::OneShot;
    let call = |ranks: &[Rank], flags: &[BufferId], dtype: DataType, len: usize| {
        b.collectives().all_reduce(
            kernel,
            dtype,
            Reduction::Sum,
            ranks,
            flags,
            Waiting::Bounded,
            len,
        )
    };
    let (ranks, flags, len) = (r.ranks(), r.flags.clone(), r.len);
    // Peer access first, before anything else is wrong.
    let missing = usage(call(&ranks, &flags, DataType::F32, len));
    says(&missing, "enable_peer_access(");
    enable_peer_access(b, pair);

    says(
        &usage(call(&ranks, &flags, DataType::F32, 6)),
        "whole number of f32",
    );
    says(
        &usage(call(&ranks, &flags, DataType::Bf16, 3)),
        "whole number of bf16",
    );
    says(&usage(call(&ranks, &flags, DataType::F32, 0)), "0 bytes");
    says(
        &usage(call(&ranks, &flags, DataType::F32, len + 4)),
        "outside",
    );
    says(
        &usage(call(&ranks, &flags[..1], DataType::F32, len)),
        "one per rank",
    );
    let big = Ranks::new(b, pair, DataType::F32, PACKET_MAX_BYTES / 4 + 1);
    let too_big = usage(big.all_reduce(b, AllReduceKernel::OneShotPackets, Reduction::Sum));
    says(
        &too_big,
        &format!("at most {PACKET_MAX_BYTES} bytes (PACKET_MAX_BYTES)"),
    );
    says(&too_big, "use one-shot or two-shot");
    let mut same = ranks.clone();
    same[1].output = same[1].input;
    says(
        &usage(call(&same, &flags, DataType::F32, len)),
        "output is its input",
    );
    let mut swapped = ranks.clone();
    swapped[1].input = r.inputs[0];
    says(
        &usage(call(&swapped, &flags, DataType::F32, len)),
        "use memory of GPU",
    );
    let pinned = b
        .alloc(Memory::PinnedHost { numa_node: None }, len)
        .unwrap();
    let mut on_host = ranks.clone();
    on_host[0].output = pinned;
    says(
        &usage(call(&on_host, &flags, DataType::F32, len)),
        "pinned host memory",
    );
    let short = b.alloc(Memory::Device(pair[1]), FLAG_BYTES - 1).unwrap();
    b.write(short, 0, &vec![0; FLAG_BYTES - 1]).unwrap();
    says(
        &usage(call(&ranks, &[flags[0], short], DataType::F32, len)),
        "flag block",
    );
    let mut as_flags = flags.clone();
    as_flags[1] = r.inputs[1];
    says(
        &usage(call(&ranks, &as_flags, DataType::F32, len)),
        "flags[1]",
    );
    let mut one_gpu = ranks.clone();
    one_gpu[1].stream = b.create_stream(pair[0]).unwrap();
    says(
        &usage(call(&one_gpu, &flags, DataType::F32, len)),
        "both run on GPU",
    );
    b.begin_capture(r.streams[0]).unwrap();
    says(
        &usage(call(&ranks, &flags, DataType::F32, len)),
        "capture every rank's stream or none",
    );
    let graph = b.end_capture(r.streams[0]).unwrap();
    b.destroy_graph(graph).unwrap();
    r.synchronize(b);
    r.check(b, "after refused calls", &r.outputs, &vec![FILL; len]);
    // And the arguments were right otherwise.
    r.all_reduce(b, kernel, Reduction::Sum).unwrap();
    r.synchronize(b);
    r.check(b, "after the refusals", &r.outputs, &r.want(Reduction::Sum));
}

/// One rank's kernel of the all-reduce across processes checks what it can in this process before
/// it queues anything (the peers' buffers stand in here for imported ones, on their own GPUs): the
/// ranks, its stream's GPU, one GPU per rank, lengths, flags and graph capture.
pub fn rank_all_reduce_refuses_what_it_cannot_take(b: &dyn Backend) {
    let clique = p2p_clique(b);
    if clique.len() < 2 {
        return not_here(
            "all-reduce across processes refusals",
            "no two GPUs with P2P",
        );
    }
    let pair = &clique[..2];
    enable_peer_access(b, pair);
    let r = Ranks::new(b, pair, DataType::F32, 16);
    let buffers: Vec<RankBuffers> = (0..2)
        .map(|i| RankBuffers {
            input: r.inputs[i],
            output: r.outputs[i],
            input_offset: 0,
            output_offset: 0,
            flags: r.flags[i],
        })
        .collect();
    let call =
        |kernel: AllReduceKernel, rank: usize, stream: StreamId, ranks: &[RankBuffers], len| {
            b.collectives().rank_all_reduce(
                kernel,
                DataType::F32,
                Reduction::Sum,
                rank,
                stream,
                ranks,
                Waiting::Bounded,
                len,
            )
        };
    let (one_shot, len) = (AllReduceKernel::OneShot, r.len);
    says(
        &usage(call(one_shot, 0, r.streams[0], &[], len)),
        "1 to 8 ranks",
    );
    says(
        &usage(call(one_shot, 2, r.streams[0], &buffers, len)),
        "rank 2 of 2 ranks",
    );
    says(
        &usage(call(one_shot, 0, r.streams[1], &buffers, len)),
        "queue it on a stream of GPU",
    );
    says(
        &usage(call(one_shot, 0, r.streams[0], &buffers, 6)),
        "whole number of f32",
    );
    says(
        &usage(call(one_shot, 0, r.streams[0], &buffers, len + 4)),
        "outside",
    );
    let mut past_the_end = buffers.clone();
    past_the_end[1].input_offset = 4;
    says(
        &usage(call(one_shot, 0, r.streams[0], &past_the_end, len)),
        "rank 1's input",
    );
    let mut one_gpu = buffers.clone();
    one_gpu[1] = one_gpu[0];
    says(
        &usage(call(one_shot, 0, r.streams[0], &one_gpu, len)),
        "both have their buffers on GPU",
    );
    let mut same = buffers.clone();
    same[0].output = same[0].input;
    says(
        &usage(call(one_shot, 0, r.streams[0], &same, len)),
        "output is its input",
    );
    let mut as_flags = buffers.clone();
    as_flags[1].flags = r.inputs[1];
    says(
        &usage(call(one_shot, 0, r.streams[0], &as_flags, len)),
        "also its input or output",
    );
    let short = b.alloc(Memory::Device(pair[1]), FLAG_BYTES - 1).unwrap();
    let mut short_flags = buffers.clone();
    short_flags[1].flags = short;
    says(
        &usage(call(one_shot, 0, r.streams[0], &short_flags, len)),
        "rank 1's flags",
    );
    let packets = AllReduceKernel::OneShotPackets;
    says(
        &usage(call(
            packets,
            0,
            r.streams[0],
            &buffers,
            PACKET_MAX_BYTES + 4,
        )),
        "at most",
    );
    r.synchronize(b);
    r.check(b, "after refused calls", &r.outputs, &vec![FILL; len]);
}

/// One rank's part across processes sums with no one: every kernel and element type writes its
/// input, summed or averaged alone, into its output (one element, an odd count, the largest the
/// kernel takes up to 1 MiB), twice on the same flags, and in place where the kernel takes it.
pub fn one_rank_across_processes_writes_its_input_as_its_sum(b: &dyn Backend) {
    if gpus(b) == 0 {
        return not_here("one rank's all-reduce", "no GPU");
    }
    for dtype in DTYPES {
        for kernel in KERNELS {
            let larger = ((1 << 20) / dtype.size() + 3).min(kernel.max_len() / dtype.size());
            for elements in [1, 1001, larger] {
                let r = Ranks::new(b, &[0], dtype, elements);
                let mut alone = RankBuffers {
                    input: r.inputs[0],
                    output: r.outputs[0],
                    input_offset: 0,
                    output_offset: 0,
                    flags: r.flags[0],
                };
                let call = |op: Reduction, buffers: RankBuffers| {
                    let collectives = b.collectives();
                    let waiting = Waiting::Bounded;
                    collectives.rank_all_reduce(
                        kernel,
                        dtype,
                        op,
                        0,
                        r.streams[0],
                        &[buffers],
                        waiting,
                        r.len,
                    )
                };
                for op in [Reduction::Sum, Reduction::Average] {
                    call(op, alone).unwrap();
                    r.synchronize(b);
                    let what = format!("one rank's {} all-reduce ({op})", kernel.name());
                    r.check(b, &what, &r.outputs, &r.want(op));
                    b.write(r.outputs[0], 0, &vec![FILL; r.len]).unwrap();
                }
                if kernel.in_place() {
                    alone.output = alone.input;
                    call(Reduction::Sum, alone).unwrap();
                    r.synchronize(b);
                    let what = format!("one rank's {} all-reduce in place", kernel.name());
                    r.check(b, &what, &r.inputs, &r.want(Reduction::Sum));
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The stand-in compute kernel

pub fn busy_keeps_its_stream_for_at_least_its_duration(b: &dyn Backend) {
    let stream = b.create_stream(gpus(b) - 1).unwrap();
    for duration in [0.0, 50.0, 2000.0] {
        let gate = b.hold(stream).unwrap();
        let start = b.record(stream).unwrap();
        b.collectives().busy(stream, duration).unwrap();
        let end = b.record(stream).unwrap();
        b.release(gate).unwrap();
        b.synchronize(stream).unwrap();
        let took = b.elapsed_us(start, end).unwrap();
        // Events resolve about half a microsecond.
        assert!(
            took >= duration - 0.5,
            "busy for {duration} µs took {took} µs"
        );
        if b.source().is_simulated() {
            // The simulator: a kernel launch, then exactly the duration.
            assert!(
                took <= duration + 10.0,
                "busy for {duration} µs took {took} µs"
            );
        }
    }
    for wrong in [-1.0, f64::NAN, f64::INFINITY] {
        says(
            &usage(b.collectives().busy(stream, wrong)),
            "finite duration",
        );
    }
}

// ---------------------------------------------------------------------------------------------
// NCCL

/// NCCL, or `None` after saying why the check has nothing to do.
fn nccl<'a>(b: &'a dyn Backend, check: &str) -> Option<&'a dyn Nccl> {
    match b.collectives().nccl() {
        Ok(nccl) => Some(nccl),
        Err(why) => {
            eprintln!("{check}: nothing to check, this host has no NCCL ({why})");
            None
        }
    }
}

/// The first two GPUs and every GPU, or GPU 0 alone on a one-GPU host.
fn nccl_device_sets(b: &dyn Backend) -> Vec<Vec<usize>> {
    let all: Vec<usize> = (0..gpus(b)).collect();
    match all.len() {
        1 | 2 => vec![all],
        _ => vec![all[..2].to_vec(), all],
    }
}

pub fn nccl_all_reduce_sums_in_place_and_out_of_place(b: &dyn Backend) {
    let Some(nccl) = nccl(b, "NCCL all-reduce") else {
        return;
    };
    let described = nccl.describe();
    assert!(!described.trim().is_empty());
    if b.source().is_simulated() {
        says(&described, "simulated");
    }
    for devices in nccl_device_sets(b) {
        let comm = nccl.communicator(&devices).unwrap();
        for dtype in DTYPES {
            for elements in [1, 1001, (1 << 20) / dtype.size() + 3] {
                let r = Ranks::new(b, &devices, dtype, elements);
                nccl.all_reduce(comm, dtype, &r.ranks(), r.len).unwrap();
                r.synchronize(b);
                let sum = r.want(Reduction::Sum);
                r.check(b, "NCCL all-reduce", &r.outputs, &sum);
                let in_place: Vec<Rank> = r
                    .ranks()
                    .into_iter()
                    .map(|rank| Rank {
                        output: rank.input,
                        ..rank
                    })
                    .collect();
                nccl.all_reduce(comm, dtype, &in_place, r.len).unwrap();
                r.synchronize(b);
                r.check(b, "NCCL all-reduce in place", &r.inputs, &sum);
            }
        }
        nccl.destroy_communicator(comm).unwrap();
    }
}

/// Each `(from, to)` of `pairs` sends `len` bytes in one grouped call over `devices`; every
/// destination byte is checked, and the bytes around each destination range stay.
fn check_send_recv(
    b: &dyn Backend,
    nccl: &dyn Nccl,
    devices: &[usize],
    pairs: &[(usize, usize)],
    len: usize,
) {
    let comm = nccl.communicator(devices).unwrap();
    let streams: Vec<StreamId> = devices
        .iter()
        .map(|&d| b.create_stream(d).unwrap())
        .collect();
    let (before, after) = (5, 3);
    let mut transfers = Vec::new();
    let mut want = Vec::new();
    for (k, &(from, to)) in pairs.iter().enumerate() {
        let data = super::pattern(len, k as u8 + 1);
        let src = b.alloc(Memory::Device(devices[from]), len + 7).unwrap();
        b.write(src, 7, &data).unwrap();
        let dst = b
            .alloc(Memory::Device(devices[to]), before + len + after)
            .unwrap();
        b.write(dst, 0, &vec![FILL; before + len + after]).unwrap();
        let range = |buffer, offset| BufferRange {
            buffer,
            offset,
            len,
        };
        transfers.push(PeerTransfer {
            from,
            to,
            src: range(src, 7),
            dst: range(dst, before),
        });
        let mut expected = vec![FILL; before + len + after];
        expected[before..before + len].copy_from_slice(&data);
        want.push((dst, expected, from, to));
    }
    nccl.send_recv(comm, &streams, &transfers).unwrap();
    for &s in &streams {
        b.synchronize(s).unwrap();
    }
    for (dst, expected, from, to) in want {
        let got = super::contents(b, dst);
        if let Some(at) = (0..got.len()).find(|&i| got[i] != expected[i]) {
            panic!(
                "NCCL send of {len} bytes from rank {from} (GPU {}) to rank {to} (GPU {}): first \
                 wrong byte at {at} of the destination (want {:#04x}, got {:#04x})",
                devices[from], devices[to], expected[at], got[at]
            );
        }
    }
    nccl.destroy_communicator(comm).unwrap();
}

pub fn nccl_send_recv_moves_every_byte_one_way_both_ways_and_round_a_ring(b: &dyn Backend) {
    let Some(nccl) = nccl(b, "NCCL send/recv") else {
        return;
    };
    let n = gpus(b);
    if n < 2 {
        return not_here("NCCL send/recv", "one GPU");
    }
    for len in [1, 4099, 3 << 20] {
        check_send_recv(b, nccl, &[0, 1], &[(0, 1)], len);
        check_send_recv(b, nccl, &[1, 0], &[(0, 1), (1, 0)], len);
    }
    let all: Vec<usize> = (0..n).collect();
    let ring: Vec<(usize, usize)> = (0..n)
        .flat_map(|i| [(i, (i + 1) % n), ((i + 1) % n, i)])
        .collect();
    check_send_recv(b, nccl, &all, &ring, 65_537);
}

pub fn nccl_refuses_what_it_cannot_take(b: &dyn Backend) {
    let Some(nccl) = nccl(b, "NCCL refusals") else {
        return;
    };
    says(&usage(nccl.communicator(&[])), "at least one GPU");
    says(&usage(nccl.communicator(&[0, 0])), "twice");
    usage(nccl.communicator(&[gpus(b)]));
    let comm = nccl.communicator(&[0]).unwrap();
    let r = Ranks::new(b, &[0], DataType::F32, 16);
    says(
        &usage(nccl.all_reduce(comm, DataType::F32, &r.ranks(), 6)),
        "whole number",
    );
    says(
        &usage(nccl.all_reduce(comm, DataType::F32, &[], r.len)),
        "one rank each",
    );
    nccl.destroy_communicator(comm).unwrap();
    match nccl.all_reduce(comm, DataType::F32, &r.ranks(), r.len) {
        Err(Error::InvalidHandle(message)) => says(&message, "released"),
        other => panic!("a destroyed communicator: expected an invalid handle, got {other:?}"),
    }
    if gpus(b) < 2 {
        return not_here("NCCL refusals between GPUs", "one GPU");
    }
    let comm = nccl.communicator(&[0, 1]).unwrap();
    let r = Ranks::new(b, &[0, 1], DataType::F32, 16);
    let mut reversed = r.ranks();
    reversed.reverse();
    says(
        &usage(nccl.all_reduce(comm, DataType::F32, &reversed, r.len)),
        "communicator's order",
    );
    let range = |buffer, offset, len| BufferRange {
        buffer,
        offset,
        len,
    };
    let send = |from, to, src: BufferRange, dst: BufferRange| {
        nccl.send_recv(comm, &r.streams, &[PeerTransfer { from, to, src, dst }])
    };
    let (on_0, on_1) = (r.inputs[0], r.outputs[1]);
    says(
        &usage(send(0, 0, range(on_0, 0, 8), range(r.outputs[0], 0, 8))),
        "to itself",
    );
    says(
        &usage(send(0, 2, range(on_0, 0, 8), range(on_1, 0, 8))),
        "names rank 2",
    );
    says(
        &usage(send(0, 1, range(on_0, 0, 8), range(on_1, 0, 4))),
        "one length",
    );
    says(
        &usage(send(0, 1, range(on_1, 0, 8), range(on_1, 8, 8))),
        "use memory of GPU 0",
    );
    says(
        &usage(send(0, 1, range(on_0, 60, 8), range(on_1, 0, 8))),
        "outside",
    );
    says(
        &usage(nccl.send_recv(comm, &r.streams[..1], &[])),
        "one stream per rank",
    );
    let twice = [
        PeerTransfer {
            from: 0,
            to: 1,
            src: range(on_0, 0, 8),
            dst: range(on_1, 0, 8),
        },
        PeerTransfer {
            from: 0,
            to: 1,
            src: range(on_0, 8, 8),
            dst: range(on_1, 4, 8),
        },
    ];
    says(
        &usage(nccl.send_recv(comm, &r.streams, &twice)),
        "overlapping",
    );
    r.synchronize(b);
    r.check(
        b,
        "after refused calls",
        &r.outputs[1..],
        &vec![FILL; r.len],
    );
    nccl.destroy_communicator(comm).unwrap();
}

/// A communicator across processes, as one process sees it: on GPUs, a rank of one (the rest of a
/// real group is `tests/gpu/processes.rs`'s) made from a fresh unique id, which sums like any
/// other and takes only its own rank's calls; on the simulator, refused in one sentence.
pub fn nccl_one_rank_of_a_communicator_across_processes(b: &dyn Backend) {
    let Some(nccl) = nccl(b, "NCCL across processes") else {
        return;
    };
    says(&usage(UniqueId::from_bytes(&[7; 5])), "128 bytes");
    let alone = CommRank {
        rank: 0,
        world: 1,
        device: 0,
    };
    if b.topology().is_simulated() {
        says(&usage(nccl.unique_id()), "not simulated");
        let made_elsewhere = UniqueId::from_bytes(&[7; 128]).unwrap();
        says(
            &usage(nccl.join_communicator(&made_elsewhere, alone)),
            "not simulated",
        );
        return;
    }
    let id = nccl.unique_id().unwrap();
    let beyond = CommRank { rank: 1, ..alone };
    says(&usage(nccl.join_communicator(&id, beyond)), "from 0 to 0");
    let comm = nccl.join_communicator(&id, alone).unwrap();
    let r = Ranks::new(b, &[0], DataType::F32, 16);
    nccl.all_reduce(comm, DataType::F32, &r.ranks(), r.len)
        .unwrap();
    r.synchronize(b);
    r.check(
        b,
        "a rank of one's all-reduce",
        &r.outputs,
        &r.want(Reduction::Sum),
    );
    let range = BufferRange {
        buffer: r.inputs[0],
        offset: 0,
        len: 8,
    };
    says(
        &usage(nccl.rank_send_recv(comm, r.streams[0], &[PeerOp::Send { to: 0, src: range }])),
        "not another rank",
    );
    says(
        &usage(nccl.send_recv(comm, &r.streams, &[])),
        "rank_send_recv",
    );
    nccl.destroy_communicator(comm).unwrap();
    let whole = nccl.communicator(&[0]).unwrap();
    says(
        &usage(nccl.rank_send_recv(whole, r.streams[0], &[])),
        "made in this process",
    );
    nccl.destroy_communicator(whole).unwrap();
}
