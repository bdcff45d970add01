//! [`Tensor`]: the interpreter's dense row-major tensor, and the strided walks the ops share.

use crate::dtype::DType;

use super::{InterpError, Site};

/// A dense tensor as the reference interpreter holds it.
///
/// Elements are kept row-major (the last axis varies fastest) as `f64`s that are already
/// rounded to [`Tensor::dtype`] with [`DType::round`]: a `bf16` tensor holds only values a
/// `bf16` can represent, an `i32` tensor only integers in `i32`'s range, a `bool` tensor only
/// `0.0` (false) and `1.0` (true). Every constructor rounds, so this holds for every `Tensor`.
/// `i64` values beyond ±2⁵³ are not exact (they are stored as `f64`).
///
/// A rank-0 tensor (`shape == []`) is a scalar with one element; a shape with a zero
/// dimension has no elements.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    pub(super) dtype: DType,
    pub(super) shape: Vec<usize>,
    pub(super) data: Vec<f64>,
}

/// The element count of `shape`, `None` if it overflows `usize`.
pub(super) fn checked_numel(shape: &[usize]) -> Option<usize> {
    shape.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d))
}

/// The element count of `shape`.
///
/// # Panics
/// If the count overflows `usize` (no such tensor could be allocated either).
fn numel_or_panic(shape: &[usize]) -> usize {
    match checked_numel(shape) {
        Some(n) => n,
        None => panic!("the element count of shape {shape:?} overflows usize"),
    }
}

/// Rounds every element to `dtype` in place.
pub(super) fn round_all(dtype: DType, data: &mut [f64]) {
    match dtype {
        DType::F32 => data.iter_mut().for_each(|x| *x = *x as f32 as f64),
        _ => data.iter_mut().for_each(|x| *x = dtype.round(*x)),
    }
}

impl Tensor {
    /// A tensor of `shape` holding `data` in row-major order, each element rounded to `dtype`.
    ///
    /// # Errors
    /// [`InterpError::BadTensor`] when `data.len()` is not the element count of `shape` (or
    /// that count overflows `usize`).
    pub fn new(dtype: DType, shape: &[usize], mut data: Vec<f64>) -> Result<Tensor, InterpError> {
        match checked_numel(shape) {
            Some(n) if n == data.len() => {
                round_all(dtype, &mut data);
                Ok(Tensor { dtype, shape: shape.to_vec(), data })
            }
            Some(n) => Err(InterpError::BadTensor {
                message: format!("a {dtype} tensor of shape {shape:?} has {n} elements, {} were given", data.len()),
            }),
            None => Err(InterpError::BadTensor { message: format!("the element count of shape {shape:?} overflows usize") }),
        }
    }

    /// A tensor whose elements are all zero.
    ///
    /// # Panics
    /// If the element count of `shape` overflows `usize`.
    pub fn zeros(dtype: DType, shape: &[usize]) -> Tensor {
        Tensor { dtype, shape: shape.to_vec(), data: vec![0.0; numel_or_panic(shape)] }
    }

    /// A tensor whose elements are all `value` rounded to `dtype`.
    ///
    /// # Panics
    /// If the element count of `shape` overflows `usize`.
    pub fn full(dtype: DType, shape: &[usize], value: f64) -> Tensor {
        Tensor { dtype, shape: shape.to_vec(), data: vec![dtype.round(value); numel_or_panic(shape)] }
    }

    /// A rank-0 tensor holding `value` rounded to `dtype`.
    pub fn scalar(dtype: DType, value: f64) -> Tensor {
        Tensor { dtype, shape: vec![], data: vec![dtype.round(value)] }
    }

    /// A tensor whose element at index `idx` (one entry per axis) is `f(idx)` rounded to
    /// `dtype`; `f` is called once per element, in row-major order.
    ///
    /// # Panics
    /// If the element count of `shape` overflows `usize`.
    pub fn from_fn(dtype: DType, shape: &[usize], mut f: impl FnMut(&[usize]) -> f64) -> Tensor {
        let n = numel_or_panic(shape);
        let mut data = Vec::with_capacity(n);
        let mut idx = vec![0usize; shape.len()];
        for _ in 0..n {
            data.push(dtype.round(f(&idx)));
            for ax in (0..shape.len()).rev() {
                idx[ax] += 1;
                if idx[ax] < shape[ax] {
                    break;
                }
                idx[ax] = 0;
            }
        }
        Tensor { dtype, shape: shape.to_vec(), data }
    }

