//! Tests of the real-GPU backend: the backend contract (tests/contract/suite.rs, the same checks the
//! simulator passes), what only real GPUs have (their topology, a real clock) and the measurements
//! behind the engine's choices. All but the first need an NVIDIA GPU and are ignored by default: run
//! them on a GPU host with `gpu-tests --ignored --test-threads=1` (see scripts/gpu-build.sh).

use peerlink::backend::cuda::{driver_library_present, CudaBackend};
use peerlink::backend::{Backend, BufferCopy, CopyMethod, Memory};
use peerlink::bench::stats::median;
use peerlink::pattern;
use peerlink::Error;

#[macro_use]
#[path = "contract/suite.rs"]
mod contract;

#[path = "gpu/engine.rs"]
mod engine;

#[path = "gpu/check.rs"]
mod check;
#[path = "gpu/collectives.rs"]
mod collectives;
#[path = "common/mod.rs"]
mod common;
#[path = "gpu/doctor.rs"]
mod doctor;
#[path = "gpu/managed.rs"]
mod managed;
#[path = "gpu/network.rs"]
mod network;
#[path = "gpu/processes.rs"]
mod processes;
#[path = "gpu/resident.rs"]
mod resident;
#[path = "soak/run.rs"]
mod soak;
#[path = "gpu/workload.rs"]
mod workload;

use contract::contents;

mod cuda_contract {
    contract_tests!(
        #[ignore = "needs a GPU"]
        open = super::open()
    );
}

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

/// Set in the child process of `the_backend_retains_a_context_only_where_work_needs_one`.
const FRESH_PROCESS_VAR: &str = "PEERLINK_TEST_FRESH_PROCESS";

#[test]
#[ignore = "needs a GPU"]
fn the_backend_retains_a_context_only_where_work_needs_one() {
    // In a process of its own: the other tests of this one leave contexts behind.
    if std::env::var_os(FRESH_PROCESS_VAR).is_none() {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "the_backend_retains_a_context_only_where_work_needs_one",
            ])
            .args(["--ignored", "--nocapture", "--test-threads", "1"])
            .env(FRESH_PROCESS_VAR, "1")
            .output()
            .unwrap();
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success() && text.contains("1 passed"), "{text}");
        return;
    }
    let b = open();
    let n = b.topology().devices.len();
    assert_eq!(
        b.gpus_with_context().unwrap(),
        Vec::<usize>::new(),
        "after open"
    );
    let last = b.alloc(Memory::Device(n - 1), 4096).unwrap();
    assert_eq!(
        b.gpus_with_context().unwrap(),
        vec![n - 1],
        "after an allocation on GPU {}",
        n - 1
    );
    if n > 1 {
        let first = b.alloc(Memory::Device(0), 4096).unwrap();
        assert_eq!(b.gpus_with_context().unwrap(), vec![0, n - 1]);
        b.free(first).unwrap();
    }
    b.free(last).unwrap();
}

fn open() -> CudaBackend {
    CudaBackend::open().unwrap_or_else(|e| panic!("this test needs a GPU: {e}"))
}

#[test]
#[ignore = "needs a GPU"]
fn every_document_header_names_the_driver_cuda_and_each_gpu() {
    let b = open();
    let header = peerlink::document::Header::new("peerlink.topo/1", b.topology());
    assert!(!header.simulated);
    assert!(header.driver_version.is_some(), "NVML gives the driver");
    assert!(header.cuda_version.is_some());
    assert_eq!(header.host_gpus.len(), b.topology().devices.len());
    for gpu in &header.host_gpus {
        assert!(gpu.uuid.starts_with("GPU-"), "{gpu:?}");
        assert_eq!(gpu.pci_bus_id.len(), "00000000:18:00.0".len(), "{gpu:?}");
    }
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
    assert_eq!(t.source, peerlink::topology::Source::Cuda);
    // Every document's header names the CUDA version the driver supports (`13.0`).
    assert!(
        t.cuda_version.as_deref().is_some_and(|v| v.contains('.')),
        "{:?}",
        t.cuda_version
    );
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
    let data = pattern::bytes(5, len);
    b.write(src, 0, &data).unwrap();
    let copy = BufferCopy::from_start(src, dst, len);
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
                contents(&b, dst) == data,
                "{method:?} {direction} moved wrong bytes"
            );
            b.write(dst, 0, &[0; 4096]).unwrap();
        }
    }
}

