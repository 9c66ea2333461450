//! `peerlink._native.Fabric`: the engine over host buffers (any object with the buffer protocol:
//! their bytes moved through the engine and written back) and over another library's device
//! memory (a PyTorch tensor's storage, ordered on its CUDA stream).

use crate::describe::{Described, Describer, Role, TensorTypes};
use crate::device_buffer::SymmetricBuffer;
use crate::errors;
use crate::{detached, Host, KeptOnDrop};
use peerlink::backend::collective::{BufferRange, DataType, Reduction};
use peerlink::backend::{Backend, Memory, Owned, StreamId};
use peerlink::engine;
use peerlink::engine::all_reduce::GroupAllReduce;
use peerlink::engine::all_reduce::{LocalAllReduce, LocalRank};
use peerlink::launch;
use peerlink::{Error, Result};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyTuple};
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

/// Another library's device memory, as the Python layer found it: its address, GPU and the CUDA
/// stream its owner orders work on.
type DeviceRef = (u64, usize, u64);

/// A host buffer of bytes and the GPU the engine is to hold it on.
type HostRef = (PyBuffer<u8>, usize);

#[pyclass(frozen, module = "peerlink._native")]
pub struct Fabric {
    fabric: KeptOnDrop<engine::Fabric>,
    state: Mutex<State>,
    tensor_types: TensorTypes,
    /// The all-reduce over this fabric's GPUs.
    reduce: Mutex<LocalAllReduce>,
    /// With one rank per process: this process's rank of the all-reduce across the group.
    group: Option<Mutex<GroupAllReduce>>,
}

#[derive(Default)]
struct State {
    /// Streams borrowed from their owners, by GPU and handle, kept from their first use: a handle
    /// the caller passes is its current stream, so alive; and should its owner destroy it and the
    /// driver hand the same handle out again, the wrapper names that stream, of the same GPU's
    /// context (the key holds the GPU), which is what a fresh borrow would find.
    borrowed_streams: HashMap<(usize, u64), StreamId>,
    /// Streams of this fabric's own, one per GPU, for the all-reduce of host buffers.
    own_streams: HashMap<usize, StreamId>,
    /// The owners' streams copies and all-reduces were queued on since the last `synchronize`:
    /// they order that work, and nothing else of it is kept.
    queued_on: Vec<StreamId>,
}

