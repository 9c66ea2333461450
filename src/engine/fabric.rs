//! The safe library API: a [`Fabric`] over a backend, [`Buffer`]s on its GPUs, and [`Transfer`]s
//! between them.
//!
//! A transfer never blocks the host: it returns a handle tied to an event, which can be waited on,
//! polled, or made a dependency of later work. Buffers know which transfers still use them, and
//! that rule is checked at run time:
//! - the host cannot write a buffer a pending transfer reads or writes, nor read one a pending
//!   transfer writes (an error, not a race);
//! - a transfer that would race with a pending one on the same buffer (write after read, read
//!   after write, write after write) is ordered after it on the GPU automatically;
//! - dropping a buffer waits for the transfers that use it before its memory is freed, and a
//!   prepared batch keeps its buffers alive.

use super::executor::{self, lock, CallerStreams, Completion, Loc, ResidentWorkers, Shared};
use super::plan::{BatchPlan, Plan, Route, RouteEnd, Strategy, Ways};
use super::planner::{ways_together, Together};
use super::Planner;
use crate::backend::{Backend, BufferId, EventId, Memory, SharedBuffer, SharedMemory, StreamId};
use crate::model::CostModel;
use crate::{Error, Result};
use std::fmt;
use std::ops::Range;
use std::sync::{Arc, Mutex};

/// Moves data between the GPUs of one host by the fastest way its cost model predicts.
///
/// Cheap to share: `&Fabric` may be used from several threads at once.
pub struct Fabric {
    pub(super) shared: Arc<Shared>,
}

/// Options for opening a [`Fabric`].
pub struct FabricBuilder {
    backend: Arc<dyn Backend>,
    devices: Option<Vec<usize>>,
    model: Option<CostModel>,
    /// Copy blocks of each resident worker, where the fabric runs them.
    resident: Option<u32>,
}

impl FabricBuilder {
    /// Restricts the fabric to these GPUs: buffers live and routes relay only there.
    pub fn devices(mut self, devices: &[usize]) -> Self {
        self.devices = Some(devices.to_vec());
        self
    }

    /// Uses this cost model (from a measured profile, say) instead of the topology's defaults.
    pub fn model(mut self, model: CostModel) -> Self {
        self.model = Some(model);
        self
    }

    /// Runs a resident worker of `copy_blocks` copy blocks on each GPU that sends (started by its
    /// first resident transfer, stopped with the fabric), and lets the planner pick
    /// [`Strategy::Resident`] where it wins. While a worker runs, device-wide synchronisation
    /// (cuCtxSynchronize, `torch.cuda.synchronize()`) does not return: see
    /// [`crate::backend::resident`].
    pub fn resident(mut self, copy_blocks: u32) -> Self {
        self.resident = Some(copy_blocks);
        self
    }

    pub fn open(self) -> Result<Fabric> {
        let topology = self.backend.topology();
        let devices = topology.select(self.devices.as_deref())?;
        let model = self
            .model
            .unwrap_or_else(|| CostModel::from_topology(topology));
        let mut planner = Planner::for_devices(model, &devices);
        if self.resident.is_some() {
            planner = planner.with_resident();
        }
        let workers = self.resident.map(ResidentWorkers::new);
        Ok(Fabric {
            shared: Arc::new(Shared::new(self.backend, planner, workers)),
        })
    }
}

impl Fabric {
    /// A fabric over every GPU of `backend`, planning from the topology's default costs.
    pub fn open(backend: Arc<dyn Backend>) -> Result<Fabric> {
        Fabric::builder(backend).open()
    }

    pub fn builder(backend: Arc<dyn Backend>) -> FabricBuilder {
        FabricBuilder {
            backend,
            devices: None,
            model: None,
            resident: None,
        }
    }

    pub fn backend(&self) -> &Arc<dyn Backend> {
        &self.shared.backend
    }

    pub fn planner(&self) -> &Planner {
        &self.shared.planner
    }

