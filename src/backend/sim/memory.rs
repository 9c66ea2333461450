//! The simulator's buffers: real bytes in host memory.
//!
//! A copy reads its source when it starts and writes its destination when it ends, in virtual time.
//! Snapshotting every source at start would double the memory of large transfers, so a copy in
//! flight only registers as a reader; whoever overwrites a range that a reader still needs (another
//! copy ending, the host writing) first saves the reader's bytes. Without such a write, the copy
//! moves the bytes straight from the source when it ends, at memcpy speed.

use crate::backend::{BufferId, Memory};
use crate::{Error, Result};
use std::collections::BTreeMap;

/// A copy in flight that still needs a source range as it was when the copy started.
struct Reader {
    op: u64,
    offset: usize,
    len: usize,
    saved: Option<Vec<u8>>,
}

pub(super) struct Buffer {
    pub memory: Memory,
    data: Vec<u8>,
    /// Operations queued or running that touch this buffer.
    queued: usize,
    readers: Vec<Reader>,
}

impl Buffer {
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Saves the bytes of every reader (but `except`) that overlaps `[offset, offset + len)`.
    fn protect(&mut self, offset: usize, len: usize, except: Option<u64>) {
        let data = &self.data;
        for r in &mut self.readers {
            let overlaps = r.offset < offset + len && offset < r.offset + r.len;
            if overlaps && r.saved.is_none() && Some(r.op) != except {
                r.saved = Some(data[r.offset..r.offset + r.len].to_vec());
            }
        }
    }
}

#[derive(Default)]
pub(super) struct Store {
    buffers: BTreeMap<u64, Buffer>,
    next_id: u64,
}

impl Store {
    pub fn insert(&mut self, memory: Memory, bytes: usize) -> BufferId {
        self.next_id += 1;
        let buffer = Buffer {
            memory,
            data: vec![0; bytes],
            queued: 0,
            readers: Vec::new(),
        };
        self.buffers.insert(self.next_id, buffer);
        BufferId(self.next_id)
    }

    pub fn get(&self, id: BufferId) -> Result<&Buffer> {
        self.buffers.get(&id.0).ok_or_else(|| {
            Error::InvalidHandle(format!(
                "buffer {} does not exist in this simulator (freed, or from another backend)",
                id.0
            ))
        })
    }

    fn get_mut(&mut self, id: BufferId) -> &mut Buffer {
        self.buffers
            .get_mut(&id.0)
            .expect("buffers with queued work are never freed")
    }

