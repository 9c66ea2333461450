//! The host-staged route beside a direct copy, measured: splits of the direct copy-engine route and
//! the host route are run on the engine at two sizes (every byte verified), each route's end timed
//! on the source GPU, and the two figures that price the host route there — its first hop's rate
//! fraction and its extra cost per chunk — are fitted so that the cost model's host route ends when
//! it was measured to at both. Then the splits are planned again with them and run once more: their
//! routes should end together; where they end more than [`REFIT_TOLERANCE`] apart, one
//! rebalancing step fits the figures again to those runs (the bytes shift in proportion), and says
//! so. The direct copy's end is fitted likewise (its rate and an extra per transfer): its share is
//! far larger than the copies its hop was fitted to, and a split priced with the hop's rate leaves
//! the routes apart by as much as that rate is off.
//!
//! A fit is kept only where it is physically possible: a figure on its search bound, a rate above
//! the hop's own (the link's), or a per-chunk cost below zero says the two figures could not make
//! the model's route end when it was measured to, not what the route does. Such a fit is refused
//! (and shown); the rate is fitted alone, the per-chunk cost fixed at the hop's own as measured
//! alone; where that too is impossible the pair keeps the planner's estimate.
//!
//! The figures replace the planner's estimate ([`crate::model::defaults::BESIDE_DIRECT_RATE_FRACTION`],
//! [`crate::model::defaults::BESIDE_DIRECT_CHUNK_US`]) for the measured pairs, and for the host's
//! other pairs for want of their own ([`crate::model::CostModel::beside_direct`]).

use crate::backend::{Backend, CopyMethod};
use crate::bench::progress::Progress;
use crate::bench::proof::document::RouteName;
use crate::bench::proof::sweep::{median_route_ends, route_spread};
use crate::bench::timing::{interleaved, Runs, Turn};
use crate::engine::{Fabric, Plan, Planner, Route, RouteEnd, Strategy, Ways};
use crate::model::profile::{HostRouteEnd, MAX_CHUNK_US, MAX_RATE_FRACTION};
use crate::model::{defaults, CostModel, DirectPace, HostPace};
use crate::pattern;
use crate::units::format_bytes;
use crate::{Error, Result};
use serde::Serialize;
use std::sync::Arc;

/// The splits' sizes on GPUs: where issue 11 sets its goals for the split; the host route carries
/// a few and a few dozen chunks of 4 MiB on the H200 pair.
const GPU_SIZES: [u64; 2] = [256 << 20, 1 << 30];
/// On the simulator, which copies every byte on the CPU: sizes where the H200 pair's planner splits.
const SIM_SIZES: [u64; 2] = [64 << 20, 128 << 20];
/// Runs of each split on GPUs; the median of each route's end is kept.
const GPU_RUNS: Runs = Runs {
    warmup: 2,
    runs: 11,
};
/// Ordered pairs measured at most: the first pair both ways. Other pairs take the first pair's
/// figures (their copy engines and PCIe links are alike on the hosts peerlink knows).
const MAX_PAIRS: usize = 2;
/// The rate fractions tried before the fit is refined between two of them.
const RATE_STEPS: usize = 120;
const LOWEST_RATE: f64 = 0.05;
/// A check run whose routes end further apart than this is fitted to once more: the split ends with
/// its later route, so it loses about that much (on the H200 pair the checks ended 0.2–1.7% apart,
/// and NVLink ended first at both sizes: the first runs' shares were further from the final ones).
pub const REFIT_TOLERANCE: f64 = 0.01;
/// Halvings of an interval that pins a figure down (far below a measurement's own spread).
const HALVINGS: usize = 40;

/// One split, as planned and as measured (the median of its runs).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitRun {
    pub bytes: u64,
    pub chunk_bytes: u64,
    pub routes: Vec<RouteRun>,
    /// (latest − earliest) / latest of the measured ends.
    pub spread: f64,
    #[serde(skip)]
    plan: Plan,
}

/// One route of a [`SplitRun`].
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RouteRun {
    #[serde(flatten)]
    pub route: RouteName,
    pub bytes: u64,
    pub predicted_us: f64,
    /// GPU µs from the split's start until the route's last operation ended (median).
    pub measured_us: f64,
}

impl SplitRun {
    fn host(&self) -> (usize, &RouteRun) {
        self.route(RouteName::Host)
            .expect("a measured split has the host route")
    }

    fn route(&self, name: RouteName) -> Option<(usize, &RouteRun)> {
        self.routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.route == name)
    }

    /// Its source and destination GPUs.
    pub fn pair(&self) -> (usize, usize) {
        (self.plan.src, self.plan.dst)
    }

    /// When its host route ended, as a profile keeps it.
    fn host_end(&self) -> HostRouteEnd {
        let (_, host) = self.host();
        HostRouteEnd {
            split_bytes: self.bytes,
            host_bytes: host.bytes,
            chunk_bytes: self.chunk_bytes,
            host_end_us: host.measured_us,
            direct_end_us: self
                .route(RouteName::DirectCe)
                .map(|(_, direct)| direct.measured_us),
        }
    }
}

/// The figures that price the host route beside a direct copy.
pub type Fit = HostPace;

/// What fitting the figures to some splits came to.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Fitted {
    /// The figures, physically possible; `None` where no fit was: the pair keeps the planner's
    /// estimate (or another measured pair's figures).
    pub fit: Option<Fit>,
    /// Fits tried before and refused, in order, each with why.
    pub refused: Vec<Refused>,
    /// The direct copy's pace fitted to the same runs; `None` where none was physically possible
    /// (it is then priced as its hop alone).
    pub direct: Option<DirectPace>,
}

/// A fit that is not written to a profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Refused {
    #[serde(flatten)]
    pub fit: Fit,
    /// Why, in words: a figure on its search bound, a rate above the link, a negative cost.
    pub why: String,
}

/// The host route beside a direct copy on one ordered pair.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitFit {
    pub src: usize,
    pub dst: usize,
    /// The splits as planned before (with the estimate), run: one per size.
    pub first: Vec<SplitRun>,
    /// The figures with which the model's host route ends when it was measured to in `first`.
    pub fitted: Fitted,
    /// The splits planned again with `fitted`, run (a size where the planner no longer splits is
    /// left out; none where nothing was fitted).
    pub check: Vec<SplitRun>,
    /// Where a check's routes ended more than [`REFIT_TOLERANCE`] apart: the figures fitted again
    /// to the checks (one rebalancing step), which the profile keeps where they are possible.
    pub refitted: Option<Fitted>,
}

