//! The matmul family's tests: ptxas reports, launch plans, the schedule rule, refusals, and
//! every generator run by the CPU emulator against the interpreter.

use inkwell::IntPredicate;
use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, DType, Family, Function, FunctionBuilder, Graph, KernelParam, OpKind, TensorType, Value};

use super::*;
use super::schedule::small_m_schedule;
use super::spec::Spec;
use crate::isa::kit::{SharedKind, R};
use crate::testing::{assemble, d, plan_line, single_kernel, sym, ty};


/// The tensor-core primitives on one warp, emulated (and assembled for sm_80 and sm_90a):
/// `cp.async` of a 16×16 A and a 16×16 B into shared memory (one chunk of A zero-filled
/// past 3 elements), `ldmatrix.x4` (B both ways: `[N, K]` without `.trans`, `[K, N]`
/// with), two `mma.m16n8k16` accumulating onto 0.5, and `pack_x2` of the result — checked
/// against a CPU product, in bf16 and f16.
#[test]
fn mma_primitives() {
    use crate::emu::{from_bytes, random, run, to_bytes};
    for dt in [DType::BF16, DType::F16] {
        for b_k_contig in [true, false] {
            let build = |kit: &Kit<'_>| -> R<()> {
                let smem = kit.shared(SharedKind::Static, 1024)?;
                let lane = kit.sreg("tid.x")?;
                let (a, b) = (kit.buf(0)?, kit.buf(1)?);
                // Chunk `lane` of each 16 × 16 tile: row lane/2, 8 elements from 8·(lane%2).
                let row = kit.lshr(lane, 1)?;
                let half = kit.and(lane, kit.i32c(1))?;
                let at = kit.zext64(kit.add(kit.mul(row, kit.i32c(16))?, kit.shl(half, 3)?)?)?;
                let boff = kit.add(kit.mul(row, kit.i32c(32))?, kit.shl(half, 4)?)?;
                let last = kit.icmp(IntPredicate::EQ, lane, kit.i32c(31))?;
                let bytes = kit.select_i(last, kit.i32c(6), kit.i32c(16))?;
                kit.cp_async_16(kit.sh_at(smem, boff)?, kit.gep_raw(dt, a, at)?, bytes)?;
                kit.cp_async_16(kit.sh_at(smem, kit.add(boff, kit.i32c(512))?)?, kit.gep_raw(dt, b, at)?, kit.i32c(16))?;
                kit.cp_async_commit()?;
                kit.cp_async_wait(0)?;
                kit.warp_sync()?;
                // A: lane l at row l % 16, column 8·(l / 16).
                let aoff = kit.add(kit.mul(kit.and(lane, kit.i32c(15))?, kit.i32c(32))?, kit.shl(kit.lshr(lane, 4)?, 4)?)?;
                let af = kit.ldmatrix_x4(kit.sh_at(smem, aoff)?, false)?;
                // B [N, K]: lane l at row (l % 8) + 8·(l / 16), column 8·((l / 8) % 2);
                // B [K, N] (.trans): row (l % 16), column 8·(l / 16).
                let r8 = kit.and(lane, kit.i32c(7))?;
                let j1 = kit.and(kit.lshr(lane, 3)?, kit.i32c(1))?;
                let j2 = kit.lshr(lane, 4)?;
                let (brow, bcol) = if b_k_contig { (kit.add(r8, kit.shl(j2, 3)?)?, j1) } else { (kit.add(r8, kit.shl(j1, 3)?)?, j2) };
                let bo = kit.add(kit.i32c(512), kit.add(kit.mul(brow, kit.i32c(32))?, kit.shl(bcol, 4)?)?)?;
                let bf = kit.ldmatrix_x4(kit.sh_at(smem, bo)?, !b_k_contig)?;
                let g = kit.zext64(kit.lshr(lane, 2)?)?;
                let t2 = kit.zext64(kit.shl(kit.and(lane, kit.i32c(3))?, 1)?)?;
                let c = kit.f32c(0.5);
                for nt in 0..2usize {
                    let d = kit.mma(dt, af, [bf[2 * nt], bf[2 * nt + 1]], [c; 4])?;
                    for h in 0..2usize {
                        let row = kit.add(g, kit.i64c(8 * h as i64))?;
                        let e = kit.add(kit.mul(row, kit.i64c(16))?, kit.add(t2, kit.i64c(8 * nt as i64))?)?;
                        kit.store_vec(DType::F32, kit.buf(2)?, e, &[d[2 * h], d[2 * h + 1]])?;
                        let packed = kit.math(|kb| kb.pack_x2(dt, d[2 * h], d[2 * h + 1]))?;
                        let p = kit.gep(kit.i32t.into(), kit.buf(3)?, kit.udiv(e, kit.i64c(2))?)?;
                        kit.set(p, packed.into())?;
                    }
                }
                Ok(())
            };
            let make = |emit_ir: bool, target: Target| -> LaunchPlan {
                crate::isa::kit::EMIT_IR.with(|f| f.set(emit_ir));
                let ctx = Context::create();
                let (ptx, params) = Kit::build(&ctx, "mma_unit", target, 2, 2, &[], 32, build).unwrap();
                crate::isa::kit::EMIT_IR.with(|f| f.set(false));
                LaunchPlan { entry: "mma_unit".into(), ptx, target, grid: [GridDim::fixed(1), GridDim::fixed(1), GridDim::fixed(1)], block: [32, 1, 1], shared_bytes: 0, params }
            };
            for t in [Target::SM_80, Target::SM_90A] {
                let plan = make(false, t);
                for want in ["cp.async.cg.shared.global", "cp.async.wait_group", "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32"] {
                    assert!(plan.ptx.contains(want), "{dt} {t}: no {want}:\n{}", plan.ptx);
                }
                assert_eq!(plan.ptx.contains("ldmatrix.sync.aligned.m8n8.x4.trans"), !b_k_contig);
                assemble(&plan);
            }
            let a = random(dt, &[16, 16], 70);
            let b = random(dt, &[16, 16], 71);
            let mut bufs = vec![to_bytes(&a), to_bytes(&b), vec![0u8; 16 * 16 * 4], vec![0u8; 16 * 16 * 2]];
            run(&make(true, Target::SM_80), &sinter_ir::Bindings::new(), &mut bufs);
            let got = from_bytes(DType::F32, &bufs[2], 256);
            let packed = from_bytes(dt, &bufs[3], 256);
            for i in 0..16 {
                for j in 0..16 {
                    let mut want = 0.5;
                    for kk in 0..16 {
                        // The last chunk of A (row 15, k 8..16) kept 3 elements.
                        let av = if i == 15 && kk >= 11 { 0.0 } else { a.data()[i * 16 + kk] };
                        let bv = if b_k_contig { b.data()[j * 16 + kk] } else { b.data()[kk * 16 + j] };
                        want += av * bv;
                    }
                    let o = got[i * 16 + j];
                    assert!((o - want).abs() <= 1e-5 * (1.0 + want.abs()), "{dt} B k-contiguous {b_k_contig}: D[{i}][{j}] = {o}, want {want}");
                    assert_eq!(packed[i * 16 + j], dt.round(o), "{dt}: pack_x2 at [{i}][{j}]");
                }
            }
        }
    }
}

/// `x [M, 576] · w [1536, 576]ᵀ + bias [1536]`, then silu: a projection with an epilogue.
fn projection(m: Dim, dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(dt, &[m, d(576)]));
    let w = fb.param("w", ty(dt, &[d(1536), d(576)]));
    let bias = fb.param("bias", ty(dt, &[d(1536)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let y = fb.op1(OpKind::Add, &[mm, bias], vec![]).unwrap();
    let z = fb.op1(OpKind::Silu, &[y], vec![]).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[z]).unwrap())
}

/// `x + attn · wo [576, 576]ᵀ` (the residual add of a decoder layer), M rows.
fn residual(m: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "o_proj");
    let attn = fb.param("attn", ty(DType::BF16, &[m.clone(), d(576)]));
    let wo = fb.param("wo", ty(DType::BF16, &[d(576), d(576)]));
    let x = fb.param("x", ty(DType::BF16, &[m, d(576)]));
    let mm = fb.op1(OpKind::Matmul, &[attn, wo], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let y = fb.op1(OpKind::Add, &[x, mm], vec![]).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// Batched scores `q [9, T, 64] · k [3→9 broadcast? no: 9, S, 64]ᵀ · 0.125` in f32 with a
/// second output (the unscaled product).
fn batched_scores() -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "scores");
    let q = fb.param("q", ty(DType::F32, &[sym("B"), d(9), sym("T"), d(64)]));
    let k = fb.param("k", ty(DType::F32, &[d(9), sym("S"), d(64)]));
    let mm = fb.op1(OpKind::Matmul, &[q, k], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let c = fb.op1(OpKind::Constant, &[], vec![("value", Attr::Float(0.125)), ("dtype", Attr::DType(DType::F32))]).unwrap();
    let s = fb.op1(OpKind::Mul, &[mm, c], vec![]).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[s, mm]).unwrap())
}

