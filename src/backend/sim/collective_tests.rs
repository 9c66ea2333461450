//! The simulator's collectives through the checked layer: real sums in every output, and the
//! cost model's shape.

use super::*;
use crate::backend::collective::{AllReduceKernel, DataType, Rank, Reduction, Waiting, FLAG_BYTES};
use crate::backend::{Backend, BufferId, StreamId};

const MIB: usize = 1 << 20;

/// The value of element `e` of rank `r`'s input: small integers, so that every sum is exact in
/// f32 and bf16 whatever the order of the additions.
fn value(r: usize, e: usize) -> f32 {
    ((e * 7 + r * 13) % 33) as f32 - 16.0
}

/// Little-endian elements (small integers and their means here, exact in every type).
fn encode(dtype: DataType, values: impl Iterator<Item = f32>) -> Vec<u8> {
    let mut out = Vec::new();
    values.for_each(|v| dtype.push_rounded(v, &mut out));
    out
}

/// Every rank's buffers and stream, peer access enabled between all of them.
struct Setup {
    devices: Vec<usize>,
    streams: Vec<StreamId>,
    inputs: Vec<BufferId>,
    outputs: Vec<BufferId>,
    flags: Vec<BufferId>,
    dtype: DataType,
    len: usize,
}

impl Setup {
    fn new(sim: &SimBackend, devices: &[usize], dtype: DataType, len: usize) -> Setup {
        let setup = Setup::zeroed(sim, devices, dtype, len);
        let elements = len / dtype.size();
        for (r, &input) in setup.inputs.iter().enumerate() {
            let data = encode(dtype, (0..elements).map(|e| value(r, e)));
            sim.write(input, 0, &data).unwrap();
        }
        setup
    }

