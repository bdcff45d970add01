//! `sinter-dsl`: the `graph!` macro, which turns tensor code written like the math into calls
//! of `sinter-ir`'s builder ([`sinter_ir::scope::Scope`]).
//!
//! The macro knows the DSL's vocabulary (method names, their tensor operands and attribute
//! names) and a light static view of shapes, so an unknown op, a wrong arity, an unknown
//! attribute, a dtype clash or a dim mismatch visible at expansion time is a compile error at
//! the offending span. Everything that depends on symbols or config values is checked when the
//! graph is built, with the user's source location. The grammar is documented on [`graph!`];
//! `sinter::dsl_guide` has a tested example of each form, and `tests/ui` the compile errors.
//!
//! The modules, in the order a macro call meets them: `parse` reads the tokens into the syntax
//! tree of `ast`; `expand` turns the tree into builder calls, with `types` for the static view
//! of dtypes and dims and its checks, and `vocab` for the ops' names, operands and attributes.

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2, TokenTree};
use quote::quote;
use syn::parse::Parser;
use syn::Ident;

mod ast;
mod expand;
mod parse;
mod types;
mod vocab;

use expand::expand_graph;
use parse::parse_graph;
use types::FP8_OPS;

/// Builds a graph from functions written in the tensor DSL.
///
/// Use it through the `sinter` crate (`sinter::graph!`): the expansion names `::sinter::ir`.
/// It evaluates to `Result<sinter::Graph, sinter::BuildError>`; `sinter::dsl_guide` has a
/// runnable example of every form below.
///
/// # Grammar
///
/// ```text
/// graph    := function+
/// function := "fn" NAME "(" (NAME ":" type),* ")" "->" (type | "(" type,* ")") block
/// type     := dtype "[" dim,* "]"                      f32[T, 4]    bf16[]
/// dtype    := bf16 | f16 | f32 | i32 | i64 | bool | "{" rust : DType "}"
/// dim      := INT | SYMBOL | "{" rust : IntoDim "}" | dim (+ | - | *) dim | "(" dim ")"
/// block    := "{" statement* expr? "}"              the tail is the function's result(s)
/// statement:= "let" PATTERN "=" expr ";"           let [k, v] = ... for several results
///           | NAME "=" expr ";"
///           | "for" PATTERN "in" rust block              unrolled while building
///           | "if" rust block ("else" (block | if))?     decided while building
///           | expr ";"
/// expr     := expr (@ | * | /) expr | expr (+ | -) expr | expr (== | != | < | <= | > | >=) expr
///           | expr && expr | expr || expr | "!" expr      logical_and/or/not of bool tensors
///           | "-" expr | expr "." OP "(" args ")" | OP "(" expr, args ")"
///           | FN "(" expr,* ")"                     a graph function defined above
///           | weight "(" rust : name, type ")" | input "(" rust : name, type ")"
///           | concat "(" "[" expr,* "]" "," axis ")"
///           | iota "(" dtype, "[" dim,* "]", axis? ")" | constant "(" value, dtype, ("[" dim,* "]")? ")"
///           | "if" rust block "else" block          both branches end with a value
///           | "(" expr,* ")"                        a tuple: a function's or a branch's tail
///           | NAME | NUMBER | "{" rust "}"            a number only beside a tensor
/// args     := tensor operands, then attributes: positional in the op's order, or NAME "=" value
/// ```
///
/// `*`, `/` and `@` bind tighter than `+` and `-`, which bind tighter than comparisons, then
/// `&&`, then `||` (as in Rust); all are left-associative. A number (a literal, or a Rust number in braces) beside a tensor
/// becomes a scalar constant of the tensor's dtype. An attribute value is a literal, a dtype
/// name, a list of dims `[T, 4]`, or a Rust expression that converts into `sinter::ir::Attr`.
/// Rust code (conditions, iterators, names, `{ .. }`) sees the variables around the macro.
/// The ops, their tensor operands and attributes are `sinter::ir::OP_TABLE`'s.
///
/// # Checks
///
/// At expansion time, as a compile error at the offending token: unknown ops and functions
/// (with a "did you mean"), operand counts, unknown, missing and repeated attributes, unknown
/// dtypes, dtype clashes, dims that differ between literals or symbols (in broadcasting, in
/// `@`'s contracted axis), ranks below 2 for `@`, axes out of range for a known rank, reshapes
/// of a literal element count to another, float-only ops on integers, return types and counts
/// that differ from the declaration, duplicate functions and parameters, calls of functions
/// defined below or of the function itself, and destructuring that does not match the number
/// of results. What depends on a Rust value is checked when the graph is built: a
/// `BuildError` with the user's file:line:column, the op and its operand types.
#[proc_macro]
pub fn graph(input: TokenStream) -> TokenStream {
    match Parser::parse2(parse_graph, input.into()).and_then(expand_graph) {
        Ok(ts) => ts.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

/// An error at `span`.
pub(crate) fn err<T>(span: Span, msg: impl std::fmt::Display) -> syn::Result<T> {
    Err(syn::Error::new(span, msg))
}

/// An error underlining `start` to `end` (syn draws the range from a first and a last token).
pub(crate) fn err_range<T>(range: (Span, Span), msg: impl std::fmt::Display) -> syn::Result<T> {
    let toks: TokenStream2 = [TokenTree::Ident(Ident::new("a", range.0)), TokenTree::Ident(Ident::new("b", range.1))].into_iter().collect();
    Err(syn::Error::new_spanned(toks, msg))
}

/// The vocabulary as data, for the root crate's consistency test against the op table:
/// expands to `&[(dsl_name, op_variant, &[attr names])]`.
#[doc(hidden)]
#[proc_macro]
pub fn __vocab(_input: TokenStream) -> TokenStream {
    let rows = vocab::METHODS.iter().chain(vocab::SOURCES).map(|m| {
        let (n, op, attrs) = (m.name, m.op, m.attrs);
        quote!((#n, #op, &[#(#attrs),*] as &[&str]))
    });
    quote!(&[#(#rows),*] as &[(&str, &str, &[&str])]).into()
}

/// The ops whose `f8e4m3` operands the macro lets through ([`FP8_OPS`]), for the root crate's
/// consistency test against `sinter_ir::infer::accepts_fp8`: expands to `&[op_variant]`.
#[doc(hidden)]
#[proc_macro]
pub fn __vocab_fp8(_input: TokenStream) -> TokenStream {
    let ops = FP8_OPS.iter();
    quote!(&[#(#ops),*] as &[&str]).into()
}