/// `x [4, 100] · w [100, 200]` in f16 (B N-contiguous: a thread per column), cast to f32.
fn n_contiguous() -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "nc");
    let x = fb.param("x", ty(DType::F16, &[d(4), d(100)]));
    let w = fb.param("w", ty(DType::F16, &[d(100), d(200)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
    let y = fb.op1(OpKind::Cast, &[mm], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// `x [m, 512] · w [512, 1000]` in f16 (B N-contiguous) plus a bias, cast to f32.
fn n_contiguous_f16(m: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "nc");
    let x = fb.param("x", ty(DType::F16, &[m, d(512)]));
    let w = fb.param("w", ty(DType::F16, &[d(512), d(1000)]));
    let b = fb.param("b", ty(DType::F16, &[d(1000)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
    let y = fb.op1(OpKind::Add, &[mm, b], vec![]).unwrap();
    let y = fb.op1(OpKind::Cast, &[y], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// [`n_contiguous_f16`] with `m = T`: the tensor-core GEMM with `ldmatrix.trans`.
fn n_contiguous_mma() -> (KernelGraph, Kernel) {
    n_contiguous_f16(sym("T"))
}

/// [`n_contiguous_f16`] with `m = 8`: the flat tensor-core GEMM with `ldmatrix.trans`.
fn n_contiguous_flat() -> (KernelGraph, Kernel) {
    n_contiguous_f16(d(8))
}

/// Every case at sm_80 and sm_90a: plan and ptxas resource line (no spills).
#[test]
fn ptxas_reports() {
    let cases: Vec<(&str, (KernelGraph, Kernel))> = vec![
        ("projection bf16 M=T (tensor cores)", projection(sym("T"), DType::BF16)),
        ("projection bf16 M=1 (small M)", projection(d(1), DType::BF16)),
        ("residual bf16 M=16 (flat tensor cores)", residual(d(16))),
        ("projection bf16 M=5 (flat tensor cores)", projection(d(5), DType::BF16)),
        ("f16 N-contiguous M=8 (flat tensor cores, ldmatrix.trans)", n_contiguous_flat()),
        ("residual bf16 M=T (tensor cores, 128-column tiles)", residual(sym("T"))),
        ("batched scores f32, two outputs (tiled)", batched_scores()),
        ("f16 N-contiguous M=4 (small M, thread per column)", n_contiguous()),
        ("f16 N-contiguous M=T (tensor cores, ldmatrix.trans)", n_contiguous_mma()),
        ("projection f32 M=T (tiled)", projection(sym("T"), DType::F32)),
    ];
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k)) in &cases {
            let plan = generate(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("matmul_ptxas", text);
}

#[test]
fn empty_k_builds_no_tensor_map() {
    // K = 0 on sm_90a: the product is zeros, computed by the wgmma kernel with `cp.async`
    // loads (the driver encodes no tensor map with an empty dimension).
    let mut fb = FunctionBuilder::new(&Graph::new(), "empty_k");
    let x = fb.param("x", ty(DType::F16, &[d(7), d(256), d(0)]));
    let w = fb.param("w", ty(DType::F16, &[d(7), d(0)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
    let plan = generate(&g, k, &Target::SM_90A).unwrap();
    assert!(!plan.params.iter().any(|p| matches!(p, KernelParam::TensorMap(_))), "{} {:?}", plan.entry, plan.params);
    let names: Vec<String> = crate::kernels::family::candidates::<super::Matmul>(&g, k, &Target::SM_90A).unwrap().into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().all(|n| !n.contains("tma")), "{names:?}");
}

#[test]
fn launch_plans() {
    // bf16 at a symbolic M: the tensor cores, 128×256 tiles, 144 KiB of dynamic shared
    // memory, the launch bound declared.
    let (g, k) = projection(sym("T"), DType::BF16);
    // sm_90a: the same tile on warpgroup MMAs, 4 stages (192 KiB), 8 warps, the stages
    // loaded by the TMA from two tensor maps (parameters after the buffers).
    let hopper = generate(&g, k, &Target::SM_90A).unwrap();
    assert_eq!((hopper.entry.as_str(), hopper.block, hopper.shared_bytes), ("k0_matmul_wgmma", [256, 1, 1], 192 * 1024));
    assert_eq!(hopper.grid[..2], [GridDim { numerator: sym("T"), denominator: 128 }, GridDim { numerator: d(1536), denominator: 256 }]);
    assert!(hopper.ptx.contains("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") && hopper.ptx.contains("cp.async.bulk.tensor.2d"));
    assert!(matches!(hopper.params[..], [KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Buffer(3), KernelParam::TensorMap(_), KernelParam::TensorMap(_), KernelParam::Size(_)]), "{:?}", hopper.params);
    let plan = generate(&g, k, &Target::SM_90).unwrap();
    assert_eq!(plan.entry, "k0_matmul_mma");
    assert_eq!(plan.block, [256, 1, 1]);
    assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 128 });
    assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 256 });
    assert_eq!(plan.grid[2], GridDim::fixed(1));
    assert_eq!(plan.shared_bytes, 144 * 1024);
    assert_eq!(&plan.params[..4], &[KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Buffer(3)]);
    assert!(plan.params[4..].iter().all(|p| matches!(p, KernelParam::Size(_))), "{:?}", plan.params);
    assert!(plan.params.contains(&KernelParam::Size(sym("T"))));
    assert!(plan.ptx.contains(".entry k0_matmul_mma("), "{}", plan.ptx);
    assert!(plan.ptx.contains(".maxntid 256"), "{}", plan.ptx);
    for want in ["cp.async.cg.shared.global", "cp.async.wait_group", "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "cvt.rn.bf16x2.f32"] {
        assert!(plan.ptx.contains(want), "no {want}");
    }
    assert!(!plan.ptx.contains(".trans"), "both operands K-contiguous: no transposed ldmatrix");
    // f32 stays on the CUDA cores.
    let (g, k) = projection(sym("T"), DType::F32);
    let plan = generate(&g, k, &Target::SM_90A).unwrap();
    assert_eq!(plan.entry, "k0_matmul");
    assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 64 });
    assert_eq!(plan.shared_bytes, 0);
    // A layout the 16-byte copies cannot prove (rows of 577 elements) falls back to the
    // tiled kernel, and the tensor-core schedule given explicitly is refused.
    let mut fb = FunctionBuilder::new(&Graph::new(), "odd");
    let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(577)]));
    let w = fb.param("w", ty(DType::BF16, &[d(64), d(577)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
    assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul");
    let e = generate_with(&g, k, &Target::SM_80, &MatmulSchedule::Mma(MmaSchedule::DEFAULT)).unwrap_err();
    assert!(e.to_string().contains("aligned 16-byte chunks"), "{e}");
    // More stages than sm_80's shared memory holds.
    let (g, k) = projection(sym("T"), DType::BF16);
    let deep = MmaSchedule { stages: 4, ..MmaSchedule::DEFAULT };
    assert!(generate_with(&g, k, &Target::SM_80, &MatmulSchedule::Mma(deep)).is_err());
    assert!(generate_with(&g, k, &Target::SM_90A, &MatmulSchedule::Mma(deep)).is_ok());
    // The small-M path reads 16-byte vectors of x and w and reduces with shuffles.
    let (g, k) = projection(d(1), DType::BF16);
    let plan = generate(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.entry, "k0_matmul_small_m");
    assert_eq!(plan.grid[0], GridDim { numerator: d(1536), denominator: 4 });
    assert!(plan.ptx.contains("ld.global.nc.v4.b32"), "{}", plan.ptx);
    assert!(plan.ptx.contains("shfl.sync.bfly.b32"), "{}", plan.ptx);
    // M = 5: the flat tensor-core GEMM, one 16-row tile, 32 columns per CTA, 2 warps,
    // 4 stages of 16×256 and 32×256 slabs (96 KiB).
    let (g, k) = projection(d(5), DType::BF16);
    let plan = generate(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.entry, "k0_matmul_mma");
    assert_eq!(plan.grid[0], GridDim { numerator: d(5), denominator: 16 });
    assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 32 });
    assert_eq!(plan.block, [64, 1, 1]);
    assert_eq!(plan.shared_bytes, 96 * 1024);
    assert!(plan.ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
    // f32 at M = 5 and a layout without 16-byte chunks (rows of 577) keep the small-M kernel.
    let (g, k) = projection(d(5), DType::F32);
    assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
    let mut fb = FunctionBuilder::new(&Graph::new(), "odd");
    let x = fb.param("x", ty(DType::BF16, &[d(5), d(577)]));
    let w = fb.param("w", ty(DType::BF16, &[d(64), d(577)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
    assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
    // Batched: grid.z is the batch.
    let (g, k) = batched_scores();
    let plan = generate(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.grid[2], GridDim { numerator: sym("B").scale(9), denominator: 1 });
}

#[test]
fn schedule_heuristic() {
    let bf = DType::BF16;
    assert_eq!(choose_schedule(&sym("T"), &d(1536), bf, true), MatmulSchedule::Mma(MmaSchedule::DEFAULT));
    assert_eq!(choose_schedule(&sym("T"), &sym("N"), DType::F16, false), MatmulSchedule::Mma(MmaSchedule::DEFAULT));
    assert_eq!(choose_schedule(&d(17), &d(576), bf, true), MatmulSchedule::Mma(MmaSchedule::NARROW));
    assert_eq!(choose_schedule(&sym("T"), &d(64), bf, true), MatmulSchedule::Mma(MmaSchedule::NARROW));
    assert_eq!(choose_schedule(&sym("T"), &d(64), DType::F32, true), MatmulSchedule::Tiled(TiledSchedule::DEFAULT));
    assert_eq!(choose_schedule(&d(17), &d(64), DType::F32, true), MatmulSchedule::Tiled(TiledSchedule::DEFAULT));
    assert_eq!(choose_schedule(&d(1), &d(64), bf, true), MatmulSchedule::SmallM(SmallMSchedule { rows: 1, lanes: 32, columns: 4 }));
    assert_eq!(choose_schedule(&d(1), &d(64), bf, false), MatmulSchedule::SmallM(SmallMSchedule { rows: 1, lanes: 1, columns: 128 }));
    // M in 2..=16 of bf16/f16: the flat tensor-core GEMM; f32 keeps the small-M kernel.
    for m in [2, 5, 16] {
        assert_eq!(choose_schedule(&d(m), &d(576), bf, true), MatmulSchedule::Mma(MmaSchedule::FLAT));
        assert_eq!(choose_schedule(&d(m), &d(192), DType::F16, false), MatmulSchedule::Mma(MmaSchedule::FLAT));
    }
    assert_eq!(choose_schedule(&d(16), &d(64), DType::F32, false), MatmulSchedule::SmallM(SmallMSchedule { rows: 16, lanes: 1, columns: 128 }));
    assert_eq!(MmaSchedule::FLAT, MmaSchedule { bm: 16, bn: 32, bk: 256, warps_m: 1, warps_n: 2, stages: 4, group_m: 1 });
    for bn in [32, 64, 128, 256] {
        let s = MmaSchedule::flat(bn);
        s.check().unwrap();
        assert_eq!(s.warp_tile().0, 16);
        assert!(s.stages * s.stage_bytes() <= 144 * 1024, "{s:?}");
    }
    assert_eq!(MmaSchedule::DEFAULT.threads(), 256);
    assert_eq!(MmaSchedule::DEFAULT.warp_tile(), (64, 64));
    assert_eq!(3 * MmaSchedule::DEFAULT.stage_bytes(), 144 * 1024);
    assert_eq!(MmaSchedule::for_columns(&d(4096), 128), MmaSchedule::DEFAULT);
    assert_eq!(MmaSchedule::for_columns(&d(576), 256), MmaSchedule::DEFAULT, "a 256-wide RoPE head needs 256-column tiles");
    assert_eq!(TiledSchedule::DEFAULT.threads(), 256);
    assert_eq!(TiledSchedule::DEFAULT.shared_bytes(), 8704);
    // Other schedules generate and assemble too (the autotuner's candidates).
    let (g, k) = residual(sym("T"));
    for s in [
        MatmulSchedule::Tiled(TiledSchedule { bm: 32, bn: 64, bk: 8, tm: 2, tn: 4 }),
        MatmulSchedule::Tiled(TiledSchedule { bm: 128, bn: 64, bk: 8, tm: 4, tn: 4 }),
        MatmulSchedule::Tiled(TiledSchedule { bm: 32, bn: 32, bk: 8, tm: 1, tn: 4 }),
        MatmulSchedule::SmallM(SmallMSchedule { rows: 8, lanes: 8, columns: 16 }),
    ] {
        let plan = generate_with(&g, k, &Target::SM_80, &s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
        assemble(&plan);
    }
    let bad = MatmulSchedule::Tiled(TiledSchedule { bm: 64, bn: 64, bk: 16, tm: 3, tn: 4 });
    assert!(matches!(generate_with(&g, k, &Target::SM_80, &bad), Err(CodegenError::Unsupported { .. })));
}

#[test]
fn rejects_what_it_cannot_do() {
    let unsupported = |f: Function| {
        let (g, k) = single_kernel(Family::Matmul, f);
        match generate(&g, k, &Target::SM_80) {
            Err(CodegenError::Unsupported { kernel, message }) => format!("{kernel}: {message}"),
            other => panic!("{other:?}"),
        }
    };
    // A prologue (the operand is computed in the kernel).
    let mut fb = FunctionBuilder::new(&Graph::new(), "k");
    let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
    let w = fb.param("w", ty(DType::F32, &[d(8), d(8)]));
    let xn = fb.op1(OpKind::Neg, &[x], vec![]).unwrap();
    let mm = fb.op1(OpKind::Matmul, &[xn, w], vec![]).unwrap();
    let msg = unsupported(fb.finish(&[mm]).unwrap());
    assert!(msg.contains("k0 (Matmul)") && msg.contains("computed in the kernel"), "{msg}");
    // An output of another shape.
    let mut fb = FunctionBuilder::new(&Graph::new(), "k");
    let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
    let w = fb.param("w", ty(DType::F32, &[d(8), d(8)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
    let r = fb.op1(OpKind::ReduceSum, &[mm], vec![]).unwrap();
    let msg = unsupported(fb.finish(&[r]).unwrap());
    assert!(msg.contains("`reduce_sum` on the matmul's result"), "{msg}");
    // Integer operands.
    let mut fb = FunctionBuilder::new(&Graph::new(), "k");
    let x = fb.param("x", ty(DType::I32, &[d(4), d(8)]));
    let w = fb.param("w", ty(DType::I32, &[d(8), d(8)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
    let msg = unsupported(fb.finish(&[mm]).unwrap());
    assert!(msg.contains("bf16, f16 or f32"), "{msg}");
    // A kernel of another family.
    let (g, k) = projection(d(2), DType::F32);
    let mut g2 = g.clone();
    g2.kernels[k].family = Family::Pointwise;
    assert!(generate(&g2, k, &Target::SM_80).is_err());
}

/// The merged QKV projection as the passes fuse it (SmolLM2 sizes): one matmul, column
/// slices for Q, K, V, RoPE on Q and K after a reshape to heads.
pub(crate) fn qkv_rope(m: Dim, dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "qkv");
    let x = fb.param("x", ty(dt, &[m.clone(), d(576)]));
    let w = fb.param("w", ty(dt, &[d(960), d(576)]));
    let pos = fb.param("positions", ty(DType::I32, std::slice::from_ref(&m)));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let p2 = fb.op1(OpKind::Reshape, &[pos], vec![("shape", Attr::Dims(vec![m.clone(), d(1)]))]).unwrap();
    let slice = |fb: &mut FunctionBuilder, a: i64, b: i64| {
        fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(a))), ("end", Attr::Dim(d(b)))]).unwrap()
    };
    let q = slice(&mut fb, 0, 576);
    let q = fb.op1(OpKind::Reshape, &[q], vec![("shape", Attr::Dims(vec![m.clone(), d(9), d(64)]))]).unwrap();
    let q = fb.op1(OpKind::Rope, &[q, p2], vec![("theta", Attr::Float(100000.0))]).unwrap();
    let k = slice(&mut fb, 576, 768);
    let k = fb.op1(OpKind::Reshape, &[k], vec![("shape", Attr::Dims(vec![m.clone(), d(3), d(64)]))]).unwrap();
    let k = fb.op1(OpKind::Rope, &[k, p2], vec![("theta", Attr::Float(100000.0))]).unwrap();
    let v = slice(&mut fb, 768, 960);
    single_kernel(Family::Matmul, fb.finish(&[q, k, v]).unwrap())
}

/// The merged gate/up projection with SwiGLU over its halves.
pub(crate) fn gate_up(m: Dim, dt: DType) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "mlp");
    let x = fb.param("x", ty(dt, &[m, d(576)]));
    let w = fb.param("w", ty(dt, &[d(3072), d(576)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let g = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(1536)))]).unwrap();
    let u = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(1536))), ("end", Attr::Dim(d(3072)))]).unwrap();
    let o = fb.op1(OpKind::Swiglu, &[g, u], vec![]).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[o]).unwrap())
}

