//! Latency: GPU time per small copy, the CPU's cost to issue one, end to end as the host sees it,
//! one dependent load over the link (pointer chase), and one-way GPU-initiated signalling.

use super::{
    chase_on_host, enable, lane_outcome, no_p2p, strided_chain, Context, Outcome, TestCase,
};
use crate::backend::{Backend, BufferCopy, BufferId, CopyMethod, Memory};
use crate::bench::footprint::Footprint;
use crate::bench::result::{Place, Shape, Unit};
use crate::bench::stats::Stats;
use crate::bench::timing::cpus::MAX_CPUS_VISITED;
use crate::bench::timing::{
    gpu_us, host_us, issue_spread, measure, spread_over_cpus, CpuSpread, HopSpec, Lane,
    Measurement, Runs, Sampling,
};
use crate::bench::LATENCY_SAMPLES;
use crate::{Error, Result};

/// Bytes of a latency test's message.
pub const SMALL_MESSAGE: u64 = 4;
/// Back-to-back copies per sample behind the gate.
pub const SMALL_COPIES: u32 = 100;
/// Transfers per sample for the end-to-end latency.
pub const END_TO_END_TRANSFERS: u32 = 20;
/// Dependent loads per pointer-chase sample.
pub const CHASE_STEPS: u32 = 10_000;
/// Round trips per ping-pong sample.
pub const PING_PONG_ROUNDS: u32 = 1_000;

/// Which figure of back-to-back small copies a [`SmallCopy`] test reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SmallCopyFigure {
    /// GPU time per copy, from events around copies queued behind the gate.
    GpuTime,
    /// Host time spent in the call that queues one copy.
    IssueCost,
}

/// Back-to-back 4-byte peer copies.
pub struct SmallCopy(pub SmallCopyFigure);

/// The copy-engine push lane of small-copy tests, checked for P2P; `Err(reason)` when it cannot run.
fn small_lane<'b>(
    ctx: &mut Context<'b>,
    test: &str,
    src: usize,
    dst: usize,
    sampling: &Sampling,
) -> Result<std::result::Result<Lane<'b>, String>> {
    small_lane_by(ctx, test, src, dst, CopyMethod::CopyEngine, sampling)
}

/// A lane of 4-byte writes from `src` to `dst` by `method`; `Err(reason)` without P2P.
fn small_lane_by<'b>(
    ctx: &mut Context<'b>,
    test: &str,
    src: usize,
    dst: usize,
    method: CopyMethod,
    sampling: &Sampling,
) -> Result<std::result::Result<Lane<'b>, String>> {
    if let Some(reason) = no_p2p(ctx.topology(), src, dst).or_else(|| enable(ctx, src, dst)) {
        return Ok(Err(reason));
    }
    let stream = ctx.streams(&[src])?[0];
    let hop = HopSpec {
        stream,
        method,
        memory: Memory::Device(dst),
    };
    Ok(Ok(Lane::new(
        ctx.backend,
        Context::label(test, src, dst),
        Memory::Device(src),
        &[hop],
        SMALL_MESSAGE as usize,
        sampling,
        ctx.buffer_budget(dst)?,
    )?))
}

impl TestCase for SmallCopy {
    fn name(&self) -> &str {
        match self.0 {
            SmallCopyFigure::GpuTime => "copy-latency",
            SmallCopyFigure::IssueCost => "issue-cost",
        }
    }

    fn unit(&self) -> Unit {
        Unit::Micros
    }

    fn shape(&self) -> Shape {
        Shape::Matrix
    }

    fn message_bytes(&self, _requested: u64) -> u64 {
        SMALL_MESSAGE
    }

