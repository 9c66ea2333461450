//! The batch proof: every way of moving a batch of small messages between two GPUs — plain copies
//! as a user would queue them, the engine in one call, and each batch strategy prepared once and
//! run again and again — timed on the host clock, every byte verified after each.

use crate::backend::{BufferCopy, CopyMethod, Owned};
use crate::bench::progress::Progress;
use crate::bench::timing::{host_us, Runs};
use crate::engine::{BatchStrategy, Buffer, Fabric, Planned, Span};
use crate::pattern;
use crate::topology::Source;
use crate::units::format_bytes;
use crate::{Error, Result};

/// One way of moving a batch, timed on the host clock from the call to the completion seen.
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema)]
pub struct BatchTiming {
    /// A batch strategy's name, `plain copies` or `engine, one call`.
    pub name: String,
    /// Host µs spent preparing it once (validation, planning, a graph's capture), before the runs.
    pub prepare_us: f64,
    /// Median host µs of one run, divided by the message count.
    pub per_message_us: f64,
}

/// Every way of moving `count` messages of `size` bytes between two buffers.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchReport {
    pub source: Source,
    pub src: usize,
    pub dst: usize,
    pub count: usize,
    pub size: usize,
    /// What the planner picks for the batch.
    pub pick: BatchStrategy,
    /// `count` copy-engine copies queued one by one straight on the backend (cudaMemcpyAsync each),
    /// then one synchronisation: what a user writes without peerlink.
    pub plain: BatchTiming,
    /// `Fabric::copy_batch` then `wait`: validation, planning, the copy list's upload, the launch and
    /// the completion, all paid in every run.
    pub one_call: BatchTiming,
    /// Each usable batch strategy prepared once and run again and again (`PreparedBatch::run` + `wait`).
    pub prepared: Vec<BatchTiming>,
}

impl BatchReport {
    /// plain per-message time / the engine's one-call per-message time.
    pub fn speedup(&self) -> f64 {
        self.plain.per_message_us / self.one_call.per_message_us
    }
}

/// Moves `count` messages of `size` bytes from GPU `src` to GPU `dst` every way, verifying every
/// byte after each, and times them; `progress` hears of each way.
pub fn run(
    fabric: &Fabric,
    src: usize,
    dst: usize,
    count: usize,
    size: usize,
    runs: Runs,
    progress: &dyn Progress,
) -> Result<BatchReport> {
    if count == 0 || size == 0 || runs.runs == 0 {
        return Err(Error::usage(
            "a batch benchmark needs at least one message of at least one byte, and one run",
        ));
    }
    super::within_one_host(fabric, &[(src, dst)])?;
    if count.checked_mul(size).is_none() {
        return Err(Error::usage(
            "the batch is larger than this host's address space",
        ));
    }
    check_footprint(fabric, (src, dst), count, size)?;
    let batch = Batch::open(fabric, (src, dst), count, size, runs)?;
    // Plain copies, the engine in one call, then each batch strategy.
    progress.start("batch proof", 2 + BatchStrategy::ALL.len() as u64);
    let plain = batch.plain_copies(progress)?;
    let (one_call, pick) = batch.one_call(progress)?;
    let prepared = batch.prepared(progress)?;
    progress.finish();
    Ok(BatchReport {
        source: fabric.backend().source().clone(),
        src,
        dst,
        count,
        size,
        pick: pick
            .ok_or_else(|| Error::InvalidHandle("copy_batch was not planned as a batch".into()))?,
        plain,
        one_call,
        prepared,
    })
}

/// Besides the source and destination: the batch's gathering buffers on both GPUs (the packing
/// strategies'), and the host's pattern, poison, expected bytes and read-back.
fn check_footprint(
    fabric: &Fabric,
    (src, dst): (usize, usize),
    count: usize,
    size: usize,
) -> Result<()> {
    let total = (count * size) as u64;
    let mut footprint = super::footprint(fabric, src, dst, total, 4);
    for gpu in [src, dst] {
        footprint.add(crate::backend::Memory::Device(gpu), 1, total);
    }
    footprint.check(
        &**fabric.backend(),
        &format!(
            "a batch of {count} messages of {}",
            format_bytes(size as u64)
        ),
        "send fewer or smaller messages",
    )
}

/// The batch moved every way: the source filled with a pattern, and the bytes the destination
/// must then hold. Message i lands in slot count−1−i: a scatter, not one contiguous copy in
/// disguise.
struct Batch<'f> {
    fabric: &'f Fabric,
    src: usize,
    dst: usize,
    count: usize,
    size: usize,
    runs: Runs,
    from: Buffer,
    to: Buffer,
    poison: Vec<u8>,
    expected: Vec<u8>,
}

