//! Kernel generators, one file per family (as Triton's `TritonGPUToLLVM/` is organised):
//!
//! | family | file | what |
//! |---|---|---|
//! | [`Family::Pointwise`] | [`pointwise`] | any fused element-wise DAG, broadcasting, 16-byte vectors, grid-stride |
//! | [`Family::RowReduction`] | [`reduce`] | reductions / softmax / norms over the last axis with prologue and epilogue |
//! | [`Family::Layout`] | [`layout`] | transpose / permute / broadcast / concat / slice / reshape copies |
//! | [`Family::Gather`] | [`gather`] | embedding rows |
//! | [`Family::KvAppend`] | [`kv_append`] | new K/V rows scattered into the paged cache |
//! | [`Family::Matmul`] | [`matmul`] | tiled matmul with epilogue |
//! | [`Family::Attention`], [`Family::PagedAttention`], [`Family::AttentionMerge`] | [`attention`] | prefill attention (FlashAttention-2 on `mma.sync`, `wgmma` or CUDA cores), split-KV paged decode, the log-sum-exp merge |
//!
//! Each family is reached through one trait, [`family::Generator`] (analyse the kernel, its
//! default schedule, its autotuning candidates, build one schedule), implemented on a
//! zero-sized struct in the family's module; [`compile`] and [`candidates`] are written once
//! over it and [`compile_family`] / [`family_candidates`] are the table from [`Family`] to
//! them.
//!
//! Every generator returns a [`LaunchPlan`]: the PTX, its entry point, the grid as
//! `ceil(dim / per_cta)` expressions of the kernel's symbols, the block, and the parameter
//! list — **the kernel's buffers in order (inputs, then outputs: [`KernelParam::Buffer`]),
//! then one `i64` per symbolic size it needs ([`KernelParam::Size`])**, so a kernel compiled
//! once runs for every value of `T`, `P`, … Constant sizes are baked into the code.
//!
//! Buffers are read with the strides and alignment of their [`sinter_ir::Layout`]. Kernels
//! assume an output buffer does not overlap any other buffer of the kernel (their pointers
//! are `noalias`), except where a family says otherwise (`KvAppend`, whose output pages are
//! its input pages).

pub mod attention;
pub(crate) mod element;
pub(crate) mod family;
pub(crate) mod fp8_operand;
pub mod gather;
pub mod kv_append;
pub mod layout;
pub mod matmul;
pub mod pointwise;
pub mod reduce;
pub(crate) mod view;

// shim: old path, removed at integration
pub use attention::schedule as attention_tc;
// shim: old path, removed at integration
pub use attention::{decode, merge};

use std::rc::Rc;

use sinter_ir::{BufferData, Dim, Family, Kernel, KernelData, KernelGraph, KernelParam, LaunchPlan};

use self::element::{Buf, IndexWidth};
use crate::emit::{KernelBuilder, ParamKind, SizeTable};
use crate::isa::kit;
use crate::math::R;
use self::family::{Generator, Schedule};
use crate::target::Target;
use crate::{Candidate, CodegenError};

/// Generates kernel `kernel` of `graph` with family `G`'s default schedule.
pub(crate) fn compile<G: Generator>(graph: &KernelGraph, kernel: Kernel, target: &Target) -> R<LaunchPlan> {
    let a = G::analyse(graph, kernel, target)?;
    let s = G::default_schedule(&a, target)?;
    G::build(&a, &s, target)
}

/// Family `G`'s schedule candidates of kernel `kernel`, named, each with a closure that
/// compiles it (the analysis is shared).
pub(crate) fn candidates<'a, G>(graph: &'a KernelGraph, kernel: Kernel, target: &'a Target) -> R<Vec<Candidate<'a>>>
where
    G: Generator + 'a,
    G::Analysis<'a>: 'a,
    G::Schedule: 'a,
{
    let a: Rc<G::Analysis<'a>> = Rc::new(G::analyse(graph, kernel, target)?);
    Ok(G::candidates(&a, target)?
        .into_iter()
        .map(|s| {
            let a = a.clone();
            let name = s.name();
            let build: Box<dyn FnOnce() -> R<LaunchPlan> + 'a> = Box::new(move || {
                let a: &G::Analysis<'a> = &a;
                G::build(a, &s, target)
            });
            (name, build)
        })
        .collect())
}

/// [`compile`] with the generator of `family`.
pub(crate) fn compile_family(family: Family, graph: &KernelGraph, kernel: Kernel, target: &Target) -> R<LaunchPlan> {
    match family {
        Family::Pointwise => compile::<pointwise::Pointwise>(graph, kernel, target),
        Family::RowReduction => compile::<reduce::RowReduction>(graph, kernel, target),
        Family::Layout => compile::<layout::Layout>(graph, kernel, target),
        Family::Gather => compile::<gather::Gather>(graph, kernel, target),
        Family::KvAppend => compile::<kv_append::KvAppend>(graph, kernel, target),
        Family::Matmul => compile::<matmul::Matmul>(graph, kernel, target),
        Family::Attention => compile::<attention::Attention>(graph, kernel, target),
        Family::PagedAttention => compile::<attention::decode::PagedAttention>(graph, kernel, target),
        Family::AttentionMerge => compile::<attention::merge::AttentionMerge>(graph, kernel, target),
    }
}

/// [`candidates`] with the generator of `family`.
pub(crate) fn family_candidates<'a>(family: Family, graph: &'a KernelGraph, kernel: Kernel, target: &'a Target) -> R<Vec<Candidate<'a>>> {
    match family {
        Family::Pointwise => candidates::<pointwise::Pointwise>(graph, kernel, target),
        Family::RowReduction => candidates::<reduce::RowReduction>(graph, kernel, target),
        Family::Layout => candidates::<layout::Layout>(graph, kernel, target),
        Family::Gather => candidates::<gather::Gather>(graph, kernel, target),
        Family::KvAppend => candidates::<kv_append::KvAppend>(graph, kernel, target),
        Family::Matmul => candidates::<matmul::Matmul>(graph, kernel, target),
        Family::Attention => candidates::<attention::Attention>(graph, kernel, target),
        Family::PagedAttention => candidates::<attention::decode::PagedAttention>(graph, kernel, target),
        Family::AttentionMerge => candidates::<attention::merge::AttentionMerge>(graph, kernel, target),
    }
}

/// The lower-case name of a family, as used in entry-point names (`k3_pointwise`).
pub fn family_name(f: Family) -> &'static str {
    f.name()
}

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
        format!("{}_{}", self.kernel, family_name(self.data.family))
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
// shim: old path, removed at integration (a re-export would make `isa` know `KernelCtx`)
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
// shim: old path, removed at integration (a re-export would make `isa` know `KernelCtx`)
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
