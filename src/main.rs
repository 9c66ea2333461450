//! The `peerlink` command line: parses, opens a backend, calls the library, prints.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use peerlink::backend::sim::Preset;
use peerlink::backend::{self, Choice, Opened};
use peerlink::bench::{self, explain, progress, tune};
use peerlink::engine::concurrent::{self, Traffic};
use peerlink::engine::{benchmark, Fabric};
use peerlink::model::profile::{check_destination, write_atomically};
use peerlink::model::{CostModel, Profile};
use peerlink::report;
use peerlink::units::{parse_size, parse_sizes};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

#[derive(Parser)]
#[command(
    name = "peerlink",
    version,
    about = "See, measure and speed up GPU-to-GPU (peer-to-peer) traffic on multi-GPU hosts",
    long_about = "See, measure and speed up GPU-to-GPU (peer-to-peer) traffic on multi-GPU hosts.\n\n\
                  Without --sim, real GPUs are used; a host with no NVIDIA driver falls back to the \
                  simulated `dgx-h100` host and says so."
)]
struct Cli {
    #[command(flatten)]
    global: Global,
    #[command(subcommand)]
    verb: Verb,
}

#[derive(Args)]
struct Global {
    /// Use a simulated host: an embedded preset name (dgx-h100, dgx1-v100, pcie-4gpu-2socket,
    /// pcie-2gpu-switch, h200-pair) or a preset JSON file
    #[arg(
        long,
        global = true,
        value_name = "PRESET|FILE",
        conflicts_with = "gpu"
    )]
    sim: Option<String>,

    /// Require real GPUs: fail instead of falling back to the simulator
    #[arg(long, global = true)]
    gpu: bool,

    /// Print one JSON document on stdout (human text and progress go to stderr)
    #[arg(long, global = true)]
    json: bool,

    /// GPUs to use, by CUDA index (default: all)
    #[arg(long, global = true, value_delimiter = ',', value_name = "I,J,..")]
    devices: Option<Vec<usize>>,
}

#[derive(Subcommand)]
enum Verb {
    /// Which GPU pairs can use P2P, over what link, with what rank and atomics, and what is wrong
    Topo,
    /// Bandwidth and latency per GPU pair, and message-size sweeps; every byte verified
    Bench(BenchArgs),
    /// Where one transfer's time goes (setup, launch, link, receiver) and what each fix would save
    Explain(ExplainArgs),
    /// How the transfer engine would move one transfer, with every alternative's predicted time
    Plan(PlanArgs),
    /// Measure this host's hop costs and write a profile for `plan --profile` (and, with
    /// --export-sim, a simulator preset calibrated from the same measurements)
    Tune(TuneArgs),
    /// Two `bench --json` documents side by side, figure by figure (another run, another host, or
    /// a simulator preset against the machine it was calibrated on)
    Compare(CompareArgs),
}

#[derive(Args)]
struct CompareArgs {
    /// The document compared against (ratios are OTHER / BASE)
    base: PathBuf,
    /// The document compared
    other: PathBuf,
}

#[derive(Args)]
struct BenchArgs {
    /// Tests to run, comma-separated (default: ce-write, ce-read, ce-bidir-write, h2d, d2h, local
    /// and the latency tests; an unknown name lists them all)
    #[arg(long, value_delimiter = ',', value_name = "NAME,..")]
    tests: Option<Vec<String>>,

    /// Bytes per message: 64MiB, 4K (K/M/G = powers of 1024), 1GB (powers of 1000), or `plateau`:
    /// each test where it reaches its plateau (512 MiB between GPUs, 64 MiB to or from the host,
    /// 1 GiB within a GPU) [default: plateau on GPUs, 8MiB on the simulator]
    #[arg(long, value_name = "SIZE")]
    size: Option<String>,

    /// Samples per measurement [default: 3 on GPUs (21 for copy-latency, issue-cost, e2e-latency
    /// and ping-pong), 1 on the simulator]
    #[arg(long)]
    samples: Option<u32>,

    /// Timed operations per sample [default: 16 on GPUs, 2 on the simulator]
    #[arg(long)]
    iterations: Option<u32>,

    /// Untimed operations queued before each sample's window [default: 4 on GPUs, 1 on the
    /// simulator]
    #[arg(long, value_name = "N")]
    warmup: Option<u32>,

