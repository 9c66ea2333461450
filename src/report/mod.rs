//! Text tables and CSV for the CLI's verbs, from their documents (the document core is
//! [`crate::document`]; each verb's documents live beside it), and each document's tables for the
//! exports ([`export::Tables`]).
//!
//! Text output from the simulator opens with [`simulated_banner`] (see [`opening`]), as its JSON
//! says `"simulated": true`.

pub mod bench;
pub mod check;
pub mod compare;
pub mod doctor;
pub mod export;
pub mod plan;
pub mod schemas;
pub mod table;
pub mod topo;
pub mod tune;
pub mod workload;

use crate::topology::Source;

/// Names for a sentence: all of them up to ten, else the first ten and how many more.
pub fn first_few(names: &[String]) -> String {
    const AT_MOST: usize = 10;
    match names.len().checked_sub(AT_MOST) {
        Some(more) if more > 0 => format!("{}, and {more} more", names[..AT_MOST].join(", ")),
        _ => names.join(", "),
    }
}

/// The start of a text report: the simulated-host banner and a blank line where `source` is the
/// simulator, nothing for real GPUs.
pub fn opening(source: &Source) -> String {
    simulated_banner(source).map_or_else(String::new, |banner| format!("{banner}\n\n"))
}

/// The line that opens every text report made from a simulated host, or `None` for real GPUs.
pub fn simulated_banner(source: &Source) -> Option<String> {
    source.preset().map(|preset| {
        format!(
            "*** SIMULATED host `{preset}`: every figure comes from the preset's model, not from \
             hardware ***"
        )
    })
}
