//! `peerlink workload`: the work GPU-to-GPU traffic exists for — an all-reduce, messages between
//! neighbouring GPUs, a pipeline's activations, a halo exchange — run by peerlink and, where the
//! host has it, by NCCL, side by side in one run, every byte verified.
//!
//! Timed as nccl-tests times: every rank (one per GPU) gets its own stream; warm-up operations, then
//! `iters` operations back to back on every rank's stream, GPU events around the loop on each, every
//! stream held behind a gate while the host queues, so that the host's issue cost stays out
//! ([`crate::bench::timing::held_group_us`]); the time per operation is the slowest rank's
//! (end − start) / iters. The loop is issued by one host thread, or captured into a CUDA graph per
//! stream and replayed (`--issue graphs`). After timing, each contender runs once more into
//! poisoned outputs and every byte is checked against what the host computed.
//!
//! - [`all_reduce`]: peerlink's one-shot, two-shot and one-shot-packets kernels and the cost
//!   model's pick among them, against `ncclAllReduce`;
//! - [`send_recv`]: the transfer engine between consecutive GPUs, one way and both ways at once,
//!   against NCCL send/recv;
//! - [`pipeline`]: each stage's stand-in compute overlapped with handing its activation to the
//!   next, double-buffered: the communication left exposed;
//! - [`halo`]: 1-D and 2-D domain decompositions exchanging boundary faces with every neighbour.

pub mod all_reduce;
pub mod document;
pub mod halo;
pub mod pipeline;
pub mod processes;
pub mod send_recv;

use crate::backend::collective::DataType;
use crate::backend::{Backend, GraphId, Owned, StreamId};
use crate::bench::progress::Progress;
use crate::bench::timing::{held_group_us, Phase};
use crate::bench::{counted, MAX_ITERATIONS};
use crate::topology::Source;
use crate::units::format_bytes;
use crate::{Error, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The workloads `peerlink workload` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    AllReduce,
    SendRecv,
    Pipeline,
    Halo,
}

impl Workload {
    pub const ALL: [Workload; 4] = [
        Workload::AllReduce,
        Workload::SendRecv,
        Workload::Pipeline,
        Workload::Halo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::AllReduce => "all-reduce",
            Workload::SendRecv => "send-recv",
            Workload::Pipeline => "pipeline",
            Workload::Halo => "halo",
        }
    }

    /// The workload named `name`, or a usage error listing them.
    pub fn parse(name: &str) -> Result<Workload> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == name)
            .ok_or_else(|| {
                Error::usage(format!(
                    "unknown workload `{name}`; known workloads: {}",
                    Workload::ALL.map(Workload::name).join(", ")
                ))
            })
    }

    /// How the workload's busbw follows from its algbw, in words.
    pub fn busbw_rule(self) -> &'static str {
        match self {
            Workload::AllReduce => {
                "busbw = algbw × 2(n−1)/n, what each rank's busiest link carries (nccl-tests)"
            }
            Workload::SendRecv => "busbw = algbw: each message crosses one link once",
            Workload::Pipeline => {
                "algbw = activation bytes / step time; busbw = algbw (one hand-over per stage per step)"
            }
            Workload::Halo => {
                "algbw = one face's bytes / step time (every face moves at once); busbw = algbw"
            }
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a timed loop reaches the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum IssueMode {
    /// One host thread queues every rank's operations, each stream held behind a gate meanwhile.
    Stream,
    /// Each rank's loop captured once into a CUDA graph on its stream, the graphs replayed.
    Graphs,
}

impl IssueMode {
    pub fn name(self) -> &'static str {
        match self {
            IssueMode::Stream => "stream",
            IssueMode::Graphs => "graphs",
        }
    }
}

/// Which issue modes to run (`--issue`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IssueChoice {
    #[default]
    Stream,
    Graphs,
    Both,
}

