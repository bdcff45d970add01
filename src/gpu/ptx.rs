//! PTX for a user's own graph: every kernel's PTX text and launch plan, without a GPU
//! ([`compile_ptx`]), and the folder `sinter compile` writes them into ([`CompiledPtx::write_to`]).
//!
//! Nothing here reads or writes the kernel cache: the kernels are generated now, each
//! distinct kernel once (the same kernel in every layer of a model is one PTX module, as the
//! runtime loads it).
//!
//! **The folder.** [`CompiledPtx::write_to`] writes one `<entry>.ptx` per distinct kernel and
//! `plan.json`, the launch plan of every kernel in launch order (keys in any order):
//!
//! ```json
//! {
//!   "format": "sinter-ptx-plan 1",
//!   "target": "sm_90a",
//!   "inputs":  [{ "buffer": "b0", "name": "x", "type": "bf16[T, 64]" }],
//!   "outputs": [{ "buffer": "b3", "name": "out0", "type": "bf16[T, 64]" }],
//!   "kernels": [{
//!     "kernel": "k0", "family": "row_reduction", "ops": ["rms_norm"],
//!     "entry": "k0_row_reduction", "ptx": "k0_row_reduction.ptx",
//!     "grid": [{ "work": "T", "per_cta": 1 }, { "work": "1", "per_cta": 1 }, { "work": "1", "per_cta": 1 }],
//!     "block": [256, 1, 1], "shared_bytes": 0,
//!     "buffers": [{ "buffer": "b0", "name": "x", "role": "input", "written": false, "type": "bf16[T, 64]", "strides": ["64", "1"] }],
//!     "params": [{ "buffer": 0 }, { "size": "T" }]
//!   }]
//! }
//! ```
//!
//! A grid axis launches `⌈work / per_cta⌉` CTAs (at least one), `work` a dim expression of
//! the graph's symbols. A kernel's `buffers` are its inputs then its outputs; a parameter
//! `{"buffer": i}` is a pointer to the `i`-th of them, `{"size": d}` a 64-bit integer (the
//! dim `d` evaluated at launch), and `{"tensor_map": …}` a 128-byte TMA tensor map over one
//! of them that the launcher encodes (`cuTensorMapEncodeTiled`) from its `dtype`, `offset`,
//! `dims` and `strides` (elements, innermost first), `box` and `swizzle` (bytes).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use sinter_ir::{Buffer, BufferRole, Family, Graph, Kernel, KernelGraph, KernelParam, LaunchPlan, Target};

use super::Lowering;
use crate::Error;

/// One buffer a kernel reads or writes, as its launch plan numbers them.
#[derive(Clone, Debug, PartialEq)]
pub struct KernelBuffer {
    /// The buffer of the kernel graph (`b3`).
    pub buffer: Buffer,
    /// The graph value's name, for the graph's inputs and outputs.
    pub name: Option<String>,
    /// Dtype and shape (dims over the graph's symbols).
    pub ty: sinter_ir::TensorType,
    /// Input of the graph, output of the graph, or a temporary between kernels.
    pub role: BufferRole,
    /// Strides per axis, in elements.
    pub strides: Vec<sinter_ir::Dim>,
    /// Whether the kernel writes it (its outputs follow its inputs).
    pub written: bool,
}

/// One kernel of a graph compiled to PTX.
#[derive(Clone, Debug, PartialEq)]
pub struct PtxKernel {
    /// The kernel (`k0`), in launch order.
    pub kernel: Kernel,
    /// Its family (which generator built it).
    pub family: Family,
    /// The ops of its body, in order.
    pub ops: Vec<&'static str>,
    /// The PTX (`plan.ptx`), its entry point, grid, block, dynamic shared memory and
    /// parameter list. Kernels identical to an earlier one share its plan, entry included.
    pub plan: LaunchPlan,
    /// Its buffers, inputs then outputs: [`KernelParam::Buffer`]`(i)` is `buffers[i]`.
    pub buffers: Vec<KernelBuffer>,
}

/// A graph's kernels compiled to PTX for one target ([`compile_ptx`]).
#[derive(Clone, Debug, PartialEq)]
pub struct CompiledPtx {
    /// The target the PTX is for.
    pub target: Target,
    /// The kernel graph the passes made of the graph.
    pub kernel_graph: KernelGraph,
    /// Every kernel, in launch order.
    pub kernels: Vec<PtxKernel>,
}

/// What [`CompiledPtx::write_to`] wrote.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenPtx {
    /// The `.ptx` files, one per distinct kernel, in launch order of first use.
    pub ptx_files: Vec<PathBuf>,
    /// The plan file (`plan.json`).
    pub plan_file: PathBuf,
}

