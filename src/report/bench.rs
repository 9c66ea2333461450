//! `peerlink bench` and `peerlink explain` as text tables and CSV (their JSON documents are
//! [`BenchDocument`] and [`ExplainDocument`]).

use super::export::{Records, Tables};
use super::table::{matrix, plain};
use crate::bench::document::{BenchDocument, ExplainDocument};
use crate::bench::explain::Explanation;
use crate::bench::result::{BenchReport, NotMeasured, Place, Sweep, TestResult, Unit};
use crate::units::format_bytes;
use comfy_table::CellAlignment;
use std::fmt::Write;

impl Tables for BenchDocument {
    fn tables(&self) -> Vec<Records> {
        vec![figures(&self.results)]
    }
}

impl Tables for ExplainDocument {
    fn tables(&self) -> Vec<Records> {
        explain_tables(&self.explanation)
    }
}

pub(super) fn figure(unit: Unit, value: f64) -> String {
    match unit {
        Unit::Gbps => format!("{value:.1}"),
        Unit::Micros => format!("{value:.2}"),
        Unit::Nanos => format!("{value:.0}"),
    }
}

fn place_name(place: Place) -> String {
    match place {
        Place::Pair { src, dst } => format!("{src}→{dst}"),
        Place::Device { device } => format!("GPU{device}"),
    }
}

/// The reasons for N/A cells, each once, with the places it applies to. Diagonal cells of a
/// multi-GPU matrix (shown as X) are left to the legend.
fn reasons(not_measured: &[NotMeasured]) -> Vec<String> {
    let mut grouped: Vec<(&str, Vec<String>)> = Vec::new();
    for n in not_measured {
        if matches!(n.place, Place::Pair { src, dst } if src == dst) {
            continue;
        }
        match grouped.iter_mut().find(|(r, _)| *r == n.reason) {
            Some((_, places)) => places.push(place_name(n.place)),
            None => grouped.push((&n.reason, vec![place_name(n.place)])),
        }
    }
    grouped
        .into_iter()
        .map(|(reason, places)| format!("N/A {}: {reason}", places.join(", ")))
        .collect()
}

fn test_text(out: &mut String, devices: &[usize], test: &TestResult) {
    let unit = test.unit;
    let _ = writeln!(
        out,
        "{} — {} per message, {}",
        test.name,
        format_bytes(test.size_bytes),
        unit.symbol()
    );
    let _ = writeln!(out, "  {}", test.measures);
    let single = devices.len() == 1;
    let cell_text = |m: &Vec<Vec<Option<f64>>>, s: usize, d: usize| {
        m[s][d].map_or_else(|| "N/A".to_string(), |v| figure(unit, v))
    };
    if let Some(m) = &test.matrix {
        let _ = writeln!(
            out,
            "{}",
            matrix(devices, single, |s, d| cell_text(m, s, d))
        );
    }
    if let Some(t) = &test.total_matrix {
        let _ = writeln!(out, "  both directions together, {}:", unit.symbol());
        let _ = writeln!(
            out,
            "{}",
            matrix(devices, single, |s, d| cell_text(t, s, d))
        );
    }
    if let Some(values) = &test.values {
        let mut table = plain(devices.iter().map(|d| format!("GPU{d}")).collect());
        table.add_row(
            devices
                .iter()
                .map(|&d| values[d].map_or_else(|| "N/A".to_string(), |v| figure(unit, v)))
                .collect::<Vec<_>>(),
        );
        for column in table.column_iter_mut() {
            column.set_cell_alignment(CellAlignment::Right);
        }
        let _ = writeln!(out, "{table}");
    }
    if let Some(noisiest) = test
        .cells
        .iter()
        .filter(|c| c.time_us.samples > 1)
        .max_by(|a, b| a.time_us.cv.total_cmp(&b.time_us.cv))
    {
        let _ = writeln!(
            out,
            "  spread: largest coefficient of variation {:.1}% ({}, {} samples)",
            noisiest.time_us.cv * 100.0,
            place_name(noisiest.place),
            noisiest.time_us.samples
        );
    }
    for line in reasons(&test.not_measured).iter().chain(&test.notes) {
        let _ = writeln!(out, "  {line}");
    }
    out.push('\n');
}

