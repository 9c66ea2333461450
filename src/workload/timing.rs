//! How a workload's operation is timed in one process: primed, then a held window of warm-ups and
//! timed operations, issued from the host or replayed as graphs, then checked.

use super::kinds::IssueMode;
use super::settings::Counts;
use crate::backend::{Backend, GraphId, Owned, StreamId};
use crate::bench::timing::{held_group_us, Phase};
use crate::Result;

/// How every row of a workload in one process is timed, in words.
pub const TIMING: &str = "as nccl-tests times: warm-up operations, then `iters` operations back \
    to back on every rank's stream, GPU events around the loop on each, every stream held behind a \
    gate while the host queues; time per operation = the slowest rank's window / iters. After \
    timing, each contender ran once more into poisoned outputs and every byte was checked";

/// One operation of a workload, on every rank at once.
pub(crate) trait Operation {
    /// Queues operation number `step` (counted from 0 over warm-ups and timed operations) on every
    /// rank.
    fn queue(&mut self, step: u64) -> Result<()>;

    /// Makes every held stream wait for the work the operations queued elsewhere (the engine's
    /// own streams), so that an event recorded on it next follows all of it.
    fn join(&mut self) -> Result<()> {
        Ok(())
    }
}

/// A timed loop of one operation over the held `streams`: queued from the host, or captured once
/// into a graph per stream.
pub(crate) struct Loop<'b> {
    backend: &'b dyn Backend,
    streams: Vec<StreamId>,
    counts: Counts,
    /// One per stream, in `streams`' order, in graphs mode; empty in stream mode.
    graphs: Vec<Owned<'b, GraphId>>,
}

impl<'b> Loop<'b> {
    /// A loop of `counts.iters` operations on `streams` (every stream `op` queues on), captured
    /// now in graphs mode.
    pub fn new(
        backend: &'b dyn Backend,
        streams: &[StreamId],
        issue: IssueMode,
        counts: Counts,
        op: &mut dyn Operation,
    ) -> Result<Loop<'b>> {
        let mut graphs = Vec::new();
        if issue == IssueMode::Graphs {
            let mut capturing = Vec::with_capacity(streams.len());
            let queued = (|| {
                for &stream in streams {
                    backend.begin_capture(stream)?;
                    capturing.push(stream);
                }
                (0..counts.iters).try_for_each(|i| op.queue(u64::from(counts.warmup + i)))
            })();
            // End every capture even after an error, so that the streams are usable again.
            let mut ended = Ok(());
            for stream in capturing {
                match backend.end_capture(stream) {
                    Ok(graph) => graphs.push(Owned::new(backend, graph)),
                    Err(e) => ended = ended.and(Err(e)),
                }
            }
            queued?;
            ended?;
        }
        Ok(Loop {
            backend,
            streams: streams.to_vec(),
            counts,
            graphs,
        })
    }

    /// GPU µs per operation: every stream held while the warm-ups and the timed loop are queued,
    /// the slowest stream's window over the timed operations.
    pub fn time(&self, op: &mut dyn Operation) -> Result<f64> {
        let Counts { warmup, iters, .. } = self.counts;
        let windows = held_group_us(self.backend, &self.streams, |phase| {
            match phase {
                Phase::WarmUp => (0..warmup).try_for_each(|step| op.queue(u64::from(step)))?,
                Phase::Timed if self.graphs.is_empty() => {
                    (warmup..warmup + iters).try_for_each(|step| op.queue(u64::from(step)))?
                }
                Phase::Timed => self.replay()?,
            }
            op.join()
        })?;
        let slowest = windows.into_iter().fold(0.0, f64::max);
        Ok(slowest / f64::from(iters))
    }

    /// Runs the loop once more, untimed, and waits for it: the graphs replayed, or one operation
    /// queued. What it leaves behind is what the contender's results are checked on.
    pub fn run_once(&self, op: &mut dyn Operation) -> Result<()> {
        if self.graphs.is_empty() {
            op.queue(u64::from(self.counts.warmup + self.counts.iters))?;
        } else {
            self.replay()?;
        }
        op.join()?;
        self.streams
            .iter()
            .try_for_each(|&s| self.backend.synchronize(s))
    }

    fn replay(&self) -> Result<()> {
        self.graphs
            .iter()
            .zip(&self.streams)
            .try_for_each(|(graph, &stream)| self.backend.replay(**graph, stream))
    }
}

/// Times `op` in `issue` mode, then runs it once more after `poison` and checks the result with
/// `check`: the time per operation, every byte verified.
pub(crate) fn measure(
    backend: &dyn Backend,
    streams: &[StreamId],
    issue: IssueMode,
    counts: Counts,
    op: &mut dyn Operation,
    poison: impl FnOnce() -> Result<()>,
    check: impl FnOnce() -> Result<()>,
) -> Result<f64> {
    prime(backend, streams, op, counts.prime)?;
    let looped = Loop::new(backend, streams, issue, counts, op)?;
    let us = looped.time(op)?;
    poison()?;
    looped.run_once(op)?;
    check()?;
    Ok(us)
}

/// Runs `op` `times` times (at least once), untimed, and waits for it: first-use costs (a module
/// load, NCCL's connections, the engine's staging buffers) stay out of the held windows that
/// follow, where a host call that waited for the GPUs would wait for the gate.
pub(crate) fn prime(
    backend: &dyn Backend,
    streams: &[StreamId],
    op: &mut dyn Operation,
    times: u32,
) -> Result<()> {
    (0..times.max(1)).try_for_each(|step| op.queue(u64::from(step)))?;
    op.join()?;
    streams.iter().try_for_each(|&s| backend.synchronize(s))
}
