//! Windows of back-to-back operations behind a held stream: the timing every bandwidth and
//! copy-latency test runs on (nvbandwidth's design).
//!
//! A sample: hold each lane's issuing stream behind a spin kernel (so the CPU's issue cost stays
//! out of the window) → queue the warm-up operations (outside the window) → record the start event →
//! queue the timed operations → record the end event → release → synchronise → read the GPU time.
//! The sources are filled once per measurement, and after its last sample every byte of every
//! destination is checked against them. Device memory is filled and checked on its own GPU
//! ([`crate::backend::Patterns`]: a 512 MiB message in about a millisecond, where the host took
//! 0.14 s on the H200 pair to generate, write, read back and check it, nearly twice the 0.08 s of
//! its 60 copies), pinned host memory on the host.
//!
//! A [`Lane`] is one message's path: a source buffer and one or more hops, each a copy issued on a
//! stream into the next buffer (one hop for a direct copy; two, chained with events, for a copy
//! staged through pinned host memory). Several lanes run at once for bidirectional and fan tests;
//! the first lane's stream is the anchor whose events time the whole.

use crate::backend::collective::BufferRange;
use crate::backend::{Backend, BufferCopy, BufferId, CopyMethod, EventId, Memory, StreamId};
use crate::bench::stats::Stats;
use crate::bench::timing::{spread_over_cpus, CpuSpread};
use crate::pattern::{self, first_mismatch, Mismatch};
use crate::Result;
use std::collections::HashMap;

/// How many operations and samples a measurement takes.
#[derive(
    Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize, schemars::JsonSchema,
)]
pub struct Sampling {
    /// Operations queued before the start event (first-use costs stay out of the window).
    pub warmup: u32,
    /// Operations between the start and end events.
    pub iterations: u32,
    /// Samples, each a separate held-and-released window (every byte verified after the last).
    pub samples: u32,
    /// Each lane rotates its operations over buffer slots spanning at least this many bytes, so that
    /// messages that fit in the GPU's L2 cache (60 MB on H200) are not served from it. 0 disables.
    pub rotation_bytes: u64,
}

impl Sampling {
    fn operations(&self) -> u64 {
        u64::from(self.warmup) + u64::from(self.iterations)
    }
}

/// Byte alignment of rotation slots and staging chunks (a few cache lines).
const SLOT_ALIGN: usize = 512;
/// A staged copy is split into chunks of at least this size so its two copies overlap.
const STAGING_CHUNK: usize = 1 << 20;
/// …and into at most this many.
const MAX_STAGING_CHUNKS: usize = 8;

/// Names a lane in errors: which test, which GPUs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LaneLabel {
    pub test: String,
    pub src: usize,
    pub dst: usize,
}

/// One hop of a lane: a copy issued on `stream` into a buffer in `memory`.
#[derive(Clone, Copy, Debug)]
pub struct HopSpec {
    pub stream: StreamId,
    pub method: CopyMethod,
    pub memory: Memory,
}

/// A lane's buffer that the caller gives instead of the lane allocating it: another process's
/// buffer imported into this one, in the memory the lane would have allocated, at least
/// [`Lane::buffer_bytes`] long.
#[derive(Clone, Copy, Debug)]
pub enum Given {
    /// The source the lane fills and copies from.
    Source(BufferId),
    /// Where the last hop lands.
    Destination(BufferId),
}

/// One message's path, with its buffers allocated (and freed on drop).
pub struct Lane<'b> {
    backend: &'b dyn Backend,
    label: LaneLabel,
    source: BufferId,
    source_memory: Memory,
    hops: Vec<(HopSpec, BufferId)>,
    message: usize,
    stride: usize,
    slots: usize,
    chunk: usize,
    /// For multi-hop lanes: the event after which hop `k + 1` finished reading chunk `c` of slot `s`
    /// of hop `k`'s buffer, keyed by (k, s, c); hop `k` waits for it before overwriting that region.
    /// These are the only events a lane keeps: every other one is destroyed once waited on (a wait
    /// holds on to the record it waits for), so a long window holds no event per operation.
    read_done: HashMap<(usize, usize, usize), EventId>,
    seeds: Vec<u64>,
}

