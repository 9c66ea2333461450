//! The planner: predicts every usable strategy's time from the cost model and picks the fastest.
//!
//! Single-operation routes cost `α + bytes/β`. Chunked routes (host-staged, relay) are pipelines:
//! chunk `k+1`'s first hop overlaps chunk `k`'s second, so their time is the fill (one chunk through
//! every hop) plus the remaining chunks at the slowest hop's pace, each chunk paying its copies' α
//! and, where its hops run on two GPUs, the waits that order them across the GPUs; the planner
//! tries each chunk size in [`CHUNK_SIZES`] and keeps the best. A split runs several routes at once:
//! routes that share hardware (an NVSwitch port, a PCIe link) divide its bandwidth, a pipeline
//! beside a direct copy is priced at its pace measured there, and the bytes are divided so that
//! every route finishes at the same predicted time.
//!
//! A split's slow routes are priced on the pessimistic side on purpose: if one of them runs faster
//! than predicted it finishes early and the split still ends with its fastest route, whose
//! prediction is the surest; if it ran slower, the whole split would wait for it.

mod batch;
mod candidates;
mod copy_engines;
mod pricing;
mod sharing;
mod split;
#[cfg(test)]
mod tests;

use super::plan::{Plan, Route, Strategy, Ways};
use crate::model::CostModel;
use crate::{Error, Result};

/// Chunk sizes tried for pipelined routes.
pub const CHUNK_SIZES: [u64; 7] = [
    64 << 10,
    128 << 10,
    256 << 10,
    512 << 10,
    1 << 20,
    2 << 20,
    4 << 20,
];

/// The largest chunk: staging buffers hold [`STAGING_SLOTS`] of these.
pub const MAX_CHUNK: u64 = 4 << 20;

/// Chunks in flight per pipelined route (triple buffering: one being filled, one being drained,
/// one spare so that a late drain does not stall the next fill).
pub const STAGING_SLOTS: usize = 3;

/// Chunk and split boundaries fall on multiples of this, so that copies stay aligned.
pub const ALIGN: u64 = 4096;

/// How far a prediction may be off (the engine's regret goal): a route joins a split only where it
/// shortens the split's predicted time by more than this fraction, since a smaller gain would be
/// within the model's error.
pub const MODEL_MARGIN: f64 = 0.05;

/// Messages gathered into one staging buffer start on this alignment, so that the copy kernels
/// can use 16-byte accesses.
pub const GATHER_ALIGN: u64 = 16;

/// Where each message of a batch sits in the gathering buffer, and that buffer's length.
pub fn packing(sizes: &[u64]) -> (Vec<u64>, u64) {
    let mut at = 0;
    let offsets = sizes
        .iter()
        .map(|&len| {
            let here = at;
            at = (at + len).next_multiple_of(GATHER_ALIGN);
            here
        })
        .collect();
    (offsets, at)
}

/// How a transfer of `bytes` is cut for a target chunk size: `(chunk_len, count)`, the chunks
/// equal and aligned except a shorter last one.
pub fn chunking(bytes: u64, target: u64) -> (u64, u64) {
    let target = target.max(1);
    let wanted = bytes.div_ceil(target);
    let len = bytes.div_ceil(wanted).next_multiple_of(ALIGN).min(bytes);
    (len, bytes.div_ceil(len))
}

/// Predicts and picks strategies for one host.
#[derive(Clone, Debug)]
pub struct Planner {
    model: CostModel,
    /// The GPUs transfers may start, end or relay on.
    devices: Vec<usize>,
    /// Whether resident workers run, so that [`Strategy::Resident`] is offered.
    resident: bool,
}

impl Planner {
    /// A planner that may use every GPU of the host.
    pub fn new(model: CostModel) -> Self {
        let devices = (0..model.topology().devices.len()).collect();
        Planner {
            model,
            devices,
            resident: false,
        }
    }

    /// A planner that only uses `devices` (already checked against the host).
    pub fn for_devices(model: CostModel, devices: &[usize]) -> Self {
        Planner {
            model,
            devices: devices.to_vec(),
            resident: false,
        }
    }

    /// The same planner, offering [`Strategy::Resident`] too: for a fabric that runs resident
    /// workers. It is picked only where its prediction wins; large transfers stay on the copy
    /// engine, which costs no SMs.
    pub fn with_resident(mut self) -> Self {
        self.resident = true;
        self
    }

    /// Whether [`Strategy::Resident`] is offered.
    pub fn offers_resident(&self) -> bool {
        self.resident
    }

    /// The GPUs this planner may use.
    pub fn devices(&self) -> &[usize] {
        &self.devices
    }

    pub fn model(&self) -> &CostModel {
        &self.model
    }

