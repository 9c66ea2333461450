//! Tests of the real-GPU backend. All but the first need an NVIDIA GPU and are ignored by default:
//! run them on a GPU host with `gpu-tests --ignored --test-threads=1` (see scripts/gpu-build.sh).

use peerlink::backend::cuda::{driver_library_present, CudaBackend};
use peerlink::backend::{Backend, BufferCopy, BufferId, CopyMethod, Memory, Probes, StreamId};
use peerlink::Error;

#[path = "gpu/engine.rs"]
mod engine;

#[test]
fn open_without_the_driver_is_no_gpu_not_a_panic() {
    let opened = CudaBackend::open();
    if driver_library_present() {
        // A GPU host: opening may work or find no GPU, but never fails otherwise.
        assert!(matches!(opened, Ok(_) | Err(Error::NoGpu(_))));
        return;
    }
    match opened {
        Err(Error::NoGpu(why)) => assert!(why.contains("libcuda"), "{why}"),
        Err(other) => panic!("expected NoGpu, got {other}"),
        Ok(_) => panic!("opened a GPU backend without the driver library"),
    }
}

fn open() -> CudaBackend {
    CudaBackend::open().unwrap_or_else(|e| panic!("this test needs a GPU: {e}"))
}

/// Bytes that differ from their neighbours and from the fill, so a shifted copy shows.
fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

const FILL: u8 = 0x00;

fn read_all(b: &CudaBackend, buffer: BufferId) -> Vec<u8> {
    let mut out = vec![0; b.len(buffer).unwrap()];
    b.read(buffer, 0, &mut out).unwrap();
    out
}

