//! Pricing one route: its hops and their costs, what queuing them costs the CPU, and the time of
//! a direct copy or of a pipeline at each chunk size tried.

use super::{chunking, Planner, CHUNK_SIZES, MAX_CHUNK};
use crate::backend::CopyMethod;
use crate::engine::plan::{Route, Ways};
use crate::model::{defaults, Cost, Hop};

/// Chunk sizes that would cut a transfer into more chunks than this are not tried (unless no
/// other is left): their per-chunk overhead cannot pay, and planning stays cheap.
const MAX_CHUNKS: u64 = 1024;

/// A route's hops, with their costs.
pub(super) struct Hops {
    pub(super) hops: Vec<Hop>,
    pub(super) costs: Vec<Cost>,
    /// CPU time to queue one chunk's operations (copies, and the events that order them).
    pub(super) issue_us: f64,
    /// CPU time before the first hop can start: its copy and the waits queued ahead of it.
    pub(super) first_issue_us: f64,
    /// CPU time to queue the first chunk whole, waits included (what a later route of a split
    /// waits for).
    pub(super) first_chunk_issue_us: f64,
    /// A direct route's time before its bytes: a lone operation's measured time where the profile
    /// has one (its issue and start-up), else the issue and α.
    pub(super) start_us: f64,
    /// A pipeline's GPU time beyond its chunks: the control stream on the source waits for the
    /// last drain (an event of another GPU where the second hop runs elsewhere), and the fixed
    /// part measured beyond that ([`defaults::PIPELINE_FIXED_US`]).
    pub(super) finish_us: f64,
}

impl Hops {
    pub(super) fn is_pipeline(&self) -> bool {
        self.hops.len() > 1
    }

    /// A pipeline's time over `costs` (its own, or as a split slows them), the CPU queuing a chunk
    /// every `period_us`.
    pub(super) fn pipelined_us(
        &self,
        costs: &[Cost],
        period_us: f64,
        bytes: u64,
        target: u64,
    ) -> f64 {
        pipeline_us(self.first_issue_us, period_us, costs, bytes, target) + self.finish_us
    }
}

impl Planner {
    /// The hops a route takes, or `None` where one of them is impossible. Both ways, the host
    /// route's hops are priced at the fraction of their rate they keep while each GPU's PCIe link
    /// carries copies the other way too.
    pub(super) fn hops(&self, route: Route, src: usize, dst: usize, ways: Ways) -> Option<Hops> {
        let hops = self.route_hops(route, src, dst);
        let mut costs = hops
            .iter()
            .map(|&h| self.model.cost(h))
            .collect::<Option<Vec<_>>>()?;
        if route == Route::Host && ways == Ways::Both {
            let fraction = self.model.both_ways(src, dst).fraction();
            for c in &mut costs {
                c.beta_gbps *= fraction;
            }
        }
        // The GPU whose streams run a pipeline's second hop (the first runs on the source). Where
        // it is another GPU, every chunk's drain waits for its fill across the GPUs, a fill into a
        // reused slot for that slot's drain, and the end for the last drain.
        let second_gpu = match route {
            Route::Direct(_) | Route::Resident | Route::GpudirectRdma => src,
            Route::Host | Route::NetStaged => dst,
            Route::Relay(r) => r,
        };
        let across = if second_gpu != src {
            defaults::CROSS_GPU_CHUNK_US
        } else {
            0.0
        };
        if costs.len() > 1 {
            for c in &mut costs {
                c.alpha_us += across;
            }
        }
        let (setup_us, first_op_us, issue_us) = self.issue_costs(route, hops.len());
        let first_issue_us = setup_us + first_op_us;
        let start_us = self
            .model
            .lone_us(hops[0])
            .unwrap_or(first_issue_us + costs[0].alpha_us);
        let finish_us = if hops.len() > 1 {
            across + defaults::PIPELINE_FIXED_US
        } else {
            0.0
        };
        Some(Hops {
            hops,
            costs,
            issue_us,
            first_issue_us,
            first_chunk_issue_us: setup_us + issue_us,
            start_us,
            finish_us,
        })
    }

    /// The hops of `route` from `src` to `dst`, in order.
    fn route_hops(&self, route: Route, src: usize, dst: usize) -> Vec<Hop> {
        match route {
            Route::Direct(CopyMethod::CopyEngine) => vec![Hop::PeerCe { src, dst }],
            Route::Direct(CopyMethod::SmKernel) => vec![Hop::PeerSm { src, dst }],
            Route::Host => {
                // The bounce buffer sits on the source's NUMA node.
                let node = self.model.numa_node(src);
                vec![
                    Hop::DeviceToHost { device: src, node },
                    Hop::HostToDevice { device: dst, node },
                ]
            }
            Route::Relay(r) => vec![Hop::PeerCe { src, dst: r }, Hop::PeerCe { src: r, dst }],
            Route::Resident => vec![Hop::Resident { src, dst }],
            Route::GpudirectRdma => vec![Hop::NetRdma { src, dst }],
            Route::NetStaged => {
                // Each end's bounce buffer sits on its NIC's NUMA node.
                let (out, into) = (self.model.nic_numa_node(src), self.model.nic_numa_node(dst));
                vec![
                    Hop::DeviceToHost {
                        device: src,
                        node: out,
                    },
                    Hop::NetHost { src, dst },
                    Hop::HostToDevice {
                        device: dst,
                        node: into,
                    },
                ]
            }
        }
    }

