//! The checked layer: every argument check of the backend, written once, above both
//! implementations.
//!
//! Like cudarc's `sys → result → safe` layers: an implementation ([`super::cuda`], [`super::sim`])
//! provides a [`RawBackend`] that does its own work and nothing else, and [`Checked`] turns it into a
//! [`Backend`]. `Checked` owns the handle tables (each handle maps to the implementation's own
//! object, so nothing is looked up twice), the peer access it has enabled, and each stream's capture
//! state. It checks:
//! - handles: issued by this backend and not released (see [`super::handles`]);
//! - GPUs exist, allocations are not empty, ranges lie inside their buffers, a copy's source and
//!   destination do not overlap, nor a batch's destinations;
//! - reachability: work issued on one GPU touches another GPU's memory only with peer access
//!   (copy engines may stage between GPUs that have no P2P at all);
//! - order: what a capturing stream may do, events of one GPU for elapsed time, graphs replayed on
//!   their GPU with their buffers still allocated;
//! - collectives (module `collective`): one rank per GPU, each rank's buffers on its GPU, the
//!   ranks' streams capturing all or none, NCCL's communicators in their own table;
//! - the pattern calls (module `patterns`): device memory only.
//!
//! The table lock is held for lookups only, never across work an implementation does on a GPU, so
//! threads issuing work at once do not wait on each other here.

mod collective;
mod health;
mod managed;
mod patterns;
mod resident;
mod sharing;

use super::handles::{next_tag, Table};
use super::health::RawHealth;
use super::overlap::{first_overlap, InOrder};
use super::raw::{Batch, RawCollectives, RawManaged, RawProbes, RawResident};
use super::resident::Resident;
use super::sharing::{RawSharing, Sharing};
use super::{
    Backend, BufferCopy, BufferId, Collectives, CopyMethod, EventId, GateId, GraphId,
    KeptThreadContext, Managed, Memory, Patterns, Probes, RawPatterns, StreamId,
};
use crate::topology::{Source, Topology};
use crate::{Error, Result};
use collective::{CommEntry, WindowEntry};
use resident::{Parked, WorkerEntry};
use std::collections::BTreeSet;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError};

/// A backend: an implementation below, every check above it.
pub struct Checked<I: RawCollectives> {
    raw: I,
    state: Mutex<State<I>>,
    /// Held while peer access is being enabled, so that two threads cannot race on one pair.
    enabling: Mutex<()>,
    devices: usize,
    /// NCCL's description, or why there is none: asked of the implementation once, when a caller
    /// first wants NCCL.
    nccl: OnceLock<std::result::Result<String, String>>,
    /// Whether NCCL has symmetric windows, or why not: asked of the implementation once.
    symmetric: OnceLock<std::result::Result<(), String>>,
}

struct BufferEntry<B> {
    memory: Memory,
    len: usize,
    origin: sharing::Origin,
    raw: B,
}

struct StreamEntry<S> {
    device: usize,
    /// While the stream captures a graph: the buffers its captured work uses so far.
    capture: Option<Vec<BufferId>>,
    raw: S,
}

struct EventEntry<E> {
    device: usize,
    raw: E,
    /// Whether GPU time may be asked of it (false for [`Backend::mark`]'s).
    timed: bool,
}

struct GraphEntry<G> {
    device: usize,
    /// Every buffer the graph's work uses: a replay after one was freed would touch freed memory.
    buffers: Vec<BufferId>,
    raw: G,
}

struct State<I: RawCollectives> {
    buffers: Table<BufferEntry<I::Buffer>>,
    streams: Table<StreamEntry<I::Stream>>,
    events: Table<EventEntry<I::Event>>,
    gates: Table<I::Gate>,
    graphs: Table<GraphEntry<I::Graph>>,
    comms: Table<CommEntry<I::Comm>>,
    windows: Table<WindowEntry<I>>,
    workers: Table<WorkerEntry<I::Worker>>,
    /// What was let go while a resident worker ran, released when the last one stops.
    parked: Parked<I>,
    /// (device, peer) where work issued on `device` may touch `peer`'s memory (another GPU's:
    /// its own it always may); a set, as a host of 1024 GPUs has a million pairs.
    peers: BTreeSet<(usize, usize)>,
}

