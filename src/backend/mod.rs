//! The seam between peerlink and a GPU host.
//!
//! Everything above this seam — the bench, the engine, the reports — is safe Rust that talks to a
//! host only through [`Backend`] (and, for the latency tests, its [`Probes`]; for managed memory,
//! its [`Managed`]). Two implementations
//! exist: [`cuda`] drives real GPUs through the CUDA driver API, NVRTC and NVML; [`sim`] simulates a
//! host from a preset, moving real bytes in host memory on a virtual, deterministic clock. Like
//! hyperfine's `Executor`, each can measure its own overhead, so the same benchmark code runs, and is
//! tested, on both.
//!
//! Each implementation provides only its own work, as a [`RawBackend`]; the [`Checked`] layer above
//! it owns the handles and checks every argument once, for both. One contract suite
//! (`tests/contract/`) holds both to the same behaviour.
//!
//! Handles ([`BufferId`], [`StreamId`], …) are small copyable ids owned by the backend that issued
//! them. Every resource has a release ([`Backend::free`], [`Backend::destroy_stream`],
//! [`Backend::destroy_event`], [`Backend::release`], [`Backend::destroy_graph`]); passing a handle
//! that was released, or that comes from another backend, is an [`Error::InvalidHandle`]. Any other
//! argument the backend cannot take (a range outside its buffer, a GPU that does not exist, work on
//! a peer's memory without peer access, a call out of order) is an [`Error::Usage`] naming it.
//!
//! [`Error::InvalidHandle`]: crate::Error::InvalidHandle
//! [`Error::Usage`]: crate::Error::Usage

mod checked;
pub mod collective;
pub mod cuda;
mod handles;
pub mod health;
pub mod host_memory;
mod overlap;
mod patterns;
mod raw;
pub mod resident;
mod shared_file;
pub mod sharing;
pub mod sim;

pub use checked::Checked;
pub use collective::{Collectives, Nccl};
pub use health::Health;
pub(crate) use overlap::first_overlap;
pub use patterns::{Patterns, RawPatterns};
pub use raw::{
    Batch, RawBackend, RawCollectives, RawManaged, RawProbes, RawRank, RawRankBuffers, RawResident,
};
pub use resident::{Resident, Ticket, Worker, WorkerConfig, WorkerId};
pub use sharing::{ShareDescriptor, SharedBuffer, SharedMemory, Sharing};

use crate::topology::{Source, Topology};
use crate::Result;
use std::fmt;

/// A block of memory on one GPU or in pinned host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BufferId(pub u64);

/// An in-order queue of work on one GPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u64);

/// A point in a stream: recorded after the work queued before it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u64);

/// A stream held back by a spinning kernel until the host releases it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GateId(pub u64);

/// A recorded sequence of stream work that can be replayed (a CUDA graph on real GPUs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GraphId(pub u64);

/// What [`Backend::keep_thread_context`] keeps: the thread's CUDA context, made current again when
/// this is dropped (on the thread that kept it: the guard cannot move to another).
pub struct KeptThreadContext {
    /// Held for its drop, which restores the context.
    _kept: Option<raw::KeptContext>,
}

/// Handles print as their kind and their index in the backend's table (`buffer 3`).
macro_rules! display_handle {
    ($($handle:ident $kind:literal),*) => {$(
        impl fmt::Display for $handle {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($kind, " {}"), handles::handle_index(self.0))
            }
        }
    )*};
}
display_handle!(BufferId "buffer", StreamId "stream", EventId "event", GateId "gate", GraphId "graph");

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Device memory of this GPU, allocated so that peers granted access can reach it.
    Device(usize),
    /// Page-locked host memory, mapped for every GPU, preferably on this NUMA node.
    PinnedHost { numa_node: Option<i32> },
    /// Managed (unified) memory, placed on this GPU when allocated: one address for the host and
    /// every GPU, its pages migrating to whichever GPU touches them (a page fault each) unless
    /// advice or a prefetch says otherwise (see [`Managed`]). Refused when larger than the GPU's
    /// free memory: peerlink never oversubscribes a GPU with managed memory.
    Managed(usize),
}

