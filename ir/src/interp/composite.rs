//! Composite ops with their own kernel families: `softmax`, `log_softmax`, `matmul`, `rope`,
//! `rms_norm`, `layer_norm`, `swiglu`. Each is computed directly (not through its
//! decomposition), in f64, rounding where its op-table row says.

use crate::dtype::DType;
use crate::ops::Op;

use super::elementwise::{nan_max, silu};
use super::tensor::{bcast_strides, broadcast_shapes, broadcasts_to, checked_numel, round_all, split_at_axis, walk, Tensor};
use super::{attr_err, attrs, norm_axis, operands_err, type_text, InterpError, Result, Site};

fn want_float(t: &Tensor, what: &str) -> Result<()> {
    if !t.dtype.is_float() {
        return operands_err(format!("{what} must be a float tensor, got {}", type_text(t.dtype, &t.shape)));
    }
    Ok(())
}

/// Safe softmax (or log-softmax) of one row, in place; `row` holds the inputs, `out` gets
/// the results (unrounded).
///
/// - max-subtracted: `e_i = exp(x_i − m)`, `m = max x` (NaN if any x is NaN);
/// - a row of all `−inf` (or an empty row) gives 0 (log-softmax: `−inf`);
/// - NaN anywhere gives a NaN row; `+inf` gives `inf − inf = NaN` terms, so a NaN row (IEEE).
fn softmax_row(row: &[f64], out: &mut [f64], log: bool) {
    let m = row.iter().fold(f64::NEG_INFINITY, |a, &v| nan_max(a, v));
    if m == f64::NEG_INFINITY {
        let fill = if log { f64::NEG_INFINITY } else { 0.0 };
        out.iter_mut().for_each(|o| *o = fill);
        return;
    }
    let mut sum = 0.0;
    for (o, &x) in out.iter_mut().zip(row) {
        let e = (x - m).exp();
        *o = e;
        sum += e;
    }
    if log {
        let lse = sum.ln();
        for (o, &x) in out.iter_mut().zip(row) {
            // −((m − x) + lse): the row max gives −0 when lse is 0, as kernels do in f32.
            *o = -((m - x) + lse);
        }
    } else {
        out.iter_mut().for_each(|o| *o /= sum);
    }
}

/// `softmax` / `log_softmax` over `axis`.
pub(super) fn softmax(op: &Op, x: &Tensor, log: bool) -> Result<Tensor> {
    want_float(x, "the operand")?;
    let axis = norm_axis(attrs::int(op, "axis")?, x.rank(), "axis")?;
    let (outer, n, inner) = split_at_axis(&x.shape, axis);
    let mut data = vec![0.0; x.data.len()];
    if inner == 1 {
        for (src, dst) in x.data.chunks(n.max(1)).zip(data.chunks_mut(n.max(1))) {
            softmax_row(src, dst, log);
        }
    } else {
        let (mut row, mut out) = (vec![0.0; n], vec![0.0; n]);
        for o in 0..outer {
            for i in 0..inner {
                for (j, r) in row.iter_mut().enumerate() {
                    *r = x.data[(o * n + j) * inner + i];
                }
                softmax_row(&row, &mut out, log);
                for (j, &v) in out.iter().enumerate() {
                    data[(o * n + j) * inner + i] = v;
                }
            }
        }
    }
    round_all(x.dtype, &mut data);
    Ok(Tensor::from_parts(x.dtype, x.shape.clone(), data))
}

