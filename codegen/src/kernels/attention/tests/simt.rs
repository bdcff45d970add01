//! The CUDA-core kernels (prefill and single-CTA paged decode), the choice between them and
//! the tensor-core kernels, and what the family refuses.

use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, DType, Family, FunctionBuilder, Graph, GridDim, Kernel, KernelGraph, KernelParam, OpKind};

use super::{bind, paged, prefill};
use crate::kernels::attention::*;
use crate::testing::{assemble, d, plan_line, single_kernel, sym, ty};
use crate::target::Target;
use crate::error::CodegenError;

#[test]
fn prefill_ptxas_reports() {
    let cases = vec![
        ("bf16 D64 GQA 9/3 causal Sq=T Skv=T (SmolLM2)", prefill(DType::BF16, 9, 3, sym("T"), sym("T"), 64, 64, true, false)),
        ("bf16 D128 GQA 32/8 causal Sq=T Skv=S", prefill(DType::BF16, 32, 8, sym("T"), sym("S"), 128, 128, true, false)),
        ("f32 D128 MHA 4/4 additive mask", prefill(DType::F32, 4, 4, sym("T"), sym("S"), 128, 128, false, true)),
        ("bf16 D256 GQA 8/2 causal", prefill(DType::BF16, 8, 2, sym("T"), sym("S"), 256, 256, true, false)),
        ("f16 D80 Dv96 causal with mask", prefill(DType::F16, 4, 2, d(100), d(130), 80, 96, true, true)),
    ];
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k)) in &cases {
            let plan = generate_prefill(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("attention_ptxas", text);
}

/// Paged decode at sm_80 and sm_90a.
#[test]
fn paged_ptxas_reports() {
    let cases = vec![
        ("bf16 D64 GQA 9/3 T=1 page 16 (SmolLM2)", paged(DType::BF16, 9, 3, d(1), 64, 16)),
        ("bf16 D128 GQA 32/8 T=1 page 16", paged(DType::BF16, 32, 8, d(1), 128, 16)),
        ("bf16 D128 GQA 32/8 T=4 page 32", paged(DType::BF16, 32, 8, d(4), 128, 32)),
        ("f32 D128 GQA 8/2 T symbolic", paged(DType::F32, 8, 2, sym("T"), 128, 16)),
    ];
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k)) in &cases {
            let plan = generate_paged(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("paged_attention_ptxas", text);
}

#[test]
fn launch_plans() {
    // bf16, D = 128, causal: the tensor-core kernel, 4 warps × 32 rows, 78 KiB of dynamic
    // shared memory (Q 128×136, two stages of K and V 32×136, the P scratch 128×40). On
    // sm_90 (sm_90a takes the wgmma kernel: below).
    let (g, k) = prefill(DType::BF16, 32, 8, sym("T"), sym("S"), 128, 128, true, false);
    let plan = generate_prefill(&g, k, &Target::SM_90).unwrap();
    assert_eq!(plan.entry, "k0_attention");
    assert_eq!(plan.block, [128, 1, 1]);
    assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 128 });
    assert_eq!(plan.grid[1], GridDim::fixed(32));
    assert_eq!(plan.grid[2], GridDim { numerator: sym("B"), denominator: 1 });
    assert_eq!(plan.shared_bytes, 79872);
    assert_eq!(TcSchedule { warps: 4, m_tiles: 2, block_kv: 32, q_in_regs: false }.shared_bytes(128, 128), 79872);
    // Not causal, on sm_90: 48-key tiles, 99 KiB (K and V 48×136, the P scratch 128×56);
    // on sm_80, whose 164 KiB would not hold two CTAs of 99, 32-key tiles.
    let (gn, kn) = prefill(DType::BF16, 32, 8, sym("T"), sym("S"), 128, 128, false, false);
    assert_eq!(generate_prefill(&gn, kn, &Target::SM_90).unwrap().shared_bytes, 101376);
    // sm_90a: the wgmma kernel, 2 warpgroups × 64 rows, 194 KiB (Q 128×128, two stages of
    // K and V 128×128, all swizzled slabs, and the P scratch 128×136).
    let hw = generate_prefill(&gn, kn, &Target::SM_90A).unwrap();
    assert_eq!((hw.entry.as_str(), hw.block, hw.shared_bytes), ("k0_attention_wgmma", [256, 1, 1], 128 * 128 * 2 * 5 + 128 * 136 * 2));
    assert_eq!(hw.grid[0], GridDim { numerator: sym("T"), denominator: 128 });
    assert_eq!(generate_prefill(&gn, kn, &Target::SM_80).unwrap().shared_bytes, 79872);
    assert_eq!(&plan.params[..4], &[KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Buffer(3)]);
    for s in ["T", "S"] {
        assert!(plan.params.contains(&KernelParam::Size(sym(s))), "{:?}", plan.params);
    }
    for needle in [
        "cp.async.cg.shared.global",
        "cp.async.wait_group",
        "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
        "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
        "cvt.rn.bf16x2.f32",
        "max.NaN.f32",
        "shfl.sync.bfly.b32",
        "vote.sync.any.pred",
        "ex2.approx.ftz.f32",
        "bar.sync",
        "st.global.v4",
    ] {
        assert!(plan.ptx.contains(needle), "no {needle}");
    }
    // The same on CUDA cores.
    let plan = generate_prefill_with(&g, k, &Target::SM_90A, &choose_prefill_schedule(128, 128, DType::BF16)).unwrap();
    assert_eq!(plan.block, [256, 1, 1]);
    assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 32 });
    assert_eq!(plan.shared_bytes, 0);
    for needle in ["max.NaN.f32", "shfl.sync.bfly.b32", "ex2.approx", "bar.sync", "bar.warp.sync", "ld.global.nc.v4"] {
        assert!(plan.ptx.contains(needle), "no {needle}");
    }
    assert!(!plan.ptx.contains("mma.sync"));
    // Which kernel: tensor cores for bf16/f16 with head dims multiples of 16 and 16-byte
    // aligned rows; CUDA cores for f32, D = 40, a strided head dim, a mask beside D = 256.
    let tc = |g: &KernelGraph, k| generate_prefill(g, k, &Target::SM_80).unwrap().ptx.contains("mma.sync");
    assert!(tc(&prefill(DType::F16, 4, 2, sym("T"), sym("T"), 64, 64, true, false).0, k));
    assert!(tc(&prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 80, 96, false, true).0, k));
    assert!(tc(&prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 256, 256, true, false).0, k));
    assert!(!tc(&prefill(DType::F32, 4, 2, sym("T"), sym("T"), 64, 64, true, false).0, k));
    assert!(!tc(&prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 40, 40, true, false).0, k));
    assert!(!tc(&prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 256, 256, false, true).0, k));
    let (mut g2, k2) = prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 64, 64, true, false);
    let vb = g2.kernels[k2].inputs[2];
    g2.buffers[vb].layout.align = 8;
    assert!(!tc(&g2, k2), "v's buffer is only 8-byte aligned");
    assert!(matches!(generate_prefill_tc_with(&g2, k2, &Target::SM_80, &schedule::choose_tc_schedule(64, 64, false, true, &Target::SM_80)), Err(CodegenError::Unsupported { .. })));
    let (g, k) = paged(DType::BF16, 32, 8, d(1), 128, 16);
    let plan = generate_paged(&g, k, &Target::SM_80).unwrap();
    assert_eq!(plan.entry, "k0_paged_attention");
    assert_eq!(plan.block, [128, 1, 1]);
    assert_eq!(plan.grid[0], GridDim { numerator: d(4), denominator: 4 });
    assert_eq!(plan.grid[1], GridDim::fixed(8));
    assert_eq!(plan.grid[2], GridDim { numerator: sym("B"), denominator: 1 });
    assert_eq!(plan.params.len(), 6 + plan.params.iter().filter(|p| matches!(p, KernelParam::Size(_))).count());
    // f32 with D = 256 needs more than 48 KiB: dynamic shared memory.
    let (g, k) = prefill(DType::F32, 2, 1, sym("T"), sym("T"), 256, 256, true, false);
    let plan = generate_prefill(&g, k, &Target::SM_80).unwrap();
    assert!(plan.shared_bytes > 48 * 1024, "{}", plan.shared_bytes);
    assert!(plan.ptx.contains(".extern .shared"), "{}", plan.ptx);
    assemble(&plan);
}

