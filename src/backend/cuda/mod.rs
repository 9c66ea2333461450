//! Real GPUs: the CUDA driver API through cudarc, NVRTC-compiled kernels, NVML for the topology.
//!
//! - `driver`: the thin raw layer (every direct `sys` call, owning types for memory and graphs);
//! - `topology`: devices and pairs, read once at open;
//! - `peer`: enabling peer access, and the driver's refusals in words;
//! - `abi`: what the host and the kernels agree on (the source, descriptors, argument layouts,
//!   entry points, the spin timeout), in one file the others import;
//! - `kernels`: copy, pattern, gate and latency kernels (sources in `kernels/*.cu`);
//! - `patterns`: filling and checking device memory with the data pattern on its GPU;
//! - `batches`: pinned memory for the copy lists of batch kernels;
//! - `gates`: pinned flags that hold streams until released;
//! - `health`: NVML's health facts for `peerlink doctor` (PCIe link, NVLinks, counters, clocks);
//! - `collective`: peerlink's all-reduce over P2P and the busy kernel, queued for every rank;
//! - `nccl`: NCCL, found and loaded at run time by a loader of our own;
//! - `resident`: resident workers, persistent kernels the host rings with transfers.
//!
//! [`Gpus`] does the work on arguments the [`Checked`] layer has already checked (ranges, handles,
//! peer access), so [`CudaBackend`] is what callers open. One primary context per device, retained
//! when work first needs it (opening asks the driver about the devices alone), with cudarc's event
//! tracking off: the backend orders work itself, and cudarc's hidden per-buffer events would
//! otherwise land in timed windows and graph captures.

mod abi;
mod batches;
mod collective;
mod driver;
mod gates;
mod health;
mod ipc;
mod kernels;
mod nccl;
mod patterns;
mod peer;
mod ranges;
mod resident;
mod topology;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use self::driver::{failed, DeviceMemory, ManagedMemory, PinnedMemory};
use super::{
    Advice, Batch, BufferCopy, Checked, CopyMethod, Location, Memory, RawBackend, RawManaged,
    RawProbes,
};
use crate::topology::Topology;
use crate::{Error, Result};

/// Whether the NVIDIA driver library can be loaded on this host (nothing else is called).
pub fn driver_library_present() -> bool {
    driver::driver_library_present()
}

pub use nccl::{
    search_candidates as nccl_search_candidates, FORWARDER_MARKER as NCCL_FORWARDER_MARKER,
    LIBRARY_VARIABLE as NCCL_LIBRARY_VARIABLE,
};

/// Makes NCCL load from `path` alone, in place of its search, for this process (what `--nccl-lib`
/// does; it takes effect if no backend has opened NCCL yet). Without it, the environment variable
/// [`NCCL_LIBRARY_VARIABLE`] may name the library; else `libnccl.so.2` and `libnccl.so` are looked
/// up by the dynamic loader, then in PyTorch installs (`nvidia/nccl/lib/libnccl.so.2`).
pub fn prefer_nccl_library(path: impl Into<std::path::PathBuf>) {
    nccl::prefer_library(path)
}

/// The backend for real NVIDIA GPUs, as callers open it.
pub type CudaBackend = Checked<Gpus>;

impl CudaBackend {
    /// Opens every visible GPU. A host without the driver, or with no GPU, is [`Error::NoGpu`].
    pub fn open() -> Result<Self> {
        Ok(Checked::new(Gpus::open()?))
    }
}

/// Driver work a backend has issued, counted since it opened: the resident worker's tests show
/// with it that a transfer through a worker costs none. NCCL's own launches are not counted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IssueCounts {
    /// Kernel launches (copies, batches, gates, probes, collectives, workers).
    pub launches: u64,
    /// Copy calls: copy-engine copies, batched copies, and the synchronous writes and reads.
    pub copies: u64,
    /// Events recorded, the backend's own included.
    pub events: u64,
    /// Stream memory operations (a resident worker's doorbells and stream waits).
    pub memory_ops: u64,
}

/// The counters behind [`IssueCounts`].
#[derive(Default)]
struct Counters {
    launches: AtomicU64,
    copies: AtomicU64,
    events: AtomicU64,
    memory_ops: AtomicU64,
}

