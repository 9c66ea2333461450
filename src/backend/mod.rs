//! The seam between peerlink and a GPU host.
//!
//! Everything above this trait — the bench, the engine, the reports — is safe Rust that talks to a
//! host only through [`Backend`]. Two implementations exist: [`cuda`] drives real GPUs through the
//! CUDA driver API, NVRTC and NVML; [`sim`] simulates a host from a preset, moving real bytes in host
//! memory on a virtual, deterministic clock. Like hyperfine's `Executor`, each can measure its own
//! overhead, so the same benchmark code runs, and is tested, on both.
//!
//! Handles ([`BufferId`], [`StreamId`], …) are small copyable ids owned by the backend that issued them;
//! passing a handle from another backend, or one already freed, is an [`Error::InvalidHandle`].
//!
//! [`Error::InvalidHandle`]: crate::Error::InvalidHandle

pub mod cuda;
pub mod sim;

use crate::topology::Topology;
use crate::{Error, Result};

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

/// Where a buffer lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Memory {
    /// Device memory of this GPU, allocated so that peers granted access can reach it.
    Device(usize),
    /// Page-locked host memory, mapped for every GPU, preferably on this NUMA node.
    PinnedHost { numa_node: Option<i32> },
}

/// Which hardware moves the bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CopyMethod {
    /// A DMA copy engine, driven by the context of the stream's GPU.
    CopyEngine,
    /// A copy kernel on the stream's GPU that loads and stores through peer mappings (16-byte accesses).
    SmKernel,
}

/// One contiguous copy between two buffers. The ranges must lie inside their buffers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferCopy {
    pub dst: BufferId,
    pub dst_offset: usize,
    pub src: BufferId,
    pub src_offset: usize,
    pub len: usize,
}

/// What a GPU host offers to peerlink.
///
/// Work on one stream runs in order; work on different streams may overlap. Nothing here blocks the
/// host except [`Backend::synchronize`], [`Backend::event_synchronize`], [`Backend::read`] and
/// [`Backend::write`].
pub trait Backend: Send + Sync {
    /// `cuda` for real GPUs, `sim:<preset>` for the simulator.
    fn source(&self) -> &str;

    /// The host's devices and pairs, read once when the backend was opened.
    fn topology(&self) -> &Topology;

    /// What the backend could not find out about the host (NVML missing, say), one sentence each,
    /// to show beside the topology. Empty when nothing is missing.
    fn notices(&self) -> Vec<String> {
        Vec::new()
    }

    /// Lets kernels and copies issued on `device` reach memory of `peer`. Idempotent: enabling an
    /// already enabled pair succeeds. Fails with a sentence saying why where the pair has no P2P.
    fn enable_peer_access(&self, device: usize, peer: usize) -> Result<()>;

    /// Bytes of device memory currently free on `device`.
    fn free_memory(&self, device: usize) -> Result<u64>;

    /// Allocates `bytes` (> 0) of memory. Device memory is reachable by peers once access is enabled.
    fn alloc(&self, memory: Memory, bytes: usize) -> Result<BufferId>;

    /// Frees a buffer. Work still queued on it must have been synchronised first.
    fn free(&self, buffer: BufferId) -> Result<()>;

    /// Size of a buffer in bytes.
    fn len(&self, buffer: BufferId) -> Result<usize>;

    /// Writes `data` at `offset` from the host, synchronously (for filling buffers; not timed).
    fn write(&self, buffer: BufferId, offset: usize, data: &[u8]) -> Result<()>;

    /// Reads `out.len()` bytes at `offset` into the host, synchronously (for verification; not timed).
    fn read(&self, buffer: BufferId, offset: usize, out: &mut [u8]) -> Result<()>;

    /// A new stream on `device`.
    fn create_stream(&self, device: usize) -> Result<StreamId>;

    /// Queues a copy on `stream`. Which GPU's stream issues it decides push (the source's) or pull
    /// (the destination's); a peer copy needs peer access enabled from the issuing GPU.
    fn copy(&self, stream: StreamId, method: CopyMethod, copy: &BufferCopy) -> Result<()>;