/// Who touches memory, which decides whether another GPU's memory needs peer access.
#[derive(Clone, Copy)]
enum Toucher {
    /// A kernel (named for messages): it faults on a peer's memory without access.
    Kernel(&'static str),
    /// A copy engine: the driver stages through host memory between GPUs that have no P2P.
    CopyEngine,
}

impl<I: RawCollectives> Checked<I> {
    pub fn new(raw: I) -> Self {
        let tag = next_tag();
        let devices = raw.topology().devices.len();
        let state = State {
            buffers: Table::new("buffer", tag),
            streams: Table::new("stream", tag),
            events: Table::new("event", tag),
            gates: Table::new("gate", tag),
            graphs: Table::new("graph", tag),
            comms: Table::new("communicator", tag),
            windows: Table::new("window", tag),
            workers: Table::new("worker", tag),
            parked: Parked::default(),
            peers: BTreeSet::new(),
        };
        Checked {
            raw,
            state: Mutex::new(state),
            enabling: Mutex::new(()),
            devices,
            nccl: OnceLock::new(),
            symmetric: OnceLock::new(),
        }
    }

    /// The implementation, for what only it knows (a simulator's preset).
    pub(super) fn raw(&self) -> &I {
        &self.raw
    }

    fn lock(&self) -> MutexGuard<'_, State<I>> {
        // Every critical section leaves the tables consistent: carry on past another thread's panic.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A wait's outcome; one cut short by a stop request leaves the work queued unfinished, so the
    /// memory it uses is left to the process's end (releasing it would wait for that work).
    fn waited(&self, outcome: Result<()>) -> Result<()> {
        if let Err(Error::Interrupted) = outcome {
            self.lock().parked.stuck = true;
            crate::interrupt::abandon();
        }
        outcome
    }

    fn check_device(&self, device: usize) -> Result<()> {
        match crate::topology::missing_gpu(device, self.devices) {
            None => Ok(()),
            Some(missing) => Err(Error::usage(missing)),
        }
    }

    /// Fails unless work issued on `device` by `toucher` may touch `buffer` (whose entry is
    /// `entry`).
    fn check_reach(
        &self,
        st: &State<I>,
        device: usize,
        buffer: BufferId,
        entry: &BufferEntry<I::Buffer>,
        toucher: Toucher,
    ) -> Result<()> {
        // Pinned host memory is mapped for every GPU; managed memory's pages move or are mapped
        // by the driver for whichever GPU touches them.
        let Memory::Device(owner) = entry.memory else {
            return Ok(());
        };
        if let sharing::Origin::Imported { gpu } = entry.origin {
            // The IPC mapping is the importing GPU's alone; it brought its own peer access.
            if gpu == device {
                return Ok(());
            }
            return Err(Error::usage(format!(
                "work on GPU {device} touches {buffer}, another process's memory of GPU {owner} \
                 imported for GPU {gpu}: only work issued on GPU {gpu} reaches it; issue the work \
                 there, or import the buffer for GPU {device}"
            )));
        }
        if device == owner || st.peers.contains(&(device, owner)) {
            return Ok(());
        }
        let p2p = || {
            self.raw
                .topology()
                .pair(device, owner)
                .is_some_and(|p| p.p2p)
        };
        let (what, without) = match toucher {
            Toucher::CopyEngine if !p2p() => return Ok(()),
            Toucher::CopyEngine => (
                "a copy-engine copy",
                "the driver would stage it through host memory",
            ),
            Toucher::Kernel(what) => (what, "the kernel would fault"),
        };
        Err(Error::usage(format!(
            "{what} on GPU {device} touches GPU {owner}'s memory ({buffer}), but peer access from \
             GPU {device} to GPU {owner} is not enabled ({without}): call \
             enable_peer_access({device}, {owner}) first"
        )))
    }