/// The bench's 512 MiB peer lane is filled and checked on the GPUs (every byte), in milliseconds
/// where the host took 0.14 s, and a single wrong byte in the destination is still caught, with its
/// offset and both values.
#[test]
#[ignore = "needs a GPU"]
fn a_512mib_lane_is_filled_and_checked_on_the_gpus_and_a_wrong_byte_is_caught() {
    use peerlink::bench::cases::{Context, Initiator, PeerCopy, Transport};
    use peerlink::bench::timing::{measure, Sampling};
    let b = open();
    let n = b.topology().devices.len();
    let to = if n > 1 && b.topology().pair(0, n - 1).unwrap().p2p {
        n - 1
    } else {
        0
    };
    b.enable_peer_access(0, to).unwrap();
    let message = 512 << 20;
    let sampling = Sampling {
        warmup: 1,
        iterations: 2,
        samples: 1,
        rotation_bytes: 0,
    };
    let mut ctx = Context::new(&b, vec![0, to], sampling, 1 << 20);
    let ce_write = PeerCopy::new(
        "ce",
        Transport::Direct(CopyMethod::CopyEngine),
        Initiator::Source,
        false,
    );
    let mut lanes = ce_write
        .lanes(&mut ctx, &[(0, to)], message, &sampling)
        .unwrap();
    measure(&mut lanes, &sampling, 3).unwrap(); // first use: kernels compiled and loaded
    let lane = &mut lanes[0];
    let host_ms = |b: &CudaBackend, started: f64| (b.host_time_us() - started) / 1e3;
    let started = b.host_time_us();
    lane.fill(11).unwrap();
    let fill_ms = host_ms(&b, started);
    lane.enqueue(0).unwrap();
    b.synchronize(lane.stream()).unwrap();
    let started = b.host_time_us();
    lane.verify().unwrap();
    let verify_ms = host_ms(&b, started);
    println!("GPU 0 -> GPU {to}, 512 MiB: filled in {fill_ms:.2} ms, checked in {verify_ms:.2} ms");
    assert!(
        fill_ms < 50.0 && verify_ms < 50.0,
        "{fill_ms} / {verify_ms} ms"
    );

    let at = 300_000_001;
    let mut byte = [0u8];
    b.read(lane.destination(), at, &mut byte).unwrap();
    b.write(lane.destination(), at, &[!byte[0]]).unwrap();
    let wrong = pattern::Mismatch {
        offset: at,
        expected: byte[0],
        found: !byte[0],
    };
    let want = wrong.into_error("ce-write", 0, to).to_string();
    assert_eq!(lane.verify().unwrap_err().to_string(), want);
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
    b.write(src, 0, &pattern::bytes(5, count * len)).unwrap();
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
    let got = contents(&b, dst);
    let data = pattern::bytes(5, count * len);
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
        median(&call).unwrap(),
        median(&gpu).unwrap(),
        median(&wall).unwrap(),
        median(&sync).unwrap()
    );
}

/// How fast the host writes into pinned memory of each kind (batch descriptors are written there).
#[test]
#[ignore = "needs a GPU"]
fn host_writes_into_pinned_memory() {
    let b = open();
    let data = pattern::bytes(9, 24 * 1024);
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
        let mut back = vec![0; data.len()];
        b.read(buffer, 0, &mut back).unwrap();
        assert_eq!(back, data);
        eprintln!(
            "24 KiB host write into {what} pinned memory: {:.1} µs (median)",
            median(&times).expect("21 writes")
        );
        b.free(buffer).unwrap();
    }
}

