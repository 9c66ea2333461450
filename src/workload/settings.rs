//! The user's choices and the run's settings resolved from them and the backend: GPUs, sizes,
//! counts of operations.

use super::kinds::{IssueChoice, IssueMode, Variant, Workload};
use crate::backend::collective::DataType;
use crate::backend::Backend;
use crate::bench::{counted, MAX_ITERATIONS};
use crate::units::format_bytes;
use crate::{Error, Result};

/// The user's choices; `None` means the default for the backend.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Options {
    pub devices: Option<Vec<usize>>,
    pub sizes: Option<Vec<u64>>,
    /// Leaves larger sizes out of the sweep.
    pub max_size: Option<u64>,
    pub iters: Option<u32>,
    pub warmup: Option<u32>,
    pub issue: IssueChoice,
    /// all-reduce: the element type (default f32).
    pub dtype: Option<DataType>,
    /// send-recv: the directions (default both variants).
    pub directions: Option<Vec<Variant>>,
    /// pipeline: the stand-in compute per step, µs (default
    /// [`super::pipeline::DEFAULT_COMPUTE_US`]).
    pub compute_us: Option<f64>,
    /// halo: the decompositions (default both).
    pub dims: Option<Vec<Variant>>,
}

/// The sizes the sweep covers by default: 4 B to 1 GiB in steps of 4×.
pub fn default_sizes() -> Vec<u64> {
    std::iter::successors(Some(4u64), |s| Some(s * 4))
        .take_while(|&s| s <= 1 << 30)
        .collect()
}

/// Timed operations per window at `bytes` on real GPUs: nccl-tests' 20, fewer from 64 MiB up so
/// that the largest sizes (several ms per operation) keep a sweep short; never fewer than 5.
pub fn default_iters(bytes: u64) -> u32 {
    const FULL_UP_TO: u64 = 64 << 20;
    if bytes <= FULL_UP_TO {
        20
    } else {
        (20 * FULL_UP_TO / bytes).max(5) as u32
    }
}

/// Warm-up operations before each window on real GPUs (nccl-tests' `-w 5`).
pub const WARMUP: u32 = 5;

/// The simulator copies and reduces every byte on the CPU: its sweep stops here unless asked for
/// more, and it times 2 operations after 1 warm-up (its virtual clock repeats exactly).
pub const SIM_MAX_SIZE: u64 = 16 << 20;

/// The run's settings, resolved from the options and the backend.
#[derive(Clone, Debug, PartialEq)]
pub struct Settings {
    pub devices: Vec<usize>,
    pub sizes: Vec<u64>,
    pub warmup: u32,
    /// `--iters`, else [`default_iters`] per size (2 on the simulator).
    pub iters: Option<u32>,
    pub issue: Vec<IssueMode>,
    pub simulated: bool,
    pub notices: Vec<String>,
}

