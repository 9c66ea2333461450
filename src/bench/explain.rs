//! `peerlink explain`: where the time of one transfer goes, and what each fix would save.
//!
//! The steady-state latency of a transfer, as the host sees it, is split into parts that are each
//! measured on their own: the CPU's cost to issue the copy (launch overhead), the GPU's time to move
//! the bytes (link transfer, from the α–β fit of a sweep of lone copies on the pair), and the time
//! until the receiver learns that it finished (the GPU front end's pickup, the completion signal and
//! the host's wake-up, measured with an empty marker). Their sum is set beside the measured end-to-end time. First
//! use costs (allocation, pinning, peer enable, first transfer) are measured apart as setup. Every
//! saving in the fixes is computed from these measurements.
//!
//! For a read of managed memory ([`run_managed`]) the GPU's part splits instead into the page
//! faults, the pages' move over the link and the read itself, and the fixes are a prefetch and
//! SetAccessedBy.

mod managed;

pub use managed::run as run_managed;

use super::cases::{enable, EndToEnd, Initiator, PeerCopy, TestCase, Transport};
use super::fit::Fit;
use super::progress::Progress;
use super::result::{Place, Sweep};
use super::stats::Stats;
use super::timing::{held_gpu_us, host_us, measure, Lane, Runs, Sampling};
use super::{sweep_pair, Context, Defaults};
use crate::backend::resident::DEFAULT_COPY_BLOCKS;
use crate::backend::{
    Backend, BufferCopy, CopyMethod, EventId, Memory, Owned, Worker, WorkerConfig,
};
use crate::units::format_bytes;
use crate::{Error, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Messages coalesced into one copy when computing what batching saves.
pub const BATCH: u32 = 16;
/// Copies captured into one graph to measure replay.
const GRAPH_COPIES: u64 = 16;
/// Times each completion-cost probe is repeated.
const PROBES: usize = 20;
/// End-to-end transfers per sample.
const TRANSFERS: u32 = 20;
/// Samples (windows of one copy each) per size of the lone-copy sweep.
const LONE_SAMPLES: u32 = 9;

/// One part of the latency.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Part {
    pub name: String,
    pub us: f64,
    /// How it was measured.
    pub measured_by: String,
}

/// A way to cut a part, and what it would save.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Fix {
    /// The part it acts on.
    pub part: String,
    pub fix: String,
    /// µs saved per transfer (or once, for setup); ≤ 0 when the fix would not help here.
    pub saves_us: f64,
    /// The arithmetic behind `saves_us`, from measured figures.
    pub computed_from: String,
}

/// Where one transfer's time goes (the body of the `peerlink.explain/1` document,
/// [`crate::bench::document::ExplainDocument`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Explanation {
    pub src: usize,
    pub dst: usize,
    pub size_bytes: u64,
    /// The path measured: a direct copy-engine write, or staged through host memory without P2P.
    pub route: String,
    /// One-time costs before the first transfer, not part of the steady state.
    pub setup: Vec<Part>,
    /// launch overhead, link transfer, receiver side.
    pub parts: Vec<Part>,
    pub sum_us: f64,
    /// Median end-to-end time measured on the host clock, with its spread.
    pub measured_us: f64,
    pub measured: Stats,
    /// `measured_us - sum_us`.
    pub gap_us: f64,
    /// `|gap| / measured`, in percent.
    pub gap_percent: f64,
    pub adds_up_within_10_percent: bool,
    pub fit: Option<Fit>,
    pub sweep: Sweep,
    pub fixes: Vec<Fix>,
    pub notes: Vec<String>,
}

/// The host clock's resolution, µs: it counts nanoseconds, so a part smaller than one was not seen.
pub const HOST_CLOCK_RESOLUTION_US: f64 = 1e-3;

/// What a part's `measured_by` says where the part was smaller than its measurement resolves.
pub const BELOW_RESOLUTION: &str = "below resolution";

impl Part {
    /// Whether the part was too small to measure (its `us` is then 0, never a negative cost).
    pub fn below_resolution(&self) -> bool {
        self.us == 0.0 && self.measured_by.contains(BELOW_RESOLUTION)
    }
}

