//! Pipeline activations: the GPUs are stages in order; every step, each stage runs its compute (a
//! stand-in kernel of `--compute-us`) and hands its activation (the sweep's size) to the next
//! stage, double-buffered, so that step k's hand-over overlaps step k + 1's compute.
//!
//! Stage i's step k: its compute waits for the activation of step k to arrive (stages after the
//! first) and for buffer k % 2 to be sent on from step k − 2; its hand-over, on a stream of its
//! own, waits for the compute of step k and for the next stage to have finished with that buffer
//! (its compute of step k − 2). peerlink hands over with a copy-engine copy pushed into the next
//! GPU; NCCL with a send on the stage's stream and a receive on the next stage's own stream, in a
//! communicator of the two stages alone.
//!
//! Reported: the step time, the compute kernel's time alone, and their difference, the
//! communication the overlap left exposed. Graphs cannot capture the stages' event waits, so the
//! steps are issued from the host in every mode.

use super::kinds::{Contender, IssueMode, Workload};
use super::resources::{
    buffers_on, check_memory, enable_peers, footprint, ids, length, nccl, streams_on, Communicator,
};
use super::rows::{row, Measured};
use super::settings::{Counts, Settings};
use super::timing::{measure, prime, Loop, Operation};
use crate::backend::collective::{BufferRange, PeerTransfer};
use crate::backend::{Backend, BufferCopy, BufferId, CopyMethod, EventId, StreamId};
use crate::bench::progress::Progress;
use crate::pattern;
use crate::workload::rows::Row;
use crate::{Error, Result};
use std::collections::HashMap;

/// The stand-in compute per step when `--compute-us` is not given, µs.
pub const DEFAULT_COMPUTE_US: f64 = 200.0;

/// The most stand-in compute a step may ask for, µs: one second. More only makes a sweep last
/// for hours, and far more (1e308) overflows the simulator's clock into a false deadlock.
pub const MAX_COMPUTE_US: f64 = 1e6;

/// Step time − compute alone: the communication the overlap did not hide.
pub fn exposed_us(step_us: f64, compute_us: f64) -> f64 {
    step_us - compute_us
}

/// How a stage hands its activation to the next.
enum HandOver<'a> {
    /// A copy-engine copy on the stage's send stream, pushed into the next GPU's buffer.
    Copy,
    /// An NCCL send on the stage's send stream, received on the next stage's receive stream;
    /// `pairs[i]` is the communicator of stages i and i + 1 (as PyTorch makes one per pair for
    /// point-to-point work: a stage's receive then need not queue behind its own send).
    Nccl(&'a [Communicator<'a>]),
}

/// Every stage's streams and buffers.
struct Stages<'a> {
    compute: &'a [StreamId],
    send: &'a [StreamId],
    recv: &'a [StreamId],
    /// `out[i][b]`: stage i's activation in buffer b (on GPU i).
    out: &'a [[BufferId; 2]],
    /// `input[i][b]`: where stage i receives buffer b (on GPU i).
    input: &'a [[BufferId; 2]],
}

struct Steps<'a> {
    backend: &'a dyn Backend,
    stages: &'a Stages<'a>,
    hand_over: HandOver<'a>,
    compute_us: f64,
    len: usize,
    /// `(stage, step)` → recorded after the stage's compute of that step.
    computed: HashMap<(usize, u64), EventId>,
    /// `(stage, step)` → recorded once the stage's activation of that step has arrived at the next.
    arrived: HashMap<(usize, u64), EventId>,
}

/// Which of a step's events.
#[derive(Clone, Copy)]
enum Kept {
    Computed,
    Arrived,
}

