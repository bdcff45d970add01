//! Ill-shaped graphs built with the [`FunctionBuilder`] API: each is refused when the node is
//! added, with a [`BuildError`] whose rule text is asserted exactly and whose location is the
//! line of this file that asked for the node (`#[track_caller]`).
//!
//! The `.sir` counterparts (parse and verifier errors) are `tests/filetests/verify/*.sir`.

use sinter_ir::{parse, print, verify, Attr, BuildError, DType, Dim, FunctionBuilder, Graph, OpKind, TensorType, Value};

/// A dim from its text spelling (`"H*64"`, `"past+T"`), read with the `.sir` parser.
fn dim(text: &str) -> Dim {
    let g = parse(&format!("func @d(%x: f32[{text}]) {{\n  return %x\n}}\n")).unwrap_or_else(|e| panic!("`{text}`: {e}"));
    g.funcs.values().next().expect("one function").values.values().next().expect("one value").ty.shape[0].clone()
}

/// A tensor type from a dtype and dim spellings.
fn ty(dtype: DType, dims: &[&str]) -> TensorType {
    TensorType::new(dtype, dims.iter().map(|d| dim(d)))
}

/// Asserts that `$e` fails with exactly `$rule`, reported at the line of the macro call (or
/// the next lines, when rustfmt breaks the call) of this file.
///
/// FIXME: `FunctionBuilder::op` builds its errors inside closures (`map_err(|e| ...)`,
/// `ok_or_else(|| ...)`), and `#[track_caller]` does not reach through a closure, so errors
/// from attributes, callees and shape rules are located in `ir/src/builder.rs` instead of the
/// caller's line. Those cases use `refused!(misplaced: ...)`, which asserts today's wrong
/// location; once the builder takes `Location::caller()` outside the closures, they fail and
/// should become plain `refused!(...)`.
macro_rules! refused {
    (misplaced: $e:expr, $rule:expr) => {{
        let err: BuildError = $e.expect_err("the builder accepted an ill-shaped node");
        assert!(
            err.location.file().ends_with("builder.rs"),
            "located at {}: the builder's location bug is fixed; use `refused!` here",
            err.location
        );
        refused!(@message err, $rule)
    }};
    ($e:expr, $rule:expr) => {{
        let line = line!();
        let err: BuildError = $e.expect_err("the builder accepted an ill-shaped node");
        assert!(err.location.file().ends_with("bad_input.rs"), "located at {}", err.location);
        assert!((line..line + 4).contains(&err.location.line()), "located at {}, called at line {line}", err.location);
        refused!(@message err, $rule)
    }};
    (@message $err:expr, $rule:expr) => {{
        let err = $err;
        assert_eq!(err.rule, $rule, "{err}");
        // The message names the function, and the op and operand types when there is a node.
        let shown = err.to_string();
        assert!(shown.contains(&format!("in @{}", err.func)) && shown.ends_with(&err.rule), "{shown}");
        if let Some(op) = err.op {
            assert!(shown.contains(&format!("`{op}`({})", err.operands)), "{shown}");
        }
        err
    }};
}

fn builder(name: &str) -> FunctionBuilder {
    FunctionBuilder::new(&Graph::new(), name)
}

#[test]
fn matmul_symbolic_inner_dims_differ() {
    let mut b = builder("proj");
    let x = b.param("x", ty(DType::BF16, &["T", "H*64"]));
    let w = b.param("w", ty(DType::BF16, &["H*32", "64"]));
    let err = refused!(misplaced: b.op1(OpKind::Matmul, &[x, w], vec![]), "the contracted dimensions differ: 64*H vs 32*H");
    assert_eq!(err.op, Some("matmul"));
    assert_eq!(err.operands, "bf16[T, 64*H], bf16[32*H, 64]");
}

#[test]
fn add_symbolic_dims_do_not_broadcast() {
    let mut b = builder("residual");
    let x = b.param("x", ty(DType::F32, &["T", "576"]));
    let y = b.param("y", ty(DType::F32, &["past+T", "576"]));
    refused!(misplaced:
        b.op1(OpKind::Add, &[x, y], vec![]),
        "shapes [T, 576] and [T+past, 576] do not broadcast: T vs T+past at axis 0 of the result"
    );
}

