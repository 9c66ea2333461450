//! The host-staged route's pace beside a direct copy, measured: a split of the direct copy-engine
//! route and the host route is run on the engine (every byte verified), each route's end timed on
//! the source GPU, and the pace is the one at which the cost model's host route ends when it was
//! measured to. Then the split is planned again at that pace and run once more: its routes should
//! end together; where they end more than [`BALANCE_TOLERANCE`] apart, one rebalancing step finds
//! the pace again from that run (the bytes shift in proportion), and says so.
//!
//! The pace replaces the planner's estimate ([`crate::model::defaults::BESIDE_DIRECT_RATE_FRACTION`])
//! for the measured pairs, and for the host's other pairs for want of their own
//! ([`crate::model::CostModel::beside_direct`]).

use crate::backend::{Backend, CopyMethod};
use crate::bench::pattern;
use crate::bench::progress::Progress;
use crate::bench::proof::sweep::{median_route_ends, route_spread, BALANCE_TOLERANCE};
use crate::bench::timing::{interleaved, Runs, Turn};
use crate::document::plan::RouteName;
use crate::engine::{Fabric, Plan, Planner, Route, RouteEnd, Strategy};
use crate::model::profile::MAX_PACE;
use crate::model::CostModel;
use crate::units::format_bytes;
use crate::{Error, Result};
use serde::Serialize;
use std::sync::Arc;

/// The split's size on GPUs: the smallest where issue 11 sets its goal for the split, where the
/// host route carries a few chunks of 4 MiB on the H200 pair.
const GPU_BYTES: u64 = 256 << 20;
/// On the simulator, which copies every byte on the CPU: the smallest size where the H200 pair's
/// planner splits.
const SIM_BYTES: u64 = 64 << 20;
/// Runs of each split on GPUs; the median of each route's end is kept.
const GPU_RUNS: Runs = Runs {
    warmup: 2,
    runs: 11,
};
/// Ordered pairs measured at most: the first pair both ways. Other pairs take the first pair's
/// pace (their copy engines and PCIe links are alike on the hosts peerlink knows).
const MAX_PAIRS: usize = 2;
/// The paces searched, as a fraction of the route's pace alone.
const LOWEST_PACE: f64 = 0.05;

/// One run of a split (the median of its runs): its routes' predicted and measured ends.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitRun {
    pub chunk_bytes: u64,
    pub routes: Vec<RouteRun>,
    /// (latest − earliest) / latest of the measured ends.
    pub spread: f64,
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

/// The host route's pace beside a direct copy on one ordered pair.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitPace {
    pub src: usize,
    pub dst: usize,
    pub bytes: u64,
    /// The split as planned before (the estimate's pace), run.
    pub first: SplitRun,
    /// The pace at which the model's host route ends when it was measured to in `first`.
    pub pace: f64,
    /// The split planned again at `pace`, run; `None` where the planner no longer splits there.
    pub check: Option<SplitRun>,
    /// Where `check`'s routes ended more than [`BALANCE_TOLERANCE`] apart: the pace found again
    /// from it (one rebalancing step), which the profile keeps.
    pub rebalanced: Option<f64>,
}

impl SplitPace {
    /// The pace the profile keeps.
    pub fn kept(&self) -> f64 {
        self.rebalanced.unwrap_or(self.pace)
    }

    /// The run the kept pace was last found from: its host route's share, chunk and end.
    pub fn host_run(&self) -> (u64, u64, f64) {
        let run = match (&self.check, self.rebalanced) {
            (Some(check), Some(_)) => check,
            _ => &self.first,
        };
        let host = run
            .routes
            .iter()
            .find(|r| r.route == RouteName::Host)
            .expect("a measured split has the host route");
        (host.bytes, run.chunk_bytes, host.measured_us)
    }
}

/// Measures the host route's pace beside a direct copy on the first pairs of `devices` whose split
/// is the direct copy and the host route, priced with `model` (the hops measured so far).
/// Returns the paces and a note per pair left out.
pub fn measure(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    devices: &[usize],
    progress: &dyn Progress,
) -> Result<(Vec<SplitPace>, Vec<String>)> {
    let simulated = backend.topology().is_simulated();
    let (bytes, runs) = if simulated {
        (SIM_BYTES, Runs { warmup: 1, runs: 1 })
    } else {
        (GPU_BYTES, GPU_RUNS)
    };
    let planner = Planner::for_devices(model.clone(), devices);
    let mut notes = Vec::new();
    let mut pairs = Vec::new();
    for &src in devices {
        for &dst in devices.iter().filter(|&&d| d != src) {
            match planner.plan_with(Strategy::Split, src, dst, bytes) {
                Ok(plan) if is_direct_and_host(&plan) => pairs.push((src, dst)),
                _ => {}
            }
        }
    }
    if pairs.is_empty() {
        notes.push(format!(
            "the host route's pace beside a direct copy: no pair splits {} over a direct copy and \
             the host route, so none was measured; the planner keeps its estimate",
            format_bytes(bytes)
        ));
        return Ok((Vec::new(), notes));
    }
    if pairs.len() > MAX_PAIRS {
        let (a, b) = pairs[0];
        notes.push(format!(
            "the host route's pace beside a direct copy was measured on GPU {a} → GPU {b} and back; \
             the other {} pairs take GPU {a} → GPU {b}'s",
            pairs.len() - MAX_PAIRS
        ));
        pairs = vec![(a, b), (b, a)];
    }
    crate::bench::check_fits(&**backend, devices, bytes)?;
    progress.start("split beside direct", (pairs.len() * 2 * runs_per_split(runs)) as u64);
    let paces = pairs
        .into_iter()
        .map(|(src, dst)| pace_of_pair(backend, model, devices, (src, dst), bytes, runs, progress))
        .collect::<Result<Vec<_>>>()?;
    progress.finish();
    notes.push(format!(
        "the host route's pace beside a direct copy: a split of {} over the direct copy and the \
         host route run {} times on the engine (median, every byte verified), each route's end \
         timed on the source GPU; the pace is where the model's host route ends when it was \
         measured to; the split is then planned at that pace and run again, and where its routes \
         end more than {:.0}% apart the pace is found once more from that run",
        format_bytes(bytes),
        runs.runs,
        BALANCE_TOLERANCE * 100.0
    ));
    Ok((paces, notes))
}

