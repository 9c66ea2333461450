//! `peerlink plan --json` in its four modes: one transfer (`peerlink.plan/1`), the engine benchmark
//! over sizes (`peerlink.plan-sweep/1`), a batch of messages (`peerlink.plan-batch/1`) and every
//! GPU's transfer at once (`peerlink.plan-concurrent/1`).
//!
//! Each `*View` gathers the in-memory results a mode reports, which its document is made from; the
//! text report reads the document.

use super::batch::{BatchReport, BatchTiming};
use super::concurrent;
use super::sweep::{Point, Report};
use crate::backend::CopyMethod;
use crate::document::{impl_document, Document, Header};
use crate::engine::{BatchPlan, BatchStrategy, PathShare, Plan, Route, Strategy};
use crate::model::{BesideDirect, DirectPace};
use crate::topology::Topology;
use crate::units::gbps;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Everything `plan` reports for one transfer.
pub struct PlanView<'a> {
    /// Where the costs came from, in words.
    pub model: &'a str,
    pub plan: &'a Plan,
    /// Strategies this pair cannot use, with the reason.
    pub unusable: &'a [(Strategy, String)],
    /// Measurements of every strategy at this size, where asked for.
    pub proof: Option<&'a Report>,
    /// Between hosts: the way through the NICs, in words.
    pub network: Option<String>,
    /// A split over a direct copy and the host route: how the host route is priced beside it.
    pub host_pricing: Option<BesideDirect>,
    /// And how its direct copy is priced beside the host route, where measured.
    pub direct_pricing: Option<DirectPace>,
}

impl PlanView<'_> {
    /// How a split's routes are priced beside each other, in words.
    pub fn pricing(&self) -> Option<String> {
        let host = self.host_pricing?;
        Some(match self.direct_pricing {
            Some(direct) => format!("{host}; {direct}"),
            None => host.to_string(),
        })
    }
}

/// The engine benchmark over a size sweep.
pub struct SweepView<'a> {
    pub model: &'a str,
    pub report: &'a Report,
}

/// A batch plan and, with `--prove`, its measurements.
pub struct BatchView<'a> {
    pub model: &'a str,
    pub count: usize,
    pub size: u64,
    pub plan: &'a BatchPlan,
    pub proof: Option<&'a BatchReport>,
}

/// Concurrent traffic, measured (`plan --concurrent`).
pub struct ConcurrentView<'a> {
    pub model: &'a str,
    pub traffic: &'a str,
    pub report: &'a concurrent::Report,
}

/// How the planner would move one transfer, every alternative's prediction, and (with `--prove`)
/// what each measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlanDocument {
    #[serde(flatten)]
    pub header: Header,
    /// Where the costs came from, in words.
    pub model: String,
    pub src: usize,
    pub dst: usize,
    pub bytes: u64,
    /// The pick.
    pub strategy: Strategy,
    /// Bytes per pipeline step for the chunked strategies; the whole transfer for the others.
    pub chunk_bytes: u64,
    pub predicted_us: f64,
    pub predicted_gbps: f64,
    /// The routes the bytes take, covering the transfer once.
    pub paths: Vec<PlannedPath>,
    /// Every other usable strategy's best prediction, fastest first.
    pub alternatives: Vec<Predicted<Strategy>>,
    /// Strategies this pair cannot use, and why.
    pub unusable: Vec<Unusable>,
    /// Every strategy run on the backend at this size (`--prove`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<Proof>,
    /// A split over a direct copy and the host route: how the host route is priced beside the
    /// direct copy, and whether that was measured or is an estimate; then, where a profile measured
    /// it, how the direct copy is priced beside the host route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_route_beside_direct: Option<String>,
    /// Between hosts: the way through the NICs, in words. The text shows it; the JSON has never
    /// held it (its paths say the route), so it is not read back.
    #[serde(skip)]
    #[schemars(skip)]
    pub network: Option<String>,
}

