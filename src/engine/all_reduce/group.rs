//! peerlink's all-reduce with one rank per process, as real jobs run (torchrun, `peerlink launch`,
//! Slurm, mpirun on one host): [`GroupAllReduce`].
//!
//! A kernel of one process reaches another process's memory only where that memory was shared
//! (exported, imported: a CUDA IPC handle, on the simulator a shared file), and sharing takes
//! milliseconds and the whole group. So the ranks share, once, a flag block each and a buffer
//! each (grown, by all of them at once, when a call needs more), and every call works through
//! them: the packet kernel reads only the rank's own tensor and pushes packets into the peers'
//! flag blocks, so it copies nothing; one-shot reads every rank's input, so each rank first copies
//! its tensor into its shared buffer; two-shot reads and writes every rank's, so each rank copies
//! its tensor in, the kernel sums in place in the shared buffers, and each copies the sum back.
//! Memory the ranks allocate together for the purpose ([`GroupAllReduce::alloc_symmetric`], as
//! PyTorch's SymmetricMemory tensors) spares those copies: every rank's kernel reaches every
//! rank's range of it, so two-shot sums in place there and only one-shot copies its input aside.
//! The cost model prices the copies with the kernels ([`Placement::AcrossProcesses`],
//! [`Placement::Symmetric`]).
//! Nothing crosses the group's sockets per call.
//!
//! Tested across real processes, every kernel at each size with every element checked by its
//! rank: tests/processes/group_reduce.rs, on the simulator in CI and on two GPUs.

use super::buffers::{zeroed, CallOrder};
use super::exchange::{agreed_by, RankExchange};
use super::price::{pick, Picks, Placement};
use crate::backend::collective::{
    AllReduceKernel, BufferRange, DataType, RankBuffers, Reduction, Waiting, FLAG_BYTES,
};
use crate::backend::{Backend, BufferCopy, BufferId, CopyMethod, Memory, Owned, StreamId};
use crate::launch::Group;
use crate::model::CostModel;
use crate::{Error, Result};
use std::sync::Arc;

/// The shared buffer's length at the start, and the least it grows to: calls up to it never
/// grow it.
pub const INITIAL_SHARED_BYTES: usize = 1 << 20;

/// This process's rank of peerlink's all-reduce across the processes of a [`Group`], one GPU each
/// (see the module's introduction).
///
/// Every rank calls [`GroupAllReduce::join`] together, then the same calls with the same lengths
/// and element types, in the same order, each on its own buffer and stream (as NCCL's collectives
/// are called): a rank that calls with another length, or not at all, leaves the others' kernels
/// waiting until they fail.
///
/// The ranks meet through `G`: a [`Group`] of processes, owned or borrowed (`&Group`) where it
/// serves other work too, or another [`RankExchange`] (threads of one process).
pub struct GroupAllReduce<G: RankExchange = Group> {
    backend: Arc<dyn Backend>,
    group: G,
    model: CostModel,
    /// Each rank's GPU, in rank order.
    gpus: Vec<usize>,
    /// Every rank's flag block: this rank's own, the others' imported for its GPU.
    flags: Vec<BufferId>,
    /// Every rank's shared buffer, likewise, and their length.
    shared: Vec<BufferId>,
    shared_len: usize,
    /// Whether a call on the shared buffers was queued into a CUDA graph: a replay may use them
    /// at any time, so when they grow they are kept, not freed.
    shared_captured: bool,
    /// Every rank's shared buffers that grew since a graph captured a call on them, each list as
    /// `shared`: freed with the rest at the drop.
    superseded: Vec<Vec<BufferId>>,
    /// Memory the ranks allocated together ([`GroupAllReduce::alloc_symmetric`]), in the order
    /// allocated.
    symmetric: Vec<Symmetric>,
    /// The cost model's picks per length and kind of memory.
    picks: Picks,
    /// The stream of the last call: the next, on another stream, waits for it (the flags and the
    /// shared buffer serve one call after another).
    order: CallOrder,
    /// How this rank's kernels wait for the others'.
    waiting: Waiting,
    /// Whether the other ranks are given up on: its drop meets none of them.
    abandoned: bool,
}

