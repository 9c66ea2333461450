//! `peerlink tune`: what each hop of a transfer costs on this host, measured, as a host profile.
//!
//! Every hop kind the cost model prices is swept over a few message sizes with the bench's tests
//! and timing ([`super::timing`]: back-to-back copies queued behind a held stream, GPU time, every
//! byte verified), and `time = α + bytes / β` is fitted to each sweep ([`super::fit`]): a copy-engine and an SM-kernel
//! write per ordered pair with P2P, host→device and device→host per GPU and NUMA node, and a copy
//! inside each GPU. Around them, what the model needs besides hops: the CPU's cost to queue a copy,
//! a kernel, an event and a graph; the GPU time per node of a replayed graph; the GPU time per
//! message of a batched copy kernel. A GPU is its own peer: everything but the peer pairs is
//! measured on one GPU alone, so a one-GPU host gets a profile too.
//!
//! [`Measurements::profile`] turns the figures into a [`Profile`]; [`export::preset`] into a
//! simulator preset calibrated from them.

pub mod beside;
pub mod document;
pub mod export;
#[cfg(test)]
mod tests;

use super::cases::{
    Buffers, ChaseChain, Context, HostCopy, HostDirection, Initiator, Outcome, PeerCopy, PingPong,
    PointerChase, ResidentLatency, ResidentWrite, SmallCopy, SmallCopyFigure, TestCase, Transport,
    RESIDENT_LATENCY_BYTES,
};
use super::explain::completion_costs;
use super::progress::Progress;
use super::result::{Place, Sweep};
use super::stats::Stats;
use super::timing::{
    gpu_us, held_gpu_us, host_us, interleaved, spread_over_cpus, HopSpec, Lane, Runs, Sampling,
    Turn,
};
use super::{check_fits, sweep_pair, Defaults};
use crate::backend::{Backend, BufferCopy, CopyMethod, Memory, Owned, StreamId};
use crate::model::profile::{BesideDirect, BothWays, Lone, Measured};
use crate::model::{Cost, CostModel, Hop, IssueCosts, Profile};
use crate::pattern;
use crate::topology::Topology;
use crate::units::format_bytes;
use crate::{Error, Result};
use serde::Serialize;
use std::sync::Arc;

/// Sweep sizes on the simulator: it copies every byte on the CPU, so a few MiB at most; its time
/// is exactly affine in the bytes, so four sizes pin α and β down.
const SIM_SIZES: &[u64] = &[4 << 10, 64 << 10, 1 << 20, 4 << 20];
const SIM_QUICK_SIZES: &[u64] = &[64 << 10, 1 << 20];
/// Sweep sizes on real GPUs: α shows at 4 KiB, β from 32 MiB (a 400 GB/s link reaches 90% of β
/// at ~9 MB, docs/reference.md).
const GPU_SIZES: &[u64] = &[4 << 10, 256 << 10, 4 << 20, 32 << 20];
const GPU_QUICK_SIZES: &[u64] = &[64 << 10, 4 << 20, 32 << 20];

/// Back-to-back 4-byte operations whose queuing is timed on the host clock.
const ISSUE_OPERATIONS: u32 = super::cases::latency::SMALL_COPIES;
/// Bytes of the operations whose issue, graph and batch costs are measured.
pub const SMALL_BYTES: usize = 4;
/// Host-clock probes per figure (event record, graph launch, synchronisation); the median is kept.
const PROBES: Runs = Runs {
    warmup: 0,
    runs: 20,
};
/// GPU-time windows per figure (graph replay, batch kernel); the median is kept.
const WINDOWS: Runs = Runs { warmup: 0, runs: 5 };
/// Copies captured into the graph whose replay is timed.
const GRAPH_COPIES: u64 = 32;
/// Messages of the batched copy kernel whose time per message is measured, and their size.
const BATCH_MESSAGES: usize = 256;
const BATCH_MESSAGE_BYTES: usize = 64;

/// What the user asked for.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    /// GPUs to measure (default: all).
    pub devices: Option<Vec<usize>>,
    /// Fewer sizes (and one sample on real GPUs): a rougher profile in about half the time.
    pub quick: bool,
    /// Also measure load and signal latencies (pointer chase, ping-pong), which only a simulator
    /// preset needs.
    pub latencies: bool,
}

/// One hop's sweep; its fit is the hop's cost.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct HopSweep {
    pub hop: Hop,
    pub sweep: Sweep,
}

impl HopSweep {
    /// The fitted cost, if the sweep could be fitted.
    pub fn cost(&self) -> Option<Cost> {
        self.sweep.fit.map(|f| Cost {
            alpha_us: f.alpha_us,
            beta_gbps: f.beta_gbps,
        })
    }
}

/// Latency of a dependent load and of a signal between two kernels, and GPU time of a small copy,
/// on one pair of GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PairLatency {
    pub src: usize,
    pub dst: usize,
    /// Round trip of one dependent load by `src` from `dst`'s memory (pointer chase, caches
    /// flushed), ns.
    pub load_ns: f64,
    /// The same through a chain the caches hold (pointer-chase-resident), ns.
    pub resident_load_ns: f64,
    /// One way, fenced store + flag between kernels on the two GPUs (half a ping-pong), µs.
    pub signal_us: f64,
    /// GPU time per back-to-back 4 B copy-engine copy (bench's copy-latency), µs.
    pub copy_us: f64,
}