    /// The GPUs this fabric uses.
    pub fn devices(&self) -> &[usize] {
        self.shared.planner.devices()
    }

    /// Allocates `bytes` of memory on GPU `device`.
    pub fn alloc(&self, device: usize, bytes: usize) -> Result<Buffer> {
        self.check_member(device)?;
        if bytes == 0 {
            return Err(Error::usage(
                "cannot allocate a buffer of 0 bytes; ask for at least 1 byte",
            ));
        }
        let id = self.shared.backend.alloc(Memory::Device(device), bytes)?;
        Ok(self.adopt(id, device, bytes, Origin::Own))
    }

    fn check_member(&self, device: usize) -> Result<()> {
        if self.devices().contains(&device) {
            return Ok(());
        }
        Err(Error::usage(format!(
            "GPU {device} is not part of this fabric (GPUs {})",
            list(self.devices())
        )))
    }

    /// A fabric buffer over a backend buffer of `device`'s memory, released with the buffer.
    fn adopt(&self, id: BufferId, device: usize, size: usize, origin: Origin) -> Buffer {
        Buffer {
            state: Arc::new(BufferState {
                shared: self.shared.clone(),
                id,
                device,
                size,
                origin,
                uses: Mutex::default(),
            }),
        }
    }

    /// Exports `buffer` to another process of this host, which opens it with [`Fabric::import`]
    /// (see [`crate::backend::sharing`]). It stays this fabric's buffer; free it only after the
    /// other process has dropped its import.
    pub fn export(&self, buffer: &Buffer) -> Result<SharedBuffer> {
        self.shared.backend.sharing().export(buffer.state.id)
    }

    /// Opens another process's exported device buffer as a buffer of this fabric, mapped for GPU
    /// `gpu` of it: only work issued on `gpu` reaches it. Usually `gpu` is the GPU this process
    /// drives: the import is then a transfer's source or destination between `gpu` and the
    /// memory's GPU by a direct copy (copy engine or SM kernel, as the planner picks) that `gpu`
    /// issues, reads and writes alike. Imported for the memory's own GPU, it is reached by the
    /// routes that touch it from there too (through host memory; a relay's first hop), as where
    /// the two GPUs have no P2P. The planner picks the fastest strategy that reaches it, and a
    /// strategy asked for that cannot is refused. Dropping it closes the import, not the other
    /// process's memory.
    pub fn import(&self, shared: SharedBuffer, gpu: usize) -> Result<Buffer> {
        self.check_member(gpu)?;
        let SharedMemory::Device { gpu_uuid } = &shared.descriptor.memory else {
            return Err(Error::usage(
                "a fabric imports device memory only; shared host memory is imported with \
                 Backend::sharing",
            ));
        };
        let devices = &self.shared.backend.topology().devices;
        let device = devices.iter().position(|d| d.uuid == *gpu_uuid);
        if let Some(outside) = device.filter(|d| !self.devices().contains(d)) {
            return Err(Error::usage(format!(
                "the shared buffer is memory of GPU {outside}, which is not part of this fabric \
                 (GPUs {}): open the fabric on it",
                list(self.devices())
            )));
        }
        let size = shared.descriptor.len;
        // The backend refuses a GPU this process does not see, saying so.
        let id = self.shared.backend.sharing().import(shared, gpu)?;
        let device = device.expect("the backend imported memory of a GPU it sees");
        Ok(self.adopt(id, device, size, Origin::Imported { for_gpu: gpu }))
    }

    /// Makes `bytes` of another library's memory of GPU `device`, at unified address `address` (a
    /// PyTorch tensor's storage), a buffer of this fabric (see [`Backend::borrow_memory`]). Dropping
    /// it waits for its transfers, as any buffer's drop does, and leaves the memory to its owner.
    pub fn borrow(&self, device: usize, address: u64, bytes: usize) -> Result<Buffer> {
        self.check_member(device)?;
        let id = self.shared.backend.borrow_memory(device, address, bytes)?;
        Ok(self.adopt(id, device, bytes, Origin::Borrowed))
    }