impl CudaBackend {
    /// The GPUs on which this process holds a primary context now, whoever retained it
    /// (peerlink, PyTorch, NCCL; cuDevicePrimaryCtxGetState). The backend retains one only where
    /// work first needs it, so a rank of a job run one process per GPU holds its own GPU's alone.
    pub fn gpus_with_context(&self) -> Result<Vec<usize>> {
        let mut active = Vec::new();
        for device in 0..self.raw().contexts.len() {
            if driver::Gpu::get(device)?.primary_context_active()? {
                active.push(device);
            }
        }
        Ok(active)
    }

    /// Driver work issued since the backend opened.
    pub fn issued(&self) -> IssueCounts {
        let counters = &self.raw().issued;
        let read = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        IssueCounts {
            launches: read(&counters.launches),
            copies: read(&counters.copies),
            events: read(&counters.events),
            memory_ops: read(&counters.memory_ops),
        }
    }
}

/// A buffer's memory, freed when the last reference goes.
pub struct Buffer(Storage);

enum Storage {
    Device(DeviceMemory),
    Pinned(PinnedMemory),
    Managed(ManagedMemory),
    /// NCCL's memory for symmetric windows (`ncclMemAlloc`), freed by `ncclMemFree`.
    Nccl(nccl::WindowMemory),
    /// Another library's memory of this GPU (see `Backend::borrow_memory`): never freed here.
    Borrowed {
        address: u64,
        device: usize,
    },
    /// Another process's range of another library's memory (`ranges`), closed when freed.
    Range(ranges::RangeImport),
}

impl Buffer {
    /// The unified (UVA) address of the buffer's first byte, valid in every context.
    fn address(&self) -> u64 {
        match &self.0 {
            Storage::Device(memory) => memory.address(),
            Storage::Pinned(memory) => memory.address(),
            Storage::Managed(memory) => memory.address(),
            Storage::Nccl(memory) => memory.address(),
            Storage::Borrowed { address, .. } => *address,
            Storage::Range(range) => range.address(),
        }
    }

    /// The GPU whose context allocated the buffer, or opened it (an import).
    fn device(&self) -> usize {
        match &self.0 {
            Storage::Device(memory) => memory.device(),
            Storage::Pinned(memory) => memory.device(),
            Storage::Managed(memory) => memory.device(),
            Storage::Nccl(memory) => memory.device(),
            Storage::Borrowed { device, .. } => *device,
            Storage::Range(range) => range.device(),
        }
    }

    /// The managed memory of a buffer the checked layer found to be managed.
    fn managed(&self) -> &ManagedMemory {
        match &self.0 {
            Storage::Managed(memory) => memory,
            Storage::Device(_)
            | Storage::Pinned(_)
            | Storage::Nccl(_)
            | Storage::Borrowed { .. }
            | Storage::Range(_) => {
                unreachable!("the checked layer passes only managed buffers here")
            }
        }
    }
}

/// A stream, and the descriptor blocks of batches captured on it, for the graph to keep at
/// `end_capture`.
pub struct Stream {
    device: usize,
    stream: Arc<CudaStream>,
    captured_descriptors: Mutex<Vec<batches::Block>>,
}

/// An event, the GPU it was recorded on, and whether it keeps time (a mark does not).
pub struct Event {
    device: usize,
    event: CudaEvent,
    timed: bool,
}

/// A replayable graph and the batch descriptors its kernels read.
pub struct CapturedGraph {
    graph: Mutex<driver::Graph>,
    descriptors: Vec<batches::Block>,
    /// Where the graph was replayed, when its kernels read descriptors: they must have run before
    /// the descriptors are freed.
    replayed_on: Mutex<Vec<Arc<CudaStream>>>,
}

impl Drop for CapturedGraph {
    fn drop(&mut self) {
        // The fields go after this: the executable graph (a replay in flight would finish on its
        // own) and the descriptors, which no replay may still read.
        for stream in lock(&self.replayed_on).iter() {
            let _ = stream.synchronize();
        }
    }
}

