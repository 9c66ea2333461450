//! The engine's proofs: the transfer engine's choices measured against the alternatives on the
//! backend, every byte verified.
//!
//! - [`sweep`]: every strategy and the planner's pick for one pair over a size sweep, the pick's
//!   regret, and the engine against one plain copy.
//! - [`batch`]: every way of moving a batch of small messages, against plain copies.
//! - [`concurrent`]: every GPU's transfer at once, against each alone and each strategy for all.

pub mod batch;
pub mod concurrent;
pub mod sweep;

use super::timing::Runs;
use crate::backend::Backend;

/// The proofs' runs on real GPUs: enough that the median of a few-µs transfer is steady. With 3
/// runs, small transfers on the H200 showed up to 23% regret between strategies that take the same
/// time, and with 11 (not yet interleaved) still up to 12% where two took the same time within
/// 0.1 µs at other sizes.
pub const RUNS: Runs = Runs {
    warmup: 2,
    runs: 21,
};

/// [`RUNS`], except on the simulator: its virtual times repeat exactly, and it copies every byte
/// for real on the CPU, so one warm-up and one timed run say all there is.
pub fn runs_for(backend: &dyn Backend) -> Runs {
    if backend.topology().is_simulated() {
        Runs { warmup: 1, runs: 1 }
    } else {
        RUNS
    }
}