    fn measures(&self) -> String {
        match self.0 {
            SmallCopyFigure::GpuTime => format!(
                "GPU time per copy of {SMALL_MESSAGE} B, {SMALL_COPIES} back-to-back copy-engine \
                 writes (push, issued on the source GPU's stream) queued behind the gate; the \
                 median over samples, after one sample thrown away; not a CPU time"
            ),
            SmallCopyFigure::IssueCost => format!(
                "CPU time (host clock) spent in the call that queues one {SMALL_MESSAGE} B \
                 copy-engine write on the source GPU's stream, averaged over {SMALL_COPIES} calls \
                 per sample, after one sample thrown away; on real GPUs one sample on each CPU \
                 the thread may run on (at least {LATENCY_SAMPLES}, up to {MAX_CPUS_VISITED} \
                 CPUs), the thread kept there, the figure the lowest (where the driver's calls ran \
                 fastest: in a VM some CPUs ran them up to 50% slower, changing over seconds), \
                 the note the range over CPUs; not a transfer time"
            ),
        }
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, _bytes: u64) -> Result<Outcome> {
        let (src, dst) = place.pair();
        let method = CopyMethod::CopyEngine;
        Ok(match self.0 {
            SmallCopyFigure::GpuTime => {
                match SmallCopy::copies(ctx, self.name(), src, dst, method)? {
                    Ok(m) => lane_outcome(Unit::Micros, &m, SMALL_MESSAGE as usize),
                    Err(reason) => Outcome::Skipped(reason),
                }
            }
            SmallCopyFigure::IssueCost => {
                match SmallCopy::issue_costs(ctx, self.name(), src, dst, method)? {
                    Ok(spread) => Outcome::Measured {
                        value: spread.lowest,
                        total: None,
                        time_us: Stats::of_times(&spread.times)?,
                        note: spread.note(&format!("GPU {src} → {dst}")),
                    },
                    Err(reason) => Outcome::Skipped(reason),
                }
            }
        })
    }
}

impl SmallCopy {
    /// `run` over a lane of [`SMALL_COPIES`] back-to-back 4-byte copies from `src` to `dst` by
    /// `method` per sample, `ctx.latency_samples` samples, with the sampling and the seed to use,
    /// after a first window run and thrown away: on fresh buffers and streams it pays first-use
    /// costs (seen on the H200: one sample of 16.3 µs against a median of 2.27). `Err(reason)`
    /// without P2P.
    fn on_warmed_lane<T>(
        ctx: &mut Context<'_>,
        test: &str,
        (src, dst): (usize, usize),
        method: CopyMethod,
        run: impl FnOnce(&mut [Lane<'_>], &Sampling, u64) -> Result<T>,
    ) -> Result<std::result::Result<T, String>> {
        let sampling = Sampling {
            warmup: ctx.sampling.warmup.max(1),
            iterations: SMALL_COPIES,
            samples: ctx.latency_samples,
            ..ctx.sampling
        };
        let seed = ctx.next_seed();
        let mut lane = match small_lane_by(ctx, test, src, dst, method, &sampling)? {
            Ok(lane) => [lane],
            Err(reason) => return Ok(Err(reason)),
        };
        let first = Sampling {
            samples: 1,
            ..sampling
        };
        measure(&mut lane, &first, seed)?;
        Ok(Ok(run(&mut lane, &sampling, seed + 1)?))
    }

    /// [`SMALL_COPIES`] back-to-back 4-byte writes from `src` to `dst` by `method` per sample,
    /// `ctx.latency_samples` samples after one thrown away; `Err(reason)` without P2P.
    pub(crate) fn copies(
        ctx: &mut Context<'_>,
        test: &str,
        src: usize,
        dst: usize,
        method: CopyMethod,
    ) -> Result<std::result::Result<Measurement, String>> {
        SmallCopy::on_warmed_lane(ctx, test, (src, dst), method, measure)
    }

    /// Host µs to queue one of [`SMALL_COPIES`] back-to-back 4-byte copies from `src` to `dst`
    /// by `method`, a sample on each CPU the thread may run on (real GPUs: in a VM the driver's
    /// calls run at two speeds by CPU, see [`crate::bench::timing::CpuSpread`]) or
    /// `ctx.latency_samples` where it is (the simulator), after one thrown away; `Err(reason)`
    /// without P2P.
    pub(crate) fn issue_costs(
        ctx: &mut Context<'_>,
        test: &str,
        src: usize,
        dst: usize,
        method: CopyMethod,
    ) -> Result<std::result::Result<CpuSpread, String>> {
        let pin = !ctx.topology().is_simulated();
        SmallCopy::on_warmed_lane(ctx, test, (src, dst), method, |lane, sampling, seed| {
            issue_spread(lane, sampling, seed, pin)
        })
    }
}

/// End-to-end latency of one small transfer as the host sees it.
pub struct EndToEnd;

/// Host times of one transfer seen end to end.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostTimes {
    /// From the call that queues the transfer until the host has seen it complete.
    pub total_us: f64,
    /// Spent inside the call that queues its first copy.
    pub call_us: f64,
}

impl EndToEnd {
    /// Host µs of one transfer: from the call that queues operation `op` of `lane` until the host
    /// has seen it complete (event synchronisation).
    pub fn one_transfer(lane: &mut Lane<'_>, op: u64) -> Result<HostTimes> {
        let backend = lane.backend();
        let ((call_us, done), total_us) = host_us(backend, || {
            let call_us = lane.enqueue(op)?;
            let done = backend.record(lane.final_stream())?;
            backend.event_synchronize(done)?;
            Ok((call_us, done))
        })?;
        backend.destroy_event(done)?;
        Ok(HostTimes { total_us, call_us })
    }

