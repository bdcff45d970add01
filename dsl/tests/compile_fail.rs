//! The DSL's compile-time errors: each `tests/ui/NAME.rs` must fail to compile with exactly
//! the diagnostics of its reviewed `NAME.stderr` (an unknown op, a wrong arity, a dim or dtype
//! clash visible at expansion time, ... each at the offending token). Only refusals here:
//! trybuild then runs `cargo check`, not a build of sinter's whole dependency tree; programs
//! the DSL must accept are tests of the root crate (`tests/dsl_pass.rs`).
//!
//! After a deliberate change of a message, regenerate with
//! `TRYBUILD=overwrite cargo test -p sinter-dsl --test compile_fail` and review the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
