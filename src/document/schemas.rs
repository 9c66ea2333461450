//! The JSON Schemas of the documents, generated from their types and published as
//! `docs/schemas/<schema>.schema.json` (`peerlink.bench/1` → `peerlink.bench-1.schema.json`).
//! The list of every published schema is the report's (`report::schemas::published`), which sees
//! every verb's documents; here is how one is made.
//!
//! Each schema describes what a reader accepts: a document written before the header existed lacks
//! most of it, and still validates. A test (`tests/schemas.rs`) fails when the committed files
//! drift from these types (`PEERLINK_BLESS=1 cargo test --release --test schemas` rewrites them)
//! and validates every committed document under `benchmarks/` against its schema.

use super::Document;
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

/// A document's schema, its `schema` field pinned to the document's name.
pub fn of<D: Document>() -> Published {
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

/// The schema of `T`, titled `title`.
pub fn titled<T: schemars::JsonSchema>(title: &str) -> Value {
    let mut schema = schemars::schema_for!(T).to_value();
    schema["title"] = json!(title);
    schema
}
