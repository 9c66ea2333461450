//! The checked layer's collectives: peerlink's all-reduce, the stand-in compute kernel, and NCCL
//! with its communicators.
//!
//! Beside the checks every call makes (live handles, ranges inside buffers), a collective's ranks
//! are one per GPU, each rank's buffers are memory of its stream's GPU, and the ranks' streams
//! either all capture a graph or none does: the ranks' kernels wait for each other, so a part
//! recorded into a graph and a part queued now would meet only when the graph is replayed.

use super::{check_range, BufferEntry, Checked, State, Toucher};
use crate::backend::collective::{
    AllReduceKernel, BufferRange, CommId, CommRank, DataType, PeerOp, PeerTransfer, Rank,
    RankBuffers, Reduction, UniqueId, Waiting, WindowId, FLAG_BYTES, MAX_RANKS, RELEASE_WORD_BYTES,
};
use crate::backend::raw::{RawBackend, RawCollectives, RawProbes, RawRank, RawRankBuffers};
use crate::backend::{first_overlap, BufferId, Collectives, Memory, Nccl, StreamId};
use crate::{Error, Result};
use std::sync::Arc;

/// A communicator: its GPUs, rank by rank, and the implementation's object (shared with calls in
/// flight, so that the table's lock is not held across them).
pub(super) struct CommEntry<C> {
    /// This process's ranks' GPUs, in rank order: every rank of a communicator made in one
    /// process, the one rank of a joined one.
    devices: Vec<usize>,
    /// For a communicator across processes ([`Nccl::join_communicator`]): this process's rank.
    joined: Option<CommRank>,
    pub(super) raw: Arc<C>,
}

/// A symmetric window: its communicator, each rank's buffer, and the implementation's object.
pub(super) struct WindowEntry<I: RawCollectives> {
    pub(super) comm: CommId,
    /// Rank `i`'s buffer at `i`.
    buffers: Vec<BufferId>,
    /// The buffers' memory, held until the window is deregistered: NCCL maps it meanwhile, so a
    /// buffer freed first keeps its memory until then.
    _memory: Vec<I::Buffer>,
    pub(super) raw: I::Window,
}

/// One rank of a collective, checked: its GPU and the implementation's objects.
struct Resolved<I: RawBackend> {
    device: usize,
    stream: I::Stream,
    input: I::Buffer,
    output: I::Buffer,
}

impl<I: RawBackend> Resolved<I> {
    fn raw(&self) -> RawRank<'_, I> {
        RawRank {
            stream: &self.stream,
            input: &self.input,
            output: &self.output,
        }
    }
}

/// Fails unless `buffer` is memory of `device`, the GPU of whoever (`whose`) uses it. `what` and
/// `whose` are formatted only for a buffer that fails: this runs for every buffer of every call
/// (of every `all_reduce_` of the Python package), so callers pass `format_args!`.
fn on_gpu(
    call: &str,
    what: impl std::fmt::Display,
    buffer: BufferId,
    memory: Memory,
    device: usize,
    whose: impl std::fmt::Display,
) -> Result<()> {
    if memory == Memory::Device(device) {
        return Ok(());
    }
    Err(Error::usage(format!(
        "{call}: {what} ({buffer}) is {memory}, but {whose} on GPU {device}: use memory of GPU \
         {device}"
    )))
}

/// A wait's release word, checked: pinned host memory of at least [`RELEASE_WORD_BYTES`], which
/// the host writes while the kernels read it.
fn check_waiting<I: RawCollectives>(
    st: &State<I>,
    call: &str,
    waiting: Waiting,
) -> Result<Waiting<I::Buffer>> {
    let Waiting::Released(word) = waiting else {
        return Ok(Waiting::Bounded);
    };
    let entry = st.buffers.get(word.0)?;
    if !matches!(entry.memory, Memory::PinnedHost { .. }) || entry.len < RELEASE_WORD_BYTES {
        return Err(Error::usage(format!(
            "{call}: the release word ({word}) is {} bytes of {}: it must be at least \
             {RELEASE_WORD_BYTES} bytes of pinned host memory, which the host raises while the \
             kernels wait",
            entry.len, entry.memory
        )));
    }
    Ok(Waiting::Released(entry.raw.clone()))
}

/// The release word's buffer, where there is one.
fn waiting_word(waiting: Waiting) -> Option<BufferId> {
    match waiting {
        Waiting::Released(word) => Some(word),
        Waiting::Bounded => None,
    }
}