/// A copy within one GPU at the bench's plateau size: the rate the simulator's local copies take.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct PlateauCopy {
    pub device: usize,
    pub bytes: u64,
    /// Median GPU µs per copy, back to back behind a held stream.
    pub median_us: f64,
}

/// Load and signal latencies within a GPU and, where the host has such pairs, over NVLink and
/// over PCIe; and a local copy at its plateau size.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Latencies {
    pub local: PairLatency,
    pub nvlink: Option<PairLatency>,
    pub pcie: Option<PairLatency>,
    pub local_plateau: PlateauCopy,
}

/// Everything `tune` measured on one host.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Measurements {
    /// `cuda` or `sim:<preset>`.
    pub source: crate::topology::Source,
    /// UTC date of the run, `YYYY-MM-DD`.
    pub measured_on: String,
    pub devices: Vec<usize>,
    /// The message sizes every hop was swept over.
    pub sizes: Vec<u64>,
    pub timing: Sampling,
    /// Every hop swept, fitted or not.
    pub hops: Vec<HopSweep>,
    /// Lone small direct operations, both methods, on every measured pair and every GPU to itself.
    pub lone: Vec<Lone>,
    /// An SM copy kernel within the first GPU: its α is a kernel's fixed cost, its β against the
    /// local copy engine's the kernel's efficiency.
    pub sm_local: Sweep,
    pub issue: IssueCosts,
    /// Host µs of a blocking synchronisation on a completed event (waking up).
    pub sync_us: f64,
    /// Host µs from the return of the call that queues an empty marker (an event) on an idle
    /// stream until the host's synchronisation on it returns: the GPU picking work up, its
    /// completion signal and the host's wake-up — what the simulator's `sync_us` stands for.
    pub receiver_us: f64,
    /// GPU µs per copy node of a replayed graph.
    pub graph_node_us: f64,
    /// GPU µs per message of one batched copy kernel, beyond its bytes.
    pub batch_message_us: f64,
    /// Measured only when asked for ([`Options::latencies`]).
    pub latencies: Option<Latencies>,
    /// The host route beside a direct copy, on the pairs whose split takes both.
    pub splits: Vec<beside::SplitFit>,
    /// The host route both ways, on the first pair measured in both directions.
    pub both_ways: Option<beside::BothWaysFit>,
    /// How the figures were taken and what could not be measured, one sentence each.
    pub notes: Vec<String>,
}

impl Measurements {
    /// The host profile: every fitted hop, the issue, graph and batch costs, keyed to `topology`'s
    /// GPUs and driver.
    pub fn profile(&self, topology: &Topology) -> Profile {
        let mut profile = Profile::for_host(topology);
        profile.hops = self
            .hops
            .iter()
            .filter_map(|h| h.cost().map(|cost| Measured { hop: h.hop, cost }))
            .collect();
        // A GPU is its own peer: a direct copy to itself is the local copy (copy engine) or the
        // SM-kernel sweep within it, so those fits price it too.
        let to_itself: Vec<Measured> = profile
            .hops
            .iter()
            .filter_map(|m| match m.hop {
                Hop::Local { device } => Some(Measured {
                    hop: Hop::PeerCe {
                        src: device,
                        dst: device,
                    },
                    cost: m.cost,
                }),
                _ => None,
            })
            .chain(self.sm_local.fit.map(|f| Measured {
                hop: Hop::PeerSm {
                    src: self.sm_local.src,
                    dst: self.sm_local.src,
                },
                cost: Cost {
                    alpha_us: f.alpha_us,
                    beta_gbps: f.beta_gbps,
                },
            }))
            .collect();
        profile.hops.extend(to_itself);
        profile.batch_message_us = Some(self.batch_message_us);
        profile.graph_node_us = Some(self.graph_node_us);
        profile.issue = Some(self.issue);
        profile.lone = self.lone.clone();
        // A pair without a physically possible fit keeps the estimate (or another pair's).
        profile.beside_direct = self
            .splits
            .iter()
            .filter_map(|s| {
                let kept = s.kept()?;
                Some(BesideDirect {
                    src: s.src,
                    dst: s.dst,
                    rate_fraction: kept.rate_fraction,
                    chunk_us: kept.chunk_us,
                    fixed_us: kept.fixed_us,
                    direct_rate_fraction: s.kept_direct().map_or(1.0, |d| d.rate_fraction),
                    direct_fixed_us: s.kept_direct().map_or(0.0, |d| d.fixed_us),
                    splits: s.fitted_to(),
                    both_ways: self.both_ways_of(s.src, s.dst),
                })
            })
            .collect();
        profile.measured_on = Some(self.measured_on.clone());
        profile.notes = self.notes.clone();
        profile
    }

