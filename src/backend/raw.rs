//! What an implementation provides: its own work, on arguments the checked layer has already
//! checked.
//!
//! [`RawBackend`] mirrors [`Backend`](super::Backend) method for method, except that handles arrive
//! as the implementation's own objects (`Self::Buffer`, `Self::Stream`, …), which the
//! [`Checked`](super::Checked) layer keeps in its handle tables. Each method's documentation says
//! what has been checked before it is called; an implementation checks only what it alone can know
//! (memory left on a device, a preset's NUMA nodes, a driver's refusal).

use super::collective::{
    AllReduceKernel, CommRank, DataType, PeerOp, PeerTransfer, Reduction, UniqueId, Waiting,
};
use super::resident::{StopReport, WorkerConfig};
use super::{Advice, BufferCopy, BufferId, CopyMethod, Location, Memory};
use crate::topology::Topology;
use crate::Result;

/// What [`RawBackend::keep_thread_context`] keeps, held for its drop alone (which restores the
/// thread's context). Opaque, so that this layer names no implementation's types; without `Send`,
/// so that it stays on the thread whose context it keeps.
pub type KeptContext = Box<dyn std::any::Any>;

/// The core of a backend, below the checks. Every GPU index exists; every buffer, stream, event and
/// graph is live and from this backend; every range lies inside its buffer.
pub trait RawBackend: Send + Sync {
    /// A buffer's memory (cloned out of the handle table for each call that uses it).
    type Buffer: Clone + Send + Sync;
    type Stream: Clone + Send + Sync;
    type Event: Clone + Send + Sync;
    /// A held gate (taken out of the table by its release).
    type Gate: Send + Sync;
    type Graph: Clone + Send + Sync;
    /// A running resident worker (shared with calls in flight). Dropping the last reference stops
    /// it, as [`RawBackend::stop_worker`] does.
    type Worker: Send + Sync;

    fn topology(&self) -> &Topology;

    /// Stops a resident worker ([`RawResident::start_worker`]) and waits for its kernel to end.
    /// Called once per worker; calls on other threads may still hold it, and fail from then on.
    /// Here rather than with the rest of the worker's calls so that closing a backend can stop
    /// every worker before it releases anything.
    fn stop_worker(&self, worker: &Self::Worker) -> Result<StopReport>;
    fn notices(&self) -> Vec<String> {
        Vec::new()
    }

    /// See [`super::Backend::keep_thread_context`]: None where there is no CUDA context.
    fn keep_thread_context(&self) -> Result<Option<KeptContext>> {
        Ok(None)
    }

    /// Called once per ordered pair of distinct GPUs, never concurrently; the pair's P2P is not
    /// known to work (the implementation says why it does not).
    fn enable_peer_access(&self, device: usize, peer: usize) -> Result<()>;
    fn free_memory(&self, device: usize) -> Result<u64>;
    /// `bytes` > 0.
    fn alloc(&self, memory: Memory, bytes: usize) -> Result<Self::Buffer>;
    /// May refuse (the buffer stays live then); on success the checked layer drops the buffer.
    fn free(&self, buffer: &Self::Buffer) -> Result<()>;
    /// `data` is not empty.
    fn write(&self, buffer: &Self::Buffer, offset: usize, data: &[u8]) -> Result<()>;
    /// `out` is not empty.
    fn read(&self, buffer: &Self::Buffer, offset: usize, out: &mut [u8]) -> Result<()>;

    fn create_stream(&self, device: usize) -> Result<Self::Stream>;
    /// The stream does not capture.
    fn destroy_stream(&self, stream: Self::Stream) -> Result<()>;