/// One range a send or receive names: memory of the GPU that runs it (`whose` says who), inside
/// its buffer; its buffer noted once in `found` with the implementation's object. The sentences
/// are formatted only for an error, as [`on_gpu`]'s are: these checks run at every NCCL send/recv.
fn check_peer_range<B: Clone>(
    call: &str,
    what: std::fmt::Arguments<'_>,
    whose: std::fmt::Arguments<'_>,
    range: BufferRange,
    entry: &BufferEntry<B>,
    device: usize,
    found: &mut Vec<(BufferId, B)>,
) -> Result<()> {
    on_gpu(call, what, range.buffer, entry.memory, device, whose)?;
    check_range(
        format_args!("{call}: {what}"),
        range.buffer,
        entry.len,
        range.offset,
        range.len,
    )?;
    if !found.iter().any(|(b, _)| *b == range.buffer) {
        found.push((range.buffer, entry.raw.clone()));
    }
    Ok(())
}

/// Fails unless `len` is at least one whole `dtype` element and a whole number of them.
fn check_length(call: &str, dtype: DataType, len: usize) -> Result<()> {
    let size = dtype.size();
    if len == 0 {
        return Err(Error::usage(format!(
            "{call} of 0 bytes: pass a length of at least one {dtype} element ({size} bytes)"
        )));
    }
    if !len.is_multiple_of(size) {
        return Err(Error::usage(format!(
            "{call} of {len} bytes is not a whole number of {dtype} elements ({size} bytes each): \
             pass a multiple of {size}"
        )));
    }
    Ok(())
}

/// What one process's call of [`Collectives::rank_all_reduce`] is: the checks of every rank's
/// buffers name it.
struct RankCall<'a> {
    call: &'a str,
    kernel: AllReduceKernel,
    /// This process's rank, its stream and the stream's GPU.
    rank: usize,
    stream: StreamId,
    device: usize,
    len: usize,
}

/// Fails unless a call across processes has 2 to [`MAX_RANKS`] ranks, this process's `rank` among
/// them, and a length the kernel takes.
fn check_rank_call(
    call: &str,
    kernel: AllReduceKernel,
    dtype: DataType,
    rank: usize,
    n: usize,
    len: usize,
) -> Result<()> {
    // One rank sums with no one: its kernel still runs (the NCCL-API library serves a
    // communicator of one rank with it, as NCCL runs its own for one).
    if !(1..=MAX_RANKS).contains(&n) {
        return Err(Error::usage(format!(
            "{call} over {n} rank(s): peerlink's all-reduce across processes takes 1 to \
             {MAX_RANKS} ranks, one per GPU"
        )));
    }
    if rank >= n {
        return Err(Error::usage(format!(
            "{call}: rank {rank} of {n} ranks: this process's rank is 0 to {}",
            n - 1
        )));
    }
    if len > kernel.max_len() {
        return Err(Error::usage(format!(
            "{call} of {len} bytes: this kernel takes at most {} bytes (PACKET_MAX_BYTES); \
             use one-shot or two-shot for larger buffers",
            kernel.max_len()
        )));
    }
    check_length(call, dtype, len)
}

impl<I: RawProbes + RawCollectives> Checked<I> {
    /// Checks rank `i`'s buffers — device memory of one GPU that no earlier rank (`gpus`) has,
    /// this process's on its stream's GPU, flags apart from the data, each range inside its
    /// buffer, the other ranks' reachable by this process's kernel — and resolves them (input,
    /// output, flags) with their GPU.
    fn resolve_rank_buffers(
        &self,
        st: &State<I>,
        this: &RankCall<'_>,
        i: usize,
        buffers: &RankBuffers,
        gpus: &[usize],
    ) -> Result<(usize, [I::Buffer; 3])> {
        let RankCall {
            call,
            kernel,
            rank,
            stream,
            device,
            len,
        } = *this;
        let whose = format_args!("rank {i}'s");
        let input = st.buffers.get(buffers.input.0)?;
        let Memory::Device(gpu) = input.memory else {
            return Err(Error::usage(format!(
                "{call}: {whose} input ({}) is {}: every rank's buffers are device memory of \
                 its GPU",
                buffers.input, input.memory
            )));
        };
        if i == rank && gpu != device {
            return Err(Error::usage(format!(
                "{call}: this process's rank {rank} has its input on GPU {gpu} but its stream \
                 ({stream}) on GPU {device}: queue it on a stream of GPU {gpu}"
            )));
        }
        if let Some(j) = gpus.iter().position(|&d| d == gpu) {
            return Err(Error::usage(format!(
                "{call}: ranks {j} and {i} both have their buffers on GPU {gpu}: each rank \
                 needs a GPU of its own"
            )));
        }
        if i == rank && buffers.output == buffers.input && !kernel.in_place() {
            return Err(Error::usage(format!(
                "{call}: rank {i}'s output is its input ({}): the {} kernel reads every \
                 rank's input while the outputs are written; give it an output of its own, \
                 or use two-shot or packets, which reduce in place",
                buffers.input,
                kernel.name()
            )));
        }
        if buffers.flags == buffers.input || buffers.flags == buffers.output {
            return Err(Error::usage(format!(
                "{call}: {whose} flags ({}) are also its input or output: the kernels keep \
                 their counters in the flags; give them a buffer of their own",
                buffers.flags
            )));
        }
        let resolve = |name: &str, id: BufferId, offset: usize, len: usize| -> Result<I::Buffer> {
            let entry = st.buffers.get(id.0)?;
            on_gpu(
                call,
                format_args!("{whose} {name}"),
                id,
                entry.memory,
                gpu,
                format_args!("rank {i}'s input is"),
            )?;
            check_range(
                format_args!("{call}: {whose} {name}"),
                id,
                entry.len,
                offset,
                len,
            )?;
            if i != rank {
                let toucher = Toucher::Kernel("an all-reduce kernel");
                self.check_reach(st, device, id, entry, toucher)?;
            }
            Ok(entry.raw.clone())
        };
        let input = resolve("input", buffers.input, buffers.input_offset, len)?;
        let output = resolve("output", buffers.output, buffers.output_offset, len)?;
        let flags = resolve("flags", buffers.flags, 0, FLAG_BYTES)?;
        Ok((gpu, [input, output, flags]))
    }
}

