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
//! - [`check`]: a short health check for fleets — a few tests measured and compared with a
//!   baseline or with reference figures for known GPUs.
//! - [`pattern`]: the one data pattern every measurement and test moves, and the check that
//!   finds the first wrong byte; [`files`]: bounded reads of the input files users name.
//! - [`units`]: byte sizes as users type them. [`echo`]: text made safe to print (no control
//!   characters, no bidirectional overrides). [`interrupt`]: stopping a long run, keeping what
//!   it measured.
//! - [`document`]: the JSON document core — the header every document carries, schema names,
//!   reading and writing; each verb's document types live beside the verb.
//! - [`report`]: text tables, CSV, the exports and the published schema list, each renderer from
//!   its verb's document; `html` (feature `html`, on
//!   with the command line): `peerlink report`'s HTML page and its SVG charts.
//! - [`launch`]: one process per GPU — who this process is (torchrun, Slurm, Open MPI or
//!   `peerlink launch`), the rendezvous and the small messages the processes exchange.
//! - [`doctor`]: what stands between the GPUs and fast P2P, each check with its evidence, verdict
//!   and fix.
//!
//! Everything above [`backend`] runs the same on real GPUs and on the simulator, so this example
//! runs anywhere (on a GPU host, open `backend::cuda::CudaBackend` instead):
//!
//! ```
//! use peerlink::backend::{sim::SimBackend, Backend};
//! use peerlink::engine::Fabric;
//! use std::sync::Arc;
//!
//! // A simulated DGX-1: which pairs have P2P, over what link.
//! let backend: Arc<dyn Backend> = Arc::new(SimBackend::open("dgx1-v100")?);
//! let pair = backend.topology().pair(0, 3).expect("GPUs 0 and 3 exist");
//! assert_eq!(pair.link.to_string(), "NV2");
//!
//! // Move 1 MiB from GPU 0 to GPU 3 by the fastest way the engine knows.
//! let fabric = Fabric::open(backend)?;
//! let (from, to) = (fabric.alloc(0, 1 << 20)?, fabric.alloc(3, 1 << 20)?);
//! from.write(0, &[42; 1 << 20])?;
//! fabric.copy(from.all(), to.all())?.wait()?;
//! assert_eq!(to.to_vec()?, vec![42; 1 << 20]);
//! # Ok::<(), peerlink::Error>(())
//! ```
//!
//! The design, the contracts scripts rely on (verbs, JSON fields, exit codes) and the figures the code
//! cites are in the repository's `docs/` folder.

pub mod backend;
pub mod bench;
pub mod check;
pub mod doctor;
pub mod document;
pub mod echo;
pub mod engine;
pub mod error;
pub mod files;
#[cfg(feature = "html")]
pub mod html;
pub mod interrupt;
pub mod launch;
pub mod model;
pub mod pattern;
pub mod report;
pub mod topology;
pub mod units;
pub mod workload;

pub use error::{Error, Result};