/// A part measured on the host clock (see [`resolved`]).
fn part(name: &str, us: f64, measured_by: impl Into<String>) -> Part {
    resolved(name, us, measured_by, HOST_CLOCK_RESOLUTION_US)
}

/// A part of `us` where that is at least `resolution_us`; else 0 µs, said to be below
/// resolution with the figure measured (a difference of two clock readings can come out
/// negative or as rounding noise, and neither is a cost).
fn resolved(name: &str, us: f64, measured_by: impl Into<String>, resolution_us: f64) -> Part {
    let measured_by = measured_by.into();
    let (us, measured_by) = match us >= resolution_us {
        true => (us, measured_by),
        false => (
            0.0,
            format!(
                "{measured_by}; {BELOW_RESOLUTION}: {us:.3} µs measured, under the {resolution_us:.3} µs \
                 this measurement resolves"
            ),
        ),
    };
    Part {
        name: name.to_string(),
        us,
        measured_by,
    }
}

/// The sizes the link is swept over: from 4 B by ×16 to at least 16 MiB and `size`, and `size`.
fn sweep_sizes(size: u64) -> Vec<u64> {
    let top = size.max(16 << 20);
    let mut sizes: Vec<u64> = std::iter::successors(Some(4u64), |&s| {
        (s < top).then(|| s.saturating_mul(16).min(top))
    })
    .collect();
    sizes.push(size);
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// Explains a transfer of `size` bytes from GPU `src` to GPU `dst`.
pub fn run(
    backend: &dyn Backend,
    src: usize,
    dst: usize,
    size: u64,
    progress: &dyn Progress,
) -> Result<Explanation> {
    let Opening {
        defaults,
        mut ctx,
        mut notes,
    } = open(backend, src, dst)?;
    let direct = src == dst || backend.topology().pair(src, dst).is_some_and(|p| p.p2p);
    let test = copy_test(direct);
    check_peak(&ctx, &test, (src, dst), size)?;
    progress.start("explain", 6);
    let (mut setup, mut lane, first_us) = first_use(&mut ctx, &test, (src, dst), size, direct)?;
    progress.step();
    let steady = end_to_end(&mut ctx, &mut lane)?;
    // One transfer against the steady state's median resolves no better than the steady state's
    // own spread.
    let spread = steady.measured.p99 - steady.measured.median;
    setup.push(resolved(
        "first transfer",
        first_us - steady.measured.median,
        "host clock of the first transfer (first launch, module load, mappings) minus the \
         steady-state median",
        spread.max(HOST_CLOCK_RESOLUTION_US),
    ));
    progress.step();
    let seed = ctx.next_seed();
    let m = measure(std::slice::from_mut(&mut lane), &defaults.sampling, seed)?;
    let issue = m.issue_us.median;
    progress.step();
    let windowed_us = m.lane_us[0].median;
    let link = LoneLink::measure(
        backend,
        &test,
        (src, dst),
        size,
        &defaults,
        &lane,
        windowed_us,
    )?;
    progress.step();
    let completion = completion_costs(backend, lane.final_stream())?;
    progress.step();
    let parts = vec![
        launch_part(steady.launch_us, issue - m.start_us.median, direct),
        link.part(size),
        receiver_part(&completion),
    ];

    let mut fixes = vec![setup_fix(&setup)];
    if direct {
        fixes.push(graph_fix(&mut lane, &mut ctx, issue)?);
    }
    progress.step();
    if let Some(f) = link.fit {
        fixes.push(batch_fix(f, issue));
        fixes.push(bigger_messages(f, size));
    }
    fixes.push(staged_versus_direct(
        &mut ctx, src, dst, size, link.us, direct,
    )?);
    if direct {
        let resident = resident_path(backend, src, dst, size, defaults.sampling.samples)?;
        fixes.push(resident.fix(steady.measured.median));
        notes.push(resident.note());
    }
    fixes.extend(receiver_fixes(&completion, link.fit));
    progress.finish();
    let findings = Findings {
        route: route_sentence(src, dst, direct),
        setup,
        parts,
        measured: steady.measured,
        fit: link.fit,
        sweep: link.sweep,
        fixes,
        notes,
    };
    Ok(findings.explain(src, dst, size))
}

/// What every explanation opens with: both GPUs checked, the backend's defaults, a context on the
/// two GPUs and the notes (that the host is simulated, and how the defaults differ there).
struct Opening<'a> {
    defaults: Defaults,
    ctx: Context<'a>,
    notes: Vec<String>,
}

