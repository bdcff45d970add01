//! [`Device`]: a CUDA context with one stream, a memory pool and the kernels loaded into it.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::{self, CUfunction_attribute, CUjit_option};
use cudarc::driver::{result, CudaContext, CudaStream, DriverError};
use sha2::{Digest, Sha256};
use sinter_ir::interp::Tensor;
use sinter_ir::{Bindings, DType, LaunchPlan};

use crate::buffer::{byte_len, numel, DeviceBuffer, GuardViolation};
use crate::cache::KernelCache;
use crate::codec::{self, Element};
use crate::cubin::{assembler_from_env, ptxas_assemble, Assembler, CubinAssembler, CubinLookup};
use crate::error::RuntimeError;
use crate::launch::{resolve, ArgValue, ResolvedLaunch, DEFAULT_SHARED_LIMIT};
use crate::pool::{MemoryPool, PoolStats, RawAllocator};
use crate::probe::{device_info, no_panic, open_context, DeviceInfo};

/// How many kernel names an error found at synchronisation lists (the most recent ones).
const PENDING_NAMES: usize = 16;

/// Bytes of each JIT log buffer.
const JIT_LOG_BYTES: usize = 1 << 16;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// `cuMemAlloc`/`cuMemFree` under a [`MemoryPool`].
struct CudaAllocator {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
}

impl RawAllocator for CudaAllocator {
    fn allocate(&mut self, bytes: usize) -> Result<u64, RuntimeError> {
        self.ctx.bind_to_thread().map_err(|e| RuntimeError::cuda("cuCtxSetCurrent", e, None))?;
        // SAFETY: cuMemAlloc has no preconditions beyond a current context (bound above).
        match unsafe { result::malloc_sync(bytes) } {
            Ok(p) => Ok(p),
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => Err(RuntimeError::OutOfMemory { requested: bytes, free: self.free_memory() }),
            Err(e) => {
                // Some drivers refuse absurd sizes with another code: more than is free is
                // out of memory whatever the code says.
                let free = self.free_memory();
                if bytes > free {
                    Err(RuntimeError::OutOfMemory { requested: bytes, free })
                } else {
                    Err(RuntimeError::cuda(format!("cuMemAlloc({bytes})"), e, None))
                }
            }
        }
    }

    fn free(&mut self, ptr: u64, _bytes: usize) {
        // Work still queued on the stream may use the block: let it finish first.
        let _ = self.stream.synchronize();
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed once (the pool
            // forgets it here); no queued work uses it any more (synchronised above).
            let _ = unsafe { result::free_sync(ptr) };
        }
    }

    fn free_memory(&self) -> usize {
        self.ctx.mem_get_info().map(|(free, _)| free).unwrap_or(0)
    }
}

/// A loaded PTX module; unloaded when the last kernel from it goes.
struct Module {
    raw: sys::CUmodule,
    ctx: Arc<CudaContext>,
}

// SAFETY: a CUmodule handle may be used from any thread once its context is current; every
// use here binds the context first.
unsafe impl Send for Module {}
unsafe impl Sync for Module {}

impl Drop for Module {
    fn drop(&mut self) {
        if self.ctx.bind_to_thread().is_ok() {
            // SAFETY: the module was loaded in this context and is unloaded once.
            let _ = unsafe { result::module::unload(self.raw) };
        }
    }
}

/// Facts the driver reports about a loaded kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KernelAttributes {
    /// Registers per thread.
    pub registers: u32,
    /// Local memory per thread in bytes (stack and register spills; 0 for a kernel that does
    /// not spill).
    pub local_bytes: u32,
    /// Static shared memory per CTA in bytes.
    pub static_shared_bytes: u32,
    /// Most threads per CTA this kernel can be launched with.
    pub max_threads_per_block: u32,
    /// PTX ISA version the kernel was compiled from, times 10 (e.g. 85).
    pub ptx_version: u32,
    /// SASS architecture it was JIT-compiled to, times 10 (e.g. 90).
    pub binary_version: u32,
    /// CTAs per thread-block cluster the kernel requires (`.reqnctapercluster`, PTX ISA
    /// §11.4.3.5): 1 without a cluster. Above 8 (the portable size) the loader sets
    /// `CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED` (16 on Hopper).
    pub cluster_size: u32,
}

/// The largest cluster every device of compute capability 9.0 and up schedules (CUDA C
/// Programming Guide, "Thread Block Clusters"); larger ones (16 on H100/H200) must be allowed
/// per kernel.
const PORTABLE_CLUSTER_SIZE: u32 = 8;

/// A kernel loaded into a [`Device`]: the JIT-compiled entry point of a plan's PTX.
pub struct LoadedKernel {
    entry: String,
    func: sys::CUfunction,
    _module: Arc<Module>,
    /// The largest dynamic shared memory size this function has been opened up to.
    dynamic_smem_limit: AtomicU32,
    attributes: KernelAttributes,
    /// Launched with programmatic stream serialization ([`programmatic_launch`]).
    programmatic: bool,
}

// SAFETY: a CUfunction handle may be launched from any thread with its context current; the
// only mutable state is atomic.
unsafe impl Send for LoadedKernel {}
unsafe impl Sync for LoadedKernel {}

impl LoadedKernel {
    /// Entry point name.
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// Registers, spills, shared memory of the compiled kernel.
    pub fn attributes(&self) -> KernelAttributes {
        self.attributes
    }

    /// Whether it is launched with programmatic dependent launch ([`programmatic_launch`]).
    pub fn programmatic(&self) -> bool {
        self.programmatic
    }

    /// The driver's function handle.
    pub(crate) fn func(&self) -> sys::CUfunction {
        self.func
    }
}

/// Whether a kernel of `ptx` is launched with programmatic dependent launch on a device of
/// compute capability `cc`: from 9.0 up, when its code waits for the grids it depends on
/// (`griddepcontrol.wait`, which sinter's code generator puts before the kernel's first
/// instruction on those targets), unless `SINTER_NO_PDL` is set. Such a launch may start
/// while the previous kernel of the stream runs (CUDA C Programming Guide, "Programmatic
/// Dependent Launch and Synchronization"); a kernel without the wait is launched as usual.
pub fn programmatic_launch(cc: (u32, u32), ptx: &str) -> bool {
    cc.0 >= 9 && ptx.contains("griddepcontrol.wait") && std::env::var_os("SINTER_NO_PDL").is_none()
}

