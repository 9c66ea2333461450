//! A host profile: measured hop costs for one host, saved as a `peerlink.profile/1` document.
//!
//! A profile is only true for the GPUs and driver it was measured on, so it names them (GPU UUIDs in
//! index order, and the header's driver version) and [`Profile::check_matches`] refuses it anywhere
//! else. Files are written atomically (a temporary file in the same directory, then a rename), so a
//! reader never sees half a profile.
//!
//! The profile is the cost model's input, so it lives here; like every document it carries the
//! common [`Header`], and its schema is published with theirs ([`crate::report::schemas`]).

use super::{Cost, Hop, IssueCosts};
use crate::document::{self, impl_document, Document, Header};
use crate::files;
use crate::topology::Topology;
use crate::{Error, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::path::Path;

/// One measured hop.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Measured {
    #[serde(flatten)]
    pub hop: Hop,
    #[serde(flatten)]
    pub cost: Cost,
}

/// A direct hop's lone operation, measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Lone {
    #[serde(flatten)]
    pub hop: Hop,
    /// GPU time of one operation of a few bytes on an idle stream, from an event recorded just
    /// before it is queued to one recorded after it (the CPU's queuing included), in µs.
    pub lone_us: f64,
}

/// The host-staged route beside a direct copy, measured on one ordered pair: `tune` runs splits
/// of the direct copy-engine route and the host route at two sizes, times when the host route ends,
/// and fits the two figures with which the cost model's host route ends then. They replace the
/// planner's estimate ([`super::defaults::BESIDE_DIRECT_RATE_FRACTION`] and
/// [`super::defaults::BESIDE_DIRECT_CHUNK_US`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BesideDirect {
    pub src: usize,
    pub dst: usize,
    /// The host route's first hop (device → host on the source, whose copy engines also run the
    /// direct copy) moves its bytes at this fraction of its rate alone.
    pub rate_fraction: f64,
    /// And each of its chunks costs this much more, µs (below 0 where the route ran faster than
    /// the model prices it alone).
    pub chunk_us: f64,
    /// And the route takes this much more per transfer, µs (below 0 where its fixed costs are
    /// less than the model's defaults): fitted where the two figures above could not be (0 when
    /// absent).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub fixed_us: f64,
    /// The split's direct copy moved its bytes at this fraction of its hop's rate (1 when absent):
    /// its share is far larger than the copies its hop was fitted to.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub direct_rate_fraction: f64,
    /// And took this much more per transfer, µs (0 when absent).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub direct_fixed_us: f64,
    /// The splits the figures were fitted to.
    pub splits: Vec<HostRouteEnd>,
    /// The host route beside a direct copy while the pair's other direction runs the same at
    /// once, where measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub both_ways: Option<BothWays>,
}

/// The host route of a split while a split goes the opposite way at once (each GPU's PCIe link
/// carrying copies both ways): `tune` runs both directions' splits together and fits the fraction,
/// the one-way figures held. It replaces the planner's estimate
/// ([`super::defaults::HOST_BOTH_WAYS_FRACTION`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BothWays {
    /// Both of the host route's hops move their bytes at this fraction of their rate one way
    /// (beside a direct copy), in (0, 1].
    pub fraction: f64,
    /// This direction's splits, run while the other direction's ran, the fraction was fitted to.
    pub splits: Vec<HostRouteEnd>,
}

fn is_zero(value: &f64) -> bool {
    *value == 0.0
}

fn one() -> f64 {
    1.0
}

fn is_one(value: &f64) -> bool {
    *value == 1.0
}

/// When the host route of one measured split ended.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HostRouteEnd {
    pub split_bytes: u64,
    pub host_bytes: u64,
    pub chunk_bytes: u64,
    /// GPU µs from the split's start until the host route's last chunk ended (median).
    pub host_end_us: f64,
    /// GPU µs from the split's start until its direct copy ended (median), where kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direct_end_us: Option<f64>,
}

