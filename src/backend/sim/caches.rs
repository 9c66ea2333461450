//! What the caches hold, as far as a pointer chase can tell: the chains walked since nothing
//! evicted them.
//!
//! A real GPU serves a chain that was walked a moment ago from its caches (nvbandwidth's
//! `device_to_device_latency_sm`, the bench's `pointer-chase-resident`), and a chain that other
//! traffic pushed out from memory (the bench's `pointer-chase`, which copies a region as large as
//! the chain through each GPU's memory before every sample). The simulator keeps no cache lines:
//!
//! - a chase leaves its whole chain cached, and the next chase of that chain takes the preset's
//!   `resident_load_latency_ns` per load instead of `load_latency_ns`;
//! - work that moves at least the chain's size through the memory of the GPU holding it evicts it:
//!   a copy counts its length at each end in that memory, other stream work (a collective, a
//!   ping-pong flag) the whole of each buffer it touches there, a host write (`write`, a pattern
//!   fill) its bytes; a chase counts nothing, its loads being the chain's own;
//! - writing the chain, or freeing it, evicts it at once.
//!
//! All of it in the order the host queues work (the simulator decides a chase's pace when it is
//! queued), and a chase recorded into a graph leaves nothing cached (it has not run): its replays
//! keep the pace the capture saw. A chain in pinned host memory is evicted only by writing it.

use super::memory::{Key, Store};
use super::scheduler::Work;
use crate::backend::Memory;
use std::collections::BTreeMap;

/// The chains the caches hold.
#[derive(Debug, Default)]
pub(super) struct Caches {
    /// Per chain: the GPU whose memory holds it (`None`: pinned host memory) and the bytes that
    /// may still move through that memory before it is evicted.
    chains: BTreeMap<Key, (Option<usize>, u64)>,
}

impl Caches {
    pub fn holds(&self, chain: Key) -> bool {
        self.chains.contains_key(&chain)
    }

    /// A chase walked `chain`: all of it is cached now.
    pub fn walked(&mut self, chain: Key, store: &Store) {
        let buffer = store.get(chain);
        let gpu = match buffer.memory {
            Memory::Device(d) | Memory::Managed(d) => Some(d),
            Memory::PinnedHost { .. } => None,
        };
        self.chains.insert(chain, (gpu, buffer.len() as u64));
    }

    /// The host wrote `len` bytes into `buffer`.
    pub fn host_wrote(&mut self, buffer: Key, len: usize, store: &Store) {
        self.chains.remove(&buffer);
        self.moved(&[(buffer, len)], store);
    }

    /// `buffer` is gone.
    pub fn freed(&mut self, buffer: Key) {
        self.chains.remove(&buffer);
    }

    /// `work` was queued to run: the bytes it moves through each GPU's memory push chains out.
    pub fn queued(&mut self, work: &Work, store: &Store) {
        let touched: Vec<(Key, usize)> = match work {
            Work::Copy { copies, .. } => copies
                .iter()
                .flat_map(|c| [(c.src, c.len), (c.dst, c.len)])
                .collect(),
            Work::Chase { .. } => return,
            other => other
                .buffers()
                .into_iter()
                .map(|b| (b, store.get(b).len()))
                .collect(),
        };
        self.moved(&touched, store);
    }

    /// Bytes moved through the memory of each buffer in `touched`.
    fn moved(&mut self, touched: &[(Key, usize)], store: &Store) {
        if self.chains.is_empty() {
            return;
        }
        for &(buffer, len) in touched {
            let Memory::Device(gpu) = store.get(buffer).memory else {
                continue;
            };
            for (holder, left) in self.chains.values_mut() {
                if *holder == Some(gpu) {
                    *left = left.saturating_sub(len as u64);
                }
            }
        }
        self.chains.retain(|_, (_, left)| *left > 0);
    }
}
