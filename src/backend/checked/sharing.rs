//! Checks of sharing between processes: only memory this process allocated, of a kind that can be
//! shared, or another library's device memory it borrowed, is exported; a descriptor is imported
//! only from a backend of the same source, naming a GPU this process sees, with its file where it
//! says it has one.

use super::{BufferEntry, Checked};
use crate::backend::raw::RawCollectives;
use crate::backend::sharing::{RawSharing, ShareDescriptor, SharedBuffer, SharedMemory, Sharing};
use crate::backend::{BufferId, Memory};
use crate::{Error, Result};

/// Where a buffer's memory came from, as far as sharing goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// Allocated here with `alloc`.
    Allocated,
    /// Allocated here as host memory other processes can map.
    SharedHost,
    /// Another process's buffer, opened here for work issued on GPU `gpu` (device memory is
    /// mapped for that GPU alone).
    Imported { gpu: usize },
    /// Another library's memory in this process ([`crate::backend::Backend::borrow_memory`]).
    Borrowed,
    /// NCCL's memory for symmetric windows ([`crate::backend::Nccl::alloc_window_memory`]).
    Nccl,
}

impl<I: RawCollectives + RawSharing> Sharing for Checked<I> {
    fn alloc_shared_host(&self, bytes: usize) -> Result<BufferId> {
        if bytes == 0 {
            return Err(Error::usage("cannot allocate a buffer of 0 bytes"));
        }
        let raw = self.raw.alloc_shared_host(bytes)?;
        self.insert_buffer(
            raw,
            Memory::PinnedHost { numa_node: None },
            bytes,
            Origin::SharedHost,
        )
    }

    fn export(&self, buffer: BufferId) -> Result<SharedBuffer> {
        let (raw, memory, len) = {
            let st = self.lock();
            let entry = st.buffers.get(buffer.0)?;
            let refusal = match (entry.origin, entry.memory) {
                (Origin::Imported { .. }, _) => Some(
                    "was imported from another process: export it in the process that allocated it"
                        .to_string(),
                ),
                (Origin::Nccl, _) => Some(
                    "is NCCL's memory (ncclMemAlloc), which CUDA IPC cannot share: share it \
                     through an NCCL window registered by every rank"
                        .to_string(),
                ),
                (_, Memory::Managed(_)) => Some(
                    "is managed memory, which CUDA cannot share between processes: export device \
                     memory or shared host memory"
                        .to_string(),
                ),
                (Origin::Allocated, Memory::PinnedHost { .. }) => Some(
                    "is pinned host memory private to this process: allocate host memory to share \
                     with alloc_shared_host"
                        .to_string(),
                ),
                _ => None,
            };
            if let Some(why) = refusal {
                return Err(Error::usage(format!("cannot export {buffer}: it {why}")));
            }
            (entry.raw.clone(), entry.memory, entry.len)
        };
        let (handle, fd) = self.raw.export(&raw, memory, len)?;
        let memory = match memory {
            Memory::Device(d) => SharedMemory::Device {
                gpu_uuid: self.raw.topology().devices[d].uuid.clone(),
            },
            _ => SharedMemory::Host,
        };
        let descriptor = ShareDescriptor {
            source: self.raw.topology().source.clone(),
            memory,
            len,
            handle,
            has_fd: fd.is_some(),
        };
        Ok(SharedBuffer { descriptor, fd })
    }

    fn import(&self, shared: SharedBuffer, gpu: usize) -> Result<BufferId> {
        self.check_device(gpu)?;
        let SharedBuffer { descriptor, fd } = shared;
        let source = &self.raw.topology().source;
        if descriptor.source != *source {
            return Err(Error::usage(format!(
                "cannot import a buffer exported by a `{}` backend into this `{source}` one: run \
                 every process on the same backend (the same --sim preset, or real GPUs)",
                descriptor.source
            )));
        }
        if descriptor.has_fd != fd.is_some() {
            let (says, came) = if descriptor.has_fd {
                ("has", "none came")
            } else {
                ("has no", "one came")
            };
            return Err(Error::usage(format!(
                "cannot import the shared buffer: its descriptor {says} file descriptor but \
                 {came}; send the descriptor and its file descriptor from one export together"
            )));
        }
        if descriptor.len == 0 {
            return Err(Error::usage(
                "cannot import a shared buffer of 0 bytes: the descriptor is not from an export",
            ));
        }
        let memory = match &descriptor.memory {
            SharedMemory::Host => Memory::PinnedHost { numa_node: None },
            SharedMemory::Device { gpu_uuid } => {
                let devices = &self.raw.topology().devices;
                let index = devices.iter().position(|d| d.uuid == *gpu_uuid);
                Memory::Device(index.ok_or_else(|| {
                    Error::usage(format!(
                        "cannot import the shared buffer: it is memory of GPU {gpu_uuid}, which \
                         this process does not see; give every process the same GPUs \
                         (CUDA_VISIBLE_DEVICES)"
                    ))
                })?)
            }
        };
        let raw = self
            .raw
            .import(memory, gpu, descriptor.len, &descriptor.handle, fd)?;
        self.insert_buffer(raw, memory, descriptor.len, Origin::Imported { gpu })
    }

    fn device_address(&self, buffer: BufferId) -> Result<u64> {
        let st = self.lock();
        let entry = st.buffers.get(buffer.0)?;
        match entry.memory {
            Memory::Device(_) => Ok(self.raw.device_address(&entry.raw)),
            other => Err(Error::usage(format!(
                "{buffer} is {other}, not device memory: only device memory has an address to \
                 lend another library; allocate Memory::Device"
            ))),
        }
    }
}

impl<I: RawCollectives> Checked<I> {
    /// Files a new buffer in the table and returns its handle.
    pub(super) fn insert_buffer(
        &self,
        raw: I::Buffer,
        memory: Memory,
        len: usize,
        origin: Origin,
    ) -> Result<BufferId> {
        let entry = BufferEntry {
            memory,
            len,
            origin,
            raw,
        };
        self.lock().buffers.insert(entry).map(BufferId)
    }
}
