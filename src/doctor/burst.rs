//! The doctor's traffic burst: copies over every P2P pair at once, both ways, and between every
//! GPU and pinned host memory both ways, so that error counters read before and after it have
//! traffic to count, and the PCIe link and clocks are read while the GPUs are busy (a PCIe link
//! slows down when idle, and an idle GPU's clocks say only that it is idle).
//!
//! The burst moves data; it does not measure or verify it (`peerlink bench` does both).

use crate::backend::health::GpuHealth;
use crate::backend::{Backend, BufferCopy, BufferId, CopyMethod, Memory, Owned, StreamId};
use crate::bench::footprint::Footprint;
use crate::{Error, Result};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What the burst moved, and over how long the counters were read apart.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Burst {
    /// The ordered GPU pairs with P2P that data moved between, `[src, dst]`.
    pub pairs: Vec<[usize; 2]>,
    /// Bytes copied over each of those pairs (copy-engine writes, issued on the source GPU).
    pub bytes_per_pair: u64,
    /// Bytes copied between each GPU and pinned host memory, each way.
    pub host_bytes_per_gpu: u64,
    /// Rounds of copies (each round one copy per pair and per direction to the host).
    pub rounds: u32,
    /// Seconds between the counters' two reads, the burst in between (the host clock: virtual on
    /// the simulator).
    pub interval_s: f64,
}

/// The message of one copy of the burst, and how long it keeps going, by backend.
pub struct Plan {
    /// Bytes of each copy (the largest that fits; less where memory is short).
    pub chunk: u64,
    /// Rounds go on until this much host time has passed (at least one round).
    pub seconds: f64,
}

impl Plan {
    /// On real GPUs 256 MiB copies for one second (counters that rise per gigabyte get a few
    /// hundred of them); on the simulator, which copies every byte on the CPU, one round of 4 MiB
    /// copies (its counters rise with the bytes moved, whatever the time).
    pub fn for_backend(backend: &dyn Backend) -> Plan {
        if backend.topology().is_simulated() {
            Plan {
                chunk: 4 << 20,
                seconds: 0.0,
            }
        } else {
            Plan {
                chunk: 256 << 20,
                seconds: 1.0,
            }
        }
    }
}

/// The smallest copy the burst shrinks to before it gives up on memory.
const SMALLEST_CHUNK: u64 = 1 << 20;
/// Rounds at most, however fast they go.
const MOST_ROUNDS: u32 = 10_000;

/// What happened: the burst (or why there was none), peer access the driver refused, and the
/// health of each GPU (by position in `devices`) read before the burst, while its first round was
/// in flight, and after it.
pub struct Outcome {
    pub burst: std::result::Result<Burst, String>,
    /// `(src, dst, why)` for pairs whose P2P the topology reports but whose access failed.
    pub refused: Vec<(usize, usize, String)>,
    pub before: Vec<GpuHealth>,
    /// `None` where there was no burst.
    pub during: Option<Vec<GpuHealth>>,
    pub after: Vec<GpuHealth>,
}

/// Every GPU's health, now.
fn read_all(backend: &dyn Backend, devices: &[usize]) -> Result<Vec<GpuHealth>> {
    devices
        .iter()
        .map(|&d| backend.health().gpu_health(d))
        .collect()
}

/// Memory the burst holds with copies of `chunk` bytes: a source on each GPU, a destination per
/// pair on its destination GPU, and per GPU a device buffer and two pinned host buffers.
fn footprint(devices: &[usize], pairs: &[[usize; 2]], chunk: u64) -> Footprint {
    let mut f = Footprint::default();
    for &d in devices {
        f.add(Memory::Device(d), 2, chunk);
        f.add(Memory::PinnedHost { numa_node: None }, 2, chunk);
    }
    for &[_, dst] in pairs {
        f.add(Memory::Device(dst), 1, chunk);
    }
    f
}