#[test]
fn schedules() {
    let s = |w, r| AttentionSchedule { warps: w, rows_per_warp: r };
    assert_eq!(choose_prefill_schedule(64, 64, DType::BF16), s(8, 4));
    assert_eq!(choose_prefill_schedule(128, 128, DType::BF16), s(8, 4));
    assert_eq!(choose_prefill_schedule(256, 256, DType::BF16), s(4, 4));
    assert_eq!(choose_prefill_schedule(128, 128, DType::F32), s(4, 4));
    assert_eq!(choose_paged_schedule(Some(4), 128, 128, DType::BF16), s(4, 1));
    assert_eq!(choose_paged_schedule(Some(3), 64, 64, DType::BF16), s(4, 1));
    assert_eq!(choose_paged_schedule(Some(8), 128, 128, DType::BF16), s(4, 2));
    assert_eq!(choose_paged_schedule(None, 128, 128, DType::BF16), s(8, 4));
    assert_eq!(s(8, 4).shared_bytes(128, 128, DType::BF16), 29696);
    // Other schedules generate and assemble (the autotuner's candidates).
    let (g, k) = prefill(DType::BF16, 8, 2, sym("T"), sym("S"), 64, 64, true, false);
    for sch in [s(4, 8), s(2, 2), s(1, 1), s(8, 1)] {
        let plan = generate_prefill_with(&g, k, &Target::SM_80, &sch).unwrap_or_else(|e| panic!("{sch:?}: {e}"));
        assemble(&plan);
    }
    assert!(matches!(generate_prefill_with(&g, k, &Target::SM_80, &s(0, 4)), Err(CodegenError::Unsupported { .. })));
}

