//! Work over several GPUs at once: peerlink's own all-reduce kernels, the stand-in compute a
//! workload overlaps its communication with, and NCCL where the host has it.
//!
//! Each collective names one rank per GPU, rank `i` at position `i`, each with its own stream. A
//! collective call queues the work of every rank at once; the ranks' kernels meet on the GPUs
//! (peerlink's through flags in each GPU's memory, NCCL through its own), never through the host.
//! The ranks' streams either all capture a graph or none does: a rank recorded into a graph would
//! meet the others only when its graph is replayed (replay every rank's graph, as many times).

use super::{BufferId, StreamId};
use crate::Result;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The most ranks one of peerlink's all-reduce kernels serves (the kernels hold one pointer per
/// rank in their arguments).
pub const MAX_RANKS: usize = 8;

/// The largest all-reduce [`AllReduceKernel::OneShotPackets`] takes, bytes. On the H200 pair the
/// packets beat plain NCCL (ordinary buffers, no symmetric windows) 1.75× at 64 KiB, while one-shot
/// only tied it at 256 KiB (8.53 against 8.57 µs): the packets reach that far, for a receive area
/// of 8 MiB per rank.
pub const PACKET_MAX_BYTES: usize = 256 * 1024;

/// Bytes at the start of a flag block that hold the kernels' counters and flags.
const FLAG_AREA_BYTES: usize = 64 * 1024;

/// Bytes of the receive area of [`AllReduceKernel::OneShotPackets`], after the flags: an 8-byte
/// packet for every 4 bytes of payload, from each of [`MAX_RANKS`] senders, in each of two
/// parities (alternate calls): 2 × 8 × 256 KiB × 2 = 8 MiB.
const PACKET_AREA_BYTES: usize = 2 * MAX_RANKS * PACKET_MAX_BYTES * 2;

/// Bytes of one rank's flag block for peerlink's all-reduce kernels: 64 KiB of counters and flags,
/// then the packet kernel's 8 MiB receive area. The block is zeroed once after allocation and then
/// belongs to the kernels: they keep their own operation counter in it and only ever raise their
/// flags and packets' epochs, so no call needs a reset pass, and a captured graph replays as the
/// stream would run the calls.
pub const FLAG_BYTES: usize = FLAG_AREA_BYTES + PACKET_AREA_BYTES;

/// How long a rank's all-reduce kernel waits for its peers with [`Waiting::Bounded`] before it
/// traps: 10 s, twice the longest hold of a gate (`Backend::hold`), so that one rank held back by a
/// gate while the others run is not mistaken for a lost peer.
pub const PEER_TIMEOUT_NS: u64 = 10_000_000_000;

/// How a rank's kernel of peerlink's all-reduce waits for its peers' kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Waiting<B = BufferId> {
    /// At most [`PEER_TIMEOUT_NS`]; a peer later than that traps the kernel, and the GPU's context
    /// reports an error to every later call. peerlink's own verbs wait so: a lost peer is reported,
    /// never hung on.
    Bounded,
    /// For as long as its peers take (NCCL's contract: a rank busy for minutes with a checkpoint
    /// is normal), until the host raises the release word: the first 4 bytes of this buffer,
    /// pinned host memory, zero while the wait may go on. The host that watches the peers raises
    /// it for a peer that died or a communicator aborted; a released kernel ends without an error
    /// and what it wrote is undefined.
    Released(B),
}

impl<B> Waiting<B> {
    /// The same waiting, with the release word's buffer replaced by `f`'s answer for it.
    pub fn map<C>(self, f: impl FnOnce(B) -> C) -> Waiting<C> {
        match self {
            Waiting::Bounded => Waiting::Bounded,
            Waiting::Released(word) => Waiting::Released(f(word)),
        }
    }

    pub fn as_ref(&self) -> Waiting<&B> {
        match self {
            Waiting::Bounded => Waiting::Bounded,
            Waiting::Released(word) => Waiting::Released(word),
        }
    }
}

/// Bytes of a release word ([`Waiting::Released`]): one u32.
pub const RELEASE_WORD_BYTES: usize = 4;

/// The element type of a reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum DataType {
    F32,
    Bf16,
    // IEEE binary16, NCCL's ncclFloat16 (a plain comment keeps the schema one enum).
    F16,
}