/// Lowers `graph` (its entry function) through the fusion passes for `target` and generates
/// every kernel's PTX and launch plan, with no GPU and no kernel cache.
///
/// ```
/// # #[cfg(feature = "llvm")] {
/// use sinter::{compile_ptx, graph, Target};
/// let g = graph! { fn main(x: f32[T, 64]) -> f32[T, 64] { x.softmax(-1) } }?;
/// let compiled = compile_ptx(&g, &Target::SM_90A)?;
/// let k = &compiled.kernels[0];
/// assert_eq!(k.family.name(), "row_reduction");
/// assert!(k.plan.ptx.contains(&format!(".entry {}", k.plan.entry)));
/// assert_eq!(k.buffers[0].name.as_deref(), Some("x"));
/// # }
/// # Ok::<(), sinter::Error>(())
/// ```
///
/// # Errors
/// [`Error::Verify`] for an ill-formed graph; [`Error::Passes`]; [`Error::Codegen`] naming
/// the kernel the generator refused; [`Error::NoCodegen`] in a build without the `llvm`
/// feature.
pub fn compile_ptx(graph: &Graph, target: &Target) -> Result<CompiledPtx, Error> {
    compile_ptx_with(graph, target, Lowering::Fused)
}

/// [`compile_ptx`] with the lowering chosen: [`Lowering::Unfused`] gives one kernel per node.
///
/// # Errors
/// As [`compile_ptx`].
pub fn compile_ptx_with(graph: &Graph, target: &Target, lowering: Lowering) -> Result<CompiledPtx, Error> {
    if !cfg!(feature = "llvm") {
        return Err(Error::NoCodegen { what: "compile_ptx".into() });
    }
    sinter_ir::verify(graph)?;
    let kg = super::lower(graph, lowering, target)?;
    let plans = distinct_plans(&kg, target)?;
    let kernels = kg
        .kernels
        .iter()
        .zip(plans)
        .map(|((k, kd), plan)| {
            let n_in = kd.inputs.len();
            let buffers = kd
                .inputs
                .iter()
                .chain(&kd.outputs)
                .enumerate()
                .map(|(i, &b)| {
                    let bd = &kg.buffers[b];
                    KernelBuffer { buffer: b, name: bd.name.clone(), ty: bd.ty.clone(), role: bd.role, strides: bd.layout.strides.clone(), written: i >= n_in }
                })
                .collect();
            PtxKernel { kernel: k, family: kd.family, ops: kd.body.nodes.values().map(|n| n.op.kind.name()).collect(), plan, buffers }
        })
        .collect();
    Ok(CompiledPtx { target: *target, kernel_graph: kg, kernels })
}

/// Each kernel's plan, every distinct kernel (by its kernel-cache key) generated once, on up
/// to [`super::jobs`] threads; the first failure in launch order is the error.
fn distinct_plans(kg: &KernelGraph, target: &Target) -> Result<Vec<LaunchPlan>, Error> {
    let keys: Vec<Kernel> = kg.kernels.keys().collect();
    let mut first: HashMap<String, usize> = HashMap::new();
    let mut todo: Vec<Kernel> = Vec::new();
    let slot: Vec<usize> = keys
        .iter()
        .map(|&k| {
            let digest = crate::cache_key::kernel_key(kg, k, target).digest();
            *first.entry(digest).or_insert_with(|| {
                todo.push(k);
                todo.len() - 1
            })
        })
        .collect();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = super::jobs().clamp(1, todo.len().max(1));
    let mut built: Vec<Option<Result<LaunchPlan, Error>>> = std::iter::repeat_with(|| None).take(todo.len()).collect();
    std::thread::scope(|s| {
        let work = || {
            let mut mine = Vec::new();
            loop {
                let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&k) = todo.get(j) else { break };
                mine.push((j, super::build_plan(kg, k, target)));
            }
            mine
        };
        let handles: Vec<_> = (0..workers).filter_map(|_| std::thread::Builder::new().stack_size(crate::gpu::CODEGEN_STACK_BYTES).spawn_scoped(s, work).ok()).collect();
        if handles.is_empty() {
            // No thread could be started (out of memory for stacks): generate here.
            for (j, r) in work() {
                built[j] = Some(r);
            }
        }
        for h in handles {
            // A worker that panicked leaves its kernels `None`: reported below.
            for (j, r) in h.join().unwrap_or_default() {
                built[j] = Some(r);
            }
        }
    });
    let mut plans = Vec::with_capacity(todo.len());
    for (j, r) in built.into_iter().enumerate() {
        plans.push(r.unwrap_or_else(|| Err(Error::Codegen(format!("kernel {}: the code generator's thread failed", todo[j]))))?);
    }
    Ok(slot.into_iter().map(|j| plans[j].clone()).collect())
}

