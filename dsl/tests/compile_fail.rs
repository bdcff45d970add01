//! The DSL's compile-time errors: each `tests/ui/NAME.rs` must fail to compile with exactly
//! the diagnostics of its reviewed `NAME.stderr` (an unknown op, a wrong arity, a dim or dtype
//! clash visible at expansion time, ... each at the offending token). `tests/ui/pass/*.rs`
//! must compile and run.
//!
//! After a deliberate change of a message, regenerate with
//! `TRYBUILD=overwrite cargo test -p sinter-dsl --test compile_fail` and review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
    t.pass("tests/ui/pass/*.rs");
}
