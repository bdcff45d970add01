//! The CUDA backend: a graph lowered to a [`KernelGraph`] by `sinter-passes`, each kernel
//! compiled to PTX and a [`LaunchPlan`] by `sinter-codegen` (or taken from the on-disk kernel
//! cache), and run by `sinter-runtime`.
//!
//! **Kernel cache.** Every compiled kernel is stored under `$SINTER_CACHE/kernels`, keyed by
//! its family, its body's IR text, its buffers' types and layouts, the target, the PTX
//! version, the LLVM version and the sinter version. A build without the `llvm` feature
//! compiles nothing: it runs kernels from the cache (compiled earlier on a machine with LLVM
//! and carried over) and reports a missing one as [`Error::KernelNotCached`].

use std::collections::BTreeMap;
use std::time::Instant;

use sinter_ir::{Bindings, Graph, Kernel, KernelGraph, LaunchPlan};
use sinter_runtime::{CacheKey, Device, DeviceBuffer, Executor, KernelCache, Lookup, RuntimeError};

use crate::{Error, Tensor};

/// The PTX ISA version the code generator emits.
pub const PTX_VERSION: &str = "8.5";
/// The LLVM the code generator is built with (Debian's llvm-22-dev, TOOLCHAIN.md).
pub const LLVM_VERSION: &str = "22.1";

/// How a graph becomes kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lowering {
    /// One kernel per IR node (calls inlined): the baseline every fusion is checked against.
    Unfused,
    /// The e-graph passes: recognitions, fusion, extraction under the cost model.
    Fused,
}

/// What compiling a program's kernels took.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CompileStats {
    /// Kernels in the kernel graph.
    pub kernels: usize,
    /// Kernels found in the cache.
    pub cached: usize,
    /// Kernels compiled now (LLVM).
    pub built: usize,
    /// Wall time of lowering + code generation + loading, seconds.
    pub seconds: f64,
}

/// The cache key of one kernel (see the module docs).
pub fn kernel_key(kg: &KernelGraph, k: Kernel, target: &str) -> CacheKey {
    let kd = &kg.kernels[k];
    // The body's name carries the kernel's index: identical kernels (the same op in every
    // layer) must share one cache entry and one loaded module.
    let mut body = kd.body.clone();
    body.name = "kernel".into();
    for v in body.values.values_mut() {
        v.name = None;
    }
    let mut text = format!("family {:?}\n{}", kd.family, sinter_ir::text::print_function(&body));
    for &b in kd.inputs.iter().chain(&kd.outputs) {
        let bd = &kg.buffers[b];
        let strides: Vec<String> = bd.layout.strides.iter().map(|d| d.to_string()).collect();
        text.push_str(&format!("buffer {} strides [{}] align {}\n", bd.ty, strides.join(", "), bd.layout.align));
    }
    CacheKey::new(&text, "auto", target, PTX_VERSION, LLVM_VERSION)
}

#[cfg(feature = "llvm")]
fn build_plan(kg: &KernelGraph, k: Kernel, target: &str) -> Result<LaunchPlan, Error> {
    let t = sinter_codegen::Target::parse(target).map_err(|e| Error::Codegen(e.to_string()))?;
    sinter_codegen::compile_kernel(kg, k, &t).map_err(|e| Error::Codegen(format!("kernel {k} ({:?}): {e}", kg.kernels[k].family)))
}

#[cfg(not(feature = "llvm"))]
fn build_plan(kg: &KernelGraph, k: Kernel, target: &str) -> Result<LaunchPlan, Error> {
    Err(Error::KernelNotCached { kernel: format!("{k} ({:?})", kg.kernels[k].family), target: target.to_string() })
}

/// Compiles (or loads from `cache`) the launch plan of every kernel of `kg` for `target`.
///
/// # Errors
/// Code generation errors; [`Error::KernelNotCached`] in a build without LLVM.
pub fn plans(kg: &KernelGraph, target: &str, cache: &KernelCache, stats: &mut CompileStats) -> Result<Vec<LaunchPlan>, Error> {
    let mut out = Vec::with_capacity(kg.kernels.len());
    for k in kg.kernels.keys() {
        let key = kernel_key(kg, k, target);
        match cache.get(&key) {
            Lookup::Hit(plan) => {
                stats.cached += 1;
                out.push(plan);
            }
            Lookup::Miss | Lookup::Corrupt { .. } => {
                let plan = build_plan(kg, k, target)?;
                cache.put(&key, &plan)?;
                stats.built += 1;
                out.push(plan);
            }
        }
    }
    stats.kernels = kg.kernels.len();
    Ok(out)
}

