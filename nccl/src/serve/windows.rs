//! Symmetric windows (`ncclCommWindowRegister` with `NCCL_WIN_COLL_SYMMETRIC`, a collective):
//! registered with the real NCCL first, so that a forwarded call keeps NCCL's symmetric kernels,
//! then, on a communicator peerlink serves, adopted by its all-reduce
//! (`GroupAllReduce::adopt_symmetric`: every rank's window shared with the others, by CUDA IPC
//! between processes). A served call whose output lies in the window then sums in place there —
//! two-shot copies nothing, where other memory is copied into the ranks' shared buffer and the
//! sum back — as NCCL's symmetric kernels do. NCCL's rule for symmetric windows holds: every
//! rank registers a window of one size, and calls with buffers at the same offset in it.
//!
//! A registration inside a group is adopted at the group's end (where NCCL has written its
//! handle), unless the group registered windows of several ranks of one clique of thread ranks:
//! one thread drives them all (nccl-tests `-g N`), and its calls sum the caller's buffers
//! directly. A registration where peerlink serves nothing stays NCCL's alone.

use std::sync::Arc;

use peerlink::backend::Backend;

use super::comm::{Comm, Peers};
use super::group::hold_window;
use super::{joined, server, Real, Server, State};
use crate::log;

/// `NCCL_WIN_COLL_SYMMETRIC`: every rank registers its window at once, for collectives.
pub const NCCL_WIN_COLL_SYMMETRIC: i32 = 0x01;

/// A window NCCL registered: its communicator, memory and flags.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub comm: usize,
    pub address: u64,
    pub size: usize,
    pub flags: i32,
}

/// A window registered inside a group, with what reads its handle (`ncclWindow_t`) once NCCL
/// wrote it, at the group's end.
pub struct HeldWindow {
    pub window: Window,
    pub handle: Box<dyn FnOnce() -> usize>,
}

/// After NCCL registered `window` (`handle` reads its `ncclWindow_t`): where it is symmetric,
/// adopted now, or held to the end of the group it was registered in.
pub fn window_registered(real: &dyn Real, window: Window, handle: Box<dyn FnOnce() -> usize>) {
    if window.flags & NCCL_WIN_COLL_SYMMETRIC == 0 || window.size == 0 {
        return;
    }
    let held = HeldWindow { window, handle };
    if let Some(now) = hold_window(held) {
        server().register_windows(real, vec![now]);
    }
}

impl Server {
    /// Adopts `held` (registered together, in the caller's order) where peerlink serves their
    /// communicators (each set up now, on the default stream, where it was not
    /// yet: every rank registers at once). Windows of two or more ranks of one clique of thread
    /// ranks are left alone: one thread registered for several ranks (nccl-tests `-g N`), whose
    /// calls sum the caller's buffers directly. A failure is said on stderr; the window stays
    /// NCCL's.
    pub fn register_windows(&self, real: &dyn Real, mut held: Vec<HeldWindow>) {
        if held.is_empty() || self.why_none().is_some() {
            return;
        }
        let Some(backend) = self.backend() else {
            return;
        };
        let mut addresses: Vec<usize> = Vec::new();
        for held in &held {
            if !addresses.contains(&held.window.comm) {
                addresses.push(held.window.comm);
            }
        }
        let Some(entries) = addresses
            .iter()
            .map(|&address| self.comm(real, address))
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        let Some(mut guards) = entries
            .iter()
            .map(|e| e.lock().ok())
            .collect::<Option<Vec<_>>>()
        else {
            return;
        };
        let mut pending: Vec<&mut Comm> = guards
            .iter_mut()
            .map(|g| &mut **g)
            .filter(|c| matches!(c.state, State::Pending))
            .collect();
        let streams = vec![0; pending.len()];
        self.set_up(backend, real, &mut pending, &streams);
        if one_thread_drives_several_ranks(&guards) {
            return;
        }
        let at = |window: &Window| {
            let at = addresses.iter().position(|&a| a == window.comm);
            at.expect("every window's communicator was looked up")
        };
        // Adopting meets every rank: communicators in their meeting order, each one's windows
        // in the caller's order (the sort is stable).
        held.sort_by_key(|h| guards[at(&h.window)].meeting_order);
        for HeldWindow { window, handle } in held {
            let comm = &mut *guards[at(&window)];
            if let Err(e) = self.adopt(backend, comm, window, handle()) {
                log::write(&[format!(
                    "communicator {:#x}: its symmetric window of {} bytes stays NCCL's alone, so \
                     served calls in it copy as for other memory ({e})",
                    window.comm, window.size
                )]);
            }
        }
    }

    /// Adopts `window` (its `ncclWindow_t`: `handle`) into `comm`'s all-reduce (joined now where
    /// its ranks are threads or it has one).
    fn adopt(
        &self,
        backend: &Arc<dyn Backend>,
        comm: &mut Comm,
        window: Window,
        handle: usize,
    ) -> peerlink::Result<()> {
        let Some(peers) = comm.served_peers() else {
            return Ok(());
        };
        let _kept = backend.keep_thread_context()?;
        let reduce = joined(backend, self.model(backend), comm, peers)?;
        let adopted = reduce.adopt_symmetric(window.address, window.size)?;
        comm.windows.insert(handle, adopted);
        self.log_decision(
            comm,
            &format!(
                "its symmetric window of {} bytes is summed in place by served calls",
                window.size
            ),
        );
        Ok(())
    }

    /// How many of `comm`'s symmetric windows peerlink's all-reduce holds (0 for a communicator
    /// it does not know).
    pub fn windows_of(&self, comm: usize) -> usize {
        let entry = self.known(comm);
        entry.map_or(0, |entry| entry.lock().map_or(0, |comm| comm.windows.len()))
    }

    /// Peerlink's state of `comm`, where it has made one.
    fn known(&self, comm: usize) -> Option<Arc<std::sync::Mutex<Comm>>> {
        self.comms.lock().ok()?.get(&comm).cloned()
    }

    /// Before NCCL deregisters window `handle` of `comm` (a collective too): gives it up, every
    /// rank together, where it was adopted.
    pub fn deregister_window(&self, comm: usize, handle: usize) {
        let Some(entry) = self.known(comm) else {
            return;
        };
        let Ok(mut comm) = entry.lock() else {
            return;
        };
        let Some(buffer) = comm.windows.remove(&handle) else {
            return;
        };
        let released = comm
            .reduce
            .as_mut()
            .map(|reduce| reduce.release_symmetric(buffer));
        if let Some(Err(e)) = released {
            log::write(&[format!(
                "communicator {:#x}: its symmetric window could not be given up ({e})",
                comm.address
            )]);
        }
    }
}

/// Whether two of `comms` are ranks of one clique of this process's threads (so one thread
/// drives them both).
fn one_thread_drives_several_ranks(comms: &[std::sync::MutexGuard<'_, Comm>]) -> bool {
    let cliques: Vec<_> = comms
        .iter()
        .filter_map(|comm| match comm.served_peers() {
            Some(Peers::Threads(clique)) => Some(clique),
            _ => None,
        })
        .collect();
    (1..cliques.len()).any(|i| cliques[..i].iter().any(|c| Arc::ptr_eq(c, &cliques[i])))
}