impl<I: RawCollectives> Checked<I> {
    /// Checks what every collective over ranks asks — a whole number of elements, one GPU per
    /// rank, each rank's buffers on its GPU and long enough, the streams capturing all or none —
    /// and resolves each rank's handles.
    fn check_ranks(
        &self,
        st: &State<I>,
        call: &str,
        dtype: DataType,
        ranks: &[Rank],
        len: usize,
    ) -> Result<Vec<Resolved<I>>> {
        check_length(call, dtype, len)?;
        let mut resolved: Vec<Resolved<I>> = Vec::with_capacity(ranks.len());
        for (i, rank) in ranks.iter().enumerate() {
            let stream = st.streams.get(rank.stream.0)?;
            let device = stream.device;
            if let Some(j) = resolved.iter().position(|r| r.device == device) {
                return Err(Error::usage(format!(
                    "{call}: ranks {j} and {i} both run on GPU {device}: each rank needs a GPU of \
                     its own"
                )));
            }
            let buffer = |name: &str, id: BufferId| -> Result<I::Buffer> {
                let entry = st.buffers.get(id.0)?;
                on_gpu(
                    call,
                    format_args!("rank {i}'s {name}"),
                    id,
                    entry.memory,
                    device,
                    format_args!("rank {i} runs"),
                )?;
                let what = format_args!("{call}: rank {i}'s {name}");
                check_range(what, id, entry.len, 0, len)?;
                Ok(entry.raw.clone())
            };
            let (input, output) = (buffer("input", rank.input)?, buffer("output", rank.output)?);
            resolved.push(Resolved {
                device,
                stream: stream.raw.clone(),
                input,
                output,
            });
        }
        Self::check_capture(st, call, ranks.iter().map(|r| r.stream))?;
        Ok(resolved)
    }

    /// Fails unless the streams of one collective all capture a graph or none does.
    fn check_capture(
        st: &State<I>,
        call: &str,
        streams: impl Iterator<Item = StreamId>,
    ) -> Result<()> {
        let mut first: Option<(StreamId, bool)> = None;
        for stream in streams {
            let captures = st.streams.get(stream.0)?.capture.is_some();
            match first {
                None => first = Some((stream, captures)),
                Some((other, theirs)) if theirs != captures => {
                    let (yes, no) = if captures {
                        (stream, other)
                    } else {
                        (other, stream)
                    };
                    return Err(Error::usage(format!(
                        "{call}: {yes} captures a graph but {no} does not: the ranks' kernels \
                         wait for each other, so a part recorded into a graph would meet the \
                         others only when the graph is replayed; capture every rank's stream or \
                         none"
                    )));
                }
                Some(_) => {}
            }
        }
        Ok(())
    }

    /// Notes every buffer of a collective on each of its streams that captures a graph: a
    /// rank's kernel touches the other ranks' buffers too.
    fn note_collective(st: &mut State<I>, streams: &[StreamId], buffers: &[BufferId]) {
        for &stream in streams {
            Self::note_capture(st, stream, buffers.iter().copied());
        }
    }

    /// NCCL's description, or why there is none, asked of the implementation the first time.
    fn nccl_answer(&self) -> &std::result::Result<String, String> {
        self.nccl.get_or_init(|| self.raw.nccl_open())
    }

    /// Fails unless NCCL was found, saying why not.
    fn nccl_opened(&self) -> Result<()> {
        match self.nccl_answer() {
            Ok(_) => Ok(()),
            Err(why) => Err(Error::usage(format!(
                "NCCL is not available here ({why}): ask collectives().nccl() first and leave \
                 NCCL out where it answers Err"
            ))),
        }
    }

