//! `peerlink plan`: the planner's pick for one transfer, its prediction and every alternative's,
//! and (with `--prove`) the times measured for each on the backend.

use super::table::plain;
use crate::engine::benchmark::Report;
use crate::engine::{Plan, Route, Strategy};
use crate::units::{format_bytes, gbps};
use comfy_table::CellAlignment;
use serde_json::{json, Value};
use std::fmt::Write;

/// JSON schema name of the `plan` document.
pub const SCHEMA: &str = "peerlink.plan/1";

/// Everything `plan` reports.
pub struct PlanView<'a> {
    /// `cuda` or `sim:<preset>`.
    pub source: &'a str,
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
        "simulated": view.source.starts_with("sim:"),
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
        doc["proof"] = json!({
            "measured": measured,
            "best": point.best,
            "regret": point.regret,
        });
    }
    doc
}

/// The human-readable report.
pub fn text(view: &PlanView<'_>) -> String {
    let plan = view.plan;
    let mut out = String::new();
    if let Some(banner) = super::simulated_banner(view.source) {
        let _ = writeln!(out, "{banner}\n");
    }
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
        let what = if view.source.starts_with("sim:") {
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
            source: "sim:dgx1-v100",
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
            source: "sim:dgx1-v100",
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