impl SplitFit {
    /// The figures the profile keeps; `None` where no fit was physically possible.
    pub fn kept(&self) -> Option<Fit> {
        self.refitted
            .as_ref()
            .and_then(|again| again.fit)
            .or(self.fitted.fit)
    }

    /// The direct copy's pace the profile keeps, fitted to the same runs as [`Self::kept`]'s
    /// figures; `None` where those are none (the profile keeps nothing for the pair) or no pace
    /// was physically possible.
    pub fn kept_direct(&self) -> Option<DirectPace> {
        match &self.refitted {
            Some(again) if again.fit.is_some() => again.direct,
            _ => self.fitted.fit.and(self.fitted.direct),
        }
    }

    /// The splits the kept figures were fitted to, by their host route's end.
    pub fn fitted_to(&self) -> Vec<HostRouteEnd> {
        let runs = if self
            .refitted
            .as_ref()
            .is_some_and(|again| again.fit.is_some())
        {
            &self.check
        } else {
            &self.first
        };
        runs.iter().map(SplitRun::host_end).collect()
    }
}

/// The host route both ways on one pair: both directions' splits, each priced beside its direct
/// copy with the one-way figures kept, run together.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BothWaysFit {
    /// The pair's GPUs; each sends to the other.
    pub pair: (usize, usize),
    /// Both directions' splits at each size, planned both ways with the estimate, run together.
    pub first: Vec<SplitRun>,
    /// The fraction with which the model's host routes end both ways when they were measured to
    /// in `first`; `None` where no possible fraction does.
    pub fraction: Option<f64>,
    /// Fractions found and refused, each with why.
    pub refused: Vec<RefusedFraction>,
    /// The splits planned again with `fraction`, run together (none where nothing was fitted).
    pub check: Vec<SplitRun>,
}

/// A both-ways fraction that is not written to a profile.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RefusedFraction {
    pub fraction: f64,
    pub why: String,
}

impl BothWaysFit {
    /// The runs from `src` to `dst` the fraction was fitted to, by their host route's end.
    pub fn fitted_to(&self, src: usize, dst: usize) -> Vec<HostRouteEnd> {
        self.first
            .iter()
            .filter(|run| run.pair() == (src, dst))
            .map(SplitRun::host_end)
            .collect()
    }
}

/// The splits' sizes and runs on `backend`.
fn sizes_and_runs(backend: &dyn Backend) -> ([u64; 2], Runs) {
    if backend.topology().is_simulated() {
        (SIM_SIZES, Runs { warmup: 1, runs: 1 })
    } else {
        (GPU_SIZES, GPU_RUNS)
    }
}

/// Measures the host route both ways on the first pair of `fits` measured in both directions:
/// both directions' splits at each size, planned both ways ([`Ways::Both`]) with the one-way
/// figures `fits` kept, run together; the fraction that makes the model's host routes end when
/// they were measured to is fitted with those figures held, then the splits are planned with it
/// and run together once more. Returns the fit (`None` where no pair splits both ways) and notes.
pub fn measure_both_ways(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    devices: &[usize],
    fits: &[SplitFit],
    progress: &dyn Progress,
) -> Result<(Option<BothWaysFit>, Vec<String>)> {
    let Some((a, b)) = fits
        .iter()
        .map(|f| (f.src, f.dst))
        .find(|&(a, b)| fits.iter().any(|f| (f.src, f.dst) == (b, a)))
    else {
        return Ok((None, Vec::new()));
    };
    // The one-way figures held: each direction's kept figures (the estimate where none was).
    let model = fits.iter().fold(model.clone(), |m, f| {
        with_kept(&m, f.src, f.dst, f.kept(), f.kept_direct())
    });
    let (sizes, runs) = sizes_and_runs(&**backend);
    let run_all = |model: &CostModel| -> Result<Vec<SplitRun>> {
        let planner = Planner::for_devices(model.clone(), devices);
        let mut done = Vec::new();
        for &bytes in &sizes {
            let plans: Option<Vec<Plan>> = [(a, b), (b, a)]
                .iter()
                .map(|&(src, dst)| {
                    planner
                        .plan_with_ways(Strategy::Split, src, dst, bytes, Ways::Both)
                        .ok()
                        .filter(is_direct_and_host)
                })
                .collect();
            if let Some(plans) = plans {
                done.extend(run_splits(backend, model, devices, plans, runs, progress)?);
            }
        }
        Ok(done)
    };
    let steps = 2 * sizes.len() * (runs.warmup + runs.runs);
    progress.start("split both ways", steps as u64);
    let first = run_all(&model)?;
    let (fraction, refused) = fit_both_ways(&model, &first);
    let check = match fraction {
        Some(f) => run_all(&with_both_ways(&model, (a, b), f))?,
        None => Vec::new(),
    };
    progress.finish();
    let note = format!(
        "the host route both ways: GPU {a} → GPU {b} and GPU {b} → GPU {a} split {} at once \
         (planned both ways, the one-way figures above held), run {} each (median, every byte \
         verified); the fraction of their one-way rate both host hops keep is fitted so that the \
         model's host routes end when they were measured to, over both directions and sizes; the \
         splits are then planned with it and run together again",
        sizes.map(format_bytes).join(" and "),
        match runs.runs {
            1 => "once".to_string(),
            n => format!("{n} times"),
        },
    );
    let fit = BothWaysFit {
        pair: (a, b),
        first,
        fraction,
        refused,
        check,
    };
    Ok((Some(fit), vec![note]))
}

fn with_both_ways(model: &CostModel, (a, b): (usize, usize), fraction: f64) -> CostModel {
    model
        .clone()
        .with_both_ways(a, b, fraction)
        .with_both_ways(b, a, fraction)
}

