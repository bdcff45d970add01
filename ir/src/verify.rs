//! The verifier: checks a [`Graph`] against the op table's arity, attribute and shape rules.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::dim::Dim;
use crate::graph::{Function, Graph, Node, Signature, TensorType, Value, ValueDef};
use crate::infer::InferCtx;
use crate::ops::{kind_text, Op, OpKind};

/// A rule a graph broke, located at a function and, where there is one, a node.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifyError {
    /// The function (`@name`).
    pub func: String,
    /// The node, when the error is about one (`n3`).
    pub node: Option<Node>,
    /// The op's text name, when the error is about a node.
    pub op: Option<&'static str>,
    /// The operand types, printed (`bf16[T, 576], bf16[64, 64]`).
    pub operands: String,
    /// The node's results as the text format labels them (`%scores`, `%v7`), so that the
    /// error can be found in a `.sir` file; empty when the error is not about a node.
    pub results: String,
    /// The rule broken.
    pub rule: String,
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "in @{}", self.func)?;
        if let (Some(n), Some(op)) = (self.node, self.op) {
            write!(f, ", {n}")?;
            if !self.results.is_empty() {
                write!(f, " {} =", self.results)?;
            }
            write!(f, " `{op}`({})", self.operands)?;
        }
        write!(f, ": {}", self.rule)
    }
}

impl std::error::Error for VerifyError {}

fn types_text(f: &Function, vals: &[Value]) -> String {
    vals.iter()
        .map(|&v| f.values.get(v).map(|d| d.ty.to_string()).unwrap_or_else(|| format!("<undefined {v}>")))
        .collect::<Vec<_>>()
        .join(", ")
}

fn labels_text(f: &Function, vals: &[Value]) -> String {
    vals.iter().map(|&v| f.label(v)).collect::<Vec<_>>().join(", ")
}

/// Checks arity and attributes of `op` applied to `n` operands. Shared with the builder.
pub(crate) fn check_op_form(op: &Op, n: usize) -> Result<(), String> {
    let info = op.kind.info();
    if !op.kind.arity_ok(n) || (op.kind == OpKind::Concat && n == 0) {
        let text = op.kind.arity_text();
        let noun = if text.ends_with(" 1") || text == "1" { "operand" } else { "operands" };
        return Err(format!("`{}` takes {text} {noun} ({}), got {n}", info.name, info.operands.join(", ")));
    }
    if op.attrs.len() != info.attrs.len() {
        return Err(format!("`{}` has {} attributes, the node carries {}", info.name, info.attrs.len(), op.attrs.len()));
    }
    for (a, spec) in op.attrs.iter().zip(info.attrs) {
        if !spec.accepts(a) {
            return Err(format!("attribute `{}` must be {}", spec.name, kind_text(spec.kind)));
        }
    }
    Ok(())
}

/// Runs an op's shape rule. Shared with the builder.
pub(crate) fn infer_op(op: &Op, inputs: Vec<&TensorType>, callee: Option<&Signature>) -> Result<Vec<TensorType>, String> {
    check_op_form(op, inputs.len())?;
    crate::storage::check_quantized(op, &inputs, &[]).map_err(|e| e.0)?;
    crate::storage::check_fp8(op, &inputs, &[]).map_err(|e| e.0)?;
    let results = (op.kind.info().infer)(&InferCtx { op, inputs: inputs.clone(), callee }).map_err(|e| e.0)?;
    crate::storage::check_quantized(op, &[], &results).map_err(|e| e.0)?;
    crate::storage::check_fp8(op, &[], &results).map_err(|e| e.0)?;
    Ok(results)
}

/// Verifies every function of a graph.
///
/// Checks: function names unique, callees defined before callers (so calls cannot recurse),
/// value names unique per function, every operand defined before use, every node's arity,
/// attributes and shape rule, declared result types equal to inferred ones, no negative
/// constant dims.
///
/// # Errors
/// The first [`VerifyError`] found, in definition order.
pub fn verify(g: &Graph) -> Result<(), VerifyError> {
    let mut sigs: BTreeMap<&str, Signature> = BTreeMap::new();
    for f in g.funcs.values() {
        if sigs.contains_key(f.name.as_str()) {
            return Err(VerifyError {
                func: f.name.clone(),
                node: None,
                op: None,
                operands: String::new(),
                results: String::new(),
                rule: format!("function @{} is defined twice", f.name),
            });
        }
        verify_function(f, &sigs)?;
        sigs.insert(&f.name, f.signature());
    }
    Ok(())
}

