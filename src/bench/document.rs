//! `peerlink bench --json` and `peerlink explain --json`: the `peerlink.bench/1` and
//! `peerlink.explain/1` documents, the header beside what the bench found.

use super::explain::Explanation;
use super::result::BenchReport;
use crate::document::{impl_document, Document, Header};
use crate::topology::Topology;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Bandwidth and latency per GPU pair (`tests`) and message-size sweeps (`sweeps`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BenchDocument {
    #[serde(flatten)]
    pub header: Header,
    #[serde(flatten)]
    pub results: BenchReport,
}

impl_document!(BenchDocument, "peerlink.bench/1");

impl BenchDocument {
    pub fn new(host: &Topology, results: BenchReport) -> BenchDocument {
        BenchDocument {
            header: Header::new(Self::SCHEMA, host),
            results,
        }
    }
}

/// Where one transfer's time goes, part by part, and what each fix would save.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct ExplainDocument {
    #[serde(flatten)]
    pub header: Header,
    #[serde(flatten)]
    pub explanation: Explanation,
}

impl_document!(ExplainDocument, "peerlink.explain/1");

impl ExplainDocument {
    pub fn new(host: &Topology, explanation: Explanation) -> ExplainDocument {
        ExplainDocument {
            header: Header::new(Self::SCHEMA, host),
            explanation,
        }
    }
}