impl DataType {
    /// Bytes of one element.
    pub fn size(self) -> usize {
        match self {
            DataType::F32 => 4,
            DataType::Bf16 | DataType::F16 => 2,
        }
    }

    /// One little-endian element (`self.size()` bytes) as f32, exactly.
    pub fn to_f32(self, element: &[u8]) -> f32 {
        match self {
            DataType::F32 => f32_at(element),
            DataType::Bf16 => f32::from_bits(u32::from(u16_at(element)) << 16),
            DataType::F16 => f16_to_f32(u16_at(element)),
        }
    }

    /// Appends `x` rounded to one little-endian element, to nearest, ties to even, as the
    /// kernels round (kernels/collective.cu's `Bf16Half::round` and `F16Half::round`).
    pub fn push_rounded(self, x: f32, out: &mut Vec<u8>) {
        match self {
            DataType::F32 => out.extend_from_slice(&x.to_le_bytes()),
            DataType::Bf16 => out.extend_from_slice(&bf16_from_f32(x).to_le_bytes()),
            DataType::F16 => out.extend_from_slice(&f16_from_f32(x).to_le_bytes()),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            DataType::F32 => "f32",
            DataType::Bf16 => "bf16",
            DataType::F16 => "f16",
        }
    }
}

impl fmt::Display for DataType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How an all-reduce combines the ranks' elements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Reduction {
    /// The sum, added in rank order.
    #[default]
    Sum,
    /// The mean, as NCCL's `ncclAvg` of floats: the sum times 1/ranks.
    Average,
}

impl Reduction {
    pub fn name(self) -> &'static str {
        match self {
            Reduction::Sum => "sum",
            Reduction::Average => "avg",
        }
    }

    /// The factor each f32 sum is multiplied by before its one rounding to the element type, over
    /// `ranks` ranks: exactly 1 for a sum (so sums keep their bits), the f32 nearest 1/ranks for
    /// an average. The kernels and the simulator both multiply by this one value.
    pub fn scale(self, ranks: usize) -> f32 {
        match self {
            Reduction::Sum => 1.0,
            Reduction::Average => 1.0 / ranks as f32,
        }
    }
}

impl fmt::Display for Reduction {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

fn f32_at(bytes: &[u8]) -> f32 {
    f32::from_le_bytes(bytes.try_into().expect("4 bytes"))
}

fn u16_at(bytes: &[u8]) -> u16 {
    u16::from_le_bytes(bytes.try_into().expect("2 bytes"))
}

/// The bf16 nearest to `x`, ties to even; a NaN stays a (quiet) NaN.
fn bf16_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return (bits >> 16) as u16 | 0x0040;
    }
    let round = 0x7fff + ((bits >> 16) & 1);
    // No overflow: the largest non-NaN pattern, 0xff80_0000 (−∞), plus 0x8000 fits.
    ((bits + round) >> 16) as u16
}

/// The f16 (IEEE binary16) `half` as f32, exactly (kernels/collective.cu's `F16Half::widen`).
fn f16_to_f32(half: u16) -> f32 {
    let half = u32::from(half);
    let sign = (half & 0x8000) << 16;
    let exponent = (half >> 10) & 0x1f;
    let mantissa = half & 0x3ff;
    match exponent {
        0x1f => f32::from_bits(sign | 0x7f80_0000 | (mantissa << 13)),
        // Zero or subnormal: mantissa × 2^-24.
        0 => f32::from_bits(sign | (mantissa as f32 * f32::from_bits(0x3380_0000)).to_bits()),
        _ => f32::from_bits(sign | ((exponent + 112) << 23) | (mantissa << 13)),
    }
}

/// The f16 nearest to `x`, ties to even: subnormals kept, a magnitude of 65520 or more to
/// infinity, a NaN stays a (quiet) NaN (kernels/collective.cu's `F16Half::round`, line for line).
fn f16_from_f32(x: f32) -> u16 {
    let bits = x.to_bits();
    let sign = (bits >> 16) & 0x8000;
    let magnitude = bits & 0x7fff_ffff;
    let half = if magnitude > 0x7f80_0000 {
        0x7e00 | ((magnitude >> 13) & 0x3ff)
    } else if magnitude >= 0x477f_f000 {
        0x7c00
    } else if magnitude >= 0x3880_0000 {
        // Normal: rebias the exponent, round the 13 dropped bits to even.
        (magnitude - 0x3800_0000 + 0xfff + ((magnitude >> 13) & 1)) >> 13
    } else if magnitude >> 23 < 102 {
        0
    } else {
        // Subnormal: the 24-bit significand in units of 2^-24, rounded to even.
        let significand = (magnitude & 0x7f_ffff) | 0x80_0000;
        let shift = 126 - (magnitude >> 23);
        (significand + (1 << (shift - 1)) - 1 + ((significand >> shift) & 1)) >> shift
    };
    (sign | half) as u16
}