/// As error messages name it: `memory of GPU 2`, `pinned host memory`, `managed memory`.
impl fmt::Display for Memory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Memory::Device(d) => write!(f, "memory of GPU {d}"),
            Memory::PinnedHost { .. } => f.write_str("pinned host memory"),
            Memory::Managed(d) => write!(f, "managed memory (allocated for GPU {d})"),
        }
    }
}

/// Where pages of managed memory can be put: on a GPU, or in host memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Location {
    Device(usize),
    Host,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Location::Device(d) => write!(f, "GPU {d}"),
            Location::Host => f.write_str("host memory"),
        }
    }
}

/// Advice on a managed buffer (cuMemAdvise), applied to the whole buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Advice {
    /// Pages read by a GPU that lacks them are duplicated there instead of moved; a write anywhere
    /// collapses them back to the writer's one copy.
    SetReadMostly,
    /// Undoes [`Advice::SetReadMostly`], collapsing every duplicated page to one copy.
    UnsetReadMostly,
    /// Keeps the pages mapped for this GPU wherever they live: its accesses cross the link to them
    /// instead of faulting and moving them.
    SetAccessedBy(usize),
    /// Undoes [`Advice::SetAccessedBy`] for this GPU.
    UnsetAccessedBy(usize),
}

/// Which hardware moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyMethod {
    /// A DMA copy engine, driven by the context of the stream's GPU.
    CopyEngine,
    /// A copy kernel on the stream's GPU that loads and stores through peer mappings (16-byte accesses).
    SmKernel,
}

/// One contiguous copy between two buffers: `len` bytes from `src` at `src_offset` to `dst` at
/// `dst_offset`. Callers name buffers by handle; below the checked layer, an implementation gets the
/// same copy with its own buffer objects (`BufferCopy<&I::Buffer>`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferCopy<B = BufferId> {
    pub dst: B,
    pub dst_offset: usize,
    pub src: B,
    pub src_offset: usize,
    pub len: usize,
}

impl<B> BufferCopy<B> {
    /// `len` bytes from the start of `src` to the start of `dst`.
    pub fn from_start(src: B, dst: B, len: usize) -> BufferCopy<B> {
        BufferCopy {
            dst,
            dst_offset: 0,
            src,
            src_offset: 0,
            len,
        }
    }

    /// The same ranges, with each buffer replaced by `f`'s answer for it.
    pub fn map<C>(self, mut f: impl FnMut(B) -> C) -> BufferCopy<C> {
        BufferCopy {
            dst: f(self.dst),
            dst_offset: self.dst_offset,
            src: f(self.src),
            src_offset: self.src_offset,
            len: self.len,
        }
    }
}

/// What a GPU host offers to peerlink: memory, streams, events, copies, batch kernels, gates and
/// graphs. Implemented by [`Checked`] over each implementation; the contract suite checks every
/// method, its errors and every release on both.
///
/// Work on one stream runs in order; work on different streams may overlap. Nothing here blocks the
/// host except [`Backend::synchronize`], [`Backend::event_synchronize`], [`Backend::read`],
/// [`Backend::write`] and [`Backend::destroy_graph`] (see there).
///
/// Peer access: work issued on one GPU (a stream's) may touch its own memory, pinned host memory,
/// and another GPU's memory once [`Backend::enable_peer_access`] allowed it. Kernels (SM copies,
/// batches, probes) need that access; a copy-engine copy between a pair that has no P2P at all is
/// staged through host memory by the driver instead, but between a pair that has P2P it needs the
/// access enabled, so that no copy is staged by mistake.
pub trait Backend: Send + Sync {
    /// Real GPUs or the simulator (`cuda` or `sim:<preset>` in documents).
    fn source(&self) -> &Source;

    /// The host's devices and pairs, read once when the backend was opened.
    fn topology(&self) -> &Topology;

