//! The transfer engine: moves data between GPUs by the fastest way the cost model predicts, and
//! proves its pick against the alternatives.
//!
//! - [`Fabric`]: the safe API — buffers on GPUs, non-blocking transfers with completion handles.
//! - [`Planner`] predicts every strategy from the [`crate::model::CostModel`] and picks one.
//! - The executors queue a plan on the backend's streams, ordered by events; [`batch`] does the
//!   same for many small messages, and [`Pattern`] replays a prepared batch.
//! - [`benchmark`] runs every strategy and the pick over a size sweep and reports the regret.

pub mod batch;
pub mod benchmark;
mod executor;
pub mod fabric;
pub mod plan;
pub mod planner;
#[cfg(test)]
mod tests;

pub use batch::Pattern;
pub use fabric::{Buffer, Fabric, FabricBuilder, Planned, Span, Transfer, TransferBuilder};
pub use plan::{BatchPlan, BatchStrategy, PathShare, Plan, Route, Strategy};
pub use planner::Planner;
