//! `peerlink workload` as text: one table per variant (send-recv's directions, halo's
//! decompositions), a row per size and contender. The notices go to stderr (the CLI prints them).

use super::export::{Records, Tables};
use super::table::plain;
use crate::units::format_bytes;
use crate::workload::document::WorkloadDocument;
use crate::workload::kinds::{Contender, Workload};
use crate::workload::rows::Row;
use comfy_table::CellAlignment;
use std::fmt::Write;

impl Tables for WorkloadDocument {
    fn tables(&self) -> Vec<Records> {
        vec![Records::of("rows", &self.rows)]
    }
}

/// An optional figure, or a dash.
fn or_dash(value: Option<f64>, show: impl Fn(f64) -> String) -> String {
    value.map_or_else(|| "—".to_string(), show)
}

/// The table of `rows` (one variant's).
fn table(workload: Workload, rows: &[&Row]) -> String {
    let mut header: Vec<String> = [
        "size",
        "contender",
        "algorithm",
        "issue",
        "µs/op",
        "algbw GB/s",
        "busbw GB/s",
        "verified",
        "vs NCCL",
    ]
    .map(String::from)
    .to_vec();
    let extra: &[&str] = match workload {
        Workload::AllReduce => &["predicted µs", "regret"],
        Workload::Pipeline => &["compute µs", "exposed µs"],
        Workload::SendRecv | Workload::Halo => &[],
    };
    // Only where NCCL with symmetric windows ran beside plain NCCL.
    let symmetric = rows.iter().any(|r| r.vs_nccl_symmetric.is_some());
    if symmetric {
        header.insert(9, "vs NCCL symm.".into());
    }
    header.extend(extra.iter().map(|s| s.to_string()));
    if workload == Workload::Pipeline {
        header[4] = "µs/step".into();
    }
    let mut t = plain(header);
    for r in rows {
        let model = if r.simulated { " model" } else { "" };
        let mut cells = vec![
            format_bytes(r.bytes),
            match r.contender {
                Contender::Nccl => format!("{}{model}", r.contender),
                _ => r.contender.to_string(),
            },
            r.algorithm.clone(),
            r.issue.name().to_string(),
            format!("{:.2}", r.time_us),
            format!("{:.2}", r.algbw_gbps),
            format!("{:.2}", r.busbw_gbps),
            if r.verified { "yes" } else { "NO" }.to_string(),
            or_dash(r.vs_nccl, |v| format!("{v:.2}×{model}")),
        ];
        if symmetric {
            cells.push(or_dash(r.vs_nccl_symmetric, |v| format!("{v:.2}×")));
        }
        match workload {
            Workload::AllReduce => {
                cells.push(or_dash(r.predicted_us, |v| format!("{v:.2}")));
                cells.push(or_dash(r.regret, |v| format!("{:.1}%", v * 100.0)));
            }
            Workload::Pipeline => {
                cells.push(or_dash(r.compute_us, |v| format!("{v:.2}")));
                cells.push(or_dash(r.exposed_us, |v| format!("{v:.2}")));
            }
            Workload::SendRecv | Workload::Halo => {}
        }
        t.add_row(cells);
    }
    for (i, column) in t.column_iter_mut().enumerate() {
        if i == 0 || i >= 4 {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    t.to_string()
}

/// What the NCCL rows of a simulated run are, where it has any: the simulator's model of NCCL,
/// with what it was calibrated on (the model's own account, `backend::sim`'s NCCL module), which
/// is not the host it is applied to.
pub fn nccl_model_note(doc: &WorkloadDocument) -> Option<String> {
    let modelled = doc
        .rows
        .iter()
        .any(|r| r.simulated && r.contender == Contender::Nccl);
    modelled.then(|| {
        format!(
            "NCCL model = the simulator's model of NCCL, not NCCL: NCCL's tuner's ring cost model \
             (LL, LL128, Simple), its LL and Simple latencies and bus efficiency calibrated on \
             NCCL 2.28.3 measured on two H200s over NVLink, applied unchanged to these {} GPUs \
             over {}'s links",
            doc.devices.len(),
            doc.header.source
        )
    })
}

/// The whole report.
pub fn text(doc: &WorkloadDocument) -> String {
    let h = &doc.header;
    let mut out = super::opening(&h.source);
    let devices: Vec<String> = doc.devices.iter().map(usize::to_string).collect();
    let dtype = doc
        .rows
        .iter()
        .find_map(|r| r.dtype)
        .map_or_else(String::new, |d| format!(" ({d})"));
    let _ = writeln!(
        out,
        "workload {}{dtype} over GPUs {} ({}){}",
        doc.workload,
        devices.join(","),
        h.source,
        if h.simulated {
            " — every figure SIMULATED"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "timed {}", doc.timing);
    let _ = writeln!(
        out,
        "{}; vs NCCL = the fastest NCCL row's time at that size over this row's (above 1× where \
         peerlink is faster)",
        doc.busbw_rule
    );
    if doc.rows.iter().any(|r| r.vs_nccl_symmetric.is_some()) {
        let _ = writeln!(
            out,
            "(vs NCCL: plain NCCL, ordinary buffers; vs NCCL symm.: NCCL with symmetric windows, \
             ncclMemAlloc memory registered with ncclCommWindowRegister)"
        );
    }
    if let Some(note) = nccl_model_note(doc) {
        let _ = writeln!(out, "{note}");
    }
    let mut variants: Vec<_> = doc.rows.iter().map(|r| r.variant).collect();
    variants.dedup();
    if variants.is_empty() {
        let _ = writeln!(
            out,
            "\nno contender could run here: the notes on stderr say why"
        );
    }
    for variant in variants {
        let rows: Vec<&Row> = doc.rows.iter().filter(|r| r.variant == variant).collect();
        let _ = writeln!(out);
        if let Some(v) = variant {
            let _ = writeln!(out, "{} {v}:", doc.workload);
        }
        let _ = writeln!(out, "{}", table(doc.workload, &rows));
    }
    if let Some(regret) = doc.worst_regret {
        let _ = writeln!(
            out,
            "\nthe pick's worst regret (its kernel's time over the faster kernel's − 1): {:.1}%",
            regret * 100.0
        );
    }
    out
}
