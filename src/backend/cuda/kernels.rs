//! peerlink's CUDA kernels: compiled by NVRTC at first use, once per GPU architecture, loaded once
//! per device, and launched from here.
//!
//! Compiling takes about 200 ms: it is a setup cost, paid before any timed work that needs a kernel.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cudarc::driver::{
    CudaContext, CudaEvent, CudaFunction, CudaStream, DriverError, LaunchConfig, PushKernelArg,
};
use cudarc::nvrtc::{CompileOptions, Ptx};

use super::abi::{
    self, entry, AllReduceArgs, ResidentArgs, ALL_REDUCE_THREADS, ALL_REDUCE_VARIANTS,
    RESIDENT_THREADS, SOURCE, SPIN_TIMEOUT_NS,
};
use super::driver::{self, failed};
use crate::backend::collective::{AllReduceKernel, DataType};
use crate::pattern::WordRule;
use crate::{Error, Result};

/// Threads per block of the copy kernel.
const COPY_THREADS: u32 = 512;
/// Resident blocks per SM the copy kernel aims for, to fill the GPU.
const COPY_BLOCKS_PER_SM: u32 = 4;

/// Blocks for a copy of `len` bytes: enough to fill the GPU for large copies, no more blocks than
/// there are 16-byte vectors to move for small ones.
pub(super) fn copy_blocks(len: usize, sm_count: u32) -> u32 {
    let per_block = COPY_THREADS as usize * 16;
    let wanted = len.div_ceil(per_block).max(1);
    wanted.min((sm_count.max(1) * COPY_BLOCKS_PER_SM) as usize) as u32
}

/// Threads per block of the batch kernel: one block moves a 4 KiB message in one 16-byte step each.
const BATCH_THREADS: u32 = 256;
/// The most blocks a batch launch uses; longer lists are strided over.
const BATCH_MAX_BLOCKS: usize = 65_535;

/// One thread, for the latency probes and the gate.
const ONE_THREAD: LaunchConfig = LaunchConfig {
    grid_dim: (1, 1, 1),
    block_dim: (1, 1, 1),
    shared_mem_bytes: 0,
};

/// The kernels loaded into one device's context.
pub(super) struct Kernels {
    copy: CudaFunction,
    batch: CudaFunction,
    fill_pattern: CudaFunction,
    find_mismatch: CudaFunction,
    spin: CudaFunction,
    chase: CudaFunction,
    ping: CudaFunction,
    pong: CudaFunction,
    /// One per entry of [`ALL_REDUCE_VARIANTS`], in its order.
    all_reduce: Vec<CudaFunction>,
    busy: CudaFunction,
    resident: CudaFunction,
    pub(super) sm_count: u32,
}

/// Compiled programs per architecture and loaded kernels per device, both made on first use.
pub(super) struct KernelCache {
    ptx: Mutex<HashMap<String, Ptx>>,
    loaded: Vec<Mutex<Option<Arc<Kernels>>>>,
}

impl KernelCache {
    pub(super) fn new(devices: usize) -> Self {
        KernelCache {
            ptx: Mutex::new(HashMap::new()),
            loaded: (0..devices).map(|_| Mutex::new(None)).collect(),
        }
    }

    /// The kernels of `device`, compiling and loading them the first time.
    pub(super) fn get(&self, device: usize, ctx: &Arc<CudaContext>) -> Result<Arc<Kernels>> {
        let mut slot = self.loaded[device]
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(kernels) = slot.as_ref() {
            return Ok(kernels.clone());
        }
        let (major, minor) = ctx
            .compute_capability()
            .map_err(failed("cuDeviceGetAttribute"))?;
        let ptx = self.compile(&format!("compute_{major}{minor}"))?;
        let module = ctx.load_module(ptx).map_err(failed("cuModuleLoadData"))?;
        let function = |name| {
            let function = module
                .load_function(name)
                .map_err(failed("cuModuleGetFunction"))?;
            driver::load_now(ctx, &function)?;
            Ok::<_, Error>(function)
        };
        let sm_count = ctx
            .attribute(
                cudarc::driver::sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT,
            )
            .map_err(failed("cuDeviceGetAttribute"))?;
        let kernels = Arc::new(Kernels {
            copy: function(entry::COPY)?,
            batch: function(entry::BATCH)?,
            fill_pattern: function(entry::FILL_PATTERN)?,
            find_mismatch: function(entry::FIND_MISMATCH)?,
            spin: function(entry::SPIN)?,
            chase: function(entry::CHASE)?,
            ping: function(entry::PING)?,
            pong: function(entry::PONG)?,
            all_reduce: ALL_REDUCE_VARIANTS
                .iter()
                .map(|&(kernel, dtype)| function(abi::entry_point(kernel, dtype)))
                .collect::<Result<_>>()?,
            busy: function(entry::BUSY)?,
            resident: function(entry::RESIDENT)?,
            sm_count: sm_count.max(1) as u32,
        });
        *slot = Some(kernels.clone());
        Ok(kernels)
    }