impl_document!(PlanDocument, "peerlink.plan/1");

/// One route of a plan and the bytes it carries.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlannedPath {
    #[serde(flatten)]
    pub route: RouteName,
    pub bytes: u64,
    /// Predicted time for this share alone, µs.
    pub predicted_us: f64,
}

/// A route as documents name it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "route", rename_all = "kebab-case")]
pub enum RouteName {
    /// The direct peer path, by copy engine.
    DirectCe,
    /// The direct peer path, by an SM copy kernel.
    DirectSm,
    /// Through pinned host memory.
    Host,
    /// Through another GPU's memory.
    Relay { via: usize },
    /// To another host, GPU memory to GPU memory through the NICs.
    GpudirectRdma,
    /// To another host, through host memory near each NIC.
    NetStaged,
    /// Through the source GPU's resident worker.
    Resident,
}

impl From<Route> for RouteName {
    fn from(route: Route) -> Self {
        match route {
            Route::Direct(CopyMethod::CopyEngine) => RouteName::DirectCe,
            Route::Direct(CopyMethod::SmKernel) => RouteName::DirectSm,
            Route::Host => RouteName::Host,
            Route::Relay(via) => RouteName::Relay { via },
            Route::GpudirectRdma => RouteName::GpudirectRdma,
            Route::NetStaged => RouteName::NetStaged,
            Route::Resident => RouteName::Resident,
        }
    }
}

impl From<RouteName> for Route {
    fn from(name: RouteName) -> Self {
        match name {
            RouteName::DirectCe => Route::Direct(CopyMethod::CopyEngine),
            RouteName::DirectSm => Route::Direct(CopyMethod::SmKernel),
            RouteName::Host => Route::Host,
            RouteName::Relay { via } => Route::Relay(via),
            RouteName::GpudirectRdma => Route::GpudirectRdma,
            RouteName::NetStaged => Route::NetStaged,
            RouteName::Resident => Route::Resident,
        }
    }
}

impl From<&PathShare> for PlannedPath {
    fn from(p: &PathShare) -> Self {
        PlannedPath {
            route: p.route.into(),
            bytes: p.bytes,
            predicted_us: p.predicted_us,
        }
    }
}

/// A strategy and the time predicted for it, µs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Predicted<S> {
    pub strategy: S,
    pub predicted_us: f64,
}

/// A strategy a pair cannot use.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Unusable {
    pub strategy: Strategy,
    pub reason: String,
}

/// What one size of the engine benchmark measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Proof {
    /// Every usable strategy: predicted and measured GPU time (median, every byte verified).
    pub measured: Vec<MeasuredStrategy>,
    /// The fastest strategy measured.
    pub best: Strategy,
    /// The pick's time over the fastest's − 1: 0 when the pick was the fastest.
    pub regret: f64,
    /// The same bytes moved without the engine.
    pub plain_copy: PlainCopy,
    /// The pick through the whole engine, host clock from the planning call until `wait`
    /// returns, µs.
    pub engine_wall_us: f64,
    /// `engine_wall_us` over the plain copy's `wall_us` − 1.
    pub engine_overhead: f64,
}

/// One strategy at one size, predicted and measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MeasuredStrategy {
    pub strategy: Strategy,
    /// Bytes per pipeline step (in the sweep's points).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_bytes: Option<u64>,
    pub predicted_us: f64,
    /// Median GPU time from the transfer's start event to its end event.
    pub measured_us: f64,
    /// A split's routes: when each was predicted to end and when it did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<MeasuredRoute>,
    /// How far apart the split's routes ended: (latest − earliest) / latest.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub route_spread: Option<f64>,
}

/// One route of a split, measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct MeasuredRoute {
    #[serde(flatten)]
    pub route: RouteName,
    pub bytes: u64,
    /// When the planner predicted the route to end, µs from the transfer's start.
    pub predicted_us: f64,
    /// When its last operation ended, GPU time from the transfer's start (median), µs.
    pub measured_end_us: f64,
}