/// Lowers `graph` to a kernel graph.
///
/// # Errors
/// [`Error::Passes`].
pub fn lower(graph: &Graph, lowering: Lowering) -> Result<KernelGraph, Error> {
    Ok(match lowering {
        Lowering::Unfused => sinter_passes::lower_unfused(graph)?,
        Lowering::Fused => sinter_passes::compile(graph, &sinter_passes::PassOptions::default())?.0,
    })
}

/// The target to generate code for on this device: `sm_90a` on Hopper, `sm_80` elsewhere
/// (sm_80 PTX runs on every later GPU through the driver's JIT).
pub fn target_for(device: &Device) -> &'static str {
    match device.info().compute_capability {
        (9, 0) => "sm_90a",
        _ => "sm_80",
    }
}

/// A graph compiled for the GPU, with its weights on the device.
pub struct GpuProgram {
    device: Device,
    exec: Executor,
    kg: KernelGraph,
    bound: BTreeMap<String, DeviceBuffer>,
    stats: CompileStats,
}

impl GpuProgram {
    /// Lowers `graph` (its entry function), compiles or loads every kernel, and loads them on
    /// `device`.
    ///
    /// # Errors
    /// Lowering, code generation, cache or driver errors.
    pub fn compile(graph: &Graph, device: &Device, lowering: Lowering) -> Result<GpuProgram, Error> {
        let t0 = Instant::now();
        let kg = lower(graph, lowering)?;
        let cache = KernelCache::open_default()?;
        let mut stats = CompileStats::default();
        let plans = plans(&kg, target_for(device), &cache, &mut stats)?;
        let mut exec = Executor::new(device, &kg, plans)?;
        // SINTER_POISON=1 fills every output with 0xFF bytes (NaN in every float dtype) before
        // each launch, so that an element a kernel forgets to write shows up in the tests.
        if std::env::var_os("SINTER_POISON").is_some() {
            exec = exec.with_output_guard(256, 0xFF);
        }
        stats.seconds = t0.elapsed().as_secs_f64();
        Ok(GpuProgram { device: device.clone(), exec, kg, bound: BTreeMap::new(), stats })
    }

    /// The kernel graph it runs.
    pub fn kernel_graph(&self) -> &KernelGraph {
        &self.kg
    }

    /// What compiling took.
    pub fn stats(&self) -> &CompileStats {
        &self.stats
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Uploads a parameter that stays on the device between runs (a weight).
    ///
    /// # Errors
    /// Out of device memory, driver errors.
    pub fn bind(&mut self, name: &str, t: &Tensor) -> Result<(), Error> {
        let buf = self.device.upload_tensor(t)?;
        self.bound.insert(name.to_string(), buf);
        Ok(())
    }

    /// Binds a parameter to a buffer already on the device (shared, not copied): one upload
    /// of the weights serves the prefill and the decode program.
    pub fn bind_buffer(&mut self, name: &str, buf: DeviceBuffer) {
        self.bound.insert(name.to_string(), buf);
    }

    /// Runs with host inputs (uploaded for this run) and the bound weights; returns the
    /// outputs on the host.
    ///
    /// # Errors
    /// Missing inputs, shape disagreements, driver errors.
    pub fn run(&self, inputs: &[(&str, &Tensor)], symbols: &Bindings) -> Result<Vec<Tensor>, Error> {
        let uploaded: Vec<(&str, DeviceBuffer)> = inputs.iter().map(|(n, t)| Ok((*n, self.device.upload_tensor(t)?))).collect::<Result<_, RuntimeError>>()?;
        let mut all: Vec<(&str, &DeviceBuffer)> = uploaded.iter().map(|(n, b)| (*n, b)).collect();
        for (n, b) in &self.bound {
            if !inputs.iter().any(|(m, _)| m == n) {
                all.push((n.as_str(), b));
            }
        }
        let outs = self.exec.run_named(&all, symbols)?;
        Ok(outs.iter().map(|b| self.device.download_tensor(b)).collect::<Result<Vec<_>, _>>()?)
    }

    /// Runs with device-resident inputs; returns device buffers (no host copies).
    ///
    /// # Errors
    /// As [`GpuProgram::run`].
    pub fn run_device(&self, inputs: &[(&str, &DeviceBuffer)], symbols: &Bindings) -> Result<Vec<DeviceBuffer>, Error> {
        let mut all: Vec<(&str, &DeviceBuffer)> = inputs.to_vec();
        for (n, b) in &self.bound {
            if !inputs.iter().any(|(m, _)| m == n) {
                all.push((n.as_str(), b));
            }
        }
        Ok(self.exec.run_named(&all, symbols)?)
    }

    /// The executor (for profiling and CUDA-graph capture).
    pub fn executor(&self) -> &Executor {
        &self.exec
    }
}