/// Which of the host route's copies slows an NVLink copy that runs beside it: the copy-engine
/// write over NVLink (240 MiB, GPU 0 → GPU 1) alone and beside a 28 MiB device→host copy on GPU 0,
/// a 28 MiB host→device copy on GPU 1, or both; and the NVLink share issued other ways (pulled by
/// GPU 1, or by an SM kernel) beside both host copies; and both ways at once (each GPU pushing over
/// NVLink, copying to and from the host: three copy engines busy on each). Every copy starts
/// together behind held streams; each stream's GPU time is printed (median of 5). The numbers
/// decide how a split may use the host route beside NVLink (issue 11).
#[test]
#[ignore = "needs a GPU"]
fn nvlink_copy_beside_host_copies() {
    let b = open();
    if b.topology().devices.len() < 2 {
        eprintln!("skipped: needs two GPUs");
        return;
    }
    b.enable_peer_access(0, 1).unwrap();
    b.enable_peer_access(1, 0).unwrap();
    let (big, small) = (240usize << 20, 28usize << 20);
    let a0 = b.alloc(Memory::Device(0), big).unwrap();
    let b1 = b.alloc(Memory::Device(1), big).unwrap();
    let d0 = b.alloc(Memory::Device(0), small).unwrap();
    let d1 = b.alloc(Memory::Device(1), small).unwrap();
    let h0 = b
        .alloc(Memory::PinnedHost { numa_node: None }, small)
        .unwrap();
    let h1 = b
        .alloc(Memory::PinnedHost { numa_node: None }, small)
        .unwrap();
    let on0 = [0, 0, 0].map(|d| b.create_stream(d).unwrap());
    let on1 = b.create_stream(1).unwrap();
    let nvlink_push = (
        on0[0],
        CopyMethod::CopyEngine,
        BufferCopy::from_start(a0, b1, big),
        "nvlink push",
    );
    let nvlink_pull = (
        on1,
        CopyMethod::CopyEngine,
        BufferCopy::from_start(a0, b1, big),
        "nvlink pull",
    );
    let nvlink_sm = (
        on0[0],
        CopyMethod::SmKernel,
        BufferCopy::from_start(a0, b1, big),
        "nvlink sm",
    );
    let d2h = (
        on0[1],
        CopyMethod::CopyEngine,
        BufferCopy::from_start(d0, h0, small),
        "d2h GPU0",
    );
    let on1b = b.create_stream(1).unwrap();
    let h2d = (
        on1b,
        CopyMethod::CopyEngine,
        BufferCopy::from_start(h1, d1, small),
        "h2d GPU1",
    );
    // The other direction's copies, on buffers of their own.
    let a1 = b.alloc(Memory::Device(1), big).unwrap();
    let b0 = b.alloc(Memory::Device(0), big).unwrap();
    let d0_back = b.alloc(Memory::Device(0), small).unwrap();
    let d1_back = b.alloc(Memory::Device(1), small).unwrap();
    let pinned = || {
        b.alloc(Memory::PinnedHost { numa_node: None }, small)
            .unwrap()
    };
    let (h2, h3) = (pinned(), pinned());
    let back = [1, 1].map(|d| b.create_stream(d).unwrap());
    let nvlink_push_back = (
        back[0],
        CopyMethod::CopyEngine,
        BufferCopy::from_start(a1, b0, big),
        "nvlink push 1->0",
    );
    let d2h_back = (
        back[1],
        CopyMethod::CopyEngine,
        BufferCopy::from_start(d1_back, h2, small),
        "d2h GPU1",
    );
    let h2d_back = (
        on0[2],
        CopyMethod::CopyEngine,
        BufferCopy::from_start(h3, d0_back, small),
        "h2d GPU0",
    );
    let scenarios: Vec<Vec<_>> = vec![
        vec![nvlink_push],
        vec![d2h],
        vec![h2d],
        vec![nvlink_push, d2h],
        vec![nvlink_push, h2d],
        vec![nvlink_push, d2h, h2d],
        vec![nvlink_pull, d2h, h2d],
        vec![nvlink_sm, d2h, h2d],
        vec![nvlink_push, nvlink_push_back],
        vec![nvlink_push, d2h, h2d, nvlink_push_back, d2h_back, h2d_back],
    ];
    for scenario in &scenarios {
        let mut times = vec![Vec::new(); scenario.len()];
        for _ in 0..6 {
            let gates: Vec<_> = scenario.iter().map(|c| b.hold(c.0).unwrap()).collect();
            let events: Vec<_> = scenario
                .iter()
                .map(|(stream, method, copy, _)| {
                    let start = b.record(*stream).unwrap();
                    b.copy(*stream, *method, copy).unwrap();
                    (start, b.record(*stream).unwrap())
                })
                .collect();
            for gate in gates {
                b.release(gate).unwrap();
            }
            for c in scenario {
                b.synchronize(c.0).unwrap();
            }
            for (i, (start, end)) in events.into_iter().enumerate() {
                times[i].push(b.elapsed_us(start, end).unwrap());
                b.destroy_event(start).unwrap();
                b.destroy_event(end).unwrap();
            }
        }
        let line: Vec<String> = scenario
            .iter()
            .zip(&times)
            .map(|((_, _, copy, name), t)| {
                let us = median(&t[1..]).unwrap();
                format!("{name} {us:.1} µs {:.1} GB/s", copy.len as f64 / us / 1e3)
            })
            .collect();
        eprintln!("beside: {}", line.join(" | "));
    }
}