fn open(backend: &dyn Backend, src: usize, dst: usize) -> Result<Opening<'_>> {
    let topo = backend.topology();
    let n = topo.devices.len();
    for (flag, gpu) in [("--src", src), ("--dst", dst)] {
        if let Some(missing) = crate::topology::missing_gpu(gpu, n) {
            return Err(Error::usage(format!("{flag}: {missing}")));
        }
    }
    if let Some(why) = super::cases::other_host(topo, src, dst) {
        return Err(Error::usage(format!("GPU {src} and GPU {dst} are {why}")));
    }
    let defaults = Defaults::for_backend(backend);
    let mut notes: Vec<String> = defaults.note.iter().cloned().collect();
    if topo.is_simulated() {
        notes.insert(
            0,
            format!(
                "SIMULATED host ({}): times come from the preset's model on a virtual clock",
                backend.source()
            ),
        );
    }
    let ctx = Context::new(
        backend,
        vec![src, dst],
        defaults.sampling,
        defaults.chase_region_bytes,
    );
    Ok(Opening {
        defaults,
        ctx,
        notes,
    })
}

/// What an explanation found, before its parts are added up beside the time measured end to end.
struct Findings {
    route: String,
    setup: Vec<Part>,
    parts: Vec<Part>,
    measured: Stats,
    fit: Option<Fit>,
    sweep: Sweep,
    fixes: Vec<Fix>,
    notes: Vec<String>,
}

impl Findings {
    fn explain(self, src: usize, dst: usize, size: u64) -> Explanation {
        let sum_us: f64 = self.parts.iter().map(|p| p.us).sum();
        let gap_us = self.measured.median - sum_us;
        let gap_percent = (gap_us / self.measured.median).abs() * 100.0;
        Explanation {
            src,
            dst,
            size_bytes: size,
            route: self.route,
            setup: self.setup,
            parts: self.parts,
            sum_us,
            measured_us: self.measured.median,
            measured: self.measured,
            gap_us,
            gap_percent,
            adds_up_within_10_percent: gap_percent <= 10.0,
            fit: self.fit,
            sweep: self.sweep,
            fixes: self.fixes,
            notes: self.notes,
        }
    }
}

/// The copy explained: a direct copy-engine write, or staged through host memory without P2P.
fn copy_test(direct: bool) -> PeerCopy {
    let route = if direct {
        Transport::Direct(CopyMethod::CopyEngine)
    } else {
        Transport::Staged
    };
    PeerCopy::new(
        if direct { "ce" } else { "staged" },
        route,
        Initiator::Source,
        false,
    )
}

fn route_sentence(src: usize, dst: usize, direct: bool) -> String {
    if direct {
        format!(
            "direct peer copy: copy-engine write (push) issued on GPU {src}'s stream; link \
             transfer in GPU time"
        )
    } else {
        format!(
            "no P2P between GPU {src} and GPU {dst}: staged through pinned host memory \
             (device→host on GPU {src}'s stream, host→device on GPU {dst}'s)"
        )
    }
}

/// Refuses a size whose memory at its peak does not fit: the lane timed end to end, the lone
/// copies' lane at the sweep's largest size, and the host's copy of a message to fill and check
/// them.
fn check_peak(ctx: &Context<'_>, test: &PeerCopy, pair: (usize, usize), size: u64) -> Result<()> {
    let sampling = ctx.sampling;
    let largest = sweep_sizes(size).into_iter().max().unwrap_or(size);
    let mut footprint = test.lanes_footprint(ctx, &[pair], size as usize, &sampling)?;
    footprint.add_all(&test.lanes_footprint(ctx, &[pair], largest as usize, &sampling)?);
    footprint.add_host(largest);
    footprint.check(
        ctx.backend,
        &format!("explaining {}", format_bytes(size)),
        "choose a smaller --size",
    )
}

