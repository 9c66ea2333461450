//! `peerlink plan` as text: the planner's pick for one transfer, its prediction and every
//! alternative's, and (with `--prove`) the times measured for each on the backend.

use super::export::{Records, Tables};
use super::table::plain;
use crate::backend::CopyMethod;
use crate::bench::proof::batch::BatchTiming;
use crate::bench::proof::concurrent;
use crate::bench::proof::document::{
    BatchView, ConcurrentView, PlanBatchDocument, PlanConcurrentDocument, PlanDocument,
    PlanSweepDocument, PlanView, Predicted, SweepView,
};
use crate::bench::proof::sweep::{Point, StrategyTiming, BALANCE_TOLERANCE};
use crate::engine::{Route, Strategy};
use crate::topology::Source;
use crate::units::{format_bytes, gbps};
use comfy_table::CellAlignment;
use serde_json::{json, Value};
use std::fmt::Write;

impl Tables for PlanDocument {
    fn tables(&self) -> Vec<Records> {
        tables(self)
    }
}

impl Tables for PlanSweepDocument {
    fn tables(&self) -> Vec<Records> {
        sweep_tables(self)
    }
}

impl Tables for PlanBatchDocument {
    fn tables(&self) -> Vec<Records> {
        batch_tables(self)
    }
}

impl Tables for PlanConcurrentDocument {
    fn tables(&self) -> Vec<Records> {
        vec![
            Records::of("flows", &self.flows),
            Records::of("ways", &self.ways),
        ]
    }
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
         call-to-completion time against the plain copy's, in %; split's routes apart = (latest \
         − earliest) / latest of its routes' measured ends\n"
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
    header.extend(
        [
            "plain µs",
            "regret",
            "engine vs plain",
            "split's routes apart",
        ]
        .map(String::from),
    );
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
        row.push(
            p.timing(Strategy::Split)
                .and_then(StrategyTiming::route_spread)
                .map_or_else(|| "—".to_string(), |s| format!("{:.1}%", s * 100.0)),
        );
        table.add_row(row);
    }
    for column in table.column_iter_mut().skip(2) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "{table}");
    let _ = writeln!(out, "\nworst regret: {:.1}%", r.worst_regret() * 100.0);
    out
}