    /// Whether NCCL has symmetric windows, asked of the implementation the first time (after NCCL
    /// itself).
    fn symmetric_answer(&self) -> std::result::Result<(), String> {
        if let Err(why) = self.nccl_answer() {
            return Err(why.clone());
        }
        self.symmetric
            .get_or_init(|| self.raw.nccl_symmetric())
            .clone()
    }

    /// Fails unless NCCL has symmetric windows, saying why not.
    fn symmetric_opened(&self) -> Result<()> {
        self.symmetric_answer().map_err(|why| {
            Error::usage(format!(
                "NCCL's symmetric windows are not available here ({why}): ask \
                 Nccl::symmetric_windows first and leave them out where it answers Err"
            ))
        })
    }

    /// Fails unless every rank's `buffers` entry (their inputs, or outputs: `what`) is that rank's
    /// buffer of one window of `comm`: one registration, so one offset on every rank.
    fn check_in_window(
        st: &State<I>,
        comm: CommId,
        what: &str,
        buffers: impl Iterator<Item = BufferId>,
    ) -> Result<()> {
        let mut window: Option<&WindowEntry<I>> = None;
        for (i, buffer) in buffers.enumerate() {
            let found = match window {
                Some(entry) => (entry.buffers.get(i) == Some(&buffer)).then_some(entry),
                None => st
                    .windows
                    .iter()
                    .find(|w| w.comm == comm && w.buffers.first() == Some(&buffer)),
            };
            let Some(entry) = found else {
                return Err(Error::usage(format!(
                    "NCCL all-reduce in windows: rank {i}'s {what} ({buffer}) is not its buffer \
                     of a window of {comm} that holds every rank's {what}: register one buffer \
                     per rank in one window (Nccl::register_window) and pass them in rank order"
                )));
            };
            window = Some(entry);
        }
        Ok(())
    }

    /// A live communicator's GPUs and object.
    fn comm(st: &State<I>, comm: CommId) -> Result<(Vec<usize>, Arc<I::Comm>)> {
        let entry = st.comms.get(comm.0)?;
        Ok((entry.devices.clone(), Arc::clone(&entry.raw)))
    }

    /// Adds a communicator made by the implementation to the table.
    fn adopt_comm(
        &self,
        devices: Vec<usize>,
        joined: Option<CommRank>,
        raw: I::Comm,
    ) -> Result<CommId> {
        let entry = CommEntry {
            devices,
            joined,
            raw: Arc::new(raw),
        };
        self.lock().comms.insert(entry).map(CommId)
    }
}

