//! sinter-runtime: runs compiled kernels on a CUDA device.
//!
//! The runtime takes what the code generator produced — PTX text and a
//! [`LaunchPlan`](sinter_ir::LaunchPlan) per kernel of a [`KernelGraph`](sinter_ir::KernelGraph) —
//! and never sees LLVM. It depends on `sinter-ir` and `cudarc` (driver API, loaded at run time:
//! no CUDA toolkit is needed to build, and a machine without a driver gets
//! [`RuntimeError::NoDevice`], never a panic).
//!
//! - [`probe()`] — is there a device, and what is it ([`DeviceInfo`]).
//! - [`Device`] — a context with one stream, a [`MemoryPool`] and a cache of kernels loaded
//!   through the driver JIT; [`Device::launch`] runs one plan over [`DeviceBuffer`]s.
//! - [`DeviceBuffer`] — a tensor's bytes on the device; upload/download in every dtype
//!   ([`Device::upload_f64`], [`Device::download_tensor`], …), guard tails and poisoning to
//!   catch writes past an output ([`Device::alloc_with_guard`], [`Device::guard_violation`]).
//! - [`Executor`] — a whole kernel graph: buffers from the pool, kernels in order, per-kernel
//!   timing ([`Executor::run_profiled`]) and CUDA graph capture ([`Executor::capture`] →
//!   [`CapturedGraph::replay`]).
//! - [`KernelCache`] — compiled plans on disk, keyed by a hash of everything they depend on,
//!   with corrupt entries detected and rebuilt; beside them each kernel's machine code
//!   ([`cubin`]: assembled once per architecture and `ptxas` version, loaded by
//!   [`Device::load_modules`] without the JIT).
//!
//! ```no_run
//! use sinter_runtime::{probe, Device, RuntimeError};
//! match probe() {
//!     Err(RuntimeError::NoDevice { reason }) => eprintln!("skipped: no GPU ({reason})"),
//!     Err(e) => panic!("{e}"),
//!     Ok(info) => {
//!         println!("{info}");
//!         let dev = Device::open().unwrap();
//!         let x = dev.upload_f64(sinter_ir::DType::BF16, &[2, 3], &[1.0; 6]).unwrap();
//!         assert_eq!(dev.download_f64(&x).unwrap(), vec![1.0; 6]);
//!     }
//! }
//! ```
#![warn(missing_docs)]
#![cfg_attr(not(test), warn(clippy::unwrap_used, clippy::expect_used))]

pub mod buffer;
pub mod cache;
pub mod codec;
pub mod cubin;
pub mod device;
pub mod error;
pub mod executor;
pub mod launch;
pub mod persistent;
pub mod pool;
pub mod probe;

pub use buffer::{DeviceBuffer, GuardViolation};
pub use cache::{CacheKey, CacheStatus, KernelCache, Lookup};
pub use codec::Element;
pub use cubin::{assembler_from_env, Assembler, CubinAssembler, CubinLookup};
pub use device::{Device, KernelAttributes, LoadStats, LoadedKernel};
pub use error::RuntimeError;
pub use executor::{free_symbols, CapturedGraph, Executor, KernelTime, Profile};
pub use persistent::PersistentOptions;
pub use launch::{resolve, ArgValue, ResolvedLaunch, ResolvedTensorMap};
pub use pool::{MemoryPool, PoolStats, RawAllocator};
pub use probe::{driver_available, probe, DeviceInfo};
