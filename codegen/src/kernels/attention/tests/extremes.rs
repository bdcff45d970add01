//! Extreme but finite values, against the interpreter on the CPU emulator: additive masks
//! holding a dtype's lowest finite value (as Hugging Face models build them) with fully
//! masked rows (the mean of V and a finite log-sum-exp), −inf masks with fully masked rows
//! (0 and −inf), mixed rows, and raw scores near ±3e38 — on every kernel the emulator runs
//! (CUDA-core prefill and paged decode, `mma.sync` prefill in both softmax forms, split-KV
//! decode, the merge). The `wgmma` kernel is not emulated: its PTX is assembled.

use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, DType, Family, FunctionBuilder, Graph, Kernel, KernelGraph, OpKind};

use super::{bind, paged};
use super::merge::merge_graph;
use crate::emu::{check, random};
use crate::kernels::attention::decode::{generate_with as decode_with, DecodeSchedule};
use crate::kernels::attention::*;
use crate::testing::{assemble, d, single_kernel, sym, ty};
use crate::target::Target;

/// `attention(q [B, H, T, D], k, v [B, Hkv, S, D], mask [T, S] of `mask`?) {scale, lse}`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn graph(dt: DType, mask: Option<DType>, h: i64, hkv: i64, hd: i64, scale: f64, causal: bool, lse: bool) -> (KernelGraph, Kernel) {
    let (b, sq, skv) = (sym("B"), sym("T"), sym("S"));
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(dt, &[b.clone(), d(h), sq.clone(), d(hd)]));
    let k = fb.param("k", ty(dt, &[b.clone(), d(hkv), skv.clone(), d(hd)]));
    let v = fb.param("v", ty(dt, &[b, d(hkv), skv.clone(), d(hd)]));
    let mut args = vec![q, k, v];
    if let Some(mdt) = mask {
        args.push(fb.param("mask", ty(mdt, &[sq, skv])));
    }
    let attrs = vec![("scale", Attr::Float(scale)), ("causal", Attr::Bool(causal)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv)), ("lse", Attr::Bool(lse))];
    let r = fb.op(OpKind::Attention, &args, attrs).unwrap();
    single_kernel(Family::Attention, fb.finish(&r).unwrap())
}

/// The lowest finite value of `dt` (what `torch.finfo(dt).min` gives).
pub(crate) fn lowest(dt: DType) -> f64 {
    match dt {
        DType::BF16 => -3.3895313892515355e38,
        DType::F16 => -65504.0,
        _ => f64::from(f32::MIN),
    }
}

/// A mask `[t, s]`: rows `full..` hide every key with `fill`, row 1 every key with −inf,
/// the other rows keys `j % 3 == 1` with `fill` (row 0: none).
pub(crate) fn mask(t: usize, s: usize, full: usize, fill: f64) -> Tensor {
    let data = (0..t * s)
        .map(|e| {
            let (i, j) = (e / s, e % s);
            match i {
                0 => 0.0,
                1 => f64::NEG_INFINITY,
                _ if i >= full || j % 3 == 1 => fill,
                _ => 0.0,
            }
        })
        .collect();
    Tensor::new(DType::F32, &[t, s], data).unwrap()
}

/// `t` with element 0 of every row of its last axis (of length `hd`) set to `x` (alternating
/// sign by row when `alternate`): raw scores q·k near ±x².
fn spike(t: Tensor, hd: usize, x: f64, alternate: bool) -> Tensor {
    let mut data = t.data().to_vec();
    for (r, row) in data.chunks_mut(hd).enumerate() {
        row[0] = if alternate && r % 2 == 1 { -x } else { x };
    }
    Tensor::new(t.dtype(), t.shape(), data).unwrap()
}

fn sizes(t: usize, s: usize) -> sinter_ir::Bindings {
    bind(&[("B", 1), ("T", t as i64), ("S", s as i64)])
}

