//! `peerlink._native`: the Rust side of the Python package. The pure-Python `peerlink` package
//! wraps it (tensor and buffer handling, the documents as dicts); everything here is the library's
//! own types and serde, with the GIL released while the library works.

mod describe;
mod device_buffer;
mod errors;
mod fabric;

use errors::IntoPy;
use peerlink::backend::{self, Backend, Choice};
use peerlink::bench::document::{BenchDocument, ExplainDocument};
use peerlink::bench::{self, explain, progress};
use peerlink::document;
use peerlink::document::topo::TopoDocument;
use peerlink::units::parse::{parse_size, parse_sizes};
use pyo3::prelude::*;
use std::sync::Arc;

/// An opened backend: real GPUs, or the simulator (asked for, or fallen back to with a notice).
#[pyclass(frozen, module = "peerlink._native")]
struct Host {
    backend: KeptOnDrop<Arc<dyn Backend>>,
    notice: Option<String>,
}

/// What keeps a backend open: the backend itself, or an engine fabric over it.
pub(crate) trait HoldsBackend {
    fn held_backend(&self) -> &dyn Backend;
}

impl HoldsBackend for Arc<dyn Backend> {
    fn held_backend(&self) -> &dyn Backend {
        self.as_ref()
    }
}

impl HoldsBackend for peerlink::engine::Fabric {
    fn held_backend(&self) -> &dyn Backend {
        self.backend().as_ref()
    }
}

/// `T`, dropped with the thread's CUDA context kept: the last holder of a CUDA backend releases
/// its GPUs' contexts, and releasing one makes it current; a Python object is dropped on whatever
/// thread collects it (PyTorch's, say).
pub(crate) struct KeptOnDrop<T: HoldsBackend>(Option<T>);

impl<T: HoldsBackend> KeptOnDrop<T> {
    pub(crate) fn new(inner: T) -> Self {
        KeptOnDrop(Some(inner))
    }
}

impl<T: HoldsBackend> std::ops::Deref for KeptOnDrop<T> {
    type Target = T;

    fn deref(&self) -> &T {
        self.0.as_ref().expect("taken only by drop")
    }
}

impl<T: HoldsBackend> Drop for KeptOnDrop<T> {
    fn drop(&mut self) {
        if let Some(inner) = self.0.take() {
            let kept = inner.held_backend().keep_thread_context();
            drop(inner);
            drop(kept);
        }
    }
}

/// Runs `work` with the GIL released, keeping the thread's CUDA context: the backend makes its
/// GPUs' contexts current as it works, and the caller's (PyTorch's current device) is made current
/// again after, as a CUDA library owes the code it shares a thread with.
pub(crate) fn detached<T: Send>(
    py: Python<'_>,
    backend: &dyn Backend,
    work: impl FnOnce() -> peerlink::Result<T> + Send,
) -> PyResult<T> {
    py.detach(|| {
        let _kept = backend.keep_thread_context()?;
        work()
    })
    .or_raise(py)
}

#[pymethods]
impl Host {
    /// Opens the simulator with `sim` (a preset name or file), real GPUs with `gpu`, else real
    /// GPUs when the driver is present and the simulator with a notice when not.
    #[new]
    #[pyo3(signature = (sim = None, gpu = false))]
    fn new(py: Python<'_>, sim: Option<String>, gpu: bool) -> PyResult<Host> {
        let choice = match (sim, gpu) {
            (Some(preset), _) => Choice::Sim(preset),
            (None, true) => Choice::Gpu,
            (None, false) => Choice::Auto,
        };
        let opened = py.detach(|| backend::open(&choice)).or_raise(py)?;
        Ok(Host {
            backend: KeptOnDrop::new(Arc::from(opened.backend)),
            notice: opened.notice,
        })
    }

    /// Set when the simulator was opened because no GPU could be used: one sentence saying so.
    #[getter]
    fn notice(&self) -> Option<String> {
        self.notice.clone()
    }