/// Which of peerlink's all-reduce kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum AllReduceKernel {
    /// Every rank reads every peer's whole input over P2P and sums it into its own output: one
    /// launch, one flag exchange, `n − 1` whole buffers read per rank. Fastest for small buffers.
    OneShot,
    /// Rank `r` sums slice `r` of every input (reduce-scatter) and stores the sum into slice `r`
    /// of every rank's output (all-gather): each rank moves `2 (n − 1) / n` of the buffer over its
    /// links, as a ring does, in one launch. Fastest for large buffers.
    TwoShot,
    /// Every rank pushes its input into every peer's receive area (in its flag block) as 8-byte
    /// packets of 4 data bytes and the call's epoch, then sums the packets it received with its own
    /// input: no barrier, each rank waits only for its peers' data. Twice the bytes over the
    /// links, so it takes at most [`PACKET_MAX_BYTES`]. Fastest for the smallest buffers.
    OneShotPackets,
}

impl AllReduceKernel {
    /// Every kernel, in the order workloads and tests list them.
    pub const ALL: [AllReduceKernel; 3] = [
        AllReduceKernel::OneShot,
        AllReduceKernel::TwoShot,
        AllReduceKernel::OneShotPackets,
    ];

    pub fn name(self) -> &'static str {
        match self {
            AllReduceKernel::OneShot => "one-shot",
            AllReduceKernel::TwoShot => "two-shot",
            AllReduceKernel::OneShotPackets => "one-shot-packets",
        }
    }

    /// The most bytes one call of this kernel takes.
    pub fn max_len(self) -> usize {
        match self {
            AllReduceKernel::OneShot | AllReduceKernel::TwoShot => usize::MAX,
            AllReduceKernel::OneShotPackets => PACKET_MAX_BYTES,
        }
    }

    /// Whether a rank's output may be its own input (kernels/collective.cu). Two-shot: only rank
    /// `r`'s threads touch slice `r`, in every buffer, and each thread reads an item from every
    /// input before it stores the sum into every output; the barriers at both ends keep the
    /// owners' work out. Packets: a rank reads only its own input, each word by the thread that
    /// then stores that word of its output; peers read packets, never the input. One-shot is not:
    /// every rank reads every peer's whole input while the peer stores its output.
    pub fn in_place(self) -> bool {
        match self {
            AllReduceKernel::TwoShot | AllReduceKernel::OneShotPackets => true,
            AllReduceKernel::OneShot => false,
        }
    }
}

/// One rank's part of an all-reduce: the stream that runs it (on the rank's GPU) and its buffers,
/// both memory of that GPU, `len` bytes used from the start of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rank {
    pub stream: StreamId,
    pub input: BufferId,
    pub output: BufferId,
}

/// One rank's buffers in an all-reduce whose ranks are processes ([`Collectives::rank_all_reduce`]):
/// this process's own rank's, or another process's, imported into this one for this process's GPU
/// ([`super::Sharing::import`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RankBuffers {
    pub input: BufferId,
    pub output: BufferId,
    /// Where the call's bytes start in `input` and in `output` (0 and 0 for whole buffers): ranges
    /// of memory the ranks shared once serve call after call.
    pub input_offset: usize,
    pub output_offset: usize,
    /// The rank's flag block ([`FLAG_BYTES`], zeroed once after allocation).
    pub flags: BufferId,
}

/// Bytes of one buffer from `offset`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BufferRange<B = BufferId> {
    pub buffer: B,
    pub offset: usize,
    pub len: usize,
}

/// One point-to-point message of a grouped NCCL call: rank `from` sends `src`, rank `to` receives
/// it into `dst` (of the same length).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerTransfer<B = BufferId> {
    pub from: usize,
    pub to: usize,
    pub src: BufferRange<B>,
    pub dst: BufferRange<B>,
}

