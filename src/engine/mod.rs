//! The transfer engine: moves data between GPUs by the fastest way the cost model predicts, and
//! proves its pick against the alternatives.
//!
//! - [`Planner`] predicts every strategy from the [`crate::model::CostModel`] and picks one.

pub mod plan;
pub mod planner;

pub use plan::{BatchPlan, BatchStrategy, PathShare, Plan, Route, Strategy};
pub use planner::Planner;
