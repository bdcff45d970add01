//! The builder surface the `graph!` macro of `sinter-dsl` expands to.
//!
//! A [`Scope`] builds one function. Every method is `#[track_caller]`, and the macro emits each
//! call with the span of the user's operator or method, so a [`BuildError`] points at the
//! user's source line. It is usable by hand too, but the macro is the intended front end.

use crate::builder::{BuildError, FunctionBuilder};
use crate::dim::Dim;
use crate::dtype::DType;
use crate::graph::{Function, Graph, TensorType, Value};
use crate::ops::{Attr, OpKind};

impl From<i64> for Attr {
    fn from(v: i64) -> Attr {
        Attr::Int(v)
    }
}
impl From<i32> for Attr {
    fn from(v: i32) -> Attr {
        Attr::Int(v as i64)
    }
}
impl From<usize> for Attr {
    fn from(v: usize) -> Attr {
        Attr::Int(v as i64)
    }
}
impl From<f64> for Attr {
    fn from(v: f64) -> Attr {
        Attr::Float(v)
    }
}
impl From<f32> for Attr {
    fn from(v: f32) -> Attr {
        Attr::Float(v as f64)
    }
}
impl From<bool> for Attr {
    fn from(v: bool) -> Attr {
        Attr::Bool(v)
    }
}
impl From<&str> for Attr {
    fn from(v: &str) -> Attr {
        Attr::Str(v.to_string())
    }
}
impl From<String> for Attr {
    fn from(v: String) -> Attr {
        Attr::Str(v)
    }
}
impl From<DType> for Attr {
    fn from(v: DType) -> Attr {
        Attr::DType(v)
    }
}
impl From<Dim> for Attr {
    fn from(v: Dim) -> Attr {
        Attr::Dim(v)
    }
}
impl From<Vec<Dim>> for Attr {
    fn from(v: Vec<Dim>) -> Attr {
        Attr::Dims(v)
    }
}
impl From<Vec<i64>> for Attr {
    fn from(v: Vec<i64>) -> Attr {
        Attr::Ints(v)
    }
}

/// Converts the integer types a config holds into a [`Dim`] (`bf16[T, cfg.hidden]`).
pub trait IntoDim {
    /// The dim.
    fn into_dim(self) -> Dim;
}
macro_rules! into_dim_int {
    ($($t:ty),*) => {$(impl IntoDim for $t { fn into_dim(self) -> Dim { Dim::constant(self as i64) } })*};
}
into_dim_int!(i32, i64, u32, u64, usize);
impl IntoDim for Dim {
    fn into_dim(self) -> Dim {
        self
    }
}
impl IntoDim for &Dim {
    fn into_dim(self) -> Dim {
        self.clone()
    }
}

/// What may stand beside a tensor in a binary operation of the DSL: another tensor, or a
/// Rust number that becomes a scalar constant of the other operand's dtype (`x * {scale}`).
pub trait Operand {
    /// The operand as a value of `scope`; `like` is the tensor on the other side, if known.
    ///
    /// # Errors
    /// A number with no tensor beside it to take a dtype from.
    fn into_operand(self, scope: &mut Scope, like: Option<Value>) -> Result<Value, BuildError>;
}

impl Operand for Value {
    fn into_operand(self, _: &mut Scope, _: Option<Value>) -> Result<Value, BuildError> {
        Ok(self)
    }
}

macro_rules! operand_number {
    ($($t:ty),*) => {$(
        impl Operand for $t {
            #[track_caller]
            fn into_operand(self, scope: &mut Scope, like: Option<Value>) -> Result<Value, BuildError> {
                match like {
                    Some(l) => scope.scalar_like(l, self as f64),
                    None => Err(scope.b.error_at(None, &[], format!("the number {} needs a tensor beside it to take its dtype from", self))),
                }
            }
        }
    )*};
}
operand_number!(f64, f32, i64, i32, usize);

/// Builds one function of a graph for the `graph!` macro.
pub struct Scope {
    b: FunctionBuilder,
}