/// The warp-specialised wgmma kernel writes from registers only: a staged epilogue (the
/// gate/up pairs) is refused with the reason and is not among the candidates, persistent
/// CTAs need the specialised kernel, and specialisation needs the TMA.
#[test]
fn wgmma_ws_refuses_what_it_cannot_run() {
    let ws = WgmmaSchedule { specialized: true, ..WgmmaSchedule::DEFAULT };
    let (g, k) = gate_up(d(256), DType::BF16);
    let err = generate_with(&g, k, &Target::SM_90A, &MatmulSchedule::Wgmma(ws)).unwrap_err();
    assert!(err.to_string().contains("staged epilogue"), "{err}");
    let names: Vec<String> = crate::kernels::family::candidates::<super::Matmul>(&g, k, &Target::SM_90A).unwrap().into_iter().map(|(n, _)| n).collect();
    assert!(names.iter().all(|n| !n.contains(" ws")), "{names:?}");
    let (g, k) = o_proj_view(d(256));
    for (w, why) in [(WgmmaSchedule { ctas: 132, ..WgmmaSchedule::DEFAULT }, "persistent"), (WgmmaSchedule { tma: false, ..ws }, "TMA")] {
        let err = generate_with(&g, k, &Target::SM_90A, &MatmulSchedule::Wgmma(w)).unwrap_err();
        assert!(err.to_string().contains(why), "{err}");
    }
    assert_eq!(MatmulSchedule::Wgmma(WgmmaSchedule { ctas: 132, ..ws }).name(), "wgmma 128x256x64 s4 f1 tma ws p132");
}

/// `x + reshape(attn [1, M, 9, 64]) · wo` — the operand through a view, as the passes
/// leave the attention output.
fn o_proj_view(m: Dim) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "o_proj");
    let attn = fb.param("attn", ty(DType::BF16, &[d(1), m.clone(), d(9), d(64)]));
    let wo = fb.param("wo", ty(DType::BF16, &[d(576), d(576)]));
    let x = fb.param("x", ty(DType::BF16, &[m.clone(), d(576)]));
    let a = fb.op1(OpKind::Reshape, &[attn], vec![("shape", Attr::Dims(vec![m, d(576)]))]).unwrap();
    let mm = fb.op1(OpKind::Matmul, &[a, wo], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let y = fb.op1(OpKind::Add, &[x, mm], vec![]).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// SmolLM2's prefill QKV projection as the passes fuse it: RoPE on Q and K, and K and V
/// appended to the paged cache (the prefill form: one sequence's block table, its start
/// from the first position).
pub(crate) fn qkv_append_prefill() -> (KernelGraph, Kernel) {
    let text = "func @k3_matmul(%block_tables: i32[2, 1, M], %x: bf16[T, 576], %w: bf16[960, 576], %positions: i32[T], %k_pages: bf16[P, 16, 3, 64], %v_pages: bf16[P, 16, 3, 64]) {
  %v6: i32[1, 1, M] = slice(%block_tables) {axis=-3, start=0, end=1}
  %v7: i32[1, M] = reshape(%v6) {shape=[1, M]}
  %v8: bf16[T, 960] = matmul(%x, %w) {transpose_b=true}
  %v9: bf16[T, 576] = slice(%v8) {start=0, end=576}
  %v10: bf16[T, 9, 64] = reshape(%v9) {shape=[T, 9, 64]}
  %v11: i32[T, 1] = reshape(%positions) {shape=[T, 1]}
  %v12: bf16[T, 9, 64] = rope(%v10, %v11) {theta=100000.0}
  %v13: bf16[T, 192] = slice(%v8) {start=576, end=768}
  %v14: bf16[T, 3, 64] = reshape(%v13) {shape=[T, 3, 64]}
  %v15: bf16[T, 3, 64] = rope(%v14, %v11) {theta=100000.0}
  %v16: bf16[1, T, 3, 64] = reshape(%v15) {shape=[1, T, 3, 64]}
  %v17: bf16[T, 192] = slice(%v8) {start=768, end=960}
  %v18: bf16[1, T, 3, 64] = reshape(%v17) {shape=[1, T, 3, 64]}
  %v19: i32[1] = slice(%positions) {start=0, end=1}
  %v20: bf16[P, 16, 3, 64], %v21: bf16[P, 16, 3, 64] = kv_append(%k_pages, %v_pages, %v16, %v18, %v7, %v19)
  return %v12, %v15, %v20, %v21, %v18
}
";
    let g = sinter_ir::parse(text).unwrap();
    let f = g.funcs.values().next().unwrap().clone();
    single_kernel(Family::Matmul, f)
}

