//! How kernels read their buffers: [`BufInfo`] (a kernel buffer's dtype, shape, strides and
//! alignment), [`View`] (a body value read straight from an input buffer through `reshape`s and
//! `slice`s, [`input_view`]), the strides of outputs and broadcast operands, and the bridge
//! from the instruction layer's [`Kit`] to the shared element evaluator ([`Kit::with_eval`]).
//! Shared by the families below which they sit (matmul, attention, decode, merge).

use sinter_ir::{DType, Dim, Function, KernelData, KernelGraph, Layout, OpKind, Value, ValueDef};

use super::element::{Buf, Eval, IndexWidth};
use crate::isa::kit::{Kit, R};

impl<'ctx> Kit<'ctx> {
    /// Runs `f` with the shared element evaluator ([`Eval`]) over `body`, whose
    /// parameter `i` is read from `params[i]`; the kernel's size parameters serve its
    /// dims. Kit methods must not be called inside `f` (the evaluator holds the builder).
    pub(crate) fn with_eval<T>(&self, body: &Function, params: Vec<Buf<'ctx>>, f: impl FnOnce(&mut Eval<'_, 'ctx>) -> R<T>) -> R<T> {
        self.with_sizes(|kb, sizes| {
            let mut ev = Eval::new(kb, sizes, body, params, IndexWidth::I64);
            f(&mut ev)
        })
    }
}

/// A kernel buffer as the generators see it.
#[derive(Clone, Debug)]
pub(crate) struct BufInfo {
    pub dtype: DType,
    pub shape: Vec<Dim>,
    pub strides: Vec<Dim>,
    pub align: u32,
}

/// Every buffer of kernel `kd`, inputs then outputs.
pub(crate) fn buffer_infos(graph: &KernelGraph, kd: &KernelData) -> Result<Vec<BufInfo>, String> {
    kd.inputs
        .iter()
        .chain(&kd.outputs)
        .map(|&b| {
            let bd = graph.buffers.get(b).ok_or_else(|| format!("buffer {b} is missing"))?;
            Ok(BufInfo { dtype: bd.ty.dtype, shape: bd.ty.shape.clone(), strides: bd.layout.strides.clone(), align: bd.layout.align.max(1) })
        })
        .collect()
}

/// A value of a kernel body read straight from a kernel input buffer: element `(i…)` of the
/// value is element `offset + Σ i·strides` of buffer `param`.
#[derive(Clone, Debug)]
pub(crate) struct View {
    pub param: usize,
    pub offset: Dim,
    pub strides: Vec<Dim>,
    /// Alignment of the buffer's base, bytes.
    pub align: u32,
}

/// Follows `v` back through `reshape` and `slice` nodes (the views the passes leave at
/// the start of a body) to a parameter, and says where its elements live. A `reshape`
/// needs a contiguous input (row-major order is then the storage order); a `slice` adds
/// `start · stride` to the offset.
///
/// # Errors
/// A message when `v` is computed by another op or is a reshape of a strided view.
pub(crate) fn input_view(body: &Function, v: Value, bufs: &[BufInfo]) -> Result<View, String> {
    let mut chain = Vec::new();
    let mut cur = v;
    let param = loop {
        let vd = body.values.get(cur).ok_or_else(|| format!("value {cur} does not exist"))?;
        match vd.def {
            ValueDef::Param(i) => break i,
            ValueDef::Result(n, _) => {
                let nd = body.nodes.get(n).ok_or_else(|| format!("node {n} does not exist"))?;
                if !matches!(nd.op.kind, OpKind::Reshape | OpKind::Slice) {
                    return Err(format!("{} is computed in the kernel (`{}`), not read from a buffer", body.label(v), nd.op.kind.name()));
                }
                chain.push(n);
                cur = *nd.inputs.first().ok_or_else(|| format!("{n} has no operand"))?;
            }
        }
    };
    let info = bufs.get(param).ok_or_else(|| format!("no buffer for parameter {param}"))?;
    let mut shape = info.shape.clone();
    let mut strides = info.strides.clone();
    let mut offset = Dim::constant(0);
    let mut contiguous = strides == Layout::contiguous(&shape).strides;
    for &n in chain.iter().rev() {
        let nd = &body.nodes[n];
        let out = body.ty(*nd.results.first().ok_or_else(|| format!("{n} has no result"))?).shape.clone();
        match nd.op.kind {
            OpKind::Reshape => {
                if !contiguous {
                    return Err(format!("{} reshapes a strided view", body.label(v)));
                }
                strides = Layout::contiguous(&out).strides;
            }
            _ => {
                let axis = nd.op.int("axis").ok_or("slice without an axis")?;
                let axis = sinter_ir::infer::norm_axis(axis, shape.len()).map_err(|e| e.to_string())?;
                let start = nd.op.dim("start").ok_or("slice without a start")?;
                offset = offset.add(&start.mul(&strides[axis]));
                contiguous = contiguous && shape[..axis].iter().all(Dim::is_one);
            }
        }
        shape = out;
    }
    if strides.len() != body.ty(v).rank() {
        return Err(format!("{} has {} strides for rank {}", body.label(v), strides.len(), body.ty(v).rank()));
    }
    Ok(View { param, offset, strides, align: info.align })
}

/// For a kernel output `out` that is `core` through `reshape`s (the views the passes
/// leave at the end of a body), the strides at which `core`'s elements are written into
/// output buffer `buf` (row-major order is storage order when the buffer is contiguous).
///
/// # Errors
/// When another op lies between them or a reshape meets a strided output buffer.
pub(crate) fn output_strides(body: &Function, out: Value, core: Value, buf: &BufInfo) -> Result<Vec<Dim>, String> {
    if out == core {
        return Ok(buf.strides.clone());
    }
    let mut cur = out;
    while cur != core {
        match body.values.get(cur).map(|d| d.def) {
            Some(ValueDef::Result(n, _)) if body.nodes[n].op.kind == OpKind::Reshape => cur = body.nodes[n].inputs[0],
            _ => return Err(format!("output {} is not a reshape of the result", body.label(out))),
        }
    }
    if buf.strides != Layout::contiguous(&buf.shape).strides {
        return Err(format!("output {} reshapes into a strided buffer", body.label(out)));
    }
    Ok(Layout::contiguous(&body.ty(core).shape).strides)
}

/// Strides of a tensor of shape `shape` (layout `strides`) as seen from an output of rank
/// `out_rank` it broadcasts to (NumPy rules, right-aligned): one stride per output axis,
/// 0 where the tensor has no such axis or a size-1 axis.
pub(crate) fn broadcast_strides(shape: &[Dim], strides: &[Dim], out_rank: usize) -> Vec<Dim> {
    let mut out = vec![Dim::constant(0); out_rank];
    let r = shape.len();
    for (a, (d, s)) in shape.iter().zip(strides).enumerate() {
        if out_rank + a >= r && !d.is_one() {
            out[out_rank + a - r] = s.clone();
        }
    }
    out
}
