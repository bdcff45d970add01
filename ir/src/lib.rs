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
#![warn(missing_docs)]

pub mod builder;
pub mod dim;
pub mod dtype;
pub mod epilogue;
pub mod graph;
pub mod infer;
pub mod interp;
pub mod kernel;
pub mod ops;
pub mod scope;
pub mod text;
pub mod verify;

pub use builder::{BuildError, FunctionBuilder};
pub use dim::{Bindings, Dim, DimError};
pub use dtype::DType;
pub use kernel::{Buffer, BufferData, BufferRole, Family, GridDim, Kernel, KernelData, KernelGraph, KernelParam, LaunchPlan, Layout, TensorMap};
pub use graph::{FuncId, Function, Graph, Node, NodeData, Signature, TensorType, Value, ValueData, ValueDef};
pub use ops::{Attr, AttrKind, Op, OpClass, OpInfo, OpKind, OP_TABLE};
pub use text::{parse, print, ParseError};
pub use verify::{verify, VerifyError};
