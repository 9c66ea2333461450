//! `peerlink doctor`: what stands between a host's GPUs and fast P2P, found, shown and explained.
//!
//! Each [`Check`] shows the evidence it read, a [`Verdict`] and the fix. The facts come through
//! narrow readers: the topology and [`Health`](crate::backend::Health) through the backend (NVML
//! on real GPUs, the preset and its faults on the simulator), and the host's own sysfs and procfs
//! through [`Sysfs`], rooted at `/` on a real host (a fake tree in tests). Between two readings of
//! the error counters a short [`burst`] of traffic crosses every P2P pair and every host link, so
//! that counters which rise with traffic show it.
//!
//! The checks: per pair of GPUs, P2P and why it is off (`pairs.rs`); per GPU, its PCIe link,
//! NVLinks, error counters, MIG, persistence mode and clocks (`gpus.rs`); for the host, a virtual
//! machine and what it costs, the IOMMU, PCIe ACS and the CUDA device order (`host_checks.rs`).

pub mod burst;
pub mod document;
mod facts;
mod gpus;
pub mod host;
mod host_checks;
mod pairs;

pub use burst::Burst;
pub use facts::HostFacts;

use crate::backend::Backend;
use crate::bench::progress::Progress;
use crate::topology::sysfs::Sysfs;
use crate::Result;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// The checks made of every GPU, in the order a report lists them.
pub const GPU_CHECKS: [&str; 6] = [
    "pcie-link",
    "nvlink",
    "error-counters",
    "mig",
    "persistence",
    "clocks",
];

/// How a check came out. Only `fail` makes `peerlink doctor` exit 1.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Nothing wrong found.
    Ok,
    /// Worth knowing, not wrong: a virtual machine and its cost, or a fact that could not be read.
    Info,
    /// Slower or more fragile than it should be, though it works.
    Warn,
    /// Broken: P2P off where it should work, a link below its maximum or down, errors rising.
    Fail,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Info => "info",
            Verdict::Warn => "warn",
            Verdict::Fail => "fail",
        }
    }
}

/// One check of one thing: a pair of GPUs, a GPU, or the host.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Check {
    /// What was checked, a stable name for scripts: `p2p`, `pcie-link`, `nvlink`,
    /// `error-counters`, `mig`, `persistence`, `clocks`, `virtual-machine`, `iommu`, `acs`,
    /// `device-order`.
    pub check: String,
    /// `host`, `GPU 1` or `GPU 0 ↔ GPU 1`.
    pub subject: String,
    /// The GPUs concerned (none for the host).
    pub devices: Vec<usize>,
    pub verdict: Verdict,
    /// One sentence: what was found.
    pub finding: String,
    /// The facts it was read from, each saying where it came from.
    pub evidence: Vec<String>,
    /// What to do, where there is something to do.
    pub fix: Option<String>,
}

/// What a check is about.
#[derive(Clone, Copy, Debug)]
pub enum Subject {
    Host,
    Gpu(usize),
    Pair(usize, usize),
}

impl Check {
    pub fn new(
        check: &str,
        subject: Subject,
        verdict: Verdict,
        finding: impl Into<String>,
    ) -> Check {
        let (subject, devices) = match subject {
            Subject::Host => ("host".to_string(), Vec::new()),
            Subject::Gpu(d) => (format!("GPU {d}"), vec![d]),
            Subject::Pair(a, b) => (format!("GPU {a} ↔ GPU {b}"), vec![a, b]),
        };
        Check {
            check: check.to_string(),
            subject,
            devices,
            verdict,
            finding: finding.into(),
            evidence: Vec::new(),
            fix: None,
        }
    }

    pub fn evidence(mut self, fact: impl Into<String>) -> Check {
        self.evidence.push(fact.into());
        self
    }

    pub fn fix(mut self, fix: impl Into<String>) -> Check {
        self.fix = Some(fix.into());
        self
    }
}

/// The user's choices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    /// GPUs to check (all by default).
    pub devices: Option<Vec<usize>>,
    /// Where the host's /sys and /proc are: `/` by default on real GPUs; on the simulator none
    /// unless given (a simulated host has no files of its own).
    pub host_root: Option<PathBuf>,
}

/// Everything the doctor found.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub devices: Vec<usize>,
    /// The traffic burst between the counters' two readings, or why there was none.
    pub burst: std::result::Result<Burst, String>,
    /// Host checks first, then pairs, then each kind of GPU check GPU by GPU.
    pub checks: Vec<Check>,
    pub notes: Vec<String>,
}

impl Report {
    /// Whether any check failed (`peerlink doctor` exits 1 then).
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.verdict == Verdict::Fail)
    }

    /// How many checks came out each way, worst first.
    pub fn tally(&self) -> Vec<(Verdict, usize)> {
        [Verdict::Fail, Verdict::Warn, Verdict::Info, Verdict::Ok]
            .into_iter()
            .map(|v| (v, self.checks.iter().filter(|c| c.verdict == v).count()))
            .collect()
    }
}

/// Runs every check on `backend`'s GPUs (those of `options.devices`).
/// `progress` hears of the three stages: the host's files, the traffic burst, the checks that
/// measure (a second or two on GPUs).
pub fn run(backend: &dyn Backend, options: &Options, progress: &dyn Progress) -> Result<Report> {
    let topology = backend.topology();
    let devices = topology.select(options.devices.as_deref())?;
    let mut notes = Vec::new();
    let root = match (&options.host_root, topology.is_simulated()) {
        (Some(root), _) => Some(root.clone()),
        (None, false) => Some(PathBuf::from("/")),
        (None, true) => None,
    };
    if topology.is_simulated() {
        notes.push(format!(
            "SIMULATED host ({}): the GPUs' facts, the traffic and its timing come from the \
             preset and its faults, not from hardware{}",
            backend.source(),
            match &root {
                Some(root) => format!("; the host's files are read under {}", root.display()),
                None => "; the host's own files are not read (pass --root DIR to read a tree)"
                    .to_string(),
            }
        ));
    }
    progress.start("doctor", 3);
    let facts = HostFacts::read(root.map(Sysfs::at), topology, &devices);
    progress.step();
    let outcome = burst::run(backend, &devices, &burst::Plan::for_backend(backend))?;
    progress.step();
    let mut checks = host_checks::run(backend, &facts, &devices)?;
    progress.step();
    progress.finish();
    checks.extend(pairs::run(topology, &facts, &devices, &outcome));
    checks.extend(gpus::run(topology, &facts, &devices, &outcome));
    Ok(Report {
        devices,
        burst: outcome.burst,
        checks,
        notes,
    })
}

#[cfg(test)]
mod tests;
