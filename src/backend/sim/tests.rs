//! Behaviour of the simulated backend through the `Backend` trait.

use super::*;
use crate::backend::{Backend, BufferId, EventId, GateId, Probes, StreamId};
use crate::pattern;

const MIB: usize = 1 << 20;

fn h100() -> SimBackend {
    SimBackend::open("dgx-h100").unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

fn device_buffer(sim: &SimBackend, device: usize, bytes: usize, seed: u8) -> BufferId {
    let b = sim.alloc(Memory::Device(device), bytes).unwrap();
    sim.write(b, 0, &pattern::bytes(seed.into(), bytes))
        .unwrap();
    b
}

fn contents(sim: &SimBackend, buffer: BufferId) -> Vec<u8> {
    let mut out = vec![0; sim.len(buffer).unwrap()];
    sim.read(buffer, 0, &mut out).unwrap();
    out
}

/// GPU time of `f`'s work on `stream`, measured like the bench: behind a hold, between events.
fn timed(sim: &SimBackend, stream: StreamId, f: impl FnOnce()) -> f64 {
    let gate = sim.hold(stream).unwrap();
    let start = sim.record(stream).unwrap();
    f();
    let end = sim.record(stream).unwrap();
    sim.release(gate).unwrap();
    sim.synchronize(stream).unwrap();
    sim.elapsed_us(start, end).unwrap()
}

#[test]
fn source_names_the_preset_and_topology_is_simulated() {
    let sim = h100();
    assert_eq!(sim.source().to_string(), "sim:dgx-h100");
    assert!(sim.topology().is_simulated());
    assert_eq!(sim.topology().devices.len(), 8);
}

/// `preset` repeated over `hosts` hosts (the network's checks are not the point here).
fn hosts_of(preset: &str, hosts: usize) -> Preset {
    let mut p = Preset::load(preset).unwrap();
    p.hosts = hosts;
    p
}

#[test]
fn a_simulator_for_a_few_of_1024_gpus_holds_their_pairs_alone() {
    let preset = hosts_of("2x-dgx-h100", 128);
    let sim = SimBackend::from_preset_among(&preset, Some(&[5, 1000, 3, 5]));
    let t = sim.topology();
    assert_eq!(t.devices.len(), 1024, "every GPU is listed");
    let pairs: Vec<(usize, usize)> = t.pairs.iter().map(|p| (p.src, p.dst)).collect();
    assert_eq!(
        pairs,
        [(3, 5), (3, 1000), (5, 3), (5, 1000), (1000, 3), (1000, 5)]
    );
    for p in &t.pairs {
        assert_eq!(
            (p.link, p.p2p),
            (preset.link(p.src, p.dst), preset.p2p(p.src, p.dst))
        );
    }
    // A copy between two of them moves its bytes.
    sim.enable_peer_access(3, 5).unwrap();
    let (src, dst) = (
        device_buffer(&sim, 3, MIB, 7),
        device_buffer(&sim, 5, MIB, 8),
    );
    let s = sim.create_stream(3).unwrap();
    sim.copy(
        s,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, dst, MIB),
    )
    .unwrap();
    sim.synchronize(s).unwrap();
    assert_eq!(contents(&sim, dst), contents(&sim, src));
}

#[test]
fn the_link_model_grows_with_the_hosts_not_with_the_pairs() {
    // Switched hosts and hosts of NVLink bundles (`links`) alike: 128 hosts hold 128 hosts'
    // resources, one host's times 128.
    for name in ["dgx-h100", "dgx1-v100"] {
        let one = LinkModel::new(&hosts_of(name, 1)).capacity().len();
        let many = LinkModel::new(&hosts_of(name, 128)).capacity().len();
        assert_eq!(many, 128 * one, "{name}");
    }
}

#[test]
fn a_256_mib_copy_on_a_dgx_h100_pair_takes_latency_plus_bytes_over_rate() {
    let sim = h100();
    sim.enable_peer_access(0, 1).unwrap();
    let len = 256 * MIB;
    let src = sim.alloc(Memory::Device(0), len).unwrap();
    let dst = sim.alloc(Memory::Device(1), len).unwrap();
    let s = sim.create_stream(0).unwrap();
    let gpu_us = timed(&sim, s, || {
        sim.copy(
            s,
            CopyMethod::CopyEngine,
            &BufferCopy::from_start(src, dst, len),
        )
        .unwrap()
    });
    let p = sim.preset();
    let nv = p.nvlink.as_ref().unwrap();
    let alpha = p.costs.copy_setup_us + nv.latency_us;
    let rate_bytes_per_us = 18.0 * nv.link_gbps * nv.efficiency * 1e3;
    let expected = alpha + len as f64 / rate_bytes_per_us;
    assert!(close(gpu_us, expected), "{gpu_us} vs {expected}");
    // ~397 GB/s, as nvbandwidth's CE write on H100.
    let gbps = len as f64 / gpu_us / 1e3;
    assert!((390.0..400.0).contains(&gbps), "{gbps}");
}

#[test]
fn host_clock_counts_issue_costs_and_sync_waits_for_the_gpu() {
    let sim = h100();
    let costs = sim.preset().costs.clone();
    let src = device_buffer(&sim, 0, 64 * MIB, 1);
    let dst = sim.alloc(Memory::Device(0), 64 * MIB).unwrap();
    let s = sim.create_stream(0).unwrap();
    assert_eq!(sim.host_time_us(), 0.0);
    sim.copy(
        s,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, dst, 64 * MIB),
    )
    .unwrap();
    assert_eq!(sim.host_time_us(), costs.copy_issue_us);
    // Not done yet: the host did not wait, so the destination still holds zeros.
    assert!(contents(&sim, dst).iter().all(|&b| b == 0));
    sim.synchronize(s).unwrap();
    let local_rate = sim.preset().gpu.local_copy_gbps * 1e3;
    let expected =
        costs.copy_issue_us + costs.copy_setup_us + (64 * MIB) as f64 / local_rate + costs.sync_us;
    assert!(
        close(sim.host_time_us(), expected),
        "{}",
        sim.host_time_us()
    );
    assert_eq!(contents(&sim, dst), contents(&sim, src));
}

