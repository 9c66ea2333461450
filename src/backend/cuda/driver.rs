//! The thin raw layer: every call into the CUDA driver that cudarc's safe API does not cover.
//!
//! Like cudarc's own `sys → result → safe` layering, this file is the only place that calls
//! `cudarc::driver::sys` directly. Each function binds the right context first and turns a `CUresult`
//! into a `Result`; each owning type frees its resource on drop.

use std::ffi::{c_void, CStr};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{result, CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError};

use crate::backend::{host_memory, Advice, Location};
use crate::Error;

/// Turns a driver error into the library's error, naming the call that failed.
pub(super) fn cuda_error(call: &str, error: DriverError) -> Error {
    let name = error
        .error_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|_| format!("{:?}", error.0));
    let text = error
        .error_string()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    Error::Cuda {
        call: call.to_string(),
        message: format!("{name}: {text}"),
    }
}

/// Adapter for `map_err`: `.map_err(failed("cuMemAlloc"))`.
pub(super) fn failed(call: &'static str) -> impl Fn(DriverError) -> Error {
    move |error| cuda_error(call, error)
}

/// Whether libcuda can be loaded. cudarc panics at the first call into a missing library, so this
/// must be asked before any other driver call.
pub(super) fn driver_library_present() -> bool {
    // SAFETY: only tries to dlopen the library by its usual names; calls nothing in it.
    unsafe { sys::is_culib_present() }
}

/// Whether libnvrtc can be loaded (checked before compiling kernels, for the same reason).
pub(super) fn nvrtc_library_present() -> bool {
    // SAFETY: as above, only a dlopen attempt.
    unsafe { cudarc::nvrtc::sys::is_culib_present() }
}

/// Makes `ctx` current on this thread, for the raw calls below that act on the current context.
pub(super) fn bind(ctx: &CudaContext) -> Result<(), Error> {
    ctx.bind_to_thread().map_err(failed("cuCtxSetCurrent"))
}

/// Where another library's device memory lies: the ordinal of its GPU, and the first address and
/// size of the allocation that holds `address`, in one driver call (cuPointerGetAttributes: this
/// runs at every borrow, so at every `Fabric.copy_` of the Python package). No allocation holds
/// an address the driver answers a size of 0 for.
pub(super) fn allocation_of(ctx: &CudaContext, address: u64) -> Result<Allocation, Error> {
    use sys::CUpointer_attribute as Attribute;
    bind(ctx)?;
    let (mut ordinal, mut start, mut size): (i32, sys::CUdeviceptr, usize) = (-1, 0, 0);
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    let mut attributes = [
        Attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        Attribute::CU_POINTER_ATTRIBUTE_RANGE_START_ADDR,
        Attribute::CU_POINTER_ATTRIBUTE_RANGE_SIZE,
        Attribute::CU_POINTER_ATTRIBUTE_MEMPOOL_HANDLE,
    ];
    let mut data: [*mut c_void; 4] = [
        (&mut ordinal as *mut i32).cast(),
        (&mut start as *mut sys::CUdeviceptr).cast(),
        (&mut size as *mut usize).cast(),
        (&mut pool as *mut sys::CUmemoryPool).cast(),
    ];
    // SAFETY: `data[i]` points at a live local of attribute `i`'s type (an int, a CUdeviceptr, a
    // size_t, a CUmemoryPool), and both arrays hold as many entries as the count says; the driver
    // looks the address up in its tables and never dereferences it.
    unsafe {
        sys::cuPointerGetAttributes(
            attributes.len() as std::ffi::c_uint,
            attributes.as_mut_ptr(),
            data.as_mut_ptr(),
            address,
        )
    }
    .result()
    .map_err(failed("cuPointerGetAttributes"))?;
    if size == 0 {
        return Err(Error::usage(format!(
            "no GPU allocation holds the address {address:#x}; borrow memory another library \
             allocated on a GPU (a CUDA tensor's data_ptr())"
        )));
    }
    Ok(Allocation {
        ordinal,
        start,
        size,
        pool: (!pool.is_null()).then_some(MemoryPool(pool)),
    })
}

/// What the driver knows of the allocation that holds an address.
pub(super) struct Allocation {
    pub ordinal: i32,
    pub start: u64,
    pub size: usize,
    /// The stream-ordered pool it came from (cuMemAllocAsync, e.g. cudarc's allocations), if any.
    pub pool: Option<MemoryPool>,
}

/// A stream-ordered memory pool of another library, by its driver handle.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub(super) struct MemoryPool(sys::CUmemoryPool);

// SAFETY: a pool handle is an opaque driver identifier, valid from any thread.
unsafe impl Send for MemoryPool {}

impl MemoryPool {
    /// Grants GPUs `peers` read-write access to every allocation of the pool
    /// (cuMemPoolSetAccess). A pool's memory does not follow cuCtxEnablePeerAccess: without this a
    /// copy or kernel of another GPU is refused (CUDA_ERROR_INVALID_VALUE) or faults.
    pub(super) fn grant(self, peers: &[usize]) -> Result<(), Error> {
        let access: Vec<sys::CUmemAccessDesc> = peers
            .iter()
            .map(|&peer| sys::CUmemAccessDesc {
                location: sys::CUmemLocation {
                    type_: sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE,
                    id: peer as std::ffi::c_int,
                },
                flags: sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
            })
            .collect();
        if access.is_empty() {
            return Ok(());
        }
        // SAFETY: the pool handle came from the driver for a live allocation; `access` holds
        // `access.len()` descriptors, read during the call only.
        unsafe { sys::cuMemPoolSetAccess(self.0, access.as_ptr(), access.len()) }
            .result()
            .map_err(failed("cuMemPoolSetAccess"))
    }
}