fn sweep_text(out: &mut String, sweep: &Sweep) {
    let _ = writeln!(
        out,
        "{} sweep, GPU {} → GPU {}",
        sweep.test, sweep.src, sweep.dst
    );
    if let Some(reason) = &sweep.not_measured {
        let _ = writeln!(out, "  N/A: {reason}\n");
        return;
    }
    let mut table = plain(
        ["size", "median µs", "p99 µs", "GB/s"]
            .iter()
            .map(|h| h.to_string())
            .collect(),
    );
    for p in &sweep.points {
        table.add_row(vec![
            format_bytes(p.bytes),
            format!("{:.2}", p.median_us),
            format!("{:.2}", p.p99_us),
            format!("{:.1}", p.gbps),
        ]);
    }
    for column in table.column_iter_mut() {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "{table}");
    match &sweep.fit {
        Some(f) => {
            let _ = writeln!(
                out,
                "  fit time = α + bytes/β: α = {:.2} µs, β = {:.1} GB/s; half of β at {} (αβ), \
                 90% at {} (9αβ)\n",
                f.alpha_us,
                f.beta_gbps,
                format_bytes(f.half_beta_bytes.round() as u64),
                format_bytes(f.ninety_beta_bytes.round() as u64)
            );
        }
        None => {
            let _ = writeln!(out, "  no α–β fit: it needs two sizes whose times grow\n");
        }
    }
}

/// The human-readable bench report.
pub fn text(doc: &BenchDocument) -> String {
    let (source, report) = (&doc.header.source, &doc.results);
    let mut out = super::opening(source);
    let t = &report.timing;
    let _ = writeln!(
        out,
        "peerlink bench on {} — GPUs {}; {} sample{} of {} timed operation{} after {} warm-up{}; \
         GB/s = 1e9 bytes/s; rows are sources, columns destinations",
        source,
        report
            .devices
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(","),
        t.samples,
        if t.samples == 1 { "" } else { "s" },
        t.iterations,
        if t.iterations == 1 { "" } else { "s" },
        t.warmup,
        if t.rotation_bytes > 0 {
            format!(
                ", buffers rotated over {}",
                crate::units::format_bytes(t.rotation_bytes)
            )
        } else {
            String::new()
        }
    );
    for note in &report.notes {
        let _ = writeln!(out, "note: {note}");
    }
    out.push('\n');
    for test in &report.tests {
        test_text(&mut out, &report.devices, test);
    }
    for sweep in &report.sweeps {
        sweep_text(&mut out, sweep);
    }
    out
}

/// The bench report as one table: a row per measured or skipped cell and per sweep point (what
/// `--csv` prints and `--export-csv` writes).
fn figures(report: &BenchReport) -> Records {
    let mut table = Records::new(
        "figures",
        &[
            "kind",
            "test",
            "unit",
            "size_bytes",
            "src",
            "dst",
            "device",
            "value",
            "total",
            "median_us",
            "p99_us",
            "cv",
            "samples",
            "note",
        ],
    );
    let text = |v: &dyn ToString| v.to_string();
    let opt = |v: Option<f64>| v.map_or_else(String::new, |v| v.to_string());
    let place_fields = |place: Place| match place {
        Place::Pair { src, dst } => [src.to_string(), dst.to_string(), String::new()],
        Place::Device { device } => [String::new(), String::new(), device.to_string()],
    };
    for test in &report.tests {
        let head = [
            test.name.clone(),
            test.unit.symbol().replace('µ', "u"),
            test.size_bytes.to_string(),
        ];
        for c in &test.cells {
            let mut row = vec!["cell".to_string()];
            row.extend(head.iter().cloned());
            row.extend(place_fields(c.place));
            row.extend([
                text(&c.value),
                opt(c.total),
                text(&c.time_us.median),
                text(&c.time_us.p99),
                text(&c.time_us.cv),
                text(&c.time_us.samples),
                String::new(),
            ]);
            table.rows.push(row);
        }
        for n in &test.not_measured {
            let mut row = vec!["not_measured".to_string()];
            row.extend(head.iter().cloned());
            row.extend(place_fields(n.place));
            row.extend(vec![String::new(); 6]);
            row.push(n.reason.clone());
            table.rows.push(row);
        }
    }
    for sweep in &report.sweeps {
        let pair = |kind: &str, bytes: String| {
            vec![
                kind.to_string(),
                sweep.test.clone(),
                "GB/s".to_string(),
                bytes,
                sweep.src.to_string(),
                sweep.dst.to_string(),
                String::new(),
            ]
        };
        for p in &sweep.points {
            let mut row = pair("sweep", p.bytes.to_string());
            row.extend([
                text(&p.gbps),
                String::new(),
                text(&p.median_us),
                text(&p.p99_us),
                String::new(),
                String::new(),
                String::new(),
            ]);
            table.rows.push(row);
        }
        if let Some(reason) = &sweep.not_measured {
            let mut row = pair("not_measured", String::new());
            row.extend(vec![String::new(); 6]);
            row.push(reason.clone());
            table.rows.push(row);
        }
    }
    table
}

