//! Errors: each names the function, the node and the op, and none panics.

use super::*;
use crate::interp::Site;

fn bind(pairs: &[(&str, i64)]) -> Bindings {
    pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

#[test]
fn integer_division_by_zero_is_an_error() {
    let src = "func @main(%a: i32[3], %b: i32[3]) {\n  %q: i32[3] = div(%a, %b)\n  return %q\n}";
    let e = eval_err(src, &[&t(DType::I32, &[3], vec![1.0, 2.0, 3.0]), &t(DType::I32, &[3], vec![1.0, 0.0, 1.0])], &Bindings::new());
    assert!(matches!(&e, InterpError::DivisionByZero { index: 1, .. }), "{e:?}");
    assert_eq!(e.to_string(), "in @main, n0 `div`: integer division by zero (element 1 of the result)");
    // Float division by zero follows IEEE.
    let src = "func @main(%a: f32[2], %b: f32[2]) {\n  %q: f32[2] = div(%a, %b)\n  return %q\n}";
    let q = eval1(src, &[&t(DType::F32, &[2], vec![1.0, 0.0]), &t(DType::F32, &[2], vec![0.0, 0.0])]);
    assert!(q.data()[0] == f64::INFINITY && q.data()[1].is_nan());
}

#[test]
fn gather_out_of_range_is_an_error() {
    let src = "func @main(%t: f32[4, 2], %i: i32[3]) {\n  %y: f32[3, 2] = gather(%t, %i)\n  return %y\n}";
    let table = Tensor::zeros(DType::F32, &[4, 2]);
    for (bad, pos) in [(4.0, 2usize), (-1.0, 2)] {
        let e = eval_err(src, &[&table, &t(DType::I32, &[3], vec![0.0, 3.0, bad])], &Bindings::new());
        match &e {
            InterpError::IndexOutOfRange { index, len: 4, what, site } => {
                assert_eq!(*index, bad as i64);
                assert!(what.contains(&format!("[{pos}]")), "{what}");
                assert_eq!(site.op, Some("gather"));
            }
            _ => panic!("{e:?}"),
        }
        assert!(e.to_string().contains(&format!("is {}, outside 0..4", bad as i64)), "{e}");
    }
    // An empty table has no valid index.
    let src = "func @main(%t: f32[0, 2], %i: i32[1]) {\n  %y: f32[1, 2] = gather(%t, %i)\n  return %y\n}";
    let e = eval_err(src, &[&Tensor::zeros(DType::F32, &[0, 2]), &t(DType::I32, &[1], vec![0.0])], &Bindings::new());
    assert!(matches!(e, InterpError::IndexOutOfRange { len: 0, .. }), "{e:?}");
}

#[test]
fn inputs_are_checked_against_the_declared_types() {
    let src = "func @main(%x: f32[T, 4], %y: f32[T+1]) {\n  %z: f32[T, 4] = neg(%x)\n  return %z\n}";
    let ok = Tensor::zeros(DType::F32, &[3, 4]);
    // Shape: a constant dim.
    let e = eval_err(src, &[&Tensor::zeros(DType::F32, &[3, 5]), &Tensor::zeros(DType::F32, &[4])], &Bindings::new());
    match &e {
        InterpError::InputMismatch { param, declared, actual, .. } => {
            assert!(param.starts_with("%x"), "{param}");
            assert_eq!((declared.as_str(), actual.as_str()), ("f32[T, 4]", "f32[3, 5]"));
        }
        _ => panic!("{e:?}"),
    }
    // A derived dim: T+1 must be 4.
    let e = eval_err(src, &[&ok, &Tensor::zeros(DType::F32, &[5])], &Bindings::new());
    assert!(matches!(&e, InterpError::InputMismatch { param, .. } if param.starts_with("%y")), "{e:?}");
    assert!(e.to_string().contains("`T+1` is 4"), "{e}");
    // Dtype and rank.
    let e = eval_err(src, &[&Tensor::zeros(DType::BF16, &[3, 4]), &Tensor::zeros(DType::F32, &[4])], &Bindings::new());
    assert!(matches!(e, InterpError::InputMismatch { .. }), "{e:?}");
    let e = eval_err(src, &[&Tensor::zeros(DType::F32, &[12]), &Tensor::zeros(DType::F32, &[4])], &Bindings::new());
    assert!(matches!(e, InterpError::InputMismatch { .. }), "{e:?}");
    // Count.
    let e = eval_err(src, &[&ok], &Bindings::new());
    assert!(matches!(e, InterpError::Arity { expected, got: 1, .. } if expected == "2"));
}

#[test]
fn symbol_conflicts_and_unbound_symbols_are_errors() {
    let src = "func @main(%x: f32[T], %y: f32[T]) {\n  %z: f32[T] = add(%x, %y)\n  return %z\n}";
    let e = eval_err(src, &[&Tensor::zeros(DType::F32, &[3]), &Tensor::zeros(DType::F32, &[4])], &Bindings::new());
    assert!(matches!(&e, InterpError::SymbolConflict { symbol, first: 3, second: 4, .. } if symbol == "T"), "{e:?}");
    let e = eval_err(src, &[&Tensor::zeros(DType::F32, &[3]), &Tensor::zeros(DType::F32, &[3])], &bind(&[("T", 5)]));
    assert!(matches!(&e, InterpError::SymbolConflict { first: 5, second: 3, first_source, .. } if first_source == "the given bindings"), "{e:?}");

    let src = "func @main(%x: f32[2]) {\n  %c: f32[N] = constant() {value=1.0, dtype=f32, shape=[N]}\n  return %c\n}";
    let e = eval_err(src, &[&Tensor::zeros(DType::F32, &[2])], &Bindings::new());
    assert!(matches!(&e, InterpError::UnboundSymbol { symbol, site, .. } if symbol == "N" && site.op == Some("constant")), "{e:?}");
    // With a binding it runs.
    let out = run_entry(&graph(src), &[&Tensor::zeros(DType::F32, &[2])], &bind(&[("N", 3)])).unwrap();
    assert_eq!(out[0].data(), &[1.0; 3]);
}

#[test]
fn slice_bounds_are_checked_at_run_time() {
    let src = "func @main(%x: f32[T]) {\n  %y: f32[K] = slice(%x) {axis=0, start=0, end=K}\n  return %y\n}";
    let x = Tensor::zeros(DType::F32, &[4]);
    let e = eval_err(src, &[&x], &bind(&[("K", 5)]));
    assert_eq!(e, InterpError::SliceBounds { site: e.site().cloned().unwrap_or_default(), axis: 0, start: 0, end: 5, size: 4 });
    assert!(e.to_string().starts_with("in @main, n0 `slice`"), "{e}");
    let src = "func @main(%x: f32[T]) {\n  %y: f32[K-P] = slice(%x) {axis=0, start=P, end=K}\n  return %y\n}";
    let e = eval_err(src, &[&x], &bind(&[("K", 1), ("P", 2)]));
    assert!(matches!(e, InterpError::SliceBounds { start: 2, end: 1, .. }), "{e:?}");
    let out = run_entry(&graph(src), &[&x], &bind(&[("K", 3), ("P", 1)])).unwrap();
    assert_eq!(out[0].shape(), &[2]);
}

#[test]
fn rope_with_an_odd_axis_is_an_error() {
    let src = "func @main(%x: f32[T, D], %p: i32[T]) {\n  %y: f32[T, D] = rope(%x, %p) {theta=10000.0}\n  return %y\n}";
    let e = eval_err(src, &[&Tensor::zeros(DType::F32, &[2, 3]), &Tensor::zeros(DType::I32, &[2])], &Bindings::new());
    assert!(matches!(e, InterpError::OddRotaryAxis { size: 3, .. }), "{e:?}");
}

const KV_APPEND: &str = "func @main(%kp: f32[P, S, 1, 2], %vp: f32[P, S, 1, 2], %kn: f32[B, T, 1, 2], %vn: f32[B, T, 1, 2], %bt: i32[B, M], %sp: i32[B]) {
  %k: f32[P, S, 1, 2], %v: f32[P, S, 1, 2] = kv_append(%kp, %vp, %kn, %vn, %bt, %sp)
  return %k, %v
}";

