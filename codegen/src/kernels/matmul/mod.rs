//! The matmul family ([`Family::Matmul`]): a (batched) matrix product with a fused
//! epilogue, on tensor cores (bf16, f16, fp8) or CUDA cores, correct for every shape.
//!
//! # What a kernel computes
//! The body holds one `matmul` node `R = a · b` (`a [..., M, K]`, `b [..., K, N]` after the
//! optional `transpose_a` / `transpose_b`; batch axes broadcast by NumPy rules) whose operands
//! are kernel inputs, possibly through views (`reshape`, `slice`), or `dequantize` of a
//! block-quantized weight, or `dequantize_fp8` of `f8e4m3` inputs; then an epilogue that the
//! shared element evaluator (`kernels::element`) computes from R, the other inputs and
//! constants. The epilogue decides how N is tiled ([`sinter_ir::epilogue::analyse`]):
//! - **direct** — every output is an element-wise function of R at the same element (bias,
//!   residual, `cast`, `silu`, …): each thread evaluates it from its accumulators;
//! - **columns** — each output reads one column segment of R through element-wise ops,
//!   `reshape`s, `rope` and `kv_append` (a merged QKV projection with RoPE writing the paged
//!   cache): the CTA's tile is staged in shared memory and the epilogue reads R there;
//! - **paired** — the outputs combine 2 or 4 equal-width column segments (SwiGLU over a merged
//!   gate/up projection): a CTA's tile holds the matching columns of every segment.
//!
//! Anything else is refused ([`CodegenError::Unsupported`] naming the op), never computed
//! wrongly. Products accumulate in f32, R is rounded once to its dtype, and every epilogue
//! node rounds where the unfused graph rounds. Addresses are 64-bit and every access is
//! bounds-checked, so any M, N, K (0 included) and any strides are correct; a symbolic dim is
//! a [`sinter_ir::KernelParam::Size`].
//!
//! # Generators and files
//! | schedule | file | kernel |
//! |---|---|---|
//! | [`MmaSchedule`] | `mma.rs` | Ampere tensor cores: `cp.async` pipeline (`pipeline.rs`), `ldmatrix`, `mma.m16n8k16`; also the flat GEMM for M ≤ 16 |
//! | [`WgmmaSchedule`] | `wgmma.rs` | sm_90a warpgroup MMAs, `cp.async` or TMA loads, warp-specialised and persistent variants, fp8 |
//! | [`TiledSchedule`] | `tiled.rs` | shared-memory tiled GEMM on CUDA cores (f32, and the fallback) |
//! | [`SmallMSchedule`] | `small_m.rs` | GEMV / small-M on CUDA cores for decode, quantized weights streamed |
//! | [`QuantMmaSchedule`] | `quant_mma.rs` | block-quantized weights (`q8_0`, `q4_1`) into `mma` fragments |
//!
//! `prologue.rs`: an A operand that is `rms_norm` or `layer_norm` of a kernel input computed
//! in the small-M kernel's prologue (`sinter_ir::contract::prologue`), bit-exact with the norm's own
//! kernel followed by the matmul.
//!
//! `schedule.rs` holds the schedules and [`choose_schedule`]; `spec.rs` the kernel analysis
//! (`Spec`), the operand views and the tensor-core shared-memory plan; `epilogue.rs` the
//! epilogue from registers or from a staged tile. [`generate`] takes the default schedule,
//! [`generate_with`] a given one; `Matmul` is the family's `Generator` (its candidates are
//! the autotuning variants).
//!
//! # Tests
//! Every kernel is assembled by ptxas for sm_80 and sm_90a (no spills; the resource lines are
//! insta snapshots) and run on the CPU against the interpreter by the emulator
//! (`crate::emu`): tails, batches, epilogues, NaN and ±inf, both B layouts.
//!
//! Design notes: book/src/design/matmul.md

mod epilogue;
mod mma;
mod pipeline;
mod prologue;
mod quant_mma;
mod schedule;
mod small_m;
mod spec;
mod tiled;
mod wgmma;

#[cfg(test)]
pub(crate) mod tests;

use inkwell::context::Context;
use sinter_ir::epilogue::MatmulEpilogue as Epi;
use sinter_ir::{Dim, GridDim, Kernel, KernelGraph, LaunchPlan};

use self::mma::build_mma;
use self::quant_mma::build_quant_mma;
use self::small_m::build_small_m;
use self::spec::{unsupported, Spec};
use self::tiled::build_tiled;
use self::wgmma::build_wgmma;
use super::family::{Generator, Schedule};
use crate::isa::kit::Kit;
use crate::math::R;
use crate::target::Target;
use crate::error::CodegenError;
#[cfg(doc)]
use sinter_ir::Family;

