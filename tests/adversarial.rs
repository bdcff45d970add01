//! Regression tests for inputs a test suite rarely tries (finite "minus infinity" masks, empty
//! batches, reads before an in-place append, explicit cast chains, kernels the generator
//! refuses), on the CPU: each graph as written on the interpreter against its fused and unfused
//! kernel graphs on the kernel-graph interpreter, which keeps the device's storage rules (an
//! in-place `kv_append` result shares its pages' storage). The GPU runs of the same graphs are
//! in `gpu::adversarial`.

use sinter_ir::interp::{self, run_kernel_graph, Tensor};
use sinter_ir::{Bindings, DType, Family, KernelGraph};
use sinter_passes::{compile, lower_unfused, PassOptions, Target};

/// A read of a KV page (its sum of squares), an in-place `kv_append` into that page, then
/// `paged_attention` over the cache: one sequence growing from 2 to 3 keys, page size 4, one
/// head, D 2, f32. The sum must see the page before the append, the attention after it
/// (written after the append, so that the order of the text does not save it).
pub(crate) const READ_BEFORE_APPEND: &str = "func @main(%kp: f32[2, 4, 1, 2], %vp: f32[2, 4, 1, 2], %kn: f32[1, 1, 1, 2], %vn: f32[1, 1, 1, 2], %bt: i32[1, 2], %pos: i32[1], %q: f32[1, 1, 1, 2]) {
  %k2: f32[2, 4, 1, 2], %v2: f32[2, 4, 1, 2] = kv_append(%kp, %vp, %kn, %vn, %bt, %pos)
  %page: f32[1, 4, 1, 2] = slice(%kp) {axis=0, start=0, end=1}
  %sq: f32[1, 4, 1, 2] = mul(%page, %page)
  %flat: f32[1, 8] = reshape(%sq) {shape=[1, 8]}
  %ss: f32[1, 1] = reduce_sum(%flat) {axis=-1}
  %one: i32[] = constant() {value=1.0, dtype=i32}
  %len: i32[1] = add(%pos, %one)
  %o: f32[1, 1, 1, 2] = paged_attention(%q, %k2, %v2, %bt, %len) {scale=0.7071, heads=1, kv_heads=1}
  return %ss, %o
}";

/// The inputs of [`READ_BEFORE_APPEND`]: two keys in page 0 (the third slot, where the new
/// key goes, holds 5s: a stale value the sum must count and the attention must not see).
pub(crate) fn read_before_append_inputs() -> Vec<Tensor> {
    let kp = Tensor::from_fn(DType::F32, &[2, 4, 1, 2], |i| if i[0] == 0 && i[1] == 2 { 5.0 } else { (i[0] * 8 + i[1] * 2 + i[3]) as f64 * 0.25 - 0.5 });
    let vp = Tensor::from_fn(DType::F32, &[2, 4, 1, 2], |i| (i[1] * 2 + i[3]) as f64 * 0.5);
    let kn = Tensor::new(DType::F32, &[1, 1, 1, 2], vec![-1.0, 2.0]).unwrap();
    let vn = Tensor::new(DType::F32, &[1, 1, 1, 2], vec![3.0, -3.0]).unwrap();
    let bt = Tensor::new(DType::I32, &[1, 2], vec![0.0, 1.0]).unwrap();
    let pos = Tensor::new(DType::I32, &[1], vec![2.0]).unwrap();
    let q = Tensor::new(DType::F32, &[1, 1, 1, 2], vec![0.5, 1.0]).unwrap();
    vec![kp, vp, kn, vn, bt, pos, q]
}

/// Runs `kg` on the kernel-graph interpreter and compares every output with `want` exactly
/// (f32 graphs whose kernels compute what the graph says, in the same order).
fn assert_same(what: &str, kg: &KernelGraph, ins: &[Tensor], want: &[Tensor]) {
    let refs: Vec<&Tensor> = ins.iter().collect();
    let got = run_kernel_graph(kg, &refs, &Bindings::new()).unwrap_or_else(|e| panic!("{what}: {e}"));
    assert_eq!(got.len(), want.len(), "{what}: output count");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_eq!(g.shape(), w.shape(), "{what}: output {i} shape");
        for (j, (a, b)) in g.data().iter().zip(w.data()).enumerate() {
            assert!((a - b).abs() <= 1e-6 * b.abs().max(1.0), "{what}: output {i} element {j}: {a} vs {b}");
        }
    }
}

