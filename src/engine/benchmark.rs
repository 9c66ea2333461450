//! The engine benchmark: runs every usable strategy and the planner's pick over a size sweep, timed
//! with events, every byte verified, and reports the pick's regret (pick time / best time − 1).
//!
//! This is how the engine proves its choice: a planner whose predictions rank strategies the way
//! the backend does has a regret near zero at every size.

use super::fabric::{Buffer, Fabric};
use super::plan::{BatchStrategy, Strategy};
use crate::backend::{BufferCopy, CopyMethod, Owned};
use crate::{Error, Result};

/// How much to run per strategy and size.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Untimed runs first (the first use of a route allocates its staging buffers).
    pub warmup: usize,
    /// Timed runs; the median is reported.
    pub runs: usize,
}

impl Options {
    /// The defaults, except on the simulator: its virtual times repeat exactly, and it copies every
    /// byte for real on the CPU, so one warm-up and one timed run say all there is.
    pub fn for_backend(backend: &dyn crate::backend::Backend) -> Options {
        if backend.topology().is_simulated() {
            Options { warmup: 1, runs: 1 }
        } else {
            Options::default()
        }
    }
}

impl Default for Options {
    /// Enough runs that the median of a few-µs transfer is steady: with 3 runs, small transfers on
    /// the H200 showed up to 23% regret between strategies that take the same time, and with 11
    /// (not yet interleaved) still up to 12% where two took the same time within 0.1 µs at other
    /// sizes.
    fn default() -> Self {
        Options {
            warmup: 2,
            runs: 21,
        }
    }
}

/// One strategy at one size.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    pub strategy: Strategy,
    pub chunk_bytes: u64,
    pub predicted_us: f64,
    /// Median GPU time from the transfer's start event to its end event.
    pub measured_us: f64,
}

/// Every strategy at one size, and how the pick fared.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub bytes: u64,
    pub pick: Strategy,
    /// The fastest strategy measured.
    pub best: Strategy,
    /// pick time / best time − 1: 0 when the pick was the fastest.
    pub regret: f64,
    pub timings: Vec<Timing>,
    /// The same bytes moved without the engine: one plain copy-engine copy queued straight on the
    /// backend (cudaMemcpyAsync), as a user would write it.
    pub raw: Baseline,
    /// The planner's pick through the whole engine, on the host clock: from the call that plans and
    /// submits it until `wait` returns.
    pub engine_wall_us: f64,
}

/// A plain copy's times (medians).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Baseline {
    /// GPU time between events around the copy.
    pub gpu_us: f64,
    /// Host clock from the copy call until the host's event synchronisation returns.
    pub wall_us: f64,
}

impl Point {
    /// The engine's cost over a plain copy, on the host clock: engine / plain − 1.
    pub fn overhead(&self) -> f64 {
        self.engine_wall_us / self.raw.wall_us - 1.0
    }
}

impl Point {
    pub fn timing(&self, strategy: Strategy) -> Option<&Timing> {
        self.timings.iter().find(|t| t.strategy == strategy)
    }
}

/// The whole sweep for one pair.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// `cuda` or `sim:<preset>`: where the times come from.
    pub source: String,
    pub src: usize,
    pub dst: usize,
    pub points: Vec<Point>,
}

impl Report {
    /// The largest regret over the sweep.
    pub fn worst_regret(&self) -> f64 {
        self.points.iter().map(|p| p.regret).fold(0.0, f64::max)
    }
}

/// Runs the sweep from GPU `src` to GPU `dst`.
pub fn run(
    fabric: &Fabric,
    src: usize,
    dst: usize,
    sizes: &[u64],
    options: Options,
) -> Result<Report> {
    if options.runs == 0 {
        return Err(Error::usage(
            "the engine benchmark needs at least one timed run",
        ));
    }
    let mut points = Vec::new();
    for &bytes in sizes {
        points.push(point(fabric, src, dst, bytes, options)?);
    }
    Ok(Report {
        source: fabric.backend().source().to_string(),
        src,
        dst,
        points,
    })
}

