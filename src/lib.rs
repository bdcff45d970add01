//! sinter: a tensor compiler embedded in Rust.
//!
//! Write a model with [`graph!`], get a verified [`Graph`], compile it into a [`Program`] for a
//! [`Backend`], bind its weights and run it. Every step returns errors as values ([`Error`]).
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn mlp(x: f32[T, 4], w_gate: f32[4, 8], w_up: f32[4, 8], w_down: f32[8, 4]) -> f32[T, 4] {
//!         ((x @ w_gate).silu() * (x @ w_up)) @ w_down
//!     }
//! }?;
//! let mut p = Program::compile(g, Backend::Interpreter)?;
//! p.bind("w_gate", Tensor::full(DType::F32, &[4, 8], 0.5))?;
//! p.bind("w_up", Tensor::full(DType::F32, &[4, 8], 1.0))?;
//! p.bind("w_down", Tensor::full(DType::F32, &[8, 4], 0.25))?;
//! let x = Tensor::full(DType::F32, &[3, 4], 1.0); // binds T = 3
//! let out = p.run(&[("x", &x)], &[])?;
//! // x·w_gate = 2, silu(2) = 1.7616, x·w_up = 4, product 7.0464, times 8 · 0.25
//! assert_eq!(out[0].shape(), &[3, 4]);
//! assert!((out[0].data()[0] - 14.0928).abs() < 1e-3);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! The same program runs on the GPU with [`Backend::Gpu`]: the graph is lowered through the
//! fusion passes, every kernel compiled to PTX (or taken from the kernel cache) and loaded on
//! the device, and `bind` uploads the weights once. [`Backend::gpu`] opens the first GPU, and
//! says so clearly where there is none ([`Error::NoGpu`]). Everything a GPU program needs is
//! re-exported here ([`Device`], [`DeviceBuffer`], [`KernelCache`], ...): a user depends on
//! `sinter` alone.
//!
//! ```no_run
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn mlp(x: bf16[T, 64], w_gate: bf16[64, 128], w_up: bf16[64, 128], w_down: bf16[128, 64]) -> bf16[T, 64] {
//!         ((x @ w_gate).silu() * (x @ w_up)) @ w_down
//!     }
//! }?;
//! let mut p = Program::compile(g, Backend::gpu()?)?; // Err(Error::NoGpu) without a GPU
//! p.bind("w_gate", Tensor::full(DType::BF16, &[64, 128], 0.5))?;
//! p.bind("w_up", Tensor::full(DType::BF16, &[64, 128], 1.0))?;
//! p.bind("w_down", Tensor::full(DType::BF16, &[128, 64], 0.25))?;
//! let out = p.run(&[("x", &Tensor::full(DType::BF16, &[3, 64], 0.01))], &[])?;
//! assert_eq!(out[0].shape(), &[3, 64]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! [`compile_ptx`] gives each kernel's PTX and launch plan for a target without a GPU (what
//! `sinter compile FILE.sir --target sm_90a --out DIR` writes).

extern crate self as sinter;

use std::collections::BTreeMap;
use std::sync::Arc;

/// Writes a model as tensor math and builds its [`Graph`]: `graph! { fn .. }` evaluates to
/// `Result<Graph, BuildError>`.
///
/// Each `fn` of the DSL becomes a function of the graph. Its parameters are typed tensors
/// (`x: bf16[T, 576]`: a dtype and dims that are literals, symbols bound when the graph runs,
/// or Rust values in braces); its body is `let` bindings, assignments, Rust `for` loops and
/// `if`s decided while the graph is built, and ends with the tensor(s) it returns. Tensor
/// expressions are written like the math: `@`, `+ - * /`, comparisons, and methods with
/// positional or named attributes (`.softmax(-1)`, `.rms_norm(w, eps = 1e-5)`). Rust values
/// enter through braces (`{cfg.hidden}`, `x * {scale}`), attribute values and names
/// (`weight(format!("blk.{i}.wq"), bf16[576, 576])`).
///
/// Mistakes the macro can see (an unknown op, a wrong arity, an unknown attribute, a dtype
/// clash, dims that cannot match) are compile errors at the offending token; a shape mismatch
/// that depends on Rust values is an `Err(`[`BuildError`]`)` naming the user's
/// file:line:column. The [`dsl_guide`] has a worked, tested example of every form; the
/// reference grammar follows.
///
/// ```
/// use sinter::{graph, Backend, DType, Program, Tensor};
///
/// let (n_layers, eps) = (2, 1e-5);
/// let g = graph! {
///     fn block(x: f32[T, 4], norm: f32[4], w_up: f32[4, 8], w_down: f32[8, 4]) -> f32[T, 4] {
///         let h = x.rms_norm(norm, eps = eps);
///         x + (h @ w_up).silu() @ w_down
///     }
///
///     fn main(x: f32[T, 4]) -> f32[T, 4] {
///         let mut h = x;
///         for i in 0..n_layers {
///             h = block(h, weight(format!("blk.{i}.norm"), f32[4]),
///                       weight(format!("blk.{i}.up"), f32[4, 8]), weight(format!("blk.{i}.down"), f32[8, 4]));
///         }
///         h.softmax(-1)
///     }
/// }?;
/// let mut p = Program::compile(g, Backend::Interpreter)?;
/// for i in 0..n_layers {
///     p.bind(&format!("blk.{i}.norm"), Tensor::full(DType::F32, &[4], 1.0))?;
///     p.bind(&format!("blk.{i}.up"), Tensor::full(DType::F32, &[4, 8], 0.0))?;
///     p.bind(&format!("blk.{i}.down"), Tensor::full(DType::F32, &[8, 4], 1.0))?;
/// }
/// // With w_up = 0 each block adds silu(0) = 0: the output is softmax(x).
/// let x = Tensor::new(DType::F32, &[1, 4], vec![0.0, 0.0, 0.0, 0.0])?;
/// let out = p.run(&[("x", &x)], &[])?;
/// assert_eq!(out[0].data(), &[0.25; 4]);
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub use sinter_dsl::graph;
#[doc(hidden)]
pub use sinter_dsl::__vocab;
#[doc(hidden)]
pub use sinter_dsl::__vocab_fp8;
pub use sinter_ir as ir;
pub use sinter_ir::interp::{InterpError, Tensor};
pub use sinter_ir::{Bindings, BuildError, DType, Dim, Graph, ParseError, Target, TensorType, VerifyError};
pub use sinter_ir::{Buffer, BufferRole, Family, GridDim, Kernel, KernelGraph, KernelParam, LaunchPlan, TensorMap};
/// The GPU runtime (`sinter-runtime`), for what the re-exports below leave out.
pub use sinter_runtime as runtime;
pub use sinter_runtime::{probe, CapturedGraph, Device, DeviceBuffer, DeviceInfo, Executor, KernelCache, Profile, RuntimeError};
/// Assembling PTX with NVIDIA's `ptxas -v` and reading its resource report (registers,
/// shared memory, spills), as sinter's own PTX snapshot tests do (the `llvm` feature).
#[cfg(feature = "llvm")]
pub use sinter_codegen::ptxas;
pub use gpu::{compile_ptx, compile_ptx_with, CompiledPtx, CompileStats, GpuProgram, KernelBuffer, Lowering, PtxKernel, WrittenPtx};

pub mod bench;
pub mod cache_key;
pub mod gpu;
pub mod timing;
pub mod tune;
pub mod llm;
pub mod serve;
pub mod dsl_guide;
pub mod zoo;

/// Everything that can go wrong between writing a graph and running it.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The graph could not be built (a shape rule broken at build time, with the source location).
    #[error(transparent)]
    Build(#[from] BuildError),
    /// The graph is ill-formed.
    #[error(transparent)]
    Verify(#[from] VerifyError),
    /// A `.sir` text could not be parsed.
    #[error(transparent)]
    Parse(#[from] ParseError),
    /// The interpreter failed (bad input shapes, out-of-range indices, ...).
    #[error(transparent)]
    Interp(#[from] InterpError),
    /// The GPU runtime failed (no device, out of memory, a CUDA error naming the kernel, ...).
    #[error(transparent)]
    Runtime(#[from] sinter_runtime::RuntimeError),
    /// The passes could not lower the graph.
    #[error(transparent)]
    Passes(#[from] sinter_passes::PassError),
    /// The code generator failed on a kernel.
    #[error("code generation: {0}")]
    Codegen(String),
    /// A build without LLVM met a kernel that is not in the kernel cache.
    #[error("kernel {kernel} for {target} is not in the kernel cache, and this build of sinter has no code generator (the `llvm` feature): compile it on a machine with LLVM and carry the cache ($SINTER_CACHE/kernels)")]
    KernelNotCached {
        /// The kernel.
        kernel: String,
        /// The target.
        target: String,
    },
    /// A build without LLVM found a kernel's cache entry damaged (and cannot rebuild it).
    #[error("kernel {kernel} for {target}: its kernel cache entry {path} is damaged ({reason}), and this build of sinter has no code generator (the `llvm` feature) to rebuild it: compile it again on a machine with LLVM and carry the cache")]
    KernelCacheDamaged {
        /// The kernel.
        kernel: String,
        /// The target.
        target: String,
        /// The entry's file.
        path: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A model file could not be used.
    #[error(transparent)]
    Model(llm::gguf::ModelError),
    /// No zoo model has this name.
    #[error("no zoo model is called `{name}` (known: {known})")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The zoo's names.
        known: String,
    },
    /// [`Backend::gpu`] found no usable GPU (no driver, no device, or it failed to start).
    #[error("no GPU for `Backend::Gpu`: {reason} (`Backend::Interpreter` runs anywhere)")]
    NoGpu {
        /// What was missing or failed, in words.
        reason: String,
    },
    /// This build of sinter has no code generator (it was built without the `llvm` feature).
    #[error("{what} needs the code generator, and this build of sinter has none (it was built without the `llvm` feature)")]
    NoCodegen {
        /// What needed it.
        what: String,
    },
    /// A file or folder could not be created or written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or folder.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Two inputs (or an input and the given symbols) give a symbol different values.
    #[error("symbol `{symbol}` is {first} from {first_from} but {second} from {second_from}")]
    SymbolConflict {
        /// The symbol.
        symbol: String,
        /// Its first value.
        first: i64,
        /// Where the first value came from.
        first_from: String,
        /// The other value.
        second: i64,
        /// Where the other value came from.
        second_from: String,
    },
    /// A combination this version does not support, named in the message.
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The graph has no entry function.
    #[error("the graph has no function to run")]
    NoEntry,
    /// A name given to `bind` or `run` is not a parameter of the entry function.
    #[error("@{func} has no parameter `{name}` (it has: {known})")]
    UnknownInput {
        /// The entry function.
        func: String,
        /// The name given.
        name: String,
        /// The parameters it has.
        known: String,
    },
    /// A parameter was neither bound nor given to `run`.
    #[error("parameter `{name}` of @{func} was not given: bind it with `Program::bind` or pass it to `run`")]
    MissingInput {
        /// The entry function.
        func: String,
        /// The parameter.
        name: String,
    },
    /// A tensor's dtype or rank disagrees with the parameter's declared type.
    #[error("`{name}` is declared {declared} but the tensor is {dtype}{shape:?}")]
    InputMismatch {
        /// The parameter.
        name: String,
        /// Its declared type.
        declared: TensorType,
        /// The tensor's dtype.
        dtype: DType,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
}

/// Where a [`Program`] runs.
#[derive(Clone, Debug)]
pub enum Backend {
    /// The CPU reference interpreter (`sinter_ir::interp`): f64 arithmetic rounded per dtype;
    /// available everywhere, and the ground truth for every other backend.
    Interpreter,
    /// A CUDA GPU ([`GpuProgram`]): the graph lowered through the fusion passes, its kernels
    /// compiled to PTX for the device's target (`sm_90a` on Hopper, `sm_80` elsewhere) or taken
    /// from the kernel cache, the weights uploaded once by [`Program::bind`].
    Gpu(Device),
}

impl Backend {
    /// The first GPU (device 0) as a backend.
    ///
    /// ```
    /// use sinter::{Backend, Error};
    /// match Backend::gpu() {
    ///     Ok(b) => assert!(b.is_gpu()),
    ///     Err(Error::NoGpu { reason }) => eprintln!("no GPU here ({reason}): the interpreter it is"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok::<(), sinter::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::NoGpu`] where there is no driver or no device (an ordinary condition on CPU-only
    /// machines, never a panic); [`Error::Runtime`] when the device fails to start.
    pub fn gpu() -> Result<Backend, Error> {
        match Device::open() {
            Ok(d) => Ok(Backend::Gpu(d)),
            Err(RuntimeError::NoDevice { reason }) => Err(Error::NoGpu { reason }),
            Err(e) => Err(e.into()),
        }
    }

    /// Whether it is [`Backend::Gpu`].
    ///
    /// ```
    /// assert!(!sinter::Backend::Interpreter.is_gpu());
    /// ```
    pub fn is_gpu(&self) -> bool {
        matches!(self, Backend::Gpu(_))
    }
}

/// Two GPU backends are equal when they are the same device (by ordinal).
impl PartialEq for Backend {
    fn eq(&self, other: &Backend) -> bool {
        match (self, other) {
            (Backend::Interpreter, Backend::Interpreter) => true,
            (Backend::Gpu(a), Backend::Gpu(b)) => a.info().ordinal == b.info().ordinal,
            _ => false,
        }
    }
}

impl Eq for Backend {}

/// What runs a [`Program`], with the weights bound so far.
enum Runner {
    Interpreter(BTreeMap<String, Arc<Tensor>>),
    /// The weights live on the device, in the program.
    Gpu(Box<GpuProgram>),
}

/// A verified graph ready to run, with the weights bound to it so far.
pub struct Program {
    graph: Graph,
    entry: String,
    backend: Backend,
    runner: Runner,
}

impl Program {
    /// Verifies `graph` and prepares it for `backend`. The entry is `@main`, else the last
    /// function defined. For [`Backend::Gpu`] this lowers the entry function through the fusion
    /// passes and compiles (or loads from the kernel cache) and loads every kernel.
    ///
    /// ```
    /// # use sinter::{graph, Backend, Program};
    /// let g = graph! { fn f(x: f32[N]) -> f32[N] { x.exp() } }?;
    /// let p = Program::compile(g, Backend::Interpreter)?;
    /// assert_eq!(p.entry(), "f");
    /// # Ok::<(), sinter::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Verify`] for an ill-formed graph, [`Error::NoEntry`] for an empty one; on the GPU
    /// also lowering ([`Error::Passes`]), code generation ([`Error::Codegen`], or
    /// [`Error::KernelNotCached`] in a build without LLVM) and driver errors.
    pub fn compile(graph: Graph, backend: Backend) -> Result<Program, Error> {
        Program::compile_with(graph, backend, Lowering::Fused)
    }

    /// [`Program::compile`] with the lowering chosen for the GPU ([`Lowering::Unfused`]: one
    /// kernel per node, the baseline every fusion is checked against); the interpreter ignores it.
    ///
    /// ```
    /// # use sinter::{graph, Backend, Lowering, Program};
    /// let g = graph! { fn f(x: f32[N]) -> f32[N] { x.exp() } }?;
    /// let p = Program::compile_with(g, Backend::Interpreter, Lowering::Unfused)?;
    /// assert!(p.gpu_program().is_none());
    /// # Ok::<(), sinter::Error>(())
    /// ```
    ///
    /// # Errors
    /// As [`Program::compile`].
    pub fn compile_with(graph: Graph, backend: Backend, lowering: Lowering) -> Result<Program, Error> {
        sinter_ir::verify(&graph)?;
        let entry = graph.entry().ok_or(Error::NoEntry)?.name.clone();
        let runner = match &backend {
            Backend::Interpreter => Runner::Interpreter(BTreeMap::new()),
            Backend::Gpu(device) => {
                let mut p = GpuProgram::compile(&graph, device, lowering)?;
                // Kernels reading nothing (tables of constants) fold now; the others once the
                // weights are bound (`Program::bind`).
                p.fold_bound()?;
                Runner::Gpu(Box::new(p))
            }
        };
        Ok(Program { graph, entry, backend, runner })
    }

    /// Parses and compiles a `.sir` text.
    ///
    /// ```
    /// # use sinter::{Backend, Program};
    /// let p = Program::from_text("func @f(%x: f32[4]) {\n  %y: f32[4] = exp(%x)\n  return %y\n}\n", Backend::Interpreter)?;
    /// assert_eq!(p.entry(), "f");
    /// # Ok::<(), sinter::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::Parse`] with line and column, then as [`Program::compile`].
    pub fn from_text(text: &str, backend: Backend) -> Result<Program, Error> {
        Program::compile(sinter_ir::parse(text)?, backend)
    }

    /// The verified graph.
    ///
    /// ```
    /// # use sinter::{graph, Backend, Program};
    /// let p = Program::compile(graph! { fn f(x: f32[N]) -> f32[N] { x.exp() } }?, Backend::Interpreter)?;
    /// assert_eq!(p.graph().funcs.len(), 1);
    /// # Ok::<(), sinter::Error>(())
    /// ```
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The entry function's name: `main` if the graph has one, else the last function.
    ///
    /// ```
    /// # use sinter::{graph, Backend, Program};
    /// let g = graph! {
    ///     fn inner(x: f32[N]) -> f32[N] { x.exp() }
    ///     fn main(x: f32[N]) -> f32[N] { inner(x) }
    /// }?;
    /// assert_eq!(Program::compile(g, Backend::Interpreter)?.entry(), "main");
    /// # Ok::<(), sinter::Error>(())
    /// ```
    pub fn entry(&self) -> &str {
        &self.entry
    }

    /// The backend it runs on.
    ///
    /// ```
    /// # use sinter::{graph, Backend, Program};
    /// let p = Program::compile(graph! { fn f(x: f32[N]) -> f32[N] { x.exp() } }?, Backend::Interpreter)?;
    /// assert_eq!(p.backend(), &Backend::Interpreter);
    /// # Ok::<(), sinter::Error>(())
    /// ```
    pub fn backend(&self) -> &Backend {
        &self.backend
    }

    /// The GPU program behind a [`Backend::Gpu`] program (its kernel graph, compile statistics,
    /// device-resident runs, CUDA-graph capture); `None` on the interpreter.
    ///
    /// ```
    /// # use sinter::{graph, Backend, Program};
    /// let p = Program::compile(graph! { fn f(x: f32[N]) -> f32[N] { x.exp() } }?, Backend::Interpreter)?;
    /// assert!(p.gpu_program().is_none());
    /// # Ok::<(), sinter::Error>(())
    /// ```
    pub fn gpu_program(&self) -> Option<&GpuProgram> {
        match &self.runner {
            Runner::Gpu(p) => Some(p),
            Runner::Interpreter(_) => None,
        }
    }

    fn param_type(&self, name: &str) -> Result<&TensorType, Error> {
        let f = self.graph.func(&self.entry).ok_or(Error::NoEntry)?;
        match f.param_named(name) {
            Some(v) => Ok(f.ty(v)),
            None => Err(Error::UnknownInput {
                func: self.entry.clone(),
                name: name.to_string(),
                known: f.params.iter().map(|&p| f.label(p).trim_start_matches('%').to_string()).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    fn check(&self, name: &str, t: &Tensor) -> Result<(), Error> {
        let declared = self.param_type(name)?;
        let const_ok = declared.shape.iter().zip(t.shape()).all(|(d, &n)| d.as_const().is_none_or(|c| c == n as i64));
        if declared.dtype != t.dtype() || declared.rank() != t.rank() || !const_ok {
            return Err(Error::InputMismatch { name: name.to_string(), declared: declared.clone(), dtype: t.dtype(), shape: t.shape().to_vec() });
        }
        Ok(())
    }

    /// Binds a weight (or any parameter that stays the same between runs) by name. Pass an
    /// `Arc<Tensor>` to share one tensor between programs (prefill and decode) without a copy.
    /// On the GPU the tensor is uploaded now and kept on the device, and once every weight the
    /// passes hoisted work on is bound ([`GpuProgram::weights`]), that work runs once
    /// ([`GpuProgram::fold_bound`]); an input given to [`Program::run`] in place of such a
    /// weight runs the program as compiled.
    ///
    /// ```
    /// # use sinter::{graph, Backend, DType, Program, Tensor};
    /// let g = graph! { fn f(x: f32[N], w: f32[N]) -> f32[N] { x * w } }?;
    /// let mut p = Program::compile(g, Backend::Interpreter)?;
    /// p.bind("w", Tensor::full(DType::F32, &[2], 3.0))?;
    /// assert!(p.bind("nope", Tensor::scalar(DType::F32, 0.0)).is_err());
    /// # Ok::<(), sinter::Error>(())
    /// ```
    ///
    /// # Errors
    /// [`Error::UnknownInput`] for a name the entry does not have, [`Error::InputMismatch`]
    /// when the dtype, the rank or a constant dimension disagrees; on the GPU, out of device
    /// memory.
    pub fn bind(&mut self, name: &str, t: impl Into<Arc<Tensor>>) -> Result<(), Error> {
        let t = t.into();
        self.check(name, &t)?;
        match &mut self.runner {
            Runner::Interpreter(bound) => {
                bound.insert(name.to_string(), t);
            }
            Runner::Gpu(p) => {
                p.bind(name, &t)?;
                // Once every weight is bound, the load-time kernels (work on weights and
                // constants alone) run, once; rebinding a weight they read runs them again.
                if p.weights_bound() {
                    p.fold_bound()?;
                }
            }
        }
        Ok(())
    }

    /// Whether a parameter has been bound.
    ///
    /// ```
    /// # use sinter::{graph, Backend, DType, Program, Tensor};
    /// let mut p = Program::compile(graph! { fn f(x: f32[2], w: f32[2]) -> f32[2] { x * w } }?, Backend::Interpreter)?;
    /// p.bind("w", Tensor::full(DType::F32, &[2], 1.0))?;
    /// assert!(p.is_bound("w") && !p.is_bound("x"));
    /// # Ok::<(), sinter::Error>(())
    /// ```
    pub fn is_bound(&self, name: &str) -> bool {
        self.bound_type(name).is_some()
    }

    /// The dtype and shape of what is bound to `name`.
    fn bound_type(&self, name: &str) -> Option<(DType, Vec<usize>)> {
        match &self.runner {
            Runner::Interpreter(bound) => bound.get(name).map(|t| (t.dtype(), t.shape().to_vec())),
            Runner::Gpu(p) => p.bound_buffer(name).map(|b| (b.dtype(), b.shape().to_vec())),
        }
    }

    /// The entry function's parameters that are neither bound nor in `given`, by name.
    ///
    /// ```
    /// # use sinter::{graph, Backend, Program};
    /// let p = Program::compile(graph! { fn f(x: f32[2], w: f32[2], b: f32[2]) -> f32[2] { x * w + b } }?, Backend::Interpreter)?;
    /// assert_eq!(p.unbound(&["x"]), vec!["w".to_string(), "b".to_string()]);
    /// # Ok::<(), sinter::Error>(())
    /// ```
    pub fn unbound(&self, given: &[&str]) -> Vec<String> {
        let Some(f) = self.graph.func(&self.entry) else { return vec![] };
        f.params.iter().filter_map(|&p| f.values[p].name.clone()).filter(|n| !self.is_bound(n) && !given.contains(&n.as_str())).collect()
    }

    /// The symbols of the entry's parameter types, from the explicit `symbols` and the
    /// arguments' shapes (`args`: every parameter's name, dtype and shape, in order), each
    /// symbol given one value; then every dimension checked against them. Both backends run
    /// this first, so bad shapes are the same errors on both.
    fn symbols(&self, args: &[(String, DType, Vec<usize>)], symbols: &[(&str, i64)]) -> Result<Bindings, Error> {
        let mut b = Bindings::new();
        let mut from: BTreeMap<String, String> = BTreeMap::new();
        for (k, v) in symbols {
            if let Some(&prev) = b.get(*k) {
                if prev != *v {
                    return Err(Error::SymbolConflict { symbol: k.to_string(), first: prev, first_from: "the given symbols".into(), second: *v, second_from: "the given symbols".into() });
                }
            }
            b.insert(k.to_string(), *v);
            from.insert(k.to_string(), "the given symbols".into());
        }
        for (name, _, shape) in args {
            let ty = self.param_type(name)?;
            for (ax, (d, &n)) in ty.shape.iter().zip(shape).enumerate() {
                let Some(s) = d.as_symbol() else { continue };
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                let here = format!("axis {ax} of `{name}`");
                match b.get(s) {
                    Some(&prev) if prev != n => {
                        return Err(Error::SymbolConflict { symbol: s.to_string(), first: prev, first_from: from.get(s).cloned().unwrap_or_default(), second: n, second_from: here });
                    }
                    Some(_) => {}
                    None => {
                        b.insert(s.to_string(), n);
                        from.insert(s.to_string(), here);
                    }
                }
            }
        }
        for (name, dtype, shape) in args {
            let ty = self.param_type(name)?;
            // A dim over symbols bound nowhere (only explicit ones could) is left to the backend.
            if ty.shape.iter().zip(shape).any(|(d, &n)| d.eval(&b).is_ok_and(|want| want != i64::try_from(n).unwrap_or(i64::MAX))) {
                return Err(Error::InputMismatch { name: name.clone(), declared: ty.clone(), dtype: *dtype, shape: shape.clone() });
            }
        }
        Ok(b)
    }

    /// Runs the entry function with `inputs` (by parameter name; they override bound weights)
    /// and explicit symbol values (symbols are also bound from the inputs' shapes). On the GPU
    /// the inputs are uploaded for this run and the outputs downloaded.
    ///
    /// ```
    /// # use sinter::{graph, Backend, DType, Program, Tensor};
    /// let g = graph! { fn f(x: f32[N]) -> f32[N] { x * 2.0 } }?;
    /// let p = Program::compile(g, Backend::Interpreter)?;
    /// let y = p.run(&[("x", &Tensor::full(DType::F32, &[3], 1.5))], &[])?;
    /// assert_eq!(y[0].data(), &[3.0, 3.0, 3.0]);
    /// # Ok::<(), sinter::Error>(())
    /// ```
    ///
    /// # Errors
    /// Unknown, missing or mismatched inputs ([`Error::UnknownInput`], [`Error::MissingInput`],
    /// [`Error::InputMismatch`], [`Error::SymbolConflict`]), the same on every backend; then
    /// anything the interpreter or the device reports.
    pub fn run(&self, inputs: &[(&str, &Tensor)], symbols: &[(&str, i64)]) -> Result<Vec<Tensor>, Error> {
        let f = self.graph.func(&self.entry).ok_or(Error::NoEntry)?;
        for (name, t) in inputs {
            self.check(name, t)?;
        }
        let given = |name: &str| inputs.iter().find(|(n, _)| *n == name).map(|(_, t)| *t);
        let mut args: Vec<(String, DType, Vec<usize>)> = Vec::with_capacity(f.params.len());
        for &p in &f.params {
            let name = f.values[p].name.clone().unwrap_or_default();
            let (dtype, shape) = match given(&name) {
                Some(t) => (t.dtype(), t.shape().to_vec()),
                None => self.bound_type(&name).ok_or_else(|| Error::MissingInput { func: self.entry.clone(), name: name.clone() })?,
            };
            args.push((name, dtype, shape));
        }
        let bindings = self.symbols(&args, symbols)?;
        match &self.runner {
            Runner::Interpreter(bound) => {
                let tensors: Vec<&Tensor> = args.iter().map(|(n, _, _)| given(n).or_else(|| bound.get(n).map(|t| &**t))).collect::<Option<_>>().ok_or(Error::NoEntry)?;
                Ok(sinter_ir::interp::run(&self.graph, &self.entry, &tensors, &bindings)?)
            }
            Runner::Gpu(p) => p.run_checked(&self.entry, &|n| given(n), &bindings),
        }
    }
}