/// One plain copy-engine copy queued straight on the backend: what a user writes without
/// peerlink.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlainCopy {
    /// GPU time between events around the copy, µs (median).
    pub gpu_us: f64,
    /// Host clock from the copy call until the host's event synchronisation returns, µs (median).
    pub wall_us: f64,
    pub what: String,
}

impl Proof {
    /// The proof of `point`, its strategies' chunk sizes given where `with_chunks`.
    fn new(point: &Point, with_chunks: bool) -> Proof {
        Proof {
            measured: point
                .timings
                .iter()
                .map(|t| MeasuredStrategy {
                    strategy: t.strategy,
                    chunk_bytes: with_chunks.then_some(t.chunk_bytes),
                    predicted_us: t.predicted_us,
                    measured_us: t.measured_us,
                    routes: t
                        .routes
                        .iter()
                        .map(|r| MeasuredRoute {
                            route: r.route.into(),
                            bytes: r.bytes,
                            predicted_us: r.predicted_us,
                            measured_end_us: r.measured_us,
                        })
                        .collect(),
                    route_spread: t.route_spread(),
                })
                .collect(),
            best: point.best,
            regret: point.regret,
            plain_copy: PlainCopy {
                gpu_us: point.raw.gpu_us,
                wall_us: point.raw.wall_us,
                what: "one copy-engine copy queued straight on the backend (cudaMemcpyAsync)"
                    .into(),
            },
            engine_wall_us: point.engine_wall_us,
            engine_overhead: point.overhead(),
        }
    }
}

impl PlanDocument {
    pub fn new(host: &Topology, view: &PlanView<'_>) -> PlanDocument {
        let plan = view.plan;
        PlanDocument {
            header: Header::new(Self::SCHEMA, host),
            model: view.model.to_string(),
            src: plan.src,
            dst: plan.dst,
            bytes: plan.bytes,
            strategy: plan.strategy,
            chunk_bytes: plan.chunk_bytes,
            predicted_us: plan.predicted_us,
            predicted_gbps: gbps(plan.bytes, plan.predicted_us),
            paths: plan.paths.iter().map(PlannedPath::from).collect(),
            alternatives: predictions(&plan.alternatives),
            unusable: view
                .unusable
                .iter()
                .map(|(strategy, reason)| Unusable {
                    strategy: *strategy,
                    reason: reason.clone(),
                })
                .collect(),
            proof: view
                .proof
                .and_then(|r| r.points.first())
                .map(|point| Proof::new(point, false)),
            host_route_beside_direct: view.pricing(),
            network: view.network.clone(),
        }
    }
}

fn predictions<S: Copy>(alternatives: &[(S, f64)]) -> Vec<Predicted<S>> {
    alternatives
        .iter()
        .map(|&(strategy, predicted_us)| Predicted {
            strategy,
            predicted_us,
        })
        .collect()
}

/// The engine benchmark over a size sweep: every strategy and the pick at each size.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlanSweepDocument {
    #[serde(flatten)]
    pub header: Header,
    pub model: String,
    pub src: usize,
    pub dst: usize,
    /// The largest regret over the sweep.
    pub worst_regret: f64,
    pub points: Vec<SweepPoint>,
}

impl_document!(PlanSweepDocument, "peerlink.plan-sweep/1");

/// One size of the engine benchmark.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct SweepPoint {
    pub bytes: u64,
    /// The planner's pick at this size.
    pub pick: Strategy,
    #[serde(flatten)]
    pub proof: Proof,
}

