//! Element-wise ops (unary, binary with broadcasting, comparisons, `select`) and the
//! single-axis reductions.

use crate::dtype::DType;
use crate::ops::{Op, OpKind};

use super::erf;
use super::tensor::{bcast_strides, broadcast_shapes, round_all, split_at_axis, walk, Tensor};
use super::{attrs, norm_axis, operands_err, type_text, InterpError, Result, Site};

/// max(a, b) that is NaN when either is NaN.
pub(super) fn nan_max(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.max(b)
    }
}

/// min(a, b) that is NaN when either is NaN.
pub(super) fn nan_min(a: f64, b: f64) -> f64 {
    if a.is_nan() || b.is_nan() {
        f64::NAN
    } else {
        a.min(b)
    }
}

/// 1/(1+e⁻ˣ) in f64; saturates to exactly 0 and 1 far out, NaN for NaN.
pub(super) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

/// x·sigmoid(x) in f64 (NaN at x = −inf, as −inf·0 is: IEEE).
pub(super) fn silu(x: f64) -> f64 {
    x * sigmoid(x)
}

/// GELU, erf form: x/2·(1+erf(x/√2)).
pub(super) fn gelu_erf(x: f64) -> f64 {
    0.5 * x * (1.0 + erf(x * std::f64::consts::FRAC_1_SQRT_2))
}

/// GELU, tanh form (GPT-2): x/2·(1+tanh(√(2/π)(x+0.044715x³))).
pub(super) fn gelu_tanh(x: f64) -> f64 {
    let k = (2.0 / std::f64::consts::PI).sqrt();
    0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
}

/// The unary op `op` on `x`.
pub(super) fn unary(op: &Op, x: &Tensor) -> Result<Tensor> {
    use OpKind::*;
    let kind = op.kind;
    let dt = x.dtype;
    if kind == Dequantize {
        let out_dt = attrs::dtype(op, "dtype")?;
        if !dt.is_quantized() || !out_dt.is_float() {
            return operands_err(format!("`dequantize` reads a block-quantized tensor into a float dtype, got {dt} → {out_dt}"));
        }
        let data: Vec<f64> = x.data.iter().map(|&c| out_dt.round(crate::dtype::QCode::from_f64(dt, c).value(dt))).collect();
        return Ok(Tensor::from_parts(out_dt, x.shape.clone(), data));
    }
    if dt.is_quantized() {
        return operands_err(format!("`{}` does not read block-quantized tensors ({dt})", kind.name()));
    }
    if kind == LogicalNot {
        if dt != DType::Bool {
            return operands_err(format!("`logical_not` takes a bool operand, got {dt}"));
        }
        let data = x.data.iter().map(|&v| if v != 0.0 { 0.0 } else { 1.0 }).collect();
        return Ok(Tensor::from_parts(DType::Bool, x.shape.clone(), data));
    }
    let out_dt = if kind == Cast { attrs::dtype(op, "dtype")? } else { dt };
    match kind {
        Cast => {}
        Neg | Abs if dt == DType::Bool => return operands_err(format!("`{}` is not defined on bool", kind.name())),
        Neg | Abs => {}
        _ if !dt.is_float() => return operands_err(format!("`{}` needs a float operand, got {dt}", kind.name())),
        _ => {}
    }
    let f: fn(f64) -> f64 = match kind {
        Neg => |v| -v,
        Abs => f64::abs,
        Exp => f64::exp,
        Log => f64::ln,
        Sqrt => f64::sqrt,
        Rsqrt => |v| 1.0 / v.sqrt(),
        Recip => |v| 1.0 / v,
        Sigmoid => sigmoid,
        Silu => silu,
        Gelu => match attrs::str(op, "form")? {
            "erf" => gelu_erf,
            "tanh" => gelu_tanh,
            other => return super::attr_err(format!("gelu form must be \"erf\" or \"tanh\", got {other:?}")),
        },
        Tanh => f64::tanh,
        Erf => erf,
        Sin => f64::sin,
        Cos => f64::cos,
        Cast => |v| v,
        _ => return super::attr_err(format!("`{}` is not a unary op", kind.name())),
    };
    let mut data: Vec<f64> = x.data.iter().map(|&v| f(v)).collect();
    round_all(out_dt, &mut data);
    Ok(Tensor::from_parts(out_dt, x.shape.clone(), data))
}