#[test]
fn a_page_read_before_an_in_place_append_sees_the_old_page_fused_and_unfused() {
    let g = sinter::ir::parse(READ_BEFORE_APPEND).unwrap();
    let ins = read_before_append_inputs();
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(&g, "main", &refs, &Bindings::new()).unwrap();
    // Σ of page 0's squares before the append: slots 0, 1 and the stale 5s in slot 2.
    let page0: f64 = [-0.5f64, -0.25, 0.0, 0.25, 5.0, 5.0, 1.0, 1.25].iter().map(|x| x * x).sum();
    assert!((want[0].data()[0] - page0).abs() < 1e-9, "interpreter: {} vs {page0}", want[0].data()[0]);
    let unfused = lower_unfused(&g).unwrap();
    assert_same("unfused", &unfused, &ins, &want);
    for target in [Target::SM_90A, Target::SM_80] {
        let (fused, _) = compile(&g, &target, &PassOptions::for_graph(&g)).unwrap();
        assert!(fused.kernels.values().any(|k| k.family == Family::KvAppend || k.body.nodes.values().any(|n| n.op.kind.name() == "kv_append")));
        assert_same(&format!("fused for {target}"), &fused, &ins, &want);
    }
}

#[test]
fn a_kernel_reading_pages_before_and_after_an_append_is_a_clear_error() {
    // The same page read before and after the append by one fused kernel cannot be ordered;
    // the passes say so instead of building a graph that reads the wrong pages.
    let src = "func @main(%kp: f32[2, 4, 1, 2], %vp: f32[2, 4, 1, 2], %kn: f32[1, 1, 1, 2], %vn: f32[1, 1, 1, 2], %bt: i32[1, 2], %pos: i32[1]) {
  %k2: f32[2, 4, 1, 2], %v2: f32[2, 4, 1, 2] = kv_append(%kp, %vp, %kn, %vn, %bt, %pos)
  %d: f32[2, 4, 1, 2] = sub(%k2, %kp)
  return %d
}";
    let g = sinter::ir::parse(src).unwrap();
    let ins: Vec<Tensor> = read_before_append_inputs().into_iter().take(6).collect();
    let refs: Vec<&Tensor> = ins.iter().collect();
    let want = interp::run(&g, "main", &refs, &Bindings::new()).unwrap();
    for kg in [lower_unfused(&g).map_err(|e| e.to_string()), compile(&g, &Target::SM_90A, &PassOptions::for_graph(&g)).map(|r| r.0).map_err(|e| e.to_string())] {
        match kg {
            Ok(kg) => assert_same("before and after", &kg, &ins, &want),
            Err(e) => assert!(e.contains("before a kv_append"), "{e}"),
        }
    }
}

#[test]
fn argmax_lowers_fused_and_unfused_and_matches_the_interpreter() {
    let src = "func @main(%x: f32[4, 37]) {\n  %y: i64[4] = argmax(%x) {axis=-1, keepdim=false}\n  return %y\n}";
    let g = sinter::ir::parse(src).unwrap();
    let mut data: Vec<f64> = (0..4 * 37).map(|i| ((i * 7919) % 37) as f64 - 18.0).collect();
    data[5] = f64::NAN;
    data[40] = f64::INFINITY;
    data[41] = f64::INFINITY;
    data[37 * 3 + 36] = 1e30;
    let x = Tensor::new(DType::F32, &[4, 37], data).unwrap();
    let want = interp::run(&g, "main", &[&x], &Bindings::new()).unwrap();
    assert_eq!(want[0].data(), &[5.0, 3.0, want[0].data()[2], 36.0]);
    assert_same("unfused", &lower_unfused(&g).unwrap(), std::slice::from_ref(&x), &want);
    let (fused, _) = compile(&g, &Target::SM_90A, &PassOptions::for_graph(&g)).unwrap();
    assert_same("fused", &fused, std::slice::from_ref(&x), &want);
}