/// Wraps another library's stream of `ctx`'s GPU (0: the default stream) once the driver says the
/// stream belongs to `ctx` (cuStreamGetCtx). Dropping the wrapper leaves the stream to its owner.
pub(super) fn borrow_stream(
    ctx: &Arc<CudaContext>,
    device: usize,
    handle: u64,
) -> Result<Arc<CudaStream>, Error> {
    bind(ctx)?;
    let stream = handle as usize as sys::CUstream;
    if handle != 0 {
        let mut owner: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: the out-pointer is valid; the driver checks the handle against its own tables.
        unsafe { sys::cuStreamGetCtx(stream, &mut owner) }
            .result()
            .map_err(failed("cuStreamGetCtx"))?;
        if owner != ctx.cu_ctx() {
            return Err(Error::usage(format!(
                "CUDA stream {handle:#x} does not belong to GPU {device}'s primary context; pass \
                 a stream of the GPU the work runs on (torch.cuda.current_stream({device}))"
            )));
        }
    }
    // SAFETY: the driver knows the stream and says it belongs to `ctx` (or it is 0, the default
    // stream of the context cudarc binds before each call); `Backend::borrow_stream`'s caller keeps
    // it alive while peerlink holds it, and peerlink orders its own work on it with events.
    Ok(unsafe { ctx.wrap_borrowed_stream(stream) })
}

/// Loads a kernel onto its device now. Under lazy loading (the default since CUDA 12.2) its first
/// launch would do it instead, putting milliseconds of host work into the first timed window.
pub(super) fn load_now(ctx: &CudaContext, function: &CudaFunction) -> Result<(), Error> {
    bind(ctx)?;
    // SAFETY: the handle comes from a module loaded in `ctx`, which the CudaFunction keeps alive.
    unsafe { sys::cuFuncLoad(function.cu_function()) }
        .result()
        .map_err(failed("cuFuncLoad"))
}

/// A GPU as the driver numbers it (a `CUdevice`): what can be asked of it without a context, so
/// that opening the backend makes none. A process of a job run one process per GPU then holds a
/// context, with its memory and its line in `nvidia-smi`, only on the GPUs it works on.
#[derive(Clone, Copy)]
pub(super) struct Gpu(sys::CUdevice);

impl Gpu {
    pub(super) fn get(ordinal: usize) -> Result<Self, Error> {
        result::device::get(ordinal as i32)
            .map(Gpu)
            .map_err(failed("cuDeviceGet"))
    }

    pub(super) fn name(self) -> Result<String, Error> {
        result::device::get_name(self.0).map_err(failed("cuDeviceGetName"))
    }

    pub(super) fn uuid(self) -> Result<sys::CUuuid, Error> {
        result::device::get_uuid(self.0).map_err(failed("cuDeviceGetUuid"))
    }

    pub(super) fn attribute(self, attribute: sys::CUdevice_attribute) -> Result<i32, Error> {
        // SAFETY: a device handle from cuDeviceGet; the attribute is an enum value of the driver's.
        unsafe { result::device::get_attribute(self.0, attribute) }
            .map_err(failed("cuDeviceGetAttribute"))
    }

    pub(super) fn total_memory(self) -> Result<usize, Error> {
        // SAFETY: a device handle from cuDeviceGet.
        unsafe { result::device::total_mem(self.0) }.map_err(failed("cuDeviceTotalMem"))
    }

    /// cuDeviceGetPCIBusId, in the driver's own form (`0000:18:00.0`).
    pub(super) fn pci_bus_id(self) -> Result<String, Error> {
        let mut text = [0 as std::ffi::c_char; 64];
        // SAFETY: the buffer is 64 bytes and we pass its length; the driver writes a
        // NUL-terminated id.
        unsafe { sys::cuDeviceGetPCIBusId(text.as_mut_ptr(), text.len() as i32, self.0) }
            .result()
            .map_err(failed("cuDeviceGetPCIBusId"))?;
        // SAFETY: the driver NUL-terminated the string inside the buffer.
        let id = unsafe { CStr::from_ptr(text.as_ptr()) };
        Ok(id.to_string_lossy().into_owned())
    }

    /// cuDeviceCanAccessPeer.
    pub(super) fn can_access_peer(self, peer: Gpu) -> Result<bool, Error> {
        let mut can = 0;
        // SAFETY: `can` is a valid out-pointer; both handles come from cuDeviceGet.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, self.0, peer.0) }
            .result()
            .map_err(failed("cuDeviceCanAccessPeer"))?;
        Ok(can != 0)
    }

    /// cuDeviceGetP2PAttribute for the ordered pair `self → dst`.
    pub(super) fn p2p_attribute(
        self,
        dst: Gpu,
        attribute: sys::CUdevice_P2PAttribute,
    ) -> Result<i32, Error> {
        let mut value = 0;
        // SAFETY: `value` is a valid out-pointer; both handles come from cuDeviceGet.
        unsafe { sys::cuDeviceGetP2PAttribute(&mut value, attribute, self.0, dst.0) }
            .result()
            .map_err(failed("cuDeviceGetP2PAttribute"))?;
        Ok(value)
    }

    /// Whether this process holds the GPU's primary context active, whoever retained it
    /// (cuDevicePrimaryCtxGetState: peerlink, PyTorch, NCCL alike).
    pub(super) fn primary_context_active(self) -> Result<bool, Error> {
        let (mut flags, mut active) = (0, 0);
        // SAFETY: both are valid out-pointers; the handle comes from cuDeviceGet.
        unsafe { sys::cuDevicePrimaryCtxGetState(self.0, &mut flags, &mut active) }
            .result()
            .map_err(failed("cuDevicePrimaryCtxGetState"))?;
        Ok(active != 0)
    }
}

/// The context current on this thread when it was kept (none, or another library's), made current
/// again on drop where the backend's work has changed it since. A raw context handle: neither
/// `Send` nor `Sync`, so the guard stays on the thread whose context it keeps.
pub struct KeptContext(sys::CUcontext);