/// The correctness report's case on the CUDA-core kernel (f32, 1 head, 8 × 8, D 8, scale
/// 1/√8): rows 4–7 masked everywhere with −3.4028235e38 give the mean of V and a finite
/// lse; then the same with −inf (0, −inf), and bf16 with its own lowest value.
#[test]
fn emulated_hf_mask_cuda_cores() {
    let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
    let (g, k) = graph(DType::F32, Some(DType::F32), 1, 1, 8, 1.0 / 8f64.sqrt(), false, true);
    let ins = |m: Tensor| [random(DType::F32, &[1, 1, 8, 8], 1), random(DType::F32, &[1, 1, 8, 8], 2), random(DType::F32, &[1, 1, 8, 8], 3), m];
    // The interpreter (the ground truth) gives the mean of V and a finite lse for rows 4–7.
    let ins_hf = ins(mask(8, 8, 4, lowest(DType::F32)));
    let mut gr = Graph::new();
    gr.add_func(g.kernels[k].body.clone());
    let want = sinter_ir::interp::run(&gr, "attn", &ins_hf.iter().collect::<Vec<_>>(), &sizes(8, 8)).unwrap();
    let v = ins_hf[2].data();
    for i in 4..8 {
        for e in 0..8 {
            let mean = (0..8).map(|j| v[j * 8 + e]).sum::<f64>() / 8.0;
            assert!((want[0].data()[i * 8 + e] - mean).abs() < 1e-6, "row {i}: {} vs mean {mean}", want[0].data()[i * 8 + e]);
        }
        assert!(want[1].data()[i].is_finite(), "row {i}: lse {}", want[1].data()[i]);
    }
    assert_eq!(want[1].data()[1], f64::NEG_INFINITY);
    check("f32 D8 mask of −3.4e38, rows 4–7 fully masked", &g, k, gen, &ins_hf, &sizes(8, 8));
    check("f32 D8 −inf mask, rows 4–7 fully masked", &g, k, gen, &ins(mask(8, 8, 4, f64::NEG_INFINITY)), &sizes(8, 8));
    // Longer rows (two key tiles, a tail), GQA 4/2, f32 masks beside bf16 and f16 operands
    // (f16: its lowest value, −65504, is an ordinary score), causal too.
    for (dt, causal) in [(DType::BF16, false), (DType::F16, true), (DType::F32, true)] {
        let (g, k) = graph(dt, Some(DType::F32), 4, 2, 40, 0.15, causal, true);
        let (t, s) = (19usize, 45usize);
        let ins = [random(dt, &[1, 4, t, 40], 4), random(dt, &[1, 2, s, 40], 5), random(dt, &[1, 2, s, 40], 6), mask(t, s, 12, lowest(DType::F32))];
        check(&format!("{dt} D40 GQA causal={causal} mask of −3.4e38"), &g, k, gen, &ins, &sizes(t, s));
        let ins = [ins[0].clone(), ins[1].clone(), ins[2].clone(), mask(t, s, 12, lowest(dt))];
        check(&format!("{dt} D40 GQA causal={causal} mask of {dt}'s lowest"), &g, k, gen, &ins, &sizes(t, s));
    }
}

/// The `mma.sync` kernel (bf16 D 64, natural-unit scores with a mask): the same masks,
/// finite and −inf, fully masked rows in both, a key tile and a tail.
#[test]
fn emulated_hf_mask_tensor_cores() {
    let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
    for causal in [false, true] {
        let (g, k) = graph(DType::BF16, Some(DType::F32), 2, 1, 64, 0.125, causal, true);
        let plan = generate_prefill(&g, k, &Target::SM_80).unwrap();
        assert!(plan.ptx.contains("mma.sync"));
        let (t, s) = (24usize, 70usize);
        let base = [random(DType::BF16, &[1, 2, t, 64], 7), random(DType::BF16, &[1, 1, s, 64], 8), random(DType::BF16, &[1, 1, s, 64], 9)];
        for (what, fill) in [("−3.4e38", lowest(DType::F32)), ("−inf", f64::NEG_INFINITY)] {
            let ins = [base[0].clone(), base[1].clone(), base[2].clone(), mask(t, s, 16, fill)];
            check(&format!("tc bf16 causal={causal} mask of {what}"), &g, k, gen, &ins, &sizes(t, s));
        }
    }
}

