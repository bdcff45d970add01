//! FP8 in the passes: on sm_90a, `matmul(dequantize_fp8(a8, sa), dequantize_fp8(b8, sb))` and
//! `attention` of dequantised q, k, v are one kernel each whose inputs are the fp8 tensors and
//! the scales — also when the fp8 activations and their scale are computed by earlier kernels
//! — where the layouts allow it, and the dequantised operands are written to buffers where they
//! do not (and on every other target); the passes never introduce fp8 where the user did not
//! write it.

mod common;

use sinter_ir::interp::{self, run_kernel_graph, Tensor};
use sinter_ir::{Bindings, DType, Family, KernelGraph, OpKind};
use sinter_passes::check::compare;
use sinter_ir::contract::{self, fp8_attention, fp8_matmul};
use sinter_passes::{compile, PassOptions, Target};

/// Compiles `src` for sm_90a ([`compile_checked_for`]).
fn compile_checked(src: &str) -> KernelGraph {
    compile_checked_for(src, &Target::SM_90A)
}

/// Compiles `src` for `target`, checks every kernel against the contract and the kernel graph
/// against the reference (symbols at 5).
fn compile_checked_for(src: &str, target: &Target) -> KernelGraph {
    let g = sinter_ir::parse(src).unwrap_or_else(|e| panic!("{e}\n{src}"));
    let (kg, _) = compile(&g, target, &PassOptions::default()).unwrap_or_else(|e| panic!("{e}"));
    for (k, kd) in kg.kernels.iter() {
        contract::check(kd, target).unwrap_or_else(|e| panic!("{target}: {k} ({:?}) breaks the contract: {e}", kd.family));
    }
    let f = g.entry().unwrap();
    let b: Bindings = common::sizes(f, 5);
    let ins = common::inputs(f, &b, 11, common::Variant::Random);
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(&g, &f.name, &refs, &b).unwrap();
    let got = run_kernel_graph(&kg, &refs, &b).unwrap();
    for (w, o) in want.iter().zip(&got) {
        compare(w, o, false).unwrap();
    }
    kg
}

/// The input buffers' types of the one kernel of `family`, printed.
fn inputs_of(kg: &KernelGraph, family: Family) -> Vec<String> {
    let mut ks = kg.kernels.values().filter(|k| k.family == family);
    let k = ks.next().unwrap_or_else(|| panic!("no {family:?} kernel"));
    assert!(ks.next().is_none(), "one {family:?} kernel");
    let mut tys: Vec<String> = k.inputs.iter().map(|&b| kg.buffers[b].ty.to_string()).collect();
    tys.sort();
    tys
}

#[test]
fn an_fp8_matmul_reads_the_fp8_bytes_and_the_scales() {
    let src = "func @f(%x8: f8e4m3[T, 64], %sx: f32[], %w8: f8e4m3[32, 64], %sw: f32[]) {
  %x: bf16[T, 64] = dequantize_fp8(%x8, %sx) {dtype=bf16}
  %w: bf16[32, 64] = dequantize_fp8(%w8, %sw) {dtype=bf16}
  %y: bf16[T, 32] = matmul(%x, %w) {transpose_b=true}
  return %y
}";
    let kg = compile_checked(src);
    assert_eq!(kg.kernels.len(), 1);
    assert_eq!(inputs_of(&kg, Family::Matmul), ["f32[]", "f32[]", "f8e4m3[32, 64]", "f8e4m3[T, 64]"]);
    let body = &kg.kernels.values().next().unwrap().body;
    let (mm, _) = body.nodes.iter().find(|(_, n)| n.op.kind == OpKind::Matmul).unwrap();
    assert!(fp8_matmul(body, mm, &Target::SM_90A));
}

