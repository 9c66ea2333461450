//! What `copy_batch` needs besides its kernel: pinned host memory to hold the copy list as
//! descriptors, reused once the kernel that read them is done.
//!
//! The kernel reads its descriptors straight from mapped pinned memory (one small PCIe read per
//! block, all in parallel), so issuing a batch costs a host memcpy and one launch, with no upload
//! copy and no host wait. Everything here is per batch CPU time on the path of every batch, which
//! is why the blocks keep their completion event from one use to the next.
//!
//! A batch's descriptors must stay in place until its kernel has run — for ever, if the launch was
//! captured into a graph. Blocks of running kernels wait here behind their event and come back to
//! a per-device free list when it has fired; captured ones go to the graph (see the backend's
//! `end_capture`).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::abi::{Descriptor, DESCRIPTOR_BYTES};
use super::driver::{failed, PinnedMemory};
use crate::Result;

/// Smallest descriptor block allocated: 170 descriptors.
const MIN_BLOCK_BYTES: usize = 4096;

/// Pinned memory holding one batch's descriptors, and the event recorded after the kernel that
/// reads them (made on first use, then recorded again at each use).
pub(super) struct Block {
    size: usize,
    memory: PinnedMemory,
    done: Option<CudaEvent>,
}

impl Block {
    /// The first `count` descriptors of the block, where the kernel will read them.
    pub(super) fn descriptors_mut(&mut self, count: usize) -> &mut [Descriptor] {
        let (pointer, bytes) = self.memory.as_mut_ptr();
        assert!(
            count * DESCRIPTOR_BYTES <= bytes,
            "descriptor block too small"
        );
        assert!(pointer.align_offset(std::mem::align_of::<Descriptor>()) == 0);
        // SAFETY: the block's pinned memory holds at least `count` descriptors (asserted) from a
        // suitably aligned start (asserted; pinned allocations are page-aligned); any bytes are a
        // valid Descriptor (three u64); `&mut self` gives exclusive access for the borrow, and no
        // kernel reads a block taken from the pool until it is launched after this borrow ends.
        unsafe { std::slice::from_raw_parts_mut(pointer.cast::<Descriptor>(), count) }
    }

    /// The unified address the kernel reads from.
    pub(super) fn address(&self) -> u64 {
        self.memory.address()
    }

    fn device(&self) -> usize {
        self.memory.device()
    }

    /// Whether no kernel can still read the block; an event that cannot say counts as fired (the
    /// context is broken then anyway).
    fn is_idle(&self) -> bool {
        self.done
            .as_ref()
            .is_none_or(|e| e.try_is_complete().unwrap_or(true))
    }
}

pub(super) struct DescriptorPool {
    /// Per device: blocks no kernel will read any more.
    free: Vec<Mutex<Vec<Block>>>,
    /// Blocks whose kernels may still be running.
    in_flight: Mutex<Vec<Block>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl DescriptorPool {
    pub(super) fn new(devices: usize) -> Self {
        DescriptorPool {
            free: (0..devices).map(|_| Mutex::new(Vec::new())).collect(),
            in_flight: Mutex::new(Vec::new()),
        }
    }

    /// A block of at least `count` descriptors on the device of `ctx`: a free one if any fits,
    /// else one whose kernel has finished since, else a new one.
    pub(super) fn take(&self, ctx: &Arc<CudaContext>, count: usize) -> Result<Block> {
        let bytes = count * DESCRIPTOR_BYTES;
        let device = ctx.ordinal();
        if let Some(block) = self.best_fit(device, bytes) {
            return Ok(block);
        }
        self.reclaim();
        if let Some(block) = self.best_fit(device, bytes) {
            return Ok(block);
        }
        let size = bytes.max(MIN_BLOCK_BYTES).next_power_of_two();
        Ok(Block {
            size,
            memory: PinnedMemory::new(ctx, size)?,
            done: None,
        })
    }

    /// Records the block's event after the kernel just queued on `stream` and keeps the block until
    /// it fires.
    pub(super) fn retire(&self, mut block: Block, stream: &CudaStream) -> Result<()> {
        let event = match block.done.take() {
            Some(event) => event,
            None => stream
                .context()
                .new_event(None)
                .map_err(failed("cuEventCreate"))?,
        };
        event.record(stream).map_err(failed("cuEventRecord"))?;
        block.done = Some(event);
        lock(&self.in_flight).push(block);
        Ok(())
    }

    /// Takes back a block that no kernel will read any more (a resident worker's batch list once
    /// its ticket is complete, or its worker has stopped).
    pub(super) fn give_back(&self, block: Block) {
        lock(&self.free[block.device()]).push(block);
    }

    fn best_fit(&self, device: usize, bytes: usize) -> Option<Block> {
        let mut free = lock(&self.free[device]);
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, b)| b.size >= bytes)
            .min_by_key(|(_, b)| b.size)
            .map(|(i, _)| i)?;
        Some(free.swap_remove(best))
    }

    /// Moves blocks whose kernels have finished back to the free lists.
    fn reclaim(&self) {
        let mut in_flight = lock(&self.in_flight);
        let mut i = 0;
        while i < in_flight.len() {
            if in_flight[i].is_idle() {
                self.give_back(in_flight.swap_remove(i));
            } else {
                i += 1;
            }
        }
    }
}