/// Calls of the run closure per split: each run twice (the second timed, as the engine proof
/// does).
fn runs_per_split(runs: Runs) -> usize {
    2 * (runs.warmup + runs.runs)
}

/// Whether a split's routes are a direct copy-engine copy and the host route.
fn is_direct_and_host(plan: &Plan) -> bool {
    let has = |route| plan.paths.iter().any(|p| p.route == route);
    plan.paths.len() == 2 && has(Route::Direct(CopyMethod::CopyEngine)) && has(Route::Host)
}

fn pace_of_pair(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    devices: &[usize],
    (src, dst): (usize, usize),
    bytes: u64,
    runs: Runs,
    progress: &dyn Progress,
) -> Result<SplitPace> {
    let (first_plan, first) = run_split(backend, model, devices, (src, dst), bytes, runs, progress)?;
    let pace = solve_pace(model, devices, &first_plan, &first);
    let paced = model.clone().with_beside_direct(src, dst, pace);
    let checked = Planner::for_devices(paced.clone(), devices)
        .plan_with(Strategy::Split, src, dst, bytes)
        .ok()
        .filter(is_direct_and_host);
    let (check, rebalanced) = match checked {
        Some(_) => {
            let (plan, run) = run_split(backend, &paced, devices, (src, dst), bytes, runs, progress)?;
            let rebalanced = if run.spread > BALANCE_TOLERANCE {
                Some(solve_pace(model, devices, &plan, &run))
            } else {
                None
            };
            (Some(run), rebalanced)
        }
        None => (None, None),
    };
    Ok(SplitPace {
        src,
        dst,
        bytes,
        first,
        pace,
        check,
        rebalanced,
    })
}

/// Runs the split `model` plans from `src` to `dst` for `bytes`: once into a poisoned destination
/// whose every byte is checked, then timed. Returns the plan and its routes' median ends.
fn run_split(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    devices: &[usize],
    (src, dst): (usize, usize),
    bytes: u64,
    runs: Runs,
    progress: &dyn Progress,
) -> Result<(Plan, SplitRun)> {
    let fabric = Fabric::builder(backend.clone())
        .devices(devices)
        .model(model.clone())
        .open()?;
    let plan = fabric.planner().plan_with(Strategy::Split, src, dst, bytes)?;
    let len = usize::try_from(bytes)
        .map_err(|_| Error::usage(format!("{bytes} bytes do not fit in this host's memory")))?;
    let (from, to) = (fabric.alloc(src, len)?, fabric.alloc(dst, len)?);
    let data = pattern::bytes(bytes, len);
    from.write(0, &data)?;
    to.write(0, &data.iter().map(|b| !b).collect::<Vec<u8>>())?;
    let split = || {
        fabric
            .transfer(from.all(), to.all())
            .strategy(Strategy::Split)
            .timed()
            .submit()
    };
    split()?.wait()?;
    Error::check_bytes("split beside direct", src, dst, &data, &to.to_vec()?)?;
    let ends: Vec<Vec<RouteEnd>> = interleaved(runs, 1, Turn::SecondOfTwo, |_, _| {
        progress.step();
        split()?.route_ends()
    })?
    .pop()
    .unwrap_or_default();
    let ends = median_route_ends(&ends)?;
    let routes: Vec<RouteRun> = plan
        .paths
        .iter()
        .map(|share| {
            let end = ends
                .iter()
                .find(|e| e.route == share.route)
                .expect("a timed split times every route's end");
            RouteRun {
                route: share.route.into(),
                bytes: share.bytes,
                predicted_us: share.predicted_us,
                measured_us: end.end_us,
            }
        })
        .collect();
    let spread = route_spread(routes.iter().map(|r| r.measured_us)).unwrap_or(0.0);
    let run = SplitRun {
        chunk_bytes: plan.chunk_bytes,
        routes,
        spread,
    };
    Ok((plan, run))
}

/// The pace at which `model`'s host route of `plan` ends when `run` measured it to: the model's end
/// falls as the pace rises, so halving the interval finds it.
fn solve_pace(model: &CostModel, devices: &[usize], plan: &Plan, run: &SplitRun) -> f64 {
    let host = plan
        .paths
        .iter()
        .position(|p| p.route == Route::Host)
        .expect("a split over the host route");
    let measured = run.routes[host].measured_us;
    // The pace changes how the routes are priced, not which of them the split keeps.
    let modelled = |pace: f64| {
        let paced = model.clone().with_beside_direct(plan.src, plan.dst, pace);
        Planner::for_devices(paced, devices)
            .route_ends_us(plan)
            .expect("the planner prices the routes of its own split")[host]
    };
    let (mut slow, mut fast) = (LOWEST_PACE, MAX_PACE * 0.999);
    if modelled(fast) > measured {
        // Faster than any pace the model can give it: the route's fixed costs alone take longer.
        return fast;
    }
    if modelled(slow) < measured {
        return slow;
    }
    for _ in 0..50 {
        let mid = 0.5 * (slow + fast);
        if modelled(mid) > measured {
            slow = mid;
        } else {
            fast = mid;
        }
    }
    0.5 * (slow + fast)
}