/// Locks a mutex, carrying on past a panic of another thread (the data stay consistent: every
/// critical section here is a single insert, remove or push).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Real GPUs' work, below the checks.
pub struct Gpus {
    started: Instant,
    topology: Topology,
    notices: Vec<String>,
    kernels: kernels::KernelCache,
    /// Made at the first `hold`.
    gates: OnceLock<gates::Gates>,
    /// Per device, destroyed events kept for the next `record`: creating and destroying a CUDA
    /// event costs the CPU about a microsecond each, which every transfer would otherwise pay.
    spare_events: Vec<Mutex<Vec<CudaEvent>>>,
    /// Likewise for `mark`: events created without timing.
    spare_marks: Vec<Mutex<Vec<CudaEvent>>>,
    descriptors: batches::DescriptorPool,
    /// One internal stream per device for the synchronous `write`, `read` and pattern calls, made
    /// at its first use.
    io_streams: Vec<OnceLock<Arc<CudaStream>>>,
    issued: Counters,
    health: health::NvmlHealth,
    mismatch_slots: patterns::MismatchSlots,
    /// Other libraries' stream-ordered pools whose memory was borrowed, each granted to the GPUs
    /// with P2P to its own once.
    granted_pools: Mutex<std::collections::HashSet<driver::MemoryPool>>,
    /// Each GPU's SM count: an all-reduce's grid is sized by the smallest of its ranks' GPUs.
    sm_counts: Vec<u32>,
    /// Each GPU's primary context, retained when work first needs it (see [`Gpus::context`]).
    contexts: Vec<OnceLock<Arc<CudaContext>>>,
}

impl Gpus {
    fn open() -> Result<Self> {
        if !driver::driver_library_present() {
            return Err(Error::NoGpu(
                "the NVIDIA driver library (libcuda.so.1) cannot be loaded: install the NVIDIA \
                 driver, or add its directory to LD_LIBRARY_PATH"
                    .into(),
            ));
        }
        let started = Instant::now();
        cudarc::driver::result::init().map_err(|e| {
            Error::NoGpu(format!(
                "the CUDA driver did not start ({}); check that the NVIDIA kernel module is loaded \
                 and that CUDA_VISIBLE_DEVICES names a GPU",
                driver::cuda_error("cuInit", e)
            ))
        })?;
        let count = CudaContext::device_count().map_err(failed("cuDeviceGetCount"))?;
        if count <= 0 {
            return Err(Error::NoGpu(format!(
                "the CUDA driver sees no GPU (CUDA_VISIBLE_DEVICES={})",
                std::env::var("CUDA_VISIBLE_DEVICES").unwrap_or_else(|_| "unset".into())
            )));
        }
        // No context yet: what the topology needs the driver answers per device.
        let gpus = (0..count as usize)
            .map(driver::Gpu::get)
            .collect::<Result<Vec<_>>>()?;
        let (topology, notices) = topology::discover(&gpus)?;
        let sm_counts = gpus
            .iter()
            .map(|gpu| {
                let attribute =
                    cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
                Ok(gpu.attribute(attribute)?.max(1) as u32)
            })
            .collect::<Result<Vec<_>>>()?;
        let count = gpus.len();
        let bus_ids = topology.devices.iter().map(|d| d.pci_bus_id.clone());
        let health = health::NvmlHealth::open(bus_ids.collect());
        Ok(Gpus {
            started,
            health,
            topology,
            notices,
            kernels: kernels::KernelCache::new(count),
            gates: OnceLock::new(),
            spare_events: (0..count).map(|_| Mutex::default()).collect(),
            spare_marks: (0..count).map(|_| Mutex::default()).collect(),
            descriptors: batches::DescriptorPool::new(count),
            io_streams: (0..count).map(|_| OnceLock::new()).collect(),
            issued: Counters::default(),
            mismatch_slots: patterns::MismatchSlots::new(count),
            granted_pools: Mutex::default(),
            sm_counts,
            contexts: (0..count).map(|_| OnceLock::new()).collect(),
        })
    }

    /// GPU `device`'s primary context, retained the first time work needs it, not at open: one
    /// process per GPU (torchrun, `peerlink launch`) then holds a context, and the device memory
    /// it costs, only on its own GPU, as PyTorch and NCCL do.
    fn context(&self, device: usize) -> Result<&Arc<CudaContext>> {
        first_use(&self.contexts[device], || {
            driver::retain_primary_context(device)
        })
    }

    /// A context for memory that every context may use (portable pinned memory): one already
    /// open, else GPU 0's.
    fn any_context(&self) -> Result<&Arc<CudaContext>> {
        match self.contexts.iter().find_map(OnceLock::get) {
            Some(ctx) => Ok(ctx),
            None => self.context(0),
        }
    }