    /// What the executor queues for `route` (of `hops` hops), CPU µs: before its first chunk, its
    /// first operation, and each chunk.
    fn issue_costs(&self, route: Route, hops: usize) -> (f64, f64, f64) {
        let issue = self.model.issue();
        // What the executor queues: a direct route is one operation; a pipeline first waits for
        // the start and for the lane's last use, then each chunk is two copies, each recording an
        // event, and two waits (the drain for the fill, the fill for a reused slot).
        // A network operation is priced as a copy is: one call that queues it.
        match route {
            Route::Direct(CopyMethod::SmKernel) => (0.0, issue.kernel_us, issue.kernel_us),
            Route::Direct(CopyMethod::CopyEngine) | Route::GpudirectRdma => {
                (0.0, issue.copy_us, issue.copy_us)
            }
            // A doorbell and a stream wait: two stream memory operations, priced as events.
            Route::Resident => (0.0, 2.0 * issue.event_us, 2.0 * issue.event_us),
            Route::Host | Route::Relay(_) | Route::NetStaged => (
                2.0 * issue.event_us,
                issue.copy_us,
                hops as f64 * (issue.copy_us + 2.0 * issue.event_us),
            ),
        }
    }

    /// A direct route's time: a lone operation holds the issue and the start-up, then the bytes.
    pub(super) fn direct_us(&self, h: &Hops, bytes: u64) -> f64 {
        h.start_us + h.costs[0].bytes_us(bytes)
    }

    /// A route's time on its own: direct, or pipelined at its best chunk size.
    pub(super) fn alone_us(&self, h: &Hops, bytes: u64) -> f64 {
        if !h.is_pipeline() {
            return self.direct_us(h, bytes);
        }
        Self::chunk_targets(bytes)
            .map(|target| h.pipelined_us(&h.costs, h.issue_us, bytes, target))
            .fold(f64::INFINITY, f64::min)
    }

    /// The chunk targets worth trying for `bytes`: every size below it, and one chunk where it fits.
    pub(super) fn chunk_targets(bytes: u64) -> impl Iterator<Item = u64> {
        CHUNK_SIZES
            .into_iter()
            .filter(move |&c| c < bytes && (bytes / c <= MAX_CHUNKS || c == MAX_CHUNK))
            .chain((bytes <= MAX_CHUNK).then_some(bytes))
    }

    /// What each chunk of the host route from `src` to `dst` costs its first hop beyond its bytes,
    /// before any pricing beside a direct copy: the copy's α and the waits across the GPUs. `tune`
    /// refuses a fitted per-chunk cost that would take it below zero.
    pub fn host_chunk_alpha_us(&self, src: usize, dst: usize) -> Option<f64> {
        self.hops(Route::Host, src, dst, Ways::One)
            .map(|h| h.costs[0].alpha_us)
    }

    /// What the host route from `src` to `dst` takes beyond its chunks' copies (queuing the first,
    /// the wait for the last drain, the fixed part): `tune` refuses a fitted extra per transfer
    /// that would take it below zero.
    pub fn host_fixed_us(&self, src: usize, dst: usize) -> Option<f64> {
        self.hops(Route::Host, src, dst, Ways::One)
            .map(|h| h.first_issue_us + h.finish_us)
    }
}

/// Time of a pipeline moving `bytes` in chunks of about `target`: the CPU queues each chunk
/// (`issue_us`; the first hop of a chunk can start `first_issue_us` into it), then the chunk crosses
/// the hops with `costs` in turn. This is the longest path through the (chunk, step) grid, which
/// stays on one step for every full chunk and takes the last (shorter) chunk through the
/// remaining steps.
pub fn pipeline_us(
    first_issue_us: f64,
    issue_us: f64,
    costs: &[Cost],
    bytes: u64,
    target: u64,
) -> f64 {
    let (len, count) = chunking(bytes, target);
    let last = bytes - (count - 1) * len;
    let hops = |range: std::ops::Range<usize>, size: u64| -> f64 {
        costs[range].iter().map(|c| c.time_us(size)).sum()
    };
    let on_cpu = (count - 1) as f64 * issue_us + first_issue_us + hops(0..costs.len(), last);
    (0..costs.len())
        .map(|s| {
            let along = (count - 1) as f64 * costs[s].time_us(len);
            first_issue_us + hops(0..s, len) + along + hops(s..costs.len(), last)
        })
        .fold(on_cpu, f64::max)
}
