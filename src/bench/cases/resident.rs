//! The resident worker's tests ([`crate::backend::resident`]): a small transfer from the call until
//! the host sees it complete, and the bandwidth of back-to-back submissions of one size. Each
//! measurement starts a worker on the source GPU (push) with the default share of SMs and stops it
//! after; every byte is verified.

use super::{enable, Context, Outcome, TestCase};
use crate::backend::resident::DEFAULT_COPY_BLOCKS;
use crate::backend::{BufferCopy, BufferId, Memory, Owned, Worker, WorkerConfig};
use crate::bench::footprint::Footprint;
use crate::bench::result::{Place, Shape, Unit};
use crate::bench::stats::Stats;
use crate::bench::timing::host_us;
use crate::pattern;
use crate::Result;

/// Bytes of the latency test's transfer.
pub const RESIDENT_LATENCY_BYTES: u64 = 4;
/// Transfers per sample of the latency test, one at a time.
const LATENCY_TRANSFERS: u32 = 100;
/// Bytes one sample of the bandwidth test moves at least (as transfers of the size asked for).
const WRITE_SAMPLE_BYTES: u64 = 64 << 20;
/// Transfers per sample of the bandwidth test: at least two, at most a ring's worth.
const MIN_WRITES: u64 = 2;
const MAX_WRITES: u64 = 1024;

/// A source filled with the message for `seed` and a destination, on the pair's GPUs.
fn buffers<'a>(
    ctx: &Context<'a>,
    (src, dst): (usize, usize),
    (src_len, dst_len): (u64, u64),
    seed: u64,
) -> Result<(Owned<'a, BufferId>, Owned<'a, BufferId>)> {
    let backend = ctx.backend;
    let from = Owned::new(
        backend,
        backend.alloc(Memory::Device(src), src_len as usize)?,
    );
    let to = Owned::new(
        backend,
        backend.alloc(Memory::Device(dst), dst_len as usize)?,
    );
    backend.write(*from, 0, &pattern::bytes(seed, src_len as usize))?;
    Ok((from, to))
}

/// A worker on GPU `src` with the default share of SMs.
fn worker<'a>(ctx: &Context<'a>, src: usize) -> Result<Worker<'a>> {
    Worker::start(ctx.backend, &WorkerConfig::on(src))
}

/// What every figure of these tests is measured with, in words.
fn worker_words() -> String {
    format!(
        "a resident worker on the source GPU ({DEFAULT_COPY_BLOCKS} copy blocks and its \
         dispatcher's), started for the measurement"
    )
}

/// One small transfer through a resident worker, from the call until the host sees it complete.
pub struct ResidentLatency;

impl TestCase for ResidentLatency {
    fn name(&self) -> &str {
        "resident-latency"
    }

    fn unit(&self) -> Unit {
        Unit::Micros
    }

    fn shape(&self) -> Shape {
        Shape::Matrix
    }

    fn message_bytes(&self, _requested: u64) -> u64 {
        RESIDENT_LATENCY_BYTES
    }

    fn measures(&self) -> String {
        format!(
            "host clock from the call that submits one {RESIDENT_LATENCY_BYTES} B transfer to {} \
             until the host sees its ticket complete (polling); one transfer at a time, \
             {LATENCY_TRANSFERS} per sample after one thrown away, the median over every transfer \
             of every sample",
            worker_words()
        )
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, _bytes: u64) -> Result<Outcome> {
        let (src, dst) = place.pair();
        if let Some(reason) = enable(ctx, src, dst) {
            return Ok(Outcome::Skipped(reason));
        }
        let seed = ctx.next_seed();
        let len = RESIDENT_LATENCY_BYTES;
        let (from, to) = buffers(ctx, (src, dst), (len, len), seed)?;
        let worker = worker(ctx, src)?;
        let copy = BufferCopy::from_start(*from, *to, len as usize);
        let one = || -> Result<f64> {
            let ((), us) = host_us(ctx.backend, || worker.wait(worker.submit(&copy)?))?;
            Ok(us)
        };
        one()?;
        let times = (0..ctx.latency_samples * LATENCY_TRANSFERS)
            .map(|_| one())
            .collect::<Result<Vec<f64>>>()?;
        worker.stop()?;
        verify(ctx, self.name(), (src, dst), *to, seed, len)?;
        let time_us = Stats::of_times(&times)?;
        Ok(Outcome::Measured {
            value: time_us.median,
            total: None,
            time_us,
            note: None,
        })
    }
}

