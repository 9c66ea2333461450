//! Gates: pinned host flags that hold a stream behind a spinning one-thread kernel until released.
//!
//! All gates share one mapped pinned block of slots, allocated at open, so that `hold` costs a kernel
//! launch and no allocation. A slot holds two u64: the flag the kernel spins on, and where the kernel
//! notes that it gave up waiting. Tickets only grow, and the kernel waits for `flag >= ticket`, so a
//! released slot can serve the next gate at once without waking any earlier kernel early or late.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::CudaContext;

use super::abi::SPIN_TIMEOUT_NS;
use super::driver::PinnedMemory;
use crate::{Error, Result};

/// Gates that may be held at once.
const SLOTS: usize = 1024;

/// u64 words per slot: the flag, then the timed-out marker.
const WORDS_PER_SLOT: usize = 2;

/// A held gate: its slot and the ticket its kernel waits for.
pub struct Claim {
    slot: usize,
    ticket: u64,
}

/// Where the gate kernel of a claim looks.
pub(super) struct SlotAddresses {
    pub(super) flag: u64,
    pub(super) timed_out: u64,
    pub(super) ticket: u64,
}

pub(super) struct Gates {
    memory: PinnedMemory,
    free_slots: Mutex<Vec<usize>>,
    next_ticket: AtomicU64,
}

impl Gates {
    pub(super) fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        let memory = PinnedMemory::new(ctx, SLOTS * WORDS_PER_SLOT * 8)?;
        for word in 0..SLOTS * WORDS_PER_SLOT {
            memory.store_u64(word, 0);
        }
        Ok(Gates {
            memory,
            free_slots: Mutex::new((0..SLOTS).rev().collect()),
            next_ticket: AtomicU64::new(1),
        })
    }

    /// Takes a free slot with a fresh ticket.
    pub(super) fn claim(&self) -> Result<(Claim, SlotAddresses)> {
        let slot = self
            .free_slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .pop()
            .ok_or_else(|| {
                Error::usage(format!(
                    "{SLOTS} streams are already held: release some gates before holding more"
                ))
            })?;
        let ticket = self.next_ticket.fetch_add(1, Ordering::Relaxed);
        let base = self.memory.address() + (slot * WORDS_PER_SLOT * 8) as u64;
        let addresses = SlotAddresses {
            flag: base,
            timed_out: base + 8,
            ticket,
        };
        Ok((Claim { slot, ticket }, addresses))
    }

    /// Gives back a claim whose kernel never launched.
    pub(super) fn abandon(&self, claim: Claim) {
        self.free_slots
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(claim.slot);
    }

    /// Opens a gate. Fails, after opening it, if its kernel had already given up waiting: the work
    /// behind it then started before the release, and any GPU-time window around it is not valid.
    pub(super) fn release(&self, claim: Claim) -> Result<()> {
        let timed_out = self.open(&claim);
        self.abandon(claim);
        if timed_out {
            return Err(Error::Cuda {
                call: "release".into(),
                message: format!(
                    "the gate's spin kernel gave up after {} s, before the release: the work queued \
                     behind it did not wait, so its timing is not valid; release sooner, or queue \
                     less work between hold and release",
                    SPIN_TIMEOUT_NS / 1_000_000_000
                ),
            });
        }
        Ok(())
    }

    /// Stores the claim's ticket in its flag; says whether the kernel had given up before.
    fn open(&self, claim: &Claim) -> bool {
        let word = claim.slot * WORDS_PER_SLOT;
        self.memory.store_u64(word, claim.ticket);
        self.memory.load_u64(word + 1) == claim.ticket
    }
}
