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

use super::stats::Stats;
use crate::Result;

/// How much to run per strategy and size.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Untimed runs first (the first use of a route allocates its staging buffers).
    pub warmup: usize,
    /// Timed runs; the median is reported.
    pub runs: usize,
}

impl Options {
    /// The defaults, except on the simulator: its virtual times repeat exactly, and it copies every
    /// byte for real on the CPU, so one warm-up and one timed run say all there is.
    pub fn for_backend(backend: &dyn crate::backend::Backend) -> Options {
        if backend.topology().is_simulated() {
            Options { warmup: 1, runs: 1 }
        } else {
            Options::default()
        }
    }
}

impl Default for Options {
    /// Enough runs that the median of a few-µs transfer is steady: with 3 runs, small transfers on
    /// the H200 showed up to 23% regret between strategies that take the same time, and with 11
    /// (not yet interleaved) still up to 12% where two took the same time within 0.1 µs at other
    /// sizes.
    fn default() -> Self {
        Options {
            warmup: 2,
            runs: 21,
        }
    }
}

/// The median of times a backend returned (an error where one is not finite).
fn median(values: Vec<f64>) -> Result<f64> {
    Ok(Stats::of_times(&values)?.median)
}