    /// Checks every message of a batch issued on `device` and returns each buffer it names, once,
    /// with the implementation's object. A batch names few buffers many times: each is looked up
    /// once, and destinations laid out in order show they are disjoint in the same pass.
    fn check_batch(
        &self,
        st: &State<I>,
        call: &str,
        device: usize,
        copies: &[BufferCopy],
        toucher: Toucher,
    ) -> Result<Vec<(BufferId, I::Buffer)>> {
        let mut found: Vec<(BufferId, I::Buffer)> = Vec::new();
        let mut sizes: Vec<usize> = Vec::new();
        let mut size_of = |id: BufferId, last: &mut Option<(BufferId, usize)>| -> Result<usize> {
            if let Some((known, size)) = *last {
                if known == id {
                    return Ok(size);
                }
            }
            let size = match found.iter().position(|(b, _)| *b == id) {
                Some(i) => sizes[i],
                None => {
                    let entry = st.buffers.get(id.0)?;
                    self.check_reach(st, device, id, entry, toucher)?;
                    found.push((id, entry.raw.clone()));
                    sizes.push(entry.len);
                    entry.len
                }
            };
            *last = Some((id, size));
            Ok(size)
        };
        let (mut dst, mut src) = (None, None);
        let mut order = InOrder::default();
        let mut in_order = true;
        for (i, c) in copies.iter().enumerate() {
            let dst_size = size_of(c.dst, &mut dst)?;
            let src_size = size_of(c.src, &mut src)?;
            let fits = |offset: usize, size| offset.checked_add(c.len).is_some_and(|e| e <= size);
            if !fits(c.dst_offset, dst_size) {
                return Err(out_of_range(
                    format_args!("{call} message {i}: destination"),
                    c.dst,
                    dst_size,
                    c.dst_offset,
                    c.len,
                ));
            }
            if !fits(c.src_offset, src_size) {
                return Err(out_of_range(
                    format_args!("{call} message {i}: source"),
                    c.src,
                    src_size,
                    c.src_offset,
                    c.len,
                ));
            }
            if c.len > 0 && in_order {
                in_order = order.push(c.dst, c.dst_offset, c.dst_offset + c.len);
            }
        }
        if !in_order {
            let destinations = copies
                .iter()
                .filter(|c| c.len > 0)
                .map(|c| (c.dst, c.dst_offset, c.dst_offset + c.len));
            if let Some((a, b)) = first_overlap(destinations) {
                return Err(Error::usage(format!(
                    "{call}: two messages write overlapping bytes of one buffer (offsets {a} and \
                     {b}); the messages run in any order, so give them disjoint destinations"
                )));
            }
        }
        Ok(found)
    }

    /// Checks one copy that `toucher` performs for work issued on `device` — both ranges inside
    /// their buffers, not overlapping each other, both buffers reachable — and returns the
    /// implementation's destination and source objects.
    fn check_copy(
        &self,
        st: &State<I>,
        call: &str,
        device: usize,
        copy: &BufferCopy,
        toucher: Toucher,
    ) -> Result<(I::Buffer, I::Buffer)> {
        let (dst, src) = (st.buffers.get(copy.dst.0)?, st.buffers.get(copy.src.0)?);
        // Messages are built only for a range that does not fit: this runs once per transfer.
        let fits =
            |offset: usize, size: usize| offset.checked_add(copy.len).is_some_and(|e| e <= size);
        for (side, id, entry, offset) in [
            ("destination", copy.dst, dst, copy.dst_offset),
            ("source", copy.src, src, copy.src_offset),
        ] {
            if !fits(offset, entry.len) {
                let what = format!("{call} {side}");
                return Err(out_of_range(&what, id, entry.len, offset, copy.len));
            }
        }
        if copy.dst == copy.src
            && copy.len > 0
            && copy.src_offset < copy.dst_offset + copy.len
            && copy.dst_offset < copy.src_offset + copy.len
        {
            return Err(Error::usage(format!(
                "{call}: source and destination overlap in {} (offsets {} and {}, {} bytes): the \
                 result would depend on the order the bytes move in; copy through another buffer",
                copy.dst, copy.src_offset, copy.dst_offset, copy.len
            )));
        }
        self.check_reach(st, device, copy.dst, dst, toucher)?;
        self.check_reach(st, device, copy.src, src, toucher)?;
        Ok((dst.raw.clone(), src.raw.clone()))
    }

    /// The stream's GPU and object, for work a capture records.
    fn stream(&self, st: &State<I>, stream: StreamId) -> Result<(usize, I::Stream)> {
        let entry = st.streams.get(stream.0)?;
        Ok((entry.device, entry.raw.clone()))
    }