impl<I: RawProbes + RawCollectives> Collectives for Checked<I> {
    fn all_reduce(
        &self,
        kernel: AllReduceKernel,
        dtype: DataType,
        op: Reduction,
        ranks: &[Rank],
        flags: &[BufferId],
        waiting: Waiting,
        len: usize,
    ) -> Result<()> {
        let call = format!("all-reduce ({})", kernel.name());
        let n = ranks.len();
        if !(2..=MAX_RANKS).contains(&n) {
            return Err(Error::usage(format!(
                "{call} over {n} rank(s): peerlink's all-reduce kernels take 2 to {MAX_RANKS} \
                 ranks, one per GPU"
            )));
        }
        if flags.len() != n {
            return Err(Error::usage(format!(
                "{call}: {} flag blocks for {n} ranks: pass one per rank, in rank order",
                flags.len()
            )));
        }
        if len > kernel.max_len() {
            return Err(Error::usage(format!(
                "{call} of {len} bytes: this kernel takes at most {} bytes (PACKET_MAX_BYTES), \
                 what its receive area holds; use one-shot or two-shot for larger buffers",
                kernel.max_len()
            )));
        }
        let mut st = self.lock();
        let resolved = self.check_ranks(&st, &call, dtype, ranks, len)?;
        let mut raw_flags = Vec::with_capacity(n);
        for (i, (rank, &flag)) in ranks.iter().zip(flags).enumerate() {
            if rank.output == rank.input && !kernel.in_place() {
                return Err(Error::usage(format!(
                    "{call}: rank {i}'s output is its input ({}): the {} kernel reads every \
                     peer's input while it writes the outputs; give each rank an output buffer of \
                     its own, or use two-shot or packets, which reduce in place",
                    rank.input,
                    kernel.name()
                )));
            }
            if flag == rank.input || flag == rank.output {
                return Err(Error::usage(format!(
                    "{call}: flags[{i}] ({flag}) is also rank {i}'s input or output: the kernels \
                     keep their counters in the flags; give them a buffer of their own"
                )));
            }
            let entry = st.buffers.get(flag.0)?;
            let device = resolved[i].device;
            on_gpu(
                &call,
                format_args!("flags[{i}]"),
                flag,
                entry.memory,
                device,
                format_args!("rank {i} runs"),
            )?;
            if entry.len < FLAG_BYTES {
                return Err(Error::usage(format!(
                    "{call}: flags[{i}] ({flag}) holds {} bytes, fewer than a flag block's \
                     {FLAG_BYTES}: allocate FLAG_BYTES for each rank and zero them once",
                    entry.len
                )));
            }
            raw_flags.push(entry.raw.clone());
        }
        // Each rank's kernel loads from and stores to the other ranks' buffers and flags.
        let kernel_reach = Toucher::Kernel("an all-reduce kernel");
        for (i, a) in resolved.iter().enumerate() {
            for (j, _) in resolved.iter().enumerate().filter(|&(j, _)| j != i) {
                let input = ranks[j].input;
                let entry = st.buffers.get(input.0)?;
                self.check_reach(&st, a.device, input, entry, kernel_reach)?;
            }
        }
        let streams: Vec<StreamId> = ranks.iter().map(|r| r.stream).collect();
        let buffers: Vec<BufferId> = ranks
            .iter()
            .flat_map(|r| [r.input, r.output])
            .chain(flags.iter().copied())
            .collect();
        let word = check_waiting(&st, &call, waiting)?;
        Self::note_collective(&mut st, &streams, &buffers);
        drop(st);
        let raw_ranks: Vec<RawRank<'_, I>> = resolved.iter().map(Resolved::raw).collect();
        let raw_flags: Vec<&I::Buffer> = raw_flags.iter().collect();
        self.raw.all_reduce(
            kernel,
            dtype,
            op,
            &raw_ranks,
            &raw_flags,
            word.as_ref(),
            len,
        )
    }

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
    ) -> Result<()> {
        let call = format!("all-reduce across processes ({})", kernel.name());
        check_rank_call(&call, kernel, dtype, rank, ranks.len(), len)?;
        let mut st = self.lock();
        let (device, raw_stream) = self.stream(&st, stream)?;
        let mut raw: Vec<(usize, [I::Buffer; 3])> = Vec::with_capacity(ranks.len());
        for (i, buffers) in ranks.iter().enumerate() {
            let this = RankCall {
                call: &call,
                kernel,
                rank,
                stream,
                device,
                len,
            };
            let gpus: Vec<usize> = raw.iter().map(|(gpu, _)| *gpu).collect();
            raw.push(self.resolve_rank_buffers(&st, &this, i, buffers, &gpus)?);
        }
        let word = check_waiting(&st, &call, waiting)?;
        // A capture's replays use every buffer: the graph keeps them from being freed first.
        let used = ranks.iter().flat_map(|r| [r.input, r.output, r.flags]);
        Self::note_capture(&mut st, stream, used.chain(waiting_word(waiting)));
        drop(st);
        let raw_ranks: Vec<RawRankBuffers<'_, I>> = raw
            .iter()
            .zip(ranks)
            .map(
                |((device, [input, output, flags]), buffers)| RawRankBuffers {
                    device: *device,
                    input,
                    output,
                    input_offset: buffers.input_offset,
                    output_offset: buffers.output_offset,
                    flags,
                },
            )
            .collect();
        self.raw.rank_all_reduce(
            kernel,
            dtype,
            op,
            rank,
            &raw_stream,
            &raw_ranks,
            word.as_ref(),
            len,
        )
    }

    fn busy(&self, stream: StreamId, duration_us: f64) -> Result<()> {
        let (_, raw_stream) = self.stream(&self.lock(), stream)?;
        if !(duration_us.is_finite() && duration_us >= 0.0) {
            return Err(Error::usage(format!(
                "busy for {duration_us} µs: pass a finite duration of 0 µs or more"
            )));
        }
        self.raw.busy(&raw_stream, duration_us)
    }

    fn nccl(&self) -> std::result::Result<&dyn Nccl, String> {
        match self.nccl_answer() {
            Ok(_) => Ok(self),
            Err(why) => Err(why.clone()),
        }
    }
}

impl<I: RawProbes + RawCollectives> Nccl for Checked<I> {
    fn describe(&self) -> String {
        match self.nccl_answer() {
            Ok(description) => description.clone(),
            Err(why) => format!("no NCCL: {why}"),
        }
    }

    fn communicator(&self, devices: &[usize]) -> Result<CommId> {
        self.nccl_opened()?;
        if devices.is_empty() {
            return Err(Error::usage(
                "an NCCL communicator needs at least one GPU: name the GPUs of its ranks",
            ));
        }
        for (i, &device) in devices.iter().enumerate() {
            self.check_device(device)?;
            if devices[..i].contains(&device) {
                return Err(Error::usage(format!(
                    "an NCCL communicator over GPUs {devices:?} names GPU {device} twice: a \
                     communicator has one rank per GPU"
                )));
            }
        }
        let raw = self.raw.nccl_communicator(devices)?;
        self.adopt_comm(devices.to_vec(), None, raw)
    }

