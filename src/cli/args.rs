//! The command line's words: every verb, option and default, as clap types. Nothing here runs.

use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(
    name = "peerlink",
    version,
    about = "See, measure and speed up GPU-to-GPU (peer-to-peer) traffic on multi-GPU hosts",
    long_about = "See, measure and speed up GPU-to-GPU (peer-to-peer) traffic on multi-GPU hosts.\n\n\
                  Without --sim, real GPUs are used; a host with no NVIDIA driver falls back to the \
                  simulated `dgx-h100` host and says so."
)]
pub struct Cli {
    #[command(flatten)]
    pub global: Global,
    #[command(subcommand)]
    pub verb: Verb,
}

#[derive(Args)]
pub struct Global {
    /// Use a simulated host: an embedded preset name (dgx-h100, dgx1-v100, pcie-4gpu-2socket,
    /// pcie-2gpu-switch, h200-pair; several hosts: 2x-dgx-h100, 2x-pcie-4gpu-2socket) or a preset
    /// JSON file
    #[arg(
        long,
        global = true,
        value_name = "PRESET|FILE",
        conflicts_with = "gpu"
    )]
    pub sim: Option<String>,

    /// Require real GPUs: fail instead of falling back to the simulator
    #[arg(long, global = true)]
    pub gpu: bool,

    /// Print one JSON document on stdout (human text and progress go to stderr)
    #[arg(long, global = true)]
    pub json: bool,

    /// GPUs to use, by CUDA index (default: all)
    #[arg(long, global = true, value_delimiter = ',', value_name = "I,J,..")]
    pub devices: Option<Vec<usize>>,

    #[command(flatten)]
    pub exports: Exports,
}

/// Files written beside what a verb prints, as hyperfine writes them; any of them in one run.
#[derive(Args)]
pub struct Exports {
    /// Also write the verb's JSON document to FILE
    #[arg(long, global = true, value_name = "FILE")]
    pub export_json: Option<PathBuf>,

    /// Also write the verb's tables to FILE as CSV, the document's header as leading `#` lines
    #[arg(long, global = true, value_name = "FILE")]
    pub export_csv: Option<PathBuf>,

    /// Also write the verb's header and tables to FILE as Markdown
    #[arg(long, global = true, value_name = "FILE")]
    pub export_markdown: Option<PathBuf>,
}

#[derive(Subcommand)]
pub enum Verb {
    /// Which GPU pairs can use P2P, over what link, with what rank and atomics, and what is wrong;
    /// the RDMA NICs and how far each GPU is from them
    Topo(TopoArgs),
    /// Bandwidth and latency per GPU pair, and message-size sweeps; every byte verified
    Bench(BenchArgs),
    /// Where one transfer's time goes (setup, launch, link, receiver) and what each fix would save
    Explain(ExplainArgs),
    /// How the transfer engine would move one transfer, with every alternative's predicted time
    Plan(PlanArgs),
    /// Measure this host's hop costs and write a profile for `plan --profile` (and, with
    /// --export-sim, a simulator preset calibrated from the same measurements)
    Tune(TuneArgs),
    /// Run a workload over the GPUs, peerlink beside NCCL, timed as nccl-tests times and every
    /// byte verified: all-reduce, send-recv, pipeline or halo
    Workload(WorkloadArgs),
    /// Two `bench --json` documents side by side, figure by figure (another run, another host, or
    /// a simulator preset against the machine it was calibrated on)
    Compare(CompareArgs),
    /// One self-contained HTML page of charts (SVG, no script, nothing fetched) from any mix of
    /// peerlink's JSON documents; --svg DIR writes the charts alone
    Report(ReportArgs),
    /// What stands between the GPUs and fast P2P: each check's evidence, verdict (ok, info, warn,
    /// fail) and fix; exit status 1 when a check fails
    Doctor(DoctorArgs),
    /// A short health check: ce-write, h2d, d2h, local and copy-latency measured and compared with
    /// a baseline or with reference figures for known GPUs; exit 1 naming what regressed
    Check(CheckArgs),
    /// Run N processes of peerlink on this host as one group, one per GPU, as torchrun would:
    /// `peerlink launch -n 2 -- ranks`. Rank 0's stdout is passed through; every other line is
    /// labelled with its rank on stderr; the first rank to fail is named and the others stopped
    Launch(LaunchArgs),
    /// The processes of a multi-process run (under torchrun, srun, mpirun or `peerlink launch`):
    /// each rank's identity, host and pid, the rendezvous checked end to end, printed by rank 0
    Ranks(RanksArgs),
}

