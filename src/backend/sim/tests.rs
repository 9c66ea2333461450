//! Behaviour of the simulated backend through the `Backend` trait.

use super::*;

const MIB: usize = 1 << 20;

fn h100() -> SimBackend {
    SimBackend::open("dgx-h100").unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * b.abs().max(1.0)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2654435761).to_le_bytes()[1] ^ seed)
        .collect()
}

fn device_buffer(sim: &SimBackend, device: usize, bytes: usize, seed: u8) -> BufferId {
    let b = sim.alloc(Memory::Device(device), bytes).unwrap();
    sim.write(b, 0, &pattern(bytes, seed)).unwrap();
    b
}

fn contents(sim: &SimBackend, buffer: BufferId) -> Vec<u8> {
    let mut out = vec![0; sim.len(buffer).unwrap()];
    sim.read(buffer, 0, &mut out).unwrap();
    out
}

fn whole(src: BufferId, dst: BufferId, len: usize) -> Copy {
    Copy {
        dst,
        dst_offset: 0,
        src,
        src_offset: 0,
        len,
    }
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
    assert_eq!(sim.source(), "sim:dgx-h100");
    assert!(sim.topology().is_simulated());
    assert_eq!(sim.topology().devices.len(), 8);
}

#[test]
fn a_peer_copy_moves_the_bytes() {
    let sim = h100();
    sim.enable_peer_access(0, 1).unwrap();
    let src = device_buffer(&sim, 0, 3 * MIB + 5, 7);
    let dst = device_buffer(&sim, 1, 3 * MIB + 5, 0);
    let s = sim.create_stream(0).unwrap();
    let c = Copy {
        dst,
        dst_offset: 3,
        src,
        src_offset: 1,
        len: 2 * MIB,
    };
    sim.copy(s, CopyMethod::CopyEngine, &c).unwrap();
    sim.synchronize(s).unwrap();
    let (a, b) = (contents(&sim, src), contents(&sim, dst));
    assert_eq!(&b[3..3 + 2 * MIB], &a[1..1 + 2 * MIB]);
    assert_eq!(&b[..3], &pattern(3 * MIB + 5, 0)[..3]);
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
        sim.copy(s, CopyMethod::CopyEngine, &whole(src, dst, len))
            .unwrap()
    });
    let p = sim.fabric.preset();
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
    let costs = sim.fabric.preset().costs.clone();
    let src = device_buffer(&sim, 0, 64 * MIB, 1);
    let dst = sim.alloc(Memory::Device(0), 64 * MIB).unwrap();
    let s = sim.create_stream(0).unwrap();
    assert_eq!(sim.host_time_us(), 0.0);
    sim.copy(s, CopyMethod::CopyEngine, &whole(src, dst, 64 * MIB))
        .unwrap();
    assert_eq!(sim.host_time_us(), costs.copy_issue_us);
    // Not done yet: the host did not wait, so the destination still holds zeros.
    assert!(contents(&sim, dst).iter().all(|&b| b == 0));
    sim.synchronize(s).unwrap();
    let local_rate = sim.fabric.preset().gpu.local_copy_gbps * 1e3;
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
fn hold_keeps_the_stream_until_release() {
    let sim = h100();
    let src = device_buffer(&sim, 0, 4096, 3);
    let dst = sim.alloc(Memory::Device(0), 4096).unwrap();
    let s = sim.create_stream(0).unwrap();
    let gate = sim.hold(s).unwrap();
    sim.copy(s, CopyMethod::CopyEngine, &whole(src, dst, 4096))
        .unwrap();
    let done = sim.record(s).unwrap();
    // Far later on the host clock, the copy has still not run.
    for _ in 0..100 {
        sim.record(s).unwrap();
    }
    assert!(!sim.event_done(done).unwrap());
    assert!(contents(&sim, dst).iter().all(|&b| b == 0));
    let released_at = sim.host_time_us();
    sim.release(gate).unwrap();
    sim.event_synchronize(done).unwrap();
    assert!(sim.event_done(done).unwrap());
    assert_eq!(contents(&sim, dst), contents(&sim, src));
    assert!(sim.host_time_us() > released_at);
}

