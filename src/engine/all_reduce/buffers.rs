//! The memory and ordering every all-reduce call works through: zeroed flag blocks, a scratch
//! buffer per GPU for the inputs a kernel cannot reduce in place, and the order of calls that
//! share them.

use crate::backend::{Backend, BufferId, Memory, Owned, StreamId};
use crate::Result;
use std::collections::HashMap;

/// `len` zeroed bytes of `device`'s memory: a flag block (the kernels start from zeros), or
/// symmetric memory.
pub(super) fn zeroed(
    backend: &dyn Backend,
    device: usize,
    len: usize,
) -> Result<Owned<'_, BufferId>> {
    let buffer = Owned::new(backend, backend.alloc(Memory::Device(device), len)?);
    backend.write(*buffer, 0, &vec![0; len])?;
    Ok(buffer)
}

/// Per GPU, the stream of the last call queued there: the flag blocks and scratch buffers serve
/// one call after another, so a call on another stream waits for it.
#[derive(Debug, Default)]
pub(super) struct CallOrder(HashMap<usize, StreamId>);

impl CallOrder {
    /// Orders `stream` (of `device`) after the last call there, where that ran on another stream.
    pub(super) fn follow(
        &mut self,
        backend: &dyn Backend,
        device: usize,
        stream: StreamId,
    ) -> Result<()> {
        match self.0.insert(device, stream) {
            Some(last) if last != stream => {
                let mark = Owned::new(backend, backend.mark(last)?);
                backend.wait(stream, *mark)
            }
            _ => Ok(()),
        }
    }

    /// Whether a call on `stream` of `device` would follow the last one there without waiting for
    /// another stream (it ran on this one, or none ran).
    pub(super) fn follows_on(&self, device: usize, stream: StreamId) -> bool {
        self.0.get(&device).is_none_or(|&last| last == stream)
    }

    /// Waits for the last call on every GPU (each followed the ones before); nothing can report a
    /// failure here (it serves the releases of drop), so each wait is tried.
    pub(super) fn wait_all(&self, backend: &dyn Backend) {
        for &stream in self.0.values() {
            let _ = backend.synchronize(stream);
        }
    }
}

/// Per GPU, a buffer for a rank's input copied aside, as large as the largest call so far (in
/// powers of two); one a CUDA graph captured a call on is kept when it grows (a replay may use it
/// at any time) and freed with the rest, so that those kept add up to less than the one in use.
#[derive(Debug, Default)]
pub(super) struct Scratch {
    buffers: HashMap<usize, ScratchBuffer>,
    superseded: Vec<BufferId>,
}

#[derive(Debug)]
struct ScratchBuffer {
    buffer: BufferId,
    len: usize,
    captured: bool,
}

impl Scratch {
    /// `device`'s scratch buffer of at least `len` bytes, for a call on `stream`, which follows
    /// the last call on that GPU ([`CallOrder::follow`]).
    pub(super) fn get(
        &mut self,
        backend: &dyn Backend,
        device: usize,
        len: usize,
        stream: StreamId,
    ) -> Result<BufferId> {
        let capturing = backend.is_capturing(stream)?;
        if let Some(held) = self.buffers.get_mut(&device).filter(|held| held.len >= len) {
            held.captured |= capturing;
            return Ok(held.buffer);
        }
        if let Some(old) = self.buffers.remove(&device) {
            if old.captured {
                self.superseded.push(old.buffer);
            } else {
                // The stream follows the last user, so the old buffer is idle once this
                // stream's earlier work is: free it after that.
                backend.synchronize(stream)?;
                backend.free(old.buffer)?;
            }
        }
        let len = len.next_power_of_two();
        let buffer = backend.alloc(Memory::Device(device), len)?;
        let held = ScratchBuffer {
            buffer,
            len,
            captured: capturing,
        };
        self.buffers.insert(device, held);
        Ok(buffer)
    }

    /// Whether `device`'s scratch buffer holds `len` bytes already.
    pub(super) fn holds(&self, device: usize, len: usize) -> bool {
        self.buffers
            .get(&device)
            .is_some_and(|held| held.len >= len)
    }

    /// Frees every scratch buffer (each release tried: it serves drop), once the calls that used
    /// them are done.
    pub(super) fn free_all(&mut self, backend: &dyn Backend) {
        let held = self.buffers.drain().map(|(_, held)| held.buffer);
        for buffer in held.chain(self.superseded.drain(..)) {
            let _ = backend.free(buffer);
        }
    }
}