    /// Rotate each lane's operations over buffers spanning at least this many bytes, so that the
    /// GPU's cache cannot serve them; 0 keeps one buffer [default: 64MiB on GPUs, 0 on the
    /// simulator]
    #[arg(long, value_name = "SIZE")]
    rotation: Option<String>,

    /// Sweep message sizes instead: a range 4B..1GiB (powers of two) or a list 4K,64K,1M; reports
    /// median, p99 and GB/s per size and fits time = α + bytes/β per pair
    #[arg(long, value_name = "RANGE|LIST")]
    sizes: Option<String>,

    /// Print CSV instead of tables
    #[arg(long, conflicts_with = "json")]
    csv: bool,
}

#[derive(Args)]
struct ExplainArgs {
    /// The sending GPU
    #[arg(long)]
    src: usize,

    /// The receiving GPU (may equal --src)
    #[arg(long)]
    dst: usize,

    /// Bytes of the transfer: 4B, 64K, 1MiB, …
    #[arg(long, default_value = "4KiB", value_name = "SIZE")]
    size: String,
}

#[derive(Args)]
struct PlanArgs {
    /// The sending GPU
    #[arg(long, required_unless_present = "concurrent")]
    src: Option<usize>,

    /// The receiving GPU
    #[arg(long, required_unless_present = "concurrent")]
    dst: Option<usize>,

    /// Run every GPU's transfer of --size at once instead, planned as if alone, against each alone
    /// and each strategy used for all: `shift` (GPU i sends to GPU i+1, over the GPUs in use) or
    /// `shift:K`
    #[arg(
        long,
        value_name = "TRAFFIC",
        conflicts_with_all = ["src", "dst", "sizes", "messages", "prove"],
        requires = "size"
    )]
    concurrent: Option<String>,

    /// Bytes to move (of each message, with --messages): 4096, 4K, 64MiB, 1GB, …
    #[arg(long, value_name = "SIZE", required_unless_present = "sizes")]
    size: Option<String>,

    /// Run the engine benchmark over these sizes instead (implies --prove): a range 4B..1GiB
    /// (powers of two) or a list 4K,64K,1M; every strategy and the pick at each size, with regret
    #[arg(long, value_name = "RANGE|LIST", conflicts_with_all = ["size", "messages"])]
    sizes: Option<String>,

    /// Plan a batch of this many messages of --size each, between two buffers; with --prove, time
    /// every batch strategy against as many plain copies
    #[arg(long, value_name = "N")]
    messages: Option<usize>,

    /// Costs measured on this host (a profile file) instead of the topology's published defaults
    #[arg(long, value_name = "FILE")]
    profile: Option<PathBuf>,

    /// Also run every strategy on the backend (timed, every byte verified) and report the pick's
    /// regret and the engine's cost over a plain copy
    #[arg(long)]
    prove: bool,
}

#[derive(Args)]
struct TuneArgs {
    /// Where to write the profile (replaced atomically)
    #[arg(long, value_name = "FILE", default_value = "peerlink-profile.json")]
    out: PathBuf,

    /// Also write a simulator preset calibrated from the measurements (load it with --sim FILE)
    #[arg(long, value_name = "FILE")]
    export_sim: Option<PathBuf>,

    /// Fewer sizes (and one sample on real GPUs): a rougher profile in about half the time
    #[arg(long)]
    quick: bool,
}

impl Global {
    fn choice(&self) -> Choice {
        match (&self.sim, self.gpu) {
            (Some(preset), _) => Choice::Sim(preset.clone()),
            (None, true) => Choice::Gpu,
            (None, false) => Choice::Auto,
        }
    }

    /// Opens the backend, printing the simulator fallback notice on stderr.
    fn open(&self) -> peerlink::Result<Opened> {
        let opened = backend::open(&self.choice())?;
        if let Some(notice) = &opened.notice {
            eprintln!("peerlink: {notice}");
        }
        for notice in opened.backend.notices() {
            eprintln!("peerlink: note: {notice}");
        }
        Ok(opened)
    }
}

