//! Routes of one split sharing hardware: each route slowed to what the faster ones leave it, priced
//! beside the others, and when each ends as the one CPU queues them all.

use super::copy_engines::CopyEngines;
use super::pricing::Hops;
use super::Planner;
use crate::backend::CopyMethod;
use crate::engine::plan::{Route, Ways};
use crate::model::{BesideDirect, Cost, DirectPace, Resource};
use std::collections::{HashMap, HashSet};

/// A route that shares hardware with faster ones (an NVSwitch port, a PCIe link) and is left with
/// less than this fraction of the fastest one's rate is left out of a split: what the sharing leaves
/// it is the model's least certain figure (why two NVSwitch peers never relay). A route that shares
/// nothing with them, as the host-staged route beside NVLink (an NVLink copy ran at 390.9 GB/s on the
/// H200 pair while a device→host and a host→device copy ran at 53.8 and 53.3 GB/s beside it), is
/// held to [`MODEL_MARGIN`] alone: it joins where it shortens the split enough.
///
/// [`MODEL_MARGIN`]: super::MODEL_MARGIN
const SPLIT_MIN_FRACTION: f64 = 0.25;

impl Planner {
    /// The routes worth splitting over, fastest first, each slowed to what shared hardware leaves
    /// it: routes take bandwidth fastest first; a route left with nothing, or sharing hardware with
    /// faster ones and left with less than [`SPLIT_MIN_FRACTION`] of the fastest, is dropped, and
    /// so is one whose copy engines the faster routes already took. Beside a direct copy-engine
    /// copy, the host route's first hop (on the source's copy engines too) is priced at its pace
    /// measured there ([`defaults::BESIDE_DIRECT_RATE_FRACTION`]), and one way the direct copy at
    /// its pace measured beside the host route ([`CostModel::direct_beside_host`]).
    ///
    /// [`defaults::BESIDE_DIRECT_RATE_FRACTION`]: crate::model::defaults::BESIDE_DIRECT_RATE_FRACTION
    /// [`CostModel::direct_beside_host`]: crate::model::CostModel::direct_beside_host
    pub(super) fn share_bandwidth<'h>(
        &self,
        routes: &'h [(Route, Hops)],
        src: usize,
        dst: usize,
        target: u64,
        ways: Ways,
    ) -> Vec<Lane<'h>> {
        let mut lanes: Vec<(Lane<'h>, Vec<Resource>)> = routes
            .iter()
            .map(|(route, h)| {
                let resources = h.hops.iter().flat_map(|&hop| self.model.resources(hop));
                (Lane::new(*route, h, target), resources.collect())
            })
            .collect();
        lanes.sort_by(|a, b| b.0.bytes_per_us.total_cmp(&a.0.bytes_per_us));
        let mut left: HashMap<Resource, f64> = HashMap::new();
        let mut taken: HashSet<Resource> = HashSet::new();
        let mut engines = CopyEngines::of(self.model.topology());
        let mut kept: Vec<Lane<'h>> = Vec::new();
        for (mut lane, resources) in lanes {
            let own = lane.bytes_per_us;
            for &res in &resources {
                let capacity = self.model.capacity_gbps(res) * 1e3;
                let room = *left.entry(res).or_insert(capacity);
                lane.bytes_per_us = lane.bytes_per_us.min(room);
            }
            let fastest = kept.first().map_or(lane.bytes_per_us, |l| l.bytes_per_us);
            let shares_hardware = resources.iter().any(|r| taken.contains(r));
            if lane.bytes_per_us <= 0.0
                || (shares_hardware && lane.bytes_per_us < SPLIT_MIN_FRACTION * fastest)
                || !engines.take(lane.route, src, dst)
            {
                continue;
            }
            for res in resources {
                *left.get_mut(&res).expect("inserted above") -= lane.bytes_per_us;
                taken.insert(res);
            }
            lane.slow_down(lane.bytes_per_us / own);
            kept.push(lane);
        }
        let has = |kept: &[Lane<'_>], route| kept.iter().any(|l| l.route == route);
        if has(&kept, Route::Direct(CopyMethod::CopyEngine)) {
            // Measured for the host route only (device → host beside a peer copy on the source);
            // a relay's first hop beside one is priced as before, for want of a measurement.
            let pricing = self.model.beside_direct(src, dst);
            for lane in kept.iter_mut().filter(|l| l.route == Route::Host) {
                lane.beside_direct_copy(pricing);
            }
        }
        if ways == Ways::One && has(&kept, Route::Host) {
            // Measured one way only: both ways the direct copies share the link's two directions,
            // and ran at about their hop's rate (the H200 pair).
            let pace = self.model.direct_beside_host(src, dst);
            for lane in kept
                .iter_mut()
                .filter(|l| l.route == Route::Direct(CopyMethod::CopyEngine))
            {
                lane.beside_host_route(pace);
            }
        }
        kept
    }
}

