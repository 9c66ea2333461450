//! `peerlink plan`: the planner's pick for one transfer, its prediction and every alternative's,
//! and (with `--prove`) the times measured for each on the backend.

use super::table::plain;
use crate::engine::benchmark::{BatchReport, BatchTiming, Point, Report};
use crate::engine::{concurrent, BatchPlan, Plan, Route, Strategy};
use crate::topology::Source;
use crate::units::{format_bytes, gbps};
use comfy_table::CellAlignment;
use serde_json::{json, Value};
use std::fmt::Write;

/// JSON schema name of the `plan` document.
pub const SCHEMA: &str = "peerlink.plan/1";
/// JSON schema name of the engine benchmark over a size sweep (`plan --sizes`).
pub const SWEEP_SCHEMA: &str = "peerlink.plan-sweep/1";
/// JSON schema name of a batch plan (`plan --messages`).
pub const BATCH_SCHEMA: &str = "peerlink.plan-batch/1";
/// JSON schema name of concurrent traffic (`plan --concurrent`).
pub const CONCURRENT_SCHEMA: &str = "peerlink.plan-concurrent/1";

/// Everything `plan` reports.
pub struct PlanView<'a> {
    pub source: &'a Source,
    /// Where the costs came from, in words.
    pub model: &'a str,
    pub plan: &'a Plan,
    /// Strategies this pair cannot use, with the reason.
    pub unusable: &'a [(Strategy, String)],
    /// Measurements of every strategy at this size, where asked for.
    pub proof: Option<&'a Report>,
}

fn route_json(route: Route) -> Value {
    match route {
        Route::Direct(method) => {
            let name = match method {
                crate::backend::CopyMethod::CopyEngine => "direct-ce",
                crate::backend::CopyMethod::SmKernel => "direct-sm",
            };
            json!({ "route": name })
        }
        Route::Host => json!({ "route": "host" }),
        Route::Relay(via) => json!({ "route": "relay", "via": via }),
    }
}

/// The `plan --json` document.
pub fn json(view: &PlanView<'_>) -> Value {
    let plan = view.plan;
    let paths: Vec<Value> = plan
        .paths
        .iter()
        .map(|p| {
            let mut v = route_json(p.route);
            v["bytes"] = json!(p.bytes);
            v["predicted_us"] = json!(p.predicted_us);
            v
        })
        .collect();
    let alternatives: Vec<Value> = plan
        .alternatives
        .iter()
        .map(|(s, us)| json!({ "strategy": s, "predicted_us": us }))
        .collect();
    let unusable: Vec<Value> = view
        .unusable
        .iter()
        .map(|(s, why)| json!({ "strategy": s, "reason": why }))
        .collect();
    let mut doc = json!({
        "schema": SCHEMA,
        "source": view.source,
        "simulated": view.source.is_simulated(),
        "model": view.model,
        "src": plan.src,
        "dst": plan.dst,
        "bytes": plan.bytes,
        "strategy": plan.strategy,
        "chunk_bytes": plan.chunk_bytes,
        "predicted_us": plan.predicted_us,
        "predicted_gbps": gbps(plan.bytes, plan.predicted_us),
        "paths": paths,
        "alternatives": alternatives,
        "unusable": unusable,
    });
    if let Some(point) = view.proof.and_then(|r| r.points.first()) {
        let measured: Vec<Value> = point
            .timings
            .iter()
            .map(|t| {
                json!({
                    "strategy": t.strategy,
                    "predicted_us": t.predicted_us,
                    "measured_us": t.measured_us,
                })
            })
            .collect();
        doc["proof"] = point_proof(point, measured);
    }
    doc
}

/// What one size of the engine benchmark measured, as JSON.
fn point_proof(point: &Point, measured: Vec<Value>) -> Value {
    json!({
        "measured": measured,
        "best": point.best,
        "regret": point.regret,
        "plain_copy": {
            "gpu_us": point.raw.gpu_us,
            "wall_us": point.raw.wall_us,
            "what": "one copy-engine copy queued straight on the backend (cudaMemcpyAsync)",
        },
        "engine_wall_us": point.engine_wall_us,
        "engine_overhead": point.overhead(),
    })
}

/// The closing lines of a proof: regret, and the engine against a plain copy.
fn proof_lines(out: &mut String, source: &Source, point: &Point) {
    let what = if source.is_simulated() {
        "simulated GPU time"
    } else {
        "GPU time"
    };
    let _ = writeln!(
        out,
        "\nmeasured ({what}, median, every byte verified): fastest {}, the pick's regret {:.1}%",
        point.best,
        point.regret * 100.0
    );
    let _ = writeln!(
        out,
        "plain copy-engine copy (no engine): {:.1} µs GPU, {:.1} µs call to completion; the \
         engine's pick, planned and submitted: {:.1} µs call to completion ({:+.1}%)",
        point.raw.gpu_us,
        point.raw.wall_us,
        point.engine_wall_us,
        point.overhead() * 100.0
    );
}