/// The bench document as CSV: its one table (the exported `figures`) with its header line.
pub fn csv(doc: &BenchDocument) -> String {
    figures(&doc.results).csv()
}

/// An explanation's tables: the setup, the steady-state parts, the fixes and the link's sweep.
fn explain_tables(e: &Explanation) -> Vec<Records> {
    vec![
        Records::of("setup", &e.setup),
        Records::of("parts", &e.parts),
        Records::of("fixes", &e.fixes),
        Records::of("sweep", &e.sweep.points),
    ]
}

/// `v` with its sign, to two decimals: a difference that rounds to nothing is `+0.00`, never
/// `-0.00` (rounding noise of two equal figures has no direction).
pub fn signed_hundredths(v: f64) -> String {
    match v.abs() < 0.005 {
        true => "+0.00".to_string(),
        false => format!("{v:+.2}"),
    }
}

/// The human-readable latency breakdown.
pub fn explain_text(doc: &ExplainDocument) -> String {
    let (source, e) = (&doc.header.source, &doc.explanation);
    let mut out = super::opening(source);
    let _ = writeln!(
        out,
        "Where the time goes: {} from GPU {} to GPU {} ({})",
        format_bytes(e.size_bytes),
        e.src,
        e.dst,
        source
    );
    let _ = writeln!(out, "route: {}", e.route);
    for note in &e.notes {
        let _ = writeln!(out, "note: {note}");
    }
    let _ = writeln!(
        out,
        "\nSetup (once, before the first transfer; host clock):"
    );
    let mut setup = plain(vec!["part".into(), "µs".into(), "measured by".into()]);
    for p in &e.setup {
        setup.add_row(vec![
            p.name.clone(),
            format!("{:.2}", p.us),
            p.measured_by.clone(),
        ]);
    }
    let _ = writeln!(out, "{setup}");

    let _ = writeln!(out, "\nSteady state, per transfer:");
    let mut parts = plain(vec![
        "part".into(),
        "µs".into(),
        "share".into(),
        "measured by".into(),
    ]);
    for p in &e.parts {
        parts.add_row(vec![
            p.name.clone(),
            format!("{:.2}", p.us),
            format!("{:.0}%", p.us / e.sum_us * 100.0),
            p.measured_by.clone(),
        ]);
    }
    parts.add_row(vec![
        "sum of parts".into(),
        format!("{:.2}", e.sum_us),
        String::new(),
        String::new(),
    ]);
    parts.add_row(vec![
        "measured end to end".into(),
        format!("{:.2}", e.measured_us),
        String::new(),
        format!(
            "host clock from the copy call until the host saw it finish; median of {}, p99 {:.2} µs",
            e.measured.samples, e.measured.p99
        ),
    ]);
    let _ = writeln!(out, "{parts}");
    let _ = writeln!(
        out,
        "gap: {} µs ({:.1}% of the measured time): {}",
        signed_hundredths(e.gap_us),
        e.gap_percent,
        if e.adds_up_within_10_percent {
            "the parts add up within 10%"
        } else {
            "the parts do NOT add up within 10%: something unmeasured is in the way"
        }
    );
    let _ = writeln!(
        out,
        "\nFixes (savings computed from the measurements above):"
    );
    for f in &e.fixes {
        let verdict = if f.saves_us > 0.0 {
            format!("saves {:.2} µs", f.saves_us)
        } else if f.saves_us < 0.0 {
            format!("would not help here: {:.2} µs slower", -f.saves_us)
        } else {
            "saves nothing here".to_string()
        };
        let _ = writeln!(out, "  [{}] {} — {verdict}", f.part, f.fix);
        let _ = writeln!(out, "      {}", f.computed_from);
    }
    out
}
