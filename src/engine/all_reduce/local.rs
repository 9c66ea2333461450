//! peerlink's all-reduce within one process driving several GPUs: [`LocalAllReduce`].

use super::buffers::{zeroed, CallOrder, Scratch};
use super::price::{Picks, Placement};
use crate::backend::collective::{AllReduceKernel, DataType, Rank, Reduction, Waiting, FLAG_BYTES};
use crate::backend::{Backend, BufferCopy, BufferId, CopyMethod, Owned, StreamId};
use crate::model::CostModel;
use crate::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// In place where some rank's output is its input (the pick prices the copy aside), else beside.
fn placement_of(ranks: &[LocalRank]) -> Placement {
    if ranks.iter().any(|r| r.input == r.output) {
        Placement::InPlace
    } else {
        Placement::Beside
    }
}

/// One rank of an all-reduce within one process: its GPU, the stream that orders its part (of
/// that GPU), and its input and output, `len` bytes from the start of each, memory of that GPU.
/// The same buffer as input and output sums in place.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalRank {
    pub device: usize,
    pub stream: StreamId,
    pub input: BufferId,
    pub output: BufferId,
}

/// peerlink's all-reduce (sum or average) over GPUs of one process: what every call works through — each
/// list of GPUs' flag blocks, the cost model's picks, a scratch buffer per GPU for inputs a
/// kernel cannot reduce in place, and the order of calls that share them — kept from call to
/// call.
pub struct LocalAllReduce {
    backend: Arc<dyn Backend>,
    model: CostModel,
    /// The GPUs its ranks may be on.
    devices: Vec<usize>,
    /// Flag blocks by the ranks' GPUs in order, made and zeroed at their first call.
    flags: HashMap<Vec<usize>, Vec<BufferId>>,
    picks: Picks,
    scratch: Scratch,
    order: CallOrder,
    waiting: Waiting,
}

impl LocalAllReduce {
    /// An all-reduce over ranks on `devices` of `backend`, its kernels priced by `model` (the
    /// engine's, from [`crate::engine::Fabric::planner`], or a measured profile's).
    pub fn new(backend: Arc<dyn Backend>, model: CostModel, devices: &[usize]) -> Self {
        LocalAllReduce {
            backend,
            model,
            devices: devices.to_vec(),
            flags: HashMap::new(),
            picks: Picks::default(),
            scratch: Scratch::default(),
            order: CallOrder::default(),
            waiting: Waiting::Bounded,
        }
    }

    /// How the ranks' kernels of later calls wait for each other (bounded at first).
    pub fn set_waiting(&mut self, waiting: Waiting) {
        self.waiting = waiting;
    }

    /// Reduces every rank's input (`len` bytes of `dtype`) element-wise by `op` into every rank's
    /// output, queued on each rank's stream after the work queued there so far; later work there
    /// sees the result. Returns the kernel the cost model picked: for a sum in place (a rank's input is
    /// its output) a kernel that cannot reduce in place first copies the input aside, and the
    /// pick prices that copy. The host does not wait.
    pub fn all_reduce(
        &mut self,
        ranks: &[LocalRank],
        len: usize,
        dtype: DataType,
        op: Reduction,
    ) -> Result<AllReduceKernel> {
        let devices = devices_of(ranks);
        let kernel = self.kernel(&devices, len, dtype, placement_of(ranks))?;
        self.queue(kernel, ranks, &devices, len, (dtype, op))?;
        Ok(kernel)
    }

    /// Whether [`LocalAllReduce::all_reduce`] of these ranks would only queue work on their
    /// streams, making nothing and waiting for no other stream: the ranks' flag blocks made by an
    /// earlier call, each stream the one its GPU's last call ran on, and a scratch buffer large
    /// enough where an input is copied aside. A call captured into a CUDA graph must be so: an
    /// allocation, a synchronous write or a wait for a stream outside the capture would break it.
    pub fn queues_only(&mut self, ranks: &[LocalRank], len: usize, dtype: DataType) -> bool {
        let devices = devices_of(ranks);
        let Ok(kernel) = self.kernel(&devices, len, dtype, placement_of(ranks)) else {
            return false;
        };
        self.flags.contains_key(&devices)
            && ranks.iter().all(|r| {
                self.order.follows_on(r.device, r.stream)
                    && (r.input != r.output
                        || kernel.in_place()
                        || self.scratch.holds(r.device, len))
            })
    }

    /// [`LocalAllReduce::all_reduce`] by `kernel` rather than the cost model's pick: to measure
    /// the kernels against each other.
    pub fn all_reduce_by(
        &mut self,
        kernel: AllReduceKernel,
        ranks: &[LocalRank],
        len: usize,
        dtype: DataType,
        op: Reduction,
    ) -> Result<()> {
        let devices = devices_of(ranks);
        self.check(&devices, len, dtype)?;
        self.queue(kernel, ranks, &devices, len, (dtype, op))
    }

