//! Shape and dtype rules, one per op-table row.
//!
//! A rule reads the operand types and the attributes and returns the result types, or a
//! [`ShapeError`] that states the rule broken in words. The verifier and the builder add the
//! node, the op and the operand shapes around it.

use std::collections::BTreeMap;

use crate::attr::Attrs;
use crate::dim::Dim;
use crate::dtype::DType;
use crate::types::{Signature, TensorType};

/// The rule an op's operands or attributes broke, in words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ShapeError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, ShapeError> {
    Err(ShapeError(msg.into()))
}

/// What a shape rule sees.
pub struct InferCtx<'a> {
    /// The op's attributes (complete: defaults filled in), read by name.
    pub op: &'a dyn Attrs,
    /// Operand types, in order.
    pub inputs: Vec<&'a TensorType>,
    /// For `call`: the callee's signature.
    pub callee: Option<&'a Signature>,
}

impl InferCtx<'_> {
    fn int(&self, name: &str) -> Result<i64, ShapeError> {
        self.op.int(name).ok_or_else(|| ShapeError(format!("attribute `{name}` missing")))
    }
    fn dims(&self, name: &str) -> Result<&[Dim], ShapeError> {
        self.op.dims(name).ok_or_else(|| ShapeError(format!("attribute `{name}` missing")))
    }
    fn dtype(&self, name: &str) -> Result<DType, ShapeError> {
        self.op.dtype(name).ok_or_else(|| ShapeError(format!("attribute `{name}` missing")))
    }
    fn input(&self, i: usize) -> Result<&TensorType, ShapeError> {
        self.inputs.get(i).copied().ok_or_else(|| ShapeError(format!("operand {i} missing")))
    }
}

/// Resolves a possibly negative axis against a rank.
///
/// # Errors
/// When `axis` is outside `-rank..rank`.
pub fn norm_axis(axis: i64, rank: usize) -> Result<usize, ShapeError> {
    let r = rank as i64;
    let a = if axis < 0 { axis + r } else { axis };
    if a < 0 || a >= r {
        return err(format!("axis {axis} is out of range for rank {rank}"));
    }
    Ok(a as usize)
}

fn shape_text(s: &[Dim]) -> String {
    format!("[{}]", s.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", "))
}

/// NumPy broadcasting of two shapes (right-aligned; equal dims, or one is the constant 1).
///
/// # Errors
/// Names the first pair of axes that do not broadcast.
pub fn broadcast_shapes(a: &[Dim], b: &[Dim]) -> Result<Vec<Dim>, ShapeError> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = (i + a.len()).checked_sub(n).map(|j| &a[j]);
        let db = (i + b.len()).checked_sub(n).map(|j| &b[j]);
        out.push(match (da, db) {
            (Some(x), None) | (None, Some(x)) => x.clone(),
            (Some(x), Some(y)) if x == y => x.clone(),
            (Some(x), Some(y)) if x.is_one() => y.clone(),
            (Some(x), Some(y)) if y.is_one() => x.clone(),
            (Some(x), Some(y)) => {
                return err(format!(
                    "shapes {} and {} do not broadcast: {x} vs {y} at axis {i} of the result",
                    shape_text(a),
                    shape_text(b)
                ))
            }
            (None, None) => unreachable!("i < max(len)"),
        });
    }
    Ok(out)
}

fn check_nonneg(shape: &[Dim], what: &str) -> Result<(), ShapeError> {
    for d in shape {
        if let Some(c) = d.as_const() {
            if c < 0 {
                return err(format!("{what} {} has a negative dimension {c}", shape_text(shape)));
            }
        }
    }
    Ok(())
}

fn same_dtype(a: &TensorType, b: &TensorType, what: &str) -> Result<(), ShapeError> {
    if a.dtype != b.dtype {
        return err(format!("{what} must share a dtype, got {} and {}", a.dtype, b.dtype));
    }
    Ok(())
}

fn want_float(t: &TensorType, what: &str) -> Result<(), ShapeError> {
    if !t.dtype.is_float() {
        return err(format!("{what} must be a float tensor (bf16, f16, f32), got {}", t.dtype));
    }
    Ok(())
}

