//! The fast path's description of a Python object as borrowed device memory: a PyTorch CUDA tensor
//! or an object with `__cuda_array_interface__`, read with a few attribute calls and no Python
//! frames. Its checks and sentences are `peerlink/__init__.py`'s `_torch` and `_cuda_array`, which
//! describe everything else (host buffers, `peerlink.on` placements) on the slow path.

use crate::errors;
use peerlink::backend::collective::DataType;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyInt, PyString, PyType};
use std::fmt;
use std::sync::{Arc, Mutex};

/// Which argument an object is, as the sentences name it.
#[derive(Clone, Copy)]
pub enum Role {
    Destination,
    Source,
    /// Tensor `i` of an all-reduce.
    Tensor(usize),
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Role::Destination => f.write_str("destination"),
            Role::Source => f.write_str("source"),
            Role::Tensor(i) => write!(f, "tensor {i}"),
        }
    }
}

/// Device memory as an argument names it: address, GPU, the CUDA stream its owner orders work on
/// (0: the default stream), its length, and its element type where it says one peerlink sums.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Described {
    pub address: u64,
    pub device: usize,
    pub stream: u64,
    pub nbytes: usize,
    pub dtype: Option<DataType>,
}

/// What the fast path keeps of PyTorch between calls.
#[derive(Default)]
pub struct TensorTypes {
    /// Whether objects of each type seen are PyTorch tensors, found once per type: the slow
    /// path's test (`type(obj).__module__` starts with `torch`, and `data_ptr` is there), on the
    /// type. Each type is held, so that its address names it for as long as it is cached.
    seen: Mutex<Vec<(Py<PyType>, bool)>>,
    /// What was read of the `torch` module last found in `sys.modules`: read again when
    /// `sys.modules` holds another module.
    torch: Mutex<Option<Arc<Torch>>>,
}

/// A `torch` module and what the fast path reads of it once.
struct Torch {
    module: Py<PyAny>,
    /// `_C._cuda_getCurrentRawStream`, where it has one.
    raw_stream: Option<Py<PyAny>>,
    /// `torch.float32` and `torch.bfloat16`: a tensor's `dtype` is one of these objects, so that
    /// telling it is a comparison of addresses, not a string made and compared per tensor.
    dtypes: Vec<(Py<PyAny>, DataType)>,
}

impl TensorTypes {
    fn is_tensor(&self, ty: &Bound<'_, PyType>) -> PyResult<bool> {
        // The locks are never held across a call into Python, which could let another thread
        // take the GIL and wait for the lock while this one waits for the GIL.
        let known = lock(&self.seen)
            .iter()
            .find(|(t, _)| t.as_ptr() == ty.as_ptr())
            .map(|(_, tensor)| *tensor);
        if let Some(tensor) = known {
            return Ok(tensor);
        }
        let py = ty.py();
        let module: String = ty.getattr(intern!(py, "__module__"))?.extract()?;
        let tensor = module.starts_with("torch") && ty.hasattr(intern!(py, "data_ptr"))?;
        lock(&self.seen).push((ty.clone().unbind(), tensor));
        Ok(tensor)
    }
}

/// Describes the arguments of one call. What it reads of PyTorch once serves every argument of
/// the call: the `torch` module's cached facts, and each GPU's current stream (reading an argument
/// does not change a current stream; the user's code does, between calls).
pub struct Describer<'t> {
    types: &'t TensorTypes,
    torch: Option<Arc<Torch>>,
    /// The last GPU whose current stream was read, and the stream.
    last_stream: Option<(usize, u64)>,
}

impl<'t> Describer<'t> {
    pub fn new(types: &'t TensorTypes) -> Self {
        Describer {
            types,
            torch: None,
            last_stream: None,
        }
    }

    /// What `obj` is: device memory (described, or refused with the slow path's sentence), or
    /// None where the slow path must look (a host buffer, a placement, anything else).
    pub fn describe(
        &mut self,
        obj: &Bound<'_, PyAny>,
        what: Role,
        want_dtype: bool,
    ) -> PyResult<Option<Described>> {
        let py = obj.py();
        if self.types.is_tensor(&obj.get_type())? {
            return self.tensor(obj, what, want_dtype).map(Some);
        }
        match obj.getattr_opt(intern!(py, "__cuda_array_interface__"))? {
            Some(interface) => cuda_array(obj, &interface.cast_into::<PyDict>()?, what).map(Some),
            None => Ok(None),
        }
    }

