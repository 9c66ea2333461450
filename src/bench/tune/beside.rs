//! The host-staged route beside a direct copy, measured: splits of the direct copy-engine route and
//! the host route are run on the engine at two sizes (every byte verified), each route's end timed
//! on the source GPU, and the two figures that price the host route there — its first hop's rate
//! fraction and its extra cost per chunk — are fitted so that the cost model's host route ends when
//! it was measured to at both. Then the splits are planned again with them and run once more: their
//! routes should end together; where they end more than [`BALANCE_TOLERANCE`] apart, one
//! rebalancing step fits the figures again to those runs (the bytes shift in proportion), and says
//! so.
//!
//! The figures replace the planner's estimate ([`crate::model::defaults::BESIDE_DIRECT_RATE_FRACTION`],
//! [`crate::model::defaults::BESIDE_DIRECT_CHUNK_US`]) for the measured pairs, and for the host's
//! other pairs for want of their own ([`crate::model::CostModel::beside_direct`]).

use crate::backend::{Backend, CopyMethod};
use crate::bench::pattern;
use crate::bench::progress::Progress;
use crate::bench::proof::sweep::{median_route_ends, route_spread, BALANCE_TOLERANCE};
use crate::bench::timing::{interleaved, Runs, Turn};
use crate::document::plan::RouteName;
use crate::engine::{Fabric, Plan, Planner, Route, RouteEnd, Strategy};
use crate::model::profile::{HostRouteEnd, MAX_CHUNK_US, MAX_RATE_FRACTION};
use crate::model::{defaults, CostModel};
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
        self.routes
            .iter()
            .enumerate()
            .find(|(_, r)| r.route == RouteName::Host)
            .expect("a measured split has the host route")
    }
}

/// The two figures that price the host route beside a direct copy.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Fit {
    /// The first hop's rate, as a fraction of its rate alone.
    pub rate_fraction: f64,
    /// Its extra cost per chunk, µs.
    pub chunk_us: f64,
}

/// The host route beside a direct copy on one ordered pair.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SplitFit {
    pub src: usize,
    pub dst: usize,
    /// The splits as planned before (with the estimate), run: one per size.
    pub first: Vec<SplitRun>,
    /// The figures with which the model's host route ends when it was measured to in `first`.
    pub fitted: Fit,
    /// The splits planned again with `fitted`, run (a size where the planner no longer splits is
    /// left out).
    pub check: Vec<SplitRun>,
    /// Where a check's routes ended more than [`BALANCE_TOLERANCE`] apart: the figures fitted again
    /// to the checks (one rebalancing step), which the profile keeps.
    pub refitted: Option<Fit>,
}

impl SplitFit {
    /// The figures the profile keeps.
    pub fn kept(&self) -> Fit {
        self.refitted.unwrap_or(self.fitted)
    }

    /// The splits the kept figures were fitted to, by their host route's end.
    pub fn fitted_to(&self) -> Vec<HostRouteEnd> {
        let runs = if self.refitted.is_some() {
            &self.check
        } else {
            &self.first
        };
        runs.iter()
            .map(|run| {
                let (_, host) = run.host();
                HostRouteEnd {
                    split_bytes: run.bytes,
                    host_bytes: host.bytes,
                    chunk_bytes: run.chunk_bytes,
                    host_end_us: host.measured_us,
                }
            })
            .collect()
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
    let (sizes, runs) = if backend.topology().is_simulated() {
        (SIM_SIZES, Runs { warmup: 1, runs: 1 })
    } else {
        (GPU_SIZES, GPU_RUNS)
    };
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
         the source GPU; the host route's first-hop rate fraction and extra µs per chunk are \
         fitted so that the model's host route ends when it was measured to at both sizes; the \
         splits are then planned with them and run again, and where their routes end more than \
         {:.0}% apart the figures are fitted once more to those runs",
        sizes.map(format_bytes).join(" and "),
        match runs.runs {
            1 => "once".to_string(),
            n => format!("{n} times"),
        },
        BALANCE_TOLERANCE * 100.0
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
                done.push(run_split(backend, model, devices, plan, runs, progress)?);
            }
        }
        Ok(done)
    };
    let first = run_all(model)?;
    let fitted = fit(model, &first);
    let check = run_all(&with_fit(model, src, dst, fitted))?;
    let refitted = check
        .iter()
        .any(|run| run.spread > BALANCE_TOLERANCE)
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
    model
        .clone()
        .with_beside_direct(src, dst, fit.rate_fraction, fit.chunk_us)
}