/// The fraction with which `model`'s host routes of `runs` (splits run both ways) end when they
/// were measured to, summed over the runs; refused where it lands on the search's bound (the
/// model's routes could not end then) or above 1 (faster both ways than one way).
fn fit_both_ways(model: &CostModel, runs: &[SplitRun]) -> (Option<f64>, Vec<RefusedFraction>) {
    let Some(first) = runs.first() else {
        return (None, Vec::new());
    };
    let pair = first.pair();
    let miss = |fraction: f64| -> f64 {
        let paced = with_both_ways(model, pair, fraction);
        runs.iter()
            .map(|run| host_end_in(&paced, run, Ways::Both) - run.host().1.measured_us)
            .sum()
    };
    // The model's ends fall as the fraction rises. At 1 the routes may already end later than
    // measured: faster both ways than one way, unless only by a measurement's spread.
    let fraction = solve(LOWEST_RATE, 1.0, |f| -miss(f));
    let measured: f64 = runs.iter().map(|run| run.host().1.measured_us).sum();
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-6;
    let why = if near(fraction, LOWEST_RATE) {
        Some(format!("{fraction:.3} is the fit's bound"))
    } else if near(fraction, 1.0) && miss(1.0) > ABOVE_LINK_TOLERANCE * measured {
        Some(format!(
            "the host routes ended sooner than a fraction of 1 prices them (faster both ways \
             than one way), by {:.1} µs summed",
            miss(1.0)
        ))
    } else {
        None
    };
    match why {
        None => (Some(fraction), Vec::new()),
        Some(why) => (None, vec![RefusedFraction { fraction, why }]),
    }
}

/// Measures the host route beside a direct copy on the first pairs of `devices` whose split is the
/// direct copy and the host route, priced with `model` (the hops measured so far). Returns the
/// fits and notes saying how, or why nothing was measured.
pub fn measure(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    devices: &[usize],
    progress: &dyn Progress,
) -> Result<(Vec<SplitFit>, Vec<String>)> {
    let (sizes, runs) = sizes_and_runs(&**backend);
    let planner = Planner::for_devices(model.clone(), devices);
    let splits = |src: usize, dst: usize| {
        planner
            .plan_with(Strategy::Split, src, dst, sizes[0])
            .is_ok_and(|plan| is_direct_and_host(&plan))
    };
    let mut pairs: Vec<(usize, usize)> = devices
        .iter()
        .flat_map(|&src| devices.iter().map(move |&dst| (src, dst)))
        .filter(|&(src, dst)| src != dst && splits(src, dst))
        .collect();
    let mut notes = Vec::new();
    let Some(&(a, b)) = pairs.first() else {
        notes.push(format!(
            "the host route beside a direct copy: no pair splits {} over a direct copy and the \
             host route, so nothing was measured; the planner keeps its estimate",
            format_bytes(sizes[0])
        ));
        return Ok((Vec::new(), notes));
    };
    if pairs.len() > MAX_PAIRS {
        notes.push(format!(
            "the host route beside a direct copy was measured on GPU {a} → GPU {b} and back; the \
             other {} pairs take GPU {a} → GPU {b}'s figures",
            pairs.len() - MAX_PAIRS
        ));
        pairs.retain(|&pair| pair == (a, b) || pair == (b, a));
    }
    let largest = sizes.iter().copied().max().unwrap_or(0);
    crate::bench::check_fits(&**backend, devices, largest)?;
    let steps = pairs.len() * 2 * sizes.len() * 2 * (runs.warmup + runs.runs);
    progress.start("split beside direct", steps as u64);
    let fits = pairs
        .into_iter()
        .map(|pair| fit_pair(backend, model, devices, pair, &sizes, runs, progress))
        .collect::<Result<Vec<_>>>()?;
    progress.finish();
    notes.push(format!(
        "the host route beside a direct copy: splits of {} over the direct copy and the host route, \
         run {} each on the engine (median, every byte verified), each route's end timed on \
         the source GPU; the host route's first-hop rate fraction and extra µs per chunk, and \
         the direct copy's rate and extra µs per transfer, are fitted so that the model's \
         routes end when they were measured to at both sizes; the \
         splits are then planned with them and run again, and where their routes end more than \
         {:.0}% apart the figures are fitted once more to those runs",
        sizes.map(format_bytes).join(" and "),
        match runs.runs {
            1 => "once".to_string(),
            n => format!("{n} times"),
        },
        REFIT_TOLERANCE * 100.0
    ));
    Ok((fits, notes))
}

/// Whether a split's routes are a direct copy-engine copy and the host route.
fn is_direct_and_host(plan: &Plan) -> bool {
    let has = |route| plan.paths.iter().any(|p| p.route == route);
    plan.paths.len() == 2 && has(Route::Direct(CopyMethod::CopyEngine)) && has(Route::Host)
}

fn fit_pair(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    devices: &[usize],
    (src, dst): (usize, usize),
    sizes: &[u64],
    runs: Runs,
    progress: &dyn Progress,
) -> Result<SplitFit> {
    let run_all = |model: &CostModel| -> Result<Vec<SplitRun>> {
        let mut done = Vec::new();
        for &bytes in sizes {
            let planned = Planner::for_devices(model.clone(), devices)
                .plan_with(Strategy::Split, src, dst, bytes)
                .ok()
                .filter(is_direct_and_host);
            if let Some(plan) = planned {
                done.extend(run_splits(
                    backend,
                    model,
                    devices,
                    vec![plan],
                    runs,
                    progress,
                )?);
            }
        }
        Ok(done)
    };
    let first = run_all(model)?;
    let fitted = fit(model, &first);
    let check = match fitted.fit {
        Some(found) => run_all(&with_kept(model, src, dst, Some(found), fitted.direct))?,
        None => Vec::new(),
    };
    let refitted = check
        .iter()
        .any(|run| run.spread > REFIT_TOLERANCE)
        .then(|| fit(model, &check));
    Ok(SplitFit {
        src,
        dst,
        first,
        fitted,
        check,
        refitted,
    })
}

fn with_fit(model: &CostModel, src: usize, dst: usize, fit: Fit) -> CostModel {
    model.clone().with_beside_direct(src, dst, fit)
}

/// `model` with what was fitted on the pair from `src` to `dst`, where anything was.
fn with_kept(
    model: &CostModel,
    src: usize,
    dst: usize,
    fit: Option<Fit>,
    direct: Option<DirectPace>,
) -> CostModel {
    let model = fit.map_or_else(|| model.clone(), |fit| with_fit(model, src, dst, fit));
    match direct {
        Some(pace) => model.with_direct_beside_host(src, dst, pace),
        None => model,
    }
}

