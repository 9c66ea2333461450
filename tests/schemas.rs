//! The published JSON Schemas (`docs/schemas/`): generated from the document types, and every
//! document the repository holds validates against them and reads back as its type.
//!
//! When a document type changes, regenerate the files with
//! `PEERLINK_BLESS=1 cargo test --release --test schemas` and commit them with the change.

use peerlink::document::schemas::{file_name, PRESET_FILE};
use peerlink::report::schemas::published;
use serde_json::Value;
use std::path::{Path, PathBuf};

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn schema_dir() -> PathBuf {
    repo().join("docs/schemas")
}

#[test]
fn committed_schemas_are_the_ones_the_code_generates() {
    let bless = std::env::var_os("PEERLINK_BLESS").is_some();
    let mut differing = Vec::new();
    let generated = published();
    for published in &generated {
        let path = schema_dir().join(&published.file);
        let text = serde_json::to_string_pretty(&published.schema).unwrap() + "\n";
        if bless {
            std::fs::create_dir_all(schema_dir()).unwrap();
            std::fs::write(&path, &text).unwrap();
        } else if std::fs::read_to_string(&path).ok().as_deref() != Some(&text) {
            differing.push(published.file.clone());
        }
    }
    // A schema the code no longer generates is stale.
    for entry in std::fs::read_dir(schema_dir()).unwrap() {
        let name = entry.unwrap().file_name().to_string_lossy().to_string();
        if !generated.iter().any(|p| p.file == name) {
            if bless {
                std::fs::remove_file(schema_dir().join(&name)).unwrap();
            } else {
                differing.push(format!("{name} (no document has it)"));
            }
        }
    }
    assert!(
        differing.is_empty(),
        "docs/schemas differs from the document types (regenerate with PEERLINK_BLESS=1 cargo test \
         --release --test schemas): {}",
        differing.join(", ")
    );
}

/// Every `.json` file under `dir`, recursively, sorted.
fn json_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(json_files(&path));
        } else if path.extension().is_some_and(|e| e == "json") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Which published schema a JSON file must satisfy, or `None` where peerlink did not write it.
///
/// Every document peerlink writes has `schema` and `source`; one with a `schema` but no `source`
/// comes from another tool (the PyTorch side-by-side script). A JSON object without `schema` is a
/// simulator preset, the one format peerlink reads that has none.
fn schema_file_for(doc: &Value) -> Option<String> {
    match (doc.get("schema"), doc.get("source")) {
        (Some(schema), Some(_)) => Some(file_name(schema.as_str().unwrap_or_default())),
        (Some(_), None) => None,
        (None, _) => Some(PRESET_FILE.to_string()),
    }
}

/// Validates every file in `files` and reads it as peerlink does, returning what failed.
fn validate_all(files: &[PathBuf]) -> (usize, Vec<String>) {
    let schemas = published();
    let mut checked = 0;
    let mut failures = Vec::new();
    for path in files {
        let shown = path.strip_prefix(repo()).unwrap_or(path).display();
        let text = std::fs::read_to_string(path).unwrap();
        let doc: Value =
            serde_json::from_str(&text).unwrap_or_else(|e| panic!("{shown} is not JSON: {e}"));
        let Some(file) = schema_file_for(&doc) else {
            continue;
        };
        let Some(published) = schemas.iter().find(|p| p.file == file) else {
            failures.push(format!("{shown}: no published schema {file}"));
            continue;
        };
        let validator = jsonschema::validator_for(&published.schema).unwrap();
        for error in validator.iter_errors(&doc).take(3) {
            failures.push(format!("{shown} at {}: {error}", error.instance_path()));
        }
        if let Err(why) = (published.read)(&text) {
            failures.push(format!("{shown}: peerlink cannot read it: {why}"));
        }
        checked += 1;
    }
    (checked, failures)
}

#[test]
fn every_committed_document_validates_against_its_schema_and_reads_back() {
    let files = json_files(&repo().join("benchmarks"));
    let (checked, failures) = validate_all(&files);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert!(
        checked > 50,
        "only {checked} documents under benchmarks/ were checked"
    );
}

#[test]
fn the_embedded_presets_and_the_golden_outputs_validate_too() {
    let mut files = json_files(&repo().join("src/topology/presets"));
    files.extend(json_files(&repo().join("tests/golden")));
    // The doctor's fault presets: the preset format, faults and all.
    files.extend(json_files(&repo().join("tests/fixtures/doctor")));
    let (checked, failures) = validate_all(&files);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(checked, files.len());
}

#[test]
fn a_document_that_breaks_its_schema_is_caught() {
    let golden = repo().join("tests/golden/dgx1-v100.plan.json");
    let mut doc: Value = serde_json::from_str(&std::fs::read_to_string(golden).unwrap()).unwrap();
    doc["strategy"] = "teleport".into();
    doc["source"] = "gpu".into();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("broken.json");
    std::fs::write(&path, doc.to_string()).unwrap();
    let (_, failures) = validate_all(&[path]);
    // Two schema violations, and peerlink's own reading refuses it.
    assert_eq!(failures.len(), 3, "{failures:?}");
}