impl IssueChoice {
    pub fn parse(text: &str) -> Result<IssueChoice> {
        match text {
            "stream" => Ok(IssueChoice::Stream),
            "graphs" => Ok(IssueChoice::Graphs),
            "both" => Ok(IssueChoice::Both),
            other => Err(Error::usage(format!(
                "unknown issue mode `{other}`; expected stream, graphs or both"
            ))),
        }
    }

    pub fn modes(self) -> Vec<IssueMode> {
        match self {
            IssueChoice::Stream => vec![IssueMode::Stream],
            IssueChoice::Graphs => vec![IssueMode::Graphs],
            IssueChoice::Both => vec![IssueMode::Stream, IssueMode::Graphs],
        }
    }
}

/// Whose implementation a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Contender {
    /// peerlink's own: a kernel, the engine, copies.
    Peerlink,
    /// peerlink's all-reduce as its cost model picks the kernel at each size (the row repeats the
    /// picked kernel's measurement).
    PeerlinkPick,
    /// NCCL (or, on the simulator, its model).
    Nccl,
}

impl Contender {
    pub fn is_peerlink(self) -> bool {
        self != Contender::Nccl
    }
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Contender::Peerlink => "peerlink",
            Contender::PeerlinkPick => "peerlink (pick)",
            Contender::Nccl => "NCCL",
        })
    }
}

/// A workload's variants: send-recv's directions, halo's decompositions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Variant {
    /// Every rank but the last sends to the next.
    #[serde(rename = "one-way")]
    OneWay,
    /// Every pair of consecutive ranks sends both ways at once.
    #[serde(rename = "both")]
    BothWays,
    /// The GPUs in a ring, each domain exchanging contiguous rows.
    #[serde(rename = "1-d")]
    OneD,
    /// The GPUs as a grid, rows (contiguous) and columns (strided).
    #[serde(rename = "2-d")]
    TwoD,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::OneWay => "one-way",
            Variant::BothWays => "both",
            Variant::OneD => "1-d",
            Variant::TwoD => "2-d",
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One contender at one size, measured and verified.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Row {
    pub workload: Workload,
    /// send-recv's direction or halo's decomposition; absent for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Variant>,
    /// Bytes of one operation: the buffer reduced, the message, the activation, the face.
    pub bytes: u64,
    pub contender: Contender,
    /// What ran: peerlink's kernel, the engine's strategy, the copies, or the NCCL calls.
    pub algorithm: String,
    /// The element type reduced (all-reduce only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<DataType>,
    pub issue: IssueMode,
    /// Timed operations (steps) per window.
    pub iters: u32,
    /// GPU µs per operation: the slowest rank's window over `iters`.
    pub time_us: f64,
    pub algbw_gbps: f64,
    /// See the workload's rule (`busbw_rule` in the document).
    pub busbw_gbps: f64,
    /// Every byte of the contender's results matched the host's expectation (a mismatch stops the
    /// run with an error instead).
    pub verified: bool,
    /// The figures come from the simulator, not from hardware.
    pub simulated: bool,
    /// The fastest NCCL row's time at this size (and variant) over this row's: above 1 where
    /// peerlink is faster. Peerlink's rows only, where NCCL ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_nccl: Option<f64>,
    /// The cost model's prediction for the picked kernel, µs (the pick's row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_us: Option<f64>,
    /// The picked kernel's time over the faster measured kernel's − 1 (the pick's row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regret: Option<f64>,
    /// The stand-in compute kernel's time alone per step, µs (pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_us: Option<f64>,
    /// Step time − compute alone, µs: the communication the overlap did not hide (pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_us: Option<f64>,
}

/// What a row measured, before the run's context is added.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub variant: Option<Variant>,
    pub bytes: u64,
    pub contender: Contender,
    pub algorithm: String,
    pub issue: IssueMode,
    pub iters: u32,
    pub time_us: f64,
}

/// Everything one `peerlink workload` run found.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub source: Source,
    pub workload: Workload,
    pub devices: Vec<usize>,
    /// Untimed operations before each window.
    pub warmup: u32,
    /// How every row was timed, in words ([`TIMING`], or the way across processes).
    pub timing: &'static str,
    pub rows: Vec<Row>,
    /// What was left out and why (NCCL missing, pairs without P2P, graphs not available), and the
    /// simulator's defaults: one sentence each.
    pub notices: Vec<String>,
}

