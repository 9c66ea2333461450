//! The simulator's buffers: real bytes in host memory.
//!
//! A copy reads its source when it starts and writes its destination when it ends, in virtual time.
//! Snapshotting every source at start would double the memory of large transfers, so a copy in
//! flight only registers as a reader; whoever overwrites a range that a reader still needs (another
//! copy ending, the host writing) first saves the reader's bytes. Without such a write, the copy
//! moves the bytes straight from the source when it ends, at memcpy speed.
//!
//! Every byte of a buffer is host memory: an allocation the host cannot back is refused like a GPU's
//! out-of-memory, never left to abort the process later. Buffers are mapped lazily (zero pages until
//! written), so the host's free memory does not yet show those allocated but not yet written: the
//! store counts every byte it holds against what the host had free when it opened, as if written.
//!
//! A buffer shared with another process (exported or imported) keeps its bytes in a shared file
//! instead ([`Bytes::Shared`]): every read and write goes to the file, so each process sees the
//! other's writes as soon as they are made.

use crate::backend::{host_memory, BufferCopy, Memory};
use crate::{Error, Result};
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fs::File;
use std::os::unix::fs::FileExt;

/// A buffer of the store. The checked layer above the simulator names buffers by handle and hands
/// the simulator this key, so every key the store is asked about is live.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key(u64);

/// Where the simulator's made-up device addresses start: the top bit, which no user-space address
/// of x86-64 or AArch64 has, so that a real address handed to the simulator names no buffer.
const ADDRESS_BASE: u64 = 1 << 63;
/// A buffer's made-up address is its key times 2^32 above the base (distinct for the first 2^31
/// keys, a billion allocations): starts are the only addresses the simulator lends (see
/// [`Store::borrow`]).
const ADDRESS_STEP_BITS: u32 = 32;

impl Key {
    /// The buffer's made-up unified address.
    pub fn address(self) -> u64 {
        ADDRESS_BASE + (self.0 << ADDRESS_STEP_BITS)
    }

    /// The buffer whose first byte `address` is, if it names a start at all.
    fn at(address: u64) -> Option<Key> {
        let offset = address.checked_sub(ADDRESS_BASE)?;
        let step_mask = (1 << ADDRESS_STEP_BITS) - 1;
        (offset & step_mask == 0).then_some(Key(offset >> ADDRESS_STEP_BITS))
    }
}

/// A copy in flight that still needs a source range as it was when the copy started.
struct Reader {
    offset: usize,
    len: usize,
    saved: Option<Vec<u8>>,
}

/// Where a buffer's bytes are.
enum Bytes {
    /// This process's memory.
    Local(Vec<u8>),
    /// A file shared with other processes, `len` bytes from its start.
    Shared { file: File, len: usize },
}

/// Reads and writes of a shared file: tmpfs pages, already written in full by the exporter (see
/// [`Store::share`]), so neither can run out of space or fail short of a broken host.
const SHARED_FILE_IO: &str = "reading or writing a shared buffer's tmpfs file";

impl Bytes {
    fn len(&self) -> usize {
        match self {
            Bytes::Local(data) => data.len(),
            Bytes::Shared { len, .. } => *len,
        }
    }

    fn read_at(&self, offset: usize, out: &mut [u8]) {
        match self {
            Bytes::Local(data) => out.copy_from_slice(&data[offset..offset + out.len()]),
            Bytes::Shared { file, .. } => file
                .read_exact_at(out, offset as u64)
                .expect(SHARED_FILE_IO),
        }
    }

    fn write_at(&mut self, offset: usize, bytes: &[u8]) {
        match self {
            Bytes::Local(data) => data[offset..offset + bytes.len()].copy_from_slice(bytes),
            Bytes::Shared { file, .. } => file
                .write_all_at(bytes, offset as u64)
                .expect(SHARED_FILE_IO),
        }
    }

    /// `len` bytes from `offset`: borrowed where they are local, read out of a shared file.
    fn slice(&self, offset: usize, len: usize) -> Cow<'_, [u8]> {
        match self {
            Bytes::Local(data) => Cow::Borrowed(&data[offset..offset + len]),
            Bytes::Shared { .. } => {
                let mut out = vec![0; len];
                self.read_at(offset, &mut out);
                Cow::Owned(out)
            }
        }
    }

    /// Lets `make` change `len` bytes from `offset` in place.
    fn modify(&mut self, offset: usize, len: usize, make: impl FnOnce(&mut [u8])) {
        match self {
            Bytes::Local(data) => make(&mut data[offset..offset + len]),
            Bytes::Shared { .. } => {
                let mut bytes = self.slice(offset, len).into_owned();
                make(&mut bytes);
                self.write_at(offset, &bytes);
            }
        }
    }
}

