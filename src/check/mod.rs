//! `peerlink check`: a short health check for fleets of GPU hosts.
//!
//! It measures a few tests — each a figure that a fault moves (an NVLink down, a PCIe link trained
//! below its width, memory or clocks held back) and that holds still from run to run on a healthy
//! host ([`CHECKED`]) — and compares every figure with what it should be: a baseline (an earlier
//! `bench --json` of a host of this kind, taken when it was healthy) or, without one, the reference
//! figures shipped for known GPUs ([`reference`](mod@reference)). A figure slower than expected by more than its
//! tolerance has regressed, and the verdict names its test and place.
//!
//! The host itself is checked first (`check/topology.rs`): a pair joined by another link
//! than it should be, without P2P, or a GPU missing is wrong in itself, and a figure expected and
//! not measured because of it fails the check too — a fault never removes itself from the
//! comparison. The verdict comes from what was measured and what the host reports.
//!
//! Like is compared with like: each test runs at the baseline's message size (a baseline made at
//! other sizes than the default bench's is measured at those, and a note says so), or at the
//! reference figure's. The measuring is the bench's own ([`bench::run`]), with its defaults.
//!
//! Host-clock latencies are left out ([`LEFT_OUT`]): in a VM they move far more than any tolerance
//! from one process to the next, so comparing them would raise false alarms.

pub mod document;
pub mod reference;
#[cfg(test)]
mod tests;
mod topology;

use crate::backend::Backend;
use crate::bench::document::BenchDocument;
use crate::bench::progress::Progress;
use crate::bench::result::{Place, Shape, TestResult, Unit};
use crate::bench::{self, budget, Kept};
use crate::topology::{Source, Topology};
use crate::units::format_bytes;
use crate::{Error, Result};
use reference::Reference;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// `--tolerance` unless given: how much slower than expected a figure may be, in percent. It sits
/// well above the bandwidths' run-to-run spread on the H200 pair (0.7% at most over six processes
/// in two sessions, BENCHMARKS.md) and far below what a fault costs (one NVLink of 18 down: 5.6%
/// of the pair's bandwidth and more; a PCIe link trained at half width: 50%).
pub const DEFAULT_TOLERANCE_PCT: f64 = 5.0;

/// The host size check says its tests would take on, by the default bench's formula
/// ([`budget`]): a full HGX board.
pub const FLEET_GPUS: usize = 8;

/// A test check runs, and how far its figures may fall behind.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CheckedTest {
    pub test: &'static str,
    /// The test's tolerance as a multiple of `--tolerance`.
    pub tolerance_scale: f64,
    /// What it watches and how still it holds on a healthy host.
    pub why: &'static str,
}

/// The tests check runs, in its order. Their spreads are over six default `bench` processes on
/// the H200 pair, in two sessions (BENCHMARKS.md, issue 11; `benchmarks/h200-x2/bench*.json` and
/// `pinned-experiment/`). The other bandwidth tests (ce-read, the bidirectional and SM tests)
/// watch the same links as ce-write at the cost of as much time again, so they are left to `bench`.
pub const CHECKED: &[CheckedTest] = &[
    CheckedTest {
        test: "ce-write",
        tolerance_scale: 1.0,
        why: "every ordered pair's link (NVLink or PCIe P2P); 396.1–396.5 GB/s on the H200 pair \
              (0.1%)",
    },
    CheckedTest {
        test: "h2d",
        tolerance_scale: 1.0,
        why: "each GPU's PCIe link from the host; 55.0–55.4 GB/s on the H200 pair (0.7%)",
    },
    CheckedTest {
        test: "d2h",
        tolerance_scale: 1.0,
        why: "each GPU's PCIe link to the host; 55.1–55.3 GB/s on the H200 pair (0.4%)",
    },
    CheckedTest {
        test: "local",
        tolerance_scale: 1.0,
        why: "each GPU's memory and clocks; 2120–2134 GB/s on the H200 pair (0.7%)",
    },
    CheckedTest {
        test: "copy-latency",
        tolerance_scale: 2.0,
        why:
            "the GPU time of a small copy between GPUs (a GPU clock, not the host's); 2.21–2.28 µs \
              on the H200 pair (2.8%), so checked at twice the tolerance to stay clear of it",
    },
];

