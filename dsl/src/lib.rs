//! sinter-dsl: the `graph!` macro (issue 3).