    /// `len` > 0; source and destination do not overlap; every buffer is reachable from the
    /// stream's GPU by `method`'s rule (for a copy engine, another GPU's memory without peer access
    /// means a pair without P2P: stage the copy through host memory).
    fn copy(
        &self,
        stream: &Self::Stream,
        method: CopyMethod,
        copy: BufferCopy<&Self::Buffer>,
    ) -> Result<()>;
    /// Not empty; destinations disjoint; every buffer reachable by a kernel on the stream's GPU.
    fn copy_batch(&self, stream: &Self::Stream, batch: Batch<'_, Self::Buffer>) -> Result<()>;
    /// Not empty; destinations disjoint; every buffer reachable by the copy-engine rule of `copy`.
    fn memcpy_batch(&self, stream: &Self::Stream, batch: Batch<'_, Self::Buffer>) -> Result<()>;

    /// The stream does not capture (nor for `wait`, `synchronize`, `hold`).
    fn record(&self, stream: &Self::Stream) -> Result<Self::Event>;
    /// An event for ordering only, never timed; a recorded one where the backend has one kind.
    fn mark(&self, stream: &Self::Stream) -> Result<Self::Event> {
        self.record(stream)
    }
    fn wait(&self, stream: &Self::Stream, event: &Self::Event) -> Result<()>;
    fn event_done(&self, event: &Self::Event) -> Result<bool>;
    fn event_synchronize(&self, event: &Self::Event) -> Result<()>;
    /// Both events were recorded on one GPU. `None` while either has not completed.
    fn elapsed_us(&self, start: &Self::Event, end: &Self::Event) -> Result<Option<f64>>;
    fn destroy_event(&self, event: Self::Event) -> Result<()>;
    fn synchronize(&self, stream: &Self::Stream) -> Result<()>;
    fn host_time_us(&self) -> f64;

    fn hold(&self, stream: &Self::Stream) -> Result<Self::Gate>;
    fn release(&self, gate: Self::Gate) -> Result<()>;

    /// The stream does not capture yet.
    fn begin_capture(&self, stream: &Self::Stream) -> Result<()>;
    /// The stream captures.
    fn end_capture(&self, stream: &Self::Stream) -> Result<Self::Graph>;
    /// The stream does not capture and is on the GPU that captured the graph; every buffer the
    /// graph uses is live.
    fn replay(&self, graph: &Self::Graph, stream: &Self::Stream) -> Result<()>;
    fn destroy_graph(&self, graph: Self::Graph) -> Result<()>;

    /// The GPU exists; `bytes` > 0. The buffer's release must leave the memory to its owner.
    fn borrow_memory(&self, device: usize, address: u64, bytes: usize) -> Result<Self::Buffer>;
    /// The GPU exists. The stream's release must leave the stream to its owner.
    fn borrow_stream(&self, device: usize, handle: u64) -> Result<Self::Stream>;
    /// Whether the stream is capturing a graph, whoever began it (a borrowed stream's owner may
    /// have, through another handle of the same stream); the checked layer adds the captures of
    /// its own handles.
    fn is_capturing(&self, stream: &Self::Stream) -> Result<bool>;
}

/// The latency probes, below the checks.
pub trait RawProbes: RawBackend {
    /// `chain` holds `elements` ≥ 1 u64 indices; `result` holds at least 8 bytes; both are reachable
    /// by a kernel on the stream's GPU.
    fn pointer_chase(
        &self,
        stream: &Self::Stream,
        chain: &Self::Buffer,
        elements: u64,
        steps: u32,
        result: &Self::Buffer,
    ) -> Result<()>;

    /// Two distinct streams that do not capture; each flag holds at least 4 bytes of its own
    /// stream's GPU and is reachable by a kernel on the other stream's GPU.
    fn ping_pong(
        &self,
        ping: &Self::Stream,
        pong: &Self::Stream,
        ping_flag: &Self::Buffer,
        pong_flag: &Self::Buffer,
        rounds: u32,
    ) -> Result<()>;
}

/// Resident workers, below the checks (see [`super::Resident`]). Tickets are the worker's own
/// indices (0, 1, 2, …).
pub trait RawResident: RawBackend {
    /// The GPU exists; `copy_blocks`, `ring_slots` and `watchdog_ms` are in the documented ranges
    /// (whether the GPU has the SMs is the implementation's to check).
    fn start_worker(&self, config: &WorkerConfig) -> Result<Self::Worker>;

    /// Both ranges lie inside their buffers and do not overlap; both buffers are reachable by a
    /// kernel on the worker's GPU and neither is managed memory. `len` may be 0 (a ticket that
    /// moves nothing).
    fn submit(&self, worker: &Self::Worker, copy: BufferCopy<&Self::Buffer>) -> Result<u64>;

    /// Checked as a `copy_batch` on the worker's GPU, with no managed memory; may be empty.
    fn submit_batch(&self, worker: &Self::Worker, batch: Batch<'_, Self::Buffer>) -> Result<u64>;

    /// As `submit`; the stream does not capture.
    fn submit_after(
        &self,
        worker: &Self::Worker,
        stream: &Self::Stream,
        copy: BufferCopy<&Self::Buffer>,
    ) -> Result<u64>;

    /// As `submit_batch`; the stream does not capture.
    fn submit_batch_after(
        &self,
        worker: &Self::Worker,
        stream: &Self::Stream,
        batch: Batch<'_, Self::Buffer>,
    ) -> Result<u64>;

    /// The ticket was issued by the worker; the stream does not capture.
    fn wait_on_stream(
        &self,
        stream: &Self::Stream,
        worker: &Self::Worker,
        ticket: u64,
    ) -> Result<()>;

    /// Tickets issued so far (the next ticket's index).
    fn submitted(&self, worker: &Self::Worker) -> u64;

    /// The ticket was issued by the worker.
    fn is_complete(&self, worker: &Self::Worker, ticket: u64) -> Result<bool>;

    /// The ticket was issued by the worker.
    fn wait_for(&self, worker: &Self::Worker, ticket: u64) -> Result<()>;
}

/// Managed memory's advice and prefetches, below the checks: the buffer is managed memory, every
/// GPU the advice or location names exists, and the stream does not capture.
pub trait RawManaged: RawBackend {
    fn advise(&self, buffer: &Self::Buffer, advice: Advice) -> Result<()>;
    fn prefetch(&self, stream: &Self::Stream, buffer: &Self::Buffer, to: Location) -> Result<()>;
}

/// One rank of an all-reduce, below the checks: its stream and buffers as the implementation's
/// objects.
pub struct RawRank<'a, I: RawBackend + ?Sized> {
    pub stream: &'a I::Stream,
    pub input: &'a I::Buffer,
    pub output: &'a I::Buffer,
}

/// One rank's buffers of an all-reduce across processes, below the checks, with the GPU they are
/// memory of.
pub struct RawRankBuffers<'a, I: RawBackend + ?Sized> {
    pub device: usize,
    pub input: &'a I::Buffer,
    pub output: &'a I::Buffer,
    /// Where the call's bytes start in `input` and in `output`.
    pub input_offset: usize,
    pub output_offset: usize,
    pub flags: &'a I::Buffer,
}

/// Collectives and NCCL, below the checks (see [`super::Collectives`] and [`super::Nccl`]).
pub trait RawCollectives: RawBackend {
    /// An NCCL communicator (taken out of the table by its release).
    type Comm: Send + Sync;
    /// A symmetric window of a communicator (taken out of the table by its deregistration).
    type Window: Send + Sync;