    /// Copies `src` into `dst` (ranges of equal length) by the planner's pick.
    pub fn copy(&self, src: Span<'_>, dst: Span<'_>) -> Result<Transfer> {
        self.transfer(src, dst).submit()
    }

    /// Queues several transfers at once, their chunks interleaved, so that none waits for the CPU
    /// to finish queuing another: every GPU sending at once, or a split through the host both ways
    /// between two GPUs, starts all of its transfers together. A transfer is planned as it will
    /// run: where another of them goes the opposite way through the host, its host route is
    /// priced both ways ([`Ways::Both`]). A transfer may read what another of them reads, but
    /// none may write bytes another of them reads or writes (submit those one after the other,
    /// and the later is ordered after the earlier).
    pub fn submit_together<'a>(
        &'a self,
        transfers: Vec<TransferBuilder<'a>>,
    ) -> Result<Vec<Transfer>> {
        for (i, a) in transfers.iter().enumerate() {
            for b in &transfers[i + 1..] {
                let touches = |w: &Span<'_>, other: &Span<'_>| {
                    Arc::ptr_eq(&w.buffer.state, &other.buffer.state) && w.overlaps(other)
                };
                if touches(&a.dst, &b.src) || touches(&a.dst, &b.dst) || touches(&b.dst, &a.src) {
                    return Err(Error::usage(
                        "transfers submitted together must not write bytes another of them reads \
                         or writes; submit those one after the other",
                    ));
                }
            }
        }
        let ends: Vec<Together> = transfers.iter().map(TransferBuilder::together).collect();
        let ways = ways_together(&ends, |src, dst, bytes, strategy, ways| {
            self.shared.plan(src, dst, bytes, strategy, ways)
        });
        let prepared = transfers
            .into_iter()
            .zip(ways)
            .map(|(transfer, ways)| transfer.prepare(ways))
            .collect::<Result<Vec<_>>>()?;
        let jobs: Vec<executor::Job<'_>> = prepared.iter().map(Prepared::job).collect();
        let done = executor::submit_together(&self.shared, &jobs)?;
        Ok(prepared
            .into_iter()
            .zip(done)
            .map(|(p, done)| p.claim(done))
            .collect())
    }

    /// A copy with options: dependencies, a forced strategy.
    pub fn transfer<'a>(&'a self, src: Span<'a>, dst: Span<'a>) -> TransferBuilder<'a> {
        TransferBuilder {
            fabric: self,
            src,
            dst,
            after: Vec::new(),
            after_events: Vec::new(),
            on_streams: None,
            strategy: None,
            timed: false,
        }
    }

    /// Checks a source and destination pair: valid ranges of buffers of this fabric, of equal
    /// length, not overlapping in one buffer; returns the length. Batches check every message, so
    /// the valid case is a few comparisons and the sentences are built only for a wrong one.
    pub(super) fn check_pair(&self, src: &Span<'_>, dst: &Span<'_>) -> Result<usize> {
        let valid = |span: &Span<'_>| {
            let state = &span.buffer.state;
            Arc::ptr_eq(&state.shared, &self.shared)
                && span.range.start < span.range.end
                && span.range.end <= state.size
        };
        let same_buffer = Arc::ptr_eq(&src.buffer.state, &dst.buffer.state);
        if valid(src)
            && valid(dst)
            && src.range.len() == dst.range.len()
            && !(same_buffer && src.overlaps(dst))
        {
            return Ok(src.range.len());
        }
        Err(self.pair_error(src, dst))
    }

    /// What is wrong with a pair that [`Fabric::check_pair`] refused.
    #[cold]
    fn pair_error(&self, src: &Span<'_>, dst: &Span<'_>) -> Error {
        let (len, dst_len) = match (
            self.check_span(src, "source"),
            self.check_span(dst, "destination"),
        ) {
            (Err(e), _) | (_, Err(e)) => return e,
            (Ok(len), Ok(dst_len)) => (len, dst_len),
        };
        if len != dst_len {
            return Error::usage(format!(
                "the source range holds {len} bytes but the destination range {dst_len}; they \
                 must be equal"
            ));
        }
        Error::usage(format!(
            "the source range {:?} and destination range {:?} overlap in one buffer; bytes would \
             be overwritten while they are read",
            src.range, dst.range
        ))
    }

    /// Checks that a span is a valid range of a buffer of this fabric; returns its length.
    fn check_span(&self, span: &Span<'_>, what: &str) -> Result<usize> {
        let state = &span.buffer.state;
        if !Arc::ptr_eq(&state.shared, &self.shared) {
            return Err(Error::usage(format!(
                "the {what} buffer (on GPU {}) belongs to another fabric; use buffers allocated \
                 from the fabric that moves them",
                state.device
            )));
        }
        let Range { start, end } = span.range;
        if start > end {
            return Err(Error::usage(format!(
                "the {what} range {start}..{end} runs backwards"
            )));
        }
        if end > state.size {
            return Err(Error::usage(format!(
                "the {what} range {start}..{end} ends past the end of its {}-byte buffer on GPU {}",
                state.size, state.device
            )));
        }
        if start == end {
            return Err(Error::usage(format!(
                "the {what} range {start}..{end} is empty; a transfer moves at least 1 byte"
            )));
        }
        Ok(end - start)
    }

    pub(super) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Lets `device` reach `peer`'s memory, once per ordered pair, as the engine does before its
    /// first direct copy between them: what the proofs' plain copies get, as a careful user would
    /// set it up.
    pub(crate) fn enable_peer_access(&self, device: usize, peer: usize) -> Result<()> {
        self.shared.ensure_peer(device, peer)
    }
}