fn point(fabric: &Fabric, src: usize, dst: usize, bytes: u64, options: Options) -> Result<Point> {
    let pick = fabric.planner().plan(src, dst, bytes)?;
    let len = usize::try_from(bytes)
        .map_err(|_| Error::usage(format!("{bytes} bytes do not fit in this host's memory")))?;
    let from = fabric.alloc(src, len)?;
    let to = fabric.alloc(dst, len)?;
    let data = pattern(len, bytes);
    let poison: Vec<u8> = data.iter().map(|b| !b).collect();
    from.write(0, &data)?;
    // A strategy this pair cannot use is not a contender.
    let plans: Vec<_> = Strategy::ALL
        .into_iter()
        .filter_map(|s| fabric.planner().plan_with(s, src, dst, bytes).ok())
        .collect();
    // Strategies take turns round by round, so that drift on the host or the GPU (clocks, other
    // load) falls on all of them alike rather than on whichever ran at the time. Within a round
    // each strategy runs twice and the second run is timed: a transfer right after another kind
    // (a staged one, GPU nearly idle for milliseconds) ran up to 25% slower on the H200 from
    // 32 MiB up. The round's order rotates, so no strategy always follows the same one.
    let mut times = vec![Vec::with_capacity(options.runs); plans.len()];
    for round in 0..options.warmup + options.runs {
        for turn in 0..plans.len() {
            let at = (round + turn) % plans.len();
            let strategy = plans[at].strategy;
            let run = || {
                fabric
                    .transfer(from.all(), to.all())
                    .strategy(strategy)
                    .timed()
                    .submit()?
                    .elapsed_us()
            };
            run()?;
            let us = run()?;
            if round >= options.warmup {
                times[at].push(us);
            }
        }
    }
    // Each strategy once more into a poisoned destination: stale bytes from another strategy
    // cannot pass.
    for plan in &plans {
        to.write(0, &poison)?;
        fabric
            .transfer(from.all(), to.all())
            .strategy(plan.strategy)
            .submit()?
            .wait()?;
        Error::check_bytes(
            format!("engine {}", plan.strategy),
            src,
            dst,
            &data,
            &to.to_vec()?,
        )?;
    }
    let timings: Vec<Timing> = plans
        .iter()
        .zip(times)
        .map(|(plan, times)| Timing {
            strategy: plan.strategy,
            chunk_bytes: plan.chunk_bytes,
            predicted_us: plan.predicted_us,
            measured_us: median(times),
        })
        .collect();
    let measured = |s: Strategy| {
        timings
            .iter()
            .find(|t| t.strategy == s)
            .map(|t| t.measured_us)
    };
    let best = timings
        .iter()
        .min_by(|a, b| a.measured_us.total_cmp(&b.measured_us))
        .expect("the planner's pick is always usable");
    let pick_us = measured(pick.strategy).expect("the pick was measured");
    let (best, regret) = (best.strategy, pick_us / best.measured_us - 1.0);

    // The engine's pick and a plain copy, alternating run by run so that drift on the host
    // (clocks, other load) falls on both alike, and taking turns at going first so that whatever
    // the first of two back-to-back copies pays (or leaves behind) falls on both alike too.
    let backend = fabric.backend();
    let plain = PlainCopy::new(fabric, &from, &to)?;
    let engine_run = || -> Result<f64> {
        let start = backend.host_time_us();
        fabric.copy(from.all(), to.all())?.wait()?;
        Ok(backend.host_time_us() - start)
    };
    let (mut engine_wall, mut plain_gpu, mut plain_wall) = (Vec::new(), Vec::new(), Vec::new());
    // Three times the runs: the two differ by about 1% at large sizes, within the noise of a few.
    let runs = OVERHEAD_RUNS_FACTOR * options.runs;
    for run in 0..options.warmup + runs {
        let ((gpu, wall), engine) = if run % 2 == 0 {
            let plain = plain.run()?;
            (plain, engine_run()?)
        } else {
            let engine = engine_run()?;
            (plain.run()?, engine)
        };
        if run >= options.warmup {
            engine_wall.push(engine);
            plain_gpu.push(gpu);
            plain_wall.push(wall);
        }
    }
    // Poisoning inside the loop would put a host write of the whole buffer right before each
    // engine run (seen on the H200: +25–50% from 2 MiB up, against none before plain runs); the
    // engine's own bytes are checked once more after it.
    to.write(0, &poison)?;
    fabric.copy(from.all(), to.all())?.wait()?;
    Error::check_bytes(
        format!("engine {}", pick.strategy),
        src,
        dst,
        &data,
        &to.to_vec()?,
    )?;
    Ok(Point {
        bytes,
        pick: pick.strategy,
        best,
        regret,
        timings,
        raw: Baseline {
            gpu_us: median(plain_gpu),
            wall_us: median(plain_wall),
        },
        engine_wall_us: median(engine_wall),
    })
}

/// How many times more runs the engine-versus-plain comparison takes than each strategy.
const OVERHEAD_RUNS_FACTOR: usize = 3;

pub(super) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

/// One copy-engine copy of all of `from` into `to`, issued straight on the backend on a stream of
/// the source GPU: what a user writes without peerlink.
struct PlainCopy<'f> {
    backend: &'f dyn crate::backend::Backend,
    stream: crate::backend::StreamId,
    copy: BufferCopy,
}