impl KeptContext {
    pub(super) fn now() -> Result<Self, Error> {
        let current = result::ctx::get_current().map_err(failed("cuCtxGetCurrent"))?;
        Ok(KeptContext(current.unwrap_or(std::ptr::null_mut())))
    }
}

impl Drop for KeptContext {
    fn drop(&mut self) {
        // Nothing can report a failure from drop: the thread then stays on the backend's context.
        let now = result::ctx::get_current().map(|c| c.unwrap_or(std::ptr::null_mut()));
        if now.is_ok_and(|now| now != self.0) {
            // SAFETY: the context that was current on this thread when kept (or none: a null
            // handle unbinds), whose owner still holds it while its work runs in this thread.
            let _ = unsafe { sys::cuCtxSetCurrent(self.0) };
        }
    }
}

/// Retains GPU `ordinal`'s primary context (cudarc's `CudaContext::new`, which makes it current,
/// as the work that needs it would) with cudarc's event tracking off. Callers that share the
/// thread with other CUDA code keep their context around the backend's work
/// ([`KeptContext`]).
pub(super) fn retain_primary_context(ordinal: usize) -> Result<Arc<CudaContext>, Error> {
    let ctx = CudaContext::new(ordinal).map_err(failed("cuDevicePrimaryCtxRetain"))?;
    // SAFETY: this context object is new and has made nothing; the backend never uses cudarc's
    // tracked slices: it orders its own work with streams and events.
    unsafe { ctx.disable_event_tracking() };
    Ok(ctx)
}

/// cuCtxEnablePeerAccess from `device`'s context to `peer`'s memory. An already enabled pair is
/// success; any other failure comes back as the driver's code for the caller to explain.
pub(super) fn enable_peer_access(device: &CudaContext, peer: &CudaContext) -> Result<(), CUresult> {
    device.bind_to_thread().map_err(|DriverError(code)| code)?;
    // SAFETY: the current context is `device`'s; `peer.cu_ctx()` is a live context; flags must be 0.
    match unsafe { sys::cuCtxEnablePeerAccess(peer.cu_ctx(), 0) } {
        CUresult::CUDA_SUCCESS | CUresult::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(()),
        code => Err(code),
    }
}

/// A driver error of an allocation of `bytes` on `ctx`'s GPU (`what` says what memory, after the
/// GPU), an out-of-memory as one sentence with what is free.
fn allocation_error<'a>(
    call: &'static str,
    ctx: &'a CudaContext,
    bytes: usize,
    what: &'a str,
) -> impl Fn(DriverError) -> Error + 'a {
    move |error| match error {
        DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY) => Error::OutOfMemory {
            place: format!("GPU {}{what}", ctx.ordinal()),
            asked: bytes as u64,
            free: ctx.mem_get_info().map_or(0, |(free, _)| free as u64),
        },
        error => cuda_error(call, error),
    }
}

/// Device memory from cuMemAlloc_v2 — not the stream-ordered pool, whose memory does not follow
/// cuCtxEnablePeerAccess — or another process's such memory opened through CUDA IPC. Freed (or
/// closed) on drop.
pub(super) struct DeviceMemory {
    address: sys::CUdeviceptr,
    ctx: Arc<CudaContext>,
    opened: bool,
}

/// The size of a CUDA IPC memory handle, in bytes.
pub(super) const IPC_HANDLE_BYTES: usize = std::mem::size_of::<sys::CUipcMemHandle>();

impl DeviceMemory {
    pub(super) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, Error> {
        bind(ctx)?;
        let mut address = 0;
        // SAFETY: `address` is a valid out-pointer and `ctx` is current; `bytes` > 0 (the checked
        // layer refuses 0).
        unsafe { sys::cuMemAlloc_v2(&mut address, bytes) }
            .result()
            .map_err(allocation_error("cuMemAlloc", ctx, bytes, ""))?;
        Ok(DeviceMemory {
            address,
            ctx: ctx.clone(),
            opened: false,
        })
    }

    /// Opens another process's device memory from its IPC handle (cuIpcOpenMemHandle) for work
    /// in `ctx`. Where the memory is another GPU's, peer access from `ctx` to it is enabled as it
    /// opens (CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS), as cuCtxEnablePeerAccess would.
    pub(super) fn open_ipc(ctx: &Arc<CudaContext>, handle: &[u8]) -> Result<Self, Error> {
        let mut ipc = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        if handle.len() != IPC_HANDLE_BYTES {
            return Err(Error::usage(format!(
                "cannot import the shared buffer: a CUDA IPC handle is {IPC_HANDLE_BYTES} bytes, \
                 this one {}; send the descriptor of one export unchanged",
                handle.len()
            )));
        }
        for (to, from) in ipc.reserved.iter_mut().zip(handle) {
            *to = *from as std::ffi::c_char;
        }
        bind(ctx)?;
        let mut address = 0;
        let lazy = sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32;
        // SAFETY: `address` is a valid out-pointer, `ctx` is current, the handle is passed by value.
        let opened = unsafe { sys::cuIpcOpenMemHandle_v2(&mut address, ipc, lazy) }.result();
        match opened {
            Ok(()) => Ok(DeviceMemory {
                address,
                ctx: ctx.clone(),
                opened: true,
            }),
            Err(DriverError(
                code @ (CUresult::CUDA_ERROR_INVALID_VALUE
                | CUresult::CUDA_ERROR_INVALID_HANDLE
                | CUresult::CUDA_ERROR_INVALID_CONTEXT
                | CUresult::CUDA_ERROR_MAP_FAILED),
            )) => Err(Error::usage(format!(
                "the driver refused the CUDA IPC handle ({code:?}) as it opened for GPU {}: it is \
                 not a live export of another process's memory (a handle opens only in another \
                 process, and only while the exporter keeps its buffer)",
                ctx.ordinal()
            ))),
            Err(error) => Err(cuda_error("cuIpcOpenMemHandle", error)),
        }
    }

