//! `peerlink check` as text: a row per figure with its verdict, what was left out and why, the
//! time the tests took (and would take on a full host), then the verdict.

use super::bench::figure;
use super::export::{Records, Tables};
use super::table::plain;
use crate::check::document::CheckDocument;
use crate::check::{Against, CheckReport, CheckedFigure};
use comfy_table::CellAlignment;
use std::fmt::Write;

impl Tables for CheckDocument {
    fn tables(&self) -> Vec<Records> {
        vec![Records::of("figures", &self.report.figures)]
    }
}

/// The whole report, opening with the simulated-host banner where the host is simulated.
pub fn text(doc: &CheckDocument) -> String {
    let r = &doc.report;
    let mut out = super::opening(&doc.header.source);
    let gpus: Vec<String> = r.devices.iter().map(usize::to_string).collect();
    let _ = writeln!(
        out,
        "peerlink check of GPU{} {} against {}\n",
        if gpus.len() == 1 { "" } else { "s" },
        gpus.join(", "),
        against(&r.against)
    );
    let _ = writeln!(out, "{}\n", table(&r.figures));
    let mut sources: Vec<&str> = Vec::new();
    for source in r.figures.iter().filter_map(|f| f.reference.as_deref()) {
        if !sources.contains(&source) {
            sources.push(source);
        }
    }
    for source in sources {
        let _ = writeln!(out, "reference: {source}");
    }
    for c in &r.checked {
        let _ = writeln!(
            out,
            "checked: {} within {}%: {}",
            c.test, c.tolerance_pct, c.why
        );
    }
    for n in &r.not_checked {
        let _ = writeln!(out, "not checked: {}: {}", n.test, n.why);
    }
    for place in &r.not_compared {
        let _ = writeln!(out, "not compared: {place}");
    }
    for fault in &r.faults {
        let _ = writeln!(out, "WRONG: {fault}");
    }
    for m in &r.missing {
        let _ = writeln!(out, "NOT MEASURED: {}: {}", m.figure, m.why);
    }
    for note in &r.notes {
        let _ = writeln!(out, "note: {note}");
    }
    let _ = writeln!(
        out,
        "time: the tests took {:.3} s on {} GPU{} ({} clock); by the default bench's formula \
         (src/bench/budget.rs), about {:.1} s on {} GPUs of this kind",
        r.wall_s,
        r.devices.len(),
        if r.devices.len() == 1 { "" } else { "s" },
        if doc.header.simulated {
            "the simulator's virtual"
        } else {
            "host"
        },
        r.fleet_wall_s,
        r.fleet_gpus
    );
    let _ = writeln!(out, "\n{}", verdict(r));
    out
}

/// What the figures were compared with, in a phrase.
fn against(against: &Against) -> String {
    match against {
        // The day is enough to tell an old baseline here; the JSON has the time and the host.
        Against::Baseline {
            file, source, time, ..
        } => match time.as_deref().and_then(|t| t.get(..10)) {
            Some(day) => format!("the baseline {file} ({source}, written {day})"),
            None => format!("the baseline {file} ({source})"),
        },
        Against::Reference { gpus } => format!(
            "the reference figures of {} shipped with peerlink",
            gpus.join(" and ")
        ),
    }
}

fn table(figures: &[CheckedFigure]) -> String {
    let mut table = plain(
        [
            "test",
            "size",
            "place",
            "unit",
            "expected",
            "measured",
            "slower",
            "tolerance",
            "verdict",
        ]
        .map(String::from)
        .to_vec(),
    );
    for f in figures {
        table.add_row(vec![
            f.test.clone(),
            crate::units::format_bytes(f.size_bytes),
            f.place.clone(),
            f.unit.symbol().to_string(),
            figure(f.unit, f.expected),
            figure(f.unit, f.measured),
            format!("{:+.1}%", f.slower_pct),
            format!("{}%", f.tolerance_pct),
            if f.regressed { "REGRESSED" } else { "ok" }.to_string(),
        ]);
    }
    for column in table.column_iter_mut().skip(4).take(4) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table.to_string()
}

/// The last line: healthy, or what is wrong and the figures that regressed.
fn verdict(r: &CheckReport) -> String {
    let what_failed = r.what_failed(|list| list.join(", "));
    match what_failed {
        None => format!(
            "HEALTHY: all {} figures within their tolerance",
            r.figures.len()
        ),
        Some(what) if !r.is_faulty() => format!("REGRESSED: {what}"),
        Some(what) => format!("FAULTY: {what}"),
    }
}