fn run(cli: Cli) -> Result<()> {
    let global = &cli.global;
    match cli.verb {
        Verb::Topo => {
            let opened = global.open()?;
            let topo = opened.backend.topology();
            let selected = topo.select(global.devices.as_deref())?;
            if global.json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&report::topo::json(topo, &selected))?
                );
            } else {
                print!("{}", report::topo::text(topo, &selected));
            }
        }
        Verb::Bench(args) => {
            let opened = global.open()?;
            let options = bench::Options {
                tests: args.tests,
                devices: global.devices.clone(),
                size: args.size.as_deref().map(bench_size).transpose()?,
                samples: args.samples,
                iterations: args.iterations,
                warmup: args.warmup,
                rotation: args.rotation.as_deref().map(parse_rotation).transpose()?,
                sizes: args.sizes.as_deref().map(parse_sizes).transpose()?,
            };
            let found = bench::run(opened.backend.as_ref(), &options, &*progress_for(global))?;
            if global.json {
                println!("{}", serde_json::to_string_pretty(&found)?);
            } else if args.csv {
                print!("{}", report::bench::csv(&found));
            } else {
                print!("{}", report::bench::text(&found));
            }
        }
        Verb::Explain(args) => {
            let opened = global.open()?;
            let size = parse_size(&args.size)?;
            let found = explain::run(
                opened.backend.as_ref(),
                args.src,
                args.dst,
                size,
                &*progress_for(global),
            )?;
            if global.json {
                println!("{}", serde_json::to_string_pretty(&found)?);
            } else {
                print!("{}", report::bench::explain_text(&found));
            }
        }
        Verb::Plan(args) => plan(global, &args)?,
        Verb::Tune(args) => tune(global, &args)?,
        Verb::Compare(args) => compare(global, &args)?,
    }
    Ok(())
}

fn compare(global: &Global, args: &CompareArgs) -> Result<()> {
    let read = |path: &PathBuf| -> Result<serde_json::Value> {
        let text = std::fs::read_to_string(path).map_err(|source| peerlink::Error::Io {
            path: path.clone(),
            source,
        })?;
        serde_json::from_str(&text).map_err(|e| {
            peerlink::Error::Usage(format!(
                "{} is not JSON ({e}); give two `peerlink bench --json` outputs",
                path.display()
            ))
            .into()
        })
    };
    let (base_name, other_name) = (
        args.base.display().to_string(),
        args.other.display().to_string(),
    );
    let comparison = report::compare::compare(
        &read(&args.base)?,
        &read(&args.other)?,
        &base_name,
        &other_name,
    )?;
    if global.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report::compare::json(&comparison))?
        );
    } else {
        print!(
            "{}",
            report::compare::text(&comparison, &base_name, &other_name)
        );
    }
    Ok(())
}

fn tune(global: &Global, args: &TuneArgs) -> Result<()> {
    // Check where the results go before measuring for half a minute; the preset's name is the
    // file's stem.
    check_destination(&args.out, "--out")?;
    if let Some(path) = &args.export_sim {
        check_destination(path, "--export-sim")?;
    }
    let preset_name = match &args.export_sim {
        Some(path) => Some(
            path.file_stem()
                .map(|s| s.to_string_lossy().to_string())
                .filter(|s| !s.is_empty())
                .ok_or_else(|| {
                    peerlink::Error::Usage(format!(
                        "--export-sim {}: not a file name",
                        path.display()
                    ))
                })?,
        ),
        None => None,
    };
    let opened = global.open()?;
    let backend = opened.backend.as_ref();
    let options = tune::Options {
        devices: global.devices.clone(),
        quick: args.quick,
        latencies: args.export_sim.is_some(),
    };
    let measured = tune::run(backend, &options, &*progress_for(global))?;
    let profile = measured.profile(backend.topology());
    profile.save(&args.out)?;
    let preset = match (&args.export_sim, preset_name) {
        (Some(path), Some(name)) => {
            let preset: Preset = tune::export::preset(&measured, backend.topology(), &name)?;
            write_atomically(path, &serde_json::to_string_pretty(&preset)?)?;
            Some(path)
        }
        _ => None,
    };
    if global.json {
        println!("{}", serde_json::to_string_pretty(&profile)?);
    } else {
        print!("{}", report::tune::text(&measured));
    }
    // Where the files went goes to stderr with --json (stdout holds the document), else stdout.
    let said = format!(
        "profile written to {}{}",
        shown(&args.out),
        preset.map_or(String::new(), |p| format!(
            "\nsimulator preset written to {} (use it with --sim {})",
            shown(p),
            p.display()
        ))
    );
    if global.json {
        eprintln!("peerlink: {said}");
    } else {
        println!("\n{said}");
    }
    Ok(())
}

/// A path as the user can find it: absolute where the working directory is known.
fn shown(path: &std::path::Path) -> String {
    std::path::absolute(path)
        .unwrap_or_else(|_| path.to_path_buf())
        .display()
        .to_string()
}