impl<'b> Lane<'b> {
    /// Allocates a lane for messages of `message` bytes from `source` memory through `hops`.
    /// `max_bytes_per_buffer` caps the rotation (keep it well below the free memory).
    pub fn new(
        backend: &'b dyn Backend,
        label: LaneLabel,
        source: Memory,
        hops: &[HopSpec],
        message: usize,
        sampling: &Sampling,
        max_bytes_per_buffer: u64,
    ) -> Result<Lane<'b>> {
        let shape = (message, sampling, max_bytes_per_buffer);
        Self::build(backend, label, source, hops, shape, None)
    }

    /// As [`Lane::new`], with one of the lane's buffers given instead of allocated (see
    /// [`Given`]). The lane frees it with its own buffers, or at once if the lane cannot be made.
    pub fn with_given(
        backend: &'b dyn Backend,
        label: LaneLabel,
        source: Memory,
        hops: &[HopSpec],
        (message, sampling, max_bytes_per_buffer): (usize, &Sampling, u64),
        given: Given,
    ) -> Result<Lane<'b>> {
        let shape = (message, sampling, max_bytes_per_buffer);
        Self::build(backend, label, source, hops, shape, Some(given)).inspect_err(|_| {
            // A given source is the lane's from the start (its drop frees it); a given destination
            // joins last, after every allocation that can fail: free it here.
            if let Given::Destination(destination) = given {
                let _ = backend.free(destination);
            }
        })
    }

    fn build(
        backend: &'b dyn Backend,
        label: LaneLabel,
        source: Memory,
        hops: &[HopSpec],
        (message, sampling, max_bytes_per_buffer): (usize, &Sampling, u64),
        given: Option<Given>,
    ) -> Result<Lane<'b>> {
        assert!(!hops.is_empty() && message > 0, "a lane copies something");
        let (stride, slots) = rotation(message, sampling, max_bytes_per_buffer);
        let chunk = if hops.len() > 1 {
            message
                .div_ceil(MAX_STAGING_CHUNKS)
                .max(STAGING_CHUNK)
                .min(message)
        } else {
            message
        };
        let bytes = Self::buffer_bytes(message, sampling, max_bytes_per_buffer);
        let mut lane = Lane {
            backend,
            label,
            source: BufferId(u64::MAX),
            source_memory: source,
            hops: Vec::with_capacity(hops.len()),
            message,
            stride,
            slots,
            chunk,
            read_done: HashMap::new(),
            seeds: Vec::new(),
        };
        lane.source = match given {
            Some(Given::Source(given)) => given,
            _ => backend.alloc(source, bytes)?,
        };
        for (k, hop) in hops.iter().enumerate() {
            let buffer = match given {
                Some(Given::Destination(given)) if k == hops.len() - 1 => given,
                _ => backend.alloc(hop.memory, bytes)?,
            };
            lane.hops.push((*hop, buffer));
        }
        Ok(lane)
    }

    /// Bytes of each of the lane's buffers (its source and each hop's) for messages of `message`
    /// bytes: one message, or its rotation slots.
    pub fn buffer_bytes(message: usize, sampling: &Sampling, max_bytes_per_buffer: u64) -> usize {
        match rotation(message, sampling, max_bytes_per_buffer) {
            (_, 1) => message,
            // Slots are laid out at `stride`, so offsets never leave the buffer.
            (stride, slots) => slots * stride,
        }
    }

    /// The stream that issues the first hop; its events time the lane.
    pub fn stream(&self) -> StreamId {
        self.hops[0].0.stream
    }

    /// The stream of the last hop: an event recorded there follows the whole message.
    pub fn final_stream(&self) -> StreamId {
        self.hops[self.hops.len() - 1].0.stream
    }

    /// Every stream the lane queues on.
    fn streams(&self) -> impl Iterator<Item = StreamId> + '_ {
        self.hops.iter().map(|(h, _)| h.stream)
    }

    pub fn backend(&self) -> &'b dyn Backend {
        self.backend
    }

    /// The final destination buffer.
    pub fn destination(&self) -> BufferId {
        self.hops[self.hops.len() - 1].1
    }

    /// How many buffer slots the lane rotates over.
    pub fn slots(&self) -> usize {
        self.slots
    }

    /// Byte offset of rotation slot `slot` in every buffer of the lane.
    fn slot_offset(&self, slot: usize) -> usize {
        slot * self.stride
    }

    /// Rotation slot `slot` of `buffer`: where one message lies.
    fn slot_range(&self, buffer: BufferId, slot: usize) -> BufferRange {
        BufferRange {
            buffer,
            offset: self.slot_offset(slot),
            len: self.message,
        }
    }

    /// Fills every slot of the source with its own pattern, derived from `seed`: on the source's
    /// GPU, or on the host for pinned memory.
    pub fn fill(&mut self, seed: u64) -> Result<()> {
        self.seeds = (0..self.slots)
            .map(|slot| pattern::seed(&[seed, slot as u64]))
            .collect();
        let backend = self.backend;
        if let Memory::Device(_) = self.source_memory {
            for (slot, &s) in self.seeds.iter().enumerate() {
                backend
                    .patterns()
                    .fill(&self.slot_range(self.source, slot), s)?;
            }
            return Ok(());
        }
        with_scratch(self.message, |data| {
            for (slot, &s) in self.seeds.iter().enumerate() {
                pattern::fill(s, data);
                backend.write(self.source, self.slot_offset(slot), data)?;
            }
            Ok(())
        })
    }

    /// Where each slot's message lies in the final destination, with the seed of the pattern the
    /// last fill put in it: what [`Lane::verify`] checks (and what the owner of an imported
    /// destination checks in its own process).
    pub fn expected(&self) -> Vec<(BufferRange, u64)> {
        let destination = self.destination();
        let slots = self.seeds.iter().enumerate();
        slots
            .map(|(slot, &seed)| (self.slot_range(destination, slot), seed))
            .collect()
    }

    /// Checks every byte of every slot of the destination against the last fill: on the
    /// destination's GPU, or on the host for pinned memory.
    pub fn verify(&self) -> Result<()> {
        let LaneLabel { test, src, dst } = &self.label;
        let memory = self.hops[self.hops.len() - 1].0.memory;
        match check_ranges(self.backend, memory, &self.expected())? {
            Some(m) => Err(m.into_error(test.clone(), *src, *dst)),
            None => Ok(()),
        }
    }

    /// Queues operation number `op`: every hop of the message in its rotation slot, chunk by chunk,
    /// each hop's chunk waiting for the previous hop's. Returns the host µs spent in the call that
    /// starts the operation (its first copy); a staged lane's later calls overlap its transfer.
    pub fn enqueue(&mut self, op: u64) -> Result<f64> {
        let backend = self.backend;
        let slot = (op % self.slots as u64) as usize;
        let base = self.slot_offset(slot);
        let staged = self.hops.len() > 1;
        let mut starting_call_us = None;
        for (c, start) in (0..self.message).step_by(self.chunk).enumerate() {
            let len = self.chunk.min(self.message - start);
            let mut ready: Option<EventId> = None;
            for k in 0..self.hops.len() {
                let (hop, dst) = self.hops[k];
                let src = if k == 0 {
                    self.source
                } else {
                    self.hops[k - 1].1
                };
                if let Some(event) = ready {
                    backend.wait(hop.stream, event)?;
                    // The first hop's event has no other use; a later hop's is in `read_done`.
                    if k == 1 {
                        backend.destroy_event(event)?;
                    }
                }
                if let Some(event) = self.read_done.get(&(k, slot, c)) {
                    backend.wait(hop.stream, *event)?;
                }
                let copy = BufferCopy {
                    dst,
                    dst_offset: base + start,
                    src,
                    src_offset: base + start,
                    len,
                };
                let before = backend.host_time_us();
                backend.copy(hop.stream, hop.method, &copy)?;
                starting_call_us.get_or_insert(backend.host_time_us() - before);
                if staged {
                    let done = backend.record(hop.stream)?;
                    if k > 0 {
                        // The event it replaces was waited on by hop k - 1 of this operation above.
                        if let Some(old) = self.read_done.insert((k - 1, slot, c), done) {
                            backend.destroy_event(old)?;
                        }
                    }
                    ready = Some(done);
                }
            }
        }
        Ok(starting_call_us.unwrap_or(0.0))
    }

    /// Makes the lane's own stream wait for its later hops, so an event recorded on it next follows
    /// all of the lane's work.
    fn join(&mut self) -> Result<()> {
        if self.hops.len() > 1 {
            let done = self.backend.record(self.final_stream())?;
            self.backend.wait(self.stream(), done)?;
            self.backend.destroy_event(done)?;
        }
        Ok(())
    }

    fn destroy_events(&mut self) -> Result<()> {
        for (_, event) in self.read_done.drain() {
            self.backend.destroy_event(event)?;
        }
        Ok(())
    }
}

