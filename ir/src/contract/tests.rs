//! The contract's rules on hand-written kernel bodies.

use super::*;
use crate::{Family, KernelData};

#[test]
fn check_names_what_a_generator_refuses() {
    let body = |fam: Family, src: &str| {
        let g = crate::parse(src).unwrap();
        let f = g.entry().unwrap().clone();
        check(&KernelData { family: fam, body: f, inputs: vec![], outputs: vec![] }, &Target::SM_90A).err().unwrap_or_default()
    };
    // RoPE of the whole result is a columns epilogue (the head is the last axis); its
    // transpose is not: the epilogue reads the result at its own columns only.
    let rope = body(
        Family::Matmul,
        "func @k(%x: f32[4, 8], %w: f32[8, 8], %p: i32[4, 1]) {
  %m: f32[4, 8] = matmul(%x, %w)
  %r: f32[4, 8] = rope(%m, %p) {theta=10000.0}
  return %r
}",
    );
    assert_eq!(rope, "");
    let transposed = body(
        Family::Matmul,
        "func @k(%x: f32[4, 8], %w: f32[8, 8]) {
  %m: f32[4, 8] = matmul(%x, %w)
  %t: f32[8, 4] = transpose(%m) {dim0=0, dim1=1}
  return %t
}",
    );
    assert!(transposed.contains("transpose"), "{transposed}");
    // Views of the operands are read in place; computing one is not.
    let view = body(
        Family::Attention,
        "func @k(%q: f32[4, 2, 8]) {
  %r: f32[1, 4, 2, 8] = reshape(%q) {shape=[1, 4, 2, 8]}
  %o: f32[1, 4, 2, 8] = attention(%r, %r, %r) {scale=0.35, heads=2, kv_heads=2, layout=\"bshd\"}
  %o3: f32[4, 16] = reshape(%o) {shape=[4, 16]}
  return %o3
}",
    );
    assert_eq!(view, "");
    let computed = body(
        Family::Attention,
        "func @k(%q: f32[1, 4, 2, 8]) {
  %e: f32[1, 4, 2, 8] = exp(%q)
  %o: f32[1, 4, 2, 8] = attention(%e, %q, %q) {scale=0.35, heads=2, kv_heads=2, layout=\"bshd\"}
  return %o
}",
    );
    assert!(computed.contains("exactly one"), "{computed}");
    let shapes = body(
        Family::Pointwise,
        "func @k(%x: f32[4, 8], %y: f32[8]) {
  %a: f32[4, 8] = exp(%x)
  %b: f32[8] = exp(%y)
  return %a, %b
}",
    );
    assert!(shapes.contains("different shapes"), "{shapes}");
    // A trailing reshape is peeled: [4, 8] and reshape([4, 8]) → [32] are one shape.
    let peeled = body(
        Family::Pointwise,
        "func @k(%x: f32[4, 8]) {
  %a: f32[4, 8] = exp(%x)
  %b: f32[32] = reshape(%a) {shape=[32]}
  return %a, %b
}",
    );
    assert_eq!(peeled, "");
}

fn kernel(family: Family, src: &str) -> KernelData {
    let g = crate::parse(src).unwrap();
    KernelData { family, body: g.entry().unwrap().clone(), inputs: vec![], outputs: vec![] }
}

#[test]
fn fp8_kernels_are_accepted_on_sm_90a_only() {
    let mm = kernel(
        Family::Matmul,
        "func @k(%a8: f8e4m3[16, 64], %sa: f32[], %b8: f8e4m3[32, 64], %sb: f32[]) {
  %a: bf16[16, 64] = dequantize_fp8(%a8, %sa) {dtype=bf16}
  %b: bf16[32, 64] = dequantize_fp8(%b8, %sb) {dtype=bf16}
  %y: bf16[16, 32] = matmul(%a, %b) {transpose_b=true}
  return %y
}",
    );
    let attn = kernel(
        Family::Attention,
        "func @k(%q8: f8e4m3[1, 4, 2, 64], %sq: f32[], %k8: f8e4m3[1, 4, 2, 64], %sk: f32[], %v8: f8e4m3[1, 4, 2, 64], %sv: f32[]) {
  %q: bf16[1, 4, 2, 64] = dequantize_fp8(%q8, %sq) {dtype=bf16}
  %k: bf16[1, 4, 2, 64] = dequantize_fp8(%k8, %sk) {dtype=bf16}
  %v: bf16[1, 4, 2, 64] = dequantize_fp8(%v8, %sv) {dtype=bf16}
  %o: bf16[1, 4, 2, 64] = attention(%q, %k, %v) {scale=0.125, heads=2, kv_heads=2, layout=\"bshd\"}
  return %o
}",
    );
    for kd in [&mm, &attn] {
        assert_eq!(check(kd, &Target::SM_90A), Ok(()));
        for t in [Target::SM_80, Target::SM_90] {
            let e = check(kd, &t).unwrap_err();
            assert!(e.contains("sm_90a only") && e.contains(t.name()), "{e}");
        }
    }
    let (n, _) = mm.body.nodes.iter().find(|(_, n)| n.op.kind == crate::OpKind::Matmul).unwrap();
    assert!(fp8_matmul(&mm.body, n, &Target::SM_90A) && !fp8_matmul(&mm.body, n, &Target::SM_80));
    assert!(fp8_matmul_form(&mm.body, n, &|v| is_param(&mm.body, v)));
}

#[test]
fn fp8_where_no_generator_reads_it_is_refused() {
    // A matmul whose epilogue quantizes its result: the quantization is a pointwise kernel.
    let quantized = kernel(
        Family::Matmul,
        "func @k(%a: bf16[16, 64], %b: bf16[32, 64], %s: f32[]) {
  %y: bf16[16, 32] = matmul(%a, %b) {transpose_b=true}
  %q: f8e4m3[16, 32] = quantize_fp8(%y, %s)
  return %q
}",
    );
    for t in Target::ALL {
        let e = check(&quantized, &t).unwrap_err();
        assert!(e.starts_with("f8e4m3 in a matmul epilogue"), "{e}");
    }
}