impl Report {
    /// The worst regret of the all-reduce pick over the sweep, where it was measured.
    pub fn worst_regret(&self) -> Option<f64> {
        self.rows.iter().filter_map(|r| r.regret).reduce(f64::max)
    }
}

/// How every row of a workload in one process is timed, in words.
pub const TIMING: &str = "as nccl-tests times: warm-up operations, then `iters` operations back \
    to back on every rank's stream, GPU events around the loop on each, every stream held behind a \
    gate while the host queues; time per operation = the slowest rank's window / iters. After \
    timing, each contender ran once more into poisoned outputs and every byte was checked";

/// The user's choices; `None` means the default for the backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    pub devices: Option<Vec<usize>>,
    pub sizes: Option<Vec<u64>>,
    /// Leaves larger sizes out of the sweep.
    pub max_size: Option<u64>,
    pub iters: Option<u32>,
    pub warmup: Option<u32>,
    pub issue: IssueChoice,
    /// all-reduce: the element type (default f32).
    pub dtype: Option<DataType>,
    /// send-recv: the directions (default both variants).
    pub directions: Option<Vec<Variant>>,
    /// pipeline: the stand-in compute per step, µs (default [`pipeline::DEFAULT_COMPUTE_US`]).
    pub compute_us: Option<f64>,
    /// halo: the decompositions (default both).
    pub dims: Option<Vec<Variant>>,
}

/// The sizes the sweep covers by default: 4 B to 1 GiB in steps of 4×.
pub fn default_sizes() -> Vec<u64> {
    std::iter::successors(Some(4u64), |s| Some(s * 4))
        .take_while(|&s| s <= 1 << 30)
        .collect()
}

/// Timed operations per window at `bytes` on real GPUs: nccl-tests' 20, fewer from 64 MiB up so
/// that the largest sizes (several ms per operation) keep a sweep short; never fewer than 5.
pub fn default_iters(bytes: u64) -> u32 {
    const FULL_UP_TO: u64 = 64 << 20;
    if bytes <= FULL_UP_TO {
        20
    } else {
        (20 * FULL_UP_TO / bytes).max(5) as u32
    }
}

/// Warm-up operations before each window on real GPUs (nccl-tests' `-w 5`).
pub const WARMUP: u32 = 5;

/// The simulator copies and reduces every byte on the CPU: its sweep stops here unless asked for
/// more, and it times 2 operations after 1 warm-up (its virtual clock repeats exactly).
pub const SIM_MAX_SIZE: u64 = 16 << 20;

/// The run's settings, resolved from the options and the backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub devices: Vec<usize>,
    pub sizes: Vec<u64>,
    pub warmup: u32,
    /// `--iters`, else [`default_iters`] per size (2 on the simulator).
    pub iters: Option<u32>,
    pub issue: Vec<IssueMode>,
    pub simulated: bool,
    pub notices: Vec<String>,
}

