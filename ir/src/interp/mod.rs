//! The CPU reference interpreter: the ground truth every rewrite and kernel is compared with.
//!
//! [`run`] evaluates one function of a [`Graph`] on concrete [`Tensor`]s. Conventions (see
//! `DESIGN.md`, "Numerical conventions"):
//!
//! - **Arithmetic.** Every op computes in `f64` from its (already rounded) operands and rounds
//!   each result element once to the result's dtype with [`DType::round`] (round to nearest
//!   even for floats). Composite ops round only where their op-table row says so: `rms_norm`
//!   and `layer_norm` round the normalised value to x's dtype before the weight, `swiglu`
//!   rounds `silu(gate)` before the product; everything else (matmul, softmax, rope,
//!   attention, gelu) rounds once. The op table speaks of "f32 statistics": the interpreter
//!   keeps them in `f64`, which is at least as accurate; only `eps` of the norms is first
//!   rounded to `f32`, as the graph adds it in `f32`.
//! - **Independent composites.** `softmax`, `log_softmax`, `rms_norm`, `layer_norm`, `swiglu`,
//!   `gelu` and `attention` are implemented directly, not through their decompositions, and
//!   `attention` / `paged_attention` as a tiled online-softmax loop (FlashAttention-2, Dao
//!   2023, arXiv 2307.08691: key tiles of 16, running max `m`, running sum `l`, the
//!   accumulator rescaled by `exp(m_old − m_new)`, `O = acc / l` at the end), so that a rewrite
//!   test compares two different computations.
//! - **Special values.** NaN propagates through `maximum`/`minimum`, `reduce_max`/`reduce_min`,
//!   softmax rows and attention rows; comparisons with NaN are false except `ne`; `±inf`
//!   follow IEEE rules (a softmax row holding `+inf` is NaN, since `inf − inf` is NaN). A
//!   softmax row of all `−inf` is 0 (`log_softmax`: `−inf`); an attention row with no visible
//!   key is exactly 0. Integer `div` truncates toward zero and division by zero is an error;
//!   integer results that leave the dtype's range saturate (as [`DType::round`] does), they do
//!   not wrap.
//! - **FP8.** `f8e4m3` elements are held as their exact values. Rounding to it is nearest even
//!   with saturation (±inf and finite values beyond ±448 give ±448, NaN stays NaN), as PTX's
//!   `cvt.rn.satfinite.e4m3x2.f32` converts; `quantize_fp8` divides by its per-tensor scale in
//!   f32 first (one IEEE rounding, then the e4m3 one), `dequantize_fp8` multiplies in f32 and
//!   rounds to its dtype. No other arithmetic reads `f8e4m3` (an error naming the operand).
//! - **Symbols** are bound from the input shapes (a parameter dim that is a bare symbol binds
//!   it) together with explicit [`Bindings`]; every other declared dim is evaluated and must
//!   equal the input's. Every node result is checked against its declared type.
//! - **Calls** pass their arguments by reference (weights are never copied per call); the
//!   callee's symbols are bound from the argument shapes, and a symbol of the callee that no
//!   argument binds takes the caller's value of the same name, if it has one.
//! - **Errors**, never panics, for anything a graph or its inputs can get wrong: each
//!   [`InterpError`] names the function, the node (`n3`) and the op ([`Site`]).
//!
//! Values live in an environment of borrowed inputs and owned intermediates; an intermediate
//! is freed after its last use. `transpose`, `permute`, `broadcast`, `reshape` and `slice`
//! materialise their result; `kv_append` copies the pages it updates (it is functional).

// An error names its site (function, node, op, call chain) and the shapes involved; it is
// built once per failed run, so its size does not matter.
#![allow(clippy::result_large_err)]

mod attention;
mod composite;
mod elementwise;
mod kernel_graph;
mod layout;
mod ranks;
mod tensor;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use crate::dim::{Bindings, Dim, DimError};
use crate::dtype::DType;
use crate::graph::{Function, Graph, Node};
use crate::ops::{Op, OpClass, OpKind};

pub use kernel_graph::run_kernel_graph;
pub use ranks::run_ranks;
pub use tensor::Tensor;