/// Runs `plans` (splits `model` made, for the ways they run: one, or both directions of a pair)
/// submitted together: once into poisoned destinations whose every byte is checked, then timed;
/// returns each one's routes' median ends.
fn run_splits(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    devices: &[usize],
    plans: Vec<Plan>,
    runs: Runs,
    progress: &dyn Progress,
) -> Result<Vec<SplitRun>> {
    let fabric = Fabric::builder(backend.clone())
        .devices(devices)
        .model(model.clone())
        .open()?;
    let mut buffers = Vec::with_capacity(plans.len());
    for plan in &plans {
        let bytes = plan.bytes;
        let len = usize::try_from(bytes)
            .map_err(|_| Error::usage(format!("{bytes} bytes do not fit in this host's memory")))?;
        let (from, to) = (fabric.alloc(plan.src, len)?, fabric.alloc(plan.dst, len)?);
        let data = pattern::bytes(bytes ^ plan.src as u64, len);
        from.write(0, &data)?;
        to.write(0, &data.iter().map(|b| !b).collect::<Vec<u8>>())?;
        buffers.push((from, to, data));
    }
    let splits = || {
        fabric.submit_together(
            buffers
                .iter()
                .map(|(from, to, _)| {
                    fabric
                        .transfer(from.all(), to.all())
                        .strategy(Strategy::Split)
                        .timed()
                })
                .collect(),
        )
    };
    for t in splits()? {
        t.wait()?;
    }
    for (plan, (_, to, data)) in plans.iter().zip(&buffers) {
        let (src, dst) = (plan.src, plan.dst);
        Error::check_bytes("split beside direct", src, dst, data, &to.to_vec()?)?;
    }
    let timed: Vec<Vec<Vec<RouteEnd>>> = interleaved(runs, 1, Turn::SecondOfTwo, |_, _| {
        progress.step();
        splits()?.iter().map(|t| t.route_ends()).collect()
    })?
    .pop()
    .unwrap_or_default();
    plans
        .into_iter()
        .enumerate()
        .map(|(i, plan)| {
            let each: Vec<Vec<RouteEnd>> = timed.iter().map(|run| run[i].clone()).collect();
            let ends = median_route_ends(&each)?;
            let routes: Vec<RouteRun> = plan
                .paths
                .iter()
                .map(|share| RouteRun {
                    route: share.route.into(),
                    bytes: share.bytes,
                    predicted_us: share.predicted_us,
                    measured_us: ends
                        .iter()
                        .find(|e| e.route == share.route)
                        .expect("a timed split times every route's end")
                        .end_us,
                })
                .collect();
            Ok(SplitRun {
                bytes: plan.bytes,
                chunk_bytes: plan.chunk_bytes,
                spread: route_spread(routes.iter().map(|r| r.measured_us)).unwrap_or(0.0),
                routes,
                plan,
            })
        })
        .collect()
}

/// The figures with which `model`'s host route of each run ends when it was measured to, where
/// they are physically possible. With two runs, both figures first: for each rate fraction the
/// chunk cost that fits the first run, and the fraction where that fits the second too (or comes
/// nearest). Refused ([`impossible`]), or with one run: the rate and an extra per transfer, the
/// chunk cost fixed at the hop's own ([`FIXED_CHUNK_US`]; [`fit_rate_and_fixed`]); refused too,
/// nothing.
fn fit(model: &CostModel, runs: &[SplitRun]) -> Fitted {
    let mut refused = Vec::new();
    let direct = fit_direct(model, runs);
    let Some(run) = runs.first() else {
        return Fitted {
            fit: None,
            refused,
            direct,
        };
    };
    let (src, dst) = (run.plan.src, run.plan.dst);
    let both = (runs.len() > 1).then(|| fit_both(model, runs));
    let fallback = || fit_rate_and_fixed(model, runs, FIXED_CHUNK_US);
    for candidate in both.into_iter().chain(std::iter::once_with(fallback)) {
        match impossible(model, src, dst, candidate) {
            None => {
                return Fitted {
                    fit: Some(candidate),
                    refused,
                    direct,
                }
            }
            Some(why) => refused.push(Refused {
                fit: candidate,
                why,
            }),
        }
    }
    Fitted {
        fit: None,
        refused,
        direct,
    }
}

/// A split's direct copy runs at its hop's rate give or take this fraction: a fit further off is a
/// measurement gone wrong (the H200 pair's came to 1.2–1.5% faster).
const DIRECT_RATE_SPAN: f64 = 0.25;
/// And takes at most this much more or less per transfer than its hop prices it, µs (a lone copy's
/// start-up is a few µs).
const DIRECT_FIXED_LIMIT_US: f64 = 50.0;

/// The pace with which `model`'s direct copy of `runs` ends when it was measured to: the line
/// through the measured ends against the time the hop prices the bytes at — its slope the rate's
/// inverse, its offset the extra per transfer (with one share, the rate alone). `None` where no
/// run has a direct copy, or the pace is not physically possible ([`DIRECT_RATE_SPAN`],
/// [`DIRECT_FIXED_LIMIT_US`]).
fn fit_direct(model: &CostModel, runs: &[SplitRun]) -> Option<DirectPace> {
    // Each run's (the hop's time for the bytes, the model's time before them, the measured end).
    let points: Vec<(f64, f64, f64)> = runs
        .iter()
        .filter_map(|run| {
            let (i, direct) = run.route(RouteName::DirectCe)?;
            let (src, dst) = run.pair();
            let end_at = |rate_fraction: f64| {
                let pace = DirectPace {
                    rate_fraction,
                    fixed_us: 0.0,
                };
                let paced = model.clone().with_direct_beside_host(src, dst, pace);
                Planner::new(paced)
                    .route_ends_us(&run.plan, Ways::One)?
                    .get(i)
                    .copied()
            };
            // The model's end is t + bytes_us / rate_fraction: twice the rate halves bytes_us.
            let (as_hop, twice) = (end_at(1.0)?, end_at(2.0)?);
            let bytes_us = 2.0 * (as_hop - twice);
            Some((bytes_us, as_hop - bytes_us, direct.measured_us))
        })
        .collect();
    if points.is_empty() {
        return None;
    }
    let n = points.len() as f64;
    let mean = |f: fn(&(f64, f64, f64)) -> f64| points.iter().map(f).sum::<f64>() / n;
    let (x, y) = (mean(|p| p.0), mean(|p| p.2 - p.1));
    let spread: f64 = points.iter().map(|p| (p.0 - x).powi(2)).sum();
    let pace = if spread > 1e-9 * x * x {
        let slope = points
            .iter()
            .map(|p| (p.0 - x) * (p.2 - p.1 - y))
            .sum::<f64>()
            / spread;
        DirectPace {
            rate_fraction: 1.0 / slope,
            fixed_us: y - slope * x,
        }
    } else {
        // One share: the rate alone.
        DirectPace {
            rate_fraction: x / y,
            fixed_us: 0.0,
        }
    };
    let possible = (pace.rate_fraction - 1.0).abs() <= DIRECT_RATE_SPAN
        && pace.fixed_us.abs() <= DIRECT_FIXED_LIMIT_US;
    possible.then_some(pace)
}