/// One side of a point-to-point message, as the process of one rank issues it
/// ([`Nccl::rank_send_recv`]): the peer rank issues the matching side in its own process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PeerOp<B = BufferId> {
    /// Send `src` to rank `to`, which receives as many bytes.
    Send { to: usize, src: BufferRange<B> },
    /// Receive into `dst` what rank `from` sends.
    Recv { from: usize, dst: BufferRange<B> },
}

impl<B> PeerOp<B> {
    /// The rank at the other end.
    pub fn peer(&self) -> usize {
        match *self {
            PeerOp::Send { to, .. } => to,
            PeerOp::Recv { from, .. } => from,
        }
    }

    /// The bytes this side reads (a send) or writes (a receive).
    pub fn range(&self) -> &BufferRange<B> {
        match self {
            PeerOp::Send { src, .. } => src,
            PeerOp::Recv { dst, .. } => dst,
        }
    }

    /// The same side, with its buffer replaced by `f`'s answer for it.
    pub fn map<C>(self, f: impl FnOnce(B) -> C) -> PeerOp<C> {
        match self {
            PeerOp::Send { to, src } => PeerOp::Send {
                to,
                src: src.map(f),
            },
            PeerOp::Recv { from, dst } => PeerOp::Recv {
                from,
                dst: dst.map(f),
            },
        }
    }
}

/// Bytes of NCCL's unique id (`ncclUniqueId`, `NCCL_UNIQUE_ID_BYTES` in nccl.h).
pub const UNIQUE_ID_BYTES: usize = 128;

/// NCCL's unique id for a communicator across processes: made by one rank
/// ([`Nccl::unique_id`]), passed to every other (through `Group::broadcast`) as plain bytes, and
/// given by all of them to [`Nccl::join_communicator`]. It names the maker's bootstrap socket, so
/// it serves one communicator.
#[derive(Clone, PartialEq, Eq)]
pub struct UniqueId([u8; UNIQUE_ID_BYTES]);

impl UniqueId {
    /// The id in `bytes`, as another rank sent it; a usage error unless it is
    /// [`UNIQUE_ID_BYTES`] long.
    pub fn from_bytes(bytes: &[u8]) -> Result<UniqueId> {
        let id = bytes.try_into().map_err(|_| {
            crate::Error::usage(format!(
                "an NCCL unique id of {} bytes: NCCL's ids are {UNIQUE_ID_BYTES} bytes; pass the \
                 bytes Nccl::unique_id made on one rank, unchanged",
                bytes.len()
            ))
        })?;
        Ok(UniqueId(id))
    }

    pub fn as_bytes(&self) -> &[u8; UNIQUE_ID_BYTES] {
        &self.0
    }
}

impl fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // An address and a random magic number: nothing a reader needs in full.
        write!(f, "UniqueId({:02x?}…)", &self.0[..8])
    }
}

/// This process's rank of a communicator that spans processes, one GPU each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommRank {
    /// 0 to `world - 1`.
    pub rank: usize,
    /// How many ranks (processes) the communicator has.
    pub world: usize,
    /// The GPU of this process the rank runs on.
    pub device: usize,
}

/// An NCCL communicator over some of the host's GPUs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CommId(pub u64);

impl fmt::Display for CommId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "communicator {}", super::handles::handle_index(self.0))
    }
}

/// A symmetric window of an NCCL communicator ([`Nccl::register_window`]): one buffer of each of
/// this process's ranks, registered together with `ncclCommWindowRegister(…,
/// NCCL_WIN_COLL_SYMMETRIC)`, so that NCCL may run its symmetric-memory kernels on them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WindowId(pub u64);

impl fmt::Display for WindowId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "window {}", super::handles::handle_index(self.0))
    }
}