/// The error function erf(x) = 2/√π ∫₀ˣ e^(−t²) dt in f64, as the interpreter computes the
/// `erf` op and `gelu`'s erf form: fdlibm's `s_erf.c` as the `libm` crate carries it (error
/// below 1 ulp over the whole range). erf(±0) = ±0, erf(±inf) = ±1, erf(NaN) = NaN.
pub fn erf(x: f64) -> f64 {
    libm::erf(x)
}

/// The most elements one value may have in the interpreter (2^32 `f64`s, 32 GiB).
pub const MAX_ELEMENTS: usize = 1 << 32;

/// Where an error happened: the function, and the node and op when there is one, with the
/// chain of calls that led there.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Site {
    /// The function being evaluated (without the `@`).
    pub func: String,
    /// The node, when the error is about one.
    pub node: Option<Node>,
    /// The node's op (text name).
    pub op: Option<&'static str>,
    /// The calls that led to `func`, outermost first, each as `@caller n5`.
    pub callers: Vec<String>,
}

impl fmt::Display for Site {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in @{}", self.func)?;
        match (self.node, self.op) {
            (Some(n), Some(op)) => write!(f, ", {n} `{op}`")?,
            (Some(n), None) => write!(f, ", {n}")?,
            _ => {}
        }
        if !self.callers.is_empty() {
            let chain: Vec<&str> = self.callers.iter().rev().map(String::as_str).collect();
            write!(f, " (called from {})", chain.join(", from "))?;
        }
        Ok(())
    }
}

