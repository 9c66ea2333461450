//! What `copy_batch` needs besides its kernel: the copy list turned into descriptors, and pinned
//! host memory to hold them, reused once the kernel that read them is done.
//!
//! The kernel reads its descriptors straight from mapped pinned memory (one small PCIe read per
//! block, all in parallel), so issuing a batch costs a host memcpy and one launch, with no upload
//! copy and no host wait. Everything here is per message or per batch CPU time on the path of every
//! batch, which is why the descriptors are built in one pass with no per-message lookup and the
//! blocks keep their completion event from one use to the next.
//!
//! A batch's descriptors must stay in place until its kernel has run — for ever, if the launch was
//! captured into a graph. Blocks of running kernels wait here behind their event and come back to
//! a per-device free list when it has fired; captured ones go to the graph (see the backend's
//! `end_capture`).

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use cudarc::driver::{CudaContext, CudaEvent, CudaStream};

use super::driver::{failed, PinnedMemory};
use super::kernels::{Descriptor, DESCRIPTOR_BYTES};
use crate::backend::{check_disjoint_destinations, BufferCopy, BufferId, InOrder};
use crate::{Error, Result};

/// Smallest descriptor block allocated: 170 descriptors.
const MIN_BLOCK_BYTES: usize = 4096;

/// Writes each copy's unified destination and source addresses into `out` (one per copy), every
/// range checked against its buffer. `lookup` gives a buffer's base address and size (and checks
/// that the launching GPU reaches it); a batch names few buffers many times, so it is asked once
/// per buffer, not once per message. Refuses copies whose destinations overlap: destinations laid
/// out in order (or reverse order) buffer by buffer show they do not in the same pass; any others
/// are sorted.
pub(super) fn describe(
    copies: &[BufferCopy],
    mut lookup: impl FnMut(BufferId) -> Result<(u64, usize)>,
    out: &mut [Descriptor],
) -> Result<()> {
    assert_eq!(out.len(), copies.len(), "one descriptor per copy");
    // (buffer, base address, size) of each buffer met so far: one or two in most batches.
    let mut known: Vec<(BufferId, u64, usize)> = Vec::new();
    let mut place = |id: BufferId| -> Result<(BufferId, u64, usize)> {
        if let Some(&k) = known.iter().find(|k| k.0 == id) {
            return Ok(k);
        }
        let (base, size) = lookup(id)?;
        known.push((id, base, size));
        Ok((id, base, size))
    };
    // The buffers of the message before: most messages name the same two.
    let mut dst: Option<(BufferId, u64, usize)> = None;
    let mut src = dst;
    let mut order = InOrder::default();
    let mut in_order = true;
    for (c, slot) in copies.iter().zip(out) {
        let (_, dst_base, dst_size) = match dst {
            Some(k @ (id, ..)) if id == c.dst => k,
            _ => *dst.insert(place(c.dst)?),
        };
        let (_, src_base, src_size) = match src {
            Some(k @ (id, ..)) if id == c.src => k,
            _ => *src.insert(place(c.src)?),
        };
        let fits =
            |offset: usize, size: usize| offset.checked_add(c.len).is_some_and(|e| e <= size);
        if !fits(c.dst_offset, dst_size) || !fits(c.src_offset, src_size) {
            return Err(out_of_range(c, dst_size, src_size));
        }
        if c.len > 0 && in_order {
            in_order = order.push(c.dst, c.dst_offset, c.dst_offset + c.len);
        }
        *slot = Descriptor {
            dst: dst_base + c.dst_offset as u64,
            src: src_base + c.src_offset as u64,
            len: c.len as u64,
        };
    }
    if in_order {
        Ok(())
    } else {
        check_disjoint_destinations(copies)
    }
}