#[test]
fn a_missing_dependency_shows_in_the_bytes() {
    // Without the wait, the second copy reads `mid` when it starts, before the first one lands.
    let sim = h100();
    let len = 16 * MIB;
    let src = device_buffer(&sim, 0, len, 9);
    let mid = sim.alloc(Memory::Device(0), len).unwrap();
    let dst = sim.alloc(Memory::Device(0), len).unwrap();
    let (s0, s1) = (sim.create_stream(0).unwrap(), sim.create_stream(0).unwrap());
    sim.copy(
        s0,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, mid, len),
    )
    .unwrap();
    sim.copy(
        s1,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(mid, dst, len),
    )
    .unwrap();
    sim.synchronize(s0).unwrap();
    sim.synchronize(s1).unwrap();
    assert!(contents(&sim, dst).iter().all(|&b| b == 0));
}

#[test]
fn freeing_a_buffer_with_queued_work_is_refused() {
    let sim = h100();
    let a = sim.alloc(Memory::Device(0), MIB).unwrap();
    let b = sim.alloc(Memory::Device(0), MIB).unwrap();
    let s = sim.create_stream(0).unwrap();
    let gate = sim.hold(s).unwrap();
    sim.copy(
        s,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(a, b, MIB),
    )
    .unwrap();
    assert!(sim.free(a).is_err());
    sim.release(gate).unwrap();
    sim.synchronize(s).unwrap();
    sim.free(a).unwrap();
}

#[test]
fn same_calls_give_the_same_times_bit_for_bit() {
    fn run() -> Vec<u64> {
        let sim = h100();
        let mut times = Vec::new();
        let streams: Vec<StreamId> = (0..8).map(|d| sim.create_stream(d).unwrap()).collect();
        for d in 0..8 {
            for p in 0..8 {
                sim.enable_peer_access(d, p).unwrap();
            }
        }
        let bufs: Vec<BufferId> = (0..8)
            .map(|d| sim.alloc(Memory::Device(d), 8 * MIB).unwrap())
            .collect();
        for round in 0..3 {
            let starts: Vec<EventId> = streams.iter().map(|&s| sim.record(s).unwrap()).collect();
            for d in 0..8 {
                let peer = (d + 1 + round) % 8;
                let len = (d + 1) * MIB;
                sim.copy(
                    streams[d],
                    CopyMethod::CopyEngine,
                    &BufferCopy::from_start(bufs[d], bufs[peer], len),
                )
                .unwrap();
            }
            for (d, &s) in streams.iter().enumerate() {
                let end = sim.record(s).unwrap();
                sim.synchronize(s).unwrap();
                times.push(sim.elapsed_us(starts[d], end).unwrap().to_bits());
            }
        }
        times.push(sim.host_time_us().to_bits());
        times
    }
    assert_eq!(run(), run());
}

fn open(name: &str) -> SimBackend {
    SimBackend::open(name).unwrap()
}

/// Starts `n` streams' work at one instant: each stream is held, and all are released together.
fn held_streams(sim: &SimBackend, devices: &[usize]) -> (Vec<StreamId>, Vec<GateId>, Vec<EventId>) {
    let streams: Vec<StreamId> = devices
        .iter()
        .map(|&d| sim.create_stream(d).unwrap())
        .collect();
    let gates = streams.iter().map(|&s| sim.hold(s).unwrap()).collect();
    let starts = streams.iter().map(|&s| sim.record(s).unwrap()).collect();
    (streams, gates, starts)
}

/// Releases the gates and returns each stream's GPU time from its start event to its end.
fn finish(
    sim: &SimBackend,
    streams: &[StreamId],
    gates: &[GateId],
    starts: &[EventId],
) -> Vec<f64> {
    let ends: Vec<EventId> = streams.iter().map(|&s| sim.record(s).unwrap()).collect();
    for &g in gates {
        sim.release(g).unwrap();
    }
    streams
        .iter()
        .zip(starts.iter().zip(&ends))
        .map(|(&s, (&a, &b))| {
            sim.synchronize(s).unwrap();
            sim.elapsed_us(a, b).unwrap()
        })
        .collect()
}

fn h100_port_bytes_per_us(sim: &SimBackend) -> f64 {
    let nv = sim.preset().nvlink.clone().unwrap();
    18.0 * nv.link_gbps * nv.efficiency * 1e3
}

#[test]
fn two_flows_out_of_one_nvlink_port_each_get_half() {
    let sim = h100();
    let len = 64 * MIB;
    for p in [1, 2] {
        sim.enable_peer_access(0, p).unwrap();
    }
    let src = sim.alloc(Memory::Device(0), len).unwrap();
    let d1 = sim.alloc(Memory::Device(1), len).unwrap();
    let d2 = sim.alloc(Memory::Device(2), len).unwrap();
    let (streams, gates, starts) = held_streams(&sim, &[0, 0]);
    sim.copy(
        streams[0],
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, d1, len),
    )
    .unwrap();
    sim.copy(
        streams[1],
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, d2, len),
    )
    .unwrap();
    let times = finish(&sim, &streams, &gates, &starts);
    let alpha = 2.0 + 0.8;
    let expected = alpha + len as f64 / (h100_port_bytes_per_us(&sim) / 2.0);
    for t in times {
        assert!(close(t, expected), "{t} vs {expected}");
    }
}

#[test]
fn flows_on_disjoint_routes_run_at_full_rate() {
    let sim = h100();
    let len = 64 * MIB;
    sim.enable_peer_access(0, 1).unwrap();
    sim.enable_peer_access(2, 3).unwrap();
    let bufs: Vec<BufferId> = (0..4)
        .map(|d| sim.alloc(Memory::Device(d), len).unwrap())
        .collect();
    let (streams, gates, starts) = held_streams(&sim, &[0, 2]);
    sim.copy(
        streams[0],
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(bufs[0], bufs[1], len),
    )
    .unwrap();
    sim.copy(
        streams[1],
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(bufs[2], bufs[3], len),
    )
    .unwrap();
    let times = finish(&sim, &streams, &gates, &starts);
    let expected = 2.8 + len as f64 / h100_port_bytes_per_us(&sim);
    for t in times {
        assert!(close(t, expected), "{t} vs {expected}");
    }
}