    /// Records a timed event ([`Backend::record`]) or one that only orders work
    /// ([`Backend::mark`]) on `stream`.
    fn new_event(&self, stream: StreamId, timed: bool) -> Result<EventId> {
        let (device, raw_stream) = self.idle_stream(&self.lock(), stream, "recording an event")?;
        let raw = if timed {
            self.raw.record(&raw_stream)?
        } else {
            self.raw.mark(&raw_stream)?
        };
        self.lock()
            .events
            .insert(EventEntry { device, raw, timed })
            .map(EventId)
    }

    /// The stream's GPU and object, for work a capture cannot record.
    fn idle_stream(
        &self,
        st: &State<I>,
        stream: StreamId,
        what: &str,
    ) -> Result<(usize, I::Stream)> {
        let entry = st.streams.get(stream.0)?;
        if entry.capture.is_some() {
            return Err(Error::usage(format!(
                "{what} on {stream} while it captures a graph: a capture records only copies, \
                 batches, pointer chases, busy kernels and collectives; end the capture first"
            )));
        }
        Ok((entry.device, entry.raw.clone()))
    }

    /// Notes the buffers work queued on `stream` uses, where the stream captures a graph.
    fn note_capture(
        st: &mut State<I>,
        stream: StreamId,
        buffers: impl IntoIterator<Item = BufferId>,
    ) {
        if let Ok(StreamEntry {
            capture: Some(used),
            ..
        }) = st.streams.get_mut(stream.0)
        {
            for buffer in buffers {
                if !used.contains(&buffer) {
                    used.push(buffer);
                }
            }
        }
    }

    /// Queues a batch after checking it: the shared part of `copy_batch` and `memcpy_batch`.
    fn batch(
        &self,
        call: &str,
        stream: StreamId,
        copies: &[BufferCopy],
        toucher: Toucher,
        queue: impl FnOnce(&I::Stream, Batch<'_, I::Buffer>) -> Result<()>,
    ) -> Result<()> {
        let mut st = self.lock();
        let (device, raw_stream) = self.stream(&st, stream)?;
        if copies.is_empty() {
            return Ok(());
        }
        let buffers = self.check_batch(&st, call, device, copies, toucher)?;
        Self::note_capture(&mut st, stream, buffers.iter().map(|(id, _)| *id));
        drop(st);
        queue(&raw_stream, Batch::new(copies, &buffers))
    }
}

#[cold]
/// `what` is formatted only here, for a range that fails (callers on hot paths pass
/// `format_args!`).
fn out_of_range(
    what: impl std::fmt::Display,
    buffer: BufferId,
    size: usize,
    offset: usize,
    len: usize,
) -> Error {
    Error::usage(format!(
        "{what} range {offset}..{offset}+{len} lies outside {buffer} of {size} bytes"
    ))
}

fn check_range(
    what: impl std::fmt::Display,
    buffer: BufferId,
    size: usize,
    offset: usize,
    len: usize,
) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(out_of_range(what, buffer, size, offset, len)),
    }
}