impl Fabric {
    fn backend(&self) -> &dyn Backend {
        self.fabric.backend().as_ref()
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The backend's handle of an owner's stream, borrowed at its first use.
    fn stream(&self, device: usize, handle: u64) -> Result<StreamId> {
        if let Some(&stream) = self.lock().borrowed_streams.get(&(device, handle)) {
            return Ok(stream);
        }
        let stream = self.backend().borrow_stream(device, handle)?;
        self.lock()
            .borrowed_streams
            .insert((device, handle), stream);
        Ok(stream)
    }

    /// Notes that work was queued on `streams`, for `synchronize` to wait for.
    fn queued_on(&self, streams: &[StreamId]) {
        let mut state = self.lock();
        for stream in streams {
            if !state.queued_on.contains(stream) {
                state.queued_on.push(*stream);
            }
        }
    }

    /// Queues copies between borrowed memory.
    fn queue_device_copies(&self, copies: &[(DeviceRef, DeviceRef, usize)]) -> Result<()> {
        copies
            .iter()
            .try_for_each(|&(dst, src, bytes)| self.queue_device_copy(dst, src, bytes))
    }

    /// Queues one copy between borrowed memory after the work queued so far on both owners'
    /// streams, and makes their later work wait for it: on the issuing owner's stream itself, as
    /// PyTorch queues a copy between GPUs (see `TransferBuilder::on_streams`). Nothing of it is
    /// kept (`TransferBuilder::submit_ordered`): the owners' streams order it, and the borrowed
    /// handles go at once.
    fn queue_device_copy(&self, dst: DeviceRef, src: DeviceRef, bytes: usize) -> Result<()> {
        // Borrowed at every call, never cached: the borrow (one driver query) is what checks that
        // the range lies in an allocation of that GPU now. A cache by (GPU, address, length)
        // would skip it, and an object naming memory given back to the driver since (PyTorch's
        // empty_cache, a stale __cuda_array_interface__) would fault the GPU's context instead of
        // raising an error.
        let (dst_buffer, src_buffer) = (
            self.fabric.borrow(dst.1, dst.0, bytes)?,
            self.fabric.borrow(src.1, src.0, bytes)?,
        );
        let streams = [self.stream(src.1, src.2)?, self.stream(dst.1, dst.2)?];
        self.fabric
            .transfer(src_buffer.all(), dst_buffer.all())
            .on_streams(streams[0], streams[1])
            .submit_ordered()?;
        self.queued_on(&streams);
        Ok(())
    }

    /// A stream of this fabric's own on `device`.
    fn own_stream(&self, device: usize) -> Result<StreamId> {
        if let Some(&stream) = self.lock().own_streams.get(&device) {
            return Ok(stream);
        }
        let stream = self.backend().create_stream(device)?;
        self.lock().own_streams.insert(device, stream);
        Ok(stream)
    }

    fn lock_reduce(&self) -> MutexGuard<'_, LocalAllReduce> {
        self.reduce.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sums host buffers' bytes as `dtype` through the all-reduce on their GPUs; returns each
    /// rank's result.
    fn reduce_host(&self, inputs: &[(Vec<u8>, usize)], dtype: DataType) -> Result<Vec<Vec<u8>>> {
        let backend = self.backend();
        let devices: Vec<usize> = inputs.iter().map(|(_, d)| *d).collect();
        let bytes = inputs[0].0.len();
        self.lock_reduce().check(&devices, bytes, dtype)?;
        let mut held = Vec::new();
        let mut ranks = Vec::new();
        for (data, device) in inputs {
            let input = Owned::new(backend, backend.alloc(Memory::Device(*device), bytes)?);
            let output = Owned::new(backend, backend.alloc(Memory::Device(*device), bytes)?);
            backend.write(*input, 0, data)?;
            ranks.push(LocalRank {
                device: *device,
                stream: self.own_stream(*device)?,
                input: *input,
                output: *output,
            });
            held.push((input, output));
        }
        self.lock_reduce()
            .all_reduce(&ranks, bytes, dtype, Reduction::Sum)?;
        ranks
            .iter()
            .map(|rank| {
                backend.synchronize(rank.stream)?;
                let mut out = vec![0; bytes];
                backend.read(rank.output, 0, &mut out)?;
                Ok(out)
            })
            .collect()
    }

    /// Queues the in-place all-reduce of borrowed memory on its owners' streams.
    fn reduce_device(&self, ranks: &[DeviceRef], bytes: usize, dtype: DataType) -> Result<()> {
        let backend = self.backend();
        let devices: Vec<usize> = ranks.iter().map(|r| r.1).collect();
        self.lock_reduce().check(&devices, bytes, dtype)?;
        let mut borrowed = Vec::with_capacity(ranks.len());
        let mut queued = Vec::with_capacity(ranks.len());
        for &(address, device, handle) in ranks {
            let stream = self.stream(device, handle)?;
            let tensor = Owned::new(backend, backend.borrow_memory(device, address, bytes)?);
            queued.push(LocalRank {
                device,
                stream,
                input: *tensor,
                output: *tensor,
            });
            borrowed.push(tensor);
        }
        // Releasing the borrowed handles leaves the memory to its owners; the queued work runs.
        self.lock_reduce()
            .all_reduce(&queued, bytes, dtype, Reduction::Sum)?;
        let streams: Vec<StreamId> = queued.iter().map(|rank| rank.stream).collect();
        self.queued_on(&streams);
        Ok(())
    }

    /// This process's rank of the all-reduce across processes, or why there is none.
    fn group(&self) -> Result<MutexGuard<'_, GroupAllReduce>> {
        let group = self.group.as_ref().ok_or_else(|| {
            Error::usage(
                "this fabric runs in one process: open it with processes=True, under a launcher, \
                 to reduce one tensor per process",
            )
        })?;
        Ok(group.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// The GPU of this process's rank, with processes=True.
    fn rank_gpu(&self) -> Option<usize> {
        self.group
            .as_ref()
            .map(|g| g.lock().unwrap_or_else(PoisonError::into_inner).gpu())
    }

    /// Queues the all-reduce across processes of this rank's borrowed memory on its owner's
    /// stream.
    fn reduce_rank(&self, tensor: DeviceRef, bytes: usize, dtype: DataType) -> Result<()> {
        let (address, device, handle) = tensor;
        let mut group = self.group()?;
        let gpu = group.gpu();
        if device != gpu {
            return Err(Error::usage(format!(
                "the tensor is on GPU {device}, but this process is rank {} of the group, on GPU \
                 {gpu} (its LOCAL_RANK): give it a tensor of GPU {gpu}",
                group.rank()
            )));
        }
        let stream = self.stream(device, handle)?;
        let backend = self.backend();
        // Symmetric memory as it is (no copies); any other memory borrowed for the call.
        let borrowed;
        let range = match group.symmetric_range(address, bytes) {
            Some(range) => range,
            None => {
                borrowed = Owned::new(backend, backend.borrow_memory(device, address, bytes)?);
                BufferRange {
                    buffer: *borrowed,
                    offset: 0,
                    len: bytes,
                }
            }
        };
        group.all_reduce(range, stream, dtype, Reduction::Sum)?;
        drop(group);
        self.queued_on(&[stream]);
        Ok(())
    }

    /// Sums a host buffer's bytes across the processes, through this rank's GPU; returns the sum.
    fn reduce_rank_host(&self, data: &[u8], dtype: DataType) -> Result<Vec<u8>> {
        let mut group = self.group()?;
        let gpu = group.gpu();
        let backend = self.backend();
        let stream = self.own_stream(gpu)?;
        let buffer = Owned::new(
            backend,
            backend.alloc(Memory::Device(gpu), data.len().max(1))?,
        );
        backend.write(*buffer, 0, data)?;
        let range = BufferRange {
            buffer: *buffer,
            offset: 0,
            len: data.len(),
        };
        group.all_reduce(range, stream, dtype, Reduction::Sum)?;
        drop(group);
        backend.synchronize(stream)?;
        let mut out = vec![0; data.len()];
        backend.read(*buffer, 0, &mut out)?;
        Ok(out)
    }

    /// Waits for the streams copies and all-reduces were queued on.
    fn wait_all(&self) -> Result<()> {
        let queued_on = std::mem::take(&mut self.lock().queued_on);
        for stream in queued_on {
            self.backend().synchronize(stream)?;
        }
        Ok(())
    }
}

/// The host time of `calls` calls of `op`, µs per call.
fn host_time_per_call(calls: u32, mut op: impl FnMut() -> Result<()>) -> Result<f64> {
    if calls == 0 {
        return Err(Error::usage("time at least 1 call"));
    }
    let started = std::time::Instant::now();
    for _ in 0..calls {
        op()?;
    }
    Ok(started.elapsed().as_secs_f64() * 1e6 / f64::from(calls))
}

/// Moves host bytes through the engine: each source written into a buffer on its GPU, the
/// transfers submitted together, each destination read back.
fn move_host_bytes(
    fabric: &engine::Fabric,
    copies: &[(usize, Vec<u8>, usize)],
) -> Result<Vec<Vec<u8>>> {
    let mut buffers = Vec::new();
    for (dst_device, data, src_device) in copies {
        let src = fabric.alloc(*src_device, data.len())?;
        src.write(0, data)?;
        buffers.push((fabric.alloc(*dst_device, data.len())?, src));
    }
    let transfers = buffers
        .iter()
        .map(|(dst, src)| fabric.transfer(src.all(), dst.all()))
        .collect();
    for transfer in fabric.submit_together(transfers)? {
        transfer.wait()?;
    }
    buffers.iter().map(|(dst, _)| dst.to_vec()).collect()
}

/// The bytes of each source, after checking that each destination can take them.
fn host_bytes(
    py: Python<'_>,
    copies: &[(HostRef, HostRef)],
) -> PyResult<Vec<(usize, Vec<u8>, usize)>> {
    copies
        .iter()
        .enumerate()
        .map(|(i, ((dst, dst_device), (src, src_device)))| {
            let which = if copies.len() == 1 {
                String::new()
            } else {
                format!(" of pair {i}")
            };
            if dst.readonly() {
                return Err(errors::usage(
                    py,
                    format!("the destination{which} is read-only; pass a writable buffer (a bytearray or an array)"),
                ));
            }
            if dst.item_count() != src.item_count() {
                return Err(errors::usage(
                    py,
                    format!(
                        "the source{which} holds {} bytes but the destination {}; they must be equal",
                        src.item_count(),
                        dst.item_count()
                    ),
                ));
            }
            Ok((*dst_device, src.to_vec(py)?, *src_device))
        })
        .collect()
}

fn data_type(py: Python<'_>, name: &str) -> PyResult<DataType> {
    match name {
        "f32" => Ok(DataType::F32),
        "bf16" => Ok(DataType::Bf16),
        other => Err(errors::usage(
            py,
            format!("peerlink's all-reduce sums f32 or bf16, not `{other}`"),
        )),
    }
}

/// A copy between two pieces of device memory, after the slow path's checks.
fn device_copy(
    py: Python<'_>,
    dst: &Described,
    src: &Described,
) -> PyResult<(DeviceRef, DeviceRef, usize)> {
    if dst.nbytes != src.nbytes {
        return Err(errors::usage(
            py,
            format!(
                "the source holds {} bytes but the destination {}; they must be equal",
                src.nbytes, dst.nbytes
            ),
        ));
    }
    let overlap = dst.device == src.device
        && dst.address < src.address + src.nbytes as u64
        && src.address < dst.address + dst.nbytes as u64;
    if overlap {
        return Err(errors::usage(
            py,
            "the source and destination overlap in one GPU's memory; bytes would be overwritten \
             while they are read",
        ));
    }
    Ok((
        (dst.address, dst.device, dst.stream),
        (src.address, src.device, src.stream),
        dst.nbytes,
    ))
}

#[pymethods]
impl Fabric {
    /// A fabric over `devices` (every GPU when None) of `host`; with `resident`, a resident worker
    /// of that many copy blocks on each GPU that sends.
    ///
    /// With `processes`, this process is one rank of a group started by a launcher (torchrun,
    /// `peerlink launch`, srun, mpirun: read from their variables), on the GPU of its
    /// `LOCAL_RANK`: it meets the others and joins their all-reduce (every rank opens its fabric
    /// so, together).
    #[new]
    #[pyo3(signature = (host, devices = None, resident = None, processes = false))]
    fn new(
        py: Python<'_>,
        host: &Host,
        devices: Option<Vec<usize>>,
        resident: Option<u32>,
        processes: bool,
    ) -> PyResult<Fabric> {
        let mut builder = engine::Fabric::builder(host.backend.clone());
        if let Some(devices) = &devices {
            if processes {
                return Err(errors::usage(
                    py,
                    "devices: with processes=True each rank uses the GPU of its LOCAL_RANK; leave \
                     devices out",
                ));
            }
            builder = builder.devices(devices);
        }
        if let Some(blocks) = resident {
            builder = builder.resident(blocks);
        }
        let fabric = detached(py, host.backend.as_ref(), || builder.open())?;
        let group = if processes {
            let backend = host.backend.clone();
            let model = fabric.planner().model().clone();
            let joined = detached(py, host.backend.as_ref(), || {
                let (_, group) = launch::join_from_env()?.ok_or_else(|| {
                    Error::usage(
                        "processes=True, but no launcher's variables are set (RANK and \
                         WORLD_SIZE, OMPI_COMM_WORLD_*, SLURM_PROCID): start every rank with \
                         torchrun, peerlink launch, srun or mpirun",
                    )
                })?;
                GroupAllReduce::join(backend, group, model)
            });
            Some(Mutex::new(joined?))
        } else {
            None
        };
        let reduce = LocalAllReduce::new(
            host.backend.clone(),
            fabric.planner().model().clone(),
            fabric.devices(),
        );
        Ok(Fabric {
            fabric: KeptOnDrop::new(fabric),
            state: Mutex::default(),
            tensor_types: TensorTypes::default(),
            reduce: Mutex::new(reduce),
            group,
        })
    }

    /// This process's rank of the group, with processes=True; None in one process.
    #[getter]
    fn rank(&self) -> Option<usize> {
        self.group
            .as_ref()
            .map(|g| g.lock().unwrap_or_else(PoisonError::into_inner).rank())
    }

    /// How many processes the group has, with processes=True; None in one process.
    #[getter]
    fn world(&self) -> Option<usize> {
        self.group.as_ref().map(|g| {
            g.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .gpus()
                .len()
        })
    }

    /// The fast path of `peerlink.Fabric.all_reduce_` across processes: queues the all-reduce of
    /// this rank's tensor (or a list or tuple of it alone) when it is device memory and returns
    /// True; False, having done nothing, when it is not.
    #[pyo3(signature = (tensor, dtype = None))]
    fn all_reduce_rank_(
        &self,
        py: Python<'_>,
        tensor: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<bool> {
        // This rank's one tensor, or a list or tuple of it (a longer one is the slow path's to
        // refuse).
        let one = match (tensor.cast::<PyList>(), tensor.cast::<PyTuple>()) {
            (Ok(list), _) if list.len() == 1 => list.get_item(0)?,
            (_, Ok(tuple)) if tuple.len() == 1 => tuple.get_item(0)?,
            _ => tensor.clone(),
        };
        let Some(found) =
            Describer::new(&self.tensor_types).describe(&one, Role::Tensor(0), dtype.is_none())?
        else {
            return Ok(false);
        };
        let chosen = match dtype {
            Some(name) => data_type(py, name)?,
            None => found.dtype.ok_or_else(|| {
                errors::usage(
                    py,
                    "the tensor does not say its element type (or says one peerlink does not \
                     sum); pass dtype='f32' or dtype='bf16'",
                )
            })?,
        };
        let tensor = (found.address, found.device, found.stream);
        detached(py, self.backend(), || {
            self.reduce_rank(tensor, found.nbytes, chosen)
        })?;
        Ok(true)
    }

    /// Queues the all-reduce across processes of this rank's borrowed memory (address, GPU,
    /// stream); the host does not wait.
    fn all_reduce_rank_device(
        &self,
        py: Python<'_>,
        tensor: DeviceRef,
        bytes: usize,
        dtype: &str,
    ) -> PyResult<()> {
        let dtype = data_type(py, dtype)?;
        detached(py, self.backend(), || {
            self.reduce_rank(tensor, bytes, dtype)
        })
    }

    /// For the Python layer's cost (python/benchmarks): queues the same all-reduce as
    /// `all_reduce_rank_device` `calls` times from Rust and returns the host time per call, µs.
    fn time_all_reduce_rank_device(
        &self,
        py: Python<'_>,
        tensor: DeviceRef,
        bytes: usize,
        dtype: &str,
        calls: u32,
    ) -> PyResult<f64> {
        let dtype = data_type(py, dtype)?;
        detached(py, self.backend(), || {
            host_time_per_call(calls, || self.reduce_rank(tensor, bytes, dtype))
        })
    }

    /// With processes=True: `nbytes` zeroed bytes of this rank's GPU in memory every rank's
    /// all-reduce kernels reach, allocated by every rank together (the same `nbytes`, in the same
    /// order of calls); freed when the fabric closes.
    fn alloc_symmetric(&self, py: Python<'_>, nbytes: usize) -> PyResult<SymmetricBuffer> {
        detached(py, self.backend(), || {
            let mut group = self.group()?;
            let buffer = group.alloc_symmetric(nbytes)?;
            Ok(SymmetricBuffer {
                device: group.gpu(),
                nbytes,
                address: self.backend().sharing().device_address(buffer)?,
            })
        })
    }

    /// Sums a host buffer across the processes (its bytes through this rank's GPU) as `dtype`
    /// elements and writes the sum into it.
    fn all_reduce_rank_host(&self, py: Python<'_>, buffer: HostRef, dtype: &str) -> PyResult<()> {
        let dtype = data_type(py, dtype)?;
        let (buffer, device) = buffer;
        if buffer.readonly() {
            return Err(errors::usage(
                py,
                "the buffer of the all-reduce is read-only; give a writable buffer (a bytearray \
                 or an array)",
            ));
        }
        let gpu = self.rank_gpu();
        if Some(device) != gpu {
            return Err(errors::usage(
                py,
                format!(
                    "the buffer is placed on GPU {device}, but this process's rank runs on GPU \
                     {gpu:?} (its LOCAL_RANK): place it there"
                ),
            ));
        }
        let data = buffer.to_vec(py)?;
        let sum = detached(py, self.backend(), || self.reduce_rank_host(&data, dtype))?;
        buffer.copy_from_slice(py, &sum)
    }

    /// The GPUs the fabric uses.
    #[getter]
    fn devices(&self) -> Vec<usize> {
        self.fabric.devices().to_vec()
    }

    /// Copies each source's bytes into its destination through the engine, between their GPUs.
    fn copy_host(&self, py: Python<'_>, copies: Vec<(HostRef, HostRef)>) -> PyResult<()> {
        let moves = host_bytes(py, &copies)?;
        let moved = detached(py, self.backend(), || move_host_bytes(&self.fabric, &moves))?;
        for (((dst, _), _), bytes) in copies.iter().zip(moved) {
            dst.copy_from_slice(py, &bytes)?;
        }
        Ok(())
    }

    /// Sums the host buffers (one per GPU) as `dtype` elements and writes the sum into each.
    fn all_reduce_host(&self, py: Python<'_>, buffers: Vec<HostRef>, dtype: &str) -> PyResult<()> {
        let dtype = data_type(py, dtype)?;
        if let Some((first, _)) = buffers.first() {
            if let Some((i, _)) = buffers
                .iter()
                .enumerate()
                .find(|(_, (b, _))| b.readonly() || b.item_count() != first.item_count())
            {
                return Err(errors::usage(
                    py,
                    format!(
                        "buffer {i} of the all-reduce is read-only or of another length than \
                         buffer 0 ({} bytes); give writable buffers of one length",
                        first.item_count()
                    ),
                ));
            }
        }
        let inputs = buffers
            .iter()
            .map(|(b, d)| Ok((b.to_vec(py)?, *d)))
            .collect::<PyResult<Vec<_>>>()?;
        if inputs.is_empty() {
            return Err(errors::usage(
                py,
                "an all-reduce takes one tensor per GPU on at least 2 GPUs; none given",
            ));
        }
        let sums = detached(py, self.backend(), || self.reduce_host(&inputs, dtype))?;
        for ((buffer, _), sum) in buffers.iter().zip(sums) {
            buffer.copy_from_slice(py, &sum)?;
        }
        Ok(())
    }

    /// The fast path of `peerlink.Fabric.copy_`: queues the copy when both are device memory (a
    /// CUDA tensor, `__cuda_array_interface__`) and returns True; False, having done nothing,
    /// when either is not (the slow path then describes them).
    fn copy_(
        &self,
        py: Python<'_>,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let Some((to, from)) = Describer::new(&self.tensor_types).pair(dst, src)? else {
            return Ok(false);
        };
        let copy = device_copy(py, &to, &from)?;
        detached(py, self.backend(), || {
            self.queue_device_copies(std::slice::from_ref(&copy))
        })?;
        Ok(true)
    }

    /// As `copy_`, for `peerlink.Fabric.copy_many_` (sequences of one length).
    fn copy_many_(
        &self,
        py: Python<'_>,
        dsts: &Bound<'_, PyAny>,
        srcs: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let mut pairs = Vec::new();
        let mut describer = Describer::new(&self.tensor_types);
        for (dst, src) in dsts.try_iter()?.zip(srcs.try_iter()?) {
            let Some(pair) = describer.pair(&dst?, &src?)? else {
                return Ok(false);
            };
            pairs.push(pair);
        }
        let copies = pairs
            .iter()
            .map(|(to, from)| device_copy(py, to, from))
            .collect::<PyResult<Vec<_>>>()?;
        detached(py, self.backend(), || self.queue_device_copies(&copies))?;
        Ok(true)
    }

    /// The fast path of `peerlink.Fabric.all_reduce_`: queues the all-reduce when `tensors` is a
    /// list or tuple of device memory and returns True; False, having done nothing, when it is
    /// another sequence, when one is not device memory, or when there are none.
    #[pyo3(signature = (tensors, dtype = None))]
    fn all_reduce_(
        &self,
        py: Python<'_>,
        tensors: &Bound<'_, PyAny>,
        dtype: Option<&str>,
    ) -> PyResult<bool> {
        // Only these: iterating another sequence could consume what the slow path then reads.
        let tensors = match (tensors.cast::<PyList>(), tensors.cast::<PyTuple>()) {
            (Ok(list), _) => list.as_sequence().clone(),
            (_, Ok(tuple)) => tuple.as_sequence().clone(),
            _ => return Ok(false),
        };
        let mut found = Vec::with_capacity(tensors.len()?);
        let mut describer = Describer::new(&self.tensor_types);
        for (i, tensor) in tensors.try_iter()?.enumerate() {
            let tensor = tensor?;
            match describer.describe(&tensor, Role::Tensor(i), dtype.is_none())? {
                Some(described) => found.push(described),
                None => return Ok(false),
            }
        }
        let Some(first) = found.first() else {
            return Ok(false);
        };
        let chosen = match dtype {
            Some(name) => Some(data_type(py, name)?),
            None => first
                .dtype
                .filter(|t| found.iter().all(|f| f.dtype == Some(*t))),
        };
        let Some(chosen) = chosen else {
            return Err(errors::usage(
                py,
                "the tensors do not say their element type (or say different ones); pass \
                 dtype='f32' or dtype='bf16'",
            ));
        };
        if found.iter().any(|f| f.nbytes != first.nbytes) {
            return Err(errors::usage(
                py,
                "the tensors of an all-reduce must all hold the same number of bytes",
            ));
        }
        let ranks: Vec<DeviceRef> = found
            .iter()
            .map(|f| (f.address, f.device, f.stream))
            .collect();
        let bytes = first.nbytes;
        detached(py, self.backend(), || {
            self.reduce_device(&ranks, bytes, chosen)
        })?;
        Ok(true)
    }

    /// Queues copies of `bytes` each between borrowed memory (address, GPU, stream), ordered on
    /// both owners' streams; the host does not wait.
    fn copy_device(
        &self,
        py: Python<'_>,
        copies: Vec<(DeviceRef, DeviceRef, usize)>,
    ) -> PyResult<()> {
        detached(py, self.backend(), || self.queue_device_copies(&copies))
    }

    /// For the Python layer's cost (python/benchmarks): queues the same copies as `copy_device`
    /// `calls` times from Rust and returns the host time per call, µs.
    fn time_copy_device(
        &self,
        py: Python<'_>,
        copies: Vec<(DeviceRef, DeviceRef, usize)>,
        calls: u32,
    ) -> PyResult<f64> {
        detached(py, self.backend(), || {
            host_time_per_call(calls, || self.queue_device_copies(&copies))
        })
    }

    /// As `time_copy_device`, for `all_reduce_device`.
    fn time_all_reduce_device(
        &self,
        py: Python<'_>,
        ranks: Vec<DeviceRef>,
        bytes: usize,
        dtype: &str,
        calls: u32,
    ) -> PyResult<f64> {
        let dtype = data_type(py, dtype)?;
        detached(py, self.backend(), || {
            host_time_per_call(calls, || self.reduce_device(&ranks, bytes, dtype))
        })
    }

    /// Queues the in-place all-reduce (sum) of borrowed memory, one rank per GPU, on the owners'
    /// streams; the host does not wait.
    fn all_reduce_device(
        &self,
        py: Python<'_>,
        ranks: Vec<DeviceRef>,
        bytes: usize,
        dtype: &str,
    ) -> PyResult<()> {
        let dtype = data_type(py, dtype)?;
        detached(py, self.backend(), || {
            self.reduce_device(&ranks, bytes, dtype)
        })
    }

    /// Blocks until every copy and all-reduce queued so far has finished.
    fn synchronize(&self, py: Python<'_>) -> PyResult<()> {
        detached(py, self.backend(), || self.wait_all())
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        // Nothing can report a failure from drop: each release is tried. The group's part goes
        // first: it waits for its calls on the borrowed streams, released below.
        let backend = self.fabric.backend().clone();
        let _kept = backend.keep_thread_context();
        drop(self.group.take());
        let _ = self.wait_all();
        // The all-reduce waits for its calls on the streams destroyed below.
        self.lock_reduce().release();
        let state = std::mem::take(&mut *self.lock());
        for stream in state.own_streams.values() {
            let _ = backend.synchronize(*stream);
            let _ = backend.destroy_stream(*stream);
        }
        for stream in state.borrowed_streams.values() {
            let _ = backend.synchronize(*stream);
            let _ = backend.destroy_stream(*stream);
        }
    }
}
