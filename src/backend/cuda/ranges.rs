//! Sharing a range of another library's device memory with other processes (a buffer a caller of
//! the NCCL-API library registered as a window, a PyTorch tensor): the range travels as a handle
//! of the allocation that holds it and the range's offset there.
//!
//! - Memory from cuMemAlloc (cudaMalloc, PyTorch's caching allocator) goes as a CUDA IPC handle
//!   of its whole allocation — cuIpcGetMemHandle takes an allocation's start only — which the
//!   importer opens as for peerlink's own buffers.
//! - Memory mapped through CUDA's virtual memory management (cuMemCreate, as ncclMemAlloc maps
//!   one physical allocation per buffer), which CUDA IPC refuses, goes as a POSIX file descriptor
//!   of its physical allocation (cuMemExportToShareableHandle; the allocation must have been made
//!   with that handle type, as ncclMemAlloc makes it). The importer maps it into an address range
//!   of its own (cuMemAddressReserve, cuMemMap) and opens that to its GPU (cuMemSetAccess). The
//!   range must lie in the one mapping the driver names for its address.
//! - Memory of a stream-ordered pool (cudaMallocAsync) is refused.
//!
//! The handle bytes say which: an IPC handle and the offset (72 bytes), or the allocation's size
//! and the offset (16 bytes) beside the file descriptor. Every integer is little-endian.

use super::driver::{allocation_of, bind, failed, DeviceMemory, IPC_HANDLE_BYTES};
use crate::Error;
use cudarc::driver::sys;
use cudarc::driver::CudaContext;
use std::ffi::c_void;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

/// The handle bytes of a range of cuMemAlloc memory: its allocation's IPC handle, the offset.
const IPC_RANGE_BYTES: usize = IPC_HANDLE_BYTES + 8;
/// The handle bytes of a range of mapped memory: its physical allocation's size, the offset.
const MAPPED_RANGE_BYTES: usize = 16;

const POSIX_FD: sys::CUmemAllocationHandleType =
    sys::CUmemAllocationHandleType::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;

/// Exports the `len` bytes at `address`, memory of `ctx`'s GPU that another library allocated:
/// the handle bytes, and the file descriptor where the memory is mapped memory.
pub(super) fn export(
    ctx: &Arc<CudaContext>,
    address: u64,
    len: usize,
) -> Result<(Vec<u8>, Option<OwnedFd>), Error> {
    let allocation = allocation_of(ctx, address)?;
    if allocation.pool.is_some() {
        return Err(Error::usage(format!(
            "cannot export the memory at {address:#x}: it is of a stream-ordered pool \
             (cudaMallocAsync), which peerlink does not share; allocate it with cudaMalloc or \
             ncclMemAlloc"
        )));
    }
    let offset = address - allocation.start;
    if offset + len as u64 > allocation.size as u64 {
        return Err(Error::usage(format!(
            "cannot export {len} bytes at {address:#x}: they run past the end of the allocation \
             that holds them ({} bytes from {:#x}); share memory of one allocation",
            allocation.size, allocation.start
        )));
    }
    if let Some(handle) = Retained::of(ctx, address)? {
        // Mapped memory made without a shareable handle type gives no descriptor: it may still
        // be cuMemAlloc's underneath, which CUDA IPC shares.
        if let Some(fd) = handle.descriptor() {
            let mut bytes = (allocation.size as u64).to_le_bytes().to_vec();
            bytes.extend_from_slice(&offset.to_le_bytes());
            return Ok((bytes, Some(fd)));
        }
    }
    let mut bytes = DeviceMemory::ipc_handle_at(ctx, allocation.start).map_err(|e| {
        Error::usage(format!(
            "cannot export the memory at {address:#x}: the driver shares neither its allocation's \
             IPC handle ({e}) nor a file descriptor of it; share memory of cudaMalloc, or mapped \
             with a POSIX file descriptor handle type as ncclMemAlloc maps it"
        ))
    })?;
    bytes.extend_from_slice(&offset.to_le_bytes());
    Ok((bytes, None))
}

/// A physical allocation's handle, retained from an address it is mapped at, released on drop.
struct Retained(sys::CUmemGenericAllocationHandle);

impl Retained {
    /// The handle of the mapped memory at `address`, or `None` where the memory is not mapped
    /// memory (the driver refuses cuMemRetainAllocationHandle for cuMemAlloc's).
    fn of(ctx: &CudaContext, address: u64) -> Result<Option<Retained>, Error> {
        bind(ctx)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer; the driver looks the address up and never
        // dereferences it.
        let retained = unsafe {
            sys::cuMemRetainAllocationHandle(&mut handle, address as usize as *mut c_void)
        };
        Ok(retained.result().ok().map(|()| Retained(handle)))
    }
}

impl Retained {
    /// A POSIX file descriptor of the allocation for another process, where it was made with
    /// that handle type (cuMemExportToShareableHandle).
    fn descriptor(&self) -> Option<OwnedFd> {
        let mut fd: std::ffi::c_int = -1;
        // SAFETY: `fd` is a valid out-pointer for a POSIX file descriptor (an int), the handle a
        // live one retained by `of`.
        let exported = unsafe {
            sys::cuMemExportToShareableHandle(
                (&mut fd as *mut std::ffi::c_int).cast(),
                self.0,
                POSIX_FD,
                0,
            )
        };
        // SAFETY: where the export succeeded the driver returned a new descriptor, owned by no
        // one else.
        exported
            .result()
            .ok()
            .map(|()| unsafe { OwnedFd::from_raw_fd(fd) })
    }
}

