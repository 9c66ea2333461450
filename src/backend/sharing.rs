//! Buffers shared between processes on one host: one process exports a buffer, another imports
//! it and copies into or out of the same memory.
//!
//! An export is a [`SharedBuffer`]: a [`ShareDescriptor`] of plain bytes (which GPU, how long, the
//! backend's own handle) that may travel over any channel, and for some memory a file descriptor,
//! which only a Unix socket can carry (SCM_RIGHTS). On real GPUs device memory travels as a CUDA
//! IPC handle (`cuIpcGetMemHandle`, opened with `cuIpcOpenMemHandle`); pinned host memory that
//! other processes can map is a shared file mapped and registered with the driver in each process.
//! On the simulator every exported buffer becomes a shared file, so the bytes really move between
//! processes.
//!
//! An imported buffer is an ordinary [`BufferId`] in the importing process: a copy's source or
//! destination, read and written like any other, and closed with [`Backend::free`] (which leaves
//! the exporter's memory alone). Another process's device memory is mapped for one GPU of the
//! importing process, named at import: CUDA maps an IPC handle into one context per GPU, with
//! peer access from that GPU to the memory's own enabled as it opens, so only work issued on that
//! GPU reaches it (the usual choice: the GPU this process drives).
//!
//! [`Backend::free`]: super::Backend::free

use super::{BufferId, Memory, RawBackend};
use crate::topology::Source;
use crate::Result;
use serde::{Deserialize, Serialize};
use std::os::fd::OwnedFd;

/// Which memory a shared buffer is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum SharedMemory {
    /// Device memory of the GPU with this UUID (device indices may differ between processes).
    Device { gpu_uuid: String },
    /// Page-locked host memory that every process maps from one shared file.
    Host,
}

/// The plain-bytes part of an exported buffer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShareDescriptor {
    /// The exporting backend (`cuda`, `sim:<preset>`): a handle opens only in a backend of the
    /// same source.
    pub source: Source,
    pub memory: SharedMemory,
    /// The buffer's size in bytes.
    pub len: usize,
    /// The backend's own handle (a CUDA IPC memory handle; empty where the file says it all).
    pub handle: Vec<u8>,
    /// Whether a file descriptor belongs with the descriptor ([`SharedBuffer::fd`]).
    pub has_fd: bool,
}

/// An exported buffer: what another process needs to import it.
#[derive(Debug)]
pub struct SharedBuffer {
    pub descriptor: ShareDescriptor,
    /// The shared file behind the memory, where there is one (to send with SCM_RIGHTS).
    pub fd: Option<OwnedFd>,
}

/// Sharing buffers with other processes of this host (see the module documentation).
pub trait Sharing {
    /// Allocates `bytes` (> 0) of pinned host memory that other processes can map: a buffer like
    /// `Memory::PinnedHost`, which [`Sharing::export`] accepts. The host-staged route between
    /// processes goes through it.
    fn alloc_shared_host(&self, bytes: usize) -> Result<BufferId>;

    /// Exports a buffer this process allocated: device memory, or host memory from
    /// [`Sharing::alloc_shared_host`]; or another library's device memory it borrowed
    /// ([`crate::backend::Backend::borrow_memory`]: on real GPUs memory of cudaMalloc, or mapped
    /// with a file-descriptor handle as ncclMemAlloc maps it; not of a stream-ordered pool). The
    /// buffer stays this process's to use and free; an importer must close its import before the
    /// exporter frees it (or its owner frees the memory).
    fn export(&self, buffer: BufferId) -> Result<SharedBuffer>;

    /// Opens a buffer another process exported, for work issued on GPU `gpu` of this process:
    /// device memory is mapped for that GPU alone (copies and kernels issued on another GPU are
    /// refused), shared host memory for every GPU. A descriptor from another kind of backend, a
    /// GPU this process does not see, or a missing or wrong file is an [`Error::Usage`] saying so.
    ///
    /// [`Error::Usage`]: crate::Error::Usage
    fn import(&self, shared: SharedBuffer, gpu: usize) -> Result<BufferId>;

    /// The unified address of a device buffer's first byte: what another library in this process
    /// (PyTorch, CuPy) or [`crate::backend::Backend::borrow_memory`] takes. The simulator's
    /// addresses are made up: only its own `borrow_memory` understands them.
    fn device_address(&self, buffer: BufferId) -> Result<u64>;
}

/// Sharing, below the checks.
pub trait RawSharing: RawBackend {
    /// `bytes` > 0.
    fn alloc_shared_host(&self, bytes: usize) -> Result<Self::Buffer>;

    /// The buffer was allocated by this process as `memory` (device memory, or shared host
    /// memory) and is `len` bytes long; returns the handle bytes and the file, if any.
    fn export(
        &self,
        buffer: &Self::Buffer,
        memory: Memory,
        len: usize,
    ) -> Result<(Vec<u8>, Option<OwnedFd>)>;

    /// The descriptor came from a backend of this one's source; `memory` is the device memory of
    /// a GPU of this process (its index here) or `PinnedHost { numa_node: None }`; `len` > 0; a
    /// file is there exactly when the descriptor says so. Device memory is mapped for work issued
    /// on `gpu` (a GPU of this process).
    fn import(
        &self,
        memory: Memory,
        gpu: usize,
        len: usize,
        handle: &[u8],
        fd: Option<OwnedFd>,
    ) -> Result<Self::Buffer>;

    /// The buffer is device memory.
    fn device_address(&self, buffer: &Self::Buffer) -> u64;
}
