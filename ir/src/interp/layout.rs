//! Layout ops (`transpose`, `permute`, `reshape`, `broadcast`, `concat`, `slice`, `gather`)
//! and sources (`constant`, `iota`). Each materialises its result.

use crate::dim::Bindings;
use crate::dtype::DType;
use crate::ops::Op;

use super::tensor::{bcast_strides, broadcasts_to, checked_numel, contiguous_strides, split_at_axis, walk, Tensor};
use super::{attr_err, attrs, eval_dim, eval_size, norm_axis, operands_err, type_text, InterpError, Result, Site};

/// Result axis i is input axis `perm[i]`; `perm` already validated.
fn permute_by(x: &Tensor, perm: &[usize]) -> Tensor {
    let st = contiguous_strides(&x.shape);
    let out: Vec<usize> = perm.iter().map(|&p| x.shape[p]).collect();
    let pst: Vec<usize> = perm.iter().map(|&p| st[p]).collect();
    let mut data = Vec::with_capacity(x.data.len());
    walk(&out, [&pst], [0], |[i]| data.push(x.data[i]));
    Tensor::from_parts(x.dtype, out, data)
}

/// `transpose`: swaps `dim0` and `dim1`.
pub(super) fn transpose(op: &Op, x: &Tensor) -> Result<Tensor> {
    let a = norm_axis(attrs::int(op, "dim0")?, x.rank(), "dim0")?;
    let b = norm_axis(attrs::int(op, "dim1")?, x.rank(), "dim1")?;
    let mut perm: Vec<usize> = (0..x.rank()).collect();
    perm.swap(a, b);
    Ok(permute_by(x, &perm))
}

/// `permute`.
pub(super) fn permute(op: &Op, x: &Tensor) -> Result<Tensor> {
    let perm = attrs::ints(op, "perm")?;
    let r = x.rank();
    let mut seen = vec![false; r];
    let mut out = Vec::with_capacity(r);
    for &p in perm {
        match usize::try_from(p).ok().filter(|&p| p < r) {
            Some(p) if !std::mem::replace(&mut seen[p], true) => out.push(p),
            _ => return attr_err(format!("perm {perm:?} is not a permutation of 0..{r}")),
        }
    }
    if out.len() != r {
        return attr_err(format!("perm {perm:?} is not a permutation of 0..{r}"));
    }
    Ok(permute_by(x, &out))
}

fn eval_shape(op: &Op, name: &str, b: &Bindings) -> Result<Vec<usize>> {
    attrs::dims(op, name)?.iter().enumerate().map(|(i, d)| eval_size(d, b, &format!("entry {i} of `{name}`"))).collect()
}

/// `reshape`.
pub(super) fn reshape(op: &Op, x: &Tensor, b: &Bindings) -> Result<Tensor> {
    let shape = eval_shape(op, "shape", b)?;
    if checked_numel(&shape) != Some(x.data.len()) {
        return operands_err(format!(
            "cannot reshape {} ({} elements) to {shape:?}",
            type_text(x.dtype, &x.shape),
            x.data.len()
        ));
    }
    Ok(Tensor::from_parts(x.dtype, shape, x.data.clone()))
}

/// `broadcast` (expand).
pub(super) fn broadcast(op: &Op, x: &Tensor, b: &Bindings) -> Result<Tensor> {
    let shape = eval_shape(op, "shape", b)?;
    if !broadcasts_to(&x.shape, &shape) {
        return operands_err(format!("cannot broadcast {} to {shape:?}", type_text(x.dtype, &x.shape)));
    }
    let n = checked_numel(&shape).ok_or_else(|| InterpError::Operands { site: Site::default(), message: format!("shape {shape:?} is too large") })?;
    let st = bcast_strides(&x.shape, &shape);
    let mut data = Vec::with_capacity(n);
    walk(&shape, [&st], [0], |[i]| data.push(x.data[i]));
    Ok(Tensor::from_parts(x.dtype, shape, data))
}

/// `concat` along `axis`.
pub(super) fn concat(op: &Op, ins: &[&Tensor]) -> Result<Tensor> {
    let Some(first) = ins.first() else { return operands_err("concat needs at least one operand") };
    let axis = norm_axis(attrs::int(op, "axis")?, first.rank(), "axis")?;
    Tensor::concat_axis(ins, axis)
}

