//! `peerlink._native.DeviceBuffer`: device memory peerlink allocates and lends to Python through
//! `__cuda_array_interface__`, so that the borrowed-memory paths of `Fabric` run without another
//! GPU library: on the simulator (its made-up addresses mean something only to peerlink) for the
//! tests, and on GPUs for benchmarks without PyTorch.

use crate::{detached, Host, KeptOnDrop};
use peerlink::backend::{Backend, BufferId, Memory};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::Arc;

#[pyclass(frozen, module = "peerlink._native")]
pub struct DeviceBuffer {
    backend: KeptOnDrop<Arc<dyn Backend>>,
    buffer: BufferId,
    /// The GPU the memory is on.
    #[pyo3(get)]
    device: usize,
    #[pyo3(get)]
    nbytes: usize,
    /// The unified address of the first byte.
    #[pyo3(get)]
    address: u64,
}

#[pymethods]
impl DeviceBuffer {
    /// `nbytes` zeroed bytes of GPU `device`'s memory.
    #[new]
    fn new(py: Python<'_>, host: &Host, device: usize, nbytes: usize) -> PyResult<DeviceBuffer> {
        let backend = host.backend.clone();
        let (buffer, address) = detached(py, backend.as_ref(), || {
            let buffer = backend.alloc(Memory::Device(device), nbytes)?;
            backend.write(buffer, 0, &vec![0; nbytes])?;
            Ok((buffer, backend.sharing().device_address(buffer)?))
        })?;
        Ok(DeviceBuffer {
            backend: KeptOnDrop::new(backend),
            buffer,
            device,
            nbytes,
            address,
        })
    }

    /// Writes `data` (as many bytes as the buffer holds, or fewer) from the first byte.
    fn write(&self, py: Python<'_>, data: PyBuffer<u8>) -> PyResult<()> {
        let bytes = data.to_vec(py)?;
        detached(py, self.backend.as_ref(), || {
            self.backend.write(self.buffer, 0, &bytes)
        })
    }

    /// The buffer's bytes, once the work queued on it has run.
    fn read(&self, py: Python<'_>) -> PyResult<Vec<u8>> {
        detached(py, self.backend.as_ref(), || {
            let mut out = vec![0; self.nbytes];
            self.backend.read(self.buffer, 0, &mut out)?;
            Ok(out)
        })
    }

    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cuda_array_interface(py, self.address, self.nbytes)
    }
}

/// `peerlink._native.SymmetricBuffer`: this rank's part of memory every rank of a group allocated
/// together (`engine::all_reduce::GroupAllReduce::alloc_symmetric`), lent through
/// `__cuda_array_interface__`.
/// The group frees it when the fabric closes, not when this object goes (the Python fabric keeps a
/// weak reference to each, to warn at its close about those still referenced).
#[pyclass(frozen, weakref, module = "peerlink._native")]
pub struct SymmetricBuffer {
    #[pyo3(get)]
    pub(crate) device: usize,
    #[pyo3(get)]
    pub(crate) nbytes: usize,
    #[pyo3(get)]
    pub(crate) address: u64,
}

#[pymethods]
impl SymmetricBuffer {
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        cuda_array_interface(py, self.address, self.nbytes)
    }
}

/// Version 3 of the interface over `nbytes` at `address`: bytes (`|u1`), one dimension, no
/// stream to follow.
fn cuda_array_interface(
    py: Python<'_>,
    address: u64,
    nbytes: usize,
) -> PyResult<Bound<'_, PyDict>> {
    let interface = PyDict::new(py);
    interface.set_item("data", (address, false))?;
    interface.set_item("shape", (nbytes,))?;
    interface.set_item("typestr", "|u1")?;
    interface.set_item("version", 3)?;
    interface.set_item("stream", py.None())?;
    Ok(interface)
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        // Nothing can report a failure from drop; the simulator refuses while a fabric still
        // holds a borrowed handle on the buffer (synchronize the fabric first).
        let _kept = self.backend.keep_thread_context();
        let _ = self.backend.free(self.buffer);
    }
}
