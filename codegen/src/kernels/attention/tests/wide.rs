//! Head dims above 256 (up to [`MAX_HEAD_DIM`] = 512): the CUDA-core prefill and paged
//! kernels and the split-KV decode, emulated against the interpreter (bf16 and f32, GQA 8/1
//! and K/V broadcast across heads by a head stride of 0, key counts 32 to 289 with tails),
//! their PTX assembled for sm_80 and sm_90a without spills, and the refusal above 512.

use sinter_ir::interp::Tensor;
use sinter_ir::{DType, Kernel, KernelGraph};

use super::extremes::graph;
use super::{bind, paged};
use crate::emu::{check, random};
use crate::kernels::attention::decode::{generate_with as decode_with, DecodeSchedule};
use crate::kernels::attention::*;
use crate::testing::{assemble, d, plan_line, sym};
use crate::target::Target;

/// `t` `[B, H, S, D]` with every head a copy of head 0 (what a head stride of 0 reads).
fn heads_alike(t: Tensor) -> Tensor {
    let s = t.shape().to_vec();
    let per_head = s[2] * s[3];
    let data = t.data().chunks(per_head * s[1]).flat_map(|b| b[..per_head].repeat(s[1])).collect();
    Tensor::new(t.dtype(), &s, data).unwrap()
}

/// Prefill at D = 320 and 512: GQA 8/1 not causal (Sq 5, Skv 289: nine key tiles, a tail of
/// 1) and causal (33 × 32), then 8 heads whose K and V are one head broadcast by a head stride
/// of 0, with an additive mask; bf16 and f32.
#[test]
fn emulated_wide_prefill() {
    let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
    for (dt, hd) in [(DType::BF16, 512usize), (DType::F32, 320), (DType::F32, 512), (DType::BF16, 320)] {
        for (causal, t, s) in [(false, 5usize, 289usize), (true, 33, 32)] {
            let (g, k) = graph(dt, None, 8, 1, hd as i64, 1.0 / (hd as f64).sqrt(), causal, false);
            let ins = [random(dt, &[1, 8, t, hd], 1), random(dt, &[1, 1, s, hd], 2), random(dt, &[1, 1, s, hd], 3)];
            let sizes = bind(&[("B", 1), ("T", t as i64), ("S", s as i64)]);
            check(&format!("{dt} D{hd} GQA 8/1 causal={causal} Sq={t} Skv={s}"), &g, k, gen, &ins, &sizes);
        }
        let (mut g, k) = graph(dt, Some(DType::F32), 8, 8, hd as i64, 0.05, false, true);
        for i in [1, 2] {
            let b = g.kernels[k].inputs[i];
            g.buffers[b].layout.strides[1] = d(0);
        }
        let (t, s) = (6usize, 70usize);
        let mask = super::extremes::mask(t, s, 4, f64::from(f32::MIN));
        let ins = [random(dt, &[1, 8, t, hd], 4), heads_alike(random(dt, &[1, 8, s, hd], 5)), heads_alike(random(dt, &[1, 8, s, hd], 6)), mask];
        check(&format!("{dt} D{hd} K/V head stride 0, mask"), &g, k, gen, &ins, &bind(&[("B", 1), ("T", t as i64), ("S", s as i64)]));
    }
}

/// Paged decode at D = 320 and 512, GQA 8/1, lengths 32, 289 and 1: the split-KV kernel
/// (sm_80, and with clusters) and the single-CTA kernel; bf16 and f32.
#[test]
fn emulated_wide_paged() {
    let (b, pages, page, m) = (3usize, 40usize, 16usize, 19usize);
    let table = Tensor::new(DType::I32, &[b, m], (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect()).unwrap();
    let lens = Tensor::new(DType::I32, &[b], vec![32.0, 289.0, 1.0]).unwrap();
    let binds = bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]);
    for (dt, hd) in [(DType::BF16, 512usize), (DType::F32, 320)] {
        let (g, k) = paged(dt, 8, 1, d(1), hd as i64, page as i64);
        let ins = [random(dt, &[b, 8, 1, hd], 7), random(dt, &[pages, page, 1, hd], 8), random(dt, &[pages, page, 1, hd], 9), table.clone(), lens.clone()];
        check(&format!("split-KV {dt} D{hd} GQA 8/1"), &g, k, |g, k| decode::generate(g, k, &Target::SM_80), &ins, &binds);
        let cl = DecodeSchedule { warps: 4, rows: 4, cluster: 2 };
        check(&format!("split-KV cluster {dt} D{hd}"), &g, k, |g, k| decode_with(g, k, &Target::SM_90, &cl), &ins, &binds);
        check(&format!("single-CTA {dt} D{hd}"), &g, k, |g, k| generate_paged(g, k, &Target::SM_80), &ins, &binds);
    }
}

/// The wide kernels' plans and ptxas reports (sm_80, sm_90a; `assemble` asserts no spills
/// and no stack), and the refusal above 512.
#[test]
fn wide_ptxas_reports() {
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (dt, hd) in [(DType::BF16, 320), (DType::BF16, 512), (DType::F16, 512), (DType::F32, 512)] {
            let (g, k) = graph(dt, Some(dt), 32, 8, hd, 0.05, true, true);
            let plan = generate_prefill(&g, k, &t).unwrap_or_else(|e| panic!("{dt} D{hd}: {e}"));
            assert!(!plan.ptx.contains("mma"), "CUDA cores above 256");
            // D 320 in bf16 fits 48 KiB (8 rows); D 512 needs dynamic shared memory (4 rows).
            assert!(plan.shared_bytes <= t.max_shared_memory_per_block(), "{}", plan.shared_bytes);
            assert_eq!(plan.shared_bytes > 48 * 1024, hd == 512, "{dt} D{hd}: {}", plan.shared_bytes);
            let (gp, kp) = paged(dt, 32, 4, d(1), hd, 16);
            let plans = [plan, decode::generate(&gp, kp, &t).unwrap(), generate_paged(&gp, kp, &t).unwrap()];
            for (what, plan) in ["prefill", "split-KV", "single-CTA paged"].iter().zip(&plans) {
                eprintln!("{t} {dt} D{hd} {what}");
                let Some(report) = assemble(plan) else { return };
                text.push_str(&format!("# {what} {dt} D{hd}\n{}\n{report}", plan_line(plan)));
            }
        }
    }
    insta::assert_snapshot!("attention_wide_ptxas", text);
    let (g, k) = graph(DType::BF16, None, 2, 1, 576, 0.05, false, false);
    let e = generate_prefill(&g, k, &Target::SM_90A).unwrap_err();
    assert!(e.to_string().contains("head dim of q and k must be a constant in 1..=512"), "{e}");
    let (g, k) = paged(DType::BF16, 2, 1, sym("T"), 1024, 16);
    let e = generate_paged(&g, k, &Target::SM_90A).unwrap_err();
    assert!(e.to_string().contains("1..=512"), "{e}");
}
