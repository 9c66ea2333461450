//! The soak itself, on any backend (tests/soak.rs on the simulator, tests/gpu.rs on GPUs): transfers
//! between random GPUs at random offsets — plain, timed, batches, strategies the planner would not
//! pick. The process's resident memory (VmRSS) is read after a tenth of them and after the last, and
//! may grow by no more than [`MAX_GROWTH_PER_TRANSFER`] bytes per transfer in between: a leak of one
//! event or one record per transfer (16 bytes and more) fails.

use peerlink::backend::Backend;
use peerlink::engine::{Buffer, Fabric, Strategy};
use peerlink::pattern::{self, SplitMix};
use std::sync::Arc;
use std::time::Instant;

/// Bytes of each GPU's source and destination buffer.
const SPAN: usize = 1 << 20;
/// A small transfer moves up to this many bytes: the soak counts transfers, not bytes.
const SMALL: u64 = 16 << 10;
/// The sizes of large transfers (pipelined or split where the pair has no P2P): a few fixed ones,
/// which the warm-up also moves. The engine's staging buffers are allocated once per route (12 MiB)
/// and the simulator maps memory lazily, so a chunk of a size not seen before writes pages of them
/// for the first time: resident memory that grows towards the staging's size, not per transfer.
const LARGE: [usize; 3] = [SPAN / 2 + 4099, 3 * SPAN / 4 + 1, SPAN - 3];
/// The goal: less than 5 MB between transfer 10⁵ and 10⁶, about 5.5 bytes per transfer.
const MAX_GROWTH_PER_TRANSFER: f64 = 5.0;

/// Resident memory of this process, bytes.
fn rss_bytes() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("Linux: /proc/self/status");
    let kib: u64 = status
        .lines()
        .find_map(|line| line.strip_prefix("VmRSS:"))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|kib| kib.parse().ok())
        .expect("VmRSS in /proc/self/status");
    kib * 1024
}

/// One GPU's buffers and what its source holds.
struct Gpu {
    src: Buffer,
    dst: Buffer,
    data: Vec<u8>,
}

/// Every pair by every strategy at every large size: what the engine makes on a route's first use
/// and keeps for the fabric's life (its staging buffers) is made, and written, before the soak.
fn warm_up(fabric: &Fabric, gpus: &[Gpu]) {
    let strategies = std::iter::once(None).chain(Strategy::ALL.map(Some));
    for (strategy, len) in strategies.flat_map(|s| LARGE.map(|len| (s, len))) {
        for a in gpus {
            for b in gpus {
                let mut t = fabric.transfer(a.src.range(0..len), b.dst.range(0..len));
                if let Some(s) = strategy {
                    t = t.strategy(s);
                }
                if let Ok(t) = t.submit() {
                    t.wait().unwrap();
                }
            }
        }
    }
}

/// Moves `transfers` transfers, one in `large_every` (if any) large; returns VmRSS after each tenth.
fn run(backend: Arc<dyn Backend>, transfers: usize, large_every: Option<usize>) -> Vec<u64> {
    let fabric = Fabric::open(backend).unwrap();
    let gpus: Vec<Gpu> = fabric
        .devices()
        .iter()
        .map(|&d| {
            let data = pattern::bytes(d as u64, SPAN);
            let src = fabric.alloc(d, SPAN).unwrap();
            src.write(0, &data).unwrap();
            let dst = fabric.alloc(d, SPAN).unwrap();
            Gpu { src, dst, data }
        })
        .collect();
    warm_up(&fabric, &gpus);
    let n = gpus.len() as u64;
    let mut rng = SplitMix::new(13);
    let mut rss = Vec::with_capacity(10);
    for i in 0..transfers {
        let (a, b) = (&gpus[rng.below(n) as usize], &gpus[rng.below(n) as usize]);
        let len = match large_every {
            Some(every) if i % every == 0 => LARGE[i / every % LARGE.len()],
            _ => 1 + rng.below(SMALL) as usize,
        };
        let src_at = rng.below((SPAN - len + 1) as u64) as usize;
        let dst_at = rng.below((SPAN - len + 1) as u64) as usize;
        let (src, dst) = (
            a.src.range(src_at..src_at + len),
            b.dst.range(dst_at..dst_at + len),
        );
        // One in 16 is a batch of two messages, one in 3 is timed, one in 29 forces a strategy
        // (which the pair may refuse).
        let timed = i % 3 == 0;
        let transfer = if i % 16 == 1 && len > 1 {
            let half = len / 2;
            let messages = [
                (
                    a.src.range(src_at..src_at + half),
                    b.dst.range(dst_at..dst_at + half),
                ),
                (
                    a.src.range(src_at + half..src_at + len),
                    b.dst.range(dst_at + half..dst_at + len),
                ),
            ];
            fabric.copy_batch(&messages).unwrap()
        } else {
            let mut t = fabric.transfer(src, dst);
            if timed {
                t = t.timed();
            }
            if i % 29 == 0 {
                t = t.strategy(Strategy::ALL[i / 29 % Strategy::ALL.len()]);
            }
            match t.submit() {
                Ok(t) => t,
                Err(e) if e.exit_code() == 2 => continue,
                Err(e) => panic!("transfer {i}: {e}"),
            }
        };
        transfer.wait().unwrap();
        if timed && i % 16 != 1 {
            assert!(transfer.elapsed_us().unwrap() > 0.0);
        }
        // Every byte of one transfer in a thousand is checked.
        if i % 1000 == 0 {
            let mut got = vec![0; len];
            b.dst.read(dst_at, &mut got).unwrap();
            assert!(
                got == a.data[src_at..src_at + len],
                "transfer {i}: wrong bytes"
            );
        }
        if (i + 1) % (transfers / 10) == 0 {
            rss.push(rss_bytes());
        }
    }
    rss
}

/// Moves `transfers` transfers on `backend` (`host` names it) and fails where resident memory grew.
pub fn soak(host: &str, backend: Arc<dyn Backend>, transfers: usize, large_every: Option<usize>) {
    let started = Instant::now();
    let rss = run(backend, transfers, large_every);
    let (tenth, last) = (rss[0], rss[rss.len() - 1]);
    let growth = (last as f64 - tenth as f64) / (0.9 * transfers as f64);
    let mb: Vec<String> = rss
        .iter()
        .map(|b| format!("{:.1}", *b as f64 / 1e6))
        .collect();
    println!(
        "{transfers} transfers on {host} in {:.1} s; VmRSS after each tenth, MB: {}; from the \
         first tenth to the last {:+.2} MB, {growth:+.2} bytes per transfer",
        started.elapsed().as_secs_f64(),
        mb.join(" "),
        (last as f64 - tenth as f64) / 1e6,
    );
    assert!(
        growth < MAX_GROWTH_PER_TRANSFER,
        "resident memory grew by {growth:.2} bytes per transfer (at most {MAX_GROWTH_PER_TRANSFER})"
    );
}