impl<
        I: RawProbes
            + RawCollectives
            + RawManaged
            + RawHealth
            + RawPatterns
            + RawResident
            + RawSharing,
    > Backend for Checked<I>
{
    fn source(&self) -> &Source {
        &self.raw.topology().source
    }

    fn topology(&self) -> &Topology {
        self.raw.topology()
    }

    fn notices(&self) -> Vec<String> {
        self.raw.notices()
    }

    fn keep_thread_context(&self) -> Result<KeptThreadContext> {
        Ok(KeptThreadContext {
            _kept: self.raw.keep_thread_context()?,
        })
    }

    fn probes(&self) -> &dyn Probes {
        self
    }

    fn collectives(&self) -> &dyn Collectives {
        self
    }

    fn resident(&self) -> &dyn Resident {
        self
    }

    fn managed(&self) -> &dyn Managed {
        self
    }

    fn health(&self) -> &dyn super::Health {
        self
    }

    fn patterns(&self) -> &dyn Patterns {
        self
    }

    fn sharing(&self) -> &dyn Sharing {
        self
    }

    fn enable_peer_access(&self, device: usize, peer: usize) -> Result<()> {
        self.check_device(device)?;
        self.check_device(peer)?;
        let pair = (device, peer);
        let enabled = || device == peer || self.lock().peers.contains(&pair);
        if enabled() {
            return Ok(());
        }
        let _one_at_a_time = self.enabling.lock().unwrap_or_else(PoisonError::into_inner);
        if enabled() {
            return Ok(());
        }
        self.raw.enable_peer_access(device, peer)?;
        self.lock().peers.insert(pair);
        Ok(())
    }

    fn free_memory(&self, device: usize) -> Result<u64> {
        self.check_device(device)?;
        self.raw.free_memory(device)
    }

    fn alloc(&self, memory: Memory, bytes: usize) -> Result<BufferId> {
        if bytes == 0 {
            return Err(Error::usage("cannot allocate a buffer of 0 bytes"));
        }
        match memory {
            Memory::Device(device) => self.check_device(device)?,
            Memory::Managed(device) => {
                self.check_device(device)?;
                // The driver would let managed memory outgrow the GPU and evict pages to make room;
                // peerlink never asks for more than is free.
                let free = self.raw.free_memory(device)?;
                if bytes as u64 > free {
                    return Err(Error::OutOfMemory {
                        place: format!(
                            "GPU {device} (managed memory is never allowed past a GPU's free                              memory)"
                        ),
                        asked: bytes as u64,
                        free,
                    });
                }
            }
            Memory::PinnedHost { .. } => {}
        }
        let raw = self.raw.alloc(memory, bytes)?;
        self.insert_buffer(raw, memory, bytes, sharing::Origin::Allocated)
    }

    fn free(&self, buffer: BufferId) -> Result<()> {
        let mut st = self.lock();
        if st.parked.must_wait(!st.workers.is_empty()) {
            // Releasing GPU memory waits for its device to idle, which never happens while a
            // worker's kernel runs: the handle goes now, the memory when the last worker stops.
            let entry = st.buffers.remove(buffer.0)?;
            st.parked.buffers.push(entry.raw);
            return Ok(());
        }
        // Freed under the lock, so that two threads freeing one buffer cannot both succeed.
        self.raw.free(&st.buffers.get(buffer.0)?.raw)?;
        let freed = st.buffers.remove(buffer.0)?;
        drop(st);
        drop(freed);
        Ok(())
    }

    fn len(&self, buffer: BufferId) -> Result<usize> {
        Ok(self.lock().buffers.get(buffer.0)?.len)
    }

    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<()> {
        let raw = {
            let st = self.lock();
            let entry = st.buffers.get(buffer.0)?;
            check_range("write", buffer, entry.len, offset, data.len())?;
            entry.raw.clone()
        };
        if data.is_empty() {
            return Ok(());
        }
        self.raw.write(&raw, offset, data)
    }

    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()> {
        let raw = {
            let st = self.lock();
            let entry = st.buffers.get(buffer.0)?;
            check_range("read", buffer, entry.len, offset, out.len())?;
            entry.raw.clone()
        };
        if out.is_empty() {
            return Ok(());
        }
        self.raw.read(&raw, offset, out)
    }

    fn create_stream(&self, device: usize) -> Result<StreamId> {
        self.check_device(device)?;
        let raw = self.raw.create_stream(device)?;
        let entry = StreamEntry {
            device,
            capture: None,
            raw,
        };
        self.lock().streams.insert(entry).map(StreamId)
    }

    fn destroy_stream(&self, stream: StreamId) -> Result<()> {
        let entry = {
            let mut st = self.lock();
            if st.streams.get(stream.0)?.capture.is_some() {
                return Err(Error::usage(format!(
                    "{stream} captures a graph: end the capture before destroying the stream"
                )));
            }
            st.streams.remove(stream.0)?
        };
        self.raw.destroy_stream(entry.raw)
    }

    fn copy(&self, stream: StreamId, method: CopyMethod, copy: &BufferCopy) -> Result<()> {
        let mut st = self.lock();
        let (device, raw_stream) = self.stream(&st, stream)?;
        let toucher = match method {
            CopyMethod::CopyEngine => Toucher::CopyEngine,
            CopyMethod::SmKernel => Toucher::Kernel("an SM copy kernel"),
        };
        let (raw_dst, raw_src) = self.check_copy(&st, "copy", device, copy, toucher)?;
        if copy.len == 0 {
            return Ok(());
        }
        Self::note_capture(&mut st, stream, [copy.dst, copy.src]);
        drop(st);
        self.raw.copy(
            &raw_stream,
            method,
            copy.map(|b| if b == copy.dst { &raw_dst } else { &raw_src }),
        )
    }

    fn copy_batch(&self, stream: StreamId, copies: &[BufferCopy]) -> Result<()> {
        let kernel = Toucher::Kernel("a copy_batch kernel");
        self.batch("copy_batch", stream, copies, kernel, |s, batch| {
            self.raw.copy_batch(s, batch)
        })
    }

    fn memcpy_batch(&self, stream: StreamId, copies: &[BufferCopy]) -> Result<()> {
        let engine = Toucher::CopyEngine;
        self.batch("memcpy_batch", stream, copies, engine, |s, batch| {
            self.raw.memcpy_batch(s, batch)
        })
    }

    fn record(&self, stream: StreamId) -> Result<EventId> {
        self.new_event(stream, true)
    }

    fn mark(&self, stream: StreamId) -> Result<EventId> {
        self.new_event(stream, false)
    }

    fn wait(&self, stream: StreamId, event: EventId) -> Result<()> {
        let (raw_stream, raw_event) = {
            let st = self.lock();
            let (_, raw_stream) = self.idle_stream(&st, stream, "waiting for an event")?;
            (raw_stream, st.events.get(event.0)?.raw.clone())
        };
        self.raw.wait(&raw_stream, &raw_event)
    }

    fn event_done(&self, event: EventId) -> Result<bool> {
        let raw = self.lock().events.get(event.0)?.raw.clone();
        self.raw.event_done(&raw)
    }

    fn event_synchronize(&self, event: EventId) -> Result<()> {
        let raw = self.lock().events.get(event.0)?.raw.clone();
        self.waited(self.raw.event_synchronize(&raw))
    }

    fn elapsed_us(&self, start: EventId, end: EventId) -> Result<f64> {
        let (first, last) = {
            let st = self.lock();
            let (first, last) = (st.events.get(start.0)?, st.events.get(end.0)?);
            if let Some(untimed) = [(start, first), (end, last)].iter().find(|(_, e)| !e.timed) {
                return Err(Error::usage(format!(
                    "{} only orders work and carries no time: record the events to time with \
                     `record`",
                    untimed.0
                )));
            }
            if first.device != last.device {
                return Err(Error::usage(format!(
                    "{start} and {end} were recorded on different GPUs ({} and {}): GPU time can \
                     only be measured between events of one GPU",
                    first.device, last.device
                )));
            }
            (first.raw.clone(), last.raw.clone())
        };
        self.raw.elapsed_us(&first, &last)?.ok_or_else(|| {
            Error::usage(format!(
                "{start} and {end} have not both completed: synchronise before asking for the \
                 time between them"
            ))
        })
    }

    fn destroy_event(&self, event: EventId) -> Result<()> {
        let entry = self.lock().events.remove(event.0)?;
        self.raw.destroy_event(entry.raw)
    }

    fn synchronize(&self, stream: StreamId) -> Result<()> {
        let (_, raw_stream) = self.idle_stream(&self.lock(), stream, "synchronizing")?;
        self.waited(self.raw.synchronize(&raw_stream))
    }

    fn host_time_us(&self) -> f64 {
        self.raw.host_time_us()
    }

    fn hold(&self, stream: StreamId) -> Result<GateId> {
        let (_, raw_stream) = self.idle_stream(&self.lock(), stream, "holding")?;
        let gate = self.raw.hold(&raw_stream)?;
        self.lock().gates.insert(gate).map(GateId)
    }

    fn release(&self, gate: GateId) -> Result<()> {
        let raw = self.lock().gates.remove(gate.0)?;
        self.raw.release(raw)
    }

    fn begin_capture(&self, stream: StreamId) -> Result<()> {
        let raw_stream = {
            let st = self.lock();
            let entry = st.streams.get(stream.0)?;
            if entry.capture.is_some() {
                return Err(Error::usage(format!(
                    "{stream} already captures a graph: end that capture first"
                )));
            }
            entry.raw.clone()
        };
        self.raw.begin_capture(&raw_stream)?;
        self.lock().streams.get_mut(stream.0)?.capture = Some(Vec::new());
        Ok(())
    }

    fn end_capture(&self, stream: StreamId) -> Result<GraphId> {
        let (device, buffers, raw_stream) = {
            let mut st = self.lock();
            let entry = st.streams.get_mut(stream.0)?;
            let buffers = entry.capture.take().ok_or_else(|| {
                Error::usage(format!(
                    "{stream} is not capturing a graph: call begin_capture first"
                ))
            })?;
            (entry.device, buffers, entry.raw.clone())
        };
        let raw = self.raw.end_capture(&raw_stream)?;
        let entry = GraphEntry {
            device,
            buffers,
            raw,
        };
        self.lock().graphs.insert(entry).map(GraphId)
    }

    fn replay(&self, graph: GraphId, stream: StreamId) -> Result<()> {
        let (raw_graph, raw_stream) = {
            let st = self.lock();
            let (device, raw_stream) = self.idle_stream(&st, stream, "replaying a graph")?;
            let entry = st.graphs.get(graph.0)?;
            if entry.device != device {
                return Err(Error::usage(format!(
                    "{graph} was captured on GPU {}: replay it on a stream of that GPU, not of GPU \
                     {device}",
                    entry.device
                )));
            }
            if let Some(freed) = entry.buffers.iter().find(|b| !st.buffers.contains(b.0)) {
                return Err(Error::usage(format!(
                    "{graph} uses {freed}, which was freed since the capture: a replay would touch \
                     freed memory; capture the graph again"
                )));
            }
            (entry.raw.clone(), raw_stream)
        };
        self.raw.replay(&raw_graph, &raw_stream)
    }

    fn destroy_graph(&self, graph: GraphId) -> Result<()> {
        let entry = self.lock().graphs.remove(graph.0)?;
        self.raw.destroy_graph(entry.raw)
    }

    fn borrow_memory(&self, device: usize, address: u64, bytes: usize) -> Result<BufferId> {
        self.check_device(device)?;
        if bytes == 0 {
            return Err(Error::usage(
                "cannot borrow 0 bytes of memory; a buffer holds at least 1 byte",
            ));
        }
        let raw = self.raw.borrow_memory(device, address, bytes)?;
        self.insert_buffer(
            raw,
            Memory::Device(device),
            bytes,
            sharing::Origin::Borrowed,
        )
    }

    fn is_capturing(&self, stream: StreamId) -> Result<bool> {
        let raw_stream = {
            let st = self.lock();
            let entry = st.streams.get(stream.0)?;
            if entry.capture.is_some() {
                return Ok(true);
            }
            entry.raw.clone()
        };
        self.raw.is_capturing(&raw_stream)
    }

    fn borrow_stream(&self, device: usize, handle: u64) -> Result<StreamId> {
        self.check_device(device)?;
        let raw = self.raw.borrow_stream(device, handle)?;
        let entry = StreamEntry {
            device,
            capture: None,
            raw,
        };
        self.lock().streams.insert(entry).map(StreamId)
    }
}