/// Issue 13: a run larger than a GPU's free memory is refused before it starts (exit 2, saying
/// what it needs and what is free); an allocation that fails while running is one sentence (exit 1,
/// no CUDA_ERROR_* text); either way GPU 0's free memory is back where it was, also where a lane's
/// second buffer did not fit after its first was allocated.
#[test]
#[ignore = "needs a GPU"]
fn out_of_memory_is_refused_or_one_sentence_and_leaks_nothing() {
    use peerlink::bench::progress::Silent;
    use peerlink::bench::timing::{HopSpec, Lane, LaneLabel, Sampling};
    use peerlink::bench::{Options, Size};
    let b = open();
    // The context's own first allocations (module loads) happen before the baseline.
    let warm = b.alloc(Memory::Device(0), 1 << 20).unwrap();
    b.free(warm).unwrap();
    let free = b.free_memory(0).unwrap();
    let back_where_it_was = |after: &str| {
        let now = b.free_memory(0).unwrap();
        assert!(
            now.abs_diff(free) <= 32 << 20,
            "after {after}: {now} bytes free, {free} before"
        );
    };
    // A local copy needs two buffers: three quarters of the free memory each cannot run.
    let size = (free / 4 * 3) >> 20 << 20;
    let options = Options {
        tests: Some(vec!["local".into()]),
        devices: Some(vec![0]),
        size: Some(Size::Bytes(size)),
        ..Options::default()
    };
    let err = peerlink::bench::run(&b, &options, &Silent).unwrap_err();
    let text = err.to_string();
    assert_eq!(err.exit_code(), 2, "{text}");
    assert!(
        text.contains("needs") && text.contains("on GPU 0, which has"),
        "{text}"
    );
    eprintln!("refused: {text}");
    back_where_it_was("the refused bench");

    let err = b
        .alloc(Memory::Device(0), (free + (1 << 30)) as usize)
        .unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    assert_eq!(err.exit_code(), 1);
    assert!(
        !text.contains("CUDA_ERROR") && !text.contains('\n'),
        "{text}"
    );
    eprintln!("failed: {text}");
    back_where_it_was("the failed allocation");

    // The lane's source fits, its destination does not: the source goes with the error.
    let stream = b.create_stream(0).unwrap();
    let hop = HopSpec {
        stream,
        method: CopyMethod::CopyEngine,
        memory: Memory::Device(0),
    };
    let sampling = Sampling {
        warmup: 0,
        iterations: 1,
        samples: 1,
        rotation_bytes: 0,
    };
    let label = LaneLabel {
        test: "local".into(),
        src: 0,
        dst: 0,
    };
    let lane = Lane::new(
        &b,
        label,
        Memory::Device(0),
        &[hop],
        size as usize,
        &sampling,
        u64::MAX,
    );
    let err = lane.err().expect("two buffers of 3/4 of the free memory");
    assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
    back_where_it_was("the lane that did not fit");
    b.destroy_stream(stream).unwrap();

    if let Some(host_free) = peerlink::backend::host_memory::free() {
        let pinned = Memory::PinnedHost { numa_node: None };
        let err = b
            .alloc(pinned, (host_free + (1 << 30)) as usize)
            .unwrap_err();
        assert!(matches!(err, Error::OutOfMemory { .. }), "{err:?}");
        assert!(
            err.to_string().contains("the host (pinned memory)"),
            "{err}"
        );
    }
}