/// Back-to-back submissions of one size through a resident worker: bytes per second from the first
/// call until the host sees the last ticket complete.
pub struct ResidentWrite;

/// Transfers per sample for `bytes` each.
fn writes(bytes: u64) -> u64 {
    (WRITE_SAMPLE_BYTES / bytes.max(1)).clamp(MIN_WRITES, MAX_WRITES)
}

impl TestCase for ResidentWrite {
    fn name(&self) -> &str {
        "resident-write"
    }

    fn unit(&self) -> Unit {
        Unit::Gbps
    }

    fn shape(&self) -> Shape {
        Shape::Matrix
    }

    fn sweeps(&self) -> bool {
        true
    }

    fn measures(&self) -> String {
        format!(
            "write (push) through {}: back-to-back submissions of one size into distinct \
             destinations, host clock from the first call until the host sees the last ticket \
             complete, divided by the transfers ({MIN_WRITES} to {MAX_WRITES}, at least {} MiB \
             per sample)",
            worker_words(),
            WRITE_SAMPLE_BYTES >> 20
        )
    }

    fn footprint(&self, _ctx: &Context<'_>, place: Place, bytes: u64) -> Result<Footprint> {
        let (src, dst) = place.pair();
        let mut footprint = Footprint::default();
        footprint.add(Memory::Device(src), 1, bytes);
        footprint.add(Memory::Device(dst), writes(bytes), bytes);
        footprint.add_host(bytes * writes(bytes));
        Ok(footprint)
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, bytes: u64) -> Result<Outcome> {
        let (src, dst) = place.pair();
        if let Some(reason) = enable(ctx, src, dst) {
            return Ok(Outcome::Skipped(reason));
        }
        let seed = ctx.next_seed();
        let count = writes(bytes);
        let (from, to) = buffers(ctx, (src, dst), (bytes, bytes * count), seed)?;
        let worker = worker(ctx, src)?;
        let len = bytes as usize;
        let all = || -> Result<f64> {
            let ((), us) = host_us(ctx.backend, || {
                let mut last = None;
                for i in 0..count as usize {
                    let copy = BufferCopy {
                        dst_offset: i * len,
                        ..BufferCopy::from_start(*from, *to, len)
                    };
                    last = Some(worker.submit(&copy)?);
                }
                worker.wait(last.expect("at least two transfers"))
            })?;
            Ok(us / count as f64)
        };
        for _ in 0..ctx.sampling.warmup {
            all()?;
        }
        let times = (0..ctx.sampling.samples.max(1))
            .map(|_| all())
            .collect::<Result<Vec<f64>>>()?;
        worker.stop()?;
        verify(ctx, self.name(), (src, dst), *to, seed, bytes)?;
        let time_us = Stats::of_times(&times)?;
        Ok(Outcome::Measured {
            value: bytes as f64 / time_us.median / 1e3,
            total: None,
            time_us,
            note: None,
        })
    }
}

/// Checks that every `len`-byte copy in `dst` holds the message for `seed`.
fn verify(
    ctx: &Context<'_>,
    test: &str,
    (src, dst): (usize, usize),
    buffer: BufferId,
    seed: u64,
    len: u64,
) -> Result<()> {
    let mut got = vec![0; ctx.backend.len(buffer)?];
    ctx.backend.read(buffer, 0, &mut got)?;
    for copy in got.chunks(len as usize) {
        if let Some(mismatch) = pattern::first_mismatch(seed, copy) {
            return Err(mismatch.into_error(test, src, dst));
        }
    }
    Ok(())
}
