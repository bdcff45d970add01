//! [`RuntimeError`]: everything the runtime can report, as values (the runtime never panics on
//! a missing driver, a bad plan, a failed launch or a corrupt cache entry).

use std::path::PathBuf;

use sinter_ir::DimError;

/// An error of the runtime.
///
/// CUDA failures carry the driver's error name (`CUDA_ERROR_ILLEGAL_ADDRESS`, …) and, where a
/// kernel is involved, its entry name, so that a failure in a long sequence of launches names
/// the kernel that caused it.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// No usable CUDA device: the driver library (`libcuda.so.1`) is absent, it has no device,
    /// or initialising it failed. An ordinary condition on CPU-only machines.
    #[error("no CUDA device: {reason}")]
    NoDevice {
        /// What was missing or failed, in words.
        reason: String,
    },
    /// A CUDA driver call failed.
    #[error("{code} in {op}{}: {message}", kernel.as_ref().map(|k| format!(" (kernel `{k}`)")).unwrap_or_default())]
    Cuda {
        /// The driver operation that failed (`launch`, `synchronize`, `memcpy`, …).
        op: String,
        /// The driver's error name, e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`.
        code: String,
        /// The driver's description of the error.
        message: String,
        /// The kernel entry (or entries, for an error found at synchronisation: every kernel
        /// launched since the previous synchronisation, oldest first) involved, if any.
        kernel: Option<String>,
    },
    /// The driver JIT rejected a PTX module.
    #[error("{code} while loading the PTX of kernel `{entry}`: {log}")]
    Jit {
        /// Entry point asked for.
        entry: String,
        /// The driver's error name, e.g. `CUDA_ERROR_INVALID_PTX`.
        code: String,
        /// The JIT's error log (ptxas' messages), or the driver's description when empty.
        log: String,
    },
    /// An allocation did not fit in device memory, even after the pool released its cached
    /// blocks.
    #[error("out of device memory: {requested} bytes requested, {free} bytes free")]
    OutOfMemory {
        /// Bytes asked for (after rounding up to the pool's size class).
        requested: usize,
        /// Free device memory reported by the driver, in bytes.
        free: usize,
    },
    /// A launch plan cannot be launched as written (bad geometry, parameter index out of range,
    /// a parameter that is not representable, too much shared memory, …).
    #[error("cannot launch kernel `{entry}`: {reason}")]
    InvalidLaunch {
        /// Entry point of the plan.
        entry: String,
        /// What is wrong.
        reason: String,
    },
    /// A dimension of a launch plan or a buffer shape could not be evaluated under the bindings.
    #[error("{what}: {source}")]
    Dim {
        /// Which dimension (e.g. ``grid.x of kernel `k0` ``).
        what: String,
        /// Why.
        source: DimError,
    },
    /// A buffer does not fit its use: wrong dtype, shape, element count, or host data length.
    #[error("buffer mismatch: {0}")]
    Buffer(String),
    /// A kernel graph and its launch plans do not fit together, or a graph input is missing.
    #[error("invalid executor setup: {0}")]
    Graph(String),
    /// A persistent launch was abandoned: a task waited past the timeout for the kernel
    /// before it (one that faulted inside or never completed). The message names both.
    #[error("persistent decode step abandoned: {0}")]
    Persistent(String),
    /// A file-system operation of the kernel cache failed.
    #[error("kernel cache {}: {message}", path.display())]
    Cache {
        /// The file or folder.
        path: PathBuf,
        /// What failed.
        message: String,
    },
}

impl RuntimeError {
    /// A [`RuntimeError::Cuda`] from a driver error.
    pub(crate) fn cuda(op: impl Into<String>, err: cudarc::driver::DriverError, kernel: Option<String>) -> RuntimeError {
        // The enum variant's name *is* the CUDA error name; asking the driver for its
        // description may itself fail, so fall back to the name.
        let code = format!("{:?}", err.0);
        let message = err
            .error_string()
            .ok()
            .and_then(|s| s.to_str().ok().map(str::to_owned))
            .unwrap_or_else(|| code.clone());
        RuntimeError::Cuda { op: op.into(), code, message, kernel }
    }

    /// The CUDA error name this error carries (`CUDA_ERROR_…`), if it is a driver error.
    pub fn cuda_code(&self) -> Option<&str> {
        match self {
            RuntimeError::Cuda { code, .. } | RuntimeError::Jit { code, .. } => Some(code),
            _ => None,
        }
    }

    /// True for [`RuntimeError::NoDevice`].
    pub fn is_no_device(&self) -> bool {
        matches!(self, RuntimeError::NoDevice { .. })
    }
}