/// The first wrong byte of `ranges` of one buffer in `memory`, each against its seed's pattern:
/// device memory checked on its GPU, host memory on the host.
pub fn check_ranges(
    backend: &dyn Backend,
    memory: Memory,
    ranges: &[(BufferRange, u64)],
) -> Result<Option<Mismatch>> {
    if let Memory::Device(_) = memory {
        for (range, seed) in ranges {
            if let Some(m) = backend.patterns().first_mismatch(range, *seed)? {
                return Ok(Some(m));
            }
        }
        return Ok(None);
    }
    let longest = ranges.iter().map(|(r, _)| r.len).max().unwrap_or(0);
    with_scratch(longest, |data| {
        for (range, seed) in ranges {
            let data = &mut data[..range.len];
            backend.read(range.buffer, range.offset, data)?;
            if let Some(m) = first_mismatch(*seed, data) {
                return Ok(Some(m));
            }
        }
        Ok(None)
    })
}

/// The stride of a lane's rotation slots and how many it rotates over: enough to span
/// `sampling.rotation_bytes`, no more than its operations use, within `max_bytes_per_buffer`.
fn rotation(message: usize, sampling: &Sampling, max_bytes_per_buffer: u64) -> (usize, usize) {
    let stride = message.div_ceil(SLOT_ALIGN).saturating_mul(SLOT_ALIGN);
    let wanted = (sampling.rotation_bytes as usize).div_ceil(stride).max(1);
    let affordable = (max_bytes_per_buffer as usize / stride).max(1);
    let slots = wanted
        .min(sampling.operations().max(1) as usize)
        .min(affordable);
    (stride, slots)
}