pub use self::schedule::{choose_schedule, MatmulSchedule, MmaSchedule, QuantMmaSchedule, SmallMSchedule, TiledSchedule, WgmmaSchedule, WS_CONSUMER_REGS, WS_PRODUCER_REGS};
use self::schedule::small_m_schedule;



/// Generates the PTX and launch plan of matmul kernel `kernel` of `graph` with the schedule
/// [`choose_schedule`] picks.
///
/// Parameters: the kernel's buffers (inputs then outputs), then one i64 per symbolic dim the
/// kernel needs. Block and grid: see [`MmaSchedule`] / [`TiledSchedule`] / [`SmallMSchedule`];
/// the tensor-core kernel uses dynamic shared memory (the plan's `shared_bytes`, beyond 48 KiB
/// at the default schedule: the runtime opts in), the others static shared memory only.
///
/// # Errors
/// [`CodegenError::Unsupported`] when the body is not one `matmul` of float kernel inputs
/// followed by an epilogue the element evaluator supports, or when an output does not have
/// the matmul's shape; LLVM and target errors otherwise.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    crate::kernels::family::compile::<Matmul>(graph, kernel, target)
}

/// The matmul family's generator: one schedule enum over its five kernels.
pub(crate) struct Matmul;

impl Generator for Matmul {
    type Analysis<'g> = Spec;
    type Schedule = MatmulSchedule;
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, _: &Target) -> R<Spec> {
        Spec::analyse(graph, kernel)
    }
    /// [`choose_schedule`]'s.
    fn default_schedule(spec: &Spec, target: &Target) -> R<MatmulSchedule> {
        Ok(spec.default_schedule(target))
    }
    fn candidates(spec: &Spec, target: &Target) -> R<Vec<MatmulSchedule>> {
        variants(spec, target)
    }
    fn build(spec: &Spec, s: &MatmulSchedule, target: &Target) -> R<LaunchPlan> {
        generate_spec(spec, target, s)
    }
}

impl Schedule for MatmulSchedule {
    fn name(&self) -> String {
        MatmulSchedule::name(self)
    }
}

/// As [`generate`], with the schedule given (for autotuning and tests). Every schedule is
/// correct for every shape it accepts ([`MatmulSchedule::SmallM`] covers M with `⌈M/rows⌉`
/// CTAs along y, so it is merely slow for a large M; [`MatmulSchedule::Mma`] needs bf16/f16
/// operands whose layouts allow 16-byte copies).
///
/// # Errors
/// As [`generate`], and [`CodegenError::Unsupported`] for a schedule that breaks its
/// constraints.
pub fn generate_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &MatmulSchedule) -> Result<LaunchPlan, CodegenError> {
    let spec = Spec::analyse(graph, kernel)?;
    generate_spec(&spec, target, schedule)
}