#[derive(Args)]
pub struct LaunchArgs {
    /// How many processes to start (ranks 0 to N-1), 1 to 1024
    #[arg(short = 'n', long = "processes", value_name = "N")]
    pub processes: usize,

    /// Seconds each rank waits for the others: to meet, in every call, and for a silent rank's
    /// heartbeat before it is taken for hung [default: 60]
    #[arg(long, value_name = "SECS")]
    pub timeout: Option<String>,

    /// Rank 0's port on 127.0.0.1 [default: a free port]
    #[arg(long, value_name = "PORT")]
    pub port: Option<u16>,

    /// Preload libpeerlink_nccl.so (NCCL's C API in front of the real NCCL; found beside this
    /// peerlink executable) in every rank, so that their NCCL calls go through it
    #[arg(long)]
    pub nccl: bool,

    /// The peerlink command line every rank runs, after `--`: `-- ranks`, `-- --sim h200-pair topo`
    #[arg(last = true, required = true, value_name = "VERB")]
    pub command: Vec<String>,
}

#[derive(Args)]
pub struct RanksArgs {
    /// Stay together this many seconds after the checks, a barrier each second: kill or stop a
    /// rank meanwhile to see how the others fail
    #[arg(long, value_name = "SECS")]
    pub hold: Option<String>,
}

#[derive(Args)]
pub struct ReportArgs {
    /// JSON documents peerlink wrote: topo, bench, explain, plan, tune's profile, compare,
    /// workload, doctor or check `--json` outputs, in any mix and order
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,

    /// Where to write the HTML page (replaced atomically)
    #[arg(short, long, value_name = "FILE", required_unless_present = "svg")]
    pub out: Option<PathBuf>,

    /// Write each chart as an SVG file into DIR (made if missing), named by its id
    #[arg(long, value_name = "DIR")]
    pub svg: Option<PathBuf>,
}

#[derive(Args)]
pub struct DoctorArgs {
    /// Read the host's /sys and /proc under this directory [default: / on real GPUs; none on the
    /// simulator]
    #[arg(long, value_name = "DIR")]
    pub root: Option<PathBuf>,
}

#[derive(Args)]
pub struct CheckArgs {
    /// An earlier `peerlink bench --json` of this kind of host, taken when it was healthy; each
    /// test is measured at its size [default: the reference figures shipped for H200, H100 SXM
    /// and A100 SXM]
    #[arg(long, value_name = "FILE")]
    pub baseline: Option<PathBuf>,

    /// How much slower than expected a figure may be, in percent of it (copy-latency: twice this)
    /// [default: 5]
    #[arg(long, value_name = "PCT")]
    pub tolerance: Option<String>,
}

#[derive(Args)]
pub struct TopoArgs {
    /// Also run NCCL over the GPUs with NCCL_TOPO_DUMP_FILE set and show where its view of the
    /// GPU ↔ NIC paths differs from peerlink's (real GPUs; the dump is kept where
    /// NCCL_TOPO_DUMP_FILE already names a file)
    #[arg(long, conflicts_with = "nccl_xml")]
    pub nccl: bool,

    /// Compare with a topology dump NCCL wrote before (any NCCL job run with
    /// NCCL_TOPO_DUMP_FILE=FILE on this host) instead of running NCCL
    #[arg(long, value_name = "FILE")]
    pub nccl_xml: Option<PathBuf>,

    /// NCCL's library to load for --nccl (a path to libnccl.so.2), in place of the search
    #[arg(long, value_name = "PATH", requires = "nccl")]
    pub nccl_lib: Option<PathBuf>,
}

#[derive(Args)]
pub struct CompareArgs {
    /// The document compared against (ratios are OTHER / BASE)
    pub base: PathBuf,
    /// The document compared
    pub other: PathBuf,

