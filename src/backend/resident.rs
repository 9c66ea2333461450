//! A resident worker: a persistent kernel on one GPU that the host rings with transfers, instead of
//! a kernel launch or a copy call per transfer.
//!
//! [`Resident::start_worker`] launches the worker once, on a non-blocking stream of its own, holding
//! `copy_blocks + 1` SMs until it stops. The host then writes each transfer into a ring of
//! descriptors in pinned host memory the worker polls, and the worker's blocks move the bytes with
//! SM loads and stores (16-byte accesses, small transfers by one warp) through peer mappings. It
//! publishes completion into host memory the host polls. Nothing per transfer costs a kernel
//! launch, a copy call or an event: the µs-scale path, for small and medium transfers; large ones
//! are faster on a copy engine, which needs no SMs.
//!
//! # Contract
//! - **Who moves the bytes.** The worker's GPU loads the source and stores the destination. Any
//!   buffer a kernel on that GPU can reach will do (its own memory, a peer's with peer access
//!   enabled, pinned host memory), but start the worker on the *source* GPU: stores over NVLink or
//!   PCIe are posted and pipeline (push), loads from a peer wait a round trip each (pull).
//!   Managed memory is refused ([`crate::Error::Usage`]): a page fault inside the worker's kernel
//!   would stall it, and every ticket behind the one that faults, for as long as the driver takes.
//! - **Tickets and order.** Each submission returns a [`Ticket`]. One worker takes transfers in
//!   ticket order and reports them complete in ticket order: once ticket `t` is complete, every
//!   earlier ticket of the worker is complete, whichever thread submitted it. Transfers in flight
//!   together may run at the same time, so a transfer must not read or write bytes that an earlier,
//!   incomplete transfer writes: wait for that one first (as a batch's destinations must be
//!   disjoint). Several threads may submit through one worker at once.
//! - **Back-pressure.** The ring holds `ring_slots` transfers; a submission that finds it full waits
//!   until the oldest one completes.
//! - **Device-wide synchronisation never returns while a worker runs.** cuCtxSynchronize,
//!   cudaDeviceSynchronize, `torch.cuda.synchronize()` wait for every kernel of the device, and the
//!   worker's kernel ends only when it is stopped. Synchronise streams or events instead, and order
//!   work around transfers with [`Resident::submit_after`] and [`Resident::wait_on_stream`].
//! - **With a CUDA stream, without a host round trip.** [`Resident::submit_after`] queues a stream
//!   memory write (cuStreamWriteValue) that rings the transfer's doorbell when the stream's earlier
//!   work is done; the worker starts the transfer only then (and takes none of its later transfers
//!   before it). [`Resident::wait_on_stream`] queues a stream memory wait (cuStreamWaitValue) on
//!   the worker's completion word: the stream's later work starts once the transfer is complete.
//! - **Buffers** a transfer names must stay allocated until it is complete, as for queued copies.
//!   Memory freed while any worker runs loses its handle at once and is released when the last
//!   worker stops (a stopped worker's own memory too): releasing GPU or pinned memory waits for
//!   the device to idle (cuMemFree, cuMemFreeHost), which would otherwise wait forever. Frees
//!   elsewhere in the process (another backend, `cudaFree`, PyTorch's `empty_cache()`) wait until
//!   the worker stops: stop it first.
//! - **Never left spinning.** [`Resident::stop_worker`] stops a worker (and [`Worker`] does when
//!   dropped): it finishes every transfer already submitted, except one whose doorbell has not rung,
//!   which is abandoned with every transfer after it (waiting on them fails, saying so). A watchdog
//!   stops the kernel when the host's heartbeat has been silent for [`WorkerConfig::watchdog_ms`]
//!   (a hung or stopped process); Ctrl-C ([`crate::interrupt`]) stops every worker; when the process
//!   dies, the driver tears its context down and the kernel with it.
//!
//! On the simulator the worker is modelled: a transfer becomes visible to it one poll after the
//! host wrote it, moves at an SM copy's rate scaled by the worker's share of SMs, and its completion
//! reaches the host one PCIe store later. Every such figure is simulated.

use super::{BufferCopy, StreamId};
use crate::Result;
use std::fmt;

/// A running worker, named by the backend that started it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkerId(pub u64);

impl fmt::Display for WorkerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "worker {}", super::handles::handle_index(self.0))
    }
}

/// One submission to a worker: its worker and its place in the worker's order (0, 1, 2, …).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Ticket {
    pub worker: WorkerId,
    pub index: u64,
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "ticket {} of {}", self.index, self.worker)
    }
}