#[test]
fn rejects_what_it_cannot_do() {
    // A symbolic head dim.
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let shape = [d(1), d(2), sym("T"), sym("D")];
    let q = fb.param("q", ty(DType::BF16, &shape));
    let k = fb.param("k", ty(DType::BF16, &shape));
    let v = fb.param("v", ty(DType::BF16, &shape));
    let attrs = vec![("scale", Attr::Float(0.1)), ("heads", Attr::Int(2)), ("kv_heads", Attr::Int(2))];
    let o = fb.op1(OpKind::Attention, &[q, k, v], attrs).unwrap();
    let (g, kk) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
    let e = generate_prefill(&g, kk, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("head dim"), "{e}");
    // A fused epilogue.
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let shape = [d(1), d(2), sym("T"), d(64)];
    let q = fb.param("q", ty(DType::BF16, &shape));
    let k = fb.param("k", ty(DType::BF16, &shape));
    let v = fb.param("v", ty(DType::BF16, &shape));
    let attrs = vec![("scale", Attr::Float(0.1)), ("heads", Attr::Int(2)), ("kv_heads", Attr::Int(2))];
    let o = fb.op1(OpKind::Attention, &[q, k, v], attrs).unwrap();
    let o = fb.op1(OpKind::Neg, &[o], vec![]).unwrap();
    let (g, kk) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
    assert!(matches!(generate_prefill(&g, kk, &Target::SM_80), Err(CodegenError::Unsupported { .. })));
    // The wrong generator for the family.
    let (g, kk) = paged(DType::BF16, 4, 2, d(1), 64, 16);
    assert!(matches!(generate_prefill(&g, kk, &Target::SM_80), Err(CodegenError::BadKernel { .. })));
}

/// The attention kernels the passes produce for a Llama layer (SmolLM2 sizes): operands
/// are reshaped kernel inputs, the paged kernel's block table a slice of the per-layer
/// tables.
#[test]
fn llama_layer_bodies() {
    // Prefill: q [T, 9, 64], k [T, 3, 64], v [T, 192] viewed as [1, T, H, 64] (bshd).
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(DType::BF16, &[sym("T"), d(9), d(64)]));
    let k = fb.param("k", ty(DType::BF16, &[sym("T"), d(3), d(64)]));
    let v = fb.param("v", ty(DType::BF16, &[sym("T"), d(192)]));
    let view = |fb: &mut FunctionBuilder, x, h| fb.op1(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(vec![d(1), sym("T"), d(h), d(64)]))]).unwrap();
    let (q4, k4, v4) = (view(&mut fb, q, 9), view(&mut fb, k, 3), view(&mut fb, v, 3));
    let attrs = vec![("scale", Attr::Float(0.125)), ("causal", Attr::Bool(true)), ("heads", Attr::Int(9)), ("kv_heads", Attr::Int(3)), ("layout", Attr::Str("bshd".into()))];
    let o = fb.op1(OpKind::Attention, &[q4, k4, v4], attrs).unwrap();
    let (g, kk) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
    // Decode: block_tables [L, T, M] sliced to layer 1, q [T, 9, 64] viewed as [T, 9, 1, 64].
    let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
    let tables = fb.param("block_tables", ty(DType::I32, &[d(2), sym("T"), sym("M")]));
    let q = fb.param("q", ty(DType::BF16, &[sym("T"), d(9), d(64)]));
    let kp = fb.param("k_pages", ty(DType::BF16, &[sym("P"), d(16), d(3), d(64)]));
    let vp = fb.param("v_pages", ty(DType::BF16, &[sym("P"), d(16), d(3), d(64)]));
    let lens = fb.param("seq_lens", ty(DType::I32, &[sym("T")]));
    let t1 = fb.op1(OpKind::Slice, &[tables], vec![("axis", Attr::Int(-3)), ("start", Attr::Dim(d(1))), ("end", Attr::Dim(d(2)))]).unwrap();
    let bt = fb.op1(OpKind::Reshape, &[t1], vec![("shape", Attr::Dims(vec![sym("T"), sym("M")]))]).unwrap();
    let q4 = fb.op1(OpKind::Reshape, &[q], vec![("shape", Attr::Dims(vec![sym("T"), d(9), d(1), d(64)]))]).unwrap();
    let attrs = vec![("scale", Attr::Float(0.125)), ("causal", Attr::Bool(true)), ("heads", Attr::Int(9)), ("kv_heads", Attr::Int(3))];
    let o = fb.op1(OpKind::PagedAttention, &[q4, kp, vp, bt, lens], attrs).unwrap();
    let o3 = fb.op1(OpKind::Reshape, &[o], vec![("shape", Attr::Dims(vec![sym("T"), d(576)]))]).unwrap();
    let (gp, kp) = single_kernel(Family::PagedAttention, fb.finish(&[o3]).unwrap());
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        let plans = [generate_prefill(&g, kk, &t).unwrap(), generate_paged(&gp, kp, &t).unwrap()];
        for plan in &plans {
            let Some(report) = assemble(plan) else { return };
            text.push_str(&format!("{}\n{report}", plan_line(plan)));
        }
        // sm_90a: the wgmma kernel (bf16, D 64), on the same cp.async copies.
        let mma = if t == Target::SM_90A { "wgmma.mma_async" } else { "mma.sync" };
        assert!(plans[0].ptx.contains("cp.async.cg.shared.global") && plans[0].ptx.contains(mma), "the reshaped operands are still contiguous");
    }
    insta::assert_snapshot!("attention_llama_ptxas", text);
    // The block table's view: layer 1 starts T·M elements in.
    let p = Paged::analyse(&gp, kp).unwrap();
    assert_eq!(p.table.1, sym("M").mul(&sym("T")));
    // A reshape of a strided input is refused.
    let mut g2 = g.clone();
    let qb = g2.kernels[kk].inputs[0];
    g2.buffers[qb].layout.strides = vec![d(1), sym("T"), sym("T").scale(9)];
    let e = generate_prefill(&g2, kk, &Target::SM_80).unwrap_err();
    assert!(e.to_string().contains("reshapes a strided view"), "{e}");
}