    /// GPU `device`'s internal stream for the synchronous calls.
    fn io_stream(&self, device: usize) -> Result<&Arc<CudaStream>> {
        first_use(&self.io_streams[device], || {
            self.context(device)?
                .new_stream()
                .map_err(failed("cuStreamCreate"))
        })
    }

    fn gates(&self) -> Result<&gates::Gates> {
        first_use(&self.gates, || gates::Gates::new(self.any_context()?))
    }

    fn kernels(&self, device: usize) -> Result<Arc<kernels::Kernels>> {
        self.kernels.get(device, self.context(device)?)
    }

    /// Counts one driver call of a kind (`|c| &c.launches`).
    fn count(&self, which: impl Fn(&Counters) -> &AtomicU64) {
        which(&self.issued).fetch_add(1, Ordering::Relaxed);
    }

    /// The kept events of one kind, per device.
    fn spares(&self, timed: bool) -> &[Mutex<Vec<CudaEvent>>] {
        if timed {
            &self.spare_events
        } else {
            &self.spare_marks
        }
    }

    /// Records an event on `stream`: a kept one of its kind, or a new one. Timed events carry a
    /// GPU timestamp; the others only order work, and streams wait on them sooner (the CUDA
    /// documentation: CU_EVENT_DISABLE_TIMING events are the best for cuStreamWaitEvent).
    fn new_event(&self, stream: &Arc<Stream>, timed: bool) -> Result<Arc<Event>> {
        let spare = lock(&self.spares(timed)[stream.device]).pop();
        let event = match spare {
            Some(event) => event,
            // cudarc's `new_event(None)` would disable timing: say which each time.
            None => self
                .context(stream.device)?
                .new_event(Some(if timed {
                    CUevent_flags::CU_EVENT_DEFAULT
                } else {
                    CUevent_flags::CU_EVENT_DISABLE_TIMING
                }))
                .map_err(failed("cuEventCreate"))?,
        };
        event
            .record(&stream.stream)
            .map_err(failed("cuEventRecord"))?;
        self.count(|c| &c.events);
        Ok(Arc::new(Event {
            device: stream.device,
            event,
            timed,
        }))
    }
}

/// `cell`'s value, made by `make` at its first use. Two threads may both make one; the one not
/// kept is dropped.
fn first_use<T>(cell: &OnceLock<T>, make: impl FnOnce() -> Result<T>) -> Result<&T> {
    if let Some(value) = cell.get() {
        return Ok(value);
    }
    let made = make()?;
    Ok(cell.get_or_init(|| made))
}

/// The unified addresses a copy moves between.
fn addresses(copy: &BufferCopy<&Arc<Buffer>>) -> (u64, u64) {
    (
        copy.dst.address() + copy.dst_offset as u64,
        copy.src.address() + copy.src_offset as u64,
    )
}

impl RawBackend for Gpus {
    type Buffer = Arc<Buffer>;
    type Stream = Arc<Stream>;
    type Event = Arc<Event>;
    type Gate = gates::Claim;
    type Graph = Arc<CapturedGraph>;
    type Worker = resident::Worker;