/// Copy blocks a worker runs with unless told otherwise: 16 SMs (plus the dispatching block's),
/// about an eighth of an H100 or H200.
pub const DEFAULT_COPY_BLOCKS: u32 = 16;

/// Ring slots unless told otherwise: transfers submitted and not yet complete, at most.
pub const DEFAULT_RING_SLOTS: u32 = 1024;

/// The watchdog's default: a worker whose host has been silent this long stops.
pub const DEFAULT_WATCHDOG_MS: u64 = 5_000;

/// The smallest ring: more than the 15 slots the worker reads at a time (kernels/resident.cu).
pub const MIN_RING_SLOTS: u32 = 32;

/// The largest ring.
pub const MAX_RING_SLOTS: u32 = 1 << 20;

/// The shortest watchdog period: the heartbeat thread must get the CPU a few times within it,
/// on a busy host too.
pub const MIN_WATCHDOG_MS: u64 = 100;

/// The longest watchdog period, one hour.
pub const MAX_WATCHDOG_MS: u64 = 3_600_000;

/// How a worker is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The GPU the worker runs on (start it on the source GPU of its transfers: push).
    pub device: usize,
    /// Blocks that copy (one per SM, 512 threads each), beside the block that reads the ring. With
    /// 0, the dispatching warp moves every byte itself: the lowest cost to the user's compute, the
    /// lowest bandwidth. At most the GPU's SM count minus one.
    pub copy_blocks: u32,
    /// Descriptors the ring holds, a power of two from [`MIN_RING_SLOTS`] to [`MAX_RING_SLOTS`].
    pub ring_slots: u32,
    /// The worker stops when the host's heartbeat (a thread of the worker's) has been silent this
    /// long, in milliseconds, from [`MIN_WATCHDOG_MS`] to [`MAX_WATCHDOG_MS`].
    pub watchdog_ms: u64,
}

impl WorkerConfig {
    /// A worker on `device` with the default SM share, ring and watchdog.
    pub fn on(device: usize) -> Self {
        WorkerConfig {
            device,
            copy_blocks: DEFAULT_COPY_BLOCKS,
            ring_slots: DEFAULT_RING_SLOTS,
            watchdog_ms: DEFAULT_WATCHDOG_MS,
        }
    }
}

/// Why a worker's kernel ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WorkerExit {
    /// Stopped by the host ([`Resident::stop_worker`], a dropped [`Worker`], the backend closing).
    Stopped,
    /// Stopped by Ctrl-C or SIGTERM ([`crate::interrupt::request`]).
    Interrupted,
    /// The watchdog stopped it: the host's heartbeat was silent for the configured time.
    Watchdog,
}

impl WorkerExit {
    pub fn name(self) -> &'static str {
        match self {
            WorkerExit::Stopped => "stopped",
            WorkerExit::Interrupted => "interrupted",
            WorkerExit::Watchdog => "watchdog",
        }
    }
}

/// What a stopped worker did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopReport {
    /// Tickets taken by submissions.
    pub submitted: u64,
    /// Tickets completed (the first `completed` of them); the rest were abandoned.
    pub completed: u64,
    pub exit: WorkerExit,
    /// Where the dispatcher's time went, by the GPU's own clock; None on the simulator, which
    /// models the worker's poll without timing it part by part.
    pub dispatcher: Option<DispatcherTimes>,
}

/// Where a worker's dispatcher spent its time, by the GPU's clock (%globaltimer), summed over the
/// worker's life: what takes a microsecond-scale transfer apart on the GPU's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DispatcherTimes {
    /// From the kernel's start to its stop.
    pub run_ns: u64,
    /// Poll rounds: each reads the ring's next slots and the host's words in one round trip.
    pub rounds: u64,
    /// Over every round: from its start until what it read had arrived.
    pub poll_ns: u64,
    /// Rounds that took at least one ticket.
    pub working_rounds: u64,
    /// Over the working rounds: their polls (reading slots the host had just written, which
    /// its cache may hold).
    pub working_poll_ns: u64,
    /// Over the working rounds: the copies the dispatcher moved itself (their loads, and their
    /// stores' issue) and the transfers it posted to the copy blocks.
    pub copy_ns: u64,
    /// Over the working rounds: publishing completion, whose system-scope release waits until
    /// the copies' stores have landed.
    pub publish_ns: u64,
}

/// Resident workers on a backend's GPUs. Reached through [`super::Backend::resident`]; the
/// module documentation holds the contract.
pub trait Resident: Send + Sync {
    /// Starts a worker: one launch of its kernel, on a stream of its own. Fails with a usage error
    /// for a GPU that does not exist, more copy blocks than the GPU has SMs to spare, or a ring
    /// or watchdog out of range.
    fn start_worker(&self, config: &WorkerConfig) -> Result<WorkerId>;