impl Steps<'_> {
    fn wait(&self, stream: StreamId, event: Option<&EventId>) -> Result<()> {
        event.map_or(Ok(()), |&e| self.backend.wait(stream, e))
    }

    /// Keeps `event` for `key`, destroying the one an earlier run of the same step left there.
    fn keep(&mut self, which: Kept, key: (usize, u64), event: EventId) -> Result<()> {
        let map = match which {
            Kept::Computed => &mut self.computed,
            Kept::Arrived => &mut self.arrived,
        };
        match map.insert(key, event) {
            Some(old) => self.backend.destroy_event(old),
            None => Ok(()),
        }
    }

    /// Destroys the events of `step` and earlier (the waits on them are queued).
    fn forget(&mut self, step: u64) -> Result<()> {
        let stale: Vec<(usize, u64)> = self
            .computed
            .keys()
            .chain(self.arrived.keys())
            .copied()
            .filter(|&(_, s)| s <= step)
            .collect();
        for key in stale {
            for map in [&mut self.computed, &mut self.arrived] {
                if let Some(event) = map.remove(&key) {
                    self.backend.destroy_event(event)?;
                }
            }
        }
        Ok(())
    }
}

impl Operation for Steps<'_> {
    fn queue(&mut self, step: u64) -> Result<()> {
        let s = self.stages;
        let n = s.compute.len();
        let b = (step % 2) as usize;
        let previous = step.checked_sub(2);
        let collectives = self.backend.collectives();
        for i in 0..n {
            if i > 0 {
                self.wait(s.compute[i], self.arrived.get(&(i - 1, step)))?;
            }
            if let Some(p) = previous {
                self.wait(s.compute[i], self.arrived.get(&(i, p)))?;
            }
            collectives.busy(s.compute[i], self.compute_us)?;
            let done = self.backend.record(s.compute[i])?;
            self.keep(Kept::Computed, (i, step), done)?;
            if i + 1 == n {
                continue;
            }
            // The receiving side's stream waits for the next stage to be done with the buffer.
            let receiver = match self.hand_over {
                HandOver::Copy => s.send[i],
                HandOver::Nccl(_) => s.recv[i + 1],
            };
            self.wait(s.send[i], Some(&done))?;
            if let Some(p) = previous {
                self.wait(receiver, self.computed.get(&(i + 1, p)))?;
            }
            let (src, dst) = (s.out[i][b], s.input[i + 1][b]);
            match self.hand_over {
                HandOver::Copy => self.backend.copy(
                    s.send[i],
                    CopyMethod::CopyEngine,
                    &BufferCopy::from_start(src, dst, self.len),
                )?,
                HandOver::Nccl(pairs) => {
                    let range = |buffer| BufferRange {
                        buffer,
                        offset: 0,
                        len: self.len,
                    };
                    let transfer = PeerTransfer {
                        from: 0,
                        to: 1,
                        src: range(src),
                        dst: range(dst),
                    };
                    let comm = &pairs[i];
                    let streams = [s.send[i], s.recv[i + 1]];
                    comm.nccl.send_recv(comm.id, &streams, &[transfer])?
                }
            }
            let arrived = self.backend.record(receiver)?;
            self.keep(Kept::Arrived, (i, step), arrived)?;
        }
        match previous {
            Some(p) => self.forget(p),
            None => Ok(()),
        }
    }
}

impl Drop for Steps<'_> {
    fn drop(&mut self) {
        // Nothing can report a failure from drop; the waits on these events are queued.
        let _ = self.forget(u64::MAX);
    }
}