/// Verifies one function given the signatures of the functions it may call.
///
/// # Errors
/// See [`verify`].
pub fn verify_function(f: &Function, callees: &BTreeMap<&str, Signature>) -> Result<(), VerifyError> {
    let fail = |node: Option<Node>, rule: String| {
        let (op, operands, results) = match node.and_then(|n| f.nodes.get(n)) {
            Some(d) => (Some(d.op.kind.name()), types_text(f, &d.inputs), labels_text(f, &d.results)),
            None => (None, String::new(), String::new()),
        };
        VerifyError { func: f.name.clone(), node, op, operands, results, rule }
    };
    // Structure first, so that the checks below can index tables without panicking on a
    // function assembled by hand (its fields are public).
    for (i, &p) in f.params.iter().enumerate() {
        if f.values.get(p).map(|d| d.def) != Some(ValueDef::Param(i)) {
            return Err(fail(None, format!("parameter {i} ({p}) is not a value defined as that parameter")));
        }
    }
    for (node, nd) in f.nodes.iter() {
        for (i, &r) in nd.results.iter().enumerate() {
            if f.values.get(r).map(|d| d.def) != Some(ValueDef::Result(node, i)) {
                return Err(fail(None, format!("result {i} of {node} ({r}) is not a value defined as that result")));
            }
        }
    }
    let mut names = BTreeSet::new();
    for (v, d) in f.values.iter() {
        if let Some(n) = &d.name {
            if !names.insert(n.as_str()) {
                return Err(fail(None, format!("value name %{n} is used twice")));
            }
        }
        for dim in &d.ty.shape {
            if dim.as_const().is_some_and(|c| c < 0) {
                return Err(fail(None, format!("{} has a negative dimension in {}", f.label(v), d.ty)));
            }
        }
        // The constant dims' element count, and its bytes, must fit an i64: kernels index
        // and size buffers with 64-bit integers (symbolic dims are checked when bound).
        let elements = d.ty.shape.iter().filter_map(Dim::as_const).try_fold(1i64, i64::checked_mul);
        if elements.and_then(|n| n.checked_mul(d.ty.dtype.size_bytes().max(1) as i64)).is_none() {
            return Err(fail(None, format!("{} has more elements than a 64-bit size can count in {}", f.label(v), d.ty)));
        }
        if let Err(e) = crate::storage::check_quantized_type(&d.ty) {
            return Err(fail(None, format!("{}: {e}", f.label(v))));
        }
        let ok = match d.def {
            ValueDef::Param(i) => f.params.get(i) == Some(&v),
            ValueDef::Result(n, i) => f.nodes.get(n).is_some_and(|nd| nd.results.get(i) == Some(&v)),
        };
        if !ok {
            return Err(fail(None, format!("{v}'s definition {:?} does not point back to it", d.def)));
        }
    }
    let mut defined: BTreeSet<Value> = f.params.iter().copied().collect();
    for (node, nd) in f.nodes.iter() {
        for &i in &nd.inputs {
            if !defined.contains(&i) {
                return Err(fail(Some(node), format!("operand {i} is used before it is defined")));
            }
        }
        let callee = if nd.op.kind == OpKind::Call {
            let name = nd.op.str("func").unwrap_or("");
            match callees.get(name) {
                Some(s) => Some(s),
                None => return Err(fail(Some(node), format!("@{name} is not defined before this call"))),
            }
        } else {
            None
        };
        let inputs: Vec<&TensorType> = nd.inputs.iter().map(|&v| &f.values[v].ty).collect();
        let inferred = infer_op(&nd.op, inputs, callee).map_err(|r| fail(Some(node), r))?;
        if inferred.len() != nd.results.len() {
            return Err(fail(Some(node), format!("the op gives {} results, the node declares {}", inferred.len(), nd.results.len())));
        }
        for (&r, t) in nd.results.iter().zip(&inferred) {
            let declared = &f.values[r].ty;
            if declared != t {
                return Err(fail(Some(node), format!("result {} is declared {declared} but the op gives {t}", f.label(r))));
            }
            defined.insert(r);
        }
    }
    for &o in &f.outputs {
        if !defined.contains(&o) {
            return Err(fail(None, format!("output {o} is not defined")));
        }
    }
    Ok(())
}