fn kv_append_err(pages: usize, page_size: usize, table: Vec<f64>, start: f64, t_new: usize) -> InterpError {
    let pg = Tensor::zeros(DType::F32, &[pages, page_size, 1, 2]);
    let new = Tensor::full(DType::F32, &[1, t_new, 1, 2], 1.0);
    let m = table.len();
    let bt = t(DType::I32, &[1, m], table);
    let sp = t(DType::I32, &[1], vec![start]);
    eval_err(KV_APPEND, &[&pg, &pg, &new, &new, &bt, &sp], &Bindings::new())
}

#[test]
fn kv_append_checks_slots_pages_and_table_entries() {
    // Slot 4 needs column 2 of a 2-column table (page size 2).
    let e = kv_append_err(4, 2, vec![0.0, 1.0], 3.0, 2);
    assert!(matches!(&e, InterpError::IndexOutOfRange { index: 4, len: 4, what, .. } if what.contains("token 1 of sequence 0")), "{e:?}");
    let e = kv_append_err(4, 2, vec![0.0, 1.0], -1.0, 1);
    assert!(matches!(e, InterpError::IndexOutOfRange { index: -1, .. }), "{e:?}");
    // A block-table entry naming page 7 of 4.
    let e = kv_append_err(4, 2, vec![0.0, 7.0], 1.0, 2);
    assert!(matches!(&e, InterpError::IndexOutOfRange { index: 7, len: 4, what, .. } if what.starts_with("block_table[0][1]")), "{e:?}");
    assert!(e.to_string().contains("`kv_append`"), "{e}");
    // Page size 0 with tokens to store.
    let e = kv_append_err(4, 0, vec![0.0], 0.0, 1);
    assert!(matches!(e, InterpError::ZeroSize { .. }), "{e:?}");
}

