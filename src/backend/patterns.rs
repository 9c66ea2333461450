//! Filling and checking device memory with the crate's data pattern ([`crate::pattern`]) on
//! the GPU that holds it.
//!
//! The bench fills every source it copies and checks every byte of every destination. On the host
//! that means generating, writing, reading back and checking each byte at a few GB/s: at 512 MiB a
//! message, most of a place's time on the H200 pair (ce-read: 0.14 of 0.22 s). A GPU does the same
//! at its memory's speed, and only the first wrong byte crosses back to the host. Host and GPU generate
//! byte for byte the same message ([`crate::pattern::WordRule`]), so whichever filled a
//! buffer, either can check it.
//!
//! Like [`Backend::write`](super::Backend::write) and [`Backend::read`](super::Backend::read), these
//! calls block the host until they are done and are not timed; they run on the buffer's GPU, outside
//! the caller's streams, so work queued on the buffer must have been synchronised first. They take
//! device memory only: pinned host memory is the host's to fill and check.

use super::collective::BufferRange;
use super::raw::RawBackend;
use crate::pattern::Mismatch;
use crate::Result;

/// The pattern on the GPU (reached through [`super::Backend::patterns`]).
pub trait Patterns {
    /// Writes bytes `0..range.len` of the message for `seed` (what `pattern::bytes(seed,
    /// range.len)` returns) into `range`, which lies in one GPU's memory. Any offset and length;
    /// a range of 0 bytes writes nothing.
    fn fill(&self, range: &BufferRange, seed: u64) -> Result<()>;

    /// Checks every byte of `range` (one GPU's memory) against bytes `0..range.len` of the message
    /// for `seed`: the first that differs, its offset counted from the range's start, or `None`
    /// when every byte is right.
    fn first_mismatch(&self, range: &BufferRange, seed: u64) -> Result<Option<Mismatch>>;
}

/// The pattern on the GPU, below the checks: every range is non-empty, lies inside its buffer, and
/// the buffer is memory of a GPU.
pub trait RawPatterns: RawBackend {
    fn fill(&self, range: BufferRange<&Self::Buffer>, seed: u64) -> Result<()>;
    fn first_mismatch(
        &self,
        range: BufferRange<&Self::Buffer>,
        seed: u64,
    ) -> Result<Option<Mismatch>>;
}
