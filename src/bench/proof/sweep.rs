//! The strategy sweep: runs every usable strategy and the planner's pick over a size sweep, timed
//! with events, every byte verified, and reports the pick's regret (pick time / best time − 1);
//! beside it, the pick through the whole engine against one plain copy (the engine's overhead).
//!
//! This is how the engine proves its choice: a planner whose predictions rank strategies the way
//! the backend does has a regret near zero at every size.

use crate::backend::{BufferCopy, CopyMethod};
use crate::bench::progress::Progress;
use crate::bench::stats::Stats;
use crate::bench::timing::{host_us, interleaved, interleaved_calls, Runs, Turn};
use crate::engine::{Buffer, Fabric, Plan, Route, RouteEnd, Strategy};
use crate::pattern;
use crate::topology::Source;
use crate::units::format_bytes;
use crate::{Error, Result};

/// One strategy at one size: what the planner predicted and what it measured.
#[derive(Clone, Debug, PartialEq)]
pub struct StrategyTiming {
    pub strategy: Strategy,
    pub chunk_bytes: u64,
    pub predicted_us: f64,
    /// Median GPU time from the transfer's start event to its end event.
    pub measured_us: f64,
    /// A split's routes, each with its predicted and measured end (empty for other strategies).
    pub routes: Vec<RouteTiming>,
}

/// One route of a split: the bytes it carried, when the planner said it would end and when it did
/// (the median over the runs of GPU time from the transfer's start).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteTiming {
    pub route: Route,
    pub bytes: u64,
    pub predicted_us: f64,
    pub measured_us: f64,
}

/// How far apart a split's routes may end and still count as balanced: the planner's predictions
/// of a route are good to a few % (a chunk through the host is tens of µs of a few hundred).
pub const BALANCE_TOLERANCE: f64 = 0.03;

/// How far apart a split's routes ended: (latest − earliest) / latest, 0 where they ended
/// together; `None` for fewer than two routes. A balanced split's routes end within a few % (the
/// planner divides the bytes so that they would end together).
pub fn route_spread(ends: impl IntoIterator<Item = f64>) -> Option<f64> {
    let ends: Vec<f64> = ends.into_iter().collect();
    let latest = ends.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let earliest = ends.iter().copied().fold(f64::INFINITY, f64::min);
    (ends.len() >= 2 && latest > 0.0).then(|| (latest - earliest) / latest)
}

/// Each route's median end over several runs of one split (every run the same routes in the same
/// order, as one plan gives them).
pub fn median_route_ends(runs: &[Vec<RouteEnd>]) -> Result<Vec<RouteEnd>> {
    let Some(first) = runs.first() else {
        return Ok(Vec::new());
    };
    first
        .iter()
        .enumerate()
        .map(|(i, end)| {
            let times: Vec<f64> = runs.iter().map(|run| run[i].end_us).collect();
            Ok(RouteEnd {
                end_us: Stats::of_times(&times)?.median,
                ..*end
            })
        })
        .collect()
}

impl StrategyTiming {
    /// How far apart the routes ended ([`route_spread`]); `None` but for a split.
    pub fn route_spread(&self) -> Option<f64> {
        route_spread(self.routes.iter().map(|r| r.measured_us))
    }
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
    pub timings: Vec<StrategyTiming>,
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
    pub fn timing(&self, strategy: Strategy) -> Option<&StrategyTiming> {
        self.timings.iter().find(|t| t.strategy == strategy)
    }
}

/// The whole sweep for one pair.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// `cuda` or `sim:<preset>`: where the times come from.
    pub source: Source,
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

