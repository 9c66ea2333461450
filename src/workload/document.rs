//! `peerlink workload --json`: the `peerlink.workload/1` document.

use super::kinds::{ProcessLayout, Workload};
use super::rows::{Report, Row};
use crate::document::{impl_document, Document, Header};
use crate::topology::Topology;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// One workload over a size sweep: every contender at every size, measured and verified.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct WorkloadDocument {
    #[serde(flatten)]
    pub header: Header,
    pub workload: Workload,
    /// The GPUs, rank `i` on `devices[i]`.
    pub devices: Vec<usize>,
    /// Whether the ranks were threads of one process or a process each.
    #[serde(default)]
    pub process_layout: ProcessLayout,
    /// How every row was timed.
    pub timing: String,
    /// Untimed operations before each window.
    pub warmup: u32,
    /// How `busbw_gbps` follows from `algbw_gbps` for this workload.
    pub busbw_rule: String,
    /// All-reduce: the largest regret of the cost model's pick over the sweep.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worst_regret: Option<f64>,
    /// What was left out, and why (NCCL missing, pairs without P2P, graphs not available), and
    /// the simulator's defaults: one sentence each.
    pub notices: Vec<String>,
    pub rows: Vec<Row>,
}

impl_document!(WorkloadDocument, "peerlink.workload/1");

impl WorkloadDocument {
    pub fn new(host: &Topology, report: &Report) -> WorkloadDocument {
        WorkloadDocument {
            header: Header::new(Self::SCHEMA, host),
            workload: report.workload,
            devices: report.devices.clone(),
            process_layout: report.process_layout,
            timing: report.timing.to_string(),
            warmup: report.warmup,
            busbw_rule: report.workload.busbw_rule().to_string(),
            worst_regret: report.worst_regret(),
            notices: report.notices.clone(),
            rows: report.rows.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::test_support::three_gpus;
    use crate::workload::kinds::{Contender, IssueMode};

    #[test]
    fn json_names_the_workload_and_every_row_is_labelled() {
        let row = Row {
            workload: Workload::AllReduce,
            variant: None,
            bytes: 4096,
            contender: Contender::PeerlinkPick,
            algorithm: "one-shot".into(),
            dtype: Some(crate::backend::collective::DataType::Bf16),
            issue: IssueMode::Graphs,
            iters: 20,
            time_us: 4.0,
            algbw_gbps: 1.024,
            busbw_gbps: 1.024,
            verified: true,
            simulated: true,
            vs_nccl: Some(1.5),
            vs_nccl_symmetric: None,
            predicted_us: Some(3.5),
            regret: Some(0.0),
            compute_us: None,
            exposed_us: None,
        };
        let report = Report {
            source: three_gpus().source,
            workload: Workload::AllReduce,
            devices: vec![0, 1],
            process_layout: ProcessLayout::RankPerProcess,
            warmup: 5,
            timing: crate::workload::timing::TIMING,
            rows: vec![row],
            notices: vec!["NCCL's rows are left out: none".into()],
        };
        let doc = WorkloadDocument::new(&three_gpus(), &report);
        let json = serde_json::to_value(&doc).unwrap();
        assert_eq!(json["schema"], "peerlink.workload/1");
        assert_eq!(json["process_layout"], "rank-per-process");
        assert_eq!(json["simulated"], true);
        assert_eq!(json["workload"], "all-reduce");
        assert_eq!(json["worst_regret"], 0.0);
        let row = &json["rows"][0];
        assert_eq!(row["contender"], "peerlink-pick");
        assert_eq!(row["dtype"], "bf16");
        assert_eq!(row["issue"], "graphs");
        assert_eq!(row["simulated"], true);
        assert!(row.get("variant").is_none() && row.get("exposed_us").is_none());
        let back: WorkloadDocument =
            crate::document::read(&crate::document::to_json(&doc)).unwrap();
        assert_eq!(back, doc);
    }
}