/// The engine benchmark over a size sweep.
pub struct SweepView<'a> {
    pub model: &'a str,
    pub report: &'a Report,
}

/// The `plan --sizes --json` document.
pub fn sweep_json(view: &SweepView<'_>) -> Value {
    let r = view.report;
    let points: Vec<Value> = r
        .points
        .iter()
        .map(|p| {
            let measured = p
                .timings
                .iter()
                .map(|t| {
                    json!({
                        "strategy": t.strategy,
                        "chunk_bytes": t.chunk_bytes,
                        "predicted_us": t.predicted_us,
                        "measured_us": t.measured_us,
                    })
                })
                .collect();
            let mut v = point_proof(p, measured);
            v["bytes"] = json!(p.bytes);
            v["pick"] = json!(p.pick);
            v
        })
        .collect();
    json!({
        "schema": SWEEP_SCHEMA,
        "source": r.source,
        "simulated": r.source.is_simulated(),
        "model": view.model,
        "src": r.src,
        "dst": r.dst,
        "worst_regret": r.worst_regret(),
        "points": points,
    })
}

/// The engine benchmark's table: one row per size.
pub fn sweep_text(view: &SweepView<'_>) -> String {
    let r = view.report;
    let mut out = super::opening(&r.source);
    let _ = writeln!(
        out,
        "engine benchmark, GPU {} → GPU {} ({}); costs: {}",
        r.src, r.dst, r.source, view.model
    );
    let _ = writeln!(
        out,
        "each strategy's GPU time (median, every byte verified); regret = pick / fastest − 1; plain \
         = one cudaMemcpyAsync with no engine (GPU time); engine vs plain = the engine's \
         call-to-completion time against the plain copy's, in %\n"
    );
    let mut strategies: Vec<Strategy> = r
        .points
        .iter()
        .flat_map(|p| p.timings.iter().map(|t| t.strategy))
        .collect();
    strategies.dedup();
    strategies.sort_by_key(|s| Strategy::ALL.iter().position(|a| a == s));
    strategies.dedup();
    let mut header = vec!["size".to_string(), "pick".to_string()];
    header.extend(strategies.iter().map(|s| format!("{s} µs")));
    header.extend(["plain µs", "regret", "engine vs plain"].map(String::from));
    let mut table = plain(header);
    for p in &r.points {
        let mut row = vec![format_bytes(p.bytes), p.pick.to_string()];
        for s in &strategies {
            row.push(
                p.timing(*s)
                    .map_or_else(|| "—".to_string(), |t| format!("{:.1}", t.measured_us)),
            );
        }
        row.push(format!("{:.1}", p.raw.gpu_us));
        row.push(format!("{:.1}%", p.regret * 100.0));
        row.push(format!("{:+.1}%", p.overhead() * 100.0));
        table.add_row(row);
    }
    for column in table.column_iter_mut().skip(2) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "{table}");
    let _ = writeln!(out, "\nworst regret: {:.1}%", r.worst_regret() * 100.0);
    out
}

/// Concurrent traffic, measured (`plan --concurrent`).
pub struct ConcurrentView<'a> {
    pub model: &'a str,
    pub traffic: &'a str,
    pub report: &'a concurrent::Report,
}

/// A way's name: the planner's picks, or one strategy for every flow.
fn way_name(way: &concurrent::Way) -> String {
    way.strategy
        .map_or_else(|| "planner's picks".to_string(), |s| format!("{s} for all"))
}

/// The `plan --concurrent --json` document.
pub fn concurrent_json(view: &ConcurrentView<'_>) -> Value {
    let r = view.report;
    let flows: Vec<Value> = r
        .flows
        .iter()
        .map(|f| {
            json!({
                "src": f.src,
                "dst": f.dst,
                "pick": f.pick,
                "alone_us": f.alone_us,
                "together_us": f.together_us,
            })
        })
        .collect();
    let ways: Vec<Value> = r
        .ways
        .iter()
        .map(|w| json!({"strategy": w.strategy, "makespan_us": w.makespan_us, "gbps": w.gbps}))
        .collect();
    json!({
        "schema": CONCURRENT_SCHEMA,
        "source": r.source,
        "simulated": r.source.is_simulated(),
        "model": view.model,
        "traffic": view.traffic,
        "bytes": r.bytes,
        "flows": flows,
        "ways": ways,
        "alone_gbps": r.alone_gbps,
        "together_gbps": r.together_gbps,
        "regret": r.regret,
    })
}

