//! The logical ops and `rope`'s partial rotary dims and frequency scalings from the DSL
//! through the passes: the DSL builds them (words and attributes named as the op table
//! names them), and the fused kernel graph — RoPE in a QKV projection's epilogue — evaluated on
//! the interpreter matches the graph.

use sinter::{graph, Backend, DType, Program, Tensor};
use sinter_ir::interp::{run_entry, run_kernel_graph};
use sinter_ir::{Bindings, Family, OpKind};
use sinter_passes::{compile, PassOptions, Target};

#[test]
fn the_dsl_builds_logical_ops_and_scaled_partial_ropes() -> Result<(), Box<dyn std::error::Error>> {
    let g = graph! {
        fn main(q: f32[T, 2, 8], pos: i32[T, 1], a: bool[T, 8], b: bool[8]) -> (f32[T, 2, 8], bool[T, 8], bool[T, 8]) {
            let r = q.rope(pos, theta = 10000.0, rotary_dim = 4, scaling = "yarn", factor = 4.0, original_max_position_embeddings = 64, truncate = false);
            let m = a.logical_and(b).logical_or(a.logical_not());
            (r, m, logical_not(b.logical_or(a)))
        }
    }?;
    let text = sinter::ir::print(&g);
    for want in [
        "rope(%q, %pos) {theta=10000.0, rotary_dim=4, scaling=\"yarn\", factor=4.0, original_max_position_embeddings=64, truncate=false}",
        "logical_and(%a, %b)",
        "logical_not(%a)",
        "logical_or(",
    ] {
        assert!(text.contains(want), "{want}\n{text}");
    }
    // The same graph from the text format gives the same results on the interpreter.
    let p = Program::compile(g.clone(), Backend::Interpreter)?;
    let q = Tensor::new(
        DType::F32,
        &[2, 2, 8],
        (0..32).map(|i| (i as f64 * 0.37).sin()).collect(),
    )?;
    let pos = Tensor::new(DType::I32, &[2, 1], vec![3.0, 1000.0])?;
    let a = Tensor::new(
        DType::Bool,
        &[2, 8],
        (0..16).map(|i| f64::from(i % 3 == 0)).collect(),
    )?;
    let b = Tensor::new(
        DType::Bool,
        &[8],
        (0..8).map(|i| f64::from(i % 2 == 0)).collect(),
    )?;
    let out = p.run(
        &[("q", &q), ("pos", &pos), ("a", &a), ("b", &b)],
        &[("T", 2)],
    )?;
    let want = run_entry(
        &sinter::ir::parse(&text)?,
        &[&q, &pos, &a, &b],
        &[("T".to_string(), 2)].into_iter().collect(),
    )?;
    for (o, w) in out.iter().zip(&want) {
        assert_eq!(o.data(), w.data());
    }
    // a ∧ b ∨ ¬a = b ∨ ¬a; ¬(b ∨ a).
    for i in 0..16 {
        let (ai, bi) = (i % 3 == 0, (i % 8) % 2 == 0);
        assert_eq!(out[1].data()[i] != 0.0, bi || !ai, "m[{i}]");
        assert_eq!(out[2].data()[i] != 0.0, !(bi || ai), "n[{i}]");
    }
    // Features 4.. pass through.
    for row in 0..4 {
        assert_eq!(
            out[0].data()[row * 8 + 4..row * 8 + 8],
            q.data()[row * 8 + 4..row * 8 + 8]
        );
    }
    Ok(())
}

