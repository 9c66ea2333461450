//! The library's errors as Python exceptions: the classes of `peerlink._errors`, each message the
//! library's own sentence.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::types::PyType;

/// The exception class of `peerlink._errors` that stands for `error`.
fn class_name(error: &peerlink::Error) -> &'static str {
    use peerlink::Error;
    match error {
        Error::Usage(_) | Error::Preset { .. } => "UsageError",
        Error::NoGpu(_) => "NoGpuError",
        Error::Cuda { .. } => "CudaError",
        Error::PeerAccess { .. } => "PeerAccessError",
        Error::Verification { .. } => "VerificationError",
        Error::OutOfMemory { .. } => "OutOfMemoryError",
        Error::InvalidHandle(_) => "InvalidHandleError",
        Error::Io { .. } => "FileError",
        // Only a program that calls `peerlink::interrupt::request` sees `Interrupted`.
        Error::Draw(_) | Error::Interrupted => "Error",
        Error::Group(_) | Error::RankFailed { .. } => "GroupError",
    }
}

/// `error` as the Python exception its kind maps to.
pub fn to_py(py: Python<'_>, error: peerlink::Error) -> PyErr {
    let message = error.to_string();
    let class = py
        .import("peerlink._errors")
        .and_then(|module| module.getattr(class_name(&error)))
        .and_then(|class| Ok(class.cast_into::<PyType>()?));
    match class {
        Ok(class) => PyErr::from_type(class, message),
        // Only a broken install lacks the module; the sentence still reaches the user.
        Err(_) => PyRuntimeError::new_err(message),
    }
}

/// A usage error raised by this layer (a buffer it cannot take), as the library's own would be.
pub fn usage(py: Python<'_>, message: impl Into<String>) -> PyErr {
    to_py(py, peerlink::Error::usage(message))
}

/// Turns the library's results into Python's.
pub trait IntoPy<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T>;
}

impl<T> IntoPy<T> for peerlink::Result<T> {
    fn or_raise(self, py: Python<'_>) -> PyResult<T> {
        self.map_err(|e| to_py(py, e))
    }
}