    /// Queues ONE kernel on `stream`'s GPU that performs every copy in `copies` (a thread block per
    /// message, 16-byte accesses where alignment allows), loading and storing through peer mappings where
    /// a buffer is another GPU's (peer access enabled) or pinned host memory. The backend carries the copy
    /// list to the GPU itself (its cost is part of this call). Copies must not overlap each other's
    /// destinations. This is how thousands of small messages cost one launch instead of one each.
    fn copy_batch(&self, stream: StreamId, copies: &[BufferCopy]) -> Result<()>;

    /// Queues every copy in `copies` on `stream` as copy-engine copies in ONE driver call
    /// (cuMemcpyBatchAsync), ordered after the stream's earlier work. Copies must not overlap each
    /// other's destinations (the driver may run them in any order); peer copies need peer access
    /// from `stream`'s GPU.
    fn memcpy_batch(&self, stream: StreamId, copies: &[BufferCopy]) -> Result<()>;

    /// Records an event after the work queued so far on `stream`.
    fn record(&self, stream: StreamId) -> Result<EventId>;

    /// Makes later work on `stream` wait for `event` (no host blocking).
    fn wait(&self, stream: StreamId, event: EventId) -> Result<()>;

    /// Whether the work before `event` has finished (non-blocking).
    fn event_done(&self, event: EventId) -> Result<bool>;

    /// Blocks the host until the work before `event` has finished.
    fn event_synchronize(&self, event: EventId) -> Result<()>;

    /// GPU time between two completed events of one device, in microseconds.
    fn elapsed_us(&self, start: EventId, end: EventId) -> Result<f64>;

    /// Frees an event's resources.
    fn destroy_event(&self, event: EventId) -> Result<()>;

    /// Blocks the host until all work queued on `stream` has finished.
    fn synchronize(&self, stream: StreamId) -> Result<()>;

    /// The host clock in microseconds since the backend was opened: real time on real GPUs, the
    /// simulator's virtual host time (which advances by each call's modelled CPU cost) on the sim.
    fn host_time_us(&self) -> f64;

    /// Holds `stream` behind a one-thread kernel spinning on a pinned host flag, so that work queued
    /// after it starts only at [`Backend::release`]: the CPU's issue cost stays out of GPU-time windows.
    /// The spin gives up after a timeout so that a forgotten release cannot hang the GPU.
    fn hold(&self, stream: StreamId) -> Result<GateId>;

    /// Releases a held stream.
    fn release(&self, gate: GateId) -> Result<()>;

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

    /// Starts recording the work queued on `stream` into a graph instead of running it.
    fn begin_capture(&self, stream: StreamId) -> Result<()>;

    /// Ends the recording and returns a replayable graph.
    fn end_capture(&self, stream: StreamId) -> Result<GraphId>;

    /// Queues one replay of a graph on `stream`.
    fn replay(&self, graph: GraphId, stream: StreamId) -> Result<()>;
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
    match choice {
        Choice::Sim(preset) => Ok(Opened {
            backend: Box::new(sim::SimBackend::open(preset)?),
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
                backend: Box::new(sim::SimBackend::open(DEFAULT_PRESET)?),
                notice: Some(format!(
                    "no usable NVIDIA GPU ({why}): using the SIMULATED `{DEFAULT_PRESET}` host; \
                     every figure below is simulated (pass --gpu to require real GPUs)"
                )),
            }),
            Err(other) => Err(other),
        },
    }
}

/// A batch kernel's messages run concurrently, so their destinations must not overlap.
pub(crate) fn check_disjoint_destinations(copies: &[BufferCopy]) -> Result<()> {
    let ranges = copies
        .iter()
        .filter(|c| c.len > 0)
        .map(|c| (c.dst, c.dst_offset, c.dst_offset + c.len));
    match first_overlap(ranges) {
        None => Ok(()),
        Some((a, b)) => Err(Error::usage(format!(
            "copy_batch: two messages write overlapping bytes of one buffer (offsets {a} and {b})"
        ))),
    }
}