    /// PTX for one architecture (`compute_90`), compiled once.
    fn compile(&self, arch: &str) -> Result<Ptx> {
        let mut cache = self.ptx.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(ptx) = cache.get(arch) {
            return Ok(ptx.clone());
        }
        if !driver::nvrtc_library_present() {
            return Err(Error::Cuda {
                call: "NVRTC".into(),
                message:
                    "libnvrtc (CUDA 13) cannot be loaded, so peerlink cannot compile its copy \
                          and latency kernels: install the CUDA runtime's NVRTC or add its lib \
                          directory to LD_LIBRARY_PATH"
                        .into(),
            });
        }
        let options = CompileOptions {
            options: vec![format!("--gpu-architecture={arch}")],
            ..Default::default()
        };
        let ptx =
            cudarc::nvrtc::compile_ptx_with_opts(SOURCE, options).map_err(|e| Error::Cuda {
                call: "nvrtcCompileProgram".into(),
                message: format!("peerlink's kernels did not compile for {arch}: {e}"),
            })?;
        cache.insert(arch.to_string(), ptx.clone());
        Ok(ptx)
    }
}

/// The outcome of a launch (cudarc's optional timing events are never asked for here).
type Launch = std::result::Result<Option<(CudaEvent, CudaEvent)>, DriverError>;

fn launched(result: Launch) -> Result<()> {
    result.map(|_| ()).map_err(failed("cuLaunchKernel"))
}

