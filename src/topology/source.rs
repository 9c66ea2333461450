//! Where a host's figures come from: real GPUs, or the simulator running a preset.

use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

/// Where a host's figures come from. Written `cuda` or `sim:<preset>` (a document's `source`), so
/// that a script can tell a simulated figure from a measured one.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// Real GPUs, through the CUDA driver.
    Cuda,
    /// The simulator, running the preset of this name.
    Sim(String),
}

impl Source {
    /// Whether the figures come from the simulator.
    pub fn is_simulated(&self) -> bool {
        matches!(self, Source::Sim(_))
    }

    /// The simulator preset's name, or `None` for real GPUs.
    pub fn preset(&self) -> Option<&str> {
        match self {
            Source::Cuda => None,
            Source::Sim(name) => Some(name),
        }
    }
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Cuda => f.write_str("cuda"),
            Source::Sim(name) => write!(f, "sim:{name}"),
        }
    }
}

impl FromStr for Source {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.strip_prefix("sim:") {
            Some(name) if !name.is_empty() => Ok(Source::Sim(name.to_string())),
            _ if s == "cuda" => Ok(Source::Cuda),
            _ => Err(format!(
                "unknown source `{s}`: expected `cuda` or `sim:<preset>`"
            )),
        }
    }
}

impl Serialize for Source {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Source {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Source {
    fn schema_name() -> Cow<'static, str> {
        "Source".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Where the figures come from: `cuda` for real GPUs, `sim:<preset>` for \
                            the simulator running that preset.",
            "type": "string",
            "pattern": "^(cuda|sim:.+)$"
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_as_the_documents_write_it() {
        for (text, source) in [
            ("cuda", Source::Cuda),
            ("sim:dgx1-v100", Source::Sim("dgx1-v100".into())),
        ] {
            assert_eq!(text.parse::<Source>().unwrap(), source);
            assert_eq!(source.to_string(), text);
            let json = serde_json::to_string(&source).unwrap();
            assert_eq!(json, format!("\"{text}\""));
            assert_eq!(serde_json::from_str::<Source>(&json).unwrap(), source);
        }
        assert!(Source::Sim("x".into()).is_simulated());
        assert_eq!(Source::Sim("x".into()).preset(), Some("x"));
        assert!(!Source::Cuda.is_simulated());
    }

    #[test]
    fn refuses_anything_else() {
        for text in ["sim:", "CUDA", "gpu", ""] {
            assert!(text.parse::<Source>().is_err(), "{text}");
        }
    }
}