/// Copies `len` bytes between fresh buffers with `method` on a stream of `issuer`, and checks that
/// exactly the destination range changed, to the right bytes.
#[allow(clippy::too_many_arguments)]
fn check_copy(
    b: &CudaBackend,
    issuer: usize,
    method: CopyMethod,
    src_memory: Memory,
    dst_memory: Memory,
    src_offset: usize,
    dst_offset: usize,
    len: usize,
) {
    let size = len + 64;
    let src = b.alloc(src_memory, size).unwrap();
    let dst = b.alloc(dst_memory, size).unwrap();
    let data = pattern(size, 7);
    b.write(src, 0, &data).unwrap();
    b.write(dst, 0, &vec![FILL; size]).unwrap();
    let stream = b.create_stream(issuer).unwrap();
    let copy = BufferCopy {
        dst,
        dst_offset,
        src,
        src_offset,
        len,
    };
    b.copy(stream, method, &copy).unwrap();
    b.synchronize(stream).unwrap();
    let got = read_all(b, dst);
    let mut want = vec![FILL; size];
    want[dst_offset..dst_offset + len].copy_from_slice(&data[src_offset..src_offset + len]);
    if let Some(offset) = (0..size).find(|&i| got[i] != want[i]) {
        panic!(
            "{method:?} {src_memory:?}+{src_offset} -> {dst_memory:?}+{dst_offset}, {len} bytes \
             on GPU {issuer}: first wrong byte at {offset} (want {:#04x}, got {:#04x})",
            want[offset], got[offset]
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

/// The GPUs to copy between: every device to itself, and the first to the last if they differ.
fn device_pairs(b: &CudaBackend) -> Vec<(usize, usize)> {
    let n = b.topology().devices.len();
    let mut pairs = vec![(0, 0)];
    if n > 1 && b.topology().pair(0, n - 1).is_some_and(|p| p.p2p) {
        pairs.extend([(0, n - 1), (n - 1, 0)]);
    }
    pairs
}

#[test]
#[ignore = "needs a GPU"]
fn topology_is_sane() {
    let b = open();
    let t = b.topology();
    println!("{}", serde_json::to_string_pretty(t).unwrap());
    for notice in b.notices() {
        println!("notice: {notice}");
    }
    assert_eq!(t.source, "cuda");
    assert!(!t.devices.is_empty());
    let n = t.devices.len();
    assert_eq!(t.pairs.len(), n * (n - 1));
    for (i, d) in t.devices.iter().enumerate() {
        assert_eq!(d.index, i);
        assert!(!d.name.is_empty());
        assert!(
            d.uuid.starts_with("GPU-") && d.uuid.len() == 40,
            "{}",
            d.uuid
        );
        let bus = d.pci_bus_id.as_bytes();
        let shape_ok = bus.len() == 16
            && bus[8] == b':'
            && bus[11] == b':'
            && bus[14] == b'.'
            && d.pci_bus_id
                .chars()
                .filter(|c| !":.".contains(*c))
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_lowercase());
        assert!(
            shape_ok,
            "bus id not in nvidia-smi -q form: {}",
            d.pci_bus_id
        );
        assert!(["nvml", "sysfs", "unknown"].contains(&d.numa_source.as_str()));
        assert_eq!(d.numa_node.is_some(), d.numa_source != "unknown");
        assert!(d.memory_bytes > 1 << 30);
        assert!(d.compute_capability.contains('.'));
        assert!(d.copy_engines >= 1);
        let free = b.free_memory(i).unwrap();
        assert!(free > 0 && free <= d.memory_bytes, "free {free}");
    }
    for p in &t.pairs {
        assert_ne!(p.src, p.dst);
        if !p.p2p {
            assert_eq!(p.perf_rank, 0);
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn write_read_round_trip_and_bad_handles() {
    let b = open();
    for memory in [Memory::Device(0), Memory::PinnedHost { numa_node: None }] {
        let buffer = b.alloc(memory, 3 << 20).unwrap();
        let data = pattern(3 << 20, 3);
        b.write(buffer, 0, &data).unwrap();
        assert_eq!(read_all(&b, buffer), data, "{memory:?}");
        let mut middle = vec![0; 1001];
        b.read(buffer, 12345, &mut middle).unwrap();
        assert_eq!(middle, data[12345..13346]);
        let too_far = b.write(buffer, (3 << 20) - 1, &[1, 2]).unwrap_err();
        assert_eq!(too_far.exit_code(), 2, "{too_far}");
        b.free(buffer).unwrap();
        assert!(matches!(b.len(buffer), Err(Error::InvalidHandle(_))));
        assert!(matches!(b.free(buffer), Err(Error::InvalidHandle(_))));
    }
    assert!(b.alloc(Memory::Device(0), 0).is_err());
    assert!(b.alloc(Memory::Device(99), 16).is_err());
    assert!(b.create_stream(99).is_err());
}

#[test]
#[ignore = "needs a GPU"]
fn copy_engine_and_sm_copies_move_exactly_the_right_bytes() {
    let b = open();
    for (src, dst) in device_pairs(&b) {
        b.enable_peer_access(src, dst).unwrap();
        b.enable_peer_access(dst, src).unwrap();
        for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
            for issuer in [src, dst] {
                for (so, d_o, len) in SHAPES {
                    let (s, d) = (Memory::Device(src), Memory::Device(dst));
                    check_copy(&b, issuer, method, s, d, so, d_o, len);
                }
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn copies_between_device_and_pinned_host() {
    let b = open();
    // Unplaced, and placed on the GPU's own NUMA node (mbind + cuMemHostRegister where allowed).
    let near = b.topology().devices[0].numa_node.or(Some(0));
    for host in [
        Memory::PinnedHost { numa_node: None },
        Memory::PinnedHost { numa_node: near },
    ] {
        for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
            for (so, d_o, len) in SHAPES {
                check_copy(&b, 0, method, Memory::Device(0), host, so, d_o, len);
                check_copy(&b, 0, method, host, Memory::Device(0), so, d_o, len);
            }
        }
    }
}

#[test]
#[ignore = "needs a GPU"]
fn batches_move_every_message() {
    type BatchCall = fn(&dyn Backend, StreamId, &[BufferCopy]) -> peerlink::Result<()>;
    let calls: [(&str, BatchCall); 2] = [
        ("copy_batch", |b, s, c| b.copy_batch(s, c)),
        ("memcpy_batch", |b, s, c| b.memcpy_batch(s, c)),
    ];
    for (name, batch) in calls {
        let b = open();
        let src = b.alloc(Memory::Device(0), 1 << 20).unwrap();
        let dst = b.alloc(Memory::Device(0), 1 << 20).unwrap();
        let data = pattern(1 << 20, 11);
        b.write(src, 0, &data).unwrap();
        b.write(dst, 0, &vec![FILL; 1 << 20]).unwrap();
        // 1000 messages of odd sizes at odd offsets, packed without overlap into the destination.
        let mut copies = Vec::new();
        let mut at = 0;
        for i in 0..1000usize {
            let len = 1 + (i * 37) % 700;
            copies.push(BufferCopy {
                dst,
                dst_offset: at + i % 3,
                src,
                src_offset: (i * 997) % ((1 << 20) - 800),
                len,
            });
            at += len + 3;
        }
        let stream = b.create_stream(0).unwrap();
        for _ in 0..3 {
            // Repeated, so descriptor blocks are reused once their kernels are done.
            batch(&b, stream, &copies).unwrap();
        }
        b.synchronize(stream).unwrap();
        let got = read_all(&b, dst);
        let mut want = vec![FILL; 1 << 20];
        for c in &copies {
            want[c.dst_offset..c.dst_offset + c.len]
                .copy_from_slice(&data[c.src_offset..c.src_offset + c.len]);
        }
        assert!(got == want, "{name} delivered wrong bytes");
        batch(&b, stream, &[]).unwrap();
    }
}

#[test]
#[ignore = "needs a GPU"]
fn hold_keeps_work_back_until_release() {
    let b = open();
    let len = 64 << 20;
    let src = b.alloc(Memory::Device(0), len).unwrap();
    let dst = b.alloc(Memory::Device(0), len).unwrap();
    let stream = b.create_stream(0).unwrap();
    let gate = b.hold(stream).unwrap();
    let start = b.record(stream).unwrap();
    let copy = BufferCopy {
        dst,
        dst_offset: 0,
        src,
        src_offset: 0,
        len,
    };
    for _ in 0..10 {
        b.copy(stream, CopyMethod::CopyEngine, &copy).unwrap();
    }
    let end = b.record(stream).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert!(!b.event_done(start).unwrap(), "work ran before release");
    assert!(!b.event_done(end).unwrap(), "work ran before release");
    b.release(gate).unwrap();
    b.event_synchronize(end).unwrap();
    let us = b.elapsed_us(start, end).unwrap();
    let gbps = (10 * len) as f64 / us / 1e3;
    println!("10 × 64 MiB copy-engine copies behind a gate: {us:.1} µs GPU time, {gbps:.0} GB/s");
    // The 200 ms the host slept must not be inside the window.
    assert!(us > 0.0 && us < 50_000.0, "{us} µs");
    assert!(matches!(b.release(gate), Err(Error::InvalidHandle(_))));
    b.destroy_event(start).unwrap();
    b.destroy_event(end).unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn captured_graph_replays_the_copies() {
    let b = open();
    let size = 1 << 16;
    let src = b.alloc(Memory::Device(0), size).unwrap();
    let dst = b.alloc(Memory::Device(0), size).unwrap();
    b.write(dst, 0, &vec![FILL; size]).unwrap();
    let stream = b.create_stream(0).unwrap();
    let half = size / 2;
    let first = BufferCopy {
        dst,
        dst_offset: 0,
        src,
        src_offset: 0,
        len: half,
    };
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
    b.begin_capture(stream).unwrap();
    b.copy(stream, CopyMethod::CopyEngine, &first).unwrap();
    b.copy(stream, CopyMethod::SmKernel, &second).unwrap();
    b.copy_batch(stream, &[third]).unwrap();
    let graph = b.end_capture(stream).unwrap();
    b.synchronize(stream).unwrap();
    assert_eq!(
        read_all(&b, dst),
        vec![FILL; size],
        "capture must not run the work"
    );
    for seed in [1, 2] {
        let data = pattern(size, seed);
        b.write(src, 0, &data).unwrap();
        b.replay(graph, stream).unwrap();
        b.synchronize(stream).unwrap();
        assert!(
            read_all(&b, dst) == data,
            "replay {seed} moved the wrong bytes"
        );
    }
}

#[test]
#[ignore = "needs a GPU"]
fn peer_access_is_idempotent_and_required() {
    let b = open();
    b.enable_peer_access(0, 0).unwrap();
    b.enable_peer_access(0, 0).unwrap();
    let n = b.topology().devices.len();
    if n < 2 {
        println!("one GPU: only self-access checked");
        return;
    }
    let dst = b.alloc(Memory::Device(1), 4096).unwrap();
    let src = b.alloc(Memory::Device(0), 4096).unwrap();
    let stream = b.create_stream(0).unwrap();
    let copy = BufferCopy {
        dst,
        dst_offset: 0,
        src,
        src_offset: 0,
        len: 4096,
    };
    let refused = b.copy(stream, CopyMethod::SmKernel, &copy).unwrap_err();
    assert!(
        matches!(refused, Error::PeerAccess { src: 0, dst: 1, .. }),
        "{refused}"
    );
    if b.topology().pair(0, 1).unwrap().p2p {
        b.enable_peer_access(0, 1).unwrap();
        b.enable_peer_access(0, 1).unwrap();
        b.copy(stream, CopyMethod::SmKernel, &copy).unwrap();
        b.synchronize(stream).unwrap();
    } else {
        assert!(matches!(
            b.enable_peer_access(0, 1),
            Err(Error::PeerAccess { .. })
        ));
    }
}

/// Host model of the pointer chase: where `steps` loads from element 0 end.
fn chase(chain: &[u64], steps: u32) -> u64 {
    (0..steps).fold(0, |index, _| chain[index as usize])
}

#[test]
#[ignore = "needs a GPU"]
fn pointer_chase_ends_on_the_right_element() {
    let b = open();
    let elements = 1 << 16;
    // A single cycle through every element, with a stride that defeats simple prefetching.
    let chain: Vec<u64> = (0..elements as u64)
        .map(|i| (i + 40_503) % elements as u64)
        .collect();
    let bytes: Vec<u8> = chain.iter().flat_map(|v| v.to_le_bytes()).collect();
    for memory in [Memory::Device(0), Memory::PinnedHost { numa_node: None }] {
        let buffer = b.alloc(memory, bytes.len()).unwrap();
        b.write(buffer, 0, &bytes).unwrap();
        let result = b.alloc(Memory::Device(0), 8).unwrap();
        let stream = b.create_stream(0).unwrap();
        let steps = 10_007;
        // Untimed first run: the first kernel on a device compiles and loads the kernels.
        b.pointer_chase(stream, buffer, 1, result).unwrap();
        let start = b.record(stream).unwrap();
        b.pointer_chase(stream, buffer, steps, result).unwrap();
        let end = b.record(stream).unwrap();
        b.synchronize(stream).unwrap();
        let mut out = [0u8; 8];
        b.read(result, 0, &mut out).unwrap();
        assert_eq!(u64::from_le_bytes(out), chase(&chain, steps), "{memory:?}");
        let ns = b.elapsed_us(start, end).unwrap() * 1e3 / f64::from(steps);
        println!("pointer chase on GPU 0 through {memory:?}: {ns:.0} ns per dependent load");
    }
}

fn zeroed_flag(b: &CudaBackend, device: usize) -> BufferId {
    let flag = b.alloc(Memory::Device(device), 4).unwrap();
    b.write(flag, 0, &[0; 4]).unwrap();
    flag
}

fn flag_value(b: &CudaBackend, flag: BufferId) -> u32 {
    let mut out = [0u8; 4];
    b.read(flag, 0, &mut out).unwrap();
    u32::from_le_bytes(out)
}

fn run_ping_pong(b: &CudaBackend, ping_gpu: usize, pong_gpu: usize, rounds: u32) -> f64 {
    let (ping, pong): (StreamId, StreamId) = (
        b.create_stream(ping_gpu).unwrap(),
        b.create_stream(pong_gpu).unwrap(),
    );
    let ping_flag = zeroed_flag(b, ping_gpu);
    let pong_flag = zeroed_flag(b, pong_gpu);
    let start = b.record(ping).unwrap();
    b.ping_pong(ping, pong, ping_flag, pong_flag, rounds)
        .unwrap();
    let end = b.record(ping).unwrap();
    b.synchronize(ping).unwrap();
    b.synchronize(pong).unwrap();
    assert_eq!(flag_value(b, ping_flag), rounds);
    assert_eq!(flag_value(b, pong_flag), rounds);
    b.elapsed_us(start, end).unwrap() / f64::from(rounds)
}

#[test]
#[ignore = "needs a GPU"]
fn ping_pong_flags_end_at_the_round_count() {
    let b = open();
    let rounds = 2000;
    run_ping_pong(&b, 0, 0, 1); // warm-up: compiles and loads the kernels
    let same = run_ping_pong(&b, 0, 0, rounds);
    println!("ping-pong on GPU 0 (two streams): {same:.2} µs per round trip");
    let n = b.topology().devices.len();
    if n > 1 && b.topology().pair(0, 1).unwrap().p2p {
        b.enable_peer_access(0, 1).unwrap();
        b.enable_peer_access(1, 0).unwrap();
        let across = run_ping_pong(&b, 0, 1, rounds);
        println!("ping-pong GPU 0 <-> GPU 1: {across:.2} µs per round trip");
    }
    let s = b.create_stream(0).unwrap();
    let flag = zeroed_flag(&b, 0);
    assert!(b.ping_pong(s, s, flag, flag, 1).is_err());
}

#[test]
#[ignore = "needs a GPU"]
fn host_clock_runs_in_real_time() {
    let b = open();
    let before = b.host_time_us();
    std::thread::sleep(std::time::Duration::from_millis(20));
    let passed = b.host_time_us() - before;
    assert!((20_000.0..1_000_000.0).contains(&passed), "{passed}");
}

#[test]
#[ignore = "needs a GPU"]
fn copy_bandwidth_push_and_pull() {
    let b = open();
    let n = b.topology().devices.len();
    let (from, to) = if n > 1 && b.topology().pair(0, n - 1).unwrap().p2p {
        (0, n - 1)
    } else {
        (0, 0)
    };
    b.enable_peer_access(from, to).unwrap();
    b.enable_peer_access(to, from).unwrap();
    let len = 256 << 20; // past the 60 MB L2, so memory and link are measured, not the cache
    let src = b.alloc(Memory::Device(from), len).unwrap();
    let dst = b.alloc(Memory::Device(to), len).unwrap();
    let data = pattern(len, 5);
    b.write(src, 0, &data).unwrap();
    let copy = BufferCopy {
        dst,
        dst_offset: 0,
        src,
        src_offset: 0,
        len,
    };
    let repeats = 5;
    for method in [CopyMethod::CopyEngine, CopyMethod::SmKernel] {
        for (issuer, direction) in [(from, "push"), (to, "pull")] {
            let stream = b.create_stream(issuer).unwrap();
            b.copy(stream, method, &copy).unwrap(); // warm-up
            b.synchronize(stream).unwrap();
            let gate = b.hold(stream).unwrap();
            let start = b.record(stream).unwrap();
            for _ in 0..repeats {
                b.copy(stream, method, &copy).unwrap();
            }
            let end = b.record(stream).unwrap();
            b.release(gate).unwrap();
            b.synchronize(stream).unwrap();
            let us = b.elapsed_us(start, end).unwrap();
            let gbps = (repeats * len) as f64 / us / 1e3;
            println!(
                "{method:?} GPU {from} -> GPU {to}, 256 MiB, {direction} (issued on GPU {issuer}): \
                 {gbps:.0} GB/s over {repeats} back-to-back copies"
            );
            assert!(
                read_all(&b, dst) == data,
                "{method:?} {direction} moved wrong bytes"
            );
            b.write(dst, 0, &[0; 4096]).unwrap();
        }
    }
}

/// Where a batch of 1000 × 4 KiB spends its time on this host, per step, for the engine's batching
/// goal: the host's time in the `copy_batch` call, the kernel's GPU time behind a held stream, and
/// the call-to-completion wall time of a lone batch.
#[test]
#[ignore = "needs a GPU"]
fn copy_batch_time_split() {
    let b = open();
    let (count, len) = (1000usize, 4096usize);
    let src = b.alloc(Memory::Device(0), count * len).unwrap();
    let dst = b.alloc(Memory::Device(0), count * len).unwrap();
    b.write(src, 0, &pattern(count * len, 5)).unwrap();
    let copies: Vec<BufferCopy> = (0..count)
        .map(|i| BufferCopy {
            dst,
            dst_offset: (count - 1 - i) * len,
            src,
            src_offset: i * len,
            len,
        })
        .collect();
    let stream = b.create_stream(0).unwrap();
    let median = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (mut call, mut gpu, mut wall, mut sync) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for run in 0..23 {
        // GPU time and call time behind a held stream.
        let gate = b.hold(stream).unwrap();
        let start = b.record(stream).unwrap();
        let t0 = b.host_time_us();
        b.copy_batch(stream, &copies).unwrap();
        let t1 = b.host_time_us();
        let end = b.record(stream).unwrap();
        b.release(gate).unwrap();
        b.synchronize(stream).unwrap();
        // A lone batch, call to completion seen.
        let t2 = b.host_time_us();
        b.copy_batch(stream, &copies).unwrap();
        let t3 = b.host_time_us();
        let done = b.record(stream).unwrap();
        b.event_synchronize(done).unwrap();
        let t4 = b.host_time_us();
        if run >= 3 {
            call.push(t1 - t0);
            gpu.push(b.elapsed_us(start, end).unwrap());
            wall.push(t4 - t2);
            sync.push(t4 - t3);
        }
        for e in [start, end, done] {
            b.destroy_event(e).unwrap();
        }
    }
    let got = read_all(&b, dst);
    let data = pattern(count * len, 5);
    for i in 0..count {
        let d = (count - 1 - i) * len;
        assert!(
            got[d..d + len] == data[i * len..(i + 1) * len],
            "message {i}"
        );
    }
    eprintln!(
        "copy_batch 1000 × 4 KiB: call {:.1} µs (host), kernel {:.1} µs (GPU, behind a gate), lone \
         batch {:.1} µs call to completion, of which {:.1} µs after the call returned",
        median(call),
        median(gpu),
        median(wall),
        median(sync)
    );
}

/// How fast the host writes into pinned memory of each kind (batch descriptors are written there).
#[test]
#[ignore = "needs a GPU"]
fn host_writes_into_pinned_memory() {
    let b = open();
    let data = pattern(24 * 1024, 9);
    for (what, memory) in [
        ("cuMemHostAlloc", Memory::PinnedHost { numa_node: None }),
        (
            "mbind + cuMemHostRegister",
            Memory::PinnedHost { numa_node: Some(0) },
        ),
    ] {
        let buffer = b.alloc(memory, data.len()).unwrap();
        let mut times = Vec::new();
        for _ in 0..21 {
            let t0 = b.host_time_us();
            b.write(buffer, 0, &data).unwrap();
            times.push(b.host_time_us() - t0);
        }
        times.sort_by(f64::total_cmp);
        let mut back = vec![0; data.len()];
        b.read(buffer, 0, &mut back).unwrap();
        assert_eq!(back, data);
        eprintln!(
            "24 KiB host write into {what} pinned memory: {:.1} µs (median)",
            times[10]
        );
        b.free(buffer).unwrap();
    }
}
