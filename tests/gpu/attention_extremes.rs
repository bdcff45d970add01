//! Attention at finite extremes and wide head dims on the GPU, against the interpreter, under
//! both lowerings (one kernel per node, and the passes' fused attention kernel):
//! - the Hugging Face form `softmax(q·kᵀ·scale + mask)·v` written as separate ops, with a mask
//!   of the lowest finite value (−3.4028235e38 in f32, −3.39e38 in bf16) whose rows 4–7 hide
//!   every key (the mean of V there, never NaN), and the same with −inf (0 there);
//! - head dim 512 (and 320) with 8 query heads on 1 KV head, prefill and paged decode, key
//!   counts with tails.
//!
//! Without a GPU: the passes keep the HF mask as it is (no rewrite divides it by the scale,
//! which would overflow −3.4e38 to −inf), and every kernel assembles for sm_80 and sm_90a.

use super::*;

/// `softmax(q·kᵀ·scale + mask)·v` over `[1, H, S, D]` in `dt`, as separate ops.
fn hf_graph(dt: &str, h: usize, s: usize, d: usize) -> String {
    let scale = 1.0 / (d as f64).sqrt();
    format!(
        "func @main(%q: {dt}[1, {h}, {s}, {d}], %k: {dt}[1, {h}, {s}, {d}], %v: {dt}[1, {h}, {s}, {d}], %mask: {dt}[1, 1, {s}, {s}]) {{
  %c: {dt}[] = constant() {{value={scale}, dtype={dt}}}
  %kt: {dt}[1, {h}, {d}, {s}] = transpose(%k)
  %qk: {dt}[1, {h}, {s}, {s}] = matmul(%q, %kt)
  %sc: {dt}[1, {h}, {s}, {s}] = mul(%qk, %c)
  %sm: {dt}[1, {h}, {s}, {s}] = add(%sc, %mask)
  %p: {dt}[1, {h}, {s}, {s}] = softmax(%sm)
  %o: {dt}[1, {h}, {s}, {d}] = matmul(%p, %v)
  return %o
}}"
    )
}

/// Sets the mask `[.., s, s]`: rows `full..` hide every key with `fill`, earlier rows keys
/// `j % 3 == 1` (row 0: none).
fn hf_mask(s: usize, full: usize, fill: f64) -> Edit {
    Box::new(move |ins| {
        for (n, t) in ins.iter_mut() {
            if n == "mask" {
                let data = (0..s * s).map(|e| if e / s >= full || (e / s > 0 && (e % s) % 3 == 1) { fill } else { 0.0 }).collect();
                *t = Tensor::new(t.dtype(), t.shape(), data).unwrap();
            }
        }
    })
}

/// The HF-mask cases: the correctness report's (f32, 1 head, 8 × 8, D 8, rows 4–7 fully
/// masked with −3.4028235e38), its −inf twin, and bf16 with D 64 (the tensor-core kernel)
/// and 70 keys.
fn hf_cases() -> Vec<Case> {
    let lowest_bf16 = -3.3895313892515355e38;
    vec![
        Case::new("HF mask f32 D8 8x8, rows 4-7 of -3.4028235e38", hf_graph("f32", 1, 8, 8), &[], 301, 1.0, hf_mask(8, 4, f64::from(f32::MIN))),
        Case::new("HF mask f32 D8 8x8, rows 4-7 of -inf", hf_graph("f32", 1, 8, 8), &[], 302, 1.0, hf_mask(8, 4, f64::NEG_INFINITY)),
        Case::new("HF mask bf16 D64 70x70 H2, rows 50.. of bf16's lowest", hf_graph("bf16", 2, 70, 64), &[], 303, 1.0, hf_mask(70, 50, lowest_bf16)),
        Case::new("HF mask bf16 D64 70x70 H2, rows 50.. of -inf", hf_graph("bf16", 2, 70, 64), &[], 304, 1.0, hf_mask(70, 50, f64::NEG_INFINITY)),
    ]
}

/// Head dims above 256: prefill with 8 query heads on 1 KV head (causal 33 × 289, and not
/// causal 5 × 32), bf16 D 512 and f32 D 320; paged decode D 512 with lengths 32, 289 and 1.
fn wide_cases() -> Vec<Case> {
    let mut cases = vec![];
    for (dt, d) in [("bf16", 512usize), ("f32", 320)] {
        for (causal, sq, skv) in [(true, 33usize, 289usize), (false, 5, 32)] {
            let src = format!("func @main(%q: {dt}[2, 8, {sq}, {d}], %k: {dt}[2, 1, {skv}, {d}], %v: {dt}[2, 1, {skv}, {d}]) {{\n  %o: {dt}[2, 8, {sq}, {d}] = attention(%q, %k, %v) {{scale=0.044, causal={causal}, heads=8, kv_heads=1}}\n  return %o\n}}");
            cases.push(Case::new(format!("attention {dt} D{d} GQA 8/1 causal={causal} Sq={sq} Skv={skv}"), &src, &[], 310, 1.0, Box::new(none)));
        }
    }
    let src = "func @main(%q: bf16[3, 8, 1, 512], %kp: bf16[60, 16, 1, 512], %vp: bf16[60, 16, 1, 512], %bt: i32[3, 19], %len: i32[3]) {\n  %o: bf16[3, 8, 1, 512] = paged_attention(%q, %kp, %vp, %bt, %len) {scale=0.044, heads=8, kv_heads=1}\n  return %o\n}";
    let lens: Edit = Box::new(|ins| {
        for (n, t) in ins.iter_mut() {
            match n.as_str() {
                "len" => *t = Tensor::new(DType::I32, &[3], vec![32.0, 289.0, 1.0]).unwrap(),
                "bt" => *t = Tensor::new(DType::I32, &[3, 19], (0..57).map(|i| ((i * 7 + 3) % 60) as f64).collect()).unwrap(),
                _ => {}
            }
        }
    });
    cases.push(Case::new("paged_attention bf16 D512 GQA 8/1 lengths 32/289/1", src, &[], 311, 1.0, lens));
    cases
}