pub(super) struct Buffer {
    pub memory: Memory,
    data: Bytes,
    /// Whether the buffer is another process's, opened here (its memory is not this process's to
    /// count).
    pub imported: bool,
    /// Operations queued or running that touch this buffer.
    queued: usize,
    /// By operation: a batch's million copies each find theirs at once, not by a scan of all.
    readers: BTreeMap<u64, Reader>,
}

impl Buffer {
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Saves the bytes of every reader (but `except`) that overlaps `[offset, offset + len)`.
    fn protect(&mut self, offset: usize, len: usize, except: Option<u64>) {
        let data = &self.data;
        for (&op, r) in &mut self.readers {
            let overlaps = r.offset < offset + len && offset < r.offset + r.len;
            if overlaps && r.saved.is_none() && Some(op) != except {
                r.saved = Some(data.slice(r.offset, r.len).into_owned());
            }
        }
    }
}

/// A borrowed handle on a buffer of the store.
struct Alias {
    owner: u64,
    /// Operations queued or running through this handle: it resolves until they are done, even
    /// once forgotten (a real GPU runs work queued on borrowed memory after the handle goes).
    queued: usize,
    forgotten: bool,
}

pub(super) struct Store {
    buffers: BTreeMap<u64, Buffer>,
    /// Borrowed handles (`borrow_memory`), by key: both keys reach the same bytes.
    aliases: BTreeMap<u64, Alias>,
    next_id: u64,
    /// Bytes of all buffers held.
    held: u64,
    /// What the host had free when the store opened (`None`: the host does not say).
    host_free_at_open: Option<u64>,
}

impl Store {
    pub fn new() -> Store {
        Store {
            buffers: BTreeMap::new(),
            aliases: BTreeMap::new(),
            next_id: 0,
            held: 0,
            host_free_at_open: host_memory::free(),
        }
    }

    /// Host bytes the store may still take: no more than the host has free now (less a margin, see
    /// [`host_memory::free`]), nor than it had when the store opened less every byte held since.
    pub fn host_free(&self) -> Option<u64> {
        let since_open = self
            .host_free_at_open
            .map(|free| free.saturating_sub(self.held));
        match (host_memory::free(), since_open) {
            (Some(now), Some(since_open)) => Some(now.min(since_open)),
            (now, since_open) => now.or(since_open),
        }
    }

    /// Bytes of this process's buffers the store holds.
    pub fn held(&self) -> u64 {
        self.held
    }

    /// A buffer of `bytes` zeroed bytes, refused where the host cannot back it ([`Store::host_free`]).
    pub fn insert(&mut self, memory: Memory, bytes: usize) -> Result<Key> {
        if let Some(free) = self.host_free().filter(|&free| bytes as u64 > free) {
            return Err(Error::OutOfMemory {
                place: match memory {
                    Memory::Device(d) => {
                        format!("the host, which holds simulated GPU {d}'s memory")
                    }
                    Memory::Managed(_) => {
                        "the host, which holds the simulated managed memory".to_string()
                    }
                    Memory::PinnedHost { .. } => "the host".to_string(),
                },
                asked: bytes as u64,
                free,
            });
        }
        Ok(self.file(memory, Bytes::Local(vec![0; bytes]), false))
    }

    /// Files a buffer and returns its key; the one place a buffer's bytes are counted as held
    /// (another process's, imported, are that process's to count).
    fn file(&mut self, memory: Memory, data: Bytes, imported: bool) -> Key {
        self.next_id += 1;
        if !imported {
            self.held += data.len() as u64;
        }
        let buffer = Buffer {
            memory,
            data,
            imported,
            queued: 0,
            readers: BTreeMap::new(),
        };
        self.buffers.insert(self.next_id, buffer);
        Key(self.next_id)
    }

    /// Moves a buffer's bytes into a shared file (once; later calls find it there) and returns a
    /// handle on the file for another process. The bytes are written out in full, so that the file
    /// owns every page it will ever need.
    pub fn share(&mut self, key: Key) -> Result<File> {
        let buffer = self.get_mut(key);
        if let Bytes::Local(data) = &buffer.data {
            let file = crate::backend::shared_file::create(data.len())?;
            file.write_all_at(data, 0).map_err(|source| Error::Io {
                path: "(a shared buffer's tmpfs file)".into(),
                source,
            })?;
            let len = data.len();
            buffer.data = Bytes::Shared { file, len };
        }
        let Bytes::Shared { file, .. } = &buffer.data else {
            unreachable!("moved into a file above")
        };
        file.try_clone().map_err(|source| Error::Io {
            path: "(a shared buffer's tmpfs file)".into(),
            source,
        })
    }