impl Scope {
    /// Starts function `name`; it may call every function already in `graph`.
    pub fn new(graph: &Graph, name: &str) -> Scope {
        Scope { b: FunctionBuilder::new(graph, name) }
    }

    /// Declares a parameter (a function input or a weight).
    ///
    /// # Errors
    /// When another value of the function already has this name.
    #[track_caller]
    pub fn param(&mut self, name: impl AsRef<str>, ty: TensorType) -> Result<Value, BuildError> {
        let v = self.b.param("__unnamed", ty);
        self.b.func_mut().values[v].name = None;
        self.b.name(v, name.as_ref())?;
        Ok(v)
    }

    /// Type of a value.
    pub fn ty(&self, v: Value) -> &TensorType {
        self.b.ty(v)
    }

    /// Applies a one-result op.
    ///
    /// # Errors
    /// See [`FunctionBuilder::op`].
    #[track_caller]
    pub fn op1(&mut self, kind: OpKind, inputs: &[Value], attrs: Vec<(&str, Attr)>) -> Result<Value, BuildError> {
        self.b.op1(kind, inputs, attrs)
    }

    /// Applies an op with `N` results (`kv_append` has two).
    ///
    /// # Errors
    /// See [`FunctionBuilder::op`]; also when the op does not give `N` results.
    #[track_caller]
    pub fn opn<const N: usize>(&mut self, kind: OpKind, inputs: &[Value], attrs: Vec<(&str, Attr)>) -> Result<[Value; N], BuildError> {
        let r = self.b.op(kind, inputs, attrs)?;
        let n = r.len();
        r.try_into().map_err(|_| self.b.error_at(Some(kind.name()), inputs, format!("`{}` gives {n} results, {N} were expected", kind.name())))
    }

    /// A scalar constant with the dtype of `like` (for literals such as `x * 0.5`).
    ///
    /// # Errors
    /// See [`FunctionBuilder::op`].
    #[track_caller]
    pub fn scalar_like(&mut self, like: Value, value: f64) -> Result<Value, BuildError> {
        let dtype = self.b.ty(like).dtype;
        if !dtype.is_float() && dtype.round(value) != value {
            let t = self.b.ty(like).to_string();
            return Err(self.b.error_at(Some("constant"), &[like], format!("the number {value} beside a {t} tensor is not representable in {dtype} (cast the tensor to a float type first)")));
        }
        self.b.op1(OpKind::Constant, &[], vec![("value", Attr::Float(value)), ("dtype", Attr::DType(dtype)), ("shape", Attr::Dims(vec![]))])
    }

    /// Calls function `func` (defined earlier in the same graph) and returns its `N` results.
    ///
    /// # Errors
    /// Unknown function, argument types that do not match its parameters.
    #[track_caller]
    pub fn call<const N: usize>(&mut self, func: &str, args: &[Value]) -> Result<[Value; N], BuildError> {
        self.opn(OpKind::Call, args, vec![("func", Attr::Str(func.to_string()))])
    }

    /// Names a value (must be unique in the function).
    ///
    /// # Errors
    /// When the name is taken or not a valid name.
    #[track_caller]
    pub fn name(&mut self, v: Value, name: &str) -> Result<(), BuildError> {
        self.b.name(v, name)
    }

    /// Finishes the function, checking the outputs against the declared return types.
    ///
    /// # Errors
    /// When an output's type differs from the declared one.
    #[track_caller]
    pub fn finish(self, outputs: &[Value], declared: &[TensorType]) -> Result<Function, BuildError> {
        if outputs.len() != declared.len() {
            return Err(self.b.error_at(None, outputs, format!("the function returns {} values but declares {}", outputs.len(), declared.len())));
        }
        for (i, (&o, d)) in outputs.iter().zip(declared).enumerate() {
            let got = self.b.ty(o);
            if got != d {
                return Err(self.b.error_at(None, &[], format!("return value {i} is {got} but the function declares {d}")));
            }
        }
        let mut f = self.b.finish(outputs)?;
        f.canonicalize();
        Ok(f)
    }
}