impl<'f> Batch<'f> {
    fn open(
        fabric: &'f Fabric,
        (src, dst): (usize, usize),
        count: usize,
        size: usize,
        runs: Runs,
    ) -> Result<Self> {
        let total = count * size;
        let from = fabric.alloc(src, total)?;
        let to = fabric.alloc(dst, total)?;
        let data = pattern::bytes(pattern::seed(&[count as u64, size as u64]), total);
        let poison: Vec<u8> = data.iter().map(|b| !b).collect();
        from.write(0, &data)?;
        let mut batch = Batch {
            fabric,
            src,
            dst,
            count,
            size,
            runs,
            from,
            to,
            poison,
            expected: vec![0u8; total],
        };
        for i in 0..count {
            let (s, d) = batch.at(i);
            batch.expected[d..d + size].copy_from_slice(&data[s..s + size]);
        }
        Ok(batch)
    }

    /// Where message `i` starts in the source and in the destination.
    fn at(&self, i: usize) -> (usize, usize) {
        (i * self.size, (self.count - 1 - i) * self.size)
    }

    fn messages(&self) -> Vec<(Span<'_>, Span<'_>)> {
        (0..self.count)
            .map(|i| {
                let (s, d) = self.at(i);
                (
                    self.from.range(s..s + self.size),
                    self.to.range(d..d + self.size),
                )
            })
            .collect()
    }

    /// Times one way, each run from the call until the completion is seen, then checks every
    /// byte.
    fn time(
        &self,
        name: &str,
        prepare_us: f64,
        progress: &dyn Progress,
        run: &mut dyn FnMut() -> Result<()>,
    ) -> Result<BatchTiming> {
        progress.step();
        self.to.write(0, &self.poison)?;
        let backend = self.fabric.backend();
        let wall = self.runs.stats(|| Ok(host_us(&**backend, &mut *run)?.1))?;
        Error::check_bytes(
            format!("engine batch, {name}"),
            self.src,
            self.dst,
            &self.expected,
            &self.to.to_vec()?,
        )?;
        Ok(BatchTiming {
            name: name.to_string(),
            prepare_us,
            per_message_us: wall.median / self.count as f64,
        })
    }

    /// Copy-engine copies queued one by one straight on the backend, then one synchronisation.
    /// They get what any careful user sets up first: peer access, where the pair has it.
    fn plain_copies(&self, progress: &dyn Progress) -> Result<BatchTiming> {
        let (fabric, src, dst) = (self.fabric, self.src, self.dst);
        if fabric.planner().model().has_p2p(src, dst) {
            fabric.enable_peer_access(src, dst)?;
        }
        let backend = fabric.backend();
        let stream = Owned::new(&**backend, backend.create_stream(src)?);
        let copies: Vec<BufferCopy> = (0..self.count)
            .map(|i| {
                let (s, d) = self.at(i);
                BufferCopy {
                    dst: self.to.backend_id(),
                    dst_offset: d,
                    src: self.from.backend_id(),
                    src_offset: s,
                    len: self.size,
                }
            })
            .collect();
        self.time("plain copies", 0.0, progress, &mut || {
            for copy in &copies {
                crate::interrupt::check()?;
                backend.copy(*stream, CopyMethod::CopyEngine, copy)?;
            }
            let done = backend.record(*stream)?;
            backend.event_synchronize(done)?;
            backend.destroy_event(done)
        })
    }

    /// The engine in one call (`copy_batch` then `wait`), and what it picked.
    fn one_call(&self, progress: &dyn Progress) -> Result<(BatchTiming, Option<BatchStrategy>)> {
        let messages = self.messages();
        let mut pick = None;
        let timing = self.time("engine, one call", 0.0, progress, &mut || {
            let t = self.fabric.copy_batch(&messages)?;
            t.wait()?;
            if let Planned::Batch(plan) = t.planned() {
                pick = Some(plan.strategy);
            }
            Ok(())
        })?;
        Ok((timing, pick))
    }

    /// Each batch strategy this pair can use, prepared once and run again and again.
    fn prepared(&self, progress: &dyn Progress) -> Result<Vec<BatchTiming>> {
        let messages = self.messages();
        let backend = self.fabric.backend();
        let mut prepared = Vec::new();
        let repeats = u32::try_from(self.runs.warmup + self.runs.runs).unwrap_or(u32::MAX);
        for strategy in BatchStrategy::ALL {
            // A strategy this pair cannot use is not a contender.
            let Ok((batch, prepare_us)) = host_us(&**backend, || {
                self.fabric.prepare_batch_with(&messages, repeats, strategy)
            }) else {
                progress.step();
                continue;
            };
            prepared.push(self.time(strategy.name(), prepare_us, progress, &mut || {
                batch.run(&[])?.wait()
            })?);
        }
        Ok(prepared)
    }
}