impl Kernels {
    /// Queues an SM copy of `len` bytes between two unified addresses.
    pub(super) fn copy(&self, stream: &CudaStream, dst: u64, src: u64, len: usize) -> Result<()> {
        let config = LaunchConfig {
            grid_dim: (copy_blocks(len, self.sm_count), 1, 1),
            block_dim: (COPY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let len = len as u64;
        let mut launch = stream.launch_builder(&self.copy);
        launch.arg(&dst).arg(&src).arg(&len);
        // SAFETY: arguments match copy_bytes(uchar*, const uchar*, u64); the checked layer checked
        // that both ranges lie inside live allocations reachable from this stream's device.
        launched(unsafe { launch.launch(config) })
    }

    /// Queues one launch performing `count` copies whose descriptors lie at `descriptors` (device
    /// memory that must stay untouched until the kernel has run).
    pub(super) fn copy_batch(
        &self,
        stream: &CudaStream,
        descriptors: u64,
        count: u32,
    ) -> Result<()> {
        let config = LaunchConfig {
            grid_dim: ((count as usize).clamp(1, BATCH_MAX_BLOCKS) as u32, 1, 1),
            block_dim: (BATCH_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&self.batch);
        launch.arg(&descriptors).arg(&count);
        // SAFETY: arguments match copy_batch(const CopyDescriptor*, u32); the caller wrote `count`
        // descriptors there, each range checked to lie inside a live, reachable allocation.
        launched(unsafe { launch.launch(config) })
    }

    /// The grid of a pattern kernel over `len` bytes: as large as a copy's.
    fn pattern_grid(&self, len: usize) -> LaunchConfig {
        LaunchConfig {
            grid_dim: (copy_blocks(len, self.sm_count), 1, 1),
            block_dim: (COPY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        }
    }

    /// Queues a kernel writing bytes `0..len` of the message `rule` generates at `dst`.
    pub(super) fn fill_pattern(
        &self,
        stream: &CudaStream,
        dst: u64,
        len: usize,
        rule: WordRule,
    ) -> Result<()> {
        let len = len as u64;
        let mut launch = stream.launch_builder(&self.fill_pattern);
        launch
            .arg(&dst)
            .arg(&len)
            .arg(&rule.base)
            .arg(&rule.multiplier);
        // SAFETY: arguments match fill_pattern(uchar*, u64, u64, u64); the checked layer checked
        // that the `len` bytes at `dst` lie inside a live allocation of this stream's device.
        launched(unsafe { launch.launch(self.pattern_grid(len as usize)) })
    }

    /// Queues a kernel checking bytes `0..len` at `data` against the message `rule` generates; it
    /// lowers the u64 at `first` (device memory, set to `u64::MAX` before) to `(offset << 8) |
    /// byte found` of the first wrong byte.
    pub(super) fn find_mismatch(
        &self,
        stream: &CudaStream,
        data: u64,
        len: usize,
        rule: WordRule,
        first: u64,
    ) -> Result<()> {
        let len = len as u64;
        let mut launch = stream.launch_builder(&self.find_mismatch);
        launch
            .arg(&data)
            .arg(&len)
            .arg(&rule.base)
            .arg(&rule.multiplier)
            .arg(&first);
        // SAFETY: arguments match find_mismatch(const uchar*, u64, u64, u64, u64*); the checked
        // layer checked the `len` bytes at `data` lie inside a live allocation of this stream's
        // device, and `first` is the backend's own 8-byte slot on that device.
        launched(unsafe { launch.launch(self.pattern_grid(len as usize)) })
    }

    /// Queues the gate kernel: it waits until the u64 at `flag` reaches `ticket`, or writes `ticket`
    /// to `timed_out` and ends after [`SPIN_TIMEOUT_NS`].
    pub(super) fn spin(
        &self,
        stream: &CudaStream,
        flag: u64,
        ticket: u64,
        timed_out: u64,
    ) -> Result<()> {
        let mut launch = stream.launch_builder(&self.spin);
        launch
            .arg(&flag)
            .arg(&ticket)
            .arg(&timed_out)
            .arg(&SPIN_TIMEOUT_NS);
        // SAFETY: arguments match spin_until_released(volatile u64*, u64, volatile u64*, u64); both
        // addresses are slots of the backend's mapped pinned gate memory, which lives as long as it.
        launched(unsafe { launch.launch(ONE_THREAD) })
    }

    /// Queues a pointer chase of `steps` loads through `elements` u64 indices at `chain`, storing the
    /// last index at `result`.
    pub(super) fn pointer_chase(
        &self,
        stream: &CudaStream,
        chain: u64,
        elements: u64,
        steps: u32,
        result: u64,
    ) -> Result<()> {
        let mut launch = stream.launch_builder(&self.chase);
        launch.arg(&chain).arg(&elements).arg(&steps).arg(&result);
        // SAFETY: arguments match pointer_chase(const u64*, u64, u32, u64*); the kernel never loads
        // past `elements` and the checked layer checked `result` has 8 bytes; both are reachable.
        launched(unsafe { launch.launch(ONE_THREAD) })
    }

    /// Queues one side of a ping-pong: `ping` sends first, the other side answers.
    pub(super) fn ping_pong_side(
        &self,
        stream: &CudaStream,
        sends_first: bool,
        local_flag: u64,
        peer_flag: u64,
        rounds: u32,
    ) -> Result<()> {
        let function = if sends_first { &self.ping } else { &self.pong };
        let mut launch = stream.launch_builder(function);
        launch
            .arg(&local_flag)
            .arg(&peer_flag)
            .arg(&rounds)
            .arg(&SPIN_TIMEOUT_NS);
        // SAFETY: arguments match ping/pong(volatile u32*, volatile u32*, u32, u64); the caller
        // checked both flags hold 4 bytes and are reachable from this stream's device.
        launched(unsafe { launch.launch(ONE_THREAD) })
    }

    /// Queues one rank's all-reduce kernel on `blocks` blocks (the same on every rank).
    pub(super) fn all_reduce(
        &self,
        stream: &CudaStream,
        kernel: AllReduceKernel,
        dtype: DataType,
        args: &AllReduceArgs,
        blocks: u32,
    ) -> Result<()> {
        let variant = ALL_REDUCE_VARIANTS
            .iter()
            .position(|&v| v == (kernel, dtype))
            .expect("every kernel and element type has an entry point");
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (ALL_REDUCE_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&self.all_reduce[variant]);
        launch.arg(args);
        // SAFETY: the argument matches all_reduce_*(AllReduceArgs) (layout checked in abi.rs);
        // the checked layer checked that every rank's buffers hold `elements` and its flag block
        // FLAG_BYTES, all reachable from every rank's GPU; `blocks` ≤ ALL_REDUCE_MAX_BLOCKS, the
        // flag layout's limit (and for the packet kernel, exactly the blocks its words need, within
        // its receive area).
        launched(unsafe { launch.launch(config) })
    }

    /// Launches a resident worker's kernel on `blocks` blocks (the dispatching block and the copy
    /// blocks), cooperatively: the launch fails rather than leave a block waiting for an SM.
    pub(super) fn resident(
        &self,
        stream: &CudaStream,
        args: &ResidentArgs,
        blocks: u32,
    ) -> Result<()> {
        let config = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (RESIDENT_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&self.resident);
        launch.arg(args);
        // SAFETY: the argument matches resident_worker(ResidentArgs) (layout checked in
        // resident.rs); its host words, ring, doorbells and device board are allocations the
        // worker owns and frees only after the kernel has ended; every address a descriptor names
        // was checked by the checked layer to lie inside a live buffer reachable from this GPU.
        let launched_now = unsafe { launch.launch_cooperative(config) };
        launched_now
            .map(|_| ())
            .map_err(failed("cuLaunchCooperativeKernel"))
    }

    /// Queues the busy kernel: one warp per SM, each spinning for `duration_ns` of GPU time.
    pub(super) fn busy(&self, stream: &CudaStream, duration_ns: u64) -> Result<()> {
        let config = LaunchConfig {
            grid_dim: (self.sm_count, 1, 1),
            block_dim: (32, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut launch = stream.launch_builder(&self.busy);
        launch.arg(&duration_ns);
        // SAFETY: the argument matches busy(u64); the kernel touches no memory.
        launched(unsafe { launch.launch(config) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copy_grid_fills_the_gpu_for_large_copies_only() {
        let h200_sms = 132;
        assert_eq!(copy_blocks(1, h200_sms), 1);
        assert_eq!(copy_blocks(512 * 16, h200_sms), 1);
        assert_eq!(copy_blocks(512 * 16 + 1, h200_sms), 2);
        assert_eq!(copy_blocks(256 << 20, h200_sms), 132 * 4);
        assert_eq!(copy_blocks(0, 0), 1);
    }

    #[test]
    #[ignore = "needs libnvrtc (CUDA 13) on the library path"]
    fn kernels_compile_for_ampere_hopper_and_blackwell() {
        let cache = KernelCache::new(0);
        for arch in ["compute_80", "compute_90", "compute_100"] {
            let ptx = cache
                .compile(arch)
                .unwrap_or_else(|e| panic!("{arch}: {e}"));
            let text = ptx.to_src();
            let all_reduce = ALL_REDUCE_VARIANTS.map(|(k, d)| abi::entry_point(k, d));
            for kernel in entry::ALL.into_iter().chain(all_reduce) {
                assert!(
                    text.contains(&format!(".entry {kernel}")),
                    "{arch}: {kernel}"
                );
            }
        }
    }

    #[test]
    fn kernel_sources_define_every_launched_kernel() {
        for name in entry::ALL {
            // `void name(`, or the name on a line of its own after `__launch_bounds__(…)`.
            let defined = [format!("void {name}("), format!("\n    {name}(")];
            assert!(
                defined.iter().any(|d| SOURCE.contains(d.as_str())),
                "{name} missing from the kernel sources"
            );
        }
        // The gate and the latency probes share one timer helper.
        assert_eq!(SOURCE.matches("global_timer_ns() {").count(), 1);
    }
}