/// `matmul`: batched `a[…, M, K] · b[…, K, N]` with `matrixmultiply::dgemm` on the f64
/// elements (the transposes are strides, batch axes broadcast by zero strides), one rounding.
pub(super) fn matmul(op: &Op, a: &Tensor, b: &Tensor) -> Result<Tensor> {
    if a.dtype != b.dtype || a.dtype == DType::Bool {
        return operands_err(format!("matmul needs two operands of one non-bool dtype, got {} and {}", a.dtype, b.dtype));
    }
    let (ra, rb) = (a.rank(), b.rank());
    if ra < 2 || rb < 2 {
        return operands_err(format!("matmul operands need rank ≥ 2, got {} and {}", type_text(a.dtype, &a.shape), type_text(b.dtype, &b.shape)));
    }
    let ta = attrs::bool(op, "transpose_a")?;
    let tb = attrs::bool(op, "transpose_b")?;
    let (r0, c0) = (a.shape[ra - 2], a.shape[ra - 1]);
    let (r1, c1) = (b.shape[rb - 2], b.shape[rb - 1]);
    // Element (i, p) of the logical A is at i*rsa + p*csa within one matrix.
    let (m, k, rsa, csa) = if ta { (c0, r0, 1, c0) } else { (r0, c0, c0, 1) };
    let (kb, n, rsb, csb) = if tb { (c1, r1, 1, c1) } else { (r1, c1, c1, 1) };
    if k != kb {
        return operands_err(format!(
            "the contracted dimensions differ: {} vs {} ({} · {}, transpose_a={ta}, transpose_b={tb})",
            k,
            kb,
            type_text(a.dtype, &a.shape),
            type_text(b.dtype, &b.shape)
        ));
    }
    let (abatch, bbatch) = (&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let Some(batch) = broadcast_shapes(abatch, bbatch) else {
        return operands_err(format!("batch axes {abatch:?} and {bbatch:?} do not broadcast"));
    };
    let mut shape = batch.clone();
    shape.extend([m, n]);
    let total = checked_numel(&shape).ok_or_else(|| InterpError::Operands { site: Site::default(), message: format!("result shape {shape:?} is too large") })?;
    let mut data = vec![0.0; total];
    // The invariant `data.len() == numel(shape)` of every Tensor is what makes the raw
    // pointer arithmetic below stay in bounds; check it rather than trust it.
    if a.data.len() != a.shape.iter().product::<usize>() || b.data.len() != b.shape.iter().product::<usize>() {
        return operands_err("internal: tensor data does not match its shape");
    }
    if m > 0 && n > 0 && k > 0 {
        let sa: Vec<usize> = bcast_strides(abatch, &batch).into_iter().map(|s| s * m * k).collect();
        let sb: Vec<usize> = bcast_strides(bbatch, &batch).into_iter().map(|s| s * k * n).collect();
        let mut offsets = Vec::new();
        walk(&batch, [&sa, &sb], [0, 0], |o| offsets.push(o));
        let (ap, bp) = (a.data.as_ptr(), b.data.as_ptr());
        for (c, [oa, ob]) in data.chunks_mut(m * n).zip(offsets) {
            debug_assert!(oa + m * k <= a.data.len() && ob + k * n <= b.data.len());
            // SAFETY: matrix `oa..oa+m*k` lies inside `a.data` (its batch offset is a multiple
            // of m*k below numel(a)), likewise for b, and `c` holds exactly m*n elements;
            // the strides address exactly those matrices.
            unsafe {
                matrixmultiply::dgemm(
                    m,
                    k,
                    n,
                    1.0,
                    ap.add(oa),
                    rsa as isize,
                    csa as isize,
                    bp.add(ob),
                    rsb as isize,
                    csb as isize,
                    0.0,
                    c.as_mut_ptr(),
                    n as isize,
                    1,
                );
            }
        }
    }
    round_all(a.dtype, &mut data);
    Ok(Tensor::from_parts(a.dtype, shape, data))
}

/// `rope`: rotary position embedding over the last axis D.
///
/// The first R = `rotary_dim` features rotate (the rest are copied); `inv_freq_i` and the
/// attention factor `a` come from [`crate::rope::freqs`] (θ^(−2i/R), scaled as the op's
/// `scaling` says); `angle = pos · inv_freq_i` (f64); `rotate_half` rotates pairs (i, i+R/2),
/// `interleaved` pairs (2i, 2i+1): `out_a = x_a·(a·cos) − x_b·(a·sin)`,
/// `out_b = x_b·(a·cos) + x_a·(a·sin)`, as HF scales its cos/sin tables. One rounding.
pub(super) fn rope(op: &Op, x: &Tensor, pos: &Tensor) -> Result<Tensor> {
    want_float(x, "x")?;
    if !pos.dtype.is_int() {
        return operands_err(format!("positions must be i32 or i64, got {}", pos.dtype));
    }
    let interleaved = match attrs::str(op, "form")? {
        "rotate_half" => false,
        "interleaved" => true,
        other => return attr_err(format!("rope form must be \"rotate_half\" or \"interleaved\", got {other:?}")),
    };
    let Some((&d, lead)) = x.shape.split_last() else {
        return operands_err("x must have rank ≥ 1");
    };
    if d % 2 != 0 {
        return Err(InterpError::OddRotaryAxis { site: Site::default(), size: d });
    }
    if !broadcasts_to(&pos.shape, lead) {
        return operands_err(format!(
            "positions {} do not broadcast to x's leading axes {lead:?}",
            type_text(pos.dtype, &pos.shape)
        ));
    }
    let freqs = crate::rope::freqs(op, d).or_else(attr_err)?;
    let half = freqs.rotary_dim / 2;
    let af = freqs.attention_factor;
    let mut data = x.data.clone();
    if d > 0 {
        let st = bcast_strides(&pos.shape, lead);
        let mut rows = data.chunks_mut(d).zip(x.data.chunks(d));
        walk(lead, [&st], [0], |[pi]| {
            let p = pos.data[pi];
            let Some((out, src)) = rows.next() else { return };
            for (i, &f) in freqs.inv_freq.iter().enumerate() {
                let (s, c) = (p * f).sin_cos();
                let (s, c) = (af * s, af * c);
                let (ia, ib) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (xa, xb) = (src[ia], src[ib]);
                out[ia] = xa * c - xb * s;
                out[ib] = xb * c + xa * s;
            }
        });
    }
    round_all(x.dtype, &mut data);
    Ok(Tensor::from_parts(x.dtype, x.shape.clone(), data))
}

/// `rotary(x, cos, sin)`: each rotated feature times its own table entries (the op table's
/// formula), in f64, rounded once to x's dtype.
pub(super) fn rotary(op: &Op, x: &Tensor, cos: &Tensor, sin: &Tensor) -> Result<Tensor> {
    want_float(x, "x")?;
    want_float(cos, "cos")?;
    want_float(sin, "sin")?;
    let interleaved = match attrs::str(op, "form")? {
        "rotate_half" => false,
        "interleaved" => true,
        other => return attr_err(format!("rotary form must be \"rotate_half\" or \"interleaved\", got {other:?}")),
    };
    let Some((&d, lead)) = x.shape.split_last() else {
        return operands_err("x must have rank ≥ 1");
    };
    let r = match crate::rope::rotary_dim(op, i64::try_from(d).ok()).or_else(attr_err)? {
        Some(r) => usize::try_from(r).unwrap_or(usize::MAX),
        None => d,
    };
    if r % 2 != 0 {
        return Err(InterpError::OddRotaryAxis { site: Site::default(), size: r });
    }
    let mut strides = Vec::with_capacity(2);
    for (t, name) in [(cos, "cos"), (sin, "sin")] {
        match t.shape.split_last() {
            Some((&tr, tlead)) if tr == r && broadcasts_to(tlead, lead) => strides.push(bcast_strides(tlead, lead).into_iter().map(|s| s * r).collect::<Vec<_>>()),
            _ => return operands_err(format!("{name} {} does not broadcast against x's rotated features {:?}", type_text(t.dtype, &t.shape), [lead, &[r]].concat())),
        }
    }
    let half = r / 2;
    let mut data = x.data.clone();
    if d > 0 && r > 0 {
        let mut rows = data.chunks_mut(d).zip(x.data.chunks(d));
        walk(lead, [&strides[0], &strides[1]], [0, 0], |[ci, si]| {
            let Some((out, src)) = rows.next() else { return };
            let (c, s) = (&cos.data[ci..ci + r], &sin.data[si..si + r]);
            for i in 0..half {
                let (ia, ib) = if interleaved { (2 * i, 2 * i + 1) } else { (i, i + half) };
                let (xa, xb) = (src[ia], src[ib]);
                out[ia] = xa * c[ia] - xb * s[ia];
                out[ib] = xb * c[ib] + xa * s[ib];
            }
        });
    }
    round_all(x.dtype, &mut data);
    Ok(Tensor::from_parts(x.dtype, x.shape.clone(), data))
}

fn norm_checks(x: &Tensor, w: &Tensor, what: &str) -> Result<usize> {
    want_float(x, "x")?;
    if w.dtype != x.dtype {
        return operands_err(format!("x and {what} must share a dtype, got {} and {}", x.dtype, w.dtype));
    }
    let Some(&d) = x.shape.last() else { return operands_err("x must have rank ≥ 1") };
    if w.shape != [d] {
        return operands_err(format!("{what} must be [{d}] (the last axis of x), got {:?}", w.shape));
    }
    Ok(d)
}

/// The f32 value of the `eps` attribute, as the graph adds it in f32.
fn eps32(op: &Op) -> Result<f64> {
    Ok(attrs::float(op, "eps")? as f32 as f64)
}

/// `rms_norm`: `h = round_x(x / sqrt(mean(x²) + eps32))`, `out = round(h · w)`; mean over the
/// last axis in f64. A zero row gives 0 (0/√eps).
pub(super) fn rms_norm(op: &Op, x: &Tensor, w: &Tensor) -> Result<Tensor> {
    let d = norm_checks(x, w, "weight")?;
    let eps = eps32(op)?;
    let mut data = vec![0.0; x.data.len()];
    if d > 0 {
        for (src, dst) in x.data.chunks(d).zip(data.chunks_mut(d)) {
            let ms = src.iter().map(|v| v * v).sum::<f64>() / d as f64;
            let r = (ms + eps).sqrt();
            for ((o, &v), &wv) in dst.iter_mut().zip(src).zip(&w.data) {
                *o = x.dtype.round(v / r) * wv;
            }
        }
    }
    round_all(x.dtype, &mut data);
    Ok(Tensor::from_parts(x.dtype, x.shape.clone(), data))
}

/// `layer_norm`: `h = round_x((x − mean) / sqrt(var + eps32))` with the biased variance,
/// `out = round(h · w + b)`; statistics over the last axis in f64.
pub(super) fn layer_norm(op: &Op, x: &Tensor, w: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let d = norm_checks(x, w, "weight")?;
    norm_checks(x, bias, "bias")?;
    let eps = eps32(op)?;
    let mut data = vec![0.0; x.data.len()];
    if d > 0 {
        for (src, dst) in x.data.chunks(d).zip(data.chunks_mut(d)) {
            let mean = src.iter().sum::<f64>() / d as f64;
            let var = src.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / d as f64;
            let r = (var + eps).sqrt();
            for (((o, &v), &wv), &bv) in dst.iter_mut().zip(src).zip(&w.data).zip(&bias.data) {
                *o = x.dtype.round((v - mean) / r) * wv + bv;
            }
        }
    }
    round_all(x.dtype, &mut data);
    Ok(Tensor::from_parts(x.dtype, x.shape.clone(), data))
}

/// `swiglu`: `round(round(silu(gate)) · up)`.
pub(super) fn swiglu(gate: &Tensor, up: &Tensor) -> Result<Tensor> {
    want_float(gate, "gate")?;
    if gate.dtype != up.dtype || gate.shape != up.shape {
        return operands_err(format!(
            "gate and up must have one type, got {} and {}",
            type_text(gate.dtype, &gate.shape),
            type_text(up.dtype, &up.shape)
        ));
    }
    let dt = gate.dtype;
    let mut data: Vec<f64> = gate.data.iter().zip(&up.data).map(|(&g, &u)| dt.round(silu(g)) * u).collect();
    round_all(dt, &mut data);
    Ok(Tensor::from_parts(dt, gate.shape.clone(), data))
}