    fn stop_worker(&self, worker: &Self::Worker) -> Result<super::resident::StopReport> {
        self.stop_resident(worker)
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn notices(&self) -> Vec<String> {
        self.notices.clone()
    }

    fn keep_thread_context(&self) -> Result<Option<super::raw::KeptContext>> {
        Ok(Some(Box::new(driver::KeptContext::now()?)))
    }

    fn enable_peer_access(&self, device: usize, peer: usize) -> Result<()> {
        let (ctx, peer_ctx) = (self.context(device)?, self.context(peer)?);
        peer::enable(ctx, peer_ctx, &self.topology, device, peer)
    }

    fn free_memory(&self, device: usize) -> Result<u64> {
        let (free, _total) = self
            .context(device)?
            .mem_get_info()
            .map_err(failed("cuMemGetInfo"))?;
        Ok(free as u64)
    }

    fn alloc(&self, memory: Memory, bytes: usize) -> Result<Arc<Buffer>> {
        let storage = match memory {
            Memory::Device(device) => {
                Storage::Device(DeviceMemory::new(self.context(device)?, bytes)?)
            }
            Memory::Managed(device) => Storage::Managed(ManagedMemory::new(
                self.context(device)?,
                self.io_stream(device)?,
                bytes,
            )?),
            // Portable memory: the context it is allocated in does not matter. Placed on the NUMA
            // node asked for where the kernel allows it, else wherever the calling thread runs.
            Memory::PinnedHost { numa_node } => {
                let ctx = self.any_context()?;
                let placed = match numa_node.and_then(|n| u32::try_from(n).ok()) {
                    Some(node) => PinnedMemory::on_numa_node(ctx, bytes, node)?,
                    None => None,
                };
                Storage::Pinned(match placed {
                    Some(memory) => memory,
                    None => PinnedMemory::new(ctx, bytes)?,
                })
            }
        };
        Ok(Arc::new(Buffer(storage)))
    }

    fn free(&self, _buffer: &Arc<Buffer>) -> Result<()> {
        // The memory goes with the last reference: the checked layer's, or a call still using it.
        Ok(())
    }

    fn write(&self, buffer: &Arc<Buffer>, offset: usize, data: &[u8]) -> Result<()> {
        if let Storage::Pinned(memory) = &buffer.0 {
            memory.write_at(offset, data);
            return Ok(());
        }
        // Device memory, or managed memory, whose pages the copy writes wherever they live.
        self.count(|c| &c.copies);
        driver::copy_to_device_and_wait(
            self.io_stream(buffer.device())?,
            buffer.address() + offset as u64,
            data,
        )
    }

    fn read(&self, buffer: &Arc<Buffer>, offset: usize, out: &mut [u8]) -> Result<()> {
        if let Storage::Pinned(memory) = &buffer.0 {
            memory.read_at(offset, out);
            return Ok(());
        }
        self.count(|c| &c.copies);
        driver::copy_to_host_and_wait(
            self.io_stream(buffer.device())?,
            out,
            buffer.address() + offset as u64,
        )
    }

    fn create_stream(&self, device: usize) -> Result<Arc<Stream>> {
        let stream = self
            .context(device)?
            .new_stream()
            .map_err(failed("cuStreamCreate"))?;
        Ok(Arc::new(Stream {
            device,
            stream,
            captured_descriptors: Mutex::new(Vec::new()),
        }))
    }

    fn destroy_stream(&self, stream: Arc<Stream>) -> Result<()> {
        // cudarc's stream calls cuStreamDestroy when its last reference goes (this one, or a call
        // still using it); work queued on it still runs.
        drop(stream);
        Ok(())
    }

    fn copy(
        &self,
        stream: &Arc<Stream>,
        method: CopyMethod,
        copy: BufferCopy<&Arc<Buffer>>,
    ) -> Result<()> {
        let (dst, src) = addresses(&copy);
        match method {
            CopyMethod::CopyEngine => {
                self.count(|c| &c.copies);
                driver::copy_async(&stream.stream, dst, src, copy.len)
            }
            CopyMethod::SmKernel => {
                self.count(|c| &c.launches);
                self.kernels(stream.device)?
                    .copy(&stream.stream, dst, src, copy.len)
            }
        }
    }

    fn copy_batch(&self, stream: &Arc<Stream>, batch: Batch<'_, Arc<Buffer>>) -> Result<()> {
        let count = u32::try_from(batch.len())
            .map_err(|_| Error::usage("a copy batch holds at most 4294967295 copies"))?;
        let device = stream.device;
        let kernels = self.kernels(device)?;
        let mut block = self.descriptors.take(self.context(device)?, batch.len())?;
        for (slot, copy) in block
            .descriptors_mut(batch.len())
            .iter_mut()
            .zip(batch.iter())
        {
            let (dst, src) = addresses(&copy);
            *slot = abi::Descriptor {
                dst,
                src,
                len: copy.len as u64,
            };
        }
        kernels.copy_batch(&stream.stream, block.address(), count)?;
        self.count(|c| &c.launches);
        if driver::is_capturing(&stream.stream)? {
            lock(&stream.captured_descriptors).push(block);
            Ok(())
        } else {
            self.count(|c| &c.events);
            self.descriptors.retire(block, &stream.stream)
        }
    }

    fn memcpy_batch(&self, stream: &Arc<Stream>, batch: Batch<'_, Arc<Buffer>>) -> Result<()> {
        let copies: Vec<(u64, u64, usize)> = batch
            .iter()
            .filter(|c| c.len > 0)
            .map(|c| {
                let (dst, src) = addresses(&c);
                (dst, src, c.len)
            })
            .collect();
        self.count(|c| &c.copies);
        driver::memcpy_batch_async(&stream.stream, &copies)
    }

    fn record(&self, stream: &Arc<Stream>) -> Result<Arc<Event>> {
        self.new_event(stream, true)
    }

    fn mark(&self, stream: &Arc<Stream>) -> Result<Arc<Event>> {
        self.new_event(stream, false)
    }

    fn wait(&self, stream: &Arc<Stream>, event: &Arc<Event>) -> Result<()> {
        stream
            .stream
            .wait(&event.event)
            .map_err(failed("cuStreamWaitEvent"))
    }

    fn event_done(&self, event: &Arc<Event>) -> Result<bool> {
        event
            .event
            .try_is_complete()
            .map_err(failed("cuEventQuery"))
    }

    fn event_synchronize(&self, event: &Arc<Event>) -> Result<()> {
        until_done_or_stopped(|| self.event_done(event))
    }

    fn elapsed_us(&self, start: &Arc<Event>, end: &Arc<Event>) -> Result<Option<f64>> {
        Ok(driver::elapsed_ms(&start.event, &end.event)?.map(|ms| f64::from(ms) * 1000.0))
    }

    fn destroy_event(&self, event: Arc<Event>) -> Result<()> {
        // Kept for the next record instead. Recording a kept event again later is safe: a stream
        // that waited on it captured the record it waited for. Another thread still using the
        // event (a concurrent query) lets it be destroyed with its last reference instead.
        if let Ok(Event {
            device,
            event,
            timed,
        }) = Arc::try_unwrap(event)
        {
            lock(&self.spares(timed)[device]).push(event);
        }
        Ok(())
    }

    fn synchronize(&self, stream: &Arc<Stream>) -> Result<()> {
        until_done_or_stopped(|| driver::stream_finished(&stream.stream))
    }

    fn host_time_us(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e6
    }

    fn hold(&self, stream: &Arc<Stream>) -> Result<gates::Claim> {
        let kernels = self.kernels(stream.device)?;
        let gates = self.gates()?;
        let (claim, at) = gates.claim()?;
        if let Err(error) = kernels.spin(&stream.stream, at.flag, at.ticket, at.timed_out) {
            gates.abandon(claim);
            return Err(error);
        }
        self.count(|c| &c.launches);
        Ok(claim)
    }

    fn release(&self, gate: gates::Claim) -> Result<()> {
        self.gates()?.release(gate)
    }

    fn begin_capture(&self, stream: &Arc<Stream>) -> Result<()> {
        // Compile and load the kernels now: loading a module inside a capture is asking for trouble.
        self.kernels(stream.device)?;
        driver::begin_capture(&stream.stream)
    }

    fn end_capture(&self, stream: &Arc<Stream>) -> Result<Arc<CapturedGraph>> {
        // Taken first: if the capture fails, its kernels never run and their descriptors can go.
        let descriptors = std::mem::take(&mut *lock(&stream.captured_descriptors));
        let graph = driver::Graph::end_capture(&stream.stream)?;
        Ok(Arc::new(CapturedGraph {
            graph: Mutex::new(graph),
            descriptors,
            replayed_on: Mutex::new(Vec::new()),
        }))
    }

    fn replay(&self, graph: &Arc<CapturedGraph>, stream: &Arc<Stream>) -> Result<()> {
        lock(&graph.graph).launch(&stream.stream)?;
        self.count(|c| &c.launches);
        if !graph.descriptors.is_empty() {
            let mut replayed_on = lock(&graph.replayed_on);
            if !replayed_on.iter().any(|s| Arc::ptr_eq(s, &stream.stream)) {
                replayed_on.push(stream.stream.clone());
            }
        }
        Ok(())
    }

    fn destroy_graph(&self, graph: Arc<CapturedGraph>) -> Result<()> {
        // cuGraphExecDestroy and cuGraphDestroy when the last reference goes, after the replays
        // that read its descriptors (see CapturedGraph's drop).
        drop(graph);
        Ok(())
    }

    fn borrow_memory(&self, device: usize, address: u64, bytes: usize) -> Result<Arc<Buffer>> {
        let driver::Allocation {
            ordinal,
            start,
            size,
            pool,
        } = driver::allocation_of(self.context(device)?, address)?;
        if usize::try_from(ordinal).ok() != Some(device) {
            return Err(Error::usage(format!(
                "the memory at {address:#x} is not GPU {device}'s (the driver places it on GPU \
                 {ordinal}); name the GPU the memory is on"
            )));
        }
        let fits = address
            .checked_add(bytes as u64)
            .is_some_and(|end| end <= start + size as u64);
        if !fits {
            return Err(Error::usage(format!(
                "{bytes} bytes at {address:#x} run past the end of their allocation on GPU \
                 {device} ({size} bytes from {start:#x}); borrow only memory the owner allocated"
            )));
        }
        if let Some(pool) = pool {
            // Once per pool: the GPUs with P2P to this one may reach its memory, as peer access
            // lets them reach cuMemAlloc's.
            if lock(&self.granted_pools).insert(pool) {
                let peers: Vec<usize> = (0..self.contexts.len())
                    .filter(|&peer| peer != device)
                    .filter(|&peer| self.topology.pair(peer, device).is_some_and(|p| p.p2p))
                    .collect();
                pool.grant(&peers)?;
            }
        }
        Ok(Arc::new(Buffer(Storage::Borrowed { address, device })))
    }

    fn is_capturing(&self, stream: &Arc<Stream>) -> Result<bool> {
        driver::is_capturing(&stream.stream)
    }

    fn borrow_stream(&self, device: usize, handle: u64) -> Result<Arc<Stream>> {
        Ok(Arc::new(Stream {
            device,
            stream: driver::borrow_stream(self.context(device)?, device, handle)?,
            captured_descriptors: Mutex::new(Vec::new()),
        }))
    }
}

impl RawManaged for Gpus {
    fn advise(&self, buffer: &Arc<Buffer>, advice: Advice) -> Result<()> {
        buffer.managed().advise(advice)
    }

