//! The attention families: prefill attention ([`Family::Attention`], [`generate_prefill`]),
//! decode attention over a paged KV cache ([`Family::PagedAttention`], the split-KV
//! [`decode::generate`] and the single-CTA [`generate_paged`]) and the log-sum-exp merge of
//! partial attention states ([`Family::AttentionMerge`], [`merge::generate`]).
//!
//! # Which kernel
//! [`generate_prefill`] tries, in order: on sm_90a the `wgmma` kernel (`prefill_wgmma.rs`) for
//! head dims 64 and 128 without an additive mask (the only kernel of an fp8 attention); the
//! `mma.sync` kernel (`prefill_mma.rs`) for bf16/f16 with head dims multiples of 16 and q/k/v
//! rows contiguous and 16-byte aligned; else the CUDA-core kernel (`simt.rs`), correct for
//! every shape. `schedule::eligible` and `schedule::wg_eligible` say why a kernel does not
//! apply; `Attention` is the family's `Generator` (its candidates: the autotuning variants).
//! A sliding window or a softcap (`window`, `softcap`) is taken by the `mma.sync` and the
//! CUDA-core prefill kernels and both paged decode kernels; the `wgmma` kernel has neither
//! yet, so on sm_90a such a node goes to `mma.sync` (and an fp8 one is not formed: the
//! contract refuses it).
//!
//! # Semantics (the interpreter's, `sinter_ir::interp`)
//! - Causal masks are aligned bottom-right: query `i` sees keys `j ≤ i + Skv − Sq`; key tiles
//!   wholly above the CTA's last visible key are never loaded.
//! - A sliding window W (causal only) hides keys `j ≤ pᵢ − W` (pᵢ = i + Skv − Sq); the key
//!   tiles wholly below a CTA's first visible key are never loaded, and the partial tile's
//!   hidden keys score −inf and are never multiplied. A softcap c makes each score
//!   `c·tanh(s/c)` (f32) before the additive mask.
//! - GQA: query head `h` reads KV head `h / (H/Hkv)`; K/V are never repeated in memory.
//! - Every visible key's `p·v` is made, a masked key's (score −inf) with `p = 0`, so NaN or
//!   ±inf in its V row gives NaN as the written-out `softmax(s)·V` does; a row whose visible
//!   scores are all −inf gives `Σ 0·v` (exactly 0 for finite V), a row with no visible key 0;
//!   a NaN score makes its row NaN (NaN-propagating maxima); a +inf score gives NaN (inf − inf).
//! - Keys hidden by the causal mask or the window, or past the sequence, are never
//!   multiplied, as in the reference; the tensor-core kernels multiply whole tiles and fall
//!   back to exactly the reference's products for a tile whose concerned V rows hold a
//!   non-finite value.
//! - Statistics, scores and the accumulator are f32; the output is rounded once. Finite
//!   extremes stay finite: a row masked everywhere with the lowest f32 (Hugging Face masks)
//!   gives the mean of V and a finite lse, scores near ±3e38 never give NaN (the tensor-core
//!   softmax subtracts the maximum before scaling to log2 units; the CUDA-core `exp` is
//!   clamped below, `analysis::exp0`).
//! - With `lse=true` the node's second result, each row's log-sum-exp (f32, natural log,
//!   −inf for a row without a finite score), is written where the body outputs it; the merge
//!   combines such partial states (cascade inference, split-KV).
//!
//! # Bodies
//! One `attention` / `paged_attention` / `attention_merge` node whose operands are kernel
//! inputs, possibly through views (`reshape`, `slice`), and whose results are the kernel's
//! outputs, possibly through `reshape`s (`analysis.rs`). An fp8 attention (q, k, v all
//! `dequantize_fp8` of `f8e4m3` inputs) is taken by the `wgmma` kernel only.
//!
//! Design notes: book/src/design/attention.md

pub mod decode;
pub mod merge;
pub mod schedule;