fn list(devices: &[usize]) -> String {
    devices
        .iter()
        .map(usize::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// Device memory of one GPU, owned by a [`Fabric`]. Freed when dropped (after the transfers that
/// use it).
pub struct Buffer {
    pub(super) state: Arc<BufferState>,
}

/// A pending transfer's claim on a buffer.
struct Use {
    done: Arc<Completion>,
    writes: bool,
}

/// Whose memory a buffer is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// Allocated by the fabric, freed with the buffer.
    Own,
    /// Another library's memory in this process, lent by address (see [`Fabric::borrow`]): its
    /// owner frees it, and orders its reuse by its own streams.
    Borrowed,
    /// Another process's memory, imported for one GPU, the only one whose work reaches it.
    Imported { for_gpu: usize },
}

impl Origin {
    fn imported_for(self) -> Option<usize> {
        match self {
            Origin::Imported { for_gpu } => Some(for_gpu),
            Origin::Own | Origin::Borrowed => None,
        }
    }
}

pub(super) struct BufferState {
    shared: Arc<Shared>,
    pub id: BufferId,
    pub device: usize,
    size: usize,
    pub origin: Origin,
    uses: Mutex<Vec<Use>>,
}

impl BufferState {
    /// The pending uses, with finished ones forgotten.
    fn pending(&self) -> std::sync::MutexGuard<'_, Vec<Use>> {
        let mut uses = lock(&self.uses);
        uses.retain(|u| !u.done.fired());
        uses
    }

    /// End events of pending transfers that a new access must follow: writers always; readers too
    /// when the new access writes. Finished uses stay until [`BufferState::claim`]: forgetting them
    /// frees their events, CPU time better spent after the new transfer is queued.
    pub fn conflicts(&self, writes: bool) -> Vec<Arc<Completion>> {
        lock(&self.uses)
            .iter()
            .filter(|u| (u.writes || writes) && !u.done.fired())
            .map(|u| u.done.clone())
            .collect()
    }

    /// Records a new transfer's use, forgetting those that have finished.
    pub fn claim(&self, done: &Arc<Completion>, writes: bool) {
        let mut uses = lock(&self.uses);
        uses.retain(|u| !u.done.fired());
        uses.push(Use {
            done: done.clone(),
            writes,
        });
    }

    fn check_host_range(&self, offset: usize, len: usize, what: &str) -> Result<()> {
        if offset.checked_add(len).is_none_or(|end| end > self.size) {
            return Err(Error::usage(format!(
                "cannot {what} {len} bytes at offset {offset}: the buffer on GPU {} holds {} bytes",
                self.device, self.size
            )));
        }
        Ok(())
    }
}

