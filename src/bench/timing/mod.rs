//! How peerlink times things: the one core that bench, explain, tune, the engine's proofs and the
//! workloads measure through.
//!
//! Two shapes of measurement, each for its own question:
//! - **Windows** ([`Lane`], [`measure`]): back-to-back operations queued behind a held stream,
//!   GPU events around them, the GPU time divided by their count: what a path sustains, the CPU's
//!   cost of queuing kept out (nvbandwidth's design; nccl-tests times a loop of collectives the
//!   same way: [`held_gpu_us`] times such a loop on one stream, [`held_group_us`] on every rank's
//!   stream at once).
//! - **Runs** ([`Runs`], [`interleaved`]): one operation at a time, timed on the host clock
//!   ([`host_us`]) or between events around it ([`gpu_us`]): what a lone transfer costs, or what a
//!   caller waits for end to end. Several contenders take turns, so that drift falls on all alike.
//!
//! Either way the figures end in [`Stats`]: the median, with the spread.

pub mod cpus;
mod lanes;

pub use cpus::{spread_over_cpus, CpuSpread};

pub use lanes::{
    check_ranges, issue_spread, measure, Given, HopSpec, Lane, LaneLabel, Measurement, Sampling,
};

use super::stats::Stats;
use crate::backend::{Backend, StreamId};
use crate::Result;

/// How often a measurement taken run by run runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Runs {
    /// Untimed runs first: first-use costs (allocations, module loads, a route's staging buffers)
    /// stay out of the figures.
    pub warmup: usize,
    /// Timed runs; their median is reported.
    pub runs: usize,
}

impl Runs {
    /// `warmup` untimed calls of `run`, then `runs` timed ones: what the timed ones returned.
    pub fn collect<T>(self, mut run: impl FnMut() -> Result<T>) -> Result<Vec<T>> {
        let mut all = interleaved(self, 1, Turn::Once, |_, _| run())?;
        Ok(all.pop().unwrap_or_default())
    }

    /// [`Runs::collect`] of times, as statistics (an error where a time is not finite).
    pub fn stats(self, run: impl FnMut() -> Result<f64>) -> Result<Stats> {
        Stats::of_times(&self.collect(run)?)
    }
}

/// What one contender's turn in a round is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Turn {
    /// One run.
    Once,
    /// Two runs back to back, the second timed: a transfer right after another kind (after a
    /// staged one, the GPU nearly idle for milliseconds) ran up to 25% slower on the H200 from
    /// 32 MiB up; the contender's own first run takes that.
    SecondOfTwo,
}

/// How many times [`interleaved`] calls its `run`: what a progress bar counts.
pub fn interleaved_calls(runs: Runs, contenders: usize, turn: Turn) -> u64 {
    let per_turn = match turn {
        Turn::Once => 1,
        Turn::SecondOfTwo => 2,
    };
    ((runs.warmup + runs.runs) * contenders * per_turn) as u64
}

/// Measures `contenders` against each other: round after round, each takes its [`Turn`], and
/// `run(contender, timed)` runs it; the first `runs.warmup` rounds are untimed. Returns what each
/// contender's timed runs returned, in round order.
///
/// Contenders take turns round by round, rather than one after another, so that drift on the host
/// or the GPU (clocks, other load) falls on all of them alike rather than on whichever ran at the
/// time. The order rotates from round to round, so that no contender always follows the same one,
/// and each goes first as often as the others: whatever the first of two back-to-back runs pays
/// (or leaves behind) falls on all alike too.
pub fn interleaved<T>(
    runs: Runs,
    contenders: usize,
    turn: Turn,
    mut run: impl FnMut(usize, bool) -> Result<T>,
) -> Result<Vec<Vec<T>>> {
    let mut results: Vec<Vec<T>> = (0..contenders)
        .map(|_| Vec::with_capacity(runs.runs))
        .collect();
    for round in 0..runs.warmup + runs.runs {
        let timed = round >= runs.warmup;
        for place in 0..contenders {
            crate::interrupt::check()?;
            let contender = (round + place) % contenders;
            if turn == Turn::SecondOfTwo {
                run(contender, false)?;
            }
            let result = run(contender, timed)?;
            if timed {
                results[contender].push(result);
            }
        }
    }
    Ok(results)
}