/// Issue 13's soak on real GPUs: resident memory stays flat over a million transfers through the
/// engine between every pair of the host's GPUs (one in 64 large), as on the simulator.
#[test]
#[ignore = "needs a GPU"]
fn memory_stays_flat_over_a_million_transfers_on_gpus() {
    let backend = std::sync::Arc::new(open());
    soak::soak("cuda", backend, 1_000_000, Some(64));
}

/// The first two GPUs (or GPU 0 twice) with peer access both ways and a stream on each, for the
/// ping-pong experiments below.
fn ping_pong_pair(b: &CudaBackend) -> [(usize, peerlink::backend::StreamId); 2] {
    let (ping_gpu, pong_gpu) = (0, usize::from(b.topology().devices.len() > 1));
    b.enable_peer_access(ping_gpu, pong_gpu).unwrap();
    b.enable_peer_access(pong_gpu, ping_gpu).unwrap();
    [ping_gpu, pong_gpu].map(|gpu| (gpu, b.create_stream(gpu).unwrap()))
}

/// One way of a ping-pong of 1000 rounds between `pair`'s streams with these flags, µs: the median
/// of `samples` after one thrown away, GPU time; both flags checked after each.
fn ping_pong_one_way_us(
    b: &CudaBackend,
    pair: [(usize, peerlink::backend::StreamId); 2],
    (ping_flag, pong_flag): (peerlink::backend::BufferId, peerlink::backend::BufferId),
    samples: usize,
) -> f64 {
    let [(_, ping), (_, pong)] = pair;
    let rounds = 1000u32;
    let mut times = Vec::new();
    for sample in 0..=samples {
        b.write(ping_flag, 0, &[0; 4]).unwrap();
        b.write(pong_flag, 0, &[0; 4]).unwrap();
        let start = b.record(ping).unwrap();
        b.probes()
            .ping_pong(ping, pong, ping_flag, pong_flag, rounds)
            .unwrap();
        let end = b.record(ping).unwrap();
        b.synchronize(pong).unwrap();
        b.synchronize(ping).unwrap();
        if sample > 0 {
            times.push(b.elapsed_us(start, end).unwrap() / f64::from(rounds) / 2.0);
        }
        for flag in [ping_flag, pong_flag] {
            assert_eq!(contents(b, flag)[..4], rounds.to_le_bytes());
        }
    }
    median(&times).unwrap()
}

