//! The JSON document core: the header every document opens with, the schema names, and reading
//! and writing documents — no rendering.
//!
//! A document opens with the same [`Header`] — `schema` (`peerlink.<verb>/<n>`), `source` (`cuda`
//! or `sim:<preset>`), `simulated`, and who wrote it, when, where and on what GPUs — flattened into
//! its top level beside its own fields, so scripts find `schema` and `source` where they always
//! were. Each verb's document types live beside the verb and convert from its in-memory results;
//! reading one back ([`read`]) checks its `schema` first. The JSON Schemas published under
//! `docs/schemas/` are generated from these types ([`schemas`]), and a test keeps the committed
//! files in step.
//!
//! The documents: [`topo::TopoDocument`] (here, as the topology is below this layer),
//! `bench::document::{BenchDocument, ExplainDocument}`, `bench::proof::document`'s four plan
//! documents, `model::Profile` (from `tune`, read by `plan --profile`),
//! `bench::compare::CompareDocument`, `workload::document::WorkloadDocument`,
//! `doctor::document::DoctorDocument` and `check::document::CheckDocument`. A simulator preset
//! ([`crate::backend::sim::Preset`]) is an input users write, with no header, but its schema is
//! published beside theirs. Their tables (for the exports) and text are the report's.

mod header;
pub mod schemas;
pub mod topo;

pub use header::{rfc3339, utc_date, Header, HostGpu, COMMIT, PEERLINK_VERSION};

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::fmt;

/// A document type: its schema name and its header.
pub trait Document: Serialize + DeserializeOwned + JsonSchema {
    /// `peerlink.<verb>/<n>`: what the document is and the version of its shape.
    const SCHEMA: &'static str;

    fn header(&self) -> &Header;

    fn header_mut(&mut self) -> &mut Header;
}

/// Implements [`Document`] for a type whose header is its `header` field.
macro_rules! impl_document {
    ($type:ty, $schema:literal) => {
        impl $crate::document::Document for $type {
            const SCHEMA: &'static str = $schema;

            fn header(&self) -> &$crate::document::Header {
                &self.header
            }

            fn header_mut(&mut self) -> &mut $crate::document::Header {
                &mut self.header
            }
        }
    };
}
pub(crate) use impl_document;

/// Why a text could not be read as a document of the expected kind.
#[derive(Debug)]
pub enum ReadError {
    NotJson(serde_json::Error),
    /// Another document, or none: the `schema` found (if any) and the one expected.
    OtherSchema {
        found: Option<String>,
        expected: &'static str,
    },
    /// The right `schema`, but fields missing or of the wrong type.
    Malformed {
        expected: &'static str,
        error: serde_json::Error,
    },
}

impl fmt::Display for ReadError {
    /// A phrase to follow "`FILE` is": "not JSON (…)", "not a `peerlink.bench/1` document (…)".
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReadError::NotJson(e) => write!(f, "not JSON ({e})"),
            ReadError::OtherSchema {
                found: Some(found),
                expected,
            } => write!(f, "not a `{expected}` document (its schema is `{found}`)"),
            ReadError::OtherSchema {
                found: None,
                expected,
            } => write!(f, "not a `{expected}` document (it has no `schema` string)"),
            ReadError::Malformed { expected, error } => {
                write!(f, "not a well-formed `{expected}` document ({error})")
            }
        }
    }
}

impl std::error::Error for ReadError {}

/// Reads a `D` document from JSON text, its `schema` checked before its fields; its strings are
/// read as [`crate::echo::printable`] leaves them (a document's names are echoed).
pub fn read<D: Document>(text: &str) -> Result<D, ReadError> {
    let value = parse_refusing_duplicate_keys(text).map_err(ReadError::NotJson)?;
    let found = value.get("schema").and_then(|s| s.as_str());
    if found != Some(D::SCHEMA) {
        return Err(ReadError::OtherSchema {
            found: found.map(str::to_string),
            expected: D::SCHEMA,
        });
    }
    let mut doc: D = serde_json::from_value(value).map_err(|error| ReadError::Malformed {
        expected: D::SCHEMA,
        error,
    })?;
    // A document written before `simulated` was in every header lacks it; its source says it.
    let header = doc.header_mut();
    header.simulated = header.source.is_simulated();
    Ok(doc)
}