impl std::fmt::Debug for LoadedKernel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LoadedKernel({}, {:?})", self.entry, self.attributes)
    }
}

/// What [`Device::load_modules`] did.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LoadStats {
    /// Modules loaded now (one per distinct PTX not loaded before).
    pub modules: usize,
    /// Of which loaded from a cubin found in the cache.
    pub cubin_hits: usize,
    /// Cubins assembled now (and stored, where there is a cache).
    pub assembled: usize,
    /// Modules JIT-compiled from their PTX (no cubin could be had or loaded).
    pub ptx_jit: usize,
    /// Cache entries refused — damaged, or made for another architecture or assembler — and
    /// cubins the driver would not load, each with what was wrong; their kernels were
    /// assembled again (and the entries rewritten) or JIT-compiled.
    pub damaged: Vec<String>,
    /// Kernels `ptxas` could not assemble (JIT-compiled from their PTX instead), each with
    /// its entry and `ptxas`'s message: an old or broken `ptxas` shows here instead of as
    /// a slow start with no reason given.
    pub assembly_failed: Vec<String>,
    /// Wall time of reading the cache, seconds.
    pub cache_seconds: f64,
    /// Wall time of assembling the cubins that were not cached (on several threads), seconds.
    pub assembly_seconds: f64,
    /// Wall time of loading the modules (cubins, or PTX through the JIT), seconds.
    pub load_seconds: f64,
}

/// The machine's available parallelism (1 where it cannot be known).
fn all_cores() -> usize {
    std::thread::available_parallelism().map(usize::from).unwrap_or(1)
}

/// `f` of every item on up to `jobs` threads, results in the items' order.
fn parallel_map<T: Sync, R: Send>(items: &[T], jobs: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    let workers = jobs.clamp(1, items.len().max(1));
    if workers == 1 {
        return items.iter().map(f).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<R>> = std::iter::repeat_with(|| None).take(items.len()).collect();
    let done: Vec<(usize, R)> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break };
                        mine.push((i, f(item)));
                    }
                    mine
                })
            })
            .collect();
        // A worker that panicked has lost its items: they stay `None` and are recomputed below.
        handles.into_iter().flat_map(|h| h.join().unwrap_or_default()).collect()
    });
    for (i, r) in done {
        out[i] = Some(r);
    }
    out.into_iter().zip(items).map(|(r, item)| r.unwrap_or_else(|| f(item))).collect()
}

type KernelKey = (String, [u8; 32]);

struct Inner {
    info: DeviceInfo,
    assembler: Assembler,
    /// What makes the cubin cache's machine code ([`assembler_from_env`]).
    cubins: CubinAssembler,
    pool: Arc<Mutex<MemoryPool>>,
    kernels: Mutex<HashMap<KernelKey, Arc<LoadedKernel>>>,
    modules: Mutex<HashMap<[u8; 32], Arc<Module>>>,
    /// Entry names launched since the last synchronisation (the most recent few).
    pending: Mutex<Vec<String>>,
    stream: Arc<CudaStream>,
    ctx: Arc<CudaContext>,
}

/// A CUDA device: its primary context, one stream on which every operation of this handle
/// runs in order, a [`MemoryPool`] and a cache of loaded kernels keyed by (entry, PTX hash).
///
/// `Device` is a cheap handle (clones share everything). Copies between host and device
/// synchronise the stream before they return; launches are asynchronous, and an error a kernel
/// causes while running (e.g. `CUDA_ERROR_ILLEGAL_ADDRESS`) is reported by the next
/// synchronising call, naming the kernels launched since the previous one.
#[derive(Clone)]
pub struct Device {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.inner.info)
    }
}

impl Device {
    /// Opens device 0.
    ///
    /// # Errors
    /// As [`Device::new`].
    pub fn open() -> Result<Device, RuntimeError> {
        Device::new(0)
    }

    /// Opens device `ordinal`: retains its primary context and creates a stream.
    ///
    /// # Errors
    /// [`RuntimeError::NoDevice`] where there is no driver or no such device (never a panic);
    /// [`RuntimeError::Cuda`] when creating the stream fails.
    pub fn new(ordinal: usize) -> Result<Device, RuntimeError> {
        let ctx = open_context(ordinal)?;
        let info = device_info(&ctx)?;
        let stream = no_panic("stream creation", || ctx.new_stream().map_err(|e| RuntimeError::cuda("cuStreamCreate", e, None)))?;
        let pool = Arc::new(Mutex::new(MemoryPool::new(Box::new(CudaAllocator { ctx: ctx.clone(), stream: stream.clone() }))));
        let (cubins, version) = assembler_from_env();
        let assembler = Assembler::for_device(info.compute_capability, &version);
        Ok(Device {
            inner: Arc::new(Inner {
                assembler,
                cubins,
                info,
                pool,
                kernels: Mutex::new(HashMap::new()),
                modules: Mutex::new(HashMap::new()),
                pending: Mutex::new(Vec::new()),
                stream,
                ctx,
            }),
        })
    }

    /// What the device is.
    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// What assembles PTX into machine code for this device (its architecture and the
    /// assembler's version, `ptxas`'s or `none`): the cubin cache's key ([`crate::cubin`]).
    pub fn assembler(&self) -> &Assembler {
        &self.inner.assembler
    }

    /// What makes machine code for the cubin cache on this device ([`assembler_from_env`]);
    /// [`CubinAssembler::Off`] when modules are JIT-compiled from PTX.
    pub fn cubin_assembler(&self) -> &CubinAssembler {
        &self.inner.cubins
    }