    /// Files another process's buffer of `len` bytes, kept in `file`.
    pub fn import(&mut self, memory: Memory, file: File, len: usize) -> Key {
        self.file(memory, Bytes::Shared { file, len }, true)
    }

    /// The made-up unified address of what a key reaches: a borrowed handle's is its owner's.
    pub fn address(&self, key: Key) -> u64 {
        Key(self.id(key)).address()
    }

    /// The buffer a key reaches: its own, or the one a borrowed handle stands for.
    fn id(&self, key: Key) -> u64 {
        self.aliases.get(&key.0).map_or(key.0, |alias| alias.owner)
    }

    pub fn get(&self, key: Key) -> &Buffer {
        self.buffers
            .get(&self.id(key))
            .expect("the checked layer passes live buffers")
    }

    fn get_mut(&mut self, key: Key) -> &mut Buffer {
        let id = self.id(key);
        self.buffers
            .get_mut(&id)
            .expect("the checked layer passes live buffers, and those with queued work stay")
    }

    /// A second handle on the device buffer whose first byte `address` is, of `bytes` at most its
    /// length, on GPU `device`: the simulator's `borrow_memory`.
    pub fn borrow(&mut self, device: usize, address: u64, bytes: usize) -> Result<Key> {
        let found = Key::at(address)
            .filter(|key| !self.aliases.contains_key(&key.0))
            .and_then(|key| Some((key, self.buffers.get(&key.0)?)));
        let Some((key, buffer)) = found else {
            return Err(Error::usage(format!(
                "no simulated buffer starts at {address:#x}: the simulator lends only its own \
                 device buffers, from their first byte (their device_address)"
            )));
        };
        if buffer.memory != Memory::Device(device) {
            return Err(Error::usage(format!(
                "the memory at {address:#x} is not GPU {device}'s (it is {}); name the GPU the \
                 memory is on",
                buffer.memory
            )));
        }
        if bytes > buffer.len() {
            return Err(Error::usage(format!(
                "{bytes} bytes at {address:#x} run past the end of their allocation on GPU \
                 {device} ({} bytes); borrow only memory the owner allocated",
                buffer.len()
            )));
        }
        self.next_id += 1;
        let alias = Alias {
            owner: key.0,
            queued: 0,
            forgotten: false,
        };
        self.aliases.insert(self.next_id, alias);
        Ok(Key(self.next_id))
    }

    /// Forgets a borrowed handle (the buffer stays its owner's) once the work queued through it is
    /// done; false for a buffer's own key.
    pub fn forget_borrowed(&mut self, key: Key) -> bool {
        let Some(alias) = self.aliases.get_mut(&key.0) else {
            return false;
        };
        alias.forgotten = true;
        if alias.queued == 0 {
            self.aliases.remove(&key.0);
        }
        true
    }

    /// Frees a buffer; refuses while work on it is still queued (a real GPU would go on using the
    /// memory after it was freed), or while a borrowed handle still reaches it.
    pub fn remove(&mut self, key: Key) -> Result<Buffer> {
        if self.get(key).queued > 0 {
            return Err(Error::usage(
                "a buffer with queued work cannot be freed: synchronize its streams first",
            ));
        }
        if self
            .aliases
            .values()
            .any(|alias| alias.owner == key.0 && !alias.forgotten)
        {
            return Err(Error::usage(
                "a simulated buffer another handle borrows cannot be freed: free the borrowed \
                 handles first",
            ));
        }
        let buffer = self.buffers.remove(&key.0).expect("checked above");
        if !buffer.imported {
            self.held -= buffer.len() as u64;
        }
        Ok(buffer)
    }

    /// Writes bytes now (host writes, and the stores of kernels as they end); the range lies inside
    /// the buffer.
    pub fn write(&mut self, key: Key, offset: usize, bytes: &[u8]) {
        let b = self.get_mut(key);
        b.protect(offset, bytes.len(), None);
        b.data.write_at(offset, bytes);
    }

    /// Writes `len` bytes from `offset` now as `make` makes them in place (the pattern calls);
    /// the range lies inside the buffer.
    pub fn write_with(
        &mut self,
        key: Key,
        offset: usize,
        len: usize,
        make: impl FnOnce(&mut [u8]),
    ) {
        let b = self.get_mut(key);
        b.protect(offset, len, None);
        b.data.modify(offset, len, make);
    }

    /// Reads bytes now; the range lies inside the buffer.
    pub fn read(&self, key: Key, offset: usize, out: &mut [u8]) {
        self.get(key).data.read_at(offset, out);
    }