/// Collectives over several GPUs, and the compute they overlap with.
pub trait Collectives {
    /// Queues peerlink's all-reduce (`op`) of `len` bytes over `ranks` (2 to [`MAX_RANKS`], on
    /// distinct GPUs that all have peer access to each other): afterwards every rank's output holds
    /// the element-wise sum (or average) of every rank's input. `flags[i]` is rank `i`'s flag block
    /// ([`FLAG_BYTES`], memory of its GPU, zeroed once after allocation); the same ranks must use
    /// the same flags, in the same order, call after call, and the calls on one set of flags must
    /// run one after another on each GPU (queued on the same streams, or ordered by events). Inputs
    /// are not changed, but where [`AllReduceKernel::in_place`] allows a rank's output to be its own
    /// input (the same handle), in place. `len` is a whole number of elements, at
    /// most `kernel.max_len()`. Every rank's kernel waits for the others as `waiting` says.
    #[allow(clippy::too_many_arguments)] // what it reduces, how, where the ranks meet and how long
    fn all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        ranks: &[Rank],
        flags: &[BufferId],
        waiting: Waiting,
        len: usize,
    ) -> Result<()>;

    /// Queues this process's rank of peerlink's all-reduce across processes, one GPU each: the
    /// kernel of rank `rank` on `stream` (its GPU), which meets the other ranks' kernels, each queued
    /// by its own process with the same `kernel`, `dtype`, `op` and `len`, through their flag blocks.
    /// `ranks[i]` are rank `i`'s buffers: this rank's of its own GPU, every other's memory of that
    /// rank's GPU imported for this one. The kernel reads every rank's input (one-shot and
    /// two-shot) and writes this rank's output (two-shot: every rank's), or pushes packets into
    /// the peers' flag blocks (packets); so every rank's input, output and flags must be the
    /// buffers its own process passes for itself, call after call on the same flags, in order.
    /// Each rank's bytes are `len` from its offsets in its input and its output. As for [`Collectives::all_reduce`], an output may be its own input where the kernel allows.
    /// On a stream that captures a graph, the part is recorded: each replay's kernel meets the
    /// other ranks' kernels then, so every rank replays its graph as many times, in the order of
    /// its other calls on the same flags. On the simulator the call (or a replay) returns once every
    /// rank's process has queued its part (the processes meet through their shared flag files;
    /// each keeps its own virtual clock).
    /// The kernel waits for the others as `waiting` says (its release word is this process's).
    /// One rank (1 to `MAX_RANKS` ranks) sums with no one: its kernel runs all the same.
    #[allow(clippy::too_many_arguments)] // one rank's part: what it reduces, how, and where
    fn rank_all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        rank: usize,
        stream: StreamId,
        ranks: &[RankBuffers],
        waiting: Waiting,
        len: usize,
    ) -> Result<()>;

    /// Queues a kernel that keeps `stream`'s GPU busy for `duration_us` of GPU time: the stand-in
    /// for a model's compute that a workload overlaps its communication with. It runs one block of
    /// one warp per SM, so other kernels can still be scheduled beside it, as beside real compute.
    fn busy(&self, stream: StreamId, duration_us: f64) -> Result<()>;

    /// NCCL on this host, or one sentence saying why there is none (the library was not found, a
    /// simulator without a model of it).
    fn nccl(&self) -> std::result::Result<&dyn Nccl, String>;
}

/// NCCL, driven by one process for all its GPUs (`ncclCommInitAll`), or by one process per GPU
/// (`ncclCommInitRank`, [`Nccl::join_communicator`]); or the simulator's model of it, in one
/// process only. Every call queues the work of all of this process's ranks at once in one NCCL
/// group.
pub trait Nccl {
    /// What runs: NCCL's version and the library's path, or the simulator's model, in a few words.
    fn describe(&self) -> String;

    /// A communicator over `devices` (distinct GPUs, at least one): rank `i` on `devices[i]`.
    fn communicator(&self, devices: &[usize]) -> Result<CommId>;

    /// Releases a communicator; work already queued still runs.
    fn destroy_communicator(&self, comm: CommId) -> Result<()>;

    /// `ncclAllReduce` (sum) of `len` bytes on every rank: `ranks[i]` is the communicator's rank
    /// `i`, its stream on that rank's GPU. An output may be its own input (in place).
    fn all_reduce(&self, comm: CommId, dtype: DataType, ranks: &[Rank], len: usize) -> Result<()>;

    /// `ncclSend` / `ncclRecv` for every transfer, in one group: `streams[i]` runs rank `i`'s
    /// sends and receives. Sources are memory of the sender's GPU, destinations of the receiver's;
    /// destinations do not overlap. A transfer of 0 bytes moves nothing.
    fn send_recv(
        &self,
        comm: CommId,
        streams: &[StreamId],
        transfers: &[PeerTransfer],
    ) -> Result<()>;

