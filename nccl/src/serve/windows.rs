//! Symmetric windows (`ncclCommWindowRegister` with `NCCL_WIN_COLL_SYMMETRIC`, a collective):
//! registered with the real NCCL first, so that a forwarded call keeps NCCL's symmetric kernels,
//! then, on a communicator peerlink serves with other ranks, adopted by its all-reduce
//! (`GroupAllReduce::adopt_symmetric`: every rank's window shared with the others, by CUDA IPC
//! between processes). A served call whose output lies in the window then sums in place there —
//! two-shot copies nothing, where other memory is copied into the ranks' shared buffer and the
//! sum back — as NCCL's symmetric kernels do. NCCL's rule for symmetric windows holds: every
//! rank registers a window of one size, and calls with buffers at the same offset in it.
//!
//! A registration inside a group stays NCCL's alone (one thread may register for several ranks
//! there, and adopting is a meeting of every rank); so does one where peerlink serves nothing.

use std::sync::Arc;

use peerlink::backend::Backend;

use super::comm::Comm;
use super::group::in_group;
use super::{joined, Real, Server, State};
use crate::log;

/// `NCCL_WIN_COLL_SYMMETRIC`: every rank registers its window at once, for collectives.
pub const NCCL_WIN_COLL_SYMMETRIC: i32 = 0x01;

/// A window NCCL registered: its communicator, memory, handle (`ncclWindow_t`) and flags.
#[derive(Clone, Copy, Debug)]
pub struct Window {
    pub comm: usize,
    pub address: u64,
    pub size: usize,
    pub handle: usize,
    pub flags: i32,
}

impl Server {
    /// After NCCL registered `window`: adopts it where it is symmetric and its communicator is
    /// served with other ranks (set up now, on the default stream, where it was not yet — every
    /// rank registers at once). A failure is said on stderr; the window stays NCCL's.
    pub fn register_window(&self, real: &dyn Real, window: Window) {
        let symmetric = window.flags & NCCL_WIN_COLL_SYMMETRIC != 0;
        if !symmetric || window.size == 0 || in_group() || self.why_none().is_some() {
            return;
        }
        let Some(backend) = self.backend() else {
            return;
        };
        let Some(entry) = self.comm(real, window.comm) else {
            return;
        };
        let Ok(mut comm) = entry.lock() else {
            return;
        };
        if matches!(comm.state, State::Pending) {
            self.set_up(backend, real, &mut [&mut comm], &[0]);
        }
        if let Err(e) = self.adopt(backend, &mut comm, window) {
            log::write(&[format!(
                "communicator {:#x}: its symmetric window of {} bytes stays NCCL's alone, so \
                 served calls in it copy as for other memory ({e})",
                window.comm, window.size
            )]);
        }
    }

    /// Adopts `window` into `comm`'s all-reduce (joined now where its ranks are threads).
    fn adopt(
        &self,
        backend: &Arc<dyn Backend>,
        comm: &mut Comm,
        window: Window,
    ) -> peerlink::Result<()> {
        let Some(peers) = comm.served_peers() else {
            return Ok(());
        };
        let _kept = backend.keep_thread_context()?;
        let Some(reduce) = joined(backend, self.model(backend), comm, peers)? else {
            return Ok(());
        };
        let adopted = reduce.adopt(window.address, window.size)?;
        comm.windows.insert(window.handle, adopted);
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
        let entry = self.comms.lock().ok().and_then(|c| c.get(&comm).cloned());
        entry.map_or(0, |entry| entry.lock().map_or(0, |comm| comm.windows.len()))
    }

    /// Before NCCL deregisters window `handle` of `comm` (a collective too): gives it up, every
    /// rank together, where it was adopted.
    pub fn deregister_window(&self, comm: usize, handle: usize) {
        let Some(entry) = self.comms.lock().ok().and_then(|c| c.get(&comm).cloned()) else {
            return;
        };
        let Ok(mut comm) = entry.lock() else {
            return;
        };
        let Some(buffer) = comm.windows.remove(&handle) else {
            return;
        };
        let released = comm.reduce.as_mut().map(|reduce| reduce.release(buffer));
        if let Some(Err(e)) = released {
            log::write(&[format!(
                "communicator {:#x}: its symmetric window could not be given up ({e})",
                comm.address
            )]);
        }
    }
}
