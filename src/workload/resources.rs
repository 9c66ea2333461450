//! What a workload in one process runs on: a stream and buffers per GPU, peer access, NCCL's
//! communicator, and the notices for what cannot run.

use super::kinds::Workload;
use super::settings::{across_hosts, Settings};
use crate::backend::collective::CommId;
use crate::backend::{Backend, BufferId, Handle, Memory, Nccl, Owned, StreamId};
use crate::bench::footprint::Footprint;
use crate::topology::Topology;
use crate::units::format_bytes;
use crate::{Error, Result};

/// What a workload holds at once at the sweep's largest size: `per_gpu(rank)` bytes on each GPU
/// of `devices`, and `host` bytes of the host's own copies (what it fills from and checks).
pub(crate) fn footprint(devices: &[usize], per_gpu: impl Fn(usize) -> u64, host: u64) -> Footprint {
    let mut footprint = Footprint::default();
    for (rank, &d) in devices.iter().enumerate() {
        footprint.add(Memory::Device(d), 1, per_gpu(rank));
    }
    footprint.add_host(host);
    footprint
}

/// Refuses, before anything is allocated, a sweep whose largest size would not fit in memory:
/// the check bench makes ([`Footprint::check`]), a usage error saying what is needed and free.
pub(crate) fn check_memory(
    backend: &dyn Backend,
    workload: Workload,
    settings: &Settings,
    footprint: &Footprint,
) -> Result<()> {
    let what = format!(
        "workload {workload} at {}",
        format_bytes(settings.largest())
    );
    footprint.check(backend, &what, "choose a smaller --size or --max-size")
}

/// One stream per GPU of `devices`, in that order, destroyed when dropped.
pub(crate) fn streams_on<'b>(
    backend: &'b dyn Backend,
    devices: &[usize],
) -> Result<Vec<Owned<'b, StreamId>>> {
    devices
        .iter()
        .map(|&d| Ok(Owned::new(backend, backend.create_stream(d)?)))
        .collect()
}

/// The handles of owned resources, in order.
pub(crate) fn ids<H: Handle>(owned: &[Owned<'_, H>]) -> Vec<H> {
    owned.iter().map(|o| **o).collect()
}

/// Buffers of `bytes` on each GPU of `devices`, freed when dropped.
pub(crate) fn buffers_on<'b>(
    backend: &'b dyn Backend,
    devices: &[usize],
    bytes: usize,
) -> Result<Vec<Owned<'b, BufferId>>> {
    devices
        .iter()
        .map(|&d| {
            Ok(Owned::new(
                backend,
                backend.alloc(Memory::Device(d), bytes)?,
            ))
        })
        .collect()
}

/// `bytes` as a buffer length, or a usage error where it cannot be one on this host.
pub(crate) fn length(bytes: u64) -> Result<usize> {
    usize::try_from(bytes)
        .map_err(|_| Error::usage(format!("{bytes} bytes do not fit in this host's memory")))
}

/// The notice for peerlink's rows left out where `devices` span hosts: they move data within one.
pub(crate) fn within_one_host(
    topology: &Topology,
    devices: &[usize],
    rows: &str,
) -> Option<String> {
    let (a, b) = across_hosts(topology, devices)?;
    Some(format!(
        "GPU {a} and GPU {b} are on different hosts: {rows} move data within one host, so they are \
         left out; NCCL's rows carry the data between hosts"
    ))
}

/// NCCL, or the sentence saying why there is none (added to the notices, its rows left out).
pub(crate) fn nccl<'b>(
    backend: &'b dyn Backend,
    notices: &mut Vec<String>,
) -> Option<&'b dyn Nccl> {
    match backend.collectives().nccl() {
        Ok(nccl) => Some(nccl),
        Err(why) => {
            notices.push(format!("NCCL's rows are left out: {why}"));
            None
        }
    }
}

/// An NCCL communicator over `devices`, destroyed when dropped.
pub(crate) struct Communicator<'n> {
    pub nccl: &'n dyn Nccl,
    pub id: CommId,
}

impl<'n> Communicator<'n> {
    pub fn new(nccl: &'n dyn Nccl, devices: &[usize]) -> Result<Communicator<'n>> {
        Ok(Communicator {
            nccl,
            id: nccl.communicator(devices)?,
        })
    }
}

impl Drop for Communicator<'_> {
    fn drop(&mut self) {
        // Nothing can report a failure from drop; the work queued on it has been waited for.
        let _ = self.nccl.destroy_communicator(self.id);
    }
}

/// Enables peer access both ways between every two of `devices` that have P2P, and returns the
/// pairs (ordered, distinct) that have none.
pub(crate) fn enable_peers(
    backend: &dyn Backend,
    devices: &[usize],
) -> Result<Vec<(usize, usize)>> {
    let mut without = Vec::new();
    for &a in devices {
        for &b in devices {
            if a == b {
                continue;
            }
            if backend.topology().pair(a, b).is_some_and(|p| p.p2p) {
                backend.enable_peer_access(a, b)?;
            } else {
                without.push((a, b));
            }
        }
    }
    Ok(without)
}