impl<G: RankExchange> GroupAllReduce<G> {
    /// Joins the all-reduce of `group`'s ranks: rank `r` on the GPU of its `LOCAL_RANK`, all of
    /// one host and with P2P between every two. Every rank calls it; it returns once all have
    /// shared their flag blocks and buffers. `model` prices the kernels (the engine's, from
    /// [`crate::engine::Fabric::planner`], or a measured profile's).
    pub fn join(backend: Arc<dyn Backend>, group: G, model: CostModel) -> Result<Self> {
        let gpus = group.gpus(backend.as_ref())?;
        // The same answer on every rank (one host, one topology): refused before anything is made.
        let element = DataType::F32.size() as u64;
        if pick(&model, &gpus, element, Placement::AcrossProcesses).is_none() {
            return Err(no_p2p(&gpus));
        }
        let me = group.rank();
        let gpu = gpus[me];
        let made = (|| {
            let flags = zeroed(backend.as_ref(), gpu, FLAG_BYTES)?;
            let shared = Owned::new(
                backend.as_ref(),
                backend.alloc(Memory::Device(gpu), INITIAL_SHARED_BYTES)?,
            );
            Ok((flags, shared))
        })();
        let (flags, shared) = agreed_by(&group, made)?;
        let every = group.share(backend.as_ref(), gpu, &[*flags, *shared])?;
        // From here the struct's drop frees them.
        flags.keep();
        shared.keep();
        Ok(GroupAllReduce {
            backend,
            group,
            model,
            gpus,
            flags: every.iter().map(|b| b[0]).collect(),
            shared: every.iter().map(|b| b[1]).collect(),
            shared_len: INITIAL_SHARED_BYTES,
            shared_captured: false,
            superseded: Vec::new(),
            symmetric: Vec::new(),
            picks: Picks::default(),
            order: CallOrder::default(),
            waiting: Waiting::Bounded,
            abandoned: false,
        })
    }

    /// How this rank's kernels of later calls wait for the other ranks' (bounded at first).
    pub fn set_waiting(&mut self, waiting: Waiting) {
        self.waiting = waiting;
    }

    /// Gives up on the other ranks (an abort, or a rank lost, once the kernels' release word is
    /// raised): the drop then waits for this rank's own calls alone, not for every rank to
    /// leave. (Memory the peers imported stays theirs until they let it go.)
    pub fn abandon(&mut self) {
        self.abandoned = true;
    }

    /// This process's rank.
    pub fn rank(&self) -> usize {
        self.group.rank()
    }

    /// This rank's GPU (its `LOCAL_RANK`).
    pub fn gpu(&self) -> usize {
        self.gpus[self.rank()]
    }

    /// Each rank's GPU, in rank order.
    pub fn gpus(&self) -> &[usize] {
        &self.gpus
    }

    /// What the ranks meet through.
    pub fn group(&self) -> &G {
        &self.group
    }

    /// Allocates `len` (> 0) zeroed bytes of this rank's GPU that every rank's kernels reach, with
    /// every rank (each calls it with the same `len`, in the same order of calls, as a collective):
    /// an all-reduce of a range of it, each rank passing its own memory's range at the same
    /// offset, copies nothing into or out of the shared buffers (module introduction). The memory
    /// stays allocated, and this rank's to read and write, until this `GroupAllReduce` drops: do
    /// not free it.
    pub fn alloc_symmetric(&mut self, len: usize) -> Result<BufferId> {
        if len == 0 {
            return Err(Error::usage(
                "symmetric memory of 0 bytes: ask for at least one byte",
            ));
        }
        let backend = self.backend.clone();
        let made = zeroed(backend.as_ref(), self.gpu(), len);
        let mine = agreed_by(&self.group, made)?;
        self.share_symmetric(*mine, len)?;
        Ok(mine.keep())
    }

    /// Makes the `len` (> 0) bytes at unified address `address`, memory of this rank's GPU that
    /// another library allocated (a window an NCCL-API caller registered), symmetric memory of the
    /// ranks, with every rank (each with its own, all of one `len`, in the same order of calls, as
    /// a collective): an all-reduce of a range of it copies as little as one of
    /// [`GroupAllReduce::alloc_symmetric`]'s. Returns the memory's handle here, this
    /// `GroupAllReduce`'s (closed, the memory left to its owner, by
    /// [`GroupAllReduce::release_symmetric`] or the drop); the owner must keep the memory until
    /// then.
    pub fn adopt_symmetric(&mut self, address: u64, len: usize) -> Result<BufferId> {
        let backend = self.backend.clone();
        let borrowed = if len == 0 {
            Err(Error::usage(
                "symmetric memory of 0 bytes: adopt at least one byte",
            ))
        } else {
            backend
                .borrow_memory(self.gpu(), address, len)
                .map(|buffer| Owned::new(backend.as_ref(), buffer))
        };
        let mine = agreed_by(&self.group, borrowed)?;
        self.share_symmetric(*mine, len)?;
        Ok(mine.keep())
    }