/// The per-tensor scale of `quantize_fp8`/`dequantize_fp8`: an f32 scalar.
fn fp8_scale(op: &str, scale: &Tensor) -> Result<f64> {
    match (scale.dtype, scale.shape.as_slice(), scale.data.first()) {
        (DType::F32, [], Some(&s)) => Ok(s),
        _ => operands_err(format!(
            "the scale of `{op}` is one f32 per tensor, a scalar f32[]: operand 1 (`scale`) is {}",
            type_text(scale.dtype, &scale.shape)
        )),
    }
}

/// `quantize_fp8(x, scale)`: x / scale in f32 (the quotient of two f32 values computed in f64
/// and rounded to f32 is the correctly rounded f32 quotient, as `div.rn.f32` gives), then
/// rounded to `f8e4m3` with saturation ([`DType::round`]).
pub(super) fn quantize_fp8(x: &Tensor, scale: &Tensor) -> Result<Tensor> {
    if !x.dtype.is_float() {
        return operands_err(format!("`quantize_fp8` quantizes a float tensor (bf16, f16, f32): operand 0 (`x`) is {}", type_text(x.dtype, &x.shape)));
    }
    let s = fp8_scale("quantize_fp8", scale)?;
    let data = x.data.iter().map(|&v| DType::F8E4M3.round((v / s) as f32 as f64)).collect();
    Ok(Tensor::from_parts(DType::F8E4M3, x.shape.clone(), data))
}

/// `dequantize_fp8(x, scale) {dtype}`: x·scale in f32 (exact in f64: a 4-bit by a 24-bit
/// significand; then one rounding to f32, as `mul.rn.f32` gives), rounded to `dtype`.
pub(super) fn dequantize_fp8(op: &Op, x: &Tensor, scale: &Tensor) -> Result<Tensor> {
    let out_dt = attrs::dtype(op, "dtype")?;
    if x.dtype != DType::F8E4M3 || !out_dt.is_float() {
        return operands_err(format!("`dequantize_fp8` reads f8e4m3 into a float dtype (bf16, f16, f32), got {} → {out_dt}", type_text(x.dtype, &x.shape)));
    }
    let s = fp8_scale("dequantize_fp8", scale)?;
    let data = x.data.iter().map(|&v| out_dt.round((v * s) as f32 as f64)).collect();
    Ok(Tensor::from_parts(out_dt, x.shape.clone(), data))
}

fn bcast(a: &Tensor, b: &Tensor) -> Result<Vec<usize>> {
    broadcast_shapes(&a.shape, &b.shape).map_or_else(
        || operands_err(format!("shapes {} and {} do not broadcast", type_text(a.dtype, &a.shape), type_text(b.dtype, &b.shape))),
        Ok,
    )
}

/// `f(a, b)` element-wise over the broadcast shape `out`, unrounded.
fn map2(a: &Tensor, b: &Tensor, out: &[usize], f: impl Fn(f64, f64) -> f64) -> Vec<f64> {
    if a.shape == b.shape {
        return a.data.iter().zip(&b.data).map(|(&x, &y)| f(x, y)).collect();
    }
    if b.data.len() == 1 && a.shape == out {
        let y = b.data.first().copied().unwrap_or(0.0);
        return a.data.iter().map(|&x| f(x, y)).collect();
    }
    if a.data.len() == 1 && b.shape == out {
        let x = a.data.first().copied().unwrap_or(0.0);
        return b.data.iter().map(|&y| f(x, y)).collect();
    }
    let (sa, sb) = (bcast_strides(&a.shape, out), bcast_strides(&b.shape, out));
    let mut data = Vec::with_capacity(out.iter().product());
    walk(out, [&sa, &sb], [0, 0], |[i, j]| data.push(f(a.data[i], b.data[j])));
    data
}

