//! [`probe`]: is there a CUDA device, and what is it?
//!
//! cudarc loads the driver library lazily and *panics* when it is missing, so the runtime first
//! opens `libcuda.so.1` itself with `libloading`; without it every entry point returns
//! [`RuntimeError::NoDevice`]. Calls into cudarc that could still panic on an odd setup (a
//! driver too old to have a symbol) run under `catch_unwind` and come back as errors too.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{result, sys, CudaContext};

use crate::error::RuntimeError;

/// Set (to anything but `0` or empty) to make [`probe`] report no device even where one exists:
/// for checking CPU-only paths on a GPU machine.
pub const NO_GPU_ENV: &str = "SINTER_NO_GPU";

/// Names tried, in order, for the driver library.
const LIBCUDA: [&str; 2] = ["libcuda.so.1", "libcuda.so"];

/// What [`probe`] found out about device 0.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device ordinal (0).
    pub ordinal: usize,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Compute capability (major, minor), e.g. (9, 0).
    pub compute_capability: (u32, u32),
    /// Streaming multiprocessors.
    pub sm_count: u32,
    /// Device memory in bytes.
    pub total_memory: usize,
    /// Free device memory at probe time, in bytes.
    pub free_memory: usize,
    /// Largest shared memory a CTA may opt in to, in bytes.
    pub max_shared_per_block_optin: u32,
    /// L2 cache size in bytes.
    pub l2_cache_bytes: u32,
    /// CUDA driver API version (major, minor), e.g. (13, 0).
    pub driver_version: (u32, u32),
}

impl DeviceInfo {
    /// The target name of the compute capability, e.g. `sm_90` (without the arch-specific
    /// `a` suffix, which the caller may add for sm_90 and later).
    pub fn sm(&self) -> String {
        format!("sm_{}{}", self.compute_capability.0, self.compute_capability.1)
    }
}

impl std::fmt::Display for DeviceInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} ({}, {} SMs, {:.1} GiB, driver CUDA {}.{})",
            self.name,
            self.sm(),
            self.sm_count,
            self.total_memory as f64 / (1u64 << 30) as f64,
            self.driver_version.0,
            self.driver_version.1
        )
    }
}

/// Checks that the CUDA driver library can be loaded (once per process; the answer is kept).
///
/// # Errors
/// [`RuntimeError::NoDevice`] when [`NO_GPU_ENV`] is set or no driver library opens.
pub fn driver_available() -> Result<(), RuntimeError> {
    if std::env::var_os(NO_GPU_ENV).is_some_and(|v| !v.is_empty() && v != "0") {
        return Err(RuntimeError::NoDevice { reason: format!("{NO_GPU_ENV} is set") });
    }
    static FOUND: OnceLock<Result<(), String>> = OnceLock::new();
    let found = FOUND.get_or_init(|| {
        let mut errors = Vec::new();
        for name in LIBCUDA {
            // SAFETY: loading the CUDA driver library runs its initialisers, which have no
            // preconditions; it is what cudarc does too.
            match unsafe { libloading::Library::new(name) } {
                Ok(lib) => {
                    // Keep it loaded for the life of the process, as cudarc will.
                    std::mem::forget(lib);
                    return Ok(());
                }
                Err(e) => errors.push(format!("{name}: {e}")),
            }
        }
        Err(format!("the CUDA driver library could not be loaded ({})", errors.join("; ")))
    });
    found.clone().map_err(|reason| RuntimeError::NoDevice { reason })
}

/// Runs `f` (which calls into cudarc) and turns a panic into [`RuntimeError::NoDevice`].
pub(crate) fn no_panic<T>(what: &str, f: impl FnOnce() -> Result<T, RuntimeError>) -> Result<T, RuntimeError> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(RuntimeError::NoDevice { reason: format!("the CUDA driver failed during {what}: {msg}") })
        }
    }
}

/// Opens the primary context of device `ordinal`, mapping every failure to an error.
pub(crate) fn open_context(ordinal: usize) -> Result<Arc<CudaContext>, RuntimeError> {
    driver_available()?;
    no_panic("context creation", || {
        let no_device = |what: &str, e: result::DriverError| RuntimeError::NoDevice { reason: format!("{what} failed with {:?}", e.0) };
        result::init().map_err(|e| no_device("cuInit", e))?;
        let count = result::device::get_count().map_err(|e| no_device("cuDeviceGetCount", e))?;
        if count <= 0 {
            return Err(RuntimeError::NoDevice { reason: "the driver reports no CUDA device".into() });
        }
        if ordinal >= count as usize {
            return Err(RuntimeError::NoDevice { reason: format!("device {ordinal} asked for, the driver reports {count}") });
        }
        CudaContext::new(ordinal).map_err(|e| no_device("creating the context", e))
    })
}

/// Reads a [`DeviceInfo`] from an open context.
pub(crate) fn device_info(ctx: &Arc<CudaContext>) -> Result<DeviceInfo, RuntimeError> {
    no_panic("the device query", || {
        let err = |e| RuntimeError::cuda("device query", e, None);
        let attr = |a: CUdevice_attribute| ctx.attribute(a).map(|v| v.max(0) as u32).map_err(err);
        let (major, minor) = ctx.compute_capability().map_err(err)?;
        let (free, total) = ctx.mem_get_info().map_err(err)?;
        let mut version: std::ffi::c_int = 0;
        // SAFETY: cuDriverGetVersion writes one int through a valid pointer.
        unsafe { sys::cuDriverGetVersion(&mut version) }.result().map_err(err)?;
        Ok(DeviceInfo {
            ordinal: ctx.ordinal(),
            name: ctx.name().map_err(err)?,
            compute_capability: (major.max(0) as u32, minor.max(0) as u32),
            sm_count: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)?,
            total_memory: total,
            free_memory: free,
            max_shared_per_block_optin: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN)?,
            l2_cache_bytes: attr(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)?,
            driver_version: (version.max(0) as u32 / 1000, (version.max(0) as u32 % 1000) / 10),
        })
    })
}

/// Finds CUDA device 0 and describes it.
///
/// Never panics: where there is no driver library, no device, or the driver fails to
/// initialise, the answer is [`RuntimeError::NoDevice`] with the reason.
///
/// # Errors
/// [`RuntimeError::NoDevice`] as above; [`RuntimeError::Cuda`] when a query of an opened
/// device fails.
pub fn probe() -> Result<DeviceInfo, RuntimeError> {
    let ctx = open_context(0)?;
    device_info(&ctx)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_panic_turns_panics_into_errors() {
        let r: Result<(), _> = no_panic("a test", || panic!("Missing symbol cuFoo"));
        let err = r.unwrap_err();
        assert!(err.is_no_device());
        assert!(err.to_string().contains("Missing symbol cuFoo"), "{err}");
        assert_eq!(no_panic("ok", || Ok(3)).unwrap(), 3);
    }

    #[test]
    fn sm_name_and_display() {
        let info = DeviceInfo {
            ordinal: 0,
            name: "NVIDIA H200".into(),
            compute_capability: (9, 0),
            sm_count: 132,
            total_memory: 150 << 30,
            free_memory: 149 << 30,
            max_shared_per_block_optin: 232_448,
            l2_cache_bytes: 60 << 20,
            driver_version: (13, 0),
        };
        assert_eq!(info.sm(), "sm_90");
        let s = info.to_string();
        assert!(s.contains("NVIDIA H200") && s.contains("132 SMs") && s.contains("CUDA 13.0"), "{s}");
    }
}
