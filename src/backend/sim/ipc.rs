//! Sharing buffers between simulator processes: an exported buffer's bytes move into a shared
//! file (see `memory`), which the importing process opens from the file descriptor it received,
//! so the bytes really cross between processes. Each process keeps its own virtual clock; opening
//! an import costs its host [`IPC_OPEN_US`].

use super::memory::Key;
use super::Simulator;
use crate::backend::shared_file;
use crate::backend::sharing::RawSharing;
use crate::backend::Memory;
use crate::{Error, Result};
use std::fs::File;
use std::os::fd::OwnedFd;

/// The simulated host time of opening another process's buffer (cuIpcOpenMemHandle maps the
/// peer's allocation into this process: driver work of the order of a hundred microseconds). An
/// estimate of the order, not a measurement; no preset sets it.
pub const IPC_OPEN_US: f64 = 100.0;

impl RawSharing for Simulator {
    fn alloc_shared_host(&self, bytes: usize) -> Result<Key> {
        // Any simulated buffer can move into a shared file when it is exported.
        let host = Memory::PinnedHost { numa_node: None };
        self.lock().store.insert(host, bytes)
    }

    fn export(
        &self,
        buffer: &Key,
        _memory: Memory,
        _len: usize,
    ) -> Result<(Vec<u8>, Option<OwnedFd>)> {
        let mut st = self.lock();
        Self::catch_up(&mut st);
        let file = st.store.share(*buffer)?;
        Ok((Vec::new(), Some(OwnedFd::from(file))))
    }

    fn import(
        &self,
        memory: Memory,
        _gpu: usize,
        len: usize,
        handle: &[u8],
        fd: Option<OwnedFd>,
    ) -> Result<Key> {
        let Some(fd) = fd.filter(|_| handle.is_empty()) else {
            return Err(Error::usage(
                "cannot import the shared buffer: a simulator's export is a file descriptor and \
                 no handle bytes; this descriptor was not made by a simulator's export",
            ));
        };
        let file = File::from(fd);
        shared_file::check_len(&file, len)?;
        let mut st = self.lock();
        st.host_us += IPC_OPEN_US;
        Ok(st.store.import(memory, file, len))
    }

    fn device_address(&self, buffer: &Key) -> u64 {
        self.lock().store.address(*buffer)
    }
}
