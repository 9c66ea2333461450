//! The JSON Schemas of the documents, generated from their types and published as
//! `docs/schemas/<schema>.schema.json` (`peerlink.bench/1` → `peerlink.bench-1.schema.json`).
//!
//! Each schema describes what a reader accepts: a document written before the header existed lacks
//! most of it, and still validates. A test (`tests/schemas.rs`) fails when the committed files
//! drift from these types (`PEERLINK_BLESS=1 cargo test --release --test schemas` rewrites them)
//! and validates every committed document under `benchmarks/` against its schema.

use super::bench::{BenchDocument, ExplainDocument};
use super::check::CheckDocument;
use super::compare::CompareDocument;
use super::doctor::DoctorDocument;
use super::plan::{PlanBatchDocument, PlanConcurrentDocument, PlanDocument, PlanSweepDocument};
use super::topo::TopoDocument;
use super::workload::WorkloadDocument;
use super::Document;
use crate::backend::sim::Preset;
use crate::model::Profile;
use serde_json::{json, Value};

/// The file the simulator preset format's schema is published as. A preset has no `schema`
/// field: it is an input users write by hand, where an unknown field is an error.
pub const PRESET_FILE: &str = "peerlink.sim-preset.schema.json";

/// The file a document's schema is published as: `peerlink.bench/1` → `peerlink.bench-1.schema.json`.
pub fn file_name(schema: &str) -> String {
    format!("{}.schema.json", schema.replace('/', "-"))
}

/// One published schema, and how peerlink reads what it describes.
pub struct Published {
    /// The file under `docs/schemas/`.
    pub file: String,
    pub schema: Value,
    /// Reads a text as peerlink does (`compare`, `plan --profile`, `--sim FILE`): the sentence
    /// saying why it cannot, if it cannot.
    pub read: fn(&str) -> Result<(), String>,
}

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

/// A document's schema, its `schema` field pinned to the document's name.
fn of<D: Document>() -> Published {
    let mut schema = titled::<D>(D::SCHEMA);
    schema["properties"]["schema"] = json!({
        "description": "What the document is and the version of its shape.",
        "const": D::SCHEMA,
    });
    Published {
        file: file_name(D::SCHEMA),
        schema,
        read: |text| super::read::<D>(text).map(drop).map_err(|e| e.to_string()),
    }
}

fn titled<T: schemars::JsonSchema>(title: &str) -> Value {
    let mut schema = schemars::schema_for!(T).to_value();
    schema["title"] = json!(title);
    schema
}

#[cfg(test)]
mod tests {
    use super::*;

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