    /// The host route's fraction both ways from `src` to `dst`, where one was fitted on that pair.
    fn both_ways_of(&self, src: usize, dst: usize) -> Option<BothWays> {
        let fit = self.both_ways.as_ref()?;
        let on_pair = fit.pair == (src, dst) || fit.pair == (dst, src);
        Some(BothWays {
            fraction: fit.fraction.filter(|_| on_pair)?,
            splits: fit.fitted_to(src, dst),
        })
    }

    /// The fitted costs of the hops `matches` selects.
    pub fn costs(&self, matches: impl Fn(Hop) -> bool) -> Vec<(Hop, Cost)> {
        self.hops
            .iter()
            .filter(|h| matches(h.hop))
            .filter_map(|h| h.cost().map(|c| (h.hop, c)))
            .collect()
    }
}

/// What tune measures with, on one backend.
struct Plan {
    /// The sizes every hop is swept over.
    sizes: Vec<u64>,
    sampling: Sampling,
    /// Samples of the issue costs and of the small-copy latencies (as the bench's latency tests).
    latency_samples: u32,
    /// The size of the one local copy whose rate the exported simulator takes (the bench's plateau
    /// on GPUs; on the simulator, whose times are affine in the bytes, its largest sweep size).
    local_plateau_bytes: u64,
}

/// Sizes and sampling for this backend.
fn plan(simulated: bool, quick: bool) -> Plan {
    if simulated {
        let sizes = if quick { SIM_QUICK_SIZES } else { SIM_SIZES };
        // The simulator's own bench defaults: its virtual time repeats exactly.
        let sampling = Sampling {
            warmup: 1,
            iterations: 2,
            samples: 1,
            rotation_bytes: 0,
        };
        Plan {
            local_plateau_bytes: sizes.iter().copied().max().unwrap_or(0),
            sizes: sizes.to_vec(),
            sampling,
            latency_samples: 1,
        }
    } else {
        let sizes = if quick { GPU_QUICK_SIZES } else { GPU_SIZES };
        let sampling = Sampling {
            warmup: 2,
            iterations: 8,
            samples: if quick { 1 } else { 3 },
            // Beyond the H200's 60 MB L2, as the bench's own default.
            rotation_bytes: 64 << 20,
        };
        Plan {
            sizes: sizes.to_vec(),
            sampling,
            latency_samples: if quick { 5 } else { super::LATENCY_SAMPLES },
            local_plateau_bytes: super::PLATEAU.local,
        }
    }
}

