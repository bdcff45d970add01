//! Sliding-window and soft-capped attention on the GPU against the interpreter: prefill
//! (`attention`: bf16 on the `mma.sync` kernel, which sm_90a's `wgmma` kernel leaves such a
//! node to; f32 on CUDA cores) and paged
//! decode (`paged_attention`, the split-KV kernel and its clusters of 8 on sm_90a), under both
//! lowerings; windows of 1, shorter than the keys and longer than them, rows with no visible
//! key, soft caps that bite, the lse. Without a GPU: every case compiles, assembles without
//! spills, and the fused lowering keeps each windowed node one kernel of its family.

use sinter::gpu::Lowering;
use sinter::{DType, Target, Tensor};

use super::{case, device, Case};

fn attn_src(dt: &str, h: usize, hkv: usize, sq: usize, skv: usize, dh: usize, attrs: &str, mask: bool) -> String {
    let (mp, ma) = if mask { (format!(", %m: {dt}[{sq}, {skv}]"), ", %m") } else { (String::new(), "") };
    format!(
        "func @main(%q: {dt}[2, {h}, {sq}, {dh}], %k: {dt}[2, {hkv}, {skv}, {dh}], %v: {dt}[2, {hkv}, {skv}, {dh}]{mp}) {{\n  %o: {dt}[2, {h}, {sq}, {dh}], %lse: f32[2, {h}, {sq}] = attention(%q, %k, %v{ma}) {{scale={:?}, causal=true, heads={h}, kv_heads={hkv}, lse=true, {attrs}}}\n  return %o, %lse\n}}",
        1.0 / (dh as f64).sqrt()
    )
}

fn paged_src(t: usize, h: usize, hkv: usize, dh: usize, attrs: &str) -> String {
    format!("func @main(%q: bf16[3, {h}, {t}, {dh}], %kp: bf16[200, 16, {hkv}, {dh}], %vp: bf16[200, 16, {hkv}, {dh}], %bt: i32[3, 70], %len: i32[3]) {{\n  %o: bf16[3, {h}, {t}, {dh}], %lse: f32[3, {h}, {t}] = paged_attention(%q, %kp, %vp, %bt, %len) {{scale=0.088, heads={h}, kv_heads={hkv}, lse=true, {attrs}}}\n  return %o, %lse\n}}")
}

/// The cases: prefill bf16 GQA 8/2 D128 (Sq = Skv = 300, a chunk of 37 after 263 keys, 40
/// queries over 9 keys), Gemma-3-like D256 GQA 4/1 window 512 over 600 keys, f32 with an
/// additive mask; paged decode over lengths 0/1111/333 (T = 1 and 4), with `unified_max` too.
fn window_cases() -> Vec<Case> {
    let mut cases = Vec::new();
    for (sq, skv) in [(300, 300), (37, 300), (40, 9)] {
        for attrs in ["window=1", "window=64", "window=4096", "softcap=2.0", "window=100, softcap=30.0"] {
            cases.push(Case::new(format!("attention bf16 GQA 8/2 D128 Sq={sq} Skv={skv} {attrs}"), attn_src("bf16", 8, 2, sq, skv, 128, attrs, false), &[], 41, 1.0, Box::new(super::none)));
        }
    }
    cases.push(Case::new("attention bf16 GQA 4/1 D256 window 512 (Gemma 3), 600 keys", attn_src("bf16", 4, 1, 600, 600, 256, "window=512", false), &[], 42, 1.0, Box::new(super::none)));
    cases.push(Case::new("attention f32 MHA 4/4 D64 window 7 softcap 5 with a mask", attn_src("f32", 4, 4, 50, 70, 64, "window=7, softcap=5.0", true), &[], 43, 1.0, Box::new(super::none)));
    let table = |ins: &mut Vec<(String, Tensor)>| {
        ins[3].1 = Tensor::from_fn(DType::I32, &[3, 70], |i| ((i[0] * 70 + i[1] * 3) % 200) as f64);
        ins[4].1 = Tensor::new(DType::I32, &[3], vec![0.0, 1111.0, 333.0]).unwrap();
    };
    for (t, h, hkv, dh) in [(1, 8, 2, 128), (4, 8, 2, 128), (1, 16, 1, 64)] {
        for attrs in ["window=1", "window=100", "window=5000", "softcap=1.0", "window=300, softcap=30.0", "window=200, unified_max=5.0"] {
            cases.push(Case::new(format!("paged_attention T={t} H={h}/{hkv} D={dh} lengths 0/1111/333 {attrs}"), paged_src(t, h, hkv, dh, attrs), &[], 44, 1.0, Box::new(table)));
        }
    }
    cases
}

#[test]
fn gpu_window_softcap_attention_matches_the_interpreter() {
    let Some(dev) = device() else { return };
    let mut fails = Vec::new();
    for c in window_cases() {
        fails.extend(case(&dev, &c.name, &c.src, &c.syms, c.seed, c.widen, &c.edit));
    }
    assert!(fails.is_empty(), "{} GPU case failures:\n{}", fails.len(), fails.join("\n"));
}

/// Without a GPU: each case lowers (fused, sm_90a) to one kernel of its family holding the
/// window and softcap, and every kernel of both lowerings assembles for sm_80 and sm_90a
/// without spills.
#[cfg(feature = "llvm")]
#[test]
fn window_softcap_cases_compile_to_their_family() {
    let ptxas = sinter_codegen::ptxas::find_ptxas_for_tests().unwrap();
    for c in window_cases() {
        let g = sinter::ir::parse(&c.src).unwrap();
        let want = g.entry().unwrap().nodes.values().next().unwrap().op.clone();
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            let kg = match lowering {
                Lowering::Unfused => sinter_passes::lower_unfused(&g),
                Lowering::Fused => sinter_passes::compile(&g, &Target::SM_90A, &sinter_passes::PassOptions::default()).map(|r| r.0),
            }
            .unwrap_or_else(|e| panic!("{} [{lowering:?}]: {e}", c.name));
            let held = kg.kernels.values().flat_map(|kd| kd.body.nodes.values()).any(|nd| nd.op == want);
            assert!(held, "{} [{lowering:?}]: no kernel holds {want:?}", c.name);
            for target in [sinter_codegen::Target::SM_80, sinter_codegen::Target::SM_90A] {
                for k in kg.kernels.keys() {
                    let plan = sinter_codegen::compile_kernel(&kg, k, &target).unwrap_or_else(|e| panic!("{} [{lowering:?}] {k}: {e}", c.name));
                    if let Some(ptxas) = &ptxas {
                        let r = sinter_codegen::ptxas::assemble_with(ptxas, &plan.ptx, &target).unwrap_or_else(|e| panic!("{} {k}: {e}", c.name));
                        assert!(!r.functions.iter().any(|f| f.spills()), "{} {k} {}: spills", c.name, target.name());
                    }
                }
            }
        }
    }
}