/// The HF-mask graphs and the wide attentions on the GPU against the interpreter, unfused and
/// fused.
#[test]
fn gpu_attention_extremes_match_the_interpreter() {
    let Some(dev) = device() else { return };
    let mut fails = Vec::new();
    for c in hf_cases().into_iter().chain(wide_cases()) {
        fails.extend(case(&dev, &c.name, &c.src, &c.syms, c.seed, c.widen, &c.edit));
    }
    assert!(fails.is_empty(), "{} GPU case failures:\n{}", fails.len(), fails.join("\n"));
}

/// Without a GPU: the passes turn the HF graph into one attention kernel whose mask is the
/// mask input itself (not rescaled), the interpreter gives the mean of V for the fully masked
/// rows of the kernel graph, and every kernel of both lowerings compiles for sm_80 and sm_90a
/// and assembles without spills (where ptxas is found).
#[cfg(feature = "llvm")]
#[test]
fn attention_extremes_lower_and_compile() {
    use sinter::ir::{Family, OpKind};
    let g = sinter::ir::parse(&hf_graph("f32", 1, 8, 8)).unwrap();
    for target in [Target::SM_80, Target::SM_90A] {
        let (kg, _) = sinter_passes::compile(&g, &target, &sinter_passes::PassOptions::default()).unwrap();
        let attn: Vec<_> = kg.kernels.iter().filter(|(_, kd)| kd.family == Family::Attention).collect();
        assert_eq!(attn.len(), 1, "{target}: {kg:?}");
        let body = &attn[0].1.body;
        let nd = body.nodes.values().find(|nd| nd.op.kind == OpKind::Attention).unwrap();
        assert_eq!(nd.inputs.len(), 4, "{target}: a mask");
        assert!(body.params.contains(&nd.inputs[3]), "{target}: the mask is rewritten before the kernel: {body:?}");
        assert!(!body.nodes.values().any(|nd| matches!(nd.op.kind, OpKind::Mul | OpKind::Div | OpKind::Add)), "{target}: {body:?}");
        // The kernel graph on the interpreter: rows 4–7 are the mean of V.
        let b = Bindings::new();
        let mut ins = inputs_for(&g, &b, 301, 7);
        hf_mask(8, 4, f64::from(f32::MIN))(&mut ins);
        let refs: Vec<&Tensor> = ins.iter().map(|(_, t)| t).collect();
        let out = sinter::ir::interp::run_kernel_graph(&kg, &refs, &b).unwrap();
        let v = ins[2].1.data();
        for i in 4..8 {
            for e in 0..8 {
                let mean = (0..8).map(|j| v[j * 8 + e]).sum::<f64>() / 8.0;
                assert!((out[0].data()[i * 8 + e] - mean).abs() < 1e-5, "{target}: row {i}: {} vs {mean}", out[0].data()[i * 8 + e]);
            }
        }
    }
    let ptxas = sinter_codegen::ptxas::find_ptxas_for_tests().unwrap();
    for c in hf_cases().into_iter().chain(wide_cases()) {
        let g = sinter::ir::parse(&c.src).unwrap();
        for lowering in [Lowering::Unfused, Lowering::Fused] {
            for target in [Target::SM_80, Target::SM_90A] {
                let kg = sinter::gpu::lower(&g, lowering, &target).unwrap_or_else(|e| panic!("{} [{lowering:?}]: {e}", c.name));
                for k in kg.kernels.keys() {
                    let plan = sinter_codegen::compile_kernel(&kg, k, &target).unwrap_or_else(|e| panic!("{} [{lowering:?}] {k} {target}: {e}", c.name));
                    if let Some(ptxas) = &ptxas {
                        let r = sinter_codegen::ptxas::assemble_with(ptxas, &plan.ptx, &target).unwrap_or_else(|e| panic!("{} [{lowering:?}] {k} {target}: {e}", c.name));
                        assert!(!r.functions.iter().any(|f| f.spills()), "{} [{lowering:?}] {k} {target}: spills: {r:?}", c.name);
                    }
                }
            }
        }
    }
}
