//! What the planner decides: a strategy, its chunk size, the routes the bytes take, and the
//! predictions that justify the pick.

use crate::backend::CopyMethod;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// What else a transfer runs beside, as far as its pricing goes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Ways {
    /// Nothing that slows its routes: each GPU's PCIe link carries its host route one way.
    #[default]
    One,
    /// Another transfer goes the opposite way through the host at once (both GPUs splitting to
    /// each other): each GPU's PCIe link carries copies both ways, and the host route is priced
    /// at the fraction of its rate it keeps then ([`crate::model::CostModel::both_ways`]).
    Both,
}

/// A way to move one contiguous range from one GPU to another.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// One copy-engine copy over the direct peer path.
    DirectCe,
    /// One SM copy kernel storing through the peer mapping.
    DirectSm,
    /// Through pinned host memory, chunked, device→host of one chunk overlapping host→device of
    /// the previous.
    Staged,
    /// Through an intermediate GPU, chunked and pipelined.
    Relay,
    /// Several routes at once, the bytes divided by their predicted speed.
    Split,
    /// Through a resident worker on the source GPU: no launch, no copy call; offered only by a
    /// fabric that runs workers (`FabricBuilder::resident`, `plan --resident`).
    Resident,
    /// To a GPU of another host: the source's NIC reads its memory, the destination's NIC writes
    /// into the other GPU's (GPUDirect RDMA).
    GpudirectRdma,
    /// To a GPU of another host through host memory: device → host near the NIC, NIC to NIC,
    /// host → device, chunked and pipelined.
    NetStaged,
}

impl Strategy {
    /// The strategies between two GPUs of one host.
    pub const ALL: [Strategy; 6] = [
        Strategy::DirectCe,
        Strategy::DirectSm,
        Strategy::Staged,
        Strategy::Relay,
        Strategy::Split,
        Strategy::Resident,
    ];

    /// The strategies between GPUs of different hosts.
    pub const NETWORK: [Strategy; 2] = [Strategy::GpudirectRdma, Strategy::NetStaged];

    /// The name used on the command line and in JSON.
    pub fn name(self) -> &'static str {
        match self {
            Strategy::DirectCe => "direct-ce",
            Strategy::DirectSm => "direct-sm",
            Strategy::Staged => "staged",
            Strategy::Relay => "relay",
            Strategy::Split => "split",
            Strategy::GpudirectRdma => "gpudirect-rdma",
            Strategy::NetStaged => "net-staged",
            Strategy::Resident => "resident",
        }
    }

    /// Whether it moves data between hosts.
    pub fn crosses_hosts(self) -> bool {
        Strategy::NETWORK.contains(&self)
    }
}

impl fmt::Display for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Strategy {
    type Err = crate::Error;

    fn from_str(s: &str) -> crate::Result<Self> {
        let every = || Strategy::ALL.into_iter().chain(Strategy::NETWORK);
        every().find(|st| st.name() == s).ok_or_else(|| {
            let names: Vec<_> = every().map(|s| s.name()).collect();
            crate::Error::usage(format!(
                "unknown strategy `{s}`: expected one of {}",
                names.join(", ")
            ))
        })
    }
}

/// The refusal of a transfer between GPUs of different hosts: peerlink plans those, and NCCL
/// moves them (across processes, which the engine does not span).
pub fn between_hosts(src: usize, dst: usize) -> crate::Error {
    crate::Error::usage(format!(
        "GPU {src} and GPU {dst} are on different hosts: peerlink plans transfers between hosts \
         (`peerlink plan --src {src} --dst {dst}` predicts them) but moves data only within one; \
         between hosts NCCL carries it (`peerlink workload`)"
    ))
}

/// One way through the machine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Route {
    /// The direct peer path, by copy engine or SM kernel.
    Direct(CopyMethod),
    /// Through pinned host memory near the source GPU.
    Host,
    /// Through this intermediate GPU's memory.
    Relay(usize),
    /// GPU memory to GPU memory of another host, through the two GPUs' NICs.
    GpudirectRdma,
    /// Through host memory near each GPU's NIC, to another host.
    NetStaged,
    /// Through the source GPU's resident worker.
    Resident,
}