/// First-time costs, each on the host clock: peer access, the allocations, then the lane's first
/// transfer (its µs returned with the lane, to be set beside the steady state).
fn first_use<'a>(
    ctx: &mut Context<'a>,
    test: &PeerCopy,
    (src, dst): (usize, usize),
    size: u64,
    direct: bool,
) -> Result<(Vec<Part>, Lane<'a>, f64)> {
    let backend = ctx.backend;
    let mut setup = Vec::new();
    if direct && src != dst {
        let (enabled, us) = host_us(backend, || Ok(enable(ctx, src, dst)))?;
        if let Some(reason) = enabled {
            return Err(Error::PeerAccess {
                src,
                dst,
                message: reason,
            });
        }
        setup.push(part(
            "peer access enable",
            us,
            "host clock around the first enable_peer_access",
        ));
    }
    setup.extend(allocations(backend, (src, dst), size, direct)?);
    let sampling = ctx.sampling;
    let mut lane = test
        .lanes(ctx, &[(src, dst)], size as usize, &sampling)?
        .remove(0);
    let seed = ctx.next_seed();
    lane.fill(seed)?;
    let first_us = EndToEnd::one_transfer(&mut lane, 0)?.total_us;
    Ok((setup, lane, first_us))
}

/// The host clock around allocating the transfer's buffers on both GPUs, and its pinned host
/// memory.
fn allocations(
    backend: &dyn Backend,
    (src, dst): (usize, usize),
    size: u64,
    direct: bool,
) -> Result<[Part; 2]> {
    let message = size as usize;
    let ((), alloc_us) = host_us(backend, || {
        let a = backend.alloc(Memory::Device(src), message)?;
        let b = backend.alloc(Memory::Device(dst), message)?;
        backend.free(a)?;
        backend.free(b)
    })?;
    let numa_node = backend.topology().devices[dst].numa_node;
    let ((), pin_us) = host_us(backend, || {
        let p = backend.alloc(Memory::PinnedHost { numa_node }, message)?;
        backend.free(p)
    })?;
    Ok([
        part(
            "device allocation",
            alloc_us,
            format!(
                "host clock around allocating {} on each GPU",
                format_bytes(size)
            ),
        ),
        part(
            "pinned host allocation",
            pin_us,
            format!(
                "host clock around allocating {} of page-locked host memory{}",
                format_bytes(size),
                if direct {
                    " (the direct route needs none; a staged one does)"
                } else {
                    ""
                }
            ),
        ),
    ])
}

/// The steady state end to end on the host clock, and the issue cost inside the very transfers
/// timed (an idle stream, as a lone transfer has it).
struct Steady {
    measured: Stats,
    launch_us: f64,
}

fn end_to_end(ctx: &mut Context<'_>, lane: &mut Lane<'_>) -> Result<Steady> {
    let (mut times, mut calls) = (Vec::new(), Vec::new());
    for _ in 0..ctx.sampling.samples {
        let seed = ctx.next_seed();
        for t in EndToEnd::host_times(lane, TRANSFERS, seed)? {
            times.push(t.total_us);
            calls.push(t.call_us);
        }
    }
    Ok(Steady {
        measured: Stats::of_times(&times)?,
        launch_us: Stats::of_times(&calls)?.median,
    })
}

/// The link part: the GPU time of ONE copy on its own, as a lone transfer has it, from a fit over
/// windows of one copy each. Back-to-back copies (the bench's sweeps) overlap one copy's start
/// with the previous one's end and would understate a lone copy's latency.
struct LoneLink {
    sweep: Sweep,
    /// The sweep's fit, its α less the two events' own time.
    fit: Option<Fit>,
    /// GPU time between two events with nothing between.
    events_us: f64,
    /// The link part at the size explained.
    us: f64,
}