    /// Waits for the calls queued, then frees the flag blocks and scratch buffers (a later call
    /// makes them anew); each release is tried. Dropping does it too; a caller that destroys the
    /// ranks' streams first calls it before.
    pub fn release(&mut self) {
        let backend = self.backend.as_ref();
        self.order.wait_all(backend);
        self.order = CallOrder::default();
        self.scratch.free_all(backend);
        for (_, flags) in self.flags.drain() {
            for flag in flags {
                let _ = backend.free(flag);
            }
        }
    }

    /// Checks a call over ranks on `devices` (in order) before anything is made for it: 2 or
    /// more ranks, on distinct GPUs of this all-reduce with P2P between every two, `len` a whole
    /// number of `dtype` elements.
    pub fn check(&mut self, devices: &[usize], len: usize, dtype: DataType) -> Result<()> {
        self.kernel(devices, len, dtype, Placement::Beside)
            .map(|_| ())
    }

    /// The kernel the cost model picks for a call over `devices` placed so, once checked
    /// ([`LocalAllReduce::check`]).
    fn kernel(
        &mut self,
        devices: &[usize],
        len: usize,
        dtype: DataType,
        placed: Placement,
    ) -> Result<AllReduceKernel> {
        self.check_ranks(devices, len, dtype)?;
        self.picks
            .get(&self.model, devices, len, placed)
            .ok_or_else(|| {
                Error::usage(format!(
                    "peerlink's all-reduce needs P2P between every two of GPUs {devices:?}, and a \
                     pair of them has none; reduce over GPUs that all reach each other"
                ))
            })
    }

    fn check_ranks(&self, devices: &[usize], len: usize, dtype: DataType) -> Result<()> {
        if devices.len() < 2 {
            return Err(Error::usage(format!(
                "an all-reduce takes one tensor per GPU on at least 2 GPUs; {} given",
                devices.len()
            )));
        }
        for (i, d) in devices.iter().enumerate() {
            if devices[..i].contains(d) {
                return Err(Error::usage(format!(
                    "two tensors of the all-reduce are on GPU {d}; give one tensor per GPU"
                )));
            }
            if !self.devices.contains(d) {
                return Err(Error::usage(format!(
                    "GPU {d} is not part of this fabric (GPUs {:?})",
                    self.devices
                )));
            }
        }
        if len == 0 || !len.is_multiple_of(dtype.size()) {
            return Err(Error::usage(format!(
                "an all-reduce of {dtype} takes a whole number of {}-byte elements, at least one; \
                 the tensors hold {len} bytes",
                dtype.size()
            )));
        }
        Ok(())
    }

    /// Queues `kernel` over the ranks: each after the last call on its GPU, an input the kernel
    /// cannot reduce in place copied aside first.
    fn queue(
        &mut self,
        kernel: AllReduceKernel,
        ranks: &[LocalRank],
        devices: &[usize],
        len: usize,
        (dtype, op): (DataType, Reduction),
    ) -> Result<()> {
        let flags = self.flags(devices)?;
        let backend = self.backend.as_ref();
        let mut queued = Vec::with_capacity(ranks.len());
        for rank in ranks {
            self.order.follow(backend, rank.device, rank.stream)?;
            let input = if rank.input == rank.output && !kernel.in_place() {
                let aside = self.scratch.get(backend, rank.device, len, rank.stream)?;
                let copy = BufferCopy::from_start(rank.input, aside, len);
                backend.copy(rank.stream, CopyMethod::CopyEngine, &copy)?;
                aside
            } else {
                rank.input
            };
            queued.push(Rank {
                stream: rank.stream,
                input,
                output: rank.output,
            });
        }
        backend
            .collectives()
            .all_reduce(kernel, dtype, op, &queued, &flags, self.waiting, len)
    }

    /// The flag blocks of the all-reduce over `devices` (made and zeroed at first use), with peer
    /// access enabled between every two of them.
    fn flags(&mut self, devices: &[usize]) -> Result<Vec<BufferId>> {
        if let Some(flags) = self.flags.get(devices) {
            return Ok(flags.clone());
        }
        let backend = self.backend.as_ref();
        for &a in devices {
            for &b in devices {
                backend.enable_peer_access(a, b)?;
            }
        }
        let flags = devices
            .iter()
            .map(|&d| zeroed(backend, d, FLAG_BYTES))
            .collect::<Result<Vec<_>>>()?;
        let flags: Vec<BufferId> = flags.into_iter().map(Owned::keep).collect();
        self.flags.insert(devices.to_vec(), flags.clone());
        Ok(flags)
    }
}

/// The ranks' GPUs, in order.
fn devices_of(ranks: &[LocalRank]) -> Vec<usize> {
    ranks.iter().map(|r| r.device).collect()
}

impl Drop for LocalAllReduce {
    fn drop(&mut self) {
        self.release();
    }
}
