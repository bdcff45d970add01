//! Op attributes: their kinds ([`AttrKind`]), values ([`Attr`]), defaults and table specs,
//! and [`Attrs`], read access by name, through which the shape rules ([`crate::infer`]) read
//! an op's attributes.

use crate::dim::Dim;
use crate::dtype::DType;

/// The kind of value an attribute holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttrKind {
    /// A signed integer (`axis=-1`).
    Int,
    /// A 64-bit float (`eps=1e-5`, `theta=100000.0`); prints so that it reads back bit-exactly.
    Float,
    /// `true` / `false`.
    Bool,
    /// One of a fixed set of words, printed quoted (`form="tanh"`).
    Enum(&'static [&'static str]),
    /// Any string, printed quoted (a callee's name).
    Str,
    /// A list of integers (`perm=[0, 2, 1, 3]`).
    Ints,
    /// A list of symbolic dims (`shape=[T, 9, 64]`).
    Dims,
    /// One symbolic dim (`start=past`).
    Dim,
    /// A dtype (`dtype=bf16`).
    DType,
}

/// An attribute value.
#[derive(Clone, Debug)]
pub enum Attr {
    /// See [`AttrKind::Int`].
    Int(i64),
    /// See [`AttrKind::Float`].
    Float(f64),
    /// See [`AttrKind::Bool`].
    Bool(bool),
    /// See [`AttrKind::Enum`] and [`AttrKind::Str`].
    Str(String),
    /// See [`AttrKind::Ints`].
    Ints(Vec<i64>),
    /// See [`AttrKind::Dims`].
    Dims(Vec<Dim>),
    /// See [`AttrKind::Dim`].
    Dim(Dim),
    /// See [`AttrKind::DType`].
    DType(DType),
    /// An optional attribute ([`AttrDefault::Absent`]) that is not given: the node carries this
    /// in its slot, the text format omits it. Of no [`AttrKind`]: only an optional attribute's
    /// slot accepts it ([`AttrSpec::accepts`]).
    Absent,
}

impl PartialEq for Attr {
    /// Floats compare by bit pattern, so that a NaN attribute equals itself after a round trip.
    fn eq(&self, other: &Attr) -> bool {
        use Attr::*;
        match (self, other) {
            (Int(a), Int(b)) => a == b,
            (Float(a), Float(b)) => a.to_bits() == b.to_bits(),
            (Bool(a), Bool(b)) => a == b,
            (Str(a), Str(b)) => a == b,
            (Ints(a), Ints(b)) => a == b,
            (Dims(a), Dims(b)) => a == b,
            (Dim(a), Dim(b)) => a == b,
            (DType(a), DType(b)) => a == b,
            (Absent, Absent) => true,
            _ => false,
        }
    }
}
impl Eq for Attr {}

impl Attr {
    /// True when the value is of the given kind (an enum also checks the word is allowed).
    pub fn is_kind(&self, kind: AttrKind) -> bool {
        match (self, kind) {
            (Attr::Int(_), AttrKind::Int)
            | (Attr::Float(_), AttrKind::Float)
            | (Attr::Bool(_), AttrKind::Bool)
            | (Attr::Str(_), AttrKind::Str)
            | (Attr::Ints(_), AttrKind::Ints)
            | (Attr::Dims(_), AttrKind::Dims)
            | (Attr::Dim(_), AttrKind::Dim)
            | (Attr::DType(_), AttrKind::DType) => true,
            (Attr::Str(s), AttrKind::Enum(words)) => words.contains(&s.as_str()),
            _ => false,
        }
    }
}

/// A default attribute value, as a `const`-friendly description.
#[derive(Clone, Copy, Debug)]
pub enum AttrDefault {
    /// The attribute is required.
    Required,
    /// Integer default.
    Int(i64),
    /// Float default.
    Float(f64),
    /// Bool default.
    Bool(bool),
    /// Word default (for enums).
    Str(&'static str),
    /// The empty list (for `Ints` / `Dims`).
    Empty,
    /// Optional: absent unless given ([`Attr::Absent`] in the node's slot); when given, a value
    /// of the attribute's kind.
    Absent,
}

impl AttrDefault {
    /// The default as a value, `None` when required.
    pub fn value(self) -> Option<Attr> {
        match self {
            AttrDefault::Required => None,
            AttrDefault::Int(v) => Some(Attr::Int(v)),
            AttrDefault::Float(v) => Some(Attr::Float(v)),
            AttrDefault::Bool(v) => Some(Attr::Bool(v)),
            AttrDefault::Str(v) => Some(Attr::Str(v.to_string())),
            AttrDefault::Empty => None,
            AttrDefault::Absent => Some(Attr::Absent),
        }
    }
}

/// One attribute of an op.
#[derive(Clone, Copy, Debug)]
pub struct AttrSpec {
    /// Name in the text format.
    pub name: &'static str,
    /// Kind of value.
    pub kind: AttrKind,
    /// Default, or [`AttrDefault::Required`].
    pub default: AttrDefault,
}

impl AttrSpec {
    /// The default value for this spec (an empty list for `Empty`), `None` if required.
    pub fn default_value(&self) -> Option<Attr> {
        match (self.default, self.kind) {
            (AttrDefault::Empty, AttrKind::Dims) => Some(Attr::Dims(vec![])),
            (AttrDefault::Empty, AttrKind::Ints) => Some(Attr::Ints(vec![])),
            (d, _) => d.value(),
        }
    }

