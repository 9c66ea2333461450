//! Real GPUs: the CUDA driver API through cudarc, NVRTC-compiled kernels, NVML for the topology.
//!
//! - [`driver`]: the thin raw layer (every direct `sys` call, owning types for memory and graphs);
//! - [`topology`](self::topology): devices and pairs, read once at open;
//! - [`peer`]: the one place that enables peer access;
//! - [`kernels`]: copy, gate and latency kernels (sources in `kernels/*.cu`);
//! - [`gates`]: pinned flags that hold streams until released.
//!
//! One primary context per device, with cudarc's event tracking off: the backend orders work itself,
//! and cudarc's hidden per-buffer events would otherwise land in timed windows and graph captures.

mod batches;
mod driver;
mod gates;
mod kernels;
mod peer;
mod topology;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use self::driver::{failed, DeviceMemory, PinnedMemory};
use super::{Backend, BufferId, CopyMethod, EventId, GateId, GraphId, Memory, StreamId};
use crate::topology::Topology;
use crate::{Error, Result};

/// Whether the NVIDIA driver library can be loaded on this host (nothing else is called).
pub fn driver_library_present() -> bool {
    driver::driver_library_present()
}

/// A buffer's memory, freed when the last reference goes.
enum Storage {
    Device(DeviceMemory),
    Pinned(PinnedMemory),
}

struct Buffer {
    memory: Memory,
    bytes: usize,
    storage: Storage,
}

impl Buffer {
    fn address(&self) -> u64 {
        match &self.storage {
            Storage::Device(memory) => memory.address(),
            Storage::Pinned(memory) => memory.address(),
        }
    }

    /// The unified address of `len` bytes at `offset`, if they lie inside the buffer.
    fn range(&self, id: u64, offset: usize, len: usize, role: &str) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.bytes => Ok(self.address() + offset as u64),
            _ => Err(Error::usage(format!(
                "{role} range {offset}..{offset}+{len} lies outside buffer {id} of {} bytes",
                self.bytes
            ))),
        }
    }
}

struct Stream {
    device: usize,
    stream: Arc<CudaStream>,
    /// Descriptor blocks of batches captured on this stream, for the graph to keep at end_capture.
    captured_descriptors: Mutex<Vec<batches::Block>>,
}

/// A replayable graph and the batch descriptors its kernels read (dropped after the graph).
struct CapturedGraph {
    graph: Mutex<driver::Graph>,
    _descriptors: Vec<batches::Block>,
}

struct Event {
    device: usize,
    event: CudaEvent,
}

/// Locks a mutex, carrying on past a panic of another thread (the data stay consistent: every
/// critical section here is a single insert, remove or push).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// Live objects of one kind, by handle id.
struct Handles<T> {
    kind: &'static str,
    items: Mutex<HashMap<u64, Arc<T>>>,
}