mod analysis;
mod prefill_mma;
mod prefill_wgmma;
mod simt;
#[cfg(test)]
mod tests;

#[cfg(doc)]
use sinter_ir::Family;
use sinter_ir::{Kernel, KernelGraph, LaunchPlan};

use self::analysis::{Paged, Prefill};
pub use self::analysis::MAX_HEAD_DIM;
pub use self::schedule::{choose_paged_schedule, choose_prefill_schedule, AttentionSchedule, TcSchedule, WgSchedule, BLOCK_KV};
use super::family::{Generator, Schedule};
use crate::math::R;
use crate::target::Target;
use crate::error::CodegenError;

/// Generates prefill attention kernel `kernel` of `graph` ([`Family::Attention`], one
/// `attention` node of kernel inputs q, k, v and an optional additive mask, through views;
/// see the module docs) with the schedule [`choose_prefill_schedule`] picks.
///
/// Shapes: q `[B, H, Sq, D]`, k `[B, Hkv, Skv, D]`, v `[B, Hkv, Skv, Dv]` (`bshd`: `[B, S, H,
/// D]`; any strides), mask broadcasting to `[B, H, Sq, Skv]`; D and Dv constants ≤ 512 (above
/// 256 on CUDA cores only; [`MAX_HEAD_DIM`]), B,
/// Sq, Skv any (symbolic dims are [`sinter_ir::KernelParam::Size`] parameters); bf16, f16 or
/// f32. Grid `(⌈Sq/block_q⌉, H, B)`, the longest causal tiles first; block `32·warps`.
///
/// # Errors
/// [`CodegenError::Unsupported`] / [`CodegenError::BadKernel`] for other bodies or shapes;
/// LLVM and target errors otherwise.
pub fn generate_prefill(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    crate::kernels::family::compile::<Attention>(graph, kernel, target)
}

/// [`generate_prefill`]'s choice for analysed `p`: the first kernel that takes it.
fn prefill_default(p: &Prefill, target: &Target) -> Result<LaunchPlan, CodegenError> {
    if p.fp8.is_some() {
        // The fp8 attention has one kernel: wgmma on sm_90a (it says why not elsewhere).
        return prefill_wgmma::plan_wg(p, target, &schedule::choose_fp8_schedule());
    }
    if schedule::wg_eligible(p, target).is_ok() {
        match prefill_wgmma::plan_wg(p, target, &schedule::choose_wg_schedule(p.d, p.dv)) {
            Err(CodegenError::Unsupported { .. }) => {}
            done => return done,
        }
    }
    if schedule::eligible(p).is_ok() {
        match prefill_mma::plan(p, target, &tc_default(p, target)) {
            // Only a shared-memory budget the target cannot give sends it back to CUDA cores.
            Err(CodegenError::Unsupported { .. }) => {}
            done => return done,
        }
    }
    let s = choose_prefill_schedule(p.d, p.dv, p.dtype);
    simt::prefill_plan(p, target, &s)
}

/// The tensor-core schedule [`generate_prefill`] tries first for `p`.
fn tc_default(p: &Prefill, target: &Target) -> TcSchedule {
    let mut sched = schedule::choose_tc_schedule(p.d, p.dv, p.mask.is_some(), p.causal, target);
    if p.lse.is_some() && sched.block_kv == 48 {
        // The lse epilogue tips the 48-key tile over 255 registers (it spills), as causality
        // does: 32-key tiles.
        sched.block_kv = 32;
    }
    sched
}

/// One schedule of prefill attention: one of its three kernels, or [`generate_prefill`]'s
/// choice among them.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum PrefillSchedule {
    /// [`generate_prefill`]'s: the first kernel that takes the kernel (wgmma, `mma.sync`, CUDA
    /// cores), named after the one it tries first.
    Default(Box<PrefillSchedule>),
    /// The `wgmma` kernel (sm_90a).
    Wgmma(WgSchedule),
    /// The fp8 `wgmma` kernel (sm_90a; named `… e4m3`).
    Fp8(WgSchedule),
    /// The `mma.sync` kernel.
    Mma(TcSchedule),
    /// The CUDA-core kernel (named `cuda-core`).
    Simt(AttentionSchedule),
}