/// Host µs spent in `call`, and what it returned.
pub fn host_us<T>(backend: &dyn Backend, call: impl FnOnce() -> Result<T>) -> Result<(T, f64)> {
    let start = backend.host_time_us();
    let value = call()?;
    Ok((value, backend.host_time_us() - start))
}

/// GPU µs between an event recorded on `stream` before `queue` puts its work there and one
/// recorded after it; the host waits for the second.
pub fn gpu_us(
    backend: &dyn Backend,
    stream: StreamId,
    queue: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let start = backend.record(stream)?;
    queue()?;
    let end = backend.record(stream)?;
    backend.event_synchronize(end)?;
    elapsed_then_destroy(backend, start, end)
}

/// [`gpu_us`] with `stream` held while `queue` puts its work there, so that the CPU's cost of
/// queuing it stays out of the window: the GPU time of back-to-back work.
pub fn held_gpu_us(
    backend: &dyn Backend,
    stream: StreamId,
    queue: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    let mut queue = Some(queue);
    let us = held_group_us(backend, &[stream], |phase| match phase {
        Phase::WarmUp => Ok(()),
        Phase::Timed => queue.take().map_or(Ok(()), |queue| queue()),
    })?;
    Ok(us[0])
}

/// Which part of a held window [`held_group_us`] asks its caller to queue.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    /// Untimed work before the start events: first-use costs, and a pipeline filling up.
    WarmUp,
    /// The work the window times.
    Timed,
}

/// GPU µs on each of `streams` (one or more per GPU, every one held while the host queues) of
/// the work `queue(Phase::Timed)` puts there, after the untimed work of `queue(Phase::WarmUp)`:
/// nccl-tests' timing of a loop of collectives on every rank's stream, the CPU's issue cost kept
/// out. The workloads take the slowest stream's time. Work may wait across streams (events) but
/// must not make the host wait for the GPUs, which stay held until both phases are queued.
pub fn held_group_us(
    backend: &dyn Backend,
    streams: &[StreamId],
    mut queue: impl FnMut(Phase) -> Result<()>,
) -> Result<Vec<f64>> {
    let mut gates = Vec::with_capacity(streams.len());
    let queued = (|| {
        for &stream in streams {
            gates.push(backend.hold(stream)?);
        }
        queue(Phase::WarmUp)?;
        let starts = record_each(backend, streams)?;
        queue(Phase::Timed)?;
        Ok((starts, record_each(backend, streams)?))
    })();
    // Release and drain even after an error, so that no stream stays held.
    let released = gates.into_iter().try_for_each(|g| backend.release(g));
    let drained = streams.iter().try_for_each(|&s| backend.synchronize(s));
    let (starts, ends) = queued?;
    released?;
    drained?;
    starts
        .into_iter()
        .zip(ends)
        .map(|(start, end)| elapsed_then_destroy(backend, start, end))
        .collect()
}

fn record_each(
    backend: &dyn Backend,
    streams: &[StreamId],
) -> Result<Vec<crate::backend::EventId>> {
    streams.iter().map(|&s| backend.record(s)).collect()
}