/// A way's name: the planner's picks, or one strategy for every flow.
fn way_name(way: &concurrent::Way) -> String {
    way.strategy
        .map_or_else(|| "planner's picks".to_string(), |s| format!("{s} for all"))
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
        "each flow's pick (planned as it runs: its host route priced both ways where another flow \
         goes the opposite way through the host), its GPU time alone and while every flow runs \
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
    let _ = writeln!(out, "costs: {}", view.model);
    if let Some(network) = &view.network {
        let _ = writeln!(out, "network: {network}");
    }
    out.push('\n');
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
    if let Some(pricing) = view.pricing() {
        let _ = writeln!(out, "  the host route beside the direct copy: {pricing}");
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
    if let Some(split) = point.and_then(|p| p.timing(Strategy::Split)) {
        route_lines(&mut out, split);
    }
    if let Some(point) = point {
        proof_lines(&mut out, view.source, point);
    }
    out
}

/// When each route of the measured split ended against its prediction, and whether they ended
/// together.
fn route_lines(out: &mut String, split: &StrategyTiming) {
    let Some(spread) = split.route_spread() else {
        return;
    };
    let _ = writeln!(
        out,
        "\nsplit's routes (GPU time from the transfer's start, median):"
    );
    for r in &split.routes {
        let _ = writeln!(
            out,
            "  {:<26} {:>12}  predicted {:>10.1} µs  ended {:>10.1} µs",
            r.route.to_string(),
            format_bytes(r.bytes),
            r.predicted_us,
            r.measured_us
        );
    }
    let has = |route| split.routes.iter().any(|r| r.route == route);
    let verdict = if spread > BALANCE_TOLERANCE {
        let tune = if has(Route::Host) && has(Route::Direct(CopyMethod::CopyEngine)) {
            "; `peerlink tune` measures how the host route runs beside the direct copy, and a \
             profile from it divides the bytes by that"
        } else {
            ""
        };
        format!(
            "unbalanced (more than {:.0}%: the routes that ended first could have carried more){tune}",
            BALANCE_TOLERANCE * 100.0
        )
    } else {
        format!("balanced (within {:.0}%)", BALANCE_TOLERANCE * 100.0)
    };
    let _ = writeln!(out, "  ended {:.1}% apart: {verdict}", spread * 100.0);
}

/// A plan's tables: every strategy's prediction (the pick first) with, after `--prove`, its
/// measured time; the routes of the pick; the strategies the pair cannot use.
fn tables(doc: &PlanDocument) -> Vec<Records> {
    let pick = Predicted {
        strategy: doc.strategy,
        predicted_us: doc.predicted_us,
    };
    let rows: Vec<Value> = std::iter::once(&pick)
        .chain(&doc.alternatives)
        .map(|p| {
            let measured = doc.proof.as_ref().and_then(|proof| {
                proof
                    .measured
                    .iter()
                    .find(|m| m.strategy == p.strategy)
                    .map(|m| m.measured_us)
            });
            json!({
                "strategy": p.strategy,
                "pick": p.strategy == doc.strategy,
                "predicted_us": p.predicted_us,
                "predicted_gbps": gbps(doc.bytes, p.predicted_us),
                "measured_us": measured,
            })
        })
        .collect();
    vec![
        Records::of("strategies", &rows),
        Records::of("paths", &doc.paths),
        Records::of("unusable", &doc.unusable),
    ]
}

/// The engine benchmark as one long table: a row per size and strategy.
fn sweep_tables(doc: &PlanSweepDocument) -> Vec<Records> {
    let rows: Vec<Value> = doc
        .points
        .iter()
        .flat_map(|p| {
            p.proof.measured.iter().map(move |m| {
                json!({
                    "bytes": p.bytes,
                    "strategy": m.strategy,
                    "pick": m.strategy == p.pick,
                    "fastest": m.strategy == p.proof.best,
                    "chunk_bytes": m.chunk_bytes,
                    "predicted_us": m.predicted_us,
                    "measured_us": m.measured_us,
                    "regret": p.proof.regret,
                    "plain_gpu_us": p.proof.plain_copy.gpu_us,
                    "plain_wall_us": p.proof.plain_copy.wall_us,
                    "engine_wall_us": p.proof.engine_wall_us,
                })
            })
        })
        .collect();
    vec![Records::of("points", &rows)]
}

/// A batch plan's tables: every batch strategy's prediction, and after `--prove` every way
/// measured.
fn batch_tables(doc: &PlanBatchDocument) -> Vec<Records> {
    let pick = Predicted {
        strategy: doc.strategy,
        predicted_us: doc.predicted_us,
    };
    let predicted: Vec<Value> = std::iter::once(&pick)
        .chain(&doc.alternatives)
        .map(|p| {
            json!({
                "strategy": p.strategy,
                "pick": p.strategy == doc.strategy,
                "predicted_us": p.predicted_us,
            })
        })
        .collect();
    let mut tables = vec![Records::of("predicted", &predicted)];
    if let Some(proof) = &doc.proof {
        let ways: Vec<&BatchTiming> = [&proof.plain_copies, &proof.engine_one_call]
            .into_iter()
            .chain(&proof.prepared)
            .collect();
        tables.push(Records::of("measured", &ways));
    }
    tables
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::proof::document::tests::split_plan;

    #[test]
    fn text_says_simulated_and_lists_every_strategy() {
        let p = split_plan();
        let unusable = vec![(Strategy::DirectCe, "needs P2P".to_string())];
        let text = text(&PlanView {
            source: &Source::Sim("dgx1-v100".into()),
            model: "defaults",
            plan: &p,
            unusable: &unusable,
            proof: None,
            network: None,
            host_pricing: None,
            direct_pricing: None,
        });
        assert!(text.starts_with("*** SIMULATED"), "{text}");
        assert!(text.contains("pick: split"), "{text}");
        assert!(text.contains("via GPU 1"), "{text}");
        assert!(text.contains("split (pick)"), "{text}");
        assert!(text.contains("relay") && text.contains("staged"), "{text}");
        assert!(text.contains("not usable: direct-ce — needs P2P"), "{text}");
    }
}
