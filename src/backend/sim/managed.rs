//! Managed memory on the simulator: where each page of a managed buffer lives, and what a touch or
//! a prefetch moves.
//!
//! The store keeps one copy of every buffer's bytes, so where a page lives changes no byte: it
//! prices the work. Pages move when the work that moves them is queued, in queue order — the order
//! in which peerlink's tests and callers synchronise — so work on two streams racing over the same
//! pages is not modelled, and a captured graph replays the moves decided at its capture.

use super::memory::Key;
use crate::backend::{Advice, Location};
use crate::{Error, Result};
use std::collections::BTreeMap;

/// The places one page lives in: bit 0 host memory, bit `1 + d` GPU `d`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Holders(u64);

/// GPUs a holder set can name (one bit is the host's).
const MAX_GPUS: usize = 63;

fn bit(location: Location) -> u64 {
    match location {
        Location::Host => 1,
        Location::Device(d) => 1 << (d + 1),
    }
}

impl Holders {
    fn only(location: Location) -> Holders {
        Holders(bit(location))
    }

    fn has(self, location: Location) -> bool {
        self.0 & bit(location) != 0
    }

    fn with(self, location: Location) -> Holders {
        Holders(self.0 | bit(location))
    }

    fn duplicated(self) -> bool {
        self.0.count_ones() > 1
    }

    /// The copy a move starts from, and the one a collapse keeps: host memory first, then the GPU
    /// of lowest index (the driver's choice is arbitrary).
    fn first(self) -> Location {
        match self.0.trailing_zeros() {
            0 => Location::Host,
            b => Location::Device(b as usize - 1),
        }
    }
}

/// One managed buffer's pages and advice.
struct Pages {
    len: usize,
    holders: Vec<Holders>,
    read_mostly: bool,
    /// GPUs (bit `d`) for which the pages stay mapped wherever they live.
    accessed_by: u64,
}

/// Bytes that move from one place before (or instead of) an access, and the faults behind them.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) struct Move {
    pub from: Location,
    pub bytes: usize,
    /// Pages that faulted (0 for a prefetch). A write to a duplicated page faults without moving
    /// bytes: the other copies are dropped.
    pub faults: usize,
}

/// What a kernel's touch of a range costs: the moves before the access, and where the access then
/// finds the bytes (its own GPU, or the places it reaches over a link).
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Touch {
    pub moves: Vec<Move>,
    pub served_from: Vec<Location>,
}

/// Bytes of page `index` (of `page` bytes) in a buffer of `len` bytes: the last may be short.
fn page_bytes(page: usize, index: usize, len: usize) -> usize {
    page.min(len - index * page)
}

fn note_move(moves: &mut Vec<Move>, from: Location, bytes: usize, faults: usize) {
    match moves.iter_mut().find(|m| m.from == from) {
        Some(m) => {
            m.bytes += bytes;
            m.faults += faults;
        }
        None => moves.push(Move {
            from,
            bytes,
            faults,
        }),
    }
}

fn note_place(places: &mut Vec<Location>, place: Location) {
    if !places.contains(&place) {
        places.push(place);
    }
}

/// Every managed buffer's pages, by store key.
pub(super) struct ManagedPages {
    page: usize,
    buffers: BTreeMap<Key, Pages>,
}

impl ManagedPages {
    /// Pages of `page` bytes.
    pub fn new(page: usize) -> ManagedPages {
        ManagedPages {
            page,
            buffers: BTreeMap::new(),
        }
    }

    /// Refuses managed memory on a host with more GPUs than a page's holder set can name.
    pub fn check_gpus(gpus: usize) -> Result<()> {
        if gpus > MAX_GPUS {
            return Err(Error::usage(format!(
                "the simulator models managed memory on hosts of up to {MAX_GPUS} GPUs, and this \
                 preset has {gpus}"
            )));
        }
        Ok(())
    }

    /// A new managed buffer of `len` bytes, every page on `on`, no advice.
    pub fn insert(&mut self, key: Key, len: usize, on: Location) {
        let pages = Pages {
            len,
            holders: vec![Holders::only(on); len.div_ceil(self.page)],
            read_mostly: false,
            accessed_by: 0,
        };
        self.buffers.insert(key, pages);
    }

    pub fn remove(&mut self, key: Key) {
        self.buffers.remove(&key);
    }

    pub fn contains(&self, key: Key) -> bool {
        self.buffers.contains_key(&key)
    }