#[test]
fn reshape_symbolic_element_counts_differ() {
    let mut b = builder("heads");
    let x = b.param("x", ty(DType::BF16, &["T", "H*64"]));
    let to = Attr::Dims(vec![dim("T"), dim("H"), dim("32")]);
    refused!(misplaced:
        b.op1(OpKind::Reshape, &[x], vec![("shape", to)]),
        "cannot reshape [T, 64*H] (64*H*T elements) to [T, H, 32] (32*H*T elements)"
    );
}

#[test]
fn concat_of_cache_and_new_rows_with_other_widths() {
    let mut b = builder("kv");
    let cache = b.param("cache", ty(DType::BF16, &["past", "64"]));
    let new = b.param("new", ty(DType::BF16, &["T", "32"]));
    refused!(misplaced:
        b.op1(OpKind::Concat, &[cache, new], vec![("axis", Attr::Int(0))]),
        "operand 1 differs from operand 0 at axis 1: 32 vs 64"
    );
}

#[test]
fn attention_heads_not_a_multiple_of_kv_heads() {
    let mut b = builder("attn");
    let q = b.param("q", ty(DType::BF16, &["B", "9", "T", "64"]));
    let k = b.param("k", ty(DType::BF16, &["B", "4", "T", "64"]));
    let v = b.param("v", ty(DType::BF16, &["B", "4", "T", "64"]));
    let attrs = vec![("scale", Attr::Float(0.125)), ("heads", Attr::Int(9)), ("kv_heads", Attr::Int(4))];
    refused!(misplaced: b.op1(OpKind::Attention, &[q, k, v], attrs), "heads (9) must be a positive multiple of kv_heads (4)");
}

#[test]
fn paged_attention_unified_max_not_finite() {
    let mut b = builder("decode");
    let q = b.param("q", ty(DType::BF16, &["B", "8", "1", "64"]));
    let kp = b.param("kp", ty(DType::BF16, &["P", "16", "2", "64"]));
    let vp = b.param("vp", ty(DType::BF16, &["P", "16", "2", "64"]));
    let bt = b.param("bt", ty(DType::I32, &["B", "M"]));
    let lens = b.param("lens", ty(DType::I32, &["B"]));
    for (phi, shown) in [(f64::NAN, "NaN"), (f64::NEG_INFINITY, "-inf"), (1e39, "1e39")] {
        let attrs = vec![("scale", Attr::Float(0.125)), ("heads", Attr::Int(8)), ("kv_heads", Attr::Int(2)), ("unified_max", Attr::Float(phi))];
        refused!(misplaced:
            b.op1(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs),
            format!("attribute `unified_max` must be a finite f32 number, got {shown}")
        );
    }
}

#[test]
fn operands_of_two_dtypes() {
    let mut b = builder("mixed");
    let x = b.param("x", ty(DType::BF16, &["T", "64"]));
    let y = b.param("y", ty(DType::F32, &["T", "64"]));
    refused!(misplaced: b.op1(OpKind::Mul, &[x, y], vec![]), "both operands must share a dtype, got bf16 and f32");
}

#[test]
fn attributes_unknown_missing_and_ill_typed() {
    let mut b = builder("attrs");
    let x = b.param("x", ty(DType::F32, &["T", "64"]));
    let w = b.param("w", ty(DType::F32, &["64"]));
    refused!(misplaced: b.op1(OpKind::Softmax, &[x], vec![("dim", Attr::Int(0))]), "`softmax` has no attribute `dim` (it has: axis)");
    refused!(misplaced: b.op1(OpKind::RmsNorm, &[x, w], vec![]), "`rms_norm` needs attribute `eps`");
    refused!(misplaced:
        b.op1(OpKind::Gelu, &[x], vec![("form", Attr::Str("fast".into()))]),
        "attribute `form` of `gelu` must be one of \"erf\", \"tanh\""
    );
    refused!(misplaced: b.op1(OpKind::Exp, &[], vec![]), "`exp` takes 1 operand (x), got 0");
    refused!(misplaced: b.op1(OpKind::Exp, &[x, x], vec![]), "`exp` takes 1 operand (x), got 2");
}

