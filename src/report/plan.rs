//! `peerlink plan` as text: the planner's pick for one transfer, its prediction and every
//! alternative's, and (with `--prove`) the times measured for each on the backend.

use super::export::{Records, Tables};
use super::table::plain;
use crate::bench::proof::batch::BatchTiming;
use crate::bench::proof::concurrent;
use crate::bench::proof::document::{
    BatchProof, MeasuredStrategy, PlanBatchDocument, PlanConcurrentDocument, PlanDocument,
    PlanSweepDocument, Predicted, Proof, RouteName,
};
use crate::bench::proof::sweep::BALANCE_TOLERANCE;
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
fn proof_lines(out: &mut String, source: &Source, proof: &Proof) {
    let what = if source.is_simulated() {
        "simulated GPU time"
    } else {
        "GPU time"
    };
    let _ = writeln!(
        out,
        "\nmeasured ({what}, median, every byte verified): fastest {}, the pick's regret {:.1}%",
        proof.best,
        proof.regret * 100.0
    );
    let _ = writeln!(
        out,
        "plain copy-engine copy (no engine): {:.1} µs GPU, {:.1} µs call to completion; the \
         engine's pick, planned and submitted: {:.1} µs call to completion ({:+.1}%)",
        proof.plain_copy.gpu_us,
        proof.plain_copy.wall_us,
        proof.engine_wall_us,
        proof.engine_overhead * 100.0
    );
}

/// What a proof measured of `strategy`, if it ran.
fn measured(proof: &Proof, strategy: Strategy) -> Option<&MeasuredStrategy> {
    proof.measured.iter().find(|m| m.strategy == strategy)
}

/// The engine benchmark's table: one row per size.
pub fn sweep_text(doc: &PlanSweepDocument) -> String {
    let source = &doc.header.source;
    let mut out = super::opening(source);
    let _ = writeln!(
        out,
        "engine benchmark, GPU {} → GPU {} ({source}); costs: {}",
        doc.src, doc.dst, doc.model
    );
    let _ = writeln!(
        out,
        "each strategy's GPU time (median, every byte verified); regret = pick / fastest − 1; plain \
         = one cudaMemcpyAsync with no engine (GPU time); engine vs plain = the engine's \
         call-to-completion time against the plain copy's, in %; split's routes apart = (latest \
         − earliest) / latest of its routes' measured ends\n"
    );
    let _ = writeln!(out, "{}", sweep_table(doc));
    let _ = writeln!(out, "\nworst regret: {:.1}%", doc.worst_regret * 100.0);
    out
}