#[test]
fn both_directions_of_a_pair_do_not_share() {
    // Egress and ingress are separate resources: 0->1 and 1->0 together give twice one direction,
    // ~795 GB/s, as the 739-786 GB/s bidirectional figures for H100.
    let sim = h100();
    let len = 256 * MIB;
    sim.enable_peer_access(0, 1).unwrap();
    sim.enable_peer_access(1, 0).unwrap();
    let a = sim.alloc(Memory::Device(0), len).unwrap();
    let b = sim.alloc(Memory::Device(1), len).unwrap();
    let c = sim.alloc(Memory::Device(0), len).unwrap();
    let (streams, gates, starts) = held_streams(&sim, &[0, 1]);
    sim.copy(
        streams[0],
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(a, b, len),
    )
    .unwrap();
    sim.copy(
        streams[1],
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(b, c, len),
    )
    .unwrap();
    let times = finish(&sim, &streams, &gates, &starts);
    let both_gbps = 2.0 * len as f64 / times[0].max(times[1]) / 1e3;
    assert!((780.0..800.0).contains(&both_gbps), "{both_gbps}");
}

#[test]
fn a_capped_flow_leaves_the_rest_of_a_shared_link_to_the_other() {
    // A staged copy (capped at host.staged_gbps) and a device-to-host copy share GPU 0's PCIe
    // uplink: the staged one keeps its cap, the other gets the remainder.
    let mut preset = no_p2p_to_gpu_1();
    preset.host.staged_gbps = 10.0;
    let sim = SimBackend::from_preset(&preset);
    let len = 64 * MIB;
    let src = sim.alloc(Memory::Device(0), len).unwrap();
    let peer = sim.alloc(Memory::Device(1), len).unwrap();
    let host = sim
        .alloc(Memory::PinnedHost { numa_node: None }, len)
        .unwrap();
    let (streams, gates, starts) = held_streams(&sim, &[0, 0]);
    sim.copy(
        streams[0],
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, peer, len),
    )
    .unwrap();
    sim.copy(
        streams[1],
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(src, host, len),
    )
    .unwrap();
    let times = finish(&sim, &streams, &gates, &starts);
    let (staged_alpha, d2h_alpha) = (2.0 + 12.5, 2.0 + 1.0);
    let staged = staged_alpha + len as f64 / 10e3;
    assert!(close(times[0], staged), "{} vs {staged}", times[0]);
    // Alone at 55.4 GB/s until the staged copy's flow starts, then 55.4 - 10.
    let alone = (staged_alpha - d2h_alpha) * 55.4e3;
    let d2h = staged_alpha + (len as f64 - alone) / 45.4e3;
    assert!(close(times[1], d2h), "{} vs {d2h}", times[1]);
}

/// A DGX H100 whose GPU 1 runs MIG: no P2P between it and the others, on the same links.
fn no_p2p_to_gpu_1() -> Preset {
    let mut preset = Preset::load("dgx-h100").unwrap();
    preset.devices[1].mig_enabled = true;
    preset
}

#[test]
fn peer_copies_without_p2p_are_staged_through_the_host() {
    let sim = SimBackend::from_preset(&no_p2p_to_gpu_1());
    let len = 32 * MIB;
    let src = device_buffer(&sim, 0, len, 5);
    let dst = sim.alloc(Memory::Device(1), len).unwrap();
    let s = sim.create_stream(0).unwrap();
    let staged = timed(&sim, s, || {
        sim.copy(
            s,
            CopyMethod::CopyEngine,
            &BufferCopy::from_start(src, dst, len),
        )
        .unwrap()
    });
    assert_eq!(contents(&sim, dst), contents(&sim, src));
    let expected = 2.0 + 12.5 + len as f64 / 37e3;
    assert!(close(staged, expected), "{staged} vs {expected}");
    let p2p = sim.alloc(Memory::Device(2), len).unwrap();
    sim.enable_peer_access(0, 2).unwrap();
    let direct = timed(&sim, s, || {
        sim.copy(
            s,
            CopyMethod::CopyEngine,
            &BufferCopy::from_start(src, p2p, len),
        )
        .unwrap()
    });
    assert!(staged > 9.0 * direct, "{staged} vs {direct}");
    // A small staged copy costs what p2pBandwidthLatencyTest reports with P2P disabled: 14-19 µs.
    let back = sim.create_stream(1).unwrap();
    let small = timed(&sim, back, || {
        sim.copy(
            back,
            CopyMethod::CopyEngine,
            &BufferCopy::from_start(dst, src, 16),
        )
        .unwrap()
    });
    assert!((14.0..19.0).contains(&small), "{small}");
}

#[test]
fn peer_access_refused_across_sockets_or_to_a_mig_gpu_says_why() {
    let sim = open("pcie-4gpu-2socket");
    let err = sim.enable_peer_access(0, 2).unwrap_err();
    assert!(err.to_string().contains("different CPU sockets"), "{err}");
    let sim = SimBackend::from_preset(&no_p2p_to_gpu_1());
    let err = sim.enable_peer_access(0, 1).unwrap_err();
    assert!(err.to_string().contains("MIG"), "{err}");
}