    fn prefetch(&self, stream: &Arc<Stream>, buffer: &Arc<Buffer>, to: Location) -> Result<()> {
        buffer.managed().prefetch(&stream.stream, to)
    }
}

impl RawProbes for Gpus {
    fn pointer_chase(
        &self,
        stream: &Arc<Stream>,
        chain: &Arc<Buffer>,
        elements: u64,
        steps: u32,
        result: &Arc<Buffer>,
    ) -> Result<()> {
        self.count(|c| &c.launches);
        self.kernels(stream.device)?.pointer_chase(
            &stream.stream,
            chain.address(),
            elements,
            steps,
            result.address(),
        )
    }

    fn ping_pong(
        &self,
        ping: &Arc<Stream>,
        pong: &Arc<Stream>,
        ping_flag: &Arc<Buffer>,
        pong_flag: &Arc<Buffer>,
        rounds: u32,
    ) -> Result<()> {
        let (ping_kernels, pong_kernels) = (self.kernels(ping.device)?, self.kernels(pong.device)?);
        let (ping_at, pong_at) = (ping_flag.address(), pong_flag.address());
        // The answering side first, so it is already spinning when the first round arrives.
        self.count(|c| &c.launches);
        self.count(|c| &c.launches);
        pong_kernels.ping_pong_side(&pong.stream, false, pong_at, ping_at, rounds)?;
        ping_kernels.ping_pong_side(&ping.stream, true, ping_at, pong_at, rounds)
    }
}

impl Drop for Gpus {
    fn drop(&mut self) {
        // The checked layer released every gate and handle; wait for work on streams destroyed
        // earlier too, before the descriptor blocks and the gates' memory go with the fields.
        for ctx in self.contexts.iter().filter_map(OnceLock::get) {
            let _ = ctx.synchronize();
        }
    }
}

impl RawCollectives for Gpus {
    type Comm = nccl::Comm;
    type Window = nccl::Window;