#[test]
fn rope_on_an_odd_axis_and_gather_with_float_indices() {
    let mut b = builder("embed");
    let x = b.param("x", ty(DType::BF16, &["T", "9", "63"]));
    let pos = b.param("pos", ty(DType::I32, &["T", "1"]));
    refused!(misplaced: b.op1(OpKind::Rope, &[x, pos], vec![("theta", Attr::Float(1e4))]), "the rotary axis must be even, got 63");
    let table = b.param("table", ty(DType::BF16, &["V", "576"]));
    let ids = b.param("ids", ty(DType::F32, &["T"]));
    refused!(misplaced: b.op1(OpKind::Gather, &[table, ids], vec![]), "the indices must be an integer tensor (i32 or i64), got f32");
}

#[test]
fn calls_undefined_and_with_conflicting_symbols() {
    let mut g = Graph::new();
    let mut callee = FunctionBuilder::new(&g, "pair");
    let a = callee.param("a", ty(DType::F32, &["N"]));
    let c = callee.param("b", ty(DType::F32, &["N"]));
    let s = callee.op1(OpKind::Add, &[a, c], vec![]).expect("a well-formed callee");
    g.add_func(callee.finish(&[s]).expect("finish"));

    let mut b = FunctionBuilder::new(&g, "main");
    let x = b.param("x", ty(DType::F32, &["T"]));
    let y = b.param("y", ty(DType::F32, &["S"]));
    let z = b.param("z", ty(DType::I32, &["T"]));
    refused!(misplaced: b.op(OpKind::Call, &[x, x], vec![("func", Attr::Str("layer".into()))]), "@layer is not defined");
    refused!(misplaced: b.op(OpKind::Call, &[x, y], vec![("func", Attr::Str("pair".into()))]), "@pair's symbol N is bound to both T and S");
    refused!(misplaced: b.op(OpKind::Call, &[x], vec![("func", Attr::Str("pair".into()))]), "@pair takes 2 arguments, got 1");
    refused!(misplaced:
        b.op(OpKind::Call, &[x, z], vec![("func", Attr::Str("pair".into()))]),
        "argument 1 of @pair must be f32[T] (declared f32[N]), got i32[T]"
    );
    // The same call with matching arguments is fine, and binds N to T in the result.
    let r = b.op(OpKind::Call, &[x, x], vec![("func", Attr::Str("pair".into()))]).expect("a good call");
    assert_eq!(b.ty(r[0]).to_string(), "f32[T]");
}

#[test]
fn kv_append_shapes_and_results() {
    let mut b = builder("cache");
    let kp = b.param("k_pages", ty(DType::BF16, &["P", "16", "3", "64"]));
    let vp = b.param("v_pages", ty(DType::BF16, &["P", "16", "3", "64"]));
    let kn = b.param("k_new", ty(DType::BF16, &["B", "T", "3", "64"]));
    let wide = b.param("k_wide", ty(DType::BF16, &["B", "T", "4", "64"]));
    let bt = b.param("block_table", ty(DType::I32, &["B", "M"]));
    let sp = b.param("start_pos", ty(DType::I32, &["B"]));
    refused!(misplaced:
        b.op(OpKind::KvAppend, &[kp, vp, wide, wide, bt, sp], vec![]),
        "k_new's head axis differs from the pages': 4 vs 3"
    );
    refused!(b.op1(OpKind::KvAppend, &[kp, vp, kn, kn, bt, sp], vec![]), "`kv_append` gives 2 results, one was expected");
}

