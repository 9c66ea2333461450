//! The header every document opens with: what it is, where its figures come from, and which
//! peerlink wrote it, when, where and on what GPUs.

use crate::topology::sysfs::Sysfs;
use crate::topology::{Device, Source, Topology};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::time::{SystemTime, UNIX_EPOCH};

/// The peerlink that writes documents: the package version, and the git commit it was built from
/// (`unknown` outside a git checkout; see `build.rs`).
pub const PEERLINK_VERSION: &str = env!("CARGO_PKG_VERSION");
pub const COMMIT: &str = env!("PEERLINK_COMMIT");

/// One GPU of the host, as every document names it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct HostGpu {
    /// CUDA device ordinal (after CUDA_VISIBLE_DEVICES).
    pub index: usize,
    pub name: String,
    pub uuid: String,
    /// PCI bus id as NVML and `nvidia-smi -q` write it, `00000000:18:00.0`.
    pub pci_bus_id: String,
}

impl From<&Device> for HostGpu {
    fn from(d: &Device) -> Self {
        HostGpu {
            index: d.index,
            name: d.name.clone(),
            uuid: d.uuid.clone(),
            pci_bus_id: d.pci_bus_id.clone(),
        }
    }
}

/// The fields every document carries at its top level, beside its own.
///
/// peerlink writes every field. Documents written before the header existed have only `schema`
/// and `source` (and most `simulated`), so a reader takes the rest as optional: the published
/// schemas say the same, and the documents under `benchmarks/` still validate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Header {
    /// What the document is and the version of its shape: `peerlink.<verb>/<n>`.
    pub schema: String,
    pub source: Source,
    /// Whether the figures come from the simulator (`source` is `sim:<preset>`).
    #[serde(default)]
    pub simulated: bool,
    /// The version of the peerlink that wrote the document.
    #[serde(default)]
    pub peerlink_version: Option<String>,
    /// The git commit that peerlink was built from, `unknown` when built outside a git checkout.
    #[serde(default)]
    pub commit: Option<String>,
    /// When the document was written: UTC, RFC 3339 (`2026-11-30T06:00:00Z`).
    #[serde(default)]
    pub time: Option<String>,
    /// The name of the machine that wrote it, where known.
    #[serde(default)]
    pub host: Option<String>,
    /// The NVIDIA driver's version (NVML), where known; `null` on the simulator.
    #[serde(default)]
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports (`13.0`), where known; `null` on the simulator.
    #[serde(default)]
    pub cuda_version: Option<String>,
    /// Every GPU of the host in CUDA order, whichever of them the document is about; the
    /// simulator's are its preset's.
    #[serde(default)]
    pub host_gpus: Vec<HostGpu>,
    /// The run was interrupted (Ctrl-C, SIGTERM): the document holds what was measured before it
    /// stopped, and what it left out says "interrupted". Written only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub partial: bool,
}

impl Header {
    /// The header of a `schema` document about `host`, written now by this peerlink.
    pub fn new(schema: &str, host: &Topology) -> Header {
        Header {
            schema: schema.to_string(),
            source: host.source.clone(),
            simulated: host.source.is_simulated(),
            peerlink_version: None,
            commit: None,
            time: None,
            host: None,
            driver_version: host.driver_version.clone(),
            cuda_version: host.cuda_version.clone(),
            host_gpus: host.devices.iter().map(HostGpu::from).collect(),
            partial: false,
        }
        .written_now()
    }

    /// The header of a `schema` document made from another document (`compare`): its source and
    /// GPUs, written now by this peerlink.
    pub fn after(schema: &str, other: &Header) -> Header {
        Header {
            schema: schema.to_string(),
            simulated: other.source.is_simulated(),
            ..other.clone()
        }
        .written_now()
    }

    /// The header with this peerlink, this machine and the time now as its writer.
    fn written_now(self) -> Header {
        Header {
            peerlink_version: Some(PEERLINK_VERSION.to_string()),
            commit: Some(COMMIT.to_string()),
            time: Some(rfc3339(SystemTime::now())),
            host: Sysfs::system().host_name(),
            partial: crate::interrupt::requested(),
            ..self
        }
    }
}

/// `time` in UTC as RFC 3339, to the second: `2026-11-30T06:00:00Z`.
pub fn rfc3339(time: SystemTime) -> String {
    let secs = time.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let of_day = secs % 86_400;
    format!(
        "{}T{:02}:{:02}:{:02}Z",
        utc_date(time),
        of_day / 3600,
        of_day % 3600 / 60,
        of_day % 60
    )
}

/// The UTC calendar date of `time`, `YYYY-MM-DD` (Howard Hinnant's days-to-civil algorithm).
pub fn utc_date(time: SystemTime) -> String {
    let days = time
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() / 86_400) as i64;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topology::test_support::device;
    use std::time::Duration;

    #[test]
    fn dates_are_utc_calendar_days() {
        let at = |secs: u64| utc_date(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01");
        assert_eq!(at(1_704_067_200), "2024-01-01");
        assert_eq!(at(1_709_164_800), "2024-02-29");
        assert_eq!(at(1_764_374_399), "2025-11-28");
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        let at = |secs: u64| rfc3339(UNIX_EPOCH + Duration::from_secs(secs));
        assert_eq!(at(0), "1970-01-01T00:00:00Z");
        assert_eq!(at(1_764_374_399), "2025-11-28T23:59:59Z");
        assert_eq!(at(1_709_164_800 + 3_723), "2024-02-29T01:02:03Z");
    }

    #[test]
    fn a_new_header_names_the_writer_and_every_gpu() {
        let host = Topology {
            source: Source::Sim("test".into()),
            driver_version: None,
            cuda_version: None,
            visible_devices: None,
            devices: vec![device(0, Some(0), "0000:18:00.0"), device(1, None, "x")],
            pairs: Vec::new(),
            network: None,
        };
        let header = Header::new("peerlink.topo/1", &host);
        assert!(header.simulated);
        assert_eq!(header.peerlink_version.as_deref(), Some(PEERLINK_VERSION));
        assert!(!COMMIT.is_empty());
        assert_eq!(header.time.as_ref().map(String::len), Some(20));
        assert_eq!(header.host_gpus.len(), 2);
        assert_eq!(header.host_gpus[0].pci_bus_id, "0000:18:00.0");
        assert_eq!(header.host_gpus[1].uuid, "GPU-test-1");

        // Every field is written, the unknown ones as null.
        let json = serde_json::to_value(&header).unwrap();
        for key in [
            "schema",
            "source",
            "simulated",
            "peerlink_version",
            "commit",
            "time",
            "host",
            "driver_version",
            "cuda_version",
            "host_gpus",
        ] {
            assert!(json.get(key).is_some(), "the header lacks {key}");
        }
        assert_eq!(json["source"], "sim:test");
        assert_eq!(json["driver_version"], serde_json::Value::Null);

        let after = Header::after("peerlink.compare/1", &header);
        assert_eq!(after.schema, "peerlink.compare/1");
        assert_eq!(after.host_gpus, header.host_gpus);
    }
}