    fn all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        ranks: &[RawRank<'_, Self>],
        flags: &[&Arc<Buffer>],
        waiting: Waiting<&Arc<Buffer>>,
        len: usize,
    ) -> Result<()> {
        collective::all_reduce(self, kernel, dtype, op, ranks, flags, waiting, len)
    }

    fn rank_all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        rank: usize,
        stream: &Arc<Stream>,
        ranks: &[RawRankBuffers<'_, Self>],
        waiting: Waiting<&Arc<Buffer>>,
        len: usize,
    ) -> Result<()> {
        collective::rank_all_reduce(self, kernel, dtype, op, rank, stream, ranks, waiting, len)
    }

    fn busy(&self, stream: &Arc<Stream>, duration_us: f64) -> Result<()> {
        collective::busy(self, stream, duration_us)
    }

    fn nccl_open(&self) -> std::result::Result<String, String> {
        nccl::open().map(|library| library.describe())
    }

    fn nccl_communicator(&self, devices: &[usize]) -> Result<nccl::Comm> {
        nccl::opened()?.communicator(devices)
    }

    fn nccl_destroy(&self, comm: nccl::Comm) -> Result<()> {
        comm.destroy()
    }

    fn nccl_all_reduce(
        &self,
        comm: &nccl::Comm,
        dtype: DataType,
        ranks: &[RawRank<'_, Self>],
        len: usize,
    ) -> Result<()> {
        comm.all_reduce(dtype, ranks, len)
    }

    fn nccl_send_recv(
        &self,
        comm: &nccl::Comm,
        streams: &[&Arc<Stream>],
        transfers: &[PeerTransfer<&Arc<Buffer>>],
    ) -> Result<()> {
        comm.send_recv(streams, transfers)
    }

    fn nccl_unique_id(&self) -> Result<UniqueId> {
        nccl::opened()?.unique_id()
    }

    fn nccl_join(&self, id: &UniqueId, rank: CommRank) -> Result<nccl::Comm> {
        // ncclCommInitRank runs its rank on the current device: this thread's context.
        driver::bind(self.context(rank.device)?)?;
        nccl::opened()?.join(id, rank)
    }

    fn nccl_rank_send_recv(
        &self,
        comm: &nccl::Comm,
        stream: &Arc<Stream>,
        ops: &[PeerOp<&Arc<Buffer>>],
    ) -> Result<()> {
        comm.rank_send_recv(stream, ops)
    }

    fn nccl_symmetric(&self) -> std::result::Result<(), String> {
        nccl::opened()
            .map_err(|error| error.to_string())?
            .symmetric()
    }

    fn nccl_alloc(&self, device: usize, bytes: usize) -> Result<Arc<Buffer>> {
        // ncclMemAlloc allocates on the current device: this thread's context.
        driver::bind(self.context(device)?)?;
        let memory = nccl::opened()?.alloc(device, bytes)?;
        Ok(Arc::new(Buffer(Storage::Nccl(memory))))
    }

    fn nccl_register_window(
        &self,
        comm: &nccl::Comm,
        buffers: &[&Arc<Buffer>],
        bytes: usize,
    ) -> Result<nccl::Window> {
        let contexts = buffers
            .iter()
            .map(|buffer| self.context(buffer.device()).cloned())
            .collect::<Result<Vec<_>>>()?;
        let addresses: Vec<u64> = buffers.iter().map(|buffer| buffer.address()).collect();
        comm.register_window(contexts, &addresses, bytes)
    }

    fn nccl_deregister_window(&self, comm: &nccl::Comm, window: nccl::Window) -> Result<()> {
        comm.deregister_window(window)
    }
}

/// Polls `done` until it says the work waited for is over, as the driver's spinning wait does, or
/// until a stop is requested ([`crate::interrupt`]): a window of many large copies runs for
/// minutes, and a blocking wait could not be cut short. Yields the CPU every few polls.
fn until_done_or_stopped(mut done: impl FnMut() -> Result<bool>) -> Result<()> {
    const SPINS_PER_YIELD: u32 = 64;
    let mut polls = 0u32;
    while !done()? {
        crate::interrupt::check()?;
        polls = polls.wrapping_add(1);
        if polls.is_multiple_of(SPINS_PER_YIELD) {
            std::thread::yield_now();
        } else {
            std::hint::spin_loop();
        }
    }
    Ok(())
}

use crate::backend::collective::{
    AllReduceKernel, CommRank, DataType, PeerOp, PeerTransfer, Reduction, UniqueId, Waiting,
};
use crate::backend::{RawCollectives, RawRank, RawRankBuffers};
