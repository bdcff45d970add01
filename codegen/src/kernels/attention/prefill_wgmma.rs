//! Prefill attention on Hopper tensor cores (`wgmma`, sm_90a): the launch plan, and the TMA
//! tensor maps of the warp-specialised form.
//!
//! Design notes: book/src/design/attention.md

use inkwell::context::Context;
use sinter_ir::{Dim, Family, LaunchPlan, TensorMap};

use super::analysis::{shared_kind, unsupported, Prefill, T4};
use super::prefill_mma::build;
use super::schedule::{wg_eligible, TcSmem as Smem, WgSchedule};
use crate::kernels::matmul::kit::{Kit, SharedKind, R};
use crate::target::Target;

/// The launch plan of the `wgmma` kernel for `p` with schedule `w`.
///
/// # Errors
/// [`crate::CodegenError::Unsupported`] when `p` is not [`wg_eligible`], the schedule is
/// invalid or its shared memory exceeds the target's; LLVM errors otherwise.
pub(super) fn plan_wg(p: &Prefill, target: &Target, w: &WgSchedule) -> R<LaunchPlan> {
    let fam = Family::Attention;
    w.check().map_err(|e| unsupported(&p.name, fam, e))?;
    wg_eligible(p, target).map_err(|e| unsupported(&p.name, fam, e))?;
    if p.fp8.is_some() && (w.pv_split || w.block_kv > 128 || w.block_kv % 32 != 0 || w.producer) {
        return Err(unsupported(&p.name, fam, crate::fp8_message(&format!("f8e4m3 attention: schedule `{}` (the fp8 kernel takes 32- to 128-key tiles, multiples of 32, without `+split` or the warp-specialised producer)", w.name()))));
    }
    let sm = Smem::wg(w, p.d, p.dv, p.fp8.is_some());
    // Dynamic always: its 1024-byte alignment is what the swizzled slabs need.
    let shared = match shared_kind(sm.total, target, &p.name, fam)? {
        SharedKind::Static => SharedKind::Dynamic(sm.total),
        k => k,
    };
    let s = w.as_tc();
    let ctx = Context::create();
    let entry = format!("{}_attention_wgmma{}", p.name, if p.fp8.is_some() { "_e4m3" } else { "" });
    let maps = if w.producer { tma_maps(p, w) } else { Vec::new() };
    let io = (p.n_inputs, p.n_buffers - p.n_inputs);
    let (ptx, params) = Kit::build_with_maps(&ctx, &entry, *target, io, &maps, &p.dims(), w.threads(), |kit| {
        kit.launch_bounds(w.threads());
        build(kit, p, &s, &sm, shared, Some(w))
    })?;
    Ok(p.launch_plan(target, (entry, ptx, params), s.block_q(), w.threads(), shared))
}

/// A TMA tensor map of attention operand `t` ([`WgSchedule::producer`]): the tensor as
/// `[D, S, H, B]` (innermost first; `d` elements a row, `rows` the sequence length `S`,
/// `heads` its heads), boxes of `64 × box_rows × 1 × 1` — one 64-column, 128-byte-wide slab
/// of one head's rows — with 128-byte swizzling, the layout of [`Smem::swz`] and of the
/// `wgmma` descriptors. Sequence rows past `S` read as zero **within the head** (the bounds
/// are per dimension), so a tile at a sequence's end never sees the next head's rows. A head
/// or batch axis of constant stride 0 (broadcast) is left out (the driver takes no zero
/// stride); [`TmaAxes`] says which are kept.
fn tma_map(t: &T4, d: u32, rows: &Dim, heads: i64, batch: &Dim, box_rows: u32) -> TensorMap {
    let mut dims = vec![Dim::from(i64::from(d)), rows.clone()];
    let mut strides = vec![t.st[2].clone()];
    let mut box_dims = vec![64, box_rows];
    let axes = TmaAxes::of(t);
    for (kept, extent, st) in [(axes.head, Dim::from(heads), &t.st[1]), (axes.batch, batch.clone(), &t.st[0])] {
        if kept {
            dims.push(extent);
            strides.push(st.clone());
            box_dims.push(1);
        }
    }
    TensorMap { buffer: t.buffer, dtype: t.dtype, offset: t.offset.clone(), dims, strides, box_dims, swizzle: 128 }
}

/// Which of the head and batch axes a map of [`tma_map`] has (after D and S): those whose
/// stride is not the constant 0.
#[derive(Clone, Copy)]
pub(super) struct TmaAxes {
    pub(super) head: bool,
    pub(super) batch: bool,
}

impl TmaAxes {
    pub(super) fn of(t: &T4) -> TmaAxes {
        TmaAxes { head: t.st[1].as_const() != Some(0), batch: t.st[0].as_const() != Some(0) }
    }
}

/// The maps of Q (boxes of the CTA's `block_q` rows), K and V (boxes of a key tile),
/// kernel parameters 0, 1 and 2 after the buffers ([`Kit::tensor_map`]).
fn tma_maps(p: &Prefill, w: &WgSchedule) -> Vec<TensorMap> {
    let q = tma_map(&p.q, p.d, &p.sq, p.heads, &p.batch, w.block_q());
    let k = tma_map(&p.k, p.d, &p.skv, p.kv_heads, &p.batch, w.block_kv);
    let v = tma_map(&p.v, p.dv, &p.skv, p.kv_heads, &p.batch, w.block_kv);
    vec![q, k, v]
}
