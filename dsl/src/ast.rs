//! The syntax tree of a `graph!` body, as the parser builds it and the expansion reads it.

use proc_macro2::{Span, TokenStream as TokenStream2};
use syn::Ident;

pub(crate) const DTYPES: [(&str, &str); 12] = [
    ("bf16", "BF16"),
    ("f16", "F16"),
    ("f32", "F32"),
    ("i32", "I32"),
    ("i64", "I64"),
    ("bool", "Bool"),
    ("q8_0", "Q8_0"),
    ("q4_1", "Q4_1"),
    ("f8e4m3", "F8E4M3"),
    ("q5_0", "Q5_0"),
    ("q4_k", "Q4K"),
    ("q6_k", "Q6K"),
];

/// The error for a dtype name the DSL does not have, listing every one it has.
pub(crate) fn unknown_dtype_message(name: &str) -> String {
    let known: Vec<&str> = DTYPES.iter().map(|(n, _)| *n).collect();
    format!("unknown dtype `{name}`; expected one of {} (or a Rust expression in braces)", known.join(", "))
}

#[derive(Clone)]
pub(crate) enum DimExpr {
    Sym(String, Span),
    Lit(i64),
    Rust(TokenStream2),
    Add(Box<DimExpr>, Box<DimExpr>),
    Sub(Box<DimExpr>, Box<DimExpr>),
    Mul(Box<DimExpr>, Box<DimExpr>),
}

#[derive(Clone)]
pub(crate) enum DTypeSpec {
    Lit(String),
    Rust(TokenStream2),
}

impl DTypeSpec {
    pub(crate) fn known(&self) -> Option<String> {
        match self {
            DTypeSpec::Lit(s) => Some(s.clone()),
            DTypeSpec::Rust(_) => None,
        }
    }
}

#[derive(Clone)]
pub(crate) struct TypeSpec {
    pub(crate) dtype: DTypeSpec,
    pub(crate) dims: Vec<DimExpr>,
    pub(crate) span: Span,
}

pub(crate) struct Param {
    pub(crate) name: Ident,
    pub(crate) ty: TypeSpec,
}

pub(crate) struct FnDef {
    pub(crate) name: Ident,
    pub(crate) params: Vec<Param>,
    pub(crate) ret: Vec<TypeSpec>,
    pub(crate) ret_span: Span,
    pub(crate) body: Block,
}

#[derive(Clone)]
pub(crate) struct Block {
    pub(crate) stmts: Vec<Stmt>,
    pub(crate) tail: Option<Expr>,
    /// The first and last token of `tail`, to underline all of it.
    pub(crate) tail_range: Option<(Span, Span)>,
    pub(crate) close: Span,
}

#[derive(Clone)]
pub(crate) enum Stmt {
    Let { pat: syn::Pat, init: Expr },
    Assign { name: Ident, value: Expr },
    For { pat: syn::Pat, iter: syn::Expr, body: Block },
    If { cond: syn::Expr, then: Block, els: Option<Block> },
    Expr(Expr),
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum BinOp {
    Add,
    Sub,
    Mul,
    Div,
    Matmul,
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    /// `&&`: `logical_and` of bool tensors.
    And,
    /// `||`: `logical_or` of bool tensors.
    Or,
}

impl BinOp {
    pub(crate) fn op_kind(self) -> &'static str {
        match self {
            BinOp::Add => "Add",
            BinOp::Sub => "Sub",
            BinOp::Mul => "Mul",
            BinOp::Div => "Div",
            BinOp::Matmul => "Matmul",
            BinOp::Eq => "Eq",
            BinOp::Ne => "Ne",
            BinOp::Lt => "Lt",
            BinOp::Le => "Le",
            BinOp::Gt => "Gt",
            BinOp::Ge => "Ge",
            BinOp::And => "LogicalAnd",
            BinOp::Or => "LogicalOr",
        }
    }
    pub(crate) fn prec(self) -> u8 {
        match self {
            BinOp::Or => 1,
            BinOp::And => 2,
            BinOp::Eq | BinOp::Ne | BinOp::Lt | BinOp::Le | BinOp::Gt | BinOp::Ge => 3,
            BinOp::Add | BinOp::Sub => 4,
            BinOp::Mul | BinOp::Div | BinOp::Matmul => 5,
        }
    }
    pub(crate) fn is_compare(self) -> bool {
        self.prec() == 3
    }
    pub(crate) fn is_logical(self) -> bool {
        matches!(self, BinOp::And | BinOp::Or)
    }
}

#[derive(Clone)]
pub(crate) enum Arg {
    Pos(TokenStream2, Span),
    Named(Ident, TokenStream2),
}

#[derive(Clone)]
pub(crate) enum Expr {
    Var(Ident),
    Lit(f64, Span),
    Rust(TokenStream2, Span),
    Binary { op: BinOp, span: Span, lhs: Box<Expr>, rhs: Box<Expr> },
    Neg { span: Span, e: Box<Expr> },
    Method { recv: Box<Expr>, name: Ident, args: Vec<Arg>, span: Span },
    Call { name: Ident, args: Vec<Arg>, span: Span },
    Tuple(Vec<Expr>, Span),
    If { cond: syn::Expr, then: Box<Block>, els: Box<Block>, span: Span },
}

impl Expr {
    pub(crate) fn span(&self) -> Span {
        match self {
            Expr::Var(i) => i.span(),
            Expr::Lit(_, s) | Expr::Rust(_, s) | Expr::Tuple(_, s) => *s,
            Expr::Binary { span, .. } | Expr::Neg { span, .. } | Expr::Method { span, .. } | Expr::Call { span, .. } | Expr::If { span, .. } => *span,
        }
    }
}
