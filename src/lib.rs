//! peerlink: see, measure and speed up GPU-to-GPU (peer-to-peer) traffic on multi-GPU hosts.
//!
//! - [`topology`]: which pairs can use P2P, over what, and what is wrong.
//! - [`backend`]: the seam between peerlink and a host — real GPUs ([`backend::cuda`]) or a simulated
//!   host that moves real bytes on a virtual clock ([`backend::sim`]).
//! - [`bench`]: bandwidth and latency tests, sweeps and the latency breakdown, through the backend.
//! - [`engine`]: the transfer engine — plans, runs and proves the fastest way between two GPUs.
//! - [`model`]: what each hop of a transfer costs (`α + bytes/β`), measured or from the topology.
//! - [`units`]: byte sizes as users type them.
//! - [`document`]: every JSON document, typed, with the header they all carry and their schemas.
//! - [`report`]: text tables and CSV for the CLI's verbs.

pub mod backend;
pub mod bench;
pub mod document;
pub mod engine;
pub mod error;
pub mod model;
pub mod report;
pub mod topology;
pub mod units;

pub use error::{Error, Result};