/// Why the interpreter could not evaluate a graph.
///
/// Every variant but [`InterpError::NoSuchFunction`] and [`InterpError::BadTensor`] carries a
/// [`Site`]: the function, node and op where it happened.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// The graph has no function of that name (for [`run_entry`]: no function at all).
    #[error("the graph has no function @{name}")]
    NoSuchFunction {
        /// The name asked for.
        name: String,
    },
    /// A [`Tensor`] could not be built: the data length differs from the shape's count.
    #[error("{message}")]
    BadTensor {
        /// What was wrong.
        message: String,
    },
    /// The wrong number of inputs to a function, arguments to a call or operands to an op.
    #[error("{site}: expected {expected} {what}, got {got}")]
    Arity {
        /// Where.
        site: Site,
        /// `inputs`, `arguments` or `operands`.
        what: &'static str,
        /// The accepted count, in words.
        expected: String,
        /// The count given.
        got: usize,
    },
    /// An input (or a call's argument) does not fit its parameter's declared type.
    #[error("{site}: parameter {param} is declared {declared}, but the input is {actual}: {reason}")]
    InputMismatch {
        /// Where (the function whose parameter it is).
        site: Site,
        /// The parameter (`%x`) and its position.
        param: String,
        /// The declared type, e.g. `bf16[T, 576]`.
        declared: String,
        /// The actual dtype and shape, e.g. `bf16[5, 512]`.
        actual: String,
        /// The rule broken.
        reason: String,
    },
    /// A symbol would be bound to two different sizes.
    #[error("{site}: symbol `{symbol}` is {first} from {first_source} but {second} from {second_source}")]
    SymbolConflict {
        /// Where.
        site: Site,
        /// The symbol.
        symbol: String,
        /// The first value.
        first: i64,
        /// Where the first value came from.
        first_source: String,
        /// The conflicting value.
        second: i64,
        /// Where it came from.
        second_source: String,
    },
    /// A dimension needs a symbol that has no binding.
    #[error("{site}: symbol `{symbol}` is not bound (needed for {needed_by})")]
    UnboundSymbol {
        /// Where.
        site: Site,
        /// The symbol.
        symbol: String,
        /// What needed it.
        needed_by: String,
    },
    /// A dimension overflowed or evaluated to a negative size.
    #[error("{site}: dimension `{dim}` of {needed_by} {problem}")]
    BadDim {
        /// Where.
        site: Site,
        /// The dimension, printed.
        dim: String,
        /// What it is the dimension of.
        needed_by: String,
        /// What is wrong with it.
        problem: String,
    },
    /// An index read from a tensor is out of range: a `gather` index, a `kv_append` slot or
    /// page, a block-table entry or column, a sequence length.
    #[error("{site}: {what} is {index}, outside 0..{len}")]
    IndexOutOfRange {
        /// Where.
        site: Site,
        /// Which index, in words (with its position).
        what: String,
        /// Its value.
        index: i64,
        /// The exclusive upper bound.
        len: i64,
    },
    /// A `slice` whose evaluated bounds are not `0 ≤ start ≤ end ≤ size`.
    #[error("{site}: slice {start}..{end} of axis {axis} does not fit the axis size {size}")]
    SliceBounds {
        /// Where.
        site: Site,
        /// The (normalised) axis.
        axis: usize,
        /// Evaluated start.
        start: i64,
        /// Evaluated end.
        end: i64,
        /// The axis size.
        size: usize,
    },
    /// Integer division by zero.
    #[error("{site}: integer division by zero (element {index} of the result)")]
    DivisionByZero {
        /// Where.
        site: Site,
        /// Row-major index of the first result element whose divisor is 0.
        index: usize,
    },
    /// `rope` over a last axis of odd size.
    #[error("{site}: the rotary (last) axis must have even size, got {size}")]
    OddRotaryAxis {
        /// Where.
        site: Site,
        /// The size of x's last axis.
        size: usize,
    },
    /// A zero-size problem the op table makes an error (a `page_size` of 0 with keys to
    /// store or read).
    #[error("{site}: {message}")]
    ZeroSize {
        /// Where.
        site: Site,
        /// What was zero.
        message: String,
    },
    /// The operands' dtypes or concrete shapes do not fit the op (shapes that only conflict
    /// once symbols are bound, or a graph that was not verified).
    #[error("{site}: {message}")]
    Operands {
        /// Where.
        site: Site,
        /// The rule broken, with the shapes.
        message: String,
    },
    /// A node's result differs from its declared type under the current bindings.
    #[error("{site}: result {result} is declared {declared} ({expected:?} under the bindings), but the op produced {actual}")]
    ResultMismatch {
        /// Where.
        site: Site,
        /// The result (`%v4`).
        result: String,
        /// Its declared type.
        declared: String,
        /// The declared shape evaluated.
        expected: Vec<usize>,
        /// What the op produced (dtype and shape).
        actual: String,
    },
    /// An attribute is missing, of the wrong kind or out of range (an unverified graph).
    #[error("{site}: {message}")]
    Attr {
        /// Where.
        site: Site,
        /// What is wrong.
        message: String,
    },
    /// The graph is ill-formed: an operand used before it is defined, an unknown callee,
    /// calls nested too deep (recursion).
    #[error("{site}: {message}")]
    Malformed {
        /// Where.
        site: Site,
        /// What is wrong.
        message: String,
    },
}

impl InterpError {
    /// The site of the error, if it has one.
    pub fn site(&self) -> Option<&Site> {
        use InterpError::*;
        match self {
            NoSuchFunction { .. } | BadTensor { .. } => None,
            Arity { site, .. }
            | InputMismatch { site, .. }
            | SymbolConflict { site, .. }
            | UnboundSymbol { site, .. }
            | BadDim { site, .. }
            | IndexOutOfRange { site, .. }
            | SliceBounds { site, .. }
            | DivisionByZero { site, .. }
            | OddRotaryAxis { site, .. }
            | ZeroSize { site, .. }
            | Operands { site, .. }
            | ResultMismatch { site, .. }
            | Attr { site, .. }
            | Malformed { site, .. } => Some(site),
        }
    }

    fn site_mut(&mut self) -> Option<&mut Site> {
        use InterpError::*;
        match self {
            NoSuchFunction { .. } | BadTensor { .. } => None,
            Arity { site, .. }
            | InputMismatch { site, .. }
            | SymbolConflict { site, .. }
            | UnboundSymbol { site, .. }
            | BadDim { site, .. }
            | IndexOutOfRange { site, .. }
            | SliceBounds { site, .. }
            | DivisionByZero { site, .. }
            | OddRotaryAxis { site, .. }
            | ZeroSize { site, .. }
            | Operands { site, .. }
            | ResultMismatch { site, .. }
            | Attr { site, .. }
            | Malformed { site, .. } => Some(site),
        }
    }