    /// Gives up symmetric memory `buffer` (this rank's, from [`GroupAllReduce::alloc_symmetric`]
    /// or [`GroupAllReduce::adopt_symmetric`]), with every rank (each its own, in the same order,
    /// as a collective): each waits for its calls, closes the peers' memory, and once every rank
    /// has, frees its own handle. A buffer that is not symmetric memory here is a usage error.
    pub fn release_symmetric(&mut self, buffer: BufferId) -> Result<()> {
        let Some(at) = self.symmetric_of(buffer) else {
            return Err(Error::usage(format!(
                "{buffer} is not symmetric memory of this all-reduce: release only what \
                 alloc_symmetric or adopt_symmetric made so"
            )));
        };
        let gone = self.symmetric.remove(at);
        let backend = self.backend.as_ref();
        self.order.wait_all(backend);
        let me = self.rank();
        for (_, peer) in gone.every.iter().enumerate().filter(|&(r, _)| r != me) {
            backend.free(*peer)?;
        }
        self.group.barrier()?;
        backend.free(gone.every[me])
    }

    /// Shares `mine` (`len` bytes of this rank's GPU, agreed on by every rank) with the others
    /// as symmetric memory.
    fn share_symmetric(&mut self, mine: BufferId, len: usize) -> Result<()> {
        let backend = self.backend.as_ref();
        let address = agreed_by(&self.group, backend.sharing().device_address(mine))?;
        let every = self.group.share(backend, self.gpu(), &[mine])?;
        self.symmetric.push(Symmetric {
            every: every.iter().map(|b| b[0]).collect(),
            address,
            len,
        });
        Ok(())
    }

    /// The range of this rank's symmetric memory ([`GroupAllReduce::alloc_symmetric`]) that holds
    /// the `len` bytes at unified address `address` (what another library's tensor in it says), or
    /// `None` where no allocation holds them all.
    pub fn symmetric_range(&self, address: u64, len: usize) -> Option<BufferRange> {
        let me = self.rank();
        self.symmetric.iter().find_map(|s| {
            let offset = usize::try_from(address.checked_sub(s.address)?).ok()?;
            (offset.checked_add(len)? <= s.len).then_some(BufferRange {
                buffer: s.every[me],
                offset,
                len,
            })
        })
    }

    /// Reduces every rank's `range` (`len` bytes of `dtype` from its offset, device memory of this
    /// rank's GPU: allocated, symmetric, or another library's, borrowed) element-wise by `op` into
    /// each of them, queued on `stream` (this rank's GPU) after the work queued there so far; later
    /// work there sees the result. Returns the kernel the cost model picked. Where one rank's range is
    /// symmetric memory, every rank's must be, at the same offset. The host does not wait, except
    /// when the shared buffers grow (every rank at the same call, a group exchange).
    pub fn all_reduce(
        &mut self,
        range: BufferRange,
        stream: StreamId,
        dtype: DataType,
        op: Reduction,
    ) -> Result<AllReduceKernel> {
        self.all_reduce_from(range, range, stream, dtype, op)
    }

    /// [`GroupAllReduce::all_reduce`] of every rank's `input` into its `range` (as long, of this
    /// rank's GPU; `input` may be `range`, to sum in place): the kernels read the input where it
    /// is, so a sum out of place costs no copy more than one in place — except into symmetric
    /// memory, whose kernels sum in place there, where the input is first copied into `range`.
    pub fn all_reduce_from(
        &mut self,
        input: BufferRange,
        range: BufferRange,
        stream: StreamId,
        dtype: DataType,
        op: Reduction,
    ) -> Result<AllReduceKernel> {
        let symmetric = self.symmetric_of(range.buffer);
        let kernel = self.kernel(range.len, placement(symmetric))?;
        self.reduce(kernel, (input, range), symmetric, stream, (dtype, op))?;
        Ok(kernel)
    }

    /// Whether [`GroupAllReduce::all_reduce`] of `range` on `stream` would only queue work there,
    /// making nothing and meeting no rank on the host: the shared buffers large enough (a larger
    /// call grows them, every rank together) and `stream` the one the last call ran on (or the
    /// first). A call captured into a CUDA graph must be so.
    pub fn queues_only(&mut self, range: BufferRange, stream: StreamId) -> bool {
        let symmetric = self.symmetric_of(range.buffer);
        let Ok(kernel) = self.kernel(range.len, placement(symmetric)) else {
            return false;
        };
        let copies = placement(symmetric).copies(kernel);
        self.order.follows_on(self.gpu(), stream) && (copies == 0 || range.len <= self.shared_len)
    }

