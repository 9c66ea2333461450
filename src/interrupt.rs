//! Stopping a long run early, keeping what it measured.
//!
//! The library installs no signal handler: a program that wants Ctrl-C to stop a measurement (the
//! `peerlink` command does) calls [`request`] from its handler. Measuring loops ask [`requested`]
//! between measurements — never inside one, so a figure is never half-timed — stop issuing work, let
//! what is queued finish and release what they made on the way out, and return what they measured.
//! A document made after a request says `"partial": true`.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// Asks every measuring loop to stop after its current measurement.
pub fn request() {
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Whether a stop was requested.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