/// Runs the sweep from GPU `src` to GPU `dst`; `progress` hears of every timed or untimed run.
pub fn run(
    fabric: &Fabric,
    src: usize,
    dst: usize,
    sizes: &[u64],
    runs: Runs,
    progress: &dyn Progress,
) -> Result<Report> {
    if runs.runs == 0 {
        return Err(Error::usage(
            "the engine benchmark needs at least one timed run",
        ));
    }
    super::within_one_host(fabric, &[(src, dst)])?;
    if let Some(&largest) = sizes.iter().max() {
        // The pattern, the poison and the read-back of every strategy's bytes.
        super::footprint(fabric, src, dst, largest, 3).check(
            &**fabric.backend(),
            &format!("the engine's proof at {}", format_bytes(largest)),
            "choose a smaller --size",
        )?;
    }
    let steps = sizes
        .iter()
        .map(|&bytes| {
            interleaved_calls(
                runs,
                usable(fabric, src, dst, bytes).len(),
                Turn::SecondOfTwo,
            ) + interleaved_calls(overhead_runs(runs), 2, Turn::Once)
        })
        .sum();
    progress.start("engine proof", steps);
    let mut points = Vec::new();
    // A stop request ends the sweep at the sizes measured so far (the document says partial).
    for &bytes in sizes.iter().take_while(|_| !crate::interrupt::requested()) {
        match crate::interrupt::unless_stopped(point(fabric, src, dst, bytes, runs, progress))? {
            Some(measured) => points.push(measured),
            None => break,
        }
    }
    progress.finish();
    if points.is_empty() {
        // Stopped before the first size: nothing to show.
        crate::interrupt::check()?;
    }
    Ok(Report {
        source: fabric.backend().source().clone(),
        src,
        dst,
        points,
    })
}

/// Every strategy's plan for the pair at `bytes`: a strategy this pair cannot use is not a
/// contender.
fn usable(fabric: &Fabric, src: usize, dst: usize, bytes: u64) -> Vec<Plan> {
    Strategy::ALL
        .into_iter()
        .filter_map(|s| fabric.planner().plan_with(s, src, dst, bytes).ok())
        .collect()
}

/// The runs of the engine-versus-plain comparison: three times the strategies' (the two differ by
/// about 1% at large sizes, within the noise of a few).
fn overhead_runs(runs: Runs) -> Runs {
    Runs {
        runs: OVERHEAD_RUNS_FACTOR * runs.runs,
        ..runs
    }
}

/// One size of the sweep: every usable strategy timed and checked, the pick's regret, and the
/// pick through the whole engine against a plain copy.
fn point(
    fabric: &Fabric,
    src: usize,
    dst: usize,
    bytes: u64,
    runs: Runs,
    progress: &dyn Progress,
) -> Result<Point> {
    let pick = fabric.planner().plan(src, dst, bytes)?.strategy;
    let pair = Pair::open(fabric, src, dst, bytes)?;
    let plans = usable(fabric, src, dst, bytes);
    let times = pair.time_strategies(&plans, runs, progress)?;
    pair.check_strategies(&plans)?;
    let timings = strategy_timings(&plans, times)?;
    let (best, regret) = best_and_regret(&timings, pick);
    let (raw, engine_wall_us) = pair.engine_against_plain(pick, runs, progress)?;
    Ok(Point {
        bytes,
        pick,
        best,
        regret,
        timings,
        raw,
        engine_wall_us,
    })
}

/// Each strategy's timed runs: its GPU time and its routes' ends.
type StrategyRuns = Vec<Vec<(f64, Vec<RouteEnd>)>>;

/// The two buffers of one size: the source filled with its pattern, and the poison that a
/// destination holds before a checked run.
struct Pair<'f> {
    fabric: &'f Fabric,
    src: usize,
    dst: usize,
    from: Buffer,
    to: Buffer,
    data: Vec<u8>,
    poison: Vec<u8>,
}

impl<'f> Pair<'f> {
    fn open(fabric: &'f Fabric, src: usize, dst: usize, bytes: u64) -> Result<Self> {
        let len = usize::try_from(bytes)
            .map_err(|_| Error::usage(format!("{bytes} bytes do not fit in this host's memory")))?;
        let from = fabric.alloc(src, len)?;
        let to = fabric.alloc(dst, len)?;
        let data = pattern::bytes(bytes, len);
        let poison: Vec<u8> = data.iter().map(|b| !b).collect();
        from.write(0, &data)?;
        Ok(Pair {
            fabric,
            src,
            dst,
            from,
            to,
            data,
            poison,
        })
    }

    /// Strategies take turns round by round, in a rotating order, each timed on the second of two
    /// runs: a transfer right after another kind can run slower, whichever it follows.
    fn time_strategies(
        &self,
        plans: &[Plan],
        runs: Runs,
        progress: &dyn Progress,
    ) -> Result<StrategyRuns> {
        interleaved(runs, plans.len(), Turn::SecondOfTwo, |at, _| {
            let transfer = self
                .fabric
                .transfer(self.from.all(), self.to.all())
                .strategy(plans[at].strategy)
                .timed()
                .submit()?;
            let us = transfer.elapsed_us()?;
            progress.step();
            Ok((us, transfer.route_ends()?))
        })
    }

