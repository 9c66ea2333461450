//! `peerlink compare` as text: one row per test (the comparison itself, and its JSON document,
//! are [`crate::bench::compare`]).

use super::export::{Records, Tables};
use super::table::plain;
use crate::bench::compare::{CompareDocument, Pair, TestSummary};
use comfy_table::CellAlignment;
use std::fmt::Write;

impl Tables for CompareDocument {
    fn tables(&self) -> Vec<Records> {
        vec![
            Records::of("tests", &self.tests),
            Records::of("pairs", &self.pairs),
            Records::of("unmatched", &self.unmatched),
        ]
    }
}

/// One row per test: the median ratio and the figure furthest from the base; with a threshold,
/// the figures that moved further than it.
pub fn text(doc: &CompareDocument) -> String {
    let (name_base, name_other) = &doc.files;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{name_other} ({}) against {name_base} ({}): other / base per figure\n",
        doc.header.source, doc.base_source
    );
    let _ = writeln!(out, "{}", tests_table(&doc.tests));
    if !doc.unmatched.is_empty() {
        let _ = writeln!(out, "\nnot compared: {}", doc.unmatched.join(", "));
    }
    if let Some(threshold) = &doc.threshold {
        let pct = threshold.pct;
        let beyond: Vec<String> = threshold.beyond.iter().map(Pair::named).collect();
        let _ = match beyond.len() {
            0 => writeln!(
                out,
                "\nwithin {pct}%: every one of the {} paired figures",
                doc.pairs.len()
            ),
            n => writeln!(
                out,
                "\nBEYOND {pct}%: {n} of {} paired figures: {}",
                doc.pairs.len(),
                beyond.join(", ")
            ),
        };
    }
    out
}

/// A row per test: how many figures paired, the median ratio, and the furthest figure.
fn tests_table(tests: &[TestSummary]) -> comfy_table::Table {
    let mut table = plain(
        [
            "test",
            "unit",
            "paired",
            "median ratio",
            "furthest",
            "base",
            "other",
            "ratio",
        ]
        .map(String::from)
        .to_vec(),
    );
    for s in tests {
        table.add_row(vec![
            s.test.clone(),
            s.unit.name().to_string(),
            s.paired.to_string(),
            format!("{:.3}", s.median_ratio),
            s.worst.place.clone(),
            format!("{:.2}", s.worst.base),
            format!("{:.2}", s.worst.other),
            format!("{:.3}", s.worst.ratio),
        ]);
    }
    for column in table.column_iter_mut().skip(2) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    table
}