#[cold]
fn out_of_range(c: &BufferCopy, dst_size: usize, src_size: usize) -> Error {
    let (role, id, offset, size) = if c.dst_offset.checked_add(c.len).is_none_or(|e| e > dst_size) {
        ("destination", c.dst, c.dst_offset, dst_size)
    } else {
        ("source", c.src, c.src_offset, src_size)
    };
    Error::usage(format!(
        "copy_batch: {role} range {offset}..{offset}+{} lies outside buffer {} of {size} bytes",
        c.len, id.0
    ))
}

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
                let block = in_flight.swap_remove(i);
                lock(&self.free[block.device()]).push(block);
            } else {
                i += 1;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: Descriptor = Descriptor {
        dst: 0,
        src: 0,
        len: 0,
    };

    fn copy(dst_offset: usize, src_offset: usize, len: usize) -> BufferCopy {
        BufferCopy {
            dst: BufferId(2),
            dst_offset,
            src: BufferId(1),
            src_offset,
            len,
        }
    }

    /// Buffer 1 at 0x1000 and buffer 2 at 0x9000, 64 bytes each; counts the lookups.
    fn lookup(calls: &mut usize) -> impl FnMut(BufferId) -> Result<(u64, usize)> + '_ {
        move |id| {
            *calls += 1;
            match id.0 {
                1 => Ok((0x1000, 64)),
                2 => Ok((0x9000, 64)),
                other => Err(Error::InvalidHandle(format!("buffer {other}"))),
            }
        }
    }

    #[test]
    fn descriptors_hold_unified_addresses_and_each_buffer_is_looked_up_once() {
        let mut calls = 0;
        let copies: Vec<BufferCopy> = (0..8).map(|i| copy(56 - 8 * i, 8 * i, 8)).collect();
        let mut descriptors = vec![EMPTY; 8];
        describe(&copies, lookup(&mut calls), &mut descriptors).unwrap();
        assert_eq!(calls, 2);
        assert_eq!(
            descriptors[1],
            Descriptor {
                dst: 0x9000 + 48,
                src: 0x1000 + 8,
                len: 8
            }
        );
    }

    #[test]
    fn a_range_past_either_buffer_end_is_refused_with_its_role() {
        let mut calls = 0;
        let err = describe(&[copy(0, 60, 8)], lookup(&mut calls), &mut [EMPTY]).unwrap_err();
        assert!(err.to_string().contains("source range 60..60+8"), "{err}");
        let err = describe(&[copy(57, 0, 8)], lookup(&mut calls), &mut [EMPTY]).unwrap_err();
        assert!(
            err.to_string().contains("destination range 57..57+8"),
            "{err}"
        );
        let err =
            describe(&[copy(usize::MAX, 0, 8)], lookup(&mut calls), &mut [EMPTY]).unwrap_err();
        assert!(err.to_string().contains("destination"), "{err}");
    }

    #[test]
    fn destinations_out_of_order_get_the_full_check() {
        let mut calls = 0;
        let mut out = [EMPTY; 3];
        // In order, then back into the first message's range: the sort finds the overlap.
        let copies = [copy(0, 0, 8), copy(16, 8, 8), copy(4, 16, 8)];
        let err = describe(&copies, lookup(&mut calls), &mut out).unwrap_err();
        assert!(err.to_string().contains("overlapping"), "{err}");
        // Out of order but disjoint: the sort lets them through.
        let shuffled = [copy(16, 0, 8), copy(0, 8, 8), copy(8, 16, 8)];
        describe(&shuffled, lookup(&mut calls), &mut out).unwrap();
        // Ascending without overlap, then descending without overlap: in order both times.
        let up = [copy(0, 0, 8), copy(8, 8, 8), copy(16, 16, 8)];
        describe(&up, lookup(&mut calls), &mut out).unwrap();
        let down = [copy(16, 0, 8), copy(8, 8, 8), copy(0, 16, 8)];
        describe(&down, lookup(&mut calls), &mut out).unwrap();
    }

    #[test]
    fn an_unknown_buffer_is_an_error() {
        let mut calls = 0;
        let mut bad = copy(0, 0, 8);
        bad.src = BufferId(7);
        assert!(describe(&[bad], lookup(&mut calls), &mut [EMPTY]).is_err());
    }
}