    /// Fills in the site when the error was raised without one (inside an op).
    fn at(mut self, site: &Site) -> InterpError {
        if let Some(s) = self.site_mut() {
            if s.func.is_empty() {
                *s = site.clone();
            }
        }
        self
    }
}

type Result<T, E = InterpError> = std::result::Result<T, E>;

/// An [`InterpError::Operands`] without a site yet (the dispatcher adds it).
pub(super) fn operands_err<T>(message: impl Into<String>) -> Result<T> {
    Err(InterpError::Operands { site: Site::default(), message: message.into() })
}

/// An [`InterpError::Attr`] without a site yet.
pub(super) fn attr_err<T>(message: impl Into<String>) -> Result<T> {
    Err(InterpError::Attr { site: Site::default(), message: message.into() })
}

/// Evaluates `d` under `b` as a size (≥ 0).
pub(super) fn eval_size(d: &Dim, b: &Bindings, needed_by: &str) -> Result<usize> {
    let v = eval_dim(d, b, needed_by)?;
    usize::try_from(v).map_err(|_| InterpError::BadDim {
        site: Site::default(),
        dim: d.to_string(),
        needed_by: needed_by.to_string(),
        problem: format!("is negative ({v})"),
    })
}

/// Evaluates `d` under `b` as a signed integer.
pub(super) fn eval_dim(d: &Dim, b: &Bindings, needed_by: &str) -> Result<i64> {
    d.eval(b).map_err(|e| match e {
        DimError::Unbound(symbol) => InterpError::UnboundSymbol { site: Site::default(), symbol, needed_by: needed_by.to_string() },
        DimError::Overflow(dim) => {
            InterpError::BadDim { site: Site::default(), dim, needed_by: needed_by.to_string(), problem: "overflows i64".into() }
        }
    })
}