    /// What the backend could not find out about the host (NVML missing, say), one sentence each,
    /// to show beside the topology. Empty when nothing is missing.
    fn notices(&self) -> Vec<String>;

    /// Keeps the CUDA context current on this thread now (another library's: PyTorch's current
    /// device) across the backend's work, which makes its GPUs' contexts current as it goes: the
    /// returned guard makes it current again when dropped, on this thread. For callers that share
    /// the thread with other CUDA code (the Python package); nothing to keep on the simulator.
    fn keep_thread_context(&self) -> Result<KeptThreadContext> {
        Ok(KeptThreadContext { _kept: None })
    }

    /// The latency-only kernels (pointer chase, ping-pong).
    fn probes(&self) -> &dyn Probes;

    /// Work over several GPUs at once (peerlink's all-reduce, NCCL) and the stand-in compute.
    fn collectives(&self) -> &dyn Collectives;

    /// Resident workers: persistent kernels the host rings with transfers (see [`resident`]).
    fn resident(&self) -> &dyn Resident;
    /// Advice and prefetches for managed memory.
    fn managed(&self) -> &dyn Managed;
    /// What each GPU's management interface says about its health (PCIe link, NVLinks, error
    /// counters, clocks), for `peerlink doctor`.
    fn health(&self) -> &dyn Health;
    /// Filling and checking device memory with the crate's data pattern on its GPU (see
    /// [`Patterns`]).
    fn patterns(&self) -> &dyn Patterns;
    /// Exporting buffers to other processes of this host and importing theirs (see [`sharing`]).
    fn sharing(&self) -> &dyn Sharing;

    /// Lets kernels and copies issued on `device` reach memory of `peer`. Idempotent: enabling an
    /// already enabled pair succeeds, and a GPU is its own peer. Fails with [`Error::PeerAccess`],
    /// saying why, where the pair has no P2P.
    ///
    /// [`Error::PeerAccess`]: crate::Error::PeerAccess
    fn enable_peer_access(&self, device: usize, peer: usize) -> Result<()>;

    /// Bytes of device memory currently free on `device` (on the simulator: of the simulated GPU's
    /// memory, which the host must also have free, see [`host_memory`]).
    fn free_memory(&self, device: usize) -> Result<u64>;

    /// Allocates `bytes` (> 0) of memory. Device memory is reachable by peers once access is enabled.
    fn alloc(&self, memory: Memory, bytes: usize) -> Result<BufferId>;

    /// Frees a buffer. Work still queued on it must have been synchronised first. While a resident
    /// worker runs, the handle goes at once and the memory when the last worker stops (see
    /// [`resident`]).
    fn free(&self, buffer: BufferId) -> Result<()>;

    /// Size of a buffer in bytes.
    fn len(&self, buffer: BufferId) -> Result<usize>;

    /// Writes `data` at `offset` from the host, synchronously (for filling buffers; not timed).
    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<()>;

    /// Reads `out.len()` bytes at `offset` into the host, synchronously (for verification; not timed).
    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()>;

    /// A new stream on `device`.
    fn create_stream(&self, device: usize) -> Result<StreamId>;

    /// Releases a stream. Work already queued on it still runs; the handle is gone at once. A
    /// stream that captures a graph must end the capture first.
    fn destroy_stream(&self, stream: StreamId) -> Result<()>;

    /// Queues a copy on `stream`. Which GPU's stream issues it decides push (the source's) or pull
    /// (the destination's). A copy of 0 bytes queues nothing. Source and destination must not
    /// overlap.
    fn copy(&self, stream: StreamId, method: CopyMethod, copy: &BufferCopy) -> Result<()>;

    /// Queues ONE kernel on `stream`'s GPU that performs every copy in `copies` (a thread block per
    /// message, 16-byte accesses where alignment allows), loading and storing through peer mappings where
    /// a buffer is another GPU's (peer access enabled) or pinned host memory. The backend carries the copy
    /// list to the GPU itself (its cost is part of this call). Copies must not overlap each other's
    /// destinations. This is how thousands of small messages cost one launch instead of one each. An
    /// empty list queues nothing.
    fn copy_batch(&self, stream: StreamId, copies: &[BufferCopy]) -> Result<()>;