#[test]
fn an_sm_copy_pays_a_kernel_launch_and_reaches_less_than_a_copy_engine() {
    let sim = h100();
    let len = 64 * MIB;
    let src = device_buffer(&sim, 0, len, 4);
    let dst = sim.alloc(Memory::Device(1), len).unwrap();
    let s = sim.create_stream(1).unwrap(); // pull: the destination's kernel reads GPU 0
    sim.enable_peer_access(1, 0).unwrap();
    let before = sim.host_time_us();
    let sm = timed(&sim, s, || {
        sim.copy(
            s,
            CopyMethod::SmKernel,
            &BufferCopy::from_start(src, dst, len),
        )
        .unwrap()
    });
    assert_eq!(contents(&sim, dst), contents(&sim, src));
    let p = sim.preset();
    let expected =
        p.costs.kernel_setup_us + 0.8 + len as f64 / (0.75 * h100_port_bytes_per_us(&sim));
    assert!(close(sm, expected), "{sm} vs {expected}");
    let issued =
        p.costs.kernel_issue_us * 2.0 + p.costs.event_issue_us * 2.0 + p.costs.kernel_issue_us;
    assert!(sim.host_time_us() - before > issued);
}

#[test]
fn host_copies_use_the_gpu_pcie_link() {
    let sim = h100();
    let len = 64 * MIB;
    let host = sim
        .alloc(Memory::PinnedHost { numa_node: Some(0) }, len)
        .unwrap();
    sim.write(host, 0, &pattern::bytes(3, len)).unwrap();
    let dev = sim.alloc(Memory::Device(0), len).unwrap();
    let s = sim.create_stream(0).unwrap();
    let h2d = timed(&sim, s, || {
        sim.copy(
            s,
            CopyMethod::CopyEngine,
            &BufferCopy::from_start(host, dev, len),
        )
        .unwrap()
    });
    assert_eq!(contents(&sim, dev), pattern::bytes(3, len));
    let expected = 3.0 + len as f64 / 55.4e3;
    assert!(close(h2d, expected), "{h2d} vs {expected}");
    assert!(sim
        .alloc(Memory::PinnedHost { numa_node: Some(5) }, 8)
        .is_err());
}

#[test]
fn host_copies_both_ways_over_one_gpus_link_keep_the_presets_fraction() {
    // h200-pair: a copy up from GPU 0 and one down to GPU 0 at once each keep
    // pcie.both_ways_fraction of the link; two copies up from different GPUs do not slow.
    let sim = open("h200-pair");
    let fraction = sim
        .preset()
        .pcie
        .both_ways_fraction
        .expect("h200-pair has one");
    let link_bytes_per_us = sim.preset().pcie.host_gbps * 1e3;
    let len = 64 * MIB;
    let host = |seed| {
        let b = sim
            .alloc(Memory::PinnedHost { numa_node: None }, len)
            .unwrap();
        sim.write(b, 0, &pattern::bytes(seed, len)).unwrap();
        b
    };
    let (up, down) = (host(1), host(2));
    let gpu0 = device_buffer(&sim, 0, len, 3);
    let gpu1 = device_buffer(&sim, 1, len, 4);
    let pair = |first: BufferCopy, second: BufferCopy, devices: [usize; 2]| {
        let (streams, gates, starts) = held_streams(&sim, &devices);
        for (&s, c) in streams.iter().zip([first, second]) {
            sim.copy(s, CopyMethod::CopyEngine, &c).unwrap();
        }
        finish(&sim, &streams, &gates, &starts)
    };
    let alpha = sim.preset().costs.copy_setup_us + sim.preset().pcie.latency_us;
    let both = pair(
        BufferCopy::from_start(gpu0, up, len),
        BufferCopy::from_start(down, gpu0, len),
        [0, 0],
    );
    let slowed = alpha + len as f64 / (fraction * link_bytes_per_us);
    for t in both {
        assert!(close(t, slowed), "{t} vs {slowed}");
    }
    assert_eq!(contents(&sim, up), pattern::bytes(3, len));
    let one_way = pair(
        BufferCopy::from_start(gpu0, up, len),
        BufferCopy::from_start(gpu1, down, len),
        [0, 1],
    );
    let alone = alpha + len as f64 / link_bytes_per_us;
    for t in one_way {
        assert!(close(t, alone), "{t} vs {alone}");
    }
}

#[test]
fn graph_replay_repeats_the_captured_copies_with_a_lower_per_copy_cost() {
    let sim = h100();
    let n = 100;
    let src = device_buffer(&sim, 0, n * 64, 8);
    let dst = sim.alloc(Memory::Device(0), n * 64).unwrap();
    let s = sim.create_stream(0).unwrap();
    let copies: Vec<BufferCopy> = (0..n)
        .map(|i| BufferCopy {
            dst,
            dst_offset: i * 64,
            src,
            src_offset: (n - 1 - i) * 64,
            len: 64,
        })
        .collect();
    let stream_us = timed(&sim, s, || {
        for c in &copies {
            sim.copy(s, CopyMethod::CopyEngine, c).unwrap();
        }
    });
    sim.begin_capture(s).unwrap();
    for c in &copies {
        sim.copy(s, CopyMethod::CopyEngine, c).unwrap();
    }
    let graph = sim.end_capture(s).unwrap();
    sim.write(dst, 0, &vec![0; n * 64]).unwrap();
    let before = sim.host_time_us();
    let graph_us = timed(&sim, s, || sim.replay(graph, s).unwrap());
    let host_cost = sim.host_time_us() - before;
    let (a, b) = (contents(&sim, src), contents(&sim, dst));
    for i in 0..n {
        assert_eq!(b[i * 64..(i + 1) * 64], a[(n - 1 - i) * 64..(n - i) * 64]);
    }
    let costs = &sim.preset().costs;
    // Back-to-back small copies on a stream cost the copy setup each; replayed, the graph node's.
    assert!(
        close(stream_us / n as f64, costs.copy_setup_us + 64.0 / 1500e3),
        "{stream_us}"
    );
    assert!(
        close(graph_us / n as f64, costs.graph_node_us + 64.0 / 1500e3),
        "{graph_us}"
    );
    // One CPU cost for the whole replay instead of one per copy.
    assert!(
        host_cost < 2.0 * costs.copy_issue_us + graph_us + 10.0,
        "{host_cost}"
    );
}