/// Tests a baseline may hold that check never compares, and why: each moved further than any
/// useful tolerance between healthy runs of the same H200 pair (BENCHMARKS.md, issue 11.3–11.4).
pub const LEFT_OUT: &[(&str, &str)] = &[
    (
        "issue-cost",
        "a host-clock figure: the fastest CPU's median moved 4–11% between processes a minute \
         apart in a VM (1.36–1.51 µs)",
    ),
    (
        "e2e-latency",
        "a host-clock figure: the fastest CPU's median holds within 2.3% between processes, but \
         moved 7% between two machines of the same kind (9.39–9.61 against 9.83–10.04 µs)",
    ),
    (
        "ping-pong",
        "it moved 29% between two sessions on the same H200 pair (0.57 against 0.73 µs)",
    ),
    (
        "pointer-chase",
        "it moved 7% between two sessions on the same H200 pair (959 against 1030 ns)",
    ),
    (
        "pointer-chase-resident",
        "it moved 7% between two sessions on the same H200 pair (815 against 874 ns)",
    ),
];

/// Why a test of a baseline that is neither checked nor in [`LEFT_OUT`] is not compared.
const NOT_IN_SHORT_SET: &str = "not in check's short set, which keeps a pair to a few seconds \
                                (`bench --tests` measures it)";

/// The message size `test` takes at its plateau, where the default bench measures it on GPUs
/// (a latency test's own size); `None` for a test peerlink does not know.
pub fn plateau_bytes(test: &str) -> Option<u64> {
    bench::find_test(test).map(|t| t.message_bytes(t.plateau_bytes()))
}

/// What the figures are compared with.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Against {
    /// An earlier `bench --json`.
    Baseline {
        /// The file, as given.
        file: String,
        /// Where its figures come from, and when and on what machine it was written (where it
        /// says).
        source: Source,
        time: Option<String>,
        host: Option<String>,
    },
    /// The reference figures shipped for these GPUs (each figure says where it comes from).
    Reference { gpus: Vec<String> },
}

/// A test a check compares, within what tolerance, and why it is checked so.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Checked {
    pub test: String,
    pub tolerance_pct: f64,
    /// What it watches, and how still it held on the H200 pair.
    pub why: String,
}

/// A test a check does not compare, and why.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct NotChecked {
    pub test: String,
    pub why: String,
}

/// A figure a check expected and the host could not give.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Missing {
    /// `ce-write 512 MiB 0→1`.
    pub figure: String,
    /// Why it was not measured, as the bench says.
    pub why: String,
}

/// What one figure should be.
#[derive(Clone, Debug, PartialEq)]
struct Expected {
    test: String,
    size_bytes: u64,
    place: Place,
    value: f64,
    /// Where a reference figure comes from.
    reference: Option<&'static str>,
}

impl Expected {
    fn name(&self) -> String {
        figure_name(&self.test, self.size_bytes, self.place)
    }
}

/// How a figure is named: `ce-write 512 MiB 0→1`.
fn figure_name(test: &str, size_bytes: u64, place: impl std::fmt::Display) -> String {
    format!("{test} {} {place}", format_bytes(size_bytes))
}

/// What a check will measure and what it expects, made before anything is measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Plan {
    against: Against,
    devices: Vec<usize>,
    /// Each test to run and its bytes per message, in [`CHECKED`]'s order.
    runs: Vec<(String, u64)>,
    expected: Vec<Expected>,
    not_checked: Vec<NotChecked>,
    /// Places the tests will measure with nothing to compare with, and why.
    not_compared: Vec<String>,
    /// How the host's topology differs from what it should be (`check/topology.rs`).
    faults: Vec<String>,
    notes: Vec<String>,
}