    /// The fastest way to move `bytes` from GPU `src` to GPU `dst`, with every other usable
    /// strategy's prediction. A copy within one GPU is planned as one local copy.
    pub fn plan(&self, src: usize, dst: usize, bytes: u64) -> Result<Plan> {
        self.plan_ways(src, dst, bytes, Ways::One)
    }

    /// As [`Planner::plan`], for a transfer that runs as `ways` says: [`Ways::Both`] prices the
    /// host route as it runs while another transfer goes the opposite way through the host.
    pub fn plan_ways(&self, src: usize, dst: usize, bytes: u64, ways: Ways) -> Result<Plan> {
        self.check(src, dst, bytes)?;
        let mut candidates = self.candidates(src, dst, bytes, ways);
        candidates.sort_by(|a, b| a.predicted_us.total_cmp(&b.predicted_us));
        let mut best = candidates.remove(0);
        best.alternatives = candidates
            .iter()
            .map(|p| (p.strategy, p.predicted_us))
            .collect();
        Ok(best)
    }

    /// The best plan that uses `strategy`, or an error saying why it cannot be used for this pair.
    pub fn plan_with(
        &self,
        strategy: Strategy,
        src: usize,
        dst: usize,
        bytes: u64,
    ) -> Result<Plan> {
        self.plan_with_ways(strategy, src, dst, bytes, Ways::One)
    }

    /// As [`Planner::plan_with`], for a transfer that runs as `ways` says.
    pub fn plan_with_ways(
        &self,
        strategy: Strategy,
        src: usize,
        dst: usize,
        bytes: u64,
        ways: Ways,
    ) -> Result<Plan> {
        self.check(src, dst, bytes)?;
        let mut candidates = self.candidates(src, dst, bytes, ways);
        candidates.sort_by(|a, b| a.predicted_us.total_cmp(&b.predicted_us));
        let Some(index) = candidates.iter().position(|p| p.strategy == strategy) else {
            return Err(self.unavailable(strategy, src, dst));
        };
        let mut chosen = candidates.remove(index);
        chosen.alternatives = candidates
            .iter()
            .map(|p| (p.strategy, p.predicted_us))
            .collect();
        Ok(chosen)
    }

    pub(super) fn check(&self, src: usize, dst: usize, bytes: u64) -> Result<()> {
        let n = self.model.topology().devices.len();
        for gpu in [src, dst] {
            if let Some(missing) = crate::topology::missing_gpu(gpu, n) {
                return Err(Error::usage(missing));
            }
            if !self.devices.contains(&gpu) {
                return Err(crate::topology::not_in_use(gpu, &self.devices));
            }
        }
        if bytes == 0 {
            return Err(Error::usage(
                "a transfer of 0 bytes moves nothing; give a size of at least 1 byte",
            ));
        }
        Ok(())
    }
}

/// One of several transfers that run at once, as [`ways_together`] sees it: source, destination,
/// bytes, and a forced strategy.
pub type Together = (usize, usize, u64, Option<Strategy>);

/// How each of `transfers`, all running at once, is priced: [`Ways::Both`] where another of them
/// goes the opposite way and its plan, priced both ways too, takes the host route (each GPU's PCIe
/// link then carries copies both ways); else [`Ways::One`]. `plan` plans one transfer as it runs
/// (a fabric's cached plans, or a planner's); a transfer it cannot plan takes no host route here
/// (submitting it says why). Where the opposite transfer's plan moves fewer bytes through the
/// host than this one's would, pricing this one both ways is on the pessimistic side.
pub fn ways_together<P: std::borrow::Borrow<Plan>>(
    transfers: &[Together],
    plan: impl Fn(usize, usize, u64, Option<Strategy>, Ways) -> Result<P>,
) -> Vec<Ways> {
    let takes_host = |&(src, dst, bytes, strategy): &Together| {
        src != dst
            && plan(src, dst, bytes, strategy, Ways::Both).is_ok_and(|p| {
                p.borrow()
                    .paths
                    .iter()
                    .any(|share| share.route == Route::Host)
            })
    };
    let has_opposite = |&(src, dst, ..): &Together| {
        transfers
            .iter()
            .any(|other| (other.0, other.1) == (dst, src))
    };
    // Only a transfer that has an opposite one is planned both ways (the others keep the planning
    // of a transfer alone).
    let through_host: Vec<bool> = transfers
        .iter()
        .map(|t| has_opposite(t) && takes_host(t))
        .collect();
    transfers
        .iter()
        .map(|&(src, dst, ..)| {
            let opposite = transfers
                .iter()
                .zip(&through_host)
                .any(|(other, &host)| host && (other.0, other.1) == (dst, src));
            if opposite {
                Ways::Both
            } else {
                Ways::One
            }
        })
        .collect()
}