    /// Submits one copy (checked as [`super::Backend::copy`] checks an SM copy issued on the
    /// worker's GPU) and returns at once with its ticket, unless the ring is full. A copy of 0
    /// bytes moves nothing and completes in its turn.
    fn submit(&self, worker: WorkerId, copy: &BufferCopy) -> Result<Ticket>;

    /// Submits many copies as one ticket (checked as [`super::Backend::copy_batch`] checks them:
    /// destinations disjoint): the host writes their list into pinned memory and one ring slot
    /// names it, and the worker's warps share out the messages. The ticket completes when every
    /// message has. An empty list completes in its turn.
    fn submit_batch(&self, worker: WorkerId, copies: &[BufferCopy]) -> Result<Ticket>;

    /// Submits a copy that starts only once the work queued on `stream` so far is done: a stream
    /// memory write rings its doorbell, with no host round trip. Until then the worker takes none
    /// of its later transfers. `stream` (on any GPU) must not capture a graph.
    fn submit_after(&self, worker: WorkerId, stream: StreamId, copy: &BufferCopy)
        -> Result<Ticket>;

    /// Submits a batch (as [`Resident::submit_batch`]) that starts only once the work queued on
    /// `stream` so far is done (as [`Resident::submit_after`]).
    fn submit_batch_after(
        &self,
        worker: WorkerId,
        stream: StreamId,
        copies: &[BufferCopy],
    ) -> Result<Ticket>;

    /// Makes the work queued on `stream` after this call wait until `ticket` is complete: a stream
    /// memory wait on the worker's completion word, with no host round trip. `stream` (on any GPU)
    /// must not capture a graph.
    fn wait_on_stream(&self, stream: StreamId, ticket: Ticket) -> Result<()>;

    /// Whether `ticket` is complete (its bytes are in place), without blocking.
    fn is_complete(&self, ticket: Ticket) -> Result<bool>;

    /// Blocks the host, polling, until `ticket` is complete. Fails if the worker stopped first.
    fn wait_for(&self, ticket: Ticket) -> Result<()>;

    /// Stops a worker (see the module's contract) and waits for its kernel to end; the handle is
    /// released.
    fn stop_worker(&self, worker: WorkerId) -> Result<StopReport>;
}

/// A worker that stops when dropped; [`Worker::stop`] stops it early and reports what it did.
pub struct Worker<'a> {
    resident: &'a dyn Resident,
    id: Option<WorkerId>,
}

impl<'a> Worker<'a> {
    /// Starts a worker on `backend` (see [`Resident::start_worker`]).
    pub fn start(backend: &'a dyn super::Backend, config: &WorkerConfig) -> Result<Self> {
        let resident = backend.resident();
        let id = resident.start_worker(config)?;
        Ok(Worker {
            resident,
            id: Some(id),
        })
    }

    pub fn id(&self) -> WorkerId {
        self.id.expect("stopped only by consuming the guard")
    }

    pub fn submit(&self, copy: &BufferCopy) -> Result<Ticket> {
        self.resident.submit(self.id(), copy)
    }

    pub fn submit_batch(&self, copies: &[BufferCopy]) -> Result<Ticket> {
        self.resident.submit_batch(self.id(), copies)
    }

    pub fn submit_batch_after(&self, stream: StreamId, copies: &[BufferCopy]) -> Result<Ticket> {
        self.resident.submit_batch_after(self.id(), stream, copies)
    }

    pub fn submit_after(&self, stream: StreamId, copy: &BufferCopy) -> Result<Ticket> {
        self.resident.submit_after(self.id(), stream, copy)
    }

    pub fn wait_on_stream(&self, stream: StreamId, ticket: Ticket) -> Result<()> {
        self.resident.wait_on_stream(stream, ticket)
    }

    pub fn is_complete(&self, ticket: Ticket) -> Result<bool> {
        self.resident.is_complete(ticket)
    }

    pub fn wait(&self, ticket: Ticket) -> Result<()> {
        self.resident.wait_for(ticket)
    }

    /// Stops the worker and reports what it did.
    pub fn stop(mut self) -> Result<StopReport> {
        let id = self.id.take().expect("stopped only once");
        self.resident.stop_worker(id)
    }
}

impl Drop for Worker<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            // Nothing can report a failure from drop; `stop` is there for callers who care.
            let _ = self.resident.stop_worker(id);
        }
    }
}