/// Concurrent traffic as a human reads it: each flow alone and together, then each way.
pub fn concurrent_text(view: &ConcurrentView<'_>) -> String {
    let r = view.report;
    let mut out = super::opening(&r.source);
    let _ = writeln!(
        out,
        "concurrent traffic `{}`: {} flows of {} at once ({}); costs: {}",
        view.traffic,
        r.flows.len(),
        format_bytes(r.bytes),
        r.source,
        view.model
    );
    let _ = writeln!(
        out,
        "each flow's pick (planned as if alone), its GPU time alone and while every flow runs \
         (median, every byte verified)\n"
    );
    let mut flows = plain(
        ["flow", "pick", "alone µs", "together µs", "slowdown"]
            .map(String::from)
            .to_vec(),
    );
    for f in &r.flows {
        flows.add_row(vec![
            format!("GPU {} → GPU {}", f.src, f.dst),
            f.pick.to_string(),
            format!("{:.1}", f.alone_us),
            format!("{:.1}", f.together_us),
            format!("{:+.1}%", (f.together_us / f.alone_us - 1.0) * 100.0),
        ]);
    }
    for column in flows.column_iter_mut().skip(2) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "{flows}");
    let _ = writeln!(
        out,
        "\naggregate, each flow's bytes over its GPU time, summed: {:.1} GB/s alone, {:.1} GB/s \
         together ({:+.1}%)\n",
        r.alone_gbps,
        r.together_gbps,
        (r.together_gbps / r.alone_gbps - 1.0) * 100.0
    );
    let mut ways = plain(
        ["way", "makespan µs", "GB/s end to end"]
            .map(String::from)
            .to_vec(),
    );
    for w in &r.ways {
        ways.add_row(vec![
            way_name(w),
            format!("{:.1}", w.makespan_us),
            format!("{:.1}", w.gbps),
        ]);
    }
    for column in ways.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(
        out,
        "every flow at once, host clock from the first submission until all are seen done \
         (median):\n{ways}"
    );
    let _ = writeln!(
        out,
        "\nfastest: {}; the picks' regret {:.1}%",
        way_name(r.best()),
        r.regret * 100.0
    );
    out
}

/// A batch plan and, with `--prove`, its measurements.
pub struct BatchView<'a> {
    pub source: &'a Source,
    pub model: &'a str,
    pub count: usize,
    pub size: u64,
    pub plan: &'a BatchPlan,
    pub proof: Option<&'a BatchReport>,
}

fn timing_json(t: &BatchTiming) -> Value {
    json!({
        "name": t.name,
        "prepare_us": t.prepare_us,
        "per_message_us": t.per_message_us,
    })
}

/// The `plan --messages --json` document.
pub fn batch_json(view: &BatchView<'_>) -> Value {
    let plan = view.plan;
    let mut doc = json!({
        "schema": BATCH_SCHEMA,
        "source": view.source,
        "simulated": view.source.is_simulated(),
        "model": view.model,
        "src": plan.src,
        "dst": plan.dst,
        "messages": view.count,
        "message_bytes": view.size,
        "strategy": plan.strategy.name(),
        "predicted_us": plan.predicted_us,
        "alternatives": plan
            .alternatives
            .iter()
            .map(|(s, us)| json!({ "strategy": s.name(), "predicted_us": us }))
            .collect::<Vec<_>>(),
    });
    if let Some(r) = view.proof {
        doc["proof"] = json!({
            "what": "host clock per message, from the call to the completion seen, median of runs; \
                     every byte verified",
            "pick": r.pick.name(),
            "plain_copies": timing_json(&r.plain),
            "engine_one_call": timing_json(&r.one_call),
            "prepared": r.prepared.iter().map(timing_json).collect::<Vec<_>>(),
            "speedup_over_plain": r.speedup(),
        });
    }
    doc
}

/// The human-readable batch plan.
pub fn batch_text(view: &BatchView<'_>) -> String {
    let plan = view.plan;
    let mut out = super::opening(view.source);
    let _ = writeln!(
        out,
        "GPU {} → GPU {}, {} messages of {} ({})\ncosts: {}\n",
        plan.src,
        plan.dst,
        view.count,
        format_bytes(view.size),
        view.source,
        view.model
    );
    let mut table = plain(vec!["batch strategy".into(), "predicted µs".into()]);
    table.add_row(vec![
        format!("{} (pick)", plan.strategy.name()),
        format!("{:.1}", plan.predicted_us),
    ]);
    for (s, us) in &plan.alternatives {
        table.add_row(vec![s.name().to_string(), format!("{us:.1}")]);
    }
    let _ = writeln!(out, "{table}");
    if let Some(r) = view.proof {
        let _ = writeln!(
            out,
            "\nmeasured: host clock per message, call to completion seen, median; every byte \
             verified"
        );
        let mut table = plain(vec![
            "way".into(),
            "µs per message".into(),
            "prepared once, µs".into(),
        ]);
        for t in std::iter::once(&r.plain)
            .chain(std::iter::once(&r.one_call))
            .chain(&r.prepared)
        {
            table.add_row(vec![
                t.name.clone(),
                format!("{:.4}", t.per_message_us),
                format!("{:.1}", t.prepare_us),
            ]);
        }
        let _ = writeln!(out, "{table}");
        let _ = writeln!(
            out,
            "the engine in one call ({}) is {:.0}× faster per message than plain copies",
            r.pick.name(),
            r.speedup()
        );
    }
    out
}