impl Drop for Retained {
    fn drop(&mut self) {
        // SAFETY: the handle was retained once, in `of`, and is released once, here.
        let _ = unsafe { sys::cuMemRelease(self.0) };
    }
}

/// Another process's range of device memory, opened for work of one GPU of this process.
pub(super) enum RangeImport {
    /// cuMemAlloc memory: its allocation opened by its IPC handle, the range at `offset` in it.
    Ipc { memory: DeviceMemory, offset: u64 },
    /// Mapped memory, mapped here.
    Mapped(MappedRange),
}

impl RangeImport {
    /// Opens the range of `len` bytes that `handle` (and `fd`, for mapped memory) describe for
    /// work in `ctx`; a mapped range is refused where it would run past its allocation.
    pub(super) fn open(
        ctx: &Arc<CudaContext>,
        handle: &[u8],
        fd: Option<OwnedFd>,
        len: usize,
    ) -> Result<RangeImport, Error> {
        let word = |at: usize| u64::from_le_bytes(handle[at..at + 8].try_into().expect("8 bytes"));
        let within = |offset: u64, size: u64| {
            offset
                .checked_add(len as u64)
                .is_some_and(|end| end <= size)
        };
        match (handle.len(), fd) {
            // The exporter checked the range against its allocation; as for peerlink's own IPC
            // handles, the length is taken as sent.
            (IPC_RANGE_BYTES, None) => Ok(RangeImport::Ipc {
                memory: DeviceMemory::open_ipc(ctx, &handle[..IPC_HANDLE_BYTES])?,
                offset: word(IPC_HANDLE_BYTES),
            }),
            (MAPPED_RANGE_BYTES, Some(fd)) => {
                let (size, offset) = (word(0), word(8));
                if !within(offset, size) {
                    return Err(malformed());
                }
                let mapped = MappedRange::map(ctx, &fd, size as usize, offset)?;
                Ok(RangeImport::Mapped(mapped))
            }
            _ => Err(malformed()),
        }
    }

    /// The unified address of the range's first byte in this process.
    pub(super) fn address(&self) -> u64 {
        match self {
            RangeImport::Ipc { memory, offset } => memory.address() + offset,
            RangeImport::Mapped(range) => range.address + range.offset,
        }
    }

    /// The GPU whose context opened it.
    pub(super) fn device(&self) -> usize {
        match self {
            RangeImport::Ipc { memory, .. } => memory.device(),
            RangeImport::Mapped(range) => range.ctx.ordinal(),
        }
    }
}

fn malformed() -> Error {
    Error::usage(
        "cannot import the shared buffer: its handle is neither a CUDA IPC handle nor a range of \
         another library's memory as peerlink exports them, or its length runs past that memory; \
         send the descriptor of one export unchanged, with its file descriptor where it has one",
    )
}

/// Another process's mapped memory, mapped into an address range of this process and opened to
/// one GPU; unmapped and released on drop.
pub(super) struct MappedRange {
    ctx: Arc<CudaContext>,
    handle: sys::CUmemGenericAllocationHandle,
    address: sys::CUdeviceptr,
    size: usize,
    offset: u64,
    mapped: bool,
}

impl MappedRange {
    /// Imports the physical allocation of `size` bytes behind `fd` and maps it whole for `ctx`'s
    /// GPU, read and write.
    fn map(ctx: &Arc<CudaContext>, fd: &OwnedFd, size: usize, offset: u64) -> Result<Self, Error> {
        bind(ctx)?;
        let mut handle: sys::CUmemGenericAllocationHandle = 0;
        // SAFETY: `handle` is a valid out-pointer; for POSIX descriptors the driver takes the
        // descriptor's number in place of a pointer and duplicates what it needs (ours stays ours).
        unsafe {
            sys::cuMemImportFromShareableHandle(
                &mut handle,
                fd.as_raw_fd() as isize as *mut c_void,
                POSIX_FD,
            )
        }
        .result()
        .map_err(failed("cuMemImportFromShareableHandle"))?;
        let mut range = MappedRange {
            ctx: ctx.clone(),
            handle,
            address: 0,
            size,
            offset,
            mapped: false,
        };
        // SAFETY: a valid out-pointer; the driver picks an address range of `size` bytes
        // (a multiple of the allocation's granularity: the exporter's mapped size).
        unsafe { sys::cuMemAddressReserve(&mut range.address, size, 0, 0, 0) }
            .result()
            .map_err(failed("cuMemAddressReserve"))?;
        // SAFETY: the range was reserved above with the allocation's size; the handle is live.
        unsafe { sys::cuMemMap(range.address, size, 0, handle, 0) }
            .result()
            .map_err(failed("cuMemMap"))?;
        range.mapped = true;
        let access = sys::CUmemAccessDesc {
            location: sys::CUmemLocation {
                type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                id: ctx.ordinal() as std::ffi::c_int,
            },
            flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
        };
        // SAFETY: the whole range is mapped; one descriptor, read during the call only.
        unsafe { sys::cuMemSetAccess(range.address, size, &access, 1) }
            .result()
            .map_err(failed("cuMemSetAccess"))?;
        Ok(range)
    }
}

impl Drop for MappedRange {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        // A failure cannot be reported from drop; each step is tried.
        // SAFETY: what `map` did — imported the handle, reserved the range (address ≠ 0), mapped
        // it — is undone once, here, in the reverse order.
        unsafe {
            if self.mapped {
                let _ = sys::cuMemUnmap(self.address, self.size);
            }
            if self.address != 0 {
                let _ = sys::cuMemAddressFree(self.address, self.size);
            }
            let _ = sys::cuMemRelease(self.handle);
        }
    }
}