impl LoneLink {
    /// Sweeps lone copies of `test`; `windowed_us` (a copy's GPU time back to back) stands in
    /// where no fit can be made.
    fn measure(
        backend: &dyn Backend,
        test: &PeerCopy,
        (src, dst): (usize, usize),
        size: u64,
        defaults: &Defaults,
        lane: &Lane<'_>,
        windowed_us: f64,
    ) -> Result<LoneLink> {
        let lone = Sampling {
            iterations: 1,
            samples: defaults.sampling.samples.max(LONE_SAMPLES),
            ..defaults.sampling
        };
        let mut lone_ctx = Context::new(backend, vec![src, dst], lone, defaults.chase_region_bytes);
        let sweep = sweep_pair(
            &mut lone_ctx,
            test,
            Place::Pair { src, dst },
            &sweep_sizes(size),
            &super::progress::Silent,
        )?;
        // The events around a lone copy take GPU time of their own, which the receiver side's
        // marker (itself an event) counts again: measure two events with nothing between and take
        // it out of the fit's α, so that the link part and every saving computed from α are the
        // copy's alone.
        let events_us = empty_window_us(backend, lane.stream(), &lone)?;
        let fit = sweep
            .fit
            .map(|f| Fit::new((f.alpha_us - events_us).max(0.0), f.beta_gbps));
        let us = fit.map_or(windowed_us - events_us, |f| f.time_us(size as f64));
        Ok(LoneLink {
            sweep,
            fit,
            events_us,
            us,
        })
    }

    fn part(&self, size: u64) -> Part {
        let events_us = self.events_us;
        part(
            "link transfer",
            self.us,
            match self.fit {
                Some(f) => format!(
                    "GPU time of a lone copy from the α–β fit at {}: α = {:.2} µs + bytes / β = \
                     {:.1} GB/s, where α leaves out the {events_us:.2} µs of the two events timing \
                     it (GPU time between two events with nothing between)",
                    format_bytes(size),
                    f.alpha_us,
                    f.beta_gbps
                ),
                None => format!(
                    "GPU time per copy at this size (no α–β fit could be made), less the two \
                     events' own {events_us:.2} µs"
                ),
            },
        )
    }
}

/// The launch overhead: the call that queues the copy, in the transfers timed end to end; a
/// staged route's later calls (`later_calls_us`) overlap the transfer.
fn launch_part(launch_us: f64, later_calls_us: f64, direct: bool) -> Part {
    part(
        "launch overhead",
        launch_us,
        if direct {
            "CPU issue cost: host clock in the call that queues the copy, in the transfers timed \
             end to end"
                .to_string()
        } else {
            format!(
                "CPU issue cost of the call that starts the transfer (host clock, in the \
                 transfers timed end to end); the route's later calls ({later_calls_us:.2} µs, \
                 behind a held stream) overlap the transfer"
            )
        },
    )
}

fn setup_fix(setup: &[Part]) -> Fix {
    Fix {
        part: "setup".into(),
        fix: "allocate, pin, enable peer access and run one warm-up transfer at startup, then \
              reuse the buffers"
            .into(),
        saves_us: setup.iter().map(|p| p.us.max(0.0)).sum(),
        computed_from: "the sum of the setup parts, saved once on the first transfer".into(),
    }
}

/// A CUDA graph's replay against the plain issue cost `issue` (measured here).
fn graph_fix(lane: &mut Lane<'_>, ctx: &mut Context<'_>, issue: f64) -> Result<Fix> {
    let graph_us = graph_issue_us(lane, ctx)?;
    Ok(Fix {
        part: "launch overhead".into(),
        fix: "capture the copies once in a CUDA graph and replay it".into(),
        saves_us: issue - graph_us,
        computed_from: format!(
            "plain issue {issue:.2} µs per copy − graph replay {graph_us:.2} µs per copy (host \
             clock of one replay of {GRAPH_COPIES} captured copies / {GRAPH_COPIES})"
        ),
    })
}

