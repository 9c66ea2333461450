//! `peerlink tune` as text: the fitted cost of every hop, the issue costs, and what was not
//! measured.

use super::export::{Records, Tables};
use super::table::{matrix, plain};
use crate::bench::tune::beside::{Fit, Fitted, FIXED_CHUNK_US, REFIT_TOLERANCE};
use crate::bench::tune::document::{
    BothWaysReport, SplitReport, SplitRow, TuneDocument, TuneReport,
};
use crate::bench::tune::{Latencies, SMALL_BYTES};
use crate::model::profile::Lone;
use crate::model::{DirectPace, Hop, Profile};
use crate::units::format_bytes;
use comfy_table::CellAlignment;
use std::fmt::Write;

impl Tables for Profile {
    fn tables(&self) -> Vec<Records> {
        vec![
            Records::of("hops", &self.hops),
            Records::of("lone", &self.lone),
            Records::of("beside_direct", &self.beside_direct),
            Records::of("issue", &Vec::from_iter(&self.issue)),
        ]
    }
}

/// `β (α)` of a hop: GB/s and µs; `-` where the hop was not swept, `no fit` where it could not be
/// fitted.
fn cell(m: &TuneReport, hop: Hop) -> String {
    match m.swept.iter().find(|h| h.hop == hop).map(|h| h.cost) {
        None => "-".into(),
        Some(None) => "no fit".into(),
        Some(Some(c)) => format!("{:.1} ({:.2})", c.beta_gbps, c.alpha_us),
    }
}

/// The document as a human reads it.
pub fn text(document: &TuneDocument) -> String {
    let m = &document.report;
    let mut out = super::opening(&m.source);
    let _ = writeln!(
        out,
        "Hop costs on GPU{} {} ({}): β GB/s (α µs), time = α + bytes / β\n",
        if m.devices.len() == 1 { "" } else { "s" },
        m.devices
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        m.measured_on
    );
    out.push_str(&peer_matrices(m));
    let _ = writeln!(
        out,
        "Within each GPU and to or from pinned host memory\n{}\n",
        local_and_host_table(m)
    );
    out.push_str(&issue_lines(m));
    out.push_str(&lone_matrices(m, &document.profile.lone));
    if let Some(l) = &m.latencies {
        out.push_str(&latency_lines(l));
    }
    for fit in &m.splits {
        split_lines(&mut out, fit);
    }
    if let Some(fit) = &m.both_ways {
        both_ways_lines(&mut out, fit);
    }
    let _ = writeln!(out, "\nNotes:");
    for note in &document.profile.notes {
        let _ = writeln!(out, "  - {note}");
    }
    out
}

/// A matrix per kind of peer write, where any peer hop was swept.
fn peer_matrices(m: &TuneReport) -> String {
    let mut out = String::new();
    let peer = |h: Hop| matches!(h, Hop::PeerCe { .. } | Hop::PeerSm { .. });
    if !m.swept.iter().any(|h| peer(h.hop)) {
        return out;
    }
    for (title, hop) in [
        (
            "Copy engine write, row → column",
            (|src, dst| Hop::PeerCe { src, dst }) as fn(usize, usize) -> Hop,
        ),
        ("SM kernel write, row → column", |src, dst| Hop::PeerSm {
            src,
            dst,
        }),
        (
            "Resident worker write (host clock, back-to-back submissions), row → column",
            |src, dst| Hop::Resident { src, dst },
        ),
    ] {
        let table = matrix(&m.devices, false, |src, dst| cell(m, hop(src, dst)));
        let _ = writeln!(out, "{title}\n{table}\n");
    }
    out
}

