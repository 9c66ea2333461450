//! Pinned host memory for `copy_batch`'s descriptor lists, reused once the kernel that read them is
//! done. The kernel reads its descriptors straight from mapped pinned memory (one small PCIe read per
//! block, all in parallel), so issuing a batch costs a host memcpy and one launch, with no upload copy
//! and no host wait.
//!
//! A batch's descriptors must stay in place until its kernel has run — for ever, if the
//! launch was captured into a graph. Lists of running kernels wait here behind an event and come back
//! to a per-device free list when it completes; captured ones go to the graph (see the backend's
//! `end_capture`).

use std::sync::{Arc, Mutex};

use cudarc::driver::{CudaContext, CudaEvent};

use super::driver::PinnedMemory;
use crate::Result;

/// Smallest descriptor block allocated: 170 descriptors.
const MIN_BLOCK_BYTES: usize = 4096;

pub(super) struct DescriptorPool {
    /// Per device: free blocks and their sizes.
    free: Vec<Mutex<Vec<(usize, PinnedMemory)>>>,
    /// Blocks whose kernels may still be running, each with the event recorded after its kernel.
    in_flight: Mutex<Vec<(CudaEvent, usize, PinnedMemory)>>,
}

impl DescriptorPool {
    pub(super) fn new(devices: usize) -> Self {
        DescriptorPool {
            free: (0..devices).map(|_| Mutex::new(Vec::new())).collect(),
            in_flight: Mutex::new(Vec::new()),
        }
    }

    /// A block of at least `bytes` on the device of `ctx`: a free one if any fits, else a new one.
    pub(super) fn take(
        &self,
        ctx: &Arc<CudaContext>,
        bytes: usize,
    ) -> Result<(usize, PinnedMemory)> {
        self.reclaim();
        let device = ctx.ordinal();
        let mut free = self.free[device].lock().unwrap_or_else(|e| e.into_inner());
        let best = free
            .iter()
            .enumerate()
            .filter(|(_, (size, _))| *size >= bytes)
            .min_by_key(|(_, (size, _))| *size)
            .map(|(i, _)| i);
        if let Some(i) = best {
            return Ok(free.swap_remove(i));
        }
        drop(free);
        let size = bytes.max(MIN_BLOCK_BYTES).next_power_of_two();
        Ok((size, PinnedMemory::new(ctx, size)?))
    }

    /// Hands a block back once the work before `done` has completed.
    pub(super) fn retire(&self, block: (usize, PinnedMemory), done: CudaEvent) {
        let (size, memory) = block;
        self.in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((done, size, memory));
    }

    /// Moves blocks whose kernels have finished (or whose event cannot say: the context is then
    /// broken anyway) back to the free lists.
    fn reclaim(&self) {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        let (done, running): (Vec<_>, Vec<_>) = in_flight
            .drain(..)
            .partition(|(event, _, _)| event.try_is_complete().unwrap_or(true));
        *in_flight = running;
        drop(in_flight);
        for (_, size, memory) in done {
            self.free[memory.device()]
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((size, memory));
        }
    }
}