    /// `len` bytes from `offset`, for kernels that read them when they start.
    pub fn bytes(&self, key: Key, offset: usize, len: usize) -> Cow<'_, [u8]> {
        self.get(key).data.slice(offset, len)
    }

    /// Counts one more queued operation on each of `ids`.
    pub fn retain(&mut self, ids: &[Key]) {
        for &id in ids {
            self.get_mut(id).queued += 1;
            if let Some(alias) = self.aliases.get_mut(&id.0) {
                alias.queued += 1;
            }
        }
    }

    pub fn release(&mut self, ids: &[Key]) {
        for &id in ids {
            self.get_mut(id).queued -= 1;
            if let Some(alias) = self.aliases.get_mut(&id.0) {
                alias.queued -= 1;
                if alias.forgotten && alias.queued == 0 {
                    self.aliases.remove(&id.0);
                }
            }
        }
    }

    /// A copy `op` starts reading `[offset, offset + len)` of `src`.
    pub fn begin_read(&mut self, op: u64, src: Key, offset: usize, len: usize) {
        self.get_mut(src).readers.insert(
            op,
            Reader {
                offset,
                len,
                saved: None,
            },
        );
    }

    /// Copy `op` ends: its destination receives the source bytes as they were when it started.
    pub fn finish_copy(&mut self, op: u64, copy: &BufferCopy<Key>) {
        let src = self.get_mut(copy.src);
        let saved = src
            .readers
            .remove(&op)
            .expect("a copy registers as a reader when it starts")
            .saved;
        let (dst_at, len) = (copy.dst_offset, copy.len);
        self.get_mut(copy.dst).protect(dst_at, len, None);
        match saved {
            Some(bytes) => self.get_mut(copy.dst).data.write_at(dst_at, &bytes),
            None if self.id(copy.src) == self.id(copy.dst) => {
                let src_at = copy.src_offset;
                match &mut self.get_mut(copy.dst).data {
                    Bytes::Local(data) => data.copy_within(src_at..src_at + len, dst_at),
                    shared => {
                        let bytes = shared.slice(src_at, len).into_owned();
                        shared.write_at(dst_at, &bytes);
                    }
                }
            }
            None => {
                // Two buffers of one map: move the destination's bytes out for the borrow.
                let placeholder = Bytes::Local(Vec::new());
                let mut dst = std::mem::replace(&mut self.get_mut(copy.dst).data, placeholder);
                let src = &self.get(copy.src).data;
                dst.write_at(dst_at, &src.slice(copy.src_offset, len));
                self.get_mut(copy.dst).data = dst;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(
        src: Key,
        src_offset: usize,
        dst: Key,
        dst_offset: usize,
        len: usize,
    ) -> BufferCopy<Key> {
        BufferCopy {
            dst,
            dst_offset,
            src,
            src_offset,
            len,
        }
    }

    #[test]
    fn each_buffer_is_held_once_from_its_allocation_to_its_free() {
        let mut s = Store::new();
        let a = s.insert(Memory::Device(0), 1000).unwrap();
        assert_eq!(s.held(), 1000);
        let b = s
            .insert(Memory::PinnedHost { numa_node: None }, 24)
            .unwrap();
        assert_eq!(s.held(), 1024);
        s.remove(a).unwrap();
        assert_eq!(s.held(), 24);
        s.remove(b).unwrap();
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn another_process_buffer_is_not_held_here() {
        let mut s = Store::new();
        let file = crate::backend::shared_file::create(4096).unwrap();
        let key = s.import(Memory::Device(1), file, 4096);
        assert_eq!(s.held(), 0);
        s.remove(key).unwrap();
        assert_eq!(s.held(), 0);
    }

    #[test]
    fn a_copy_delivers_the_source_as_it_was_when_it_started() {
        let mut s = Store::new();
        let a = s.insert(Memory::Device(0), 8).unwrap();
        let b = s.insert(Memory::Device(0), 8).unwrap();
        s.write(a, 0, &[1; 8]);
        s.begin_read(7, a, 0, 8);
        s.write(a, 2, &[9; 2]); // overwritten while the copy is in flight
        s.finish_copy(7, &copy(a, 0, b, 0, 8));
        let mut out = [0; 8];
        s.read(b, 0, &mut out);
        assert_eq!(out, [1; 8]);
    }

    #[test]
    fn a_copy_within_one_buffer_moves_its_range() {
        let mut s = Store::new();
        let a = s.insert(Memory::Device(0), 6).unwrap();
        s.write(a, 0, &[1, 2, 3, 4, 5, 6]);
        s.begin_read(1, a, 0, 2);
        s.finish_copy(1, &copy(a, 0, a, 4, 2));
        let mut out = [0; 6];
        s.read(a, 0, &mut out);
        assert_eq!(out, [1, 2, 3, 4, 1, 2]);
    }
}