/// One route of a split.
pub(super) struct Lane<'h> {
    pub(super) route: Route,
    hops: &'h Hops,
    /// The hops' costs, slowed where the route shares hardware with faster ones.
    pub(super) costs: Vec<Cost>,
    /// Steady-state rate on its own (before sharing), then after.
    bytes_per_us: f64,
    /// Time the route takes per transfer beyond what its hops price (measured beside the split's
    /// other route).
    fixed_us: f64,
}

impl<'h> Lane<'h> {
    pub(super) fn new(route: Route, hops: &'h Hops, target: u64) -> Self {
        let slowest = hops
            .costs
            .iter()
            .map(|c| c.bytes_us(target))
            .fold(0.0, f64::max);
        Lane {
            route,
            hops,
            costs: hops.costs.clone(),
            bytes_per_us: target as f64 / slowest,
            fixed_us: 0.0,
        }
    }

    /// Scales the bandwidth of every hop by `factor` (≤ 1).
    fn slow_down(&mut self, factor: f64) {
        for c in &mut self.costs {
            c.beta_gbps *= factor;
        }
    }

    /// Prices the first hop, issued on the source GPU, as it runs beside a direct copy-engine copy
    /// there: measured, or the estimate.
    pub(super) fn beside_direct_copy(&mut self, pricing: BesideDirect) {
        let pace = pricing.figures();
        let first = &mut self.costs[0];
        first.beta_gbps *= pace.rate_fraction;
        first.alpha_us = (first.alpha_us + pace.chunk_us).max(0.0);
        self.fixed_us = pace.fixed_us;
    }

    /// Prices a direct copy as it runs beside the host route: measured, or as its hop alone.
    fn beside_host_route(&mut self, pace: DirectPace) {
        self.costs[0].beta_gbps *= pace.rate_fraction;
        self.fixed_us = pace.fixed_us;
    }

    fn is_pipeline(&self) -> bool {
        self.hops.is_pipeline()
    }
}

/// How the CPU queues the lanes of a split that carry bytes: in order, each starting once the
/// first chunk of every lane before it is queued, and the pipelines' chunks in turn, so that each
/// pipeline's chunk period on the CPU is the sum of all of theirs.
pub(super) struct Queue {
    /// When each lane's first operation can be queued.
    starts: Vec<f64>,
    /// The CPU time per round of chunks.
    cpu_period_us: f64,
}

impl Queue {
    pub(super) fn of(lanes: &[Lane<'_>], shares: &[u64]) -> Queue {
        let used = || lanes.iter().zip(shares).filter(|(_, &b)| b > 0);
        let cpu_period_us = used()
            .filter(|(l, _)| l.is_pipeline())
            .map(|(l, _)| l.hops.issue_us)
            .sum();
        let mut queued_before = 0.0;
        let starts = lanes
            .iter()
            .zip(shares)
            .map(|(lane, &share)| {
                let start = queued_before;
                if share > 0 {
                    queued_before += lane.hops.first_chunk_issue_us;
                }
                start
            })
            .collect();
        Queue {
            starts,
            cpu_period_us,
        }
    }

    /// When lane `i` would finish carrying `share` bytes.
    pub(super) fn end(&self, lane: &Lane<'_>, i: usize, share: u64, target: u64) -> f64 {
        let h = lane.hops;
        let own = if lane.is_pipeline() {
            let period = h.issue_us.max(self.cpu_period_us);
            h.pipelined_us(&lane.costs, period, share, target) + lane.fixed_us
        } else {
            h.start_us + lane.costs[0].bytes_us(share) + lane.fixed_us
        };
        self.starts[i] + own
    }

    /// When each lane finishes (0 for a lane without bytes).
    pub(super) fn ends(&self, lanes: &[Lane<'_>], shares: &[u64], target: u64) -> Vec<f64> {
        (0..lanes.len())
            .map(|i| match shares[i] {
                0 => 0.0,
                share => self.end(&lanes[i], i, share, target),
            })
            .collect()
    }
}