#[test]
fn events_time_gpu_work_and_must_be_complete_and_on_one_device() {
    let sim = h100();
    let s0 = sim.create_stream(0).unwrap();
    let s1 = sim.create_stream(1).unwrap();
    let gate = sim.hold(s0).unwrap();
    let a = sim.record(s0).unwrap();
    let b = sim.record(s0).unwrap();
    assert!(sim.elapsed_us(a, b).is_err(), "not complete yet");
    sim.release(gate).unwrap();
    sim.synchronize(s0).unwrap();
    assert_eq!(sim.elapsed_us(a, b).unwrap(), 0.0);
    let c = sim.record(s1).unwrap();
    sim.synchronize(s1).unwrap();
    let err = sim.elapsed_us(a, c).unwrap_err();
    assert!(err.to_string().contains("different GPUs"), "{err}");
    sim.destroy_event(a).unwrap();
    assert!(sim.elapsed_us(a, b).is_err());
}

#[test]
fn wait_orders_work_across_streams() {
    let sim = h100();
    let len = 16 * MIB;
    let src = device_buffer(&sim, 0, len, 9);
    let mid = sim.alloc(Memory::Device(0), len).unwrap();
    let dst = sim.alloc(Memory::Device(0), len).unwrap();
    let (s0, s1) = (sim.create_stream(0).unwrap(), sim.create_stream(0).unwrap());
    sim.copy(s0, CopyMethod::CopyEngine, &whole(src, mid, len))
        .unwrap();
    let e = sim.record(s0).unwrap();
    sim.wait(s1, e).unwrap();
    sim.copy(s1, CopyMethod::CopyEngine, &whole(mid, dst, len))
        .unwrap();
    sim.synchronize(s1).unwrap();
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
    sim.copy(s0, CopyMethod::CopyEngine, &whole(src, mid, len))
        .unwrap();
    sim.copy(s1, CopyMethod::CopyEngine, &whole(mid, dst, len))
        .unwrap();
    sim.synchronize(s0).unwrap();
    sim.synchronize(s1).unwrap();
    assert!(contents(&sim, dst).iter().all(|&b| b == 0));
}

#[test]
fn out_of_range_copies_and_unknown_handles_are_errors() {
    let sim = h100();
    let a = sim.alloc(Memory::Device(0), 100).unwrap();
    let b = sim.alloc(Memory::Device(0), 100).unwrap();
    let s = sim.create_stream(0).unwrap();
    let mut c = whole(a, b, 100);
    c.dst_offset = 1;
    assert!(sim.copy(s, CopyMethod::CopyEngine, &c).is_err());
    c.dst_offset = usize::MAX;
    assert!(sim.copy(s, CopyMethod::CopyEngine, &c).is_err());
    assert!(sim
        .copy(StreamId(99), CopyMethod::CopyEngine, &whole(a, b, 1))
        .is_err());
    assert!(sim.write(a, 99, &[1, 2]).is_err());
    assert!(sim.create_stream(8).is_err());
    sim.free(a).unwrap();
    assert!(sim.len(a).is_err());
    assert!(sim.free(a).is_err());
}

#[test]
fn allocation_beyond_free_memory_fails_and_free_returns_it() {
    let sim = h100();
    let total = sim.free_memory(0).unwrap();
    assert_eq!(total, 81559 << 20);
    let b = sim.alloc(Memory::Device(0), MIB).unwrap();
    assert_eq!(sim.free_memory(0).unwrap(), total - MIB as u64);
    assert!(sim.alloc(Memory::Device(0), total as usize).is_err());
    sim.free(b).unwrap();
    assert_eq!(sim.free_memory(0).unwrap(), total);
    assert!(sim.alloc(Memory::Device(0), 0).is_err());
}

#[test]
fn freeing_a_buffer_with_queued_work_is_refused() {
    let sim = h100();
    let a = sim.alloc(Memory::Device(0), MIB).unwrap();
    let b = sim.alloc(Memory::Device(0), MIB).unwrap();
    let s = sim.create_stream(0).unwrap();
    let gate = sim.hold(s).unwrap();
    sim.copy(s, CopyMethod::CopyEngine, &whole(a, b, MIB))
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
                    &whole(bufs[d], bufs[peer], len),
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