    /// Queues every copy in `copies` on `stream` as copy-engine copies in ONE driver call
    /// (cuMemcpyBatchAsync), ordered after the stream's earlier work. Copies must not overlap each
    /// other's destinations (the driver may run them in any order). An empty list queues nothing.
    fn memcpy_batch(&self, stream: StreamId, copies: &[BufferCopy]) -> Result<()>;

    /// Records an event after the work queued so far on `stream`.
    fn record(&self, stream: StreamId) -> Result<EventId>;

    /// Records an event that only orders work: no GPU time can be asked of it, and where the
    /// backend has such events streams wait on them sooner (CUDA's events without timing, which its
    /// documentation names the best for stream waits). As [`Backend::record`] elsewhere.
    fn mark(&self, stream: StreamId) -> Result<EventId> {
        self.record(stream)
    }

    /// Makes later work on `stream` wait for `event` (no host blocking).
    fn wait(&self, stream: StreamId, event: EventId) -> Result<()>;

    /// Whether the work before `event` has finished (non-blocking).
    fn event_done(&self, event: EventId) -> Result<bool>;

    /// Blocks the host until the work before `event` has finished.
    fn event_synchronize(&self, event: EventId) -> Result<()>;

    /// GPU time between two completed events of one device, in microseconds.
    fn elapsed_us(&self, start: EventId, end: EventId) -> Result<f64>;

    /// Releases an event. Streams already waiting on it still wait for the work it marked.
    fn destroy_event(&self, event: EventId) -> Result<()>;

    /// Blocks the host until all work queued on `stream` has finished.
    fn synchronize(&self, stream: StreamId) -> Result<()>;

    /// The host clock in microseconds since the backend was opened: real time on real GPUs, the
    /// simulator's virtual host time (which advances by each call's modelled CPU cost) on the sim.
    fn host_time_us(&self) -> f64;

    /// Holds `stream` behind a one-thread kernel spinning on a pinned host flag, so that work queued
    /// after it starts only at [`Backend::release`]: the CPU's issue cost stays out of GPU-time windows.
    /// The spin gives up after a timeout so that a forgotten release cannot hang the GPU. Every timed
    /// measurement uses it, which is why it is core and not a probe.
    fn hold(&self, stream: StreamId) -> Result<GateId>;

    /// Releases a held stream; the gate's handle is gone afterwards.
    fn release(&self, gate: GateId) -> Result<()>;

    /// Starts recording the work queued on `stream` into a graph instead of running it. A capture
    /// records copies, batches, pointer chases, busy kernels and collectives (on every rank's
    /// stream at once); events, waits, gates, ping-pongs and synchronisation on the stream are
    /// refused until it ends.
    fn begin_capture(&self, stream: StreamId) -> Result<()>;

    /// Ends the recording and returns a replayable graph.
    fn end_capture(&self, stream: StreamId) -> Result<GraphId>;

    /// Queues one replay of a graph on a stream of the GPU that captured it. Refused once a buffer
    /// the graph uses was freed.
    fn replay(&self, graph: GraphId, stream: StreamId) -> Result<()>;

    /// Releases a graph. Replays already queued still run. On real GPUs a graph whose kernels read
    /// copy lists from host memory (a captured `copy_batch`) waits for its queued replays to finish
    /// first, so release any gate that holds them before.
    fn destroy_graph(&self, graph: GraphId) -> Result<()>;

    /// Makes `bytes` (> 0) of another library's memory of GPU `device`, at unified address
    /// `address` (a PyTorch tensor's `data_ptr()`), a buffer of [`Memory::Device`]. peerlink never
    /// frees it: [`Backend::free`] forgets the handle at once, work queued on it still runs, and
    /// the owner must keep the memory allocated until that work is done. Real GPUs check that the
    /// range lies inside one allocation of that GPU; memory of a stream-ordered pool
    /// (cuMemAllocAsync) is reachable by other GPUs only with the pool's access granted, so the
    /// first borrow from such a pool grants the GPUs with P2P to its GPU read-write access to it
    /// (cuMemPoolSetAccess, as peer access does for other allocations). The simulator, which has
    /// no device addresses of its own, lends its buffers by made-up ones
    /// ([`Sharing::device_address`]) and takes back only those.
    fn borrow_memory(&self, device: usize, address: u64, bytes: usize) -> Result<BufferId>;