#[test]
fn dynamic_per_tensor_scaling_feeds_the_fp8_matmul_from_earlier_kernels() {
    // The activation scale is amax(|x|)/448, computed on the device; x8 is written by one
    // kernel, the scale by another, and the matmul reads both as buffers.
    let src = "func @f(%x: f32[T, 64], %w8: f8e4m3[32, 64], %sw: f32[]) {
  %ax: f32[T, 64] = abs(%x)
  %m1: f32[T] = reduce_max(%ax) {keepdim=false}
  %m: f32[] = reduce_max(%m1) {keepdim=false}
  %c: f32[] = constant() {value=448.0, dtype=f32}
  %sx: f32[] = div(%m, %c)
  %x8: f8e4m3[T, 64] = quantize_fp8(%x, %sx)
  %xd: f32[T, 64] = dequantize_fp8(%x8, %sx) {dtype=f32}
  %wd: f32[32, 64] = dequantize_fp8(%w8, %sw) {dtype=f32}
  %y: f32[T, 32] = matmul(%xd, %wd) {transpose_b=true}
  return %y
}";
    let kg = compile_checked(src);
    assert_eq!(inputs_of(&kg, Family::Matmul), ["f32[]", "f32[]", "f8e4m3[32, 64]", "f8e4m3[T, 64]"]);
    let quantize = kg.kernels.values().find(|k| k.body.nodes.values().any(|n| n.op.kind == OpKind::QuantizeFp8)).expect("a kernel quantizes x");
    assert!(quantize.outputs.iter().any(|&b| kg.buffers[b].ty.dtype == DType::F8E4M3), "it writes x8");
}

#[test]
fn a_matmul_result_is_quantized_in_its_own_kernel() {
    // Two fp8 projections in a row: the first matmul's result is quantized by a pointwise
    // kernel (the matmul generators store no one-byte results, so the passes never make
    // `quantize_fp8` a matmul epilogue), the second matmul reads those bytes.
    let src = "func @f(%x8: f8e4m3[T, 64], %sx: f32[], %w8: f8e4m3[64, 64], %sw: f32[], %sh: f32[], %u8: f8e4m3[32, 64], %su: f32[]) {
  %x: bf16[T, 64] = dequantize_fp8(%x8, %sx) {dtype=bf16}
  %w: bf16[64, 64] = dequantize_fp8(%w8, %sw) {dtype=bf16}
  %h: bf16[T, 64] = matmul(%x, %w) {transpose_b=true}
  %h8: f8e4m3[T, 64] = quantize_fp8(%h, %sh)
  %hd: bf16[T, 64] = dequantize_fp8(%h8, %sh) {dtype=bf16}
  %u: bf16[32, 64] = dequantize_fp8(%u8, %su) {dtype=bf16}
  %y: bf16[T, 32] = matmul(%hd, %u) {transpose_b=true}
  return %y
}";
    let kg = compile_checked(src);
    let families: Vec<Family> = kg.kernels.values().map(|k| k.family).collect();
    assert_eq!(families, [Family::Matmul, Family::Pointwise, Family::Matmul]);
    let outs = |k: &sinter_ir::KernelData| k.outputs.iter().map(|&b| kg.buffers[b].ty.to_string()).collect::<Vec<_>>();
    let ks: Vec<_> = kg.kernels.values().collect();
    assert_eq!(outs(ks[0]), ["bf16[T, 64]"]);
    assert_eq!(outs(ks[1]), ["f8e4m3[T, 64]"]);
    assert!(ks[1].body.nodes.values().any(|n| n.op.kind == OpKind::QuantizeFp8));
}

#[test]
fn other_layouts_and_mixed_operands_dequantise_into_buffers() {
    // B stored [K, N] (not K-major), and bf16 activations against an fp8 weight: the ordinary
    // GEMM reads bf16 buffers written from the fp8 tensors.
    for src in [
        "func @f(%x8: f8e4m3[T, 64], %sx: f32[], %w8: f8e4m3[64, 32], %sw: f32[]) {
  %x: bf16[T, 64] = dequantize_fp8(%x8, %sx) {dtype=bf16}
  %w: bf16[64, 32] = dequantize_fp8(%w8, %sw) {dtype=bf16}
  %y: bf16[T, 32] = matmul(%x, %w)
  return %y
}",
        "func @f(%x: bf16[T, 64], %w8: f8e4m3[32, 64], %sw: f32[]) {
  %w: bf16[32, 64] = dequantize_fp8(%w8, %sw) {dtype=bf16}
  %y: bf16[T, 32] = matmul(%x, %w) {transpose_b=true}
  return %y
}",
    ] {
        let kg = compile_checked(src);
        assert!(inputs_of(&kg, Family::Matmul).iter().all(|t| t.starts_with("bf16")), "{src}");
    }
}