    fn destroy_communicator(&self, comm: CommId) -> Result<()> {
        let raw = {
            let mut st = self.lock();
            // Calls clone the object only under this lock, so a count of one stays one.
            if st.windows.iter().any(|w| w.comm == comm) {
                return Err(Error::usage(format!(
                    "{comm} still has symmetric windows: deregister them first \
                     (Nccl::deregister_window), which NCCL does through the communicator"
                )));
            }
            if Arc::strong_count(&st.comms.get(comm.0)?.raw) > 1 {
                return Err(Error::usage(format!(
                    "{comm} is in use by a call on another thread: NCCL communicators take one \
                     call at a time; destroy it once the call has returned"
                )));
            }
            st.comms.remove(comm.0)?.raw
        };
        let raw = Arc::into_inner(raw).expect("the table held the only reference");
        self.raw.nccl_destroy(raw)
    }

    fn all_reduce(&self, comm: CommId, dtype: DataType, ranks: &[Rank], len: usize) -> Result<()> {
        let call = "NCCL all-reduce";
        let mut st = self.lock();
        let (devices, raw_comm) = Self::comm(&st, comm)?;
        if ranks.len() != devices.len() {
            return Err(Error::usage(format!(
                "{call}: {comm} spans GPUs {devices:?}, one rank each, but {} ranks were passed: \
                 pass one rank per GPU of the communicator, in its order",
                ranks.len()
            )));
        }
        for (i, (rank, &device)) in ranks.iter().zip(&devices).enumerate() {
            let on = st.streams.get(rank.stream.0)?.device;
            if on != device {
                return Err(Error::usage(format!(
                    "{call}: rank {i} of {comm} is GPU {device}, but its stream ({}) runs on GPU \
                     {on}: pass the ranks in the communicator's order",
                    rank.stream
                )));
            }
        }
        let resolved = self.check_ranks(&st, call, dtype, ranks, len)?;
        let streams: Vec<StreamId> = ranks.iter().map(|r| r.stream).collect();
        let buffers: Vec<BufferId> = ranks.iter().flat_map(|r| [r.input, r.output]).collect();
        Self::note_collective(&mut st, &streams, &buffers);
        drop(st);
        let raw_ranks: Vec<RawRank<'_, I>> = resolved.iter().map(Resolved::raw).collect();
        self.raw.nccl_all_reduce(&raw_comm, dtype, &raw_ranks, len)
    }

    fn send_recv(
        &self,
        comm: CommId,
        streams: &[StreamId],
        transfers: &[PeerTransfer],
    ) -> Result<()> {
        let call = "NCCL send/recv";
        let mut st = self.lock();
        if let Some(CommRank { rank, world, .. }) = st.comms.get(comm.0)?.joined {
            return Err(Error::usage(format!(
                "{call}: {comm} is rank {rank} of {world} processes, whose peers issue their own \
                 sides: pass this rank's sends and receives to rank_send_recv"
            )));
        }
        let (devices, raw_comm) = Self::comm(&st, comm)?;
        let n = devices.len();
        if streams.len() != n {
            return Err(Error::usage(format!(
                "{call}: {comm} spans GPUs {devices:?}, one rank each, but {} streams were \
                 passed: pass one stream per rank, in the communicator's order",
                streams.len()
            )));
        }
        let mut raw_streams = Vec::with_capacity(n);
        for (i, (&stream, &device)) in streams.iter().zip(&devices).enumerate() {
            let entry = st.streams.get(stream.0)?;
            if entry.device != device {
                return Err(Error::usage(format!(
                    "{call}: rank {i} of {comm} is GPU {device}, but its stream ({stream}) runs \
                     on GPU {}: pass the streams in the communicator's order",
                    entry.device
                )));
            }
            raw_streams.push(entry.raw.clone());
        }
        Self::check_capture(&st, call, streams.iter().copied())?;
        // Each buffer the transfers name, once, with the implementation's object.
        let mut found: Vec<(BufferId, I::Buffer)> = Vec::new();
        for (k, t) in transfers.iter().enumerate() {
            for rank in [t.from, t.to] {
                if rank >= n {
                    return Err(Error::usage(format!(
                        "{call}: transfer {k} names rank {rank}, but {comm} has ranks 0 to {}",
                        n - 1
                    )));
                }
            }
            if t.from == t.to {
                return Err(Error::usage(format!(
                    "{call}: transfer {k} sends from rank {} to itself: NCCL pairs a send with \
                     another rank's receive; copy within the GPU instead",
                    t.from
                )));
            }
            if t.src.len != t.dst.len {
                return Err(Error::usage(format!(
                    "{call}: transfer {k} sends {} bytes into a {}-byte destination: a send and \
                     its receive have one length",
                    t.src.len, t.dst.len
                )));
            }
            let sides = [
                (t.src, "source", t.from, "sender"),
                (t.dst, "destination", t.to, "receiver"),
            ];
            for (range, name, rank, role) in sides {
                check_peer_range(
                    call,
                    format_args!("transfer {k}'s {name}"),
                    format_args!("its {role}, rank {rank}, runs"),
                    range,
                    st.buffers.get(range.buffer.0)?,
                    devices[rank],
                    &mut found,
                )?;
            }
        }
        let destinations = transfers
            .iter()
            .filter(|t| t.dst.len > 0)
            .map(|t| (t.dst.buffer, t.dst.offset, t.dst.offset + t.dst.len));
        if let Some((a, b)) = first_overlap(destinations) {
            return Err(Error::usage(format!(
                "{call}: two transfers write overlapping bytes of one buffer (offsets {a} and \
                 {b}); NCCL runs them in any order, so give them disjoint destinations"
            )));
        }
        let buffers: Vec<BufferId> = found.iter().map(|(b, _)| *b).collect();
        Self::note_collective(&mut st, streams, &buffers);
        drop(st);
        // A transfer of 0 bytes moves nothing, as a copy of 0 bytes queues nothing.
        let raw_of = |id: BufferId| &found.iter().find(|(b, _)| *b == id).expect("found").1;
        let raw_transfers: Vec<PeerTransfer<&I::Buffer>> = transfers
            .iter()
            .filter(|t| t.src.len > 0)
            .map(|t| t.map(raw_of))
            .collect();
        if raw_transfers.is_empty() {
            return Ok(());
        }
        let raw_streams: Vec<&I::Stream> = raw_streams.iter().collect();
        self.raw
            .nccl_send_recv(&raw_comm, &raw_streams, &raw_transfers)
    }