impl Settings {
    /// The settings for `options` on `backend`, or a usage error naming what is wrong.
    pub fn resolve(
        backend: &dyn Backend,
        workload: Workload,
        options: &Options,
    ) -> Result<Settings> {
        let topology = backend.topology();
        let devices = topology.select(options.devices.as_deref())?;
        if devices.len() < 2 {
            return Err(Error::usage(format!(
                "workload {workload} runs between GPUs and needs at least 2; {} selected{}",
                devices.len(),
                if topology.devices.len() < 2 {
                    " (this host has only one)"
                } else {
                    ": name two or more with --devices, or leave --devices out for all"
                }
            )));
        }
        if let Some((a, b)) = across_hosts(topology, &devices) {
            if matches!(workload, Workload::Pipeline | Workload::Halo) {
                return Err(Error::usage(format!(
                    "workload {workload} runs within one host, and GPU {a} and GPU {b} are on \
                     different hosts: choose GPUs of one host with --devices (all-reduce and \
                     send-recv run NCCL between hosts)"
                )));
            }
        }
        let simulated = topology.is_simulated();
        let mut notices = Vec::new();
        if simulated {
            notices.push(format!(
                "simulator defaults where not given: sizes up to {} (not 1 GiB), 1 warm-up and 2 \
                 timed operations (not {WARMUP} and 20): it moves and reduces every byte on the \
                 CPU and its virtual clock repeats exactly",
                format_bytes(SIM_MAX_SIZE)
            ));
        }
        let mut sizes = options.sizes.clone().unwrap_or_else(default_sizes);
        let max_size = match options.max_size {
            None if simulated && options.sizes.is_none() => Some(SIM_MAX_SIZE),
            given => given,
        };
        if let Some(max) = max_size {
            sizes.retain(|&s| s <= max);
        }
        if sizes.is_empty() {
            return Err(Error::usage(format!(
                "no size left to run: every size is above --max-size {}",
                format_bytes(max_size.unwrap_or(0))
            )));
        }
        let warmup = counted(options.warmup, "--warmup", 0, MAX_ITERATIONS)?
            .unwrap_or(if simulated { 1 } else { WARMUP });
        let iters =
            counted(options.iters, "--iters", 1, MAX_ITERATIONS)?.or(simulated.then_some(2));
        Ok(Settings {
            devices,
            sizes,
            warmup,
            iters,
            issue: options.issue.modes(),
            simulated,
            notices,
        })
    }

    /// The sweep's sizes, up to a stop request ([`crate::interrupt`]): the run then ends with the
    /// sizes measured so far, and its document says partial.
    pub fn sizes_to_run(&self) -> impl Iterator<Item = u64> + '_ {
        self.sizes
            .iter()
            .copied()
            .take_while(|_| !crate::interrupt::requested())
    }

    /// Timed operations per window at `bytes`.
    pub fn iters_at(&self, bytes: u64) -> u32 {
        self.iters.unwrap_or_else(|| default_iters(bytes))
    }

    /// The counts of one window at `bytes`.
    pub fn counts(&self, bytes: u64) -> Counts {
        Counts {
            prime: prime_ops(bytes, self.simulated),
            warmup: self.warmup,
            iters: self.iters_at(bytes),
        }
    }

    /// The largest size of the sweep.
    pub fn largest(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }
}

