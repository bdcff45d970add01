//! The CUDA backend: a graph lowered to a [`KernelGraph`] by `sinter-passes`, each kernel
//! compiled to PTX and a [`LaunchPlan`] by `sinter-codegen` (or taken from the on-disk kernel
//! cache), and run by `sinter-runtime`.
//!
//! **Kernel cache.** Every compiled kernel is stored under `$SINTER_CACHE/kernels`, keyed by
//! [`crate::cache_key::kernel_key`]. A build without the `llvm` feature
//! compiles nothing: it runs kernels from the cache (compiled earlier on a machine with LLVM
//! and carried over) and reports a missing one as [`Error::KernelNotCached`].

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::Instant;

use rayon::prelude::*;
use sinter_ir::{Bindings, Graph, Kernel, KernelGraph, LaunchPlan, Target};
use sinter_runtime::{CapturedGraph, Device, DeviceBuffer, Executor, KernelCache, Lookup, Profile, RuntimeError};

use crate::cache_key::kernel_key;
use crate::{Error, Tensor};

pub mod fold;
pub mod lowering_cache;
pub mod ptx;

pub use fold::FoldCache;

pub use ptx::{compile_ptx, compile_ptx_with, CompiledPtx, KernelBuffer, PtxKernel, WrittenPtx};

/// How a graph becomes kernels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lowering {
    /// One kernel per IR node (calls inlined): the baseline every fusion is checked against.
    Unfused,
    /// The e-graph passes: recognitions, fusion, extraction under the cost model of
    /// `PassOptions::for_graph` (decode sizes for a graph with `paged_attention`).
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
    /// Of which kernels whose cache entry was damaged (rebuilt and stored over it).
    pub rebuilt: usize,
    /// Kernels whose schedule candidates were timed now ([`crate::tune::autotune`]).
    pub tuned_now: usize,
    /// Kernels running the candidate a timing record chose rather than the default schedule.
    pub tuned: usize,
    /// Threads that generated the `built` kernels ([`jobs`], at most one per kernel).
    pub jobs: usize,
    /// Whether the kernel graph came from the lowering cache ([`crate::lowering_cache`])
    /// rather than from running the passes.
    pub lowering_cached: bool,
    /// Distinct modules loaded on the device (one per distinct PTX).
    pub modules: usize,
    /// Of which loaded from a cubin of the kernel cache ([`sinter_runtime::cubin`]).
    pub cubins_cached: usize,
    /// Cubins assembled by the code generation's workers, each right after its kernel's PTX
    /// (and stored in the cache).
    pub assembled_in_codegen: usize,
    /// Cubins assembled after code generation, when the modules are loaded (the kernels whose
    /// plans came from the cache without a cubin for this device), and stored.
    pub assembled: usize,
    /// Modules JIT-compiled from PTX (no cubin could be had or loaded).
    pub ptx_jit: usize,
    /// Cubin entries refused (damaged, or made for another architecture or assembler) or
    /// refused by the driver, with what was wrong: assembled again and rewritten.
    pub cubins_damaged: Vec<String>,
    /// Kernels `ptxas` could not assemble (JIT-compiled instead), with its message.
    pub assembly_failed: Vec<String>,
    /// Wall time of lowering + code generation + assembly + cache reads + loading, seconds.
    pub seconds: f64,
    /// Of which lowering the graph to kernels (the e-graph passes, or reading the lowering
    /// cache), seconds.
    pub lower_seconds: f64,
    /// Of which generating the `built` kernels (LLVM, on `jobs` threads, each worker also
    /// assembling the cubins of its kernels when compiling for a device): the cold compile,
    /// seconds.
    pub build_seconds: f64,
    /// Of which reading the `cached` kernels' plans and the cubins from the kernel cache,
    /// seconds.
    pub cache_seconds: f64,
    /// Of which assembling, after code generation, the cubins of kernels that were not
    /// generated now (`ptxas`, on several threads), seconds.
    pub assembly_seconds: f64,
    /// Thread time the code generation's workers spent assembling the cubins of the kernels
    /// they generated, each right after its PTX (summed over the workers; within
    /// `build_seconds`), seconds.
    pub assembly_in_codegen_seconds: f64,
    /// Of which loading the modules on the device (cubins; the PTX JIT for `ptx_jit`), seconds.
    pub load_seconds: f64,
    /// Kernels per decoder layer as the fusion report counts them (`None` for the unfused
    /// lowering, which makes no report, or a graph without layers).
    pub kernels_per_layer: Option<usize>,
}

/// The stack, in bytes, of a thread that generates kernels: the code generator's element
/// evaluator recurses through a kernel's operands, up to 2 048 deep (a deeper expression is
/// its error), at up to ~30 KiB a level in an unoptimised build. Only touched pages are
/// committed.
pub(crate) const CODEGEN_STACK_BYTES: usize = 256 << 20;

/// `k12 (Matmul)`, or `k12 (not in the graph)`, for messages.
fn kernel_label(kg: &KernelGraph, k: Kernel) -> String {
    match kg.kernels.get(k) {
        Some(kd) => format!("{k} ({:?})", kd.family),
        None => format!("{k} (not in the graph)"),
    }
}

#[cfg(feature = "llvm")]
fn build_plan(kg: &KernelGraph, k: Kernel, target: &Target) -> Result<LaunchPlan, Error> {
    sinter_codegen::compile_kernel(kg, k, target).map_err(|e| {
        // Most code generator errors name the kernel already.
        let (label, msg) = (format!("kernel {}", kernel_label(kg, k)), e.to_string());
        Error::Codegen(if msg.starts_with(&label) { msg } else { format!("{label}: {msg}") })
    })
}

#[cfg(not(feature = "llvm"))]
fn build_plan(kg: &KernelGraph, k: Kernel, target: &Target) -> Result<LaunchPlan, Error> {
    Err(Error::KernelNotCached { kernel: kernel_label(kg, k), target: target.to_string() })
}