/// Measured costs of one host (`tune` writes it, `plan --profile` reads it).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Profile {
    /// Where and with what the measurements were taken; the profile fits only this header's
    /// driver (`driver_version`).
    #[serde(flatten)]
    pub header: Header,
    /// GPU UUIDs in CUDA index order.
    pub gpus: Vec<String>,
    pub hops: Vec<Measured>,
    /// Extra time per message in one batched copy kernel, where measured.
    pub batch_message_us: Option<f64>,
    /// Time per copy node of a replayed graph, where measured.
    pub graph_node_us: Option<f64>,
    /// CPU cost of queuing work, where measured.
    pub issue: Option<IssueCosts>,
    /// Lone small operations of direct hops, where measured: a single transfer pays a start-up
    /// that back-to-back operations (and so the hops' α) hide.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub lone: Vec<Lone>,
    /// The host-staged route's pace beside a direct copy, where measured (per ordered pair).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub beside_direct: Vec<BesideDirect>,
    /// The UTC date of the measurement (`YYYY-MM-DD`), where known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_on: Option<String>,
    /// How the figures were measured and what could not be, one sentence each.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl_document!(Profile, "peerlink.profile/1");

impl Profile {
    /// An empty profile for the host `topology` describes.
    pub fn for_host(topology: &Topology) -> Self {
        Profile {
            header: Header::new(Self::SCHEMA, topology),
            gpus: topology.devices.iter().map(|d| d.uuid.clone()).collect(),
            hops: Vec::new(),
            batch_message_us: None,
            graph_node_us: None,
            issue: None,
            lone: Vec::new(),
            beside_direct: Vec::new(),
            measured_on: None,
            notes: Vec::new(),
        }
    }

    /// Reads and checks a profile file.
    pub fn load(path: &Path) -> Result<Self> {
        let text = files::read_input(path)?;
        let bad = |why: String| {
            Error::usage(format!(
                "profile {}: {why}; measure a new one with `peerlink tune`",
                path.display()
            ))
        };
        let profile: Profile = document::read(&text).map_err(|why| bad(why.to_string()))?;
        profile.validate().map_err(bad)?;
        Ok(profile)
    }

    /// One sentence for the reader of a profile whose `tune` was interrupted (`"partial": true`):
    /// what it did not measure keeps the model's defaults.
    pub fn partial_note(&self, path: &Path) -> Option<String> {
        self.header.partial.then(|| {
            format!(
                "profile {} is partial: the `peerlink tune` that wrote it was interrupted, so the \
                 costs it did not measure keep the model's defaults",
                path.display()
            )
        })
    }

    /// Writes the profile atomically: a temporary file next to `path`, synced, then renamed over it.
    pub fn save(&self, path: &Path) -> Result<()> {
        write_atomically(path, &document::to_json(self))
    }