fn want_int(t: &TensorType, what: &str) -> Result<(), ShapeError> {
    if !t.dtype.is_int() {
        return err(format!("{what} must be an integer tensor (i32 or i64), got {}", t.dtype));
    }
    Ok(())
}

fn want_dtype(t: &TensorType, d: DType, what: &str) -> Result<(), ShapeError> {
    if t.dtype != d {
        return err(format!("{what} must be {d}, got {}", t.dtype));
    }
    Ok(())
}

fn want_rank(t: &TensorType, r: usize, what: &str) -> Result<(), ShapeError> {
    if t.rank() != r {
        return err(format!("{what} must have rank {r}, got {t}"));
    }
    Ok(())
}

fn want_eq(a: &Dim, b: &Dim, what: &str) -> Result<(), ShapeError> {
    if a != b {
        return err(format!("{what}: {a} vs {b}"));
    }
    Ok(())
}

/// Element-wise op on any non-bool dtype.
pub fn unary_any(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    if x.dtype == DType::Bool {
        return err(format!("`{}` is not defined on bool", c.op.op_name()));
    }
    Ok(vec![x.clone()])
}

/// Element-wise op on floats.
pub fn unary_float(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    want_float(x, "the operand")?;
    Ok(vec![x.clone()])
}

/// `cast`.
pub fn cast(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    Ok(vec![TensorType { dtype: c.dtype("dtype")?, shape: x.shape.clone() }])
}

/// `dequantize`: a block-quantized operand whose last axis is a multiple of the block (32, or
/// 256 for the k-quants),
/// a float result dtype, the same shape.
pub fn dequantize(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    let to = c.dtype("dtype")?;
    if !x.dtype.is_quantized() {
        return err(format!("`dequantize` reads a block-quantized tensor (q8_0, q4_1, q5_0, q4_k, q6_k), not {}", x.dtype));
    }
    if !to.is_float() {
        return err(format!("`dequantize` gives a float dtype (bf16, f16, f32), not {to}"));
    }
    Ok(vec![TensorType { dtype: to, shape: x.shape.clone() }])
}

/// `quantize_fp8(x, scale)`: a float `x` (bf16, f16, f32) and a per-tensor scale, an `f32`
/// scalar; the result is `f8e4m3` of x's shape.
pub fn quantize_fp8(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (x, s) = (c.input(0)?, c.input(1)?);
    if !x.dtype.is_float() {
        return err(format!("`quantize_fp8` quantizes a float tensor (bf16, f16, f32): operand 0 (`x`) is {x}"));
    }
    want_fp8_scale(s, "quantize_fp8")?;
    Ok(vec![TensorType { dtype: DType::F8E4M3, shape: x.shape.clone() }])
}

/// `dequantize_fp8(x, scale) {dtype}`: an `f8e4m3` `x`, a per-tensor scale (an `f32` scalar)
/// and a float result dtype; the result has x's shape.
pub fn dequantize_fp8(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (x, s) = (c.input(0)?, c.input(1)?);
    let to = c.dtype("dtype")?;
    if x.dtype != DType::F8E4M3 {
        return err(format!("`dequantize_fp8` reads an f8e4m3 tensor: operand 0 (`x`) is {x}"));
    }
    want_fp8_scale(s, "dequantize_fp8")?;
    if !to.is_float() {
        return err(format!("`dequantize_fp8` gives a float dtype (bf16, f16, f32), not {to}"));
    }
    Ok(vec![TensorType { dtype: to, shape: x.shape.clone() }])
}

/// The scale of `quantize_fp8`/`dequantize_fp8`: one `f32` per tensor, a rank-0 tensor (so it
/// lives in device memory and can change without recompiling, as a per-tensor scale of
/// Transformer Engine or `torch._scaled_mm` does).
fn want_fp8_scale(s: &TensorType, op: &str) -> Result<(), ShapeError> {
    if s.dtype != DType::F32 || !s.shape.is_empty() {
        return err(format!("the scale of `{op}` is one f32 per tensor, a scalar f32[]: operand 1 (`scale`) is {s}"));
    }
    Ok(())
}