/// The fused bodies the passes produce for a Llama layer generate and assemble, prefill
/// (symbolic M) and decode (M = 1), with the staged epilogue where they need it.
#[test]
fn llama_layer_bodies() {
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k)) in [
            ("qkv+rope M=T", qkv_rope(sym("T"), DType::BF16)),
            ("qkv+rope M=1", qkv_rope(d(1), DType::BF16)),
            ("qkv+rope M=8 (flat)", qkv_rope(d(8), DType::BF16)),
            ("gate/up swiglu M=T", gate_up(sym("T"), DType::BF16)),
            ("gate/up swiglu M=1", gate_up(d(1), DType::BF16)),
            ("gate/up swiglu M=8 (flat)", gate_up(d(8), DType::BF16)),
            ("o_proj through a view M=T", o_proj_view(sym("T"))),
            ("o_proj through a view M=1", o_proj_view(d(1))),
            ("o_proj through a view M=8 (flat)", o_proj_view(d(8))),
            ("qkv+rope+kv_append (prefill) M=T", qkv_append_prefill()),
        ] {
            let plan = generate(&g, k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("matmul_llama_ptxas", text);
    // The tiling each epilogue needs.
    let spec = |(g, k): (KernelGraph, Kernel)| Spec::analyse(&g, k).unwrap();
    assert!(matches!(spec(qkv_rope(sym("T"), DType::BF16)).epi, Epi::Columns { rope_d: 64, .. }));
    assert!(matches!(spec(gate_up(sym("T"), DType::BF16)).epi, Epi::Paired { .. }));
    assert!(matches!(spec(o_proj_view(sym("T"))).epi, Epi::Direct));
    let (g, k) = gate_up(sym("T"), DType::BF16);
    let plan = generate(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.entry, "k0_matmul_mma");
    assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 128 }, "128 output columns (of each half) per 256-column CTA");
    // The same in f32: the tiled kernel, 32 columns of each half per CTA.
    let (g, k) = gate_up(sym("T"), DType::F32);
    let plan = generate(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 32 }, "32 output columns per CTA");
    let (g, k) = o_proj_view(d(1));
    assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
    // At a constant M the paired and columns epilogues take the small-M kernel too (each
    // group computes the n-th column of both halves, or its column and RoPE partner).
    let (g, k) = gate_up(d(1), DType::BF16);
    let plan = generate(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.entry, "k0_matmul_small_m");
    assert_eq!(plan.grid[0], GridDim { numerator: d(1536), denominator: 4 }, "4 output columns per CTA");
    let (g, k) = qkv_rope(d(1), DType::BF16);
    assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
    // M = 8: the flat GEMM; 16 columns of each half per CTA, a 64-column tile (the RoPE
    // head) for QKV, 32 for o_proj.
    for (what, (g, k), cols, den) in [("gate/up", gate_up(d(8), DType::BF16), 1536, 16), ("qkv", qkv_rope(d(8), DType::BF16), 960, 64), ("o_proj", o_proj_view(d(8)), 576, 32)] {
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.entry, "k0_matmul_mma", "{what}");
        assert_eq!(plan.grid[1], GridDim { numerator: d(cols), denominator: den }, "{what}");
    }
}