    /// A fresh id for a communicator across processes (`ncclGetUniqueId`), made by one rank and
    /// given to every rank (this one too) for [`Nccl::join_communicator`]. The simulator refuses:
    /// its model of NCCL runs within one process.
    fn unique_id(&self) -> Result<UniqueId>;

    /// This process's rank of a communicator across processes (`ncclCommInitRank`): every one of
    /// the `rank.world` ranks calls it with the same `id`, each with its own rank, and it returns
    /// once all have. Rank `rank.rank` runs on GPU `rank.device`; [`Nccl::all_reduce`] takes the
    /// one rank, [`Nccl::rank_send_recv`] its point-to-point messages.
    fn join_communicator(&self, id: &UniqueId, rank: CommRank) -> Result<CommId>;

    /// `ncclSend` / `ncclRecv` for each of `ops`, in one group on `stream` (on the rank's GPU):
    /// this process's side of its rank's messages in a communicator made by
    /// [`Nccl::join_communicator`]. Each peer issues the matching side, in the same order. Buffers
    /// are memory of the rank's GPU; receive destinations do not overlap. A side of 0 bytes moves
    /// nothing.
    fn rank_send_recv(&self, comm: CommId, stream: StreamId, ops: &[PeerOp]) -> Result<()>;

    /// Whether this NCCL has symmetric windows (`ncclMemAlloc`, `ncclCommWindowRegister`,
    /// `ncclCommWindowDeregister`: NCCL 2.27 and newer), on which its all-reduce may run its
    /// symmetric-memory kernels — kernels that need no NVLink multicast, which stays off — or one
    /// sentence saying why not (an older NCCL, an environment that turns them off, a simulator
    /// without a model of those kernels).
    fn symmetric_windows(&self) -> std::result::Result<(), String>;

    /// `bytes` (> 0) of GPU `device` from `ncclMemAlloc`: cuMem memory at the granularity NCCL's
    /// windows need, device memory for every other call too, released with `ncclMemFree` once the
    /// buffer is freed and no window holds it. Fails where [`Nccl::symmetric_windows`] does.
    fn alloc_window_memory(&self, device: usize, bytes: usize) -> Result<BufferId>;

    /// Registers one symmetric window of `comm`: `buffers[i]` is this process's rank `i`'s, in the
    /// communicator's order (every rank of a communicator made here, in one NCCL group, as the
    /// registration is collective; the one rank of a joined communicator, whose every process
    /// registers its own). Each buffer comes from [`Nccl::alloc_window_memory`] on its rank's GPU,
    /// all of one length, none in another window. Not while a stream captures a graph: the
    /// registration maps memory. Register once and reuse: each registration takes NCCL address
    /// space of its own.
    fn register_window(&self, comm: CommId, buffers: &[BufferId]) -> Result<WindowId>;

    /// Deregisters a window (`ncclCommWindowDeregister` of every rank, in one group) once the work
    /// queued on its buffers has finished (the caller waits for it first); the buffers stay
    /// allocated until freed.
    fn deregister_window(&self, window: WindowId) -> Result<()>;

    /// `ncclAllReduce` (sum) as [`Nccl::all_reduce`], on buffers of symmetric windows: every
    /// rank's input is its buffer of one window of `comm`, and its output its buffer of one window
    /// (the same one, in place), so that every rank's bytes sit at the same offset of the same
    /// registration, as NCCL's symmetric kernels need.
    fn window_all_reduce(
        &self,
        comm: CommId,
        dtype: DataType,
        ranks: &[Rank],
        len: usize,
    ) -> Result<()>;
}

impl<B> PeerTransfer<B> {
    /// The same transfer, with each buffer replaced by `f`'s answer for it.
    pub fn map<C>(self, mut f: impl FnMut(B) -> C) -> PeerTransfer<C> {
        PeerTransfer {
            from: self.from,
            to: self.to,
            src: self.src.map(&mut f),
            dst: self.dst.map(&mut f),
        }
    }
}