    /// Exit 1, naming them, when any paired figure moved by more than this percentage of its base
    /// figure, either way (5, 2.5%)
    #[arg(long, value_name = "PCT")]
    pub threshold: Option<String>,
}

#[derive(Args)]
pub struct BenchArgs {
    /// Tests to run, comma-separated (default: ce-write, ce-read, ce-bidir-write, h2d, d2h, local
    /// and the latency tests; an unknown name lists them all)
    #[arg(long, value_delimiter = ',', value_name = "NAME,..")]
    pub tests: Option<Vec<String>>,

    /// Bytes per message: 64MiB, 4K (K/M/G = powers of 1024), 1GB (powers of 1000), or `plateau`:
    /// each test where it reaches its plateau (512 MiB between GPUs, 64 MiB to or from the host,
    /// 1 GiB within a GPU) [default: plateau on GPUs, 8MiB on the simulator]
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// Samples per measurement, 1 to 1000 [default: 3 on GPUs (21 for copy-latency, issue-cost,
    /// e2e-latency and ping-pong), 1 on the simulator]
    #[arg(long)]
    pub samples: Option<u32>,

    /// Timed operations per sample, 1 to 100000 [default: 16 on GPUs, 2 on the simulator]
    #[arg(long)]
    pub iterations: Option<u32>,

    /// Untimed operations queued before each sample's window, 0 to 100000 [default: 4 on GPUs, 1
    /// on the simulator]
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,

    /// Rotate each lane's operations over buffers spanning at least this many bytes, so that the
    /// GPU's cache cannot serve them; 0 keeps one buffer [default: 64MiB on GPUs, 0 on the
    /// simulator]
    #[arg(long, value_name = "SIZE")]
    pub rotation: Option<String>,

    /// Sweep message sizes instead: a range 4B..1GiB (powers of two) or a list 4K,64K,1M; reports
    /// median, p99 and GB/s per size and fits time = α + bytes/β per pair
    #[arg(long, value_name = "RANGE|LIST", conflicts_with = "size")]
    pub sizes: Option<String>,

    /// Print CSV instead of tables
    #[arg(long, conflicts_with = "json")]
    pub csv: bool,
}

#[derive(Args)]
pub struct ExplainArgs {
    /// The sending GPU
    #[arg(long)]
    pub src: usize,

    /// The receiving GPU (may equal --src)
    #[arg(long)]
    pub dst: usize,

    /// Bytes of the transfer: 4B, 64K, 1MiB, …
    #[arg(long, default_value = "4KiB", value_name = "SIZE")]
    pub size: String,

    /// What the transfer moves: `device` (a copy-engine copy between device buffers) or
    /// `managed` (a kernel on --dst reading managed memory whose pages live on --src, in host
    /// memory when --src equals --dst: faults, page migration, and what a prefetch or
    /// SetAccessedBy saves)
    #[arg(long, default_value = "device", value_name = "KIND")]
    pub memory: String,
}

#[derive(Args)]
pub struct PlanArgs {
    /// The sending GPU
    #[arg(long, required_unless_present = "concurrent")]
    pub src: Option<usize>,

    /// The receiving GPU
    #[arg(long, required_unless_present = "concurrent")]
    pub dst: Option<usize>,

    /// Run every GPU's transfer of --size at once instead, planned as it runs (the host route
    /// priced both ways where two GPUs send to each other), against each alone and each strategy
    /// used for all: `shift` (GPU i sends to GPU i+1, over the GPUs in use) or `shift:K`
    #[arg(
        long,
        value_name = "TRAFFIC",
        conflicts_with_all = ["src", "dst", "sizes", "messages", "prove"],
        requires = "size"
    )]
    pub concurrent: Option<String>,

    /// Bytes to move (of each message, with --messages): 4096, 4K, 64MiB, 1GB, …
    #[arg(long, value_name = "SIZE", required_unless_present = "sizes")]
    pub size: Option<String>,

    /// Run the engine benchmark over these sizes instead (implies --prove): a range 4B..1GiB
    /// (powers of two) or a list 4K,64K,1M; every strategy and the pick at each size, with regret
    #[arg(long, value_name = "RANGE|LIST", conflicts_with_all = ["size", "messages"])]
    pub sizes: Option<String>,

    /// Plan a batch of this many messages (1 to 1000000) of --size each, between two buffers; with --prove, time
    /// every batch strategy against as many plain copies
    #[arg(long, value_name = "N")]
    pub messages: Option<usize>,

    /// Costs measured on this host (a profile file) instead of the topology's published defaults
    #[arg(long, value_name = "FILE")]
    pub profile: Option<PathBuf>,

    /// Also run every strategy on the backend (timed, every byte verified) and report the pick's
    /// regret and the engine's cost over a plain copy
    #[arg(long)]
    pub prove: bool,

    /// Run a resident worker on each sending GPU for this run (a persistent kernel holding 17 SMs:
    /// no launch per transfer) and let the planner pick it where it wins. While it runs,
    /// device-wide synchronisation (cudaDeviceSynchronize, torch.cuda.synchronize) does not return
    #[arg(long)]
    pub resident: bool,
}