fn same_dtype(a: &Tensor, b: &Tensor, what: &str) -> Result<()> {
    if a.dtype != b.dtype {
        return operands_err(format!("{what} must share a dtype, got {} and {}", a.dtype, b.dtype));
    }
    Ok(())
}

/// Binary arithmetic with NumPy broadcasting.
pub(super) fn binary(kind: OpKind, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    use OpKind::*;
    same_dtype(a, b, "both operands")?;
    let dt = a.dtype;
    if matches!(kind, LogicalAnd | LogicalOr) {
        if dt != DType::Bool {
            return operands_err(format!("`{}` takes bool operands, got {dt}", kind.name()));
        }
        let out = bcast(a, b)?;
        let and = kind == LogicalAnd;
        let data = map2(a, b, &out, |x, y| {
            let (x, y) = (x != 0.0, y != 0.0);
            f64::from(u8::from(if and { x && y } else { x || y }))
        });
        return Ok(Tensor::from_parts(DType::Bool, out, data));
    }
    if dt == DType::Bool {
        return operands_err(format!("`{}` is not defined on bool", kind.name()));
    }
    if kind == Pow && !dt.is_float() {
        return operands_err(format!("`pow` needs float operands, got {dt}"));
    }
    let out = bcast(a, b)?;
    let mut data = match kind {
        Add => map2(a, b, &out, |x, y| x + y),
        Sub => map2(a, b, &out, |x, y| x - y),
        Mul => map2(a, b, &out, |x, y| x * y),
        Div if dt.is_int() => {
            // Integers are stored exactly; divide as i64, truncating toward zero. A zero
            // divisor leaves NaN (which no integer tensor holds) to be reported below.
            let d = map2(a, b, &out, |x, y| {
                let (x, y) = (x as i64, y as i64);
                if y == 0 {
                    f64::NAN
                } else {
                    x.checked_div(y).map_or(i64::MAX as f64, |q| q as f64)
                }
            });
            if let Some(index) = d.iter().position(|v| v.is_nan()) {
                return Err(InterpError::DivisionByZero { site: Site::default(), index });
            }
            d
        }
        Div => map2(a, b, &out, |x, y| x / y),
        Maximum => map2(a, b, &out, nan_max),
        Minimum => map2(a, b, &out, nan_min),
        Pow => map2(a, b, &out, f64::powf),
        _ => return super::attr_err(format!("`{}` is not a binary op", kind.name())),
    };
    round_all(dt, &mut data);
    Ok(Tensor::from_parts(dt, out, data))
}

/// Comparisons → bool; NaN compares false except under `ne`.
pub(super) fn compare(kind: OpKind, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    use OpKind::*;
    same_dtype(a, b, "both operands")?;
    let out = bcast(a, b)?;
    let t = |c: bool| if c { 1.0 } else { 0.0 };
    let data = match kind {
        Eq => map2(a, b, &out, |x, y| t(x == y)),
        Ne => map2(a, b, &out, |x, y| t(x != y)),
        Lt => map2(a, b, &out, |x, y| t(x < y)),
        Le => map2(a, b, &out, |x, y| t(x <= y)),
        Gt => map2(a, b, &out, |x, y| t(x > y)),
        Ge => map2(a, b, &out, |x, y| t(x >= y)),
        _ => return super::attr_err(format!("`{}` is not a comparison", kind.name())),
    };
    Ok(Tensor::from_parts(DType::Bool, out, data))
}

