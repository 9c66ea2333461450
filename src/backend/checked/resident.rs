//! The checked layer's resident workers: their table, and the checks on every submission.
//!
//! A worker's transfers are checked as an SM copy issued on the worker's GPU would be (ranges,
//! overlap, peer access), a batch as `copy_batch` checks one; tickets must come from a live worker
//! that issued them. The table lock is held for lookups only: a submission that waits for room in
//! the ring, or a wait for completion, waits with no lock held, so that the stream work that rings a
//! doorbell, or other submitters, are never held up here.

use super::{Checked, State, Toucher};
use crate::backend::raw::{Batch, RawBackend, RawCollectives, RawProbes, RawResident};
use crate::backend::resident::{
    Resident, StopReport, Ticket, WorkerConfig, WorkerId, MAX_RING_SLOTS, MAX_WATCHDOG_MS,
    MIN_RING_SLOTS, MIN_WATCHDOG_MS,
};
use crate::backend::{BufferCopy, BufferId, Memory, StreamId};
use crate::{Error, Result};
use std::sync::Arc;

/// A worker's object and a copy's destination and source objects, checked.
type ResolvedCopy<I> = (
    Arc<<I as RawBackend>::Worker>,
    <I as RawBackend>::Buffer,
    <I as RawBackend>::Buffer,
);

/// A worker: its GPU and the implementation's object (shared with calls in flight).
/// Memory let go while a worker ran: buffers the caller freed and stopped workers' own memory.
/// Releasing GPU memory waits for the device to idle (cuMemFree, cuMemFreeHost), which never
/// happens while a worker's kernel runs, so it waits here until the last worker has stopped.
pub(super) struct Parked<I: RawCollectives> {
    pub(super) buffers: Vec<I::Buffer>,
    pub(super) workers: Vec<Arc<I::Worker>>,
    /// A worker failed to stop, or a wait was cut short by a stop request
    /// ([`crate::interrupt::abandon`]): work may run until the process ends.
    pub(super) stuck: bool,
}

impl<I: RawCollectives> Default for Parked<I> {
    fn default() -> Self {
        Parked {
            buffers: Vec::new(),
            workers: Vec::new(),
            stuck: false,
        }
    }
}

impl<I: RawCollectives> Parked<I> {
    /// Whether memory let go now must wait here.
    pub(super) fn must_wait(&self, workers_running: bool) -> bool {
        workers_running || self.stuck
    }

    /// Everything parked, once no worker runs (and none failed to stop); nothing otherwise.
    fn release(&mut self, workers_running: bool) -> Parked<I> {
        if self.must_wait(workers_running) {
            return Parked::default();
        }
        Parked {
            buffers: std::mem::take(&mut self.buffers),
            workers: std::mem::take(&mut self.workers),
            stuck: false,
        }
    }
}

pub(super) struct WorkerEntry<W> {
    device: usize,
    pub(super) raw: Arc<W>,
}

/// Who touches a worker's buffers, for messages.
const WORKER: Toucher = Toucher::Kernel("a resident worker");

/// Fails if a worker's transfer touches managed memory. Its pages would migrate on a fault inside
/// the persistent kernel, stalling every ticket queued behind that one for as long as the driver
/// takes; managed memory goes through `copy` or a kernel instead.
fn refuse_managed<I: RawCollectives>(
    st: &State<I>,
    call: &str,
    buffers: impl IntoIterator<Item = BufferId>,
) -> Result<()> {
    for id in buffers {
        if let Memory::Managed(_) = st.buffers.get(id.0)?.memory {
            return Err(Error::usage(format!(
                "{call}: {id} is managed memory, which a resident worker does not take (a page \
                 fault would stall every ticket behind it); copy it with copy or a kernel, or \
                 allocate device or pinned host memory"
            )));
        }
    }
    Ok(())
}

/// Fails unless a worker configuration is in the documented ranges.
fn check_config(config: &WorkerConfig) -> Result<()> {
    let slots = config.ring_slots;
    if !(MIN_RING_SLOTS..=MAX_RING_SLOTS).contains(&slots) || !slots.is_power_of_two() {
        return Err(Error::usage(format!(
            "a worker's ring of {slots} slots: pass a power of two from {MIN_RING_SLOTS} to \
             {MAX_RING_SLOTS}"
        )));
    }
    if !(MIN_WATCHDOG_MS..=MAX_WATCHDOG_MS).contains(&config.watchdog_ms) {
        return Err(Error::usage(format!(
            "a worker's watchdog of {} ms: pass {MIN_WATCHDOG_MS} to {MAX_WATCHDOG_MS} ms",
            config.watchdog_ms
        )));
    }
    Ok(())
}

impl<I: RawCollectives + RawResident> Checked<I> {
    /// A live worker's GPU and object.
    fn worker(st: &State<I>, worker: WorkerId) -> Result<(usize, Arc<I::Worker>)> {
        let entry = st.workers.get(worker.0)?;
        Ok((entry.device, Arc::clone(&entry.raw)))
    }

    /// A live worker's object, once it is known to have issued `ticket`.
    fn ticket(&self, ticket: Ticket) -> Result<Arc<I::Worker>> {
        let (_, raw) = Self::worker(&self.lock(), ticket.worker)?;
        let issued = self.raw.submitted(&raw);
        if ticket.index >= issued {
            return Err(Error::usage(format!(
                "{ticket} was never issued: that worker has issued tickets 0 to {} so far",
                issued.saturating_sub(1)
            )));
        }
        Ok(raw)
    }