impl PlanSweepDocument {
    pub fn new(host: &Topology, view: &SweepView<'_>) -> PlanSweepDocument {
        let r = view.report;
        PlanSweepDocument {
            header: Header::new(Self::SCHEMA, host),
            model: view.model.to_string(),
            src: r.src,
            dst: r.dst,
            worst_regret: r.worst_regret(),
            points: r
                .points
                .iter()
                .map(|p| SweepPoint {
                    bytes: p.bytes,
                    pick: p.pick,
                    proof: Proof::new(p, true),
                })
                .collect(),
        }
    }
}

/// How the planner would move a batch of small messages, and (with `--prove`) every batch
/// strategy timed against as many plain copies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlanBatchDocument {
    #[serde(flatten)]
    pub header: Header,
    pub model: String,
    pub src: usize,
    pub dst: usize,
    pub messages: usize,
    pub message_bytes: u64,
    /// The pick.
    pub strategy: BatchStrategy,
    pub predicted_us: f64,
    pub alternatives: Vec<Predicted<BatchStrategy>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub proof: Option<BatchProof>,
}

impl_document!(PlanBatchDocument, "peerlink.plan-batch/1");

/// Every way of moving the batch, measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct BatchProof {
    pub what: String,
    /// What the planner picks for the batch.
    pub pick: BatchStrategy,
    /// The messages as copy-engine copies queued one by one straight on the backend.
    pub plain_copies: BatchTiming,
    /// The engine's batch call, validation and planning included in every run.
    pub engine_one_call: BatchTiming,
    /// Each batch strategy prepared once, then run.
    pub prepared: Vec<BatchTiming>,
    /// Plain copies' time per message over the engine's.
    pub speedup_over_plain: f64,
}

impl PlanBatchDocument {
    pub fn new(host: &Topology, view: &BatchView<'_>) -> PlanBatchDocument {
        let plan = view.plan;
        PlanBatchDocument {
            header: Header::new(Self::SCHEMA, host),
            model: view.model.to_string(),
            src: plan.src,
            dst: plan.dst,
            messages: view.count,
            message_bytes: view.size,
            strategy: plan.strategy,
            predicted_us: plan.predicted_us,
            alternatives: predictions(&plan.alternatives),
            proof: view.proof.map(|r| BatchProof {
                what: "host clock per message, from the call to the completion seen, median of \
                       runs; every byte verified"
                    .into(),
                pick: r.pick,
                plain_copies: r.plain.clone(),
                engine_one_call: r.one_call.clone(),
                prepared: r.prepared.clone(),
                speedup_over_plain: r.speedup(),
            }),
        }
    }
}

/// Every GPU's transfer at once: each alone and together, and each way of running them all.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct PlanConcurrentDocument {
    #[serde(flatten)]
    pub header: Header,
    pub model: String,
    /// The traffic asked for: `shift` or `shift:K`.
    pub traffic: String,
    /// Bytes of each transfer.
    pub bytes: u64,
    pub flows: Vec<concurrent::Flow>,
    /// The planner's picks first (`strategy` null), then each strategy every flow can use; none
    /// in a partial document (a stop came before every way was timed and verified).
    pub ways: Vec<concurrent::Way>,
    /// Each flow's bytes over its GPU time alone, summed, GB/s.
    pub alone_gbps: f64,
    /// Each flow's bytes over its GPU time while all run (the picks), summed, GB/s; absent with
    /// the ways.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub together_gbps: Option<f64>,
    /// The picks' makespan over the fastest way's − 1; absent with the ways.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub regret: Option<f64>,
}

impl_document!(PlanConcurrentDocument, "peerlink.plan-concurrent/1");

impl PlanConcurrentDocument {
    /// The fastest way (the picks where none beat them); none in a partial document.
    pub fn fastest(&self) -> Option<&concurrent::Way> {
        self.ways
            .iter()
            .min_by(|a, b| a.makespan_us.total_cmp(&b.makespan_us))
    }

