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
    // A row reduction reads a row's statistics at that row: a slice of them across rows is
    // refused (even one that keeps every row); along the row it is not.
    let across = body(
        Family::RowReduction,
        "func @k(%x: f16[2, 257]) {
  %m: f16[2] = reduce_max(%x) {keepdim=false}
  %s: f16[2] = slice(%m) {axis=0, start=0, end=2}
  return %s
}",
    );
    assert!(across.contains("another row"), "{across}");
    let along = body(
        Family::RowReduction,
        "func @k(%x: f32[4, 8]) {
  %p: f32[4, 8] = softmax(%x)
  %s: f32[4, 8] = slice(%p) {axis=1, start=0, end=8}
  return %s
}",
    );
    assert_eq!(along, "");
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

/// The attention node's rules: head dims up to [`MAX_ATTENTION_HEAD_DIM`] (of q/k and of v,
/// in both layouts, constant), rank-4 operands of one float dtype, a float mask; the paged
/// attention's head dim and index operands.
#[test]
fn attention_head_dims_and_operands() {
    let attn = |d: i64, dv: i64, layout: &str, mask: &str| {
        let (q, kv) = if layout == "bshd" { (format!("[1, 8, 4, {d}]"), format!("[1, 8, 2, {d}]")) } else { (format!("[1, 4, 8, {d}]"), format!("[1, 2, 8, {d}]")) };
        let vs = if layout == "bshd" { format!("[1, 8, 2, {dv}]") } else { format!("[1, 2, 8, {dv}]") };
        let out = if layout == "bshd" { format!("[1, 8, 4, {dv}]") } else { format!("[1, 4, 8, {dv}]") };
        let (mp, ma) = if mask.is_empty() { (String::new(), String::new()) } else { (format!(", %m: {mask}"), ", %m".to_string()) };
        kernel(
            Family::Attention,
            &format!(
                "func @k(%q: bf16{q}, %k: bf16{kv}, %v: bf16{vs}{mp}) {{
  %o: bf16{out} = attention(%q, %k, %v{ma}) {{scale=0.125, heads=4, kv_heads=2, layout=\"{layout}\"}}
  return %o
}}"
            ),
        )
    };
    for t in Target::ALL {
        for layout in ["bhsd", "bshd"] {
            let m = i64::from(MAX_ATTENTION_HEAD_DIM);
            assert_eq!(check(&attn(256, 256, layout, ""), &t), Ok(()));
            assert_eq!(check(&attn(m, m, layout, ""), &t), Ok(()));
            assert_eq!(check(&attn(64, 128, layout, "bf16[8, 8]"), &t), Ok(()));
            for (d, dv) in [(m + 128, m + 128), (m + 128, 64), (64, m + 128), (m + 1, 64)] {
                let e = check(&attn(d, dv, layout, ""), &t).unwrap_err();
                assert!(e.contains("head dim") && e.contains(&format!("1..={MAX_ATTENTION_HEAD_DIM}")), "{e}");
            }
        }
        let e = check(&attn(64, 64, "bhsd", "i32[8, 8]"), &t).unwrap_err();
        assert!(e.contains("the mask is i32[8, 8]"), "{e}");
    }
    // A symbolic head dim is refused: the kernels are built for a constant one.
    let sym = kernel(
        Family::Attention,
        "func @k(%q: f32[1, 4, 8, D], %k: f32[1, 4, 8, D], %v: f32[1, 4, 8, D]) {
  %o: f32[1, 4, 8, D] = attention(%q, %k, %v) {scale=0.125, heads=4, kv_heads=4}
  return %o
}",
    );
    assert!(check(&sym, &Target::SM_90A).unwrap_err().contains("got D"));
    let paged = |d: i64| {
        kernel(
            Family::PagedAttention,
            &format!(
                "func @k(%q: bf16[2, 8, 1, {d}], %kp: bf16[16, 16, 2, {d}], %vp: bf16[16, 16, 2, {d}], %bt: i32[2, 4], %sl: i32[2]) {{
  %o: bf16[2, 8, 1, {d}] = paged_attention(%q, %kp, %vp, %bt, %sl) {{scale=0.1, heads=8, kv_heads=2}}
  return %o
}}"
            ),
        )
    };
    assert_eq!(check(&paged(128), &Target::SM_80), Ok(()));
    let e = check(&paged(i64::from(MAX_ATTENTION_HEAD_DIM) + 1), &Target::SM_90A).unwrap_err();
    assert!(e.contains("paged_attention") && e.contains("head dim"), "{e}");
    assert!(head_dim_ok(&crate::Dim::constant(256)) && !head_dim_ok(&crate::Dim::constant(0)) && !head_dim_ok(&crate::Dim::symbol("D")));
}