    /// Makes another library's CUDA stream of GPU `device` (`torch.cuda.current_stream(device)
    /// .cuda_stream`; 0 is the device's default stream) a stream of this backend, so that work
    /// queued on it follows the owner's work in order. peerlink never destroys it:
    /// [`Backend::destroy_stream`] forgets the handle, and the owner must keep the stream alive
    /// while the handle lives. The simulator, which has no CUDA streams, makes one simulated
    /// stream per GPU and handle at its first borrow, so that one handle's work stays in order.
    fn borrow_stream(&self, device: usize, handle: u64) -> Result<StreamId>;

    /// Whether `stream` is capturing a graph: begun here ([`Backend::begin_capture`]), or, for a
    /// borrowed stream, by its owner (`cuStreamIsCapturing`): work queued now runs only when the
    /// graph is replayed.
    fn is_capturing(&self, stream: StreamId) -> Result<bool>;
}

/// Kernels that only the latency tests use: one dependent load at a time, one flag at a time.
pub trait Probes {
    /// Queues a one-thread kernel on `stream`'s GPU that follows `steps` dependent loads through
    /// `chain`, which holds little-endian u64 element indices (entry `i` names the next element to load),
    /// starting at element 0; it stores the last index it reached as a u64 at offset 0 of `result`.
    /// `chain` may be a peer's memory (access enabled) or pinned host memory: this measures the
    /// round-trip latency of one load over that path.
    fn pointer_chase(
        &self,
        stream: StreamId,
        chain: BufferId,
        steps: u32,
        result: BufferId,
    ) -> Result<()>;

    /// Queues a ping-pong between two GPUs' kernels: for each of `rounds` rounds, the kernel on
    /// `ping`'s GPU stores the round number (a u32, with a system-scope fence) at offset 0 of
    /// `pong_flag`, which lives on the pong GPU, and the kernel on `pong`'s GPU, spinning on its local
    /// flag, answers by storing it into `ping_flag` on the ping GPU. Both flags must be zeroed first;
    /// the two streams must be on GPUs with peer access to each other (one GPU may be its own peer, on
    /// two streams). Events around the ping stream's work time `rounds` round trips.
    fn ping_pong(
        &self,
        ping: StreamId,
        pong: StreamId,
        ping_flag: BufferId,
        pong_flag: BufferId,
        rounds: u32,
    ) -> Result<()>;
}

/// What only managed memory ([`Memory::Managed`]) has: advice on where its pages should live, and
/// prefetches that move them ahead of use. Any GPU's work (kernels and copy engines) may touch a
/// managed buffer without peer access: the driver moves or maps its pages.
pub trait Managed {
    /// Applies `advice` to the whole of a managed buffer (host work, effective at once for work
    /// queued afterwards).
    fn advise(&self, buffer: BufferId, advice: Advice) -> Result<()>;

    /// Queues on `stream` the move of every page of a managed buffer to `to`, in stream order
    /// (cuMemPrefetchAsync). Under [`Advice::SetReadMostly`] the pages are duplicated there and
    /// stay where they were too.
    fn prefetch(&self, stream: StreamId, buffer: BufferId, to: Location) -> Result<()>;
}

/// A handle whose resource has a release: a buffer, stream, event, gate or graph.
pub trait Handle: Copy {
    /// Frees, destroys or releases the resource on `backend`.
    fn release_on(self, backend: &dyn Backend) -> Result<()>;
}

impl Handle for BufferId {
    fn release_on(self, backend: &dyn Backend) -> Result<()> {
        backend.free(self)
    }
}

