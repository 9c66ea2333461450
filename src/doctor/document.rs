//! `peerlink doctor --json`: the `peerlink.doctor/1` document.

use super::{Burst, Check, Report, Verdict};
use crate::document::{impl_document, Document, Header};
use crate::topology::Topology;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Every check with its evidence, verdict and fix, and the traffic burst between the error
/// counters' two readings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct DoctorDocument {
    #[serde(flatten)]
    pub header: Header,
    /// The GPUs checked (`--devices`, all by default).
    pub devices: Vec<usize>,
    /// What crossed the links between the two readings of the counters; `null` where there was
    /// no burst (`no_burst` says why).
    pub burst: Option<Burst>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub no_burst: Option<String>,
    /// Host checks first, then each pair of GPUs, then each kind of GPU check GPU by GPU.
    pub checks: Vec<Check>,
    /// How many checks came out each way.
    pub summary: Summary,
    /// Whether any check failed: `peerlink doctor` exits 1 exactly then.
    pub failed: bool,
    pub notes: Vec<String>,
}

/// Checks by verdict.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Summary {
    pub fail: usize,
    pub warn: usize,
    pub info: usize,
    pub ok: usize,
}

impl_document!(DoctorDocument, "peerlink.doctor/1");

impl DoctorDocument {
    pub fn new(host: &Topology, report: Report) -> DoctorDocument {
        let count = |v: Verdict| report.checks.iter().filter(|c| c.verdict == v).count();
        DoctorDocument {
            header: Header::new(Self::SCHEMA, host),
            devices: report.devices.clone(),
            summary: Summary {
                fail: count(Verdict::Fail),
                warn: count(Verdict::Warn),
                info: count(Verdict::Info),
                ok: count(Verdict::Ok),
            },
            failed: report.failed(),
            no_burst: report.burst.as_ref().err().cloned(),
            burst: report.burst.ok(),
            checks: report.checks,
            notes: report.notes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::SimBackend;
    use crate::backend::Backend;
    use crate::doctor::{run, Options};
    use crate::document::{read, to_json};

    #[test]
    fn the_document_counts_verdicts_and_reads_back() {
        let sim = SimBackend::open("h200-pair").unwrap();
        let report = run(&sim, &Options::default(), &crate::bench::progress::Silent).unwrap();
        let doc = DoctorDocument::new(sim.topology(), report);
        assert_eq!(doc.header.schema, DoctorDocument::SCHEMA);
        assert!(doc.header.simulated);
        let total = doc.summary.fail + doc.summary.warn + doc.summary.info + doc.summary.ok;
        assert_eq!(total, doc.checks.len());
        assert_eq!(doc.failed, doc.summary.fail > 0);
        assert!(doc.burst.is_some(), "{:?}", doc.no_burst);
        let back: DoctorDocument = read(&to_json(&doc)).unwrap();
        assert_eq!(back, doc);
    }
}