/// Runs the pipeline sweep with `compute_us` of stand-in compute per step.
pub fn run(
    backend: &dyn Backend,
    settings: &mut Settings,
    compute_us: f64,
    progress: &dyn Progress,
) -> Result<Vec<Row>> {
    if !(compute_us > 0.0 && compute_us <= MAX_COMPUTE_US) {
        return Err(Error::usage(format!(
            "--compute-us must be a positive number of microseconds up to {MAX_COMPUTE_US} (one \
             second), not {compute_us:?}"
        )));
    }
    if settings.issue.contains(&IssueMode::Graphs) {
        settings.notices.push(
            "the pipeline's steps are issued from the host in every mode: its stages wait for \
             each other through events, which a graph of each stream cannot capture"
                .into(),
        );
    }
    let devices = settings.devices.clone();
    let largest = settings.largest();
    let held = footprint(
        &devices,
        |_| largest.saturating_mul(4),
        largest.saturating_mul(2),
    );
    check_memory(backend, Workload::Pipeline, settings, &held)?;
    let n = devices.len();
    enable_peers(backend, &devices)?;
    let owned = [
        streams_on(backend, &devices)?,
        streams_on(backend, &devices)?,
        streams_on(backend, &devices)?,
    ];
    let [compute, send, recv] = [ids(&owned[0]), ids(&owned[1]), ids(&owned[2])];
    let largest = length(settings.largest())?;
    let owned_buffers = [
        buffers_on(backend, &devices, largest)?,
        buffers_on(backend, &devices, largest)?,
        buffers_on(backend, &devices, largest)?,
        buffers_on(backend, &devices, largest)?,
    ];
    let pair = |a: usize, b: usize| -> Vec<[BufferId; 2]> {
        (0..n)
            .map(|i| [*owned_buffers[a][i], *owned_buffers[b][i]])
            .collect()
    };
    let stages = Stages {
        compute: &compute,
        send: &send,
        recv: &recv,
        out: &pair(0, 1),
        input: &pair(2, 3),
    };
    let pairs = stage_pair_communicators(backend, &devices, &mut settings.notices)?;
    let pipeline = Pipeline {
        backend,
        devices: &devices,
        stages: &stages,
        pairs: pairs.as_deref(),
        compute_us,
        simulated: settings.simulated,
    };
    let mut rows = Vec::new();
    progress.start("pipeline", settings.sizes.len() as u64);
    for bytes in settings.sizes_to_run() {
        match crate::interrupt::unless_stopped(pipeline.size(bytes, settings.counts(bytes)))? {
            Some(measured) => rows.extend(measured),
            None => break,
        }
        progress.step();
    }
    progress.finish();
    Ok(rows)
}

/// Where NCCL is there, a communicator per pair of consecutive stages.
fn stage_pair_communicators<'b>(
    backend: &'b dyn Backend,
    devices: &[usize],
    notices: &mut Vec<String>,
) -> Result<Option<Vec<Communicator<'b>>>> {
    nccl(backend, notices)
        .map(|nccl| {
            devices
                .windows(2)
                .map(|pair| Communicator::new(nccl, pair))
                .collect::<Result<Vec<_>>>()
        })
        .transpose()
}

/// The pipeline's stages, ready to be timed at one size after another.
struct Pipeline<'a> {
    backend: &'a dyn Backend,
    devices: &'a [usize],
    stages: &'a Stages<'a>,
    /// NCCL's communicators of consecutive stages, where NCCL is there.
    pairs: Option<&'a [Communicator<'a>]>,
    compute_us: f64,
    simulated: bool,
}

/// Every stage's activations at one size, and the buffer a check reads: the check runs after one
/// more step, numbered past the timed ones.
struct Activations {
    data: Vec<[Vec<u8>; 2]>,
    checked: usize,
}