/// The fp8 attention kernel's own limits: head dims 64/128, no mask, a bf16/f16 result.
#[test]
fn fp8_attention_kernel_limits() {
    let attn = |d: i64, mask: bool| {
        let (mp, ma) = if mask { (", %m: bf16[4, 4]", ", %m") } else { ("", "") };
        kernel(
            Family::Attention,
            &format!(
                "func @k(%q8: f8e4m3[1, 4, 2, {d}], %sq: f32[], %k8: f8e4m3[1, 4, 2, {d}], %sk: f32[], %v8: f8e4m3[1, 4, 2, {d}], %sv: f32[]{mp}) {{
  %q: bf16[1, 4, 2, {d}] = dequantize_fp8(%q8, %sq) {{dtype=bf16}}
  %k: bf16[1, 4, 2, {d}] = dequantize_fp8(%k8, %sk) {{dtype=bf16}}
  %v: bf16[1, 4, 2, {d}] = dequantize_fp8(%v8, %sv) {{dtype=bf16}}
  %o: bf16[1, 4, 2, {d}] = attention(%q, %k, %v{ma}) {{scale=0.125, heads=2, kv_heads=2, layout=\"bshd\"}}
  return %o
}}"
            ),
        )
    };
    assert_eq!(check(&attn(128, false), &Target::SM_90A), Ok(()));
    for kd in [attn(32, false), attn(64, true)] {
        let (n, _) = kd.body.nodes.iter().find(|(_, n)| n.op.kind == crate::OpKind::Attention).unwrap();
        assert!(!fp8_attention(&kd.body, n, &Target::SM_90A), "outside the fp8 kernel's limits");
        assert!(check(&kd, &Target::SM_90A).unwrap_err().contains("exactly one `attention`"));
        let limits = families::fp8_attention_kernel(&kd.body, &kd.body.nodes[n]).unwrap_err();
        assert!(limits.contains("64 and 128") || limits.contains("no additive mask"), "{limits}");
    }
}

/// A window and a softcap: taken by the attention and paged attention kernels (valid values
/// only: the node as the verifier checks it), refused by the fp8 attention kernel (whose
/// `dequantize_fp8`s then are not part of it).
#[test]
fn window_and_softcap() {
    let attn = |extra: &str| {
        kernel(
            Family::Attention,
            &format!(
                "func @k(%q: bf16[1, 4, 9, 64], %kk: bf16[1, 2, 9, 64], %v: bf16[1, 2, 9, 64]) {{
  %o: bf16[1, 4, 9, 64] = attention(%q, %kk, %v) {{scale=0.125, heads=4, kv_heads=2{extra}}}
  return %o
}}"
            ),
        )
    };
    let paged = |extra: &str| {
        kernel(
            Family::PagedAttention,
            &format!(
                "func @k(%q: bf16[2, 4, 1, 64], %kp: bf16[6, 16, 2, 64], %vp: bf16[6, 16, 2, 64], %bt: i32[2, 3], %sl: i32[2]) {{
  %o: bf16[2, 4, 1, 64] = paged_attention(%q, %kp, %vp, %bt, %sl) {{scale=0.125, heads=4, kv_heads=2{extra}}}
  return %o
}}"
            ),
        )
    };
    assert!(window_softcap_kernels(crate::OpKind::Attention) && window_softcap_kernels(crate::OpKind::PagedAttention));
    for extra in [", causal=true, window=1", ", softcap=50.0", ", causal=true, window=4096, softcap=30.0"] {
        assert_eq!(check(&attn(extra), &Target::SM_80), Ok(()), "{extra}");
        assert_eq!(check(&paged(extra), &Target::SM_90A), Ok(()), "{extra}");
    }
    // Values the verifier refuses are refused here too (a body built around the verifier).
    let mut bad = attn(", causal=true, window=4");
    let n = bad.body.nodes.keys().next().unwrap();
    let i = crate::OpKind::Attention.attr_index("causal").unwrap();
    bad.body.nodes[n].op.attrs[i] = crate::Attr::Bool(false);
    assert!(check(&bad, &Target::SM_80).unwrap_err().contains("causal=true"));
    let mut bad = paged(", softcap=1.0");
    let n = bad.body.nodes.keys().next().unwrap();
    let i = crate::OpKind::PagedAttention.attr_index("softcap").unwrap();
    bad.body.nodes[n].op.attrs[i] = crate::Attr::Float(0.0);
    assert!(check(&bad, &Target::SM_80).unwrap_err().contains("softcap"));
    // fp8: no window or softcap in the fp8 kernel.
    let fp8 = kernel(
        Family::Attention,
        "func @k(%q8: f8e4m3[1, 4, 2, 64], %sq: f32[], %k8: f8e4m3[1, 4, 2, 64], %sk: f32[], %v8: f8e4m3[1, 4, 2, 64], %sv: f32[]) {
  %q: bf16[1, 4, 2, 64] = dequantize_fp8(%q8, %sq) {dtype=bf16}
  %k: bf16[1, 4, 2, 64] = dequantize_fp8(%k8, %sk) {dtype=bf16}
  %v: bf16[1, 4, 2, 64] = dequantize_fp8(%v8, %sv) {dtype=bf16}
  %o: bf16[1, 4, 2, 64] = attention(%q, %k, %v) {scale=0.125, heads=2, kv_heads=2, layout=\"bshd\", softcap=30.0}
  return %o
}",
    );
    let (n, _) = fp8.body.nodes.iter().find(|(_, n)| n.op.kind == crate::OpKind::Attention).unwrap();
    assert!(!fp8_attention(&fp8.body, n, &Target::SM_90A));
    assert!(families::fp8_attention_kernel(&fp8.body, &fp8.body.nodes[n]).unwrap_err().contains("window or softcap"));
}