/// Arithmetic with broadcasting; operands share a non-bool dtype.
pub fn binary(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (a, b) = (c.input(0)?, c.input(1)?);
    same_dtype(a, b, "both operands")?;
    if a.dtype == DType::Bool {
        return err(format!("`{}` is not defined on bool", c.op.op_name()));
    }
    Ok(vec![TensorType { dtype: a.dtype, shape: broadcast_shapes(&a.shape, &b.shape)? }])
}

/// Float-only binary op.
pub fn binary_float(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    want_float(c.input(0)?, "the first operand")?;
    binary(c)
}

/// Comparison → bool.
pub fn compare(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (a, b) = (c.input(0)?, c.input(1)?);
    same_dtype(a, b, "both operands")?;
    Ok(vec![TensorType { dtype: DType::Bool, shape: broadcast_shapes(&a.shape, &b.shape)? }])
}

/// `logical_and`, `logical_or` (two bool operands, broadcast) and `logical_not` (one) → bool.
pub fn logical(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let mut shape: Vec<Dim> = vec![];
    for (i, t) in c.inputs.iter().enumerate() {
        if t.dtype != DType::Bool {
            return err(format!("`{}` takes bool operands: operand {i} is {t}", c.op.op_name()));
        }
        shape = if i == 0 { t.shape.clone() } else { broadcast_shapes(&shape, &t.shape)? };
    }
    Ok(vec![TensorType { dtype: DType::Bool, shape }])
}

/// `select(cond, a, b)`.
pub fn select(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (k, a, b) = (c.input(0)?, c.input(1)?, c.input(2)?);
    want_dtype(k, DType::Bool, "the condition")?;
    same_dtype(a, b, "both branches")?;
    let s = broadcast_shapes(&k.shape, &a.shape)?;
    Ok(vec![TensorType { dtype: a.dtype, shape: broadcast_shapes(&s, &b.shape)? }])
}

/// Reductions over one axis.
pub fn reduce(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    if x.dtype == DType::Bool {
        return err("reductions are not defined on bool");
    }
    let axis = norm_axis(c.int("axis")?, x.rank())?;
    let mut shape = x.shape.clone();
    if c.op.bool("keepdim").unwrap_or(true) {
        shape[axis] = Dim::constant(1);
    } else {
        shape.remove(axis);
    }
    Ok(vec![TensorType { dtype: x.dtype, shape }])
}

/// `reduce_mean`: a reduction over one axis of a float operand.
pub fn reduce_mean(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    if x.dtype != DType::Bool {
        want_float(x, "the operand of reduce_mean")?;
    }
    reduce(c)
}

/// `argmax`: a reduction over one axis whose result is an `i64` index.
pub fn argmax(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let mut t = reduce(c)?;
    t[0].dtype = DType::I64;
    Ok(t)
}

/// softmax / log_softmax.
pub fn row_op(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    want_float(x, "the operand")?;
    norm_axis(c.int("axis")?, x.rank())?;
    Ok(vec![x.clone()])
}

/// `transpose`.
pub fn transpose(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    let a = norm_axis(c.int("dim0")?, x.rank())?;
    let b = norm_axis(c.int("dim1")?, x.rank())?;
    let mut shape = x.shape.clone();
    shape.swap(a, b);
    Ok(vec![TensorType { dtype: x.dtype, shape }])
}

/// `permute`.
pub fn permute(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    let perm = c.op.ints("perm").unwrap_or(&[]);
    let mut seen = vec![false; x.rank()];
    if perm.len() != x.rank() {
        return err(format!("perm {perm:?} has {} entries for a rank-{} operand", perm.len(), x.rank()));
    }
    for &p in perm {
        if p < 0 || p as usize >= x.rank() || std::mem::replace(&mut seen[p as usize], true) {
            return err(format!("perm {perm:?} is not a permutation of 0..{}", x.rank()));
        }
    }
    Ok(vec![TensorType { dtype: x.dtype, shape: perm.iter().map(|&p| x.shape[p as usize].clone()).collect() }])
}

/// `reshape`: element counts must be equal as canonical polynomials.
pub fn reshape(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    let shape = c.dims("shape")?.to_vec();
    check_nonneg(&shape, "target shape")?;
    let (from, to) = (x.numel(), Dim::product(&shape));
    if from != to {
        return err(format!(
            "cannot reshape {} ({from} elements) to {} ({to} elements)",
            shape_text(&x.shape),
            shape_text(&shape)
        ));
    }
    Ok(vec![TensorType { dtype: x.dtype, shape }])
}

