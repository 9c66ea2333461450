//! `peerlink workload`: the work GPU-to-GPU traffic exists for — an all-reduce, messages between
//! neighbouring GPUs, a pipeline's activations, a halo exchange — run by peerlink and, where the
//! host has it, by NCCL, side by side in one run, every byte verified.
//!
//! Timed as nccl-tests times: every rank (one per GPU) gets its own stream; warm-up operations, then
//! `iters` operations back to back on every rank's stream, GPU events around the loop on each, every
//! stream held behind a gate while the host queues, so that the host's issue cost stays out
//! ([`crate::bench::timing::held_group_us`]); the time per operation is the slowest rank's
//! (end − start) / iters. The loop is issued by one host thread, or captured into a CUDA graph per
//! stream and replayed (`--issue graphs`). After timing, each contender runs once more into
//! poisoned outputs and every byte is checked against what the host computed.
//!
//! - [`all_reduce`]: peerlink's one-shot, two-shot and one-shot-packets kernels and the cost
//!   model's pick among them, against `ncclAllReduce`;
//! - [`send_recv`]: the transfer engine between consecutive GPUs, one way and both ways at once,
//!   against NCCL send/recv;
//! - [`pipeline`]: each stage's stand-in compute overlapped with handing its activation to the
//!   next, double-buffered: the communication left exposed;
//! - [`halo`]: 1-D and 2-D domain decompositions exchanging boundary faces with every neighbour.

pub mod all_reduce;
pub mod document;
pub mod halo;
pub mod kinds;
pub mod pipeline;
pub mod processes;
mod resources;
pub mod rows;
pub mod send_recv;
pub mod settings;
pub mod timing;

use crate::backend::Backend;
use crate::bench::layout::Layout;
use crate::bench::progress::Progress;
use crate::Result;
use kinds::{ProcessLayout, Variant, Workload};
use rows::{compare, Report};
use settings::{Options, Settings};
use std::sync::Arc;
use timing::TIMING;

/// Runs `workload` laid out as `layout` says: in this process ([`run`]), or as this rank of a
/// group, one GPU each ([`processes::run`]), where rank 0 returns what every rank measured and the
/// others `None`.
pub fn run_laid_out(
    layout: Layout<'_>,
    backend: &Arc<dyn Backend>,
    workload: Workload,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Option<Report>> {
    match layout {
        Layout::OneProcess => run(backend, workload, options, progress).map(Some),
        Layout::RankPerProcess(group) => {
            processes::run(backend, group, workload, options, progress)
        }
    }
}

/// Runs `workload` on `backend` with `options`.
pub fn run(
    backend: &Arc<dyn Backend>,
    workload: Workload,
    options: &Options,
    progress: &dyn Progress,
) -> Result<Report> {
    let mut settings = Settings::resolve(backend.as_ref(), workload, options)?;
    let mut rows = match workload {
        Workload::AllReduce => all_reduce::run(backend, &mut settings, options.dtype, progress)?,
        Workload::SendRecv => send_recv::run(
            backend,
            &mut settings,
            options
                .directions
                .as_deref()
                .unwrap_or(&[Variant::OneWay, Variant::BothWays]),
            progress,
        )?,
        Workload::Pipeline => pipeline::run(
            backend.as_ref(),
            &mut settings,
            options.compute_us.unwrap_or(pipeline::DEFAULT_COMPUTE_US),
            progress,
        )?,
        Workload::Halo => halo::run(
            backend.as_ref(),
            &mut settings,
            options
                .dims
                .as_deref()
                .unwrap_or(&[Variant::OneD, Variant::TwoD]),
            progress,
        )?,
    };
    compare(&mut rows);
    Ok(Report {
        source: backend.source().clone(),
        workload,
        devices: settings.devices.clone(),
        process_layout: ProcessLayout::OneProcess,
        warmup: settings.warmup,
        timing: TIMING,
        rows,
        notices: settings.notices,
    })
}

#[cfg(test)]
mod tests;
