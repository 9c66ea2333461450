//! `peerlink compare` as text: one row per test (the comparison itself, and its JSON document,
//! are [`crate::bench::compare`]).

use super::export::{Records, Tables};
use super::table::plain;
use crate::bench::compare::{CompareDocument, Comparison};
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
pub fn text(c: &Comparison, name_base: &str, name_other: &str, threshold: Option<f64>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{name_other} ({}) against {name_base} ({}): other / base per figure\n",
        c.other.source, c.base_source
    );
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
    for s in c.summaries() {
        table.add_row(vec![
            s.test,
            s.unit.name().to_string(),
            s.paired.to_string(),
            format!("{:.3}", s.median_ratio),
            s.worst.place,
            format!("{:.2}", s.worst.base),
            format!("{:.2}", s.worst.other),
            format!("{:.3}", s.worst.ratio),
        ]);
    }
    for column in table.column_iter_mut().skip(2) {
        column.set_cell_alignment(CellAlignment::Right);
    }
    let _ = writeln!(out, "{table}");
    if !c.unmatched.is_empty() {
        let _ = writeln!(out, "\nnot compared: {}", c.unmatched.join(", "));
    }
    if let Some(pct) = threshold {
        let beyond: Vec<String> = c.beyond(pct).iter().map(|p| p.named()).collect();
        let _ = match beyond.len() {
            0 => writeln!(
                out,
                "\nwithin {pct}%: every one of the {} paired figures",
                c.pairs.len()
            ),
            n => writeln!(
                out,
                "\nBEYOND {pct}%: {n} of {} paired figures: {}",
                c.pairs.len(),
                beyond.join(", ")
            ),
        };
    }
    out
}