#[test]
fn an_fp8_attention_reads_the_fp8_bytes_and_the_scales() {
    let src = "func @f(%q8: f8e4m3[1, S, 4, 64], %sq: f32[], %k8: f8e4m3[1, S, 2, 64], %sk: f32[], %w8: f8e4m3[1, S, 2, 64], %sw: f32[]) {
  %q: f16[1, S, 4, 64] = dequantize_fp8(%q8, %sq) {dtype=f16}
  %k: f16[1, S, 2, 64] = dequantize_fp8(%k8, %sk) {dtype=f16}
  %v: f16[1, S, 2, 64] = dequantize_fp8(%w8, %sw) {dtype=f16}
  %o: f16[1, S, 4, 64] = attention(%q, %k, %v) {scale=0.25, causal=true, heads=4, kv_heads=2, layout=\"bshd\"}
  return %o
}";
    let kg = compile_checked(src);
    assert_eq!(kg.kernels.len(), 1);
    let tys = inputs_of(&kg, Family::Attention);
    assert_eq!(tys.iter().filter(|t| t.starts_with("f8e4m3")).count(), 3, "{tys:?}");
    assert_eq!(tys.iter().filter(|t| *t == "f32[]").count(), 3, "{tys:?}");
    let body = &kg.kernels.values().next().unwrap().body;
    let (n, _) = body.nodes.iter().find(|(_, n)| n.op.kind == OpKind::Attention).unwrap();
    assert!(fp8_attention(body, n, &Target::SM_90A));
}

/// An fp8 attention outside the fp8 kernel's limits (head dim 16; an additive mask) is not
/// formed as one: its operands are dequantised into buffers and a plain attention reads them.
#[test]
fn an_fp8_attention_the_kernel_does_not_take_dequantises_into_buffers() {
    for (d, mask) in [(16, false), (64, true)] {
        let (mp, ma) = if mask { (", %m: f16[S, S]", ", %m") } else { ("", "") };
        let src = format!(
            "func @f(%q8: f8e4m3[1, S, 4, {d}], %sq: f32[], %k8: f8e4m3[1, S, 2, {d}], %sk: f32[], %w8: f8e4m3[1, S, 2, {d}], %sw: f32[]{mp}) {{
  %q: f16[1, S, 4, {d}] = dequantize_fp8(%q8, %sq) {{dtype=f16}}
  %k: f16[1, S, 2, {d}] = dequantize_fp8(%k8, %sk) {{dtype=f16}}
  %v: f16[1, S, 2, {d}] = dequantize_fp8(%w8, %sw) {{dtype=f16}}
  %o: f16[1, S, 4, {d}] = attention(%q, %k, %v{ma}) {{scale=0.25, heads=4, kv_heads=2, layout=\"bshd\"}}
  return %o
}}"
        );
        let kg = compile_checked(&src);
        let tys = inputs_of(&kg, Family::Attention);
        assert!(tys.iter().all(|t| !t.starts_with("f8e4m3")), "{d} {mask}: {tys:?}");
    }
}