/// `dtype[d0, d1]` for a concrete tensor.
pub(super) fn type_text(dtype: DType, shape: &[usize]) -> String {
    format!("{dtype}[{}]", shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

/// Evaluates function `func` of `g` on `inputs`.
///
/// Symbols of the parameters' declared shapes are bound from the inputs' concrete shapes (a
/// declared dim that is a bare symbol, like `T`, binds it) and from `bindings` (for symbols no
/// input shape determines, e.g. one used only in a `slice` bound); every other declared dim
/// (`T+past`, `576`) is then evaluated and must equal the input's. Returns the function's
/// outputs in order, each checked against its declared type.
///
/// # Errors
/// [`InterpError::NoSuchFunction`]; [`InterpError::Arity`] when the input count differs;
/// [`InterpError::InputMismatch`] naming the parameter, its declared type and the actual
/// shape; [`InterpError::SymbolConflict`] when an input and `bindings` (or two inputs)
/// disagree on a symbol; [`InterpError::UnboundSymbol`]; and every error an op can raise
/// (see [`InterpError`]), each naming the function, the node and the op.
pub fn run(g: &Graph, func: &str, inputs: &[&Tensor], bindings: &Bindings) -> Result<Vec<Tensor>> {
    let f = g.func(func).ok_or_else(|| InterpError::NoSuchFunction { name: func.to_string() })?;
    Evaluator { g, callers: Vec::new(), comm: None }.eval(f, inputs, bindings, None)
}

/// Evaluates the graph's entry function ([`Graph::entry`]: `@main`, else the last defined)
/// on `inputs`, as [`run`] does.
///
/// # Errors
/// As [`run`]; [`InterpError::NoSuchFunction`] when the graph has no function.
pub fn run_entry(g: &Graph, inputs: &[&Tensor], bindings: &Bindings) -> Result<Vec<Tensor>> {
    let f = g.entry().ok_or_else(|| InterpError::NoSuchFunction { name: "main".into() })?;
    Evaluator { g, callers: Vec::new(), comm: None }.eval(f, inputs, bindings, None)
}

/// The deepest chain of calls evaluated (a verified graph cannot recurse; an unverified one
/// could).
const MAX_CALL_DEPTH: usize = 64;

struct Evaluator<'g> {
    g: &'g Graph,
    callers: Vec<String>,
    /// The rank's group when [`run_ranks`] runs it; alone, collectives of one rank only.
    comm: Option<ranks::Comm<'g>>,
}

impl Evaluator<'_> {
    fn site(&self, f: &Function, node: Option<Node>) -> Site {
        Site {
            func: f.name.clone(),
            node,
            op: node.and_then(|n| f.nodes.get(n)).map(|d| d.op.kind.name()),
            callers: self.callers.clone(),
        }
    }

    /// Binds the symbols of `f`'s parameters from `inputs` and `explicit`, then `inherited`
    /// for what is still unbound, and checks every parameter.
    fn bind(&self, f: &Function, inputs: &[&Tensor], explicit: &Bindings, inherited: Option<&Bindings>) -> Result<Bindings> {
        let site = self.site(f, None);
        if inputs.len() != f.params.len() {
            return Err(InterpError::Arity { site, what: "inputs", expected: f.params.len().to_string(), got: inputs.len() });
        }
        // The parameters' types, looked up without indexing (a hand-made function could name a
        // value it does not have).
        let mut types = Vec::with_capacity(f.params.len());
        for &p in &f.params {
            match f.values.get(p) {
                Some(d) => types.push(&d.ty),
                None => return Err(InterpError::Malformed { site, message: format!("parameter {p} is not a value of the function") }),
            }
        }
        let describe = |i: usize| format!("{} (input {i})", f.params.get(i).map(|&p| f.label(p)).unwrap_or_default());
        let mismatch = |i: usize, t: &Tensor, reason: String| InterpError::InputMismatch {
            site: site.clone(),
            param: describe(i),
            declared: types.get(i).map(|t| t.to_string()).unwrap_or_default(),
            actual: type_text(t.dtype(), t.shape()),
            reason,
        };
        let mut b = explicit.clone();
        let mut sources: BTreeMap<String, String> = explicit.keys().map(|k| (k.clone(), "the given bindings".to_string())).collect();
        for (i, (ty, t)) in types.iter().zip(inputs).enumerate() {
            if ty.dtype != t.dtype() {
                return Err(mismatch(i, t, format!("the dtype is {}, not {}", t.dtype(), ty.dtype)));
            }
            if ty.rank() != t.rank() {
                return Err(mismatch(i, t, format!("the rank is {}, not {}", t.rank(), ty.rank())));
            }
            for (ax, (d, &n)) in ty.shape.iter().zip(t.shape()).enumerate() {
                let Some(s) = d.as_symbol() else { continue };
                let here = format!("axis {ax} of {}", describe(i));
                let n = i64::try_from(n).unwrap_or(i64::MAX);
                match b.get(s) {
                    Some(&prev) if prev != n => {
                        return Err(InterpError::SymbolConflict {
                            site,
                            symbol: s.to_string(),
                            first: prev,
                            first_source: sources.get(s).cloned().unwrap_or_default(),
                            second: n,
                            second_source: here,
                        })
                    }
                    Some(_) => {}
                    None => {
                        b.insert(s.to_string(), n);
                        sources.insert(s.to_string(), here);
                    }
                }
            }
        }
        if let Some(outer) = inherited {
            for (k, v) in outer {
                b.entry(k.clone()).or_insert(*v);
            }
        }
        for (i, (ty, t)) in types.iter().zip(inputs).enumerate() {
            for (ax, (d, &n)) in ty.shape.iter().zip(t.shape()).enumerate() {
                let want = eval_dim(d, &b, &format!("axis {ax} of {}", describe(i))).map_err(|e| e.at(&site))?;
                if want != i64::try_from(n).unwrap_or(i64::MAX) {
                    return Err(mismatch(i, t, format!("axis {ax} is {n}, but `{d}` is {want}")));
                }
            }
        }
        Ok(b)
    }

    fn eval(&mut self, f: &Function, inputs: &[&Tensor], explicit: &Bindings, inherited: Option<&Bindings>) -> Result<Vec<Tensor>> {
        let b = self.bind(f, inputs, explicit, inherited)?;
        let nvals = f.values.len();
        let mut env: Vec<Option<Cow<'_, Tensor>>> = Vec::with_capacity(nvals);
        env.resize_with(nvals, || None);
        for (&p, &t) in f.params.iter().zip(inputs) {
            if let Some(slot) = env.get_mut(p.as_u32() as usize) {
                *slot = Some(Cow::Borrowed(t));
            }
        }
        // Uses left per value; outputs hold one extra use so they are never freed.
        let mut uses = vec![0usize; nvals];
        for nd in f.nodes.values() {
            for &v in &nd.inputs {
                if let Some(u) = uses.get_mut(v.as_u32() as usize) {
                    *u += 1;
                }
            }
        }
        for &o in &f.outputs {
            if let Some(u) = uses.get_mut(o.as_u32() as usize) {
                *u += 1;
            }
        }

        for (node, nd) in f.nodes.iter() {
            let site = self.site(f, Some(node));
            let mut ins: Vec<&Tensor> = Vec::with_capacity(nd.inputs.len());
            for &v in &nd.inputs {
                match env.get(v.as_u32() as usize).and_then(|s| s.as_deref()) {
                    Some(t) => ins.push(t),
                    None => {
                        return Err(InterpError::Malformed {
                            site,
                            message: format!("operand {} is not defined before this node", f.label(v)),
                        })
                    }
                }
            }
            let kind = nd.op.kind;
            if !kind.arity_ok(ins.len()) || (kind == OpKind::Concat && ins.is_empty()) {
                return Err(InterpError::Arity {
                    site,
                    what: "operands",
                    expected: format!("{} ({})", kind.arity_text(), kind.info().operands.join(", ")),
                    got: ins.len(),
                });
            }
            // Refuse results the host could not hold before trying to allocate them (an
            // allocation failure aborts the process; it cannot be caught).
            for &r in &nd.results {
                if let Some(d) = f.values.get(r) {
                    // A dim that does not evaluate is reported by the op or the result check.
                    let n = d.ty.shape.iter().map(|dim| eval_size(dim, &b, "").map(|v| v as u128).unwrap_or(0)).fold(1u128, u128::saturating_mul);
                    if n > MAX_ELEMENTS as u128 {
                        return Err(InterpError::Operands {
                            site,
                            message: format!("result {} has {n} elements, more than the interpreter's limit of {MAX_ELEMENTS} (2^32 f64 values, 32 GiB)", f.label(r)),
                        });
                    }
                }
            }
            let results = if kind == OpKind::Call {
                self.call(f, node, &nd.op, &ins, &b)
            } else if kind.info().class == OpClass::Collective {
                self.collective(&nd.op, ins[0], &site)
            } else {
                eval_op(&nd.op, &ins, &b)
            }
            .map_err(|e| e.at(&site))?;
            drop(ins);
            if results.len() != nd.results.len() {
                return Err(InterpError::Malformed {
                    site,
                    message: format!("the op gives {} results, the node declares {}", results.len(), nd.results.len()),
                });
            }
            for (&r, t) in nd.results.iter().zip(results) {
                let label = f.label(r);
                let Some(ty) = f.values.get(r).map(|d| &d.ty) else {
                    return Err(InterpError::Malformed { site, message: format!("result {label} is not a value of the function") });
                };
                let mut expected = Vec::with_capacity(ty.rank());
                for d in &ty.shape {
                    expected.push(eval_size(d, &b, &format!("the declared type of {label}")).map_err(|e| e.at(&site))?);
                }
                if ty.dtype != t.dtype() || expected != t.shape() {
                    return Err(InterpError::ResultMismatch {
                        site,
                        result: label,
                        declared: ty.to_string(),
                        expected,
                        actual: type_text(t.dtype(), t.shape()),
                    });
                }
                if let Some(slot) = env.get_mut(r.as_u32() as usize) {
                    *slot = Some(Cow::Owned(t));
                }
            }
            for &v in &nd.inputs {
                let i = v.as_u32() as usize;
                if let Some(u) = uses.get_mut(i) {
                    *u = u.saturating_sub(1);
                    if *u == 0 {
                        if let Some(slot) = env.get_mut(i) {
                            *slot = None;
                        }
                    }
                }
            }
        }

        let mut outs = Vec::with_capacity(f.outputs.len());
        for (k, &o) in f.outputs.iter().enumerate() {
            let i = o.as_u32() as usize;
            let again = f.outputs.get(k + 1..).is_some_and(|rest| rest.contains(&o));
            let undefined = || InterpError::Malformed { site: self.site(f, None), message: format!("output {} is not defined", f.label(o)) };
            let slot = env.get_mut(i).ok_or_else(undefined)?;
            let t = if again { slot.as_deref().cloned() } else { slot.take().map(Cow::into_owned) };
            let t = t.ok_or_else(undefined)?;
            outs.push(t);
        }
        Ok(outs)
    }

    fn call(&mut self, f: &Function, node: Node, op: &Op, args: &[&Tensor], b: &Bindings) -> Result<Vec<Tensor>> {
        let name = op.str("func").ok_or_else(|| InterpError::Attr { site: Site::default(), message: "`call` needs attribute `func`".into() })?;
        let callee = self.g.func(name).ok_or_else(|| InterpError::Malformed {
            site: Site::default(),
            message: format!("@{name} is not a function of the graph"),
        })?;
        if self.callers.len() >= MAX_CALL_DEPTH {
            return Err(InterpError::Malformed {
                site: Site::default(),
                message: format!("calls nest deeper than {MAX_CALL_DEPTH} (a recursive graph?)"),
            });
        }
        self.callers.push(format!("@{} {node}", f.name));
        let r = self.eval(callee, args, &Bindings::new(), Some(b));
        self.callers.pop();
        r
    }
}