#[test]
fn pointer_chase_follows_the_chain_and_takes_steps_times_load_latency() {
    let sim = h100();
    let elements = 1000usize;
    // A single cycle visiting every element: i -> (i * 7 + 3) mod 1000 (7 is coprime to 1000).
    let chain: Vec<u8> = (0..elements)
        .flat_map(|i| (((i * 7 + 3) % elements) as u64).to_le_bytes())
        .collect();
    let buf = sim.alloc(Memory::Device(1), chain.len()).unwrap();
    sim.write(buf, 0, &chain).unwrap();
    let result = sim.alloc(Memory::Device(0), 8).unwrap();
    let s = sim.create_stream(0).unwrap();
    sim.enable_peer_access(0, 1).unwrap();
    for steps in [0u32, 1, 999, 1000, 12_345, 4_000_000] {
        let us = timed(&sim, s, || {
            sim.pointer_chase(s, buf, steps, result).unwrap()
        });
        let mut expected = 0usize;
        for _ in 0..steps {
            expected = (expected * 7 + 3) % elements;
        }
        let mut out = [0u8; 8];
        sim.read(result, 0, &mut out).unwrap();
        assert_eq!(u64::from_le_bytes(out), expected as u64, "{steps} steps");
        let want = sim.preset().costs.kernel_setup_us + steps as f64 * 0.826;
        assert!(close(us, want), "{us} vs {want}");
    }
}

#[test]
fn a_walked_chain_is_served_from_the_caches_until_traffic_of_its_size_evicts_it() {
    // h200-pair: 1013 ns per load over NVLink from memory, 871 through a chain the caches hold.
    let sim = SimBackend::open("h200-pair").unwrap();
    sim.enable_peer_access(0, 1).unwrap();
    let len = 64 << 10;
    let nodes = len / 128;
    let chain: Vec<u8> = (0..nodes)
        .flat_map(|n| {
            let next = ((n + 1) % nodes * 16) as u64;
            let mut node = [0u8; 128];
            node[..8].copy_from_slice(&next.to_le_bytes());
            node
        })
        .collect();
    let on_1 = sim.alloc(Memory::Device(1), len).unwrap();
    sim.write(on_1, 0, &chain).unwrap();
    let result = sim.alloc(Memory::Device(0), 8).unwrap();
    let scratch = [0, 1].map(|gpu| sim.alloc(Memory::Device(gpu), len).unwrap());
    let s = sim.create_stream(0).unwrap();
    let steps = 1000;
    let per_load_ns = |sim: &SimBackend| {
        let us = timed(sim, s, || {
            sim.pointer_chase(s, on_1, steps, result).unwrap()
        });
        (us - sim.preset().costs.kernel_setup_us) / f64::from(steps) * 1e3
    };
    // A copy of `len` bytes within GPU `gpu`: twice `len` through its memory (read and written).
    let copy = |gpu: usize, len: usize| {
        let c = BufferCopy {
            dst: scratch[gpu],
            dst_offset: len,
            src: scratch[gpu],
            src_offset: 0,
            len,
        };
        sim.copy(s, CopyMethod::CopyEngine, &c).unwrap();
        sim.synchronize(s).unwrap();
    };
    assert!(close(per_load_ns(&sim), 1013.0), "first walk: from memory");
    assert!(close(per_load_ns(&sim), 871.0), "walked again: cached");
    copy(0, len / 2); // GPU 0's memory: not where the chain is
    copy(1, len / 8); // a quarter of the chain's size through GPU 1's memory
    assert!(close(per_load_ns(&sim), 871.0), "still cached");
    // That walk cached it afresh: its whole size must move again, in as many copies as it takes.
    copy(1, len / 4);
    copy(1, len / 4);
    assert!(
        close(per_load_ns(&sim), 1013.0),
        "its size moved through GPU 1: evicted"
    );
    assert!(close(per_load_ns(&sim), 871.0));
    sim.write(on_1, 0, &chain[..8]).unwrap();
    assert!(close(per_load_ns(&sim), 1013.0), "written: evicted");
    // A captured chase leaves nothing cached, and replays keep the pace of its capture.
    sim.patterns()
        .fill(
            &BufferRange {
                buffer: scratch[1],
                offset: 0,
                len,
            },
            1,
        )
        .unwrap();
    sim.begin_capture(s).unwrap();
    sim.pointer_chase(s, on_1, steps, result).unwrap();
    let graph = sim.end_capture(s).unwrap();
    assert!(
        close(per_load_ns(&sim), 1013.0),
        "evicted by the pattern fill"
    );
    let replayed = timed(&sim, s, || sim.replay(graph, s).unwrap());
    let node_us = sim.preset().costs.graph_node_us;
    assert!(close((replayed - node_us) / f64::from(steps) * 1e3, 1013.0));
}

#[test]
fn a_wild_chain_index_faults_at_the_next_synchronisation() {
    let sim = h100();
    let buf = sim.alloc(Memory::Device(0), 16).unwrap();
    sim.write(buf, 0, &[1, 0, 0, 0, 0, 0, 0, 0, 99, 0, 0, 0, 0, 0, 0, 0])
        .unwrap();
    let result = sim.alloc(Memory::Device(0), 8).unwrap();
    let s = sim.create_stream(0).unwrap();
    sim.pointer_chase(s, buf, 5, result).unwrap();
    let err = sim.synchronize(s).unwrap_err();
    assert!(
        err.to_string().contains("holds 99, outside its 2 elements"),
        "{err}"
    );
}

#[test]
fn ping_pong_writes_the_flags_and_takes_rounds_of_round_trips() {
    let sim = h100();
    let ping_flag = sim.alloc(Memory::Device(0), 4).unwrap();
    let pong_flag = sim.alloc(Memory::Device(1), 4).unwrap();
    let ping = sim.create_stream(0).unwrap();
    let pong = sim.create_stream(1).unwrap();
    sim.enable_peer_access(0, 1).unwrap();
    sim.enable_peer_access(1, 0).unwrap();
    let rounds = 1000;
    let us = timed(&sim, ping, || {
        sim.ping_pong(ping, pong, ping_flag, pong_flag, rounds)
            .unwrap()
    });
    sim.synchronize(pong).unwrap();
    for flag in [ping_flag, pong_flag] {
        assert_eq!(contents(&sim, flag), rounds.to_le_bytes());
    }
    let want = sim.preset().costs.kernel_setup_us + rounds as f64 * 2.0 * 2.35;
    assert!(close(us, want), "{us} vs {want}");
}