/// The persistent kernel of `kg` for `target` ([`sinter_codegen::persistent`]): each
/// distinct kernel (by its cache key) built once as a task function, on the code generator's
/// stack.
///
/// # Errors
/// [`Error::Codegen`] naming a kernel that cannot be a task or does not compile.
#[cfg(feature = "llvm")]
pub fn persistent_program(kg: &KernelGraph, target: &Target) -> Result<sinter_ir::kernel::persistent::PersistentProgram, Error> {
    on_codegen_stack(|| {
        let mut first: HashMap<String, usize> = HashMap::new();
        let mut built: Vec<(String, LaunchPlan)> = Vec::new();
        let mut which = Vec::with_capacity(kg.kernels.len());
        for k in kg.kernels.keys() {
            let digest = crate::cache_key::kernel_key(kg, k, target).digest();
            let i = match first.get(&digest) {
                Some(&i) => i,
                None => {
                    built.push(sinter_codegen::persistent::kernel_ir(kg, k, target).map_err(|e| Error::Codegen(format!("kernel {}: {e}", kernel_label(kg, k))))?);
                    first.insert(digest, built.len() - 1);
                    built.len() - 1
                }
            };
            which.push(i);
        }
        let kernels: Vec<(String, LaunchPlan)> = which.iter().map(|&i| built[i].clone()).collect();
        // `SINTER_PERSISTENT_MIN_CTAS`: CTAs an SM the registers must allow (experiments).
        let min_ctas = std::env::var("SINTER_PERSISTENT_MIN_CTAS").ok().and_then(|v| v.parse().ok()).unwrap_or(sinter_codegen::persistent::MIN_CTAS_PER_SM);
        Ok(sinter_codegen::persistent::build_with(&kernels, target, min_ctas).map_err(|e| Error::Codegen(format!("the persistent kernel: {e}")))?.program)
    })
}

/// [`persistent_program`] in a build without LLVM: the persistent kernel is not cached.
///
/// # Errors
/// Always [`Error::Unsupported`].
#[cfg(not(feature = "llvm"))]
pub fn persistent_program(_: &KernelGraph, _: &Target) -> Result<sinter_ir::kernel::persistent::PersistentProgram, Error> {
    Err(Error::Unsupported("the persistent decode kernel needs a build with LLVM".into()))
}

/// Worker threads for code generation and assembly: `SINTER_JOBS` when it is a positive
/// integer, else the machine's available parallelism (1 where that cannot be known).
pub fn jobs() -> usize {
    std::env::var("SINTER_JOBS")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map(usize::from).unwrap_or(1))
}

/// Compiles (or loads from `cache`) the launch plan of every kernel of `kg` for `target`.
///
/// # Errors
/// Code generation errors; [`Error::KernelNotCached`] in a build without LLVM.
pub fn plans(kg: &KernelGraph, target: &Target, cache: &KernelCache, stats: &mut CompileStats) -> Result<Vec<LaunchPlan>, Error> {
    plans_with_progress(kg, target, cache, stats, &mut |_, _| {})
}

/// [`plans`], calling `progress(done, total)` as kernels are found or built.
///
/// # Errors
/// As [`plans`].
pub fn plans_with_progress(kg: &KernelGraph, target: &Target, cache: &KernelCache, stats: &mut CompileStats, progress: &mut dyn FnMut(usize, usize)) -> Result<Vec<LaunchPlan>, Error> {
    plans_for_device(kg, target, cache, stats, progress, None, jobs())
}

/// [`plans_with_progress`] with the kernels that are not cached generated on `jobs` threads (each
/// generates whole kernels, one LLVM context per kernel). The plans do not depend on `jobs`:
/// each distinct kernel is generated once, by the first kernel of the graph that has its
/// cache key, whichever thread runs it.
///
/// # Errors
/// As [`plans`]; when several kernels fail, the first one's error in launch order.
pub fn plans_with_jobs(kg: &KernelGraph, target: &Target, cache: &KernelCache, stats: &mut CompileStats, jobs: usize, progress: &mut dyn FnMut(usize, usize)) -> Result<Vec<LaunchPlan>, Error> {
    plans_for_device(kg, target, cache, stats, progress, None, jobs)
}

/// With a device, each kernel's cubin assembled by the worker that generated its PTX, right
/// after it, and stored in the kernel cache (`Device::load_modules` then finds it there): the
/// two phases overlap instead of following each other. A cubin that cannot be made or stored
/// here is made, or the PTX JIT-compiled, when the modules are loaded.
struct Assembly<'d> {
    device: Option<&'d Device>,
    /// Cubins assembled and stored.
    cubins: AtomicUsize,
    /// Thread time spent assembling, nanoseconds (summed over the workers).
    nanos: AtomicU64,
}

