//! Text tables and JSON documents for the CLI's verbs.
//!
//! Every JSON document carries `"schema": "peerlink.<verb>/<n>"` and `"source"` (`cuda` or
//! `sim:<preset>`), so scripts can check what they are reading. Text output from the simulator opens
//! with [`simulated_banner`].

pub mod bench;
pub mod plan;
pub mod table;
pub mod topo;
pub mod tune;

/// The line that opens every text report made from a simulated host, or `None` for real GPUs.
pub fn simulated_banner(source: &str) -> Option<String> {
    source.strip_prefix("sim:").map(|preset| {
        format!(
            "*** SIMULATED host `{preset}`: every figure comes from the preset's model, not from \
             hardware ***"
        )
    })
}