    fn pages(&mut self, key: Key) -> &mut Pages {
        self.buffers
            .get_mut(&key)
            .expect("the checked layer passes live managed buffers")
    }

    /// The pages `[offset, offset + len)` lies on (none for an empty range).
    fn page_range(&self, offset: usize, len: usize) -> std::ops::Range<usize> {
        if len == 0 {
            return 0..0;
        }
        offset / self.page..(offset + len - 1) / self.page + 1
    }

    pub fn advise(&mut self, key: Key, advice: Advice) {
        let pages = self.pages(key);
        match advice {
            Advice::SetReadMostly => pages.read_mostly = true,
            Advice::UnsetReadMostly => {
                pages.read_mostly = false;
                for h in &mut pages.holders {
                    *h = Holders::only(h.first());
                }
            }
            Advice::SetAccessedBy(d) => pages.accessed_by |= 1 << d,
            Advice::UnsetAccessedBy(d) => pages.accessed_by &= !(1 << d),
        }
    }

    /// A kernel on `gpu` reads (or, with `write`, writes) `[offset, offset + len)`. A page it lacks
    /// faults and moves to it — or, read-mostly, is duplicated there — unless the GPU has it mapped
    /// (accessed-by) where `reachable` says the place can be reached over a link: then the access
    /// crosses the link and nothing moves.
    pub fn kernel_touch(
        &mut self,
        key: Key,
        offset: usize,
        len: usize,
        gpu: usize,
        write: bool,
        reachable: impl Fn(Location) -> bool,
    ) -> Touch {
        let here = Location::Device(gpu);
        let range = self.page_range(offset, len);
        let page = self.page;
        let pages = self.pages(key);
        let mapped = pages.accessed_by & (1 << gpu) != 0;
        let mut touch = Touch::default();
        for index in range {
            let holders = pages.holders[index];
            let bytes = page_bytes(page, index, pages.len);
            if holders.has(here) {
                if write && holders.duplicated() {
                    note_move(&mut touch.moves, holders.first(), 0, 1);
                    pages.holders[index] = Holders::only(here);
                }
                note_place(&mut touch.served_from, here);
            } else if mapped && reachable(holders.first()) {
                note_place(&mut touch.served_from, holders.first());
            } else {
                note_move(&mut touch.moves, holders.first(), bytes, 1);
                pages.holders[index] = if pages.read_mostly && !write {
                    holders.with(here)
                } else {
                    Holders::only(here)
                };
                note_place(&mut touch.served_from, here);
            }
        }
        touch
    }

    /// Where a copy engine issued on `gpu` finds `[offset, offset + len)`: the GPU's own copy of a
    /// page where it has one, else the page where it lives. A copy engine faults nothing.
    pub fn served_to_copy_engine(
        &self,
        key: Key,
        offset: usize,
        len: usize,
        gpu: usize,
    ) -> Vec<Location> {
        let here = Location::Device(gpu);
        let pages = &self.buffers[&key];
        let mut places = Vec::new();
        for index in self.page_range(offset, len) {
            let holders = pages.holders[index];
            let place = if holders.has(here) {
                here
            } else {
                holders.first()
            };
            note_place(&mut places, place);
        }
        places
    }

    /// Where a kernel on `gpu` finds the buffer's first page (a pointer chase starts there).
    pub fn first_page_for(&self, key: Key, gpu: usize) -> Location {
        self.served_to_copy_engine(key, 0, 1, gpu)[0]
    }