    /// [`EndToEnd::one_transfer`] `transfers` times, one at a time, after one warm-up transfer
    /// (first-use costs are setup, not the steady state); every byte verified afterwards.
    pub fn host_times(lane: &mut Lane<'_>, transfers: u32, seed: u64) -> Result<Vec<HostTimes>> {
        lane.fill(seed)?;
        EndToEnd::one_transfer(lane, 0)?;
        let times = (1..=u64::from(transfers))
            .map(|op| EndToEnd::one_transfer(lane, op))
            .collect::<Result<Vec<HostTimes>>>()?;
        lane.verify()?;
        Ok(times)
    }
}

impl TestCase for EndToEnd {
    fn name(&self) -> &str {
        "e2e-latency"
    }

    fn unit(&self) -> Unit {
        Unit::Micros
    }

    fn shape(&self) -> Shape {
        Shape::Matrix
    }

    fn message_bytes(&self, _requested: u64) -> u64 {
        SMALL_MESSAGE
    }

    fn measures(&self) -> String {
        format!(
            "host clock from the call that queues one {SMALL_MESSAGE} B copy-engine write (source \
             GPU's stream) until the host sees it complete (event synchronisation); one transfer \
             at a time, {END_TO_END_TRANSFERS} per sample after one thrown away; on real GPUs one \
             sample on each CPU the thread may run on (at least {LATENCY_SAMPLES}, up to \
             {MAX_CPUS_VISITED} CPUs), the thread kept there; the figure is the lowest of the \
             samples' medians, where the driver's calls ran fastest (on the H200 VM they took up \
             to 10% longer on some CPUs, which changed over seconds), the note the range over \
             CPUs, the statistics every transfer"
        )
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, _bytes: u64) -> Result<Outcome> {
        let (src, dst) = place.pair();
        let sampling = Sampling {
            warmup: 1,
            iterations: END_TO_END_TRANSFERS,
            ..ctx.sampling
        };
        let mut lane = match small_lane(ctx, self.name(), src, dst, &sampling)? {
            Ok(lane) => lane,
            Err(reason) => return Ok(Outcome::Skipped(reason)),
        };
        // The simulator's clock is virtual: the CPU it runs on changes nothing.
        let pin = !ctx.topology().is_simulated();
        let spread = spread_over_cpus(pin, ctx.latency_samples as usize, || {
            let seed = ctx.next_seed();
            let times = EndToEnd::host_times(&mut lane, END_TO_END_TRANSFERS, seed)?;
            Ok(times.into_iter().map(|t| t.total_us).collect())
        })?;
        Ok(Outcome::Measured {
            value: spread.lowest,
            total: None,
            time_us: Stats::of_times(&spread.times)?,
            note: spread.note(&format!("GPU {src} → {dst}")),
        })
    }
}

/// Buffers freed when the measurement ends, however it ends.
pub(crate) struct Buffers<'b> {
    backend: &'b dyn Backend,
    ids: Vec<BufferId>,
}

