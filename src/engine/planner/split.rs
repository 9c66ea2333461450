//! Splits: the bytes divided over several routes at once so that every route ends together, and
//! routes that do not pay dropped.

use super::pricing::Hops;
use super::sharing::{Lane, Queue};
use super::{Planner, ALIGN, MODEL_MARGIN};
use crate::backend::CopyMethod;
use crate::engine::plan::{PathShare, Plan, Route, Strategy, Ways};
use crate::model::{BesideDirect, DirectPace};

/// About how many blocks a split hands out before it refines chunk by chunk.
const COARSE_STEPS: u64 = 128;

impl Planner {
    /// The best split over every route at once, or `None` where fewer than two routes would carry
    /// bytes. Every route of the split must pay: the one carrying the fewest bytes is dropped while
    /// the routes left (split, or the best of them alone) would be predicted within
    /// [`MODEL_MARGIN`] of the split with it.
    pub(super) fn best_split(
        &self,
        src: usize,
        dst: usize,
        bytes: u64,
        ways: Ways,
    ) -> Option<Plan> {
        let mut routes = vec![Route::Direct(CopyMethod::CopyEngine), Route::Host];
        routes.extend(self.relays(src, dst));
        let mut routes: Vec<(Route, Hops)> = routes
            .into_iter()
            .filter_map(|r| self.hops(r, src, dst, ways).map(|h| (r, h)))
            .collect();
        let mut split = self.split_over(src, dst, bytes, &routes, ways)?;
        loop {
            let weakest = split
                .paths
                .iter()
                .min_by_key(|p| p.bytes)
                .expect("a split has routes")
                .route;
            routes.retain(|(r, _)| *r != weakest);
            let alone = routes
                .iter()
                .map(|(_, h)| self.alone_us(h, bytes))
                .fold(f64::INFINITY, f64::min);
            let rest = self.split_over(src, dst, bytes, &routes, ways);
            let without = rest.as_ref().map_or(alone, |p| p.predicted_us.min(alone));
            if split.predicted_us * (1.0 + MODEL_MARGIN) < without {
                return Some(split);
            }
            split = rest.filter(|p| p.predicted_us <= alone)?;
        }
    }

    /// When each route of `plan` (a split, its bytes already divided) would end as this planner
    /// prices the routes for a transfer that runs as `ways` says, in the order of `plan.paths`;
    /// `None` where a route of it is not one this planner would split over. `tune` sets these
    /// beside the ends it measures.
    pub fn route_ends_us(&self, plan: &Plan, ways: Ways) -> Option<Vec<f64>> {
        let (src, dst) = (plan.src, plan.dst);
        let routes: Vec<(Route, Hops)> = plan
            .paths
            .iter()
            .map(|p| self.hops(p.route, src, dst, ways).map(|h| (p.route, h)))
            .collect::<Option<_>>()?;
        let lanes = self.share_bandwidth(&routes, src, dst, plan.chunk_bytes, ways);
        let shares: Vec<u64> = lanes
            .iter()
            .map(|lane| {
                plan.paths
                    .iter()
                    .find(|p| p.route == lane.route)
                    .map(|p| p.bytes)
            })
            .collect::<Option<_>>()?;
        if lanes.len() != plan.paths.len() {
            return None;
        }
        let ends = Queue::of(&lanes, &shares).ends(&lanes, &shares, plan.chunk_bytes);
        plan.paths
            .iter()
            .map(|p| {
                let i = lanes.iter().position(|lane| lane.route == p.route)?;
                Some(ends[i])
            })
            .collect()
    }

    /// How the host route of `plan` is priced beside its direct copy: `None` unless `plan` is a
    /// split over both (what `plan` labels beside that route).
    pub fn host_beside_direct(&self, plan: &Plan) -> Option<BesideDirect> {
        let has = |route| plan.paths.iter().any(|p| p.route == route);
        (plan.strategy == Strategy::Split
            && has(Route::Host)
            && has(Route::Direct(CopyMethod::CopyEngine)))
        .then(|| self.model.beside_direct(plan.src, plan.dst))
    }

    /// How the direct copy of `plan` is priced beside its host route one way, where measured:
    /// `None` unless `plan` is a split over both and a profile gave the pair a pace.
    pub fn direct_beside_host(&self, plan: &Plan) -> Option<DirectPace> {
        let pace = self.model.direct_beside_host(plan.src, plan.dst);
        self.host_beside_direct(plan)
            .filter(|_| pace != DirectPace::AS_ITS_HOP)
            .map(|_| pace)
    }

    /// The best split over `routes` at any chunk size, or `None` where fewer than two of them would
    /// carry bytes.
    pub(super) fn split_over(
        &self,
        src: usize,
        dst: usize,
        bytes: u64,
        routes: &[(Route, Hops)],
        ways: Ways,
    ) -> Option<Plan> {
        if routes.len() < 2 {
            return None;
        }
        Self::chunk_targets(bytes)
            .filter_map(|target| self.split_at(src, dst, (bytes, target), routes, ways))
            .min_by(|a, b| a.predicted_us.total_cmp(&b.predicted_us))
    }

    /// A split with chunk size `target`: whole chunks go one at a time to the route where the
    /// transfer would end soonest, then the remainder likewise. Each route's time is its exact
    /// pipeline time, with its start delayed by the routes queued before it and its pace bound by
    /// the one CPU that queues every route's chunks in turn.
    pub(super) fn split_at(
        &self,
        src: usize,
        dst: usize,
        (bytes, target): (u64, u64),
        routes: &[(Route, Hops)],
        ways: Ways,
    ) -> Option<Plan> {
        let lanes = self.share_bandwidth(routes, src, dst, target, ways);
        let (mut shares, queue, mut ends) = hand_out(&lanes, bytes, target);
        if shares.iter().filter(|&&b| b > 0).count() < 2 {
            return None;
        }
        balance(&lanes, &queue, &mut shares, &mut ends, target);
        Some(Plan {
            src,
            dst,
            bytes,
            strategy: Strategy::Split,
            chunk_bytes: target,
            paths: paths(&lanes, &shares, &ends),
            predicted_us: ends.into_iter().fold(0.0, f64::max),
            alternatives: Vec::new(),
        })
    }
}