impl Settings {
    /// The settings for `options` on `backend`, or a usage error naming what is wrong.
    pub fn resolve(
        backend: &dyn Backend,
        workload: Workload,
        options: &Options,
    ) -> Result<Settings> {
        let topology = backend.topology();
        let devices = topology.select(options.devices.as_deref())?;
        if devices.len() < 2 {
            return Err(Error::usage(format!(
                "workload {workload} runs between GPUs and needs at least 2; {} selected{}",
                devices.len(),
                if topology.devices.len() < 2 {
                    " (this host has only one)"
                } else {
                    ": name two or more with --devices, or leave --devices out for all"
                }
            )));
        }
        if let Some((a, b)) = across_hosts(topology, &devices) {
            if matches!(workload, Workload::Pipeline | Workload::Halo) {
                return Err(Error::usage(format!(
                    "workload {workload} runs within one host, and GPU {a} and GPU {b} are on \
                     different hosts: choose GPUs of one host with --devices (all-reduce and \
                     send-recv run NCCL between hosts)"
                )));
            }
        }
        let simulated = topology.is_simulated();
        let mut notices = Vec::new();
        if simulated {
            notices.push(format!(
                "simulator defaults where not given: sizes up to {} (not 1 GiB), 1 warm-up and 2 \
                 timed operations (not {WARMUP} and 20): it moves and reduces every byte on the \
                 CPU and its virtual clock repeats exactly",
                format_bytes(SIM_MAX_SIZE)
            ));
        }
        let mut sizes = options.sizes.clone().unwrap_or_else(default_sizes);
        let max_size = match options.max_size {
            None if simulated && options.sizes.is_none() => Some(SIM_MAX_SIZE),
            given => given,
        };
        if let Some(max) = max_size {
            sizes.retain(|&s| s <= max);
        }
        if sizes.is_empty() {
            return Err(Error::usage(format!(
                "no size left to run: every size is above --max-size {}",
                format_bytes(max_size.unwrap_or(0))
            )));
        }
        let warmup = counted(options.warmup, "--warmup", 0, MAX_ITERATIONS)?
            .unwrap_or(if simulated { 1 } else { WARMUP });
        let iters =
            counted(options.iters, "--iters", 1, MAX_ITERATIONS)?.or(simulated.then_some(2));
        Ok(Settings {
            devices,
            sizes,
            warmup,
            iters,
            issue: options.issue.modes(),
            simulated,
            notices,
        })
    }

    /// The sweep's sizes, up to a stop request ([`crate::interrupt`]): the run then ends with the
    /// sizes measured so far, and its document says partial.
    pub fn sizes_to_run(&self) -> impl Iterator<Item = u64> + '_ {
        self.sizes
            .iter()
            .copied()
            .take_while(|_| !crate::interrupt::requested())
    }

    /// Timed operations per window at `bytes`.
    pub fn iters_at(&self, bytes: u64) -> u32 {
        self.iters.unwrap_or_else(|| default_iters(bytes))
    }

    /// The counts of one window at `bytes`.
    pub fn counts(&self, bytes: u64) -> Counts {
        Counts {
            prime: prime_ops(bytes, self.simulated),
            warmup: self.warmup,
            iters: self.iters_at(bytes),
        }
    }

    /// The largest size of the sweep.
    pub fn largest(&self) -> u64 {
        self.sizes.iter().copied().max().unwrap_or(0)
    }
}

/// Operations of one contender at one size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counts {
    /// Untimed, before the held window, waited for (see [`prime_ops`]).
    pub prime: u32,
    /// Untimed, inside the held window, before its start events.
    pub warmup: u32,
    /// Timed.
    pub iters: u32,
}

/// The most operations a contender runs, waited for, before its first window at a size.
///
/// One is enough for first-use costs (a module load, NCCL's connections, the engine's staging);
/// but on real GPUs NCCL's operations stay slow for tens of them after its communicator is made:
/// on the H200 pair a 4 B send/recv measured 13.9 µs per operation over a window of 20 after 6
/// untimed ones, and 5.6 µs after 51 (the next size: 5.9 and 5.7 µs).
pub const PRIME_OPS: u32 = 50;

/// Priming stops at this many bytes: an operation this large takes far longer than what the first
/// ones add.
const PRIME_BYTES: u64 = 256 << 20;

/// Operations to prime with at `bytes`: [`PRIME_OPS`] for small ones, fewer as they grow, and one
/// on the simulator (its clock has no warm-up to give).
pub fn prime_ops(bytes: u64, simulated: bool) -> u32 {
    if simulated {
        return 1;
    }
    (PRIME_BYTES / bytes.max(1)).clamp(1, u64::from(PRIME_OPS)) as u32
}

/// The first two of `devices` that sit on different hosts, if any.
pub(crate) fn across_hosts(
    topology: &crate::topology::Topology,
    devices: &[usize],
) -> Option<(usize, usize)> {
    let first = *devices.first()?;
    let other = devices
        .iter()
        .copied()
        .find(|&d| topology.crosses_hosts(first, d))?;
    Some((first, other))
}
