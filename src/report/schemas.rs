//! Every JSON Schema peerlink publishes under `docs/schemas/`: one per document of every verb, and
//! the simulator preset format's. The list lives here, above every verb, where it sees them all;
//! how one schema is made is the document core's ([`crate::document::schemas`]).

use crate::backend::sim::Preset;
use crate::bench::compare::CompareDocument;
use crate::bench::document::{BenchDocument, ExplainDocument};
use crate::bench::proof::document::{
    PlanBatchDocument, PlanConcurrentDocument, PlanDocument, PlanSweepDocument,
};
use crate::check::document::CheckDocument;
use crate::doctor::document::DoctorDocument;
use crate::document::schemas::{of, titled, Published, PRESET_FILE};
use crate::document::topo::TopoDocument;
use crate::model::Profile;
use crate::workload::document::WorkloadDocument;

/// Every published schema.
pub fn published() -> Vec<Published> {
    vec![
        of::<TopoDocument>(),
        of::<BenchDocument>(),
        of::<ExplainDocument>(),
        of::<PlanDocument>(),
        of::<PlanSweepDocument>(),
        of::<PlanBatchDocument>(),
        of::<PlanConcurrentDocument>(),
        of::<Profile>(),
        of::<CompareDocument>(),
        of::<WorkloadDocument>(),
        of::<DoctorDocument>(),
        of::<CheckDocument>(),
        Published {
            file: PRESET_FILE.to_string(),
            schema: titled::<Preset>("peerlink simulator preset"),
            read: |text| {
                Preset::parse(text, "preset")
                    .map(drop)
                    .map_err(|e| e.to_string())
            },
        },
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_document_has_its_own_file_and_pins_its_schema() {
        let all = published();
        let mut files: Vec<&str> = all.iter().map(|p| p.file.as_str()).collect();
        files.sort_unstable();
        files.dedup();
        assert_eq!(files.len(), all.len(), "two schemas share a file");
        let Published {
            file,
            schema: bench,
            ..
        } = of::<BenchDocument>();
        assert_eq!(file, "peerlink.bench-1.schema.json");
        assert_eq!(bench["properties"]["schema"]["const"], "peerlink.bench/1");
        let required = bench["required"].as_array().unwrap();
        for key in ["schema", "source", "tests", "sweeps"] {
            assert!(required.contains(&json!(key)), "{key} is not required");
        }
        // Documents older than the header lack the rest of it.
        assert!(!required.contains(&json!("time")));
    }
}