/// A rate fraction this far above 1 is still the link's rate (a thousandth: far below a
/// measurement's spread).
const ABOVE_LINK_TOLERANCE: f64 = 1e-3;

/// The per-chunk cost beside a direct copy where the rate is fitted alone: none beyond the hop's
/// own, as its sweep measured it alone (the H200 pair's refit came to +0.3 µs).
pub const FIXED_CHUNK_US: f64 = 0.0;

/// Why `fit` cannot be what the host route from `src` to `dst` does beside a direct copy, or
/// `None` where it can: a figure on the search's bound (the fit ran out of room, so the model's
/// route could not end when it was measured to), a first hop faster than it runs alone (above its
/// link), a chunk costing less than nothing, or a route taking less than nothing beyond its
/// chunks' copies.
fn impossible(model: &CostModel, src: usize, dst: usize, fit: Fit) -> Option<String> {
    let chunk_bound = MAX_CHUNK_US * 0.999;
    let near = |a: f64, b: f64| (a - b).abs() <= 1e-6 * b.abs().max(1.0);
    let planner = Planner::new(model.clone());
    let first_alpha_us = planner.host_chunk_alpha_us(src, dst);
    let fixed_part_us = planner.host_fixed_us(src, dst);
    if near(fit.chunk_us.abs(), chunk_bound) || near(fit.fixed_us.abs(), chunk_bound) {
        Some(format!(
            "its cost {:+.1} µs a chunk, {:+.1} µs a transfer is on the fit's bound",
            fit.chunk_us, fit.fixed_us
        ))
    } else if near(fit.rate_fraction, LOWEST_RATE)
        || near(fit.rate_fraction, MAX_RATE_FRACTION * 0.999)
    {
        Some(format!(
            "its rate fraction {:.3} is the fit's bound",
            fit.rate_fraction
        ))
    } else if fit.rate_fraction > 1.0 + ABOVE_LINK_TOLERANCE {
        Some(format!(
            "its rate fraction {:.3} is above the link (faster beside a direct copy than alone)",
            fit.rate_fraction
        ))
    } else if first_alpha_us.is_some_and(|alpha| alpha + fit.chunk_us < 0.0) {
        Some(format!(
            "a chunk would cost {:.1} µs, less than nothing",
            first_alpha_us.unwrap_or_default() + fit.chunk_us
        ))
    } else if fixed_part_us.is_some_and(|fixed| fixed + fit.fixed_us < 0.0) {
        Some(format!(
            "the route's time beyond its chunks' copies would be {:.1} µs, less than nothing",
            fixed_part_us.unwrap_or_default() + fit.fixed_us
        ))
    } else {
        None
    }
}

/// When `model` priced with `fit` says the host route of `run` (one way) ends.
fn modelled_end(model: &CostModel, run: &SplitRun, fit: Fit) -> f64 {
    let (src, dst) = run.pair();
    host_end_in(&with_fit(model, src, dst, fit), run, Ways::One)
}

/// When `model` says the host route of `run`, run as `ways` says, ends.
fn host_end_in(model: &CostModel, run: &SplitRun, ways: Ways) -> f64 {
    let (host, _) = run.host();
    Planner::new(model.clone())
        .route_ends_us(&run.plan, ways)
        .expect("the planner prices the routes of its own split")[host]
}

/// Both figures, fitted to the first two runs.
fn fit_both(model: &CostModel, runs: &[SplitRun]) -> Fit {
    let (a, b) = (&runs[0], &runs[1]);
    // The model's end rises with the chunk cost and falls with the rate.
    let chunk_for = |run: &SplitRun, rate_fraction: f64| {
        let measured = run.host().1.measured_us;
        solve(-MAX_CHUNK_US * 0.999, MAX_CHUNK_US * 0.999, |chunk_us| {
            modelled_end(
                model,
                run,
                Fit {
                    rate_fraction,
                    chunk_us,
                    fixed_us: 0.0,
                },
            ) - measured
        })
    };
    let miss = |rate_fraction: f64| {
        let chunk_us = chunk_for(a, rate_fraction);
        let fit = Fit {
            rate_fraction,
            chunk_us,
            fixed_us: 0.0,
        };
        (modelled_end(model, b, fit) - b.host().1.measured_us, fit)
    };
    let rates: Vec<f64> = (0..=RATE_STEPS)
        .map(|i| {
            let t = i as f64 / RATE_STEPS as f64;
            LOWEST_RATE * (MAX_RATE_FRACTION * 0.999 / LOWEST_RATE).powf(t)
        })
        .collect();
    let misses: Vec<(f64, Fit)> = rates.iter().map(|&r| miss(r)).collect();
    // Where the miss changes sign, refine between the two; else the nearest.
    let crossing = misses
        .windows(2)
        .position(|w| (w[0].0 > 0.0) != (w[1].0 > 0.0));
    match crossing {
        Some(i) => {
            let rate = solve(rates[i], rates[i + 1], |r| {
                let (m, _) = miss(r);
                if misses[i].0 > 0.0 {
                    -m
                } else {
                    m
                }
            });
            miss(rate).1
        }
        None => {
            misses
                .iter()
                .min_by(|x, y| x.0.abs().total_cmp(&y.0.abs()))
                .expect("rates tried")
                .1
        }
    }
}

