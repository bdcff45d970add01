//! A kernel being generated ([`KernelCtx`]: the graph, the kernel, its data and the checks
//! every generator needs) and the kernel's side of the instruction layer's "build twice"
//! ([`build_twice`]: its buffers as parameters, its index width). A shared piece below the
//! families.

use sinter_ir::{BufferData, Dim, Family, Kernel, KernelData, KernelGraph, KernelParam};

use super::element::{Buf, IndexWidth};
use crate::error::CodegenError;
use crate::isa::kit;
use crate::isa::{KernelBuilder, ParamKind, SizeTable};
use crate::math::R;
use crate::target::Target;

/// A kernel being generated: the graph, the kernel and its data, with the checks every
/// generator needs.
pub(crate) struct KernelCtx<'g> {
    pub graph: &'g KernelGraph,
    pub kernel: Kernel,
    pub data: &'g KernelData,
}

impl<'g> KernelCtx<'g> {
    /// Looks the kernel up and checks that its body's signature matches its buffers
    /// (parameters ↔ inputs, outputs ↔ outputs, same dtype and shape).
    pub fn new(graph: &'g KernelGraph, kernel: Kernel) -> R<KernelCtx<'g>> {
        let data = graph.kernels.get(kernel).ok_or_else(|| CodegenError::BadKernel {
            kernel: kernel.to_string(),
            message: format!("the kernel graph has {} kernels", graph.kernels.len()),
        })?;
        let cx = KernelCtx { graph, kernel, data };
        let body = &data.body;
        if body.params.len() != data.inputs.len() || body.outputs.len() != data.outputs.len() {
            return Err(cx.bad(format!(
                "the body has {} parameters and {} outputs, the kernel {} input and {} output buffers",
                body.params.len(),
                body.outputs.len(),
                data.inputs.len(),
                data.outputs.len()
            )));
        }
        let pairs = body.params.iter().zip(&data.inputs).chain(body.outputs.iter().zip(&data.outputs));
        for (i, (&v, &b)) in pairs.enumerate() {
            let vd = body.values.get(v).ok_or_else(|| cx.bad(format!("body value {v} does not exist")))?;
            let bd = graph.buffers.get(b).ok_or_else(|| cx.bad(format!("buffer {b} does not exist")))?;
            if vd.ty != bd.ty {
                return Err(cx.bad(format!("buffer {i} ({b}) is {}, the body's value is {}", bd.ty, vd.ty)));
            }
            if bd.layout.strides.len() != bd.ty.rank() {
                return Err(cx.bad(format!("buffer {b} has {} strides for rank {}", bd.layout.strides.len(), bd.ty.rank())));
            }
        }
        for (_, nd) in body.nodes.iter() {
            if nd.inputs.iter().chain(&nd.results).any(|v| body.values.get(*v).is_none()) {
                return Err(cx.bad("a node refers to a value the body does not have"));
            }
        }
        Ok(cx)
    }

    /// `k3 (Pointwise)`.
    pub fn name(&self) -> String {
        format!("{} ({:?})", self.kernel, self.data.family)
    }

    /// The entry point's name: `k3_pointwise`.
    pub fn entry(&self) -> String {
        format!("{}_{}", self.kernel, self.data.family.name())
    }

    /// An unsupported-kernel error naming this kernel.
    pub fn unsupported(&self, msg: impl Into<String>) -> CodegenError {
        CodegenError::Unsupported { kernel: self.name(), message: msg.into() }
    }

    /// An ill-formed-kernel error naming this kernel.
    pub fn bad(&self, msg: impl Into<String>) -> CodegenError {
        CodegenError::BadKernel { kernel: self.name(), message: msg.into() }
    }

    /// Buffer `i` of the kernel (inputs, then outputs).
    pub fn buffer(&self, i: usize) -> R<&'g BufferData> {
        let n_in = self.data.inputs.len();
        let b = if i < n_in { self.data.inputs.get(i) } else { self.data.outputs.get(i - n_in) };
        b.and_then(|b| self.graph.buffers.get(*b)).ok_or_else(|| self.bad(format!("no buffer {i}")))
    }

    /// The number of buffers (inputs + outputs).
    pub fn n_buffers(&self) -> usize {
        self.data.inputs.len() + self.data.outputs.len()
    }