impl Drop for BufferState {
    fn drop(&mut self) {
        for u in lock(&self.uses).drain(..) {
            let _ = u.done.wait();
        }
        let _ = self.shared.backend.free(self.id);
    }
}

impl Buffer {
    /// The GPU the buffer lives on.
    pub fn device(&self) -> usize {
        self.state.device
    }

    /// Its size in bytes (at least 1).
    pub fn size(&self) -> usize {
        self.state.size
    }

    /// The backend's buffer underneath, for the proofs' plain copies that bypass the engine: work
    /// queued on it straight on the backend is not ordered against the engine's transfers.
    pub(crate) fn backend_id(&self) -> BufferId {
        self.state.id
    }

    /// A range of the buffer, for a transfer (checked when the transfer is submitted).
    pub fn range(&self, range: Range<usize>) -> Span<'_> {
        Span {
            buffer: self,
            range,
        }
    }

    /// The whole buffer.
    pub fn all(&self) -> Span<'_> {
        self.range(0..self.state.size)
    }

    /// Writes `data` at `offset` from the host. Refused while a transfer still uses the buffer.
    pub fn write(&self, offset: usize, data: &[u8]) -> Result<()> {
        let state = &self.state;
        state.check_host_range(offset, data.len(), "write")?;
        let pending = state.pending();
        if !pending.is_empty() {
            return Err(Error::usage(format!(
                "the buffer on GPU {} is in use by {} transfer{} that ha{} not finished; wait() \
                 for {} before writing it from the host",
                state.device,
                pending.len(),
                if pending.len() == 1 { "" } else { "s" },
                if pending.len() == 1 { "s" } else { "ve" },
                if pending.len() == 1 { "it" } else { "them" },
            )));
        }
        state.shared.backend.write(state.id, offset, data)
    }

    /// Reads `out.len()` bytes at `offset` into the host. Refused while a transfer writes the
    /// buffer.
    pub fn read(&self, offset: usize, out: &mut [u8]) -> Result<()> {
        let state = &self.state;
        state.check_host_range(offset, out.len(), "read")?;
        if state.pending().iter().any(|u| u.writes) {
            return Err(Error::usage(format!(
                "the buffer on GPU {} is being written by a transfer that has not finished; \
                 wait() for it before reading",
                state.device
            )));
        }
        state.shared.backend.read(state.id, offset, out)
    }

    /// The whole buffer's bytes (see [`Buffer::read`]).
    pub fn to_vec(&self) -> Result<Vec<u8>> {
        let mut out = vec![0; self.state.size];
        self.read(0, &mut out)?;
        Ok(out)
    }
}

impl fmt::Debug for Buffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buffer")
            .field("device", &self.state.device)
            .field("size", &self.state.size)
            .finish()
    }
}

/// A range of a [`Buffer`].
#[derive(Clone, Debug)]
pub struct Span<'a> {
    pub(super) buffer: &'a Buffer,
    pub(super) range: Range<usize>,
}

impl Span<'_> {
    pub(super) fn loc(&self) -> Loc {
        Loc {
            buffer: self.buffer.state.id,
            offset: self.range.start,
        }
    }

    pub(super) fn device(&self) -> usize {
        self.buffer.state.device
    }

    pub(super) fn overlaps(&self, other: &Span<'_>) -> bool {
        self.range.start < other.range.end && other.range.start < self.range.end
    }
}

/// What a transfer was planned as.
#[derive(Clone, Debug)]
pub enum Planned {
    Single(Arc<Plan>),
    Batch(BatchPlan),
}