#[test]
fn a_forgotten_release_times_out_instead_of_hanging() {
    let sim = h100();
    let s = sim.create_stream(0).unwrap();
    sim.hold(s).unwrap();
    sim.synchronize(s).unwrap();
    assert!(sim.host_time_us() >= scheduler::HOLD_TIMEOUT_US);
}

mod random_copies {
    use super::*;
    use proptest::prelude::*;

    const BUF: usize = 3 * MIB;

    /// One random copy: buffer and stream choices are indices, folded into range when used.
    #[derive(Clone, Debug)]
    struct Step {
        src: usize,
        dst: usize,
        stream: usize,
        sm: bool,
        src_offset: usize,
        dst_offset: usize,
        len: usize,
        sync_first: bool,
    }

    fn step() -> impl Strategy<Value = Step> {
        (
            (0usize..16, 0usize..16, 0usize..16, any::<bool>()),
            (
                0usize..BUF,
                0usize..BUF,
                0usize..=2 * MIB,
                prop::bool::weighted(0.2),
            ),
        )
            .prop_map(
                |((src, dst, stream, sm), (so, d_o, len, sync_first))| Step {
                    src,
                    dst,
                    stream,
                    sm,
                    src_offset: so,
                    dst_offset: d_o,
                    len,
                    sync_first,
                },
            )
    }