impl Plan {
    /// A check of `devices` of `host` against `baseline`, read from the file `name`. Usage errors:
    /// a baseline of another kind of host (simulated against real, another preset, other GPUs),
    /// or one that holds none of check's tests on these GPUs.
    pub fn against_baseline(
        host: &Topology,
        devices: &[usize],
        baseline: &BenchDocument,
        name: &str,
    ) -> Result<Plan> {
        same_kind_of_host(host, devices, baseline, name)?;
        let mut plan = Plan::empty(
            Against::Baseline {
                file: name.to_string(),
                source: baseline.header.source.clone(),
                time: baseline.header.time.clone(),
                host: baseline.header.host.clone(),
            },
            devices,
        );
        plan.faults = topology::against_baseline(host, devices, baseline, name);
        let tests = &baseline.results.tests;
        for test in tests {
            if !CHECKED.iter().any(|c| c.test == test.name) {
                let why = LEFT_OUT
                    .iter()
                    .find(|(t, _)| *t == test.name)
                    .map_or(NOT_IN_SHORT_SET, |(_, why)| why);
                plan.not_checked(&test.name, why);
            }
        }
        let mut off_size = Vec::new();
        let mut elsewhere = 0;
        for checked in CHECKED {
            let Some(test) = tests.iter().find(|t| t.name == checked.test) else {
                plan.not_checked(checked.test, &format!("not in {name}"));
                continue;
            };
            for cell in &test.cells {
                let (src, dst) = cell.place.pair();
                if !(devices.contains(&src) && devices.contains(&dst)) {
                    elsewhere += 1;
                    continue;
                }
                plan.expected.push(Expected {
                    test: test.name.clone(),
                    size_bytes: test.size_bytes,
                    place: cell.place,
                    value: cell.value,
                    reference: None,
                });
            }
            let plateau = plateau_bytes(&test.name);
            if plateau.is_some_and(|p| p != test.size_bytes) {
                off_size.push(format!(
                    "{} at {} (its plateau: {})",
                    test.name,
                    format_bytes(test.size_bytes),
                    format_bytes(plateau.unwrap_or_default())
                ));
            }
            plan.run(&test.name, test.size_bytes, |_| format!("not in {name}"));
        }
        if !off_size.is_empty() {
            plan.notes.push(format!(
                "{name} measured {}: check measures each at the baseline's size, to compare like \
                 with like",
                off_size.join(", ")
            ));
        }
        if elsewhere > 0 {
            plan.notes.push(format!(
                "{elsewhere} figures of {name} are of GPUs not in use here, and not compared"
            ));
        }
        plan.require_expected(|| {
            format!(
                "{name} holds no figure of check's tests ({}) on the GPUs in use; give a default \
                 `peerlink bench --json` of this kind of host as --baseline",
                checked_names()
            )
        })?;
        Ok(plan)
    }