/// `slice`: elements `start..end` of `axis`, bounds evaluated under the bindings.
pub(super) fn slice(op: &Op, x: &Tensor, b: &Bindings) -> Result<Tensor> {
    let axis = norm_axis(attrs::int(op, "axis")?, x.rank(), "axis")?;
    let start = eval_dim(attrs::dim(op, "start")?, b, "the slice start")?;
    let end = eval_dim(attrs::dim(op, "end")?, b, "the slice end")?;
    let size = x.shape[axis];
    let fits = 0 <= start && start <= end && usize::try_from(end).is_ok_and(|e| e <= size);
    if !fits {
        return Err(InterpError::SliceBounds { site: Site::default(), axis, start, end, size });
    }
    x.slice_axis(axis, start as usize, end as usize)
}

/// `gather`: `out[i…, :] = table[indices[i…], :]`.
pub(super) fn gather(table: &Tensor, indices: &Tensor) -> Result<Tensor> {
    if table.rank() == 0 {
        return operands_err("the table must have rank ≥ 1");
    }
    if !indices.dtype.is_int() {
        return operands_err(format!("the indices must be i32 or i64, got {}", indices.dtype));
    }
    let v = table.shape[0];
    let row: usize = table.shape[1..].iter().product();
    let mut shape = indices.shape.clone();
    shape.extend_from_slice(&table.shape[1..]);
    let n = checked_numel(&shape).ok_or_else(|| InterpError::Operands { site: Site::default(), message: format!("result shape {shape:?} is too large") })?;
    let mut data = Vec::with_capacity(n);
    for (pos, &ix) in indices.data.iter().enumerate() {
        let i = ix as i64;
        match usize::try_from(i).ok().filter(|&i| i < v) {
            Some(i) => data.extend_from_slice(&table.data[i * row..][..row]),
            None => {
                let at = index_of(pos, &indices.shape);
                return Err(InterpError::IndexOutOfRange {
                    site: Site::default(),
                    what: format!("gather index at {at:?} (the table has {v} rows)"),
                    index: i,
                    len: v as i64,
                });
            }
        }
    }
    Ok(Tensor::from_parts(table.dtype, shape, data))
}

/// The multi-index of row-major position `pos` in `shape`.
pub(super) fn index_of(mut pos: usize, shape: &[usize]) -> Vec<usize> {
    let mut idx = vec![0; shape.len()];
    for ax in (0..shape.len()).rev() {
        let d = shape[ax].max(1);
        idx[ax] = pos % d;
        pos /= d;
    }
    idx
}

/// `constant`.
pub(super) fn constant(op: &Op, b: &Bindings) -> Result<Tensor> {
    let dtype = attrs::dtype(op, "dtype")?;
    let value = dtype.round(attrs::float(op, "value")?);
    let shape = eval_shape(op, "shape", b)?;
    let n = checked_numel(&shape).ok_or_else(|| InterpError::Operands { site: Site::default(), message: format!("shape {shape:?} is too large") })?;
    Ok(Tensor::from_parts(dtype, shape, vec![value; n]))
}

/// `iota`: the index along `axis`, rounded to `dtype`.
pub(super) fn iota(op: &Op, b: &Bindings) -> Result<Tensor> {
    let dtype = attrs::dtype(op, "dtype")?;
    if dtype == DType::Bool {
        return attr_err("iota cannot produce bool");
    }
    let shape = eval_shape(op, "shape", b)?;
    let axis = norm_axis(attrs::int(op, "axis")?, shape.len(), "axis")?;
    let n = checked_numel(&shape).ok_or_else(|| InterpError::Operands { site: Site::default(), message: format!("shape {shape:?} is too large") })?;
    let (_, len, inner) = split_at_axis(&shape, axis);
    let mut data = Vec::with_capacity(n);
    for i in 0..n {
        data.push(dtype.round(((i / inner.max(1)) % len.max(1)) as f64));
    }
    Ok(Tensor::from_parts(dtype, shape, data))
}