/// The rate fraction and the extra per transfer, the per-chunk cost fixed at `chunk_us`. Runs of
/// one chunk size cannot tell a per-chunk cost from a slower rate (both stretch every chunk), but
/// they do tell the rate from a cost per transfer, which moves every end alike: the rate where
/// the runs miss alike, then the extra that takes the miss away (with one run, the rate alone).
fn fit_rate_and_fixed(model: &CostModel, runs: &[SplitRun], chunk_us: f64) -> Fit {
    let at = |rate_fraction: f64, fixed_us: f64| Fit {
        rate_fraction,
        chunk_us,
        fixed_us,
    };
    let miss = |run: &SplitRun, rate_fraction: f64| {
        modelled_end(model, run, at(rate_fraction, 0.0)) - run.host().1.measured_us
    };
    let (lo, hi) = (LOWEST_RATE, MAX_RATE_FRACTION * 0.999);
    let Some((smallest, largest)) = runs
        .iter()
        .min_by_key(|r| r.host().1.bytes)
        .zip(runs.iter().max_by_key(|r| r.host().1.bytes))
    else {
        return at(defaults::BESIDE_DIRECT_RATE_FRACTION, 0.0);
    };
    if smallest.host().1.bytes == largest.host().1.bytes {
        // One host share: the rate alone.
        let rate = solve(lo, hi, |rate| -miss(smallest, rate));
        return at(rate, 0.0);
    }
    // The larger run's miss falls faster with the rate than the smaller's.
    let rate = solve(lo, hi, |rate| miss(smallest, rate) - miss(largest, rate));
    let fixed_us = -miss(largest, rate);
    at(
        rate,
        fixed_us.clamp(-MAX_CHUNK_US * 0.999, MAX_CHUNK_US * 0.999),
    )
}

