//! Sliding window and softcap: the split-KV and single-CTA paged decode kernels and the
//! `mma.sync` and CUDA-core prefill kernels against the interpreter on the emulator (windows of 1, shorter
//! than the keys, longer than them; rows with no visible key; GQA; soft caps that bite on
//! scores far beyond them; a NaN in a V row outside every window, never multiplied), what the
//! tensor-core kernels refuse (the choice falls to CUDA cores), and ptxas reports.

use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, DType, Dim, Family, FunctionBuilder, Graph, Kernel, KernelGraph, OpKind};

use super::bind;
use crate::emu::{check, random};
use crate::kernels::attention::decode::{self, DecodeSchedule};
use crate::kernels::attention::*;
use crate::target::Target;
use crate::testing::{assemble, d, plan_line, single_kernel, sym, ty};

fn extra(window: Option<i64>, softcap: Option<f64>) -> Vec<(&'static str, Attr)> {
    let mut v = vec![];
    if let Some(w) = window {
        v.push(("window", Attr::Int(w)));
    }
    if let Some(c) = softcap {
        v.push(("softcap", Attr::Float(c)));
    }
    v
}

/// Causal `attention` (bhsd) with a window and a softcap, optionally a mask `[Sq, Skv]`.
#[allow(clippy::too_many_arguments)]
fn prefill_ws(dt: DType, h: i64, hkv: i64, sq: Dim, skv: Dim, hd: i64, mask: bool, window: Option<i64>, softcap: Option<f64>) -> (KernelGraph, Kernel) {
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
    let q = fb.param("q", ty(dt, &[b.clone(), d(h), sq.clone(), d(hd)]));
    let k = fb.param("k", ty(dt, &[b.clone(), d(hkv), skv.clone(), d(hd)]));
    let v = fb.param("v", ty(dt, &[b, d(hkv), skv.clone(), d(hd)]));
    let mut args = vec![q, k, v];
    if mask {
        args.push(fb.param("mask", ty(dt, &[sq, skv])));
    }
    let mut attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("causal", Attr::Bool(true)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv)), ("lse", Attr::Bool(true))];
    attrs.extend(extra(window, softcap));
    let o = fb.op(OpKind::Attention, &args, attrs).unwrap();
    single_kernel(Family::Attention, fb.finish(&o).unwrap())
}

