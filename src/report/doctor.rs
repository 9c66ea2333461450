//! `peerlink doctor`'s text: each check's verdict and finding, its evidence and its fix, then the
//! tally.

use super::export::{Records, Tables};
use crate::doctor::document::DoctorDocument;
use crate::doctor::Verdict;
use crate::units::{format_bytes, format_seconds};
use std::fmt::Write;

impl Tables for DoctorDocument {
    fn tables(&self) -> Vec<Records> {
        vec![Records::of("checks", &self.checks)]
    }
}

pub fn text(doc: &DoctorDocument) -> String {
    let mut out = super::opening(&doc.header.source);
    let gpus: Vec<String> = doc.devices.iter().map(usize::to_string).collect();
    let _ = writeln!(
        out,
        "peerlink doctor: GPU{} {}",
        if gpus.len() == 1 { "" } else { "s" },
        gpus.join(", ")
    );
    match (&doc.burst, &doc.no_burst) {
        (Some(b), _) => {
            let peers = match b.pairs.len() {
                0 => "no P2P pair to cross".to_string(),
                n => format!(
                    "{} over each of {n} P2P direction{}",
                    format_bytes(b.bytes_per_pair),
                    if n == 1 { "" } else { "s" }
                ),
            };
            let _ = writeln!(
                out,
                "Traffic burst: {peers}, and {} each way between each GPU and the host, in {} \
                 round{}; the error counters were read {} apart.",
                format_bytes(b.host_bytes_per_gpu),
                b.rounds,
                if b.rounds == 1 { "" } else { "s" },
                format_seconds(b.interval_s)
            );
        }
        (None, Some(why)) => {
            let _ = writeln!(out, "No traffic burst: {why}.");
        }
        (None, None) => {}
    }
    for note in &doc.notes {
        let _ = writeln!(out, "Note: {note}");
    }
    for check in &doc.checks {
        let _ = writeln!(
            out,
            "\n{:<4}  {:<15} {:<15} {}",
            check.verdict.name().to_uppercase(),
            check.check,
            check.subject,
            check.finding
        );
        for fact in &check.evidence {
            let _ = writeln!(out, "      · {fact}");
        }
        if let Some(fix) = &check.fix {
            let _ = writeln!(out, "      fix: {fix}");
        }
    }
    let s = &doc.summary;
    let _ = writeln!(
        out,
        "\n{} fail, {} warn, {} info, {} ok{}",
        s.fail,
        s.warn,
        s.info,
        s.ok,
        if doc.failed {
            ": a check failed (exit status 1)"
        } else {
            ""
        }
    );
    out
}

/// The sentence `peerlink doctor` ends with when a check failed: which ones.
pub fn failed_sentence(doc: &DoctorDocument) -> Option<String> {
    let failed: Vec<String> = doc
        .checks
        .iter()
        .filter(|c| c.verdict == Verdict::Fail)
        .map(|c| format!("{} ({})", c.check, c.subject))
        .collect();
    (!failed.is_empty()).then(|| {
        format!(
            "{} check{} failed: {}",
            failed.len(),
            if failed.len() == 1 { "" } else { "s" },
            failed.join(", ")
        )
    })
}