impl fmt::Display for Route {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Route::Direct(CopyMethod::CopyEngine) => f.write_str("direct (copy engine)"),
            Route::Direct(CopyMethod::SmKernel) => f.write_str("direct (SM kernel)"),
            Route::Host => f.write_str("via pinned host memory"),
            Route::Relay(r) => write!(f, "via GPU {r}"),
            Route::GpudirectRdma => f.write_str("GPUDirect RDMA (GPU → NIC → NIC → GPU)"),
            Route::NetStaged => f.write_str("via host memory and the NICs"),
            Route::Resident => f.write_str("direct (resident worker)"),
        }
    }
}

/// The bytes one route carries.
#[derive(Clone, Debug, PartialEq)]
pub struct PathShare {
    pub route: Route,
    /// Offset of this share inside the transfer.
    pub offset: u64,
    pub bytes: u64,
    /// Predicted time for this share alone, in microseconds.
    pub predicted_us: f64,
}

/// When one route of a split ended, measured: the bytes it carried and the GPU time from the
/// transfer's start until its last operation ended ([`crate::engine::Transfer::route_ends`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RouteEnd {
    pub route: Route,
    pub bytes: u64,
    pub end_us: f64,
}

/// The planner's answer for one transfer.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    pub src: usize,
    pub dst: usize,
    pub bytes: u64,
    pub strategy: Strategy,
    /// Bytes per pipeline step for the chunked strategies; the whole transfer for the others.
    pub chunk_bytes: u64,
    /// The routes and the bytes each carries, covering the transfer exactly once.
    pub paths: Vec<PathShare>,
    pub predicted_us: f64,
    /// Every other usable strategy's best prediction, fastest first.
    pub alternatives: Vec<(Strategy, f64)>,
}

/// A way to move many small messages between one pair.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum BatchStrategy {
    /// One copy kernel performs every message through the peer mapping (needs P2P).
    Kernel,
    /// Gather on the source into one staging buffer, one transfer, scatter on the destination.
    GatherScatter,
    /// One copy-engine copy per message (needs P2P).
    Separate,
    /// The separate copies captured once as a graph and replayed (needs P2P).
    Graph,
    /// The one copy kernel captured once as a graph and replayed: a graph launch per run instead of
    /// a kernel launch, and the copy list made once (needs P2P).
    KernelGraph,
    /// Copy-engine copies queued in one driver call, cuMemcpyBatchAsync (needs P2P).
    MemcpyBatch,
    /// The source GPU's resident worker moves every message, one ticket for the batch: no launch
    /// (needs P2P; offered only by a fabric that runs workers).
    Resident,
}

impl BatchStrategy {
    pub const ALL: [BatchStrategy; 7] = [
        BatchStrategy::Kernel,
        BatchStrategy::KernelGraph,
        BatchStrategy::GatherScatter,
        BatchStrategy::Separate,
        BatchStrategy::MemcpyBatch,
        BatchStrategy::Graph,
        BatchStrategy::Resident,
    ];

    pub fn name(self) -> &'static str {
        match self {
            BatchStrategy::Kernel => "kernel",
            BatchStrategy::GatherScatter => "gather-scatter",
            BatchStrategy::Separate => "separate",
            BatchStrategy::Graph => "graph",
            BatchStrategy::KernelGraph => "kernel-graph",
            BatchStrategy::MemcpyBatch => "memcpy-batch",
            BatchStrategy::Resident => "resident",
        }
    }
}

impl fmt::Display for BatchStrategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The planner's answer for a batch of small messages.
#[derive(Clone, Debug, PartialEq)]
pub struct BatchPlan {
    pub src: usize,
    pub dst: usize,
    pub strategy: BatchStrategy,
    /// For [`BatchStrategy::GatherScatter`]: how the gathered bytes cross between the GPUs.
    pub middle: Option<Plan>,
    /// Predicted time per execution, with a graph's capture spread over the expected repeats.
    pub predicted_us: f64,
    pub alternatives: Vec<(BatchStrategy, f64)>,
}
