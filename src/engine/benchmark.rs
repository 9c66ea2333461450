//! The engine benchmark: runs every usable strategy and the planner's pick over a size sweep, timed
//! with events, every byte verified, and reports the pick's regret (pick time / best time − 1).
//!
//! This is how the engine proves its choice: a planner whose predictions rank strategies the way
//! the backend does has a regret near zero at every size.

use super::fabric::Fabric;
use super::plan::Strategy;
use crate::{Error, Result};

/// How much to run per strategy and size.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Untimed runs first (the first use of a route allocates its staging buffers).
    pub warmup: usize,
    /// Timed runs; the median is reported.
    pub runs: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options { warmup: 1, runs: 3 }
    }
}

/// One strategy at one size.
#[derive(Clone, Debug, PartialEq)]
pub struct Timing {
    pub strategy: Strategy,
    pub chunk_bytes: u64,
    pub predicted_us: f64,
    /// Median GPU time from the transfer's start event to its end event.
    pub measured_us: f64,
}

/// Every strategy at one size, and how the pick fared.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub bytes: u64,
    pub pick: Strategy,
    /// The fastest strategy measured.
    pub best: Strategy,
    /// pick time / best time − 1: 0 when the pick was the fastest.
    pub regret: f64,
    pub timings: Vec<Timing>,
}

impl Point {
    pub fn timing(&self, strategy: Strategy) -> Option<&Timing> {
        self.timings.iter().find(|t| t.strategy == strategy)
    }
}

/// The whole sweep for one pair.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// `cuda` or `sim:<preset>`: where the times come from.
    pub source: String,
    pub src: usize,
    pub dst: usize,
    pub points: Vec<Point>,
}

impl Report {
    /// The largest regret over the sweep.
    pub fn worst_regret(&self) -> f64 {
        self.points.iter().map(|p| p.regret).fold(0.0, f64::max)
    }
}

/// Runs the sweep from GPU `src` to GPU `dst`.
pub fn run(
    fabric: &Fabric,
    src: usize,
    dst: usize,
    sizes: &[u64],
    options: Options,
) -> Result<Report> {
    if options.runs == 0 {
        return Err(Error::usage(
            "the engine benchmark needs at least one timed run",
        ));
    }
    let mut points = Vec::new();
    for &bytes in sizes {
        points.push(point(fabric, src, dst, bytes, options)?);
    }
    Ok(Report {
        source: fabric.backend().source().to_string(),
        src,
        dst,
        points,
    })
}

fn point(fabric: &Fabric, src: usize, dst: usize, bytes: u64, options: Options) -> Result<Point> {
    let pick = fabric.planner().plan(src, dst, bytes)?;
    let len = usize::try_from(bytes)
        .map_err(|_| Error::usage(format!("{bytes} bytes do not fit in this host's memory")))?;
    let from = fabric.alloc(src, len)?;
    let to = fabric.alloc(dst, len)?;
    let data = pattern(len, bytes);
    // Stale bytes from an earlier strategy must not pass verification.
    let poison: Vec<u8> = data.iter().map(|b| !b).collect();
    from.write(0, &data)?;
    let mut timings = Vec::new();
    for strategy in Strategy::ALL {
        // A strategy this pair cannot use is not a contender.
        let Ok(plan) = fabric.planner().plan_with(strategy, src, dst, bytes) else {
            continue;
        };
        to.write(0, &poison)?;
        let mut times = Vec::with_capacity(options.runs);
        for run in 0..options.warmup + options.runs {
            let t = fabric
                .transfer(from.all(), to.all())
                .strategy(strategy)
                .submit()?;
            let us = t.elapsed_us()?;
            if run >= options.warmup {
                times.push(us);
            }
        }
        verify(&to.to_vec()?, &data, strategy, src, dst)?;
        times.sort_by(f64::total_cmp);
        timings.push(Timing {
            strategy,
            chunk_bytes: plan.chunk_bytes,
            predicted_us: plan.predicted_us,
            measured_us: times[times.len() / 2],
        });
    }
    let measured = |s: Strategy| {
        timings
            .iter()
            .find(|t| t.strategy == s)
            .map(|t| t.measured_us)
    };
    let best = timings
        .iter()
        .min_by(|a, b| a.measured_us.total_cmp(&b.measured_us))
        .expect("the planner's pick is always usable");
    let pick_us = measured(pick.strategy).expect("the pick was measured");
    Ok(Point {
        bytes,
        pick: pick.strategy,
        best: best.strategy,
        regret: pick_us / best.measured_us - 1.0,
        timings,
    })
}

fn verify(got: &[u8], want: &[u8], strategy: Strategy, src: usize, dst: usize) -> Result<()> {
    match got.iter().zip(want).position(|(g, w)| g != w) {
        None => Ok(()),
        Some(offset) => Err(Error::Verification {
            test: format!("engine {strategy}"),
            src,
            dst,
            offset,
            expected: want[offset],
            found: got[offset],
        }),
    }
}

/// Bytes that differ from offset to offset and from size to size.
pub(super) fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}