fn with_values(t: Tensor, edits: &[(usize, f64)]) -> Tensor {
    let mut data = t.data().to_vec();
    for &(i, v) in edits {
        data[i] = v;
    }
    Tensor::new(t.dtype(), t.shape(), data).unwrap()
}

/// Prefill attention emulated on the CPU against the interpreter (see
/// `matmul::emu`): causal with Sq ≠ Skv both ways, GQA, tails, an additive mask with
/// fully masked rows, NaN where the reference reads it and where it does not.
#[test]
fn emulated_prefill_matches_interpreter() {
    use crate::emu::{check, random};
    let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
    // GQA 4/2, D = 64, causal, Sq = T, Skv = S.
    let (g, k) = prefill(DType::BF16, 4, 2, sym("T"), sym("S"), 64, 64, true, false);
    for (b, t, sk) in [(1usize, 37usize, 50usize), (2, 50, 37), (1, 1, 70), (1, 33, 0), (1, 3, 1)] {
        let ins = [random(DType::BF16, &[b, 4, t, 64], 1), random(DType::BF16, &[b, 2, sk, 64], 2), random(DType::BF16, &[b, 2, sk, 64], 3)];
        check(&format!("bf16 causal GQA B={b} Sq={t} Skv={sk}"), &g, k, gen, &ins, &bind(&[("B", b as i64), ("T", t as i64), ("S", sk as i64)]));
    }
    // f32, not causal, D = 40 (no 16-byte chunks), an additive mask [Sq, Skv] with one row
    // fully −inf, scattered −inf, and NaN in K at a key row 5 cannot see (causal off here:
    // every row sees it, so rows become NaN exactly as in the reference).
    let (g, k) = prefill(DType::F32, 2, 1, sym("T"), sym("S"), 40, 40, false, true);
    let (t, sk) = (19usize, 45usize);
    let mut mask = vec![0.0; t * sk];
    for j in 0..sk {
        mask[4 * sk + j] = f64::NEG_INFINITY; // row 4: fully masked → 0
    }
    for (i, m) in mask.iter_mut().enumerate() {
        if i % 7 == 3 {
            *m = f64::NEG_INFINITY;
        }
    }
    let mask = Tensor::new(DType::F32, &[t, sk], mask).unwrap();
    let ins = [random(DType::F32, &[1, 2, t, 40], 4), random(DType::F32, &[1, 1, sk, 40], 5), random(DType::F32, &[1, 1, sk, 40], 6), mask.clone()];
    check("f32 masked, fully masked row", &g, k, gen, &ins, &bind(&[("B", 1), ("T", t as i64), ("S", sk as i64)]));
    // NaN in V at keys the mask hides from every row (−inf in all rows for key 40..45): the
    // reference multiplies every visible key, a masked one by 0, so every row is NaN in
    // that column (the fully masked row too: Σ 0·v).
    let mut mdata = mask.data().to_vec();
    for i in 0..t {
        for j in 40..sk {
            mdata[i * sk + j] = f64::NEG_INFINITY;
        }
    }
    let mask2 = Tensor::new(DType::F32, &[t, sk], mdata).unwrap();
    let v_nan = with_values(random(DType::F32, &[1, 1, sk, 40], 6), &[(41 * 40 + 3, f64::NAN)]);
    let ins = [ins[0].clone(), ins[1].clone(), v_nan, mask2];
    check("f32 NaN in V under a −inf mask", &g, k, gen, &ins, &bind(&[("B", 1), ("T", t as i64), ("S", sk as i64)]));
    // Causal: NaN in K and V at keys hidden from early rows stays out of them; NaN in q
    // row 2 makes exactly that row NaN.
    let (g, k) = prefill(DType::F32, 2, 2, sym("T"), sym("T"), 32, 32, true, false);
    let t = 40usize;
    let q = with_values(random(DType::F32, &[1, 2, t, 32], 7), &[(2 * 32 + 5, f64::NAN)]);
    let kk = with_values(random(DType::F32, &[1, 2, t, 32], 8), &[(30 * 32 + 1, f64::NAN)]);
    let v = with_values(random(DType::F32, &[1, 2, t, 32], 9), &[(35 * 32 + 2, f64::NAN)]);
    check("f32 causal NaN", &g, k, gen, &[q, kk, v], &bind(&[("B", 1), ("T", t as i64)]));
    // D = 80, Dv = 96 (two head dims), bf16, causal with Sq > Skv (the first rows see nothing).
    let (g, k) = prefill(DType::BF16, 2, 1, sym("T"), sym("S"), 80, 96, true, false);
    let ins = [random(DType::BF16, &[1, 2, 20, 80], 10), random(DType::BF16, &[1, 1, 9, 80], 11), random(DType::BF16, &[1, 1, 9, 96], 12)];
    check("bf16 D80 Dv96 Sq>Skv", &g, k, gen, &ins, &bind(&[("B", 1), ("T", 20), ("S", 9)]));
    // Other schedules agree.
    let (g, k) = prefill(DType::BF16, 4, 2, sym("T"), sym("S"), 64, 64, true, false);
    let ins = [random(DType::BF16, &[1, 4, 21, 64], 13), random(DType::BF16, &[1, 2, 40, 64], 14), random(DType::BF16, &[1, 2, 40, 64], 15)];
    for sch in [AttentionSchedule { warps: 4, rows_per_warp: 1 }, AttentionSchedule { warps: 2, rows_per_warp: 8 }] {
        let gen_s = |g: &KernelGraph, k: Kernel| generate_prefill_with(g, k, &Target::SM_80, &sch);
        check(&format!("bf16 schedule {sch:?}"), &g, k, gen_s, &ins, &bind(&[("B", 1), ("T", 21), ("S", 40)]));
    }
}