/// `broadcast` (expand).
pub fn broadcast(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    let shape = c.dims("shape")?.to_vec();
    check_nonneg(&shape, "target shape")?;
    if x.rank() > shape.len() {
        return err(format!("cannot broadcast rank-{} {} to rank-{} {}", x.rank(), shape_text(&x.shape), shape.len(), shape_text(&shape)));
    }
    let off = shape.len() - x.rank();
    for (i, d) in x.shape.iter().enumerate() {
        if d != &shape[off + i] && !d.is_one() {
            return err(format!("cannot broadcast {} to {}: axis {i} is {d}, not 1 or {}", shape_text(&x.shape), shape_text(&shape), shape[off + i]));
        }
    }
    Ok(vec![TensorType { dtype: x.dtype, shape }])
}

/// `concat`.
pub fn concat(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let first = c.inputs.first().ok_or_else(|| ShapeError("concat needs at least one operand".into()))?;
    let axis = norm_axis(c.int("axis")?, first.rank())?;
    let mut total = Dim::constant(0);
    for (i, t) in c.inputs.iter().enumerate() {
        same_dtype(first, t, "all operands")?;
        if t.rank() != first.rank() {
            return err(format!("operand {i} has rank {}, operand 0 rank {}", t.rank(), first.rank()));
        }
        for (ax, (a, b)) in first.shape.iter().zip(&t.shape).enumerate() {
            if ax != axis && a != b {
                return err(format!("operand {i} differs from operand 0 at axis {ax}: {b} vs {a}"));
            }
        }
        total = total.add(&t.shape[axis]);
    }
    let mut shape = first.shape.clone();
    shape[axis] = total;
    Ok(vec![TensorType { dtype: first.dtype, shape }])
}

/// The `ranks` attribute of a collective: at least 1.
fn ranks(c: &InferCtx<'_>) -> Result<i64, ShapeError> {
    let r = c.int("ranks")?;
    if r < 1 {
        return err(format!("`ranks` is {r}; a tensor-parallel group has at least 1 rank"));
    }
    Ok(r)
}

/// `all_reduce`: a float operand, the same type.
pub fn all_reduce(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    ranks(c)?;
    want_float(x, "the operand")?;
    Ok(vec![x.clone()])
}

/// `all_gather`: `axis` grows `ranks` times.
pub fn all_gather(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    let r = ranks(c)?;
    if x.dtype.is_quantized() {
        return err(format!("`all_gather` moves whole elements, not {} blocks", x.dtype));
    }
    let axis = norm_axis(c.int("axis")?, x.rank())?;
    let mut shape = x.shape.clone();
    shape[axis] = shape[axis].mul(&Dim::constant(r));
    Ok(vec![TensorType { dtype: x.dtype, shape }])
}

/// `slice`.
pub fn slice(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let x = c.input(0)?;
    let axis = norm_axis(c.int("axis")?, x.rank())?;
    let start = c.op.dim("start").cloned().unwrap_or_else(|| Dim::constant(0));
    let end = c.op.dim("end").cloned().unwrap_or_else(|| Dim::constant(0));
    let len = end.sub(&start);
    let size = &x.shape[axis];
    if let Some(s) = start.as_const() {
        if s < 0 {
            return err(format!("slice start {s} is negative"));
        }
    }
    if let Some(l) = len.as_const() {
        if l < 0 {
            return err(format!("slice {start}..{end} ends before it starts"));
        }
    }
    if let Some(over) = end.sub(size).as_const() {
        if over > 0 {
            return err(format!("slice end {end} is past the axis size {size}"));
        }
    }
    let mut shape = x.shape.clone();
    shape[axis] = len;
    Ok(vec![TensorType { dtype: x.dtype, shape }])
}

/// `gather` (embedding lookup).
pub fn gather(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (table, idx) = (c.input(0)?, c.input(1)?);
    if table.rank() == 0 {
        return err("the table must have rank ≥ 1");
    }
    want_int(idx, "the indices")?;
    let mut shape = idx.shape.clone();
    shape.extend(table.shape[1..].iter().cloned());
    Ok(vec![TensorType { dtype: table.dtype, shape }])
}