    /// Copies on many streams of a DGX-1 (NVLink, staged and host routes) agree byte for byte with
    /// a model that applies them in order. Copies that could race with one in flight on another
    /// stream are preceded by a full synchronisation, so that the order is defined.
    fn check(steps: &[Step]) {
        let sim = open("dgx1-v100");
        let t = sim.topology().clone();
        for p in t.pairs.iter().filter(|p| p.p2p) {
            sim.enable_peer_access(p.src, p.dst).unwrap();
        }
        let mut buffers = Vec::new();
        let mut model = Vec::new();
        // Each buffer a different window of one pattern: distinct contents at memcpy speed.
        let base = pattern::bytes(0, BUF + 64);
        for (i, memory) in (0..8)
            .map(Memory::Device)
            .chain([
                Memory::PinnedHost { numa_node: Some(1) },
                Memory::Managed(3),
            ])
            .enumerate()
        {
            let b = sim.alloc(memory, BUF).unwrap();
            let bytes = base[i * 7..i * 7 + BUF].to_vec();
            sim.write(b, 0, &bytes).unwrap();
            buffers.push((b, memory));
            model.push(bytes);
        }
        let streams: Vec<StreamId> = (0..8)
            .flat_map(|d| [d, d])
            .map(|d| sim.create_stream(d).unwrap())
            .collect();
        // Ranges touched since the last full synchronisation, with the stream that touched them.
        let mut in_flight: Vec<(usize, usize, std::ops::Range<usize>, bool)> = Vec::new();
        let sync_all = |in_flight: &mut Vec<_>| {
            for &s in &streams {
                sim.synchronize(s).unwrap();
            }
            in_flight.clear();
        };
        for st in steps {
            let (src, dst) = (st.src % buffers.len(), st.dst % buffers.len());
            let len = st.len.min(BUF - st.src_offset).min(BUF - st.dst_offset);
            let (so, d_o) = (st.src_offset, st.dst_offset);
            let stream = st.stream;
            let gpu = stream / 2;
            let reads = so..so + len;
            let writes = d_o..d_o + len;
            let overlap = |a: &std::ops::Range<usize>, b: &std::ops::Range<usize>| {
                a.start < b.end && b.start < a.end
            };
            let races = in_flight.iter().any(|(s, buf, range, written)| {
                *s != stream
                    && ((*buf == dst && overlap(range, &writes))
                        || (*buf == src && *written && overlap(range, &reads)))
            });
            if races || st.sync_first {
                sync_all(&mut in_flight);
            }
            let method = if st.sm {
                CopyMethod::SmKernel
            } else {
                CopyMethod::CopyEngine
            };
            let reachable = |m: Memory| match m {
                Memory::Device(d) => d == gpu || t.pair(gpu, d).unwrap().p2p,
                // Mapped for every GPU, or moved by the driver to whichever touches it.
                Memory::PinnedHost { .. } | Memory::Managed(_) => true,
            };
            let c = BufferCopy {
                dst: buffers[dst].0,
                dst_offset: d_o,
                src: buffers[src].0,
                src_offset: so,
                len,
            };
            let result = sim.copy(streams[stream], method, &c);
            if src == dst && len > 0 && overlap(&reads, &writes) {
                assert!(result.is_err(), "a copy onto its own source must fail");
                continue;
            }
            if st.sm && !(reachable(buffers[src].1) && reachable(buffers[dst].1)) {
                assert!(
                    result.is_err(),
                    "an SM copy touching a GPU without P2P must fail"
                );
                continue;
            }
            result.unwrap();
            let moved = model[src][reads.clone()].to_vec();
            model[dst][writes.clone()].copy_from_slice(&moved);
            in_flight.push((stream, src, reads, false));
            in_flight.push((stream, dst, writes, true));
        }
        sync_all(&mut in_flight);
        for (i, (b, _)) in buffers.iter().enumerate() {
            let got = contents(&sim, *b);
            if got != model[i] {
                let at = got.iter().zip(&model[i]).position(|(x, y)| x != y);
                panic!("buffer {i} differs from the model first at byte {at:?}");
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

        #[test]
        fn random_copies_match_a_reference_model(steps in prop::collection::vec(step(), 1..40)) {
            check(&steps);
        }
    }
}

#[test]
fn work_cannot_start_before_it_is_issued_so_small_ops_are_issue_bound_without_a_hold() {
    let sim = h100();
    let src = device_buffer(&sim, 0, 64, 1);
    let dst = sim.alloc(Memory::Device(0), 64).unwrap();
    let s = sim.create_stream(0).unwrap();
    let n = 50;
    let kernels = |sim: &SimBackend| {
        for _ in 0..n {
            sim.copy(
                s,
                CopyMethod::SmKernel,
                &BufferCopy::from_start(src, dst, 64),
            )
            .unwrap();
        }
    };
    let start = sim.record(s).unwrap();
    kernels(&sim);
    let end = sim.record(s).unwrap();
    sim.synchronize(s).unwrap();
    let issue_bound = sim.elapsed_us(start, end).unwrap() / n as f64;
    let held = timed(&sim, s, || kernels(&sim)) / n as f64;
    let costs = &sim.preset().costs;
    assert!(
        (issue_bound - costs.kernel_issue_us).abs() < 0.05,
        "{issue_bound}"
    );
    assert!((held - costs.kernel_setup_us).abs() < 0.05, "{held}");
}

#[test]
fn gpus_under_one_pcie_switch_share_its_uplink_but_not_their_p2p_path() {
    let sim = open("pcie-2gpu-switch");
    let len = 32 * MIB;
    sim.enable_peer_access(0, 1).unwrap();
    let a = sim.alloc(Memory::Device(0), len).unwrap();
    let b = sim.alloc(Memory::Device(1), len).unwrap();
    let host = sim
        .alloc(Memory::PinnedHost { numa_node: None }, 2 * len)
        .unwrap();
    let s = sim.create_stream(0).unwrap();
    let p2p = timed(&sim, s, || {
        sim.copy(
            s,
            CopyMethod::CopyEngine,
            &BufferCopy::from_start(a, b, len),
        )
        .unwrap()
    });
    let expected = 3.0 + len as f64 / 26e3;
    assert!(close(p2p, expected), "{p2p} vs {expected}");
    // Both GPUs write to the host at once: the switch's one uplink gives each half.
    let (streams, gates, starts) = held_streams(&sim, &[0, 1]);
    let mut up = BufferCopy::from_start(a, host, len);
    sim.copy(streams[0], CopyMethod::CopyEngine, &up).unwrap();
    up.src = b;
    up.dst_offset = len;
    sim.copy(streams[1], CopyMethod::CopyEngine, &up).unwrap();
    let times = finish(&sim, &streams, &gates, &starts);
    let shared = 3.0 + len as f64 / 13e3;
    for t in times {
        assert!(close(t, shared), "{t} vs {shared}");
    }
}

#[test]
fn dgx1_nv2_pairs_are_twice_nv1_and_sys_pairs_are_staged() {
    let sim = open("dgx1-v100");
    let len = 16 * MIB;
    let bufs: Vec<BufferId> = (0..8)
        .map(|d| sim.alloc(Memory::Device(d), len).unwrap())
        .collect();
    let s = sim.create_stream(0).unwrap();
    let rate = |peer: usize| {
        let _ = sim.enable_peer_access(0, peer);
        let us = timed(&sim, s, || {
            sim.copy(
                s,
                CopyMethod::CopyEngine,
                &BufferCopy::from_start(bufs[0], bufs[peer], len),
            )
            .unwrap()
        });
        len as f64 / us / 1e3
    };
    let (nv1, nv2, sys) = (rate(1), rate(3), rate(5));
    assert!((23.0..24.0).contains(&nv1), "{nv1}");
    assert!((45.0..48.0).contains(&nv2), "{nv2}");
    assert!(sys < 9.0, "{sys}");
    assert!(sim.enable_peer_access(0, 5).is_err());
}

/// 1000 messages of `len` bytes at odd offsets, from `src` into `dst`.
fn scattered_messages(src: BufferId, dst: BufferId, len: usize) -> Vec<BufferCopy> {
    (0..1000)
        .map(|i| BufferCopy {
            dst,
            dst_offset: i * (len + 3) + 1,
            src,
            src_offset: (999 - i) * (len + 5) + 7,
            len,
        })
        .collect()
}

#[test]
fn copy_batch_costs_one_launch_not_one_per_message() {
    let sim = h100();
    let src = device_buffer(&sim, 0, 1000 * (4096 + 5) + 8, 3);
    let dst = device_buffer(&sim, 0, 1000 * (4096 + 3) + 2, 4);
    let stream = sim.create_stream(0).unwrap();
    let messages = scattered_messages(src, dst, 4096);

    let t0 = sim.host_time_us();
    for m in &messages {
        sim.copy(stream, CopyMethod::CopyEngine, m).unwrap();
    }
    sim.synchronize(stream).unwrap();
    let separate = sim.host_time_us() - t0;

    let t0 = sim.host_time_us();
    sim.copy_batch(stream, &messages).unwrap();
    sim.synchronize(stream).unwrap();
    let batched = sim.host_time_us() - t0;
    assert!(
        batched * 20.0 < separate,
        "batch {batched} µs vs separate {separate} µs end to end"
    );
    // One driver call for copy-engine copies, priced per copy as measured on the H200.
    let t0 = sim.host_time_us();
    sim.memcpy_batch(stream, &messages).unwrap();
    sim.synchronize(stream).unwrap();
    let memcpy_batch = sim.host_time_us() - t0;
    assert!(
        (memcpy_batch - separate).abs() < 0.01 * separate,
        "memcpy_batch {memcpy_batch} µs vs separate {separate} µs"
    );
}

#[test]
fn an_allocation_the_host_cannot_back_is_refused_with_a_sentence() {
    let Some(host_free) = crate::backend::host_memory::free() else {
        return; // not Linux: nothing to check against
    };
    // GPUs far larger than this host: the host's memory is the limit, not the simulated GPU's.
    let mut preset = Preset::load("dgx-h100").unwrap();
    preset.gpu.memory_mib = 1 << 40;
    for device in &mut preset.devices {
        device.memory_mib = None;
    }
    let sim = SimBackend::from_preset(&preset);
    let free_before = sim.free_memory(0).unwrap();
    let asked = host_free as usize + (1 << 30);
    for memory in [Memory::Device(0), Memory::PinnedHost { numa_node: None }] {
        let err = sim.alloc(memory, asked).unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
        assert_eq!(err.exit_code(), 1);
        let text = err.to_string();
        assert!(text.starts_with("out of memory on the host"), "{text}");
        assert!(!text.contains('\n'), "{text}");
    }
    assert_eq!(sim.free_memory(0).unwrap(), free_before, "nothing taken");
    // What the store holds counts as taken, written or not: two halves of more than is free cannot
    // both be had, although neither is written.
    let half = host_free as usize / 2 + (64 << 20);
    let first = sim.alloc(Memory::Device(0), half).unwrap();
    let second = sim.alloc(Memory::Device(1), half).unwrap_err();
    assert!(matches!(second, Error::OutOfMemory { .. }), "{second:?}");
    sim.free(first).unwrap();
}

#[test]
fn no_copy_reaches_another_hosts_gpu() {
    let sim = SimBackend::open("2x-pcie-4gpu-2socket").unwrap();
    let (a, b) = (
        sim.alloc(Memory::Device(0), 4096).unwrap(),
        sim.alloc(Memory::Device(4), 4096).unwrap(),
    );
    let stream = sim.create_stream(0).unwrap();
    let copy = BufferCopy::from_start(a, b, 4096);
    let err = sim.copy(stream, CopyMethod::CopyEngine, &copy).unwrap_err();
    assert_eq!(err.exit_code(), 2);
    assert!(
        err.to_string().contains("different simulated hosts"),
        "{err}"
    );
    let err = sim.memcpy_batch(stream, &[copy]).unwrap_err();
    assert!(
        err.to_string().contains("different simulated hosts"),
        "{err}"
    );
    let err = sim.enable_peer_access(0, 4).unwrap_err();
    assert!(err.to_string().contains("different hosts"), "{err}");
    // Within the host, as before.
    let c = sim.alloc(Memory::Device(1), 4096).unwrap();
    sim.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(a, c, 4096),
    )
    .unwrap_err();
    sim.enable_peer_access(0, 1).unwrap();
    sim.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(a, c, 4096),
    )
    .unwrap();
    sim.synchronize(stream).unwrap();
}