    /// Refuses a profile measured on other GPUs or another driver, saying which differs.
    pub fn check_matches(&self, topology: &Topology) -> Result<()> {
        let here: Vec<&str> = topology.devices.iter().map(|d| d.uuid.as_str()).collect();
        let there: Vec<&str> = self.gpus.iter().map(String::as_str).collect();
        if here != there {
            return Err(Error::usage(format!(
                "the profile was measured on GPUs [{}] but this host has [{}] (in CUDA index \
                 order); measure this host with `peerlink tune` or pass the profile made on it",
                there.join(", "),
                here.join(", ")
            )));
        }
        if self.header.driver_version != topology.driver_version {
            let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "unknown".into());
            return Err(Error::usage(format!(
                "the profile was measured with driver {} but this host runs driver {}; costs change \
                 with the driver, so measure again with `peerlink tune`",
                show(&self.header.driver_version),
                show(&topology.driver_version)
            )));
        }
        Ok(())
    }

    /// One line naming where the profile came from.
    pub fn describe(&self) -> String {
        format!(
            "{}{}, {} GPU{}, driver {}, {} hop{}",
            self.header.source,
            self.measured_on
                .as_deref()
                .map_or(String::new(), |d| format!(" on {d}")),
            self.gpus.len(),
            if self.gpus.len() == 1 { "" } else { "s" },
            self.header.driver_version.as_deref().unwrap_or("unknown"),
            self.hops.len(),
            if self.hops.len() == 1 { "" } else { "s" }
        )
    }

    fn validate(&self) -> std::result::Result<(), String> {
        if self.hops.is_empty() {
            return Err("it measured no hop, so it cannot price any transfer".to_string());
        }
        let n = self.gpus.len();
        let names_a_missing_gpu = |hop: Hop| {
            let devices = match hop {
                Hop::PeerCe { src, dst }
                | Hop::PeerSm { src, dst }
                | Hop::Resident { src, dst }
                | Hop::NetRdma { src, dst }
                | Hop::NetHost { src, dst } => vec![src, dst],
                Hop::DeviceToHost { device, .. }
                | Hop::HostToDevice { device, .. }
                | Hop::Local { device } => vec![device],
            };
            devices
                .into_iter()
                .find(|&d| d >= n)
                .map(|d| format!("{hop} names GPU {d} but the profile lists {n} GPUs"))
        };
        for m in &self.hops {
            if !m.cost.is_valid() {
                return Err(format!(
                    "{} has alpha_us {} and beta_gbps {}; alpha must be ≥ 0 and beta > 0, each below \
                     1e12",
                    m.hop, m.cost.alpha_us, m.cost.beta_gbps
                ));
            }
            if let Some(why) = names_a_missing_gpu(m.hop) {
                return Err(why);
            }
        }
        for l in &self.lone {
            if !(l.lone_us.is_finite() && l.lone_us > 0.0) {
                return Err(format!(
                    "{} has lone_us {}; it must be > 0",
                    l.hop, l.lone_us
                ));
            }
            if !matches!(
                l.hop,
                Hop::PeerCe { .. } | Hop::PeerSm { .. } | Hop::Resident { .. }
            ) {
                return Err(format!(
                    "{} has lone_us, which only direct peer and resident hops have",
                    l.hop
                ));
            }
            if let Some(why) = names_a_missing_gpu(l.hop) {
                return Err(why);
            }
        }
        for b in &self.beside_direct {
            if let Some(&gpu) = [b.src, b.dst].iter().find(|&&d| d >= n) {
                return Err(format!(
                    "beside_direct names GPU {gpu} but the profile lists {n} GPUs"
                ));
            }
            if !(b.rate_fraction.is_finite()
                && b.rate_fraction > 0.0
                && b.rate_fraction < MAX_RATE_FRACTION
                && b.chunk_us.abs() < MAX_CHUNK_US
                && b.fixed_us.abs() < MAX_CHUNK_US
                && b.direct_rate_fraction.is_finite()
                && b.direct_rate_fraction > 0.0
                && b.direct_rate_fraction < MAX_RATE_FRACTION
                && b.direct_fixed_us.abs() < MAX_CHUNK_US)
            {
                return Err(format!(
                    "beside_direct {}→{} has rate_fraction {}, chunk_us {}, fixed_us {}, \
                     direct_rate_fraction {} and direct_fixed_us {}; the fractions must be > 0 \
                     and below {MAX_RATE_FRACTION}, the costs within ±{MAX_CHUNK_US} µs",
                    b.src,
                    b.dst,
                    b.rate_fraction,
                    b.chunk_us,
                    b.fixed_us,
                    b.direct_rate_fraction,
                    b.direct_fixed_us
                ));
            }
            if let Some(f) = b
                .both_ways
                .as_ref()
                .map(|w| w.fraction)
                .filter(|f| !(f.is_finite() && *f > 0.0 && *f <= 1.0))
            {
                return Err(format!(
                    "beside_direct {}→{} has both_ways.fraction {f}; it must be in (0, 1]",
                    b.src, b.dst
                ));
            }
        }
        for (name, value) in [
            ("batch_message_us", self.batch_message_us),
            ("graph_node_us", self.graph_node_us),
        ] {
            if let Some(v) = value.filter(|v| !(v.is_finite() && *v >= 0.0)) {
                return Err(format!("{name} is {v}; it must be ≥ 0"));
            }
        }
        if self.issue.is_some_and(|i| !i.is_valid()) {
            return Err("an issue cost is negative or not a number; each must be ≥ 0".into());
        }
        Ok(())
    }
}