/// `constant`.
pub fn constant(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let shape = c.dims("shape")?.to_vec();
    check_nonneg(&shape, "shape")?;
    Ok(vec![TensorType { dtype: c.dtype("dtype")?, shape }])
}

/// `iota`.
pub fn iota(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let shape = c.dims("shape")?.to_vec();
    check_nonneg(&shape, "shape")?;
    let dtype = c.dtype("dtype")?;
    if dtype == DType::Bool {
        return err("iota cannot produce bool");
    }
    norm_axis(c.int("axis")?, shape.len())?;
    Ok(vec![TensorType { dtype, shape }])
}

/// `matmul`.
pub fn matmul(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (a, b) = (c.input(0)?, c.input(1)?);
    same_dtype(a, b, "both operands")?;
    if a.dtype == DType::Bool {
        return err("matmul is not defined on bool");
    }
    if a.rank() < 2 || b.rank() < 2 {
        return err(format!("matmul operands need rank ≥ 2, got {a} and {b}"));
    }
    let (ra, rb) = (a.rank(), b.rank());
    let (mut m, mut ka) = (a.shape[ra - 2].clone(), a.shape[ra - 1].clone());
    if c.op.bool("transpose_a") == Some(true) {
        std::mem::swap(&mut m, &mut ka);
    }
    let (mut kb, mut n) = (b.shape[rb - 2].clone(), b.shape[rb - 1].clone());
    if c.op.bool("transpose_b") == Some(true) {
        std::mem::swap(&mut kb, &mut n);
    }
    want_eq(&ka, &kb, "the contracted dimensions differ")?;
    let mut shape = broadcast_shapes(&a.shape[..ra - 2], &b.shape[..rb - 2])?;
    shape.push(m);
    shape.push(n);
    Ok(vec![TensorType { dtype: a.dtype, shape }])
}

/// `rope`.
pub fn rope(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (x, pos) = (c.input(0)?, c.input(1)?);
    want_float(x, "x")?;
    want_int(pos, "positions")?;
    want_finite_attr(c, "theta", "the rotary base", Some((0.0, true)))?;
    let r = x.rank();
    if r == 0 {
        return err("x must have rank ≥ 1");
    }
    let d = x.shape[r - 1].as_const();
    if let Some(d) = d {
        if d % 2 != 0 {
            return err(format!("the rotary axis must be even, got {d}"));
        }
    }
    crate::rope::rotary_dim(c.op, d).map_err(ShapeError)?;
    crate::rope::scaling(c.op).map_err(ShapeError)?;
    let lead = &x.shape[..r - 1];
    if broadcast_shapes(&pos.shape, lead).ok().as_deref() != Some(lead) {
        return err(format!("positions {} do not broadcast to {} (x's shape without its last axis)", shape_text(&pos.shape), shape_text(lead)));
    }
    Ok(vec![x.clone()])
}

/// `rotary`: x float [..., D]; `cos` and `sin` of one float dtype, each [..., R] broadcasting
/// against x[..., :R] (R = `rotary_dim`, default D; even, 2 ≤ R ≤ D); the result is x's type.
pub fn rotary(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (x, cos, sin) = (c.input(0)?, c.input(1)?, c.input(2)?);
    want_float(x, "x")?;
    want_float(cos, "cos")?;
    want_float(sin, "sin")?;
    if cos.dtype != sin.dtype {
        return err(format!("cos and sin must share a dtype, got {} and {}", cos.dtype, sin.dtype));
    }
    let r = x.rank();
    if r == 0 {
        return err("x must have rank ≥ 1");
    }
    let d = x.shape[r - 1].as_const();
    if let (Some(d), None) = (d, c.op.int("rotary_dim")) {
        if d % 2 != 0 {
            return err(format!("the rotary axis must be even, got {d}"));
        }
    }
    let rd = crate::rope::rotary_dim(c.op, d).map_err(ShapeError)?;
    let rdim = rd.map(Dim::constant).unwrap_or_else(|| x.shape[r - 1].clone());
    let mut rotated = x.shape.clone();
    rotated[r - 1] = rdim.clone();
    for (t, name) in [(cos, "cos"), (sin, "sin")] {
        if t.shape.last() != Some(&rdim) {
            let last = t.shape.last().map_or_else(|| "none (a scalar)".to_string(), |l| l.to_string());
            return err(format!("{name}'s last axis is {last}, not the {rdim} rotated features (x's last axis, or `rotary_dim`)"));
        }
        if broadcast_shapes(&t.shape, &rotated).ok().as_deref() != Some(&rotated[..]) {
            return err(format!("{name} {} does not broadcast against x's rotated features {}", shape_text(&t.shape), shape_text(&rotated)));
        }
    }
    Ok(vec![x.clone()])
}