/// Epilogues no mode covers are refused, never computed wrongly: RoPE across the whole
/// width with a head that does not divide the tile, a broadcast of the result.
#[test]
fn rejects_cross_element_epilogues() {
    let mut fb = FunctionBuilder::new(&Graph::new(), "k");
    let x = fb.param("x", ty(DType::F32, &[sym("T"), d(32)]));
    let w = fb.param("w", ty(DType::F32, &[d(96), d(32)]));
    let pos = fb.param("pos", ty(DType::I32, &[sym("T"), d(1)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let r = fb.op1(OpKind::Reshape, &[mm], vec![("shape", Attr::Dims(vec![sym("T"), d(1), d(96)]))]).unwrap();
    let p3 = fb.op1(OpKind::Reshape, &[pos], vec![("shape", Attr::Dims(vec![sym("T"), d(1)]))]).unwrap();
    let o = fb.op1(OpKind::Rope, &[r, p3], vec![("theta", Attr::Float(10000.0))]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
    let e = generate(&g, k, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("rope over 96 columns"), "{e}");
    // A reduction of the result.
    let mut fb = FunctionBuilder::new(&Graph::new(), "k");
    let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
    let w = fb.param("w", ty(DType::F32, &[d(8), d(8)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
    let t = fb.op1(OpKind::Transpose, &[mm], vec![]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[t]).unwrap());
    let e = generate(&g, k, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("`transpose` on the matmul's result"), "{e}");
}

fn bind(pairs: &[(&str, i64)]) -> sinter_ir::Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

/// Emulated on the CPU against the interpreter (see [`crate::emu`]): the tiled and the
/// small-M kernels, tails in M, N and K, epilogues, batches.
#[test]
fn emulated_matches_interpreter() {
    use crate::emu::{check, random};
    let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
    // x [T, 40] · w [N=70, 40]ᵀ + bias, silu: tiled (T symbolic), tails everywhere.
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(DType::F32, &[sym("T"), d(40)]));
    let w = fb.param("w", ty(DType::F32, &[d(70), d(40)]));
    let bias = fb.param("bias", ty(DType::F32, &[d(70)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let y = fb.op1(OpKind::Add, &[mm, bias], vec![]).unwrap();
    let z = fb.op1(OpKind::Silu, &[y], vec![]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[z]).unwrap());
    for t in [1usize, 17, 65] {
        let ins = [random(DType::F32, &[t, 40], 1), random(DType::F32, &[70, 40], 2), random(DType::F32, &[70], 3)];
        check(&format!("f32 proj T={t}"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
    }
    // The same in bf16 at M = 3 (small-M, warp per column, 16-byte vectors of x and w).
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(DType::BF16, &[d(3), d(64)]));
    let w = fb.param("w", ty(DType::BF16, &[d(70), d(64)]));
    let r = fb.param("r", ty(DType::BF16, &[d(3), d(70)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let y = fb.op1(OpKind::Add, &[r, mm], vec![]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[y]).unwrap());
    let ins = [random(DType::BF16, &[3, 64], 4), random(DType::BF16, &[70, 64], 5), random(DType::BF16, &[3, 70], 6)];
    check("bf16 small-M residual", &g, k, gen, &ins, &bind(&[]));
    // f32 at M = 2: a warp per column with 16-byte vectors (4 floats).
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj32");
    let x = fb.param("x", ty(DType::F32, &[d(2), d(64)]));
    let w = fb.param("w", ty(DType::F32, &[d(45), d(64)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let (g32, k32) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
    let ins32 = [random(DType::F32, &[2, 64], 40), random(DType::F32, &[45, 64], 41)];
    check("f32 small-M warp per column", &g32, k32, gen, &ins32, &bind(&[]));
    // K-contiguous B at small M through the tiled kernel too.
    let tiled = |g: &KernelGraph, k: Kernel| generate_with(g, k, &Target::SM_80, &MatmulSchedule::Tiled(TiledSchedule::DEFAULT));
    check("bf16 residual, tiled", &g, k, tiled, &ins, &bind(&[]));
    // Batched, A broadcast over the batch, B not transposed (N contiguous), K = 1000.
    let (g, k) = matmul_kernel(ty(DType::F32, &[d(5), d(1000)]), ty(DType::F32, &[d(2), d(1000), d(17)]), vec![]);
    let ins = [random(DType::F32, &[5, 1000], 7), random(DType::F32, &[2, 1000, 17], 8)];
    check("f32 batched N-contiguous (small-M, thread per column)", &g, k, gen, &ins, &bind(&[]));
    check("f32 batched N-contiguous, tiled", &g, k, tiled, &ins, &bind(&[]));
    // transpose_a, M = 0 rows-worth of nothing: K = 0 gives zeros.
    let mut fb = FunctionBuilder::new(&Graph::new(), "ta");
    let a = fb.param("a", ty(DType::F32, &[sym("K"), d(33)]));
    let b = fb.param("b", ty(DType::F32, &[sym("K"), d(9)]));
    let mm = fb.op1(OpKind::Matmul, &[a, b], vec![("transpose_a", Attr::Bool(true))]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
    for kk in [0usize, 1, 19] {
        let ins = [random(DType::F32, &[kk, 33], 9), random(DType::F32, &[kk, 9], 10)];
        check(&format!("f32 transpose_a K={kk}"), &g, k, gen, &ins, &bind(&[("K", kk as i64)]));
    }
    emulated_mma_direct();
}

/// `x [m, k] · dequantize(w [n, k] of q, dtype)ᵀ`, then `epi`: "none", "bias_silu" (+ bias
/// [n], silu) or "residual" (+ r [m, n]); the kernel reads w as stored blocks.
fn quant_proj(q: DType, dt: DType, m: Dim, n: i64, k: i64, epi: &str) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "qproj");
    let x = fb.param("x", ty(dt, &[m.clone(), d(k)]));
    let w = fb.param("w", ty(q, &[d(n), d(k)]));
    let wd = fb.op1(OpKind::Dequantize, &[w], vec![("dtype", Attr::DType(dt))]).unwrap();
    let mut y = fb.op1(OpKind::Matmul, &[x, wd], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    match epi {
        "bias_silu" => {
            let bias = fb.param("bias", ty(dt, &[d(n)]));
            y = fb.op1(OpKind::Add, &[y, bias], vec![]).unwrap();
            y = fb.op1(OpKind::Silu, &[y], vec![]).unwrap();
        }
        "residual" => {
            let r = fb.param("r", ty(dt, &[m, d(n)]));
            y = fb.op1(OpKind::Add, &[r, y], vec![]).unwrap();
        }
        _ => {}
    }
    single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
}

/// Random quantized weights: values in [−1, 1) with a few blocks of larger range,
/// quantized as llama.cpp's reference quantizers do.
fn random_q(q: DType, shape: &[usize], seed: u64) -> Tensor {
    let v = crate::emu::random(DType::F32, shape, seed);
    let vals: Vec<f32> = v.data().iter().enumerate().map(|(i, &x)| if (i / 32) % 7 == 3 { (x * 40.0) as f32 } else { x as f32 }).collect();
    Tensor::quantize(q, shape, &vals).unwrap()
}

#[test]
fn emulated_quantized() {
    use crate::emu::{check, random};
    let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
    for q in [DType::Q4_1, DType::Q8_0] {
        // M 1 / 3 / 16; N tails (a column group of 4 partly past N); K 32, 96, 4096.
        for (m, n, k, epi) in [(1usize, 70i64, 32i64, "none"), (3, 37, 96, "bias_silu"), (16, 9, 4096, "residual"), (1, 5, 4096, "none"), (2, 33, 160, "none")] {
            for dt in [DType::BF16, DType::F32] {
                let (g, kk) = quant_proj(q, dt, d(m as i64), n, k, epi);
                let plan = gen(&g, kk).unwrap();
                // bf16/f16 with a direct epilogue and M > 1: the tensor-core kernel; f32 or
                // one row: small-M.
                let want = if dt == DType::F32 || m == 1 { "matmul_small_m_q" } else { "matmul_mma_q" };
                assert!(plan.entry.ends_with(want), "{}", plan.entry);
                // NaN and ±inf in the activations where some rows stay finite (M ≥ 3), and
                // in the one row at M = 1, N = 70 (every output NaN: it propagates).
                let x = random(dt, &[m, k as usize], 1);
                let x = if m >= 3 || n == 70 { with_specials(x) } else { x };
                let mut ins = vec![x, random_q(q, &[n as usize, k as usize], 2)];
                match epi {
                    "bias_silu" => ins.push(random(dt, &[n as usize], 3)),
                    "residual" => ins.push(random(dt, &[m, n as usize], 4)),
                    _ => {}
                }
                check(&format!("{q} {dt} M={m} N={n} K={k} {epi}"), &g, kk, gen, &ins, &bind(&[]));
                if dt != DType::F32 {
                    let small = |g: &KernelGraph, k: Kernel| generate_with(g, k, &Target::SM_80, &MatmulSchedule::SmallM(small_m_schedule(m as u32, true)));
                    check(&format!("{q} {dt} M={m} N={n} K={k} {epi} (small-M)"), &g, kk, small, &ins, &bind(&[]));
                    // Two tiles a warp, 64-column steps (a K tail when K is not a multiple).
                    let two = |g: &KernelGraph, k: Kernel| generate_with(g, k, &Target::SM_80, &MatmulSchedule::QuantMma(QuantMmaSchedule { warps: 2, tiles: 2, chunk: 64, prefetch: false }));
                    check(&format!("{q} {dt} M={m} N={n} K={k} {epi} (2 warps x 2 tiles, chunk 64)"), &g, kk, two, &ins, &bind(&[]));
                }
            }
        }
    }
    // Every autotuning variant of a quantized projection (K = 160: a partial step for
    // every step length) computes what the interpreter does.
    for q in [DType::Q4_1, DType::Q8_0] {
        let (g, kn) = quant_proj(q, DType::BF16, d(3), 37, 160, "bias_silu");
        let ins = [random(DType::BF16, &[3, 160], 80), random_q(q, &[37, 160], 81), random(DType::BF16, &[37], 82)];
        let built = crate::schedule_variants(&g, kn, &Target::SM_80).unwrap();
        assert!(built.len() >= 5, "{:?}", built.iter().map(|v| v.name.clone()).collect::<Vec<_>>());
        assert_eq!(built[0].plan, generate(&g, kn, &Target::SM_80).unwrap(), "the first variant is the default");
        for v in &built {
            let name = v.name.clone();
            check(&format!("{q} variant `{name}`"), &g, kn, |g, k| crate::compile_variant(g, k, &Target::SM_80, &name), &ins, &bind(&[]));
        }
    }
    // f16 activations, a symbolic M bound to 1 and 5 (16 rows per CTA).
    let (g, kk) = quant_proj(DType::Q4_1, DType::F16, sym("T"), 40, 64, "none");
    for t in [1usize, 5] {
        let ins = [random(DType::F16, &[t, 64], 5), random_q(DType::Q4_1, &[40, 64], 6)];
        check(&format!("q4_1 f16 T={t}"), &g, kk, gen, &ins, &bind(&[("T", t as i64)]));
    }
}

#[test]
fn quantized_ptxas_reports() {
    let cases: Vec<(&str, (KernelGraph, Kernel))> = vec![
        ("q4_1 bf16 M=1 K=4096 N=28672 (tensor cores)", quant_proj(DType::Q4_1, DType::BF16, d(1), 28672, 4096, "none")),
        ("q8_0 bf16 M=1 K=4096 N=28672 (tensor cores)", quant_proj(DType::Q8_0, DType::BF16, d(1), 28672, 4096, "none")),
        ("q4_1 bf16 M=16 K=4096 N=28672 (tensor cores)", quant_proj(DType::Q4_1, DType::BF16, d(16), 28672, 4096, "none")),
        ("q8_0 bf16 M=16 K=4096 N=28672 (tensor cores)", quant_proj(DType::Q8_0, DType::BF16, d(16), 28672, 4096, "none")),
        ("q4_1 bf16 M=1 K=4096 N=28672 (GEMV)", quant_proj(DType::Q4_1, DType::BF16, d(1), 28672, 4096, "none")),
        ("q8_0 bf16 M=1 K=4096 N=28672 (GEMV)", quant_proj(DType::Q8_0, DType::BF16, d(1), 28672, 4096, "none")),
        ("q4_1 bf16 M=16 K=4096 N=28672 (small M)", quant_proj(DType::Q4_1, DType::BF16, d(16), 28672, 4096, "none")),
        ("q8_0 bf16 M=16 K=4096 N=28672 (small M)", quant_proj(DType::Q8_0, DType::BF16, d(16), 28672, 4096, "none")),
        ("q4_1 f32 M=3 bias+silu", quant_proj(DType::Q4_1, DType::F32, d(3), 70, 96, "bias_silu")),
    ];
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k)) in &cases {
            let plan = if what.contains("GEMV") || what.contains("small M") {
                let rows = if what.contains("M=16") { 16 } else { 1 };
                generate_with(g, *k, &t, &MatmulSchedule::SmallM(small_m_schedule(rows, true)))
            } else {
                generate(g, *k, &t)
            };
            let plan = plan.unwrap_or_else(|e| panic!("{what}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("matmul_quant_ptxas", text);
    // The kernels' PTX for sm_90a: block loads of the weights, mma, no local memory.
    let (g, k) = quant_proj(DType::Q4_1, DType::BF16, d(1), 28672, 4096, "none");
    let plan = generate_with(&g, k, &Target::SM_90A, &MatmulSchedule::SmallM(small_m_schedule(1, true))).unwrap();
    assert!(plan.ptx.contains("ld.global.nc.b32"), "no 4-byte block loads");
    assert!(!plan.ptx.contains(".local"), "local memory in the quantized GEMV");
    insta::assert_snapshot!("matmul_quant_q4_1_gemv_sm_90a_ptx", plan.ptx);
    let (g, k) = quant_proj(DType::Q4_1, DType::BF16, d(16), 28672, 4096, "none");
    let plan = generate(&g, k, &Target::SM_90A).unwrap();
    assert!(plan.ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "no mma");
    assert!(!plan.ptx.contains(".local"), "local memory in the quantized tensor-core kernel");
    insta::assert_snapshot!("matmul_quant_q4_1_mma_sm_90a_ptx", plan.ptx);
}

/// Small tensor-core schedules for the emulator: one warp and a 2-stage pipeline; four
/// warps, a 3-stage pipeline and grouped CTA order.
pub(crate) const MMA_ONE_WARP: MmaSchedule = MmaSchedule { bm: 32, bn: 32, bk: 32, warps_m: 1, warps_n: 1, stages: 2, group_m: 1 };
pub(crate) const MMA_FOUR_WARPS: MmaSchedule = MmaSchedule { bm: 64, bn: 64, bk: 64, warps_m: 2, warps_n: 2, stages: 3, group_m: 2 };

/// `gen` with tensor-core schedule `s` on sm_80.
pub(crate) fn mma_gen(s: MmaSchedule) -> impl Fn(&KernelGraph, Kernel) -> Result<LaunchPlan, CodegenError> {
    move |g: &KernelGraph, k: Kernel| generate_with(g, k, &Target::SM_80, &MatmulSchedule::Mma(s))
}

/// `t` with NaN, +inf and −inf at a few places.
fn with_specials(t: Tensor) -> Tensor {
    let mut v = t.data().to_vec();
    let n = v.len();
    for (i, x) in [(n / 3, f64::NAN), (n / 2, f64::INFINITY), (n - 1, f64::NEG_INFINITY)] {
        v[i] = x;
    }
    Tensor::new(t.dtype(), t.shape(), v).unwrap()
}

/// One matmul `a · b` (with `attrs`, e.g. `transpose_b`) of kernel inputs as a kernel.
fn matmul_kernel(a: TensorType, b: TensorType, attrs: Vec<(&'static str, Attr)>) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "bmm");
    let (a, b) = (fb.param("a", a), fb.param("b", b));
    let mm = fb.op1(OpKind::Matmul, &[a, b], attrs).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap())
}

/// `silu(x · wᵀ + bias)` with `x [m, kbuf]`, `w [n, kbuf]` of `dt` read through a slice of
/// their first `k` columns (a partial last chunk when `k < kbuf`): one matmul kernel.
fn proj_silu(dt: DType, m: Dim, n: i64, k: i64, kbuf: i64) -> (KernelGraph, Kernel) {
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(dt, &[m, d(kbuf)]));
    let w = fb.param("w", ty(dt, &[d(n), d(kbuf)]));
    let bias = fb.param("bias", ty(dt, &[d(n)]));
    let mut view = |x: Value| fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(k)))]).unwrap();
    let (xs, ws) = if k == kbuf { (x, w) } else { (view(x), view(w)) };
    let mm = fb.op1(OpKind::Matmul, &[xs, ws], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let y = fb.op1(OpKind::Add, &[mm, bias], vec![]).unwrap();
    let z = fb.op1(OpKind::Silu, &[y], vec![]).unwrap();
    single_kernel(Family::Matmul, fb.finish(&[z]).unwrap())
}

/// The tensor-core kernel with direct epilogues, emulated: tails in M, N and K (zero-filled
/// `cp.async` chunks, partial ones included), both B layouts, a transposed A, batches with
/// a broadcast operand, NaN and ±inf, bf16 and f16, an odd N (a last column alone).
fn emulated_mma_direct() {
    use crate::emu::{check, random};
    let view = |fb: &mut FunctionBuilder, x: Value, end: i64| fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(end)))]).unwrap();
    // x [T, K] · w [N, K]ᵀ + bias, silu; K read through a slice of a wider buffer (rows
    // of 24 or 136 elements) so that its tail is a partial chunk.
    for dt in [DType::BF16, DType::F16] {
        for (n, k, kbuf) in [(69i64, 40i64, 40i64), (33, 17, 24), (40, 1, 8), (16, 129, 136), (24, 0, 8)] {
            let (g, kn) = proj_silu(dt, sym("T"), n, k, kbuf);
            assert!(generate(&g, kn, &Target::SM_80).unwrap().entry.ends_with("_mma"), "{dt} N={n} K={k}: the default takes the tensor cores");
            let ts: &[usize] = if dt == DType::BF16 && n == 69 { &[1, 17, 129] } else { &[17] };
            for &t in ts {
                let x_in = random(dt, &[t, kbuf as usize], 50);
                let ins = [if t == 17 && n == 69 { with_specials(x_in) } else { x_in }, random(dt, &[n as usize, kbuf as usize], 51), random(dt, &[n as usize], 52)];
                let b = bind(&[("T", t as i64)]);
                for (what, s) in [("one warp", MMA_ONE_WARP), ("four warps", MMA_FOUR_WARPS)] {
                    check(&format!("{dt} proj T={t} N={n} K={k}, mma {what}"), &g, kn, mma_gen(s), &ins, &b);
                }
                if t == 129 {
                    check(&format!("{dt} proj T={t} N={n} K={k}, mma default"), &g, kn, mma_gen(MmaSchedule::DEFAULT), &ins, &b);
                }
            }
        }
    }
    // B N-contiguous ([K, N], ldmatrix.trans) + a residual, N = 40 and N = 20 (a slice of
    // rows of 24: a partial chunk); A transposed ([K, M], M-contiguous).
    for (n, nbuf, ta) in [(40i64, 40i64, false), (20, 24, false), (40, 40, true)] {
        let mut fb = FunctionBuilder::new(&Graph::new(), "nc");
        let a = if ta { fb.param("a", ty(DType::BF16, &[d(48), d(40)])) } else { fb.param("a", ty(DType::BF16, &[d(40), d(48)])) };
        let b = fb.param("b", ty(DType::BF16, &[d(48), d(nbuf)]));
        let r = fb.param("r", ty(DType::BF16, &[d(40), d(n)]));
        let bs = if n == nbuf { b } else { view(&mut fb, b, n) };
        let mm = fb.op1(OpKind::Matmul, &[a, bs], vec![("transpose_a", Attr::Bool(ta))]).unwrap();
        let y = fb.op1(OpKind::Add, &[r, mm], vec![]).unwrap();
        let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[y]).unwrap());
        let spec = Spec::analyse(&g, kn).unwrap();
        let plan = spec.mma_plan(&MMA_FOUR_WARPS, &Target::SM_80).unwrap();
        assert!(!plan.b.k_contig && plan.a.k_contig != ta, "N={n} transpose_a={ta}: {plan:?}");
        let ashape = if ta { [48, 40] } else { [40, 48] };
        let ins = [with_specials(random(DType::BF16, &ashape, 53)), random(DType::BF16, &[48, nbuf as usize], 54), random(DType::BF16, &[40, n as usize], 55)];
        for (what, s) in [("one warp", MMA_ONE_WARP), ("four warps", MMA_FOUR_WARPS)] {
            check(&format!("bf16 [K, N] B, N={n}, transpose_a={ta}, mma {what}"), &g, kn, mma_gen(s), &ins, &bind(&[]));
        }
    }
    // Batched: a [T, 32] broadcast over b [3, 32, 24]; q [2, T, 32] · k [2, S, 32]ᵀ.
    let mut fb = FunctionBuilder::new(&Graph::new(), "bmm");
    let a = fb.param("a", ty(DType::BF16, &[sym("T"), d(32)]));
    let b = fb.param("b", ty(DType::BF16, &[d(3), d(32), d(24)]));
    let mm = fb.op1(OpKind::Matmul, &[a, b], vec![]).unwrap();
    let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
    let ins = [random(DType::BF16, &[37, 32], 56), random(DType::BF16, &[3, 32, 24], 57)];
    check("bf16 batched, A broadcast, mma one warp", &g, kn, mma_gen(MMA_ONE_WARP), &ins, &bind(&[("T", 37)]));
    let mut fb = FunctionBuilder::new(&Graph::new(), "scores");
    let q = fb.param("q", ty(DType::BF16, &[d(2), sym("T"), d(32)]));
    let kk = fb.param("k", ty(DType::BF16, &[d(2), sym("S"), d(32)]));
    let mm = fb.op1(OpKind::Matmul, &[q, kk], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
    let ins = [random(DType::BF16, &[2, 19, 32], 58), random(DType::BF16, &[2, 70, 32], 59)];
    check("bf16 batched scores, mma four warps", &g, kn, mma_gen(MMA_FOUR_WARPS), &ins, &bind(&[("T", 19), ("S", 70)]));
}

/// The flat tensor-core GEMM ([`MmaSchedule::flat`]: 16-row tiles for M ≤ 16), emulated
/// against the interpreter with direct epilogues: constant M = 1, 3, 8, 16 (rows past M
/// zero-filled, their stores masked) and a symbolic M over several row tiles, tails in N
/// and K (K read through a slice of wider rows: partial and empty chunks; K past one
/// 256-element stage), both B layouts, a batch with a broadcast A, NaN and ±inf, bf16
/// and f16. The staged epilogues (RoPE + `kv_append`, paired SwiGLU) at a constant M are
/// in `emulated_staged_epilogues`, and SmolLM2's layer bodies at M = 3 in
/// `emulated_llama_bodies`.
#[test]
fn emulated_flat() {
    use crate::emu::{check, random};
    let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
    let view = |fb: &mut FunctionBuilder, x: Value, end: i64| fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(end)))]).unwrap();
    // x [M, K] · w [N, K]ᵀ + bias, silu.
    for dt in [DType::BF16, DType::F16] {
        for (n, k, kbuf) in [(200i64, 40i64, 40i64), (576, 64, 64), (33, 17, 24), (40, 1, 8), (24, 0, 8), (70, 300, 304)] {
            let ms: &[i64] = match (dt, n) {
                (DType::BF16, 200) => &[1, 3, 8, 16],
                (DType::BF16, 70) => &[16],
                (DType::BF16, _) => &[5],
                _ => &[3],
            };
            for &m in ms {
                let mdim = if m == 16 && n == 200 { sym("T") } else { d(m) };
                let (g, kn) = proj_silu(dt, mdim.clone(), n, k, kbuf);
                let x_in = random(dt, &[m as usize, kbuf as usize], 60);
                let ins = [if m == 8 { with_specials(x_in) } else { x_in }, random(dt, &[n as usize, kbuf as usize], 61), random(dt, &[n as usize], 62)];
                if mdim.as_const().is_some() {
                    let entry = generate(&g, kn, &Target::SM_80).unwrap().entry;
                    assert_eq!(entry, if m == 1 { "k0_matmul_small_m" } else { "k0_matmul_mma" }, "{dt} M={m} N={n} K={k}");
                    check(&format!("{dt} proj M={m} N={n} K={k} ({entry})"), &g, kn, gen, &ins, &bind(&[]));
                }
                let b = bind(&[("T", m)]);
                check(&format!("{dt} proj M={mdim} N={n} K={k}, flat"), &g, kn, mma_gen(MmaSchedule::FLAT), &ins, &b);
                if n == 200 && m >= 8 {
                    check(&format!("{dt} proj M={mdim} N={n} K={k}, flat 64"), &g, kn, mma_gen(MmaSchedule::flat(64)), &ins, &b);
                }
            }
        }
    }
    // A symbolic M of 37 rows: three 16-row tiles, the last one partial.
    let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
    let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(48)]));
    let w = fb.param("w", ty(DType::BF16, &[d(50), d(48)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
    let ins = [random(DType::BF16, &[37, 48], 63), random(DType::BF16, &[50, 48], 64)];
    check("bf16 M=T=37 N=50 K=48, flat", &g, kn, mma_gen(MmaSchedule::FLAT), &ins, &bind(&[("T", 37)]));
    // B N-contiguous ([K, N], ldmatrix.trans) + a residual: N = 40, N = 20 (a slice of
    // rows of 24: a partial chunk), N = 192 (SmolLM2's K/V width); M = 5 and 16.
    for (n, nbuf) in [(40i64, 40i64), (20, 24), (192, 192)] {
        for m in [5i64, 16] {
            let mut fb = FunctionBuilder::new(&Graph::new(), "nc");
            let a = fb.param("a", ty(DType::BF16, &[d(m), d(48)]));
            let b = fb.param("b", ty(DType::BF16, &[d(48), d(nbuf)]));
            let r = fb.param("r", ty(DType::BF16, &[d(m), d(n)]));
            let bs = if n == nbuf { b } else { view(&mut fb, b, n) };
            let mm = fb.op1(OpKind::Matmul, &[a, bs], vec![]).unwrap();
            let y = fb.op1(OpKind::Add, &[r, mm], vec![]).unwrap();
            let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[y]).unwrap());
            let spec = Spec::analyse(&g, kn).unwrap();
            let plan = spec.mma_plan(&MmaSchedule::FLAT, &Target::SM_80).unwrap();
            assert!(!plan.b.k_contig && plan.a.k_contig, "{plan:?}");
            assert_eq!(generate(&g, kn, &Target::SM_80).unwrap().entry, "k0_matmul_mma");
            let ins = [with_specials(random(DType::BF16, &[m as usize, 48], 65)), random(DType::BF16, &[48, nbuf as usize], 66), random(DType::BF16, &[m as usize, n as usize], 67)];
            check(&format!("bf16 [K, N] B, M={m} N={n}, flat"), &g, kn, gen, &ins, &bind(&[]));
        }
    }
    // A transposed A ([K, M]: 16-element slab rows the swizzle does not take) keeps the
    // small-M kernel.
    let (g, kn) = matmul_kernel(ty(DType::BF16, &[d(48), d(8)]), ty(DType::BF16, &[d(48), d(40)]), vec![("transpose_a", Attr::Bool(true))]);
    assert_eq!(generate(&g, kn, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
    let ins = [random(DType::BF16, &[48, 8], 68), random(DType::BF16, &[48, 40], 69)];
    check("bf16 transpose_a M=8 (small M)", &g, kn, gen, &ins, &bind(&[]));
    // Batched: a [3, 32] broadcast over b [3, 32, 24].
    let (g, kn) = matmul_kernel(ty(DType::BF16, &[d(3), d(32)]), ty(DType::BF16, &[d(3), d(32), d(24)]), vec![]);
    assert_eq!(generate(&g, kn, &Target::SM_80).unwrap().entry, "k0_matmul_mma");
    let ins = [random(DType::BF16, &[3, 32], 70), random(DType::BF16, &[3, 32, 24], 71)];
    check("bf16 batched, A broadcast, flat", &g, kn, gen, &ins, &bind(&[]));
}

/// The staged epilogues, emulated: QKV with RoPE (Columns) and gate/up SwiGLU (Paired),
/// at tiny sizes with tails.
#[test]
fn emulated_staged_epilogues() {
    use crate::emu::{check, random};
    let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
    // QKV: x [T, 24] · w [(4+2+2)·16 = 128, 24]ᵀ; q, k roped with head dim 16.
    let mut fb = FunctionBuilder::new(&Graph::new(), "qkv");
    let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(24)]));
    let w = fb.param("w", ty(DType::BF16, &[d(128), d(24)]));
    let pos = fb.param("positions", ty(DType::I32, &[sym("T")]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let p2 = fb.op1(OpKind::Reshape, &[pos], vec![("shape", Attr::Dims(vec![sym("T"), d(1)]))]).unwrap();
    let sl = |fb: &mut FunctionBuilder, a: i64, b: i64| fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(a))), ("end", Attr::Dim(d(b)))]).unwrap();
    let q = sl(&mut fb, 0, 64);
    let q = fb.op1(OpKind::Reshape, &[q], vec![("shape", Attr::Dims(vec![sym("T"), d(4), d(16)]))]).unwrap();
    let q = fb.op1(OpKind::Rope, &[q, p2], vec![("theta", Attr::Float(10000.0))]).unwrap();
    let kk = sl(&mut fb, 64, 96);
    let kk = fb.op1(OpKind::Reshape, &[kk], vec![("shape", Attr::Dims(vec![sym("T"), d(2), d(16)]))]).unwrap();
    let kk = fb.op1(OpKind::Rope, &[kk, p2], vec![("theta", Attr::Float(10000.0)), ("form", Attr::Str("interleaved".into()))]).unwrap();
    let v = sl(&mut fb, 96, 128);
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[q, kk, v]).unwrap());
    assert!(generate(&g, k, &Target::SM_80).unwrap().entry.ends_with("_mma"));
    for t in [1usize, 5, 70] {
        let posv = Tensor::new(DType::I32, &[t], (0..t).map(|i| (i * 3 + 1) as f64).collect()).unwrap();
        let ins = [random(DType::BF16, &[t, 24], 11), random(DType::BF16, &[128, 24], 12), posv];
        check(&format!("bf16 qkv+rope T={t}"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
        if t > 1 {
            for (what, s) in [("one warp", MMA_ONE_WARP), ("four warps", MMA_FOUR_WARPS), ("flat", MmaSchedule::FLAT), ("flat 64", MmaSchedule::flat(64))] {
                check(&format!("bf16 qkv+rope T={t}, mma {what}"), &g, k, mma_gen(s), &ins, &bind(&[("T", t as i64)]));
            }
        }
    }
    // The same QKV in f32 (also emulated from optimised IR under SINTER_EMU_O3).
    let (g32, k32) = {
        let kd = &g.kernels[k];
        let mut body = kd.body.clone();
        for (_, vd) in body.values.iter_mut() {
            if vd.ty.dtype == DType::BF16 {
                vd.ty.dtype = DType::F32;
            }
        }
        single_kernel(Family::Matmul, body)
    };
    let posv = Tensor::new(DType::I32, &[9], (0..9).map(|i| (i * 5) as f64).collect()).unwrap();
    let ins = [random(DType::F32, &[9, 24], 18), random(DType::F32, &[128, 24], 19), posv];
    check("f32 qkv+rope T=9", &g32, k32, gen, &ins, &bind(&[("T", 9)]));
    // QKV with RoPE whose K and V also go into a paged cache (kv_append in the epilogue),
    // in the prefill form (one sequence, new rows [1, T, 2, 16], start_pos [1]) and the
    // decode form (T sequences of one token, rows [T, 1, 2, 16], start_pos [T]); pages
    // [4, 4, 2, 16], a block table of 3 pages per sequence.
    // Built with a symbolic T (the tiled kernel with staged tiles) and with T a constant
    // (a batch-specialised step: the small-M kernel, each group computing its column and
    // the RoPE partner), with both RoPE forms.
    let qkv_append = |tdim: Dim, decode: bool, form: &str| {
        let nb = if decode { tdim.clone() } else { d(1) };
        let mut fb = FunctionBuilder::new(&Graph::new(), "qkv_append");
        let x = fb.param("x", ty(DType::BF16, &[tdim.clone(), d(24)]));
        let w = fb.param("w", ty(DType::BF16, &[d(128), d(24)]));
        let pos = fb.param("positions", ty(DType::I32, std::slice::from_ref(&tdim)));
        let kp = fb.param("k_pages", ty(DType::BF16, &[d(4), d(4), d(2), d(16)]));
        let vp = fb.param("v_pages", ty(DType::BF16, &[d(4), d(4), d(2), d(16)]));
        let bt = fb.param("block_table", ty(DType::I32, &[nb.clone(), d(3)]));
        let sp = fb.param("start_pos", ty(DType::I32, std::slice::from_ref(&nb)));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let p2 = fb.op1(OpKind::Reshape, &[pos], vec![("shape", Attr::Dims(vec![tdim.clone(), d(1)]))]).unwrap();
        let sl = |fb: &mut FunctionBuilder, a: i64, b: i64| fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(a))), ("end", Attr::Dim(d(b)))]).unwrap();
        let rs = |fb: &mut FunctionBuilder, x: Value, dims: Vec<Dim>| fb.op1(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(dims))]).unwrap();
        let rope_attrs = || vec![("theta", Attr::Float(10000.0)), ("form", Attr::Str(form.to_string()))];
        let q = sl(&mut fb, 0, 64);
        let q = rs(&mut fb, q, vec![tdim.clone(), d(4), d(16)]);
        let q = fb.op1(OpKind::Rope, &[q, p2], rope_attrs()).unwrap();
        let kk = sl(&mut fb, 64, 96);
        let kk = rs(&mut fb, kk, vec![tdim.clone(), d(2), d(16)]);
        let kk = fb.op1(OpKind::Rope, &[kk, p2], rope_attrs()).unwrap();
        let v = sl(&mut fb, 96, 128);
        let rows = |t: Dim| if decode { vec![t, d(1), d(2), d(16)] } else { vec![d(1), t, d(2), d(16)] };
        let k4 = rs(&mut fb, kk, rows(tdim.clone()));
        let v4 = rs(&mut fb, v, rows(tdim.clone()));
        let res = fb.op(OpKind::KvAppend, &[kp, vp, k4, v4, bt, sp], vec![]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[q, kk, res[0], res[1]]).unwrap())
    };
    for decode in [false, true] {
        for form in ["rotate_half", "interleaved"] {
            for t in [1usize, 5, 11] {
                let posv = Tensor::new(DType::I32, &[t], (0..t).map(|i| (i * 3 + 1) as f64).collect()).unwrap();
                let nseq = if decode { t } else { 1 };
                let table = Tensor::new(DType::I32, &[nseq, 3], (0..nseq * 3).map(|i| [2.0, 0.0, 3.0][i % 3]).collect()).unwrap();
                // Prefill: slots 1..=t; decode: sequence b at slot (b·5) mod 12.
                let starts = Tensor::new(DType::I32, &[nseq], (0..nseq).map(|b| if decode { ((b * 5) % 12) as f64 } else { 1.0 }).collect()).unwrap();
                let ins = [
                    random(DType::BF16, &[t, 24], 21),
                    random(DType::BF16, &[128, 24], 22),
                    posv,
                    random(DType::BF16, &[4, 4, 2, 16], 23),
                    random(DType::BF16, &[4, 4, 2, 16], 24),
                    table,
                    starts,
                ];
                for constant in [false, true] {
                    let (g, k) = qkv_append(if constant { d(t as i64) } else { sym("T") }, decode, form);
                    let entry = generate(&g, k, &Target::SM_80).unwrap().entry;
                    assert_eq!(entry.ends_with("small_m"), constant && t == 1, "{entry}");
                    check(&format!("bf16 qkv+rope({form})+kv_append decode={decode} T={t} ({entry})"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
                    if constant && t == 1 {
                        // The flat GEMM given explicitly at M = 1 (the default is the GEMV).
                        check(&format!("bf16 qkv+rope({form})+kv_append decode={decode} T=1, flat"), &g, k, mma_gen(MmaSchedule::FLAT), &ins, &bind(&[]));
                    }
                }
            }
        }
    }
    // gate/up: x [T, 24] · w [2·40, 24]ᵀ, swiglu over the halves (40 = one 32-column
    // tile and a tail).
    let mut fb = FunctionBuilder::new(&Graph::new(), "mlp");
    let x = fb.param("x", ty(DType::F32, &[sym("T"), d(24)]));
    let w = fb.param("w", ty(DType::F32, &[d(80), d(24)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let g0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(40)))]).unwrap();
    let u0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(40))), ("end", Attr::Dim(d(80)))]).unwrap();
    let o = fb.op1(OpKind::Swiglu, &[g0, u0], vec![]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
    for t in [1usize, 17] {
        let ins = [random(DType::F32, &[t, 24], 13), random(DType::F32, &[80, 24], 14)];
        check(&format!("f32 gate/up swiglu T={t}"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
    }
    // The same in bf16 on the tensor cores, B as [N, K] (transpose_b) and as [K, N]
    // (ldmatrix.trans; the segments' chunks gathered at columns 0 and 40).
    for b_kn in [false, true] {
        let mut fb = FunctionBuilder::new(&Graph::new(), "mlp");
        let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(24)]));
        let wdims = if b_kn { [d(24), d(80)] } else { [d(80), d(24)] };
        let w = fb.param("w", ty(DType::BF16, &wdims));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(!b_kn))]).unwrap();
        let g0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(40)))]).unwrap();
        let u0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(40))), ("end", Attr::Dim(d(80)))]).unwrap();
        let o = fb.op1(OpKind::Swiglu, &[g0, u0], vec![]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
        assert!(generate(&g, k, &Target::SM_80).unwrap().entry.ends_with("_mma"));
        let wshape: &[usize] = if b_kn { &[24, 80] } else { &[80, 24] };
        for t in [1usize, 17] {
            let ins = [random(DType::BF16, &[t, 24], 13), random(DType::BF16, wshape, 14)];
            let b = bind(&[("T", t as i64)]);
            check(&format!("bf16 gate/up swiglu T={t} [K, N] B={b_kn}, mma default"), &g, k, gen, &ins, &b);
            for (what, s) in [("one warp", MMA_ONE_WARP), ("four warps", MMA_FOUR_WARPS)] {
                check(&format!("bf16 gate/up swiglu T={t} [K, N] B={b_kn}, mma {what}"), &g, k, mma_gen(s), &ins, &b);
            }
        }
    }
    // The same at constant M (a batch-specialised decode step): the small-M kernel at M = 1
    // (K a multiple of 8 for its 16-byte vectors in bf16), the flat tensor-core GEMM above
    // (16 columns of each half per CTA: 37 = two sub-tiles and a tail), both B layouts
    // (for [K, N] the halves start at 0 and 40: multiples of 8 for the gathered chunks).
    for b_kn in [false, true] {
        for m in [1i64, 3, 16] {
            let (half, wdims): (i64, [i64; 2]) = if b_kn { (40, [64, 80]) } else { (37, [74, 64]) };
            let mut fb = FunctionBuilder::new(&Graph::new(), "mlp_m");
            let x = fb.param("x", ty(DType::BF16, &[d(m), d(64)]));
            let w = fb.param("w", ty(DType::BF16, &[d(wdims[0]), d(wdims[1])]));
            let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(!b_kn))]).unwrap();
            let g0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(half)))]).unwrap();
            let u0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(half))), ("end", Attr::Dim(d(2 * half)))]).unwrap();
            let o = fb.op1(OpKind::Swiglu, &[g0, u0], vec![]).unwrap();
            let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
            let entry = generate(&g, k, &Target::SM_80).unwrap().entry;
            assert_eq!(entry, if m == 1 { "k0_matmul_small_m" } else { "k0_matmul_mma" }, "M={m}");
            let ins = [random(DType::BF16, &[m as usize, 64], 25), random(DType::BF16, &[wdims[0] as usize, wdims[1] as usize], 26)];
            check(&format!("bf16 gate/up swiglu M={m} [K, N] B={b_kn} ({entry})"), &g, k, gen, &ins, &bind(&[]));
            if m == 1 {
                check(&format!("bf16 gate/up swiglu M={m} [K, N] B={b_kn}, flat"), &g, k, mma_gen(MmaSchedule::FLAT), &ins, &bind(&[]));
            }
        }
    }
    // GPT-2's QKV: a bias added before the column slices.
    let mut fb = FunctionBuilder::new(&Graph::new(), "qkv_bias");
    let x = fb.param("x", ty(DType::F32, &[sym("T"), d(8)]));
    let w = fb.param("w", ty(DType::F32, &[d(96), d(8)]));
    let b = fb.param("b", ty(DType::F32, &[d(96)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let y = fb.op1(OpKind::Add, &[mm, b], vec![]).unwrap();
    let outs: Vec<Value> = (0..3).map(|i| fb.op1(OpKind::Slice, &[y], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(32 * i))), ("end", Attr::Dim(d(32 * i + 32)))]).unwrap()).collect();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&outs).unwrap());
    let ins = [random(DType::F32, &[9, 8], 15), random(DType::F32, &[96, 8], 16), random(DType::F32, &[96], 17)];
    check("f32 qkv with bias", &g, k, gen, &ins, &bind(&[("T", 9)]));
}