/// A rate this far above the model's route alone would be a measurement gone wrong, not a route
/// that runs faster beside a direct copy than on its own.
pub const MAX_RATE_FRACTION: f64 = 4.0;
/// Likewise a chunk cost this far from the model's (a chunk through the host takes tens of µs).
pub const MAX_CHUNK_US: f64 = 1000.0;

/// Ok where `path` (given as `flag`) can be written: it names a file, not a directory or a device,
/// in a directory that exists and takes new files. Checked before measuring, so that a long
/// measurement does not end in a write that cannot happen; refused with a usage error (exit 2).
pub fn check_destination(path: &Path, flag: &str) -> Result<()> {
    let refuse = |why: String| Err(Error::usage(format!("{flag} {}: {why}", path.display())));
    // `out/` (or `out/.`) names a directory, though a Path's file name drops the ending.
    let spelled = path.as_os_str().as_encoded_bytes();
    if !path.is_dir() && (spelled.ends_with(b"/") || spelled.ends_with(b"/.")) {
        return refuse("ends in `/`, so it names a directory: name a file".into());
    }
    if path.is_dir() {
        return Err(Error::usage(format!(
            "{flag} {} is a directory: name a file (in it, say)",
            path.display()
        )));
    }
    let Some((dir, temp)) = temporary_beside(path) else {
        return refuse("not a file name".into());
    };
    if !dir.is_dir() {
        return refuse(format!(
            "the directory {} does not exist; create it or choose another path",
            dir.display()
        ));
    }
    if path.exists() && !path.is_file() {
        return refuse("is not a regular file; choose another path".into());
    }
    // The file the write will create first: if it cannot be made now, it cannot be made then.
    match std::fs::File::create(&temp) {
        Ok(_) => {
            let _ = std::fs::remove_file(&temp);
            Ok(())
        }
        Err(e) => refuse(format!(
            "cannot create a file in {} ({e}); choose another path",
            dir.display()
        )),
    }
}

/// The directory `path` is in and the temporary file written there before it replaces `path`; None
/// where `path` names no file.
fn temporary_beside(path: &Path) -> Option<(&Path, std::path::PathBuf)> {
    let name = path.file_name()?;
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let temp = dir.join(format!(
        ".{}.tmp.{}",
        name.to_string_lossy(),
        std::process::id()
    ));
    Some((dir, temp))
}