/// A row per GPU: its local copy, and to and from each NUMA node's pinned host memory.
fn local_and_host_table(m: &TuneReport) -> comfy_table::Table {
    let mut nodes: Vec<Option<i32>> = m
        .swept
        .iter()
        .filter_map(|h| match h.hop {
            Hop::HostToDevice { node, .. } => Some(node),
            _ => None,
        })
        .collect();
    nodes.sort_unstable();
    nodes.dedup();
    let name = |node: Option<i32>| node.map_or(String::new(), |n| format!(" node {n}"));
    let mut header = vec!["".to_string(), "local copy".to_string()];
    for &node in &nodes {
        header.push(format!("host{} → GPU", name(node)));
        header.push(format!("GPU → host{}", name(node)));
    }
    let mut table = plain(header);
    for &device in &m.devices {
        let mut row = vec![format!("GPU{device}"), cell(m, Hop::Local { device })];
        for &node in &nodes {
            row.push(cell(m, Hop::HostToDevice { device, node }));
            row.push(cell(m, Hop::DeviceToHost { device, node }));
        }
        table.add_row(row);
    }
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

/// The CPU's cost of queuing work, and the GPU's per graph node and per batched message.
fn issue_lines(m: &TuneReport) -> String {
    let i = &m.issue;
    format!(
        "CPU time to queue (host clock): copy {:.2} µs, kernel {:.2} µs, event {:.2} µs, graph \
         launch {:.2} µs\nGPU time: {:.3} µs per node of a replayed graph, {:.4} µs per message \
         of a batched copy kernel\n",
        i.copy_us, i.kernel_us, i.event_us, i.graph_us, m.graph_node_us, m.batch_message_us
    )
}

/// Lone small transfers, row → column: by copy engine and SM kernel, then by resident worker.
fn lone_matrices(m: &TuneReport, lone: &[Lone]) -> String {
    let mut out = String::new();
    if lone.is_empty() {
        return out;
    }
    let lone = |hop: Hop| {
        lone.iter()
            .find(|l| l.hop == hop)
            .map_or("-".into(), |l| format!("{:.2}", l.lone_us))
    };
    let table = matrix(&m.devices, true, |src, dst| {
        format!(
            "{} / {}",
            lone(Hop::PeerCe { src, dst }),
            lone(Hop::PeerSm { src, dst })
        )
    });
    let _ = writeln!(
        out,
        "One lone {SMALL_BYTES} B copy, row → column, from before it is queued to its end: copy \
         engine / SM kernel, GPU µs\n{table}\n"
    );
    let table = matrix(&m.devices, true, |src, dst| {
        lone(Hop::Resident { src, dst })
    });
    let _ = writeln!(
        out,
        "One lone {SMALL_BYTES} B transfer through a resident worker, row → column, from the \
         call until the host sees it complete, host µs\n{table}\n"
    );
    out
}

/// The latencies measured for a simulator preset: within a GPU, over NVLink and over PCIe, and
/// a local copy's plateau.
fn latency_lines(l: &Latencies) -> String {
    let mut out = String::new();
    for (what, pair) in [
        ("GPU", Some(l.local)),
        ("NVLink", l.nvlink),
        ("PCIe", l.pcie),
    ] {
        if let Some(p) = pair {
            let _ = writeln!(
                out,
                "{what} latency (GPU {} → GPU {}): dependent load {:.0} ns (caches flushed), \
                 {:.0} ns (chain resident), one-way signal {:.2} µs, a back-to-back \
                 {SMALL_BYTES} B copy {:.2} µs",
                p.src, p.dst, p.load_ns, p.resident_load_ns, p.signal_us, p.copy_us
            );
        }
    }
    let p = l.local_plateau;
    let _ = writeln!(
        out,
        "Local copies of {} on GPU {}: {:.0} GB/s",
        format_bytes(p.bytes),
        p.device,
        crate::units::gbps(p.bytes, p.median_us)
    );
    out
}

/// The splits run to price the host route beside a direct copy, and the figures fitted to them.
fn split_lines(out: &mut String, fit: &SplitReport) {
    let _ = writeln!(
        out,
        "\nThe host route beside a direct copy, GPU {} → GPU {} (splits; ends in GPU µs from the \
         split's start, median):",
        fit.src, fit.dst
    );
    let _ = writeln!(out, "{}", runs_table(&fit.rows));
    fitted_lines(out, "fitted", &fit.fitted);
    if let Some(again) = &fit.refitted {
        let _ = writeln!(
            out,
            "the routes planned with the fit ended more than {:.0}% apart: fitted once more to \
             those runs",
            REFIT_TOLERANCE * 100.0,
        );
        fitted_lines(out, "refitted", again);
    }
    let kept = fit.kept.map_or_else(
        || "none (no fit was physically possible): the planner keeps its estimate".to_string(),
        |(kept, direct)| format!("{}; {}", figures(kept), direct_figures(direct)),
    );
    let _ = writeln!(out, "kept: {kept}");
}

/// Both directions' splits run together to price the host route both ways, and the fraction.
fn both_ways_lines(out: &mut String, fit: &BothWaysReport) {
    let (a, b) = fit.pair;
    let _ = writeln!(
        out,
        "\nThe host route both ways, GPU {a} ⇄ GPU {b} (both directions' splits at once; ends in \
         GPU µs from each split's start, median):"
    );
    let _ = writeln!(out, "{}", runs_table(&fit.rows));
    for refused in &fit.refused {
        let _ = writeln!(
            out,
            "fitted, refused: both hops at {:.3} of their rate one way — {}",
            refused.fraction, refused.why
        );
    }
    let kept = fit.fraction.map_or_else(
        || "none (no fraction was physically possible): the planner keeps its estimate".into(),
        |f| format!("both hops at {f:.3} of their rate one way"),
    );
    let _ = writeln!(out, "fitted and kept: {kept}");
}

/// A row for each labelled split: its host share, and when each route was predicted to end and
/// ended.
fn runs_table(rows: &[SplitRow]) -> comfy_table::Table {
    let mut table = plain(
        [
            "",
            "split",
            "host share",
            "chunk",
            "direct: predicted",
            "ended",
            "host: predicted",
            "ended",
            "apart",
        ]
        .map(String::from)
        .to_vec(),
    );
    for row in rows {
        table.add_row(vec![
            row.label.clone(),
            format_bytes(row.bytes),
            format_bytes(row.host_bytes),
            format_bytes(row.chunk_bytes),
            format!("{:.1}", row.direct_predicted_us),
            format!("{:.1}", row.direct_measured_us),
            format!("{:.1}", row.host_predicted_us),
            format!("{:.1}", row.host_measured_us),
            format!("{:.1}%", row.spread * 100.0),
        ]);
    }
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}

fn figures(f: Fit) -> String {
    f.to_string()
}

/// A fit's refused attempts, each with why, then what it came to.
fn fitted_lines(out: &mut String, label: &str, fitted: &Fitted) {
    for refused in &fitted.refused {
        let _ = writeln!(
            out,
            "{label}, refused: {} — {}",
            figures(refused.fit),
            refused.why
        );
    }
    let how = if fitted.refused.is_empty() {
        String::new()
    } else {
        format!(
            " (the rate and a cost per transfer, the per-chunk cost fixed at the hop's own, \
             {FIXED_CHUNK_US:+.1} µs)"
        )
    };
    let found = fitted
        .fit
        .map_or_else(|| "nothing physically possible".to_string(), figures);
    let _ = writeln!(out, "{label}{how}: {found}");
    let _ = writeln!(out, "{label}, beside it: {}", direct_figures(fitted.direct));
}

/// How a split's direct copy is priced beside the host route.
fn direct_figures(direct: Option<DirectPace>) -> String {
    direct.map_or_else(
        || "the direct copy as its hop alone (no pace physically possible)".to_string(),
        |pace| pace.to_string(),
    )
}
