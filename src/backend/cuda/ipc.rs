//! Sharing buffers between processes on real GPUs: device memory through CUDA IPC handles
//! (cuIpcGetMemHandle, opened with cuIpcOpenMemHandle and closed with cuIpcCloseMemHandle when the
//! import is freed); pinned host memory as a shared file every process maps and registers.
//!
//! Device buffers come from cuMemAlloc_v2, never from a stream-ordered pool, so the legacy IPC
//! handle covers them all (pool memory would need cuMemPoolExportPointer instead). Another
//! library's memory, borrowed, goes as a range of its allocation (`ranges`).

use super::driver::{DeviceMemory, PinnedMemory, IPC_HANDLE_BYTES};
use super::{ranges, Buffer, Gpus, Storage};
use crate::backend::sharing::RawSharing;
use crate::backend::{shared_file, Memory};
use crate::{Error, Result};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::sync::Arc;

/// A shared file's descriptor, duplicated for another process.
fn duplicate(file: &File) -> Result<OwnedFd> {
    Ok(OwnedFd::from(file.try_clone().map_err(|source| {
        Error::Io {
            path: "(a shared buffer's file)".into(),
            source,
        }
    })?))
}

impl RawSharing for Gpus {
    fn alloc_shared_host(&self, bytes: usize) -> Result<Arc<Buffer>> {
        let file = shared_file::create(bytes)?;
        // Portable memory: the context it is registered in does not matter.
        let memory = PinnedMemory::from_shared_file(self.any_context()?, file, bytes)?;
        Ok(Arc::new(Buffer(Storage::Pinned(memory))))
    }

    fn export(
        &self,
        buffer: &Arc<Buffer>,
        _memory: Memory,
        len: usize,
    ) -> Result<(Vec<u8>, Option<OwnedFd>)> {
        match &buffer.0 {
            Storage::Device(memory) => Ok((memory.ipc_handle()?, None)),
            Storage::Pinned(memory) => {
                let file = memory
                    .shared_file()
                    .expect("the checked layer exports only shared host memory");
                Ok((Vec::new(), Some(duplicate(file)?)))
            }
            Storage::Managed(_) => unreachable!("the checked layer refuses managed memory"),
            Storage::Borrowed { address, device } => {
                ranges::export(self.context(*device)?, *address, len)
            }
            Storage::Nccl(_) => unreachable!("the checked layer refuses NCCL's memory"),
            Storage::Range(_) => unreachable!("the checked layer refuses imports"),
        }
    }

    fn import(
        &self,
        memory: Memory,
        gpu: usize,
        len: usize,
        handle: &[u8],
        fd: Option<OwnedFd>,
    ) -> Result<Arc<Buffer>> {
        let storage =
            match (memory, fd) {
                // Opened in the issuing GPU's context: there the mapping reaches the memory's
                // GPU through peer access; opened in the memory's own GPU's context, other GPUs'
                // copies took a slow path and their kernels faulted (the H200 pair, 2026-11-30).
                (Memory::Device(_), None) if handle.len() == IPC_HANDLE_BYTES => {
                    Storage::Device(DeviceMemory::open_ipc(self.context(gpu)?, handle)?)
                }
                // A range of another library's memory (see `ranges`).
                (Memory::Device(_), fd) => {
                    let ctx = self.context(gpu)?;
                    Storage::Range(ranges::RangeImport::open(ctx, handle, fd, len)?)
                }
                (Memory::PinnedHost { .. }, Some(fd)) if handle.is_empty() => {
                    let file = File::from(fd);
                    shared_file::check_len(&file, len)?;
                    Storage::Pinned(PinnedMemory::from_shared_file(
                        self.any_context()?,
                        file,
                        len,
                    )?)
                }
                _ => return Err(Error::usage(
                    "cannot import the shared buffer: device memory travels as a CUDA IPC handle \
                     alone and host memory as a file descriptor alone; this descriptor mixes them",
                )),
            };
        Ok(Arc::new(Buffer(storage)))
    }

    fn device_address(&self, buffer: &Arc<Buffer>) -> u64 {
        buffer.address()
    }
}