    /// Moves every page to `to` (read-mostly: duplicates it there); returns what moved from where.
    pub fn prefetch(&mut self, key: Key, to: Location) -> Vec<Move> {
        let page = self.page;
        let pages = self.pages(key);
        let mut moves = Vec::new();
        for index in 0..pages.holders.len() {
            let bytes = page_bytes(page, index, pages.len);
            let holders = pages.holders[index];
            if holders.has(to) {
                continue;
            }
            note_move(&mut moves, holders.first(), bytes, 0);
            pages.holders[index] = if pages.read_mostly {
                holders.with(to)
            } else {
                Holders::only(to)
            };
        }
        moves
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::sim::memory::Store;
    use crate::backend::Memory;

    const PAGE: usize = 64 << 10;

    fn buffer(pages: &mut ManagedPages, len: usize, on: Location) -> Key {
        let key = Store::new().insert(Memory::Managed(0), 1).unwrap();
        pages.insert(key, len, on);
        key
    }

    fn anywhere(_: Location) -> bool {
        true
    }

    #[test]
    fn a_first_touch_faults_each_page_once_and_moves_it() {
        let mut m = ManagedPages::new(PAGE);
        let key = buffer(&mut m, 3 * PAGE + 100, Location::Device(0));
        let touch = m.kernel_touch(key, 0, 3 * PAGE + 100, 1, false, anywhere);
        assert_eq!(
            touch.moves,
            [Move {
                from: Location::Device(0),
                bytes: 3 * PAGE + 100,
                faults: 4
            }]
        );
        assert_eq!(touch.served_from, [Location::Device(1)]);
        // The pages now live on GPU 1: a second read is local, and GPU 0's read moves them back.
        let again = m.kernel_touch(key, 0, 3 * PAGE + 100, 1, false, anywhere);
        assert!(again.moves.is_empty(), "{again:?}");
        let back = m.kernel_touch(key, PAGE, 1, 0, false, anywhere);
        assert_eq!(back.moves[0].faults, 1, "one byte faults its whole page");
        assert_eq!(back.moves[0].bytes, PAGE);
    }

    #[test]
    fn accessed_by_reads_across_the_link_and_moves_nothing() {
        let mut m = ManagedPages::new(PAGE);
        let key = buffer(&mut m, 2 * PAGE, Location::Device(0));
        m.advise(key, Advice::SetAccessedBy(1));
        let touch = m.kernel_touch(key, 0, 2 * PAGE, 1, false, anywhere);
        assert!(touch.moves.is_empty());
        assert_eq!(touch.served_from, [Location::Device(0)]);
        // Without a link to reach it by, the mapping cannot serve the access: it faults.
        let unreachable = m.kernel_touch(key, 0, 1, 1, false, |_| false);
        assert_eq!(unreachable.moves[0].faults, 1);
        m.advise(key, Advice::UnsetAccessedBy(1));
        let faulted = m.kernel_touch(key, PAGE, PAGE, 1, false, anywhere);
        assert_eq!(faulted.moves[0].faults, 1);
    }

    #[test]
    fn read_mostly_duplicates_on_read_and_a_write_collapses() {
        let mut m = ManagedPages::new(PAGE);
        let key = buffer(&mut m, 2 * PAGE, Location::Device(0));
        m.advise(key, Advice::SetReadMostly);
        let first = m.kernel_touch(key, 0, 2 * PAGE, 1, false, anywhere);
        assert_eq!(first.moves[0].bytes, 2 * PAGE);
        // Both GPUs now read locally.
        assert!(m
            .kernel_touch(key, 0, 2 * PAGE, 0, false, anywhere)
            .moves
            .is_empty());
        assert!(m
            .kernel_touch(key, 0, 2 * PAGE, 1, false, anywhere)
            .moves
            .is_empty());
        // GPU 0 writes one page: it faults (dropping GPU 1's copy) without moving bytes; GPU 1's
        // next read of it moves the page again.
        let write = m.kernel_touch(key, 0, 1, 0, true, anywhere);
        assert_eq!(write.moves[0].bytes, 0);
        assert_eq!(write.moves[0].faults, 1);
        assert_eq!(
            m.kernel_touch(key, 0, 2 * PAGE, 1, false, anywhere).moves[0].faults,
            1
        );
    }

    #[test]
    fn a_prefetch_moves_what_is_elsewhere_and_unset_read_mostly_collapses() {
        let mut m = ManagedPages::new(PAGE);
        let key = buffer(&mut m, 4 * PAGE, Location::Host);
        m.kernel_touch(key, 0, PAGE, 2, false, anywhere);
        let moves = m.prefetch(key, Location::Device(2));
        assert_eq!(
            moves,
            [Move {
                from: Location::Host,
                bytes: 3 * PAGE,
                faults: 0
            }]
        );
        assert!(m.prefetch(key, Location::Device(2)).is_empty());
        m.advise(key, Advice::SetReadMostly);
        m.prefetch(key, Location::Device(0));
        assert_eq!(m.first_page_for(key, 2), Location::Device(2), "duplicated");
        m.advise(key, Advice::UnsetReadMostly);
        assert_eq!(
            m.first_page_for(key, 2),
            Location::Device(0),
            "collapsed to the lowest GPU"
        );
        assert_eq!(
            m.served_to_copy_engine(key, 0, 4 * PAGE, 0),
            [Location::Device(0)]
        );
    }
}
