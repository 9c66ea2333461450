//! The pattern calls on real GPUs: a kernel (`kernels/pattern.cu`) on the buffer's GPU, queued on
//! that GPU's internal stream (the one `write` and `read` use) and waited for.

use std::sync::{Arc, Mutex};

use super::driver::{self, failed, DeviceMemory};
use super::{lock, Buffer, Gpus, Storage};
use crate::backend::collective::BufferRange;
use crate::backend::RawPatterns;
use crate::pattern::{self, Mismatch};
use crate::{Error, Result};

/// What `find_mismatch` leaves in its slot when every byte is right.
const NONE_WRONG: u64 = u64::MAX;

/// Per GPU, the 8 bytes the check kernel reports its first wrong byte in: made at the first check,
/// held for the whole check (checks on one GPU take turns).
pub(super) struct MismatchSlots(Vec<Mutex<Option<DeviceMemory>>>);

impl MismatchSlots {
    pub(super) fn new(devices: usize) -> Self {
        MismatchSlots((0..devices).map(|_| Mutex::new(None)).collect())
    }
}

/// The GPU that holds `range` and the address of its first byte.
fn on_gpu(range: &BufferRange<&Arc<Buffer>>) -> Result<(usize, u64)> {
    match &range.buffer.0 {
        Storage::Device(memory) => Ok((memory.device(), memory.address() + range.offset as u64)),
        Storage::Nccl(memory) => Ok((memory.device(), memory.address() + range.offset as u64)),
        Storage::Borrowed { address, device } => Ok((*device, address + range.offset as u64)),
        Storage::Range(import) => Ok((import.device(), import.address() + range.offset as u64)),
        Storage::Pinned(_) | Storage::Managed(_) => Err(Error::usage(
            "the pattern calls take device memory; fill and check other memory on the host",
        )),
    }
}

impl RawPatterns for Gpus {
    fn fill(&self, range: BufferRange<&Arc<Buffer>>, seed: u64) -> Result<()> {
        let (device, address) = on_gpu(&range)?;
        let stream = self.io_stream(device)?;
        self.kernels(device)?
            .fill_pattern(stream, address, range.len, pattern::word_rule(seed))?;
        self.count(|c| &c.launches);
        stream.synchronize().map_err(failed("cuStreamSynchronize"))
    }

    fn first_mismatch(
        &self,
        range: BufferRange<&Arc<Buffer>>,
        seed: u64,
    ) -> Result<Option<Mismatch>> {
        let (device, address) = on_gpu(&range)?;
        let kernels = self.kernels(device)?;
        let stream = self.io_stream(device)?;
        let mut slot = lock(&self.mismatch_slots.0[device]);
        let first = match &mut *slot {
            Some(memory) => memory,
            None => slot.insert(DeviceMemory::new(self.context(device)?, 8)?),
        };
        driver::copy_to_device_and_wait(stream, first.address(), &NONE_WRONG.to_le_bytes())?;
        let rule = pattern::word_rule(seed);
        kernels.find_mismatch(stream, address, range.len, rule, first.address())?;
        let mut found = [0u8; 8];
        driver::copy_to_host_and_wait(stream, &mut found, first.address())?;
        self.count(|c| &c.launches);
        (0..2).for_each(|_| self.count(|c| &c.copies));
        let found = u64::from_le_bytes(found);
        Ok((found != NONE_WRONG).then(|| {
            let offset = (found >> 8) as usize;
            Mismatch {
                offset,
                expected: pattern::byte_at(seed, offset),
                found: found as u8,
            }
        }))
    }
}