    /// The IPC handle another process opens this memory with (cuIpcGetMemHandle).
    pub(super) fn ipc_handle(&self) -> Result<Vec<u8>, Error> {
        DeviceMemory::ipc_handle_at(&self.ctx, self.address)
    }

    /// The IPC handle of the cuMemAlloc allocation of `ctx` that starts at `start` (this
    /// process's, or another library's in it).
    pub(super) fn ipc_handle_at(
        ctx: &CudaContext,
        start: sys::CUdeviceptr,
    ) -> Result<Vec<u8>, Error> {
        let mut ipc = sys::CUipcMemHandle {
            reserved: [0; IPC_HANDLE_BYTES],
        };
        bind(ctx)?;
        // SAFETY: `ipc` is a valid out-pointer; the driver checks that the address is a live
        // allocation's start in the current context (else it fails).
        unsafe { sys::cuIpcGetMemHandle(&mut ipc, start) }
            .result()
            .map_err(failed("cuIpcGetMemHandle"))?;
        Ok(ipc.reserved.iter().map(|&b| b as u8).collect())
    }

    /// The unified (UVA) address, valid in every context.
    pub(super) fn address(&self) -> u64 {
        self.address
    }

    /// The ordinal of the GPU the memory is on.
    pub(super) fn device(&self) -> usize {
        self.ctx.ordinal()
    }
}

impl Drop for DeviceMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // A failure cannot be reported from drop; the memory goes with the context at the latest.
            let _ = if self.opened {
                // SAFETY: the address came from cuIpcOpenMemHandle in this context and is closed
                // once, here; the exporter's memory stays its own.
                unsafe { sys::cuIpcCloseMemHandle(self.address) }
            } else {
                // SAFETY: the address came from cuMemAlloc_v2 in this context and is freed once,
                // here.
                unsafe { sys::cuMemFree_v2(self.address) }
            };
        }
    }
}

/// Page-locked host memory, usable from every context and mapped into the unified address space, so
/// kernels and copies on any GPU reach it at the same address. Not write-combined, so the host reads
/// it back at full speed. Freed on drop.
pub(super) struct PinnedMemory {
    pointer: *mut u8,
    bytes: usize,
    ctx: Arc<CudaContext>,
    origin: PinnedOrigin,
}

/// How pinned memory was obtained, and so how it is released.
enum PinnedOrigin {
    /// cuMemHostAlloc(PORTABLE | DEVICEMAP): pages wherever the kernel put them.
    HostAlloc,
    /// An anonymous mapping whose pages were placed on a NUMA node (mbind, then first touch), then
    /// page-locked with cuMemHostRegister(PORTABLE | DEVICEMAP).
    Registered { mapped_bytes: usize },
    /// A shared mapping of a file other processes map too, page-locked likewise; the file is
    /// kept to export.
    SharedFile { mapped_bytes: usize, file: File },
}

// SAFETY: the allocation is plain memory owned by this value; all access goes through the methods
// below (raw copies and volatile accesses), which do not rely on thread affinity.
unsafe impl Send for PinnedMemory {}
// SAFETY: as above; concurrent host access is the callers' business, as for device memory.
unsafe impl Sync for PinnedMemory {}

/// Pinned memory the host cannot give: refused before pinning (pinning more than is free would
/// have the kernel kill a process), and what the driver says when it runs out anyway.
fn host_out_of_memory(bytes: usize) -> Error {
    Error::OutOfMemory {
        place: "the host (pinned memory)".into(),
        asked: bytes as u64,
        free: host_memory::free().unwrap_or(0),
    }
}

/// Refuses `bytes` of pinned memory where the host has not that much free.
fn check_host_free(bytes: usize) -> Result<(), Error> {
    match host_memory::free() {
        Some(free) if bytes as u64 > free => Err(host_out_of_memory(bytes)),
        _ => Ok(()),
    }
}

/// A driver error of a pinning call, an out-of-memory as one sentence.
fn pinning_error(call: &'static str, bytes: usize) -> impl Fn(DriverError) -> Error {
    move |error| match error {
        DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY) => host_out_of_memory(bytes),
        error => cuda_error(call, error),
    }
}

impl PinnedMemory {
    pub(super) fn new(ctx: &Arc<CudaContext>, bytes: usize) -> Result<Self, Error> {
        check_host_free(bytes)?;
        bind(ctx)?;
        let mut pointer: *mut c_void = std::ptr::null_mut();
        let flags = sys::CU_MEMHOSTALLOC_PORTABLE | sys::CU_MEMHOSTALLOC_DEVICEMAP;
        // SAFETY: `pointer` is a valid out-pointer, a context is current, `bytes` > 0.
        unsafe { sys::cuMemHostAlloc(&mut pointer, bytes, flags) }
            .result()
            .map_err(pinning_error("cuMemHostAlloc", bytes))?;
        Ok(PinnedMemory {
            pointer: pointer.cast(),
            bytes,
            ctx: ctx.clone(),
            origin: PinnedOrigin::HostAlloc,
        })
    }