/// The tensor-core kernel (the default for bf16/f16) emulated against the interpreter:
/// sequence lengths 1, 17, 129 (one and three key tiles, tails), Sq ≠ Skv both ways,
/// causal with more queries than keys, GQA 1, 3 and 8, head dims 64, 128, 80, 96, 16 (Dv
/// 48), 112 and 256, f16, every schedule shape.
#[test]
fn emulated_prefill_tc_matches_interpreter() {
    use crate::emu::{check, random};
    let tc = |s: TcSchedule| move |g: &KernelGraph, k: Kernel| generate_prefill_tc_with(g, k, &Target::SM_80, &s);
    // sm_90 (not sm_90a, whose wgmma kernel the emulator cannot run): the same schedules.
    let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_90);
    let sizes = |b: usize, t: usize, s: usize| bind(&[("B", b as i64), ("T", t as i64), ("S", s as i64)]);
    // Self-attention at three lengths, causal and not, D = 64 (GQA 3) and 128 (GQA 1).
    for (h, hkv, hd) in [(6, 2, 64), (2, 2, 128)] {
        for causal in [true, false] {
            let (g, k) = prefill(DType::BF16, h, hkv, sym("T"), sym("S"), hd, hd, causal, false);
            for n in [1usize, 17, 129] {
                let hd = hd as usize;
                let ins = [random(DType::BF16, &[1, h as usize, n, hd], 30), random(DType::BF16, &[1, hkv as usize, n, hd], 31), random(DType::BF16, &[1, hkv as usize, n, hd], 32)];
                check(&format!("tc bf16 D{hd} H{h}/{hkv} causal={causal} S={n}"), &g, k, gen, &ins, &sizes(1, n, n));
            }
        }
    }
    // Sq ≠ Skv both ways (causal: bottom-right; Sq > Skv leaves the first rows with no
    // key, exactly 0), GQA 8, B = 2.
    let (g, k) = prefill(DType::BF16, 8, 1, sym("T"), sym("S"), 64, 64, true, false);
    for (t, s) in [(20usize, 83usize), (83, 20), (130, 3), (5, 200)] {
        let ins = [random(DType::BF16, &[2, 8, t, 64], 33), random(DType::BF16, &[2, 1, s, 64], 34), random(DType::BF16, &[2, 1, s, 64], 35)];
        check(&format!("tc bf16 causal GQA 8 Sq={t} Skv={s}"), &g, k, gen, &ins, &sizes(2, t, s));
    }
    // D = 80 and 96, Dv ≠ D, and 256 (its own schedule); f16.
    for (hd, dv, dt) in [(80, 80, DType::BF16), (96, 64, DType::BF16), (16, 48, DType::BF16), (112, 112, DType::BF16), (256, 256, DType::BF16), (128, 128, DType::F16)] {
        let (g, k) = prefill(dt, 2, 1, sym("T"), sym("S"), hd, dv, true, false);
        let (hd, dv) = (hd as usize, dv as usize);
        let ins = [random(dt, &[1, 2, 70, hd], 36), random(dt, &[1, 1, 75, hd], 37), random(dt, &[1, 1, 75, dv], 38)];
        check(&format!("tc {dt} D{hd} Dv{dv} causal Sq=70 Skv=75"), &g, k, gen, &ins, &sizes(1, 70, 75));
    }
    // The prefill kernel of a Llama layer (SmolLM2 sizes): `bshd` views of [T, H, 64] rows
    // (V reshaped from [T, 192]); row strides 576, 192 and 192 elements.
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(DType::BF16, &[sym("T"), d(9), d(64)]));
    let kk = fb.param("k", ty(DType::BF16, &[sym("T"), d(3), d(64)]));
    let v = fb.param("v", ty(DType::BF16, &[sym("T"), d(192)]));
    let view = |fb: &mut FunctionBuilder, x, h| fb.op1(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(vec![d(1), sym("T"), d(h), d(64)]))]).unwrap();
    let (q4, k4, v4) = (view(&mut fb, q, 9), view(&mut fb, kk, 3), view(&mut fb, v, 3));
    let attrs = vec![("scale", Attr::Float(0.125)), ("causal", Attr::Bool(true)), ("heads", Attr::Int(9)), ("kv_heads", Attr::Int(3)), ("layout", Attr::Str("bshd".into()))];
    let o = fb.op1(OpKind::Attention, &[q4, k4, v4], attrs).unwrap();
    let (g, k) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
    let t = 150usize;
    let ins = [random(DType::BF16, &[t, 9, 64], 42), random(DType::BF16, &[t, 3, 64], 43), random(DType::BF16, &[t, 192], 44)];
    check("tc bf16 bshd views (Llama layer)", &g, k, gen, &ins, &bind(&[("T", t as i64)]));
    // Every schedule shape: 1 and 2 slabs a warp, Q in registers or not, 16- to 128-key
    // tiles, 1 to 8 warps.
    let (g, k) = prefill(DType::BF16, 3, 3, sym("T"), sym("S"), 64, 64, true, false);
    let ins = [random(DType::BF16, &[1, 3, 77, 64], 39), random(DType::BF16, &[1, 3, 90, 64], 40), random(DType::BF16, &[1, 3, 90, 64], 41)];
    for (warps, m_tiles, block_kv, q_in_regs) in [(4, 1, 64, true), (8, 1, 64, true), (4, 2, 32, false), (4, 2, 48, false), (2, 2, 16, true), (1, 1, 128, false)] {
        let s = TcSchedule { warps, m_tiles, block_kv, q_in_regs };
        check(&format!("tc schedule {s:?}"), &g, k, tc(s), &ins, &sizes(1, 77, 90));
    }
}