/// The human-readable report.
pub fn text(view: &PlanView<'_>) -> String {
    let plan = view.plan;
    let mut out = super::opening(view.source);
    let _ = writeln!(
        out,
        "GPU {} → GPU {}, {} ({})",
        plan.src,
        plan.dst,
        format_bytes(plan.bytes),
        view.source
    );
    let _ = writeln!(out, "costs: {}\n", view.model);
    let chunks = if plan.chunk_bytes < plan.bytes {
        format!(", in chunks of {}", format_bytes(plan.chunk_bytes))
    } else {
        String::new()
    };
    let _ = writeln!(
        out,
        "pick: {} — predicted {:.1} µs ({:.1} GB/s){chunks}",
        plan.strategy,
        plan.predicted_us,
        gbps(plan.bytes, plan.predicted_us)
    );
    for p in &plan.paths {
        let _ = writeln!(
            out,
            "  {:<26} {:>12}  {:>10.1} µs",
            p.route.to_string(),
            format_bytes(p.bytes),
            p.predicted_us
        );
    }
    let point = view.proof.and_then(|r| r.points.first());
    let mut header = vec![
        "strategy".to_string(),
        "predicted µs".to_string(),
        "GB/s".to_string(),
    ];
    if point.is_some() {
        header.push("measured µs".to_string());
    }
    let mut table = plain(header);
    let rows = std::iter::once((plan.strategy, plan.predicted_us)).chain(plan.alternatives.clone());
    for (strategy, us) in rows {
        let mark = if strategy == plan.strategy {
            " (pick)"
        } else {
            ""
        };
        let mut row = vec![
            format!("{strategy}{mark}"),
            format!("{us:.1}"),
            format!("{:.1}", gbps(plan.bytes, us)),
        ];
        if let Some(point) = point {
            row.push(
                point
                    .timing(strategy)
                    .map_or_else(|| "—".to_string(), |t| format!("{:.1}", t.measured_us)),
            );
        }
        table.add_row(row);
    }
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "\n{table}");
    for (strategy, why) in view.unusable {
        let _ = writeln!(out, "not usable: {strategy} — {why}");
    }
    if let Some(point) = point {
        proof_lines(&mut out, view.source, point);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::PathShare;

    fn plan() -> Plan {
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

    #[test]
    fn json_names_the_pick_paths_and_every_alternative() {
        let p = plan();
        let unusable = vec![(Strategy::DirectCe, "needs P2P".to_string())];
        let doc = json(&PlanView {
            source: &Source::Sim("dgx1-v100".into()),
            model: "defaults",
            plan: &p,
            unusable: &unusable,
            proof: None,
        });
        assert_eq!(doc["schema"], SCHEMA);
        assert_eq!(doc["strategy"], "split");
        assert_eq!(doc["simulated"], true);
        assert_eq!(doc["paths"][0]["route"], "relay");
        assert_eq!(doc["paths"][0]["via"], 1);
        assert_eq!(doc["paths"][1]["route"], "host");
        assert_eq!(doc["alternatives"][1]["strategy"], "staged");
        assert_eq!(doc["alternatives"][1]["predicted_us"], 90.0);
        assert_eq!(doc["unusable"][0]["strategy"], "direct-ce");
        assert!(doc.get("proof").is_none());
    }

    #[test]
    fn text_says_simulated_and_lists_every_strategy() {
        let p = plan();
        let unusable = vec![(Strategy::DirectCe, "needs P2P".to_string())];
        let text = text(&PlanView {
            source: &Source::Sim("dgx1-v100".into()),
            model: "defaults",
            plan: &p,
            unusable: &unusable,
            proof: None,
        });
        assert!(text.starts_with("*** SIMULATED"), "{text}");
        assert!(text.contains("pick: split"), "{text}");
        assert!(text.contains("via GPU 1"), "{text}");
        assert!(text.contains("split (pick)"), "{text}");
        assert!(text.contains("relay") && text.contains("staged"), "{text}");
        assert!(text.contains("not usable: direct-ce — needs P2P"), "{text}");
    }
}