/// Hands `bytes` out to `lanes` piece by piece, each piece to the lane where the split would end
/// soonest: each lane's share, the CPU's queue of the lanes used, and when each lane ends.
fn hand_out(lanes: &[Lane<'_>], bytes: u64, target: u64) -> (Vec<u64>, Queue, Vec<f64>) {
    let mut shares = vec![0u64; lanes.len()];
    let mut queue = Queue::of(lanes, &shares);
    let mut ends = vec![0.0; lanes.len()];
    // Whole chunks go out a block at a time while plenty are left (so that planning stays
    // cheap), then one at a time, then the remainder.
    let block = (bytes / COARSE_STEPS / target).max(1) * target;
    let coarse = bytes.saturating_sub(block * lanes.len() as u64) / block;
    let fine = (bytes - coarse * block) / target;
    let pieces = std::iter::repeat_n(block, coarse as usize)
        .chain(std::iter::repeat_n(target, fine as usize))
        .chain(Some(bytes % target).filter(|&r| r > 0));
    for piece in pieces {
        // The makespan if lane `i` takes the piece. A lane already in use changes only its
        // own end; a new one changes every lane's start or CPU pace, so all are recomputed.
        let (top, top_end, second_end) = top_two(&ends);
        let makespan = |i: usize, shares: &mut Vec<u64>| {
            if shares[i] > 0 {
                let own = queue.end(&lanes[i], i, shares[i] + piece, target);
                own.max(if i == top { second_end } else { top_end })
            } else {
                shares[i] += piece;
                let all = Queue::of(lanes, shares).ends(lanes, shares, target);
                shares[i] -= piece;
                all.into_iter().fold(0.0, f64::max)
            }
        };
        let mut best = (0, f64::INFINITY);
        for i in 0..lanes.len() {
            let end = makespan(i, &mut shares);
            if end < best.1 {
                best = (i, end);
            }
        }
        let i = best.0;
        let newly_used = shares[i] == 0;
        shares[i] += piece;
        if newly_used {
            queue = Queue::of(lanes, &shares);
            ends = queue.ends(lanes, &shares, target);
        } else {
            ends[i] = queue.end(&lanes[i], i, shares[i], target);
        }
    }
    (shares, queue, ends)
}

/// The routes that carry bytes, each with its share (laid out one after another) and its end.
fn paths(lanes: &[Lane<'_>], shares: &[u64], ends: &[f64]) -> Vec<PathShare> {
    let mut paths = Vec::new();
    let mut offset = 0;
    for ((lane, &share), &end) in lanes.iter().zip(shares).zip(ends) {
        if share == 0 {
            continue;
        }
        paths.push(PathShare {
            route: lane.route,
            offset,
            bytes: share,
            predicted_us: end,
        });
        offset += share;
    }
    paths
}

/// Moves bytes from the route of a split that ends last to the one that ends first, in [`ALIGN`]
/// steps, while that ends the split sooner: the hand-out of whole chunks leaves the routes up to a
/// chunk apart, and a chunk of a slow route is a long time (tens of µs through the host).
fn balance(lanes: &[Lane<'_>], queue: &Queue, shares: &mut [u64], ends: &mut [f64], target: u64) {
    let end = |i: usize, share: u64| queue.end(&lanes[i], i, share, target);
    for _ in 0..4 * lanes.len() {
        let used: Vec<usize> = (0..lanes.len()).filter(|&i| shares[i] > 0).collect();
        let by_end = |a: &&usize, b: &&usize| ends[**a].total_cmp(&ends[**b]);
        let (Some(&late), Some(&early)) = (used.iter().max_by(by_end), used.iter().min_by(by_end))
        else {
            return;
        };
        // Moving k steps ends the early route later and the late one sooner; the best k is where
        // they cross (the late one keeps at least one step).
        let after = |k: u64| {
            let moved = k * ALIGN;
            end(early, shares[early] + moved).max(end(late, shares[late] - moved))
        };
        let most = shares[late].saturating_sub(1) / ALIGN;
        let (mut lo, mut hi) = (0, most);
        while lo < hi {
            let k = (lo + hi).div_ceil(2);
            if end(early, shares[early] + k * ALIGN) <= end(late, shares[late] - k * ALIGN) {
                lo = k;
            } else {
                hi = k - 1;
            }
        }
        // `lo` is the last step before they cross; the first after may end sooner still.
        let k = if lo < most && after(lo + 1) < after(lo) {
            lo + 1
        } else {
            lo
        };
        if k == 0 || after(k) >= ends[late] {
            return;
        }
        shares[late] -= k * ALIGN;
        shares[early] += k * ALIGN;
        ends[late] = end(late, shares[late]);
        ends[early] = end(early, shares[early]);
    }
}

/// The index of the largest value, the largest, and the second largest.
fn top_two(values: &[f64]) -> (usize, f64, f64) {
    let mut top = (0, f64::NEG_INFINITY);
    let mut second = f64::NEG_INFINITY;
    for (i, &v) in values.iter().enumerate() {
        if v > top.1 {
            second = top.1;
            top = (i, v);
        } else if v > second {
            second = v;
        }
    }
    (top.0, top.1, second.max(0.0))
}