/// The tensor-core kernel's special values, against the interpreter: an additive mask with
/// a fully masked row and leading −inf groups; NaN and ±inf in V at keys the interpreter
/// never multiplies (hidden by the causal mask, which the CUDA-core fallback of a tile must
/// reproduce) and at masked keys it multiplies by 0; NaN in q; an infinite K element making a score −inf; +inf
/// scores; rows the output writes element by element (a 2-byte-aligned output).
#[test]
/// Every key-tile variant autotuning may pick computes what the interpreter does (causal,
/// GQA 3, D = 64, 129 keys: a partial last tile for each of 32, 48 and 64).
fn emulated_prefill_variants() {
    use crate::emu::{check, random};
    let (g, k) = prefill(DType::BF16, 6, 2, sym("T"), sym("S"), 64, 64, true, false);
    // sm_90a's candidates: the wgmma kernel's (not emulated: the GPU tests run them), then
    // the mma.sync kernel's, which sm_90 has alone.
    let hopper = crate::schedule_variants(&g, k, &Target::SM_90A).unwrap();
    let names: Vec<&str> = hopper.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["wgmma kv64 g2", "wgmma kv128 g2", "wgmma kv128 g2 +split", "wgmma kv128 g2 ov", "wgmma kv64 g2 ov", "wgmma kv128 g2 ws", "wgmma kv64 g2 ws", "wgmma kv128 g2 ws pp", "wgmma kv64 g2 ws pp", "tc kv64 w4 m2 +q", "tc kv32 w4 m2 +q", "tc kv48 w4 m2 +q"]);
    let built = crate::schedule_variants(&g, k, &Target::SM_90).unwrap();
    let names: Vec<&str> = built.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["tc kv64 w4 m2 +q", "tc kv32 w4 m2 +q", "tc kv48 w4 m2 +q"]);
    let ins = [random(DType::BF16, &[1, 6, 129, 64], 40), random(DType::BF16, &[1, 2, 129, 64], 41), random(DType::BF16, &[1, 2, 129, 64], 42)];
    for name in names {
        check(&format!("variant `{name}`"), &g, k, |g, k| crate::compile_variant(g, k, &Target::SM_90, name), &ins, &bind(&[("B", 1), ("T", 129), ("S", 129)]));
    }
    assert!(crate::compile_variant(&g, k, &Target::SM_90A, "tc kv99").is_err());
}

