//! The passes within the kernel contract (`sinter_ir::contract`): every kernel they form is
//! one the code generator takes for the target, and a kernel outside the rules is split.

use sinter_ir::contract::check;
use sinter_ir::interp::{self, run_kernel_graph, Tensor};
use sinter_ir::{Bindings, Family, Graph, KernelGraph, OpKind, Target};
use sinter_passes::{compile, PassOptions};

fn refused(kg: &KernelGraph) -> Vec<String> {
    kg.kernels.iter().filter_map(|(k, kd)| check(kd, &Target::SM_90A).err().map(|e| format!("{k} ({:?}): {e}", kd.family))).collect()
}

/// Compiles `src` with and without the contract; checks the contract holds with it and the
/// fused graph matches the reference (T = 5).
fn compile_both(src: &str) -> (KernelGraph, KernelGraph) {
    let g: Graph = sinter_ir::parse(src).unwrap();
    let (kg, _) = compile(&g, &Target::SM_90A, &PassOptions::default()).unwrap();
    assert_eq!(refused(&kg), Vec::<String>::new());
    let f = g.entry().unwrap();
    let b: Bindings = [("T".to_string(), 5)].into_iter().collect();
    let ins: Vec<Tensor> = f
        .params
        .iter()
        .map(|&p| {
            let ty = f.ty(p);
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.eval(&b).unwrap() as usize).collect();
            Tensor::from_fn(ty.dtype, &shape, |i| ((i.iter().sum::<usize>() * 7 + 3) % 11) as f64 / 11.0 - 0.4)
        })
        .collect();
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(&g, &f.name, &refs, &b).unwrap();
    let got = run_kernel_graph(&kg, &refs, &b).unwrap();
    for (w, o) in want.iter().zip(&got) {
        sinter_passes::check::compare(w, o, false).unwrap();
    }
    let (free, _) = compile(&g, &Target::SM_90A, &PassOptions { codegen_contract: false, ..PassOptions::default() }).unwrap();
    (kg, free)
}

#[test]
fn merged_projection_with_rope_and_attention_stays_within_the_contract() {
    // A QKV projection whose column slices are reshaped, RoPE'd and fed to attention: the
    // slices and RoPE join the matmul's columns epilogue (which writes Q and K roped and V
    // as three outputs), attention reads them through reshapes and writes its output
    // through one: two kernels, both within the contract.
    let src = "func @main(%x: f32[T, 16], %w: f32[32, 16], %pos: i32[T]) {
  %qkv: f32[T, 32] = matmul(%x, %w) {transpose_b=true}
  %q: f32[T, 16] = slice(%qkv) {start=0, end=16}
  %k: f32[T, 8] = slice(%qkv) {start=16, end=24}
  %v: f32[T, 8] = slice(%qkv) {start=24, end=32}
  %q3: f32[T, 2, 8] = reshape(%q) {shape=[T, 2, 8]}
  %k3: f32[T, 1, 8] = reshape(%k) {shape=[T, 1, 8]}
  %p: i32[T, 1] = reshape(%pos) {shape=[T, 1]}
  %qr: f32[T, 2, 8] = rope(%q3, %p) {theta=10000.0}
  %kr: f32[T, 1, 8] = rope(%k3, %p) {theta=10000.0}
  %q4: f32[1, T, 2, 8] = reshape(%qr) {shape=[1, T, 2, 8]}
  %k4: f32[1, T, 1, 8] = reshape(%kr) {shape=[1, T, 1, 8]}
  %v4: f32[1, T, 1, 8] = reshape(%v) {shape=[1, T, 1, 8]}
  %o: f32[1, T, 2, 8] = attention(%q4, %k4, %v4) {scale=0.35, causal=true, heads=2, kv_heads=1, layout=\"bshd\"}
  %o2: f32[T, 16] = reshape(%o) {shape=[T, 16]}
  return %o2
}";
    let (kg, _) = compile_both(src);
    let fams: Vec<Family> = kg.kernels.values().map(|k| k.family).collect();
    assert_eq!(fams, [Family::Matmul, Family::Attention], "{fams:?}");
    let mm = kg.kernels.values().find(|k| k.family == Family::Matmul).unwrap();
    assert_eq!(mm.outputs.len(), 3);
    assert_eq!(mm.body.nodes.values().filter(|n| n.op.kind == OpKind::Rope).count(), 2);
}

#[test]
fn a_kernel_outside_the_contract_is_split() {
    // `e` and `f` fuse into one Pointwise DAG with `s`, but `f` is also an output of
    // another shape: the kernel would write [T, 8] and [8]; it is split.
    let src = "func @main(%x: f32[T, 8], %w: f32[8]) {
  %e: f32[T, 8] = exp(%x)
  %f: f32[8] = tanh(%w)
  %s: f32[T, 8] = add(%e, %f)
  return %s, %f
}";
    let (kg, free) = compile_both(src);
    assert!(!refused(&free).is_empty());
    assert_eq!((free.kernels.len(), kg.kernels.len()), (1, 3), "one kernel per node once split");
}