/// Measures this host. `progress` hears of every size of every sweep.
pub fn run(
    shared: &Arc<dyn Backend>,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Measurements> {
    let backend = &**shared;
    let topo = backend.topology();
    let devices = one_host_devices(topo, options)?;
    let plan = plan(topo.is_simulated(), options.quick);
    let sizes = plan.sizes.clone();
    check_fits(backend, &devices, sizes.iter().copied().max().unwrap_or(0))?;
    let chase_region = Defaults::for_backend(backend).chase_region_bytes;
    let mut ctx = Context::new(backend, devices.clone(), plan.sampling, chase_region);
    ctx.latency_samples = plan.latency_samples;
    let mut notes = opening_notes(backend, &plan);
    let hops = hop_sweeps(&mut ctx, &sizes, progress, &mut notes)?;
    let sm_local = sm_local_sweep(&mut ctx, devices[0], &sizes, progress)?;
    let lone = lone_operations(backend, &mut ctx, progress)?;
    notes.push(lone_note());
    let fixed = fixed_costs(&mut ctx, &hops, progress, &mut notes)?;
    let latencies = if options.latencies {
        Some(latencies(
            &mut ctx,
            &devices,
            plan.local_plateau_bytes,
            progress,
        )?)
    } else {
        None
    };
    let mut measured = Measurements {
        source: backend.source().clone(),
        measured_on: crate::document::utc_date(std::time::SystemTime::now()),
        devices,
        sizes,
        timing: plan.sampling,
        hops,
        lone,
        sm_local,
        issue: fixed.issue,
        sync_us: fixed.sync_us,
        receiver_us: fixed.receiver_us,
        graph_node_us: fixed.graph_node_us,
        batch_message_us: fixed.batch_message_us,
        latencies,
        splits: Vec::new(),
        both_ways: None,
        notes,
    };
    if measured.devices.len() > 1 {
        // Stopped here, the profile keeps everything but the host route's pace beside a direct
        // copy, and says partial.
        crate::interrupt::unless_stopped(measure_beside(shared, &mut measured, progress))?;
    }
    Ok(measured)
}

/// The GPUs `options` selects, refused unless they are all on one host.
fn one_host_devices(topo: &Topology, options: &Options) -> Result<Vec<usize>> {
    let devices = topo.select(options.devices.as_deref())?;
    if let Some(&other) = devices.iter().find(|&&d| topo.crosses_hosts(devices[0], d)) {
        return Err(Error::usage(format!(
            "tune measures one host, and GPU {} and GPU {other} are on different hosts: choose \
             the GPUs of one host with --devices",
            devices[0]
        )));
    }
    Ok(devices)
}

/// The notes that say how every hop is measured, and on a simulator that it is one.
fn opening_notes(backend: &dyn Backend, plan: &Plan) -> Vec<String> {
    let sampling = plan.sampling;
    let mut notes = vec![format!(
        "each hop: time = α + bytes/β fitted (relative residuals, Huber weights) to GPU times of \
         back-to-back copies queued behind a held stream at {} ({} warm-up, {} timed, {} sample{} \
         each); every byte verified",
        plan.sizes
            .iter()
            .map(|&s| format_bytes(s))
            .collect::<Vec<_>>()
            .join(", "),
        sampling.warmup,
        sampling.iterations,
        sampling.samples,
        if sampling.samples == 1 { "" } else { "s" }
    )];
    if backend.topology().is_simulated() {
        notes.push(format!(
            "SIMULATED host ({}): the figures come from the preset's link model on a virtual \
             clock, not from hardware",
            backend.source()
        ));
    }
    notes
}

/// Every hop's sweep: the peer pairs, then each GPU's host and local copies; a note for each hop
/// left without a fit.
fn hop_sweeps(
    ctx: &mut Context<'_>,
    sizes: &[u64],
    progress: &dyn Progress,
    notes: &mut Vec<String>,
) -> Result<Vec<HopSweep>> {
    let mut hops = peer_sweeps(ctx, sizes, progress, notes)?;
    hops.extend(gpu_sweeps(ctx, sizes, progress)?);
    for h in hops.iter().filter(|h| h.sweep.fit.is_none()) {
        notes.push(format!(
            "{}: no α–β fit ({}); the model keeps its default for this hop",
            describe(h.hop),
            h.sweep
                .not_measured
                .as_deref()
                .unwrap_or("the times did not grow with the size")
        ));
    }
    Ok(hops)
}

/// An SM copy kernel within GPU `first`, swept over `sizes`.
fn sm_local_sweep(
    ctx: &mut Context<'_>,
    first: usize,
    sizes: &[u64],
    progress: &dyn Progress,
) -> Result<Sweep> {
    progress.start("sm-local sweep", sizes.len() as u64);
    let sm = PeerCopy::new(
        "sm",
        Transport::Direct(CopyMethod::SmKernel),
        Initiator::Source,
        false,
    );
    let place = Place::Pair {
        src: first,
        dst: first,
    };
    let sweep = sweep_pair(ctx, &sm, place, sizes, progress)?;
    progress.finish();
    Ok(sweep)
}

fn lone_note() -> String {
    format!(
        "lone operations: GPU time of one {SMALL_BYTES} B copy (copy engine, copy kernel) on an \
         idle stream from an event recorded before it is queued to one after it, the two \
         methods taking turns, median of {} after {} untimed, on every measured pair and each \
         GPU to itself; a GPU's direct copies to itself are priced by its local copy (copy \
         engine) and its SM-kernel sweep",
        LONE.runs, LONE.warmup
    )
}

/// What the model needs besides hops, measured once.
struct FixedCosts {
    issue: IssueCosts,
    sync_us: f64,
    receiver_us: f64,
    graph_node_us: f64,
    batch_message_us: f64,
}

/// The CPU's cost to queue a copy, a kernel, an event and a graph, the completion costs, and the
/// GPU time per graph node and per batched message; a note says how.
fn fixed_costs(
    ctx: &mut Context<'_>,
    hops: &[HopSweep],
    progress: &dyn Progress,
    notes: &mut Vec<String>,
) -> Result<FixedCosts> {
    let backend = ctx.backend;
    let first = ctx.devices[0];
    progress.start("issue costs", 5);
    let stream = ctx.streams(&[first])?[0];
    // The copies transfers issue go to a peer: priced where the host has one, as bench's
    // issue-cost measures it (taken from a GPU's copies to itself, the exported simulator's
    // issue-cost came out 2.2 times the bench's on the H200 pair).
    let (a, b) = first_peer_pair(ctx).unwrap_or((first, first));
    // Host-clock costs, each on the CPU where it ran fastest, as bench's issue-cost and
    // e2e-latency take theirs (the exported simulator is compared with them).
    let pin = !ctx.topology().is_simulated();
    let copy_us = queue_cost_us(ctx, a, b, CopyMethod::CopyEngine)?;
    progress.step();
    let kernel_us = queue_cost_us(ctx, a, b, CopyMethod::SmKernel)?;
    progress.step();
    let event_us = on_fastest_cpu(pin, || event_us(backend, stream))?;
    let sync_us = on_fastest_cpu(pin, || Ok(completion_costs(backend, stream)?.sync_us))?;
    let marker_us = on_fastest_cpu(pin, || Ok(completion_costs(backend, stream)?.marker_us))?;
    progress.step();
    let graph = graph_costs(ctx, first)?;
    progress.step();
    let local_beta = hops
        .iter()
        .find(|h| h.hop == Hop::Local { device: first })
        .and_then(HopSweep::cost)
        .map(|c| c.beta_gbps);
    let batch_message_us = batch_message_us(backend, stream, first, local_beta)?;
    progress.step();
    progress.finish();
    notes.push(fixed_costs_note(a, b, first, pin));
    Ok(FixedCosts {
        issue: IssueCosts {
            copy_us,
            kernel_us,
            event_us,
            graph_us: graph.launch_us,
        },
        sync_us,
        receiver_us: marker_us,
        graph_node_us: graph.node_us,
        batch_message_us,
    })
}

fn fixed_costs_note(a: usize, b: usize, first: usize, pin: bool) -> String {
    format!(
        "CPU cost to queue one {SMALL_BYTES} B copy and one copy kernel from GPU {a} to GPU {b} \
         (host clock, {ISSUE_OPERATIONS} in a row per sample, as bench's issue-cost: {}); on GPU \
         {first} (its own peer): to record an event and to learn of a completion (median of {}, \
         {}) and to launch a graph (median of {}), GPU time per node of a replayed graph of \
         {GRAPH_COPIES} copies and per message of one batched copy kernel of {BATCH_MESSAGES} × \
         {BATCH_MESSAGE_BYTES} B beyond its bytes (median of {} windows behind a held \
         stream)",
        if pin {
            "a sample on each CPU the thread may run on, the lowest"
        } else {
            "the median of the samples after one thrown away"
        },
        PROBES.runs,
        if pin {
            "on each CPU, the lowest"
        } else {
            "where the thread is"
        },
        PROBES.runs,
        WINDOWS.runs
    )
}

/// The host route beside a direct copy, and both ways: the split is planned with every cost
/// measured so far, as a profile would price it.
fn measure_beside(
    shared: &Arc<dyn Backend>,
    measured: &mut Measurements,
    progress: &dyn Progress,
) -> Result<()> {
    let topo = shared.topology();
    let model = CostModel::from_profile(topo, &measured.profile(topo))?;
    let devices = &measured.devices;
    let (fits, notes) = beside::measure(shared, &model, devices, progress)?;
    measured.notes.extend(notes);
    let (both_ways, notes) = beside::measure_both_ways(shared, &model, devices, &fits, progress)?;
    measured.splits = fits;
    measured.both_ways = both_ways;
    measured.notes.extend(notes);
    Ok(())
}

/// A test of every ordered pair with P2P, and the hop it prices.
type PeerTest = (Box<dyn TestCase>, fn(usize, usize) -> Hop);

/// The ordered pairs among the selected GPUs with P2P (measured) and the others (named in a note).
fn peer_sweeps(
    ctx: &mut Context<'_>,
    sizes: &[u64],
    progress: &dyn Progress,
    notes: &mut Vec<String>,
) -> Result<Vec<HopSweep>> {
    let topo = ctx.topology();
    let devices = ctx.devices.clone();
    let ordered: Vec<(usize, usize)> = devices
        .iter()
        .flat_map(|&a| devices.iter().map(move |&b| (a, b)))
        .filter(|(a, b)| a != b)
        .collect();
    let (with_p2p, without): (Vec<_>, Vec<_>) = ordered
        .into_iter()
        .partition(|&(a, b)| topo.pair(a, b).is_some_and(|p| p.p2p));
    if devices.len() < 2 {
        notes.push(format!(
            "one GPU selected: no peer pairs to measure, so copies to other GPUs keep the topology's \
             defaults; GPU {} was measured as its own peer (local, SM, lone, host and issue costs)",
            devices[0]
        ));
    } else if with_p2p.is_empty() {
        notes.push(
            "no selected pair has P2P: no peer copies to measure (transfers between these GPUs \
             are staged through host memory, whose hops were measured)"
                .to_string(),
        );
    }
    if !without.is_empty() && !with_p2p.is_empty() {
        notes.push(format!(
            "not measured, no P2P: {} (the model stages them through host memory)",
            without
                .iter()
                .map(|(a, b)| format!("{a}→{b}"))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let tests: [PeerTest; 3] = [
        (
            Box::new(PeerCopy::new(
                "ce",
                Transport::Direct(CopyMethod::CopyEngine),
                Initiator::Source,
                false,
            )),
            |src, dst| Hop::PeerCe { src, dst },
        ),
        (
            Box::new(PeerCopy::new(
                "sm",
                Transport::Direct(CopyMethod::SmKernel),
                Initiator::Source,
                false,
            )),
            |src, dst| Hop::PeerSm { src, dst },
        ),
        (Box::new(ResidentWrite), |src, dst| Hop::Resident {
            src,
            dst,
        }),
    ];
    let mut sweeps = Vec::new();
    for (test, hop) in &tests {
        if with_p2p.is_empty() {
            continue;
        }
        progress.start(
            &format!("{} sweeps", test.name()),
            (with_p2p.len() * sizes.len()) as u64,
        );
        for &(src, dst) in &with_p2p {
            sweeps.push(sweep_hop(
                ctx,
                test.as_ref(),
                hop(src, dst),
                sizes,
                progress,
            )?);
        }
        progress.finish();
    }
    if !with_p2p.is_empty() {
        notes.push(format!(
            "resident hops: back-to-back submissions through a resident worker on the source \
             GPU, host clock from the first call to the last completion per transfer, fitted as \
             the others; their lone time: one {RESIDENT_LATENCY_BYTES} B transfer from the call \
             until the host sees it complete (bench's resident-latency), on every measured pair \
             and each GPU to itself"
        ));
    }
    Ok(sweeps)
}

/// Host↔device per GPU and NUMA node (the host's pinned memory may sit on either socket), and a
/// copy within each GPU.
fn gpu_sweeps(
    ctx: &mut Context<'_>,
    sizes: &[u64],
    progress: &dyn Progress,
) -> Result<Vec<HopSweep>> {
    let topo = ctx.topology();
    let mut nodes: Vec<i32> = topo.devices.iter().filter_map(|d| d.numa_node).collect();
    nodes.sort_unstable();
    nodes.dedup();
    let mut todo: Vec<(Box<dyn TestCase>, Hop)> = Vec::new();
    for &device in &ctx.devices {
        // Where the GPU's own node is unknown, so is every other: measure "wherever it lands".
        let host_nodes: Vec<Option<i32>> = match topo.devices[device].numa_node {
            None => vec![None],
            Some(_) => nodes.iter().copied().map(Some).collect(),
        };
        for node in host_nodes {
            for direction in [HostDirection::HostToDevice, HostDirection::DeviceToHost] {
                let test = match node {
                    Some(n) => HostCopy::on_node(direction, n),
                    None => HostCopy::new(direction),
                };
                let hop = match direction {
                    HostDirection::HostToDevice => Hop::HostToDevice { device, node },
                    _ => Hop::DeviceToHost { device, node },
                };
                todo.push((Box::new(test), hop));
            }
        }
        todo.push((
            Box::new(HostCopy::new(HostDirection::Local)),
            Hop::Local { device },
        ));
    }
    progress.start("host and local sweeps", (todo.len() * sizes.len()) as u64);
    let mut sweeps = Vec::with_capacity(todo.len());
    for (test, hop) in &todo {
        sweeps.push(sweep_hop(ctx, test.as_ref(), *hop, sizes, progress)?);
    }
    progress.finish();
    Ok(sweeps)
}

fn sweep_hop(
    ctx: &mut Context<'_>,
    test: &dyn TestCase,
    hop: Hop,
    sizes: &[u64],
    progress: &dyn Progress,
) -> Result<HopSweep> {
    let place = match hop {
        Hop::PeerCe { src, dst }
        | Hop::PeerSm { src, dst }
        | Hop::Resident { src, dst }
        | Hop::NetRdma { src, dst }
        | Hop::NetHost { src, dst } => Place::Pair { src, dst },
        Hop::DeviceToHost { device, .. }
        | Hop::HostToDevice { device, .. }
        | Hop::Local { device } => Place::Device { device },
    };
    Ok(HopSweep {
        hop,
        sweep: sweep_pair(ctx, test, place, sizes, progress)?,
    })
}

/// A hop in words: `GPU 0 → GPU 1 (copy engine)`.
pub fn describe(hop: Hop) -> String {
    let host = |node: Option<i32>| match node {
        Some(n) => format!("host memory on NUMA node {n}"),
        None => "host memory".to_string(),
    };
    match hop {
        Hop::PeerCe { src, dst } => format!("GPU {src} → GPU {dst} (copy engine)"),
        Hop::PeerSm { src, dst } => format!("GPU {src} → GPU {dst} (SM kernel)"),
        Hop::DeviceToHost { device, node } => format!("GPU {device} → {}", host(node)),
        Hop::HostToDevice { device, node } => format!("{} → GPU {device}", host(node)),
        Hop::Local { device } => format!("GPU {device} → GPU {device} (local copy)"),
        Hop::NetRdma { src, dst } => format!("GPU {src} → GPU {dst} (GPUDirect RDMA)"),
        Hop::NetHost { src, dst } => {
            format!("host memory by GPU {src}'s NIC → host memory by GPU {dst}'s NIC (RDMA)")
        }
        Hop::Resident { src, dst } => format!("GPU {src} → GPU {dst} (resident worker)"),
    }
}

/// The first ordered pair of distinct selected GPUs with P2P, peer access enabled.
fn first_peer_pair(ctx: &Context<'_>) -> Option<(usize, usize)> {
    let topo = ctx.topology();
    ctx.devices
        .iter()
        .flat_map(|&a| ctx.devices.iter().map(move |&b| (a, b)))
        .filter(|&(a, b)| a != b && topo.pair(a, b).is_some_and(|p| p.p2p))
        .find(|&(a, b)| super::cases::enable(ctx, a, b).is_none())
}

/// Host µs to queue one small copy from GPU `src` to GPU `dst` by `method`, as bench's issue-cost
/// takes it: back-to-back copies, on the CPU where they ran fastest.
fn queue_cost_us(ctx: &mut Context<'_>, src: usize, dst: usize, method: CopyMethod) -> Result<f64> {
    match SmallCopy::issue_costs(ctx, "tune issue cost", src, dst, method)? {
        Ok(spread) => Ok(spread.lowest),
        Err(message) => Err(Error::PeerAccess { src, dst, message }),
    }
}

/// `measure` (a host-clock figure) on each CPU the thread may run on, where `pin`, else once:
/// the lowest it returned.
fn on_fastest_cpu(pin: bool, mut measure: impl FnMut() -> Result<f64>) -> Result<f64> {
    Ok(spread_over_cpus(pin, 1, || Ok(vec![measure()?]))?.lowest)
}

/// Lone operations per method and pair: untimed ones first (first use of a pair, of a kernel),
/// then many timed ones, since the two methods differ by a fraction of a microsecond.
const LONE: Runs = Runs {
    warmup: 2,
    runs: 50,
};

/// Both direct methods' lone operation on each GPU to itself and each ordered pair with P2P.
fn lone_operations(
    backend: &dyn Backend,
    ctx: &mut Context<'_>,
    progress: &dyn Progress,
) -> Result<Vec<Lone>> {
    let topo = ctx.topology();
    let devices = ctx.devices.clone();
    let pairs: Vec<(usize, usize)> = devices
        .iter()
        .flat_map(|&a| devices.iter().map(move |&b| (a, b)))
        .filter(|&(a, b)| a == b || topo.pair(a, b).is_some_and(|p| p.p2p))
        .collect();
    progress.start("lone operations", pairs.len() as u64);
    let mut lone = Vec::new();
    for (src, dst) in pairs {
        if let Some(why) = super::cases::enable(ctx, src, dst) {
            return Err(Error::PeerAccess {
                src,
                dst,
                message: why,
            });
        }
        let stream = ctx.streams(&[src])?[0];
        let [ce, sm] = lone_us(backend, stream, src, dst)?;
        lone.push(Lone {
            hop: Hop::PeerCe { src, dst },
            lone_us: ce,
        });
        lone.push(Lone {
            hop: Hop::PeerSm { src, dst },
            lone_us: sm,
        });
        let place = Place::Pair { src, dst };
        if let Outcome::Measured { value, .. } =
            ResidentLatency.measure(ctx, place, RESIDENT_LATENCY_BYTES)?
        {
            lone.push(Lone {
                hop: Hop::Resident { src, dst },
                lone_us: value,
            });
        }
        progress.step();
    }
    progress.finish();
    Ok(lone)
}

/// GPU µs of one lone `SMALL_BYTES` copy from GPU `src` to GPU `dst` on an idle `stream`, by the
/// copy engine and by a copy kernel, from an event recorded just before the copy is queued to one
/// recorded after it: what a single small direct transfer takes, the CPU's queuing of it included
/// (the GPU waits for it). The two methods take turns ([`interleaved`]).
fn lone_us(backend: &dyn Backend, stream: StreamId, src: usize, dst: usize) -> Result<[f64; 2]> {
    let from = backend.alloc(Memory::Device(src), SMALL_BYTES)?;
    let to = backend.alloc(Memory::Device(dst), SMALL_BYTES)?;
    let copy = BufferCopy::from_start(from, to, SMALL_BYTES);
    let methods = [CopyMethod::CopyEngine, CopyMethod::SmKernel];
    let times = interleaved(LONE, methods.len(), Turn::Once, |m, _| {
        gpu_us(backend, stream, || backend.copy(stream, methods[m], &copy))
    });
    backend.free(from)?;
    backend.free(to)?;
    let times = times?;
    Ok([
        Stats::of_times(&times[0])?.median,
        Stats::of_times(&times[1])?.median,
    ])
}

/// Host µs to record an event.
fn event_us(backend: &dyn Backend, stream: StreamId) -> Result<f64> {
    let record = PROBES.stats(|| {
        let (event, us) = host_us(backend, || backend.record(stream))?;
        backend.synchronize(stream)?;
        backend.destroy_event(event)?;
        Ok(us)
    })?;
    Ok(record.median)
}

/// What a captured graph costs.
struct GraphCosts {
    /// Host µs to launch one replay.
    launch_us: f64,
    /// GPU µs per copy node of a replay.
    node_us: f64,
}

/// Captures [`GRAPH_COPIES`] small copies within `gpu` once, then times replays: the launch on
/// the host clock, the nodes in GPU time. The replayed bytes are verified.
fn graph_costs(ctx: &mut Context<'_>, gpu: usize) -> Result<GraphCosts> {
    let sampling = Sampling {
        warmup: 0,
        iterations: GRAPH_COPIES as u32,
        ..ctx.sampling
    };
    let stream = ctx.streams(&[gpu])?[0];
    let hop = HopSpec {
        stream,
        method: CopyMethod::CopyEngine,
        memory: Memory::Device(gpu),
    };
    let mut lane = Lane::new(
        ctx.backend,
        Context::label("tune graph", gpu, gpu),
        Memory::Device(gpu),
        &[hop],
        SMALL_BYTES,
        &sampling,
        ctx.buffer_budget(gpu)?,
    )?;
    let backend = ctx.backend;
    backend.begin_capture(stream)?;
    let captured = (0..GRAPH_COPIES).try_for_each(|op| lane.enqueue(op).map(drop));
    let graph = Owned::new(backend, backend.end_capture(stream)?);
    captured?;
    lane.fill(ctx.next_seed())?;
    backend.replay(*graph, stream)?; // warm-up: the first replay uploads the graph
    backend.synchronize(stream)?;
    let launch = PROBES.stats(|| {
        let ((), us) = host_us(backend, || backend.replay(*graph, stream))?;
        backend.synchronize(stream)?;
        Ok(us)
    })?;
    let node = WINDOWS.stats(|| {
        let us = held_gpu_us(backend, stream, || backend.replay(*graph, stream))?;
        Ok(us / GRAPH_COPIES as f64)
    })?;
    lane.verify()?;
    Ok(GraphCosts {
        launch_us: launch.median,
        node_us: node.median,
    })
}

/// GPU µs per message of one batched copy kernel within `gpu`: a kernel of [`BATCH_MESSAGES`]
/// messages against a kernel of one, less the bytes at the local copy rate `local_gbps`.
fn batch_message_us(
    backend: &dyn Backend,
    stream: StreamId,
    gpu: usize,
    local_gbps: Option<f64>,
) -> Result<f64> {
    let bytes = BATCH_MESSAGES * BATCH_MESSAGE_BYTES;
    let mut buffers = Buffers::new(backend);
    let src = buffers.alloc(Memory::Device(gpu), bytes)?;
    let dst = buffers.alloc(Memory::Device(gpu), bytes)?;
    let seed = pattern::seed(&[0x7a5e, gpu as u64]);
    backend.write(src, 0, &pattern::bytes(seed, bytes))?;
    backend.write(dst, 0, &vec![0; bytes])?;
    let copies: Vec<BufferCopy> = (0..BATCH_MESSAGES)
        .map(|i| BufferCopy {
            dst,
            dst_offset: i * BATCH_MESSAGE_BYTES,
            src,
            src_offset: i * BATCH_MESSAGE_BYTES,
            len: BATCH_MESSAGE_BYTES,
        })
        .collect();
    // Warm-up: the first launch loads the kernel.
    backend.copy_batch(stream, &copies)?;
    backend.synchronize(stream)?;
    let per_message = WINDOWS.stats(|| {
        let one = held_gpu_us(backend, stream, || backend.copy_batch(stream, &copies[..1]))?;
        let all = held_gpu_us(backend, stream, || backend.copy_batch(stream, &copies))?;
        Ok((all - one) / (BATCH_MESSAGES - 1) as f64)
    })?;
    let mut found = vec![0u8; bytes];
    backend.read(dst, 0, &mut found)?;
    if let Some(m) = pattern::first_mismatch(seed, &found) {
        return Err(m.into_error("tune batch kernel", gpu, gpu));
    }
    let bytes_us = local_gbps.map_or(0.0, |gbps| BATCH_MESSAGE_BYTES as f64 / (gbps * 1e3));
    Ok((per_message.median - bytes_us).max(0.0))
}

/// Both pointer chases, ping-pong and a small copy's GPU time within the first GPU, on the first NVLink
/// pair and on the first PCIe pair with P2P; a copy within the first GPU of `plateau_bytes`.
fn latencies(
    ctx: &mut Context<'_>,
    devices: &[usize],
    plateau_bytes: u64,
    progress: &dyn Progress,
) -> Result<Latencies> {
    let topo = ctx.topology();
    let first_pair = |nvlink: bool| {
        topo.pairs
            .iter()
            .filter(|p| devices.contains(&p.src) && devices.contains(&p.dst))
            .find(|p| p.p2p && p.link.is_nvlink() == nvlink)
            .map(|p| (p.src, p.dst))
    };
    let (nvlink, pcie) = (first_pair(true), first_pair(false));
    progress.start("latencies", 4);
    let local = pair_latency(ctx, devices[0], devices[0])?;
    progress.step();
    let nvlink = nvlink.map(|(a, b)| pair_latency(ctx, a, b)).transpose()?;
    progress.step();
    let pcie = pcie.map(|(a, b)| pair_latency(ctx, a, b)).transpose()?;
    progress.step();
    check_fits(ctx.backend, &devices[..1], plateau_bytes)?;
    let device = devices[0];
    let local_copy = HostCopy::new(HostDirection::Local);
    let local_plateau = match local_copy.measure(ctx, Place::Device { device }, plateau_bytes)? {
        Outcome::Measured { time_us, .. } => PlateauCopy {
            device,
            bytes: plateau_bytes,
            median_us: time_us.median,
        },
        Outcome::Skipped(reason) => {
            return Err(Error::usage(format!(
                "the local copy on GPU {device} could not run: {reason}"
            )))
        }
    };
    progress.finish();
    Ok(Latencies {
        local,
        nvlink,
        pcie,
        local_plateau,
    })
}

fn pair_latency(ctx: &mut Context<'_>, src: usize, dst: usize) -> Result<PairLatency> {
    let place = Place::Pair { src, dst };
    let mut value = |test: &dyn TestCase| -> Result<f64> {
        match test.measure(ctx, place, 8)? {
            Outcome::Measured { value, .. } => Ok(value),
            Outcome::Skipped(reason) => Err(Error::PeerAccess {
                src,
                dst,
                message: format!("{} could not run: {reason}", test.name()),
            }),
        }
    };
    Ok(PairLatency {
        src,
        dst,
        load_ns: value(&PointerChase(ChaseChain::Flushed))?,
        resident_load_ns: value(&PointerChase(ChaseChain::Resident))?,
        signal_us: value(&PingPong)?,
        copy_us: value(&SmallCopy(SmallCopyFigure::GpuTime))?,
    })
}