/// Evaluates one non-`call` op on concrete operands.
fn eval_op(op: &Op, ins: &[&Tensor], b: &Bindings) -> Result<Vec<Tensor>> {
    use OpKind::*;
    let x = |i: usize| -> Result<&Tensor> {
        ins.get(i).copied().ok_or_else(|| InterpError::Arity { site: Site::default(), what: "operands", expected: op.kind.arity_text(), got: ins.len() })
    };
    let one = |t: Tensor| Ok(vec![t]);
    if !crate::storage::accepts_fp8(op.kind) {
        if let Some((i, t)) = ins.iter().enumerate().find(|(_, t)| t.dtype.is_fp8()) {
            return operands_err(crate::storage::fp8_operand_message(op.kind, i, &type_text(t.dtype, &t.shape)));
        }
    }
    match op.kind {
        QuantizeFp8 => return one(elementwise::quantize_fp8(x(0)?, x(1)?)?),
        DequantizeFp8 => return one(elementwise::dequantize_fp8(op, x(0)?, x(1)?)?),
        _ => {}
    }
    match op.kind.info().class {
        OpClass::Unary => one(elementwise::unary(op, x(0)?)?),
        OpClass::Binary if op.kind == Select => one(elementwise::select(x(0)?, x(1)?, x(2)?)?),
        OpClass::Binary => one(elementwise::binary(op.kind, x(0)?, x(1)?)?),
        OpClass::Compare => one(elementwise::compare(op.kind, x(0)?, x(1)?)?),
        OpClass::Reduce => one(elementwise::reduce(op, x(0)?)?),
        OpClass::Layout | OpClass::Source => match op.kind {
            Transpose => one(layout::transpose(op, x(0)?)?),
            Permute => one(layout::permute(op, x(0)?)?),
            Reshape => one(layout::reshape(op, x(0)?, b)?),
            Broadcast => one(layout::broadcast(op, x(0)?, b)?),
            Concat => one(layout::concat(op, ins)?),
            Slice => one(layout::slice(op, x(0)?, b)?),
            Gather => one(layout::gather(x(0)?, x(1)?)?),
            Constant => one(layout::constant(op, b)?),
            Iota => one(layout::iota(op, b)?),
            _ => attr_err(format!("`{}` is not a layout or source op", op.kind.name())),
        },
        OpClass::Composite => match op.kind {
            Softmax => one(composite::softmax(op, x(0)?, false)?),
            LogSoftmax => one(composite::softmax(op, x(0)?, true)?),
            Matmul => one(composite::matmul(op, x(0)?, x(1)?)?),
            Rope => one(composite::rope(op, x(0)?, x(1)?)?),
            Rotary => one(composite::rotary(op, x(0)?, x(1)?, x(2)?)?),
            RmsNorm => one(composite::rms_norm(op, x(0)?, x(1)?)?),
            LayerNorm => one(composite::layer_norm(op, x(0)?, x(1)?, x(2)?)?),
            Swiglu => one(composite::swiglu(x(0)?, x(1)?)?),
            Attention => {
                let (o, lse) = attention::attention(op, x(0)?, x(1)?, x(2)?, ins.get(3).copied())?;
                Ok(std::iter::once(o).chain(lse).collect())
            }
            KvAppend => {
                let (k, v) = attention::kv_append(x(0)?, x(1)?, x(2)?, x(3)?, x(4)?, x(5)?)?;
                Ok(vec![k, v])
            }
            PagedAttention => {
                let (o, lse) = attention::paged_attention(op, x(0)?, x(1)?, x(2)?, x(3)?, x(4)?)?;
                Ok(std::iter::once(o).chain(lse).collect())
            }
            AttentionMerge => {
                let (o, lse) = attention::attention_merge(x(0)?, x(1)?, x(2)?, x(3)?)?;
                Ok(vec![o, lse])
            }
            _ => attr_err(format!("`{}` is not a composite op", op.kind.name())),
        },
        OpClass::Call | OpClass::Collective => attr_err(format!("`{}` is evaluated by the evaluator", op.kind.name())),
    }
}