/// Runs `workload` on `backend` with `options`.
pub fn run(
    backend: &Arc<dyn Backend>,
    workload: Workload,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Report> {
    let mut settings = Settings::resolve(backend.as_ref(), workload, options)?;
    let mut rows = match workload {
        Workload::AllReduce => {
            all_reduce::run(backend.as_ref(), &mut settings, options.dtype, progress)?
        }
        Workload::SendRecv => send_recv::run(
            backend,
            &mut settings,
            options
                .directions
                .as_deref()
                .unwrap_or(&[Variant::OneWay, Variant::BothWays]),
            progress,
        )?,
        Workload::Pipeline => pipeline::run(
            backend.as_ref(),
            &mut settings,
            options.compute_us.unwrap_or(pipeline::DEFAULT_COMPUTE_US),
            progress,
        )?,
        Workload::Halo => halo::run(
            backend.as_ref(),
            &mut settings,
            options
                .dims
                .as_deref()
                .unwrap_or(&[Variant::OneD, Variant::TwoD]),
            progress,
        )?,
    };
    compare(&mut rows);
    Ok(Report {
        source: backend.source().clone(),
        workload,
        devices: settings.devices.clone(),
        warmup: settings.warmup,
        timing: TIMING,
        rows,
        notices: settings.notices,
    })
}

/// Bus bandwidth from algorithm bandwidth: an all-reduce over `ranks` moves 2(n−1)/n of its
/// buffer over each rank's links (nccl-tests' factor); the other workloads move each byte once.
pub fn busbw(workload: Workload, algbw_gbps: f64, ranks: usize) -> f64 {
    match workload {
        Workload::AllReduce => algbw_gbps * 2.0 * (ranks as f64 - 1.0) / ranks as f64,
        Workload::SendRecv | Workload::Pipeline | Workload::Halo => algbw_gbps,
    }
}

/// A row from a measurement: bandwidths derived, NCCL's comparison added later by [`compare`].
pub(crate) fn row(
    workload: Workload,
    ranks: usize,
    simulated: bool,
    dtype: Option<DataType>,
    m: Measured,
) -> Row {
    let algbw_gbps = crate::units::gbps(m.bytes, m.time_us);
    Row {
        workload,
        variant: m.variant,
        bytes: m.bytes,
        contender: m.contender,
        algorithm: m.algorithm,
        dtype,
        issue: m.issue,
        iters: m.iters,
        time_us: m.time_us,
        algbw_gbps,
        busbw_gbps: busbw(workload, algbw_gbps, ranks),
        verified: true,
        simulated,
        vs_nccl: None,
        predicted_us: None,
        regret: None,
        compute_us: None,
        exposed_us: None,
    }
}

/// Sets each peerlink row's `vs_nccl`: the fastest NCCL row of its size and variant over it.
pub(crate) fn compare(rows: &mut [Row]) {
    let best_nccl = |rows: &[Row], bytes: u64, variant: Option<Variant>| {
        rows.iter()
            .filter(|r| r.contender == Contender::Nccl && r.bytes == bytes && r.variant == variant)
            .map(|r| r.time_us)
            .reduce(f64::min)
    };
    let ratios: Vec<Option<f64>> = rows
        .iter()
        .map(|r| {
            (r.contender.is_peerlink())
                .then(|| best_nccl(rows, r.bytes, r.variant).map(|nccl| nccl / r.time_us))
                .flatten()
        })
        .collect();
    for (row, ratio) in rows.iter_mut().zip(ratios) {
        row.vs_nccl = ratio;
    }
}

/// Operations of one contender at one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Untimed, before the held window, waited for (see [`prime_ops`]).
    pub prime: u32,
    /// Untimed, inside the held window, before its start events.
    pub warmup: u32,
    /// Timed.
    pub iters: u32,
}

/// The most operations a contender runs, waited for, before its first window at a size.
///
/// One is enough for first-use costs (a module load, NCCL's connections, the engine's staging);
/// but on real GPUs NCCL's operations stay slow for tens of them after its communicator is made:
/// on the H200 pair a 4 B send/recv measured 13.9 µs per operation over a window of 20 after 6
/// untimed ones, and 5.6 µs after 51 (the next size: 5.9 and 5.7 µs).
pub const PRIME_OPS: u32 = 50;

/// Priming stops at this many bytes: an operation this large takes far longer than what the first
/// ones add.
const PRIME_BYTES: u64 = 256 << 20;

/// Operations to prime with at `bytes`: [`PRIME_OPS`] for small ones, fewer as they grow, and one
/// on the simulator (its clock has no warm-up to give).
pub fn prime_ops(bytes: u64, simulated: bool) -> u32 {
    if simulated {
        return 1;
    }
    (PRIME_BYTES / bytes.max(1)).clamp(1, u64::from(PRIME_OPS)) as u32
}

/// One operation of a workload, on every rank at once.
pub(crate) trait Operation {
    /// Queues operation number `step` (counted from 0 over warm-ups and timed operations) on every
    /// rank.
    fn queue(&mut self, step: u64) -> Result<()>;

