//! `sinter-ir`: the tensor IR of sinter.
//!
//! - [`Graph`] / [`Function`]: functions of nodes over typed values, entities from
//!   `cranelift-entity`; a decoder layer is one function called once per layer.
//! - [`ops`]: the one op table ([`OP_TABLE`]) that defines every op, its attributes, its shape
//!   rule ([`infer`]) and its semantics.
//! - [`Dim`]: symbolic dimensions in canonical form.
//! - [`text`]: the `.sir` printer and parser, which round-trip exactly.
//! - [`verify()`]: the verifier.
//! - [`interp`]: the CPU reference interpreter (f64 arithmetic, rounded per value dtype).
//! - [`kernel`]: the graph after fusion ([`KernelGraph`]) and a kernel's [`LaunchPlan`].
//! - [`contract`]: what the passes may hand the code generator — the [`Target`]s, the
//!   per-family rules, the matmul epilogue analysis.
#![warn(missing_docs)]

pub mod attr;
pub mod builder;
pub mod contract;
pub mod dim;
pub mod dtype;
// shim: old path, removed at integration (`sinter_ir::epilogue` → `sinter_ir::contract::epilogue`)
pub use contract::epilogue;
pub mod graph;
pub mod infer;
pub mod interp;
pub mod kernel;
pub mod ops;
pub mod rope;
pub mod scope;
pub mod qblock;
pub mod storage;
pub mod text;
pub mod types;
pub mod verify;

pub use builder::{BuildError, FunctionBuilder};
pub use contract::target::{Target, UnknownTarget};
pub use dim::{Bindings, Dim, DimError};
pub use dtype::DType;
pub use kernel::{Buffer, BufferData, BufferRole, Family, GridDim, Kernel, KernelData, KernelGraph, KernelParam, LaunchPlan, Layout, TensorMap};
pub use graph::{FuncId, Function, Graph, Node, NodeData, Signature, TensorType, Value, ValueData, ValueDef};
pub use ops::{Attr, AttrKind, Op, OpClass, OpInfo, OpKind, OP_TABLE};
pub use text::{parse, print, ParseError};
pub use verify::{verify, VerifyError};