impl Assembly<'_> {
    fn run(&self, ptx: &str, cache: &KernelCache) {
        let Some(dev) = self.device.filter(|d| *d.cubin_assembler() != sinter_runtime::cubin::CubinAssembler::Off) else { return };
        let t = Instant::now();
        if dev.assemble(ptx).is_ok_and(|cubin| cache.put_cubin(ptx, dev.assembler(), &cubin).is_ok()) {
            self.cubins.fetch_add(1, Ordering::Relaxed);
        }
        self.nanos.fetch_add(u64::try_from(t.elapsed().as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

/// A kernel to generate: its key, the cache's verdict on it and the kernels that share it.
struct ToBuild {
    key: sinter_runtime::CacheKey,
    found: Lookup,
    kernels: Vec<usize>,
}

/// [`plans_with_progress`] on `jobs` threads; with `device` (its name), a kernel that has a
/// timing record made on a device of that name runs the record's winner ([`crate::tune`]).
/// `progress(done, total)` counts the kernels whose plan is known, across the workers.
fn plans_for_device(kg: &KernelGraph, target: &Target, cache: &KernelCache, stats: &mut CompileStats, progress: &mut dyn FnMut(usize, usize), device: Option<&Device>, jobs: usize) -> Result<Vec<LaunchPlan>, Error> {
    let total = kg.kernels.len();
    let name = device.map(|d| d.info().name.clone());
    let mut out: Vec<Option<LaunchPlan>> = vec![None; total];
    let mut todo: Vec<ToBuild> = Vec::new();
    // Digest → the plan found in the cache, or the index in `todo` of the kernel to build.
    let mut seen: HashMap<String, Result<LaunchPlan, usize>> = HashMap::new();
    let mut done = 0;
    // Every kernel's timing-record plan (tunable kernels on a named device) or cache key, then
    // each distinct key's cache entry: on every core, as a warm start spends its time here.
    let t0 = Instant::now();
    let ks: Vec<Kernel> = kg.kernels.keys().collect();
    let found: Vec<Result<LaunchPlan, (sinter_runtime::CacheKey, String)>> = ks
        .par_iter()
        .map(|&k| match name.as_deref().filter(|_| crate::tune::tunable(kg, k)).and_then(|d| crate::tune::tuned_plan(kg, k, target, cache, d)) {
            Some((_, plan)) => Ok(plan),
            None => {
                let key = kernel_key(kg, k, target);
                let digest = key.digest();
                Err((key, digest))
            }
        })
        .collect();
    let mut distinct: Vec<&sinter_runtime::CacheKey> = Vec::new();
    let mut first: HashMap<&str, usize> = HashMap::new();
    for (key, digest) in found.iter().filter_map(|f| f.as_ref().err()) {
        first.entry(digest.as_str()).or_insert_with(|| {
            distinct.push(key);
            distinct.len() - 1
        });
    }
    let mut lookups: Vec<Option<Lookup>> = distinct.par_iter().map(|key| Some(cache.get(key))).collect();
    stats.cache_seconds += t0.elapsed().as_secs_f64();
    for (i, f) in found.iter().enumerate() {
        let (key, digest) = match f {
            Ok(plan) => {
                stats.cached += 1;
                stats.tuned += 1;
                out[i] = Some(plan.clone());
                done += 1;
                progress(done, total);
                continue;
            }
            Err(kd) => kd,
        };
        match seen.get(digest) {
            Some(Ok(plan)) => {
                stats.cached += 1;
                out[i] = Some(plan.clone());
                done += 1;
                progress(done, total);
                continue;
            }
            Some(Err(j)) => {
                // The same kernel as one being built (another layer's): it counts as cached,
                // as it did when the first one's entry was written before it was looked up.
                todo[*j].kernels.push(i);
                continue;
            }
            None => {}
        }
        let entry = lookups[first[digest.as_str()]].take().unwrap_or(Lookup::Miss);
        if let Lookup::Hit(plan) = entry {
            stats.cached += 1;
            seen.insert(digest.clone(), Ok(plan.clone()));
            out[i] = Some(plan);
            done += 1;
            progress(done, total);
        } else {
            seen.insert(digest.clone(), Err(todo.len()));
            todo.push(ToBuild { key: key.clone(), found: entry, kernels: vec![i] });
        }
    }
    let t1 = Instant::now();
    let keys = ks;
    let assembly = Assembly { device, cubins: AtomicUsize::new(0), nanos: AtomicU64::new(0) };
    let built = build_all(kg, target, cache, &todo, &keys, jobs, &assembly, &mut |n| {
        done += n;
        progress(done, total);
    });
    stats.assembled_in_codegen += assembly.cubins.load(Ordering::Relaxed);
    stats.assembly_in_codegen_seconds += assembly.nanos.load(Ordering::Relaxed) as f64 * 1e-9;
    // The first failure in launch order (every kernel before it was taken by a worker, and
    // finished, before it): the same error whatever the thread count.
    let first_err = built.iter().position(|r| matches!(r, Some(Err(_))));
    for (j, (tb, r)) in todo.iter().zip(built).enumerate() {
        if first_err.is_some_and(|f| j < f) {
            continue;
        }
        let Some(r) = r else { continue };
        let plan = r.map_err(|e| match (e, &tb.found) {
            (Error::KernelNotCached { kernel, target }, Lookup::Corrupt { path, reason }) => Error::KernelCacheDamaged { kernel, target, path: path.display().to_string(), reason: reason.clone() },
            (e, _) => e,
        })?;
        if matches!(tb.found, Lookup::Corrupt { .. }) {
            stats.rebuilt += 1;
        }
        stats.built += 1;
        stats.cached += tb.kernels.len() - 1;
        for &i in &tb.kernels {
            out[i] = Some(plan.clone());
        }
    }
    stats.build_seconds += t1.elapsed().as_secs_f64();
    stats.kernels = total;
    stats.jobs = jobs.clamp(1, todo.len().max(1));
    Ok(out.into_iter().flatten().collect())
}

/// Generates (and stores in `cache`) the plan of each of `todo` on up to `jobs` threads,
/// results in `todo`'s order; calls `finished(kernels)` on this thread as each is done, with
/// the number of the graph's kernels it serves. After a failure the workers start no kernel
/// after it in `todo`'s order: those not generated are `None`.
fn build_all(kg: &KernelGraph, target: &Target, cache: &KernelCache, todo: &[ToBuild], keys: &[Kernel], jobs: usize, assembly: &Assembly, finished: &mut dyn FnMut(usize)) -> Vec<Option<Result<LaunchPlan, Error>>> {
    let build = |tb: &ToBuild| -> Result<LaunchPlan, Error> {
        let plan = build_plan(kg, keys[tb.kernels[0]], target)?;
        cache.put(&tb.key, &plan)?;
        assembly.run(&plan.ptx, cache);
        Ok(plan)
    };
    let workers = jobs.clamp(1, todo.len().max(1));
    let mut results: Vec<Option<Result<LaunchPlan, Error>>> = std::iter::repeat_with(|| None).take(todo.len()).collect();
    if workers == 1 {
        for (j, tb) in todo.iter().enumerate() {
            let r = on_codegen_stack(|| build(tb));
            finished(tb.kernels.len());
            let failed = r.is_err();
            results[j] = Some(r);
            if failed {
                break;
            }
        }
    } else {
        // Workers take the kernels longest first (by family: attention, then matmul, then
        // reductions), so that no long kernel starts last and runs alone. After a failure no
        // kernel after it in `todo`'s order starts: every kernel before the first failure is
        // still generated, so the error reported is the same whatever the thread count.
        let order = longest_first(kg, keys, todo);
        let next = AtomicUsize::new(0);
        let failed_at = AtomicUsize::new(usize::MAX);
        let (tx, rx) = mpsc::channel::<(usize, Result<LaunchPlan, Error>)>();
        let work = |tx: mpsc::Sender<(usize, Result<LaunchPlan, Error>)>| loop {
            let Some(&j) = order.get(next.fetch_add(1, Ordering::Relaxed)) else { break };
            if j > failed_at.load(Ordering::Relaxed) {
                continue;
            }
            let r = build(&todo[j]);
            if r.is_err() {
                failed_at.fetch_min(j, Ordering::Relaxed);
            }
            if tx.send((j, r)).is_err() {
                break;
            }
        };
        std::thread::scope(|s| {
            let mut spawned = 0;
            for _ in 0..workers {
                let tx = tx.clone();
                let work = &work;
                if std::thread::Builder::new().stack_size(crate::gpu::CODEGEN_STACK_BYTES).spawn_scoped(s, move || work(tx)).is_ok() {
                    spawned += 1;
                }
            }
            if spawned == 0 {
                // No thread could be started (out of memory for stacks): generate here.
                work(tx.clone());
            }
            drop(tx);
            // The progress callback is not `Send`: the workers report here, in the order they
            // finish.
            for (j, r) in rx {
                finished(todo[j].kernels.len());
                results[j] = Some(r);
            }
        });
    }
    results
}

/// Runs `f` on a thread with the code generator's stack ([`crate::gpu::CODEGEN_STACK_BYTES`]), or
/// here when no such thread can be started.
pub(crate) fn on_codegen_stack<T: Send>(f: impl FnOnce() -> T + Send) -> T {
    let cell = std::sync::Mutex::new(Some(f));
    let take = || cell.lock().unwrap_or_else(std::sync::PoisonError::into_inner).take();
    let spawned = std::thread::scope(|s| {
        let h = std::thread::Builder::new().stack_size(crate::gpu::CODEGEN_STACK_BYTES).spawn_scoped(s, || take().map(|f| f())).ok()?;
        Some(h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
    });
    match spawned.flatten() {
        Some(t) => t,
        None => match take() {
            Some(f) => f(),
            None => unreachable!("the spawned thread took the closure and returned its result"),
        },
    }
}

/// The indices of `todo` with the kernels that take longest to generate and assemble first:
/// attention, then matmul, then row reductions, then the rest, each in `todo`'s order.
fn longest_first(kg: &KernelGraph, keys: &[Kernel], todo: &[ToBuild]) -> Vec<usize> {
    use sinter_ir::Family;
    let family = |tb: &ToBuild| tb.kernels.first().and_then(|&i| keys.get(i)).and_then(|&k| kg.kernels.get(k)).map(|kd| kd.family);
    let rank = |tb: &ToBuild| match family(tb) {
        Some(Family::Attention | Family::PagedAttention) => 0,
        Some(Family::Matmul) => 1,
        Some(Family::RowReduction) => 2,
        _ => 3,
    };
    let mut order: Vec<usize> = (0..todo.len()).collect();
    order.sort_by_key(|&j| (rank(&todo[j]), j));
    order
}

/// Lowers `graph` to a kernel graph whose kernels the code generator builds for `target`.
///
/// # Errors
/// [`Error::Passes`].
pub fn lower(graph: &Graph, lowering: Lowering, target: &Target) -> Result<KernelGraph, Error> {
    Ok(lower_counting(graph, lowering, target, &pass_options(graph, None))?.0)
}

/// [`lower`] through the lowering cache in `cache` (a folder of its own, such as
/// [`lowering_cache::default_dir`]): the kernel graph stored for this graph, lowering,
/// options and target when there is one, else the passes' (then stored); with the kernels per
/// decoder layer of the fusion report (`None` for the unfused lowering) and whether it came
/// from the cache. Without a cache, the passes run.
///
/// # Errors
/// [`Error::Passes`].
pub fn lower_with_cache(graph: &Graph, lowering: Lowering, target: &Target, cache: Option<&KernelCache>) -> Result<(KernelGraph, Option<usize>, bool), Error> {
    lower_with_weights(graph, lowering, target, cache, None)
}

/// [`lower_with_cache`] with the graph's weights named (`None`: guessed,
/// [`sinter_passes::hoist::infer_weights`]): work that depends only on them and on constants
/// is hoisted into kernels that [`GpuProgram::fold_bound`] runs once.
///
/// # Errors
/// [`Error::Passes`].
pub fn lower_with_weights(graph: &Graph, lowering: Lowering, target: &Target, cache: Option<&KernelCache>, weights: Option<&BTreeSet<String>>) -> Result<(KernelGraph, Option<usize>, bool), Error> {
    let options = pass_options(graph, weights);
    lowering_cache::lower_cached(graph, lowering, target, cache, &options, || lower_counting(graph, lowering, target, &options))
}

/// The pass options the GPU backend lowers `graph` with: [`sinter_passes::PassOptions::for_graph`]
/// with the weights named — left to the guess when they are what it guesses, so that a
/// lowering cached without names (`sinter precompile` of a graph file) serves an engine that
/// names them.
pub fn pass_options(graph: &Graph, weights: Option<&BTreeSet<String>>) -> sinter_passes::PassOptions {
    let weights = weights.filter(|w| **w != sinter_passes::hoist::weight_names(graph, None)).cloned();
    sinter_passes::PassOptions { weights, ..sinter_passes::PassOptions::for_graph(graph) }
}

/// [`lower`], with the kernels per decoder layer the fusion report counts
/// ([`sinter_passes::FusionReport::layers`]: the most common kind of layer).
fn lower_counting(graph: &Graph, lowering: Lowering, target: &Target, options: &sinter_passes::PassOptions) -> Result<(KernelGraph, Option<usize>), Error> {
    Ok(match lowering {
        Lowering::Unfused => (sinter_passes::lower_unfused(graph)?, None),
        Lowering::Fused => {
            let (kg, report) = sinter_passes::compile(graph, target, options)?;
            let per_layer = report.layers().and_then(|l| l.typical());
            (kg, per_layer)
        }
    })
}

/// The target to generate code for on this device: `sm_90a` on Hopper, `sm_80` elsewhere
/// (sm_80 PTX runs on every later GPU through the driver's JIT).
pub fn target_for(device: &Device) -> Target {
    match device.info().compute_capability {
        (9, 0) => Target::SM_90A,
        _ => Target::SM_80,
    }
}

/// A graph compiled for the GPU, with its weights on the device.
pub struct GpuProgram {
    device: Device,
    exec: Executor,
    kg: KernelGraph,
    bound: BTreeMap<String, DeviceBuffer>,
    stats: CompileStats,
    /// The weights the passes hoisted work on (named or guessed).
    weights: BTreeSet<String>,
    /// The program before [`GpuProgram::fold_bound`] dropped its load-time kernels, for a run
    /// given (or a rebinding of) a weight they read; `None` until something folds.
    unfolded: Option<Box<(KernelGraph, Executor)>>,
    /// The bound names the folded kernels read.
    folded_reads: BTreeSet<String>,
    /// The persistent kernel of `kg`, or why it could not be built
    /// ([`GpuProgram::capture_persistent_device`]), once tried; reset when `kg` changes.
    persistent: std::sync::OnceLock<Result<std::sync::Arc<sinter_ir::kernel::persistent::PersistentProgram>, String>>,
}

impl GpuProgram {
    /// Lowers `graph` (its entry function), compiles or loads every kernel, and loads them on
    /// `device`.
    ///
    /// # Errors
    /// Lowering, code generation, cache or driver errors.
    pub fn compile(graph: &Graph, device: &Device, lowering: Lowering) -> Result<GpuProgram, Error> {
        GpuProgram::compile_with_progress(graph, device, lowering, &mut |_, _| {})
    }

    /// [`GpuProgram::compile`], calling `progress(done, total)` once before lowering (with
    /// `total` 0: the kernel count is not known yet) and after each kernel's plan is found or
    /// built.
    ///
    /// # Errors
    /// As [`GpuProgram::compile`].
    pub fn compile_with_progress(graph: &Graph, device: &Device, lowering: Lowering, progress: &mut dyn FnMut(usize, usize)) -> Result<GpuProgram, Error> {
        GpuProgram::compile_with_options(graph, device, lowering, crate::tune::from_env(), progress)
    }

    /// [`GpuProgram::compile_with_progress`]; with `autotune`, the schedule candidates of
    /// every tunable kernel without a timing record for this device are timed first and the
    /// winners kept in the kernel cache ([`crate::tune`]; `compile_with_progress` takes
    /// `autotune` from `SINTER_AUTOTUNE=1`). Either way a kernel with such a record runs its
    /// winner.
    ///
    /// # Errors
    /// As [`GpuProgram::compile`]; driver errors while timing.
    pub fn compile_with_options(graph: &Graph, device: &Device, lowering: Lowering, autotune: bool, progress: &mut dyn FnMut(usize, usize)) -> Result<GpuProgram, Error> {
        GpuProgram::compile_full(graph, device, lowering, autotune, None, progress)
    }

    /// [`GpuProgram::compile_with_progress`] with the graph's weights named (the parameters
    /// bound once: [`sinter_passes::PassOptions::weights`]), so that the work that depends only
    /// on them and on constants is hoisted into kernels [`GpuProgram::fold_bound`] runs once.
    ///
    /// # Errors
    /// As [`GpuProgram::compile`].
    pub fn compile_with_weights(graph: &Graph, device: &Device, lowering: Lowering, weights: &BTreeSet<String>, progress: &mut dyn FnMut(usize, usize)) -> Result<GpuProgram, Error> {
        GpuProgram::compile_full(graph, device, lowering, crate::tune::from_env(), Some(weights), progress)
    }

    fn compile_full(graph: &Graph, device: &Device, lowering: Lowering, autotune: bool, weights: Option<&BTreeSet<String>>, progress: &mut dyn FnMut(usize, usize)) -> Result<GpuProgram, Error> {
        let t0 = Instant::now();
        progress(0, 0);
        let target = target_for(device);
        let cache = KernelCache::open_default()?;
        // The lowering cache is an optimisation: without its folder the passes run.
        let lowerings = lowering_cache::default_dir().ok().and_then(|d| KernelCache::new(d).ok());
        let (kg, per_layer, lowering_cached) = lower_with_weights(graph, lowering, &target, lowerings.as_ref(), weights)?;
        let mut stats = CompileStats { lower_seconds: t0.elapsed().as_secs_f64(), kernels_per_layer: per_layer, lowering_cached, ..CompileStats::default() };
        if autotune {
            stats.tuned_now = crate::tune::autotune(&kg, &target, &cache, device)?.len();
        }
        let jobs = jobs();
        let plans = plans_for_device(&kg, &target, &cache, &mut stats, progress, Some(device), jobs)?;
        // Every distinct module, from the cubins of the cache or assembled now on `jobs`
        // threads; the executor then finds them loaded.
        let loaded = device.load_modules(&plans, Some(&cache), jobs)?;
        stats.modules = loaded.modules;
        // The cubins the code generation's workers assembled are hits here: not the cache's.
        stats.cubins_cached = loaded.cubin_hits.saturating_sub(stats.assembled_in_codegen);
        stats.assembled = loaded.assembled;
        stats.ptx_jit = loaded.ptx_jit;
        stats.cubins_damaged = loaded.damaged;
        stats.assembly_failed = loaded.assembly_failed;
        stats.cache_seconds += loaded.cache_seconds;
        stats.assembly_seconds = loaded.assembly_seconds;
        let t_load = Instant::now();
        let mut exec = Executor::new(device, &kg, plans)?;
        stats.load_seconds = loaded.load_seconds + t_load.elapsed().as_secs_f64();
        // SINTER_POISON=1 fills every output with 0xFF bytes (NaN in every float dtype) before
        // each launch, so that an element a kernel forgets to write shows up in the tests.
        if std::env::var_os("SINTER_POISON").is_some() {
            exec = exec.with_output_guard(256, 0xFF);
        }
        stats.seconds = t0.elapsed().as_secs_f64();
        let weights = sinter_passes::hoist::weight_names(graph, weights);
        Ok(GpuProgram { device: device.clone(), exec, kg, bound: BTreeMap::new(), stats, weights, unfolded: None, folded_reads: BTreeSet::new(), persistent: std::sync::OnceLock::new() })
    }

    /// The kernel graph it runs.
    pub fn kernel_graph(&self) -> &KernelGraph {
        &self.kg
    }

    /// Runs, once, every kernel that reads only bound buffers (weights) or such kernels'
    /// results, and every kernel that reads nothing, when its launch needs no symbol — the
    /// load-time kernels of the fusion report: the concatenated weights of a merged
    /// projection, a transposed or scaled weight, a norm's `1 + w`, a table built from `iota`
    /// ([`fold`]) — and drops them from the program: their results become bound inputs
    /// (named `folded:<buffer>`), which runs, captures and batch-specialised programs read as
    /// they read the weights. Call it after binding the weights; rebinding a weight a folded
    /// kernel read, or giving one for a run, goes back to the program before folding (call
    /// this again after rebinding). Returns how many kernels were folded.
    ///
    /// # Errors
    /// Driver errors of the one run; loading the remaining kernels.
    pub fn fold_bound(&mut self) -> Result<usize, Error> {
        self.fold_bound_with(None)
    }

    /// [`GpuProgram::fold_bound`], taking each folded result from `cache` when a program over
    /// the same buffers folded it already, and keeping there what it computes (one copy of each
    /// result for the prefill, decode and batch-specialised programs of one model).
    ///
    /// # Errors
    /// As [`GpuProgram::fold_bound`].
    pub fn fold_bound_with(&mut self, cache: Option<&FoldCache>) -> Result<usize, Error> {
        let Some(split) = fold::split(&self.kg, self.exec.plans(), &|n| self.bound.contains_key(n)) else { return Ok(0) };
        let named = |b: sinter_ir::Buffer| split.sub.buffers[b].name.clone().unwrap_or_default();
        let inputs: Vec<DeviceBuffer> = split
            .sub
            .inputs
            .iter()
            .map(|&b| self.bound.get(&named(b)).cloned().ok_or_else(|| Error::Unsupported(format!("folding: weight {} is not bound", named(b)))))
            .collect::<Result<_, _>>()?;
        let device_key = |b: sinter_ir::Buffer| {
            let i = split.sub.inputs.iter().position(|&x| x == b)?;
            let d = &inputs[i];
            Some(format!("device {:x} {} {:?}", d.device_ptr(), d.dtype(), d.shape()))
        };
        let keys = fold::result_keys(&split, &device_key);
        // The cache is used only where every result has a key (every one does: a kernel's).
        let out_keys: Option<Vec<String>> = split.sub.outputs.iter().map(|b| keys.get(b).cloned()).collect();
        let cache = cache.zip(out_keys);
        let cached: Option<Vec<DeviceBuffer>> = cache.as_ref().and_then(|(c, ks)| ks.iter().map(|k| c.get(k)).collect());
        let results = match cached {
            Some(r) => r,
            None => {
                let refs: Vec<&DeviceBuffer> = inputs.iter().collect();
                let made = Executor::new(&self.device, &split.sub, split.sub_plans.clone())?.run(&refs, &Bindings::new())?;
                match &cache {
                    Some((c, ks)) => ks.iter().zip(made).map(|(k, buf)| c.insert(k.clone(), buf, inputs.clone())).collect(),
                    None => made,
                }
            }
        };
        for (b, buf) in split.sub.outputs.iter().zip(results) {
            self.bound.insert(fold::folded_name(*b), buf);
        }
        let mut exec = Executor::new(&self.device, &split.rest, split.rest_plans)?;
        if std::env::var_os("SINTER_POISON").is_some() {
            exec = exec.with_output_guard(256, 0xFF);
        }
        let before = std::mem::replace(&mut self.exec, exec);
        let kg_before = std::mem::replace(&mut self.kg, split.rest);
        self.persistent = std::sync::OnceLock::new();
        if self.unfolded.is_none() {
            self.unfolded = Some(Box::new((kg_before, before)));
        }
        self.folded_reads.extend(split.reads);
        Ok(split.folded.len())
    }

    /// Goes back to the program before [`GpuProgram::fold_bound`] (its folded results unbound).
    fn unfold(&mut self) {
        self.persistent = std::sync::OnceLock::new();
        if let Some(u) = self.unfolded.take() {
            (self.kg, self.exec) = *u;
            self.bound.retain(|n, _| !n.starts_with("folded:"));
            self.folded_reads.clear();
        }
    }

    /// The weights the passes hoisted work on, by name: those
    /// [`GpuProgram::compile_with_weights`] named, or the guess
    /// ([`sinter_passes::hoist::infer_weights`]).
    pub fn weights(&self) -> &BTreeSet<String> {
        &self.weights
    }

    /// Whether every weight ([`GpuProgram::weights`]) is bound: the time to
    /// [`GpuProgram::fold_bound`].
    pub fn weights_bound(&self) -> bool {
        self.weights.iter().all(|w| self.bound.contains_key(w))
    }

    /// The kernel graph and executor a run with `given` inputs takes: the program before
    /// folding when one of them replaces a weight a folded kernel read.
    fn program_for(&self, given: &dyn Fn(&str) -> bool) -> (&KernelGraph, &Executor) {
        match &self.unfolded {
            Some(u) if self.folded_reads.iter().any(|n| given(n)) => (&u.0, &u.1),
            _ => (&self.kg, &self.exec),
        }
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
        self.bind_buffer(name, buf);
        Ok(())
    }

    /// Binds a parameter to a buffer already on the device (shared, not copied): one upload
    /// of the weights serves the prefill and the decode program.
    pub fn bind_buffer(&mut self, name: &str, buf: DeviceBuffer) {
        if self.folded_reads.contains(name) {
            self.unfold();
        }
        self.bound.insert(name.to_string(), buf);
    }

    /// The device buffer bound to `name` ([`GpuProgram::bind`], [`GpuProgram::bind_buffer`]),
    /// if any.
    pub fn bound_buffer(&self, name: &str) -> Option<&DeviceBuffer> {
        self.bound.get(name)
    }

    /// Runs with host inputs (uploaded for this run) and the bound weights; returns the
    /// outputs on the host.
    ///
    /// # Errors
    /// Missing inputs, shape disagreements, driver errors.
    pub fn run(&self, inputs: &[(&str, &Tensor)], symbols: &Bindings) -> Result<Vec<Tensor>, Error> {
        let uploaded: Vec<(&str, DeviceBuffer)> = inputs.iter().map(|(n, t)| Ok((*n, self.device.upload_tensor(t)?))).collect::<Result<_, RuntimeError>>()?;
        let given: Vec<(&str, &DeviceBuffer)> = uploaded.iter().map(|(n, b)| (*n, b)).collect();
        let outs = self.run_device(&given, symbols)?;
        Ok(outs.iter().map(|b| self.device.download_tensor(b)).collect::<Result<Vec<_>, _>>()?)
    }

    /// Runs as [`crate::Program::run`] does on the GPU (`func` its entry, for errors): each input of the kernel graph is
    /// `given(name)` (uploaded for this run) or else the bound buffer of that name; parameters
    /// the kernels do not read are not uploaded. Returns the outputs on the host.
    ///
    /// # Errors
    /// [`Error::MissingInput`] for a kernel-graph input neither given nor bound; as
    /// [`GpuProgram::run`].
    pub(crate) fn run_checked<'t>(&self, func: &str, given: &dyn Fn(&str) -> Option<&'t Tensor>, symbols: &Bindings) -> Result<Vec<Tensor>, Error> {
        let mut uploaded: Vec<(&str, DeviceBuffer)> = Vec::new();
        let (kg, exec) = self.program_for(&|n| given(n).is_some());
        let names: Vec<&str> = kg.inputs.iter().filter_map(|b| kg.buffers[*b].name.as_deref()).collect();
        for &n in &names {
            if let Some(t) = given(n) {
                uploaded.push((n, self.device.upload_tensor(t)?));
            }
        }
        let mut all: Vec<(&str, &DeviceBuffer)> = uploaded.iter().map(|(n, b)| (*n, b)).collect();
        for &n in &names {
            if !uploaded.iter().any(|(m, _)| *m == n) {
                let b = self.bound.get(n).ok_or_else(|| Error::MissingInput { func: func.to_string(), name: n.to_string() })?;
                all.push((n, b));
            }
        }
        let outs = exec.run_named(&all, symbols)?;
        Ok(outs.iter().map(|b| self.device.download_tensor(b)).collect::<Result<Vec<_>, _>>()?)
    }

    /// Runs with device-resident inputs; returns device buffers (no host copies).
    ///
    /// # Errors
    /// As [`GpuProgram::run`].
    pub fn run_device(&self, inputs: &[(&str, &DeviceBuffer)], symbols: &Bindings) -> Result<Vec<DeviceBuffer>, Error> {
        let (exec, all) = self.with_bound(inputs);
        Ok(exec.run_named(&all, symbols)?)
    }

    /// The executor a run on `inputs` takes ([`GpuProgram::program_for`]) and the device inputs
    /// by name, completed with the bound buffers it reads (weights, folded results).
    fn with_bound<'a>(&'a self, inputs: &[(&'a str, &'a DeviceBuffer)]) -> (&'a Executor, Vec<(&'a str, &'a DeviceBuffer)>) {
        let (kg, exec) = self.program_for(&|n| inputs.iter().any(|(m, _)| *m == n));
        let reads: BTreeSet<&str> = kg.inputs.iter().filter_map(|b| kg.buffers[*b].name.as_deref()).collect();
        let mut all: Vec<(&str, &DeviceBuffer)> = inputs.to_vec();
        for (n, b) in &self.bound {
            if reads.contains(n.as_str()) && !inputs.iter().any(|(m, _)| m == n) {
                all.push((n.as_str(), b));
            }
        }
        (exec, all)
    }

    /// [`GpuProgram::run_device`], timing each kernel with CUDA events.
    ///
    /// # Errors
    /// As [`GpuProgram::run`].
    pub fn run_device_profiled(&self, inputs: &[(&str, &DeviceBuffer)], symbols: &Bindings) -> Result<(Vec<DeviceBuffer>, Profile), Error> {
        let (exec, all) = self.with_bound(inputs);
        Ok(exec.run_profiled_named(&all, symbols)?)
    }

    /// Captures one run on device-resident inputs (and the bound weights) as a CUDA graph,
    /// without running it: every replay reads the same input buffers and writes the same
    /// output buffers (see [`Executor::capture`]).
    ///
    /// # Errors
    /// As [`GpuProgram::run`]; capture and instantiation errors.
    pub fn capture_device(&self, inputs: &[(&str, &DeviceBuffer)], symbols: &Bindings) -> Result<CapturedGraph, Error> {
        let (exec, all) = self.with_bound(inputs);
        Ok(exec.capture_named(&all, symbols)?)
    }

    /// Captures one run on device-resident inputs as a single persistent launch
    /// ([`Executor::capture_persistent`]) of the persistent kernel built from this program's
    /// kernels ([`persistent_program`], built on the first call and kept).
    ///
    /// # Errors
    /// As [`GpuProgram::capture_device`]; [`Error::Codegen`] naming a kernel that cannot be
    /// a persistent task; [`Error::KernelNotCached`] in a build without LLVM.
    pub fn capture_persistent_device(&self, inputs: &[(&str, &DeviceBuffer)], symbols: &Bindings, options: &sinter_runtime::PersistentOptions) -> Result<CapturedGraph, Error> {
        let (exec, all) = self.with_bound(inputs);
        let build = || -> Result<std::sync::Arc<sinter_ir::kernel::persistent::PersistentProgram>, String> {
            let p = persistent_program(exec.graph(), &target_for(&self.device)).map_err(|e| e.to_string())?;
            // Through the cubin cache: the next process loads the assembled kernel.
            let cache = KernelCache::open_default().map_err(|e| e.to_string())?;
            self.device.load_modules(std::slice::from_ref(&p.kernel), Some(&cache), 1).map_err(|e| e.to_string())?;
            Ok(std::sync::Arc::new(p))
        };
        // Kept for this program's graph (a refusal too, so it is not rebuilt every step); a run
        // on the unfolded graph builds its own.
        let program = if std::ptr::eq(exec.graph(), &self.kg) { self.persistent.get_or_init(build).clone() } else { build() };
        let program = program.map_err(Error::Codegen)?;
        Ok(exec.capture_persistent_named(&all, symbols, &program, options)?)
    }

    /// The executor (for profiling and CUDA-graph capture).
    pub fn executor(&self) -> &Executor {
        &self.exec
    }
}

/// One kernel's line of a [`ProfileReport`].
#[derive(Clone, Debug, PartialEq)]
pub struct ProfileRow {
    /// The kernel (`k12`).
    pub kernel: Kernel,
    /// Its family's name (`matmul`, `paged_attention`, ...).
    pub family: &'static str,
    /// The ops of its body, in order, as `sinter explain` names them.
    pub ops: Vec<&'static str>,
    /// Device time, microseconds.
    pub micros: f64,
}

/// A [`Profile`] of a kernel graph's run with each kernel's family and ops, and the time per
/// family; its `Display` prints one line per kernel, the total, then the per-family totals.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ProfileReport {
    /// Kernels in launch order.
    pub rows: Vec<ProfileRow>,
    /// Sum of the kernels' times, microseconds.
    pub kernel_micros: f64,
    /// From the first kernel's start to the last kernel's end (launch gaps included),
    /// microseconds.
    pub span_micros: f64,
}

impl ProfileReport {
    /// Joins `profile` (a run of `kg`) with `kg`'s kernels.
    pub fn new(kg: &KernelGraph, profile: &Profile) -> ProfileReport {
        let rows: Vec<ProfileRow> = profile
            .kernels
            .iter()
            .map(|t| {
                let (family, ops) = match kg.kernels.get(t.kernel) {
                    Some(kd) => (kd.family.name(), kd.body.nodes.values().map(|n| n.op.kind.name()).collect()),
                    None => ("?", Vec::new()),
                };
                ProfileRow { kernel: t.kernel, family, ops, micros: t.micros }
            })
            .collect();
        let kernel_micros = rows.iter().map(|r| r.micros).sum();
        ProfileReport { rows, kernel_micros, span_micros: profile.total_micros }
    }

    /// `(family, kernels, microseconds)`, the most expensive family first.
    pub fn by_family(&self) -> Vec<(&'static str, usize, f64)> {
        let mut m: BTreeMap<&'static str, (usize, f64)> = BTreeMap::new();
        for r in &self.rows {
            let e = m.entry(r.family).or_insert((0, 0.0));
            e.0 += 1;
            e.1 += r.micros;
        }
        let mut v: Vec<(&'static str, usize, f64)> = m.into_iter().map(|(f, (n, us))| (f, n, us)).collect();
        v.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(b.0)));
        v
    }
}

impl std::fmt::Display for ProfileReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let total = self.kernel_micros.max(f64::MIN_POSITIVE);
        writeln!(f, "{:<6} {:<16} {:>10} {:>6}  ops", "kernel", "family", "us", "%")?;
        for r in &self.rows {
            writeln!(f, "{:<6} {:<16} {:>10.2} {:>5.1}%  {}", r.kernel.to_string(), r.family, r.micros, 100.0 * r.micros / total, r.ops.join(" "))?;
        }
        writeln!(f, "total: {} kernels, {:.2} us of kernel time, {:.2} us from the first start to the last end", self.rows.len(), self.kernel_micros, self.span_micros)?;
        writeln!(f, "per family:")?;
        for (fam, n, us) in self.by_family() {
            writeln!(f, "  {fam:<16} {n:>5} kernels {us:>12.2} us {:>5.1}%", 100.0 * us / total)?;
        }
        Ok(())
    }
}
