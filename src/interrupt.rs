//! Stopping a long run early, keeping what it measured.
//!
//! The library installs no signal handler: a program that wants Ctrl-C to stop a measurement (the
//! `peerlink` command does) calls [`request`] from its handler. Measuring loops ask [`requested`]
//! between operations and between samples (an atomic load: cheap enough for every operation), and
//! the backends ask it while they wait for the GPUs, so that a stop ends even one long
//! measurement at once: the measurement in progress is dropped ([`Error::Interrupted`]), the
//! measurements finished before it are kept and returned. A document made after a request says
//! `"partial": true`.
//!
//! A wait cut short leaves the work already queued on the GPUs unfinished: it is abandoned (the
//! buffers it uses are never freed, so that freeing them does not wait for it either) and
//! [`abandoned`] says so, for the output to tell.
//!
//! [`Error::Interrupted`]: crate::Error::Interrupted

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);
static ABANDONED: AtomicBool = AtomicBool::new(false);

/// Asks every measuring loop to stop now, keeping what it measured before.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether a stop was requested.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

/// [`crate::Error::Interrupted`] where a stop was requested: what a loop returns to end the
/// measurement in progress.
pub fn check() -> crate::Result<()> {
    if requested() {
        Err(crate::Error::Interrupted)
    } else {
        Ok(())
    }
}

/// How many items a loop over a million small ones handles between two looks at the flag: a
/// look per item would cost more than some items do, and this many take well under a millisecond.
const ITEMS_PER_CHECK: usize = 4096;

/// [`check`] once every few thousand items: what a loop over item `i` of a very long list (a
/// batch's million messages) asks, cheaply.
pub fn check_every(i: usize) -> crate::Result<()> {
    if i.is_multiple_of(ITEMS_PER_CHECK) {
        check()
    } else {
        Ok(())
    }
}

/// `outcome`, with a stop ([`crate::Error::Interrupted`]) turned into `None`: what a loop that
/// keeps the measurements it finished ends on.
pub fn unless_stopped<T>(outcome: crate::Result<T>) -> crate::Result<Option<T>> {
    match outcome {
        Err(crate::Error::Interrupted) => Ok(None),
        other => other.map(Some),
    }
}

/// Records that a wait for the GPUs was cut short by a stop, leaving queued work unfinished.
pub fn abandon() {
    ABANDONED.store(true, Ordering::SeqCst);
}

/// Whether work queued on the GPUs was abandoned unfinished after a stop.
pub fn abandoned() -> bool {
    ABANDONED.load(Ordering::SeqCst)
}