    pub(crate) fn ctx(&self) -> &Arc<CudaContext> {
        &self.inner.ctx
    }

    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.inner.stream
    }

    pub(crate) fn bind(&self) -> Result<(), RuntimeError> {
        self.inner.ctx.bind_to_thread().map_err(|e| RuntimeError::cuda("cuCtxSetCurrent", e, None))
    }

    /// A driver error of a stream operation, naming the kernels still pending (an earlier
    /// kernel's fault surfaces at the next stream operation).
    pub(crate) fn stream_error(&self, op: &str, e: DriverError) -> RuntimeError {
        let pending = lock(&self.inner.pending);
        let kernel = (!pending.is_empty()).then(|| pending.join(", "));
        RuntimeError::cuda(op, e, kernel)
    }

    pub(crate) fn note_pending(&self, name: &str) {
        let mut pending = lock(&self.inner.pending);
        if pending.len() == PENDING_NAMES {
            pending.remove(0);
        }
        pending.push(name.to_string());
    }

    /// Waits until everything queued on the device's stream has run.
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] with the driver's error name when queued work failed; its
    /// `kernel` lists the kernels launched since the last synchronisation (most recent last).
    pub fn synchronize(&self) -> Result<(), RuntimeError> {
        let r = self.inner.stream.synchronize();
        let out = r.map_err(|e| self.stream_error("synchronize", e));
        lock(&self.inner.pending).clear();
        out
    }

    // ---------------------------------------------------------------- kernels

    /// Loads `plan`'s PTX through the driver JIT (once per distinct PTX text) and looks up its
    /// entry point (once per entry); later calls with the same entry and PTX return the cached
    /// kernel.
    ///
    /// # Errors
    /// [`RuntimeError::InvalidLaunch`] when the plan's target needs a newer device than this
    /// one; [`RuntimeError::Jit`] with the JIT's log when the PTX does not compile or has no
    /// such entry.
    pub fn load(&self, plan: &LaunchPlan) -> Result<Arc<LoadedKernel>, RuntimeError> {
        self.load_hashed(plan, Sha256::digest(plan.ptx.as_bytes()).into())
    }

    /// [`Device::load`] of every plan, in order: the PTX digests (a model's plans hold
    /// megabytes of PTX) computed on every core first.
    ///
    /// # Errors
    /// As [`Device::load`], for the first plan that fails.
    pub fn load_all(&self, plans: &[LaunchPlan]) -> Result<Vec<Arc<LoadedKernel>>, RuntimeError> {
        let hashes = parallel_map(plans, all_cores(), |p| -> [u8; 32] { Sha256::digest(p.ptx.as_bytes()).into() });
        plans.iter().zip(hashes).map(|(p, h)| self.load_hashed(p, h)).collect()
    }

    fn load_hashed(&self, plan: &LaunchPlan, hash: [u8; 32]) -> Result<Arc<LoadedKernel>, RuntimeError> {
        let key = (plan.entry.clone(), hash);
        if let Some(k) = lock(&self.inner.kernels).get(&key) {
            return Ok(k.clone());
        }
        self.check_target(plan)?;
        let jit = |code: &str, log: String| RuntimeError::Jit { entry: plan.entry.clone(), code: code.to_string(), log };
        let module = {
            let cached = lock(&self.inner.modules).get(&hash).cloned();
            match cached {
                Some(m) => m,
                None => {
                    let m = Arc::new(self.load_module(&plan.ptx).map_err(|(code, log)| jit(&code, log))?);
                    lock(&self.inner.modules).insert(hash, m.clone());
                    m
                }
            }
        };
        let name = CString::new(plan.entry.as_str()).map_err(|_| jit("CUDA_ERROR_INVALID_VALUE", "the entry name contains a NUL byte".into()))?;
        self.bind()?;
        let mut func: sys::CUfunction = std::ptr::null_mut();
        // SAFETY: `module.raw` is a loaded module of the current context and `name` a valid
        // C string; the function handle lives as long as the module, which we keep.
        let r = unsafe { sys::cuModuleGetFunction(&mut func, module.raw, name.as_ptr()) }.result();
        if let Err(e) = r {
            return Err(jit(&format!("{:?}", e.0), format!("the PTX has no `.entry {}`", plan.entry)));
        }
        let attr = |a: CUfunction_attribute| -> Result<u32, RuntimeError> {
            // SAFETY: `func` is a valid function handle of the current context.
            unsafe { result::function::get_function_attribute(func, a) }
                .map(|v| v.max(0) as u32)
                .map_err(|e| RuntimeError::cuda("cuFuncGetAttribute", e, Some(plan.entry.clone())))
        };
        let cluster_size = if self.inner.info.compute_capability.0 >= 9 {
            attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_WIDTH)?.max(1)
                * attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_HEIGHT)?.max(1)
                * attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_REQUIRED_CLUSTER_DEPTH)?.max(1)
        } else {
            1
        };
        if cluster_size > PORTABLE_CLUSTER_SIZE {
            // SAFETY: `func` is a valid function handle of the current context.
            unsafe { result::function::set_function_attribute(func, CUfunction_attribute::CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1) }
                .map_err(|e| RuntimeError::cuda(format!("cuFuncSetAttribute(NON_PORTABLE_CLUSTER_SIZE_ALLOWED) for a cluster of {cluster_size} CTAs"), e, Some(plan.entry.clone())))?;
        }
        let attributes = KernelAttributes {
            cluster_size,
            registers: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
            local_bytes: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
            static_shared_bytes: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            max_threads_per_block: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK)?,
            ptx_version: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_PTX_VERSION)?,
            binary_version: attr(CUfunction_attribute::CU_FUNC_ATTRIBUTE_BINARY_VERSION)?,
        };
        let programmatic = programmatic_launch(self.inner.info.compute_capability, &plan.ptx);
        let kernel = Arc::new(LoadedKernel { entry: plan.entry.clone(), func, _module: module, dynamic_smem_limit: AtomicU32::new(DEFAULT_SHARED_LIMIT), attributes, programmatic });
        lock(&self.inner.kernels).insert(key, kernel.clone());
        Ok(kernel)
    }

    /// Refuses a plan whose target this device cannot run ([`sinter_ir::Target::runs_on`]).
    fn check_target(&self, plan: &LaunchPlan) -> Result<(), RuntimeError> {
        if !plan.target.runs_on(self.inner.info.compute_capability) {
            return Err(RuntimeError::InvalidLaunch {
                entry: plan.entry.clone(),
                reason: format!("compiled for {}, the device is {}", plan.target, self.inner.info.sm()),
            });
        }
        Ok(())
    }

    /// `cuModuleLoadDataEx` with error and info logs; errors are (CUDA error name, log).
    fn load_module(&self, ptx: &str) -> Result<Module, (String, String)> {
        let src = CString::new(ptx).map_err(|_| ("CUDA_ERROR_INVALID_PTX".to_string(), "the PTX text contains a NUL byte".to_string()))?;
        self.bind().map_err(|e| ("CUDA_ERROR_INVALID_CONTEXT".to_string(), e.to_string()))?;
        let mut err_log = vec![0u8; JIT_LOG_BYTES];
        let mut info_log = vec![0u8; JIT_LOG_BYTES];
        let mut options = [
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER,
            CUjit_option::CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES,
            CUjit_option::CU_JIT_INFO_LOG_BUFFER,
            CUjit_option::CU_JIT_INFO_LOG_BUFFER_SIZE_BYTES,
        ];
        // Sizes are passed as pointer-sized integers, as the driver API specifies.
        let mut values: [*mut c_void; 4] = [err_log.as_mut_ptr().cast(), JIT_LOG_BYTES as *mut c_void, info_log.as_mut_ptr().cast(), JIT_LOG_BYTES as *mut c_void];
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `src` is a NUL-terminated PTX image; the option arrays have 4 entries each
        // and the log buffers outlive the call with the sizes given.
        let r = no_panic("PTX loading", || {
            Ok(unsafe { sys::cuModuleLoadDataEx(&mut raw, src.as_ptr().cast(), options.len() as u32, options.as_mut_ptr(), values.as_mut_ptr()) }.result())
        })
        .map_err(|e| ("CUDA_ERROR_NOT_INITIALIZED".to_string(), e.to_string()))?;
        match r {
            Ok(()) => Ok(Module { raw, ctx: self.inner.ctx.clone() }),
            Err(e) => {
                let text = |buf: &[u8]| String::from_utf8_lossy(&buf[..buf.iter().position(|&b| b == 0).unwrap_or(buf.len())]).trim().to_string();
                let mut log = text(&err_log);
                if log.is_empty() {
                    log = e.error_string().ok().and_then(|s| s.to_str().ok().map(str::to_owned)).unwrap_or_default();
                }
                Err((format!("{:?}", e.0), log))
            }
        }
    }

    /// Enqueues `plan` on the device's stream with `buffers` (the kernel's inputs then outputs,
    /// as [`sinter_ir::KernelParam::Buffer`] counts them) and `bindings` for its symbols. Loads
    /// the kernel first if needed. Asynchronous: a fault while the kernel runs is reported by
    /// the next synchronising call.
    ///
    /// # Errors
    /// As [`Device::load`] and [`crate::launch::resolve`]; [`RuntimeError::InvalidLaunch`]
    /// when the shared memory asked for exceeds the device's opt-in limit;
    /// [`RuntimeError::Cuda`] (with the entry name) when the driver refuses the launch.
    pub fn launch(&self, plan: &LaunchPlan, buffers: &[&DeviceBuffer], bindings: &Bindings) -> Result<(), RuntimeError> {
        let kernel = self.load(plan)?;
        let ptrs: Vec<u64> = buffers.iter().map(|b| b.device_ptr()).collect();
        let resolved = resolve(plan, &ptrs, bindings)?;
        self.prepare_shared(&kernel, resolved.shared_bytes)?;
        self.enqueue(&kernel, &resolved)
    }

    /// Raises the kernel's dynamic shared memory limit when a launch needs more than 48 KiB.
    pub(crate) fn prepare_shared(&self, kernel: &LoadedKernel, bytes: u32) -> Result<(), RuntimeError> {
        if bytes <= kernel.dynamic_smem_limit.load(Ordering::Relaxed) {
            return Ok(());
        }
        let max = self.inner.info.max_shared_per_block_optin;
        if bytes > max {
            return Err(RuntimeError::InvalidLaunch { entry: kernel.entry.clone(), reason: format!("{bytes} bytes of dynamic shared memory, the device allows {max}") });
        }
        self.bind()?;
        let value = i32::try_from(bytes).unwrap_or(i32::MAX);
        // SAFETY: `kernel.func` is a valid function of the current context.
        unsafe { result::function::set_function_attribute(kernel.func, CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, value) }
            .map_err(|e| RuntimeError::cuda("cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)", e, Some(kernel.entry.clone())))?;
        kernel.dynamic_smem_limit.fetch_max(bytes, Ordering::Relaxed);
        Ok(())
    }

    /// `cuLaunchKernel` of a resolved launch on the device's stream (an argument is 8 bytes,
    /// a device pointer or an i64, or a 128-byte tensor map encoded here).
    pub(crate) fn enqueue(&self, kernel: &LoadedKernel, r: &ResolvedLaunch) -> Result<(), RuntimeError> {
        let mut words: Vec<u64> = Vec::with_capacity(r.args.len());
        let mut maps: Vec<sys::CUtensorMap> = Vec::new();
        for a in &r.args {
            match a {
                ArgValue::Ptr(p) => words.push(*p),
                ArgValue::I64(v) => words.push(*v as u64),
                ArgValue::TensorMap(t) => {
                    words.push(0);
                    maps.push(encode_tensor_map(t).map_err(|e| RuntimeError::cuda("cuTensorMapEncodeTiled", e, Some(kernel.entry.clone())))?);
                }
            }
        }
        let (mut wi, mut mi) = (words.iter_mut(), maps.iter_mut());
        let mut params: Vec<*mut c_void> = Vec::with_capacity(r.args.len());
        for a in &r.args {
            let p: Option<*mut c_void> = match a {
                ArgValue::TensorMap(_) => {
                    let _ = wi.next();
                    mi.next().map(|m| (m as *mut sys::CUtensorMap).cast())
                }
                _ => wi.next().map(|v| (v as *mut u64).cast()),
            };
            params.push(p.ok_or_else(|| RuntimeError::InvalidLaunch { entry: kernel.entry.clone(), reason: "argument storage".into() })?);
        }
        self.bind()?;
        // Both launches: `kernel.func` is a loaded function of this context; `params` points
        // at one value per kernel parameter (8 bytes, or a 64-byte-aligned 128-byte tensor
        // map), alive until the launch returns (the driver copies them). What the kernel does
        // with the addresses is the plan's contract.
        if kernel.programmatic {
            // SAFETY: as above; `attr` and `config` live until cuLaunchKernelEx returns.
            let r2 = unsafe {
                let mut attr: sys::CUlaunchAttribute = std::mem::zeroed();
                attr.id = sys::CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION;
                attr.value.programmaticStreamSerializationAllowed = 1;
                let config = sys::CUlaunchConfig {
                    gridDimX: r.grid[0],
                    gridDimY: r.grid[1],
                    gridDimZ: r.grid[2],
                    blockDimX: r.block[0],
                    blockDimY: r.block[1],
                    blockDimZ: r.block[2],
                    sharedMemBytes: r.shared_bytes,
                    hStream: self.inner.stream.cu_stream(),
                    attrs: &mut attr,
                    numAttrs: 1,
                };
                sys::cuLaunchKernelEx(&config, kernel.func, params.as_mut_ptr(), std::ptr::null_mut()).result()
            };
            r2.map_err(|e| RuntimeError::cuda("cuLaunchKernelEx (programmatic stream serialization)", e, Some(kernel.entry.clone())))?;
            self.note_pending(&kernel.entry);
            return Ok(());
        }
        // SAFETY: as above.
        let r2 = unsafe {
            result::launch_kernel(
                kernel.func,
                (r.grid[0], r.grid[1], r.grid[2]),
                (r.block[0], r.block[1], r.block[2]),
                r.shared_bytes,
                self.inner.stream.cu_stream(),
                &mut params,
            )
        };
        r2.map_err(|e| RuntimeError::cuda("cuLaunchKernel", e, Some(kernel.entry.clone())))?;
        self.note_pending(&kernel.entry);
        Ok(())
    }

    /// Loads the modules of `plans` (each distinct PTX once; those loaded already are
    /// skipped), through the cubin cache where there is one and an assembler
    /// ([`Device::cubin_assembler`], [`crate::cubin`]): a cached cubin for this device's
    /// architecture and assembler is loaded as it is; the others are assembled on `jobs`
    /// threads at once, stored, and loaded. A PTX the assembler refuses, or a cubin the driver
    /// will not load, is JIT-compiled from its PTX as [`Device::load`] does (whose error, with
    /// the JIT's log, is the one reported). Without an assembler the driver JIT-compiles each
    /// PTX, on `jobs` threads at once. Later [`Device::load`]s of these plans find their
    /// modules loaded.
    ///
    /// # Errors
    /// As [`Device::load`].
    pub fn load_modules(&self, plans: &[LaunchPlan], cache: Option<&KernelCache>, jobs: usize) -> Result<LoadStats, RuntimeError> {
        let mut stats = LoadStats::default();
        let mut todo: Vec<(&LaunchPlan, [u8; 32])> = Vec::new();
        let hashes = parallel_map(plans, jobs, |p| -> [u8; 32] { Sha256::digest(p.ptx.as_bytes()).into() });
        {
            let loaded = lock(&self.inner.modules);
            for (p, hash) in plans.iter().zip(hashes) {
                self.check_target(p)?;
                if !loaded.contains_key(&hash) && !todo.iter().any(|(_, h)| *h == hash) {
                    todo.push((p, hash));
                }
            }
        }
        if self.inner.cubins == CubinAssembler::Off {
            // The driver's PTX JIT, one module per thread (its own JIT cache keeps warm starts).
            let t = std::time::Instant::now();
            let modules = parallel_map(&todo, jobs, |(plan, _)| self.load_module(&plan.ptx).map_err(|(code, log)| RuntimeError::Jit { entry: plan.entry.clone(), code, log }));
            for ((_, hash), module) in todo.into_iter().zip(modules) {
                lock(&self.inner.modules).insert(hash, Arc::new(module?));
                stats.modules += 1;
                stats.ptx_jit += 1;
            }
            stats.load_seconds = t.elapsed().as_secs_f64();
            return Ok(stats);
        }
        let asm = &self.inner.assembler;
        let t = std::time::Instant::now();
        let lookups = parallel_map(&todo, jobs, |(p, _)| cache.map(|c| c.get_cubin(&p.ptx, asm)));
        let mut code: Vec<Option<Vec<u8>>> = lookups
            .into_iter()
            .map(|l| match l {
                Some(CubinLookup::Hit(bytes)) => Some(bytes),
                Some(CubinLookup::Corrupt { path, reason }) => {
                    stats.damaged.push(format!("{}: {reason}", path.display()));
                    None
                }
                Some(CubinLookup::Miss) | None => None,
            })
            .collect();
        stats.cache_seconds = t.elapsed().as_secs_f64();
        stats.cubin_hits = code.iter().flatten().count();
        let missing: Vec<usize> = (0..todo.len()).filter(|&i| code[i].is_none()).collect();
        let t = std::time::Instant::now();
        let assembled = parallel_map(&missing, jobs, |&i| {
            let ptx = &todo[i].0.ptx;
            let cubin = self.assemble(ptx).map_err(|e| format!("{}: {e}", todo[i].0.entry))?;
            if let Some(c) = cache {
                // A cache that cannot be written only costs the next run its assembly.
                let _ = c.put_cubin(ptx, asm, &cubin);
            }
            Ok::<_, String>(cubin)
        });
        stats.assembly_seconds = t.elapsed().as_secs_f64();
        for (i, cubin) in missing.into_iter().zip(assembled) {
            stats.assembled += usize::from(cubin.is_ok());
            code[i] = match cubin {
                Ok(c) => Some(c),
                Err(e) => {
                    if *self.cubin_assembler() != CubinAssembler::Off {
                        stats.assembly_failed.push(e);
                    }
                    None
                }
            };
        }
        let t = std::time::Instant::now();
        let work: Vec<(&LaunchPlan, Option<Vec<u8>>)> = todo.iter().map(|(p, _)| *p).zip(code).collect();
        let loaded = parallel_map(&work, jobs, |(plan, cubin)| {
            let mut note = None;
            if let Some(c) = cubin {
                match self.load_cubin(c) {
                    Ok(m) => return (Ok(m), false, None),
                    Err((code, log)) => note = Some(format!("the cubin of `{}` did not load ({code}: {log})", plan.entry)),
                }
            }
            (self.load_module(&plan.ptx).map_err(|(code, log)| RuntimeError::Jit { entry: plan.entry.clone(), code, log }), true, note)
        });
        for (((plan, hash), (module, jit, note)), (_, cubin)) in todo.into_iter().zip(loaded).zip(&work) {
            if let Some(n) = note {
                stats.damaged.push(n);
                if let (Some(c), Some(_)) = (cache, cubin) {
                    c.remove_cubin(&plan.ptx, asm);
                }
            }
            stats.ptx_jit += usize::from(jit);
            lock(&self.inner.modules).insert(hash, Arc::new(module?));
            stats.modules += 1;
        }
        stats.load_seconds = t.elapsed().as_secs_f64();
        Ok(stats)
    }

    /// Assembles `ptx` into a cubin for this device with its [`Device::cubin_assembler`]
    /// (`ptxas`), as bytes.
    ///
    /// # Errors
    /// [`RuntimeError::Jit`] (entry `""`) with the assembler's log when the PTX does not
    /// assemble, or code `NO_ASSEMBLER` when the device has none.
    pub fn assemble(&self, ptx: &str) -> Result<Vec<u8>, RuntimeError> {
        let r = match &self.inner.cubins {
            CubinAssembler::Ptxas(p) => ptxas_assemble(p, ptx, &self.inner.assembler.arch),
            CubinAssembler::Off => Err(("NO_ASSEMBLER".to_string(), "no ptxas was found (SINTER_PTXAS, $SINTER_CACHE/bin/ptxas, PATH) or SINTER_CUBIN=0".to_string())),
        };
        r.map_err(|(code, log)| RuntimeError::Jit { entry: String::new(), code, log })
    }

    /// `cuModuleLoadData` of a cubin (no JIT); errors are (CUDA error name, message).
    fn load_cubin(&self, cubin: &[u8]) -> Result<Module, (String, String)> {
        self.bind().map_err(|e| ("CUDA_ERROR_INVALID_CONTEXT".to_string(), e.to_string()))?;
        let mut raw: sys::CUmodule = std::ptr::null_mut();
        // SAFETY: `cubin` is a whole CUDA ELF image (made by `ptxas` or read from the cache,
        // and either way checked: headers and sections inside the buffer, `cubin::elf_problem`),
        // alive for the call; the driver copies what it keeps.
        let r = no_panic("cubin loading", || Ok(unsafe { sys::cuModuleLoadData(&mut raw, cubin.as_ptr().cast()) }.result()))
            .map_err(|e| ("CUDA_ERROR_NOT_INITIALIZED".to_string(), e.to_string()))?;
        match r {
            Ok(()) => Ok(Module { raw, ctx: self.inner.ctx.clone() }),
            Err(e) => Err((format!("{:?}", e.0), e.error_string().ok().and_then(|s| s.to_str().ok().map(str::to_owned)).unwrap_or_default())),
        }
    }

    // ---------------------------------------------------------------- memory

    /// A buffer of `dtype` × `shape` from the pool; its contents are undefined.
    ///
    /// # Errors
    /// [`RuntimeError::OutOfMemory`]; [`RuntimeError::Buffer`] when the size overflows.
    pub fn alloc(&self, dtype: DType, shape: &[usize]) -> Result<DeviceBuffer, RuntimeError> {
        self.alloc_with_guard(dtype, shape, 0)
    }

    /// A buffer of `dtype` × `shape` whose block has at least `guard_bytes` bytes past the
    /// extent (the guard tail), for checking that kernels write nothing past an output:
    /// [`Device::poison`] it before a launch and ask [`Device::guard_violation`] after.
    ///
    /// # Errors
    /// As [`Device::alloc`].
    pub fn alloc_with_guard(&self, dtype: DType, shape: &[usize], guard_bytes: usize) -> Result<DeviceBuffer, RuntimeError> {
        let len = byte_len(dtype, numel(shape)?)?;
        DeviceBuffer::allocate(&self.inner.pool, dtype, shape, len, guard_bytes)
    }

    /// Like [`Device::alloc_with_guard`], for a buffer whose extent is `len_bytes` (a strided
    /// layout may span more than the shape's element count).
    pub(crate) fn alloc_extent(&self, dtype: DType, shape: &[usize], len_bytes: usize, guard_bytes: usize) -> Result<DeviceBuffer, RuntimeError> {
        DeviceBuffer::allocate(&self.inner.pool, dtype, shape, len_bytes, guard_bytes)
    }

    /// A buffer of `dtype` × `shape` filled with zero bytes.
    ///
    /// # Errors
    /// As [`Device::alloc`], and [`RuntimeError::Cuda`] when the fill fails.
    pub fn alloc_zeroed(&self, dtype: DType, shape: &[usize]) -> Result<DeviceBuffer, RuntimeError> {
        let b = self.alloc(dtype, shape)?;
        self.fill(&b, 0, 0, b.len_bytes())?;
        self.synchronize()?;
        Ok(b)
    }

    fn fill(&self, buf: &DeviceBuffer, byte: u8, offset: usize, len: usize) -> Result<(), RuntimeError> {
        if len == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: [offset, offset + len) lies inside the buffer's block (callers pass ranges
        // within capacity_bytes), which this handle keeps alive.
        unsafe { result::memset_d8_async(buf.device_ptr() + offset as u64, byte, len, self.inner.stream.cu_stream()) }.map_err(|e| self.stream_error("cuMemsetD8Async", e))
    }

    /// Fills the whole block of `buf` — extent and guard tail — with `pattern` (stream
    /// ordered: before any later launch).
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] when the fill fails.
    pub fn poison(&self, buf: &DeviceBuffer, pattern: u8) -> Result<(), RuntimeError> {
        self.fill(buf, pattern, 0, buf.capacity_bytes())
    }

    /// Fills only the guard tail of `buf` (bytes past its extent) with `pattern`.
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] when the fill fails.
    pub fn poison_guard(&self, buf: &DeviceBuffer, pattern: u8) -> Result<(), RuntimeError> {
        self.fill(buf, pattern, buf.len_bytes(), buf.guard_bytes())
    }

    /// Waits for the stream, then reads `buf`'s guard tail: `None` when every byte still
    /// equals `pattern`, else where the first change is and how many bytes changed.
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] when the copy (or earlier queued work) fails.
    pub fn guard_violation(&self, buf: &DeviceBuffer, pattern: u8) -> Result<Option<GuardViolation>, RuntimeError> {
        let tail = self.read_range(buf, buf.len_bytes(), buf.guard_bytes())?;
        let mut changed = tail.iter().enumerate().filter(|(_, &b)| b != pattern);
        let Some((i, &found)) = changed.next() else { return Ok(None) };
        Ok(Some(GuardViolation { offset: buf.len_bytes() + i, found, expected: pattern, changed: 1 + changed.count() }))
    }

    fn read_range(&self, buf: &DeviceBuffer, offset: usize, len: usize) -> Result<Vec<u8>, RuntimeError> {
        let mut out = vec![0u8; len];
        if len > 0 {
            self.bind()?;
            // SAFETY: [offset, offset + len) lies inside the buffer's block; `out` has `len`
            // bytes and stays alive until the stream is synchronised below.
            unsafe { result::memcpy_dtoh_async(&mut out, buf.device_ptr() + offset as u64, self.inner.stream.cu_stream()) }.map_err(|e| self.stream_error("cuMemcpyDtoHAsync", e))?;
        }
        self.synchronize()?;
        Ok(out)
    }

    /// Copies `bytes` into `buf` (exactly its extent) and waits for the copy.
    ///
    /// # Errors
    /// [`RuntimeError::Buffer`] when the length differs from `buf.len_bytes()`;
    /// [`RuntimeError::Cuda`] when the copy (or earlier queued work) fails.
    pub fn write_bytes(&self, buf: &DeviceBuffer, bytes: &[u8]) -> Result<(), RuntimeError> {
        if bytes.len() != buf.len_bytes() {
            return Err(RuntimeError::Buffer(format!("{} bytes given for {buf:?}", bytes.len())));
        }
        if !bytes.is_empty() {
            self.bind()?;
            // SAFETY: the destination range is the buffer's extent; `bytes` outlives the
            // synchronisation below.
            unsafe { result::memcpy_htod_async(buf.device_ptr(), bytes, self.inner.stream.cu_stream()) }.map_err(|e| self.stream_error("cuMemcpyHtoDAsync", e))?;
        }
        self.synchronize()
    }

    /// Reads `buf`'s extent after the work queued before it has run.
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] when the copy (or earlier queued work) fails.
    pub fn read_bytes(&self, buf: &DeviceBuffer) -> Result<Vec<u8>, RuntimeError> {
        self.read_range(buf, 0, buf.len_bytes())
    }

    /// Copies `src`'s extent into `dst` (same byte length), stream ordered.
    ///
    /// # Errors
    /// [`RuntimeError::Buffer`] when the lengths differ; [`RuntimeError::Cuda`].
    pub fn copy(&self, dst: &DeviceBuffer, src: &DeviceBuffer) -> Result<(), RuntimeError> {
        if dst.len_bytes() != src.len_bytes() {
            return Err(RuntimeError::Buffer(format!("copy from {src:?} into {dst:?}: lengths differ")));
        }
        if src.len_bytes() == 0 {
            return Ok(());
        }
        self.bind()?;
        // SAFETY: both ranges are the buffers' extents, kept alive by the handles; the copy is
        // ordered on the stream like every other use.
        unsafe { result::memcpy_dtod_async(dst.device_ptr(), src.device_ptr(), src.len_bytes(), self.inner.stream.cu_stream()) }.map_err(|e| self.stream_error("cuMemcpyDtoDAsync", e))
    }

    /// A new buffer holding `bytes` as `dtype` × `shape`.
    ///
    /// # Errors
    /// [`RuntimeError::Buffer`] when the length does not match; as [`Device::alloc`] and
    /// [`Device::write_bytes`].
    pub fn upload_bytes(&self, dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<DeviceBuffer, RuntimeError> {
        let b = self.alloc(dtype, shape)?;
        self.write_bytes(&b, bytes)?;
        Ok(b)
    }

    /// A new buffer holding `values` rounded to `dtype` (as [`DType::round`] rounds; `bool` is
    /// `x != 0`).
    ///
    /// # Errors
    /// [`RuntimeError::Buffer`] when `values.len()` is not the element count of `shape`; as
    /// [`Device::upload_bytes`].
    pub fn upload_f64(&self, dtype: DType, shape: &[usize], values: &[f64]) -> Result<DeviceBuffer, RuntimeError> {
        check_len(shape, values.len())?;
        self.upload_bytes(dtype, shape, &codec::encode_f64(dtype, values))
    }

    /// A new buffer holding typed host elements (`half::bf16`, `half::f16`, `f32`, `i32`,
    /// `i64`, `bool`).
    ///
    /// # Errors
    /// As [`Device::upload_f64`].
    pub fn upload<T: Element>(&self, shape: &[usize], values: &[T]) -> Result<DeviceBuffer, RuntimeError> {
        check_len(shape, values.len())?;
        self.upload_bytes(T::DTYPE, shape, &codec::encode(values))
    }

    /// A new buffer holding an interpreter tensor (same dtype and shape).
    ///
    /// # Errors
    /// As [`Device::upload_f64`].
    pub fn upload_tensor(&self, t: &Tensor) -> Result<DeviceBuffer, RuntimeError> {
        self.upload_f64(t.dtype(), t.shape(), t.data())
    }

    /// Overwrites `buf` with `values` rounded to its dtype.
    ///
    /// # Errors
    /// [`RuntimeError::Buffer`] when the count differs; as [`Device::write_bytes`].
    pub fn write_f64(&self, buf: &DeviceBuffer, values: &[f64]) -> Result<(), RuntimeError> {
        check_len(buf.shape(), values.len())?;
        self.write_bytes(buf, &codec::encode_f64(buf.dtype(), values))
    }

    /// `buf`'s elements as `f64`s (exact for every dtype but `i64` beyond ±2⁵³).
    ///
    /// # Errors
    /// As [`Device::read_bytes`].
    pub fn download_f64(&self, buf: &DeviceBuffer) -> Result<Vec<f64>, RuntimeError> {
        codec::decode_f64(buf.dtype(), &self.read_bytes(buf)?)
    }

    /// Elements `first .. first + count` of `buf` (in memory order) as `f64`s: part of a
    /// tensor, e.g. the last row of a prefill's logits, without reading the rest.
    ///
    /// # Errors
    /// [`RuntimeError::Buffer`] when the range is not inside the buffer's elements; as
    /// [`Device::read_bytes`].
    pub fn download_range_f64(&self, buf: &DeviceBuffer, first: usize, count: usize) -> Result<Vec<f64>, RuntimeError> {
        if buf.dtype().is_quantized() {
            return Err(RuntimeError::Buffer(format!("a range of elements of the block-quantized {buf:?} cannot be read alone")));
        }
        let size = buf.dtype().size_bytes();
        let end = first.checked_add(count).filter(|&e| e <= buf.numel());
        let (Some(offset), Some(len), Some(_)) = (first.checked_mul(size), count.checked_mul(size), end) else {
            return Err(RuntimeError::Buffer(format!("elements {first}..{first}+{count} are not inside {buf:?}")));
        };
        codec::decode_f64(buf.dtype(), &self.read_range(buf, offset, len)?)
    }

    /// Fills `buf`'s extent with zero bytes (stream ordered: after the work queued before it,
    /// before any later launch; it does not wait).
    ///
    /// # Errors
    /// [`RuntimeError::Cuda`] when the fill fails.
    pub fn zero(&self, buf: &DeviceBuffer) -> Result<(), RuntimeError> {
        self.fill(buf, 0, 0, buf.len_bytes())
    }

    /// `buf`'s elements as typed host values.
    ///
    /// # Errors
    /// [`RuntimeError::Buffer`] when `T` is not `buf`'s dtype; as [`Device::read_bytes`].
    pub fn download<T: Element>(&self, buf: &DeviceBuffer) -> Result<Vec<T>, RuntimeError> {
        if T::DTYPE != buf.dtype() {
            return Err(RuntimeError::Buffer(format!("cannot read {buf:?} as {}", T::DTYPE)));
        }
        codec::decode(&self.read_bytes(buf)?)
    }

    /// `buf` as an interpreter tensor, to compare with the reference.
    ///
    /// # Errors
    /// As [`Device::download_f64`].
    pub fn download_tensor(&self, buf: &DeviceBuffer) -> Result<Tensor, RuntimeError> {
        let data = self.download_f64(buf)?;
        Tensor::new(buf.dtype(), buf.shape(), data).map_err(|e| RuntimeError::Buffer(e.to_string()))
    }

    /// The pool's counters.
    pub fn pool_stats(&self) -> PoolStats {
        lock(&self.inner.pool).stats()
    }

    /// Waits for the stream, then returns the pool's cached blocks to the driver; returns the
    /// bytes released.
    ///
    /// # Errors
    /// As [`Device::synchronize`].
    pub fn trim_pool(&self) -> Result<usize, RuntimeError> {
        self.synchronize()?;
        Ok(lock(&self.inner.pool).trim())
    }

    /// Free device memory as the driver reports it, in bytes.
    pub fn free_memory(&self) -> usize {
        lock(&self.inner.pool).free_memory()
    }
}