    /// Makes every held stream wait for the work the operations queued elsewhere (the engine's
    /// own streams), so that an event recorded on it next follows all of it.
    fn join(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A timed loop of one operation over the held `streams`: queued from the host, or captured once
/// into a graph per stream.
pub(crate) struct Loop<'b> {
    backend: &'b dyn Backend,
    streams: Vec<StreamId>,
    counts: Counts,
    /// One per stream, in `streams`' order, in graphs mode; empty in stream mode.
    graphs: Vec<Owned<'b, GraphId>>,
}

impl<'b> Loop<'b> {
    /// A loop of `counts.iters` operations on `streams` (every stream `op` queues on), captured
    /// now in graphs mode.
    pub fn new(
        backend: &'b dyn Backend,
        streams: &[StreamId],
        issue: IssueMode,
        counts: Counts,
        op: &mut dyn Operation,
    ) -> Result<Loop<'b>> {
        let mut graphs = Vec::new();
        if issue == IssueMode::Graphs {
            let mut capturing = Vec::with_capacity(streams.len());
            let queued = (|| {
                for &stream in streams {
                    backend.begin_capture(stream)?;
                    capturing.push(stream);
                }
                (0..counts.iters).try_for_each(|i| op.queue(u64::from(counts.warmup + i)))
            })();
            // End every capture even after an error, so that the streams are usable again.
            let mut ended = Ok(());
            for stream in capturing {
                match backend.end_capture(stream) {
                    Ok(graph) => graphs.push(Owned::new(backend, graph)),
                    Err(e) => ended = ended.and(Err(e)),
                }
            }
            queued?;
            ended?;
        }
        Ok(Loop {
            backend,
            streams: streams.to_vec(),
            counts,
            graphs,
        })
    }

    /// GPU µs per operation: every stream held while the warm-ups and the timed loop are queued,
    /// the slowest stream's window over the timed operations.
    pub fn time(&self, op: &mut dyn Operation) -> Result<f64> {
        let Counts { warmup, iters, .. } = self.counts;
        let windows = held_group_us(self.backend, &self.streams, |phase| {
            match phase {
                Phase::WarmUp => (0..warmup).try_for_each(|step| op.queue(u64::from(step)))?,
                Phase::Timed if self.graphs.is_empty() => {
                    (warmup..warmup + iters).try_for_each(|step| op.queue(u64::from(step)))?
                }
                Phase::Timed => self.replay()?,
            }
            op.join()
        })?;
        let slowest = windows.into_iter().fold(0.0, f64::max);
        Ok(slowest / f64::from(iters))
    }

    /// Runs the loop once more, untimed, and waits for it: the graphs replayed, or one operation
    /// queued. What it leaves behind is what the contender's results are checked on.
    pub fn run_once(&self, op: &mut dyn Operation) -> Result<()> {
        if self.graphs.is_empty() {
            op.queue(u64::from(self.counts.warmup + self.counts.iters))?;
        } else {
            self.replay()?;
        }
        op.join()?;
        self.streams
            .iter()
            .try_for_each(|&s| self.backend.synchronize(s))
    }

    fn replay(&self) -> Result<()> {
        self.graphs
            .iter()
            .zip(&self.streams)
            .try_for_each(|(graph, &stream)| self.backend.replay(**graph, stream))
    }
}

/// Times `op` in `issue` mode, then runs it once more after `poison` and checks the result with
/// `check`: the time per operation, every byte verified.
pub(crate) fn measure(
    backend: &dyn Backend,
    streams: &[StreamId],
    issue: IssueMode,
    counts: Counts,
    op: &mut dyn Operation,
    poison: impl FnOnce() -> Result<()>,
    check: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    prime(backend, streams, op, counts.prime)?;
    let looped = Loop::new(backend, streams, issue, counts, op)?;
    let us = looped.time(op)?;
    poison()?;
    looped.run_once(op)?;
    check()?;
    Ok(us)
}

/// Runs `op` `times` times (at least once), untimed, and waits for it: first-use costs (a module
/// load, NCCL's connections, the engine's staging buffers) stay out of the held windows that
/// follow, where a host call that waited for the GPUs would wait for the gate.
pub(crate) fn prime(
    backend: &dyn Backend,
    streams: &[StreamId],
    op: &mut dyn Operation,
    times: u32,
) -> Result<()> {
    (0..times.max(1)).try_for_each(|step| op.queue(u64::from(step)))?;
    op.join()?;
    streams.iter().try_for_each(|&s| backend.synchronize(s))
}