    fn unique_id(&self) -> Result<UniqueId> {
        self.nccl_opened()?;
        self.raw.nccl_unique_id()
    }

    fn join_communicator(&self, id: &UniqueId, rank: CommRank) -> Result<CommId> {
        self.nccl_opened()?;
        let CommRank {
            rank: index,
            world,
            device,
        } = rank;
        if index >= world {
            return Err(Error::usage(format!(
                "rank {index} of an NCCL communicator of {world} ranks: give each process a rank \
                 from 0 to {}",
                world.saturating_sub(1)
            )));
        }
        self.check_device(device)?;
        let raw = self.raw.nccl_join(id, rank)?;
        self.adopt_comm(vec![device], Some(rank), raw)
    }

    fn symmetric_windows(&self) -> std::result::Result<(), String> {
        self.symmetric_answer()
    }

    fn alloc_window_memory(&self, device: usize, bytes: usize) -> Result<BufferId> {
        self.symmetric_opened()?;
        self.check_device(device)?;
        if bytes == 0 {
            return Err(Error::usage("cannot allocate a buffer of 0 bytes"));
        }
        let raw = self.raw.nccl_alloc(device, bytes)?;
        let memory = Memory::Device(device);
        self.insert_buffer(raw, memory, bytes, super::sharing::Origin::Nccl)
    }

    fn register_window(&self, comm: CommId, buffers: &[BufferId]) -> Result<WindowId> {
        self.symmetric_opened()?;
        let call = "NCCL window registration";
        let st = self.lock();
        let (devices, raw_comm) = Self::comm(&st, comm)?;
        if buffers.len() != devices.len() {
            return Err(Error::usage(format!(
                "{call}: {comm} has {} rank(s) in this process (GPUs {devices:?}), but {} \
                 buffers were passed: pass one per rank, in the communicator's order",
                devices.len(),
                buffers.len()
            )));
        }
        if let Some(stream) = st.streams.iter().find(|s| s.capture.is_some()) {
            return Err(Error::usage(format!(
                "{call}: a stream of GPU {} captures a graph, and registering maps memory, \
                 which no capture allows: register the windows before capturing",
                stream.device
            )));
        }
        let mut memory = Vec::with_capacity(buffers.len());
        for (i, (&buffer, &device)) in buffers.iter().zip(&devices).enumerate() {
            let entry = st.buffers.get(buffer.0)?;
            if entry.origin != super::sharing::Origin::Nccl {
                return Err(Error::usage(format!(
                    "{call}: rank {i}'s {buffer} is not NCCL's memory: NCCL's symmetric windows \
                     need memory from ncclMemAlloc; allocate it with Nccl::alloc_window_memory"
                )));
            }
            on_gpu(
                call,
                format_args!("rank {i}'s buffer"),
                buffer,
                entry.memory,
                device,
                format_args!("rank {i} runs"),
            )?;
            if entry.len != st.buffers.get(buffers[0].0)?.len {
                return Err(Error::usage(format!(
                    "{call}: rank {i}'s {buffer} holds {} bytes, rank 0's {}: a window has one \
                     length on every rank",
                    entry.len,
                    st.buffers.get(buffers[0].0)?.len
                )));
            }
            if st.windows.iter().any(|w| w.buffers.contains(&buffer)) {
                return Err(Error::usage(format!(
                    "{call}: {buffer} is in a window already: register a buffer once and reuse \
                     the window (each registration takes NCCL address space of its own)"
                )));
            }
            memory.push(entry.raw.clone());
        }
        let bytes = st.buffers.get(buffers[0].0)?.len;
        drop(st);
        let refs: Vec<&I::Buffer> = memory.iter().collect();
        let raw = self.raw.nccl_register_window(&raw_comm, &refs, bytes)?;
        let entry = WindowEntry {
            comm,
            buffers: buffers.to_vec(),
            _memory: memory,
            raw,
        };
        self.lock().windows.insert(entry).map(WindowId)
    }