    /// Pinned memory whose pages the kernel was asked to place on NUMA node `node` (a preference:
    /// it falls back to other nodes rather than fail). Returns `Ok(None)` where the kernel refuses
    /// the placement (no NUMA support, a sandbox): the caller then allocates without it.
    pub(super) fn on_numa_node(
        ctx: &Arc<CudaContext>,
        bytes: usize,
        node: u32,
    ) -> Result<Option<Self>, Error> {
        const MPOL_PREFERRED: libc::c_long = 1;
        let node_bits = 8 * std::mem::size_of::<libc::c_ulong>();
        if node as usize >= node_bits {
            return Ok(None);
        }
        check_host_free(bytes)?;
        // SAFETY: an anonymous private mapping of `bytes` > 0; the result is checked below.
        let pointer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if pointer == libc::MAP_FAILED {
            return Err(Error::Cuda {
                call: "mmap of pinned host memory".into(),
                message: std::io::Error::last_os_error().to_string(),
            });
        }
        let unmap = |pointer| {
            // SAFETY: `pointer` is the mapping made above, of `bytes`, unmapped once.
            unsafe { libc::munmap(pointer, bytes) };
        };
        let mask: libc::c_ulong = 1 << node;
        // SAFETY: mbind on the mapping just made, with a one-word node mask that outlives the call.
        let placed = unsafe {
            libc::syscall(
                libc::SYS_mbind,
                pointer,
                bytes,
                MPOL_PREFERRED,
                &mask as *const libc::c_ulong,
                node_bits as libc::c_ulong,
                0 as libc::c_uint,
            )
        };
        if placed != 0 {
            unmap(pointer);
            return Ok(None);
        }
        // First touch faults every page in, on the preferred node.
        // SAFETY: the mapping is `bytes` long and writable.
        unsafe { std::ptr::write_bytes(pointer.cast::<u8>(), 0, bytes) };
        bind(ctx)?;
        let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
        // SAFETY: the range is a live mapping of `bytes`, registered once and unregistered on drop.
        let registered = unsafe { sys::cuMemHostRegister_v2(pointer, bytes, flags) }.result();
        if let Err(e) = registered {
            unmap(pointer);
            return Err(pinning_error("cuMemHostRegister", bytes)(e));
        }
        Ok(Some(PinnedMemory {
            pointer: pointer.cast(),
            bytes,
            ctx: ctx.clone(),
            origin: PinnedOrigin::Registered {
                mapped_bytes: bytes,
            },
        }))
    }

    /// Pinned memory over the first `bytes` of a shared file (as long at least), mapped shared so
    /// that every process mapping the file sees the same bytes, then page-locked and mapped for
    /// every GPU.
    pub(super) fn from_shared_file(
        ctx: &Arc<CudaContext>,
        file: File,
        bytes: usize,
    ) -> Result<Self, Error> {
        // SAFETY: a shared mapping of `bytes` > 0 of an open file at least that long (the callers
        // made it so, or checked it); the result is checked below.
        let pointer = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                bytes,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if pointer == libc::MAP_FAILED {
            return Err(Error::Cuda {
                call: "mmap of shared host memory".into(),
                message: std::io::Error::last_os_error().to_string(),
            });
        }
        let registered = bind(ctx).and_then(|()| {
            let flags = sys::CU_MEMHOSTREGISTER_PORTABLE | sys::CU_MEMHOSTREGISTER_DEVICEMAP;
            // SAFETY: the range is a live mapping of `bytes`, registered once and unregistered on
            // drop.
            unsafe { sys::cuMemHostRegister_v2(pointer, bytes, flags) }
                .result()
                .map_err(pinning_error("cuMemHostRegister", bytes))
        });
        if let Err(e) = registered {
            // SAFETY: `pointer` is the mapping made above, of `bytes`, unmapped once.
            unsafe { libc::munmap(pointer, bytes) };
            return Err(e);
        }
        Ok(PinnedMemory {
            pointer: pointer.cast(),
            bytes,
            ctx: ctx.clone(),
            origin: PinnedOrigin::SharedFile {
                mapped_bytes: bytes,
                file,
            },
        })
    }

    /// The shared file behind the memory, where it was made from one.
    pub(super) fn shared_file(&self) -> Option<&File> {
        match &self.origin {
            PinnedOrigin::SharedFile { file, .. } => Some(file),
            PinnedOrigin::HostAlloc | PinnedOrigin::Registered { .. } => None,
        }
    }

    /// The unified address: with UVA, mapped pinned memory has the same address on host and GPUs.
    pub(super) fn address(&self) -> u64 {
        self.pointer as u64
    }

    /// The ordinal of the GPU whose context allocated the memory.
    pub(super) fn device(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The start of the allocation and its size in bytes, for views over it; writing through the
    /// pointer needs exclusive access to this value, which `&mut self` shows.
    pub(super) fn as_mut_ptr(&mut self) -> (*mut u8, usize) {
        (self.pointer, self.bytes)
    }

    /// Copies `data` in at `offset`. The range must lie inside the allocation (callers check it).
    pub(super) fn write_at(&self, offset: usize, data: &[u8]) {
        assert!(
            offset + data.len() <= self.bytes,
            "pinned write out of range"
        );
        // SAFETY: the range is inside the allocation (asserted); `data` cannot overlap pinned memory
        // we own exclusively.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.pointer.add(offset), data.len())
        }
    }

    /// Copies out from `offset`. The range must lie inside the allocation (callers check it).
    pub(super) fn read_at(&self, offset: usize, out: &mut [u8]) {
        assert!(offset + out.len() <= self.bytes, "pinned read out of range");
        // SAFETY: the range is inside the allocation (asserted); `out` is a distinct host slice.
        unsafe {
            std::ptr::copy_nonoverlapping(self.pointer.add(offset), out.as_mut_ptr(), out.len())
        }
    }

    /// The `index`-th u64 as an atomic, for words the host and a running kernel share (a resident
    /// worker's ring and control words): atomic stores and loads are whole 8-byte accesses, and
    /// their orderings keep the compiler from moving other accesses across them.
    pub(super) fn word(&self, index: usize) -> &AtomicU64 {
        assert!((index + 1) * 8 <= self.bytes, "pinned word out of range");
        // SAFETY: in range (asserted) and 8-byte aligned (the allocation is page-aligned);
        // AtomicU64 has u64's layout; the memory lives as long as `self`, which the reference
        // borrows; the host touches these words only atomically (the GPU through the mapping).
        unsafe { &*self.pointer.cast::<AtomicU64>().add(index) }
    }

