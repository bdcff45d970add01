//! sinter: a tensor compiler embedded in Rust.
pub use sinter_ir as ir;
