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

use super::plan::{BatchPlan, BatchStrategy, PathShare, Plan, Route, Strategy, Ways};
use crate::backend::CopyMethod;
use crate::model::{defaults, BesideDirect, Cost, CostModel, DirectPace, Hop, Resource};
use crate::{Error, Result};
use std::collections::{HashMap, HashSet};

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

/// Chunk sizes that would cut a transfer into more chunks than this are not tried (unless no
/// other is left): their per-chunk overhead cannot pay, and planning stays cheap.
const MAX_CHUNKS: u64 = 1024;

/// About how many blocks a split hands out before it refines chunk by chunk.
const COARSE_STEPS: u64 = 128;

/// Chunks in flight per pipelined route (triple buffering: one being filled, one being drained,
/// one spare so that a late drain does not stall the next fill).
pub const STAGING_SLOTS: usize = 3;

/// Chunk and split boundaries fall on multiples of this, so that copies stay aligned.
pub const ALIGN: u64 = 4096;

/// How far a prediction may be off (the engine's regret goal): a route joins a split only where it
/// shortens the split's predicted time by more than this fraction, since a smaller gain would be
/// within the model's error.
pub const MODEL_MARGIN: f64 = 0.05;

/// A route that shares hardware with faster ones (an NVSwitch port, a PCIe link) and is left with
/// less than this fraction of the fastest one's rate is left out of a split: what the sharing leaves
/// it is the model's least certain figure (why two NVSwitch peers never relay). A route that shares
/// nothing with them, as the host-staged route beside NVLink (an NVLink copy ran at 390.9 GB/s on the
/// H200 pair while a device→host and a host→device copy ran at 53.8 and 53.3 GB/s beside it), is
/// held to [`MODEL_MARGIN`] alone: it joins where it shortens the split enough.
const SPLIT_MIN_FRACTION: f64 = 0.25;

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

/// A route's hops, with their costs.
struct Hops {
    hops: Vec<Hop>,
    costs: Vec<Cost>,
    /// CPU time to queue one chunk's operations (copies, and the events that order them).
    issue_us: f64,
    /// CPU time before the first hop can start: its copy and the waits queued ahead of it.
    first_issue_us: f64,
    /// CPU time to queue the first chunk whole, waits included (what a later route of a split
    /// waits for).
    first_chunk_issue_us: f64,
    /// A direct route's time before its bytes: a lone operation's measured time where the profile
    /// has one (its issue and start-up), else the issue and α.
    start_us: f64,
    /// A pipeline's GPU time beyond its chunks: the control stream on the source waits for the
    /// last drain (an event of another GPU where the second hop runs elsewhere), and the fixed
    /// part measured beyond that ([`defaults::PIPELINE_FIXED_US`]).
    finish_us: f64,
}

impl Hops {
    fn is_pipeline(&self) -> bool {
        self.hops.len() > 1
    }

    /// A pipeline's time over `costs` (its own, or as a split slows them), the CPU queuing a chunk
    /// every `period_us`.
    fn pipelined_us(&self, costs: &[Cost], period_us: f64, bytes: u64, target: u64) -> f64 {
        pipeline_us(self.first_issue_us, period_us, costs, bytes, target) + self.finish_us
    }
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

    /// The strategies that cannot move `bytes` from `src` to `dst` here, each with the reason.
    pub fn unusable(&self, src: usize, dst: usize, bytes: u64) -> Result<Vec<(Strategy, String)>> {
        self.check(src, dst, bytes)?;
        let usable: Vec<Strategy> = self
            .candidates(src, dst, bytes, Ways::One)
            .iter()
            .map(|p| p.strategy)
            .collect();
        // A strategy not offered (no resident workers run) is not listed as unusable either.
        Ok(self
            .family(src, dst)
            .iter()
            .copied()
            .filter(|s| !usable.contains(s) && (self.resident || *s != Strategy::Resident))
            .map(|s| (s, self.unavailable(s, src, dst).to_string()))
            .collect())
    }

    /// The fastest way to move a batch of small messages (their sizes in `sizes`) from `src` to
    /// `dst`, when the same batch will run `repeats` times (a graph's capture is spread over them).
    pub fn plan_batch(
        &self,
        src: usize,
        dst: usize,
        sizes: &[u64],
        repeats: u32,
    ) -> Result<BatchPlan> {
        self.pick_batch(None, src, dst, sizes, repeats)
    }

    /// The plan for a batch by `strategy`, or an error saying why this pair cannot use it.
    pub fn plan_batch_with(
        &self,
        strategy: BatchStrategy,
        src: usize,
        dst: usize,
        sizes: &[u64],
        repeats: u32,
    ) -> Result<BatchPlan> {
        self.pick_batch(Some(strategy), src, dst, sizes, repeats)
    }

    fn pick_batch(
        &self,
        wanted: Option<BatchStrategy>,
        src: usize,
        dst: usize,
        sizes: &[u64],
        repeats: u32,
    ) -> Result<BatchPlan> {
        if sizes.is_empty() {
            return Err(Error::usage("a batch needs at least one message"));
        }
        if let Some(i) = sizes.iter().position(|&s| s == 0) {
            return Err(Error::usage(format!(
                "message {i} of the batch has 0 bytes; every message needs at least 1 byte"
            )));
        }
        let total: u64 = sizes.iter().sum();
        self.check(src, dst, total)?;
        let count = sizes.len() as f64;
        let per_message = self.model.batch_message_us();
        let issue = self.model.issue();
        // One kernel moving every message: launch, then a block per message, then the bytes.
        let kernel = |hop: Hop| {
            self.model
                .cost(hop)
                .map(|c| issue.kernel_us + c.alpha_us + count * per_message + c.bytes_us(total))
        };
        let mut options: Vec<(BatchStrategy, f64, Option<Plan>)> = Vec::new();

        // A GPU is its own peer: within one GPU the kernel and the copies stay in its memory.
        if let Some(time) = kernel(Hop::PeerSm { src, dst }) {
            options.push((BatchStrategy::Kernel, time, None));
            // Captured once (what queuing the kernel costs), then a graph launch and one graph node
            // per run instead of the kernel's launch.
            let replay = time - issue.kernel_us + issue.graph_us + self.model.graph_node_us();
            options.push((
                BatchStrategy::KernelGraph,
                replay + issue.kernel_us / f64::from(repeats.max(1)),
                None,
            ));
        }
        if let (true, Some(lone), Some(cost)) = (
            self.resident,
            self.model.lone_us(Hop::Resident { src, dst }),
            self.model.cost(Hop::Resident { src, dst }),
        ) {
            // One ticket: a lone transfer's time, its messages at the batch kernel's pace (a warp
            // each, the worker's blocks sharing them out), then the bytes.
            let time = lone + count * per_message + cost.bytes_us(total);
            options.push((BatchStrategy::Resident, time, None));
        }
        if let Some(ce) = self.model.cost(Hop::PeerCe { src, dst }) {
            // Back-to-back copies on one stream: paced by the CPU queuing them or by the GPU
            // running them, whichever is slower.
            let each = ce.time_us(total / sizes.len() as u64);
            let separate = issue.copy_us + (count - 1.0) * each.max(issue.copy_us) + each;
            options.push((BatchStrategy::Separate, separate, None));
            // One driver call, but measured on the lent H200 no cheaper per copy to queue than
            // separate copies (5.02 vs 5.15 µs per message, docs/reference.md): priced alike,
            // after them, so that a tie goes to the plainer way.
            options.push((BatchStrategy::MemcpyBatch, separate, None));
            // Capturing costs what queuing the copies once does; a replay is one launch and a
            // graph node per copy.
            let replay = issue.graph_us + count * self.model.graph_node_us() + ce.bytes_us(total);
            let capture = count * issue.copy_us;
            options.push((
                BatchStrategy::Graph,
                replay + capture / f64::from(repeats.max(1)),
                None,
            ));
        }
        if src != dst {
            let middle = self.plan(src, dst, packing(sizes).1)?;
            let gather = kernel(Hop::Local { device: src });
            let scatter = kernel(Hop::Local { device: dst });
            if let (Some(g), Some(s)) = (gather, scatter) {
                // Two more events order the scatter after the middle transfer.
                let order = 2.0 * issue.event_us;
                options.push((
                    BatchStrategy::GatherScatter,
                    g + middle.predicted_us + order + s,
                    Some(middle),
                ));
            }
        }
        options.sort_by(|a, b| a.1.total_cmp(&b.1));
        let chosen = match wanted {
            None => 0,
            Some(strategy) => options
                .iter()
                .position(|o| o.0 == strategy)
                .ok_or_else(|| {
                    Error::usage(if strategy == BatchStrategy::Resident && !self.resident {
                        "the resident batch strategy needs resident workers: open the fabric \
                         with FabricBuilder::resident (on the command line, plan --resident)"
                            .to_string()
                    } else if src == dst {
                        format!(
                            "{strategy} is for two GPUs; within GPU {src} a batch needs no staging"
                        )
                    } else {
                        format!(
                            "the {strategy} batch strategy needs P2P access from GPU {src} to GPU \
                             {dst}, which this host does not offer; use gather-scatter"
                        )
                    })
                })?,
        };
        let (strategy, predicted_us, middle) = options.remove(chosen);
        Ok(BatchPlan {
            src,
            dst,
            strategy,
            middle,
            predicted_us,
            alternatives: options.iter().map(|(s, t, _)| (*s, *t)).collect(),
        })
    }