/// The root of `f`, rising on `[lo, hi]`, by halving the interval; an end where `f` does not
/// change sign there.
fn solve(mut lo: f64, mut hi: f64, f: impl Fn(f64) -> f64) -> f64 {
    if f(lo) >= 0.0 {
        return lo;
    }
    if f(hi) <= 0.0 {
        return hi;
    }
    for _ in 0..HALVINGS {
        let mid = 0.5 * (lo + hi);
        if f(mid) > 0.0 {
            hi = mid;
        } else {
            lo = mid;
        }
    }
    0.5 * (lo + hi)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::nvlink_pair;

    /// A run of `plan` whose host route ended where `model` priced with `truth` says.
    fn run_at(model: &CostModel, truth: Fit, bytes: u64) -> SplitRun {
        let plan = Planner::new(model.clone())
            .plan_with(Strategy::Split, 0, 1, bytes)
            .unwrap();
        let ends = Planner::new(with_fit(model, 0, 1, truth))
            .route_ends_us(&plan, Ways::One)
            .unwrap();
        run_ending(plan, bytes, ends)
    }

    /// A run of `plan` (of `bytes`) whose routes ended at `ends`, in the plan's order.
    fn run_ending(plan: Plan, bytes: u64, ends: Vec<f64>) -> SplitRun {
        let routes: Vec<RouteRun> = plan
            .paths
            .iter()
            .zip(ends)
            .map(|(share, end)| RouteRun {
                route: share.route.into(),
                bytes: share.bytes,
                predicted_us: share.predicted_us,
                measured_us: end,
            })
            .collect();
        SplitRun {
            bytes,
            chunk_bytes: plan.chunk_bytes,
            spread: route_spread(routes.iter().map(|r| r.measured_us)).unwrap(),
            routes,
            plan,
        }
    }

    #[test]
    fn the_fit_finds_the_figures_the_host_route_ran_at() {
        let model = CostModel::from_topology(&nvlink_pair());
        for truth in [
            Fit {
                rate_fraction: 0.8,
                chunk_us: 4.0,
                fixed_us: 0.0,
            },
            Fit {
                rate_fraction: 0.97,
                chunk_us: 0.5,
                fixed_us: 0.0,
            },
        ] {
            let runs = [
                run_at(&model, truth, 256 << 20),
                run_at(&model, truth, 1 << 30),
            ];
            let found = fit(&model, &runs);
            assert!(found.refused.is_empty(), "{found:?}");
            let found = found.fit.unwrap();
            assert!(
                (found.rate_fraction - truth.rate_fraction).abs() < 0.01
                    && (found.chunk_us - truth.chunk_us).abs() < 0.2,
                "{found:?} for {truth:?}"
            );
            // One run: the rate alone, the chunk cost fixed at the hop's own.
            let one = fit(&model, &runs[..1]).fit.unwrap();
            assert_eq!(one.chunk_us, FIXED_CHUNK_US);
            assert!(
                one.rate_fraction > 0.5 && one.rate_fraction <= 1.0,
                "{one:?}"
            );
        }
    }

    /// Runs whose host route ended where no physically possible pair of figures puts it.
    fn far_faster(model: &CostModel) -> [SplitRun; 2] {
        let truth = Fit {
            rate_fraction: 0.9,
            chunk_us: 2.0,
            fixed_us: 0.0,
        };
        [256 << 20, 1 << 30].map(|bytes| {
            let mut run = run_at(model, truth, bytes);
            let (host, _) = run.host();
            // Ended at a third of the time: faster than the link, and in no time per chunk.
            run.routes[host].measured_us /= 3.0;
            run
        })
    }

    #[test]
    fn a_fit_on_its_bound_or_beyond_the_link_is_refused_and_never_reaches_the_profile() {
        let model = CostModel::from_topology(&nvlink_pair());
        let runs = far_faster(&model);
        // Left to itself the two-figure fit runs into its bounds.
        let both = fit_both(&model, &runs);
        assert!(
            both.chunk_us <= -MAX_CHUNK_US * 0.99 || both.rate_fraction > 1.0,
            "{both:?}"
        );
        let found = fit(&model, &runs);
        assert_eq!(found.fit, None, "{found:?}");
        // Both attempts are kept with why: the two figures, then the rate alone.
        assert_eq!(found.refused.len(), 2, "{found:?}");
        assert_eq!(found.refused[1].fit.chunk_us, FIXED_CHUNK_US);
        for refused in &found.refused {
            assert!(impossible(&model, 0, 1, refused.fit).is_some());
        }
        // A pair without a possible fit writes nothing: the profile keeps no bound value, and
        // the planner prices the route with its estimate.
        let split = SplitFit {
            src: 0,
            dst: 1,
            first: runs.to_vec(),
            fitted: found,
            check: Vec::new(),
            refitted: None,
        };
        assert_eq!(split.kept(), None);
        // Runs the two figures cannot tell apart, but the rate and a cost per transfer can: the
        // fallback finds them.
        let truth = Fit {
            rate_fraction: 0.9,
            chunk_us: FIXED_CHUNK_US,
            fixed_us: -5.0,
        };
        let shifted = [256 << 20, 1 << 30].map(|bytes| run_at(&model, truth, bytes));
        let found = fit_rate_and_fixed(&model, &shifted, FIXED_CHUNK_US);
        assert!(
            (found.rate_fraction - 0.9).abs() < 0.01 && (found.fixed_us + 5.0).abs() < 0.5,
            "{found:?}"
        );
        assert_eq!(impossible(&model, 0, 1, found), None);
        for bound in [
            Fit {
                rate_fraction: 0.9,
                chunk_us: -MAX_CHUNK_US * 0.999,
                fixed_us: 0.0,
            },
            Fit {
                rate_fraction: LOWEST_RATE,
                chunk_us: 1.0,
                fixed_us: 0.0,
            },
            Fit {
                rate_fraction: 1.2,
                chunk_us: 1.0,
                fixed_us: 0.0,
            },
            Fit {
                rate_fraction: 0.9,
                chunk_us: -500.0,
                fixed_us: 0.0,
            },
        ] {
            assert!(impossible(&model, 0, 1, bound).is_some(), "{bound:?}");
        }
    }

    /// Both directions' runs of splits planned both ways with the estimate, whose host routes
    /// ended where `model` with `fraction` both ways says, then scaled by `stretch`.
    fn both_ways_at(model: &CostModel, fraction: f64, stretch: f64) -> Vec<SplitRun> {
        let truth = with_both_ways(model, (0, 1), fraction);
        [(0, 1), (1, 0)]
            .into_iter()
            .flat_map(|(src, dst)| [256 << 20, 1 << 30].map(|bytes| (src, dst, bytes)))
            .map(|(src, dst, bytes)| {
                let plan = Planner::new(model.clone())
                    .plan_with_ways(Strategy::Split, src, dst, bytes, Ways::Both)
                    .unwrap();
                let ends = Planner::new(truth.clone())
                    .route_ends_us(&plan, Ways::Both)
                    .unwrap();
                run_ending(plan, bytes, ends.into_iter().map(|e| e * stretch).collect())
            })
            .collect()
    }

    #[test]
    fn the_both_ways_fraction_is_found_and_an_impossible_one_refused() {
        let model = CostModel::from_topology(&nvlink_pair());
        for truth in [0.7, 0.85, 1.0] {
            let (found, refused) = fit_both_ways(&model, &both_ways_at(&model, truth, 1.0));
            assert!(refused.is_empty(), "{refused:?}");
            assert!(
                (found.unwrap() - truth).abs() < 0.01,
                "{found:?} for {truth}"
            );
        }
        // Ended in a third of the time: faster both ways than one way, beyond any fraction ≤ 1.
        let (found, refused) = fit_both_ways(&model, &both_ways_at(&model, 0.9, 1.0 / 3.0));
        assert_eq!(found, None);
        assert!(refused[0].why.contains("faster both ways"), "{refused:?}");
        // Ended far later than even the slowest fraction prices: on the fit's bound.
        let (found, refused) = fit_both_ways(&model, &both_ways_at(&model, 0.9, 1000.0));
        assert_eq!(found, None);
        assert!(refused[0].why.contains("bound"), "{refused:?}");
    }

    /// Splits of `bytes` planned with `model`, whose routes ended where `truly` prices them.
    fn runs_ending_as(model: &CostModel, truly: &CostModel, sizes: &[u64]) -> Vec<SplitRun> {
        sizes
            .iter()
            .map(|&bytes| {
                let plan = Planner::new(model.clone())
                    .plan_with(Strategy::Split, 0, 1, bytes)
                    .unwrap();
                let ends = Planner::new(truly.clone())
                    .route_ends_us(&plan, Ways::One)
                    .unwrap();
                run_ending(plan, bytes, ends)
            })
            .collect()
    }

    #[test]
    fn the_direct_copys_pace_is_fitted_and_a_split_planned_with_it_ends_sooner_one_way() {
        // As on the H200 pair (2026-11-30, evening 2): the split's direct copy of hundreds of MiB
        // ran 1.2–1.5% faster than its hop's fit, so it ended first and the split waited for the
        // host route.
        let model = CostModel::from_topology(&nvlink_pair());
        let truth = DirectPace {
            rate_fraction: 1.015,
            fixed_us: 2.7,
        };
        let truly = model.clone().with_direct_beside_host(0, 1, truth);
        let sizes = [256 << 20, 1 << 30];
        let found = fit(&model, &runs_ending_as(&model, &truly, &sizes))
            .direct
            .unwrap();
        assert!(
            (found.rate_fraction - truth.rate_fraction).abs() < 1e-3
                && (found.fixed_us - truth.fixed_us).abs() < 0.1,
            "{found:?}"
        );
        let fitted = model.clone().with_direct_beside_host(0, 1, found);
        let plan = |model: &CostModel, bytes, ways| {
            Planner::new(model.clone())
                .plan_with_ways(Strategy::Split, 0, 1, bytes, ways)
                .unwrap()
        };
        // When the routes of a plan truly end.
        let ends = |plan: &Plan| {
            let ends = Planner::new(truly.clone())
                .route_ends_us(plan, Ways::One)
                .unwrap();
            (
                ends.iter().copied().fold(0.0, f64::max),
                route_spread(ends).unwrap(),
            )
        };
        for bytes in sizes {
            let (before, after) = (
                plan(&model, bytes, Ways::One),
                plan(&fitted, bytes, Ways::One),
            );
            let ((was, was_apart), (now, now_apart)) = (ends(&before), ends(&after));
            assert!(
                was_apart > 0.01 && now_apart < 0.003,
                "{was_apart} → {now_apart}"
            );
            assert!(now < was - 3.0, "{bytes}: {was:.1} → {now:.1} µs");
            let host = |plan: &Plan| {
                plan.paths
                    .iter()
                    .find(|p| p.route == Route::Host)
                    .unwrap()
                    .bytes
            };
            assert!(host(&after) < host(&before), "{before:?} {after:?}");
            // Both ways the direct copies share the link's two directions: priced as the hop.
            assert_eq!(
                plan(&model, bytes, Ways::Both),
                plan(&fitted, bytes, Ways::Both)
            );
        }
        // A direct copy a third faster than its hop is a measurement gone wrong: no pace.
        let wrong = DirectPace {
            rate_fraction: 1.35,
            fixed_us: 0.0,
        };
        let truly = model.clone().with_direct_beside_host(0, 1, wrong);
        assert_eq!(
            fit(&model, &runs_ending_as(&model, &truly, &sizes)).direct,
            None
        );
        // Runs whose direct copy ended as its hop prices it: the hop's pace.
        let as_hop = fit(&model, &runs_ending_as(&model, &model, &sizes))
            .direct
            .unwrap();
        assert!((as_hop.rate_fraction - 1.0).abs() < 1e-6 && as_hop.fixed_us.abs() < 1e-3);
    }

    /// A model with the figures `tune` measured on the H200 pair (2026-11-30, evening 2, GPU 0 →
    /// GPU 1; docs/reference.md): the hops, the lone copy, the CPU's queuing, and the host route's
    /// pace beside NVLink.
    fn h200_pair_profile() -> CostModel {
        use crate::model::profile::{BesideDirect, Lone, Measured};
        use crate::model::{Cost, Hop, IssueCosts, Profile};
        let topology = nvlink_pair();
        let mut profile = Profile::for_host(&topology);
        let cost = |alpha_us, beta_gbps| Cost {
            alpha_us,
            beta_gbps,
        };
        profile.hops = vec![
            Measured {
                hop: Hop::PeerCe { src: 0, dst: 1 },
                cost: cost(2.708, 390.40),
            },
            Measured {
                hop: Hop::DeviceToHost {
                    device: 0,
                    node: Some(0),
                },
                cost: cost(2.742, 55.238),
            },
            Measured {
                hop: Hop::HostToDevice {
                    device: 1,
                    node: Some(0),
                },
                cost: cost(2.620, 55.081),
            },
        ];
        profile.lone = vec![Lone {
            hop: Hop::PeerCe { src: 0, dst: 1 },
            lone_us: 5.408,
        }];
        profile.issue = Some(IssueCosts {
            copy_us: 2.930,
            kernel_us: 5.439,
            event_us: 1.566,
            graph_us: 2.852,
        });
        profile.beside_direct = vec![BesideDirect {
            src: 0,
            dst: 1,
            rate_fraction: 0.955,
            chunk_us: 0.0,
            fixed_us: -12.26,
            direct_rate_fraction: 1.0,
            direct_fixed_us: 0.0,
            splits: Vec::new(),
            both_ways: None,
        }];
        CostModel::from_profile(&topology, &profile).unwrap()
    }

    #[test]
    fn on_the_h200_pairs_figures_the_direct_pace_moves_bytes_to_nvlink_and_the_split_ends_sooner() {
        let model = h200_pair_profile();
        let planner = Planner::new(model.clone());
        let mib = |m: f64| ((m * (1 << 20) as f64) as u64).next_multiple_of(4096);
        // Where the routes of the pair's splits ended, planned with these figures (plan --prove at
        // 256 MiB, tune's check at 1 GiB): the direct copy (its share in MiB, its end in µs), then
        // the host route's end — NVLink ended first by 11.8 and 40.9 µs.
        let recorded = [
            (256 << 20, 231.2, 619.2, 631.0),
            (1 << 30, 914.6, 2425.7, 2466.6),
        ];
        let runs: Vec<SplitRun> = recorded
            .iter()
            .map(|&(bytes, direct_mib, direct_us, host_us)| {
                let mut plan = planner.plan_with(Strategy::Split, 0, 1, bytes).unwrap();
                assert_eq!(plan.paths[1].route, Route::Host, "{plan:?}");
                plan.paths[0].bytes = mib(direct_mib);
                plan.paths[1].offset = mib(direct_mib);
                plan.paths[1].bytes = bytes - mib(direct_mib);
                run_ending(plan, bytes, vec![direct_us, host_us])
            })
            .collect();
        // The plan these figures make at 256 MiB is the one the pair ran (626.4 µs predicted).
        let before = planner.plan_with(Strategy::Split, 0, 1, 256 << 20).unwrap();
        assert!((before.predicted_us - 626.4).abs() < 1.0, "{before:?}");
        let pace = fit(&model, &runs).direct.unwrap();
        assert!(
            (1.005..1.03).contains(&pace.rate_fraction) && pace.fixed_us.abs() < 10.0,
            "{pace:?}"
        );
        let paced = model.clone().with_direct_beside_host(0, 1, pace);
        let after = Planner::new(paced.clone())
            .plan_with(Strategy::Split, 0, 1, 256 << 20)
            .unwrap();
        // NVLink takes more bytes, and the split is predicted to end sooner: 430 GB/s or more.
        assert!(after.paths[1].bytes < before.paths[1].bytes, "{after:?}");
        assert!(after.predicted_us < before.predicted_us - 3.0, "{after:?}");
        assert!(after.predicted_us < (256 << 20) as f64 / 430e3, "{after:?}");
        // And the paced model's direct copy ends where the pair's did.
        for run in &runs {
            let ends = Planner::new(paced.clone())
                .route_ends_us(&run.plan, Ways::One)
                .unwrap();
            assert!(
                (ends[0] - run.routes[0].measured_us).abs() < 1.0,
                "{ends:?} {run:?}"
            );
        }
    }

    #[test]
    fn solving_finds_a_root_or_the_nearer_end() {
        assert!((solve(0.0, 10.0, |x| x - 3.0) - 3.0).abs() < 1e-9);
        assert_eq!(solve(5.0, 10.0, |x| x - 3.0), 5.0);
        assert_eq!(solve(0.0, 2.0, |x| x - 3.0), 2.0);
    }
}
