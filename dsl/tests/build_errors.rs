//! Shape mismatches the macro cannot see, because they depend on a symbol or a config value
//! known only when the graph is built, are reported then: `graph!` evaluates to
//! `Err(BuildError)` whose `Display` names both operand types, the rule broken and the
//! file:line:column of the user's operator or method.
//!
//! Mismatches visible at expansion time are compile errors instead (`tests/ui/*.rs`); two
//! distinct symbol names (`[T, D] @ [E, F]`) are one of those, since the IR never unifies
//! distinct symbols.

use sinter::{graph, BuildError, Dim};

/// Asserts that `e` is located at `line:column` of this file and that its text shows `parts`.
#[track_caller]
fn assert_located(e: &BuildError, line: u32, column: u32, parts: &[&str]) {
    let text = e.to_string();
    assert_eq!((e.location.file(), e.location.line(), e.location.column()), (file!(), line, column), "{text}");
    assert!(text.starts_with(&format!("{}:{line}:{column}: ", file!())), "{text}");
    for p in parts {
        assert!(text.contains(p), "`{p}` is missing from: {text}");
    }
}

#[test]
fn matmul_of_a_symbol_with_a_symbol_from_rust() {
    // `E` comes from Rust, so the macro sees an unknown dim; the builder sees D vs E.
    let e = Dim::symbol("E");
    let line = line!() + 3;
    let r = graph! {
        fn f(x: f32[T, D], w: f32[{&e}, F]) -> f32[T, F] {
            x @ w
        }
    };
    let err = r.expect_err("D and E differ");
    assert_located(&err, line, 15, &["in @f", "`matmul`(f32[T, D], f32[E, F])", "the contracted dimensions differ: D vs E"]);
    assert_eq!(err.to_string(), format!("{}:{line}:15: in @f, `matmul`(f32[T, D], f32[E, F]): the contracted dimensions differ: D vs E", file!()));
}

#[test]
fn matmul_of_a_symbol_with_a_config_value() {
    let k = 6;
    let line = line!() + 3;
    let r = graph! {
        fn f(x: f32[T, D], w: f32[{k}, F]) -> f32[T, F] {
            x @ w
        }
    };
    let err = r.expect_err("D is not 6");
    assert_located(&err, line, 15, &["f32[T, D]", "f32[6, F]", "D vs 6"]);
}

#[test]
fn broadcast_of_symbolic_arithmetic() {
    // `2*D` and `D` are both symbolic; whether they differ is the builder's call.
    let line = line!() + 3;
    let r = graph! {
        fn f(x: f32[T, 2 * D], y: f32[T, D]) -> f32[T, D] {
            x + y
        }
    };
    let err = r.expect_err("2*D is not D");
    assert_located(&err, line, 15, &["f32[T, 2*D]", "f32[T, D]", "do not broadcast"]);
}

#[test]
fn an_operator_in_a_loop_is_located_at_the_operator() {
    let layers = 2;
    let line = line!() + 6;
    let r = graph! {
        fn f(x: f32[T, {layers}], w: f32[{layers}, 3]) -> f32[T, 3] {
            let mut h = x;
            for _ in 0..layers {
                // Valid once: the second iteration multiplies [T, 3] by [2, 3].
                h = h @ w;
            }
            h
        }
    };
    let err = r.expect_err("3 is not 2 on the second iteration");
    assert_located(&err, line, 23, &["in @f", "`matmul`(f32[T, 3], f32[2, 3])", "3 vs 2"]);
}

#[test]
fn a_return_type_known_at_build_time() {
    let width = 5;
    let line = line!() + 2;
    let r = graph! {
        fn f(x: f32[T, {width}]) -> f32[T, 4] {
            x.exp()
        }
    };
    let err = r.expect_err("5 is not 4");
    assert_located(&err, line, 37, &["in @f", "f32[T, 5]", "f32[T, 4]"]);
}