fn plan(global: &Global, args: &PlanArgs) -> Result<()> {
    let size = args.size.as_deref().map(parse_size).transpose()?;
    let sizes = args.sizes.as_deref().map(parse_sizes).transpose()?;
    let traffic = args.concurrent.as_deref().map(Traffic::parse).transpose()?;
    if args.messages == Some(0) {
        return Err(peerlink::Error::Usage("--messages must be at least 1".into()).into());
    }
    let backend: Arc<dyn peerlink::backend::Backend> = Arc::from(global.open()?.backend);
    let mut fabric = Fabric::builder(backend.clone());
    if let Some(devices) = &global.devices {
        fabric = fabric.devices(devices);
    }
    if let Some(path) = &args.profile {
        let profile = Profile::load(path)?;
        fabric = fabric.model(CostModel::from_profile(backend.topology(), &profile)?);
    }
    let fabric = fabric.open()?;
    let planner = fabric.planner();
    let options = benchmark::Options::for_backend(backend.as_ref());
    let print = |doc: serde_json::Value, text: String| -> Result<()> {
        if global.json {
            println!("{}", serde_json::to_string_pretty(&doc)?);
        } else {
            print!("{text}");
        }
        Ok(())
    };

    if let (Some(traffic), Some(size)) = (traffic, size) {
        let pairs = traffic.pairs(fabric.devices())?;
        let report = concurrent::run(&fabric, &pairs, size, options)?;
        let view = report::plan::ConcurrentView {
            model: planner.model().origin(),
            traffic: args.concurrent.as_deref().unwrap_or_default(),
            report: &report,
        };
        return print(
            report::plan::concurrent_json(&view),
            report::plan::concurrent_text(&view),
        );
    }
    let (src, dst) = args
        .src
        .zip(args.dst)
        .expect("clap requires --src and --dst without --concurrent");
    if let Some(sizes) = sizes {
        let report = benchmark::run(&fabric, src, dst, &sizes, options)?;
        let view = report::plan::SweepView {
            model: planner.model().origin(),
            report: &report,
        };
        return print(
            report::plan::sweep_json(&view),
            report::plan::sweep_text(&view),
        );
    }
    let size = size.expect("clap requires --size without --sizes");
    if let Some(count) = args.messages {
        let message = usize::try_from(size).map_err(|_| {
            peerlink::Error::Usage("--size does not fit in this host's memory".into())
        })?;
        let report = if args.prove {
            Some(benchmark::batch(
                &fabric, src, dst, count, message, options,
            )?)
        } else {
            None
        };
        let sizes = vec![size; count];
        let plan = planner.plan_batch(src, dst, &sizes, 1)?;
        let view = report::plan::BatchView {
            source: backend.source(),
            model: planner.model().origin(),
            count,
            size,
            plan: &plan,
            proof: report.as_ref(),
        };
        return print(
            report::plan::batch_json(&view),
            report::plan::batch_text(&view),
        );
    }
    let plan = planner.plan(src, dst, size)?;
    let unusable = planner.unusable(src, dst, size)?;
    let proof = if args.prove {
        Some(benchmark::run(&fabric, src, dst, &[size], options)?)
    } else {
        None
    };
    let view = report::plan::PlanView {
        source: backend.source(),
        model: planner.model().origin(),
        plan: &plan,
        unusable: &unusable,
        proof: proof.as_ref(),
    };
    print(report::plan::json(&view), report::plan::text(&view))
}

/// `bench --rotation`: a size, or 0 for one buffer.
fn parse_rotation(text: &str) -> peerlink::Result<u64> {
    if text.trim() == "0" {
        return Ok(0);
    }
    parse_size(text)
}

/// `bench --size`: a size, or `plateau`.
fn bench_size(text: &str) -> peerlink::Result<bench::Size> {
    if text == "plateau" {
        return Ok(bench::Size::Plateau);
    }
    parse_size(text).map(bench::Size::Bytes).map_err(|e| {
        peerlink::Error::Usage(format!(
            "{e}; or `plateau` for each test at its plateau size"
        ))
    })
}

/// A progress bar on stderr, except for `--json` runs.
fn progress_for(global: &Global) -> Box<dyn progress::Progress> {
    if global.json {
        Box::new(progress::Silent)
    } else {
        Box::new(progress::Bar::new())
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("peerlink: error: {err}");
            let code = err
                .downcast_ref::<peerlink::Error>()
                .map_or(1, peerlink::Error::exit_code);
            ExitCode::from(code as u8)
        }
    }
}