    /// Whether this attribute's slot may hold `a`: a value of its kind, or [`Attr::Absent`]
    /// when the attribute is optional.
    pub fn accepts(&self, a: &Attr) -> bool {
        a.is_kind(self.kind) || (matches!(a, Attr::Absent) && matches!(self.default, AttrDefault::Absent))
    }
}

impl Attr {
    /// The integer, for an [`Attr::Int`].
    pub fn as_int(&self) -> Option<i64> {
        match self {
            Attr::Int(v) => Some(*v),
            _ => None,
        }
    }
    /// The float, for an [`Attr::Float`].
    pub fn as_float(&self) -> Option<f64> {
        match self {
            Attr::Float(v) => Some(*v),
            _ => None,
        }
    }
    /// The bool, for an [`Attr::Bool`].
    pub fn as_bool(&self) -> Option<bool> {
        match self {
            Attr::Bool(v) => Some(*v),
            _ => None,
        }
    }
    /// The string, for an [`Attr::Str`].
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Attr::Str(v) => Some(v),
            _ => None,
        }
    }
    /// The integers, for an [`Attr::Ints`].
    pub fn as_ints(&self) -> Option<&[i64]> {
        match self {
            Attr::Ints(v) => Some(v),
            _ => None,
        }
    }
    /// The dims, for an [`Attr::Dims`].
    pub fn as_dims(&self) -> Option<&[Dim]> {
        match self {
            Attr::Dims(v) => Some(v),
            _ => None,
        }
    }
    /// The dim, for an [`Attr::Dim`].
    pub fn as_dim(&self) -> Option<&Dim> {
        match self {
            Attr::Dim(v) => Some(v),
            _ => None,
        }
    }
    /// The dtype, for an [`Attr::DType`].
    pub fn as_dtype(&self) -> Option<DType> {
        match self {
            Attr::DType(v) => Some(*v),
            _ => None,
        }
    }
}

/// Describes an attribute kind in words, for errors.
pub fn kind_text(kind: AttrKind) -> String {
    match kind {
        AttrKind::Int => "an integer".into(),
        AttrKind::Float => "a number".into(),
        AttrKind::Bool => "true or false".into(),
        AttrKind::Enum(w) => format!("one of {}", w.iter().map(|w| format!("\"{w}\"")).collect::<Vec<_>>().join(", ")),
        AttrKind::Str => "a string".into(),
        AttrKind::Ints => "a list of integers".into(),
        AttrKind::Dims => "a list of dims".into(),
        AttrKind::Dim => "a dim".into(),
        AttrKind::DType => "a dtype".into(),
    }
}

/// An op's attributes, read by name: what a shape rule sees of the op
/// ([`crate::infer::InferCtx::op`]); [`crate::ops::Op`] implements it.
pub trait Attrs {
    /// The op's text name (`reduce_sum`), for messages.
    fn op_name(&self) -> &'static str;

    /// The attribute called `name`, if the op has it.
    fn attr(&self, name: &str) -> Option<&Attr>;

    /// Integer attribute, `None` if absent or of another kind.
    fn int(&self, name: &str) -> Option<i64> {
        self.attr(name)?.as_int()
    }
    /// Float attribute.
    fn float(&self, name: &str) -> Option<f64> {
        self.attr(name)?.as_float()
    }
    /// Bool attribute.
    fn bool(&self, name: &str) -> Option<bool> {
        self.attr(name)?.as_bool()
    }
    /// String or enum attribute.
    fn str(&self, name: &str) -> Option<&str> {
        self.attr(name)?.as_str()
    }
    /// Integer-list attribute.
    fn ints(&self, name: &str) -> Option<&[i64]> {
        self.attr(name)?.as_ints()
    }
    /// Dim-list attribute.
    fn dims(&self, name: &str) -> Option<&[Dim]> {
        self.attr(name)?.as_dims()
    }
    /// Dim attribute.
    fn dim(&self, name: &str) -> Option<&Dim> {
        self.attr(name)?.as_dim()
    }
    /// Dtype attribute.
    fn dtype(&self, name: &str) -> Option<DType> {
        self.attr(name)?.as_dtype()
    }
}