impl<T> Handles<T> {
    fn new(kind: &'static str) -> Self {
        Handles {
            kind,
            items: Mutex::new(HashMap::new()),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<T>>> {
        lock(&self.items)
    }

    fn insert(&self, id: u64, item: T) {
        self.lock().insert(id, Arc::new(item));
    }

    fn unknown(&self, id: u64) -> Error {
        Error::InvalidHandle(format!(
            "unknown {} {id}: freed already, or not from this backend",
            self.kind
        ))
    }

    fn get(&self, id: u64) -> Result<Arc<T>> {
        self.lock()
            .get(&id)
            .cloned()
            .ok_or_else(|| self.unknown(id))
    }

    fn remove(&self, id: u64) -> Result<Arc<T>> {
        self.lock().remove(&id).ok_or_else(|| self.unknown(id))
    }

    fn all(&self) -> Vec<Arc<T>> {
        self.lock().values().cloned().collect()
    }

    fn clear(&self) {
        self.lock().clear();
    }
}

/// The backend for real NVIDIA GPUs.
pub struct CudaBackend {
    started: Instant,
    topology: Topology,
    notices: Vec<String>,
    peers: peer::PeerAccess,
    kernels: kernels::KernelCache,
    gates: gates::Gates,
    next_id: AtomicU64,
    buffers: Handles<Buffer>,
    streams: Handles<Stream>,
    events: Handles<Event>,
    /// Per device, destroyed events kept for the next `record`: creating and destroying a CUDA
    /// event costs the CPU about a microsecond each, which every transfer would otherwise pay.
    spare_events: Vec<Mutex<Vec<CudaEvent>>>,
    graphs: Handles<CapturedGraph>,
    descriptors: batches::DescriptorPool,
    /// One internal stream per device for the synchronous `write` and `read`.
    io_streams: Vec<Arc<CudaStream>>,
    contexts: Vec<Arc<CudaContext>>,
}

impl CudaBackend {
    /// Opens every visible GPU. A host without the driver, or with no GPU, is [`Error::NoGpu`].
    pub fn open() -> Result<Self> {
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
        let contexts = (0..count as usize)
            .map(|ordinal| {
                let ctx = CudaContext::new(ordinal).map_err(failed("cuDevicePrimaryCtxRetain"))?;
                // SAFETY: nothing has been allocated in this context yet, and the backend never
                // uses cudarc's tracked slices: it orders its own work with streams and events.
                unsafe { ctx.disable_event_tracking() };
                Ok(ctx)
            })
            .collect::<Result<Vec<_>>>()?;
        let (topology, notices) = topology::discover(&contexts)?;
        let io_streams = contexts
            .iter()
            .map(|ctx| ctx.new_stream().map_err(failed("cuStreamCreate")))
            .collect::<Result<Vec<_>>>()?;
        Ok(CudaBackend {
            started,
            topology,
            notices,
            peers: peer::PeerAccess::default(),
            kernels: kernels::KernelCache::new(contexts.len()),
            gates: gates::Gates::new(&contexts[0])?,
            next_id: AtomicU64::new(1),
            buffers: Handles::new("buffer"),
            streams: Handles::new("stream"),
            events: Handles::new("event"),
            spare_events: contexts.iter().map(|_| Mutex::default()).collect(),
            graphs: Handles::new("graph"),
            descriptors: batches::DescriptorPool::new(contexts.len()),
            io_streams,
            contexts,
        })
    }

    fn new_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    fn context(&self, device: usize) -> Result<&Arc<CudaContext>> {
        self.contexts.get(device).ok_or_else(|| {
            Error::usage(format!(
                "GPU {device} does not exist; this host has {} GPU(s) (0..={})",
                self.contexts.len(),
                self.contexts.len() - 1
            ))
        })
    }

    fn kernels(&self, device: usize) -> Result<Arc<kernels::Kernels>> {
        self.kernels.get(device, self.context(device)?)
    }

    /// Fails unless work issued on `device` may touch `buffer`: its own memory, pinned host memory,
    /// or a peer's memory with peer access enabled. Without this check a copy engine would silently
    /// stage through the host, and a kernel would fault and take the context down with it.
    fn check_reachable(&self, device: usize, buffer: &Buffer) -> Result<()> {
        match buffer.memory {
            Memory::Device(owner) if !self.peers.is_enabled(device, owner) => {
                Err(Error::PeerAccess {
                    src: device,
                    dst: owner,
                    message: format!(
                        "work on GPU {device} touches GPU {owner}'s memory, but peer access from \
                         GPU {device} to GPU {owner} is not enabled: enable it first"
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    /// A buffer's base address and size, after checking it is reachable from `device`.
    fn placed(&self, device: usize, id: BufferId) -> Result<(u64, usize)> {
        let buffer = self.buffers.get(id.0)?;
        self.check_reachable(device, &buffer)?;
        Ok((buffer.address(), buffer.bytes))
    }

    /// A buffer's address range after checking it is in bounds and reachable from `device`.
    fn reachable_range(
        &self,
        device: usize,
        id: BufferId,
        offset: usize,
        len: usize,
        role: &str,
    ) -> Result<u64> {
        let buffer = self.buffers.get(id.0)?;
        let address = buffer.range(id.0, offset, len, role)?;
        self.check_reachable(device, &buffer)?;
        Ok(address)
    }
}

impl Backend for CudaBackend {
    fn source(&self) -> &str {
        "cuda"
    }

    fn topology(&self) -> &Topology {
        &self.topology
    }

    fn notices(&self) -> Vec<String> {
        self.notices.clone()
    }

    fn enable_peer_access(&self, device: usize, peer: usize) -> Result<()> {
        self.peers
            .enable(&self.contexts, &self.topology, device, peer)
    }

    fn free_memory(&self, device: usize) -> Result<u64> {
        let (free, _total) = self
            .context(device)?
            .mem_get_info()
            .map_err(failed("cuMemGetInfo"))?;
        Ok(free as u64)
    }

    fn alloc(&self, memory: Memory, bytes: usize) -> Result<BufferId> {
        if bytes == 0 {
            return Err(Error::usage("cannot allocate a buffer of 0 bytes"));
        }
        let storage = match memory {
            Memory::Device(device) => {
                Storage::Device(DeviceMemory::new(self.context(device)?, bytes)?)
            }
            // Portable memory: the context it is allocated in does not matter. Placed on the NUMA
            // node asked for where the kernel allows it, else wherever the calling thread runs.
            Memory::PinnedHost { numa_node } => {
                let ctx = &self.contexts[0];
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
        let id = self.new_id();
        self.buffers.insert(
            id,
            Buffer {
                memory,
                bytes,
                storage,
            },
        );
        Ok(BufferId(id))
    }

    fn free(&self, buffer: BufferId) -> Result<()> {
        self.buffers.remove(buffer.0).map(drop)
    }

    fn len(&self, buffer: BufferId) -> Result<usize> {
        Ok(self.buffers.get(buffer.0)?.bytes)
    }

    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<()> {
        let target = self.buffers.get(buffer.0)?;
        let address = target.range(buffer.0, offset, data.len(), "write")?;
        match &target.storage {
            _ if data.is_empty() => Ok(()),
            Storage::Pinned(memory) => {
                memory.write_at(offset, data);
                Ok(())
            }
            Storage::Device(memory) => {
                driver::copy_to_device_and_wait(&self.io_streams[memory.device()], address, data)
            }
        }
    }

    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()> {
        let source = self.buffers.get(buffer.0)?;
        let address = source.range(buffer.0, offset, out.len(), "read")?;
        match &source.storage {
            _ if out.is_empty() => Ok(()),
            Storage::Pinned(memory) => {
                memory.read_at(offset, out);
                Ok(())
            }
            Storage::Device(memory) => {
                driver::copy_to_host_and_wait(&self.io_streams[memory.device()], out, address)
            }
        }
    }

    fn create_stream(&self, device: usize) -> Result<StreamId> {
        let stream = self
            .context(device)?
            .new_stream()
            .map_err(failed("cuStreamCreate"))?;
        let id = self.new_id();
        self.streams.insert(
            id,
            Stream {
                device,
                stream,
                captured_descriptors: Mutex::new(Vec::new()),
            },
        );
        Ok(StreamId(id))
    }

    fn copy(&self, stream: StreamId, method: CopyMethod, copy: &super::BufferCopy) -> Result<()> {
        let stream = self.streams.get(stream.0)?;
        let device = stream.device;
        let dst =
            self.reachable_range(device, copy.dst, copy.dst_offset, copy.len, "destination")?;
        let src = self.reachable_range(device, copy.src, copy.src_offset, copy.len, "source")?;
        if copy.len == 0 {
            return Ok(());
        }
        match method {
            CopyMethod::CopyEngine => driver::copy_async(&stream.stream, dst, src, copy.len),
            CopyMethod::SmKernel => self
                .kernels(device)?
                .copy(&stream.stream, dst, src, copy.len),
        }
    }

    fn copy_batch(&self, stream: StreamId, copies: &[super::BufferCopy]) -> Result<()> {
        let stream = self.streams.get(stream.0)?;
        if copies.is_empty() {
            return Ok(());
        }
        let count = u32::try_from(copies.len())
            .map_err(|_| Error::usage("a copy batch holds at most 4294967295 copies"))?;
        let device = stream.device;
        let kernels = self.kernels(device)?;
        let mut block = self
            .descriptors
            .take(&self.contexts[device], copies.len())?;
        batches::describe(
            copies,
            |id| self.placed(device, id),
            block.descriptors_mut(copies.len()),
        )?;
        kernels.copy_batch(&stream.stream, block.address(), count)?;
        if driver::is_capturing(&stream.stream)? {
            lock(&stream.captured_descriptors).push(block);
            Ok(())
        } else {
            self.descriptors.retire(block, &stream.stream)
        }
    }

    fn memcpy_batch(&self, stream: StreamId, copies: &[super::BufferCopy]) -> Result<()> {
        let stream = self.streams.get(stream.0)?;
        let device = stream.device;
        let mut addresses = vec![kernels::Descriptor::default(); copies.len()];
        batches::describe(copies, |id| self.placed(device, id), &mut addresses)?;
        let copies: Vec<(u64, u64, usize)> = addresses
            .iter()
            .filter(|d| d.len > 0)
            .map(|d| (d.dst, d.src, d.len as usize))
            .collect();
        driver::memcpy_batch_async(&stream.stream, &copies)
    }

    fn record(&self, stream: StreamId) -> Result<EventId> {
        let stream = self.streams.get(stream.0)?;
        let spare = lock(&self.spare_events[stream.device]).pop();
        let event = match spare {
            Some(event) => event,
            // Timing enabled: cudarc's `new_event(None)` would disable it.
            None => self.contexts[stream.device]
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(failed("cuEventCreate"))?,
        };
        event
            .record(&stream.stream)
            .map_err(failed("cuEventRecord"))?;
        let id = self.new_id();
        self.events.insert(
            id,
            Event {
                device: stream.device,
                event,
            },
        );
        Ok(EventId(id))
    }

    fn wait(&self, stream: StreamId, event: EventId) -> Result<()> {
        let stream = self.streams.get(stream.0)?;
        let event = self.events.get(event.0)?;
        stream
            .stream
            .wait(&event.event)
            .map_err(failed("cuStreamWaitEvent"))
    }

    fn event_done(&self, event: EventId) -> Result<bool> {
        self.events
            .get(event.0)?
            .event
            .try_is_complete()
            .map_err(failed("cuEventQuery"))
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        self.events
            .get(event.0)?
            .event
            .synchronize()
            .map_err(failed("cuEventSynchronize"))
    }

    fn elapsed_us(&self, start: EventId, end: EventId) -> Result<f64> {
        let (first, last) = (self.events.get(start.0)?, self.events.get(end.0)?);
        if first.device != last.device {
            return Err(Error::usage(format!(
                "events {} and {} were recorded on different GPUs ({} and {}): GPU time can only be \
                 measured between events of one GPU",
                start.0, end.0, first.device, last.device
            )));
        }
        match driver::elapsed_ms(&first.event, &last.event)? {
            Some(ms) => Ok(f64::from(ms) * 1000.0),
            None => Err(Error::usage(format!(
                "events {} and {} have not both completed: synchronise before asking for the \
                 time between them",
                start.0, end.0
            ))),
        }
    }

    fn destroy_event(&self, event: EventId) -> Result<()> {
        // Recording a kept event again later is safe: a stream that waited on it captured the
        // record it waited for.
        let removed = self.events.remove(event.0)?;
        // Another thread still using the event (a concurrent query) lets it be destroyed instead.
        if let Ok(Event { device, event }) = Arc::try_unwrap(removed) {
            lock(&self.spare_events[device]).push(event);
        }
        Ok(())
    }

    fn synchronize(&self, stream: StreamId) -> Result<()> {
        self.streams
            .get(stream.0)?
            .stream
            .synchronize()
            .map_err(failed("cuStreamSynchronize"))
    }

    fn host_time_us(&self) -> f64 {
        self.started.elapsed().as_secs_f64() * 1e6
    }

    fn hold(&self, stream: StreamId) -> Result<GateId> {
        let stream = self.streams.get(stream.0)?;
        let kernels = self.kernels(stream.device)?;
        let (claim, at) = self.gates.claim()?;
        if let Err(error) = kernels.spin(&stream.stream, at.flag, at.ticket, at.timed_out) {
            self.gates.abandon(claim);
            return Err(error);
        }
        let id = self.new_id();
        self.gates.register(id, claim);
        Ok(GateId(id))
    }

    fn release(&self, gate: GateId) -> Result<()> {
        self.gates.release(gate.0)
    }

    fn pointer_chase(
        &self,
        stream: StreamId,
        chain: BufferId,
        steps: u32,
        result: BufferId,
    ) -> Result<()> {
        let stream = self.streams.get(stream.0)?;
        let elements = (self.len(chain)? / 8) as u64;
        if elements == 0 {
            return Err(Error::usage(format!(
                "pointer chase: chain buffer {} holds no u64 element",
                chain.0
            )));
        }
        let device = stream.device;
        let chain = self.reachable_range(device, chain, 0, elements as usize * 8, "chain")?;
        let result = self.reachable_range(device, result, 0, 8, "result")?;
        self.kernels(device)?
            .pointer_chase(&stream.stream, chain, elements, steps, result)
    }

    fn ping_pong(
        &self,
        ping: StreamId,
        pong: StreamId,
        ping_flag: BufferId,
        pong_flag: BufferId,
        rounds: u32,
    ) -> Result<()> {
        if ping == pong {
            return Err(Error::usage(
                "ping-pong needs two streams: on one stream the second kernel would wait for the \
                 first to finish, and the first waits for the second",
            ));
        }
        let (ping, pong) = (self.streams.get(ping.0)?, self.streams.get(pong.0)?);
        let flags = |device| -> Result<(u64, u64)> {
            Ok((
                self.reachable_range(device, ping_flag, 0, 4, "ping flag")?,
                self.reachable_range(device, pong_flag, 0, 4, "pong flag")?,
            ))
        };
        let (ping_local, pong_remote) = flags(ping.device)?;
        let (ping_remote, pong_local) = flags(pong.device)?;
        let (ping_kernels, pong_kernels) = (self.kernels(ping.device)?, self.kernels(pong.device)?);
        // The answering side first, so it is already spinning when the first round arrives.
        pong_kernels.ping_pong_side(&pong.stream, false, pong_local, ping_remote, rounds)?;
        ping_kernels.ping_pong_side(&ping.stream, true, ping_local, pong_remote, rounds)
    }

    fn begin_capture(&self, stream: StreamId) -> Result<()> {
        let stream = self.streams.get(stream.0)?;
        // Compile and load the kernels now: loading a module inside a capture is asking for trouble.
        self.kernels(stream.device)?;
        driver::begin_capture(&stream.stream)
    }

    fn end_capture(&self, stream: StreamId) -> Result<GraphId> {
        let stream = self.streams.get(stream.0)?;
        let graph = driver::Graph::end_capture(&stream.stream)?;
        let id = self.new_id();
        self.graphs.insert(
            id,
            CapturedGraph {
                graph: Mutex::new(graph),
                _descriptors: std::mem::take(&mut *lock(&stream.captured_descriptors)),
            },
        );
        Ok(GraphId(id))
    }

    fn replay(&self, graph: GraphId, stream: StreamId) -> Result<()> {
        let graph = self.graphs.get(graph.0)?;
        let stream = self.streams.get(stream.0)?;
        let graph = lock(&graph.graph);
        graph.launch(&stream.stream)
    }
}

impl Drop for CudaBackend {
    fn drop(&mut self) {
        // Open every gate first, so that no stream waits out a spin kernel's timeout below.
        self.gates.release_all();
        for stream in self.streams.all() {
            let _ = stream.stream.synchronize();
        }
        for stream in &self.io_streams {
            let _ = stream.synchronize();
        }
        // Then free what the work used; the contexts go last, with the fields.
        self.graphs.clear();
        self.events.clear();
        self.buffers.clear();
        self.streams.clear();
    }
}