/// Runs `plan` (a split `model` made): once into a poisoned destination whose every byte is
/// checked, then timed; returns its routes' median ends.
fn run_split(
    backend: &Arc<dyn Backend>,
    model: &CostModel,
    devices: &[usize],
    plan: Plan,
    runs: Runs,
    progress: &dyn Progress,
) -> Result<SplitRun> {
    let fabric = Fabric::builder(backend.clone())
        .devices(devices)
        .model(model.clone())
        .open()?;
    let (src, dst, bytes) = (plan.src, plan.dst, plan.bytes);
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
        bytes,
        chunk_bytes: plan.chunk_bytes,
        spread: route_spread(routes.iter().map(|r| r.measured_us)).unwrap_or(0.0),
        routes,
        plan,
    })
}

/// The figures with which `model`'s host route of each run ends when it was measured to. With two
/// runs, both figures: for each rate fraction the chunk cost that fits the first run, and the
/// fraction where that fits the second too (or comes nearest). With one, the fraction alone, the
/// chunk cost left at the estimate's.
fn fit(model: &CostModel, runs: &[SplitRun]) -> Fit {
    let modelled = |run: &SplitRun, fit: Fit| -> f64 {
        let (plan, (host, _)) = (&run.plan, run.host());
        let paced = with_fit(model, plan.src, plan.dst, fit);
        Planner::new(paced)
            .route_ends_us(plan)
            .expect("the planner prices the routes of its own split")[host]
    };
    // The model's end rises with the chunk cost and falls with the rate.
    let chunk_for = |run: &SplitRun, rate_fraction: f64| {
        let measured = run.host().1.measured_us;
        let at = |chunk_us| {
            modelled(
                run,
                Fit {
                    rate_fraction,
                    chunk_us,
                },
            )
        };
        solve(-MAX_CHUNK_US * 0.999, MAX_CHUNK_US * 0.999, |c| {
            at(c) - measured
        })
    };
    let rate_for = |run: &SplitRun, chunk_us: f64| {
        let measured = run.host().1.measured_us;
        solve(LOWEST_RATE, MAX_RATE_FRACTION * 0.999, |rate_fraction| {
            measured
                - modelled(
                    run,
                    Fit {
                        rate_fraction,
                        chunk_us,
                    },
                )
        })
    };
    match runs {
        [] => Fit {
            rate_fraction: defaults::BESIDE_DIRECT_RATE_FRACTION,
            chunk_us: defaults::BESIDE_DIRECT_CHUNK_US,
        },
        [one] => Fit {
            rate_fraction: rate_for(one, defaults::BESIDE_DIRECT_CHUNK_US),
            chunk_us: defaults::BESIDE_DIRECT_CHUNK_US,
        },
        [a, b, ..] => {
            let miss = |rate_fraction: f64| {
                let chunk_us = chunk_for(a, rate_fraction);
                let fit = Fit {
                    rate_fraction,
                    chunk_us,
                };
                (modelled(b, fit) - b.host().1.measured_us, fit)
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
    }
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
            .route_ends_us(&plan)
            .unwrap();
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
            },
            Fit {
                rate_fraction: 1.0,
                chunk_us: 0.5,
            },
        ] {
            let runs = [
                run_at(&model, truth, 256 << 20),
                run_at(&model, truth, 1 << 30),
            ];
            let found = fit(&model, &runs);
            assert!(
                (found.rate_fraction - truth.rate_fraction).abs() < 0.01
                    && (found.chunk_us - truth.chunk_us).abs() < 0.2,
                "{found:?} for {truth:?}"
            );
            // One run: the rate alone, the chunk cost left at the estimate's.
            let one = fit(&model, &runs[..1]);
            assert_eq!(one.chunk_us, defaults::BESIDE_DIRECT_CHUNK_US);
        }
    }

    #[test]
    fn solving_finds_a_root_or_the_nearer_end() {
        assert!((solve(0.0, 10.0, |x| x - 3.0) - 3.0).abs() < 1e-9);
        assert_eq!(solve(5.0, 10.0, |x| x - 3.0), 5.0);
        assert_eq!(solve(0.0, 2.0, |x| x - 3.0), 2.0);
    }
}