impl<'b> Buffers<'b> {
    pub(crate) fn new(backend: &'b dyn Backend) -> Buffers<'b> {
        Buffers {
            backend,
            ids: Vec::new(),
        }
    }

    pub(crate) fn alloc(&mut self, memory: Memory, bytes: usize) -> Result<BufferId> {
        let id = self.backend.alloc(memory, bytes)?;
        self.ids.push(id);
        Ok(id)
    }
}

impl Drop for Buffers<'_> {
    fn drop(&mut self) {
        for id in &self.ids {
            let _ = self.backend.free(*id);
        }
    }
}

/// One timed run per sample, `count` samples, after the caller's own warm-up.
fn samples(count: u32) -> Runs {
    Runs {
        warmup: 0,
        runs: count as usize,
    }
}

/// Which chain a pointer chase follows: two published definitions of "the latency of one load
/// over the link" that differ by what the caches and address translation serve.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChaseChain {
    /// A random cycle over a region wider than the caches, flushed before each sample: every load
    /// goes to the peer's memory, translation misses likely included.
    Flushed,
    /// nvbandwidth's `device_to_device_latency_sm`: a 2 MiB chain stepping one 128-byte cache line
    /// at a time, walked once untimed so that it stays resident in the caches.
    Resident,
}

/// Bytes of the resident chain (nvbandwidth's latency buffer).
pub const RESIDENT_CHAIN_BYTES: u64 = 2 << 20;
/// Bytes between two nodes of the resident chain: one cache line (nvbandwidth's stride of 16
/// pointers).
pub const RESIDENT_STRIDE_BYTES: u64 = 128;

/// Dependent loads from a peer's memory: the round-trip latency of one load over the link.
pub struct PointerChase(pub ChaseChain);

impl TestCase for PointerChase {
    fn name(&self) -> &str {
        match self.0 {
            ChaseChain::Flushed => "pointer-chase",
            ChaseChain::Resident => "pointer-chase-resident",
        }
    }

    fn unit(&self) -> Unit {
        Unit::Nanos
    }

    fn shape(&self) -> Shape {
        Shape::Matrix
    }

    fn message_bytes(&self, _requested: u64) -> u64 {
        8
    }