/// Writes `text` and a final newline to `path` so that a reader sees the old file or the new one,
/// never half of one: a temporary file in the same directory, synced, then renamed over `path`.
pub fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let Some((_, temp)) = temporary_beside(path) else {
        return Err(Error::usage(format!("{}: not a file name", path.display())));
    };
    let written = std::fs::File::create(&temp).and_then(|mut file| {
        file.write_all(text.as_bytes())?;
        file.write_all(b"\n")?;
        file.sync_all()
    });
    if let Err(source) = written.and_then(|()| std::fs::rename(&temp, path)) {
        let _ = std::fs::remove_file(&temp);
        return Err(Error::Io {
            path: path.to_path_buf(),
            source,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_partial_profile_is_noted_and_a_whole_one_is_not() {
        let topology = crate::backend::sim::Preset::load("pcie-2gpu-switch")
            .unwrap()
            .topology();
        let mut profile = Profile::for_host(&topology);
        let path = Path::new("p.json");
        assert_eq!(profile.partial_note(path), None);
        profile.header.partial = true;
        let note = profile.partial_note(path).unwrap();
        assert!(note.contains("p.json is partial"), "{note}");
    }

    use super::super::test_support::dgx1;
    use super::super::CostModel;
    use super::*;

    fn measured() -> Profile {
        let mut p = Profile::for_host(&dgx1());
        p.hops.push(Measured {
            hop: Hop::PeerCe { src: 0, dst: 1 },
            cost: Cost {
                alpha_us: 4.0,
                beta_gbps: 21.5,
            },
        });
        p.hops.push(Measured {
            hop: Hop::DeviceToHost {
                device: 2,
                node: Some(0),
            },
            cost: Cost {
                alpha_us: 3.0,
                beta_gbps: 11.0,
            },
        });
        p.batch_message_us = Some(0.02);
        p.lone = vec![Lone {
            hop: Hop::PeerSm { src: 0, dst: 1 },
            lone_us: 5.5,
        }];
        p
    }

    #[test]
    fn lone_operations_must_be_positive_and_of_direct_or_resident_hops() {
        let lone = |hop, lone_us| Lone { hop, lone_us };
        let mut p = measured();
        p.lone = vec![lone(Hop::PeerSm { src: 0, dst: 0 }, 6.5)];
        assert_eq!(p.validate(), Ok(()));
        p.lone = vec![lone(Hop::PeerSm { src: 0, dst: 0 }, 0.0)];
        assert!(p.validate().unwrap_err().contains("lone_us 0"));
        p.lone = vec![lone(Hop::Local { device: 0 }, 3.0)];
        assert!(p
            .validate()
            .unwrap_err()
            .contains("only direct peer and resident hops"));
        p.lone = vec![lone(Hop::Resident { src: 0, dst: 0 }, 3.0)];
        assert_eq!(p.validate(), Ok(()));
        p.lone = vec![lone(Hop::PeerCe { src: 0, dst: 8 }, 3.0)];
        assert!(p.validate().unwrap_err().contains("names GPU 8"));
    }

    #[test]
    fn saves_atomically_and_loads_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.json");
        let profile = measured();
        profile.save(&path).unwrap();
        assert_eq!(Profile::load(&path).unwrap(), profile);
        // Nothing but the profile is left in the directory.
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(
            text.contains("\"schema\": \"peerlink.profile/1\""),
            "{text}"
        );
        assert!(text.contains("\"kind\": \"peer-ce\""), "{text}");
        // Saving again replaces the file whole.
        let mut changed = profile.clone();
        changed.hops.truncate(1);
        changed.save(&path).unwrap();
        assert_eq!(Profile::load(&path).unwrap().hops.len(), 1);
        // A profile without a hop prices nothing: refused, saying so.
        changed.hops.clear();
        changed.save(&path).unwrap();
        let err = Profile::load(&path).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("measured no hop"), "{err}");
    }

    #[test]
    fn a_destination_that_cannot_be_written_is_refused_before_anything_is_measured() {
        let dir = tempfile::tempdir().unwrap();
        check_destination(&dir.path().join("p.json"), "--out").unwrap();
        let mut refused = vec![
            (dir.path().to_path_buf(), "is a directory"),
            (dir.path().join("no/p.json"), "does not exist"),
        ];
        // Directories that exist but take no new file, whoever runs this (root included).
        if Path::new("/proc/self/status").is_file() {
            refused.push(("/proc/p.json".into(), "cannot create a file in /proc"));
            refused.push(("/proc/self/status".into(), "cannot create a file in"));
        }
        for (path, says) in refused {
            let err = check_destination(&path, "--out").unwrap_err();
            assert_eq!(err.exit_code(), 2, "{err}");
            assert!(err.to_string().starts_with("--out "), "{err}");
            assert!(err.to_string().contains(says), "{says}: {err}");
        }
        let entries = std::fs::read_dir(dir.path()).unwrap().count();
        assert_eq!(entries, 0, "the check leaves nothing behind");
    }

    #[test]
    fn a_profile_file_gives_its_model_and_its_partial_note_or_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.json");
        let mut profile = measured();
        profile.save(&path).unwrap();
        let (model, note) = CostModel::from_profile_file(&dgx1(), &path).unwrap();
        assert_eq!(note, None);
        let cost = model.cost(Hop::PeerCe { src: 0, dst: 1 }).unwrap();
        assert_eq!(cost.beta_gbps, 21.5, "the measured cost prices its hop");
        profile.header.partial = true;
        profile.save(&path).unwrap();
        let (_, note) = CostModel::from_profile_file(&dgx1(), &path).unwrap();
        assert!(note.unwrap().contains("host.json is partial"));
        let mut other_gpus = dgx1();
        other_gpus.devices[3].uuid = "GPU-elsewhere".into();
        let err = CostModel::from_profile_file(&other_gpus, &path).unwrap_err();
        assert!(err.to_string().contains("GPU-elsewhere"), "{err}");
    }

    #[test]
    fn profile_of_another_host_or_driver_is_refused_with_a_reason() {
        let profile = measured();
        let mut other_gpus = dgx1();
        other_gpus.devices[3].uuid = "GPU-elsewhere".into();
        let err = profile.check_matches(&other_gpus).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("GPU-elsewhere"), "{err}");

        let mut other_driver = dgx1();
        other_driver.driver_version = Some("535.1".into());
        let err = profile.check_matches(&other_driver).unwrap_err();
        assert!(err.to_string().contains("driver 999.1"), "{err}");
        assert!(err.to_string().contains("535.1"), "{err}");

        profile.check_matches(&dgx1()).unwrap();
    }

    #[test]
    fn malformed_profiles_are_refused_with_a_sentence() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("p.json");
        let cases = [
            ("{", "not JSON"),
            (
                r#"{"schema":"peerlink.profile/9","source":"cuda","driver_version":null,"gpus":[],"hops":[],"batch_message_us":null,"graph_node_us":null,"issue":null}"#,
                "schema",
            ),
            (
                r#"{"schema":"peerlink.profile/1","source":"cuda","driver_version":null,"gpus":["a"],"hops":[{"kind":"local","device":0,"alpha_us":1,"beta_gbps":0}],"batch_message_us":null,"graph_node_us":null,"issue":null}"#,
                "beta",
            ),
            (
                r#"{"schema":"peerlink.profile/1","source":"cuda","driver_version":null,"gpus":["a"],"hops":[{"kind":"local","device":4,"alpha_us":1,"beta_gbps":2}],"batch_message_us":null,"graph_node_us":null,"issue":null}"#,
                "GPU 4",
            ),
        ];
        for (text, needle) in cases {
            std::fs::write(&path, text).unwrap();
            let err = Profile::load(&path).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{err}");
            assert!(err.to_string().contains(needle), "{needle}: {err}");
        }
        let missing = Profile::load(&dir.path().join("absent.json")).unwrap_err();
        assert!(missing.to_string().contains("absent.json"), "{missing}");
    }

    #[test]
    fn measured_hops_override_defaults_and_others_fall_back() {
        let topo = dgx1();
        let model = super::super::CostModel::from_profile(&topo, &measured()).unwrap();
        let measured = model.cost(Hop::PeerCe { src: 0, dst: 1 }).unwrap();
        assert_eq!(measured.beta_gbps, 21.5);
        let fallback = model.cost(Hop::PeerCe { src: 0, dst: 3 }).unwrap();
        assert_eq!(fallback.beta_gbps, 44.0);
        assert_eq!(model.batch_message_us(), 0.02);
        assert!(
            model.origin().contains("measured profile"),
            "{}",
            model.origin()
        );
    }
}