/// Float attribute `name` (if given) as a finite `f32` (its `f32` rounding finite too), and at
/// least `min` (`(m, true)`: above `m`) where a bound is given; else an error naming the
/// attribute, what it is for (when `what` is not empty), and the value.
fn want_finite_attr(c: &InferCtx<'_>, name: &str, what: &str, min: Option<(f64, bool)>) -> Result<(), ShapeError> {
    let Some(v) = c.op.float(name) else { return Ok(()) };
    let attr = if what.is_empty() { format!("attribute `{name}`") } else { format!("attribute `{name}` ({what})") };
    if !v.is_finite() || !(v as f32).is_finite() {
        return err(format!("{attr} must be a finite f32 number, got {v:?}"));
    }
    match min {
        Some((m, true)) if v <= m => err(format!("{attr} must be above {m}, got {v:?}")),
        // Kernels read the attribute as an f32: above the bound there too (1e-46 is 0 in f32).
        Some((m, true)) if f64::from(v as f32) <= m => err(format!("{attr} must be above {m} as an f32 (kernels read it as one), got {v:?}, which is {} in f32", v as f32)),
        Some((m, false)) if v < m => err(format!("{attr} must be at least {m}, got {v:?}")),
        _ => Ok(()),
    }
}

fn norm_weight(x: &TensorType, w: &TensorType, what: &str) -> Result<(), ShapeError> {
    want_float(x, "x")?;
    same_dtype(x, w, &format!("x and {what}"))?;
    if x.rank() == 0 {
        return err("x must have rank ≥ 1");
    }
    if w.rank() != 1 || w.shape[0] != x.shape[x.rank() - 1] {
        return err(format!("{what} must be [{}] (the last axis of x), got {}", x.shape[x.rank() - 1], shape_text(&w.shape)));
    }
    Ok(())
}

/// `rms_norm`.
pub fn rms_norm(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (x, w) = (c.input(0)?, c.input(1)?);
    norm_weight(x, w, "weight")?;
    want_finite_attr(c, "eps", "added to the mean square", Some((0.0, false)))?;
    Ok(vec![x.clone()])
}

/// `layer_norm`.
pub fn layer_norm(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (x, w, b) = (c.input(0)?, c.input(1)?, c.input(2)?);
    norm_weight(x, w, "weight")?;
    norm_weight(x, b, "bias")?;
    want_finite_attr(c, "eps", "added to the variance", Some((0.0, false)))?;
    Ok(vec![x.clone()])
}

/// `swiglu`.
pub fn swiglu(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (g, u) = (c.input(0)?, c.input(1)?);
    want_float(g, "gate")?;
    if g != u {
        return err(format!("gate and up must have one type, got {g} and {u}"));
    }
    Ok(vec![g.clone()])
}

fn heads(c: &InferCtx<'_>) -> Result<(i64, i64), ShapeError> {
    let (h, hkv) = (c.int("heads")?, c.int("kv_heads")?);
    if h <= 0 || hkv <= 0 || h % hkv != 0 {
        return err(format!("heads ({h}) must be a positive multiple of kv_heads ({hkv})"));
    }
    Ok((h, hkv))
}

/// The sliding window and the softcap of `attention`/`paged_attention`: `window` an integer
/// in `1..=i32::MAX` that needs `causal=true`, `softcap` a finite f32 above 0.
fn window_softcap(c: &InferCtx<'_>) -> Result<(), ShapeError> {
    if let Some(w) = c.op.int("window") {
        if !(1..=i32::MAX as i64).contains(&w) {
            return err(format!("attribute `window` (keys each query sees) must be in 1..={}, got {w}", i32::MAX));
        }
        if c.op.bool("causal") != Some(true) {
            return err(format!("attribute `window={w}` is a causal sliding window: it needs `causal=true`"));
        }
    }
    want_finite_attr(c, "softcap", "the scores' soft cap", Some((0.0, true)))
}

