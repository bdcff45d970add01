//! GPU runs of inputs a test suite rarely tries: zero-sized tensors in every kernel family
//! (constant and symbolic dims bound to 0), a KV page read before an in-place append, against
//! the interpreter under both lowerings, with guard-checked outputs (`SINTER_POISON=1`).

use sinter::Tensor;

use super::{case, device, none, specials, Case};

/// Graphs with an empty axis somewhere, one per family, and the paged read-before-append.
pub(crate) fn adversarial_cases() -> Vec<Case> {
    let mut cases = vec![];
    // Attention in the bshd layout with batch 0 (constant and symbolic).
    for b in ["0", "B"] {
        let src = format!(
            "func @main(%q: f16[{b}, 3952, 10, 64], %k: f16[{b}, 16, 10, 64], %v: f16[{b}, 16, 10, 64]) {{
  %qt: f16[{b}, 10, 3952, 64] = transpose(%q) {{dim0=1, dim1=2}}
  %kt: f16[{b}, 10, 16, 64] = transpose(%k) {{dim0=1, dim1=2}}
  %vt: f16[{b}, 10, 16, 64] = transpose(%v) {{dim0=1, dim1=2}}
  %o: f16[{b}, 10, 3952, 64] = attention(%qt, %kt, %vt) {{scale=0.125, causal=false, heads=10, kv_heads=10}}
  %ot: f16[{b}, 3952, 10, 64] = transpose(%o) {{dim0=1, dim1=2}}
  return %ot
}}"
        );
        cases.push(Case::new(format!("attention bshd, batch {b} = 0"), src, &[("B", 0)], 31, 1.0, Box::new(none)));
    }
    // Attention with no keys: every row fully masked gives 0.
    cases.push(Case::new(
        "attention with 0 keys",
        "func @main(%q: bf16[2, 4, 9, 64], %k: bf16[2, 4, S, 64], %v: bf16[2, 4, S, 64]) {\n  %o: bf16[2, 4, 9, 64] = attention(%q, %k, %v) {scale=0.125, causal=false, heads=4, kv_heads=4}\n  return %o\n}",
        &[("S", 0)],
        32,
        1.0,
        Box::new(none),
    ));
    // Matmul with M = 0 and with K = 0 (a sum of nothing: zeros).
    cases.push(Case::new("matmul M = 0", "func @main(%a: bf16[M, 64], %w: bf16[32, 64]) {\n  %y: bf16[M, 32] = matmul(%a, %w) {transpose_b=true}\n  return %y\n}", &[("M", 0)], 33, 1.0, Box::new(none)));
    cases.push(Case::new("matmul K = 0", "func @main(%a: f32[5, K], %w: f32[K, 7]) {\n  %y: f32[5, 7] = matmul(%a, %w)\n  return %y\n}", &[("K", 0)], 34, 1.0, Box::new(none)));
    // Rows: no rows, and rows of length 0 (a sum of nothing is 0).
    cases.push(Case::new("softmax over 0 rows", "func @main(%x: f32[R, 128]) {\n  %y: f32[R, 128] = softmax(%x) {axis=-1}\n  return %y\n}", &[("R", 0)], 35, 1.0, Box::new(none)));
    cases.push(Case::new("reduce_sum of empty rows", "func @main(%x: f32[4, N]) {\n  %y: f32[4, 1] = reduce_sum(%x) {axis=-1}\n  return %y\n}", &[("N", 0)], 36, 1.0, Box::new(none)));
    cases.push(Case::new("rms_norm over 0 rows", "func @main(%x: bf16[T, 576], %w: bf16[576]) {\n  %y: bf16[T, 576] = rms_norm(%x, %w) {eps=1e-5}\n  return %y\n}", &[("T", 0)], 37, 1.0, Box::new(none)));
    // Pointwise, layout and gather with an empty axis.
    cases.push(Case::new("pointwise over 0 elements", "func @main(%x: f32[N, 5], %b: f32[5]) {\n  %y: f32[N, 5] = add(%x, %b)\n  %z: f32[N, 5] = exp(%y)\n  return %z\n}", &[("N", 0)], 38, 1.0, Box::new(none)));
    cases.push(Case::new("transpose of an empty tensor", "func @main(%x: f32[3, N, 7]) {\n  %t: f32[3, 7, N] = transpose(%x) {dim0=1, dim1=2}\n  return %t\n}", &[("N", 0)], 39, 1.0, Box::new(none)));
    cases.push(Case::new("gather of 0 indices", "func @main(%table: bf16[7, 64], %idx: i64[T]) {\n  %y: bf16[T, 64] = gather(%table, %idx)\n  return %y\n}", &[("T", 0)], 40, 1.0, Box::new(none)));
    // Paged cache: an append of 0 tokens, and attention over a batch of 0 sequences.
    cases.push(Case::new(
        "kv_append of 0 tokens + paged_attention",
        "func @main(%kp: bf16[4, 16, 2, 64], %vp: bf16[4, 16, 2, 64], %kn: bf16[1, T, 2, 64], %vn: bf16[1, T, 2, 64], %bt: i32[1, 4], %pos: i32[1], %q: bf16[1, 8, 1, 64]) {\n  %k2: bf16[4, 16, 2, 64], %v2: bf16[4, 16, 2, 64] = kv_append(%kp, %vp, %kn, %vn, %bt, %pos)\n  %o: bf16[1, 8, 1, 64] = paged_attention(%q, %k2, %v2, %bt, %pos) {scale=0.125, heads=8, kv_heads=2}\n  return %o, %k2\n}",
        &[("T", 0)],
        41,
        1.0,
        Box::new(|ins: &mut Vec<(String, Tensor)>| {
            ins[4].1 = Tensor::new(sinter::DType::I32, &[1, 4], vec![0.0, 1.0, 2.0, 3.0]).unwrap();
            ins[5].1 = Tensor::new(sinter::DType::I32, &[1], vec![20.0]).unwrap();
        }),
    ));
    cases.push(Case::new(
        "paged_attention over 0 sequences",
        "func @main(%q: bf16[B, 8, 1, 64], %kp: bf16[4, 16, 2, 64], %vp: bf16[4, 16, 2, 64], %bt: i32[B, 4], %len: i32[B]) {\n  %o: bf16[B, 8, 1, 64] = paged_attention(%q, %kp, %vp, %bt, %len) {scale=0.125, heads=8, kv_heads=2}\n  return %o\n}",
        &[("B", 0)],
        42,
        1.0,
        Box::new(none),
    ));
    // argmax: ties, −inf, +inf before a NaN (the NaN wins), a logits-sized row.
    cases.push(Case::new(
        "argmax f32 with ties, ±inf and NaN",
        "func @main(%x: f32[5, 1000]) {\n  %y: i64[5] = argmax(%x) {axis=-1, keepdim=false}\n  return %y\n}",
        &[],
        44,
        1.0,
        Box::new(specials("x", &[(3, 7.0), (9, 7.0), (1010, f64::INFINITY), (1500, f64::NAN), (1501, f64::NAN), (2999, f64::NEG_INFINITY), (3000, 9.0), (3999, 9.0)])),
    ));
    cases.push(Case::new("argmax bf16 over a 49152 vocabulary", "func @main(%x: bf16[3, 49152]) {\n  %y: i64[3, 1] = argmax(%x) {axis=-1}\n  return %y\n}", &[], 45, 1.0, Box::new(none)));
    // A page read before an in-place append into it (the sum must see the old page).
    cases.push(Case::new(
        "page read before an in-place kv_append",
        crate::adversarial::READ_BEFORE_APPEND,
        &[],
        43,
        1.0,
        Box::new(|ins: &mut Vec<(String, Tensor)>| {
            let fixed = crate::adversarial::read_before_append_inputs();
            for (slot, t) in ins.iter_mut().zip(fixed) {
                slot.1 = t;
            }
        }),
    ));
    cases
}