/// A submitted transfer. Dropping it does not cancel or wait: the buffers it uses stay claimed
/// until it finishes.
pub struct Transfer {
    pub(super) done: Arc<Completion>,
    pub(super) planned: Planned,
}

impl Transfer {
    /// Blocks the host until the transfer has finished.
    pub fn wait(&self) -> Result<()> {
        self.done.wait()
    }

    /// Whether the transfer has finished (non-blocking).
    pub fn is_done(&self) -> Result<bool> {
        self.done.is_done()
    }

    /// The event that fires when the transfer is done: other streams' work can wait on it
    /// ([`Backend::wait`]). Valid while this handle lives.
    pub fn event(&self) -> EventId {
        self.done.end
    }

    /// GPU time of the whole transfer, from its start to its end event (both on the source GPU), in
    /// microseconds. Waits for the transfer first. Needs a transfer built with
    /// [`TransferBuilder::timed`] (batches are always timed).
    pub fn elapsed_us(&self) -> Result<f64> {
        let start = self.done.start.ok_or_else(|| {
            Error::usage(
                "this transfer was not timed: build it with .timed() to measure its GPU time",
            )
        })?;
        self.done.wait()?;
        self.done.backend().elapsed_us(start, self.done.end)
    }

    /// When each route of a split ended, GPU time from the transfer's start (both on the source
    /// GPU), with the bytes each carried: the routes of a well-divided split end together. Waits
    /// for the transfer first. Empty unless the transfer is a split built with
    /// [`TransferBuilder::timed`]. A pipelined route's end is recorded as the source GPU learns
    /// of its last operation, on another stream than the transfer's end: it may read a few µs
    /// past [`Transfer::elapsed_us`].
    pub fn route_ends(&self) -> Result<Vec<RouteEnd>> {
        let (Some(start), false) = (self.done.start, self.done.route_ends.is_empty()) else {
            return Ok(Vec::new());
        };
        self.done.wait()?;
        let backend = self.done.backend();
        self.done
            .route_ends
            .iter()
            .map(|mark| {
                // A route's mark may be queued after the waits that end the transfer: on GPUs it
                // can still be pending once the transfer is done.
                backend.event_synchronize(mark.event)?;
                Ok(RouteEnd {
                    route: mark.route,
                    bytes: mark.bytes,
                    end_us: backend.elapsed_us(start, mark.event)?,
                })
            })
            .collect()
    }

    /// What the planner chose.
    pub fn planned(&self) -> &Planned {
        &self.planned
    }
}

/// Options for one copy; see [`Fabric::transfer`].
pub struct TransferBuilder<'a> {
    fabric: &'a Fabric,
    src: Span<'a>,
    dst: Span<'a>,
    after: Vec<Arc<Completion>>,
    after_events: Vec<EventId>,
    /// The caller's streams of the source and destination GPUs, where it is ordered on them.
    on_streams: Option<(StreamId, StreamId)>,
    strategy: Option<Strategy>,
    timed: bool,
}

impl<'a> TransferBuilder<'a> {
    /// Records a start event too, so that [`Transfer::elapsed_us`] can tell the transfer's GPU
    /// time. Untimed direct copies skip it: an event record is CPU time every transfer would pay.
    pub fn timed(mut self) -> Self {
        self.timed = true;
        self
    }

    /// Starts only after `earlier` has finished (on the GPU; the host does not wait).
    pub fn after(mut self, earlier: &Transfer) -> Self {
        self.after.push(earlier.done.clone());
        self
    }

    /// Starts only after `event` (recorded by the caller's own work on this backend) has fired.
    pub fn after_event(mut self, event: EventId) -> Self {
        self.after_events.push(event);
        self
    }