fn batch_fix(f: Fit, issue: f64) -> Fix {
    let k = f64::from(BATCH);
    Fix {
        part: "launch overhead".into(),
        fix: format!("batch: coalesce {BATCH} messages into one copy"),
        saves_us: (1.0 - 1.0 / k) * (issue + f.alpha_us),
        computed_from: format!(
            "(1 − 1/{BATCH}) × (issue {issue:.2} µs + α {:.2} µs) per message",
            f.alpha_us
        ),
    }
}

/// Polling instead of a blocking synchronisation, and (with a fit) one wait for many transfers.
fn receiver_fixes(completion: &Completion, fit: Option<Fit>) -> Vec<Fix> {
    let (sync_us, poll_us) = (completion.sync_us, completion.poll_us);
    let mut fixes = vec![Fix {
        part: "receiver side".into(),
        fix: "poll the event (non-blocking query) instead of a blocking synchronisation".into(),
        saves_us: sync_us - poll_us,
        computed_from: format!(
            "synchronise {sync_us:.2} µs − one query {poll_us:.2} µs (host clock, completed event)"
        ),
    }];
    if let Some(f) = fit {
        let k = f64::from(BATCH);
        fixes.push(Fix {
            part: "receiver side".into(),
            fix: format!(
                "wait once per {BATCH} transfers (queue them, then one event) instead of once per \
                 transfer"
            ),
            saves_us: (1.0 - 1.0 / k) * completion.marker_us,
            computed_from: format!(
                "(1 − 1/{BATCH}) × receiver side {:.2} µs per transfer (its pickup and signal are \
                 paid once per wait; α {:.2} µs stays per copy)",
                completion.marker_us, f.alpha_us
            ),
        });
    }
    fixes
}

/// The same transfer through a resident worker, part by part (host clock, medians).
struct ResidentPath {
    src: usize,
    size: u64,
    /// The call that submits one transfer.
    submit_us: f64,
    /// A ticket that moves nothing, from the call until the host sees it complete: the host's
    /// write reaching the worker's poll, and its completion reaching the host's.
    ring_us: f64,
    /// The transfer itself, from the call until the host sees it complete.
    total_us: f64,
}

impl ResidentPath {
    fn fix(&self, measured_us: f64) -> Fix {
        Fix {
            part: "launch overhead".into(),
            fix: "hand the transfer to a resident worker on the source GPU: no launch, copy call \
                  or event; the host polls the worker's completion word"
                .into(),
            saves_us: measured_us - self.total_us,
            computed_from: format!(
                "measured end to end {measured_us:.2} µs − {:.2} µs through a resident worker \
                 (host clock from the call until the host sees it complete)",
                self.total_us
            ),
        }
    }

    fn note(&self) -> String {
        format!(
            "a resident worker on GPU {} ({DEFAULT_COPY_BLOCKS} copy blocks) takes {:.2} µs for {}, \
             call until the host sees it complete: the submit {:.2} µs, the ring and the completion \
             {:.2} µs (a ticket moving nothing, less its submit), the copy and its fence {:.2} µs \
             (the rest); host clock, medians",
            self.src,
            self.total_us,
            format_bytes(self.size),
            self.submit_us,
            self.ring_us - self.submit_us,
            self.total_us - self.ring_us
        )
    }
}

/// Times the transfer through a resident worker on `src` (see [`ResidentPath`]), `samples` ×
/// [`TRANSFERS`] of each, after a warm-up; the bytes are verified.
fn resident_path(
    backend: &dyn Backend,
    src: usize,
    dst: usize,
    size: u64,
    samples: u32,
) -> Result<ResidentPath> {
    let len = size as usize;
    let from = Owned::new(backend, backend.alloc(Memory::Device(src), len)?);
    let to = Owned::new(backend, backend.alloc(Memory::Device(dst), len)?);
    let data = crate::pattern::bytes(size, len);
    backend.write(*from, 0, &data)?;
    let worker = Worker::start(backend, &WorkerConfig::on(src))?;
    let copy = BufferCopy::from_start(*from, *to, len);
    let nothing = BufferCopy::from_start(*from, *to, 0);
    let runs = Runs {
        warmup: 1,
        runs: (samples * TRANSFERS) as usize,
    };
    let round = |copy: &BufferCopy| {
        runs.stats(|| {
            let ((), us) = host_us(backend, || worker.wait(worker.submit(copy)?))?;
            Ok(us)
        })
    };
    let total = round(&copy)?;
    let ring = round(&nothing)?;
    let submit = runs.stats(|| {
        let (ticket, us) = host_us(backend, || worker.submit(&nothing))?;
        worker.wait(ticket)?;
        Ok(us)
    })?;
    worker.stop()?;
    let mut got = vec![0; len];
    backend.read(*to, 0, &mut got)?;
    if let Some(mismatch) = crate::pattern::first_mismatch(size, &got) {
        return Err(mismatch.into_error("explain (resident worker)", src, dst));
    }
    Ok(ResidentPath {
        src,
        size,
        submit_us: submit.median,
        ring_us: ring.median,
        total_us: total.median,
    })
}