#[test]
fn gpu_adversarial_cases_match_the_interpreter() {
    let Some(dev) = device() else { return };
    let mut fails = Vec::new();
    for c in adversarial_cases() {
        fails.extend(case(&dev, &c.name, &c.src, &c.syms, c.seed, c.widen, &c.edit));
    }
    assert!(fails.is_empty(), "{} GPU case failures:\n{}", fails.len(), fails.join("\n"));
}

/// Without a GPU: every kernel of every adversarial case compiles under both lowerings.
#[cfg(feature = "llvm")]
#[test]
fn adversarial_cases_compile_for_sm_90a_and_sm_80() {
    use sinter::gpu::Lowering;
    let mut fails = Vec::new();
    for c in adversarial_cases() {
        let g = sinter::ir::parse(&c.src).unwrap_or_else(|e| panic!("{}: {e}", c.name));
        for target in [sinter::Target::SM_90A, sinter::Target::SM_80] {
            for lowering in [Lowering::Unfused, Lowering::Fused] {
                let kg = match sinter::gpu::lower(&g, lowering, &target) {
                    Ok(kg) => kg,
                    Err(e) => {
                        fails.push(format!("{} [{lowering:?} {target}]: lower: {e}", c.name));
                        continue;
                    }
                };
                for k in kg.kernels.keys() {
                    if let Err(e) = sinter_codegen::compile_kernel(&kg, k, &target) {
                        fails.push(format!("{} [{lowering:?} {target}] {k} {:?}: {e}", c.name, kg.kernels[k].family));
                    }
                }
            }
        }
    }
    assert!(fails.is_empty(), "{}", fails.join("\n"));
}
