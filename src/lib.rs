//! peerlink: see, measure and speed up GPU-to-GPU (peer-to-peer) traffic on multi-GPU hosts.
//!
//! - [`topology`]: which pairs can use P2P, over what, and what is wrong.
//! - [`backend`]: the seam between peerlink and a host — real GPUs ([`backend::cuda`]) or a simulated
//!   host that moves real bytes on a virtual clock ([`backend::sim`]).
//! - [`model`]: what each hop of a transfer costs (`α + bytes/β`), measured or from the topology.
//! - [`engine`]: the transfer engine — plans and moves data between GPUs by the fastest way the
//!   model predicts.
//! - [`bench`](mod@bench): all measuring, through one timing core, one median and one data pattern: the
//!   bandwidth and latency tests, sweeps, the latency breakdown (`explain`), `tune`, and the
//!   engine's proofs (its picks timed against every alternative).
//! - [`units`]: byte sizes as users type them.
//! - [`report`]: text tables and JSON documents for the CLI's verbs.

pub mod backend;
pub mod bench;
pub mod engine;
pub mod error;
pub mod model;
pub mod report;
pub mod topology;
pub mod units;

pub use error::{Error, Result};