/// JSON text as a value, refusing an object that names a key twice: serde_json would keep the last
/// in silence, so a hand-edited document could say two things and be read as one of them.
fn parse_refusing_duplicate_keys(text: &str) -> serde_json::Result<serde_json::Value> {
    serde_json::from_str::<UniqueKeys>(text).map(|parsed| parsed.0)
}

/// A JSON value whose objects name each key once.
struct UniqueKeys(serde_json::Value);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(UniqueKeysVisitor).map(UniqueKeys)
    }
}

struct UniqueKeysVisitor;

impl<'de> serde::de::Visitor<'de> for UniqueKeysVisitor {
    type Value = serde_json::Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_i64<E>(self, v: i64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_u64<E>(self, v: u64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    fn visit_f64<E>(self, v: f64) -> Result<Self::Value, E> {
        Ok(v.into())
    }

    // A document's text is echoed (report, compare, check): it is read without the control
    // characters and bidirectional overrides a hand-edited file may hold (`crate::echo`).
    fn visit_str<E>(self, v: &str) -> Result<Self::Value, E> {
        Ok(crate::echo::printable(v).into())
    }

    fn visit_string<E>(self, v: String) -> Result<Self::Value, E> {
        Ok(match crate::echo::printable(&v) {
            std::borrow::Cow::Borrowed(_) => v,
            std::borrow::Cow::Owned(clean) => clean,
        }
        .into())
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(serde_json::Value::Null)
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        let mut items = Vec::new();
        while let Some(UniqueKeys(item)) = seq.next_element()? {
            items.push(item);
        }
        Ok(serde_json::Value::Array(items))
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut object = serde_json::Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if object.contains_key(&key) {
                return Err(serde::de::Error::custom(format!("duplicate key `{key}`")));
            }
            let UniqueKeys(value) = map.next_value()?;
            object.insert(key, value);
        }
        Ok(serde_json::Value::Object(object))
    }
}

/// A document as `--json` prints it: pretty, one JSON value.
pub fn to_json<D: Document>(doc: &D) -> String {
    serde_json::to_string_pretty(doc).expect("a document always serialises")
}

#[cfg(test)]
mod tests {
    use super::topo::TopoDocument;
    use super::*;

    #[test]
    fn reading_checks_the_schema_before_the_fields() {
        let err = read::<TopoDocument>("{").unwrap_err();
        assert!(err.to_string().starts_with("not JSON"), "{err}");
        let err = read::<TopoDocument>(r#"{"schema": "peerlink.bench/1"}"#).unwrap_err();
        assert_eq!(
            err.to_string(),
            "not a `peerlink.topo/1` document (its schema is `peerlink.bench/1`)"
        );
        let err = read::<TopoDocument>("[]").unwrap_err();
        assert!(err.to_string().contains("no `schema`"), "{err}");
        let err = read::<TopoDocument>(r#"{"schema": "peerlink.topo/1"}"#).unwrap_err();
        assert!(err.to_string().contains("missing field"), "{err}");
    }

    #[test]
    fn a_key_named_twice_is_not_json_peerlink_reads() {
        let twice = r#"{"schema": "peerlink.topo/1", "a": {"b": [{"c": 1, "c": 2}]}}"#;
        let err = read::<TopoDocument>(twice).unwrap_err().to_string();
        assert!(err.starts_with("not JSON (duplicate key `c`"), "{err}");
        let once = r#"{"n": [1, -2, 3.5e300, "x", null, true, {"a": {}}], "m": {"n": 1}}"#;
        assert_eq!(
            parse_refusing_duplicate_keys(once).unwrap(),
            serde_json::from_str::<serde_json::Value>(once).unwrap()
        );
    }

    #[test]
    fn a_document_older_than_the_header_reads_with_what_it_has() {
        let old = r#"{"schema": "peerlink.topo/1", "source": "sim:old", "driver_version": null,
                      "visible_devices": null, "devices": [], "pairs": [], "warnings": []}"#;
        let doc = read::<TopoDocument>(old).unwrap();
        assert!(doc.header.simulated, "the source says it is simulated");
        assert_eq!(doc.header.time, None);
        assert!(doc.header.host_gpus.is_empty());
    }
}