impl<I: RawProbes + RawCollectives> Probes for Checked<I> {
    fn pointer_chase(
        &self,
        stream: StreamId,
        chain: BufferId,
        steps: u32,
        result: BufferId,
    ) -> Result<()> {
        let kernel = Toucher::Kernel("a pointer-chase kernel");
        let mut st = self.lock();
        let (device, raw_stream) = self.stream(&st, stream)?;
        let (on_chain, on_result) = (st.buffers.get(chain.0)?, st.buffers.get(result.0)?);
        self.check_reach(&st, device, chain, on_chain, kernel)?;
        self.check_reach(&st, device, result, on_result, kernel)?;
        let elements = on_chain.len / 8;
        if elements == 0 {
            return Err(Error::usage(format!(
                "pointer chase: the chain, {chain}, holds {} bytes, less than one u64 element",
                on_chain.len
            )));
        }
        check_range("pointer-chase result", result, on_result.len, 0, 8)?;
        let (raw_chain, raw_result) = (on_chain.raw.clone(), on_result.raw.clone());
        Self::note_capture(&mut st, stream, [chain, result]);
        drop(st);
        self.raw
            .pointer_chase(&raw_stream, &raw_chain, elements as u64, steps, &raw_result)
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
                "ping-pong needs two different streams: on one stream the second kernel would \
                 wait for the first to finish, and the first waits for the second",
            ));
        }
        let (ping_stream, pong_stream, raw_ping_flag, raw_pong_flag) = {
            let st = self.lock();
            let (a, ping_stream) = self.idle_stream(&st, ping, "a ping-pong")?;
            let (b, pong_stream) = self.idle_stream(&st, pong, "a ping-pong")?;
            // Each side spins on its own flag and stores into the other side's.
            let mut flags = [
                (ping_flag, a, b, "ping_flag"),
                (pong_flag, b, a, "pong_flag"),
            ]
            .into_iter()
            .map(|(flag, owner, writer, name)| {
                let entry = st.buffers.get(flag.0)?;
                if entry.memory != Memory::Device(owner) {
                    return Err(Error::usage(format!(
                        "ping-pong: {name} ({flag}) must be memory of GPU {owner}, whose \
                             kernel spins on it, not {:?}",
                        entry.memory
                    )));
                }
                check_range(format_args!("ping-pong {name}"), flag, entry.len, 0, 4)?;
                let kernel = Toucher::Kernel("a ping-pong kernel");
                self.check_reach(&st, writer, flag, entry, kernel)?;
                Ok(entry.raw.clone())
            });
            let raw_ping_flag = flags.next().expect("two flags")?;
            let raw_pong_flag = flags.next().expect("two flags")?;
            (ping_stream, pong_stream, raw_ping_flag, raw_pong_flag)
        };
        self.raw.ping_pong(
            &ping_stream,
            &pong_stream,
            &raw_ping_flag,
            &raw_pong_flag,
            rounds,
        )
    }
}