#[test]
fn paged_attention_checks_lengths_and_table_entries() {
    let src = "func @main(%q: f32[1, 1, 1, 2], %kp: f32[2, 2, 1, 2], %vp: f32[2, 2, 1, 2], %bt: i32[1, 2], %l: i32[1]) {
  %o: f32[1, 1, 1, 2] = paged_attention(%q, %kp, %vp, %bt, %l) {scale=1.0, heads=1, kv_heads=1}
  return %o
}";
    let q = Tensor::zeros(DType::F32, &[1, 1, 1, 2]);
    let pg = Tensor::zeros(DType::F32, &[2, 2, 1, 2]);
    let run_with = |table: Vec<f64>, len: f64| eval_err(src, &[&q, &pg, &pg, &t(DType::I32, &[1, 2], table), &t(DType::I32, &[1], vec![len])], &Bindings::new());
    let e = run_with(vec![0.0, 1.0], 5.0);
    assert!(matches!(&e, InterpError::IndexOutOfRange { index: 5, what, .. } if what.starts_with("seq_lens[0]")), "{e:?}");
    let e = run_with(vec![0.0, 1.0], -2.0);
    assert!(matches!(e, InterpError::IndexOutOfRange { index: -2, .. }), "{e:?}");
    let e = run_with(vec![1.0, 2.0], 3.0);
    assert!(matches!(&e, InterpError::IndexOutOfRange { index: 2, len: 2, what, .. } if what.starts_with("block_table[0][1]")), "{e:?}");
    // Unused entries are not read: length 2 only needs column 0.
    let out = run_entry(&graph(src), &[&q, &pg, &pg, &t(DType::I32, &[1, 2], vec![1.0, -1.0]), &t(DType::I32, &[1], vec![2.0])], &Bindings::new());
    assert!(out.is_ok(), "{out:?}");
}