    fn measures(&self) -> String {
        let chain = match self.0 {
            ChaseChain::Flushed => {
                "a random cyclic chain spread over a region larger than the caches, which are \
                 flushed before each sample (every load reaches the peer's memory, translation \
                 misses likely included; pointer-chase-resident is nvbandwidth's definition)"
                    .to_string()
            }
            ChaseChain::Resident => format!(
                "a {} chain stepping {RESIDENT_STRIDE_BYTES} B (a cache line) at a time, walked \
                 once untimed so that it stays resident in the caches, not flushed \
                 (nvbandwidth's device_to_device_latency_sm definition)",
                crate::units::format_bytes(RESIDENT_CHAIN_BYTES)
            ),
        };
        format!(
            "ns per dependent 8-byte load by a one-thread kernel on the source (row) GPU from the \
             destination (column) GPU's memory: {CHASE_STEPS} loads per sample along {chain}; a \
             round trip over the link; GPU time"
        )
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, _bytes: u64) -> Result<Outcome> {
        let (src, dst) = place.pair();
        if let Some(reason) = no_p2p(ctx.topology(), src, dst).or_else(|| enable(ctx, src, dst)) {
            return Ok(Outcome::Skipped(reason));
        }
        let chain = match self.0 {
            ChaseChain::Flushed => ctx.chase_chain(),
            ChaseChain::Resident => {
                std::sync::Arc::new(strided_chain(RESIDENT_CHAIN_BYTES, RESIDENT_STRIDE_BYTES))
            }
        };
        if chain.len() as u64 > ctx.backend.free_memory(dst)? / 2 {
            return Ok(Outcome::Skipped(format!(
                "GPU {dst} has too little free memory for the {} chain",
                crate::units::format_bytes(chain.len() as u64)
            )));
        }
        let backend = ctx.backend;
        let stream = ctx.streams(&[src])?[0];
        let mut buffers = Buffers::new(backend);
        let on_dst = buffers.alloc(Memory::Device(dst), chain.len())?;
        let result = buffers.alloc(Memory::Device(src), 8)?;
        // Each sample walks the same nodes: without an eviction in between, every sample after the
        // first would be served from the L2 caches. Copying a scratch region as large as the chain
        // through each GPU's memory evicts them (the resident chain is meant to stay).
        let mut evictions = Vec::new();
        let flushed = if self.0 == ChaseChain::Resident {
            Vec::new()
        } else if src == dst {
            vec![dst]
        } else {
            vec![src, dst]
        };
        for gpu in flushed {
            let scratch = buffers.alloc(Memory::Device(gpu), chain.len())?;
            let half = chain.len() / 2;
            evictions.push(BufferCopy {
                dst: scratch,
                dst_offset: half,
                src: scratch,
                src_offset: 0,
                len: half,
            });
        }
        backend.write(on_dst, 0, &chain)?;
        // Warm-up: first launch and module load; the resident chain is walked whole, so that every
        // node a sample visits is in the caches.
        let warmup = match self.0 {
            ChaseChain::Flushed => CHASE_STEPS / 10,
            ChaseChain::Resident => (RESIDENT_CHAIN_BYTES / RESIDENT_STRIDE_BYTES) as u32,
        };
        backend
            .probes()
            .pointer_chase(stream, on_dst, warmup, result)?;
        let expected = chase_on_host(&chain, CHASE_STEPS);
        let stats = samples(ctx.sampling.samples).stats(|| {
            for eviction in &evictions {
                backend.copy(stream, CopyMethod::CopyEngine, eviction)?;
            }
            backend.write(result, 0, &[0xff; 8])?;
            let us = gpu_us(backend, stream, || {
                backend
                    .probes()
                    .pointer_chase(stream, on_dst, CHASE_STEPS, result)
            })?;
            let mut reached = [0u8; 8];
            backend.read(result, 0, &mut reached)?;
            Error::check_bytes(self.name(), src, dst, &expected.to_le_bytes(), &reached)?;
            Ok(us / f64::from(CHASE_STEPS))
        })?;
        Ok(Outcome::Measured {
            value: stats.median * 1e3,
            total: None,
            time_us: stats,
            note: None,
        })
    }
}

/// GPU-initiated signalling: half the round trip of a flag bounced between two GPUs' kernels.
pub struct PingPong;

/// Bytes of each flag's allocation: a page of its own, so that each sample's flags lie elsewhere
/// in memory. Where they lie moves the figure: on the H200 pair one way took 0.57 to 0.75 µs over
/// 24 placements, each reproducible, both GPUs' flags counting (benchmarks of 2026-12-01); with
/// one placement per run the figure depended on what the process had allocated before (0.65 µs
/// after bench's `local` test, 0.73 alone).
const FLAG_ALLOCATION_BYTES: usize = 2 << 20;
/// Placements of the flags at most; samples beyond them go round them again, so that `--samples
/// 1000` holds 64 MiB on each GPU, not 2 GB.
const MAX_FLAG_PLACEMENTS: usize = 32;

/// How many placements of the flags `samples` samples use.
fn flag_placements(samples: u32) -> usize {
    (samples as usize).clamp(1, MAX_FLAG_PLACEMENTS)
}

impl TestCase for PingPong {
    fn name(&self) -> &str {
        "ping-pong"
    }

