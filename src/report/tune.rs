//! `peerlink tune` as text: the fitted cost of every hop, the issue costs, and what was not
//! measured.

use super::table::plain;
use crate::bench::tune::{describe, Measurements};
use crate::units::format_bytes;
use comfy_table::CellAlignment;
use std::fmt::Write;

/// The measurements as a human reads them.
pub fn text(m: &Measurements) -> String {
    let mut out = String::new();
    if let Some(banner) = super::simulated_banner(&m.source) {
        let _ = writeln!(out, "{banner}\n");
    }
    let _ = writeln!(
        out,
        "Hop costs measured on GPU{} {} ({}), time = α + bytes / β",
        if m.devices.len() == 1 { "" } else { "s" },
        m.devices
            .iter()
            .map(usize::to_string)
            .collect::<Vec<_>>()
            .join(", "),
        m.measured_on
    );
    let mut table = plain(vec![
        "hop".into(),
        "α µs".into(),
        "β GB/s".into(),
        "largest size".into(),
    ]);
    for h in &m.hops {
        let (alpha, beta) = match h.sweep.fit {
            Some(f) => (format!("{:.2}", f.alpha_us), format!("{:.1}", f.beta_gbps)),
            None => ("-".into(), "-".into()),
        };
        let largest = h
            .sweep
            .points
            .last()
            .map_or("not measured".into(), |p| format_bytes(p.bytes));
        table.add_row(vec![describe(h.hop), alpha, beta, largest]);
    }
    for column in table.column_iter_mut().skip(1) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "{table}\n");
    let i = &m.issue;
    let _ = writeln!(
        out,
        "CPU time to queue (host clock): copy {:.2} µs, kernel {:.2} µs, event {:.2} µs, graph \
         launch {:.2} µs",
        i.copy_us, i.kernel_us, i.event_us, i.graph_us
    );
    let _ = writeln!(
        out,
        "GPU time: {:.3} µs per node of a replayed graph, {:.4} µs per message of a batched copy \
         kernel",
        m.graph_node_us, m.batch_message_us
    );
    if let Some(l) = &m.latencies {
        for (what, pair) in [
            ("GPU", Some(l.local)),
            ("NVLink", l.nvlink),
            ("PCIe", l.pcie),
        ] {
            if let Some(p) = pair {
                let _ = writeln!(
                    out,
                    "{what} latency (GPU {} → GPU {}): dependent load {:.0} ns, one-way signal \
                     {:.2} µs",
                    p.src, p.dst, p.load_ns, p.signal_us
                );
            }
        }
    }
    let _ = writeln!(out, "\nNotes:");
    for note in &m.notes {
        let _ = writeln!(out, "  - {note}");
    }
    out
}