/// `cond ? a : b`, all three broadcast.
pub(super) fn select(cond: &Tensor, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if cond.dtype != DType::Bool {
        return operands_err(format!("the condition must be bool, got {}", cond.dtype));
    }
    same_dtype(a, b, "both branches")?;
    let out = broadcast_shapes(&cond.shape, &a.shape).and_then(|s| broadcast_shapes(&s, &b.shape));
    let Some(out) = out else {
        return operands_err(format!(
            "shapes {}, {} and {} do not broadcast",
            type_text(cond.dtype, &cond.shape),
            type_text(a.dtype, &a.shape),
            type_text(b.dtype, &b.shape)
        ));
    };
    let (sc, sa, sb) = (bcast_strides(&cond.shape, &out), bcast_strides(&a.shape, &out), bcast_strides(&b.shape, &out));
    let mut data = Vec::with_capacity(out.iter().product());
    walk(&out, [&sc, &sa, &sb], [0, 0, 0], |[c, i, j]| data.push(if cond.data[c] != 0.0 { a.data[i] } else { b.data[j] }));
    Ok(Tensor::from_parts(a.dtype, out, data))
}

/// `argmax` over `axis`: the first index of the largest element, of the first NaN if any; −1
/// for an empty axis.
fn argmax(x: &Tensor, axis: usize, keepdim: bool) -> Result<Tensor> {
    let (outer, n, inner) = split_at_axis(&x.shape, axis);
    let mut data = Vec::with_capacity(outer * inner);
    for o in 0..outer {
        for i in 0..inner {
            let mut best: Option<(usize, f64)> = None;
            for j in 0..n {
                let v = x.data[(o * n + j) * inner + i];
                best = match best {
                    Some((_, b)) if b.is_nan() => best,
                    Some((_, b)) if !(v.is_nan() || v > b) => best,
                    _ => Some((j, v)),
                };
            }
            data.push(best.map_or(-1.0, |(j, _)| j as f64));
        }
    }
    let mut shape = x.shape.clone();
    if keepdim {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(Tensor::from_parts(DType::I64, shape, data))
}

/// `reduce_sum`, `reduce_max`, `reduce_min`, `reduce_mean` (and `argmax`) over one axis.
pub(super) fn reduce(op: &Op, x: &Tensor) -> Result<Tensor> {
    use OpKind::*;
    let kind = op.kind;
    if x.dtype == DType::Bool {
        return operands_err("reductions are not defined on bool");
    }
    if kind == ReduceMean && !x.dtype.is_float() {
        return operands_err(format!("`reduce_mean` needs a float operand, got {}", x.dtype));
    }
    let axis = norm_axis(attrs::int(op, "axis")?, x.rank(), "axis")?;
    let keepdim = attrs::bool(op, "keepdim")?;
    let (outer, n, inner) = split_at_axis(&x.shape, axis);
    if kind == Argmax {
        return argmax(x, axis, keepdim);
    }
    let (init, f): (f64, fn(f64, f64) -> f64) = match kind {
        ReduceSum | ReduceMean => (0.0, |a, v| a + v),
        ReduceMax => (f64::NEG_INFINITY, nan_max),
        ReduceMin => (f64::INFINITY, nan_min),
        _ => return super::attr_err(format!("`{}` is not a reduction", kind.name())),
    };
    let mut data = vec![init; outer * inner];
    for (o, acc) in data.chunks_mut(inner.max(1)).enumerate().take(outer) {
        for j in 0..n {
            let row = &x.data[(o * n + j) * inner..][..inner];
            for (a, &v) in acc.iter_mut().zip(row) {
                *a = f(*a, v);
            }
        }
    }
    if kind == ReduceMean {
        // An empty axis gives 0/0 = NaN.
        let n = n as f64;
        data.iter_mut().for_each(|a| *a /= n);
    }
    round_all(x.dtype, &mut data);
    let mut shape = x.shape.clone();
    if keepdim {
        shape[axis] = 1;
    } else {
        shape.remove(axis);
    }
    Ok(Tensor::from_parts(x.dtype, shape, data))
}