    /// Inputs left zero, for timing alone.
    fn zeroed(sim: &SimBackend, devices: &[usize], dtype: DataType, len: usize) -> Setup {
        // Where the host has P2P (peerlink's kernels need it; NCCL makes its own way).
        for &a in devices {
            for &b in devices {
                if a == b || sim.topology().pair(a, b).is_some_and(|p| p.p2p) {
                    sim.enable_peer_access(a, b).unwrap();
                }
            }
        }
        let buffer = |d: usize| sim.alloc(Memory::Device(d), len).unwrap();
        let inputs: Vec<BufferId> = devices.iter().map(|&d| buffer(d)).collect();
        Setup {
            devices: devices.to_vec(),
            streams: devices
                .iter()
                .map(|&d| sim.create_stream(d).unwrap())
                .collect(),
            outputs: devices.iter().map(|&d| buffer(d)).collect(),
            flags: devices
                .iter()
                .map(|&d| sim.alloc(Memory::Device(d), FLAG_BYTES).unwrap())
                .collect(),
            inputs,
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

    fn all_reduce(&self, sim: &SimBackend, kernel: AllReduceKernel, op: Reduction) {
        sim.collectives()
            .all_reduce(
                kernel,
                self.dtype,
                op,
                &self.ranks(),
                &self.flags,
                Waiting::Bounded,
                self.len,
            )
            .unwrap();
    }

    fn synchronize(&self, sim: &SimBackend) {
        for &s in &self.streams {
            sim.synchronize(s).unwrap();
        }
    }

    /// What every output must hold, computed on the host: the sum, or the exact mean (the tests
    /// average over a power of two of ranks, so sum / ranks is exact in f32 and bf16).
    fn want(&self, op: Reduction) -> Vec<u8> {
        let n = self.devices.len();
        let elements = self.len / self.dtype.size();
        let sums = (0..elements).map(|e| (0..n).map(|r| value(r, e)).sum::<f32>());
        match op {
            Reduction::Sum => encode(self.dtype, sums),
            Reduction::Average => encode(self.dtype, sums.map(|s| s / n as f32)),
        }
    }

    fn check_outputs(&self, sim: &SimBackend, op: Reduction) {
        let want = self.want(op);
        for (r, &output) in self.outputs.iter().enumerate() {
            let mut got = vec![0; self.len];
            sim.read(output, 0, &mut got).unwrap();
            if let Some(at) = (0..self.len).find(|&i| got[i] != want[i]) {
                panic!("rank {r}'s output differs from the host's {op} first at byte {at}");
            }
        }
    }

    /// GPU time of one all-reduce, on rank 0's stream behind a gate (the other ranks wait for it).
    fn timed(&self, sim: &SimBackend, kernel: AllReduceKernel) -> f64 {
        let first = self.streams[0];
        let gate = sim.hold(first).unwrap();
        let start = sim.record(first).unwrap();
        self.all_reduce(sim, kernel, Reduction::Sum);
        let end = sim.record(first).unwrap();
        sim.release(gate).unwrap();
        self.synchronize(sim);
        sim.elapsed_us(start, end).unwrap()
    }
}

const KERNELS: [AllReduceKernel; 3] = AllReduceKernel::ALL;

#[test]
fn all_reduce_writes_the_exact_sum_into_every_output() {
    let sim = SimBackend::open("dgx-h100").unwrap();
    for dtype in [DataType::F32, DataType::Bf16, DataType::F16] {
        for kernel in KERNELS {
            for devices in [&[0, 1][..], &[3, 0, 5], &[0, 1, 2, 3, 4, 5, 6, 7]] {
                // Odd element counts leave the two-shot slices uneven.
                let setup = Setup::new(&sim, devices, dtype, 1001 * dtype.size());
                setup.all_reduce(&sim, kernel, Reduction::Sum);
                setup.synchronize(&sim);
                setup.check_outputs(&sim, Reduction::Sum);
                let mut input = vec![0; setup.len];
                sim.read(setup.inputs[0], 0, &mut input).unwrap();
                let first = encode(dtype, (0..1001).map(|e| value(0, e)));
                assert_eq!(input, first, "the inputs are left as they were");
            }
        }
    }
}

#[test]
fn all_reduce_writes_the_exact_mean_into_every_output_over_2_4_and_8_ranks() {
    let sim = SimBackend::open("dgx-h100").unwrap();
    for dtype in [DataType::F32, DataType::Bf16, DataType::F16] {
        for kernel in KERNELS {
            for devices in [&[0, 1][..], &[3, 0, 5, 6], &[0, 1, 2, 3, 4, 5, 6, 7]] {
                // Odd counts: one element, uneven two-shot slices, a bf16 half word at the end.
                for elements in [1, 7, 1001] {
                    let setup = Setup::new(&sim, devices, dtype, elements * dtype.size());
                    setup.all_reduce(&sim, kernel, Reduction::Average);
                    setup.synchronize(&sim);
                    setup.check_outputs(&sim, Reduction::Average);
                }
            }
        }
    }
}

#[test]
fn one_shot_is_faster_for_8_bytes_and_two_shot_for_large_buffers() {
    let sim = SimBackend::open("dgx-h100").unwrap();
    let time = |devices: &[usize], len: usize, kernel| {
        Setup::zeroed(&sim, devices, DataType::F32, len).timed(&sim, kernel)
    };
    let one = time(&[0, 1], 8, AllReduceKernel::OneShot);
    let two = time(&[0, 1], 8, AllReduceKernel::TwoShot);
    assert!(one < two, "8 B: one-shot {one} µs, two-shot {two} µs");
    let p = sim.preset();
    let nv = p.nvlink.as_ref().unwrap();
    // Launch, flag exchange, a remote load's round trip, 8 bytes, flag exchange.
    let fixed = p.costs.kernel_setup_us + 2.0 * nv.signal_us + nv.load_latency_ns / 1e3;
    assert!((one - fixed).abs() < 0.01, "{one} vs {fixed}");

    let one = time(&[0, 1], 256 * MIB, AllReduceKernel::OneShot);
    let two = time(&[0, 1], 256 * MIB, AllReduceKernel::TwoShot);
    assert!(
        two < one,
        "256 MiB on 2 GPUs: one-shot {one} µs, two-shot {two} µs"
    );
    // One-shot: each rank pulls the other's whole buffer at an SM kernel's share of the port.
    let port = 18.0 * nv.link_gbps * nv.efficiency * 1e3;
    let pull = (256 * MIB) as f64 / (port * p.gpu.sm_copy_efficiency);
    assert!(
        (one - fixed - pull).abs() < 0.01,
        "{one} vs {}",
        fixed + pull
    );

    let all: Vec<usize> = (0..8).collect();
    let one = time(&all, 16 * MIB, AllReduceKernel::OneShot);
    let two = time(&all, 16 * MIB, AllReduceKernel::TwoShot);
    assert!(
        two * 3.0 < one,
        "16 MiB on 8 GPUs: one-shot {one} µs, two-shot {two} µs"
    );
}

#[test]
fn packets_beat_one_shot_at_8_bytes_by_the_barriers_they_skip() {
    for preset in ["h200-pair", "dgx-h100"] {
        let sim = SimBackend::open(preset).unwrap();
        let time = |kernel| Setup::zeroed(&sim, &[0, 1], DataType::F32, 8).timed(&sim, kernel);
        let one = time(AllReduceKernel::OneShot);
        let packets = time(AllReduceKernel::OneShotPackets);
        assert!(
            packets < one,
            "{preset}, 8 B: one-shot {one} µs, packets {packets} µs"
        );
        // Launch and one signal; 16 bytes of packets take next to nothing.
        let p = sim.preset();
        let fixed = p.costs.kernel_setup_us + p.nvlink.as_ref().unwrap().signal_us;
        assert!(
            (packets - fixed).abs() < 0.01,
            "{preset}: {packets} vs {fixed}"
        );
    }
}

#[test]
fn fifty_calls_on_the_same_flags_each_meet_their_own_partners() {
    let sim = SimBackend::open("dgx1-v100").unwrap();
    let setup = Setup::new(&sim, &[0, 1, 2, 3], DataType::Bf16, 4096);
    // Ranks issue from different host times; each call still meets its own counterparts.
    for i in 0..50 {
        setup.all_reduce(&sim, KERNELS[i % KERNELS.len()], Reduction::Sum);
    }
    setup.synchronize(&sim);
    setup.check_outputs(&sim, Reduction::Sum);
    let single = Setup::new(&sim, &[0, 1, 2, 3], DataType::Bf16, 4096);
    let one_call = single.timed(&sim, AllReduceKernel::OneShot);
    let first = setup.streams[0];
    let gate = sim.hold(first).unwrap();
    let start = sim.record(first).unwrap();
    for _ in 0..50 {
        setup.all_reduce(&sim, AllReduceKernel::OneShot, Reduction::Sum);
    }
    let end = sim.record(first).unwrap();
    sim.release(gate).unwrap();
    setup.synchronize(&sim);
    let fifty = sim.elapsed_us(start, end).unwrap();
    assert!(
        fifty >= 49.0 * one_call,
        "{fifty} µs for 50 calls of {one_call}"
    );
}

#[test]
fn a_captured_all_reduce_replays_with_a_graph_nodes_overhead() {
    let sim = SimBackend::open("dgx-h100").unwrap();
    let setup = Setup::new(&sim, &[0, 1, 2, 3], DataType::F32, 64 * 1024);
    let direct = setup.timed(&sim, AllReduceKernel::OneShot);
    for &output in &setup.outputs {
        sim.write(output, 0, &vec![0; setup.len]).unwrap();
    }
    for &s in &setup.streams {
        sim.begin_capture(s).unwrap();
    }
    setup.all_reduce(&sim, AllReduceKernel::OneShot, Reduction::Sum);
    let graphs: Vec<_> = setup
        .streams
        .iter()
        .map(|&s| sim.end_capture(s).unwrap())
        .collect();
    setup.synchronize(&sim);
    let mut zeros = vec![0; setup.len];
    sim.read(setup.outputs[2], 0, &mut zeros).unwrap();
    assert!(zeros.iter().all(|&b| b == 0), "a capture runs nothing");

    let first = setup.streams[0];
    let gate = sim.hold(first).unwrap();
    let start = sim.record(first).unwrap();
    for (g, &s) in graphs.iter().zip(&setup.streams) {
        sim.replay(*g, s).unwrap();
    }
    let end = sim.record(first).unwrap();
    sim.release(gate).unwrap();
    setup.synchronize(&sim);
    setup.check_outputs(&sim, Reduction::Sum);
    let replayed = sim.elapsed_us(start, end).unwrap();
    let costs = &sim.preset().costs;
    let saved = costs.kernel_setup_us - costs.graph_node_us;
    assert!(
        (direct - replayed - saved).abs() < 0.01,
        "direct {direct}, replayed {replayed}"
    );
}

#[test]
fn a_rank_whose_partners_never_come_hangs_as_a_gpu_would() {
    let sim = SimBackend::open("dgx-h100").unwrap();
    let setup = Setup::new(&sim, &[0, 1], DataType::F32, 64);
    sim.begin_capture(setup.streams[0]).unwrap();
    sim.begin_capture(setup.streams[1]).unwrap();
    setup.all_reduce(&sim, AllReduceKernel::OneShot, Reduction::Sum);
    let graph = sim.end_capture(setup.streams[0]).unwrap();
    sim.end_capture(setup.streams[1]).unwrap();
    // Only rank 0's graph is replayed: its kernel waits for rank 1's forever.
    sim.replay(graph, setup.streams[0]).unwrap();
    let err = sim.synchronize(setup.streams[0]).unwrap_err();
    assert!(err.to_string().contains("never arrive"), "{err}");
}

#[test]
fn busy_holds_its_stream_for_a_launch_and_its_duration() {
    let sim = SimBackend::open("h200-pair").unwrap();
    let s = sim.create_stream(1).unwrap();
    let gate = sim.hold(s).unwrap();
    let start = sim.record(s).unwrap();
    sim.collectives().busy(s, 250.0).unwrap();
    let end = sim.record(s).unwrap();
    sim.release(gate).unwrap();
    sim.synchronize(s).unwrap();
    let us = sim.elapsed_us(start, end).unwrap();
    let want = sim.preset().costs.kernel_setup_us + 250.0;
    assert!((us - want).abs() < 1e-9, "{us} vs {want}");
}

// ---------------------------------------------------------------------------------------------
// The model of NCCL

use crate::backend::collective::{BufferRange, Nccl, PeerTransfer};

fn nccl(sim: &SimBackend) -> &dyn Nccl {
    sim.collectives().nccl().expect("the simulator models NCCL")
}

impl Setup {
    /// One NCCL all-reduce over a communicator of the setup's GPUs, in place or not.
    fn nccl_all_reduce(&self, sim: &SimBackend, in_place: bool) -> f64 {
        let comm = nccl(sim).communicator(&self.devices).unwrap();
        let mut ranks = self.ranks();
        if in_place {
            ranks.iter_mut().for_each(|r| r.output = r.input);
        }
        let first = self.streams[0];
        let gate = sim.hold(first).unwrap();
        let start = sim.record(first).unwrap();
        nccl(sim)
            .all_reduce(comm, self.dtype, &ranks, self.len)
            .unwrap();
        let end = sim.record(first).unwrap();
        sim.release(gate).unwrap();
        self.synchronize(sim);
        nccl(sim).destroy_communicator(comm).unwrap();
        sim.elapsed_us(start, end).unwrap()
    }
}

#[test]
fn nccl_says_it_is_simulated() {
    let sim = SimBackend::open("h200-pair").unwrap();
    let described = nccl(&sim).describe();
    assert!(described.contains("simulated"), "{described}");
    assert!(described.contains("not measured"), "{described}");
}

#[test]
fn nccl_all_reduce_writes_the_exact_sum_in_place_and_out_of_place() {
    for (preset, devices) in [
        ("dgx-h100", &[0, 1][..]),
        ("dgx-h100", &[7, 2, 0, 4, 1, 3, 6, 5]),
        // Across sockets there is no P2P: NCCL's ring goes through host memory there.
        ("pcie-4gpu-2socket", &[0, 1, 2, 3]),
        ("h200-pair", &[1]),
    ] {
        let sim = SimBackend::open(preset).unwrap();
        for dtype in [DataType::F32, DataType::Bf16] {
            let setup = Setup::new(&sim, devices, dtype, 4099 * dtype.size());
            setup.nccl_all_reduce(&sim, false);
            setup.check_outputs(&sim, Reduction::Sum);
            let want = setup.want(Reduction::Sum);
            setup.nccl_all_reduce(&sim, true);
            for (r, &input) in setup.inputs.iter().enumerate() {
                let mut got = vec![0; setup.len];
                sim.read(input, 0, &mut got).unwrap();
                assert!(got == want, "{preset}: rank {r}'s in-place sum");
            }
        }
    }
}

#[test]
fn nccl_all_reduce_time_grows_with_ranks_and_size() {
    let sim = SimBackend::open("dgx-h100").unwrap();
    let time = |ranks: usize, len: usize| {
        let devices: Vec<usize> = (0..ranks).collect();
        Setup::zeroed(&sim, &devices, DataType::F32, len).nccl_all_reduce(&sim, false)
    };
    let mut last_by_size = 0.0;
    for len in [8, 64 << 10, 1 << 20, 16 << 20] {
        let mut last_by_ranks = 0.0;
        for ranks in [2, 4, 8] {
            let t = time(ranks, len);
            assert!(
                t > last_by_ranks,
                "{len} B: {ranks} ranks {t} µs after {last_by_ranks}"
            );
            last_by_ranks = t;
        }
        assert!(
            last_by_ranks > last_by_size,
            "{len} B on 8 ranks: {last_by_ranks} µs"
        );
        last_by_size = last_by_ranks;
    }
    // Small: the LL protocol's latency, its base + 2 steps of 0.6 µs, after a kernel launch.
    let small = time(2, 8);
    let want = sim.preset().costs.kernel_setup_us + nccl::LL.base_us() + 2.0 * 0.6;
    assert!((small - want).abs() < 0.01, "{small} vs {want}");
    // Large: the ring moves 2(n − 1)/n of the buffer at the Simple protocol's bus bandwidth.
    let large = time(8, 16 << 20);
    let nv = sim.preset().nvlink.clone().unwrap();
    let bus = 18.0 * nv.link_gbps * nv.efficiency * 1e3 * nccl::BUS_EFFICIENCY;
    let wire = (16 << 20) as f64 * 14.0 / 8.0 / bus;
    assert!(
        large > wire && large < wire + 60.0,
        "{large} µs vs {wire} on the wire"
    );
}

/// Copies `len` bytes with one grouped NCCL call for each `(from, to)` pair of ranks over `devices`,
/// checks every byte, and returns rank 0's GPU time.
fn nccl_send_recv(
    sim: &SimBackend,
    devices: &[usize],
    pairs: &[(usize, usize)],
    len: usize,
) -> f64 {
    let streams: Vec<StreamId> = devices
        .iter()
        .map(|&d| sim.create_stream(d).unwrap())
        .collect();
    let comm = nccl(sim).communicator(devices).unwrap();
    let mut transfers = Vec::new();
    let mut expected = Vec::new();
    for (k, &(from, to)) in pairs.iter().enumerate() {
        let data = crate::pattern::bytes(k as u64, len);
        let src = sim.alloc(Memory::Device(devices[from]), len + 3).unwrap();
        let dst = sim.alloc(Memory::Device(devices[to]), len + 5).unwrap();
        sim.write(src, 3, &data).unwrap();
        let range = |buffer, offset| BufferRange {
            buffer,
            offset,
            len,
        };
        transfers.push(PeerTransfer {
            from,
            to,
            src: range(src, 3),
            dst: range(dst, 5),
        });
        expected.push((dst, data));
    }
    let gate = sim.hold(streams[0]).unwrap();
    let start = sim.record(streams[0]).unwrap();
    nccl(sim).send_recv(comm, &streams, &transfers).unwrap();
    let end = sim.record(streams[0]).unwrap();
    sim.release(gate).unwrap();
    for &s in &streams {
        sim.synchronize(s).unwrap();
    }
    for (dst, data) in expected {
        let mut got = vec![0; len + 5];
        sim.read(dst, 0, &mut got).unwrap();
        assert!(got[..5] == [0; 5] && got[5..] == data[..], "{dst}");
    }
    sim.elapsed_us(start, end).unwrap()
}

#[test]
fn nccl_send_recv_copies_every_byte_one_way_both_ways_and_round_a_ring() {
    let sim = SimBackend::open("h200-pair").unwrap();
    nccl_send_recv(&sim, &[0, 1], &[(0, 1)], 1001);
    nccl_send_recv(&sim, &[1, 0], &[(0, 1), (1, 0)], 70_001);
    let sim = SimBackend::open("dgx1-v100").unwrap();
    let ring: Vec<(usize, usize)> = (0..8).map(|i| (i, (i + 1) % 8)).collect();
    nccl_send_recv(&sim, &[0, 1, 2, 3, 4, 5, 6, 7], &ring, 4096);
}

#[test]
fn nccl_messages_share_the_links_they_cross() {
    let sim = SimBackend::open("h200-pair").unwrap();
    let len = 64 << 20;
    let one = nccl_send_recv(&sim, &[0, 1], &[(0, 1)], len);
    // Both directions: each has its own half of the links.
    let both = nccl_send_recv(&sim, &[0, 1], &[(0, 1), (1, 0)], len);
    assert!(
        (both - one).abs() < 0.01 * one,
        "one way {one} µs, both ways {both}"
    );
    // Two messages one way share that direction.
    let two = nccl_send_recv(&sim, &[0, 1], &[(0, 1), (0, 1)], len);
    assert!(two > 1.9 * one, "one message {one} µs, two {two}");
    let nv = sim.preset().nvlink.clone().unwrap();
    let bus = 18.0 * nv.link_gbps * nv.efficiency * 1e3 * 0.90;
    // A large message goes as point-to-point Simple: its base latency and one 3.4 µs step over
    // NVLink, at 0.90 of the link's copy-engine rate.
    let want =
        sim.preset().costs.kernel_setup_us + nccl::P2P_SIMPLE.base_us() + 3.4 + len as f64 / bus;
    assert!((one - want).abs() < 0.01, "{one} vs {want}");
}

#[test]
fn nccl_across_hosts_sums_every_byte_and_pays_the_network_steps() {
    for (preset, ranks) in [("2x-dgx-h100", 16), ("2x-pcie-4gpu-2socket", 8)] {
        let sim = SimBackend::open(preset).unwrap();
        let devices: Vec<usize> = (0..ranks).collect();
        let setup = Setup::new(&sim, &devices, DataType::F32, 4099 * 4);
        setup.nccl_all_reduce(&sim, false);
        setup.check_outputs(&sim, Reduction::Sum);
    }
    // 8 bytes over two hosts of eight: LL's base, 28 steps over NVLink and 2 through the network,
    // each NET's 2.7 µs and the network's 1.5 µs (every crossing stays on its rail).
    let sim = SimBackend::open("2x-dgx-h100").unwrap();
    let devices: Vec<usize> = (0..16).collect();
    let small = Setup::zeroed(&sim, &devices, DataType::F32, 8).nccl_all_reduce(&sim, false);
    let want =
        sim.preset().costs.kernel_setup_us + nccl::LL.base_us() + 28.0 * 0.6 + 2.0 * (2.7 + 1.5);
    assert!((small - want).abs() < 0.01, "{small} vs {want}");
    let one_host =
        Setup::zeroed(&sim, &devices[..8], DataType::F32, 8).nccl_all_reduce(&sim, false);
    assert!(
        one_host < small,
        "{one_host} within one host, {small} across two"
    );
}

#[test]
fn nccl_messages_between_hosts_go_through_the_nics() {
    let sim = SimBackend::open("2x-dgx-h100").unwrap();
    let devices: Vec<usize> = (0..16).collect();
    let len = 4 << 20;
    let within = nccl_send_recv(&sim, &devices, &[(0, 1)], len);
    let across = nccl_send_recv(&sim, &devices, &[(0, 8)], len);
    // NVLink carries ~8× what one 400 Gb/s NIC does.
    assert!(across > 4.0 * within, "within {within} µs, across {across}");
    let net = sim.preset().network.clone().unwrap();
    let bus = net.nic_gbps * net.efficiency * 1e3 * 0.90;
    assert!(across > len as f64 / bus, "{across} µs");
}