/// A row per size: the pick, each strategy's time, the plain copy's, and how the pick fared.
fn sweep_table(doc: &PlanSweepDocument) -> comfy_table::Table {
    let mut strategies: Vec<Strategy> = doc
        .points
        .iter()
        .flat_map(|p| p.proof.measured.iter().map(|m| m.strategy))
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
    for p in &doc.points {
        let mut row = vec![format_bytes(p.bytes), p.pick.to_string()];
        for s in &strategies {
            row.push(
                measured(&p.proof, *s)
                    .map_or_else(|| "—".to_string(), |m| format!("{:.1}", m.measured_us)),
            );
        }
        row.push(format!("{:.1}", p.proof.plain_copy.gpu_us));
        row.push(format!("{:.1}%", p.proof.regret * 100.0));
        row.push(format!("{:+.1}%", p.proof.engine_overhead * 100.0));
        row.push(
            measured(&p.proof, Strategy::Split)
                .and_then(|m| m.route_spread)
                .map_or_else(|| "—".to_string(), |s| format!("{:.1}%", s * 100.0)),
        );
        table.add_row(row);
    }
    for column in table.column_iter_mut().skip(2) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

/// A way's name: the planner's picks, or one strategy for every flow.
fn way_name(way: &concurrent::Way) -> String {
    way.strategy
        .map_or_else(|| "planner's picks".to_string(), |s| format!("{s} for all"))
}

/// Concurrent traffic as a human reads it: each flow alone and together, then each way.
pub fn concurrent_text(doc: &PlanConcurrentDocument) -> String {
    let source = &doc.header.source;
    let mut out = super::opening(source);
    // A partial document holds the flows measured before the stop, not every flow of the traffic.
    let flows = match doc.regret {
        Some(_) => format!("{} flows", doc.flows.len()),
        None => format!("the {} flows measured before the stop", doc.flows.len()),
    };
    let _ = writeln!(
        out,
        "concurrent traffic `{}`: {flows} of {} at once ({source}); costs: {}",
        doc.traffic,
        format_bytes(doc.bytes),
        doc.model
    );
    let _ = writeln!(
        out,
        "each flow's pick (planned as it runs: its host route priced both ways where another flow \
         goes the opposite way through the host), its GPU time alone and while every flow runs \
         (median, every byte verified)\n"
    );
    let _ = writeln!(out, "{}", flows_table(&doc.flows));
    let (Some(together), Some(regret), Some(fastest)) =
        (doc.together_gbps, doc.regret, doc.fastest())
    else {
        let _ = writeln!(
            out,
            "\nstopped before every flow ran together: the flows above were measured alone \
             (aggregate {:.1} GB/s), no way of running them at once was",
            doc.alone_gbps
        );
        return out;
    };
    let _ = writeln!(
        out,
        "\naggregate, each flow's bytes over its GPU time, summed: {:.1} GB/s alone, {:.1} GB/s \
         together ({:+.1}%)\n",
        doc.alone_gbps,
        together,
        (together / doc.alone_gbps - 1.0) * 100.0
    );
    let _ = writeln!(
        out,
        "every flow at once, host clock from the first submission until all are seen done \
         (median):\n{}",
        ways_table(&doc.ways)
    );
    let _ = writeln!(
        out,
        "\nfastest: {}; the picks' regret {:.1}%",
        way_name(fastest),
        regret * 100.0
    );
    out
}

/// A row per flow: its pick, its time alone and together.
fn flows_table(flows: &[concurrent::Flow]) -> comfy_table::Table {
    let mut table = plain(
        ["flow", "pick", "alone µs", "together µs", "slowdown"]
            .map(String::from)
            .to_vec(),
    );
    for f in flows {
        let (together, slowdown) = f.together_us.map_or(("—".into(), "—".into()), |us| {
            (
                format!("{us:.1}"),
                format!("{:+.1}%", (us / f.alone_us - 1.0) * 100.0),
            )
        });
        table.add_row(vec![
            format!("GPU {} → GPU {}", f.src, f.dst),
            f.pick.to_string(),
            format!("{:.1}", f.alone_us),
            together,
            slowdown,
        ]);
    }
    for column in table.column_iter_mut().skip(2) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

/// A row per way of running every flow at once.
fn ways_table(ways: &[concurrent::Way]) -> comfy_table::Table {
    let mut table = plain(
        ["way", "makespan µs", "GB/s end to end"]
            .map(String::from)
            .to_vec(),
    );
    for w in ways {
        table.add_row(vec![
            way_name(w),
            format!("{:.1}", w.makespan_us),
            format!("{:.1}", w.gbps),
        ]);
    }
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

/// The human-readable batch plan.
pub fn batch_text(doc: &PlanBatchDocument) -> String {
    let source = &doc.header.source;
    let mut out = super::opening(source);
    let _ = writeln!(
        out,
        "GPU {} → GPU {}, {} messages of {} ({source})\ncosts: {}\n",
        doc.src,
        doc.dst,
        doc.messages,
        format_bytes(doc.message_bytes),
        doc.model
    );
    let mut table = plain(vec!["batch strategy".into(), "predicted µs".into()]);
    table.add_row(vec![
        format!("{} (pick)", doc.strategy.name()),
        format!("{:.1}", doc.predicted_us),
    ]);
    for p in &doc.alternatives {
        table.add_row(vec![
            p.strategy.name().to_string(),
            format!("{:.1}", p.predicted_us),
        ]);
    }
    let _ = writeln!(out, "{table}");
    if let Some(proof) = &doc.proof {
        batch_proof_lines(&mut out, proof);
    }
    out
}

/// Every way of moving the batch, measured, and the engine against plain copies.
fn batch_proof_lines(out: &mut String, proof: &BatchProof) {
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
    for t in [&proof.plain_copies, &proof.engine_one_call]
        .into_iter()
        .chain(&proof.prepared)
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
        proof.pick.name(),
        proof.speedup_over_plain
    );
}

/// The human-readable report.
pub fn text(doc: &PlanDocument) -> String {
    let source = &doc.header.source;
    let mut out = super::opening(source);
    let _ = writeln!(
        out,
        "GPU {} → GPU {}, {} ({source})",
        doc.src,
        doc.dst,
        format_bytes(doc.bytes)
    );
    let _ = writeln!(out, "costs: {}", doc.model);
    if let Some(network) = &doc.network {
        let _ = writeln!(out, "network: {network}");
    }
    out.push('\n');
    out.push_str(&pick_lines(doc));
    let _ = writeln!(out, "\n{}", strategies_table(doc));
    for u in &doc.unusable {
        let _ = writeln!(out, "not usable: {} — {}", u.strategy, u.reason);
    }
    if let Some(proof) = &doc.proof {
        if let Some(split) = measured(proof, Strategy::Split) {
            route_lines(&mut out, split);
        }
        proof_lines(&mut out, source, proof);
    }
    out
}

/// The pick, its prediction, the routes it takes, and how they are priced beside each other.
fn pick_lines(doc: &PlanDocument) -> String {
    let chunks = if doc.chunk_bytes < doc.bytes {
        format!(", in chunks of {}", format_bytes(doc.chunk_bytes))
    } else {
        String::new()
    };
    let mut out = format!(
        "pick: {} — predicted {:.1} µs ({:.1} GB/s){chunks}\n",
        doc.strategy, doc.predicted_us, doc.predicted_gbps
    );
    for p in &doc.paths {
        let _ = writeln!(
            out,
            "  {:<26} {:>12}  {:>10.1} µs",
            Route::from(p.route).to_string(),
            format_bytes(p.bytes),
            p.predicted_us
        );
    }
    if let Some(pricing) = &doc.host_route_beside_direct {
        let _ = writeln!(out, "  the host route beside the direct copy: {pricing}");
    }
    out
}

/// Every strategy's prediction, the pick first, and after `--prove` what each measured.
fn strategies_table(doc: &PlanDocument) -> comfy_table::Table {
    let mut header = vec![
        "strategy".to_string(),
        "predicted µs".to_string(),
        "GB/s".to_string(),
    ];
    if doc.proof.is_some() {
        header.push("measured µs".to_string());
    }
    let mut table = plain(header);
    let pick = Predicted {
        strategy: doc.strategy,
        predicted_us: doc.predicted_us,
    };
    for p in std::iter::once(&pick).chain(&doc.alternatives) {
        let mark = if p.strategy == doc.strategy {
            " (pick)"
        } else {
            ""
        };
        let mut row = vec![
            format!("{}{mark}", p.strategy),
            format!("{:.1}", p.predicted_us),
            format!("{:.1}", gbps(doc.bytes, p.predicted_us)),
        ];
        if let Some(proof) = &doc.proof {
            row.push(
                measured(proof, p.strategy)
                    .map_or_else(|| "—".to_string(), |m| format!("{:.1}", m.measured_us)),
            );
        }
        table.add_row(row);
    }
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

/// When each route of the measured split ended against its prediction, and whether they ended
/// together.
fn route_lines(out: &mut String, split: &MeasuredStrategy) {
    let Some(spread) = split.route_spread else {
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
            Route::from(r.route).to_string(),
            format_bytes(r.bytes),
            r.predicted_us,
            r.measured_end_us
        );
    }
    let has = |route| split.routes.iter().any(|r| r.route == route);
    let verdict = if spread > BALANCE_TOLERANCE {
        let tune = if has(RouteName::Host) && has(RouteName::DirectCe) {
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
    use crate::bench::proof::document::tests::split_plan_document;

    #[test]
    fn text_says_simulated_and_lists_every_strategy() {
        let text = text(&split_plan_document());
        assert!(text.starts_with("*** SIMULATED"), "{text}");
        assert!(text.contains("pick: split"), "{text}");
        assert!(text.contains("via GPU 1"), "{text}");
        assert!(text.contains("split (pick)"), "{text}");
        assert!(text.contains("relay") && text.contains("staged"), "{text}");
        assert!(text.contains("not usable: direct-ce — needs P2P"), "{text}");
    }
}