/// `attention`.
pub fn attention(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (q, k, v) = (c.input(0)?, c.input(1)?, c.input(2)?);
    for (t, n) in [(q, "q"), (k, "k"), (v, "v")] {
        want_rank(t, 4, n)?;
        want_float(t, n)?;
        same_dtype(q, t, &format!("q and {n}"))?;
    }
    // Axes of B, H, S, D in the layout.
    let (hx, sx) = if c.op.str("layout") == Some("bshd") { (2, 1) } else { (1, 2) };
    let (h, hkv) = heads(c)?;
    want_finite_attr(c, "scale", "the scores' factor", None)?;
    window_softcap(c)?;
    want_eq(&q.shape[hx], &Dim::constant(h), "q's head axis must equal `heads`")?;
    want_eq(&k.shape[hx], &Dim::constant(hkv), "k's head axis must equal `kv_heads`")?;
    want_eq(&v.shape[hx], &Dim::constant(hkv), "v's head axis must equal `kv_heads`")?;
    want_eq(&q.shape[0], &k.shape[0], "q and k batch sizes differ")?;
    want_eq(&q.shape[0], &v.shape[0], "q and v batch sizes differ")?;
    want_eq(&q.shape[3], &k.shape[3], "q and k head dims differ")?;
    want_eq(&k.shape[sx], &v.shape[sx], "k and v sequence lengths differ")?;
    if let Some(m) = c.inputs.get(3) {
        want_float(m, "the additive mask")?;
        let full = [q.shape[0].clone(), Dim::constant(h), q.shape[sx].clone(), k.shape[sx].clone()];
        if broadcast_shapes(&m.shape, &full).ok().as_ref() != Some(&full.to_vec()) {
            return err(format!("the mask {} does not broadcast to [B, H, Sq, Skv] = {}", shape_text(&m.shape), shape_text(&full)));
        }
    }
    let mut out = q.clone();
    out.shape[3] = v.shape[3].clone();
    Ok(with_lse(c, out))
}

/// The result types of an attention op: `out`, and with `lse=true` also its rows'
/// log-sum-exp, f32 of `out`'s shape without the last axis.
fn with_lse(c: &InferCtx<'_>, out: TensorType) -> Vec<TensorType> {
    if c.op.bool("lse") == Some(true) {
        let lse = TensorType { dtype: DType::F32, shape: out.shape[..out.shape.len() - 1].to_vec() };
        vec![out, lse]
    } else {
        vec![out]
    }
}

/// `attention_merge(o_a, lse_a, o_b, lse_b) -> (o, lse)`.
pub fn attention_merge(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (oa, la, ob, lb) = (c.input(0)?, c.input(1)?, c.input(2)?, c.input(3)?);
    want_float(oa, "o_a")?;
    if oa.shape.is_empty() {
        return err(format!("o_a must have a head-dim axis, got {oa}"));
    }
    if oa != ob {
        return err(format!("o_a and o_b must have one type, got {oa} and {ob}"));
    }
    let rows = &oa.shape[..oa.shape.len() - 1];
    for (l, n) in [(la, "lse_a"), (lb, "lse_b")] {
        if l.dtype != DType::F32 || l.shape != rows {
            return err(format!("{n} must be f32{} (o's shape without its last axis), got {l}", shape_text(rows)));
        }
    }
    Ok(vec![oa.clone(), la.clone()])
}

fn check_pages(kp: &TensorType, vp: &TensorType, hkv: Option<i64>) -> Result<(), ShapeError> {
    want_rank(kp, 4, "k_pages ([pages, page_size, kv_heads, head_dim])")?;
    want_float(kp, "k_pages")?;
    if kp != vp {
        return err(format!("k_pages and v_pages must have one type, got {kp} and {vp}"));
    }
    if let Some(h) = hkv {
        want_eq(&kp.shape[2], &Dim::constant(h), "the pages' head axis must equal `kv_heads`")?;
    }
    Ok(())
}