    /// A volatile store of the `index`-th u64, so that a GPU spinning on it sees the new value.
    pub(super) fn store_u64(&self, index: usize, value: u64) {
        assert!(
            (index + 1) * 8 <= self.bytes,
            "pinned u64 store out of range"
        );
        // SAFETY: in range (asserted) and 8-byte aligned (the allocation is page-aligned).
        unsafe { std::ptr::write_volatile(self.pointer.cast::<u64>().add(index), value) }
    }

    /// A volatile load of the `index`-th u64, which a GPU may have written.
    pub(super) fn load_u64(&self, index: usize) -> u64 {
        assert!(
            (index + 1) * 8 <= self.bytes,
            "pinned u64 load out of range"
        );
        // SAFETY: in range (asserted) and 8-byte aligned (the allocation is page-aligned).
        unsafe { std::ptr::read_volatile(self.pointer.cast::<u64>().add(index)) }
    }
}

impl Drop for PinnedMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_err() {
            return;
        }
        match self.origin {
            PinnedOrigin::HostAlloc => {
                // SAFETY: the pointer came from cuMemHostAlloc and is freed once, here.
                let _ = unsafe { sys::cuMemFreeHost(self.pointer.cast()) };
            }
            PinnedOrigin::Registered { mapped_bytes }
            | PinnedOrigin::SharedFile { mapped_bytes, .. } => {
                // SAFETY: the range was registered and mapped in `on_numa_node` or
                // `from_shared_file`; both are undone once, here, unregistering first.
                unsafe {
                    let _ = sys::cuMemHostUnregister(self.pointer.cast());
                    libc::munmap(self.pointer.cast(), mapped_bytes);
                }
            }
        }
    }
}

/// The driver version cuMemcpyBatchAsync_v2 first shipped in (CUDA 13.0).
const MEMCPY_BATCH_DRIVER: i32 = 13_000;

/// `CUmemcpyAttributes` as CUDA 13.0's cuda.h lays it out (cudarc's binding is an opaque blob):
/// source access order, source and destination location hints (`CUmemLocation`: type, id), flags.
#[repr(C)]
struct MemcpyAttributes {
    src_access_order: u32,
    src_location: [i32; 2],
    dst_location: [i32; 2],
    flags: u32,
}

/// The CUDA version the driver supports, as the driver encodes it: 1000 × major + 10 × minor.
pub(super) fn driver_version() -> Result<i32, Error> {
    let mut version = 0;
    // SAFETY: `version` is a valid out-pointer; the call needs no context.
    unsafe { sys::cuDriverGetVersion(&mut version) }
        .result()
        .map_err(failed("cuDriverGetVersion"))?;
    Ok(version)
}

/// A driver-encoded CUDA version as people write it: 13000 → `13.0`.
pub(super) fn version_text(version: i32) -> String {
    format!("{}.{}", version / 1000, version % 1000 / 10)
}