impl<B> BufferRange<B> {
    /// The same range in `f`'s answer for the buffer.
    pub fn map<C>(self, f: impl FnOnce(B) -> C) -> BufferRange<C> {
        BufferRange {
            buffer: f(self.buffer),
            offset: self.offset,
            len: self.len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounding_to_bf16_is_to_nearest_ties_to_even() {
        assert_eq!(bf16_from_f32(1.0), 0x3f80);
        // Halfway between 1 and its successor 1 + 2^-7: to the even 1.
        assert_eq!(bf16_from_f32(1.0 + 1.0 / 256.0), 0x3f80);
        // Halfway between 1 + 2^-7 (odd) and 1 + 2^-6: up to the even one.
        assert_eq!(bf16_from_f32(1.0 + 3.0 / 256.0), 0x3f82);
        // Just above halfway rounds up.
        assert_eq!(bf16_from_f32(1.0 + 1.0 / 256.0 + 1.0 / 4096.0), 0x3f81);
        assert_eq!(bf16_from_f32(-2.0), 0xc000);
        assert_eq!(bf16_from_f32(f32::INFINITY), 0x7f80);
        assert_eq!(bf16_from_f32(f32::MAX), 0x7f80, "overflows to infinity");
        assert!(f32::from_bits(u32::from(bf16_from_f32(f32::NAN)) << 16).is_nan());
    }

    #[test]
    fn rounding_to_f16_is_to_nearest_ties_to_even_with_subnormals_and_infinity() {
        assert_eq!(f16_from_f32(1.0), 0x3c00);
        assert_eq!(f16_from_f32(-2.0), 0xc000);
        assert_eq!(f16_from_f32(0.0), 0x0000);
        assert_eq!(f16_from_f32(-0.0), 0x8000);
        // Halfway between 1 and 1 + 2^-10: to the even 1; between 1 + 2^-10 and 1 + 2^-9: up.
        assert_eq!(f16_from_f32(1.0 + 1.0 / 2048.0), 0x3c00);
        assert_eq!(f16_from_f32(1.0 + 3.0 / 2048.0), 0x3c02);
        assert_eq!(f16_from_f32(1.0 + 1.0 / 2048.0 + 1.0 / 65536.0), 0x3c01);
        assert_eq!(f16_from_f32(65504.0), 0x7bff, "the largest finite f16");
        assert_eq!(f16_from_f32(65519.0), 0x7bff);
        assert_eq!(f16_from_f32(65520.0), 0x7c00, "a tie to the even infinity");
        assert_eq!(f16_from_f32(f32::INFINITY), 0x7c00);
        assert_eq!(f16_from_f32(f32::NEG_INFINITY), 0xfc00);
        assert_eq!(f16_from_f32(2f32.powi(-14)), 0x0400, "the smallest normal");
        assert_eq!(
            f16_from_f32(2f32.powi(-24)),
            0x0001,
            "the smallest subnormal"
        );
        assert_eq!(
            f16_from_f32(2f32.powi(-25)),
            0x0000,
            "half of it: a tie to the even zero"
        );
        assert_eq!(f16_from_f32(1.5 * 2f32.powi(-25)), 0x0001);
        assert_eq!(
            f16_from_f32(1.5 * 2f32.powi(-24)),
            0x0002,
            "1.5 subnormals: to even 2"
        );
        assert_eq!(
            f16_from_f32(2f32.powi(-14) - 2f32.powi(-25)),
            0x0400,
            "up to normal"
        );
        assert_eq!(f16_from_f32(1e-10), 0x0000);
        assert!(f16_to_f32(f16_from_f32(f32::NAN)).is_nan());
    }

    #[test]
    fn every_f16_widens_exactly_and_rounds_back_to_itself() {
        for half in 0..=u16::MAX {
            let x = f16_to_f32(half);
            if x.is_nan() {
                assert_eq!(half & 0x7c00, 0x7c00, "{half:#06x}");
                assert!(f16_to_f32(f16_from_f32(x)).is_nan());
                continue;
            }
            assert_eq!(f16_from_f32(x), half, "{half:#06x} = {x}");
        }
        assert_eq!(f16_to_f32(0x3555), 0.333_251_95);
        assert_eq!(f16_to_f32(0x0001), 2f32.powi(-24));
        assert_eq!(f16_to_f32(0x7bff), 65504.0);
        assert_eq!(f16_to_f32(0xfc00), f32::NEG_INFINITY);
    }

    #[test]
    fn elements_read_and_round_through_f32() {
        for dtype in [DataType::F32, DataType::Bf16, DataType::F16] {
            let mut out = Vec::new();
            dtype.push_rounded(-3.5, &mut out);
            assert_eq!(out.len(), dtype.size());
            assert_eq!(dtype.to_f32(&out), -3.5, "{dtype}");
        }
    }
}