#[test]
fn emulated_prefill_tc_special_values() {
    use crate::emu::{check, random};
    let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
    let sizes = |t: usize, s: usize| bind(&[("B", 1), ("T", t as i64), ("S", s as i64)]);
    let d = 64usize;
    // Causal self-attention over 100 keys (two tiles): NaN in V at key 35 (column 3) and
    // +inf at key 70 (column 9), −inf at key 71 (column 9 too): rows before them never see
    // them; NaN in K at key 50 hidden from rows < 50; NaN in q row 7.
    let (g, k) = prefill(DType::BF16, 2, 1, sym("T"), sym("T"), 64, 64, true, false);
    let t = 100usize;
    let q = with_values(random(DType::BF16, &[1, 2, t, d], 50), &[(7 * d + 4, f64::NAN)]);
    let kk = with_values(random(DType::BF16, &[1, 1, t, d], 51), &[(50 * d + 1, f64::NAN)]);
    let v = with_values(random(DType::BF16, &[1, 1, t, d], 52), &[(35 * d + 3, f64::NAN), (70 * d + 9, f64::INFINITY), (80 * d + 10, f64::INFINITY), (81 * d + 10, f64::NEG_INFINITY)]);
    check("tc causal NaN/inf in hidden keys", &g, k, gen, &[q, kk, v], &bind(&[("B", 1), ("T", t as i64)]));
    // An additive mask [Sq, Skv]: row 2 fully −inf (Σ 0·v), row 5 −inf on keys 0..20, row 9
    // −inf on keys 0..40 except key 33 (masked keys multiplied by 0); NaN in V at keys 5
    // and 18, +inf at key 3 of another column: those columns NaN in every row.
    let (g, k) = prefill(DType::BF16, 2, 2, sym("T"), sym("S"), 64, 64, false, true);
    let (t, s) = (12usize, 45usize);
    let mut mask = vec![0.0; t * s];
    for j in 0..s {
        mask[2 * s + j] = f64::NEG_INFINITY;
        if j < 21 {
            mask[5 * s + j] = f64::NEG_INFINITY;
        }
        if j < 41 && j != 33 {
            mask[9 * s + j] = f64::NEG_INFINITY;
        }
    }
    let mask = Tensor::new(DType::BF16, &[t, s], mask).unwrap();
    let v = with_values(random(DType::BF16, &[1, 2, s, d], 53), &[(5 * d + 1, f64::NAN), (18 * d + 2, f64::NAN), (3 * d + 6, f64::INFINITY)]);
    let ins = [random(DType::BF16, &[1, 2, t, d], 54), random(DType::BF16, &[1, 2, s, d], 55), v, mask.clone()];
    check("tc mask: fully masked row, masked groups, NaN/inf in V", &g, k, gen, &ins, &sizes(t, s));
    // An infinite K element: with q > 0, key 20's score is −inf in every row (multiplied by
    // 0 with NaN in its V row), key 40's +inf (its rows NaN).
    let q = Tensor::new(DType::BF16, &[1, 2, t, d], random(DType::BF16, &[1, 2, t, d], 56).data().iter().map(|x| x.abs() + 0.01).collect()).unwrap();
    let kk = with_values(random(DType::BF16, &[1, 2, s, d], 57), &[(20 * d + 7, f64::NEG_INFINITY), ((s + 40) * d + 7, f64::INFINITY)]);
    let v = with_values(random(DType::BF16, &[1, 2, s, d], 58), &[(20 * d + 2, f64::NAN)]);
    let ins = [q, kk, v, Tensor::new(DType::BF16, &[t, s], vec![0.0; t * s]).unwrap()];
    check("tc infinite K elements", &g, k, gen, &ins, &sizes(t, s));
    // Causal with more queries than keys and NaN in V: the first rows see nothing (0).
    let (g, k) = prefill(DType::BF16, 1, 1, sym("T"), sym("S"), 64, 64, true, false);
    let (t, s) = (40usize, 30usize);
    let v = with_values(random(DType::BF16, &[1, 1, s, d], 59), &[(25 * d, f64::NAN)]);
    let ins = [random(DType::BF16, &[1, 1, t, d], 60), random(DType::BF16, &[1, 1, s, d], 61), v];
    check("tc causal Sq > Skv, NaN in V", &g, k, gen, &ins, &sizes(t, s));
    // A 2-byte-aligned output: element stores instead of staged 16-byte ones.
    let (mut g, k) = prefill(DType::BF16, 2, 1, sym("T"), sym("S"), 64, 64, true, false);
    let ob = g.kernels[k].outputs[0];
    g.buffers[ob].layout.align = 2;
    let ins = [random(DType::BF16, &[1, 2, 33, d], 62), random(DType::BF16, &[1, 1, 33, d], 63), random(DType::BF16, &[1, 1, 33, d], 64)];
    check("tc element stores", &g, k, gen, &ins, &sizes(33, 33));
    // D = 128 on sm_90, not causal (48-key tiles: 0..48, 48..96, 96..100, the last
    // zero-filled past the sequence): NaN in V at key 35, +inf at key 70, NaN in q row 7.
    let gen90 = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_90);
    let (g, k) = prefill(DType::BF16, 2, 1, sym("T"), sym("T"), 128, 128, false, false);
    let (t, d) = (100usize, 128usize);
    let q = with_values(random(DType::BF16, &[1, 2, t, d], 65), &[(7 * d + 4, f64::NAN)]);
    let v = with_values(random(DType::BF16, &[1, 1, t, d], 66), &[(35 * d + 3, f64::NAN), (70 * d + 9, f64::INFINITY)]);
    let ins = [q, random(DType::BF16, &[1, 1, t, d], 67), v];
    check("tc D128 sm_90 NaN/inf in V, NaN in q", &g, k, gen90, &ins, &bind(&[("B", 1), ("T", t as i64)]));
}