/// The schedule candidates of matmul `kernel` for autotuning ([`crate::schedule_variants`]):
/// [`generate`]'s schedule first, then, for a tensor-core kernel, the other CTA tiles —
/// [`MmaSchedule::DEFAULT`] and [`MmaSchedule::NARROW`], or for a flat GEMM (M ≤ 16) the flat
/// tiles of 32, 64 and 128 columns ([`MmaSchedule::flat`]); for a quantized B read on tensor
/// cores, other [`QuantMmaSchedule`]s and the quantized small-M kernel — each with its
/// [`MatmulSchedule::name`] (an alternative the kernel's layouts or epilogue do not accept
/// fails to build with [`CodegenError::Unsupported`]). An fp8 matmul
/// has the wgmma tiles only.
///
/// # Errors
/// As [`generate`], when the kernel cannot be analysed or is an fp8 matmul the target's wgmma
/// kernel does not take.
fn variants(spec: &Spec, target: &Target) -> R<Vec<MatmulSchedule>> {
    let default = spec.default_schedule(target);
    if spec.prologue.is_some() {
        // A norm prologue: the small-M kernel alone computes it.
        return Ok(vec![default]);
    }
    if let (Some(_), MatmulSchedule::Wgmma(w)) = (spec.fp8, default) {
        // The fp8 matmul has no schedule where wgmma does not take it (sm_80, sm_90): no
        // candidates to name either.
        spec.wgmma_plan(&w.tile, target).map_err(|e| unsupported(&spec.kernel_name, e))?;
    }
    let mut scheds = vec![default];
    if let MatmulSchedule::Mma(d) = default {
        let alts: Vec<MmaSchedule> = if d.bm == 16 { [32, 64, 128].into_iter().map(MmaSchedule::flat).collect() } else { vec![MmaSchedule::DEFAULT, MmaSchedule::NARROW] };
        scheds.extend(alts.into_iter().map(MatmulSchedule::Mma).filter(|a| *a != default));
        if d.bm != 16 && spec.wgmma_plan(&MmaSchedule::WGMMA, target).is_ok() {
            scheds.push(MatmulSchedule::Wgmma(WgmmaSchedule { tma: false, ..WgmmaSchedule::DEFAULT }));
        }
    }
    if let MatmulSchedule::Wgmma(d) = default {
        // TMA and cp.async loads (TMA where tensor maps fit: 16-bit operands), the other
        // Hopper tile width (with the default's K tile: 64 bf16/f16, 128 e4m3 elements), then
        // the `mma.sync` kernels (not for fp8 operands).
        let base = WgmmaSchedule { tile: MmaSchedule { bk: d.tile.bk, ..MmaSchedule::WGMMA }, ..WgmmaSchedule::DEFAULT };
        let narrow = WgmmaSchedule { tile: MmaSchedule { bn: 128, ..base.tile }, ..base };
        let waiting = WgmmaSchedule { in_flight: 0, ..base };
        let chunks = |w: WgmmaSchedule| WgmmaSchedule { tma: false, ..w };
        // Warp-specialised (TMA, direct epilogue only), one CTA per tile and persistent.
        let ws = WgmmaSchedule { specialized: true, ..base };
        // Persistent: one CTA an SM of the target (a grid of constant size; a card with fewer SMs
        // runs the rest in a second wave).
        let persistent = WgmmaSchedule { ctas: target.sm_count(), ..ws };
        let mut wg = vec![base, chunks(base), chunks(waiting), narrow, chunks(narrow)];
        if spec.ws_ok(&ws).is_ok() {
            wg.extend([ws, persistent]);
        }
        let mut alts: Vec<MatmulSchedule> = wg.into_iter().filter(|w| !w.tma || spec.tma_maps(&w.tile).is_ok()).map(MatmulSchedule::Wgmma).collect();
        if spec.fp8.is_none() {
            alts.extend([MatmulSchedule::Mma(MmaSchedule::DEFAULT), MatmulSchedule::Mma(MmaSchedule::NARROW)]);
        }
        scheds.extend(alts.into_iter().filter(|a| *a != default));
    }
    if spec.b_quant.is_some() {
        // Quantized weights: other step lengths and warp shapes, with and without the
        // prefetch, and the small-M kernel streaming whole blocks per lane.
        let alts = [
            QuantMmaSchedule::DEFAULT,
            QuantMmaSchedule { warps: 8, tiles: 1, chunk: 128, prefetch: true },
            QuantMmaSchedule { warps: 8, tiles: 1, chunk: 256, prefetch: false },
            QuantMmaSchedule { warps: 8, tiles: 1, chunk: 256, prefetch: true },
            QuantMmaSchedule { warps: 4, tiles: 2, chunk: 128, prefetch: true },
            QuantMmaSchedule { warps: 4, tiles: 1, chunk: 64, prefetch: true },
        ];
        scheds.extend(alts.into_iter().map(MatmulSchedule::QuantMma).filter(|a| *a != default));
        let rows = spec.m.as_const().map_or(16, |m| m.clamp(1, 16)) as u32;
        let gemv = MatmulSchedule::SmallM(small_m_schedule(rows, true));
        if gemv != default {
            scheds.push(gemv);
        }
    }
    Ok(scheds)
}