#[test]
fn the_simulator_lends_its_own_device_buffers_and_a_stream_per_handle() {
    let sim = h100();
    let refused = |e: crate::Error| e.to_string();
    let owner = sim.alloc(Memory::Device(2), 64).unwrap();
    let data = pattern::bytes(7, 64);
    sim.write(owner, 0, &data).unwrap();
    let address = sim.sharing().device_address(owner).unwrap();
    let borrowed = sim.borrow_memory(2, address, 48).unwrap();
    assert_eq!(sim.len(borrowed).unwrap(), 48);
    // One handle per (GPU, CUDA stream handle): borrowing it again finds the same stream.
    let stream = sim.borrow_stream(2, 0x1234).unwrap();
    let again = sim.borrow_stream(2, 0x1234).unwrap();
    let out = sim.alloc(Memory::Device(2), 48).unwrap();
    sim.copy(
        stream,
        CopyMethod::CopyEngine,
        &BufferCopy::from_start(borrowed, out, 48),
    )
    .unwrap();
    // Work queued on a borrowed handle runs after the handle is forgotten, as on a GPU.
    sim.free(borrowed).unwrap();
    sim.synchronize(again).unwrap();
    let mut moved = vec![0; 48];
    sim.read(out, 0, &mut moved).unwrap();
    assert_eq!(moved, data[..48]);
    // The owner's buffer outlives a borrowed handle, and cannot go before it.
    let borrowed = sim.borrow_memory(2, address, 64).unwrap();
    assert!(refused(sim.free(owner).unwrap_err()).contains("borrows"));
    sim.free(borrowed).unwrap();
    sim.free(owner).unwrap();

    let other = sim.alloc(Memory::Device(1), 16).unwrap();
    let at = sim.sharing().device_address(other).unwrap();
    assert!(refused(sim.borrow_memory(2, at, 16).unwrap_err()).contains("is not GPU 2's"));
    assert!(refused(sim.borrow_memory(1, at, 17).unwrap_err()).contains("run past the end"));
    assert!(refused(sim.borrow_memory(1, at + 8, 8).unwrap_err())
        .starts_with("no simulated buffer starts at"));
    assert!(
        refused(sim.borrow_memory(1, 0x7f00_0000_0000, 16).unwrap_err())
            .starts_with("no simulated buffer starts at")
    );
    let host = sim
        .alloc(Memory::PinnedHost { numa_node: None }, 16)
        .unwrap();
    assert!(refused(sim.sharing().device_address(host).unwrap_err()).contains("not device memory"));
    // The checked layer's own checks come first.
    assert!(refused(sim.borrow_memory(9, 0x1000, 16).unwrap_err()).contains("GPU 9"));
    assert!(refused(sim.borrow_stream(9, 0).unwrap_err()).contains("GPU 9"));
    assert!(refused(sim.borrow_memory(0, 0x1000, 0).unwrap_err()).contains("0 bytes"));
}

/// A preset an interrupted `tune` wrote says partial, and the simulator opening it says so.
#[test]
fn a_partial_preset_is_noted_when_opened() {
    let mut preset = Preset::load("pcie-2gpu-switch").unwrap();
    assert!(SimBackend::from_preset(&preset).notices().is_empty());
    preset.partial = true;
    let notices = SimBackend::from_preset(&preset).notices();
    assert_eq!(notices.len(), 1, "{notices:?}");
    assert!(notices[0].contains("partial"), "{notices:?}");
    let text = serde_json::to_string(&preset).unwrap();
    assert!(Preset::parse(&text, "test").unwrap().partial);
}