impl Drop for Lane<'_> {
    fn drop(&mut self) {
        // Errors here would hide the one that made us drop early; the backend reclaims the rest.
        let _ = self.destroy_events();
        let _ = self.backend.free(self.source);
        for (_, buffer) in &self.hops {
            let _ = self.backend.free(*buffer);
        }
    }
}

/// One sample's times.
#[derive(Clone, Debug, PartialEq)]
struct SampleTimes {
    /// GPU µs per timed operation, per lane.
    lane_us: Vec<f64>,
    /// GPU µs from the anchor's start until every lane finished, per timed round (one operation of
    /// every lane).
    round_us: f64,
    /// Host µs spent in the calls that queued one timed operation, averaged.
    issue_us: f64,
    /// Host µs of the call that starts one timed operation, averaged.
    start_us: f64,
}

/// What [`measure`] found, over all samples.
#[derive(Clone, Debug, PartialEq)]
pub struct Measurement {
    /// GPU µs per operation, per lane.
    pub lane_us: Vec<Stats>,
    /// GPU µs per round (one operation of every lane), from the anchor's start until every lane
    /// finished, divided by the timed operations.
    pub round_us: Stats,
    /// Host µs to queue one operation, all its calls (CPU issue cost).
    pub issue_us: Stats,
    /// Host µs of the one call that starts an operation (equal to `issue_us` for a direct copy).
    pub start_us: Stats,
    /// Bytes all lanes move in one round.
    pub round_bytes: u64,
}