    /// Checks one copy for a worker and returns the worker and both buffers' objects.
    fn resolve_copy(&self, worker: WorkerId, copy: &BufferCopy) -> Result<ResolvedCopy<I>> {
        let st = self.lock();
        let (device, raw) = Self::worker(&st, worker)?;
        let (dst, src) = self.check_copy(&st, "resident submit", device, copy, WORKER)?;
        refuse_managed(&st, "resident submit", [copy.dst, copy.src])?;
        Ok((raw, dst, src))
    }
}

impl<I: RawCollectives + RawResident> Checked<I> {
    /// Checks and submits a batch, behind `stream`'s doorbell where given.
    fn batch_for(
        &self,
        worker: WorkerId,
        stream: Option<StreamId>,
        copies: &[BufferCopy],
    ) -> Result<Ticket> {
        let (raw, raw_stream, buffers) = {
            let st = self.lock();
            let raw_stream = match stream {
                Some(s) => Some(self.idle_stream(&st, s, "a resident submit_batch_after")?.1),
                None => None,
            };
            let (device, raw) = Self::worker(&st, worker)?;
            let buffers = self.check_batch(&st, "resident submit_batch", device, copies, WORKER)?;
            refuse_managed(
                &st,
                "resident submit_batch",
                buffers.iter().map(|(id, _)| *id),
            )?;
            (raw, raw_stream, buffers)
        };
        let batch = Batch::new(copies, &buffers);
        let index = match &raw_stream {
            Some(s) => self.raw.submit_batch_after(&raw, s, batch)?,
            None => self.raw.submit_batch(&raw, batch)?,
        };
        Ok(issued(worker, index))
    }
}

/// The ticket `index` of `worker`.
fn issued(worker: WorkerId, index: u64) -> Ticket {
    Ticket { worker, index }
}

impl<I: RawProbes + RawCollectives + RawResident> Resident for Checked<I> {
    fn start_worker(&self, config: &WorkerConfig) -> Result<WorkerId> {
        self.check_device(config.device)?;
        check_config(config)?;
        let raw = self.raw.start_worker(config)?;
        let entry = WorkerEntry {
            device: config.device,
            raw: Arc::new(raw),
        };
        self.lock().workers.insert(entry).map(WorkerId)
    }

    fn submit(&self, worker: WorkerId, copy: &BufferCopy) -> Result<Ticket> {
        let (raw, dst, src) = self.resolve_copy(worker, copy)?;
        let index = self
            .raw
            .submit(&raw, copy.map(|b| if b == copy.dst { &dst } else { &src }))?;
        Ok(issued(worker, index))
    }

    fn submit_batch(&self, worker: WorkerId, copies: &[BufferCopy]) -> Result<Ticket> {
        self.batch_for(worker, None, copies)
    }

    fn submit_batch_after(
        &self,
        worker: WorkerId,
        stream: StreamId,
        copies: &[BufferCopy],
    ) -> Result<Ticket> {
        self.batch_for(worker, Some(stream), copies)
    }

    fn submit_after(
        &self,
        worker: WorkerId,
        stream: StreamId,
        copy: &BufferCopy,
    ) -> Result<Ticket> {
        let (raw, raw_stream, dst, src) = {
            let st = self.lock();
            let (_, raw_stream) = self.idle_stream(&st, stream, "a resident submit_after")?;
            let (device, raw) = Self::worker(&st, worker)?;
            let (dst, src) = self.check_copy(&st, "resident submit_after", device, copy, WORKER)?;
            (raw, raw_stream, dst, src)
        };
        let index = self.raw.submit_after(
            &raw,
            &raw_stream,
            copy.map(|b| if b == copy.dst { &dst } else { &src }),
        )?;
        Ok(issued(worker, index))
    }

    fn wait_on_stream(&self, stream: StreamId, ticket: Ticket) -> Result<()> {
        let (_, raw_stream) = self.idle_stream(&self.lock(), stream, "waiting for a ticket")?;
        let raw = self.ticket(ticket)?;
        self.raw.wait_on_stream(&raw_stream, &raw, ticket.index)
    }

    fn is_complete(&self, ticket: Ticket) -> Result<bool> {
        let raw = self.ticket(ticket)?;
        self.raw.is_complete(&raw, ticket.index)
    }

    fn wait_for(&self, ticket: Ticket) -> Result<()> {
        let raw = self.ticket(ticket)?;
        self.raw.wait_for(&raw, ticket.index)
    }

    fn stop_worker(&self, worker: WorkerId) -> Result<StopReport> {
        let (_, raw) = Self::worker(&self.lock(), worker)?;
        let report = self.raw.stop_worker(&raw);
        let released = {
            let mut st = self.lock();
            st.workers.remove(worker.0)?;
            // Its own memory too waits for the others: released with theirs.
            st.parked.workers.push(raw);
            if report.is_err() {
                // Its kernel may still run: nothing parked is released until the process ends.
                st.parked.stuck = true;
            }
            let running = !st.workers.is_empty();
            st.parked.release(running)
        };
        let mut freed = Ok(());
        for buffer in &released.buffers {
            freed = freed.and(self.raw.free(buffer));
        }
        drop(released);
        report.and_then(|report| freed.map(|()| report))
    }
}