/// The receiver side: what it costs the host to learn that the GPU's work finished.
fn receiver_part(completion: &Completion) -> Part {
    part(
        "receiver side",
        completion.marker_us,
        "host clock from queuing an empty marker (an event) on an idle stream until the host sees \
         it complete, after the queuing call returned: the GPU front end picking the work up, its \
         completion signal, and the host's wake-up from the synchronisation",
    )
}

/// Median GPU µs between two events recorded back to back behind a held stream.
fn empty_window_us(
    backend: &dyn Backend,
    stream: crate::backend::StreamId,
    sampling: &Sampling,
) -> Result<f64> {
    let windows = Runs {
        warmup: 0,
        runs: sampling.samples as usize,
    };
    let empty = windows.stats(|| held_gpu_us(backend, stream, || Ok(())))?;
    Ok(empty.median)
}

/// What it costs the host to learn that work finished (medians, host µs).
pub(crate) struct Completion {
    /// A blocking synchronisation on an already completed event.
    pub sync_us: f64,
    /// One non-blocking query of a completed event.
    pub poll_us: f64,
    /// From the return of the call that queues an event on an idle stream until the host's
    /// synchronisation on it returns.
    pub marker_us: f64,
}

pub(crate) fn completion_costs(
    backend: &dyn Backend,
    stream: crate::backend::StreamId,
) -> Result<Completion> {
    let probes = Runs {
        warmup: 0,
        runs: PROBES,
    };
    let marker = probes.stats(|| {
        backend.synchronize(stream)?;
        let event = backend.record(stream)?;
        let ((), us) = host_us(backend, || backend.event_synchronize(event))?;
        backend.destroy_event(event)?;
        Ok(us)
    })?;
    let (sync, poll): (Vec<f64>, Vec<f64>) = probes
        .collect(|| {
            let event: EventId = backend.record(stream)?;
            backend.synchronize(stream)?;
            let ((), sync_us) = host_us(backend, || backend.event_synchronize(event))?;
            let (done, poll_us) = host_us(backend, || backend.event_done(event))?;
            if !done {
                return Err(Error::InvalidHandle(
                    "an event reported unfinished after its stream was synchronised".into(),
                ));
            }
            backend.destroy_event(event)?;
            Ok((sync_us, poll_us))
        })?
        .into_iter()
        .unzip();
    Ok(Completion {
        sync_us: Stats::of_times(&sync)?.median,
        poll_us: Stats::of_times(&poll)?.median,
        marker_us: marker.median,
    })
}

/// Host µs per copy to replay a graph of captured copies; the replayed bytes are verified.
fn graph_issue_us(lane: &mut Lane<'_>, ctx: &mut Context<'_>) -> Result<f64> {
    let backend = lane.backend();
    let stream = lane.stream();
    let copies = GRAPH_COPIES.max(lane.slots() as u64);
    backend.begin_capture(stream)?;
    let captured = (0..copies).try_for_each(|op| lane.enqueue(op).map(drop));
    let graph = Owned::new(backend, backend.end_capture(stream)?);
    captured?;
    lane.fill(ctx.next_seed())?;
    backend.replay(*graph, stream)?; // warm-up: the first replay uploads the graph
    backend.synchronize(stream)?;
    let ((), us) = host_us(backend, || backend.replay(*graph, stream))?;
    backend.synchronize(stream)?;
    lane.verify()?;
    Ok(us / copies as f64)
}

