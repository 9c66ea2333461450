//! Running peerlink as N cooperating processes, one per GPU (issue 17).
//!
//! A process learns who it is from the variables its launcher set ([`from_env`]: torchrun, Slurm's
//! `srun`, Open MPI's `mpirun`, or `peerlink launch`), then meets the others at a TCP rendezvous
//! ([`Group::join`]): rank 0 listens on `MASTER_ADDR:MASTER_PORT`, the others connect. Through the
//! group the processes exchange small control messages only — identities, the NCCL unique id, CUDA
//! IPC memory handles (plain bytes), figures to gather — and, between ranks of one host, file
//! descriptors ([`Group::send_fds`]: memory-pool and memfd handles, over a Unix socket with
//! `SCM_RIGHTS`). Data moves through NCCL or CUDA, never through these sockets.
//!
//! **Failure.** Every call has the rendezvous' timeout. A rank that never arrives, dies (its
//! connection closes without a goodbye) or hangs (no heartbeat for the timeout: stopped with
//! SIGSTOP, stuck, its host gone) makes every other rank's next or pending call fail within the
//! timeout with one sentence naming the rank ([`Error::Group`](crate::Error::Group), exit status
//! 3). Rank 0 judges: it hears every rank's heartbeats and contributions and sends the verdict to
//! all. `docs/multi-process.md` says how to launch and what each failure looks like.
//!
//! ```no_run
//! use peerlink::launch::{self, Group};
//!
//! if let Some((launcher, identity, rendezvous)) = launch::from_env()? {
//!     let group = Group::join(identity, &rendezvous)?;
//!     let ids = group.all_gather(&identity.rank.to_le_bytes())?;
//!     assert_eq!(ids.len(), identity.world);
//!     group.barrier()?;
//!     println!("rank {} of {} ({launcher})", identity.rank, identity.world);
//! }
//! # Ok::<(), peerlink::Error>(())
//! ```

pub mod agree;
pub mod check;
mod env;
mod fds;
mod group;
pub mod nccl_topology;
mod wire;

pub use env::{from_env, from_vars, parse_timeout};
pub use group::{heartbeat_interval, FailureWatch, Group};
pub use wire::MAX_MESSAGE;

use std::net::SocketAddr;
use std::time::Duration;

/// How long a rank waits for the others, at the rendezvous and in every call, when neither
/// `PEERLINK_TIMEOUT` nor `peerlink launch --timeout` says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

/// Who this process is among the processes of a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Identity {
    /// 0 to `world - 1`; rank 0 holds the rendezvous.
    pub rank: usize,
    /// How many processes the run has.
    pub world: usize,
    /// This process's index among the processes of its host (by convention, its GPU).
    pub local_rank: usize,
    /// How many processes run on this host.
    pub local_world: usize,
}

impl Identity {
    /// The one process of a single-process run.
    pub const SINGLE: Identity = Identity {
        rank: 0,
        world: 1,
        local_rank: 0,
        local_world: 1,
    };
}

/// Which launcher's variables told a process who it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Launcher {
    /// `peerlink launch` (torchrun's variables, marked with `PEERLINK_LAUNCHED`).
    Peerlink,
    /// torchrun, or anything else that sets `RANK` and `WORLD_SIZE`.
    Torchrun,
    /// A task of Slurm's `srun` (`SLURM_PROCID`, `SLURM_STEP_ID`, …).
    Slurm,
    /// Open MPI's `mpirun` (`OMPI_COMM_WORLD_*`).
    OpenMpi,
}

impl std::fmt::Display for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Launcher::Peerlink => "peerlink launch",
            Launcher::Torchrun => "torchrun",
            Launcher::Slurm => "Slurm",
            Launcher::OpenMpi => "Open MPI",
        })
    }
}

/// Where the ranks meet, and how long each waits for the others.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rendezvous {
    /// Rank 0's address: `MASTER_ADDR:MASTER_PORT`.
    pub addr: SocketAddr,
    /// How long a rank waits for the others to arrive, for any call to complete, and for a
    /// silent rank's heartbeat before it is taken for hung.
    pub timeout: Duration,
}

/// One process of a group, as every rank sees it after the rendezvous.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub identity: Identity,
    pub pid: u32,
    /// The host's name (`hostname`).
    pub host: String,
    /// What tells hosts apart (the kernel's boot id, else the name): ranks with the same one
    /// share a kernel, so they can pass file descriptors and open each other's CUDA IPC handles.
    pub(crate) host_id: String,
}

/// Reads the launcher's variables and joins the group; `None` for a single-process run.
pub fn join_from_env() -> crate::Result<Option<(Launcher, Group)>> {
    match from_env()? {
        None => Ok(None),
        Some((launcher, identity, rendezvous)) => {
            Ok(Some((launcher, Group::join(identity, &rendezvous)?)))
        }
    }
}

#[cfg(test)]
pub(crate) mod tests;

/// Locks `mutex`, also where a thread panicked holding it (what it guards stays consistent). Here,
/// above the group and the descriptor links, so that both may use it without importing each other.
fn lock<T>(mutex: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}