impl Measurement {
    /// GB/s of lane `i` alone, from its median time per operation.
    pub fn lane_gbps(&self, i: usize, message: usize) -> f64 {
        crate::units::gbps(message as u64, self.lane_us[i].median)
    }

    /// GB/s of all lanes together, from the median round.
    pub fn total_gbps(&self) -> f64 {
        crate::units::gbps(self.round_bytes, self.round_us.median)
    }
}

thread_local! {
    /// Host memory that messages in pinned host memory are filled and checked in, kept from one
    /// lane to the next: a fresh allocation of up to 1 GiB per lane costs more in page faults than
    /// filling it.
    static SCRATCH: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` bytes of this thread's scratch memory.
fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [u8]) -> R) -> R {
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < len {
            scratch.resize(len, 0);
        }
        f(&mut scratch[..len])
    })
}

/// Runs `sampling.samples` samples of `lanes` at once, with patterns derived from `seed`, and checks
/// every byte the lanes moved after the last.
pub fn measure(lanes: &mut [Lane<'_>], sampling: &Sampling, seed: u64) -> Result<Measurement> {
    assert!(!lanes.is_empty(), "measure needs a lane");
    assert!(sampling.iterations > 0 && sampling.samples > 0);
    fill_lanes(lanes, seed)?;
    let mut samples = Vec::with_capacity(sampling.samples as usize);
    for _ in 0..sampling.samples {
        crate::interrupt::check()?;
        samples.push(run_sample(lanes, sampling)?);
    }
    verify_lanes(lanes)?;
    let stats = |f: &dyn Fn(&SampleTimes) -> f64| {
        Stats::of_times(&samples.iter().map(f).collect::<Vec<_>>())
    };
    Ok(Measurement {
        lane_us: (0..lanes.len())
            .map(|i| stats(&|s| s.lane_us[i]))
            .collect::<Result<_>>()?,
        round_us: stats(&|s| s.round_us)?,
        issue_us: stats(&|s| s.issue_us)?,
        start_us: stats(&|s| s.start_us)?,
        round_bytes: lanes.iter().map(|l| l.message as u64).sum(),
    })
}

/// The host's time to queue one operation of a window of `sampling.iterations` (µs), a window on
/// each CPU the thread may run on where `pin`, else `sampling.samples` windows where it is (see
/// [`spread_over_cpus`]); the bytes filled before and verified after, as [`measure`] does.
pub fn issue_spread(
    lanes: &mut [Lane<'_>],
    sampling: &Sampling,
    seed: u64,
    pin: bool,
) -> Result<CpuSpread> {
    assert!(!lanes.is_empty(), "issue_spread needs a lane");
    fill_lanes(lanes, seed)?;
    let spread = spread_over_cpus(pin, sampling.samples as usize, || {
        Ok(vec![run_sample(lanes, sampling)?.issue_us])
    })?;
    verify_lanes(lanes)?;
    Ok(spread)
}

fn fill_lanes(lanes: &mut [Lane<'_>], seed: u64) -> Result<()> {
    for (i, lane) in lanes.iter_mut().enumerate() {
        lane.fill(pattern::seed(&[seed, i as u64]))?;
    }
    Ok(())
}

fn verify_lanes(lanes: &[Lane<'_>]) -> Result<()> {
    lanes.iter().try_for_each(Lane::verify)
}

/// One held-and-released window over all lanes.
fn run_sample(lanes: &mut [Lane<'_>], sampling: &Sampling) -> Result<SampleTimes> {
    let backend = lanes[0].backend;
    let mut gates = Vec::with_capacity(lanes.len());
    let held = lanes.iter().try_for_each(|lane| {
        gates.push(backend.hold(lane.stream())?);
        Ok(())
    });
    let queued = held.and_then(|()| queue_window(lanes, sampling));
    // Release and drain even after an error, so no stream stays held.
    let released = gates.into_iter().try_for_each(|g| backend.release(g));
    let mut streams: Vec<StreamId> = lanes.iter().flat_map(Lane::streams).collect();
    streams.sort_unstable();
    streams.dedup();
    let drained = streams.into_iter().try_for_each(|s| backend.synchronize(s));
    let window = queued?;
    released?;
    drained?;

    let lane_us = window
        .lanes
        .iter()
        .map(|&(start, end)| {
            backend
                .elapsed_us(start, end)
                .map(|us| us / f64::from(sampling.iterations))
        })
        .collect::<Result<Vec<f64>>>()?;
    let round_us = backend.elapsed_us(window.start, window.end)? / f64::from(sampling.iterations);
    let mut events = vec![window.start, window.end];
    events.extend(window.lanes.iter().flat_map(|&(s, e)| [s, e]));
    events.sort_unstable();
    events.dedup();
    for event in events {
        backend.destroy_event(event)?;
    }
    for lane in lanes.iter_mut() {
        lane.destroy_events()?;
    }
    let operations = f64::from(sampling.iterations) * lanes.len() as f64;
    Ok(SampleTimes {
        lane_us,
        round_us,
        issue_us: window.issue_us / operations,
        start_us: window.start_us / operations,
    })
}

/// The events of one window.
struct Window {
    start: EventId,
    end: EventId,
    lanes: Vec<(EventId, EventId)>,
    issue_us: f64,
    start_us: f64,
}

fn queue_window(lanes: &mut [Lane<'_>], sampling: &Sampling) -> Result<Window> {
    let backend = lanes[0].backend;
    let anchor = lanes[0].stream();
    // A stop ends the queuing at once (an atomic load per operation): the stream stays held
    // until the window is whole, so what is queued has not started yet.
    for op in 0..u64::from(sampling.warmup) {
        crate::interrupt::check()?;
        for lane in lanes.iter_mut() {
            lane.enqueue(op)?;
        }
    }
    let start = backend.record(anchor)?;
    let mut starts = vec![start];
    for lane in &lanes[1..] {
        // No lane starts before the anchor's window opens.
        backend.wait(lane.stream(), start)?;
        starts.push(backend.record(lane.stream())?);
    }
    let (mut issue_us, mut start_us) = (0.0, 0.0);
    for op in u64::from(sampling.warmup)..sampling.operations() {
        crate::interrupt::check()?;
        for lane in lanes.iter_mut() {
            let before = backend.host_time_us();
            start_us += lane.enqueue(op)?;
            issue_us += backend.host_time_us() - before;
        }
    }
    let mut ends = Vec::with_capacity(lanes.len());
    for lane in lanes.iter_mut() {
        lane.join()?;
        ends.push(backend.record(lane.stream())?);
    }
    for &end in &ends[1..] {
        backend.wait(anchor, end)?;
    }
    let end = if lanes.len() == 1 {
        ends[0]
    } else {
        backend.record(anchor)?
    };
    Ok(Window {
        start,
        end,
        lanes: starts.into_iter().zip(ends).collect(),
        issue_us,
        start_us,
    })
}
