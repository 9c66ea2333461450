//! What a run finds: a row per contender and size, its bandwidths, NCCL's comparison, and the
//! report of the whole run.

use super::kinds::{Contender, IssueMode, ProcessLayout, Variant, Workload};
use crate::backend::collective::DataType;
use crate::topology::Source;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One contender at one size, measured and verified.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Row {
    pub workload: Workload,
    /// send-recv's direction or halo's decomposition; absent for the others.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<Variant>,
    /// Bytes of one operation: the buffer reduced, the message, the activation, the face.
    pub bytes: u64,
    pub contender: Contender,
    /// What ran: peerlink's kernel, the engine's strategy, the copies, or the NCCL calls.
    pub algorithm: String,
    /// The element type reduced (all-reduce only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dtype: Option<DataType>,
    pub issue: IssueMode,
    /// Timed operations (steps) per window.
    pub iters: u32,
    /// GPU µs per operation: the slowest rank's window over `iters`.
    pub time_us: f64,
    pub algbw_gbps: f64,
    /// See the workload's rule (`busbw_rule` in the document).
    pub busbw_gbps: f64,
    /// Every byte of the contender's results matched the host's expectation (a mismatch stops the
    /// run with an error instead).
    pub verified: bool,
    /// The figures come from the simulator, not from hardware.
    pub simulated: bool,
    /// Plain NCCL's fastest row's time at this size (and variant) over this row's (contender
    /// `nccl`, ordinary buffers): above 1 where peerlink is faster. Peerlink's rows only, where
    /// NCCL ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_nccl: Option<f64>,
    /// The same against NCCL with symmetric windows (contender `nccl-symmetric`), where it ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vs_nccl_symmetric: Option<f64>,
    /// The cost model's prediction for the picked kernel, µs (the pick's row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_us: Option<f64>,
    /// The picked kernel's time over the faster measured kernel's − 1 (the pick's row).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regret: Option<f64>,
    /// The stand-in compute kernel's time alone per step, µs (pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compute_us: Option<f64>,
    /// Step time − compute alone, µs: the communication the overlap did not hide (pipeline).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exposed_us: Option<f64>,
}

/// What a row measured, before the run's context is added.
#[derive(Clone, Debug, PartialEq)]
pub struct Measured {
    pub variant: Option<Variant>,
    pub bytes: u64,
    pub contender: Contender,
    pub algorithm: String,
    pub issue: IssueMode,
    pub iters: u32,
    pub time_us: f64,
}

impl Measured {
    /// `time_us` per operation of `iters` issued from the host on the rank's stream, for a
    /// workload without variants.
    pub fn on_stream(
        bytes: u64,
        contender: Contender,
        algorithm: &str,
        iters: u32,
        time_us: f64,
    ) -> Measured {
        Measured {
            variant: None,
            bytes,
            contender,
            algorithm: algorithm.to_string(),
            issue: IssueMode::Stream,
            iters,
            time_us,
        }
    }
}

/// Everything one `peerlink workload` run found.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub source: Source,
    pub workload: Workload,
    pub devices: Vec<usize>,
    pub process_layout: ProcessLayout,
    /// Untimed operations before each window.
    pub warmup: u32,
    /// How every row was timed, in words ([`super::timing::TIMING`], or the way across processes).
    pub timing: &'static str,
    pub rows: Vec<Row>,
    /// What was left out and why (NCCL missing, pairs without P2P, graphs not available), and the
    /// simulator's defaults: one sentence each.
    pub notices: Vec<String>,
}

impl Report {
    /// The worst regret of the all-reduce pick over the sweep, where it was measured.
    pub fn worst_regret(&self) -> Option<f64> {
        self.rows.iter().filter_map(|r| r.regret).reduce(f64::max)
    }
}

/// Bus bandwidth from algorithm bandwidth: an all-reduce over `ranks` moves 2(n−1)/n of its
/// buffer over each rank's links (nccl-tests' factor); the other workloads move each byte once.
pub fn busbw(workload: Workload, algbw_gbps: f64, ranks: usize) -> f64 {
    match workload {
        Workload::AllReduce => algbw_gbps * 2.0 * (ranks as f64 - 1.0) / ranks as f64,
        Workload::SendRecv | Workload::Pipeline | Workload::Halo => algbw_gbps,
    }
}

/// A row from a measurement: bandwidths derived, NCCL's comparison added later by [`compare`].
pub(crate) fn row(
    workload: Workload,
    ranks: usize,
    simulated: bool,
    dtype: Option<DataType>,
    m: Measured,
) -> Row {
    let algbw_gbps = crate::units::gbps(m.bytes, m.time_us);
    Row {
        workload,
        variant: m.variant,
        bytes: m.bytes,
        contender: m.contender,
        algorithm: m.algorithm,
        dtype,
        issue: m.issue,
        iters: m.iters,
        time_us: m.time_us,
        algbw_gbps,
        busbw_gbps: busbw(workload, algbw_gbps, ranks),
        verified: true,
        simulated,
        vs_nccl: None,
        vs_nccl_symmetric: None,
        predicted_us: None,
        regret: None,
        compute_us: None,
        exposed_us: None,
    }
}

/// Sets each peerlink row's `vs_nccl` and `vs_nccl_symmetric`: the fastest row of plain NCCL, and
/// of NCCL with symmetric windows, of its size and variant over it.
pub(crate) fn compare(rows: &mut [Row]) {
    let best = |rows: &[Row], nccl: Contender, of: &Row| {
        rows.iter()
            .filter(|r| r.contender == nccl && r.bytes == of.bytes && r.variant == of.variant)
            .map(|r| r.time_us)
            .reduce(f64::min)
            .map(|time_us| time_us / of.time_us)
    };
    let ratios: Vec<(Option<f64>, Option<f64>)> = rows
        .iter()
        .map(|r| match r.contender.is_peerlink() {
            true => (
                best(rows, Contender::Nccl, r),
                best(rows, Contender::NcclSymmetric, r),
            ),
            false => (None, None),
        })
        .collect();
    for (row, (plain, symmetric)) in rows.iter_mut().zip(ratios) {
        row.vs_nccl = plain;
        row.vs_nccl_symmetric = symmetric;
    }
}