    /// 2 to `MAX_RANKS` ranks on distinct GPUs with peer access between every two of them, in
    /// rank order; each input and output holds at least `len` bytes of its rank's GPU and no
    /// output is an input; `flags[i]` holds `FLAG_BYTES` of rank `i`'s GPU; `len` > 0 is a whole
    /// number of `dtype` elements, at most `kernel.max_len()`. The streams may capture (all of
    /// them or none): each rank's kernel is recorded into its stream's graph. A release word is
    /// pinned host memory of at least `RELEASE_WORD_BYTES`.
    #[allow(clippy::too_many_arguments)] // as `Collectives::all_reduce`
    fn all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        ranks: &[RawRank<'_, Self>],
        flags: &[&Self::Buffer],
        waiting: Waiting<&Self::Buffer>,
        len: usize,
    ) -> Result<()>;

    /// `rank` < `ranks.len()`, 2 to `MAX_RANKS` ranks on distinct GPUs; the stream is on rank
    /// `rank`'s GPU (it may capture a graph: the part is recorded for its replays); every rank's input and output hold `len` bytes from
    /// their offsets, memory of its GPU (the others imported for the stream's GPU), its flags `FLAG_BYTES`, as
    /// `all_reduce` asks.
    #[allow(clippy::too_many_arguments)] // as `Collectives::rank_all_reduce`
    fn rank_all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        rank: usize,
        stream: &Self::Stream,
        ranks: &[RawRankBuffers<'_, Self>],
        waiting: Waiting<&Self::Buffer>,
        len: usize,
    ) -> Result<()>;

    /// `duration_us` is finite and ≥ 0.
    fn busy(&self, stream: &Self::Stream, duration_us: f64) -> Result<()>;

    /// NCCL's description (see `Nccl::describe`), or why this host has none. Called once, when a
    /// caller first asks for NCCL; the answer is kept.
    fn nccl_open(&self) -> std::result::Result<String, String>;

    /// Distinct GPUs, at least one; NCCL was opened.
    fn nccl_communicator(&self, devices: &[usize]) -> Result<Self::Comm>;