#[test]
fn names_foreign_values_and_outputs() {
    let mut other = builder("other");
    let mut foreign: Value = other.param("p0", ty(DType::F32, &["4"]));
    for i in 1..6 {
        foreign = other.param(&format!("p{i}"), ty(DType::F32, &["4"]));
    }
    let mut b = builder("names");
    let x = b.param("x", ty(DType::F32, &["4"]));
    let h = b.op1(OpKind::Exp, &[x], vec![]).expect("exp");
    refused!(b.name(h, "x"), "value name %x is used twice");
    refused!(b.name(h, "v3"), "`v3` is not a usable value name (letters, digits, `_` and `.`; `vN` is reserved)");
    refused!(b.op1(OpKind::Exp, &[foreign], vec![]), "operand v5 is not a value of this function");
    refused!(b.finish(&[foreign]), "output v5 is not a value of this function");
}

/// The same builder, used correctly, gives a graph that verifies and round-trips.
#[test]
fn a_well_formed_build_verifies_and_round_trips() {
    let mut g = Graph::new();
    let mut b = FunctionBuilder::new(&g, "main");
    let x = b.param("x", ty(DType::BF16, &["T", "H*64"]));
    let w = b.param("w", ty(DType::BF16, &["64*H", "H*64"]));
    let y = b.op1(OpKind::Matmul, &[x, w], vec![]).expect("matmul");
    let heads = b.op1(OpKind::Reshape, &[y], vec![("shape", Attr::Dims(vec![dim("T"), dim("H"), dim("64")]))]).expect("reshape");
    let p = b.op1(OpKind::Softmax, &[heads], vec![]).expect("softmax");
    b.name(p, "probs").expect("name");
    g.add_func(b.finish(&[p]).expect("finish"));
    verify(&g).expect("verifies");
    let text = print(&g);
    assert_eq!(parse(&text).expect("parses"), g, "{text}");
}

/// Results the host could not hold are refused before allocation (an allocation failure would
/// abort the process, which no caller can catch).
#[test]
fn huge_results_are_an_error_not_an_abort() {
    let src = "func @main(%x: f32[1]) {\n  %y: f32[N] = broadcast(%x) {shape=[N]}\n  return %y\n}";
    let g = sinter_ir::parse(src).unwrap();
    let x = sinter::Tensor::zeros(sinter::DType::F32, &[1]);
    let mut b = sinter::Bindings::new();
    b.insert("N".into(), 1 << 50);
    let e = sinter_ir::interp::run_entry(&g, &[&x], &b).unwrap_err();
    assert!(e.to_string().contains("more than the interpreter's limit"), "{e}");
}

/// A fractional literal beside an integer tensor is refused at build time, not truncated.
#[test]
fn fractional_literal_beside_an_integer_tensor_is_refused() {
    let e = sinter::graph! { fn f(x: i32[3]) -> i32[3] { x * 2.5 } }.unwrap_err();
    assert!(e.to_string().contains("the number 2.5 beside a i32[3] tensor is not representable in i32"), "{e}");
    assert!(sinter::graph! { fn f(x: i32[3]) -> i32[3] { x * 2.0 } }.is_ok());
}

/// `sinter run` refuses sampling options it cannot use, with the flag's name, before loading
/// anything: a negative temperature (written `--temperature -1`, not mistaken for a flag), a
/// NaN one, a `--top-p` outside (0, 1], a `--batch` of 0 or past 4096 (a batch of 100 000
/// would allocate KV pools for that many sequences).
#[test]
fn run_refuses_bad_sampling_flags() {
    for (args, want) in [
        (&["--temperature", "-1"][..], "--temperature must be a finite number ≥ 0"),
        (&["--temperature", "NaN"][..], "--temperature must be a finite number ≥ 0"),
        (&["--top-p", "0"][..], "--top-p must be in (0, 1]"),
        (&["--top-p", "1.5"][..], "--top-p must be in (0, 1]"),
        (&["--prompt-tokens", "4", "--batch", "100000"][..], "100000 is not in 1..=4096"),
        (&["--prompt-tokens", "4", "--batch", "0"][..], "0 is not in 1..=4096"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_sinter")).args(["run", "--device", "cpu", "--prompt", "hi"]).args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(want), "{args:?}: {err}");
    }
}
