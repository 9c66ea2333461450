//! `peerlink check --json`: the `peerlink.check/1` document, the header beside what the check
//! found.

use super::CheckReport;
use crate::document::{impl_document, Document, Header};
use crate::topology::Topology;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Every figure of a short bench compared with a baseline or with reference figures, and the
/// verdict: `healthy`, or the figures that `regressed`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CheckDocument {
    #[serde(flatten)]
    pub header: Header,
    #[serde(flatten)]
    pub report: CheckReport,
}

impl_document!(CheckDocument, "peerlink.check/1");

impl CheckDocument {
    pub fn new(host: &Topology, report: CheckReport) -> CheckDocument {
        CheckDocument {
            header: Header::new(Self::SCHEMA, host),
            report,
        }
    }
}
