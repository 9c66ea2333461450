//! Text tables and JSON documents for the CLI's verbs.
//!
//! Every JSON document carries `"schema": "peerlink.<verb>/<n>"` and `"source"` (`cuda` or
//! `sim:<preset>`), so scripts can check what they are reading. Text output from the simulator opens
//! with [`simulated_banner`] (see [`opening`]).

pub mod bench;
pub mod compare;
pub mod plan;
pub mod table;
pub mod topo;
pub mod tune;

use crate::topology::Source;

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