#[derive(Args)]
pub struct TuneArgs {
    /// Where to write the profile (replaced atomically)
    #[arg(long, value_name = "FILE", default_value = "peerlink-profile.json")]
    pub out: PathBuf,

    /// Also write a simulator preset calibrated from the measurements (load it with --sim FILE)
    #[arg(long, value_name = "FILE")]
    pub export_sim: Option<PathBuf>,

    /// Fewer sizes (and one sample on real GPUs): a rougher profile in about half the time
    #[arg(long)]
    pub quick: bool,
}

#[derive(Args)]
pub struct WorkloadArgs {
    /// all-reduce, send-recv, pipeline or halo
    pub workload: String,

    /// NCCL's library to load (a path to libnccl.so.2), in place of the search: the environment
    /// variable PEERLINK_NCCL_LIB, then libnccl.so.2 and libnccl.so through the dynamic loader, then
    /// PyTorch installs (nvidia/nccl/lib/libnccl.so.2 in site-packages)
    #[arg(long, value_name = "PATH")]
    pub nccl_lib: Option<std::path::PathBuf>,

    /// Sizes to sweep: a range 4B..1GiB (powers of two) or a list 4K,64K,1M (the buffer reduced,
    /// the message, the activation, the halo face) [default: 4B to 1GiB in steps of 4×; up to
    /// 16MiB on the simulator]
    #[arg(long, value_name = "RANGE|LIST", conflicts_with = "size")]
    pub sizes: Option<String>,

    /// One size instead of a sweep
    #[arg(long, value_name = "SIZE")]
    pub size: Option<String>,

    /// Leave sizes above this out of the sweep (for quick runs)
    #[arg(long, value_name = "SIZE")]
    pub max_size: Option<String>,

    /// Timed operations per window, 1 to 100000 [default: 20, fewer from 64MiB up (5 at 256MiB
    /// and above); 2 on the simulator]
    #[arg(long)]
    pub iters: Option<u32>,

    /// Untimed operations before each window, 0 to 100000 [default: 5; 1 on the simulator]
    #[arg(long, value_name = "N")]
    pub warmup: Option<u32>,

    /// How the timed loop is issued: `stream` (one host thread queues every rank, each stream held
    /// behind a gate), `graphs` (each rank's loop captured into a CUDA graph and replayed) or
    /// `both` (a row for each) [default: stream]
    #[arg(long, value_name = "MODE")]
    pub issue: Option<String>,

    /// Same as --issue graphs
    #[arg(long, conflicts_with = "issue")]
    pub graphs: bool,

    /// all-reduce: the element type, f32, bf16 or f16
    #[arg(long, value_name = "TYPE")]
    pub dtype: Option<String>,

    /// send-recv: one-way (each GPU sends to the next), both (each pair of neighbours both ways
    /// at once) or all (each in turn) [default: all]
    #[arg(long, value_name = "WHICH")]
    pub direction: Option<String>,

    /// pipeline: microseconds of stand-in compute per stage and step, above 0 and at most
    /// 1000000 [default: 200]
    #[arg(long, value_name = "US")]
    pub compute_us: Option<f64>,

    /// halo: 1 (a ring of GPUs, rows), 2 (a grid of GPUs, rows and columns) or both [default:
    /// both]
    #[arg(long, value_name = "1|2|both")]
    pub dims: Option<String>,
}