    /// A copy's destination and source described as device memory; None where either is not
    /// (the caller then leaves them to the slow path).
    pub fn pair(
        &mut self,
        dst: &Bound<'_, PyAny>,
        src: &Bound<'_, PyAny>,
    ) -> PyResult<Option<(Described, Described)>> {
        let Some(to) = self.describe(dst, Role::Destination, false)? else {
            return Ok(None);
        };
        Ok(self
            .describe(src, Role::Source, false)?
            .map(|from| (to, from)))
    }

    fn tensor(
        &mut self,
        tensor: &Bound<'_, PyAny>,
        what: Role,
        want_dtype: bool,
    ) -> PyResult<Described> {
        let py = tensor.py();
        // -1 for a tensor in host memory: one call instead of `is_cuda` and then `get_device()`.
        let device: i64 = tensor.call_method0(intern!(py, "get_device"))?.extract()?;
        let Ok(device) = usize::try_from(device) else {
            return Err(errors::usage(
                py,
                format!(
                    "the {what} is a tensor in host memory; give a CUDA tensor, or on the \
                     simulator peerlink.on(gpu, tensor.numpy())"
                ),
            ));
        };
        if !tensor
            .call_method0(intern!(py, "is_contiguous"))?
            .is_truthy()?
        {
            return Err(errors::usage(
                py,
                format!(
                    "the {what} is not contiguous; pass tensor.contiguous() (peerlink moves one \
                     range of bytes)"
                ),
            ));
        }
        let torch = match &self.torch {
            Some(torch) => torch.clone(),
            None => self.torch.insert(self.types.torch(py)?).clone(),
        };
        let stream = match self.last_stream {
            Some((known, stream)) if known == device => stream,
            _ => {
                let stream = torch.current_stream(py, device)?;
                self.last_stream = Some((device, stream));
                stream
            }
        };
        let dtype = if want_dtype {
            let dtype = tensor.getattr(intern!(py, "dtype"))?;
            torch
                .dtypes
                .iter()
                .find(|(known, _)| dtype.is(known))
                .map(|(_, t)| *t)
        } else {
            None
        };
        Ok(Described {
            address: tensor.call_method0(intern!(py, "data_ptr"))?.extract()?,
            device,
            stream,
            nbytes: tensor.getattr(intern!(py, "nbytes"))?.extract()?,
            dtype,
        })
    }
}

impl TensorTypes {
    /// What the fast path reads of the `torch` module in `sys.modules` (imported: the tensor is
    /// one of its own), looked up at every call as the slow path does, read once per module.
    fn torch(&self, py: Python<'_>) -> PyResult<Arc<Torch>> {
        static MODULES: PyOnceLock<Py<PyDict>> = PyOnceLock::new();
        let modules = MODULES.get_or_try_init(py, || {
            py.import(intern!(py, "sys"))?
                .getattr(intern!(py, "modules"))?
                .cast_into::<PyDict>()
                .map(Bound::unbind)
                .map_err(PyErr::from)
        })?;
        let module = modules
            .bind(py)
            .get_item(intern!(py, "torch"))?
            .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err("torch"))?;
        // The lock is never held across a call into Python (see `is_tensor`).
        let cached = lock(&self.torch)
            .as_ref()
            .filter(|t| t.module.bind(py).is(&module))
            .cloned();
        if let Some(torch) = cached {
            return Ok(torch);
        }
        let dtypes = [
            (intern!(py, "float32"), DataType::F32),
            (intern!(py, "bfloat16"), DataType::Bf16),
        ]
        .into_iter()
        .filter_map(|(name, t)| match module.getattr_opt(name) {
            Ok(found) => found.map(|d| Ok((d.unbind(), t))),
            Err(e) => Some(Err(e)),
        })
        .collect::<PyResult<_>>()?;
        let torch = Arc::new(Torch {
            raw_stream: module
                .getattr(intern!(py, "_C"))?
                .getattr_opt(intern!(py, "_cuda_getCurrentRawStream"))?
                .map(Bound::unbind),
            dtypes,
            module: module.unbind(),
        });
        *lock(&self.torch) = Some(torch.clone());
        Ok(torch)
    }
}