    /// What the backend could not find out about the host, one sentence each.
    #[getter]
    fn notices(&self) -> Vec<String> {
        self.backend.notices()
    }

    /// `cuda`, or `sim:<preset>`.
    #[getter]
    fn source(&self) -> String {
        self.backend.source().to_string()
    }

    #[getter]
    fn simulated(&self) -> bool {
        self.backend.topology().is_simulated()
    }

    /// The host's GPUs.
    #[getter]
    fn device_count(&self) -> usize {
        self.backend.topology().devices.len()
    }
}

/// `peerlink topo --json`: the document as JSON text.
#[pyfunction]
#[pyo3(signature = (host, devices = None))]
fn topology_json(py: Python<'_>, host: &Host, devices: Option<Vec<usize>>) -> PyResult<String> {
    detached(py, host.backend.as_ref(), || {
        let topo = host.backend.topology();
        let selected = topo.select(devices.as_deref())?;
        Ok(document::to_json(&TopoDocument::new(topo, &selected)))
    })
}

/// `peerlink bench --json`: runs the tests (or the sweep, with `sizes`) and returns the document
/// as JSON text. Sizes are written as on the command line (`8MiB`, `plateau`, `4K,64K`,
/// `4B..1GiB`).
#[pyfunction]
#[pyo3(signature = (host, tests = None, devices = None, size = None, sizes = None, samples = None,
    iterations = None, warmup = None, rotation = None))]
#[allow(clippy::too_many_arguments)] // bench's options, one keyword each as on the command line
fn bench_json(
    py: Python<'_>,
    host: &Host,
    tests: Option<Vec<String>>,
    devices: Option<Vec<usize>>,
    size: Option<String>,
    sizes: Option<String>,
    samples: Option<u32>,
    iterations: Option<u32>,
    warmup: Option<u32>,
    rotation: Option<String>,
) -> PyResult<String> {
    detached(py, host.backend.as_ref(), || {
        let options = bench::Options {
            tests,
            devices,
            size: size.as_deref().map(bench::Size::parse).transpose()?,
            samples,
            iterations,
            warmup,
            rotation: rotation.as_deref().map(bench::parse_rotation).transpose()?,
            sizes: sizes.as_deref().map(parse_sizes).transpose()?,
        };
        let found = bench::run(host.backend.as_ref(), &options, &progress::Silent)?;
        Ok(document::to_json(&BenchDocument::new(
            host.backend.topology(),
            found,
        )))
    })
}

/// `peerlink explain --json`: one transfer's latency taken apart.
#[pyfunction]
#[pyo3(signature = (host, src, dst, size, memory = "device"))]
fn explain_json(
    py: Python<'_>,
    host: &Host,
    src: usize,
    dst: usize,
    size: String,
    memory: &str,
) -> PyResult<String> {
    detached(py, host.backend.as_ref(), || {
        let run = match memory {
            "device" => explain::run,
            "managed" => explain::run_managed,
            other => {
                return Err(peerlink::Error::usage(format!(
                    "memory `{other}` is not a kind of memory explain knows: say `device` or \
                     `managed`"
                )))
            }
        };
        let found = run(
            host.backend.as_ref(),
            src,
            dst,
            parse_size(&size)?,
            &progress::Silent,
        )?;
        Ok(document::to_json(&ExplainDocument::new(
            host.backend.topology(),
            found,
        )))
    })
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Host>()?;
    m.add_class::<fabric::Fabric>()?;
    m.add_class::<device_buffer::DeviceBuffer>()?;
    m.add_class::<device_buffer::SymmetricBuffer>()?;
    m.add_function(wrap_pyfunction!(topology_json, m)?)?;
    m.add_function(wrap_pyfunction!(bench_json, m)?)?;
    m.add_function(wrap_pyfunction!(explain_json, m)?)?;
    m.add(
        "DEFAULT_COPY_BLOCKS",
        peerlink::backend::resident::DEFAULT_COPY_BLOCKS,
    )?;
    Ok(())
}