/// Reads every GPU's health, runs the burst over `devices` (reading again once its first round is
/// queued), and reads again after it.
pub fn run(backend: &dyn Backend, devices: &[usize], plan: &Plan) -> Result<Outcome> {
    let started_us = backend.host_time_us();
    let before = read_all(backend, devices)?;
    let (burst, refused, during) = traffic(backend, devices, plan, started_us)?;
    let after = read_all(backend, devices)?;
    let interval_s = (backend.host_time_us() - started_us) / 1e6;
    Ok(Outcome {
        burst: burst.map(|b| Burst { interval_s, ..b }),
        refused,
        before,
        during,
        after,
    })
}

/// What [`traffic`] did: the burst (its interval not yet known) or why there was none, the pairs
/// refused, the health read during it.
type Traffic = (
    std::result::Result<Burst, String>,
    Vec<(usize, usize, String)>,
    Option<Vec<GpuHealth>>,
);

fn traffic(
    backend: &dyn Backend,
    devices: &[usize],
    plan: &Plan,
    started_us: f64,
) -> Result<Traffic> {
    let topology = backend.topology();
    let mut refused = Vec::new();
    let mut pairs = Vec::new();
    for &src in devices {
        for &dst in devices.iter().filter(|&&d| d != src) {
            if !topology.pair(src, dst).is_some_and(|p| p.p2p) {
                continue;
            }
            match backend.enable_peer_access(src, dst) {
                Ok(()) => pairs.push([src, dst]),
                Err(Error::PeerAccess { message, .. }) => refused.push((src, dst, message)),
                Err(other) => return Err(other),
            }
        }
    }
    let mut chunk = plan.chunk;
    while footprint(devices, &pairs, chunk)
        .check(backend, "the burst", "")
        .is_err()
    {
        if chunk / 4 < SMALLEST_CHUNK {
            let why = format!(
                "no traffic burst: even {} copies do not fit in the memory free",
                crate::units::format_bytes(SMALLEST_CHUNK)
            );
            return Ok((Err(why), refused, None));
        }
        chunk /= 4;
    }
    let len = chunk as usize;
    // Released on every way out, errors included.
    let mut buffers: Vec<Owned<'_, BufferId>> = Vec::new();
    let mut streams: Vec<Owned<'_, StreamId>> = Vec::new();
    let mut alloc = |memory| -> Result<BufferId> {
        let buffer = backend.alloc(memory, len)?;
        buffers.push(Owned::new(backend, buffer));
        Ok(buffer)
    };
    let mut stream = |device| -> Result<StreamId> {
        let stream = backend.create_stream(device)?;
        streams.push(Owned::new(backend, stream));
        Ok(stream)
    };
    let pinned = Memory::PinnedHost { numa_node: None };
    let mut copies: Vec<(StreamId, BufferCopy)> = Vec::new();
    let mut sources = BTreeMap::new();
    for &d in devices {
        let (source, staging) = (alloc(Memory::Device(d))?, alloc(Memory::Device(d))?);
        let (host_in, host_out) = (alloc(pinned)?, alloc(pinned)?);
        copies.push((stream(d)?, BufferCopy::from_start(host_in, staging, len)));
        copies.push((stream(d)?, BufferCopy::from_start(source, host_out, len)));
        sources.insert(d, source);
    }
    for &[src, dst] in &pairs {
        let to = alloc(Memory::Device(dst))?;
        copies.push((stream(src)?, BufferCopy::from_start(sources[&src], to, len)));
    }
    let mut rounds = 0;
    let mut during = None;
    loop {
        for (on, copy) in &copies {
            backend.copy(*on, CopyMethod::CopyEngine, copy)?;
        }
        rounds += 1;
        if during.is_none() {
            during = Some(read_all(backend, devices)?);
        }
        for (on, _) in &copies {
            backend.synchronize(*on)?;
        }
        let elapsed_s = (backend.host_time_us() - started_us) / 1e6;
        if elapsed_s >= plan.seconds || rounds >= MOST_ROUNDS || crate::interrupt::requested() {
            break;
        }
    }
    let burst = Burst {
        pairs,
        bytes_per_pair: chunk * u64::from(rounds),
        host_bytes_per_gpu: chunk * u64::from(rounds),
        rounds,
        interval_s: 0.0,
    };
    Ok((Ok(burst), refused, during))
}