    fn nccl_destroy(&self, comm: Self::Comm) -> Result<()>;

    /// One rank per GPU of the communicator, in rank order, each stream on its rank's GPU; buffers
    /// of the rank's GPU holding `len` > 0 bytes, a whole number of elements. The streams all
    /// capture or none does (here and below, as for `all_reduce`).
    fn nccl_all_reduce(
        &self,
        comm: &Self::Comm,
        dtype: DataType,
        ranks: &[RawRank<'_, Self>],
        len: usize,
    ) -> Result<()>;

    /// One stream per rank, in rank order, on the rank's GPU; at least one transfer; each
    /// transfer's ranks exist and differ, source and destination have the same length > 0 and lie
    /// on the sender's and the receiver's GPU; destinations do not overlap.
    fn nccl_send_recv(
        &self,
        comm: &Self::Comm,
        streams: &[&Self::Stream],
        transfers: &[PeerTransfer<&Self::Buffer>],
    ) -> Result<()>;

    /// NCCL was opened.
    fn nccl_unique_id(&self) -> Result<UniqueId>;

    /// NCCL was opened; `rank.rank` < `rank.world`; `rank.device` exists.
    fn nccl_join(&self, id: &UniqueId, rank: CommRank) -> Result<Self::Comm>;

    /// `comm` came from `nccl_join`; the stream is on its rank's GPU; at least one op, each of
    /// `len` > 0 bytes of that GPU's memory, its peer another rank of the communicator; receive
    /// destinations do not overlap. The stream may capture.
    fn nccl_rank_send_recv(
        &self,
        comm: &Self::Comm,
        stream: &Self::Stream,
        ops: &[PeerOp<&Self::Buffer>],
    ) -> Result<()>;

    /// Whether NCCL has symmetric windows, or one sentence why not (see `Nccl::symmetric_windows`).
    /// NCCL was opened. Called once, when a caller first asks; the answer is kept.
    fn nccl_symmetric(&self) -> std::result::Result<(), String>;

    /// NCCL has symmetric windows; the GPU exists; `bytes` > 0.
    fn nccl_alloc(&self, device: usize, bytes: usize) -> Result<Self::Buffer>;

    /// One buffer per rank of `comm` made or joined in this process, in rank order, each from
    /// `nccl_alloc` on its rank's GPU and `bytes` long, none in another window; no stream captures.
    fn nccl_register_window(
        &self,
        comm: &Self::Comm,
        buffers: &[&Self::Buffer],
        bytes: usize,
    ) -> Result<Self::Window>;

    /// `window` was registered on `comm`.
    fn nccl_deregister_window(&self, comm: &Self::Comm, window: Self::Window) -> Result<()>;
}

/// A batch's copies with the implementation's buffer objects, checked: every range inside its
/// buffer, destinations disjoint, every buffer reachable from the stream's GPU.
pub struct Batch<'a, B> {
    copies: &'a [BufferCopy],
    /// Each buffer the copies name, once.
    buffers: &'a [(BufferId, B)],
}

impl<'a, B> Batch<'a, B> {
    /// `buffers` must hold every buffer `copies` names.
    pub(super) fn new(copies: &'a [BufferCopy], buffers: &'a [(BufferId, B)]) -> Self {
        Batch { copies, buffers }
    }

    pub fn len(&self) -> usize {
        self.copies.len()
    }

    pub fn is_empty(&self) -> bool {
        self.copies.is_empty()
    }

    /// Each copy with its buffers' objects, in order. Consecutive messages mostly name the same
    /// two buffers, which are then found without a search.
    pub fn iter(&self) -> impl Iterator<Item = BufferCopy<&'a B>> + '_ {
        let buffers = self.buffers;
        let resolve = move |last: &mut Option<(BufferId, &'a B)>, id: BufferId| match *last {
            Some((known, found)) if known == id => found,
            _ => {
                let found = &buffers
                    .iter()
                    .find(|(b, _)| *b == id)
                    .expect("the checked layer lists every buffer of a batch")
                    .1;
                *last = Some((id, found));
                found
            }
        };
        let (mut dst, mut src) = (None, None);
        self.copies.iter().map(move |c| BufferCopy {
            dst: resolve(&mut dst, c.dst),
            dst_offset: c.dst_offset,
            src: resolve(&mut src, c.src),
            src_offset: c.src_offset,
            len: c.len,
        })
    }
}