fn elapsed_then_destroy(
    backend: &dyn Backend,
    start: crate::backend::EventId,
    end: crate::backend::EventId,
) -> Result<f64> {
    let us = backend.elapsed_us(start, end)?;
    backend.destroy_event(start)?;
    backend.destroy_event(end)?;
    Ok(us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contenders_take_turns_in_a_rotating_order_and_warm_ups_are_not_kept() {
        let runs = Runs { warmup: 1, runs: 3 };
        let mut order = Vec::new();
        let kept = interleaved(runs, 3, Turn::Once, |c, timed| {
            order.push((c, timed));
            Ok(order.len())
        })
        .unwrap();
        let contenders: Vec<usize> = order.iter().map(|&(c, _)| c).collect();
        assert_eq!(contenders, [0, 1, 2, 1, 2, 0, 2, 0, 1, 0, 1, 2]);
        assert!(order[..3].iter().all(|&(_, timed)| !timed));
        assert!(order[3..].iter().all(|&(_, timed)| timed));
        // Each contender's timed runs, in round order.
        assert_eq!(kept, [vec![6, 8, 10], vec![4, 9, 11], vec![5, 7, 12]]);
    }

    #[test]
    fn a_second_of_two_turn_runs_twice_and_keeps_the_second() {
        let runs = Runs { warmup: 0, runs: 2 };
        let mut calls = Vec::new();
        let kept = interleaved(runs, 2, Turn::SecondOfTwo, |c, timed| {
            calls.push((c, timed));
            Ok(calls.len())
        })
        .unwrap();
        assert_eq!(
            calls,
            [
                (0, false),
                (0, true),
                (1, false),
                (1, true),
                (1, false),
                (1, true),
                (0, false),
                (0, true)
            ]
        );
        assert_eq!(kept, [vec![2, 8], vec![4, 6]]);
    }

    #[test]
    fn a_held_group_times_each_stream_after_its_warm_up() {
        use crate::backend::{sim::SimBackend, BufferCopy, CopyMethod, Memory};
        let backend = SimBackend::open("pcie-2gpu-switch").unwrap();
        let b: &dyn Backend = &backend;
        let streams = [b.create_stream(0).unwrap(), b.create_stream(1).unwrap()];
        let local = |device, bytes| {
            let src = b.alloc(Memory::Device(device), bytes).unwrap();
            let dst = b.alloc(Memory::Device(device), bytes).unwrap();
            BufferCopy::from_start(src, dst, bytes)
        };
        let copies = [local(0, 1 << 20), local(1, 4 << 20)];
        let window = |warmups: usize| {
            held_group_us(b, &streams, |phase| {
                let times = match phase {
                    Phase::WarmUp => warmups,
                    Phase::Timed => 1,
                };
                for _ in 0..times {
                    for (&stream, copy) in streams.iter().zip(&copies) {
                        b.copy(stream, CopyMethod::CopyEngine, copy)?;
                    }
                }
                Ok(())
            })
            .unwrap()
        };
        let cold = window(0);
        assert_eq!(cold.len(), 2);
        // Each stream's own work: four times the bytes take longer.
        assert!(cold[1] > 2.0 * cold[0], "{cold:?}");
        // Warm-ups queued before the start events stay out of the windows.
        let warm = window(3);
        for (w, c) in warm.iter().zip(&cold) {
            assert!((w - c).abs() < 0.05 * c, "{warm:?} against {cold:?}");
        }
        // One stream's held window is the same measurement.
        let alone = held_gpu_us(b, streams[0], || {
            b.copy(streams[0], CopyMethod::CopyEngine, &copies[0])
        })
        .unwrap();
        assert!(
            (alone - cold[0]).abs() < 0.05 * cold[0],
            "{alone} against {cold:?}"
        );
    }

    #[test]
    fn runs_keep_the_timed_results_and_an_error_stops_them() {
        let mut n = 0;
        let runs = Runs { warmup: 2, runs: 3 };
        let kept = runs
            .collect(|| {
                n += 1;
                Ok(n)
            })
            .unwrap();
        assert_eq!(kept, [3, 4, 5]);
        let stats = runs.stats(|| Ok(2.0)).unwrap();
        assert_eq!((stats.median, stats.samples), (2.0, 3));
        let failed = runs.collect(|| -> Result<()> { Err(crate::Error::usage("no")) });
        assert!(failed.is_err());
    }
}
