//! The batch proof: every way of moving a batch of small messages between two GPUs — plain copies
//! as a user would queue them, the engine in one call, and each batch strategy prepared once and
//! run again and again — timed on the host clock, every byte verified after each.

use crate::backend::{BufferCopy, CopyMethod, Owned};
use crate::bench::progress::Progress;
use crate::bench::timing::{host_us, Runs};
use crate::engine::{BatchStrategy, Fabric, Planned};
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
    let total = count
        .checked_mul(size)
        .ok_or_else(|| Error::usage("the batch is larger than this host's address space"))?;
    // Besides the source and destination: the batch's gathering buffers on both GPUs (the packing
    // strategies'), and the host's pattern, poison, expected bytes and read-back.
    let mut footprint = super::footprint(fabric, src, dst, total as u64, 4);
    for gpu in [src, dst] {
        footprint.add(crate::backend::Memory::Device(gpu), 1, total as u64);
    }
    footprint.check(
        &**fabric.backend(),
        &format!(
            "a batch of {count} messages of {}",
            format_bytes(size as u64)
        ),
        "send fewer or smaller messages",
    )?;
    let from = fabric.alloc(src, total)?;
    let to = fabric.alloc(dst, total)?;
    let data = pattern::bytes(pattern::seed(&[count as u64, size as u64]), total);
    let poison: Vec<u8> = data.iter().map(|b| !b).collect();
    from.write(0, &data)?;
    // Message i lands in slot count−1−i: a scatter, not one contiguous copy in disguise.
    let at = |i: usize| (i * size, (count - 1 - i) * size);
    let messages: Vec<_> = (0..count)
        .map(|i| {
            let (s, d) = at(i);
            (from.range(s..s + size), to.range(d..d + size))
        })
        .collect();
    let mut expected = vec![0u8; total];
    for i in 0..count {
        let (s, d) = at(i);
        expected[d..d + size].copy_from_slice(&data[s..s + size]);
    }
    let backend = fabric.backend();
    // Plain copies, the engine in one call, then each batch strategy.
    progress.start("batch proof", 2 + BatchStrategy::ALL.len() as u64);
    // One way after another, each run from the call until the completion is seen.
    let time = |name: &str, prepare_us: f64, run: &mut dyn FnMut() -> Result<()>| {
        progress.step();
        to.write(0, &poison)?;
        let wall = runs.stats(|| Ok(host_us(&**backend, &mut *run)?.1))?;
        Error::check_bytes(
            format!("engine batch, {name}"),
            src,
            dst,
            &expected,
            &to.to_vec()?,
        )?;
        Ok(BatchTiming {
            name: name.to_string(),
            prepare_us,
            per_message_us: wall.median / count as f64,
        })
    };

    // Plain copies get what any careful user sets up first: peer access, where the pair has it.
    if fabric.planner().model().has_p2p(src, dst) {
        fabric.enable_peer_access(src, dst)?;
    }
    let stream = Owned::new(&**backend, backend.create_stream(src)?);
    let copies: Vec<BufferCopy> = (0..count)
        .map(|i| {
            let (s, d) = at(i);
            BufferCopy {
                dst: to.backend_id(),
                dst_offset: d,
                src: from.backend_id(),
                src_offset: s,
                len: size,
            }
        })
        .collect();
    let plain = time("plain copies", 0.0, &mut || {
        for copy in &copies {
            backend.copy(*stream, CopyMethod::CopyEngine, copy)?;
        }
        let done = backend.record(*stream)?;
        backend.event_synchronize(done)?;
        backend.destroy_event(done)
    })?;

    let mut pick = None;
    let one_call = time("engine, one call", 0.0, &mut || {
        let t = fabric.copy_batch(&messages)?;
        t.wait()?;
        if let Planned::Batch(plan) = t.planned() {
            pick = Some(plan.strategy);
        }
        Ok(())
    })?;

    let mut prepared = Vec::new();
    let repeats = u32::try_from(runs.warmup + runs.runs).unwrap_or(u32::MAX);
    for strategy in BatchStrategy::ALL {
        // A strategy this pair cannot use is not a contender.
        let Ok((batch, prepare_us)) = host_us(&**backend, || {
            fabric.prepare_batch_with(&messages, repeats, strategy)
        }) else {
            progress.step();
            continue;
        };
        prepared.push(time(strategy.name(), prepare_us, &mut || {
            batch.run(&[])?.wait()
        })?);
    }
    progress.finish();
    Ok(BatchReport {
        source: backend.source().clone(),
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