impl Schedule for PrefillSchedule {
    fn name(&self) -> String {
        match self {
            PrefillSchedule::Default(first) => first.name(),
            PrefillSchedule::Wgmma(w) => w.name(),
            PrefillSchedule::Fp8(w) => format!("{} e4m3", w.name()),
            PrefillSchedule::Mma(t) => t.name(),
            PrefillSchedule::Simt(_) => "cuda-core".into(),
        }
    }
}

/// The prefill attention family's generator.
pub(crate) struct Attention;

impl Generator for Attention {
    type Analysis<'g> = Prefill;
    type Schedule = PrefillSchedule;
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, _: &Target) -> R<Prefill> {
        Prefill::analyse(graph, kernel)
    }
    fn default_schedule(p: &Prefill, target: &Target) -> R<PrefillSchedule> {
        let first = if p.fp8.is_some() {
            PrefillSchedule::Fp8(schedule::choose_fp8_schedule())
        } else if schedule::eligible(p).is_err() {
            PrefillSchedule::Simt(choose_prefill_schedule(p.d, p.dv, p.dtype))
        } else if schedule::wg_eligible(p, target).is_ok() {
            PrefillSchedule::Wgmma(schedule::choose_wg_schedule(p.d, p.dv))
        } else {
            PrefillSchedule::Mma(tc_default(p, target))
        };
        Ok(PrefillSchedule::Default(Box::new(first)))
    }
    /// [`generate_prefill`]'s first, then for a tensor-core kernel the same CTA shape with
    /// 32-, 48- and 64-key tiles (a tile that makes ptxas spill loses on time); on sm_90a the
    /// other `wgmma` schedules before them. CUDA-core kernels have no alternatives.
    fn candidates(p: &Prefill, target: &Target) -> R<Vec<PrefillSchedule>> {
        if p.fp8.is_some() {
            // fp8: the wgmma kernel's default (64-key tiles), then the intra-warpgroup
            // overlap; names end `e4m3`. None where the fp8 kernel does not apply (it says why).
            schedule::fp8_applies(p, target)?;
            let wd = schedule::choose_fp8_schedule();
            let mut out = vec![Self::default_schedule(p, target)?];
            out.push(PrefillSchedule::Fp8(WgSchedule { overlap: true, ..wd }));
            return Ok(out);
        }
        let mut out = vec![Self::default_schedule(p, target)?];
        if schedule::eligible(p).is_err() {
            return Ok(out);
        }
        // The default is exactly `generate_prefill` (which falls back to CUDA cores where the
        // target's shared memory does not fit the tile); the alternatives other key tiles.
        let default = tc_default(p, target);
        if schedule::wg_eligible(p, target).is_ok() {
            // sm_90a: the wgmma kernel first (the default), then the others: 128- and 64-key
            // tiles, the `+split` P·V, the intra-warpgroup overlap (`ov`), the warp-specialised
            // kernel (`ws`, TMA producer) and its ping-pong (`ws pp`), then the mma.sync kernel's.
            let wd = schedule::choose_wg_schedule(p.d, p.dv);
            let plain = WgSchedule { warpgroups: 2, block_kv: 128, pv_split: false, overlap: false, producer: false, pingpong: false };
            let ws = WgSchedule { producer: true, ..plain };
            let pp = WgSchedule { pingpong: true, ..ws };
            let alts = [
                plain,
                WgSchedule { pv_split: true, ..plain },
                WgSchedule { block_kv: 64, ..plain },
                WgSchedule { overlap: true, ..plain },
                WgSchedule { block_kv: 64, overlap: true, ..plain },
                ws,
                WgSchedule { block_kv: 64, ..ws },
                pp,
                WgSchedule { block_kv: 64, ..pp },
            ]
            .into_iter()
            .filter(|a| *a != wd);
            out.extend(alts.map(PrefillSchedule::Wgmma));
            out.push(PrefillSchedule::Mma(default));
        }
        let alts = [32, 48, 64].into_iter().map(|kv| TcSchedule { block_kv: kv, ..default }).filter(|a| *a != default);
        out.extend(alts.map(PrefillSchedule::Mma));
        Ok(out)
    }
    fn build(p: &Prefill, s: &PrefillSchedule, target: &Target) -> R<LaunchPlan> {
        match s {
            PrefillSchedule::Default(_) => prefill_default(p, target),
            PrefillSchedule::Wgmma(w) | PrefillSchedule::Fp8(w) => prefill_wgmma::plan_wg(p, target, w),
            PrefillSchedule::Mma(t) => prefill_mma::plan(p, target, t),
            PrefillSchedule::Simt(a) => simt::prefill_plan(p, target, a),
        }
    }
}