    fn unit(&self) -> Unit {
        Unit::Micros
    }

    fn shape(&self) -> Shape {
        Shape::Matrix
    }

    fn message_bytes(&self, _requested: u64) -> u64 {
        4
    }

    fn measures(&self) -> String {
        format!(
            "one-way latency, µs: half the round trip of a 4-byte flag stored (system-scope fence) \
             by a kernel on the row GPU into the column GPU's memory and answered back, \
             {PING_PONG_ROUNDS} rounds per sample after a shorter run thrown away, each sample with \
             its flags in fresh {} MiB allocations, up to {MAX_FLAG_PLACEMENTS} (where they lie \
             moves the time; the note gives the range over samples), the median over samples; GPU \
             time",
            FLAG_ALLOCATION_BYTES >> 20
        )
    }

    fn footprint(&self, ctx: &Context<'_>, place: Place, _bytes: u64) -> Result<Footprint> {
        let (src, dst) = place.pair();
        let placements = flag_placements(ctx.latency_samples) as u64;
        let mut footprint = Footprint::default();
        for gpu in [src, dst] {
            footprint.add(
                Memory::Device(gpu),
                placements,
                FLAG_ALLOCATION_BYTES as u64,
            );
        }
        Ok(footprint)
    }

    fn measure(&self, ctx: &mut Context<'_>, place: Place, _bytes: u64) -> Result<Outcome> {
        let (src, dst) = place.pair();
        for (a, b) in [(src, dst), (dst, src)] {
            if let Some(reason) = no_p2p(ctx.topology(), a, b).or_else(|| enable(ctx, a, b)) {
                return Ok(Outcome::Skipped(reason));
            }
        }
        let backend = ctx.backend;
        let streams = ctx.streams(&[src, dst])?;
        let (ping, pong) = (streams[0], streams[1]);
        let mut buffers = Buffers::new(backend);
        let run = |rounds: u32, ping_flag: BufferId, pong_flag: BufferId| -> Result<f64> {
            backend.write(ping_flag, 0, &[0; 4])?;
            backend.write(pong_flag, 0, &[0; 4])?;
            let us = gpu_us(backend, ping, || {
                backend
                    .probes()
                    .ping_pong(ping, pong, ping_flag, pong_flag, rounds)
            })?;
            backend.synchronize(pong)?;
            // Both flags end on the last round's number (rounds count from 1).
            for flag in [ping_flag, pong_flag] {
                let mut found = [0u8; 4];
                backend.read(flag, 0, &mut found)?;
                Error::check_bytes(self.name(), src, dst, &rounds.to_le_bytes(), &found)?;
            }
            Ok(us)
        };
        let placements = (0..flag_placements(ctx.latency_samples))
            .map(|_| {
                Ok((
                    buffers.alloc(Memory::Device(src), FLAG_ALLOCATION_BYTES)?,
                    buffers.alloc(Memory::Device(dst), FLAG_ALLOCATION_BYTES)?,
                ))
            })
            .collect::<Result<Vec<(BufferId, BufferId)>>>()?;
        let (first_ping, first_pong) = placements[0];
        run(PING_PONG_ROUNDS / 10, first_ping, first_pong)?; // first launches, module loads
        let mut placed = placements.iter().cycle();
        let stats = samples(ctx.latency_samples).stats(|| {
            let &(ping_flag, pong_flag) = placed.next().expect("a cycle of at least one");
            Ok(run(PING_PONG_ROUNDS, ping_flag, pong_flag)? / f64::from(PING_PONG_ROUNDS) / 2.0)
        })?;
        let note = (placements.len() > 1).then(|| {
            format!(
                "GPU {src} → {dst}: {:.2}–{:.2} µs over {} placements of the flags",
                stats.min,
                stats.max,
                placements.len()
            )
        });
        Ok(Outcome::Measured {
            value: stats.median,
            total: None,
            time_us: stats,
            note,
        })
    }
}
