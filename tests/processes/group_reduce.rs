//! peerlink's all-reduce with one rank per process (`engine::all_reduce::GroupAllReduce`): this
//! test binary runs one of its own tests again as each rank, with torchrun's variables, and each rank sums small
//! whole numbers (every other call averages them) by the cost model's pick and by every kernel that
//! takes the size, in memory of its
//! own and in symmetric memory (allocated by every rank together), each at an offset into its
//! allocation; checks every element of its result, and that the bytes around it are untouched, in
//! its own memory; and times a loop of each from Rust (GPU events on its stream). The simulator runs it in CI (tests/processes.rs), real GPUs in tests/gpu/processes.rs.

use peerlink::backend::collective::{AllReduceKernel, BufferRange, DataType, Reduction};
use peerlink::backend::{self, Backend, BufferId, Choice, Memory};
use peerlink::engine::all_reduce::GroupAllReduce;
use peerlink::engine::Fabric;
use std::net::TcpListener;
use std::process::Command;
use std::sync::Arc;

/// The backend each rank opens: `cuda` or `sim:<preset>`.
const BACKEND_VAR: &str = "PEERLINK_TEST_RANK_BACKEND";
/// The sizes each rank reduces, comma-separated bytes.
const SIZES_VAR: &str = "PEERLINK_TEST_RANK_SIZES";
/// Timed operations per loop.
const TIMED: u32 = 100;
/// Where each reduced range starts in its allocation (16-byte aligned, as the kernels' vectors).
const OFFSET: usize = 64;
/// The kinds of memory each size is reduced in: the rank's own, and symmetric.
const MEMORIES: usize = 2;

