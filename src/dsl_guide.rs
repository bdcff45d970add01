//! A guide to the [`graph!`](crate::graph) DSL: one worked example for each form of the
//! language. Every example builds a graph, compiles it into a [`Program`](crate::Program) on
//! [`Backend::Interpreter`](crate::Backend::Interpreter), runs it and checks the numbers (they
//! are this module's doctests).
//!
//! 1. [Parameters and types](#parameters-and-types)
//! 2. [Operators](#operators): `@`, arithmetic, unary minus, precedence
//! 3. [Numbers beside a tensor](#numbers-beside-a-tensor): literals and `{scalar}`
//! 4. [Methods and attributes](#methods-and-attributes): positional and named
//! 5. [`let` and assignment](#let-and-assignment)
//! 6. [Loops and weights](#loops-and-weights): `for` over a config, `weight(format!(..), type)`
//! 7. [`if`](#if-statements-and-if-expressions): statements and expressions
//! 8. [Graph functions](#graph-functions): calls, several results, `let [a, b] = f(..)`
//! 9. [Ops with several results](#ops-with-several-results): `kv_append`
//! 10. [`concat`](#concat)
//! 11. [Sources](#sources-iota-and-constant): `iota` and `constant`
//! 12. [Comparisons and `select`](#comparisons-and-select)
//! 13. [Errors](#errors): at compile time, and when the graph is built
//!
//! # Parameters and types
//!
//! A graph is a list of `fn name(params) -> type { body }`; `graph!` evaluates to
//! `Result<Graph, BuildError>`. A type is a dtype and a shape: `f32[T, 4]`. The dtype is one of
//! `bf16 f16 f32 i32 i64 bool`, or a Rust expression of type [`DType`](crate::DType) in braces
//! (`{dt}`). A dim is
//!
//! - an integer literal: `4`;
//! - a symbol, bound when the graph runs (from the inputs' shapes): `T`;
//! - a Rust expression in braces, anything [`IntoDim`](crate::ir::scope::IntoDim): an integer
//!   from a config (`{cfg.hidden}`), a [`Dim`](crate::Dim) (`{&d}`);
//! - `+`, `-`, `*` of those, with parentheses: `T + 1`, `2 * D`.
//!
//! `f32[]` is a scalar. A function with several results declares `-> (f32[T], f32[T])`.
//!
//! ```
//! use sinter::{graph, Backend, DType, Dim, Program, Tensor};
//!
//! let hidden = 3; // a config value
//! let dt = DType::F32; // a dtype chosen at run time
//! let t = Dim::symbol("T"); // the same symbol as `T`
//! let g = graph! {
//!     fn main(x: f32[T, 3], y: f32[{&t}, {hidden}], z: {dt}[3], pair: f32[2 * T, 3], s: f32[]) -> f32[T, 3] {
//!         (x + y + z) * s + pair.reshape([2, T, 3]).sum(0, keepdim = false)
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let x = Tensor::full(DType::F32, &[2, 3], 1.0); // binds T = 2
//! let y = Tensor::full(DType::F32, &[2, 3], 2.0);
//! let z = Tensor::new(DType::F32, &[3], vec![0.0, 1.0, 2.0])?;
//! let pair = Tensor::full(DType::F32, &[4, 3], 10.0); // 2 * T = 4 rows
//! let s = Tensor::scalar(DType::F32, 2.0);
//! let out = p.run(&[("x", &x), ("y", &y), ("z", &z), ("pair", &pair), ("s", &s)], &[])?;
//! assert_eq!(out[0].shape(), &[2, 3]);
//! // (1 + 2 + z) · 2 + 10 + 10
//! assert_eq!(out[0].data(), &[26.0, 28.0, 30.0, 26.0, 28.0, 30.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Operators
//!
//! `+ - * /` are element-wise with NumPy broadcasting; `@` is the (batched) matrix product.
//! `*`, `/` and `@` bind tighter than `+` and `-`, which bind tighter than the comparisons;
//! all are left-associative, and `-x` negates.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn main(x: f32[2, 2], w: f32[2, 2], b: f32[2]) -> f32[2, 2] {
//!         -(x @ w + b) / x - x * x @ w
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let x = Tensor::new(DType::F32, &[2, 2], vec![1.0, 2.0, 4.0, 8.0])?;
//! let w = Tensor::new(DType::F32, &[2, 2], vec![1.0, 0.0, 0.0, 1.0])?; // identity
//! let b = Tensor::new(DType::F32, &[2], vec![1.0, 1.0])?;
//! let out = p.run(&[("x", &x), ("w", &w), ("b", &b)], &[])?;
//! // -(x + 1) / x - x²  (`x * x @ w` is `(x * x) @ w`)
//! assert_eq!(out[0].data(), &[-3.0, -5.5, -17.25, -65.125]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Numbers beside a tensor
//!
//! A numeric literal, or a Rust number in braces (`{scale}`), beside a tensor in a binary
//! operation becomes a scalar constant of that tensor's dtype. Two numbers side by side are
//! Rust's business: write `{ 2.0 * scale }`, not `2.0 * {scale}`.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let scale = 0.5_f64;
//! let g = graph! {
//!     fn main(x: f32[3]) -> f32[3] {
//!         (1.0 - x * {scale}) * {2.0 * scale} + x / 4
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let out = p.run(&[("x", &Tensor::new(DType::F32, &[3], vec![0.0, 2.0, 4.0])?)], &[])?;
//! // (1 - x/2) · 1 + x/4
//! assert_eq!(out[0].data(), &[1.0, 0.5, 0.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Methods and attributes
//!
//! `x.op(tensors.., attributes..)` applies an op to `x` and the op's other tensor operands;
//! then come its attributes, positionally in the op's order or by name (`axis = -1`), named
//! ones last. `op(x, ..)` is the same call written as a function. An attribute value is a
//! literal, a dtype name (`f32`), a list of dims (`[T, 4]`), or any Rust expression that
//! converts into an attribute (a number, a `bool`, a string, a [`DType`](crate::DType), a
//! [`Dim`](crate::Dim)). The words, their operands and attributes are the op table of
//! [`sinter::ir`](crate::ir) (`sinter::ir::OP_TABLE`); reductions keep the reduced axis as 1
//! unless `keepdim = false`.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let eps = 1e-6;
//! let g = graph! {
//!     fn main(x: f32[2, 2], w: f32[2]) -> (f32[2, 2], f32[2, 1], f32[2], f32[2, 2]) {
//!         let n = x.rms_norm(w, eps = eps);            // tensor operand, named attribute
//!         let s = x.sum(-1);                           // positional attribute: axis
//!         let m = reduce_max(x, axis = 0, keepdim = false); // function form
//!         let t = x.transpose(0, 1).cast(f32);         // two positional ints; a dtype
//!         (n, s, m, t)
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let x = Tensor::new(DType::F32, &[2, 2], vec![3.0, 4.0, 0.0, 1.0])?;
//! let w = Tensor::new(DType::F32, &[2], vec![1.0, 2.0])?;
//! let out = p.run(&[("x", &x), ("w", &w)], &[])?;
//! // rows / rms(row) · w: rms([3, 4]) = √12.5
//! let r = 12.5_f64.sqrt();
//! assert!((out[0].data()[0] - 3.0 / r).abs() < 1e-5 && (out[0].data()[1] - 8.0 / r).abs() < 1e-5);
//! assert_eq!(out[1].data(), &[7.0, 1.0]);
//! assert_eq!(out[2].data(), &[3.0, 4.0]);
//! assert_eq!(out[3].data(), &[3.0, 0.0, 4.0, 1.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # `let` and assignment
//!
//! `let name = expr;` binds a tensor (a Rust `Value`); `let mut` and `name = expr;` rebind it.
//! Shadowing works as in Rust. A statement `expr;` builds a node and drops it.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn main(x: f32[2]) -> f32[2] {
//!         let mut y = x * 2.0;
//!         y = y + x;          // 3x
//!         let y = y.exp().log(); // shadowed: still 3x
//!         y
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let out = p.run(&[("x", &Tensor::new(DType::F32, &[2], vec![1.0, -2.0])?)], &[])?;
//! assert!((out[0].data()[0] - 3.0).abs() < 1e-5 && (out[0].data()[1] + 6.0).abs() < 1e-5);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Loops and weights
//!
//! `for pat in rust_iterator { .. }` is a Rust loop that runs while the graph is built, so it
//! unrolls: a layer stack is a loop over the config. `weight(name, type)` (or `input(..)`)
//! declares a parameter of the function where it appears, with a name computed in Rust;
//! [`Program::bind`](crate::Program::bind) gives it a tensor.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let n_layers = 3;
//! let g = graph! {
//!     fn main(x: f32[T, 2]) -> f32[T, 2] {
//!         let mut h = x;
//!         for i in 0..n_layers {
//!             h = h + h @ weight(format!("blk.{i}.w"), f32[2, 2]);
//!         }
//!         h
//!     }
//! }?;
//! let mut p = Program::compile(g, Backend::Interpreter)?;
//! for i in 0..n_layers {
//!     // blk.i.w = (i + 1)·I, so layer i multiplies h by i + 2
//!     let v = (i + 1) as f64;
//!     p.bind(&format!("blk.{i}.w"), Tensor::new(DType::F32, &[2, 2], vec![v, 0.0, 0.0, v])?)?;
//! }
//! let out = p.run(&[("x", &Tensor::full(DType::F32, &[1, 2], 1.0))], &[])?;
//! assert_eq!(out[0].data(), &[24.0, 24.0]); // 2 · 3 · 4
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # `if` statements and `if` expressions
//!
//! The condition is a Rust `bool`, decided while the graph is built: the graph holds one
//! branch. An `if` statement's branches are statements (`y = ..;`), `else` optional. An `if`
//! expression has an `else` and both branches end with a tensor, or a tuple of tensors
//! (`let (a, b) = if ..`); it may end a function.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! for (with_bias, gated) in [(true, true), (false, false)] {
//!     let g = graph! {
//!         fn main(x: f32[2], b: f32[2]) -> f32[2] {
//!             let mut y = x;
//!             if with_bias {
//!                 y = y + b;
//!             }
//!             let (lo, hi) = if gated { (y.minimum(b), y.maximum(b)) } else { (y, y) };
//!             if gated { lo * hi } else { lo + hi }
//!         }
//!     }?;
//!     let p = Program::compile(g, Backend::Interpreter)?;
//!     let x = Tensor::new(DType::F32, &[2], vec![1.0, 2.0])?;
//!     let b = Tensor::new(DType::F32, &[2], vec![3.0, -1.0])?;
//!     let out = p.run(&[("x", &x), ("b", &b)], &[])?;
//!     let want: &[f64] = if with_bias { &[12.0, -1.0] } else { &[2.0, 4.0] };
//!     assert_eq!(out[0].data(), want);
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Graph functions
//!
//! A function may call the functions defined above it in the same `graph!` (not itself, not
//! those below). A call binds the callee's symbols from the arguments' shapes. A call of a
//! function with several results is destructured: `let [a, b] = f(..);`. The entry of the
//! graph is `main`, else the last function.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn square(x: f32[N]) -> f32[N] {
//!         x * x
//!     }
//!
//!     fn halves(x: f32[N]) -> (f32[N], f32[N]) {
//!         (x * 0.5, x - x * 0.5)
//!     }
//!
//!     fn main(x: f32[3]) -> f32[3] {
//!         let [a, b] = halves(square(x));
//!         a + square(b)
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! assert_eq!(p.entry(), "main");
//! let out = p.run(&[("x", &Tensor::new(DType::F32, &[3], vec![1.0, 2.0, 4.0])?)], &[])?;
//! // x² / 2 + (x² / 2)²
//! assert_eq!(out[0].data(), &[0.75, 6.0, 72.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Ops with several results
//!
//! An op with several results, like a function with several, is destructured with
//! `let [a, b] = ..`. `kv_append` writes new keys and values into a paged KV cache (token `t`
//! of sequence `b` goes to slot `start[b] + t`, in page `block_table[b][slot / page_size]`)
//! and gives the updated key and value pages.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn main(k_pages: f32[P, 2, 1, 1], v_pages: f32[P, 2, 1, 1], k: f32[1, T, 1, 1], v: f32[1, T, 1, 1],
//!             block_table: i32[1, M], start: i32[1])
//!         -> (f32[P, 2, 1, 1], f32[P, 2, 1, 1])
//!     {
//!         let [kp, vp] = k_pages.kv_append(v_pages, k, v, block_table, start);
//!         (kp, vp * 10.0)
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let pages = Tensor::zeros(DType::F32, &[2, 2, 1, 1]); // 2 pages of 2 slots
//! let k = Tensor::new(DType::F32, &[1, 3, 1, 1], vec![1.0, 2.0, 3.0])?;
//! let v = Tensor::new(DType::F32, &[1, 3, 1, 1], vec![4.0, 5.0, 6.0])?;
//! let table = Tensor::new(DType::I32, &[1, 2], vec![1.0, 0.0])?; // slots 0-1 in page 1, 2-3 in page 0
//! let start = Tensor::new(DType::I32, &[1], vec![0.0])?;
//! let out = p.run(&[("k_pages", &pages), ("v_pages", &pages), ("k", &k), ("v", &v), ("block_table", &table), ("start", &start)], &[])?;
//! assert_eq!(out[0].data(), &[3.0, 0.0, 1.0, 2.0]);
//! assert_eq!(out[1].data(), &[60.0, 0.0, 40.0, 50.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # `concat`
//!
//! `concat([a, b, ..], axis)` joins tensors of one dtype along `axis` (also `axis = ..`).
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn main(a: f32[T, 1], b: f32[T, 2]) -> (f32[T, 3], f32[2 * T, 1]) {
//!         (concat([a, b], -1), concat([a, a * 2.0], axis = 0))
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let a = Tensor::new(DType::F32, &[2, 1], vec![1.0, 2.0])?;
//! let b = Tensor::new(DType::F32, &[2, 2], vec![3.0, 4.0, 5.0, 6.0])?;
//! let out = p.run(&[("a", &a), ("b", &b)], &[])?;
//! assert_eq!(out[0].data(), &[1.0, 3.0, 4.0, 2.0, 5.0, 6.0]);
//! assert_eq!(out[1].data(), &[1.0, 2.0, 2.0, 4.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Sources: `iota` and `constant`
//!
//! `iota(dtype, [shape], axis)` counts along `axis` (default 0); `constant(value, dtype,
//! [shape])` fills a shape (default: a scalar). Their shapes may use the function's symbols.
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn main(x: f32[T]) -> (i32[2, T], f32[T]) {
//!         let cols = iota(i32, [2, T], 1);
//!         let ones = constant(1.0, f32, [T]);
//!         let positions = iota(i32, [T]).cast(f32);
//!         (cols, x * positions + ones + constant(0.5, f32))
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let out = p.run(&[("x", &Tensor::full(DType::F32, &[3], 2.0))], &[])?;
//! assert_eq!(out[0].data(), &[0.0, 1.0, 2.0, 0.0, 1.0, 2.0]);
//! assert_eq!(out[1].data(), &[1.5, 3.5, 5.5]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Comparisons and `select`
//!
//! `== != < <= > >=` (or `.eq(..)`, `.lt(..)`, ..) compare element-wise into a `bool`
//! tensor; `&&`, `||` and `!` (or `.logical_and(..)`, `.logical_or(..)`, `.logical_not()`)
//! combine `bool` tensors, binding looser than the comparisons as in Rust (`i >= lo && i < hi`);
//! `cond.select(a, b)` takes `a` where `cond` holds, else `b`. A causal mask:
//!
//! ```
//! use sinter::{graph, Backend, DType, Program, Tensor};
//!
//! let g = graph! {
//!     fn main(scores: f32[T, T]) -> (f32[T, T], f32[T, T]) {
//!         let visible = iota(i32, [T, T], 0) >= iota(i32, [T, T], 1);
//!         let masked = visible.select(scores, constant(-1e9, f32));
//!         let relu = (scores > 0.0).select(scores, scores * 0.0);
//!         (masked.softmax(-1), relu)
//!     }
//! }?;
//! let p = Program::compile(g, Backend::Interpreter)?;
//! let s = Tensor::new(DType::F32, &[2, 2], vec![1.0, -2.0, -3.0, 4.0])?;
//! let out = p.run(&[("scores", &s)], &[])?;
//! let e = (-7.0_f64).exp(); // row 1: softmax([-3, 4])
//! assert_eq!(out[0].data()[..2], [1.0, 0.0]);
//! assert!((out[0].data()[2] - e / (1.0 + e)).abs() < 1e-6);
//! assert_eq!(out[1].data(), &[1.0, 0.0, 0.0, 4.0]);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Errors
//!
//! What the macro can see is checked when it expands, and reported as a compile error at the
//! offending token: an unknown op (with a suggestion), a wrong number of operands, an unknown,
//! missing or repeated attribute, a dtype clash, dims that differ between literals or between
//! symbols (`[T, D] @ [E, F]`: the IR never unifies two symbols), an axis out of range for a
//! known rank, a reshape that changes a literal element count, a declared return type that
//! does not match, a call of an undefined function.
//!
//! ```compile_fail
//! let g = sinter::graph! {
//!     fn f(x: f32[T, 4]) -> f32[T, 4] {
//!         x.slu() // error: unknown op `slu`; did you mean `silu`?
//!     }
//! };
//! ```
//!
//! ```compile_fail
//! let g = sinter::graph! {
//!     fn f(x: f32[T, 4], w: f32[6, 2]) -> f32[T, 2] {
//!         x @ w // error: matmul inner dimensions differ: f32[T, 4] @ f32[6, 2] contracts 4 with 6
//!     }
//! };
//! ```
//!
//! What depends on a Rust value (a `{dim}`, a `{dtype}`) is checked when the graph is built:
//! `graph!` then gives `Err(BuildError)`, whose message names the user's file, line and
//! column, the function, the op with its operand types, and the rule broken.
//!
//! ```
//! use sinter::{graph, Dim};
//!
//! let e = Dim::symbol("E"); // not visible to the macro
//! let line = line!() + 3;
//! let r = graph! {
//!     fn f(x: f32[T, D], w: f32[{&e}, F]) -> f32[T, F] {
//!         x @ w
//!     }
//! };
//! let err = r.unwrap_err();
//! assert_eq!((err.location.file(), err.location.line(), err.location.column()), (file!(), line, 11));
//! assert_eq!(
//!     err.to_string(),
//!     format!("{}:{line}:11: in @f, `matmul`(f32[T, D], f32[E, F]): the contracted dimensions differ: D vs E", file!())
//! );
//! ```