    /// A block-quantized tensor (`q8_0`, `q4_1`, `q5_0`, `q4_k`, `q6_k`) of logical `shape` from
    /// its stored bytes in GGUF's block layout (see [`crate::qblock`]): blocks of 32 (256 for the
    /// k-quants) consecutive row-major elements. Its elements are held as codes
    /// ([`crate::dtype::QCode`]).
    ///
    /// # Errors
    /// [`InterpError::BadTensor`] when `dtype` is not block-quantized, the last axis is not a
    /// multiple of the block or `bytes` is not a whole number of blocks.
    pub fn from_blocks(dtype: DType, shape: &[usize], bytes: &[u8]) -> Result<Tensor, InterpError> {
        let bad = |message: String| InterpError::BadTensor { message };
        let n = checked_numel(shape).ok_or_else(|| bad(format!("the element count of shape {shape:?} overflows usize")))?;
        let block = dtype.block_elems().ok_or_else(|| bad(format!("{dtype} is not a block-quantized dtype")))?;
        if shape.last().is_none_or(|&k| k % block != 0) {
            return Err(bad(format!("a {dtype} tensor needs a last axis that is a multiple of {block}, got {shape:?}")));
        }
        if dtype.storage_bytes(n) != Some(bytes.len()) {
            return Err(bad(format!("a {dtype} tensor of shape {shape:?} is stored in {:?} bytes, {} were given", dtype.storage_bytes(n), bytes.len())));
        }
        let data = crate::dtype::qcodes_from_bytes(dtype, bytes).ok_or_else(|| bad(format!("{dtype} is not a block-quantized dtype")))?;
        Ok(Tensor { dtype, shape: shape.to_vec(), data })
    }

