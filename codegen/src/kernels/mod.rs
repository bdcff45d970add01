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
pub(crate) mod ctx;
pub(crate) mod element;
pub(crate) mod elementwise;
pub(crate) mod family;
pub(crate) mod fp8_operand;
pub mod gather;
pub mod kv_append;
pub mod layout;
pub mod matmul;
pub mod pointwise;
pub mod reduce;
pub(crate) mod row_order;
pub(crate) mod view;

use sinter_ir::{Family, Kernel, KernelGraph, LaunchPlan};

use self::family::{candidates, compile, Candidate};
use crate::math::R;
use crate::target::Target;

/// [`family::compile`] with the generator of `family`.
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

/// [`family::candidates`] with the generator of `family`.
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