    fn deregister_window(&self, window: WindowId) -> Result<()> {
        let (entry, raw_comm) = {
            let mut st = self.lock();
            let comm = st.windows.get(window.0)?.comm;
            let (_, raw_comm) = Self::comm(&st, comm)?;
            (st.windows.remove(window.0)?, raw_comm)
        };
        self.raw.nccl_deregister_window(&raw_comm, entry.raw)
    }

    fn window_all_reduce(
        &self,
        comm: CommId,
        dtype: DataType,
        ranks: &[Rank],
        len: usize,
    ) -> Result<()> {
        {
            let st = self.lock();
            Self::check_in_window(&st, comm, "input", ranks.iter().map(|r| r.input))?;
            Self::check_in_window(&st, comm, "output", ranks.iter().map(|r| r.output))?;
        }
        Nccl::all_reduce(self, comm, dtype, ranks, len)
    }

    fn rank_send_recv(&self, comm: CommId, stream: StreamId, ops: &[PeerOp]) -> Result<()> {
        let call = "NCCL send/recv";
        let mut st = self.lock();
        let Some(CommRank {
            rank,
            world,
            device,
        }) = st.comms.get(comm.0)?.joined
        else {
            return Err(Error::usage(format!(
                "{call}: {comm} was made in this process for all its ranks: pass the transfers \
                 of every rank to send_recv; rank_send_recv is for a rank of a communicator \
                 across processes (join_communicator)"
            )));
        };
        let (_, raw_comm) = Self::comm(&st, comm)?;
        let (on, raw_stream) = self.stream(&st, stream)?;
        if on != device {
            return Err(Error::usage(format!(
                "{call}: rank {rank} of {comm} runs on GPU {device}, but {stream} runs on GPU \
                 {on}: queue the rank's calls on a stream of GPU {device}"
            )));
        }
        let mut found: Vec<(BufferId, I::Buffer)> = Vec::new();
        for (k, op) in ops.iter().enumerate() {
            let (peer, range) = (op.peer(), *op.range());
            let (verb, way) = match op {
                PeerOp::Send { .. } => ("send", "to"),
                PeerOp::Recv { .. } => ("receive", "from"),
            };
            if peer >= world || peer == rank {
                return Err(Error::usage(format!(
                    "{call}: {verb} {k} ({way} rank {peer}) names a peer that is not another rank \
                     of {comm} (ranks 0 to {}, this one {rank})",
                    world - 1
                )));
            }
            check_peer_range(
                call,
                format_args!("{verb} {k} ({way} rank {peer})"),
                format_args!("rank {rank} runs"),
                range,
                st.buffers.get(range.buffer.0)?,
                device,
                &mut found,
            )?;
        }
        let destinations = ops.iter().filter_map(|op| match op {
            PeerOp::Recv { dst, .. } if dst.len > 0 => {
                Some((dst.buffer, dst.offset, dst.offset + dst.len))
            }
            _ => None,
        });
        if let Some((a, b)) = first_overlap(destinations) {
            return Err(Error::usage(format!(
                "{call}: two receives write overlapping bytes of one buffer (offsets {a} and {b}); \
                 NCCL runs them in any order, so give them disjoint destinations"
            )));
        }
        let buffers: Vec<BufferId> = found.iter().map(|(b, _)| *b).collect();
        Self::note_collective(&mut st, &[stream], &buffers);
        drop(st);
        let raw_of = |id: BufferId| &found.iter().find(|(b, _)| *b == id).expect("found").1;
        let raw_ops: Vec<PeerOp<&I::Buffer>> = ops
            .iter()
            .filter(|op| op.range().len > 0)
            .map(|op| op.map(raw_of))
            .collect();
        if raw_ops.is_empty() {
            return Ok(());
        }
        self.raw
            .nccl_rank_send_recv(&raw_comm, &raw_stream, &raw_ops)
    }
}