/// Why ping-pong measured 0.65 µs one way after bench's `local` test and 0.73 alone (issue 11.5):
/// the same probe with its two flags allocated in different ways, in turns, one process. Not a
/// pass/fail figure (the flags' contents are checked); the printed medians decide what the bench
/// test must control.
#[test]
#[ignore = "needs a GPU"]
fn ping_pong_by_where_its_flags_lie() {
    use peerlink::backend::collective::BufferRange;
    #[derive(Clone, Copy, PartialEq)]
    enum Load {
        None,
        Copies(CopyMethod),
        Patterns,
    }
    let b = open();
    let pair = ping_pong_pair(&b);
    let [(ping_gpu, ping), (pong_gpu, pong)] = pair;
    let address = |buffer| b.sharing().device_address(buffer).unwrap();
    // `load`: work within each GPU on two 1 GiB buffers allocated before the flags and freed
    // after them (`freed_gib`: 1 GiB allocated and freed first, untouched).
    let run = |label: &str, flag_bytes: usize, freed_gib: usize, load: Load| {
        for _ in 0..freed_gib {
            for gpu in [ping_gpu, pong_gpu] {
                let big = b.alloc(Memory::Device(gpu), 1 << 30).unwrap();
                b.free(big).unwrap();
            }
        }
        let mut loaded = Vec::new();
        if load != Load::None {
            for (gpu, stream) in [(ping_gpu, ping), (pong_gpu, pong)] {
                let (from, to) = (
                    b.alloc(Memory::Device(gpu), 1 << 30).unwrap(),
                    b.alloc(Memory::Device(gpu), 1 << 30).unwrap(),
                );
                let copy = BufferCopy::from_start(from, to, 1 << 30);
                match load {
                    Load::Copies(method) => {
                        for _ in 0..40 {
                            b.copy(stream, method, &copy).unwrap();
                        }
                    }
                    Load::Patterns => {
                        let range = BufferRange {
                            buffer: from,
                            offset: 0,
                            len: 1 << 30,
                        };
                        for seed in 0..4 {
                            b.patterns().fill(&range, seed).unwrap();
                            assert!(b.patterns().first_mismatch(&range, seed).unwrap().is_none());
                        }
                    }
                    Load::None => {}
                }
                loaded.extend([from, to]);
            }
            b.synchronize(ping).unwrap();
            b.synchronize(pong).unwrap();
        }
        let (ping_flag, pong_flag) = (
            b.alloc(Memory::Device(ping_gpu), flag_bytes).unwrap(),
            b.alloc(Memory::Device(pong_gpu), flag_bytes).unwrap(),
        );
        let us = ping_pong_one_way_us(&b, pair, (ping_flag, pong_flag), 21);
        eprintln!(
            "{us:.3} µs one way  {label} (flags {:#x}, {:#x})",
            address(ping_flag),
            address(pong_flag)
        );
        b.free(ping_flag).unwrap();
        b.free(pong_flag).unwrap();
        for buffer in loaded {
            b.free(buffer).unwrap();
        }
    };
    for _ in 0..2 {
        run("4 B flags", 4, 0, Load::None);
        run("flags in 2 MiB allocations", 2 << 20, 0, Load::None);
        run("after 1 GiB allocated and freed", 4, 1, Load::None);
        run(
            "after 40 local copy-engine copies of 1 GiB",
            4,
            0,
            Load::Copies(CopyMethod::CopyEngine),
        );
        run("4 B flags again", 4, 0, Load::None);
        run(
            "after 40 local SM-kernel copies of 1 GiB",
            4,
            0,
            Load::Copies(CopyMethod::SmKernel),
        );
        run("4 B flags again", 4, 0, Load::None);
        run(
            "after filling and checking 1 GiB 4 times (pattern kernels)",
            4,
            0,
            Load::Patterns,
        );
        run("4 B flags again", 4, 0, Load::None);
    }
}

/// Ping-pong over many placements of its flags (issue 11.5): each flag in its own 2 MiB
/// allocation, 24 of them on each GPU; pairs (i, i), then the ping GPU's flag fixed and the pong
/// GPU's moved, then the other way round. Prints one line per placement (median of 5 samples).
#[test]
#[ignore = "needs a GPU"]
fn ping_pong_over_flag_placements() {
    let b = open();
    let pair = ping_pong_pair(&b);
    let [(ping_gpu, _), (pong_gpu, _)] = pair;
    let one_way_us =
        |ping_flag, pong_flag| ping_pong_one_way_us(&b, pair, (ping_flag, pong_flag), 5);
    let flags = |gpu| -> Vec<_> {
        (0..24)
            .map(|_| b.alloc(Memory::Device(gpu), 2 << 20).unwrap())
            .collect()
    };
    let (on_ping, on_pong) = (flags(ping_gpu), flags(pong_gpu));
    let address = |buffer| b.sharing().device_address(buffer).unwrap();
    let line = |label: &str, values: Vec<f64>| {
        let shown: Vec<String> = values.iter().map(|v| format!("{v:.3}")).collect();
        eprintln!("{label}: {}", shown.join(" "));
    };
    line(
        "pairs (i, i)",
        (0..24)
            .map(|i| one_way_us(on_ping[i], on_pong[i]))
            .collect(),
    );
    line(
        "ping flag 0, pong flag i",
        (0..24)
            .map(|i| one_way_us(on_ping[0], on_pong[i]))
            .collect(),
    );
    line(
        "ping flag i, pong flag 0",
        (0..24)
            .map(|i| one_way_us(on_ping[i], on_pong[0]))
            .collect(),
    );
    line(
        "pairs (i, i) again",
        (0..24)
            .map(|i| one_way_us(on_ping[i], on_pong[i]))
            .collect(),
    );
    let addresses: Vec<String> = on_ping
        .iter()
        .chain(&on_pong)
        .map(|&f| format!("{:#x}", address(f)))
        .collect();
    eprintln!(
        "addresses (ping GPU's, then pong GPU's): {}",
        addresses.join(" ")
    );
}