    /// Quantizes `values` (row-major, last axis a multiple of 32) to `dtype` as llama.cpp's
    /// reference quantizers do (`quantize_row_q8_0_ref`: `d = max|x|/127`, `q = round(x/d)`;
    /// `quantize_row_q4_1_ref`: `d = (max − min)/15`, `m = min`, `q = round((x − m)/d)` clamped to
    /// 0..15), with `d` and `m` stored as f16. For tests and benchmarks. The other block types
    /// (`q5_0` and the k-quants, read from model files) have no quantizer here: build them with
    /// [`Tensor::from_blocks`].
    ///
    /// # Errors
    /// As [`Tensor::from_blocks`], when `values` does not match `shape`, and for a dtype other
    /// than `q8_0` and `q4_1`.
    pub fn quantize(dtype: DType, shape: &[usize], values: &[f32]) -> Result<Tensor, InterpError> {
        if !matches!(dtype, DType::Q8_0 | DType::Q4_1) {
            return Err(InterpError::BadTensor { message: format!("no reference quantizer for {dtype} (q8_0 and q4_1 have one); build it from its blocks") });
        }
        if checked_numel(shape) != Some(values.len()) || values.len() % DType::QBLOCK != 0 {
            return Err(InterpError::BadTensor { message: format!("{} values for a {dtype} tensor of shape {shape:?}", values.len()) });
        }
        let mut bytes = Vec::new();
        for blk in values.chunks_exact(DType::QBLOCK) {
            if dtype == DType::Q8_0 {
                let amax = blk.iter().fold(0f32, |a, &x| a.max(x.abs()));
                let d = amax / 127.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                bytes.extend(half::f16::from_f32(d).to_le_bytes());
                bytes.extend(blk.iter().map(|&x| (x * id).round().clamp(-128.0, 127.0) as i8 as u8));
            } else {
                let (mn, mx) = blk.iter().fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &x| (a.min(x), b.max(x)));
                let d = (mx - mn) / 15.0;
                let id = if d != 0.0 { 1.0 / d } else { 0.0 };
                bytes.extend(half::f16::from_f32(d).to_le_bytes());
                bytes.extend(half::f16::from_f32(mn).to_le_bytes());
                let q: Vec<u8> = blk.iter().map(|&x| ((x - mn) * id).round().clamp(0.0, 15.0) as u8).collect();
                bytes.extend((0..16).map(|j| q[j] | (q[j + 16] << 4)));
            }
        }
        Tensor::from_blocks(dtype, shape, &bytes)
    }

    /// The stored bytes (GGUF block layout) of a block-quantized tensor, `None` for other
    /// dtypes.
    pub fn to_blocks(&self) -> Option<Vec<u8>> {
        crate::dtype::qcodes_to_bytes(self.dtype, &self.data)
    }

    /// Builds a tensor from parts that already satisfy the invariants (length, rounding).
    pub(super) fn from_parts(dtype: DType, shape: Vec<usize>, data: Vec<f64>) -> Tensor {
        debug_assert_eq!(checked_numel(&shape), Some(data.len()));
        Tensor { dtype, shape, data }
    }

    /// Elements `start..end` of axis `axis` (the `slice` op's semantics).
    ///
    /// # Errors
    /// [`InterpError::SliceBounds`] when the axis does not exist or `start ≤ end ≤ size`
    /// fails.
    pub fn slice_axis(&self, axis: usize, start: usize, end: usize) -> Result<Tensor, InterpError> {
        let size = self.shape.get(axis).copied().unwrap_or(0);
        if axis >= self.shape.len() || start > end || end > size {
            return Err(InterpError::SliceBounds { site: Site::default(), axis, start: start as i64, end: end as i64, size });
        }
        let (outer, n, inner) = split_at_axis(&self.shape, axis);
        let mut shape = self.shape.clone();
        shape[axis] = end - start;
        let mut data = Vec::with_capacity(outer * (end - start) * inner);
        for o in 0..outer {
            data.extend_from_slice(&self.data[(o * n + start) * inner..(o * n + end) * inner]);
        }
        Ok(Tensor::from_parts(self.dtype, shape, data))
    }

    /// `parts` joined along axis `axis` (the `concat` op's semantics): one dtype and rank,
    /// the same sizes on every other axis.
    ///
    /// # Errors
    /// [`InterpError::Operands`] naming the first part that does not fit.
    pub fn concat_axis(parts: &[&Tensor], axis: usize) -> Result<Tensor, InterpError> {
        let bad = |message: String| InterpError::Operands { site: Site::default(), message };
        let first = parts.first().ok_or_else(|| bad("concat needs at least one operand".into()))?;
        if axis >= first.rank() {
            return Err(bad(format!("axis {axis} of a rank-{} operand", first.rank())));
        }
        let mut total = 0usize;
        for (i, t) in parts.iter().enumerate() {
            if t.dtype != first.dtype || t.rank() != first.rank() {
                return Err(bad(format!("operand {i} is {}, operand 0 {}", super::type_text(t.dtype, &t.shape), super::type_text(first.dtype, &first.shape))));
            }
            if let Some((ax, (a, b))) = first.shape.iter().zip(&t.shape).enumerate().find(|(ax, (a, b))| *ax != axis && a != b) {
                return Err(bad(format!("operand {i} differs from operand 0 at axis {ax}: {b} vs {a}")));
            }
            total += t.shape[axis];
        }
        let mut shape = first.shape.clone();
        shape[axis] = total;
        let (outer, _, inner) = split_at_axis(&shape, axis);
        let mut data = Vec::with_capacity(outer * total * inner);
        for o in 0..outer {
            for t in parts {
                let chunk = t.shape[axis] * inner;
                data.extend_from_slice(&t.data[o * chunk..][..chunk]);
            }
        }
        Ok(Tensor::from_parts(first.dtype, shape, data))
    }

    /// The element type.
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// The dimensions, outermost first.
    pub fn shape(&self) -> &[usize] {
        &self.shape
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// The elements in row-major order (already rounded to the dtype).
    pub fn data(&self) -> &[f64] {
        &self.data
    }

    /// The elements, consuming the tensor.
    pub fn into_data(self) -> Vec<f64> {
        self.data
    }

    /// Number of elements (1 for a scalar, 0 when an axis is 0).
    pub fn numel(&self) -> usize {
        self.data.len()
    }

    /// The element at `idx` (one index per axis), `None` when the rank differs or an index is
    /// out of range.
    pub fn get(&self, idx: &[usize]) -> Option<f64> {
        if idx.len() != self.shape.len() {
            return None;
        }
        let mut off = 0usize;
        for (&i, &d) in idx.iter().zip(&self.shape) {
            if i >= d {
                return None;
            }
            off = off * d + i;
        }
        self.data.get(off).copied()
    }

    /// The elements converted to `f32` (exact for `bf16`, `f16`, `f32` and `bool`).
    pub fn to_f32_vec(&self) -> Vec<f32> {
        self.data.iter().map(|&x| x as f32).collect()
    }

    /// Row-major strides in elements (the last is 1).
    pub fn strides(&self) -> Vec<usize> {
        contiguous_strides(&self.shape)
    }
}