/// A merged QKV projection with a partial, Llama 3.1-scaled RoPE on Q and K: the passes fuse
/// the ropes into the matmul's epilogue, and the kernel graph computes what the graph does.
#[test]
fn partial_scaled_rope_fuses_into_the_qkv_epilogue() {
    let src = "func @main(%x: f32[T, 32], %w: f32[96, 32], %positions: i32[T]) {
  %m: f32[T, 96] = matmul(%x, %w) {transpose_b=true}
  %p: i32[T, 1] = reshape(%positions) {shape=[T, 1]}
  %qs: f32[T, 32] = slice(%m) {start=0, end=32}
  %q: f32[T, 2, 16] = reshape(%qs) {shape=[T, 2, 16]}
  %qr: f32[T, 2, 16] = rope(%q, %p) {theta=500000.0, rotary_dim=8, scaling=\"llama3\", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16}
  %ks: f32[T, 32] = slice(%m) {start=32, end=64}
  %k: f32[T, 2, 16] = reshape(%ks) {shape=[T, 2, 16]}
  %kr: f32[T, 2, 16] = rope(%k, %p) {theta=500000.0, rotary_dim=8, scaling=\"llama3\", factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=16}
  %v: f32[T, 32] = slice(%m) {start=64, end=96}
  return %qr, %kr, %v
}";
    let g = sinter::ir::parse(src).unwrap();
    let (kg, _) = compile(&g, &Target::SM_90A, &PassOptions::default()).unwrap();
    let mm: Vec<_> = kg
        .kernels
        .values()
        .filter(|k| k.family == Family::Matmul)
        .collect();
    assert_eq!(mm.len(), 1);
    assert_eq!(
        mm[0]
            .body
            .nodes
            .values()
            .filter(|n| n.op.kind == OpKind::Rope)
            .count(),
        2,
        "RoPE in the epilogue"
    );
    let b: Bindings = [("T".to_string(), 5)].into_iter().collect();
    let x = Tensor::new(
        DType::F32,
        &[5, 32],
        (0..160)
            .map(|i| ((i * 37 % 101) as f64 - 50.0) / 50.0)
            .collect(),
    )
    .unwrap();
    let w = Tensor::new(
        DType::F32,
        &[96, 32],
        (0..3072)
            .map(|i| ((i * 53 % 97) as f64 - 48.0) / 200.0)
            .collect(),
    )
    .unwrap();
    let pos = Tensor::new(DType::I32, &[5], vec![0.0, 7.0, 300.0, 5000.0, 65000.0]).unwrap();
    let want = run_entry(&g, &[&x, &w, &pos], &b).unwrap();
    let got = run_kernel_graph(&kg, &[&x, &w, &pos], &b).unwrap();
    for (o, r) in got.iter().zip(&want) {
        for (i, (a, e)) in o.data().iter().zip(r.data()).enumerate() {
            assert!(
                (a - e).abs() <= 1e-5 * e.abs() + 1e-6,
                "element {i}: {a} vs {e}"
            );
        }
    }
}

/// `&&`, `||` and `!` on bool tensors: `||` binds loosest, then `&&`, then the comparisons, as
/// in Rust; `!` applies to what follows it (a method call included).
#[test]
fn the_dsl_spells_logical_ops_with_operators() -> Result<(), Box<dyn std::error::Error>> {
    let g = graph! {
        fn main(i: i32[T], m: bool[T], w: bool[T]) -> (bool[T], bool[T]) {
            (i >= 1 && i < 3 || !m, !w.logical_or(m) && m)
        }
    }?;
    let text = sinter::ir::print(&g);
    assert_eq!(text.matches("logical_and(").count(), 2, "{text}");
    assert_eq!(text.matches("logical_or(").count(), 2, "{text}");
    assert_eq!(text.matches("logical_not(").count(), 2, "{text}");
    let p = Program::compile(g, Backend::Interpreter)?;
    let i = Tensor::new(DType::I32, &[6], vec![0.0, 1.0, 2.0, 3.0, 1.0, 5.0])?;
    let m = Tensor::new(DType::Bool, &[6], vec![1.0, 1.0, 0.0, 1.0, 1.0, 0.0])?;
    let w = Tensor::new(DType::Bool, &[6], vec![0.0, 0.0, 1.0, 1.0, 0.0, 0.0])?;
    let out = p.run(&[("i", &i), ("m", &m), ("w", &w)], &[])?;
    let (iv, mv, wv) = (i.data(), m.data(), w.data());
    for k in 0..6 {
        let (ik, mk, wk) = (iv[k], mv[k] != 0.0, wv[k] != 0.0);
        assert_eq!(out[0].data()[k] != 0.0, (ik >= 1.0 && ik < 3.0) || !mk, "first, {k}");
        assert_eq!(out[1].data()[k] != 0.0, !(wk || mk) && mk, "second, {k}");
    }
    Ok(())
}