    fn check(&self, src: usize, dst: usize, bytes: u64) -> Result<()> {
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

    /// The strategies that could move data between `src` and `dst`: those within one host, or
    /// those between hosts.
    fn family(&self, src: usize, dst: usize) -> &'static [Strategy] {
        if self.model.topology().crosses_hosts(src, dst) {
            &Strategy::NETWORK
        } else {
            &Strategy::ALL
        }
    }

    fn unavailable(&self, strategy: Strategy, src: usize, dst: usize) -> Error {
        let across = self.model.topology().crosses_hosts(src, dst);
        if across != strategy.crosses_hosts() {
            return Error::usage(if across {
                format!(
                    "{strategy} moves data within one host, and GPU {src} and GPU {dst} are on \
                     different hosts: use gpudirect-rdma or net-staged"
                )
            } else {
                format!(
                    "{strategy} moves data between hosts, and GPU {src} and GPU {dst} are on one"
                )
            });
        }
        let link = self
            .model
            .topology()
            .pair(src, dst)
            .map_or_else(|| "the same GPU".to_string(), |p| p.link.to_string());
        Error::usage(match strategy {
            Strategy::DirectCe | Strategy::DirectSm => format!(
                "{strategy} needs P2P access from GPU {src} to GPU {dst}, which their link ({link}) \
                 does not allow; use staged, relay or split"
            ),
            Strategy::Relay => format!(
                "relay needs a third GPU with P2P access to both GPU {src} and GPU {dst}; this \
                 host has none"
            ),
            Strategy::Split => format!(
                "split needs two routes from GPU {src} to GPU {dst} that would each carry bytes; \
                 here one route outruns the others or shares their links"
            ),
            Strategy::Staged => format!("staged cannot be used from GPU {src} to GPU {dst}"),
            Strategy::GpudirectRdma => format!(
                "gpudirect-rdma needs an RDMA NIC on each GPU's host and GPUDirect RDMA \
                 (nvidia-peermem, or dma-buf), which GPU {src} → GPU {dst} lacks; use net-staged"
            ),
            Strategy::NetStaged => format!(
                "net-staged needs an RDMA NIC on the hosts of both GPU {src} and GPU {dst}"
            ),
            Strategy::Resident if !self.resident => "resident needs resident workers: open the \
                 fabric with FabricBuilder::resident (on the command line, plan --resident)"
                .to_string(),
            Strategy::Resident => format!(
                "resident needs P2P access from GPU {src} to GPU {dst}, which their link ({link}) \
                 does not allow; use staged, relay or split"
            ),
        })
    }

    /// Every usable strategy's best plan (alternatives left empty).
    fn candidates(&self, src: usize, dst: usize, bytes: u64, ways: Ways) -> Vec<Plan> {
        if self.model.topology().crosses_hosts(src, dst) {
            return self.network_candidates(src, dst, bytes);
        }
        let mut plans = Vec::new();
        let resident = self
            .resident
            .then_some((Strategy::Resident, Route::Resident));
        let direct = [
            (Strategy::DirectCe, Route::Direct(CopyMethod::CopyEngine)),
            (Strategy::DirectSm, Route::Direct(CopyMethod::SmKernel)),
        ];
        for (strategy, route) in direct.into_iter().chain(resident) {
            if let Some(h) = self.hops(route, src, dst, ways) {
                let time = self.direct_us(&h, bytes);
                plans.push(self.single(src, dst, bytes, strategy, route, time));
            }
        }
        let host = [Route::Host];
        plans.extend(self.best_chunked(src, dst, bytes, Strategy::Staged, &host, ways));
        let relays: Vec<Route> = self.relays(src, dst).collect();
        plans.extend(self.best_chunked(src, dst, bytes, Strategy::Relay, &relays, ways));
        plans.extend(self.best_split(src, dst, bytes, ways));
        plans
    }

    /// Between GPUs of different hosts: GPUDirect RDMA where the model prices it, and through
    /// host memory at each end.
    fn network_candidates(&self, src: usize, dst: usize, bytes: u64) -> Vec<Plan> {
        let mut plans = Vec::new();
        let route = Route::GpudirectRdma;
        if let Some(h) = self.hops(route, src, dst, Ways::One) {
            let time = self.direct_us(&h, bytes);
            plans.push(self.single(src, dst, bytes, Strategy::GpudirectRdma, route, time));
        }
        let net = [Route::NetStaged];
        plans.extend(self.best_chunked(src, dst, bytes, Strategy::NetStaged, &net, Ways::One));
        plans
    }