impl Torch {
    /// `torch.cuda.current_stream(device).cuda_stream`, read as PyTorch's compiler reads it
    /// (without making a Stream object) where that function is there. Asked at every call: the
    /// current stream is the user's to change between calls (`with torch.cuda.stream(s):`).
    fn current_stream(&self, py: Python<'_>, device: usize) -> PyResult<u64> {
        match &self.raw_stream {
            Some(raw) => raw.bind(py).call1((device,))?.extract(),
            None => self
                .module
                .bind(py)
                .getattr(intern!(py, "cuda"))?
                .call_method1(intern!(py, "current_stream"), (device,))?
                .getattr(intern!(py, "cuda_stream"))?
                .extract(),
        }
    }
}

fn cuda_array(
    obj: &Bound<'_, PyAny>,
    interface: &Bound<'_, PyDict>,
    what: Role,
) -> PyResult<Described> {
    let py = obj.py();
    let found = obj.getattr_opt(intern!(py, "device"))?;
    let device = match found {
        // An int has neither `id` nor `index`: asking would raise and catch two AttributeErrors.
        Some(found) if found.is_instance_of::<PyInt>() => found,
        Some(found) => match found.getattr_opt(intern!(py, "id"))? {
            Some(id) => id,
            None => found.getattr_opt(intern!(py, "index"))?.unwrap_or(found),
        },
        None => py.None().into_bound(py),
    };
    if !device.is_instance_of::<PyInt>() {
        return Err(errors::usage(
            py,
            format!(
                "the {what} does not say which GPU it is on; name it with peerlink.on(gpu, array)"
            ),
        ));
    }
    let shape: Vec<usize> = item(interface, intern!(py, "shape"))?.extract()?;
    let typestr: String = item(interface, intern!(py, "typestr"))?.extract()?;
    let itemsize: usize = typestr
        .get(2..)
        .and_then(|digits| digits.parse().ok())
        .ok_or_else(|| {
            pyo3::exceptions::PyValueError::new_err(format!(
                "invalid literal for int() with base 10: {:?}",
                typestr.get(2..).unwrap_or("")
            ))
        })?;
    let count: usize = shape.iter().product();
    if let Some(strides) = interface.get_item(intern!(py, "strides"))? {
        if !strides.is_none() {
            let strides: Vec<usize> = strides.extract()?;
            let mut expected = vec![0; shape.len()];
            let mut step = itemsize;
            for (slot, extent) in expected.iter_mut().zip(&shape).rev() {
                *slot = step;
                step *= extent;
            }
            if strides != expected && count > 1 {
                return Err(errors::usage(
                    py,
                    format!(
                        "the {what} is not C-contiguous; copy it into a contiguous array first"
                    ),
                ));
            }
        }
    }
    // Version 3 of the interface: None or absent, no stream to follow; 1 the legacy default
    // stream; 2 the per-thread default stream, which peerlink cannot order work on.
    let stream = match interface.get_item(intern!(py, "stream"))? {
        None => 0,
        Some(stream) if stream.is_none() => 0,
        Some(stream) => match stream.extract::<u64>()? {
            1 => 0,
            2 => {
                return Err(errors::usage(
                    py,
                    format!(
                        "the {what} is ordered on the per-thread default stream, which peerlink \
                         cannot borrow; use a stream of your own or the legacy default stream"
                    ),
                ))
            }
            handle => handle,
        },
    };
    let data = item(interface, intern!(py, "data"))?;
    Ok(Described {
        address: data.get_item(0)?.extract()?,
        device: device.extract()?,
        stream,
        nbytes: count * itemsize,
        dtype: (typestr.get(1..) == Some("f4")).then_some(DataType::F32),
    })
}

/// `interface[key]`, a KeyError where it is missing (as the slow path's subscript).
fn item<'py>(
    interface: &Bound<'py, PyDict>,
    key: &Bound<'py, PyString>,
) -> PyResult<Bound<'py, PyAny>> {
    interface
        .get_item(key)?
        .ok_or_else(|| pyo3::exceptions::PyKeyError::new_err(key.clone().unbind()))
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}