/// Attribute accessors that turn a missing or mistyped attribute into [`InterpError::Attr`].
pub(super) mod attrs {
    use super::{attr_err, Result};
    use crate::dim::Dim;
    use crate::dtype::DType;
    use crate::ops::Op;

    fn missing<T>(op: &Op, name: &str, kind: &str) -> Result<T> {
        attr_err(format!("`{}` needs attribute `{name}` ({kind})", op.kind.name()))
    }
    /// Integer attribute.
    pub fn int(op: &Op, name: &str) -> Result<i64> {
        op.int(name).map_or_else(|| missing(op, name, "an integer"), Ok)
    }
    /// Float attribute.
    pub fn float(op: &Op, name: &str) -> Result<f64> {
        op.float(name).map_or_else(|| missing(op, name, "a number"), Ok)
    }
    /// Bool attribute.
    pub fn bool(op: &Op, name: &str) -> Result<bool> {
        op.bool(name).map_or_else(|| missing(op, name, "true or false"), Ok)
    }
    /// String attribute.
    pub fn str<'a>(op: &'a Op, name: &str) -> Result<&'a str> {
        op.str(name).map_or_else(|| missing(op, name, "a string"), Ok)
    }
    /// Integer-list attribute.
    pub fn ints<'a>(op: &'a Op, name: &str) -> Result<&'a [i64]> {
        op.ints(name).map_or_else(|| missing(op, name, "a list of integers"), Ok)
    }
    /// Dim-list attribute.
    pub fn dims<'a>(op: &'a Op, name: &str) -> Result<&'a [Dim]> {
        op.dims(name).map_or_else(|| missing(op, name, "a list of dims"), Ok)
    }
    /// Dim attribute.
    pub fn dim<'a>(op: &'a Op, name: &str) -> Result<&'a Dim> {
        op.dim(name).map_or_else(|| missing(op, name, "a dim"), Ok)
    }
    /// Dtype attribute.
    pub fn dtype(op: &Op, name: &str) -> Result<DType> {
        op.dtype(name).map_or_else(|| missing(op, name, "a dtype"), Ok)
    }
}

/// Resolves a possibly negative `axis` against `rank`.
pub(super) fn norm_axis(axis: i64, rank: usize, what: &str) -> Result<usize> {
    crate::infer::norm_axis(axis, rank).map_err(|e| InterpError::Attr { site: Site::default(), message: format!("{what}: {e}") })
}