/// Paged decode emulated against the interpreter: lengths 0, 1, a partly filled last
/// page, a full table; pages in scrambled order; T = 1 and T = 3 (causal within the
/// step); GQA 4/2.
#[test]
fn emulated_paged_matches_interpreter() {
    use crate::emu::{check, random};
    let gen = |g: &KernelGraph, k: Kernel| generate_paged(g, k, &Target::SM_80);
    let (b, pages, page, m) = (4usize, 12usize, 4usize, 3usize);
    let table: Vec<f64> = (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect();
    let table = Tensor::new(DType::I32, &[b, m], table).unwrap();
    let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1.0, 6.0, 12.0]).unwrap();
    for tq in [1usize, 3] {
        let (g, k) = paged(DType::BF16, 4, 2, d(tq as i64), 64, page as i64);
        let ins = [
            random(DType::BF16, &[b, 4, tq, 64], 20),
            random(DType::BF16, &[pages, page, 2, 64], 21),
            random(DType::BF16, &[pages, page, 2, 64], 22),
            table.clone(),
            lens.clone(),
        ];
        check(&format!("bf16 paged T={tq}"), &g, k, gen, &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
    }
    // f32, D = 32, T symbolic, one sequence much longer than a tile (40 keys).
    let (g, k) = paged(DType::F32, 2, 1, sym("T"), 32, 16);
    let table = Tensor::new(DType::I32, &[2, 3], vec![2.0, 0.0, 1.0, 5.0, 4.0, 3.0]).unwrap();
    let lens = Tensor::new(DType::I32, &[2], vec![40.0, 17.0]).unwrap();
    let ins = [random(DType::F32, &[2, 2, 2, 32], 23), random(DType::F32, &[6, 16, 1, 32], 24), random(DType::F32, &[6, 16, 1, 32], 25), table, lens];
    check("f32 paged T=2", &g, k, gen, &ins, &bind(&[("B", 2), ("T", 2), ("P", 6), ("M", 3)]));
}

/// The `bshd` layout and non-contiguous strides (q a transposed view) generate and
/// assemble; scalar loads are used where 16-byte ones are not proven.
#[test]
fn bshd_and_strided_inputs() {
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(DType::BF16, &[d(1), sym("T"), d(8), d(64)]));
    let k = fb.param("k", ty(DType::BF16, &[d(1), sym("T"), d(2), d(64)]));
    let v = fb.param("v", ty(DType::BF16, &[d(1), sym("T"), d(2), d(64)]));
    let attrs = vec![("scale", Attr::Float(0.125)), ("causal", Attr::Bool(true)), ("heads", Attr::Int(8)), ("kv_heads", Attr::Int(2)), ("layout", Attr::Str("bshd".into()))];
    let o = fb.op1(OpKind::Attention, &[q, k, v], attrs).unwrap();
    let (mut g, kk) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
    let plan = generate_prefill(&g, kk, &Target::SM_80).unwrap();
    assert!(plan.ptx.contains("cp.async.cg.shared.global") && plan.ptx.contains("mma.sync"), "bshd rows are contiguous");
    assemble(&plan);
    // Make k's head-dim stride 2 (an odd view): no vector loads of k, and no cp.async, so
    // the CUDA-core kernel.
    let kb = g.kernels[kk].inputs[1];
    g.buffers[kb].layout.strides[3] = d(2);
    let plan = generate_prefill(&g, kk, &Target::SM_80).unwrap();
    assert!(!plan.ptx.contains("mma.sync"));
    assemble(&plan);
}