fn generate_spec(spec: &Spec, target: &Target, schedule: &MatmulSchedule) -> Result<LaunchPlan, CodegenError> {
    let (tag, check, threads) = match schedule {
        MatmulSchedule::Tiled(s) => ("matmul", s.check().and_then(|()| spec.fits(s)), s.threads()),
        MatmulSchedule::SmallM(s) => ("matmul_small_m", s.check(), s.threads()),
        MatmulSchedule::Mma(s) => ("matmul_mma", s.check().and_then(|()| spec.mma_plan(s, target).map(|_| ())), s.threads()),
        MatmulSchedule::QuantMma(s) => ("matmul_mma_q", s.check().and_then(|()| spec.quant_mma_ok()), s.threads()),
        MatmulSchedule::Wgmma(w) => (
            "matmul_wgmma",
            w.tile
                .check()
                .and_then(|()| if w.in_flight <= 1 { Ok(()) } else { Err(format!("{w:?}: at most one product group in flight")) })
                .and_then(|()| spec.wgmma_plan(&w.tile, target).map(|_| ()))
                .and_then(|()| if w.tma { spec.tma_maps(&w.tile).map(|_| ()) } else { Ok(()) })
                .and_then(|()| spec.ws_ok(w)),
            w.threads(),
        ),
    };
    check.map_err(|reason| unsupported(&spec.kernel_name, reason))?;
    if spec.prologue.is_some() && !matches!(schedule, MatmulSchedule::SmallM(_)) {
        return Err(unsupported(&spec.kernel_name, format!("a norm prologue is computed by the small-M kernel only, not by schedule `{}`", schedule.name())));
    }
    if spec.fp8.is_some() && !matches!(schedule, MatmulSchedule::Wgmma(_)) {
        return Err(unsupported(&spec.kernel_name, crate::error::fp8_message(&format!("f8e4m3 matmul: schedule `{}`", schedule.name()))));
    }
    let quant_ok = match schedule {
        MatmulSchedule::SmallM(s) => s.lanes == 32,
        MatmulSchedule::QuantMma(_) => true,
        _ => false,
    };
    if let (Some(q), false) = (spec.b_quant, quant_ok) {
        return Err(unsupported(&spec.kernel_name, format!("a {q} B operand is read by the quantized schedules only, not {schedule:?}")));
    }
    let tag = if spec.b_quant.is_some() && matches!(schedule, MatmulSchedule::SmallM(_)) { "matmul_small_m_q" } else { tag };
    let tag = if spec.fp8.is_some() { "matmul_wgmma_e4m3" } else { tag };
    let entry = format!("{}_{tag}", spec.kernel_name);
    let ctx = Context::create();
    let n_outputs = spec.n_buffers - spec.n_inputs;
    let maps = match schedule {
        MatmulSchedule::Wgmma(w) if w.tma => spec.tma_maps(&w.tile).map_err(|e| unsupported(&spec.kernel_name, e))?,
        _ => Vec::new(),
    };
    let (ptx, params) = Kit::build_with_maps(&ctx, &entry, *target, (spec.n_inputs, n_outputs), &maps, &spec.all_dims, threads, |kit| match schedule {
        MatmulSchedule::Tiled(s) => build_tiled(kit, spec, s),
        MatmulSchedule::SmallM(s) => build_small_m(kit, spec, s),
        MatmulSchedule::Mma(s) => build_mma(kit, spec, s, &spec.mma_plan(s, target).map_err(|e| kit.err(e))?),
        MatmulSchedule::QuantMma(s) => build_quant_mma(kit, spec, s),
        MatmulSchedule::Wgmma(w) => build_wgmma(kit, spec, w, &spec.wgmma_plan(&w.tile, target).map_err(|e| kit.err(e))?),
    })?;
    let batch = GridDim { numerator: Dim::product(&spec.batch), denominator: 1 };
    // Tiled and tensor-core kernels: a CTA per (row tile, column tile, batch).
    let tiles = |bm: u32, bn: u32| {
        // Paired: a CTA covers bn / segments output columns.
        let cols = match &spec.epi {
            Epi::Paired { segs, width, .. } => GridDim { numerator: width.clone(), denominator: bn / segs.len() as u32 },
            _ => GridDim { numerator: spec.n.clone(), denominator: bn },
        };
        [GridDim { numerator: spec.m.clone(), denominator: bm }, cols, batch.clone()]
    };
    let (grid, shared_bytes) = match schedule {
        MatmulSchedule::Tiled(s) => (tiles(s.bm, s.bn), 0),
        MatmulSchedule::Mma(s) => (tiles(s.bm, s.bn), spec.mma_plan(s, target).map_err(|e| unsupported(&spec.kernel_name, e))?.smem_bytes),
        MatmulSchedule::Wgmma(w) => (if w.ctas > 0 { [GridDim::fixed(w.ctas), GridDim::fixed(1), GridDim::fixed(1)] } else { tiles(w.tile.bm, w.tile.bn) }, spec.wgmma_plan(&w.tile, target).map_err(|e| unsupported(&spec.kernel_name, e))?.smem_bytes),
        MatmulSchedule::QuantMma(s) => ([GridDim { numerator: spec.n.clone(), denominator: s.columns() }, GridDim { numerator: spec.m.clone(), denominator: 16 }, batch], 0),
        MatmulSchedule::SmallM(s) => {
            let cols = match &spec.epi {
                Epi::Paired { width, .. } => width.clone(),
                _ => spec.n.clone(),
            };
            ([GridDim { numerator: cols, denominator: s.columns }, GridDim { numerator: spec.m.clone(), denominator: s.rows }, batch], 0)
        }
    };
    Ok(LaunchPlan { entry, ptx, target: *target, grid, block: [threads, 1, 1], shared_bytes, params })
}