impl Pipeline<'_> {
    /// One size: the compute alone, then a row for each contender's hand-over.
    fn size(&self, bytes: u64, counts: Counts) -> Result<Vec<Row>> {
        let alone = compute_alone(
            self.backend,
            self.stages.compute[0],
            self.compute_us,
            counts,
        )?;
        let activations = self.activations(bytes, counts)?;
        let mut contenders: Vec<(Contender, &str, HandOver<'_>)> =
            vec![(Contender::Peerlink, "copy-engine copy", HandOver::Copy)];
        if let Some(pairs) = self.pairs {
            contenders.push((
                Contender::Nccl,
                "ncclSend/ncclRecv, a communicator per stage pair",
                HandOver::Nccl(pairs),
            ));
        }
        contenders
            .into_iter()
            .map(|(contender, algorithm, hand_over)| {
                let step_us = self.time(bytes, counts, &activations, algorithm, hand_over)?;
                let m = Measured::on_stream(bytes, contender, algorithm, counts.iters, step_us);
                let n = self.devices.len();
                let mut r = row(Workload::Pipeline, n, self.simulated, None, m);
                r.compute_us = Some(alone);
                r.exposed_us = Some(exposed_us(step_us, alone));
                Ok(r)
            })
            .collect()
    }

    /// Each stage's activations of `bytes`, written into its outgoing buffers.
    fn activations(&self, bytes: u64, counts: Counts) -> Result<Activations> {
        let len = length(bytes)?;
        let data: Vec<[Vec<u8>; 2]> = (0..self.devices.len())
            .map(|i| [0, 1].map(|b| pattern::bytes(pattern::seed(&[bytes, i as u64, b]), len)))
            .collect();
        for (i, data) in data.iter().enumerate() {
            for (&buffer, data) in self.stages.out[i].iter().zip(data) {
                self.backend.write(buffer, 0, data)?;
            }
        }
        let checked = ((counts.warmup + counts.iters) % 2) as usize;
        Ok(Activations { data, checked })
    }

    /// The step time with `hand_over`, the checked buffer poisoned before one more step and its
    /// bytes checked after it.
    fn time(
        &self,
        bytes: u64,
        counts: Counts,
        activations: &Activations,
        algorithm: &str,
        hand_over: HandOver<'_>,
    ) -> Result<f64> {
        let (backend, stages, devices) = (self.backend, self.stages, self.devices);
        let n = devices.len();
        let len = length(bytes)?;
        let Activations { data, checked } = activations;
        let poison = || {
            (1..n).try_for_each(|i| {
                let inverted: Vec<u8> = data[i - 1][*checked].iter().map(|b| !b).collect();
                backend.write(stages.input[i][*checked], 0, &inverted)
            })
        };
        let check = || {
            let mut found = vec![0; len];
            (1..n).try_for_each(|i| {
                backend.read(stages.input[i][*checked], 0, &mut found)?;
                Error::check_bytes(
                    format!("pipeline {algorithm}"),
                    devices[i - 1],
                    devices[i],
                    &data[i - 1][*checked],
                    &found,
                )
            })
        };
        let mut streams = [stages.compute, &stages.send[..n - 1]].concat();
        if matches!(hand_over, HandOver::Nccl(_)) {
            streams.extend_from_slice(&stages.recv[1..]);
        }
        let mut steps = Steps {
            backend,
            stages,
            hand_over,
            compute_us: self.compute_us,
            len,
            computed: HashMap::new(),
            arrived: HashMap::new(),
        };
        measure(
            backend,
            &streams,
            IssueMode::Stream,
            counts,
            &mut steps,
            poison,
            check,
        )
    }
}

/// The compute kernel's GPU time alone per step, µs, timed as the steps are.
fn compute_alone(
    backend: &dyn Backend,
    stream: StreamId,
    compute_us: f64,
    counts: Counts,
) -> Result<f64> {
    struct Busy<'a> {
        backend: &'a dyn Backend,
        stream: StreamId,
        compute_us: f64,
    }
    impl Operation for Busy<'_> {
        fn queue(&mut self, _step: u64) -> Result<()> {
            self.backend
                .collectives()
                .busy(self.stream, self.compute_us)
        }
    }
    let mut busy = Busy {
        backend,
        stream,
        compute_us,
    };
    prime(backend, &[stream], &mut busy, counts.prime)?;
    Loop::new(backend, &[stream], IssueMode::Stream, counts, &mut busy)?.time(&mut busy)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exposed_communication_is_what_the_step_adds_to_the_compute() {
        assert_eq!(exposed_us(250.0, 200.0), 50.0);
        assert_eq!(exposed_us(200.0, 200.0), 0.0);
        // Noise can put a fully hidden step a little below the compute alone: reported as it is.
        assert!(exposed_us(199.5, 200.0) < 0.0);
    }
}