    /// Each strategy once more into a poisoned destination: stale bytes from another strategy
    /// cannot pass.
    fn check_strategies(&self, plans: &[Plan]) -> Result<()> {
        for plan in plans {
            self.to.write(0, &self.poison)?;
            self.fabric
                .transfer(self.from.all(), self.to.all())
                .strategy(plan.strategy)
                .submit()?
                .wait()?;
            self.check(plan.strategy)?;
        }
        Ok(())
    }

    fn check(&self, strategy: Strategy) -> Result<()> {
        Error::check_bytes(
            format!("engine {strategy}"),
            self.src,
            self.dst,
            &self.data,
            &self.to.to_vec()?,
        )
    }

    /// The engine's pick and a plain copy take turns, each going first every other round, so that
    /// drift and whatever the first of two back-to-back copies pays (or leaves behind) fall on
    /// both alike: the plain copy's times, and the engine's host time.
    fn engine_against_plain(
        &self,
        pick: Strategy,
        runs: Runs,
        progress: &dyn Progress,
    ) -> Result<(Baseline, f64)> {
        let (fabric, from, to) = (self.fabric, &self.from, &self.to);
        let backend = fabric.backend();
        let plain = PlainCopy::new(fabric, from, to)?;
        let overhead_runs = overhead_runs(runs);
        let mut plain_gpu = Vec::with_capacity(overhead_runs.runs);
        let walls = interleaved(overhead_runs, 2, Turn::Once, |contender, timed| {
            progress.step();
            if contender == ENGINE {
                let ((), wall) = host_us(&**backend, || fabric.copy(from.all(), to.all())?.wait())?;
                return Ok(wall);
            }
            let (gpu, wall) = plain.run()?;
            if timed {
                plain_gpu.push(gpu);
            }
            Ok(wall)
        })?;
        // Poisoning inside the loop would put a host write of the whole buffer right before each
        // engine run (seen on the H200: +25–50% from 2 MiB up, against none before plain runs);
        // the engine's own bytes are checked once more after it.
        to.write(0, &self.poison)?;
        fabric.copy(from.all(), to.all())?.wait()?;
        self.check(pick)?;
        let raw = Baseline {
            gpu_us: Stats::of_times(&plain_gpu)?.median,
            wall_us: Stats::of_times(&walls[PLAIN])?.median,
        };
        Ok((raw, Stats::of_times(&walls[ENGINE])?.median))
    }
}

/// Each strategy's median time beside its prediction, and a split's routes' ends beside theirs.
fn strategy_timings(plans: &[Plan], times: StrategyRuns) -> Result<Vec<StrategyTiming>> {
    plans
        .iter()
        .zip(times)
        .map(|(plan, runs)| {
            let times: Vec<f64> = runs.iter().map(|(us, _)| *us).collect();
            let ends: Vec<Vec<RouteEnd>> = runs.into_iter().map(|(_, ends)| ends).collect();
            let routes = median_route_ends(&ends)?
                .into_iter()
                .map(|end| RouteTiming {
                    route: end.route,
                    bytes: end.bytes,
                    predicted_us: plan
                        .paths
                        .iter()
                        .find(|share| share.route == end.route)
                        .expect("a route end is one of the plan's routes")
                        .predicted_us,
                    measured_us: end.end_us,
                })
                .collect();
            Ok(StrategyTiming {
                strategy: plan.strategy,
                chunk_bytes: plan.chunk_bytes,
                predicted_us: plan.predicted_us,
                measured_us: Stats::of_times(&times)?.median,
                routes,
            })
        })
        .collect()
}

/// The fastest strategy measured, and the pick's regret against it.
fn best_and_regret(timings: &[StrategyTiming], pick: Strategy) -> (Strategy, f64) {
    let best = timings
        .iter()
        .min_by(|a, b| a.measured_us.total_cmp(&b.measured_us))
        .expect("the planner's pick is always usable");
    let pick_us = timings
        .iter()
        .find(|t| t.strategy == pick)
        .map(|t| t.measured_us)
        .expect("the pick was measured");
    (best.strategy, pick_us / best.measured_us - 1.0)
}

