//! The builder API: how the DSL, the model zoo and tests make graphs.
//!
//! Every node is checked against its shape rule as it is added, so a mismatch is reported at
//! graph-build time with both shapes and the caller's source location (`#[track_caller]`).

use std::collections::BTreeMap;
use std::fmt;
use std::panic::Location;

use crate::graph::{Function, Graph, Signature, TensorType, Value};
use crate::ops::{Attr, Op, OpKind};
use crate::verify::infer_op;

/// A node could not be added, or a function could not be finished.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildError {
    /// The user's source location that asked for the node.
    pub location: &'static Location<'static>,
    /// The function being built.
    pub func: String,
    /// The op, if the error is about one.
    pub op: Option<&'static str>,
    /// The operand types, printed.
    pub operands: String,
    /// The rule broken.
    pub rule: String,
}

impl fmt::Display for BuildError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: in @{}", self.location.file(), self.location.line(), self.location.column(), self.func)?;
        if let Some(op) = self.op {
            write!(f, ", `{op}`({})", self.operands)?;
        }
        write!(f, ": {}", self.rule)
    }
}

impl std::error::Error for BuildError {}

/// Builds one function of a graph. Callees must already be in the graph.
pub struct FunctionBuilder {
    func: Function,
    callees: BTreeMap<String, Signature>,
}

impl FunctionBuilder {
    /// Starts a function called `name` that may call the functions already in `graph`.
    pub fn new(graph: &Graph, name: impl Into<String>) -> FunctionBuilder {
        let callees = graph.funcs.values().map(|f| (f.name.clone(), f.signature())).collect();
        FunctionBuilder { func: Function::new(name), callees }
    }

    /// Adds a named parameter.
    pub fn param(&mut self, name: &str, ty: TensorType) -> Value {
        self.func.add_param(Some(name.to_string()), ty)
    }

    /// The function built so far.
    pub fn func(&self) -> &Function {
        &self.func
    }

    /// The function built so far, mutably (for renaming; keep its invariants).
    pub fn func_mut(&mut self) -> &mut Function {
        &mut self.func
    }

    /// Type of a value.
    pub fn ty(&self, v: Value) -> &TensorType {
        self.func.ty(v)
    }

    /// A [`BuildError`] at the caller's location.
    #[track_caller]
    pub fn error_at(&self, op: Option<&'static str>, inputs: &[Value], rule: String) -> BuildError {
        BuildError {
            location: Location::caller(),
            func: self.func.name.clone(),
            op,
            operands: inputs
                .iter()
                .map(|&v| self.func.values.get(v).map(|d| d.ty.to_string()).unwrap_or_else(|| format!("<undefined {v}>")))
                .collect::<Vec<_>>()
                .join(", "),
            rule,
        }
    }

    /// Adds a node; returns its results.
    ///
    /// # Errors
    /// Unknown or ill-typed attributes, wrong arity, a broken shape rule, an undefined operand
    /// or callee, each with the caller's location.
    #[track_caller]
    pub fn op(&mut self, kind: OpKind, inputs: &[Value], attrs: Vec<(&str, Attr)>) -> Result<Vec<Value>, BuildError> {
        let name = Some(kind.name());
        let op = Op::new(kind, attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()).map_err(|e| self.error_at(name, inputs, e.to_string()))?;
        if let Some(bad) = inputs.iter().find(|v| self.func.values.get(**v).is_none()) {
            return Err(self.error_at(name, &[], format!("operand {bad} is not a value of this function")));
        }
        let callee = if kind == OpKind::Call {
            let f = op.str("func").unwrap_or("");
            Some(self.callees.get(f).ok_or_else(|| self.error_at(name, inputs, format!("@{f} is not defined")))?)
        } else {
            None
        };
        let types: Vec<&TensorType> = inputs.iter().map(|&v| &self.func.values[v].ty).collect();
        let out = infer_op(&op, types, callee).map_err(|r| self.error_at(name, inputs, r))?;
        Ok(self.func.push_node(op, inputs.to_vec(), out).1)
    }

    /// Adds a node with exactly one result.
    ///
    /// # Errors
    /// As [`FunctionBuilder::op`], and when the op does not give one result.
    #[track_caller]
    pub fn op1(&mut self, kind: OpKind, inputs: &[Value], attrs: Vec<(&str, Attr)>) -> Result<Value, BuildError> {
        let r = self.op(kind, inputs, attrs)?;
        match r.as_slice() {
            [v] => Ok(*v),
            _ => Err(self.error_at(Some(kind.name()), inputs, format!("`{}` gives {} results, one was expected", kind.name(), r.len()))),
        }
    }

    /// Names a value (`let` bindings, outputs). The name must be unique in the function.
    ///
    /// # Errors
    /// When another value already has this name.
    #[track_caller]
    pub fn name(&mut self, v: Value, name: &str) -> Result<(), BuildError> {
        if crate::text::is_reserved_name(name) || name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '.') {
            return Err(self.error_at(None, &[], format!("`{name}` is not a usable value name (letters, digits, `_` and `.`; `vN` is reserved)")));
        }
        if self.func.values.iter().any(|(o, d)| o != v && d.name.as_deref() == Some(name)) {
            return Err(self.error_at(None, &[], format!("value name %{name} is used twice")));
        }
        self.func.values[v].name = Some(name.to_string());
        Ok(())
    }

    /// Sets the outputs and returns the function.
    ///
    /// # Errors
    /// When an output is not a value of this function.
    #[track_caller]
    pub fn finish(mut self, outputs: &[Value]) -> Result<Function, BuildError> {
        if let Some(bad) = outputs.iter().find(|v| self.func.values.get(**v).is_none()) {
            return Err(self.error_at(None, &[], format!("output {bad} is not a value of this function")));
        }
        self.func.outputs = outputs.to_vec();
        Ok(self.func)
    }
}