#[test]
fn the_passes_introduce_no_fp8() {
    // Every file test that does not mention f8e4m3 compiles to a kernel graph without an
    // f8e4m3 buffer or value: fp8 appears only where the user wrote it.
    let mut checked = 0;
    for (path, src) in common::corpus() {
        if src.contains("f8e4m3") {
            continue;
        }
        let g = common::load(&path, &src);
        let (kg, _) = compile(&g, &Target::SM_90A, &PassOptions::default()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(kg.buffers.values().all(|b| !b.ty.dtype.is_fp8()), "{}: an f8e4m3 buffer", path.display());
        for kd in kg.kernels.values() {
            assert!(kd.body.values.values().all(|v| !v.ty.dtype.is_fp8()), "{}: an f8e4m3 value", path.display());
        }
        checked += 1;
    }
    assert!(checked >= 25, "{checked} files");
}

/// The families of `kg`'s kernels, in launch order.
fn families(kg: &KernelGraph) -> Vec<Family> {
    kg.kernels.values().map(|k| k.family).collect()
}

#[test]
fn an_fp8_matmul_is_one_kernel_on_sm_90a_and_a_bf16_gemm_elsewhere() {
    let src = "func @f(%a8: f8e4m3[T, 64], %sa: f32[], %b8: f8e4m3[32, 64], %sb: f32[]) {
  %a: bf16[T, 64] = dequantize_fp8(%a8, %sa) {dtype=bf16}
  %b: bf16[32, 64] = dequantize_fp8(%b8, %sb) {dtype=bf16}
  %y: bf16[T, 32] = matmul(%a, %b) {transpose_b=true}
  return %y
}";
    let kg = compile_checked_for(src, &Target::SM_90A);
    assert_eq!(families(&kg), [Family::Matmul]);
    assert_eq!(inputs_of(&kg, Family::Matmul), ["f32[]", "f32[]", "f8e4m3[32, 64]", "f8e4m3[T, 64]"]);
    // sm_80 and sm_90 have no e4m3 tensor-core kernel: each operand is dequantised by a kernel
    // of its own (a Layout kernel: `dequantize_fp8` is a view, recomputed by its readers, and
    // a view written to a buffer is a Layout kernel) into a bf16 buffer, which the ordinary
    // GEMM reads.
    for t in [Target::SM_80, Target::SM_90] {
        let kg = compile_checked_for(src, &t);
        assert_eq!(families(&kg), [Family::Layout, Family::Layout, Family::Matmul], "{t}");
        assert_eq!(inputs_of(&kg, Family::Matmul), ["bf16[32, 64]", "bf16[T, 64]"], "{t}");
        assert!(kg.kernels.values().filter(|k| k.family == Family::Layout).all(|k| k.body.nodes.values().any(|n| n.op.kind == OpKind::DequantizeFp8)));
    }
}

#[test]
fn an_fp8_attention_is_one_kernel_on_sm_90a_only() {
    let src = "func @f(%q8: f8e4m3[1, S, 4, 64], %sq: f32[], %k8: f8e4m3[1, S, 2, 64], %sk: f32[], %w8: f8e4m3[1, S, 2, 64], %sw: f32[]) {
  %q: bf16[1, S, 4, 64] = dequantize_fp8(%q8, %sq) {dtype=bf16}
  %k: bf16[1, S, 2, 64] = dequantize_fp8(%k8, %sk) {dtype=bf16}
  %v: bf16[1, S, 2, 64] = dequantize_fp8(%w8, %sw) {dtype=bf16}
  %o: bf16[1, S, 4, 64] = attention(%q, %k, %v) {scale=0.125, causal=true, heads=4, kv_heads=2, layout=\"bshd\"}
  return %o
}";
    assert_eq!(families(&compile_checked_for(src, &Target::SM_90A)), [Family::Attention]);
    for t in [Target::SM_80, Target::SM_90] {
        let kg = compile_checked_for(src, &t);
        let fams = families(&kg);
        assert_eq!(fams.iter().filter(|&&f| f == Family::Attention).count(), 1, "{t}: {fams:?}");
        assert!(inputs_of(&kg, Family::Attention).iter().all(|ty| ty.starts_with("bf16")), "{t}");
        assert!(kg.buffers.values().filter(|b| b.ty.dtype.is_fp8()).all(|b| b.role == sinter_ir::BufferRole::Input), "{t}: fp8 only in the inputs");
    }
}