impl<'f> PlainCopy<'f> {
    fn new(fabric: &'f Fabric, from: &Buffer, to: &Buffer) -> Result<Self> {
        let backend = &**fabric.backend();
        Ok(PlainCopy {
            backend,
            stream: backend.create_stream(from.device())?,
            copy: BufferCopy {
                dst: to.state.id,
                dst_offset: 0,
                src: from.state.id,
                src_offset: 0,
                len: from.size(),
            },
        })
    }

    /// GPU time between events around the copy, and host time from the copy call until the
    /// host's synchronisation returns.
    fn run(&self) -> Result<(f64, f64)> {
        let backend = self.backend;
        let before = backend.record(self.stream)?;
        let start = backend.host_time_us();
        backend.copy(self.stream, CopyMethod::CopyEngine, &self.copy)?;
        let after = backend.record(self.stream)?;
        backend.event_synchronize(after)?;
        let wall = backend.host_time_us() - start;
        let gpu = backend.elapsed_us(before, after)?;
        backend.destroy_event(before)?;
        backend.destroy_event(after)?;
        Ok((gpu, wall))
    }
}

impl Drop for PlainCopy<'_> {
    fn drop(&mut self) {
        let _ = self.backend.destroy_stream(self.stream);
    }
}

/// One way of moving a batch, timed on the host clock from the call to the completion seen.
#[derive(Clone, Debug, PartialEq)]
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
    pub source: String,
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
    /// Each usable batch strategy prepared once and run again and again (`Pattern::run` + `wait`).
    pub prepared: Vec<BatchTiming>,
}

impl BatchReport {
    /// plain per-message time / the engine's one-call per-message time.
    pub fn speedup(&self) -> f64 {
        self.plain.per_message_us / self.one_call.per_message_us
    }
}

/// Moves `count` messages of `size` bytes from GPU `src` to GPU `dst` every way, verifying every
/// byte after each, and times them.
pub fn batch(
    fabric: &Fabric,
    src: usize,
    dst: usize,
    count: usize,
    size: usize,
    options: Options,
) -> Result<BatchReport> {
    if count == 0 || size == 0 || options.runs == 0 {
        return Err(Error::usage(
            "a batch benchmark needs at least one message of at least one byte, and one run",
        ));
    }
    let total = count
        .checked_mul(size)
        .ok_or_else(|| Error::usage("the batch is larger than this host's address space"))?;
    let from = fabric.alloc(src, total)?;
    let to = fabric.alloc(dst, total)?;
    let data = pattern(total, (count * 31 + size) as u64);
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
    let runs = |name: &str, prepare_us: f64, run: &mut dyn FnMut() -> Result<()>| {
        to.write(0, &poison)?;
        let mut wall = Vec::with_capacity(options.runs);
        for r in 0..options.warmup + options.runs {
            let start = backend.host_time_us();
            run()?;
            if r >= options.warmup {
                wall.push(backend.host_time_us() - start);
            }
        }
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
            per_message_us: median(wall) / count as f64,
        })
    };

    // Plain copies get what any careful user sets up first: peer access, where the pair has it.
    if fabric.planner().model().has_p2p(src, dst) {
        fabric.shared.ensure_peer(src, dst)?;
    }
    let stream = Owned::new(&**backend, backend.create_stream(src)?);
    let copies: Vec<BufferCopy> = (0..count)
        .map(|i| {
            let (s, d) = at(i);
            BufferCopy {
                dst: to.state.id,
                dst_offset: d,
                src: from.state.id,
                src_offset: s,
                len: size,
            }
        })
        .collect();
    let plain = runs("plain copies", 0.0, &mut || {
        for copy in &copies {
            backend.copy(*stream, CopyMethod::CopyEngine, copy)?;
        }
        let done = backend.record(*stream)?;
        backend.event_synchronize(done)?;
        backend.destroy_event(done)
    })?;

    let mut pick = None;
    let one_call = runs("engine, one call", 0.0, &mut || {
        let t = fabric.copy_batch(&messages)?;
        t.wait()?;
        if let super::fabric::Planned::Batch(plan) = t.planned() {
            pick = Some(plan.strategy);
        }
        Ok(())
    })?;

    let mut prepared = Vec::new();
    let repeats = u32::try_from(options.warmup + options.runs).unwrap_or(u32::MAX);
    for strategy in BatchStrategy::ALL {
        let start = backend.host_time_us();
        // A strategy this pair cannot use is not a contender.
        let Ok(pattern) = fabric.pattern_with(&messages, repeats, strategy) else {
            continue;
        };
        let prepare_us = backend.host_time_us() - start;
        prepared.push(runs(strategy.name(), prepare_us, &mut || {
            pattern.run(&[])?.wait()
        })?);
    }
    Ok(BatchReport {
        source: backend.source().to_string(),
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

/// Deterministic bytes that differ from offset to offset and from seed to seed (xorshift): what the
/// benchmark moves and checks, and what tests fill buffers with.
pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
