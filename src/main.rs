//! The `peerlink` command line: parses, opens a backend, calls the library, prints.

use anyhow::Result;
use clap::{Args, Parser, Subcommand};
use peerlink::backend::{self, Choice, Opened};
use peerlink::report;
use std::process::ExitCode;

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
    /// pcie-2gpu-switch) or a preset JSON file
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
    }
    Ok(())
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