/// Queues copy-engine copies between unified addresses (`(dst, src, len)`, none empty) on `stream`
/// in one cuMemcpyBatchAsync_v2 call, each reading its source in stream order. Refused, with a
/// sentence, on drivers older than CUDA 13.0 (the call would not exist).
pub(super) fn memcpy_batch_async(
    stream: &CudaStream,
    copies: &[(u64, u64, usize)],
) -> Result<(), Error> {
    let version = driver_version()?;
    if version < MEMCPY_BATCH_DRIVER {
        return Err(Error::Cuda {
            call: "cuMemcpyBatchAsync_v2".into(),
            message: format!(
                "the driver supports CUDA {}; batched copy-engine copies need CUDA 13.0 or newer: \
                 use the kernel or separate-copies batch strategy",
                version_text(version)
            ),
        });
    }
    if copies.is_empty() {
        return Ok(());
    }
    bind(stream.context())?;
    let mut dsts: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.0).collect();
    let mut srcs: Vec<sys::CUdeviceptr> = copies.iter().map(|c| c.1).collect();
    let mut sizes: Vec<usize> = copies.iter().map(|c| c.2).collect();
    // Location hints only matter for managed memory (none here); they name the stream's GPU.
    let device = stream.context().ordinal() as i32;
    let here = [
        sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE as i32,
        device,
    ];
    let ours = MemcpyAttributes {
        src_access_order: sys::CUmemcpySrcAccessOrder::CU_MEMCPY_SRC_ACCESS_ORDER_STREAM as u32,
        src_location: here,
        dst_location: here,
        flags: 0,
    };
    // The driver reads one attribute struct of the size it knows; a zeroed binding-sized buffer
    // (at least as large as ours) with ours at its start serves whichever that is.
    // SAFETY: the binding's type is plain bytes, so all-zero is a valid value.
    let mut attributes: sys::CUmemcpyAttributes = unsafe { std::mem::zeroed() };
    const _: () = assert!(
        std::mem::size_of::<MemcpyAttributes>() <= std::mem::size_of::<sys::CUmemcpyAttributes>()
    );
    // SAFETY: `ours` fits inside `attributes` (asserted above); both are plain data, distinct.
    unsafe {
        std::ptr::copy_nonoverlapping(
            (&ours as *const MemcpyAttributes).cast::<u8>(),
            (&mut attributes as *mut sys::CUmemcpyAttributes).cast::<u8>(),
            std::mem::size_of::<MemcpyAttributes>(),
        )
    };
    let mut attribute_of_copy = [0usize];
    // SAFETY: the three arrays hold `copies.len()` entries each; one attribute applies to every
    // copy (index 0); the checked layer checked every range lies inside a live allocation reachable from
    // this stream's GPU; the driver copies the arrays before returning.
    unsafe {
        sys::cuMemcpyBatchAsync_v2(
            dsts.as_mut_ptr(),
            srcs.as_mut_ptr(),
            sizes.as_mut_ptr(),
            copies.len(),
            &mut attributes,
            attribute_of_copy.as_mut_ptr(),
            1,
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(failed("cuMemcpyBatchAsync_v2"))
}

/// Queues a copy-engine copy between two unified addresses on `stream` (cuMemcpyAsync: it works for
/// device, peer and pinned host memory alike, and can be captured into a graph, unlike
/// cuMemcpyPeerAsync).
pub(super) fn copy_async(stream: &CudaStream, dst: u64, src: u64, len: usize) -> Result<(), Error> {
    bind(stream.context())?;
    // SAFETY: the checked layer checked both ranges lie inside live allocations; the stream is live.
    unsafe { sys::cuMemcpyAsync(dst, src, len, stream.cu_stream()) }
        .result()
        .map_err(failed("cuMemcpyAsync"))
}

/// Queues a store of `value` at `address` (8 bytes, device-accessible: device or mapped pinned
/// memory) on `stream`, after the stream's earlier work, with a system-wide fence before it
/// (cuStreamWriteValue64): a kernel that sees the value sees what that work wrote.
pub(super) fn write_value(stream: &CudaStream, address: u64, value: u64) -> Result<(), Error> {
    bind(stream.context())?;
    let flags = sys::CUstreamWriteValue_flags::CU_STREAM_WRITE_VALUE_DEFAULT as u32;
    // SAFETY: the caller passes an 8-byte aligned word of live mapped or device memory; the
    // stream is live.
    unsafe { sys::cuStreamWriteValue64_v2(stream.cu_stream(), address, value, flags) }
        .result()
        .map_err(failed("cuStreamWriteValue64"))
}

/// Holds `stream`'s later work until the u64 at `address` (device-accessible) is at least `value`
/// (cuStreamWaitValue64, GEQ).
pub(super) fn wait_value_at_least(
    stream: &CudaStream,
    address: u64,
    value: u64,
) -> Result<(), Error> {
    bind(stream.context())?;
    let flags = sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32;
    // SAFETY: as for `write_value`.
    unsafe { sys::cuStreamWaitValue64_v2(stream.cu_stream(), address, value, flags) }
        .result()
        .map_err(failed("cuStreamWaitValue64"))
}

/// Whether everything queued on `stream` has finished (cuStreamQuery); a kernel's fault comes
/// back as the error it left.
pub(super) fn stream_finished(stream: &CudaStream) -> Result<bool, Error> {
    bind(stream.context())?;
    // SAFETY: the stream is live.
    match unsafe { sys::cuStreamQuery(stream.cu_stream()) } {
        CUresult::CUDA_SUCCESS => Ok(true),
        CUresult::CUDA_ERROR_NOT_READY => Ok(false),
        code => Err(cuda_error("cuStreamQuery", DriverError(code))),
    }
}

/// Copies host bytes to device memory and waits for them to land. Issued on `stream` (an internal
/// non-blocking stream) rather than the legacy default stream, which would not order with the
/// backend's non-blocking streams.
pub(super) fn copy_to_device_and_wait(
    stream: &CudaStream,
    dst: u64,
    data: &[u8],
) -> Result<(), Error> {
    bind(stream.context())?;
    // SAFETY: the checked layer checked the destination range; `data` stays borrowed until the
    // synchronisation below has finished the copy.
    unsafe { sys::cuMemcpyHtoDAsync_v2(dst, data.as_ptr().cast(), data.len(), stream.cu_stream()) }
        .result()
        .map_err(failed("cuMemcpyHtoDAsync"))?;
    stream.synchronize().map_err(failed("cuStreamSynchronize"))
}

/// Copies device memory to host bytes and waits for them (see [`copy_to_device_and_wait`]).
pub(super) fn copy_to_host_and_wait(
    stream: &CudaStream,
    out: &mut [u8],
    src: u64,
) -> Result<(), Error> {
    bind(stream.context())?;
    // SAFETY: the checked layer checked the source range; `out` stays borrowed until the synchronisation
    // below has finished the copy.
    unsafe {
        sys::cuMemcpyDtoHAsync_v2(out.as_mut_ptr().cast(), src, out.len(), stream.cu_stream())
    }
    .result()
    .map_err(failed("cuMemcpyDtoHAsync"))?;
    stream.synchronize().map_err(failed("cuStreamSynchronize"))
}

/// GPU time between two completed events in milliseconds; `Ok(None)` if either is not complete yet.
pub(super) fn elapsed_ms(start: &CudaEvent, end: &CudaEvent) -> Result<Option<f32>, Error> {
    bind(start.context())?;
    // SAFETY: both events are live, created with timing enabled.
    match unsafe { result::event::elapsed(start.cu_event(), end.cu_event()) } {
        Ok(ms) => Ok(Some(ms)),
        Err(DriverError(CUresult::CUDA_ERROR_NOT_READY)) => Ok(None),
        Err(error) => Err(cuda_error("cuEventElapsedTime", error)),
    }
}

/// Starts capturing `stream` into a graph. Relaxed mode: other threads of the process may keep
/// calling the driver (loading a kernel module, querying events) while the capture is open.
pub(super) fn begin_capture(stream: &CudaStream) -> Result<(), Error> {
    stream
        .begin_capture(sys::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED)
        .map_err(failed("cuStreamBeginCapture"))
}

/// Whether `stream` is recording into a graph (work queued now runs only on replay).
pub(super) fn is_capturing(stream: &CudaStream) -> Result<bool, Error> {
    let status = stream
        .capture_status()
        .map_err(failed("cuStreamIsCapturing"))?;
    Ok(status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE)
}

/// A captured and instantiated graph; both are destroyed on drop.
pub(super) struct Graph {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    ctx: Arc<CudaContext>,
}

// SAFETY: graph handles are not bound to a thread; the backend keeps each `Graph` behind a Mutex,
// which serialises the calls on it as the driver's graph thread-safety rules require.
unsafe impl Send for Graph {}

impl Graph {
    /// Ends the capture on `stream` and instantiates what was recorded.
    pub(super) fn end_capture(stream: &CudaStream) -> Result<Self, Error> {
        let ctx = stream.context().clone();
        bind(&ctx)?;
        // SAFETY: the stream is live and capturing (the driver says so otherwise).
        let graph = unsafe { result::stream::end_capture(stream.cu_stream()) }
            .map_err(failed("cuStreamEndCapture"))?;
        let mut exec = std::ptr::null_mut();
        // SAFETY: `graph` is the live graph just captured; `exec` is a valid out-pointer.
        let instantiated =
            unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.result();
        if let Err(error) = instantiated {
            // SAFETY: the graph is ours and not used again.
            let _ = unsafe { sys::cuGraphDestroy(graph) };
            return Err(cuda_error("cuGraphInstantiate", error));
        }
        Ok(Graph { graph, exec, ctx })
    }

    /// Queues one replay on `stream`.
    pub(super) fn launch(&self, stream: &CudaStream) -> Result<(), Error> {
        bind(stream.context())?;
        // SAFETY: the executable graph is live; the stream is live.
        unsafe { sys::cuGraphLaunch(self.exec, stream.cu_stream()) }
            .result()
            .map_err(failed("cuGraphLaunch"))
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: both handles are ours, destroyed once, executable graph first.
            unsafe {
                let _ = sys::cuGraphExecDestroy(self.exec);
                let _ = sys::cuGraphDestroy(self.graph);
            }
        }
    }
}