    /// [`GroupAllReduce::all_reduce`] by `kernel` rather than the cost model's pick (every rank
    /// names the same one): to measure the kernels against each other.
    pub fn all_reduce_by(
        &mut self,
        kernel: AllReduceKernel,
        range: BufferRange,
        stream: StreamId,
        dtype: DataType,
        op: Reduction,
    ) -> Result<()> {
        let symmetric = self.symmetric_of(range.buffer);
        self.reduce(kernel, (range, range), symmetric, stream, (dtype, op))
    }

    /// The call of `kernel` summing `input` into `range`, which is this rank's part of symmetric
    /// allocation `symmetric`, or other memory.
    fn reduce(
        &mut self,
        kernel: AllReduceKernel,
        (input, range): (BufferRange, BufferRange),
        symmetric: Option<usize>,
        stream: StreamId,
        (dtype, op): (DataType, Reduction),
    ) -> Result<()> {
        let len = range.len;
        // Checked before the shared buffers grow for it (the kernel's own checks come after).
        if input.len != len {
            return Err(Error::usage(format!(
                "an all-reduce sums its input into an output as long: {} bytes into {len}",
                input.len
            )));
        }
        if len == 0 || !len.is_multiple_of(dtype.size()) || len > kernel.max_len() {
            return Err(Error::usage(format!(
                "an all-reduce of {dtype} by {} takes a whole number of {}-byte elements, at \
                 least one and at most {} bytes; {len} bytes given",
                kernel.name(),
                dtype.size(),
                kernel.max_len()
            )));
        }
        let copies = placement(symmetric).copies(kernel);
        let gpu = self.gpu();
        self.order.follow(self.backend.as_ref(), gpu, stream)?;
        if copies > 0 && len > self.shared_len {
            self.grow(len, stream)?;
        }
        // Any kernel may use the shared buffers (the packet kernel's peers write into them); once
        // a capture used them, no later call needs to ask.
        if !self.shared_captured {
            self.shared_captured = self.backend.is_capturing(stream)?;
        }
        let me = self.rank();
        let backend = self.backend.as_ref();
        let mine = BufferRange {
            buffer: self.shared[me],
            offset: 0,
            len,
        };
        let copy = |src, dst| backend.copy(stream, CopyMethod::CopyEngine, &range_copy(src, dst));
        let input = if symmetric.is_some() && input != range {
            copy(input, range)?;
            range
        } else {
            input
        };
        if copies > 0 {
            copy(input, mine)?;
        }
        let ranks = self.rank_buffers(kernel, (input, range), symmetric);
        backend.collectives().rank_all_reduce(
            kernel,
            dtype,
            op,
            me,
            stream,
            &ranks,
            self.waiting,
            len,
        )?;
        if copies > 1 {
            copy(mine, range)?;
        }
        Ok(())
    }

    /// Every rank's buffers for one call of `kernel` summing `input` into `range` (this rank's,
    /// `range` in symmetric allocation `symmetric` or other memory): this rank's own ranges where
    /// the kernel reads or writes them there, each rank's symmetric range for two-shot in
    /// symmetric memory, the shared buffers otherwise.
    fn rank_buffers(
        &self,
        kernel: AllReduceKernel,
        (input, range): (BufferRange, BufferRange),
        symmetric: Option<usize>,
    ) -> Vec<RankBuffers> {
        let me = self.rank();
        let mine = |r: BufferRange| (r.buffer, r.offset);
        (0..self.gpus.len())
            .map(|r| {
                let whole = |buffer| (buffer, 0);
                let at_offset = |buffer| (buffer, range.offset);
                let shared = whole(self.shared[r]);
                let (input, output) = match (r == me, kernel, symmetric) {
                    (true, AllReduceKernel::OneShotPackets, _) => (mine(input), mine(range)),
                    (true, AllReduceKernel::OneShot, _) => (shared, mine(range)),
                    (_, AllReduceKernel::TwoShot, Some(s)) => {
                        let theirs = at_offset(self.symmetric[s].every[r]);
                        (theirs, theirs)
                    }
                    _ => (shared, shared),
                };
                RankBuffers {
                    input: input.0,
                    input_offset: input.1,
                    output: output.0,
                    output_offset: output.1,
                    flags: self.flags[r],
                }
            })
            .collect()
    }