/// What sending bigger messages would save per message of `size`.
fn bigger_messages(f: Fit, size: u64) -> Fix {
    let bytes = size as f64;
    let now = f.time_us(bytes);
    let efficiency = bytes / (f.beta_gbps * 1e3) / now * 100.0;
    let at_ninety = bytes / (0.9 * f.beta_gbps * 1e3);
    Fix {
        part: "link transfer".into(),
        fix: format!(
            "send bigger messages: ≥ {} (9αβ) reach 90% of β, ≥ {} (αβ) half",
            format_bytes(f.ninety_beta_bytes.ceil() as u64),
            format_bytes(f.half_beta_bytes.ceil() as u64)
        ),
        saves_us: now - at_ninety,
        computed_from: format!(
            "at {} a message runs at {efficiency:.0}% of β: α + bytes/β = {now:.2} µs; inside \
             messages at 90% of β these bytes take {at_ninety:.2} µs",
            format_bytes(size)
        ),
    }
}

/// Direct peer copy against staging through host memory, both measured at `size`.
fn staged_versus_direct(
    ctx: &mut Context<'_>,
    src: usize,
    dst: usize,
    size: u64,
    link_us: f64,
    direct: bool,
) -> Result<Fix> {
    if !direct {
        return Ok(Fix {
            part: "link transfer".into(),
            fix: "no P2P between these GPUs: staging through host memory is the only direct \
                  route (a relay through a GPU with P2P to both may be faster)"
                .into(),
            saves_us: 0.0,
            computed_from: "nothing to compare: direct copies are impossible on this pair".into(),
        });
    }
    let staged = PeerCopy::new("staged", Transport::Staged, Initiator::Source, false);
    let staged_us = match staged.measure(ctx, Place::Pair { src, dst }, size)? {
        super::cases::Outcome::Measured { time_us, .. } => time_us.median,
        super::cases::Outcome::Skipped(reason) => {
            return Err(Error::InvalidHandle(format!(
                "staged copy could not run: {reason}"
            )))
        }
    };
    Ok(Fix {
        part: "link transfer".into(),
        fix: if staged_us < link_us {
            "stage through pinned host memory instead of the direct copy at this size".into()
        } else {
            "keep the direct peer copy: staging through host memory is slower at this size".into()
        },
        saves_us: link_us - staged_us,
        computed_from: format!(
            "direct {link_us:.2} µs − staged {staged_us:.2} µs (GPU time per message at {}, both \
             measured)",
            format_bytes(size)
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_part_is_a_negative_cost_or_rounding_noise() {
        let noise = resolved("first transfer", -0.5, "first minus median", 0.2);
        assert_eq!(noise.us, 0.0);
        assert!(noise.below_resolution(), "{noise:?}");
        assert!(noise
            .measured_by
            .contains("-0.500 µs measured, under the 0.200 µs"));
        let tiny = part("peer access enable", 8.9e-16, "host clock");
        assert!(tiny.below_resolution() && tiny.us == 0.0, "{tiny:?}");
        let seen = part("device allocation", 12.5, "host clock");
        assert_eq!((seen.us, seen.measured_by.as_str()), (12.5, "host clock"));
        assert!(!seen.below_resolution());
    }

    #[test]
    fn sweep_sizes_reach_beyond_the_size_and_include_it() {
        let sizes = sweep_sizes(3000);
        assert_eq!(sizes[0], 4);
        assert!(sizes.contains(&3000));
        assert!(*sizes.last().unwrap() >= 16 << 20);
        assert!(sweep_sizes(1 << 30).contains(&(1 << 30)));
    }

    #[test]
    fn bigger_messages_save_nothing_past_ninety_percent() {
        let f = Fit::new(2.0, 400.0);
        let small = bigger_messages(f, 4096);
        assert!(small.saves_us > 1.9, "{small:?}");
        let large = bigger_messages(f, 1 << 30);
        assert!(large.saves_us < 0.0, "{large:?}");
    }
}