/// `paged_attention` with a window, a softcap and the lse.
#[allow(clippy::too_many_arguments)]
fn paged_ws(dt: DType, h: i64, hkv: i64, t: Dim, hd: i64, page: i64, window: Option<i64>, softcap: Option<f64>) -> (KernelGraph, Kernel) {
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
    let q = fb.param("q", ty(dt, &[b.clone(), d(h), t, d(hd)]));
    let kp = fb.param("k_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
    let vp = fb.param("v_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
    let bt = fb.param("block_table", ty(DType::I32, &[b.clone(), sym("M")]));
    let lens = fb.param("seq_lens", ty(DType::I32, &[b]));
    let mut attrs = vec![("scale", Attr::Float(1.0 / (hd as f64).sqrt())), ("causal", Attr::Bool(true)), ("heads", Attr::Int(h)), ("kv_heads", Attr::Int(hkv)), ("lse", Attr::Bool(true))];
    attrs.extend(extra(window, softcap));
    let r = fb.op(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
    single_kernel(Family::PagedAttention, fb.finish(&r).unwrap())
}

fn scaled(t: Tensor, by: f64) -> Tensor {
    let data = t.data().iter().map(|x| x * by).collect();
    Tensor::new(t.dtype(), t.shape(), data).unwrap()
}

/// The windows and caps every kernel is checked with: `(window, softcap, q scale)`.
const CASES: [(Option<i64>, Option<f64>, f64); 6] = [(Some(1), None, 1.0), (Some(5), None, 1.0), (Some(40), Some(20.0), 8.0), (Some(1000), None, 1.0), (None, Some(1.0), 60.0), (Some(33), Some(0.25), 400.0)];

/// Paged inputs: 4 sequences of 0, 1, 37 and 160 keys over 40 scrambled pages of 16, a NaN
/// in V of sequence 3's key 10 (outside every window here but 1000's and none).
fn paged_inputs(h: usize, hkv: usize, tq: usize, hd: usize, qscale: f64, nan: bool) -> Vec<Tensor> {
    let (b, pages, page, m) = (4usize, 40usize, 16usize, 10usize);
    let table: Vec<f64> = (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect();
    let mut vp = random(DType::BF16, &[pages, page, hkv, hd], 52).data().to_vec();
    if nan {
        let page_of = |bq: usize, j: usize| ((bq * m + j / page) * 7 + 3) % pages;
        vp[((page_of(3, 10) * page + 10 % page) * hkv) * hd + 3] = f64::NAN;
    }
    vec![
        scaled(random(DType::BF16, &[b, h, tq, hd], 50), qscale),
        random(DType::BF16, &[pages, page, hkv, hd], 51),
        Tensor::new(DType::BF16, &[pages, page, hkv, hd], vp).unwrap(),
        Tensor::new(DType::I32, &[b, m], table).unwrap(),
        Tensor::new(DType::I32, &[b], vec![0.0, 1.0, 37.0, 160.0]).unwrap(),
    ]
}

/// Split-KV decode (sm_80: across the warps; sm_90a: clusters of 8 CTAs) and the single-CTA
/// kernel, T = 1 and T = 3, GQA 4/2.
#[test]
fn emulated_paged_window_softcap() {
    let binds = bind(&[("B", 4), ("P", 40), ("M", 10)]);
    for (window, softcap, qs) in CASES {
        for tq in [1usize, 3] {
            let (g, k) = paged_ws(DType::BF16, 4, 2, d(tq as i64), 64, 16, window, softcap);
            let nan = matches!(window, Some(w) if w < 100);
            let ins = paged_inputs(4, 2, tq, 64, qs, nan);
            let what = format!("window={window:?} softcap={softcap:?} T={tq}");
            check(&format!("split-KV sm_80 {what}"), &g, k, |g, k| decode::generate(g, k, &Target::SM_80), &ins, &binds);
            check(&format!("single-CTA {what}"), &g, k, |g, k| generate_paged(g, k, &Target::SM_80), &ins, &binds);
            if tq == 1 {
                check(&format!("split-KV sm_90a clusters {what}"), &g, k, |g, k| decode::generate(g, k, &Target::SM_90A), &ins, &binds);
                // One worker a CTA (so most tiles are skipped whole) and unified-max.
                check(&format!("split-KV one warp {what}"), &g, k, |g, k| decode::generate_with(g, k, &Target::SM_80, &DecodeSchedule { warps: 1, rows: 2, cluster: 1 }), &ins, &binds);
            }
        }
    }
}

/// Split-KV with `unified_max` and a window: the fast path's lower bound of each row.
#[test]
fn emulated_paged_window_unified_max() {
    let b = sym("B");
    let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
    let q = fb.param("q", ty(DType::BF16, &[b.clone(), d(4), d(1), d(64)]));
    let kp = fb.param("k_pages", ty(DType::BF16, &[sym("P"), d(16), d(2), d(64)]));
    let vp = fb.param("v_pages", ty(DType::BF16, &[sym("P"), d(16), d(2), d(64)]));
    let bt = fb.param("block_table", ty(DType::I32, &[b.clone(), sym("M")]));
    let lens = fb.param("seq_lens", ty(DType::I32, &[b]));
    let attrs = vec![("scale", Attr::Float(0.125)), ("heads", Attr::Int(4)), ("kv_heads", Attr::Int(2)), ("unified_max", Attr::Float(1.0)), ("window", Attr::Int(21)), ("softcap", Attr::Float(5.0))];
    let r = fb.op(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
    let (g, k) = single_kernel(Family::PagedAttention, fb.finish(&r).unwrap());
    let ins = paged_inputs(4, 2, 1, 64, 1.0, true);
    check("split-KV unified_max window=21 softcap=5", &g, k, |g, k| decode::generate(g, k, &Target::SM_80), &ins, &bind(&[("B", 4), ("P", 40), ("M", 10)]));
}

/// Prefill: Sq = Skv = 70, a chunk (Sq 9 after 61 keys), more queries than keys (rows with
/// no visible key), GQA 4/2; bf16 on the `mma.sync` kernel (the default on sm_80 and sm_90a;
/// 32- and 64-key tiles) and on CUDA cores, f32 with an additive mask on CUDA cores.
#[test]
fn emulated_prefill_window_softcap() {
    for (window, softcap, qs) in CASES {
        for (sq, skv) in [(70usize, 70usize), (9, 70), (12, 5)] {
            for (dt, mask) in [(DType::BF16, false), (DType::F32, true)] {
                let (g, k) = prefill_ws(dt, 4, 2, sym("T"), sym("S"), 64, mask, window, softcap);
                // One batch: the batch stride is the other attention tests' (this emulation is
                // CI's longest).
                let mut ins = vec![scaled(random(dt, &[1, 4, sq, 64], 60), qs), random(dt, &[1, 2, skv, 64], 61), random(dt, &[1, 2, skv, 64], 62)];
                if mask {
                    ins.push(scaled(random(dt, &[sq, skv], 63), 3.0));
                }
                let what = format!("{dt} window={window:?} softcap={softcap:?} Sq={sq} Skv={skv} mask={mask}");
                for t in [Target::SM_80, Target::SM_90A] {
                    let plan = generate_prefill(&g, k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert!(!plan.ptx.contains("wgmma"), "{what}: the wgmma kernel on {t}");
                    assert_eq!(plan.ptx.contains("mma.sync"), dt == DType::BF16, "{what}: mma.sync for bf16 only on {t}");
                }
                let binds = bind(&[("B", 1), ("T", sq as i64), ("S", skv as i64)]);
                check(&format!("default {what}"), &g, k, |g, k| generate_prefill(g, k, &Target::SM_80), &ins, &binds);
                if dt == DType::BF16 {
                    check(&format!("cuda-core {what}"), &g, k, |g, k| generate_prefill_with(g, k, &Target::SM_80, &choose_prefill_schedule(64, 64, dt)), &ins, &binds);
                    for kv in [32, 64] {
                        let s = TcSchedule { block_kv: kv, ..schedule::choose_tc_schedule(64, 64, false, true, &Target::SM_80) };
                        check(&format!("mma.sync {kv}-key tiles {what}"), &g, k, |g, k| generate_prefill_tc_with(g, k, &Target::SM_80, &s), &ins, &binds);
                    }
                }
            }
        }
    }
}

/// The `wgmma` kernel refuses a window or a softcap (the default on sm_90a is the `mma.sync`
/// kernel); every schedule candidate is an `mma.sync` one.
#[test]
fn wgmma_refuses_window_and_softcap() {
    for (window, softcap) in [(Some(8), None), (None, Some(30.0))] {
        let (g, k) = prefill_ws(DType::BF16, 8, 2, sym("T"), sym("S"), 128, false, window, softcap);
        let e = generate_prefill_wg_with(&g, k, &Target::SM_90A, &WgSchedule { warpgroups: 2, block_kv: 128, pv_split: false, overlap: false, producer: false, pingpong: false }).unwrap_err();
        assert!(e.to_string().contains("sliding window or a softcap"), "{e}");
        let names = crate::schedule_names(&g, k, &Target::SM_90A).unwrap();
        assert!(!names.is_empty() && names.iter().all(|n| !n.contains("wg")), "{names:?}");
        assert!(generate_prefill(&g, k, &Target::SM_90A).unwrap().ptx.contains("mma.sync"));
    }
}

/// ptxas: the windowed, soft-capped kernels assemble without spills or stack.
#[test]
fn window_softcap_ptxas_reports() {
    let cases = vec![
        ("split-KV bf16 D128 GQA 32/8 T=1 window 4096 softcap 50", paged_ws(DType::BF16, 32, 8, d(1), 128, 16, Some(4096), Some(50.0)), 0),
        ("single-CTA bf16 D128 GQA 32/8 T=1 window 4096 softcap 50", paged_ws(DType::BF16, 32, 8, d(1), 128, 16, Some(4096), Some(50.0)), 1),
        ("mma.sync prefill bf16 D128 GQA 32/8 window 4096 softcap 50", prefill_ws(DType::BF16, 32, 8, sym("T"), sym("S"), 128, false, Some(4096), Some(50.0)), 2),
        ("mma.sync prefill bf16 D256 GQA 8/4 window 512 (Gemma 3)", prefill_ws(DType::BF16, 8, 4, sym("T"), sym("T"), 256, false, Some(512), None), 2),
        ("cuda-core prefill f32 D128 GQA 32/8 window 4096 softcap 50", prefill_ws(DType::F32, 32, 8, sym("T"), sym("S"), 128, false, Some(4096), Some(50.0)), 2),
    ];
    let mut text = String::new();
    for t in [Target::SM_80, Target::SM_90A] {
        for (what, (g, k), which) in &cases {
            let plan = match which {
                0 => decode::generate(g, *k, &t),
                1 => generate_paged(g, *k, &t),
                _ => generate_prefill(g, *k, &t),
            }
            .unwrap_or_else(|e| panic!("{what}: {e}"));
            let Some(report) = assemble(&plan) else { return };
            text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
        }
    }
    insta::assert_snapshot!("window_softcap_ptxas", text);
}

/// sm_90a clusters of 8 CTAs past solo mode with a window: lengths 0, 1111 and 333, window
/// 400 (the workers start at tile 22 of sequence 1: 13 tiles split across the cluster),
/// softcap 30.
#[test]
fn emulated_paged_window_clusters() {
    let (b, pages, page, m) = (3usize, 211usize, 16usize, 70usize);
    let table = Tensor::new(DType::I32, &[b, m], (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect()).unwrap();
    let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1111.0, 333.0]).unwrap();
    let (g, k) = paged_ws(DType::BF16, 4, 2, d(1), 64, page as i64, Some(400), Some(30.0));
    let ins = [random(DType::BF16, &[b, 4, 1, 64], 70), random(DType::BF16, &[pages, page, 2, 64], 71), random(DType::BF16, &[pages, page, 2, 64], 72), table, lens];
    let plan = decode::generate(&g, k, &Target::SM_90A).unwrap();
    assert!(plan.ptx.contains(".reqnctapercluster 8, 1, 1"), "no cluster");
    check("split-KV sm_90a clusters window=400 softcap=30", &g, k, |g, k| decode::generate(g, k, &Target::SM_90A), &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
}

/// `mma.sync` with an additive mask, a window and a softcap (the mask added after the cap),
/// and a NaN in a V row below every window (scanned, never multiplied): bf16 D64 GQA 4/2,
/// 70 queries over 70 keys.
#[test]
fn emulated_mma_window_softcap_mask() {
    let (g, k) = prefill_ws(DType::BF16, 4, 2, sym("T"), sym("S"), 64, true, Some(9), Some(3.0));
    let mut v = random(DType::BF16, &[2, 2, 70, 64], 82).data().to_vec();
    v[(2 * 64) + 5] = f64::NAN; // batch 0, KV head 0, key 2: below the window of rows ≥ 11
    let ins = [scaled(random(DType::BF16, &[2, 4, 70, 64], 80), 4.0), random(DType::BF16, &[2, 2, 70, 64], 81), Tensor::new(DType::BF16, &[2, 2, 70, 64], v).unwrap(), scaled(random(DType::BF16, &[70, 70], 83), 2.0)];
    assert!(generate_prefill(&g, k, &Target::SM_80).unwrap().ptx.contains("mma.sync"));
    check("mma.sync mask window=9 softcap=3 NaN in V", &g, k, |g, k| generate_prefill(g, k, &Target::SM_80), &ins, &bind(&[("B", 2), ("T", 70), ("S", 70)]));
}