#[test]
fn unverified_graphs_give_errors_not_panics() {
    // A declared result type that the op does not produce.
    let g = parse("func @main(%x: f32[2]) {\n  %y: f32[3] = neg(%x)\n  return %y\n}").unwrap();
    let e = run_entry(&g, &[&Tensor::zeros(DType::F32, &[2])], &Bindings::new()).unwrap_err();
    assert!(matches!(&e, InterpError::ResultMismatch { expected, .. } if expected == &vec![3]), "{e:?}");
    // Operands that do not broadcast.
    let g = parse("func @main(%x: f32[2], %y: f32[3]) {\n  %z: f32[3] = add(%x, %y)\n  return %z\n}").unwrap();
    let e = run_entry(&g, &[&Tensor::zeros(DType::F32, &[2]), &Tensor::zeros(DType::F32, &[3])], &Bindings::new()).unwrap_err();
    assert!(matches!(e, InterpError::Operands { .. }), "{e:?}");
    // Wrong operand count, bad attributes.
    let g = parse("func @main(%x: f32[2, 2]) {\n  %y: f32[2, 2] = permute(%x) {perm=[0, 0]}\n  %z: f32[2, 2] = softmax(%y) {axis=5}\n  return %z\n}").unwrap();
    let e = run_entry(&g, &[&Tensor::zeros(DType::F32, &[2, 2])], &Bindings::new()).unwrap_err();
    assert!(matches!(e, InterpError::Attr { .. }), "{e:?}");
    let g = parse("func @main(%x: f32[2]) {\n  %y: f32[2] = add(%x)\n  return %y\n}").unwrap();
    let e = run_entry(&g, &[&Tensor::zeros(DType::F32, &[2])], &Bindings::new()).unwrap_err();
    assert!(matches!(e, InterpError::Arity { got: 1, .. }), "{e:?}");
    // A function calling itself.
    let g = parse("func @f(%x: f32[2]) {\n  %y: f32[2] = neg(%x)\n  return %y\n}\nfunc @main(%x: f32[2]) {\n  %y: f32[2] = call(%x) {func=\"f\"}\n  return %y\n}").unwrap();
    let mut g2 = g.clone();
    for f in g2.funcs.values_mut() {
        for nd in f.nodes.values_mut() {
            if nd.op.kind == crate::OpKind::Call {
                nd.op.attrs[0] = crate::Attr::Str("main".into());
            }
        }
    }
    let e = run_entry(&g2, &[&Tensor::zeros(DType::F32, &[2])], &Bindings::new()).unwrap_err();
    assert!(matches!(e, InterpError::Malformed { .. }), "{e:?}");
    assert!(matches!(run(&g, "nope", &[], &Bindings::new()), Err(InterpError::NoSuchFunction { .. })));
}

#[test]
fn errors_in_a_callee_name_the_call_chain() {
    let src = "func @layer(%x: i32[N], %y: i32[N]) {
  %q: i32[N] = div(%x, %y)
  return %q
}
func @main(%x: i32[2], %y: i32[2]) {
  %a: i32[2] = neg(%x)
  %b: i32[2] = call(%a, %y) {func=\"layer\"}
  return %b
}";
    let e = eval_err(src, &[&Tensor::zeros(DType::I32, &[2]), &Tensor::zeros(DType::I32, &[2])], &Bindings::new());
    let site = e.site().cloned().unwrap_or_default();
    assert_eq!(site, Site { func: "layer".into(), node: site.node, op: Some("div"), callers: vec!["@main n1".into()] });
    assert_eq!(e.to_string(), "in @layer, n0 `div` (called from @main n1): integer division by zero (element 0 of the result)");
}