/// Managed (unified) memory from cuMemAllocManaged, attached globally (the host and every GPU may
/// touch it), its pages put on the GPU of `ctx` when allocated. Freed on drop.
pub(super) struct ManagedMemory {
    address: sys::CUdeviceptr,
    bytes: usize,
    ctx: Arc<CudaContext>,
}

impl ManagedMemory {
    /// Allocates `bytes` (> 0) and moves every page onto `ctx`'s GPU, waiting on `stream` (a
    /// stream of that GPU) until they are there.
    pub(super) fn new(
        ctx: &Arc<CudaContext>,
        stream: &CudaStream,
        bytes: usize,
    ) -> Result<Self, Error> {
        bind(ctx)?;
        let mut address = 0;
        let global = sys::CUmemAttach_flags::CU_MEM_ATTACH_GLOBAL as u32;
        // SAFETY: `address` is a valid out-pointer and `ctx` is current; `bytes` > 0 (the checked
        // layer refuses 0, and anything past the GPU's free memory).
        unsafe { sys::cuMemAllocManaged(&mut address, bytes, global) }
            .result()
            .map_err(allocation_error(
                "cuMemAllocManaged",
                ctx,
                bytes,
                " (managed memory)",
            ))?;
        let memory = ManagedMemory {
            address,
            bytes,
            ctx: ctx.clone(),
        };
        memory.prefetch(stream, Location::Device(ctx.ordinal()))?;
        stream
            .synchronize()
            .map_err(failed("cuStreamSynchronize"))?;
        Ok(memory)
    }

    /// The unified address, valid on the host and in every context.
    pub(super) fn address(&self) -> u64 {
        self.address
    }

    /// The ordinal of the GPU the memory was allocated for.
    pub(super) fn device(&self) -> usize {
        self.ctx.ordinal()
    }

    /// cuMemAdvise on the whole allocation.
    pub(super) fn advise(&self, advice: Advice) -> Result<(), Error> {
        use sys::CUmem_advise::*;
        let (advice, device) = match advice {
            // The location is ignored for read-mostly advice; the allocation's own GPU is named.
            Advice::SetReadMostly => (CU_MEM_ADVISE_SET_READ_MOSTLY, self.device()),
            Advice::UnsetReadMostly => (CU_MEM_ADVISE_UNSET_READ_MOSTLY, self.device()),
            Advice::SetAccessedBy(d) => (CU_MEM_ADVISE_SET_ACCESSED_BY, d),
            Advice::UnsetAccessedBy(d) => (CU_MEM_ADVISE_UNSET_ACCESSED_BY, d),
        };
        bind(&self.ctx)?;
        let location = memory_location(Location::Device(device));
        // SAFETY: the range is this live allocation, whole; the location names a GPU the checked
        // layer found to exist.
        unsafe { sys::cuMemAdvise_v2(self.address, self.bytes, advice, location) }
            .result()
            .map_err(failed("cuMemAdvise"))
    }

    /// Queues on `stream` the move of the whole allocation to `to` (cuMemPrefetchAsync).
    pub(super) fn prefetch(&self, stream: &CudaStream, to: Location) -> Result<(), Error> {
        bind(stream.context())?;
        // SAFETY: the range is this live allocation, whole; the stream is live; flags must be 0.
        unsafe {
            sys::cuMemPrefetchAsync_v2(
                self.address,
                self.bytes,
                memory_location(to),
                0,
                stream.cu_stream(),
            )
        }
        .result()
        .map_err(failed("cuMemPrefetchAsync"))
    }
}

/// A place for pages as the driver names it (CUDA 12.2's `CUmemLocation`: a GPU by ordinal, or
/// host memory).
fn memory_location(location: Location) -> sys::CUmemLocation {
    use sys::CUmemLocationType::*;
    match location {
        Location::Device(d) => sys::CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_DEVICE,
            id: d as i32,
        },
        Location::Host => sys::CUmemLocation {
            type_: CU_MEM_LOCATION_TYPE_HOST,
            id: 0,
        },
    }
}

impl Drop for ManagedMemory {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the address came from cuMemAllocManaged and is freed once, here.
            let _ = unsafe { sys::cuMemFree_v2(self.address) };
        }
    }
}