impl CompiledPtx {
    /// The distinct PTX modules, in launch order of first use: `(entry, PTX text)`.
    pub fn modules(&self) -> Vec<(&str, &str)> {
        let mut out: Vec<(&str, &str)> = Vec::new();
        for k in &self.kernels {
            if !out.iter().any(|(e, _)| *e == k.plan.entry) {
                out.push((&k.plan.entry, &k.plan.ptx));
            }
        }
        out
    }

    /// The plan file's JSON (the format is in the module docs).
    pub fn plan_json(&self) -> Value {
        let kg = &self.kernel_graph;
        let io = |bs: &[Buffer]| -> Vec<Value> { bs.iter().map(|&b| json!({ "buffer": b.to_string(), "name": kg.buffers[b].name, "type": kg.buffers[b].ty.to_string() })).collect() };
        let kernels: Vec<Value> = self
            .kernels
            .iter()
            .map(|k| {
                let p = &k.plan;
                let buffers: Vec<Value> = k
                    .buffers
                    .iter()
                    .map(|b| {
                        let role = match b.role {
                            BufferRole::Input => "input",
                            BufferRole::Output => "output",
                            BufferRole::Temp => "temp",
                        };
                        json!({ "buffer": b.buffer.to_string(), "name": b.name, "role": role, "written": b.written, "type": b.ty.to_string(), "strides": b.strides.iter().map(ToString::to_string).collect::<Vec<_>>() })
                    })
                    .collect();
                json!({
                    "kernel": k.kernel.to_string(),
                    "family": k.family.name(),
                    "ops": k.ops,
                    "entry": p.entry,
                    "ptx": format!("{}.ptx", p.entry),
                    "grid": p.grid.iter().map(|g| json!({ "work": g.numerator.to_string(), "per_cta": g.denominator })).collect::<Vec<_>>(),
                    "block": p.block,
                    "shared_bytes": p.shared_bytes,
                    "buffers": buffers,
                    "params": p.params.iter().map(param_json).collect::<Vec<_>>(),
                })
            })
            .collect();
        json!({
            "format": "sinter-ptx-plan 1",
            "target": self.target.name(),
            "inputs": io(&kg.inputs),
            "outputs": io(&kg.outputs),
            "kernels": kernels,
        })
    }

    /// Writes one `<entry>.ptx` per distinct kernel and `plan.json` into `dir` (created with
    /// its parents when missing; files of the same names are replaced).
    ///
    /// # Errors
    /// [`Error::Write`] naming the folder or file that could not be created or written.
    pub fn write_to(&self, dir: &Path) -> Result<WrittenPtx, Error> {
        let write_err = |path: &Path, e: std::io::Error| Error::Write { path: path.display().to_string(), source: e };
        if dir.exists() && !dir.is_dir() {
            return Err(write_err(dir, std::io::Error::new(std::io::ErrorKind::AlreadyExists, "it exists and is not a folder")));
        }
        std::fs::create_dir_all(dir).map_err(|e| write_err(dir, e))?;
        let mut ptx_files = Vec::new();
        for (entry, ptx) in self.modules() {
            let path = dir.join(format!("{entry}.ptx"));
            std::fs::write(&path, ptx).map_err(|e| write_err(&path, e))?;
            ptx_files.push(path);
        }
        let plan_file = dir.join("plan.json");
        let mut text = serde_json::to_string_pretty(&self.plan_json()).map_err(|e| Error::Unsupported(format!("the plan as JSON: {e}")))?;
        text.push('\n');
        std::fs::write(&plan_file, text).map_err(|e| write_err(&plan_file, e))?;
        Ok(WrittenPtx { ptx_files, plan_file })
    }
}

fn param_json(p: &KernelParam) -> Value {
    match p {
        KernelParam::Buffer(i) => json!({ "buffer": i }),
        KernelParam::Size(d) => json!({ "size": d.to_string() }),
        KernelParam::TensorMap(t) => {
            let dims = |v: &[sinter_ir::Dim]| v.iter().map(ToString::to_string).collect::<Vec<_>>();
            json!({ "tensor_map": {
                "buffer": t.buffer,
                "dtype": t.dtype.name(),
                "offset": t.offset.to_string(),
                "dims": dims(&t.dims),
                "strides": dims(&t.strides),
                "box": t.box_dims,
                "swizzle": t.swizzle,
            } })
        }
    }
}
