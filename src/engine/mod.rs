//! The transfer engine: plans and moves data between GPUs by the fastest way the cost model
//! predicts. It measures nothing itself.
//!
//! - [`Fabric`]: the safe API — buffers on GPUs, non-blocking transfers with completion handles.
//! - [`Planner`] predicts every strategy from the [`crate::model::CostModel`] and picks one
//!   ([`plan`] holds what it decides).
//! - The executor queues a plan on the backend's streams, ordered by events; [`batch`] does the
//!   same for many small messages, and [`PreparedBatch`] replays a batch prepared once.
//! - [`all_reduce`]: peerlink's all-reduce, priced, picked and queued, in one process and across
//!   processes.
//!
//! Whether its picks are right is measured outside it, with the rest of the measuring code:
//! [`crate::bench::proof`] times every strategy against the pick.
//!
//! ```
//! use peerlink::backend::{sim::SimBackend, Backend};
//! use peerlink::engine::{Fabric, Planned, Strategy};
//! use std::sync::Arc;
//!
//! // A simulated DGX-1: GPUs 0 and 5 have no NVLink and no P2P between them.
//! let backend: Arc<dyn Backend> = Arc::new(SimBackend::open("dgx1-v100")?);
//! let fabric = Fabric::open(backend)?;
//! let src = fabric.alloc(0, 16 << 20)?;
//! let dst = fabric.alloc(5, 16 << 20)?;
//! src.write(0, &vec![7; 16 << 20])?;
//!
//! let transfer = fabric.copy(src.all(), dst.all())?; // returns at once
//! transfer.wait()?;
//! assert_eq!(dst.to_vec()?, vec![7; 16 << 20]);
//! let Planned::Single(plan) = transfer.planned() else { unreachable!() };
//! assert_eq!(plan.strategy, Strategy::Split); // both relays and the host at once
//! # Ok::<(), peerlink::Error>(())
//! ```

pub mod all_reduce;
pub mod batch;
mod executor;
pub mod fabric;
pub mod plan;
pub mod planner;
#[cfg(test)]
pub(crate) mod tests;

pub use batch::PreparedBatch;
pub use fabric::{Buffer, Fabric, FabricBuilder, Planned, Span, Transfer, TransferBuilder};
pub use plan::{BatchPlan, BatchStrategy, PathShare, Plan, Route, RouteEnd, Strategy, Ways};
pub use planner::Planner;
