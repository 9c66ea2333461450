//! The resident worker on the simulated clock.
//!
//! A worker is a scheduler stream of its own that runs its transfers one after another: each
//! becomes ready one ring poll after the host wrote it (half a poll period and one round trip of a
//! load over PCIe), moves as one flow over an SM copy's path, at the copy's rate scaled by the
//! worker's share of SMs, and is recorded by an event; the host sees it complete a fenced store's
//! one way (to the destination) and a PCIe store later. A doorbell (`submit_after`) is a wait on
//! the user's stream's event, then one poll of the doorbell word; a stream waiting for a ticket
//! waits on the ticket's event, then for the completion store. The bytes move for real. Nothing
//! spins, so there is no watchdog here, and the worker's cost to other kernels on its GPU is not
//! modelled. Every figure is simulated from the preset and the estimates below.

use super::links::Place;
use super::memory::Key;
use super::scheduler::Work;
use super::{Simulator, State, Stream};
use crate::backend::raw::{Batch, RawResident};
use crate::backend::resident::{StopReport, WorkerConfig, WorkerExit};
use crate::backend::{BufferCopy, CopyMethod};
use crate::{Error, Result};
use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Host time to take a ticket and write a descriptor into the ring, µs (estimate: an atomic add
/// and 32 bytes of stores into cached pinned memory).
const SUBMIT_US: f64 = 0.05;

/// Host time of one look at the completion word, µs (estimate: a load that hits the CPU's cache
/// until the GPU writes the line).
const POLL_US: f64 = 0.02;

/// Copy blocks at which a worker's copies reach an SM copy kernel's full rate (estimate: NCCL
/// drives NVLink to its peak with 16 to 32 channels, a block each).
const FULL_RATE_BLOCKS: f64 = 32.0;

/// The dispatching warp, which copies alone in a worker without copy blocks: a sixteenth of a
/// block of 16 warps.
const DISPATCHER_BLOCKS: f64 = 1.0 / 16.0;

/// A simulated worker.
pub struct Worker {
    device: usize,
    /// The scheduler stream its transfers run on.
    stream: Stream,
    /// The fraction of an SM copy kernel's rate its copies reach (that rate already counts the
    /// kernel's efficiency against a copy engine).
    share: f64,
    ring_slots: u64,
    progress: Mutex<Progress>,
}

/// A ticket not yet seen complete by the host.
struct Pending {
    ticket: u64,
    /// Recorded on the worker's stream after the ticket's transfer.
    event: usize,
    /// From the event until the host sees the completion.
    seen_after_us: f64,
}

#[derive(Default)]
struct Progress {
    submitted: u64,
    /// Tickets the host has seen complete: every one below this.
    completed: u64,
    pending: VecDeque<Pending>,
    stopped: Option<StopReport>,
}

impl Worker {
    /// The worker's progress (locked after the simulator's state, never before).
    fn progress(&self) -> MutexGuard<'_, Progress> {
        self.progress.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn stopped_error() -> Error {
    Error::usage("this resident worker was stopped: start another to submit more transfers")
}

fn abandoned(ticket: u64) -> Error {
    Error::usage(format!(
        "ticket {ticket} was abandoned: its worker stopped before it (a doorbell that never rang \
         holds back every later transfer)"
    ))
}

impl Simulator {
    /// From the host's write of a descriptor until the worker sees it, µs: half a poll period and
    /// the poll's round trip over PCIe.
    fn ring_seen_us(&self) -> f64 {
        1.5 * self.links.preset().pcie.load_latency_ns / 1e3
    }

    /// From the end of a transfer's flow on `gpu` until the host sees it complete, µs: the fenced
    /// stores' one way to the destination, then the completion store into host memory (half a
    /// PCIe round trip).
    fn completion_seen_us(&self, st: &State, gpu: usize, dst: Key) -> f64 {
        let pcie = &self.links.preset().pcie;
        let fence = match Self::place(st, dst, gpu) {
            Place::Device(d) => self.links.signal_us(gpu, d),
            Place::Host(_) => pcie.signal_us,
        };
        fence + pcie.load_latency_ns / 2e3
    }

    /// A worker's copy work: planned as an SM copy (or batch kernel) on its GPU, at its share of
    /// the rate, starting as soon as it is ready (the worker pipelines: a transfer's latency is
    /// paid when its completion is seen, not before the next one starts).
    fn worker_copy(&self, worker: &Worker, work: Work) -> Work {
        match work {
            Work::Copy {
                copies, mut path, ..
            } => {
                path.cap = self.links.bottleneck(&path) * worker.share;
                path.latency_us = 0.0;
                Work::Copy {
                    copies,
                    path,
                    setup_us: 0.0,
                }
            }
            other => other,
        }
    }

    /// Waits (on the host clock) until `ticket` is seen complete, or fails if it never will be.
    fn await_ticket(&self, st: &mut State, progress: &mut Progress, ticket: u64) -> Result<()> {
        while progress.completed <= ticket {
            let Some(front) = progress.pending.front() else {
                return Err(abandoned(ticket));
            };
            let State {
                scheduler, store, ..
            } = &mut *st;
            let done = scheduler
                .run_until_event(front.event, store)
                .map_err(|e| match e {
                    // A stop request cut the wait short: the run ends, keeping what it measured.
                    Error::Interrupted => e,
                    _ => abandoned(ticket),
                })?;
            st.host_us = st.host_us.max(done + front.seen_after_us);
            Self::retire_front(st, progress);
        }
        st.host_us += POLL_US;
        Ok(())
    }

    /// The oldest pending ticket is complete: forget its event.
    fn retire_front(st: &mut State, progress: &mut Progress) {
        let front = progress.pending.pop_front().expect("a pending ticket");
        st.scheduler.destroy_event(front.event);
        progress.completed = front.ticket + 1;
    }

    /// Takes the next ticket for `work` (none for a transfer of 0 bytes), after `before` (work
    /// that holds it back on the worker's stream, a doorbell's), waiting for room in the ring.
    fn enqueue_ticket(
        &self,
        st: &mut State,
        worker: &Worker,
        before: Vec<Work>,
        work: Option<Work>,
        seen_after_us: f64,
    ) -> Result<u64> {
        let mut progress = worker.progress();
        if progress.stopped.is_some() {
            return Err(stopped_error());
        }
        if progress.submitted - progress.completed >= worker.ring_slots {
            let oldest = progress.submitted - worker.ring_slots;
            self.await_ticket(st, &mut progress, oldest)?;
        }
        st.host_us += SUBMIT_US;
        let ready = st.host_us + self.ring_seen_us();
        let event = st.scheduler.add_event();
        let work = work.map(|w| self.worker_copy(worker, w));
        for work in before.into_iter().chain(work).chain([Work::Record(event)]) {
            st.store.retain(&work.buffers());
            st.caches.queued(&work, &st.store);
            st.scheduler.enqueue(worker.stream.index, ready, work);
        }
        let ticket = progress.submitted;
        progress.submitted += 1;
        progress.pending.push_back(Pending {
            ticket,
            event,
            seen_after_us,
        });
        Ok(ticket)
    }

    /// A copy's work on the worker's GPU and when the host sees it done; for 0 bytes no work, and
    /// no stores to fence, only the completion's.
    fn plan_single(
        &self,
        st: &mut State,
        worker: &Worker,
        copy: BufferCopy<Key>,
    ) -> (Option<Work>, f64) {
        if copy.len == 0 {
            return (None, self.links.preset().pcie.load_latency_ns / 2e3);
        }
        let seen = self.completion_seen_us(st, worker.device, copy.dst);
        let (moves, work) = self.plan_copy(st, worker.device, CopyMethod::SmKernel, copy);
        debug_assert!(moves.is_empty(), "workers never see managed memory");
        (Some(work), seen)
    }
}

impl Simulator {
    /// A batch's work on the worker's GPU (none for an empty one) and when the host sees it done:
    /// after the slowest message's fence.
    fn plan_many(
        &self,
        st: &mut State,
        worker: &Worker,
        batch: &Batch<'_, Key>,
    ) -> Result<(Option<Work>, f64)> {
        let seen = batch
            .iter()
            .map(|c| self.completion_seen_us(st, worker.device, *c.dst))
            .fold(self.links.preset().pcie.load_latency_ns / 2e3, f64::max);
        let work = if batch.is_empty() {
            None
        } else {
            let (moves, work) = self.plan_batch(st, worker.device, batch)?;
            debug_assert!(moves.is_empty(), "workers never see managed memory");
            Some(work)
        };
        Ok((work, seen))
    }

    /// Takes a ticket for `work` behind a doorbell that `stream` rings once its earlier work is
    /// done: an event on that stream the worker's stream waits for, then the worker's poll of the
    /// doorbell word in host memory.
    fn enqueue_behind_doorbell(
        &self,
        st: &mut State,
        worker: &Worker,
        stream: &Stream,
        work: Option<Work>,
        seen_after_us: f64,
    ) -> Result<u64> {
        st.host_us += self.costs().event_issue_us;
        let rung = st.scheduler.add_event();
        let at = st.host_us;
        st.scheduler.enqueue(stream.index, at, Work::Record(rung));
        let doorbell_poll = Work::Busy {
            setup_us: 0.0,
            duration_us: self.links.preset().pcie.load_latency_ns / 1e3,
        };
        let before = vec![Work::Wait(rung), doorbell_poll];
        let queued = self.enqueue_ticket(st, worker, before, work, seen_after_us);
        // The host's name for the event goes; the queued record and wait keep its slot.
        st.scheduler.destroy_event(rung);
        queued
    }
}

impl Simulator {
    /// [`RawBackend::stop_worker`].
    pub(super) fn stop_resident(&self, worker: &Worker) -> Result<StopReport> {
        let mut st = self.lock();
        let mut progress = worker.progress();
        if let Some(report) = progress.stopped {
            return Ok(report);
        }
        // Every transfer submitted runs, up to one whose doorbell never rings.
        if let Some(last) = progress.submitted.checked_sub(1) {
            let _ = self.await_ticket(&mut st, &mut progress, last);
        }
        for left in std::mem::take(&mut progress.pending) {
            st.scheduler.destroy_event(left.event);
        }
        let report = StopReport {
            submitted: progress.submitted,
            completed: progress.completed,
            exit: WorkerExit::Stopped,
            dispatcher: None,
        };
        progress.stopped = Some(report);
        Ok(report)
    }
}

impl RawResident for Simulator {
    fn start_worker(&self, config: &WorkerConfig) -> Result<Worker> {
        let index = self.lock().scheduler.add_stream();
        let blocks = f64::from(config.copy_blocks).max(DISPATCHER_BLOCKS);
        Ok(Worker {
            device: config.device,
            stream: Stream {
                index,
                device: config.device,
            },
            share: (blocks / FULL_RATE_BLOCKS).min(1.0),
            ring_slots: u64::from(config.ring_slots),
            progress: Mutex::default(),
        })
    }

    fn submit(&self, worker: &Worker, copy: BufferCopy<&Key>) -> Result<u64> {
        let mut st = self.lock();
        let (work, seen) = self.plan_single(&mut st, worker, copy.map(|k| *k));
        self.enqueue_ticket(&mut st, worker, Vec::new(), work, seen)
    }

    fn submit_batch(&self, worker: &Worker, batch: Batch<'_, Key>) -> Result<u64> {
        let mut st = self.lock();
        let (work, seen) = self.plan_many(&mut st, worker, &batch)?;
        self.enqueue_ticket(&mut st, worker, Vec::new(), work, seen)
    }

    fn submit_after(
        &self,
        worker: &Worker,
        stream: &Stream,
        copy: BufferCopy<&Key>,
    ) -> Result<u64> {
        let mut st = self.lock();
        let (work, seen) = self.plan_single(&mut st, worker, copy.map(|k| *k));
        self.enqueue_behind_doorbell(&mut st, worker, stream, work, seen)
    }

    fn submit_batch_after(
        &self,
        worker: &Worker,
        stream: &Stream,
        batch: Batch<'_, Key>,
    ) -> Result<u64> {
        let mut st = self.lock();
        let (work, seen) = self.plan_many(&mut st, worker, &batch)?;
        self.enqueue_behind_doorbell(&mut st, worker, stream, work, seen)
    }

    fn wait_on_stream(&self, stream: &Stream, worker: &Worker, ticket: u64) -> Result<()> {
        let mut st = self.lock();
        st.host_us += self.costs().event_issue_us;
        let progress = worker.progress();
        let Some(pending) = progress.pending.iter().find(|p| p.ticket == ticket) else {
            // Already seen complete by the host, so the completion word is already there; or
            // abandoned, and a real stream would wait forever.
            return match ticket < progress.completed {
                true => Ok(()),
                false => Err(abandoned(ticket)),
            };
        };
        let at = st.host_us;
        let completion_poll = Work::Busy {
            setup_us: 0.0,
            duration_us: pending.seen_after_us,
        };
        st.scheduler
            .enqueue(stream.index, at, Work::Wait(pending.event));
        st.scheduler.enqueue(stream.index, at, completion_poll);
        Ok(())
    }

    fn submitted(&self, worker: &Worker) -> u64 {
        worker.progress().submitted
    }

    fn is_complete(&self, worker: &Worker, ticket: u64) -> Result<bool> {
        let mut st = self.lock();
        st.host_us += POLL_US;
        Self::catch_up(&mut st);
        let mut progress = worker.progress();
        while let Some(front) = progress.pending.front() {
            match st.scheduler.event_time(front.event) {
                Some(done) if done + front.seen_after_us <= st.host_us => {
                    Self::retire_front(&mut st, &mut progress)
                }
                _ => break,
            }
        }
        if ticket >= progress.completed && progress.stopped.is_some() {
            return Err(abandoned(ticket));
        }
        Ok(ticket < progress.completed)
    }

    fn wait_for(&self, worker: &Worker, ticket: u64) -> Result<()> {
        let mut st = self.lock();
        let mut progress = worker.progress();
        self.await_ticket(&mut st, &mut progress, ticket)
    }
}