    /// Parameter kinds: inputs `noalias readonly`, outputs `noalias` — except in `KvAppend`
    /// kernels, whose output pages are their input pages (nothing is `noalias` there).
    pub fn param_kinds(&self) -> Vec<ParamKind> {
        if self.data.family == Family::KvAppend {
            let mut p = vec![ParamKind::Global { read_only: true, no_alias: false }; self.data.inputs.len()];
            p.extend(std::iter::repeat_n(ParamKind::Global { read_only: false, no_alias: false }, self.data.outputs.len()));
            return p;
        }
        let mut p = vec![ParamKind::input(); self.data.inputs.len()];
        p.extend(std::iter::repeat_n(ParamKind::output(), self.data.outputs.len()));
        p
    }

    /// The evaluator's view of buffer `i`.
    pub fn buf<'ctx>(&self, kb: &KernelBuilder<'ctx>, i: usize) -> R<Buf<'ctx>> {
        let bd = self.buffer(i)?;
        Ok(Buf { ptr: kb.param_ptr(i)?, dtype: bd.ty.dtype, strides: bd.layout.strides.clone(), align: bd.layout.align.max(1) })
    }

    /// Whether every dim of every buffer and body value is a constant and every buffer's
    /// extent is below 2³⁰ elements: then 32-bit indexing is exact (with room for a
    /// grid-stride step past the end).
    pub fn index_width(&self) -> IndexWidth {
        const LIMIT: i64 = 1 << 30;
        let mut all: Vec<&Dim> = Vec::new();
        for (_, v) in self.data.body.values.iter() {
            all.extend(v.ty.shape.iter());
        }
        let mut extents_ok = true;
        for i in 0..self.n_buffers() {
            let Ok(b) = self.buffer(i) else { return IndexWidth::I64 };
            all.extend(b.ty.shape.iter());
            all.extend(b.layout.strides.iter());
            // The largest offset: Σ (d − 1)·stride.
            let mut max: i64 = 0;
            for (d, s) in b.ty.shape.iter().zip(&b.layout.strides) {
                match (d.as_const(), s.as_const()) {
                    (Some(d), Some(s)) => {
                        let t = (d - 1).max(0).checked_mul(s.abs());
                        max = t.and_then(|t| max.checked_add(t)).unwrap_or(i64::MAX);
                    }
                    _ => extents_ok = false,
                }
            }
            let numel = b.ty.shape.iter().try_fold(1i64, |acc, d| d.as_const().and_then(|d| acc.checked_mul(d)));
            if max >= LIMIT || numel.is_none_or(|n| n >= LIMIT) {
                extents_ok = false;
            }
        }
        for (_, nd) in self.data.body.nodes.iter() {
            for a in &nd.op.attrs {
                match a {
                    sinter_ir::Attr::Dim(d) if d.as_const().is_none() => return IndexWidth::I64,
                    sinter_ir::Attr::Dims(ds) if ds.iter().any(|d| d.as_const().is_none()) => return IndexWidth::I64,
                    _ => {}
                }
            }
        }
        if extents_ok && all.iter().all(|d| d.as_const().is_some_and(|c| c.abs() < LIMIT)) {
            IndexWidth::I32
        } else {
            IndexWidth::I64
        }
    }
}

/// [`crate::isa::kit::build_twice`] with this kernel's buffer parameters and index width.
pub(crate) fn build_twice(
    cx: &KernelCtx<'_>,
    target: &Target,
    entry: &str,
    max_threads: u32,
    width: IndexWidth,
    emit: impl for<'c> Fn(&mut KernelBuilder<'c>, &mut SizeTable<'c>) -> R<()>,
) -> R<(String, Vec<KernelParam>)> {
    kit::build_twice(&cx.param_kinds(), target, entry, max_threads, width == IndexWidth::I64, emit)
}

/// [`crate::isa::kit::build_twice_occupancy`] with this kernel's buffer parameters and index
/// width.
pub(crate) fn build_twice_occupancy(
    cx: &KernelCtx<'_>,
    target: &Target,
    entry: &str,
    max_threads: u32,
    min_ctas: u32,
    width: IndexWidth,
    emit: impl for<'c> Fn(&mut KernelBuilder<'c>, &mut SizeTable<'c>) -> R<()>,
) -> R<(String, Vec<KernelParam>)> {
    kit::build_twice_occupancy(&cx.param_kinds(), target, entry, max_threads, min_ctas, width == IndexWidth::I64, emit)
}