    /// Orders the transfer on the caller's own streams, as PyTorch orders a copy between GPUs:
    /// `src_stream` of the source GPU and `dst_stream` of the destination GPU (they may be one
    /// stream where both ends are one GPU's). It starts after the work queued so far on both, and
    /// their later work waits for it. It runs on the issuing GPU's stream itself (the source's,
    /// the destination's where it reads an import of the destination's GPU) instead of the
    /// fabric's own: one wait for a mark of the other stream before it, that stream's wait for
    /// its end after it, and no event between the caller's streams and the fabric's. The caller
    /// keeps both streams alive until the transfer has finished.
    pub fn on_streams(mut self, src_stream: StreamId, dst_stream: StreamId) -> Self {
        self.on_streams = Some((src_stream, dst_stream));
        self
    }

    /// Uses this strategy instead of the planner's pick (refused where it cannot be used).
    pub fn strategy(mut self, strategy: Strategy) -> Self {
        self.strategy = Some(strategy);
        self
    }

    /// Checks the ranges, plans, and queues the transfer.
    pub fn submit(self) -> Result<Transfer> {
        let shared = self.fabric.shared().clone();
        let prepared = self.prepare(Ways::One)?;
        let done = executor::submit(&shared, &prepared.job())?;
        Ok(prepared.claim(done))
    }

    /// Queues the transfer on the caller's streams (see [`TransferBuilder::on_streams`], which
    /// it needs) and keeps nothing to wait on: the caller's later work on either stream follows
    /// it, as it follows a CUDA copy queued there, and its events go back to the fabric at once
    /// (a stream waiting on one still waits for the work it marked). Memory borrowed from its
    /// owner ([`Fabric::borrow`]) is not claimed: the owner orders its reuse by those streams, as
    /// PyTorch's allocator does, so such a buffer may be dropped at once without waiting; the
    /// fabric's own buffers and imports stay claimed until the transfer finishes, as with
    /// [`TransferBuilder::submit`]. Nothing is left to ask the driver about later: what the Python
    /// package's `Fabric.copy_` runs, once per call.
    pub fn submit_ordered(self) -> Result<()> {
        if self.on_streams.is_none() {
            return Err(Error::usage(
                "submit_ordered leaves the transfer to the caller's streams to order: name them \
                 with on_streams first, or use submit for a transfer to wait on",
            ));
        }
        let shared = self.fabric.shared().clone();
        let prepared = self.prepare(Ways::One)?;
        let done = Arc::new(executor::submit(&shared, &prepared.job())?);
        prepared.claim_buffers(&done, false);
        Ok(())
    }

    /// What [`ways_together`] needs of it: its GPUs, its bytes, a forced strategy.
    fn together(&self) -> Together {
        let bytes = self.src.range.len().min(self.dst.range.len()) as u64;
        (self.src.device(), self.dst.device(), bytes, self.strategy)
    }

    /// Checks the ranges and plans it as it runs (`ways`); gathers what the transfer must wait
    /// for (`after`, and the pending transfers it would race with).
    fn prepare(self, ways: Ways) -> Result<Prepared<'a>> {
        let fabric = self.fabric;
        let len = fabric.check_pair(&self.src, &self.dst)? as u64;
        let (a, b) = (self.src.device(), self.dst.device());
        let (plan, issuing) = match ImportReach::of(&self.src, &self.dst)? {
            None => (fabric.shared().plan(a, b, len, self.strategy, ways)?, a),
            Some(reach) => {
                let plan =
                    fabric
                        .shared()
                        .plan_reaching((a, b, len), self.strategy, ways, |p| reach.reaches(p))?;
                (plan, reach.gpu)
            }
        };
        let mut after = self.after;
        after.extend(self.src.buffer.state.conflicts(false));
        after.extend(self.dst.buffer.state.conflicts(true));
        let mut events: Vec<EventId> = after.iter().map(|c| c.end).collect();
        events.extend(self.after_events);
        let caller = self.on_streams.map(|(on_src, on_dst)| {
            let (own, other) = if issuing == a {
                (on_src, on_dst)
            } else {
                (on_dst, on_src)
            };
            CallerStreams {
                issuing: own,
                other: (other != own).then_some(other),
            }
        });
        Ok(Prepared {
            src: self.src,
            dst: self.dst,
            plan,
            issuing,
            events,
            timed: self.timed,
            caller,
        })
    }
}

