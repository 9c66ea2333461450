//! The checked layer's pattern calls: a live buffer of this backend, in one GPU's memory, and a
//! range inside it.

use super::{check_range, Checked};
use crate::backend::collective::BufferRange;
use crate::backend::raw::{RawCollectives, RawProbes};
use crate::backend::{Memory, Patterns, RawPatterns};
use crate::pattern::Mismatch;
use crate::{Error, Result};

impl<I: RawProbes + RawCollectives + RawPatterns> Checked<I> {
    /// The implementation's buffer for `range`, checked; `None` for a range of 0 bytes.
    fn pattern_range(&self, call: &str, range: &BufferRange) -> Result<Option<I::Buffer>> {
        let st = self.lock();
        let entry = st.buffers.get(range.buffer.0)?;
        check_range(call, range.buffer, entry.len, range.offset, range.len)?;
        // Managed memory is refused too: a kernel touching it would move its pages.
        if !matches!(entry.memory, Memory::Device(_)) {
            return Err(Error::usage(format!(
                "{call}: {} is {}, and the pattern calls run on a GPU over its own device \
                 memory: write or read other memory from the host (pattern)",
                range.buffer, entry.memory
            )));
        }
        Ok((range.len > 0).then(|| entry.raw.clone()))
    }
}

impl<I: RawProbes + RawCollectives + RawPatterns> Patterns for Checked<I> {
    fn fill(&self, range: &BufferRange, seed: u64) -> Result<()> {
        match self.pattern_range("pattern fill", range)? {
            Some(raw) => RawPatterns::fill(self.raw(), range.map(|_| &raw), seed),
            None => Ok(()),
        }
    }

    fn first_mismatch(&self, range: &BufferRange, seed: u64) -> Result<Option<Mismatch>> {
        match self.pattern_range("pattern check", range)? {
            Some(raw) => RawPatterns::first_mismatch(self.raw(), range.map(|_| &raw), seed),
            None => Ok(None),
        }
    }
}