    pub fn new(host: &Topology, view: &ConcurrentView<'_>) -> PlanConcurrentDocument {
        let r = view.report;
        PlanConcurrentDocument {
            header: Header::new(Self::SCHEMA, host),
            model: view.model.to_string(),
            traffic: view.traffic.to_string(),
            bytes: r.bytes,
            flows: r.flows.clone(),
            ways: r.ways.clone(),
            alone_gbps: r.alone_gbps,
            together_gbps: r.together_gbps,
            regret: r.regret,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::topology::test_support::device;
    use crate::topology::Source;

    /// GPU 0 → GPU 5, 1 MiB split over a relay and host memory, with two alternatives.
    pub(crate) fn split_plan() -> Plan {
        Plan {
            src: 0,
            dst: 5,
            bytes: 1 << 20,
            strategy: Strategy::Split,
            chunk_bytes: 256 << 10,
            paths: vec![
                PathShare {
                    route: Route::Relay(1),
                    offset: 0,
                    bytes: 600 << 10,
                    predicted_us: 30.0,
                },
                PathShare {
                    route: Route::Host,
                    offset: 600 << 10,
                    bytes: 424 << 10,
                    predicted_us: 29.0,
                },
            ],
            predicted_us: 30.0,
            alternatives: vec![(Strategy::Relay, 45.0), (Strategy::Staged, 90.0)],
        }
    }

    pub(crate) fn host() -> Topology {
        Topology {
            source: Source::Sim("dgx1-v100".into()),
            driver_version: None,
            cuda_version: None,
            visible_devices: None,
            devices: (0..8).map(|i| device(i, Some(0), "0000:18:00.0")).collect(),
            pairs: Vec::new(),
            network: None,
        }
    }

    #[test]
    fn a_splits_pricing_names_the_direct_copys_pace_only_where_measured() {
        let p = split_plan();
        let view = |direct_pricing| PlanView {
            model: "profile",
            plan: &p,
            unusable: &[],
            proof: None,
            network: None,
            host_pricing: Some(BesideDirect::Estimate),
            direct_pricing,
        };
        let host = BesideDirect::Estimate.to_string();
        assert_eq!(view(None).pricing(), Some(host.clone()));
        let pace = DirectPace {
            rate_fraction: 1.016,
            fixed_us: 2.6,
        };
        let both = view(Some(pace)).pricing().unwrap();
        assert!(
            both.starts_with(&host)
                && both.ends_with("the direct copy at 1.016 of its rate, +2.6 µs a transfer"),
            "{both}"
        );
    }

    /// [`split_plan`]'s document on [`host`], priced by the defaults, with direct-ce unusable.
    pub(crate) fn split_plan_document() -> PlanDocument {
        let unusable = vec![(Strategy::DirectCe, "needs P2P".to_string())];
        PlanDocument::new(
            &host(),
            &PlanView {
                model: "defaults",
                plan: &split_plan(),
                unusable: &unusable,
                proof: None,
                network: None,
                host_pricing: None,
                direct_pricing: None,
            },
        )
    }

    #[test]
    fn json_names_the_pick_paths_and_every_alternative() {
        let doc = split_plan_document();
        let json = serde_json::to_value(&doc).unwrap();
        assert_eq!(json["schema"], PlanDocument::SCHEMA);
        assert_eq!(json["strategy"], "split");
        assert_eq!(json["simulated"], true);
        assert_eq!(json["paths"][0]["route"], "relay");
        assert_eq!(json["paths"][0]["via"], 1);
        assert_eq!(json["paths"][1]["route"], "host");
        assert!(json["paths"][1].get("via").is_none());
        assert_eq!(json["alternatives"][1]["strategy"], "staged");
        assert_eq!(json["alternatives"][1]["predicted_us"], 90.0);
        assert_eq!(json["unusable"][0]["strategy"], "direct-ce");
        assert!(json.get("proof").is_none());
        let back: PlanDocument = crate::document::read(&crate::document::to_json(&doc)).unwrap();
        assert_eq!(back, doc);
    }
}