/// How many times more runs the engine-versus-plain comparison takes than each strategy.
const OVERHEAD_RUNS_FACTOR: usize = 3;
/// The contenders of the engine-versus-plain comparison: the plain copy goes first in the first
/// round.
const PLAIN: usize = 0;
const ENGINE: usize = 1;

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
            copy: BufferCopy::from_start(from.backend_id(), to.backend_id(), from.size()),
        })
    }

    /// GPU time between events around the copy, and host time from the copy call until the
    /// host's synchronisation returns.
    fn run(&self) -> Result<(f64, f64)> {
        let backend = self.backend;
        let before = backend.record(self.stream)?;
        let (after, wall) = host_us(backend, || {
            backend.copy(self.stream, CopyMethod::CopyEngine, &self.copy)?;
            let after = backend.record(self.stream)?;
            backend.event_synchronize(after)?;
            Ok(after)
        })?;
        let gpu = backend.elapsed_us(before, after)?;
        backend.destroy_event(before)?;
        backend.destroy_event(after)?;
        Ok((gpu, wall))
    }
}

impl Drop for PlainCopy<'_> {
    fn drop(&mut self) {
        // An error here would hide the one that dropped us early.
        let _ = self.backend.destroy_stream(self.stream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::progress::Silent;
    use crate::bench::proof::RUNS;
    use crate::engine::tests::fabric;

    /// A sweep with points on both sides of every crossover seen on the presets (kept small: CI).
    const SWEEP: [u64; 7] = [
        4 << 10,
        32 << 10,
        96 << 10,
        256 << 10,
        1 << 20,
        4 << 20,
        16 << 20,
    ];

    fn sweep(preset: &str, src: usize, dst: usize) -> Report {
        let report = run(&fabric(preset), src, dst, &SWEEP, RUNS, &Silent).unwrap();
        for p in &report.points {
            assert!(
                p.regret <= 0.05,
                "{preset} {src}->{dst} at {} bytes: picked {} but {} was faster (regret {:.1}%): {:#?}",
                p.bytes,
                p.pick,
                p.best,
                p.regret * 100.0,
                p.timings
            );
        }
        report
    }

    #[test]
    fn dgx1_pairs_without_nvlink_relay_or_split_and_beat_staging() {
        for (src, dst) in [(0, 5), (6, 1)] {
            let report = sweep("dgx1-v100", src, dst);
            for p in &report.points {
                assert!(
                    matches!(p.pick, Strategy::Relay | Strategy::Split),
                    "{p:#?}"
                );
                let staged = p.timing(Strategy::Staged).unwrap().measured_us;
                let pick = p.timing(p.pick).unwrap().measured_us;
                assert!(pick < staged, "{p:#?}");
            }
            // At 16 MiB, using both relays and the host at once beats the best single route by far.
            let big = report.points.last().unwrap();
            assert_eq!(big.pick, Strategy::Split);
            let relay = big.timing(Strategy::Relay).unwrap().measured_us;
            assert!(
                big.timing(Strategy::Split).unwrap().measured_us < 0.8 * relay,
                "{big:#?}"
            );
        }
    }

    #[test]
    fn dgx1_nvlink_pairs_go_direct_when_small_and_split_when_large() {
        let report = sweep("dgx1-v100", 0, 1);
        assert_eq!(report.points[0].pick, Strategy::DirectCe);
        assert_eq!(report.points.last().unwrap().pick, Strategy::Split);
    }

    #[test]
    fn pcie_pairs_across_sockets_are_staged() {
        for (src, dst) in [(0, 3), (2, 1)] {
            let report = sweep("pcie-4gpu-2socket", src, dst);
            assert!(
                report.points.iter().all(|p| p.pick == Strategy::Staged),
                "{report:#?}"
            );
        }
        // Inside one PCIe switch P2P works, and direct copies win.
        let report = sweep("pcie-4gpu-2socket", 0, 1);
        assert!(
            report.points.iter().all(|p| p.pick == Strategy::DirectCe),
            "{report:#?}"
        );
    }

    #[test]
    fn nvswitch_pairs_go_direct() {
        let report = sweep("dgx-h100", 0, 5);
        for p in &report.points {
            assert!(
                matches!(p.pick, Strategy::DirectCe | Strategy::DirectSm),
                "{p:#?}"
            );
            assert!(
                p.timing(Strategy::Split).is_none(),
                "no relay between NVSwitch peers, and up to 16 MiB the host route gains too little"
            );
        }
        assert_eq!(report.source.to_string(), "sim:dgx-h100");
    }
}