/// The starts of two `(buffer, start, end)` ranges that overlap in one buffer, if any.
///
/// Batches usually lay their messages out in order or in reverse order, one buffer after another:
/// such a list is checked in one pass ([`InOrder`]), with no copy and no sort; any other is sorted.
pub(crate) fn first_overlap<I>(ranges: I) -> Option<(usize, usize)>
where
    I: Iterator<Item = (BufferId, usize, usize)> + Clone,
{
    let mut order = InOrder::default();
    if ranges
        .clone()
        .all(|(buffer, start, end)| order.push(buffer, start, end))
    {
        return None;
    }
    let mut sorted: Vec<(BufferId, usize, usize)> = ranges.collect();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .find(|w| w[0].0 == w[1].0 && w[1].1 < w[0].2)
        .map(|w| (w[0].1, w[1].1))
}

/// Follows ranges one at a time while they stay laid out in runs: each buffer's ranges
/// consecutive, each range wholly after (or, for the whole run, wholly before) the one before it.
/// Ranges so laid out cannot overlap; once they are not, only a sort can tell.
#[derive(Default)]
pub(crate) struct InOrder {
    previous: Option<(BufferId, usize, usize)>,
    /// `Some(true)` once the current buffer's run is known to ascend.
    ascending: Option<bool>,
    /// Buffers whose run has ended.
    seen: Vec<BufferId>,
}

impl InOrder {
    /// Takes the next non-empty range; `false` once the ranges are no longer in runs.
    pub(crate) fn push(&mut self, buffer: BufferId, start: usize, end: usize) -> bool {
        match self.previous {
            Some((b, s, e)) if b == buffer => {
                let up = start >= e;
                if !(up || end <= s) || self.ascending.is_some_and(|a| a != up) {
                    return false;
                }
                self.ascending = Some(up);
            }
            previous => {
                // A buffer met again after another one: its ranges are not in one run.
                if self.seen.contains(&buffer) {
                    return false;
                }
                if let Some((b, ..)) = previous {
                    self.seen.push(b);
                }
                self.ascending = None;
            }
        }
        self.previous = Some((buffer, start, end));
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn overlaps_by_brute_force(ranges: &[(BufferId, usize, usize)]) -> bool {
        ranges.iter().enumerate().any(|(i, a)| {
            ranges[i + 1..]
                .iter()
                .any(|b| a.0 == b.0 && a.1 < b.2 && b.1 < a.2)
        })
    }

    #[test]
    fn ranges_in_order_or_reverse_pass_in_one_pass() {
        let up: Vec<_> = (0..10).map(|i| (BufferId(1), i * 8, i * 8 + 8)).collect();
        let down: Vec<_> = up.iter().rev().copied().collect();
        assert_eq!(first_overlap(up.iter().copied()), None);
        assert_eq!(first_overlap(down.iter().copied()), None);
    }

    #[test]
    fn an_overlap_is_found_in_a_run_and_out_of_one() {
        let run = [(BufferId(1), 0, 8), (BufferId(1), 4, 12)];
        assert_eq!(first_overlap(run.iter().copied()), Some((0, 4)));
        // Ascending, then back into the first range after another buffer.
        let scattered = [
            (BufferId(1), 0, 8),
            (BufferId(1), 16, 24),
            (BufferId(2), 0, 8),
            (BufferId(1), 20, 30),
        ];
        assert_eq!(first_overlap(scattered.iter().copied()), Some((16, 20)));
    }

    proptest! {
        #[test]
        fn first_overlap_agrees_with_brute_force(
            raw in proptest::collection::vec((1u64..4, 0usize..64, 1usize..16), 0..24),
            sort in 0u8..3,
        ) {
            let mut ranges: Vec<_> = raw.iter().map(|&(b, s, l)| (BufferId(b), s, s + l)).collect();
            // Sorted and reverse-sorted lists take the one-pass path; others the sort.
            match sort {
                0 => ranges.sort_unstable(),
                1 => { ranges.sort_unstable(); ranges.reverse(); }
                _ => {}
            }
            prop_assert_eq!(
                first_overlap(ranges.iter().copied()).is_some(),
                overlaps_by_brute_force(&ranges)
            );
        }
    }
}