/// The Llama layer bodies at SmolLM2's sizes, emulated for a decode step (M = 1) or a
/// short prefill (M = 3) (the emulator's barriers make large grids slow).
#[test]
/// Every schedule variant autotuning may pick computes what the interpreter does: the flat
/// tiles of a decode projection (M = 5, bias + silu), the CTA tiles of a symbolic-M
/// projection (37 rows).
fn emulated_variants() {
    use crate::emu::{check, random};
    for (m, sym_m) in [(5i64, false), (37, true)] {
        let mdim = if sym_m { sym("T") } else { d(m) };
        let (g, kn) = proj_silu(DType::BF16, mdim, 200, 64, 64);
        let ins = [random(DType::BF16, &[m as usize, 64], 70), random(DType::BF16, &[200, 64], 71), random(DType::BF16, &[200], 72)];
        let names = crate::schedule_names(&g, kn, &Target::SM_80).unwrap();
        let built = crate::schedule_variants(&g, kn, &Target::SM_80).unwrap();
        assert!(built.len() >= 2, "M={m}: {names:?}");
        assert_eq!(built[0].plan, generate(&g, kn, &Target::SM_80).unwrap(), "M={m}: the first variant is the default");
        for v in &built {
            let name = v.name.clone();
            check(&format!("variant `{name}` M={m}"), &g, kn, |g, k| crate::compile_variant(g, k, &Target::SM_80, &name), &ins, &bind(&[("T", m)]));
        }
    }
}