/// What a transfer touching another process's memory must respect (see [`Fabric::import`]): the
/// import is reached only by work issued on the GPU it was imported for.
struct ImportReach {
    /// The GPU the import (or both) was opened for; it issues the transfer.
    gpu: usize,
    /// Which ends are imports.
    src: bool,
    dst: bool,
    /// The transfer's source and destination GPUs.
    from: usize,
    to: usize,
}

impl ImportReach {
    /// None for a transfer of this process's memory only.
    fn of(src: &Span<'_>, dst: &Span<'_>) -> Result<Option<ImportReach>> {
        let (from, to) = (src.device(), dst.device());
        let (on_src, on_dst) = (
            src.buffer.state.origin.imported_for(),
            dst.buffer.state.origin.imported_for(),
        );
        let gpu = match (on_src, on_dst) {
            (None, None) => return Ok(None),
            (Some(x), Some(y)) if x != y => {
                return Err(Error::usage(format!(
                    "the source was imported for GPU {x} and the destination for GPU {y}: one \
                     GPU issues a transfer, so import both for the same GPU"
                )))
            }
            (Some(gpu), _) | (_, Some(gpu)) => gpu,
        };
        if gpu != from && gpu != to {
            return Err(Error::usage(format!(
                "a transfer from GPU {from} to GPU {to} touches another process's memory \
                 imported for GPU {gpu}, which only work issued on GPU {gpu} reaches: transfer \
                 between GPU {gpu} and the memory's GPU, or import it for GPU {from} or {to}"
            )));
        }
        Ok(Some(ImportReach {
            gpu,
            src: on_src.is_some(),
            dst: on_dst.is_some(),
            from,
            to,
        }))
    }

    /// Whether every route of `plan`, issued on [`ImportReach::gpu`], touches the imports from
    /// that GPU alone. A direct copy touches both ends from the issuing GPU; a pipelined route
    /// reads the source from the source GPU and writes the destination from the destination GPU
    /// (host route) or the relay's (relay); a resident worker is this process's own.
    fn reaches(&self, plan: &Plan) -> bool {
        plan.paths.iter().all(|share| match share.route {
            Route::Direct(_) => true,
            Route::Host => {
                (!self.src || self.gpu == self.from) && (!self.dst || self.gpu == self.to)
            }
            Route::Relay(_) => !self.dst && self.gpu == self.from,
            Route::Resident | Route::GpudirectRdma | Route::NetStaged => false,
        })
    }
}

/// A transfer checked and planned, ready to queue.
struct Prepared<'a> {
    src: Span<'a>,
    dst: Span<'a>,
    plan: Arc<Plan>,
    /// The GPU whose streams queue it.
    issuing: usize,
    events: Vec<EventId>,
    timed: bool,
    caller: Option<CallerStreams>,
}

impl Prepared<'_> {
    fn job(&self) -> executor::Job<'_> {
        executor::Job {
            plan: &self.plan,
            issuing: self.issuing,
            src: self.src.loc(),
            dst: self.dst.loc(),
            after: &self.events,
            timed: self.timed,
            caller: self.caller,
        }
    }

    /// Marks the buffers as used by the queued transfer.
    fn claim(self, done: Completion) -> Transfer {
        let done = Arc::new(done);
        self.claim_buffers(&done, true);
        Transfer {
            done,
            planned: Planned::Single(self.plan),
        }
    }

    /// Records the transfer's use of its buffers (the destination's as a write); of memory
    /// borrowed from its owner only where `borrowed_too`.
    fn claim_buffers(&self, done: &Arc<Completion>, borrowed_too: bool) {
        for (span, writes) in [(&self.src, false), (&self.dst, true)] {
            if borrowed_too || span.buffer.state.origin != Origin::Borrowed {
                span.buffer.state.claim(done, writes);
            }
        }
    }
}
