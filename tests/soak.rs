//! Soak: memory stays flat over many transfers through the engine on the simulator (issue 13,
//! point 6), on a DGX-1: pairs over one NVLink, over two, and without P2P (staged or relayed). The
//! soak itself is tests/soak/run.rs; tests/gpu.rs runs it on real GPUs.
//!
//! CI moves 200,000 small transfers. The long run moves a million, one in 64 of them large enough
//! to be pipelined or split (its result is in BENCHMARKS.md, "Soak"):
//!
//! ```text
//! cargo test --release --test soak -- --ignored --nocapture
//! ```

#[path = "soak/run.rs"]
mod run;

use peerlink::backend::sim::SimBackend;
use std::sync::Arc;

const PRESET: &str = "dgx1-v100";

fn soak(transfers: usize, large_every: Option<usize>) {
    let backend = Arc::new(SimBackend::open(PRESET).unwrap());
    run::soak(&format!("sim:{PRESET}"), backend, transfers, large_every);
}

#[test]
fn memory_stays_flat_over_two_hundred_thousand_small_transfers() {
    soak(200_000, None);
}

#[test]
#[ignore = "the long soak (a million transfers, a minute in release): run it with --ignored"]
fn memory_stays_flat_over_a_million_transfers() {
    soak(1_000_000, Some(64));
}