    /// Which of the symmetric allocations `buffer` (this rank's) is.
    fn symmetric_of(&self, buffer: BufferId) -> Option<usize> {
        let me = self.rank();
        self.symmetric.iter().position(|s| s.every[me] == buffer)
    }

    /// The kernel the cost model picks for `len` bytes across processes `placed` so (in symmetric
    /// memory or not), kept per size and kind of memory.
    fn kernel(&mut self, len: usize, placed: Placement) -> Result<AllReduceKernel> {
        self.picks
            .get(&self.model, &self.gpus, len, placed)
            .ok_or_else(|| no_p2p(&self.gpus))
    }

    /// Grows every rank's shared buffer to hold `len` bytes (each rank at the same call): each
    /// waits for its earlier calls, shares a new buffer with the others and lets the old go —
    /// or keeps it to the drop where a graph captured a call on it. Collectives are captured on
    /// every rank alike, so every rank keeps its own and its mappings of the others' alike (a rank
    /// that captured and one that did not still meet at the same steps, but the second's buffer
    /// would go while the first's graph maps it).
    fn grow(&mut self, len: usize, stream: StreamId) -> Result<()> {
        let backend = self.backend.as_ref();
        let me = self.rank();
        let gpu = self.gpus[me];
        let new_len = len.next_power_of_two().max(INITIAL_SHARED_BYTES);
        let made = backend.synchronize(stream).and_then(|()| {
            Ok(Owned::new(
                backend,
                backend.alloc(Memory::Device(gpu), new_len)?,
            ))
        });
        let made = agreed_by(&self.group, made)?;
        let every = self.group.share(backend, gpu, &[*made])?;
        made.keep();
        let old = std::mem::replace(&mut self.shared, every.iter().map(|b| b[0]).collect());
        self.shared_len = new_len;
        if std::mem::take(&mut self.shared_captured) {
            self.superseded.push(old);
            // Met all the same: every rank takes as many steps, whatever it captured.
            return self.group.barrier();
        }
        // Every rank waited for its calls before the exchange, so no kernel reads the old
        // buffers: close the peers' mappings, then, once every rank has, free this rank's own.
        for (_, buffer) in old.iter().enumerate().filter(|&(r, _)| r != me) {
            backend.free(*buffer)?;
        }
        self.group.barrier()?;
        backend.free(old[me])
    }
}

impl<G: RankExchange> Drop for GroupAllReduce<G> {
    fn drop(&mut self) {
        // Nothing can report a failure from drop: each release is tried. Every rank waits for its
        // own calls, then for the others' (their kernels touch this rank's flags and buffer)
        // before its own memory goes.
        let backend = self.backend.as_ref();
        self.order.wait_all(backend);
        let me = self.rank();
        let every_kind = || {
            [&self.flags, &self.shared]
                .into_iter()
                .chain(&self.superseded)
                .chain(self.symmetric.iter().map(|s| &s.every))
        };
        for buffers in every_kind() {
            for (_, &buffer) in buffers.iter().enumerate().filter(|&(r, _)| r != me) {
                let _ = backend.free(buffer);
            }
        }
        if !self.abandoned {
            let _ = self.group.barrier();
        }
        for buffers in every_kind() {
            let _ = backend.free(buffers[me]);
        }
    }
}

/// Memory the ranks allocated together: every rank's, in rank order (this rank's own, the others'
/// imported), and this rank's own unified address and length.
struct Symmetric {
    every: Vec<BufferId>,
    address: u64,
    len: usize,
}

/// The copy of `src`'s bytes into `dst` (as long).
fn range_copy(src: BufferRange, dst: BufferRange) -> BufferCopy {
    BufferCopy {
        src: src.buffer,
        src_offset: src.offset,
        dst: dst.buffer,
        dst_offset: dst.offset,
        len: dst.len,
    }
}

/// Where the sum of a call in `symmetric` allocation (or in other memory) goes.
fn placement(symmetric: Option<usize>) -> Placement {
    match symmetric {
        Some(_) => Placement::Symmetric,
        None => Placement::AcrossProcesses,
    }
}

fn no_p2p(gpus: &[usize]) -> Error {
    Error::usage(format!(
        "peerlink's all-reduce needs P2P between every two of the ranks' GPUs {gpus:?}, and a pair \
         of them has none; run the ranks on GPUs that all reach each other"
    ))
}
