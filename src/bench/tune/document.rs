//! `peerlink tune`'s document: the profile it writes and prints as JSON, and beside it what its
//! text shows that a profile does not keep (the GPUs measured, the hops that could not be fitted,
//! the latencies measured for a preset, the split runs), as plain figures derived when the
//! document is made.

use super::beside::{BothWaysFit, Fitted, RefusedFraction, SplitFit, SplitRun};
use super::{Latencies, Measurements};
use crate::bench::proof::document::RouteName;
use crate::model::{Cost, DirectPace, Hop, IssueCosts, Profile};
use crate::topology::{Source, Topology};

/// What `peerlink tune` found: the profile (its JSON) and what its text shows besides.
#[derive(Clone, Debug, PartialEq)]
pub struct TuneDocument {
    pub profile: Profile,
    pub report: TuneReport,
}

impl TuneDocument {
    /// The document of `measured`, its profile keyed to `topology`'s GPUs and driver.
    pub fn of(measured: &Measurements, topology: &Topology) -> Self {
        Self {
            profile: measured.profile(topology),
            report: TuneReport::of(measured),
        }
    }
}

/// What tune's text shows that its profile does not keep (or keeps only where measured).
#[derive(Clone, Debug, PartialEq)]
pub struct TuneReport {
    pub source: Source,
    pub measured_on: String,
    /// The GPUs measured, in order.
    pub devices: Vec<usize>,
    /// Every hop swept, with its fitted cost where it could be fitted.
    pub swept: Vec<SweptHop>,
    pub issue: IssueCosts,
    pub graph_node_us: f64,
    pub batch_message_us: f64,
    /// The latencies measured for a simulator preset, where one was asked for.
    pub latencies: Option<Latencies>,
    pub splits: Vec<SplitReport>,
    pub both_ways: Option<BothWaysReport>,
}

/// A hop swept; `cost` is `None` where the sweep could not be fitted.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SweptHop {
    pub hop: Hop,
    pub cost: Option<Cost>,
}

/// The host route beside a direct copy on one ordered pair, as the text shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitReport {
    pub src: usize,
    pub dst: usize,
    /// The splits planned with the estimate, then those planned with the fit.
    pub rows: Vec<SplitRow>,
    pub fitted: Fitted,
    pub refitted: Option<Fitted>,
    /// The figures the profile keeps and the direct copy's pace beside them; `None` where no fit
    /// was physically possible.
    pub kept: Option<(super::beside::Fit, Option<DirectPace>)>,
}

/// The host route both ways on one pair, as the text shows it.
#[derive(Clone, Debug, PartialEq)]
pub struct BothWaysReport {
    pub pair: (usize, usize),
    /// Each direction's splits planned with the estimate, then those planned with the fit.
    pub rows: Vec<SplitRow>,
    pub refused: Vec<RefusedFraction>,
    pub fraction: Option<f64>,
}

/// One split run with a direct copy and the host route: when each was predicted to end and ended.
#[derive(Clone, Debug, PartialEq)]
pub struct SplitRow {
    /// How it was planned, in words.
    pub label: String,
    pub bytes: u64,
    pub host_bytes: u64,
    pub chunk_bytes: u64,
    pub direct_predicted_us: f64,
    pub direct_measured_us: f64,
    pub host_predicted_us: f64,
    pub host_measured_us: f64,
    /// (latest − earliest) / latest of the measured ends.
    pub spread: f64,
}

impl TuneReport {
    fn of(m: &Measurements) -> Self {
        Self {
            source: m.source.clone(),
            measured_on: m.measured_on.clone(),
            devices: m.devices.clone(),
            swept: m
                .hops
                .iter()
                .map(|h| SweptHop {
                    hop: h.hop,
                    cost: h.cost(),
                })
                .collect(),
            issue: m.issue,
            graph_node_us: m.graph_node_us,
            batch_message_us: m.batch_message_us,
            latencies: m.latencies,
            splits: m.splits.iter().map(SplitReport::of).collect(),
            both_ways: m.both_ways.as_ref().map(BothWaysReport::of),
        }
    }
}

impl SplitReport {
    fn of(fit: &SplitFit) -> Self {
        let label = |when: &'static str| move |_: &SplitRun| format!("planned with the {when}");
        Self {
            src: fit.src,
            dst: fit.dst,
            rows: rows(&fit.first, label("estimate"))
                .chain(rows(&fit.check, label("fit")))
                .collect(),
            fitted: fit.fitted.clone(),
            refitted: fit.refitted.clone(),
            kept: fit.kept().map(|kept| (kept, fit.kept_direct())),
        }
    }
}

impl BothWaysReport {
    fn of(fit: &BothWaysFit) -> Self {
        let label = |when: &'static str| {
            move |run: &SplitRun| {
                let (src, dst) = run.pair();
                format!("{src} → {dst}, planned with the {when}")
            }
        };
        Self {
            pair: fit.pair,
            rows: rows(&fit.first, label("estimate"))
                .chain(rows(&fit.check, label("fit")))
                .collect(),
            refused: fit.refused.clone(),
            fraction: fit.fraction,
        }
    }
}

/// The rows of `runs` that have a direct copy and the host route, each labelled by `label`.
fn rows<'r>(
    runs: &'r [SplitRun],
    label: impl Fn(&SplitRun) -> String + 'r,
) -> impl Iterator<Item = SplitRow> + 'r {
    runs.iter().filter_map(move |run| {
        let route = |name: RouteName| run.routes.iter().find(|r| r.route == name);
        let (direct, host) = (route(RouteName::DirectCe)?, route(RouteName::Host)?);
        Some(SplitRow {
            label: label(run),
            bytes: run.bytes,
            host_bytes: host.bytes,
            chunk_bytes: run.chunk_bytes,
            direct_predicted_us: direct.predicted_us,
            direct_measured_us: direct.measured_us,
            host_predicted_us: host.predicted_us,
            host_measured_us: host.measured_us,
            spread: run.spread,
        })
    })
}