/// Runs `rank_test` of this binary as `world` ranks over `backend_name`, each reducing `sizes`;
/// returns every rank's output after checking that each succeeded and checked every call.
pub fn launch(backend_name: &str, rank_test: &str, world: usize, sizes: &[usize]) -> Vec<String> {
    let port = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let sizes_text: Vec<String> = sizes.iter().map(|s| s.to_string()).collect();
    let ranks: Vec<_> = (0..world)
        .map(|rank| {
            Command::new(std::env::current_exe().unwrap())
                .args([rank_test, "--exact", "--ignored", "--nocapture"])
                .args(["--test-threads", "1"])
                .env(BACKEND_VAR, backend_name)
                .env(SIZES_VAR, sizes_text.join(","))
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("LOCAL_RANK", rank.to_string())
                .env("LOCAL_WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("PEERLINK_TIMEOUT", "60")
                .spawn_piped()
        })
        .collect();
    let calls: usize = MEMORIES
        * sizes
            .iter()
            .map(|&len| {
                1 + AllReduceKernel::ALL
                    .iter()
                    .filter(|k| len <= k.max_len())
                    .count()
            })
            .sum::<usize>();
    ranks
        .into_iter()
        .enumerate()
        .map(|(rank, child)| {
            let out = child.wait_with_output().unwrap();
            let text = format!(
                "{}\n{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert!(out.status.success(), "rank {rank} failed:\n{text}");
            assert_eq!(
                text.matches("CHECKED").count(),
                calls,
                "rank {rank} checks every call:\n{text}"
            );
            text
        })
        .collect()
}

trait SpawnPiped {
    fn spawn_piped(&mut self) -> std::process::Child;
}

impl SpawnPiped for Command {
    fn spawn_piped(&mut self) -> std::process::Child {
        self.stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    }
}

/// Rank `rank`'s elements for call `call`: small whole numbers, so that every sum is exact.
fn values(rank: usize, call: usize, elements: usize) -> Vec<f32> {
    (0..elements)
        .map(|i| ((i * 7 + rank * 13 + call * 3) % 101) as f32)
        .collect()
}

/// Fills the bytes of `range`'s buffer (`allocated` bytes) before and after the range with a
/// pattern of this rank's and returns them: a call must leave them as they are.
fn fill_around(
    b: &dyn Backend,
    range: BufferRange<BufferId>,
    allocated: usize,
    rank: usize,
) -> (Vec<u8>, Vec<u8>) {
    let end = range.offset + range.len;
    let pattern = |from: usize, to: usize| -> Vec<u8> {
        (from..to).map(|i| (i * 7 + 31 * rank) as u8).collect()
    };
    let (before, after) = (pattern(0, range.offset), pattern(end, allocated));
    b.write(range.buffer, 0, &before).unwrap();
    b.write(range.buffer, end, &after).unwrap();
    (before, after)
}

fn bytes_of(values: &[f32]) -> Vec<u8> {
    values.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// One rank, run by [`launch`] in a process of its own: nothing to do alone.
pub fn rank() {
    let (Ok(name), Ok(sizes)) = (std::env::var(BACKEND_VAR), std::env::var(SIZES_VAR)) else {
        eprintln!("run by group_reduce::launch as a rank: nothing to do alone");
        return;
    };
    let sizes: Vec<usize> = sizes.split(',').map(|s| s.parse().unwrap()).collect();
    let choice = match name.strip_prefix("sim:") {
        Some(preset) => Choice::Sim(preset.to_string()),
        None => Choice::Gpu,
    };
    let backend: Arc<dyn Backend> = Arc::from(backend::open(&choice).unwrap().backend);
    let (_, group) = peerlink::launch::join_from_env().unwrap().unwrap();
    let world = group.identity().world;
    let model = Fabric::open(backend.clone())
        .unwrap()
        .planner()
        .model()
        .clone();
    let mut reduce = GroupAllReduce::join(backend.clone(), group, model).unwrap();
    let me = reduce.rank();
    let gpu = reduce.gpu();
    let b = backend.as_ref();
    let stream = b.create_stream(gpu).unwrap();
    let largest = OFFSET + sizes.iter().max().unwrap();
    let symmetric = reduce.alloc_symmetric(largest).unwrap();
    let address = b.sharing().device_address(symmetric).unwrap();
    let found = reduce.symmetric_range(address + OFFSET as u64, 16);
    assert_eq!(
        found.map(|r| (r.buffer, r.offset)),
        Some((symmetric, OFFSET))
    );
    assert_eq!(
        reduce.symmetric_range(address + 1, largest),
        None,
        "past its end"
    );
    let mut call = 0;
    for &len in &sizes {
        let elements = len / 4;
        let own = b.alloc(Memory::Device(gpu), OFFSET + len).unwrap();
        let mut two_shot_us = Vec::new();
        for (memory, buffer, allocated) in [
            ("own", own, OFFSET + len),
            ("symmetric", symmetric, largest),
        ] {
            let range = BufferRange {
                buffer,
                offset: OFFSET,
                len,
            };
            let around = fill_around(b, range, allocated, me);
            let takers = AllReduceKernel::ALL
                .into_iter()
                .filter(|k| len <= k.max_len());
            for kernel in std::iter::once(None).chain(takers.map(Some)) {
                call += 1;
                // Every other call averages: the sum times the f32 1/world, rounded once.
                let (op, scale) = match call % 2 {
                    0 => (Reduction::Average, 1.0 / world as f32),
                    _ => (Reduction::Sum, 1.0),
                };
                let run = |reduce: &mut GroupAllReduce| match kernel {
                    None => reduce.all_reduce(range, stream, DataType::F32, op),
                    Some(k) => reduce
                        .all_reduce_by(k, range, stream, DataType::F32, op)
                        .map(|()| k),
                };
                // Timed first, on whatever the buffer holds; then checked on known inputs.
                let ran = run(&mut reduce).unwrap();
                b.synchronize(stream).unwrap();
                let start = b.record(stream).unwrap();
                for _ in 0..TIMED {
                    run(&mut reduce).unwrap();
                }
                let end = b.record(stream).unwrap();
                b.synchronize(stream).unwrap();
                let us = b.elapsed_us(start, end).unwrap() / f64::from(TIMED);
                b.destroy_event(start).unwrap();
                b.destroy_event(end).unwrap();
                b.write(buffer, OFFSET, &bytes_of(&values(me, call, elements)))
                    .unwrap();
                run(&mut reduce).unwrap();
                b.synchronize(stream).unwrap();
                let mut out = vec![0; allocated];
                b.read(buffer, 0, &mut out).unwrap();
                let (before, rest) = out.split_at(OFFSET);
                let (out, after) = rest.split_at(len);
                let every: Vec<Vec<f32>> = (0..world).map(|r| values(r, call, elements)).collect();
                let want: Vec<f32> = (0..elements)
                    .map(|i| every.iter().map(|v| v[i]).sum::<f32>() * scale)
                    .collect();
                assert!(
                    out == bytes_of(&want),
                    "rank {me}: {len} B in {memory} memory by {ran:?} is not the {op}"
                );
                assert!(
                    (before, after) == (&around.0[..], &around.1[..]),
                    "rank {me}: {len} B in {memory} memory by {ran:?} wrote outside its range"
                );
                if kernel == Some(AllReduceKernel::TwoShot) {
                    two_shot_us.push(us);
                }
                let how = if kernel.is_none() { "pick" } else { "by" };
                println!(
                    "CHECKED rank {me} {len} B {memory} memory {how} {} ({op}) {us:.2} us/op",
                    ran.name()
                );
            }
        }
        b.free(own).unwrap();
        // In symmetric memory two-shot copies nothing in or out: from 1 MiB up the copies of
        // the rank's own memory take microseconds.
        if let [own_us, symmetric_us] = two_shot_us[..] {
            assert!(
                len < 1 << 20 || symmetric_us < own_us,
                "rank {me}: two-shot of {len} B took {symmetric_us:.2} µs in symmetric memory, \
                 {own_us:.2} µs in its own"
            );
        }
    }
    b.destroy_stream(stream).unwrap();
    if choice == Choice::Gpu {
        // A rank holds a context on its own GPU alone, not on its peers' (their memory is
        // imported into its own).
        let held = peerlink::backend::cuda::CudaBackend::open()
            .unwrap()
            .gpus_with_context()
            .unwrap();
        assert_eq!(held, vec![gpu], "rank {me} holds contexts on GPUs {held:?}");
    }
}