/// Row-major strides of a contiguous tensor of `shape`.
pub(super) fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut st = vec![0usize; shape.len()];
    let mut acc = 1usize;
    for ax in (0..shape.len()).rev() {
        st[ax] = acc;
        acc = acc.saturating_mul(shape[ax]);
    }
    st
}

/// Strides to read a contiguous tensor of shape `shape` broadcast (NumPy, right-aligned) to
/// `out`: one stride per axis of `out`, 0 on added axes and on axes of size 1.
/// The caller has checked that the shapes broadcast.
pub(super) fn bcast_strides(shape: &[usize], out: &[usize]) -> Vec<usize> {
    let own = contiguous_strides(shape);
    let off = out.len().saturating_sub(shape.len());
    (0..out.len())
        .map(|ax| match ax.checked_sub(off) {
            Some(j) if shape.get(j).copied().unwrap_or(1) != 1 => own.get(j).copied().unwrap_or(0),
            _ => 0,
        })
        .collect()
}

/// NumPy broadcasting of concrete shapes; `None` when they do not broadcast.
pub(super) fn broadcast_shapes(a: &[usize], b: &[usize]) -> Option<Vec<usize>> {
    let n = a.len().max(b.len());
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let da = (i + a.len()).checked_sub(n).and_then(|j| a.get(j)).copied();
        let db = (i + b.len()).checked_sub(n).and_then(|j| b.get(j)).copied();
        out.push(match (da, db) {
            (Some(x), None) | (None, Some(x)) => x,
            (Some(x), Some(y)) if x == y || y == 1 => x,
            (Some(1), Some(y)) => y,
            _ => return None,
        });
    }
    Some(out)
}

/// True when `shape` broadcasts to exactly `out` (right-aligned, equal dims or 1).
pub(super) fn broadcasts_to(shape: &[usize], out: &[usize]) -> bool {
    shape.len() <= out.len() && broadcast_shapes(shape, out).as_deref() == Some(out)
}

/// Visits every index of `out` in row-major order and calls `f` with the offsets of `N`
/// operands, operand `k` starting at `base[k]` and advancing by `strides[k][axis]` along each
/// axis. Nothing is visited when `out` has a zero dimension; a rank-0 `out` is visited once.
pub(super) fn walk<const N: usize>(out: &[usize], strides: [&[usize]; N], base: [usize; N], mut f: impl FnMut([usize; N])) {
    if out.contains(&0) {
        return;
    }
    let r = out.len();
    if r == 0 {
        f(base);
        return;
    }
    let st = |k: usize, ax: usize| strides[k].get(ax).copied().unwrap_or(0);
    let inner = out[r - 1];
    let mut inner_st = [0usize; N];
    for (k, s) in inner_st.iter_mut().enumerate() {
        *s = st(k, r - 1);
    }
    let mut idx = vec![0usize; r];
    let mut off = base;
    loop {
        let mut o = off;
        for _ in 0..inner {
            f(o);
            for k in 0..N {
                o[k] = o[k].wrapping_add(inner_st[k]);
            }
        }
        // Advance the odometer over the outer axes.
        let mut ax = r - 1;
        loop {
            if ax == 0 {
                return;
            }
            ax -= 1;
            idx[ax] += 1;
            for (k, o) in off.iter_mut().enumerate() {
                *o = o.wrapping_add(st(k, ax));
            }
            if idx[ax] < out[ax] {
                break;
            }
            for (k, o) in off.iter_mut().enumerate() {
                *o = o.wrapping_sub(st(k, ax).wrapping_mul(out[ax]));
            }
            idx[ax] = 0;
        }
    }
}

/// Splits `shape` around `axis` into (outer, size, inner) element counts.
pub(super) fn split_at_axis(shape: &[usize], axis: usize) -> (usize, usize, usize) {
    let outer = shape.get(..axis).map_or(1, |s| s.iter().product());
    let n = shape.get(axis).copied().unwrap_or(1);
    let inner = shape.get(axis + 1..).map_or(1, |s| s.iter().product());
    (outer, n, inner)
}