impl Handle for StreamId {
    fn release_on(self, backend: &dyn Backend) -> Result<()> {
        backend.destroy_stream(self)
    }
}

impl Handle for EventId {
    fn release_on(self, backend: &dyn Backend) -> Result<()> {
        backend.destroy_event(self)
    }
}

impl Handle for GateId {
    fn release_on(self, backend: &dyn Backend) -> Result<()> {
        backend.release(self)
    }
}

impl Handle for GraphId {
    fn release_on(self, backend: &dyn Backend) -> Result<()> {
        backend.destroy_graph(self)
    }
}

/// A resource a scope made and releases on every way out, errors included; [`Owned::release`]
/// releases it early and reports a failure that dropping would have to ignore.
pub struct Owned<'a, H: Handle> {
    backend: &'a dyn Backend,
    handle: Option<H>,
}

impl<'a, H: Handle> Owned<'a, H> {
    pub fn new(backend: &'a dyn Backend, handle: H) -> Self {
        Owned {
            backend,
            handle: Some(handle),
        }
    }

    pub fn release(mut self) -> Result<()> {
        self.handle
            .take()
            .map_or(Ok(()), |h| h.release_on(self.backend))
    }

    /// The handle, no longer released by this guard: its new owner releases it.
    pub fn keep(mut self) -> H {
        self.handle
            .take()
            .expect("released only by consuming the guard")
    }
}

impl<H: Handle> std::ops::Deref for Owned<'_, H> {
    type Target = H;

    fn deref(&self) -> &H {
        self.handle
            .as_ref()
            .expect("released only by consuming the guard")
    }
}

impl<H: Handle> Drop for Owned<'_, H> {
    fn drop(&mut self) {
        if let Some(handle) = self.handle.take() {
            // Nothing can report a failure from drop; `release` is there for callers who care.
            let _ = handle.release_on(self.backend);
        }
    }
}

/// Which backend to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Choice {
    /// Real GPUs when the NVIDIA driver is present, else the `dgx-h100` simulator with a notice.
    Auto,
    /// Real GPUs, or an error saying why there are none.
    Gpu,
    /// The simulator with an embedded preset name or a path to a preset JSON file.
    Sim(String),
}

/// The simulator preset used when no GPU is found.
pub const DEFAULT_PRESET: &str = "dgx-h100";

/// An opened backend, with the notice to show when it is not what the user might expect.
pub struct Opened {
    pub backend: Box<dyn Backend>,
    /// Set when `Auto` fell back to the simulator: one line saying so, and why.
    pub notice: Option<String>,
}

/// Opens the backend the user asked for.
pub fn open(choice: &Choice) -> Result<Opened> {
    open_among(choice, None)
}

/// [`open`] for a run over the GPUs `in_use` alone (every GPU where `None`): a simulated host's
/// topology then lists the pairs among them only, so that a run over two GPUs of a 1024-GPU preset
/// holds two GPUs' pairs, not a million. Real GPUs are read whole (a host has a few dozen at most).
pub fn open_among(choice: &Choice, in_use: Option<&[usize]>) -> Result<Opened> {
    match choice {
        Choice::Sim(preset) => Ok(Opened {
            backend: Box::new(sim::SimBackend::open_among(preset, in_use)?),
            notice: None,
        }),
        Choice::Gpu => Ok(Opened {
            backend: Box::new(cuda::CudaBackend::open()?),
            notice: None,
        }),
        Choice::Auto => match cuda::CudaBackend::open() {
            Ok(backend) => Ok(Opened {
                backend: Box::new(backend),
                notice: None,
            }),
            Err(crate::Error::NoGpu(why)) => Ok(Opened {
                backend: Box::new(sim::SimBackend::open_among(DEFAULT_PRESET, in_use)?),
                notice: Some(format!(
                    "no usable NVIDIA GPU ({why}): using the SIMULATED `{DEFAULT_PRESET}` host; \
                     every figure below is simulated (pass --gpu to require real GPUs)"
                )),
            }),
            Err(other) => Err(other),
        },
    }
}