    /// Checks that `[offset, offset + len)` lies inside the buffer.
    pub fn check_range(&self, id: BufferId, offset: usize, len: usize, what: &str) -> Result<()> {
        let size = self.get(id)?.len();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::InvalidHandle(format!(
                "{what}: range {offset}..{offset}+{len} lies outside buffer {} of {size} bytes",
                id.0
            ))),
        }
    }

    /// Frees a buffer; fails while work on it is still queued.
    pub fn remove(&mut self, id: BufferId) -> Result<Buffer> {
        if self.get(id)?.queued > 0 {
            return Err(Error::InvalidHandle(format!(
                "buffer {} still has queued work: synchronize its streams before freeing it",
                id.0
            )));
        }
        Ok(self.buffers.remove(&id.0).expect("checked above"))
    }

    /// Writes bytes now (host writes, and the stores of kernels as they end).
    pub fn write(&mut self, id: BufferId, offset: usize, bytes: &[u8]) -> Result<()> {
        self.check_range(id, offset, bytes.len(), "write")?;
        let b = self.get_mut(id);
        b.protect(offset, bytes.len(), None);
        b.data[offset..offset + bytes.len()].copy_from_slice(bytes);
        Ok(())
    }

    pub fn read(&self, id: BufferId, offset: usize, out: &mut [u8]) -> Result<()> {
        self.check_range(id, offset, out.len(), "read")?;
        out.copy_from_slice(&self.get(id)?.data[offset..offset + out.len()]);
        Ok(())
    }

    /// The whole buffer, for kernels that read it when they start.
    pub fn bytes(&self, id: BufferId) -> Result<&[u8]> {
        Ok(&self.get(id)?.data)
    }

    /// Counts one more queued operation on each of `ids`.
    pub fn retain(&mut self, ids: &[BufferId]) {
        for &id in ids {
            self.get_mut(id).queued += 1;
        }
    }

    pub fn release(&mut self, ids: &[BufferId]) {
        for &id in ids {
            self.get_mut(id).queued -= 1;
        }
    }

    /// A copy `op` starts reading `[offset, offset + len)` of `src`.
    pub fn begin_read(&mut self, op: u64, src: BufferId, offset: usize, len: usize) {
        self.get_mut(src).readers.push(Reader {
            op,
            offset,
            len,
            saved: None,
        });
    }

    /// Copy `op` ends: its destination receives the source bytes as they were when it started.
    pub fn finish_copy(&mut self, op: u64, copy: &crate::backend::BufferCopy) {
        let src = self.get_mut(copy.src);
        let at = src
            .readers
            .iter()
            .position(|r| r.op == op)
            .expect("a copy registers as a reader when it starts");
        let saved = src.readers.swap_remove(at).saved;
        let (dst_at, len) = (copy.dst_offset, copy.len);
        self.get_mut(copy.dst).protect(dst_at, len, None);
        match saved {
            Some(bytes) => {
                self.get_mut(copy.dst).data[dst_at..dst_at + len].copy_from_slice(&bytes)
            }
            None if copy.src == copy.dst => {
                let src_at = copy.src_offset;
                self.get_mut(copy.dst)
                    .data
                    .copy_within(src_at..src_at + len, dst_at);
            }
            None => {
                // Two buffers of one map: move the destination's bytes out for the borrow.
                let mut dst = std::mem::take(&mut self.get_mut(copy.dst).data);
                let src = &self.get_mut(copy.src).data;
                dst[dst_at..dst_at + len]
                    .copy_from_slice(&src[copy.src_offset..copy.src_offset + len]);
                self.get_mut(copy.dst).data = dst;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::BufferCopy;

    fn copy(
        src: BufferId,
        src_offset: usize,
        dst: BufferId,
        dst_offset: usize,
        len: usize,
    ) -> BufferCopy {
        BufferCopy {
            dst,
            dst_offset,
            src,
            src_offset,
            len,
        }
    }

    #[test]
    fn a_copy_delivers_the_source_as_it_was_when_it_started() {
        let mut s = Store::default();
        let a = s.insert(Memory::Device(0), 8);
        let b = s.insert(Memory::Device(0), 8);
        s.write(a, 0, &[1; 8]).unwrap();
        s.begin_read(7, a, 0, 8);
        s.write(a, 2, &[9; 2]).unwrap(); // overwritten while the copy is in flight
        s.finish_copy(7, &copy(a, 0, b, 0, 8));
        let mut out = [0; 8];
        s.read(b, 0, &mut out).unwrap();
        assert_eq!(out, [1; 8]);
    }

    #[test]
    fn overlapping_copy_inside_one_buffer_moves_like_memmove() {
        let mut s = Store::default();
        let a = s.insert(Memory::Device(0), 6);
        s.write(a, 0, &[1, 2, 3, 4, 5, 6]).unwrap();
        s.begin_read(1, a, 0, 4);
        s.finish_copy(1, &copy(a, 0, a, 2, 4));
        let mut out = [0; 6];
        s.read(a, 0, &mut out).unwrap();
        assert_eq!(out, [1, 2, 1, 2, 3, 4]);
    }

    #[test]
    fn ranges_are_checked_without_overflow() {
        let mut s = Store::default();
        let a = s.insert(Memory::Device(0), 16);
        assert!(s.check_range(a, 8, 8, "t").is_ok());
        assert!(s.check_range(a, 9, 8, "t").is_err());
        assert!(s.check_range(a, usize::MAX, 2, "t").is_err());
        assert!(s.write(a, 15, &[0, 0]).is_err());
    }
}
