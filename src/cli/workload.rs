//! `peerlink workload`: the options parsed and checked before any GPU is opened, the run, and its
//! text or JSON.

use super::args::{Global, WorkloadArgs};
use anyhow::Result;
use peerlink::backend::collective::DataType;
use peerlink::backend::Backend;
use peerlink::bench::layout::Layout;
use peerlink::launch::Group;
use peerlink::report;
use peerlink::units::parse::{parse_size, parse_sizes};
use peerlink::workload;
use peerlink::workload::document::WorkloadDocument;
use peerlink::workload::kinds::{IssueChoice, Variant, Workload};
use peerlink::workload::settings::Options;
use peerlink::Error;
use std::sync::Arc;

/// Runs the workload: in this process, or as this rank of `group` where a launcher started
/// several (rank 0 then prints what every rank measured).
pub fn run(global: &Global, args: &WorkloadArgs, group: Option<&Group>) -> Result<()> {
    let (workload, options) = options(global, args)?;
    if let Some(path) = &args.nccl_lib {
        peerlink::backend::cuda::prefer_nccl_library(path);
    }
    let backend: Arc<dyn Backend> = Arc::from(global.open()?.backend);
    if args.nccl_lib.is_some() && backend.topology().is_simulated() {
        // The same command line runs on a real host and on the simulator; there it has no
        // library to load, so it says that it leaves the option out rather than refusing.
        eprintln!(
            "peerlink: note: --nccl-lib is not used on the simulator: its NCCL rows come from \
             the simulator's model of NCCL, not from a library"
        );
    }
    let progress = global.progress();
    // Across processes rank 0 prints what every rank measured; the others print nothing.
    let layout = Layout::of(group);
    let Some(found) = workload::run_laid_out(layout, &backend, workload, &options, &*progress)?
    else {
        return Ok(());
    };
    for notice in &found.notices {
        eprintln!("peerlink: note: {}", peerlink::echo::one_line(notice));
    }
    let doc = WorkloadDocument::new(backend.topology(), &found);
    global.print(&doc, || report::workload::text(&doc))
}

/// The workload and its options, or a usage error naming what is wrong.
fn options(global: &Global, args: &WorkloadArgs) -> peerlink::Result<(Workload, Options)> {
    let workload = Workload::parse(&args.workload)?;
    let only_for = |given: bool, flag: &str, owner: Workload| {
        if given && workload != owner {
            return Err(Error::usage(format!(
                "{flag} applies to the {owner} workload only, not {workload}: leave it out"
            )));
        }
        Ok(())
    };
    only_for(args.dtype.is_some(), "--dtype", Workload::AllReduce)?;
    only_for(args.direction.is_some(), "--direction", Workload::SendRecv)?;
    only_for(
        args.compute_us.is_some(),
        "--compute-us",
        Workload::Pipeline,
    )?;
    only_for(args.dims.is_some(), "--dims", Workload::Halo)?;
    let sizes = match (&args.sizes, &args.size) {
        (Some(sizes), _) => Some(parse_sizes(sizes)?),
        (None, Some(size)) => Some(vec![parse_size(size)?]),
        (None, None) => None,
    };
    let issue = match (&args.issue, args.graphs) {
        (Some(issue), _) => IssueChoice::parse(issue)?,
        (None, true) => IssueChoice::Graphs,
        (None, false) => IssueChoice::Stream,
    };
    Ok((
        workload,
        Options {
            devices: global.devices.clone(),
            sizes,
            max_size: args.max_size.as_deref().map(parse_size).transpose()?,
            iters: args.iters,
            warmup: args.warmup,
            issue,
            dtype: args.dtype.as_deref().map(dtype).transpose()?,
            directions: args.direction.as_deref().map(directions).transpose()?,
            compute_us: args.compute_us,
            dims: args.dims.as_deref().map(dims).transpose()?,
        },
    ))
}

fn dtype(text: &str) -> peerlink::Result<DataType> {
    match text {
        "f32" => Ok(DataType::F32),
        "bf16" => Ok(DataType::Bf16),
        "f16" => Ok(DataType::F16),
        other => Err(Error::usage(format!(
            "unknown --dtype `{other}`; expected f32, bf16 or f16"
        ))),
    }
}

fn directions(text: &str) -> peerlink::Result<Vec<Variant>> {
    match text {
        "one-way" => Ok(vec![Variant::OneWay]),
        "both" => Ok(vec![Variant::BothWays]),
        "all" => Ok(vec![Variant::OneWay, Variant::BothWays]),
        other => Err(Error::usage(format!(
            "unknown --direction `{other}`; expected one-way, both or all"
        ))),
    }
}

fn dims(text: &str) -> peerlink::Result<Vec<Variant>> {
    match text {
        "1" => Ok(vec![Variant::OneD]),
        "2" => Ok(vec![Variant::TwoD]),
        "both" => Ok(vec![Variant::OneD, Variant::TwoD]),
        other => Err(Error::usage(format!(
            "unknown --dims `{other}`; expected 1, 2 or both"
        ))),
    }
}