fn check_len(shape: &[usize], n: usize) -> Result<(), RuntimeError> {
    let want = numel(shape)?;
    if n != want {
        return Err(RuntimeError::Buffer(format!("shape {shape:?} has {want} elements, {n} values were given")));
    }
    Ok(())
}

/// Encodes a tiled TMA tensor map (CUDA Driver API `cuTensorMapEncodeTiled`): element strides
/// 1, no interleave, L2 promotion of 128 bytes, out-of-bounds elements read as zero. The
/// encoding is host-only (no context needed); `t` was checked by
/// [`crate::ResolvedTensorMap::check`].
///
/// # Errors
/// The driver's error (`CUDA_ERROR_INVALID_VALUE` for a map it rejects).
fn encode_tensor_map(t: &crate::ResolvedTensorMap) -> Result<sys::CUtensorMap, DriverError> {
    use sys::CUtensorMapDataType_enum as Ty;
    let ty = match t.dtype {
        DType::BF16 => Ty::CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        DType::F16 => Ty::CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
        DType::F32 => Ty::CU_TENSOR_MAP_DATA_TYPE_FLOAT32,
        _ => Ty::CU_TENSOR_MAP_DATA_TYPE_UINT8,
    };
    let swizzle = match t.swizzle {
        32 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_32B,
        64 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_64B,
        128 => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_128B,
        _ => sys::CUtensorMapSwizzle::CU_TENSOR_MAP_SWIZZLE_NONE,
    };
    let ones = [1u32; 5];
    let mut map = sys::CUtensorMap { opaque: [0; 16] };
    // SAFETY: every pointer is to a live array of at least `rank` (strides: rank − 1)
    // elements; the function writes only `map`.
    unsafe {
        sys::cuTensorMapEncodeTiled(
            &mut map,
            ty,
            t.dims.len() as u32,
            t.address as *mut c_void,
            t.dims.as_ptr(),
            t.strides.as_ptr(),
            t.box_dims.as_ptr(),
            ones.as_ptr(),
            sys::CUtensorMapInterleave::CU_TENSOR_MAP_INTERLEAVE_NONE,
            swizzle,
            sys::CUtensorMapL2promotion::CU_TENSOR_MAP_L2_PROMOTION_L2_128B,
            sys::CUtensorMapFloatOOBfill::CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        )
        .result()?;
    }
    Ok(map)
}
