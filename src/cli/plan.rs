//! `peerlink plan`: how the engine would move a transfer, and with `--prove` how it did. Four modes,
//! chosen by the options given (clap keeps them apart): one transfer, a batch of messages, a sweep
//! of sizes, or every GPU sending at once.

use super::args::{Global, PlanArgs};
use anyhow::Result;
use peerlink::backend::resident::DEFAULT_COPY_BLOCKS;
use peerlink::backend::Backend;
use peerlink::bench::proof::concurrent::{self, Traffic};
use peerlink::bench::proof::document::{
    BatchView, ConcurrentView, PlanBatchDocument, PlanConcurrentDocument, PlanDocument,
    PlanSweepDocument, PlanView, SweepView,
};
use peerlink::bench::proof::{self, batch, sweep};
use peerlink::engine::Fabric;
use peerlink::model::CostModel;
use peerlink::report::plan as text;
use peerlink::units::parse::{parse_size, parse_sizes};
use std::sync::Arc;

/// What `plan` was asked to do.
enum Mode {
    /// One transfer of `size` bytes; `prove` runs every strategy.
    Single {
        src: usize,
        dst: usize,
        size: u64,
        prove: bool,
    },
    /// `count` messages of `message` bytes each; `prove` times every batch strategy.
    Batch {
        src: usize,
        dst: usize,
        count: usize,
        message: usize,
        prove: bool,
    },
    /// The engine benchmark over `sizes` (always proven).
    Sweep {
        src: usize,
        dst: usize,
        sizes: Vec<u64>,
    },
    /// Every GPU's transfer of `size` bytes at once.
    Concurrent { traffic: Traffic, size: u64 },
}

/// The most messages one batch plans: each has a copy descriptor on the host and the GPU (24 bytes),
/// and a million already amortise any launch to nothing.
const MAX_MESSAGES: usize = 1_000_000;

impl Mode {
    /// The mode the options ask for; bad values are refused before any GPU is opened.
    fn of(args: &PlanArgs) -> peerlink::Result<Mode> {
        let size = args.size.as_deref().map(parse_size).transpose()?;
        let sizes = args.sizes.as_deref().map(parse_sizes).transpose()?;
        let traffic = args.concurrent.as_deref().map(Traffic::parse).transpose()?;
        match args.messages {
            Some(0) => return Err(peerlink::Error::usage("--messages must be at least 1")),
            Some(count) if count > MAX_MESSAGES => {
                return Err(peerlink::Error::usage(format!(
                    "--messages {count} is more than peerlink plans in one batch \
                     ({MAX_MESSAGES}): send them as several batches"
                )))
            }
            _ => {}
        }
        // clap requires --src, --dst and --size or --sizes unless --concurrent, which needs --size.
        let (pair, size) = match (args.src.zip(args.dst), size) {
            (_, Some(size)) if traffic.is_some() => {
                let traffic = traffic.expect("checked just above");
                return Ok(Mode::Concurrent { traffic, size });
            }
            (Some(pair), size) => (pair, size),
            (None, _) => unreachable!("clap requires --src and --dst without --concurrent"),
        };
        let (src, dst) = pair;
        Ok(match (sizes, size, args.messages) {
            (Some(sizes), _, _) => Mode::Sweep { src, dst, sizes },
            (None, Some(size), Some(count)) => Mode::Batch {
                src,
                dst,
                count,
                message: usize::try_from(size).map_err(|_| {
                    peerlink::Error::usage("--size does not fit in this host's memory")
                })?,
                prove: args.prove,
            },
            (None, Some(size), None) => Mode::Single {
                src,
                dst,
                size,
                prove: args.prove,
            },
            (None, None, _) => unreachable!("clap requires --size without --sizes"),
        })
    }
}

pub fn run(global: &Global, args: &PlanArgs) -> Result<()> {
    let mode = Mode::of(args)?;
    let backend: Arc<dyn Backend> = Arc::from(global.open()?.backend);
    let mut fabric = Fabric::builder(backend.clone());
    if let Some(devices) = &global.devices {
        fabric = fabric.devices(devices);
    }
    if let Some(path) = &args.profile {
        let (model, partial) = CostModel::from_profile_file(backend.topology(), path)?;
        if let Some(note) = partial {
            eprintln!("peerlink: note: {note}");
        }
        fabric = fabric.model(model);
    }
    if args.resident {
        fabric = fabric.resident(DEFAULT_COPY_BLOCKS);
        eprintln!(
            "peerlink: note: a resident worker runs on each GPU that sends with the resident \
             strategy, holding {} SMs, until the run ends; device-wide synchronisation does not \
             return while it runs",
            DEFAULT_COPY_BLOCKS + 1
        );
    }
    let fabric = fabric.open()?;
    let planner = fabric.planner();
    let model = planner.model().origin();
    let host = backend.topology();
    let runs = proof::runs_for(backend.as_ref());

    match mode {
        Mode::Concurrent { traffic, size } => {
            let pairs = traffic.pairs(fabric.devices())?;
            let report = concurrent::run(&fabric, &pairs, size, runs, &*global.progress())?;
            let view = ConcurrentView {
                model,
                traffic: args.concurrent.as_deref().unwrap_or_default(),
                report: &report,
            };
            let doc = PlanConcurrentDocument::new(host, &view);
            global.print(&doc, || text::concurrent_text(&doc))
        }
        Mode::Sweep { src, dst, sizes } => {
            let report = sweep::run(&fabric, src, dst, &sizes, runs, &*global.progress())?;
            let view = SweepView {
                model,
                report: &report,
            };
            let doc = PlanSweepDocument::new(host, &view);
            global.print(&doc, || text::sweep_text(&doc))
        }
        Mode::Batch {
            src,
            dst,
            count,
            message,
            prove,
        } => {
            let proof = prove
                .then(|| batch::run(&fabric, src, dst, count, message, runs, &*global.progress()))
                .transpose()?;
            let plan = planner.plan_batch(src, dst, &vec![message as u64; count], 1)?;
            let view = BatchView {
                model,
                count,
                size: message as u64,
                plan: &plan,
                proof: proof.as_ref(),
            };
            let doc = PlanBatchDocument::new(host, &view);
            global.print(&doc, || text::batch_text(&doc))
        }
        Mode::Single {
            src,
            dst,
            size,
            prove,
        } => {
            let plan = planner.plan(src, dst, size)?;
            let unusable = planner.unusable(src, dst, size)?;
            let proof = prove
                .then(|| sweep::run(&fabric, src, dst, &[size], runs, &*global.progress()))
                .transpose()?;
            let view = PlanView {
                model,
                plan: &plan,
                unusable: &unusable,
                proof: proof.as_ref(),
                network: host.network.as_ref().and_then(|n| n.route(src, dst)),
                host_pricing: planner.host_beside_direct(&plan),
                direct_pricing: planner.direct_beside_host(&plan),
            };
            let doc = PlanDocument::new(host, &view);
            global.print(&doc, || text::text(&doc))
        }
    }
}