    /// A check of `devices` of `host` against the reference figures of their kind of GPU. A usage
    /// error where peerlink ships none for them, or none applies to the GPUs in use.
    pub fn against_references(host: &Topology, devices: &[usize]) -> Result<Plan> {
        let name_of = |d: usize| {
            host.devices
                .iter()
                .find(|x| x.index == d)
                .map_or("an unknown GPU", |x| x.name.as_str())
        };
        let reference_of = |d: usize| reference::for_gpu(name_of(d));
        let mut used: Vec<&Reference> = Vec::new();
        for &d in devices {
            if let Some(r) = reference_of(d).filter(|r| !used.contains(r)) {
                used.push(r);
            }
        }
        let mut names: Vec<&str> = Vec::new();
        for &d in devices {
            if !names.contains(&name_of(d)) {
                names.push(name_of(d));
            }
        }
        if used.is_empty() {
            return Err(Error::usage(format!(
                "peerlink ships no reference figures for {} (only for {}); give --baseline FILE, \
                 a `peerlink bench --json` of this host taken when it was healthy",
                names.join(", "),
                reference::REFERENCES
                    .iter()
                    .map(|r| r.gpu)
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        let mut plan = Plan::empty(
            Against::Reference {
                gpus: used.iter().map(|r| r.gpu.to_string()).collect(),
            },
            devices,
        );
        plan.faults = topology::against_references(host, devices, reference_of);
        for checked in CHECKED {
            let test = checked.test;
            let Some(size_bytes) = used
                .iter()
                .find_map(|r| r.figure(test))
                .map(|f| f.size_bytes)
            else {
                let gpus: Vec<&str> = used.iter().map(|r| r.gpu).collect();
                plan.not_checked(
                    test,
                    &format!("no reference figure for {}", gpus.join(", ")),
                );
                continue;
            };
            let figure_at = |place: Place| -> std::result::Result<_, String> {
                let (src, dst) = place.pair();
                let reference = reference_of(src)
                    .and_then(|r| r.figure(test).map(|f| (r, f)))
                    .ok_or_else(|| format!("no reference figure of {test} for {}", name_of(src)))?;
                if src == dst {
                    return match place {
                        Place::Device { .. } => Ok(reference.1),
                        Place::Pair { .. } => {
                            Err("a GPU with itself: pair figures need two GPUs".to_string())
                        }
                    };
                }
                // Whatever joins two GPUs of one kind, their figures are the reference's: a
                // link or P2P unlike the reference's is a fault (`plan.faults`), not a reason
                // to leave the figure out.
                match reference_of(dst) {
                    Some(other) if other == reference.0 => Ok(reference.1),
                    _ => Err(format!(
                        "GPU {dst} is another kind of GPU than GPU {src} ({}): the reference                          figures of {} hold for two of them",
                        name_of(dst),
                        reference.0.gpu
                    )),
                }
            };
            for place in bench::places(shape_of(test), devices).0 {
                if let Ok(figure) = figure_at(place) {
                    plan.expected.push(Expected {
                        test: test.to_string(),
                        size_bytes,
                        place,
                        value: figure.value,
                        reference: Some(figure.source),
                    });
                }
            }
            plan.run(test, size_bytes, |place| {
                figure_at(place).err().unwrap_or_default()
            });
        }
        plan.notes.push(
            "reference figures come from other machines and tools (each figure says which): they \
             catch a gross fault (a link down, a PCIe link trained low) sooner than a drift of a \
             few percent; a baseline of this host (--baseline) is the sharper check"
                .to_string(),
        );
        if let Some(preset) = host.source.preset() {
            plan.notes.push(format!(
                "SIMULATED host `{preset}`: every figure comes from the preset's model, so this \
                 checks the preset against the reference figures of the GPU it names, not any \
                 hardware"
            ));
        }
        plan.require_expected(|| {
            format!(
                "no reference figure applies to the GPUs in use ({}); give --baseline FILE, a \
                 `peerlink bench --json` of this host taken when it was healthy",
                names.join(", ")
            )
        })?;
        Ok(plan)
    }

    fn empty(against: Against, devices: &[usize]) -> Plan {
        Plan {
            against,
            devices: devices.to_vec(),
            runs: Vec::new(),
            expected: Vec::new(),
            not_checked: Vec::new(),
            not_compared: Vec::new(),
            faults: Vec::new(),
            notes: Vec::new(),
        }
    }

    fn not_checked(&mut self, test: &str, why: &str) {
        self.not_checked.push(NotChecked {
            test: test.to_string(),
            why: why.to_string(),
        });
    }

    /// Runs `test` at `size_bytes` where something is expected of it, naming each place it will
    /// measure with nothing to compare with (`why_not` says why).
    fn run(&mut self, test: &str, size_bytes: u64, why_not: impl Fn(Place) -> String) {
        let expected: Vec<Place> = self
            .expected
            .iter()
            .filter(|e| e.test == test)
            .map(|e| e.place)
            .collect();
        if expected.is_empty() {
            return;
        }
        for place in bench::places(shape_of(test), &self.devices).0 {
            if !expected.contains(&place) {
                let why = why_not(place);
                self.not_compared
                    .push(format!("{}: {why}", figure_name(test, size_bytes, place)));
            }
        }
        self.runs.push((test.to_string(), size_bytes));
    }

    fn require_expected(&self, why: impl FnOnce() -> String) -> Result<()> {
        if self.expected.is_empty() {
            return Err(Error::usage(why()));
        }
        Ok(())
    }

    /// Each test the check will run and its bytes per message.
    pub fn runs(&self) -> &[(String, u64)] {
        &self.runs
    }
}

/// The shape of a test of [`CHECKED`] (all of them exist).
fn shape_of(test: &str) -> Shape {
    bench::find_test(test).map_or(Shape::Matrix, |t| t.shape())
}

/// `ce-write, h2d, d2h, local and copy-latency`.
fn checked_names() -> String {
    let names: Vec<&str> = CHECKED.iter().map(|c| c.test).collect();
    names.join(", ")
}

/// Ok where `baseline` was made on the kind of host `host` is: simulated or not alike, the same
/// preset, and the same GPU model at each index in use (where the baseline names its GPUs).
fn same_kind_of_host(
    host: &Topology,
    devices: &[usize],
    baseline: &BenchDocument,
    name: &str,
) -> Result<()> {
    let there = &baseline.header;
    if there.source != host.source {
        return Err(Error::usage(format!(
            "{name} was measured on `{}` and this host is `{}`: a baseline must come from the same \
             kind of host (a simulator's figures say nothing of real GPUs, nor one preset's of \
             another); give a `peerlink bench --json` made here or on a host like this one",
            there.source, host.source
        )));
    }
    for &d in devices {
        let here = host.devices.iter().find(|x| x.index == d);
        let then = there.host_gpus.iter().find(|g| g.index == d);
        if let (Some(here), Some(then)) = (here, then) {
            if here.name != then.name {
                return Err(Error::usage(format!(
                    "{name} was measured with {} as GPU {d}, and this host's GPU {d} is {}; give a \
                     baseline made on this kind of GPU",
                    then.name, here.name
                )));
            }
        }
    }
    Ok(())
}

/// One figure checked.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CheckedFigure {
    pub test: String,
    /// Bytes per message.
    pub size_bytes: u64,
    pub unit: Unit,
    /// `0→1` for an ordered pair, `GPU 0` for one GPU.
    pub place: String,
    /// The baseline's or the reference's figure.
    pub expected: f64,
    pub measured: f64,
    /// measured / expected.
    pub ratio: f64,
    /// How much slower than expected, in percent of the expected figure: a bandwidth that fell or
    /// a latency that grew; negative where faster.
    pub slower_pct: f64,
    /// How much slower it may be: `--tolerance`, scaled for the test ([`CHECKED`]).
    pub tolerance_pct: f64,
    /// Slower than the tolerance allows.
    pub regressed: bool,
    /// Where a reference figure comes from; absent against a baseline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<String>,
}

impl CheckedFigure {
    fn new(expected: &Expected, unit: Unit, measured: f64, tolerance_pct: f64) -> CheckedFigure {
        let ratio = measured / expected.value;
        let slower_pct = match unit {
            Unit::Gbps => (1.0 - ratio) * 100.0,
            Unit::Micros | Unit::Nanos => (ratio - 1.0) * 100.0,
        };
        CheckedFigure {
            test: expected.test.clone(),
            size_bytes: expected.size_bytes,
            unit,
            place: expected.place.to_string(),
            expected: expected.value,
            measured,
            ratio,
            slower_pct,
            tolerance_pct,
            regressed: slower_pct > tolerance_pct,
            reference: expected.reference.map(str::to_string),
        }
    }

    /// `ce-write 512 MiB 0→1`.
    pub fn name(&self) -> String {
        figure_name(&self.test, self.size_bytes, &self.place)
    }

    /// `ce-write 512 MiB 0→1 (9.1% slower; tolerance 5%)`.
    pub fn named_with_change(&self) -> String {
        format!(
            "{} ({:.1}% slower; tolerance {}%)",
            self.name(),
            self.slower_pct,
            self.tolerance_pct
        )
    }
}

/// What a check found (the body of the `peerlink.check/1` document,
/// [`crate::check::document::CheckDocument`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CheckReport {
    pub against: Against,
    /// GPUs checked (CUDA indices).
    pub devices: Vec<usize>,
    /// `--tolerance`: how much slower than expected a figure may be, in percent; each test scales
    /// it (its figures' `tolerance_pct`).
    pub tolerance_pct: f64,
    /// The tests compared, each with its tolerance and why.
    pub checked: Vec<Checked>,
    /// Every figure compared, in check's test order.
    pub figures: Vec<CheckedFigure>,
    /// The figures that regressed, named (`ce-write 512 MiB 0→1`).
    pub regressed: Vec<String>,
    /// No figure regressed and nothing is wrong (`faults`).
    pub healthy: bool,
    /// Tests not compared, and why.
    pub not_checked: Vec<NotChecked>,
    /// Places measured with nothing to compare with, or expected and not measured because the
    /// run stopped, and why.
    pub not_compared: Vec<String>,
    /// How the host's topology differs from what it should be, each in a sentence: a GPU
    /// missing, P2P off, a pair joined by another link (fewer NVLinks). Written where there is
    /// any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<String>,
    /// Figures expected and not measured because the host could not give them (P2P or a link
    /// missing), and why. Written where there is any.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub missing: Vec<Missing>,
    pub notes: Vec<String>,
    /// Seconds the tests took on the backend's host clock (virtual on the simulator).
    pub wall_s: f64,
    /// Seconds the same tests would take on [`FLEET_GPUS`] GPUs of this kind, by the default
    /// bench's formula ([`budget::extrapolate_s`]: each test's time per place × its places there).
    pub fleet_wall_s: f64,
    /// The GPUs `fleet_wall_s` is for.
    pub fleet_gpus: usize,
}

/// Runs the check `plan` on `backend`: its tests (the bench's own measuring, at the plan's sizes),
/// then every figure judged against `tolerance_pct`. A failure while measuring keeps the verdict
/// on what was measured before it.
pub fn run(
    backend: &dyn Backend,
    plan: &Plan,
    tolerance_pct: f64,
    progress: &dyn Progress,
) -> Result<Kept<CheckReport>> {
    let mut measured = Vec::new();
    // bench takes one message size for all its tests: one run per size.
    let mut sizes: Vec<u64> = Vec::new();
    for &(_, bytes) in &plan.runs {
        if !sizes.contains(&bytes) {
            sizes.push(bytes);
        }
    }
    for size in sizes {
        if crate::interrupt::requested() {
            break;
        }
        let options = bench::Options {
            tests: Some(
                plan.runs
                    .iter()
                    .filter(|(_, bytes)| *bytes == size)
                    .map(|(test, _)| test.clone())
                    .collect(),
            ),
            devices: Some(plan.devices.clone()),
            size: Some(bench::Size::Bytes(size)),
            ..bench::Options::default()
        };
        let kept = bench::run_keeping(backend, &options, progress)?;
        measured.extend(kept.found.tests);
        if kept.failure.is_some() {
            return Ok(Kept {
                found: judge(plan, &measured, tolerance_pct),
                failure: kept.failure,
            });
        }
    }
    Ok(Kept::whole(judge(plan, &measured, tolerance_pct)))
}

/// Every expected figure of `plan` against what was `measured`.
pub fn judge(plan: &Plan, measured: &[TestResult], tolerance_pct: f64) -> CheckReport {
    let mut figures = Vec::new();
    let mut not_compared = plan.not_compared.clone();
    let mut missing = Vec::new();
    for checked in CHECKED {
        let result = measured.iter().find(|t| t.name == checked.test);
        let tolerance = tolerance_pct * checked.tolerance_scale;
        for expected in plan.expected.iter().filter(|e| e.test == checked.test) {
            if let Some((unit, value)) =
                result.and_then(|r| r.cell(expected.place).map(|c| (r.unit, c.value)))
            {
                figures.push(CheckedFigure::new(expected, unit, value, tolerance));
                continue;
            }
            let why = result
                .and_then(|r| r.reason(expected.place))
                .unwrap_or(bench::INTERRUPTED);
            // A stopped run leaves a figure out; a host that cannot give it is at fault.
            if [bench::INTERRUPTED, bench::STOPPED_BY_FAILURE].contains(&why) {
                not_compared.push(format!("{}: not measured ({why})", expected.name()));
            } else {
                missing.push(Missing {
                    figure: expected.name(),
                    why: why.to_string(),
                });
            }
        }
    }
    let gpus = plan.devices.len();
    let wall_s: f64 = measured.iter().map(|t| t.wall_s).sum();
    let fleet_wall_s = measured
        .iter()
        .map(|t| budget::extrapolate_s(shape_of(&t.name), t.wall_s, gpus, FLEET_GPUS))
        .sum();
    let regressed: Vec<String> = figures
        .iter()
        .filter(|f| f.regressed)
        .map(CheckedFigure::name)
        .collect();
    let checked = CHECKED
        .iter()
        .filter(|c| plan.runs.iter().any(|(test, _)| test == c.test))
        .map(|c| Checked {
            test: c.test.to_string(),
            tolerance_pct: tolerance_pct * c.tolerance_scale,
            why: c.why.to_string(),
        })
        .collect();
    CheckReport {
        against: plan.against.clone(),
        devices: plan.devices.clone(),
        tolerance_pct,
        checked,
        healthy: regressed.is_empty() && plan.faults.is_empty() && missing.is_empty(),
        regressed,
        figures,
        not_checked: plan.not_checked.clone(),
        not_compared,
        faults: plan.faults.clone(),
        missing,
        notes: plan.notes.clone(),
        wall_s,
        fleet_wall_s,
        fleet_gpus: FLEET_GPUS,
    }
}

impl CheckReport {
    /// The figures that regressed, each with how much slower it was and its tolerance.
    pub fn regressions(&self) -> Vec<String> {
        self.figures
            .iter()
            .filter(|f| f.regressed)
            .map(CheckedFigure::named_with_change)
            .collect()
    }

    /// What failed the check, in a sentence (`list` joins names): what is wrong with the host
    /// (`faults`), the figures it could not give (`missing`), then the figures slower than their
    /// tolerance allows; `None` where the host is healthy.
    pub fn what_failed(&self, list: impl Fn(&[String]) -> String) -> Option<String> {
        if self.healthy {
            return None;
        }
        let mut parts = self.faults.clone();
        if !self.missing.is_empty() {
            let names: Vec<String> = self.missing.iter().map(|m| m.figure.clone()).collect();
            parts.push(format!(
                "{} figure{} not measured: {}",
                names.len(),
                if names.len() == 1 { "" } else { "s" },
                list(&names)
            ));
        }
        if !self.regressed.is_empty() || parts.is_empty() {
            let slow = format!(
                "{} of {} figures slower than their tolerance allows",
                self.regressed.len(),
                self.figures.len()
            );
            parts.push(match self.regressed.is_empty() {
                true => slow,
                false => format!("{slow}: {}", list(&self.regressions())),
            });
        }
        Some(parts.join("; "))
    }

    /// Whether something besides a slow figure is wrong.
    pub fn is_faulty(&self) -> bool {
        !(self.faults.is_empty() && self.missing.is_empty())
    }
}