/// Raw scores near ±1e20 and ±3e38 (q and k with one element ±1e10 or ±1.7e19): finite, so
/// never NaN; with scale·log2 e < 1 and > 1 (scale 1: s·log2 e would overflow where s·scale
/// does not), on CUDA and tensor cores (whose former `s·c − m·c` fma lost p of the row's
/// largest score to m·c's rounding from scores of about 1e8 up).
#[test]
fn emulated_extreme_scores() {
    for (dt, hd, tc) in [(DType::F32, 8usize, false), (DType::BF16, 64, true), (DType::BF16, 64, false)] {
        for (scale, x) in [(1.0 / (hd as f64).sqrt(), 1.7e19), (1.0, 1.7e19), (0.125, 1e10)] {
            let (g, k) = graph(dt, None, 2, 1, hd as i64, scale, false, true);
            let (t, s) = (9usize, 37usize);
            let ins = [spike(random(dt, &[1, 2, t, hd], 10), hd, x, true), spike(random(dt, &[1, 1, s, hd], 11), hd, x, true), random(dt, &[1, 1, s, hd], 12)];
            let what = format!("{dt} D{hd} scale {scale} tc={tc} scores ±{:e}", x * x);
            if tc {
                check(&what, &g, k, |g, k| generate_prefill(g, k, &Target::SM_80), &ins, &sizes(t, s));
            } else {
                let sch = AttentionSchedule { warps: 4, rows_per_warp: 2 };
                check(&what, &g, k, |g, k| generate_prefill_with(g, k, &Target::SM_80, &sch), &ins, &sizes(t, s));
            }
        }
    }
}

/// Paged decode (split-KV, with and without clusters, and the single-CTA kernel) with raw
/// scores near ±3e38; the merge of partial states whose lse are finite extremes.
#[test]
fn emulated_extreme_decode_and_merge() {
    let (b, pages, page, m) = (2usize, 12usize, 16usize, 6usize);
    let table = Tensor::new(DType::I32, &[b, m], (0..b * m).map(|i| ((i * 5 + 1) % pages) as f64).collect()).unwrap();
    let lens = Tensor::new(DType::I32, &[b], vec![70.0, 33.0]).unwrap();
    let (g, k) = paged(DType::F32, 4, 2, d(1), 32, page as i64);
    let ins = [
        spike(random(DType::F32, &[b, 4, 1, 32], 13), 32, 1.7e19, true),
        spike(random(DType::F32, &[pages, page, 2, 32], 14), 32, 1.7e19, true),
        random(DType::F32, &[pages, page, 2, 32], 15),
        table,
        lens,
    ];
    let binds = bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]);
    check("split-KV sm_80 scores ±3e38", &g, k, |g, k| decode::generate(g, k, &Target::SM_80), &ins, &binds);
    let cl = DecodeSchedule { warps: 2, rows: 2, cluster: 2 };
    check("split-KV cluster scores ±3e38", &g, k, |g, k| decode_with(g, k, &Target::SM_90, &cl), &ins, &binds);
    check("single-CTA paged scores ±3e38", &g, k, |g, k| generate_paged(g, k, &Target::SM_80), &ins, &binds);
    // Merge: lse_a −3e38 beside lse_b 5 (w_a = e^(−3e38 − 5) = 0), both −3e38 (equal
    // weights), −inf beside −3e38.
    let (g, k) = merge_graph(DType::F32, &[sym("R")], 8, false);
    let big = f64::from(f32::MIN) * 0.9;
    let la = Tensor::new(DType::F32, &[4], vec![big, big, f64::NEG_INFINITY, 1.0]).unwrap();
    let lb = Tensor::new(DType::F32, &[4], vec![5.0, big, big, big]).unwrap();
    let ins = [random(DType::F32, &[4, 8], 16), la, random(DType::F32, &[4, 8], 17), lb];
    check("merge of extreme lse", &g, k, |g, k| merge::generate(g, k, &Target::SM_80), &ins, &bind(&[("R", 4)]));
}

/// The `wgmma` kernel (not emulated) takes masks of no kind; with scale 1 (c > 1) it takes
/// the natural-unit softmax, which assembles without spills.
#[test]
fn wgmma_natural_units_assemble() {
    for scale in [0.125, 1.0] {
        let (g, k) = graph(DType::BF16, None, 8, 2, 128, scale, true, true);
        let plan = generate_prefill(&g, k, &Target::SM_90A).unwrap();
        assert!(plan.ptx.contains("wgmma.mma_async"));
        // No spills, no stack (assemble asserts both).
        assemble(&plan);
    }
}

