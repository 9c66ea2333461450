//! Handle tables: each live resource of one kind in a slot, named by a handle that says which
//! backend issued it and which use of the slot it is.
//!
//! A handle is one u64: the issuing backend's tag (16 bits), the slot's generation (24 bits) and the
//! slot's index (24 bits). Releasing a resource bumps its slot's generation, so a released handle
//! never names the resource that takes its slot next; the tag tells another backend's handles from
//! this one's. Lookups are an index and two comparisons: the engine makes several per transfer.

use crate::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

const INDEX_BITS: u32 = 24;
const GENERATION_BITS: u32 = 24;
const INDEX_MASK: u64 = (1 << INDEX_BITS) - 1;
const GENERATION_MASK: u64 = (1 << GENERATION_BITS) - 1;
const TAG_SHIFT: u32 = INDEX_BITS + GENERATION_BITS;
const TAG_MASK: u64 = 0xffff;

/// The slot index of a handle, which is how handles print.
pub(super) fn handle_index(id: u64) -> u64 {
    id & INDEX_MASK
}

/// A tag for the next backend opened in this process. Tags wrap after 65536 backends, from where
/// telling another backend's handle apart is best effort.
pub(super) fn next_tag() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) & TAG_MASK
}

struct Slot<T> {
    generation: u64,
    item: Option<T>,
}

/// The live resources of one kind.
pub(super) struct Table<T> {
    /// What the handles name, for messages (`buffer`, `stream`, …).
    kind: &'static str,
    tag: u64,
    slots: Vec<Slot<T>>,
    /// Indices of empty slots, reused last-freed first.
    free: Vec<usize>,
}

impl<T> Table<T> {
    pub(super) fn new(kind: &'static str, tag: u64) -> Self {
        Table {
            kind,
            tag,
            slots: Vec::new(),
            free: Vec::new(),
        }
    }

    /// Files `item` and returns its handle.
    pub(super) fn insert(&mut self, item: T) -> Result<u64> {
        let index = match self.free.pop() {
            Some(index) => index,
            None if self.slots.len() as u64 > INDEX_MASK => {
                return Err(Error::usage(format!(
                    "{} {}s are live at once, the most one backend holds: release some first",
                    INDEX_MASK + 1,
                    self.kind
                )))
            }
            None => {
                self.slots.push(Slot {
                    generation: 0,
                    item: None,
                });
                self.slots.len() - 1
            }
        };
        let slot = &mut self.slots[index];
        slot.item = Some(item);
        Ok(self.tag << TAG_SHIFT | slot.generation << INDEX_BITS | index as u64)
    }

    /// The slot a live handle names, or why it names none.
    fn slot(&self, id: u64) -> Result<usize> {
        let index = handle_index(id);
        if id >> TAG_SHIFT != self.tag {
            return Err(Error::InvalidHandle(format!(
                "{} {index} comes from another backend: a handle works only with the backend that \
                 issued it",
                self.kind
            )));
        }
        let live = self.slots.get(index as usize).filter(|slot| {
            slot.item.is_some() && slot.generation == (id >> INDEX_BITS) & GENERATION_MASK
        });
        match live {
            Some(_) => Ok(index as usize),
            None if (index as usize) < self.slots.len() => Err(Error::InvalidHandle(format!(
                "{} {index} was released already: it names nothing any more",
                self.kind
            ))),
            None => Err(Error::InvalidHandle(format!(
                "unknown {} {index}: this backend never issued it",
                self.kind
            ))),
        }
    }

    pub(super) fn get(&self, id: u64) -> Result<&T> {
        let index = self.slot(id)?;
        Ok(self.slots[index].item.as_ref().expect("a live slot"))
    }

    pub(super) fn get_mut(&mut self, id: u64) -> Result<&mut T> {
        let index = self.slot(id)?;
        Ok(self.slots[index].item.as_mut().expect("a live slot"))
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        self.slot(id).is_ok()
    }

    /// Takes the item out; its handle is released from now on.
    pub(super) fn remove(&mut self, id: u64) -> Result<T> {
        let index = self.slot(id)?;
        let slot = &mut self.slots[index];
        slot.generation = (slot.generation + 1) & GENERATION_MASK;
        self.free.push(index);
        Ok(slot.item.take().expect("a live slot"))
    }

    /// Whether no item is live.
    pub(super) fn is_empty(&self) -> bool {
        self.iter().next().is_none()
    }

    /// Every live item, for the backend to release as it closes.
    pub(super) fn drain(&mut self) -> Vec<T> {
        self.free.clear();
        self.slots.drain(..).filter_map(|slot| slot.item).collect()
    }

    /// Every live item.
    pub(super) fn iter(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|slot| slot.item.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_released_handle_stays_invalid_when_its_slot_is_reused() {
        let mut table = Table::new("event", 7);
        let first = table.insert('a').unwrap();
        assert_eq!(table.remove(first).unwrap(), 'a');
        let second = table.insert('b').unwrap();
        assert_eq!(handle_index(first), handle_index(second), "slot reused");
        assert_eq!(*table.get(second).unwrap(), 'b');
        let err = table.get(first).unwrap_err();
        assert!(matches!(err, Error::InvalidHandle(_)), "{err}");
        assert!(err.to_string().contains("released already"), "{err}");
        assert!(table.remove(first).is_err());
        assert_eq!(
            *table.get(second).unwrap(),
            'b',
            "a failed remove takes nothing"
        );
    }

    #[test]
    fn handles_of_another_table_tag_or_never_issued_are_refused() {
        let mut mine = Table::new("stream", 1);
        let mut other = Table::new("stream", 2);
        let theirs = other.insert(()).unwrap();
        mine.insert(()).unwrap();
        let err = mine.get(theirs).unwrap_err().to_string();
        assert!(err.contains("another backend"), "{err}");
        let unknown = 1 << TAG_SHIFT | 99;
        let err = mine.get(unknown).unwrap_err().to_string();
        assert!(err.contains("unknown stream 99"), "{err}");
    }

    #[test]
    fn drain_empties_the_table() {
        let mut table = Table::new("buffer", 3);
        let a = table.insert(1).unwrap();
        let b = table.insert(2).unwrap();
        table.remove(a).unwrap();
        assert_eq!(table.drain(), vec![2]);
        assert!(!table.contains(b));
    }
}