    fn relays(&self, src: usize, dst: usize) -> impl Iterator<Item = Route> + '_ {
        self.devices
            .iter()
            .copied()
            .filter(move |&r| r != src && r != dst)
            .map(Route::Relay)
            .filter(move |&route| self.hops(route, src, dst, Ways::One).is_some())
    }

    /// The hops a route takes, or `None` where one of them is impossible. Both ways, the host
    /// route's hops are priced at the fraction of their rate they keep while each GPU's PCIe link
    /// carries copies the other way too.
    fn hops(&self, route: Route, src: usize, dst: usize, ways: Ways) -> Option<Hops> {
        let hops = match route {
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
        };
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
        let issue = self.model.issue();
        // What the executor queues: a direct route is one operation; a pipeline first waits for
        // the start and for the lane's last use, then each chunk is two copies, each recording an
        // event, and two waits (the drain for the fill, the fill for a reused slot).
        // A network operation is priced as a copy is: one call that queues it.
        let (setup_us, first_op_us, issue_us) = match route {
            Route::Direct(CopyMethod::SmKernel) => (0.0, issue.kernel_us, issue.kernel_us),
            Route::Direct(CopyMethod::CopyEngine) | Route::GpudirectRdma => {
                (0.0, issue.copy_us, issue.copy_us)
            }
            // A doorbell and a stream wait: two stream memory operations, priced as events.
            Route::Resident => (0.0, 2.0 * issue.event_us, 2.0 * issue.event_us),
            Route::Host | Route::Relay(_) | Route::NetStaged => (
                2.0 * issue.event_us,
                issue.copy_us,
                hops.len() as f64 * (issue.copy_us + 2.0 * issue.event_us),
            ),
        };
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

    /// A direct route's time: a lone operation holds the issue and the start-up, then the bytes.
    fn direct_us(&self, h: &Hops, bytes: u64) -> f64 {
        h.start_us + h.costs[0].bytes_us(bytes)
    }

    /// A route's time on its own: direct, or pipelined at its best chunk size.
    fn alone_us(&self, h: &Hops, bytes: u64) -> f64 {
        if !h.is_pipeline() {
            return self.direct_us(h, bytes);
        }
        Self::chunk_targets(bytes)
            .map(|target| h.pipelined_us(&h.costs, h.issue_us, bytes, target))
            .fold(f64::INFINITY, f64::min)
    }

    fn single(
        &self,
        src: usize,
        dst: usize,
        bytes: u64,
        strategy: Strategy,
        route: Route,
        predicted_us: f64,
    ) -> Plan {
        Plan {
            src,
            dst,
            bytes,
            strategy,
            chunk_bytes: bytes,
            paths: vec![PathShare {
                route,
                offset: 0,
                bytes,
                predicted_us,
            }],
            predicted_us,
            alternatives: Vec::new(),
        }
    }

    /// The chunk targets worth trying for `bytes`: every size below it, and one chunk where it fits.
    fn chunk_targets(bytes: u64) -> impl Iterator<Item = u64> {
        CHUNK_SIZES
            .into_iter()
            .filter(move |&c| c < bytes && (bytes / c <= MAX_CHUNKS || c == MAX_CHUNK))
            .chain((bytes <= MAX_CHUNK).then_some(bytes))
    }

    /// The fastest of `routes` (each a pipeline) at its best chunk size.
    fn best_chunked(
        &self,
        src: usize,
        dst: usize,
        bytes: u64,
        strategy: Strategy,
        routes: &[Route],
        ways: Ways,
    ) -> Option<Plan> {
        let mut best: Option<(f64, Route, u64)> = None;
        for &route in routes {
            let Some(h) = self.hops(route, src, dst, ways) else {
                continue;
            };
            for target in Self::chunk_targets(bytes) {
                let time = h.pipelined_us(&h.costs, h.issue_us, bytes, target);
                if best.is_none_or(|(t, _, _)| time < t) {
                    best = Some((time, route, target));
                }
            }
        }
        let (predicted_us, route, target) = best?;
        Some(Plan {
            chunk_bytes: chunking(bytes, target).0,
            ..self.single(src, dst, bytes, strategy, route, predicted_us)
        })
    }

    /// The best split over every route at once, or `None` where fewer than two routes would carry
    /// bytes. Every route of the split must pay: the one carrying the fewest bytes is dropped while
    /// the routes left (split, or the best of them alone) would be predicted within
    /// [`MODEL_MARGIN`] of the split with it.
    fn best_split(&self, src: usize, dst: usize, bytes: u64, ways: Ways) -> Option<Plan> {
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

    /// The best split over `routes` at any chunk size, or `None` where fewer than two of them would
    /// carry bytes.
    fn split_over(
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
    fn split_at(
        &self,
        src: usize,
        dst: usize,
        (bytes, target): (u64, u64),
        routes: &[(Route, Hops)],
        ways: Ways,
    ) -> Option<Plan> {
        let lanes = self.share_bandwidth(routes, src, dst, target, ways);
        let mut shares = vec![0u64; lanes.len()];
        let mut queue = Queue::of(&lanes, &shares);
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
                    let all = Queue::of(&lanes, shares).ends(&lanes, shares, target);
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
                queue = Queue::of(&lanes, &shares);
                ends = queue.ends(&lanes, &shares, target);
            } else {
                ends[i] = queue.end(&lanes[i], i, shares[i], target);
            }
        }
        if shares.iter().filter(|&&b| b > 0).count() < 2 {
            return None;
        }
        balance(&lanes, &queue, &mut shares, &mut ends, target);
        let mut paths = Vec::new();
        let mut offset = 0;
        for ((lane, &share), &end) in lanes.iter().zip(&shares).zip(&ends) {
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
        Some(Plan {
            src,
            dst,
            bytes,
            strategy: Strategy::Split,
            chunk_bytes: target,
            paths,
            predicted_us: ends.into_iter().fold(0.0, f64::max),
            alternatives: Vec::new(),
        })
    }

    /// The routes worth splitting over, fastest first, each slowed to what shared hardware leaves
    /// it: routes take bandwidth fastest first; a route left with nothing, or sharing hardware with
    /// faster ones and left with less than [`SPLIT_MIN_FRACTION`] of the fastest, is dropped, and
    /// so is one whose copy engines the faster routes already took. Beside a direct copy-engine
    /// copy, the host route's first hop (on the source's copy engines too) is priced at its pace
    /// measured there ([`defaults::BESIDE_DIRECT_RATE_FRACTION`]), and one way the direct copy at
    /// its pace measured beside the host route ([`CostModel::direct_beside_host`]).
    fn share_bandwidth<'h>(
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

/// The copy engines each GPU has left for the routes of one split. Routes running at once on one
/// GPU need an engine each, or their copies queue behind one another: an H200 has 3, so a direct
/// copy (one engine on the source) and the host-staged route (one on the source for device → host,
/// one on the destination for host → device) fit, both ways at once too.
struct CopyEngines(HashMap<usize, u32>);

impl CopyEngines {
    fn of(topology: &crate::topology::Topology) -> CopyEngines {
        CopyEngines(
            topology
                .devices
                .iter()
                .enumerate()
                .map(|(gpu, d)| (gpu, d.copy_engines.max(1)))
                .collect(),
        )
    }

    /// The GPUs whose copy engines a route of a transfer from `src` to `dst` runs on, one entry per
    /// engine: a direct copy on the source; a pipeline's first hop on the source and its second on
    /// the relay, or through the host on the destination (as the executor issues them).
    fn needed(route: Route, src: usize, dst: usize) -> Vec<usize> {
        match route {
            Route::Direct(CopyMethod::CopyEngine) => vec![src],
            Route::Direct(CopyMethod::SmKernel) | Route::Resident => Vec::new(),
            Route::Host | Route::NetStaged => vec![src, dst],
            Route::Relay(via) => vec![src, via],
            // The NICs move the bytes.
            Route::GpudirectRdma => Vec::new(),
        }
    }

    /// Takes the engines `route` needs, or leaves everything as it was and says no.
    fn take(&mut self, route: Route, src: usize, dst: usize) -> bool {
        let needed = Self::needed(route, src, dst);
        let fits = needed.iter().all(|gpu| {
            let wanted = needed.iter().filter(|&g| g == gpu).count() as u32;
            self.0.get(gpu).copied().unwrap_or(0) >= wanted
        });
        if fits {
            for gpu in needed {
                *self.0.get_mut(&gpu).expect("checked above") -= 1;
            }
        }
        fits
    }
}

/// One route of a split.
struct Lane<'h> {
    route: Route,
    hops: &'h Hops,
    /// The hops' costs, slowed where the route shares hardware with faster ones.
    costs: Vec<Cost>,
    /// Steady-state rate on its own (before sharing), then after.
    bytes_per_us: f64,
    /// Time the route takes per transfer beyond what its hops price (measured beside the split's
    /// other route).
    fixed_us: f64,
}

impl<'h> Lane<'h> {
    fn new(route: Route, hops: &'h Hops, target: u64) -> Self {
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
    fn beside_direct_copy(&mut self, pricing: BesideDirect) {
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
struct Queue {
    /// When each lane's first operation can be queued.
    starts: Vec<f64>,
    /// The CPU time per round of chunks.
    cpu_period_us: f64,
}

impl Queue {
    fn of(lanes: &[Lane<'_>], shares: &[u64]) -> Queue {
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
    fn end(&self, lane: &Lane<'_>, i: usize, share: u64, target: u64) -> f64 {
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
    fn ends(&self, lanes: &[Lane<'_>], shares: &[u64], target: u64) -> Vec<f64> {
        (0..lanes.len())
            .map(|i| match shares[i] {
                0 => 0.0,
                share => self.end(&lanes[i], i, share, target),
            })
            .collect()
    }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{dgx1, nvlink_pair, nvswitch8, pcie_2socket};

    fn planner(topology: crate::topology::Topology) -> Planner {
        Planner::new(CostModel::from_topology(&topology))
    }

    const MIB: u64 = 1 << 20;

    #[test]
    fn gathered_messages_are_packed_aligned() {
        let (offsets, len) = packing(&[1, 16, 17, 3]);
        assert_eq!(offsets, vec![0, 16, 32, 64]);
        assert_eq!(len, 80);
    }

    #[test]
    fn chunking_covers_the_transfer_with_aligned_chunks() {
        assert_eq!(chunking(10 * MIB, MIB), (MIB, 10));
        let (len, count) = chunking(10 * MIB + 1, MIB);
        assert_eq!(len % ALIGN, 0);
        assert!(len * count > 10 * MIB && len * (count - 1) <= 10 * MIB);
        assert_eq!(chunking(100, MIB), (100, 1));
        assert_eq!(chunking(5000, 4096), (4096, 2));
    }

    #[test]
    fn pipeline_time_is_fill_plus_slowest_hop_per_chunk() {
        let fast = Cost {
            alpha_us: 1.0,
            beta_gbps: 2.0,
        };
        let slow = Cost {
            alpha_us: 1.0,
            beta_gbps: 1.0,
        };
        // 4 chunks of 1 MB: 1+500 (fast) then 4 × (1+1000) on the slow hop.
        let t = pipeline_us(0.0, 0.0, &[fast, slow], 4_000_000, 1_000_000);
        let chunk = 4_000_000u64.div_ceil(4).next_multiple_of(ALIGN);
        let (tf, ts) = (fast.time_us(chunk), slow.time_us(chunk));
        let last = 4_000_000 - 3 * chunk;
        assert!(
            (t - (tf + 3.0 * ts + slow.time_us(last))).abs() < 1e-6,
            "{t}"
        );
        // One chunk: both hops in turn.
        let one = pipeline_us(0.0, 0.0, &[fast, slow], 1000, 1000);
        assert!((one - fast.time_us(1000) - slow.time_us(1000)).abs() < 1e-9);
        // Tiny chunks are bound by the CPU queuing them.
        let issue_bound = pipeline_us(1.0, 50.0, &[fast, slow], 4096 * 100, 4096);
        assert!(issue_bound >= 99.0 * 50.0, "{issue_bound}");
        // Pipelining beats store-and-forward of the whole transfer.
        assert!(t < fast.time_us(4_000_000) + slow.time_us(4_000_000));
    }

    #[test]
    fn split_shares_follow_bandwidth_and_finish_together() {
        let p = planner(dgx1());
        let plan = p.plan_with(Strategy::Split, 0, 5, 256 * MIB).unwrap();
        let share = |route| plan.paths.iter().find(|s| s.route == route).unwrap();
        // Both relays run at one NVLink's pace, the host at a PCIe Gen3 link's (~2.3x slower).
        let (via1, via4, host) = (
            share(Route::Relay(1)),
            share(Route::Relay(4)),
            share(Route::Host),
        );
        assert!(
            (via1.bytes as f64 / via4.bytes as f64 - 1.0).abs() < 0.05,
            "{plan:#?}"
        );
        let ratio = via1.bytes as f64 / host.bytes as f64;
        assert!((2.0..2.6).contains(&ratio), "{plan:#?}");
        // Within one chunk's time of each other (2 MiB on the host route: ~4%).
        for s in &plan.paths {
            assert!(s.predicted_us > 0.95 * plan.predicted_us, "{plan:#?}");
        }
        // A small transfer is not worth splitting three ways: the extra routes' queuing, start-up
        // and waits cost more than their bandwidth brings.
        if let Ok(small) = p.plan_with(Strategy::Split, 0, 5, 160 << 10) {
            assert!(small.paths.len() < 3, "{small:#?}");
        }
    }

    #[test]
    fn nvswitch_pairs_never_relay_and_split_only_with_the_host() {
        // A relay would cross the same switch ports as the direct copy; the host route crosses
        // PCIe links of its own, and joins large transfers as on the NVLink pair.
        let p = planner(nvswitch8());
        for bytes in [1, 4096, MIB, 4 * MIB, 16 * MIB] {
            let plan = p.plan(0, 5, bytes).unwrap();
            assert_eq!(plan.strategy, Strategy::DirectCe, "{bytes}: {plan:?}");
        }
        for bytes in [256 * MIB, 1 << 30] {
            let plan = p.plan(0, 5, bytes).unwrap();
            let routes: Vec<Route> = plan.paths.iter().map(|s| s.route).collect();
            assert_eq!(
                routes,
                vec![Route::Direct(CopyMethod::CopyEngine), Route::Host],
                "{bytes}: {plan:?}"
            );
        }
    }

    /// The predicted time of `strategy` among a plan's alternatives.
    fn alternative(plan: &Plan, strategy: Strategy) -> f64 {
        plan.alternatives
            .iter()
            .find(|(s, _)| *s == strategy)
            .unwrap_or_else(|| panic!("{strategy} is not among {plan:?}"))
            .1
    }

    #[test]
    fn an_nvlink_pair_adds_the_host_route_to_large_transfers_only() {
        // 55 GB/s of PCIe per GPU beside 396 of NVLink, sharing no link and no copy engine: the
        // host route joins where it shortens the transfer by more than the model's margin, and
        // once it does, it does at every larger size.
        let p = planner(nvlink_pair());
        let picks: Vec<(u64, Plan)> = (12..=30)
            .map(|shift| (1u64 << shift, p.plan(0, 1, 1 << shift).unwrap()))
            .collect();
        let first_split = picks
            .iter()
            .position(|(_, plan)| plan.strategy == Strategy::Split)
            .expect("large transfers split");
        for (bytes, plan) in &picks[..first_split] {
            assert_eq!(plan.strategy, Strategy::DirectCe, "{bytes}: {plan:?}");
        }
        assert!(picks[first_split].0 >= 16 * MIB, "{:?}", picks[first_split]);
        for (bytes, plan) in &picks[first_split..] {
            assert_eq!(plan.strategy, Strategy::Split, "{bytes}: {plan:?}");
            let routes: Vec<Route> = plan.paths.iter().map(|s| s.route).collect();
            assert_eq!(
                routes,
                vec![Route::Direct(CopyMethod::CopyEngine), Route::Host]
            );
            let direct = alternative(plan, Strategy::DirectCe);
            assert!(
                plan.predicted_us * (1.0 + MODEL_MARGIN) < direct,
                "{plan:?}"
            );
            // The host carries what it moves beside the NVLink copy: a tenth at most.
            let host = plan.paths[1].bytes as f64 / *bytes as f64;
            assert!((0.03..0.1).contains(&host), "{bytes}: {plan:?}");
            // Both routes end together: the balance moves bytes in 4 KiB steps.
            let ends: Vec<f64> = plan.paths.iter().map(|s| s.predicted_us).collect();
            assert!((ends[0] - ends[1]).abs() < 1.0, "{bytes}: {plan:?}");
        }
        // At 256 MiB and above the pair is predicted at about 430 GB/s or more one way (NVLink
        // alone 393), with the host route priced as it went beside NVLink.
        for (bytes, plan) in &picks[picks.len() - 3..] {
            let gbps = *bytes as f64 / plan.predicted_us / 1e3;
            assert!(gbps >= 429.5, "{bytes}: {gbps:.1} GB/s, {plan:?}");
        }
    }

    #[test]
    fn a_split_hands_the_host_route_few_large_chunks() {
        // Every chunk through the host costs ~10 µs beside NVLink (its copies' start-up and the
        // waits across the GPUs): a large share goes in chunks of MiBs, not hundreds of KiB.
        let p = planner(nvlink_pair());
        for bytes in [256 * MIB, 1 << 30] {
            let plan = p.plan_with(Strategy::Split, 0, 1, bytes).unwrap();
            assert!(plan.chunk_bytes >= 2 * MIB, "{plan:?}");
            let host = plan.paths.iter().find(|s| s.route == Route::Host).unwrap();
            assert!(chunking(host.bytes, plan.chunk_bytes).1 <= 32, "{plan:?}");
        }
    }

    #[test]
    fn the_staged_route_is_priced_as_the_h200_pair_ran_it() {
        // The staged strategy alone on the H200 pair (docs/reference.md), at the chunk sizes the
        // planner picks there: the model with the waits across GPUs lands within 5%.
        let p = planner(nvlink_pair());
        for (bytes, chunk, measured_us) in [
            (MIB, 512 << 10, 65.6),
            (4 * MIB, MIB, 144.1),
            (16 * MIB, 2 * MIB, 423.3),
            (256 * MIB, 4 * MIB, 5419.5),
            (1 << 30, 4 * MIB, 21342.0),
        ] {
            let plan = p.plan_with(Strategy::Staged, 0, 1, bytes).unwrap();
            assert_eq!(plan.chunk_bytes, chunk, "{bytes}: {plan:?}");
            let error = plan.predicted_us / measured_us - 1.0;
            assert!(
                error.abs() < 0.05,
                "{bytes}: {plan:?} against {measured_us} µs"
            );
        }
    }

    #[test]
    fn the_host_route_beside_nvlink_is_priced_as_the_h200_pair_ran_it() {
        // The split as first run on the H200 pair (docs/reference.md): the host route carried
        // these shares in these chunks beside the NVLink copy and ended last, after the measured
        // time. Priced beside a direct copy, the model lands within 5% of each.
        let p = planner(nvlink_pair());
        let h = p.hops(Route::Host, 0, 1, Ways::One).unwrap();
        for (share, chunk, measured_us) in [
            (MIB, 256 << 10, 89.9),
            (6 * MIB, MIB, 236.1),
            (27 * MIB, MIB, 915.2),
            (56 * MIB, 2 * MIB, 1537.4),
            (116 * MIB, 2 * MIB, 3120.8),
        ] {
            let mut lane = Lane::new(Route::Host, &h, chunk);
            lane.beside_direct_copy(BesideDirect::Estimate);
            let predicted = h.pipelined_us(&lane.costs, h.issue_us, share, chunk);
            let error = predicted / measured_us - 1.0;
            assert!(
                error.abs() < 0.05,
                "{share}: {predicted:.1} against {measured_us} µs"
            );
            // Priced alone, the same chunks would be well under what was measured.
            let alone = h.pipelined_us(&h.costs, h.issue_us, share, chunk);
            assert!(alone < 0.9 * measured_us, "{share}: {alone:.1}");
        }
    }

    #[test]
    fn a_split_is_priced_again_route_by_route_as_planned() {
        for (p, src, dst) in [(planner(nvlink_pair()), 0, 1), (planner(dgx1()), 0, 5)] {
            let plan = p.plan_with(Strategy::Split, src, dst, 256 * MIB).unwrap();
            let ends = p.route_ends_us(&plan, Ways::One).unwrap();
            let planned: Vec<f64> = plan.paths.iter().map(|s| s.predicted_us).collect();
            assert_eq!(ends, planned, "{plan:?}");
        }
    }

    #[test]
    fn the_host_route_beside_a_direct_copy_is_priced_at_the_profiles_pace() {
        let topology = nvlink_pair();
        let host_share = |model: CostModel| {
            let plan = Planner::new(model)
                .plan_with(Strategy::Split, 0, 1, 256 * MIB)
                .unwrap();
            let host = plan.paths.iter().find(|s| s.route == Route::Host).unwrap();
            (host.bytes, plan)
        };
        let estimate = CostModel::from_topology(&topology);
        assert_eq!(estimate.beside_direct(0, 1), BesideDirect::Estimate);
        let mut profile = crate::model::Profile::for_host(&topology);
        profile.beside_direct = vec![crate::model::profile::BesideDirect {
            src: 0,
            dst: 1,
            rate_fraction: 1.0,
            chunk_us: 0.0,
            fixed_us: 0.0,
            direct_rate_fraction: 1.0,
            direct_fixed_us: 0.0,
            splits: Vec::new(),
            both_ways: None,
        }];
        let measured = CostModel::from_profile(&topology, &profile).unwrap();
        // The pair's own figure, and the other direction takes it for want of its own.
        for (src, dst) in [(0, 1), (1, 0)] {
            assert_eq!(
                measured.beside_direct(src, dst),
                BesideDirect::Measured {
                    pace: crate::model::HostPace {
                        rate_fraction: 1.0,
                        chunk_us: 0.0,
                        fixed_us: 0.0,
                    },
                    on: (0, 1)
                }
            );
        }
        // Unslowed the host route carries more than the estimate (which slows it) lets it; slower,
        // less; and the model's host route ends where the plan says.
        let (at_estimate, _) = host_share(estimate.clone());
        let (alone, plan) = host_share(measured.clone());
        let slower = crate::model::HostPace {
            rate_fraction: 0.7,
            chunk_us: 5.0,
            fixed_us: 0.0,
        };
        let (slow, _) = host_share(measured.clone().with_beside_direct(0, 1, slower));
        assert!(
            alone > at_estimate && at_estimate > slow,
            "{alone} {at_estimate} {slow}"
        );
        let host = plan.paths.iter().find(|s| s.route == Route::Host).unwrap();
        let h = Planner::new(measured.clone())
            .hops(Route::Host, 0, 1, Ways::One)
            .unwrap();
        let mut lane = Lane::new(Route::Host, &h, plan.chunk_bytes);
        lane.beside_direct_copy(measured.beside_direct(0, 1));
        assert_eq!(
            lane.costs, h.costs,
            "unslowed, the route is priced as alone"
        );
        assert!(host.predicted_us > 0.95 * plan.predicted_us, "{plan:?}");
    }

    #[test]
    fn both_ways_the_host_route_carries_fewer_bytes_and_only_opposite_transfers_are_priced_so() {
        let p = planner(nvlink_pair());
        let host_bytes = |plan: &Plan| {
            plan.paths
                .iter()
                .find(|s| s.route == Route::Host)
                .map_or(0, |s| s.bytes)
        };
        for bytes in [256 * MIB, 1 << 30] {
            let one = p.plan_ways(0, 1, bytes, Ways::One).unwrap();
            let both = p.plan_ways(0, 1, bytes, Ways::Both).unwrap();
            // Still worth splitting (both GPUs' links slowed to 0.90 still add bandwidth beside
            // NVLink), with fewer bytes through the host, and predicted slower than one way.
            assert_eq!(both.strategy, Strategy::Split, "{both:?}");
            assert!(host_bytes(&both) < host_bytes(&one), "{one:?} {both:?}");
            let ratio = host_bytes(&both) as f64 / host_bytes(&one) as f64;
            assert!((0.8..0.97).contains(&ratio), "{ratio}");
            assert!(both.predicted_us > one.predicted_us);
            // Never slower than NVLink alone by the model's own prediction.
            assert!(both.predicted_us < alternative(&both, Strategy::DirectCe));
        }
        // Only a transfer with an opposite one that takes the host route is priced both ways.
        let plan = |src, dst, bytes, _, ways| p.plan_ways(src, dst, bytes, ways);
        let big = 256 * MIB;
        assert_eq!(
            ways_together(&[(0, 1, big, None), (1, 0, big, None)], plan),
            [Ways::Both, Ways::Both]
        );
        assert_eq!(
            ways_together(&[(0, 1, big, None), (1, 0, 4096, None)], plan),
            [Ways::One, Ways::Both]
        );
        assert_eq!(
            ways_together(&[(0, 1, big, None), (0, 1, big, None)], plan),
            [Ways::One, Ways::One]
        );
    }

    #[test]
    fn a_split_needs_a_free_copy_engine_for_every_route() {
        // With one copy engine per GPU the host route's device → host copy would queue behind the
        // direct copy on the source: no split.
        let mut topology = nvlink_pair();
        for d in &mut topology.devices {
            d.copy_engines = 1;
        }
        let p = planner(topology);
        let plan = p.plan(0, 1, 1 << 30).unwrap();
        assert_eq!(plan.strategy, Strategy::DirectCe, "{plan:?}");
        let mut engines = CopyEngines::of(&nvlink_pair());
        assert!(engines.take(Route::Direct(CopyMethod::CopyEngine), 0, 1));
        assert!(engines.take(Route::Host, 0, 1));
        // The other direction fits too, in the three engines of each GPU; then none is left.
        assert!(engines.take(Route::Direct(CopyMethod::CopyEngine), 1, 0));
        assert!(engines.take(Route::Host, 1, 0));
        assert!(!engines.take(Route::Direct(CopyMethod::CopyEngine), 0, 1));
        assert!(!engines.take(Route::Relay(1), 0, 1));
        // A copy kernel needs none.
        assert!(engines.take(Route::Direct(CopyMethod::SmKernel), 0, 1));
    }

    #[test]
    fn resident_is_offered_only_with_workers_and_wins_only_small_transfers() {
        let topology = nvlink_pair();
        let without = planner(topology.clone());
        for bytes in [4, MIB, 256 * MIB] {
            let plan = without.plan(0, 1, bytes).unwrap();
            assert!(plan
                .alternatives
                .iter()
                .all(|(s, _)| *s != Strategy::Resident));
            let unusable = without.unusable(0, 1, bytes).unwrap();
            assert!(
                unusable.iter().all(|(s, _)| *s != Strategy::Resident),
                "{unusable:?}"
            );
        }
        let refused = without.plan_with(Strategy::Resident, 0, 1, 4).unwrap_err();
        assert!(refused.to_string().contains("plan --resident"), "{refused}");
        let with = planner(topology).with_resident();
        assert!(with.offers_resident());
        // Unmeasured, a worker costs what it took on the lent H200 pair (7 µs from the call until
        // the host sees a few bytes arrive), which a copy does not lose to.
        assert_ne!(with.plan(0, 1, 4).unwrap().strategy, Strategy::Resident);
        // Large transfers are planned as without workers (the copy engine, which holds no SMs and
        // is faster per byte, alone or in a split).
        assert_eq!(
            with.plan(0, 1, 256 * MIB).unwrap().strategy,
            without.plan(0, 1, 256 * MIB).unwrap().strategy
        );
        let forced = with.plan_with(Strategy::Resident, 0, 1, 256 * MIB).unwrap();
        assert_eq!(forced.paths[0].route, Route::Resident);
        // A measured profile moves the boundary: a fast worker wins small transfers, a slow one
        // loses even those.
        let measured = |alpha_us: f64| {
            let mut profile = crate::model::Profile::for_host(&nvlink_pair());
            profile.hops = vec![crate::model::profile::Measured {
                hop: Hop::Resident { src: 0, dst: 1 },
                cost: crate::model::Cost {
                    alpha_us,
                    beta_gbps: 100.0,
                },
            }];
            let model = CostModel::from_profile(&nvlink_pair(), &profile).unwrap();
            Planner::new(model).with_resident()
        };
        let fast = measured(1.0);
        assert_eq!(fast.plan(0, 1, 4).unwrap().strategy, Strategy::Resident);
        assert_ne!(
            fast.plan(0, 1, 256 * MIB).unwrap().strategy,
            Strategy::Resident
        );
        assert_ne!(
            measured(50.0).plan(0, 1, 4).unwrap().strategy,
            Strategy::Resident
        );
    }

    #[test]
    fn measured_lone_operations_decide_small_direct_transfers() {
        // As on the lent H200: a lone small copy kernel done sooner than a copy-engine copy, but
        // the copy engine the faster per byte.
        let topology = nvswitch8();
        let mut profile = crate::model::Profile::for_host(&topology);
        profile.lone = vec![
            crate::model::profile::Lone {
                hop: Hop::PeerCe { src: 0, dst: 5 },
                lone_us: 7.2,
            },
            crate::model::profile::Lone {
                hop: Hop::PeerSm { src: 0, dst: 5 },
                lone_us: 6.6,
            },
        ];
        let p = Planner::new(CostModel::from_profile(&topology, &profile).unwrap());
        let at = |bytes| p.plan(0, 5, bytes).unwrap();
        assert_eq!(at(4).strategy, Strategy::DirectSm);
        assert!((at(4).predicted_us - 6.6).abs() < 0.01, "{:?}", at(4));
        assert_eq!(at(64 * 1024).strategy, Strategy::DirectSm);
        assert_eq!(at(4 << 20).strategy, Strategy::DirectCe);
        // Pairs without a measurement keep the estimate: issue, α, the copy engine's start-up.
        assert_eq!(
            at(4).predicted_us,
            p.plan_with(Strategy::DirectSm, 0, 5, 4)
                .unwrap()
                .predicted_us
        );
        let other = p.plan(1, 2, 4).unwrap();
        assert_eq!(
            other.strategy,
            planner(nvswitch8()).plan(1, 2, 4).unwrap().strategy
        );
        assert_eq!(
            other.predicted_us,
            planner(nvswitch8()).plan(1, 2, 4).unwrap().predicted_us
        );
    }

    #[test]
    fn a_batch_run_many_times_replays_its_kernel_from_a_graph() {
        // CPU costs as measured on the lent H200 (tune, BENCHMARKS.md run 4): a graph launch is a
        // third of a kernel launch there.
        let topology = nvswitch8();
        let mut profile = crate::model::Profile::for_host(&topology);
        profile.issue = Some(crate::model::IssueCosts {
            copy_us: 6.05,
            kernel_us: 6.02,
            event_us: 0.98,
            graph_us: 2.10,
        });
        let p = Planner::new(CostModel::from_profile(&topology, &profile).unwrap());
        let sizes = vec![4096; 1000];
        // Once: capturing costs what launching does, so the kernel is launched.
        assert_eq!(
            p.plan_batch(0, 5, &sizes, 1).unwrap().strategy,
            BatchStrategy::Kernel
        );
        // A thousand times: a graph launch and one node beat a kernel launch each run.
        let many = p.plan_batch(0, 5, &sizes, 1000).unwrap();
        assert_eq!(many.strategy, BatchStrategy::KernelGraph);
        let kernel = many
            .alternatives
            .iter()
            .find(|(s, _)| *s == BatchStrategy::Kernel)
            .unwrap()
            .1;
        assert!(many.predicted_us < kernel, "{many:?}");
    }

    #[test]
    fn dgx1_pairs_without_nvlink_relay_or_split_and_beat_staging() {
        let p = planner(dgx1());
        for bytes in [MIB, 16 * MIB, 256 * MIB] {
            let plan = p.plan(0, 5, bytes).unwrap();
            assert!(
                matches!(plan.strategy, Strategy::Relay | Strategy::Split),
                "{bytes}: {plan:?}"
            );
            let staged = plan
                .alternatives
                .iter()
                .find(|(s, _)| *s == Strategy::Staged)
                .unwrap()
                .1;
            assert!(plan.predicted_us < staged, "{plan:?}");
        }
        // Large transfers use both relays (via GPU 1 and GPU 4) at once.
        let big = p.plan(0, 5, 256 * MIB).unwrap();
        assert_eq!(big.strategy, Strategy::Split);
        let relays: Vec<_> = big
            .paths
            .iter()
            .filter_map(|s| match s.route {
                Route::Relay(r) => Some(r),
                _ => None,
            })
            .collect();
        assert_eq!(relays.len(), 2, "{big:?}");
    }

    #[test]
    fn pcie_pairs_across_sockets_are_staged() {
        let p = planner(pcie_2socket());
        for bytes in [4096, MIB, 64 * MIB] {
            let plan = p.plan(0, 3, bytes).unwrap();
            assert_eq!(plan.strategy, Strategy::Staged, "{bytes}: {plan:?}");
        }
        // Inside one switch P2P works and wins.
        assert_eq!(p.plan(0, 1, MIB).unwrap().strategy, Strategy::DirectCe);
    }

    #[test]
    fn a_plan_covers_every_byte_once_and_lists_the_alternatives() {
        let p = planner(dgx1()).with_resident();
        let bytes = 100 * MIB + 12345;
        for strategy in Strategy::ALL {
            let plan = p.plan_with(strategy, 0, 1, bytes).unwrap();
            assert_eq!(plan.strategy, strategy);
            let mut offset = 0;
            for share in &plan.paths {
                assert_eq!(share.offset, offset);
                offset += share.bytes;
            }
            assert_eq!(offset, bytes);
            assert_eq!(plan.alternatives.len(), Strategy::ALL.len() - 1);
            assert!(plan.alternatives.windows(2).all(|w| w[0].1 <= w[1].1));
            assert!(plan.chunk_bytes <= bytes);
        }
        let best = p.plan(0, 1, bytes).unwrap();
        assert!(best
            .alternatives
            .iter()
            .all(|(_, t)| *t >= best.predicted_us));
    }

    #[test]
    fn the_planner_chooses_the_chunk_size() {
        let p = planner(pcie_2socket());
        let small = p.plan_with(Strategy::Staged, 0, 3, 64 << 10).unwrap();
        let large = p.plan_with(Strategy::Staged, 0, 3, 256 * MIB).unwrap();
        assert_eq!(
            small.chunk_bytes,
            64 << 10,
            "one chunk for a small transfer"
        );
        assert!(large.chunk_bytes > 64 << 10, "{large:?}");
        assert!(large.chunk_bytes <= MAX_CHUNK);
        // Pipelined staging beats copying everything to the host and then everything back.
        let m = p.model();
        let d2h = m
            .cost(Hop::DeviceToHost {
                device: 0,
                node: Some(0),
            })
            .unwrap();
        let h2d = m
            .cost(Hop::HostToDevice {
                device: 3,
                node: Some(0),
            })
            .unwrap();
        assert!(large.predicted_us < d2h.time_us(256 * MIB) + h2d.time_us(256 * MIB));
    }

    #[test]
    fn a_restricted_planner_relays_only_through_its_gpus() {
        let p = Planner::for_devices(CostModel::from_topology(&dgx1()), &[0, 1, 5]);
        let plan = p.plan_with(Strategy::Relay, 0, 5, 64 * MIB).unwrap();
        assert_eq!(plan.paths[0].route, Route::Relay(1), "GPU 4 is not in use");
        let err = p.plan(0, 4, MIB).unwrap_err();
        assert!(
            err.to_string().contains("not one of the GPUs in use"),
            "{err}"
        );
    }

    #[test]
    fn unusable_strategies_come_with_their_reason() {
        let p = planner(pcie_2socket());
        let unusable = p.unusable(0, 3, MIB).unwrap();
        let names: Vec<_> = unusable.iter().map(|(s, _)| *s).collect();
        assert_eq!(
            names,
            vec![
                Strategy::DirectCe,
                Strategy::DirectSm,
                Strategy::Relay,
                Strategy::Split
            ]
        );
        assert!(unusable[0].1.contains("P2P"), "{unusable:?}");
        assert!(p
            .unusable(0, 1, MIB)
            .unwrap()
            .iter()
            .all(|(s, _)| *s != Strategy::DirectCe));
    }

    #[test]
    fn impossible_strategies_and_bad_input_are_refused_with_a_sentence() {
        let p = planner(pcie_2socket());
        let err = p.plan_with(Strategy::DirectCe, 0, 3, MIB).unwrap_err();
        assert!(err.to_string().contains("SYS"), "{err}");
        let err = p.plan_with(Strategy::Relay, 0, 3, MIB).unwrap_err();
        assert!(err.to_string().contains("third GPU"), "{err}");
        for (src, dst, bytes, needle) in [
            (0, 9, MIB, "GPU 9 does not exist"),
            (4, 0, MIB, "GPU 4 does not exist"),
            (0, 1, 0, "0 bytes"),
        ] {
            let err = p.plan(src, dst, bytes).unwrap_err();
            assert_eq!(err.exit_code(), 2);
            assert!(err.to_string().contains(needle), "{err}");
        }
    }

    fn preset_planner(name: &str) -> Planner {
        planner(crate::backend::sim::Preset::load(name).unwrap().topology())
    }

    #[test]
    fn between_hosts_a_nic_next_to_the_gpu_carries_it_by_gpudirect_rdma() {
        let p = preset_planner("2x-dgx-h100");
        for bytes in [4, 4096, MIB, 64 * MIB, 1 << 30] {
            let plan = p.plan(0, 8, bytes).unwrap();
            assert_eq!(plan.strategy, Strategy::GpudirectRdma, "{bytes}: {plan:?}");
            assert_eq!(plan.paths[0].route, Route::GpudirectRdma);
            assert_eq!(plan.alternatives.len(), 1, "{plan:?}");
            assert_eq!(plan.alternatives[0].0, Strategy::NetStaged);
        }
        // 400 Gb/s at the RDMA efficiency, behind a 1 µs post and 1.5 µs of network.
        let big = p.plan(3, 11, 1 << 30).unwrap();
        let gbps = (1u64 << 30) as f64 / big.predicted_us / 1e3;
        assert!((45.0..48.1).contains(&gbps), "{gbps} GB/s");
        // Across rails the spine adds its latency.
        let same_rail = p.plan(3, 11, 4).unwrap().predicted_us;
        let other_rail = p.plan(3, 12, 4).unwrap().predicted_us;
        assert!(
            (other_rail - same_rail - 0.5).abs() < 1e-9,
            "{same_rail} {other_rail}"
        );
    }

    #[test]
    fn a_gpu_whose_nearest_nic_is_across_the_sockets_stages_large_transfers() {
        let p = preset_planner("2x-pcie-4gpu-2socket");
        let big = p.plan(2, 6, 64 * MIB).unwrap();
        assert_eq!(big.strategy, Strategy::NetStaged, "{big:?}");
        assert_eq!(big.paths[0].route, Route::NetStaged);
        assert!(big.chunk_bytes < 64 * MIB, "pipelined: {big:?}");
        let rdma = big.alternatives[0];
        assert_eq!(rdma.0, Strategy::GpudirectRdma);
        assert!(rdma.1 > 2.0 * big.predicted_us, "{big:?}");
        // A few bytes: one RDMA operation beats three staged hops.
        assert_eq!(
            p.plan(2, 6, 4096).unwrap().strategy,
            Strategy::GpudirectRdma
        );
        // GPUs next to the NIC keep GPUDirect RDMA at every size.
        assert_eq!(
            p.plan(0, 5, 64 * MIB).unwrap().strategy,
            Strategy::GpudirectRdma
        );
    }

    #[test]
    fn without_gpudirect_rdma_only_the_staged_network_route_is_left() {
        let mut topology = crate::backend::sim::Preset::load("2x-dgx-h100")
            .unwrap()
            .topology();
        topology.network.as_mut().unwrap().gpudirect.available = Some(false);
        let p = planner(topology);
        let plan = p.plan(0, 8, MIB).unwrap();
        assert_eq!(plan.strategy, Strategy::NetStaged);
        assert!(plan.alternatives.is_empty());
        let unusable = p.unusable(0, 8, MIB).unwrap();
        assert_eq!(unusable.len(), 1, "{unusable:?}");
        assert_eq!(unusable[0].0, Strategy::GpudirectRdma);
        assert!(unusable[0].1.contains("nvidia-peermem"), "{unusable:?}");
    }

    #[test]
    fn each_strategy_serves_its_side_of_the_network() {
        let p = preset_planner("2x-dgx-h100");
        let err = p.plan_with(Strategy::DirectCe, 0, 8, MIB).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("different hosts"), "{err}");
        let err = p.plan_with(Strategy::GpudirectRdma, 0, 1, MIB).unwrap_err();
        assert!(err.to_string().contains("are on one"), "{err}");
        // Within a host nothing changes: the network's strategies are not listed as unusable.
        let within = p.unusable(0, 1, MIB).unwrap();
        assert!(within.iter().all(|(s, _)| !s.crosses_hosts()), "{within:?}");
        assert!(p.unusable(0, 8, MIB).unwrap().is_empty());
        assert_eq!(p.plan(0, 1, MIB).unwrap().strategy, Strategy::DirectCe);
        assert_eq!(
            "net-staged".parse::<Strategy>().unwrap(),
            Strategy::NetStaged
        );
        // A batch between hosts is gathered and sent as one network transfer.
        let batch = p.plan_batch(0, 8, &[256; 100], 1).unwrap();
        assert_eq!(batch.strategy, BatchStrategy::GatherScatter);
        assert_eq!(batch.middle.unwrap().strategy, Strategy::GpudirectRdma);
    }

    #[test]
    fn small_message_batches_use_one_kernel_or_gather_without_p2p() {
        let sizes = vec![256u64; 1000];
        let nv = planner(nvswitch8());
        let plan = nv.plan_batch(0, 1, &sizes, 1).unwrap();
        assert_eq!(plan.strategy, BatchStrategy::Kernel, "{plan:?}");
        let pcie = planner(pcie_2socket());
        let plan = pcie.plan_batch(0, 3, &sizes, 1).unwrap();
        assert_eq!(plan.strategy, BatchStrategy::GatherScatter, "{plan:?}");
        // 1000 messages of 256 bytes, packed back to back (256 is a multiple of the alignment).
        assert_eq!(plan.middle.as_ref().unwrap().bytes, 256_000);
        assert!(
            plan.alternatives.is_empty(),
            "only gathering works without P2P"
        );
        // A graph's capture pays off over repeats.
        let once = nv.plan_batch(0, 1, &sizes, 1).unwrap();
        let many = nv.plan_batch(0, 1, &sizes, 1000).unwrap();
        let graph = |p: &BatchPlan| {
            p.alternatives
                .iter()
                .find(|a| a.0 == BatchStrategy::Graph)
                .unwrap()
                .1
        };
        assert!(graph(&many) < graph(&once));
        assert!(nv.plan_batch(0, 1, &[], 1).is_err());
        assert!(nv.plan_batch(0, 1, &[4, 0], 1).is_err());
    }
}