fn check_tables(bt: &TensorType, lens: &TensorType, batch: &Dim, lens_name: &str) -> Result<(), ShapeError> {
    want_rank(bt, 2, "block_table ([batch, max_pages])")?;
    want_dtype(bt, DType::I32, "block_table")?;
    want_rank(lens, 1, lens_name)?;
    want_dtype(lens, DType::I32, lens_name)?;
    want_eq(&bt.shape[0], batch, "block_table's batch differs")?;
    want_eq(&lens.shape[0], batch, &format!("{lens_name}'s batch differs"))?;
    Ok(())
}

/// `kv_append`.
pub fn kv_append(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (kp, vp, kn, vn, bt, sp) = (c.input(0)?, c.input(1)?, c.input(2)?, c.input(3)?, c.input(4)?, c.input(5)?);
    check_pages(kp, vp, None)?;
    want_rank(kn, 4, "k_new ([batch, T, kv_heads, head_dim])")?;
    if kn != vn {
        return err(format!("k_new and v_new must have one type, got {kn} and {vn}"));
    }
    same_dtype(kp, kn, "the pages and the new rows")?;
    want_eq(&kn.shape[2], &kp.shape[2], "k_new's head axis differs from the pages'")?;
    want_eq(&kn.shape[3], &kp.shape[3], "k_new's head dim differs from the pages'")?;
    check_tables(bt, sp, &kn.shape[0], "start_pos")?;
    Ok(vec![kp.clone(), vp.clone()])
}

/// `paged_attention`.
pub fn paged_attention(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let (q, kp, vp, bt, lens) = (c.input(0)?, c.input(1)?, c.input(2)?, c.input(3)?, c.input(4)?);
    let (h, hkv) = heads(c)?;
    want_rank(q, 4, "q ([batch, heads, T, head_dim])")?;
    want_float(q, "q")?;
    check_pages(kp, vp, Some(hkv))?;
    same_dtype(q, kp, "q and the pages")?;
    want_eq(&q.shape[1], &Dim::constant(h), "q's head axis must equal `heads`")?;
    want_eq(&q.shape[3], &kp.shape[3], "q's head dim differs from the pages'")?;
    check_tables(bt, lens, &q.shape[0], "seq_lens")?;
    want_finite_attr(c, "scale", "the scores' factor", None)?;
    want_finite_attr(c, "unified_max", "", None)?;
    window_softcap(c)?;
    Ok(with_lse(c, q.clone()))
}

/// Binds the callee's symbols from the arguments and checks the rest.
pub fn call(c: &InferCtx<'_>) -> Result<Vec<TensorType>, ShapeError> {
    let sig = c.callee.ok_or_else(|| ShapeError("the callee is not defined before this call".into()))?;
    let name = c.op.str("func").unwrap_or("?");
    if sig.params.len() != c.inputs.len() {
        return err(format!("@{name} takes {} arguments, got {}", sig.params.len(), c.inputs.len()));
    }
    let mut map: BTreeMap<String, Dim> = BTreeMap::new();
    for (p, a) in sig.params.iter().zip(&c.inputs) {
        for (pd, ad) in p.shape.iter().zip(&a.shape) {
            if let Some(s) = pd.as_symbol() {
                match map.get(s) {
                    Some(prev) if prev != ad => {
                        return err(format!("@{name}'s symbol {s} is bound to both {prev} and {ad}"));
                    }
                    _ => {
                        map.insert(s.to_string(), ad.clone());
                    }
                }
            }
        }
    }
    for (i, (p, a)) in sig.params.iter().zip(&c.inputs).enumerate() {
        let want = TensorType { dtype: p.dtype, shape: p.shape.iter().map(|d| d.substitute(&map)).collect() };
        if &want != *a {
            let declared = if &want == p { String::new() } else { format!(" (declared {p})") };
            return err(format!("argument {i} of @{name} must be {want}{declared}, got {a}"));
        }
    }
    Ok(sig
        .results
        .iter()
        .map(|r| TensorType { dtype: r.dtype, shape: r.shape.iter().map(|d| d.substitute(&map)).collect() })
        .collect())
}