impl<I: RawCollectives> Drop for Checked<I> {
    fn drop(&mut self) {
        let st = self.state.get_mut().unwrap_or_else(PoisonError::into_inner);
        // Stop every resident worker before any is dropped: while one runs, its kernel holds its
        // GPU, and releasing another's memory (or the implementation's own closing) waits for
        // every kernel.
        let workers = st.workers.drain();
        for worker in &workers {
            st.parked.stuck |= self.raw.stop_worker(&worker.raw).is_err();
        }
        if st.parked.stuck {
            // A kernel that would not stop holds its GPU until the process ends, and every
            // release below would wait for it: leave the memory to the process's end instead.
            std::mem::forget(workers);
            std::mem::forget(std::mem::take(&mut st.parked));
            std::mem::forget(st.buffers.drain());
            return;
        }
        drop(workers);
        for buffer in std::mem::take(&mut st.parked.buffers) {
            let _ = self.raw.free(&buffer);
        }
        drop(std::mem::take(&mut st.parked.workers));
        // Open every gate first, so that no stream waits out a spin kernel's timeout below; then
        // let the work finish before releasing what it uses. Nothing can report an error here.
        for gate in st.gates.drain() {
            let _ = self.raw.release(gate);
        }
        for stream in st.streams.iter() {
            let _ = self.raw.synchronize(&stream.raw);
        }
        for graph in st.graphs.drain() {
            let _ = self.raw.destroy_graph(graph.raw);
        }
        for event in st.events.drain() {
            let _ = self.raw.destroy_event(event.raw);
        }
        // Windows before their communicators, which NCCL needs alive to deregister them.
        for window in st.windows.drain() {
            if let Ok(comm) = st.comms.get(window.comm.0) {
                let _ = self.raw.nccl_deregister_window(&comm.raw, window.raw);
            }
        }
        for comm in st.comms.drain() {
            if let Some(raw) = Arc::into_inner(comm.raw) {
                let _ = self.raw.nccl_destroy(raw);
            }
        }
        for buffer in st.buffers.drain() {
            let _ = self.raw.free(&buffer.raw);
        }
        for stream in st.streams.drain() {
            let _ = self.raw.destroy_stream(stream.raw);
        }
    }
}