#[test]
fn emulated_llama_bodies() {
    use crate::emu::{check, random};
    // sm_90 (not sm_90a): the `mma.sync` kernels the emulator runs; sm_90a takes `wgmma`
    // for these, which only the GPU runs (`tests/gpu.rs`).
    let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_90);
    for m in [1usize, 3] {
        let md = d(m as i64);
        if m == 3 {
            let posv = Tensor::new(DType::I32, &[m], (0..m).map(|i| (i + 100) as f64).collect()).unwrap();
            let (g, k) = qkv_rope(md.clone(), DType::BF16);
            let ins = [random(DType::BF16, &[m, 576], 30), random(DType::BF16, &[960, 576], 31), posv];
            check(&format!("SmolLM2 qkv+rope M={m}"), &g, k, gen, &ins, &bind(&[]));
        } else {
            let (g, k) = gate_up(md.clone(), DType::BF16);
            let ins = [random(DType::BF16, &[m, 576], 32), random(DType::BF16, &[3072, 576], 33)];
            check(&format!("SmolLM2 gate/up M={m}"), &g, k, gen, &ins, &bind(&[]));
        }
        let (g, k) = o_proj_view(md);
        let ins = [random(DType::BF16, &[1, m, 9, 64], 34), random(DType::BF16, &[576, 576], 35), random(DType::BF16, &[m, 576], 36)];
        check(&format!("SmolLM2 o_proj M={m}"), &g, k, gen, &ins, &bind(&[]));
    }
    // A short prefill (M = T symbolic): the tensor-core kernel at its default schedules
    // (256-column tiles for QKV's 960 columns and gate/up's 3072, 128 for o_proj's 576).
    let t = 5usize;
    let b = bind(&[("T", t as i64)]);
    let posv = Tensor::new(DType::I32, &[t], (0..t).map(|i| (i + 100) as f64).collect()).unwrap();
    for (what, (g, k), ins) in [
        ("qkv+rope", qkv_rope(sym("T"), DType::BF16), vec![random(DType::BF16, &[t, 576], 37), random(DType::BF16, &[960, 576], 38), posv]),
        ("gate/up", gate_up(sym("T"), DType::BF16), vec![random(DType::BF16, &[t, 576], 39), random(DType::BF16, &[3072, 576], 40)]),
        ("o_proj", o_proj_view(sym("T")), vec![random(DType::BF16, &[1, t, 9, 64], 41), random(DType::BF16, &[576, 576], 42), random(DType::BF16, &[t, 576], 43)]),
    ] {
        let entry = generate(&g, k, &Target::SM_90).unwrap().entry;
        assert!(entry.ends_with("_mma"), "{what}: {entry}");
        check(&format!("SmolLM2 {what} M=T={t} ({entry})"), &g, k, gen, &ins, &b);
    }
}