/// A norm in a matmul's prologue: `rms_norm` and `layer_norm` (through a cast) of a kernel
/// input at a constant M ≤ 16 and K ≤ 16384 are Matmul bodies; a symbolic M, a transposed A,
/// a row too long, or a norm result the kernel also writes are not.
#[test]
fn norm_prologue_bodies() {
    let body = |src: &str| {
        let g = crate::parse(src).unwrap();
        let f = g.entry().unwrap().clone();
        check(&KernelData { family: Family::Matmul, body: f, inputs: vec![], outputs: vec![] }, &Target::SM_90A).err().unwrap_or_default()
    };
    let text = |m: &str, k: i64, norm: &str, extra_out: &str| {
        format!(
            "func @k(%x: bf16[{m}, {k}], %g: bf16[{k}], %b: bf16[{k}], %w: bf16[8, {k}]) {{
  %h: bf16[{m}, {k}] = {norm} {{eps=1e-5}}
  %y: bf16[{m}, 8] = matmul(%h, %w) {{transpose_b=true}}
  return %y{extra_out}
}}"
        )
    };
    assert_eq!(body(&text("4", 576, "rms_norm(%x, %g)", "")), "");
    assert_eq!(body(&text("16", 16384, "layer_norm(%x, %g, %b)", "")), "");
    for refused in [text("T", 576, "rms_norm(%x, %g)", ""), text("4", 16392, "rms_norm(%x, %g)", ""), text("17", 576, "rms_norm(%x, %g)", ""), text("4", 576, "rms_norm(%x, %g)", ", %h")] {
        assert!(body(&refused).contains("kernel inputs"), "{refused}");
    }
    let cast = "func @k(%x: bf16[1, 64], %g: f32[64], %w: bf16[8, 64]) {
  %xf: f32[1, 64] = cast(%x) {dtype=f32}
  %n: f32[1, 64] = rms_norm(%xf, %g) {eps=1e-6}
  %h: bf16[1, 64] = cast(%n) {dtype=bf16}
  %y: bf16[1, 8] = matmul(%h, %w) {transpose_b=true}
  return %y
}";
    assert_eq!(body(cast), "");
    let g = crate::parse(cast).unwrap();
    let f = g.entry().unwrap();
    let mm = f.nodes.iter().find(|(_, n)| n.op.kind == crate::OpKind::Matmul).unwrap().0;
    assert!(norm_prologue(f, mm).is_some());
}
