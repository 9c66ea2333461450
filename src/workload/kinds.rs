//! The workload verb's vocabulary: which workload, how a loop is issued, whose implementation a
//! row measures, and the variants of a workload.

use crate::{Error, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The workloads `peerlink workload` runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Workload {
    AllReduce,
    SendRecv,
    Pipeline,
    Halo,
}

impl Workload {
    pub const ALL: [Workload; 4] = [
        Workload::AllReduce,
        Workload::SendRecv,
        Workload::Pipeline,
        Workload::Halo,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Workload::AllReduce => "all-reduce",
            Workload::SendRecv => "send-recv",
            Workload::Pipeline => "pipeline",
            Workload::Halo => "halo",
        }
    }

    /// The workload named `name`, or a usage error listing them.
    pub fn parse(name: &str) -> Result<Workload> {
        Workload::ALL
            .into_iter()
            .find(|w| w.name() == name)
            .ok_or_else(|| {
                Error::usage(format!(
                    "unknown workload `{name}`; known workloads: {}",
                    Workload::ALL.map(Workload::name).join(", ")
                ))
            })
    }

    /// How the workload's busbw follows from its algbw, in words.
    pub fn busbw_rule(self) -> &'static str {
        match self {
            Workload::AllReduce => {
                "busbw = algbw × 2(n−1)/n, what each rank's busiest link carries (nccl-tests)"
            }
            Workload::SendRecv => "busbw = algbw: each message crosses one link once",
            Workload::Pipeline => {
                "algbw = activation bytes / step time; busbw = algbw (one hand-over per stage per step)"
            }
            Workload::Halo => {
                "algbw = one face's bytes / step time (every face moves at once); busbw = algbw"
            }
        }
    }
}

impl fmt::Display for Workload {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a workload's ranks ran, as its document records it (`bench::layout::Layout` is the running
/// form, with the group): one process driving every GPU, or a process each (`peerlink launch`,
/// torchrun). The NCCL-API library's `auto` tells a measurement's layout from a communicator's
/// by it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum ProcessLayout {
    /// One process driving every rank's GPU (documents written before the field say nothing,
    /// and read as this).
    #[default]
    OneProcess,
    /// One process per rank.
    RankPerProcess,
}

/// How a timed loop reaches the GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum IssueMode {
    /// One host thread queues every rank's operations, each stream held behind a gate meanwhile.
    Stream,
    /// Each rank's loop captured once into a CUDA graph on its stream, the graphs replayed.
    Graphs,
}

impl IssueMode {
    pub fn name(self) -> &'static str {
        match self {
            IssueMode::Stream => "stream",
            IssueMode::Graphs => "graphs",
        }
    }
}

/// Which issue modes to run (`--issue`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IssueChoice {
    #[default]
    Stream,
    Graphs,
    Both,
}

impl IssueChoice {
    pub fn parse(text: &str) -> Result<IssueChoice> {
        match text {
            "stream" => Ok(IssueChoice::Stream),
            "graphs" => Ok(IssueChoice::Graphs),
            "both" => Ok(IssueChoice::Both),
            other => Err(Error::usage(format!(
                "unknown issue mode `{other}`; expected stream, graphs or both"
            ))),
        }
    }

    pub fn modes(self) -> Vec<IssueMode> {
        match self {
            IssueChoice::Stream => vec![IssueMode::Stream],
            IssueChoice::Graphs => vec![IssueMode::Graphs],
            IssueChoice::Both => vec![IssueMode::Stream, IssueMode::Graphs],
        }
    }
}

/// Whose implementation a row measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum Contender {
    /// peerlink's own: a kernel, the engine, copies.
    Peerlink,
    /// peerlink's all-reduce as its cost model picks the kernel at each size (the row repeats the
    /// picked kernel's measurement).
    PeerlinkPick,
    /// NCCL (or, on the simulator, its model) on ordinary buffers: plain NCCL.
    Nccl,
    /// NCCL on buffers of symmetric windows (`ncclMemAlloc` memory registered with
    /// `ncclCommWindowRegister(…, NCCL_WIN_COLL_SYMMETRIC)`, as nccl-tests `-R 2` runs it), where
    /// NCCL ≥ 2.27 may run its symmetric-memory kernels (no multicast: NVLS stays off). Real GPUs
    /// only: the simulator has no model of those kernels.
    NcclSymmetric,
}

impl Contender {
    pub fn is_peerlink(self) -> bool {
        matches!(self, Contender::Peerlink | Contender::PeerlinkPick)
    }
}

impl fmt::Display for Contender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Contender::Peerlink => "peerlink",
            Contender::PeerlinkPick => "peerlink (pick)",
            Contender::Nccl => "NCCL",
            Contender::NcclSymmetric => "NCCL (symmetric windows)",
        })
    }
}

/// A workload's variants: send-recv's directions, halo's decompositions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum Variant {
    /// Every rank but the last sends to the next.
    #[serde(rename = "one-way")]
    OneWay,
    /// Every pair of consecutive ranks sends both ways at once.
    #[serde(rename = "both")]
    BothWays,
    /// The GPUs in a ring, each domain exchanging contiguous rows.
    #[serde(rename = "1-d")]
    OneD,
    /// The GPUs as a grid, rows (contiguous) and columns (strided).
    #[serde(rename = "2-d")]
    TwoD,
}

impl Variant {
    pub fn name(self) -> &'static str {
        match self {
            Variant::OneWay => "one-way",
            Variant::BothWays => "both",
            Variant::OneD => "1-d",
            Variant::TwoD => "2-d",
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