/// Epilogues use the shared element evaluator: gelu, a broadcast bias of another dtype
/// through a cast, select on a comparison.
#[test]
fn rich_epilogue_assembles() {
    let mut fb = FunctionBuilder::new(&Graph::new(), "k");
    let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(64)]));
    let w = fb.param("w", ty(DType::BF16, &[d(100), d(64)]));
    let b = fb.param("b", ty(DType::F32, &[d(1), d(100)]));
    let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
    let m32 = fb.op1(OpKind::Cast, &[mm], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
    let y = fb.op1(OpKind::Add, &[m32, b], vec![]).unwrap();
    let g = fb.op1(OpKind::Gelu, &[y], vec![("form", Attr::Str("tanh".into()))]).unwrap();
    let zero = fb.op1(OpKind::Constant, &[], vec![("value", Attr::Float(0.0)), ("dtype", Attr::DType(DType::F32))]).unwrap();
    let pos = fb.op1(OpKind::Gt, &[y, zero], vec![]).unwrap();
    let o = fb.op1(OpKind::Select, &[pos, g, y], vec![]).unwrap();
    let o = fb.op1(OpKind::Cast, &[o], vec![("dtype", Attr::DType(DType::BF16))]).unwrap();
    let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
    for t in [Target::SM_80, Target::SM_90A] {
        for s in [MatmulSchedule::Tiled(TiledSchedule::DEFAULT), MatmulSchedule::SmallM(SmallMSchedule { rows: 2, lanes: 32, columns: 4 }), MatmulSchedule::Mma(MmaSchedule::DEFAULT), MatmulSchedule::Mma(MmaSchedule::NARROW)] {
            let plan = generate_with(&g, k, &t, &s).unwrap();
            assemble(&plan);
        }
    }
}