/// As [`generate_prefill`], on tensor cores with the schedule given
/// ([`prefill_mma`]).
///
/// # Errors
/// As [`generate_prefill`], and [`CodegenError::Unsupported`] for a kernel the tensor-core
/// kernel does not take (f32, head dims not multiples of 16, rows not 16-byte aligned) or an
/// invalid schedule.
pub fn generate_prefill_tc_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &TcSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Prefill::analyse(graph, kernel)?;
    prefill_mma::plan(&p, target, schedule)
}

/// As [`generate_prefill`], on Hopper tensor cores (`wgmma`, sm_90a) with the schedule given
/// ([`prefill_mma`]).
///
/// # Errors
/// As [`generate_prefill`], and [`CodegenError::Unsupported`] for a kernel or target the
/// `wgmma` kernel does not take ([`schedule::wg_eligible`]) or an invalid schedule.
pub fn generate_prefill_wg_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &WgSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Prefill::analyse(graph, kernel)?;
    prefill_wgmma::plan_wg(&p, target, schedule)
}

/// As [`generate_prefill`], on CUDA cores with the schedule given (for autotuning and tests).
///
/// # Errors
/// As [`generate_prefill`], and [`CodegenError::Unsupported`] for an invalid schedule.
pub fn generate_prefill_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &AttentionSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Prefill::analyse(graph, kernel)?;
    simt::prefill_plan(&p, target, schedule)
}

/// Generates paged decode attention kernel `kernel` of `graph` ([`Family::PagedAttention`],
/// one `paged_attention` node of kernel inputs, through views; see the module docs) with the
/// schedule [`choose_paged_schedule`] picks.
///
/// Shapes: q `[B, H, T, D]`, k_pages / v_pages `[P, S, Hkv, D]`, block_table `[B, M]` i32,
/// seq_lens `[B]` i32, output like q; D a constant ≤ 512 ([`MAX_HEAD_DIM`]); B, T, P, S, M any. Grid
/// `(⌈(H/Hkv)·T / block_q⌉, Hkv, B)`; block `32·warps`.
///
/// # Errors
/// As [`generate_prefill`].
pub fn generate_paged(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let p = Paged::analyse(graph, kernel)?;
    let s = choose_paged_schedule(p.rows().as_const(), p.d, p.d, p.dtype);
    decode::PagedAttention::build(&p, &decode::PagedSchedule::SingleCta(s), target)
}

/// As [`generate_paged`], with the schedule given.
///
/// # Errors
/// As [`generate_paged`], and [`CodegenError::Unsupported`] for an invalid schedule.
pub fn generate_paged_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &AttentionSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Paged::analyse(graph, kernel)?;
    decode::PagedAttention::build(&p, &decode::PagedSchedule::SingleCta(*schedule), target)
}