/// One stream per GPU of `devices`, in that order, destroyed when dropped.
pub(crate) fn streams_on<'b>(
    backend: &'b dyn Backend,
    devices: &[usize],
) -> Result<Vec<Owned<'b, StreamId>>> {
    devices
        .iter()
        .map(|&d| Ok(Owned::new(backend, backend.create_stream(d)?)))
        .collect()
}

/// The handles of owned resources, in order.
pub(crate) fn ids<H: crate::backend::Handle>(owned: &[Owned<'_, H>]) -> Vec<H> {
    owned.iter().map(|o| **o).collect()
}

/// Buffers of `bytes` on each GPU of `devices`, freed when dropped.
pub(crate) fn buffers_on<'b>(
    backend: &'b dyn Backend,
    devices: &[usize],
    bytes: usize,
) -> Result<Vec<Owned<'b, crate::backend::BufferId>>> {
    devices
        .iter()
        .map(|&d| {
            Ok(Owned::new(
                backend,
                backend.alloc(crate::backend::Memory::Device(d), bytes)?,
            ))
        })
        .collect()
}

/// `bytes` as a buffer length, or a usage error where it cannot be one on this host.
pub(crate) fn length(bytes: u64) -> Result<usize> {
    usize::try_from(bytes)
        .map_err(|_| Error::usage(format!("{bytes} bytes do not fit in this host's memory")))
}

/// The first two of `devices` that sit on different hosts, if any.
pub(crate) fn across_hosts(
    topology: &crate::topology::Topology,
    devices: &[usize],
) -> Option<(usize, usize)> {
    let first = *devices.first()?;
    let other = devices
        .iter()
        .copied()
        .find(|&d| topology.crosses_hosts(first, d))?;
    Some((first, other))
}

/// The notice for peerlink's rows left out where `devices` span hosts: they move data within one.
pub(crate) fn within_one_host(
    topology: &crate::topology::Topology,
    devices: &[usize],
    rows: &str,
) -> Option<String> {
    let (a, b) = across_hosts(topology, devices)?;
    Some(format!(
        "GPU {a} and GPU {b} are on different hosts: {rows} move data within one host, so they are \
         left out; NCCL's rows carry the data between hosts"
    ))
}

/// NCCL, or the sentence saying why there is none (added to the notices, its rows left out).
pub(crate) fn nccl<'b>(
    backend: &'b dyn Backend,
    notices: &mut Vec<String>,
) -> Option<&'b dyn crate::backend::Nccl> {
    match backend.collectives().nccl() {
        Ok(nccl) => Some(nccl),
        Err(why) => {
            notices.push(format!("NCCL's rows are left out: {why}"));
            None
        }
    }
}

/// An NCCL communicator over `devices`, destroyed when dropped.
pub(crate) struct Communicator<'n> {
    pub nccl: &'n dyn crate::backend::Nccl,
    pub id: crate::backend::collective::CommId,
}

impl<'n> Communicator<'n> {
    pub fn new(nccl: &'n dyn crate::backend::Nccl, devices: &[usize]) -> Result<Communicator<'n>> {
        Ok(Communicator {
            nccl,
            id: nccl.communicator(devices)?,
        })
    }
}

impl Drop for Communicator<'_> {
    fn drop(&mut self) {
        // Nothing can report a failure from drop; the work queued on it has been waited for.
        let _ = self.nccl.destroy_communicator(self.id);
    }
}

/// Enables peer access both ways between every two of `devices` that have P2P, and returns the
/// pairs (ordered, distinct) that have none.
pub(crate) fn enable_peers(
    backend: &dyn Backend,
    devices: &[usize],
) -> Result<Vec<(usize, usize)>> {
    let mut without = Vec::new();
    for &a in devices {
        for &b in devices {
            if a == b {
                continue;
            }
            if backend.topology().pair(a, b).is_some_and(|p| p.p2p) {
                backend.enable_peer_access(a, b)?;
            } else {
                without.push((a, b));
            }
        }
    }
    Ok(without)
}

#[cfg(test)]
mod tests;
