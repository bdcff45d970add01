//! The e-graph language over sinter's ops ([`Sir`]) and its analysis ([`SirAnalysis`]).
//!
//! **One op table.** An e-node is either an op of [`OP_TABLE`](sinter_ir::OP_TABLE) — any row,
//! with its attributes carried *in the symbol* ([`OpSym`]: the op kind plus a canonical key of
//! its attribute values, so two nodes match only when kind and every attribute agree) — or one
//! of three structural nodes: a function parameter, the projection of one result of a
//! multi-result op (`kv_append`, `call`), and the tuple that roots a function with several
//! outputs (egg extracts from one root). Nothing else: the language is generated from the
//! table, and `tests` check that every row converts and round-trips.
//!
//! **Canonical attributes.** When a function enters the e-graph, `transpose` becomes the
//! `permute` it is sugar for, and every `axis` of a reduction, row op, `concat` or `slice` is
//! written counting from the end (`-1` is the last axis), so that equal computations hash
//! equal and rules test `axis == -1` for "the last axis".
//!
//! **Analysis.** Each e-class carries the [`TensorType`]s of its value (one for an ordinary
//! op, several for a multi-result op or a tuple) and, when known, the value every element of a
//! constant has (`constant`, and `reshape`/`broadcast`/`cast` of one). Types come from the op
//! table's shape rules ([`sinter_ir::infer`]). `merge` never trusts a union: two classes with
//! different types or different known constants are a *conflict*, recorded in
//! [`SirAnalysis::conflicts`] with both sides, and the optimiser stops with a located error.
//! Rules are checked before they union (see [`crate::rules`]), so a conflict names the rule.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use egg::{Analysis, DidMerge, EGraph, Id, Language};
use sinter_ir::infer::InferCtx;
use sinter_ir::{Attr, DType, Dim, Function, Op, OpKind, Signature, TensorType, Value, ValueDef};

/// An op with its attributes, as the symbol of an e-node. Equality, order and hash go by the
/// op kind and a canonical text key of the attribute values (floats by bit pattern).
#[derive(Clone)]
pub struct OpSym {
    op: Arc<Op>,
    key: Arc<str>,
}

impl OpSym {
    /// The symbol of `op`.
    pub fn new(op: Op) -> OpSym {
        let key: String = op.attrs.iter().map(attr_key).collect::<Vec<_>>().join(",");
        OpSym { op: Arc::new(op), key: key.into() }
    }

    /// The op.
    pub fn op(&self) -> &Op {
        &self.op
    }

    /// The op kind.
    pub fn kind(&self) -> OpKind {
        self.op.kind
    }
}

impl PartialEq for OpSym {
    fn eq(&self, other: &OpSym) -> bool {
        self.op.kind == other.op.kind && (Arc::ptr_eq(&self.key, &other.key) || self.key == other.key)
    }
}
impl Eq for OpSym {}
impl PartialOrd for OpSym {
    fn partial_cmp(&self, other: &OpSym) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for OpSym {
    fn cmp(&self, other: &OpSym) -> std::cmp::Ordering {
        (self.op.kind, &*self.key).cmp(&(other.op.kind, &*other.key))
    }
}
impl std::hash::Hash for OpSym {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.op.kind.hash(state);
        self.key.hash(state);
    }
}
impl fmt::Debug for OpSym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self)
    }
}
impl fmt::Display for OpSym {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.op.kind.name())?;
        let specs = self.op.kind.info().attrs;
        let shown: Vec<String> = specs
            .iter()
            .zip(&self.op.attrs)
            .filter(|(s, a)| s.default_value().as_ref() != Some(*a))
            .map(|(s, a)| format!("{}={}", s.name, attr_text(a)))
            .collect();
        if !shown.is_empty() {
            write!(f, "{{{}}}", shown.join(", "))?;
        }
        Ok(())
    }
}

/// A canonical key of one attribute value (floats by bits, so `-0.0 != 0.0` and NaN == NaN).
fn attr_key(a: &Attr) -> String {
    match a {
        Attr::Int(v) => format!("i{v}"),
        Attr::Float(v) => format!("f{:x}", v.to_bits()),
        Attr::Bool(v) => format!("b{}", u8::from(*v)),
        Attr::Str(s) => format!("s{s:?}"),
        Attr::Ints(v) => format!("I{v:?}"),
        Attr::Dims(v) => format!("D[{}]", v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(";")),
        Attr::Dim(d) => format!("d{d}"),
        Attr::DType(d) => format!("t{d}"),
        Attr::Absent => "-".into(),
    }
}

/// An attribute value as the text format writes it (for messages and DOT labels).
pub fn attr_text(a: &Attr) -> String {
    match a {
        Attr::Int(v) => v.to_string(),
        Attr::Float(v) => format!("{v:?}"),
        Attr::Bool(v) => v.to_string(),
        Attr::Str(s) => format!("{s:?}"),
        Attr::Ints(v) => format!("{v:?}"),
        Attr::Dims(v) => format!("[{}]", v.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")),
        Attr::Dim(d) => d.to_string(),
        Attr::DType(d) => d.to_string(),
        Attr::Absent => "absent".into(),
    }
}

/// An e-node of sinter's e-graph language.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Sir {
    /// Parameter `i` of the function being optimised (a leaf).
    Param(u32),
    /// An op of the op table applied to its operands (in table order).
    Op(OpSym, Vec<Id>),
    /// Result `i` of a multi-result op (`kv_append`, `call`).
    Proj(u32, [Id; 1]),
    /// The outputs of the function, in order: the root that extraction starts from.
    Tuple(Vec<Id>),
}

/// What [`Sir::discriminant`] compares: the variant, its index or arity, and the op symbol.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SirDiscriminant(u8, u32, Option<OpSym>);

impl Language for Sir {
    type Discriminant = SirDiscriminant;

    fn discriminant(&self) -> SirDiscriminant {
        match self {
            Sir::Param(i) => SirDiscriminant(0, *i, None),
            Sir::Op(s, ch) => SirDiscriminant(1, ch.len() as u32, Some(s.clone())),
            Sir::Proj(i, _) => SirDiscriminant(2, *i, None),
            Sir::Tuple(ch) => SirDiscriminant(3, ch.len() as u32, None),
        }
    }

    fn matches(&self, other: &Sir) -> bool {
        match (self, other) {
            (Sir::Param(a), Sir::Param(b)) => a == b,
            (Sir::Op(a, x), Sir::Op(b, y)) => a == b && x.len() == y.len(),
            (Sir::Proj(a, _), Sir::Proj(b, _)) => a == b,
            (Sir::Tuple(x), Sir::Tuple(y)) => x.len() == y.len(),
            _ => false,
        }
    }

    fn children(&self) -> &[Id] {
        match self {
            Sir::Param(_) => &[],
            Sir::Op(_, ch) | Sir::Tuple(ch) => ch,
            Sir::Proj(_, ch) => ch,
        }
    }

    fn children_mut(&mut self) -> &mut [Id] {
        match self {
            Sir::Param(_) => &mut [],
            Sir::Op(_, ch) | Sir::Tuple(ch) => ch,
            Sir::Proj(_, ch) => ch,
        }
    }
}

impl fmt::Display for Sir {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Sir::Param(i) => write!(f, "param{i}"),
            Sir::Op(s, _) => write!(f, "{s}"),
            Sir::Proj(i, _) => write!(f, "proj{i}"),
            Sir::Tuple(_) => f.write_str("tuple"),
        }
    }
}

impl Sir {
    /// The op, when this is an op node.
    pub fn op(&self) -> Option<&Op> {
        match self {
            Sir::Op(s, _) => Some(s.op()),
            _ => None,
        }
    }

    /// The op kind, when this is an op node.
    pub fn kind(&self) -> Option<OpKind> {
        self.op().map(|o| o.kind)
    }
}

/// The facts an e-class carries.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassData {
    /// The value's types: one for an ordinary op, one per result for a multi-result op or a
    /// tuple. Empty only for a node whose shape rule failed (which rules never add).
    pub tys: Vec<TensorType>,
    /// The value of every element, when the class is a splat constant (already rounded to its
    /// dtype).
    pub konst: Option<f64>,
}

impl ClassData {
    /// The single type of an ordinary value.
    pub fn ty(&self) -> Option<&TensorType> {
        match self.tys.as_slice() {
            [t] => Some(t),
            _ => None,
        }
    }
}

/// A union that the analysis refused: two classes with different types or constants.
#[derive(Clone, Debug, PartialEq)]
pub struct Conflict {
    /// The rule that asked for the union, when known.
    pub rule: Option<String>,
    /// The e-class (or classes) involved.
    pub class: String,
    /// What differed, with both sides.
    pub message: String,
}

impl fmt::Display for Conflict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.rule {
            Some(r) => write!(f, "rule `{r}` at e-class {}: {}", self.class, self.message),
            None => write!(f, "e-class {}: {}", self.class, self.message),
        }
    }
}

/// The shape/dtype/constant analysis of one function's e-graph.
#[derive(Clone, Debug, Default)]
pub struct SirAnalysis {
    /// The function's parameter types (what `Param(i)` is).
    pub params: Vec<TensorType>,
    /// Which parameters are weights ([`crate::hoist::weight_masks`]); `None`: guessed from
    /// the parameter types ([`crate::hoist::infer_weights`]).
    pub weights: Option<Vec<bool>>,
    /// Signatures of the functions `call` nodes may name.
    pub callees: BTreeMap<String, Signature>,
    /// Unions refused so far; the optimiser stops at the first.
    pub conflicts: Vec<Conflict>,
}

/// The e-graph type of the passes.
pub type SirEGraph = EGraph<Sir, SirAnalysis>;

fn same_const(a: f64, b: f64) -> bool {
    a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan()) || a == b
}

/// Result types of `op` on operands of `inputs` types, by the op table's shape rule.
pub fn infer(op: &Op, inputs: &[&TensorType], callees: &BTreeMap<String, Signature>) -> Result<Vec<TensorType>, String> {
    if !op.kind.arity_ok(inputs.len()) || (op.kind == OpKind::Concat && inputs.is_empty()) {
        return Err(format!("`{}` takes {} operands, got {}", op.kind.name(), op.kind.arity_text(), inputs.len()));
    }
    let callee = if op.kind == OpKind::Call {
        let name = op.str("func").unwrap_or("");
        Some(callees.get(name).ok_or_else(|| format!("@{name} is not a known function"))?)
    } else {
        None
    };
    // Where f8e4m3 may appear is part of the rule: no rewrite builds arithmetic on it.
    sinter_ir::storage::check_fp8(op, inputs, &[]).map_err(|e| e.0)?;
    let out = (op.kind.info().infer)(&InferCtx { op, inputs: inputs.to_vec(), callee }).map_err(|e| e.0)?;
    sinter_ir::storage::check_fp8(op, &[], &out).map_err(|e| e.0)?;
    Ok(out)
}

impl Analysis<Sir> for SirAnalysis {
    type Data = ClassData;

    fn make(egraph: &mut SirEGraph, enode: &Sir, _id: Id) -> ClassData {
        match enode {
            Sir::Param(i) => ClassData { tys: egraph.analysis.params.get(*i as usize).cloned().into_iter().collect(), konst: None },
            Sir::Proj(i, [c]) => ClassData { tys: egraph[*c].data.tys.get(*i as usize).cloned().into_iter().collect(), konst: None },
            Sir::Tuple(ch) => ClassData { tys: ch.iter().filter_map(|c| egraph[*c].data.ty().cloned()).collect(), konst: None },
            Sir::Op(sym, ch) => {
                let op = sym.op();
                let tys: Option<Vec<&TensorType>> = ch.iter().map(|c| egraph[*c].data.ty()).collect();
                let out = match tys {
                    Some(tys) => infer(op, &tys, &egraph.analysis.callees).unwrap_or_default(),
                    None => vec![],
                };
                let konst = match op.kind {
                    OpKind::Constant => match (op.float("value"), op.dtype("dtype")) {
                        (Some(v), Some(dt)) => Some(dt.round(v)),
                        _ => None,
                    },
                    OpKind::Reshape | OpKind::Broadcast => ch.first().and_then(|c| egraph[*c].data.konst),
                    OpKind::Cast => match (ch.first().and_then(|c| egraph[*c].data.konst), op.dtype("dtype")) {
                        (Some(v), Some(dt)) => Some(dt.round(v)),
                        _ => None,
                    },
                    _ => None,
                };
                ClassData { tys: out, konst }
            }
        }
    }

    fn merge(&mut self, a: &mut ClassData, b: ClassData) -> DidMerge {
        if a.tys != b.tys {
            let show = |t: &[TensorType]| t.iter().map(|t| t.to_string()).collect::<Vec<_>>().join(", ");
            self.conflicts.push(Conflict {
                rule: None,
                class: "(merge)".into(),
                message: format!("a union of a {} value with a {} value", show(&a.tys), show(&b.tys)),
            });
            return DidMerge(false, true);
        }
        match (a.konst, b.konst) {
            (Some(x), Some(y)) if !same_const(x, y) => {
                self.conflicts.push(Conflict {
                    rule: None,
                    class: "(merge)".into(),
                    message: format!("a union of the constants {x} and {y}"),
                });
                DidMerge(false, true)
            }
            (None, Some(y)) => {
                a.konst = Some(y);
                DidMerge(true, false)
            }
            (Some(_), None) => DidMerge(false, true),
            _ => DidMerge(false, false),
        }
    }
}

/// Normalises an axis to count from the end (`-1` = last), given the rank.
pub fn neg_axis(axis: i64, rank: usize) -> i64 {
    let r = rank as i64;
    if axis >= 0 {
        axis - r
    } else {
        axis
    }
}

/// The canonical form of `op` applied to operands of `inputs` types: `transpose` as `permute`,
/// axes counted from the end, `iota` axes from the start.
pub fn canonical_op(op: &Op, inputs: &[&TensorType]) -> Op {
    let rank = inputs.first().map(|t| t.rank()).unwrap_or(0);
    let mut op = op.clone();
    match op.kind {
        OpKind::Transpose => {
            let norm = |a: i64| if a < 0 { a + rank as i64 } else { a };
            let (a, b) = (norm(op.int("dim0").unwrap_or(-2)), norm(op.int("dim1").unwrap_or(-1)));
            let mut perm: Vec<i64> = (0..rank as i64).collect();
            if (0..rank as i64).contains(&a) && (0..rank as i64).contains(&b) {
                perm.swap(a as usize, b as usize);
                if let Ok(p) = Op::new(OpKind::Permute, vec![("perm".into(), Attr::Ints(perm))]) {
                    return p;
                }
            }
        }
        OpKind::ReduceSum
        | OpKind::ReduceMax
        | OpKind::ReduceMin
        | OpKind::ReduceMean
        | OpKind::Softmax
        | OpKind::LogSoftmax
        | OpKind::Concat
        | OpKind::Slice => {
            if let (Some(i), Some(a)) = (op.kind.attr_index("axis"), op.int("axis")) {
                op.attrs[i] = Attr::Int(neg_axis(a, rank));
            }
        }
        OpKind::Iota => {
            if let (Some(i), Some(a), Some(s)) = (op.kind.attr_index("axis"), op.int("axis"), op.dims("shape")) {
                if a < 0 {
                    op.attrs[i] = Attr::Int(a + s.len() as i64);
                }
            }
        }
        _ => {}
    }
    op
}

/// A function loaded into an e-graph.
pub struct Loaded {
    /// The e-graph.
    pub egraph: SirEGraph,
    /// The root: a tuple of the outputs.
    pub root: Id,
    /// The e-class of every value of the function (parameters and node results).
    pub value_class: BTreeMap<Value, Id>,
    /// For every node of the function, the e-node it became (children as first added), in
    /// node order: what the consistency check evaluates first.
    pub original: Vec<(Id, Sir)>,
}

/// Loads a function into a fresh e-graph (canonicalising ops as [`canonical_op`] says), its
/// weight parameters guessed from their types ([`load_with_weights`] to name them).
///
/// # Errors
/// A node whose shape rule fails (an unverified graph), naming the node.
pub fn load(f: &Function, callees: &BTreeMap<String, Signature>) -> Result<Loaded, String> {
    load_with_weights(f, callees, None)
}

/// [`load`] with the parameters that are weights flagged (`weights[i]` for parameter `i`, as
/// [`crate::hoist::weight_masks`] gives them); `None` guesses them.
///
/// # Errors
/// As [`load`].
pub fn load_with_weights(f: &Function, callees: &BTreeMap<String, Signature>, weights: Option<&[bool]>) -> Result<Loaded, String> {
    let analysis = SirAnalysis { params: f.params.iter().map(|&p| f.ty(p).clone()).collect(), weights: weights.map(<[bool]>::to_vec), callees: callees.clone(), conflicts: vec![] };
    let mut eg = SirEGraph::new(analysis);
    let mut value_class = BTreeMap::new();
    let mut original = Vec::new();
    for (i, &p) in f.params.iter().enumerate() {
        let id = eg.add(Sir::Param(i as u32));
        value_class.insert(p, id);
    }
    for (node, nd) in f.nodes.iter() {
        let mut ch = Vec::with_capacity(nd.inputs.len());
        for v in &nd.inputs {
            ch.push(*value_class.get(v).ok_or_else(|| format!("{node}: operand {v} is not defined before use"))?);
        }
        let tys: Vec<&TensorType> = nd.inputs.iter().map(|&v| f.ty(v)).collect();
        let op = canonical_op(&nd.op, &tys);
        let enode = Sir::Op(OpSym::new(op), ch);
        let id = eg.add(enode.clone());
        original.push((id, enode));
        if eg[id].data.tys.len() != nd.results.len() {
            return Err(format!("{node} `{}`: its shape rule fails on its operands", nd.op.kind.name()));
        }
        if nd.results.len() == 1 {
            value_class.insert(nd.results[0], id);
        } else {
            for (i, &r) in nd.results.iter().enumerate() {
                let pn = Sir::Proj(i as u32, [id]);
                let pid = eg.add(pn.clone());
                original.push((pid, pn));
                value_class.insert(r, pid);
            }
        }
    }
    let mut outs = Vec::with_capacity(f.outputs.len());
    for o in &f.outputs {
        outs.push(*value_class.get(o).ok_or_else(|| format!("output {o} is not defined"))?);
    }
    let root = eg.add(Sir::Tuple(outs));
    eg.rebuild();
    Ok(Loaded { egraph: eg, root, value_class, original })
}

/// Whether a value is a parameter (helper for naming).
pub fn is_param(f: &Function, v: Value) -> bool {
    matches!(f.values.get(v).map(|d| d.def), Some(ValueDef::Param(_)))
}

/// True when `t` is a scalar or every dim is the constant 1.
pub fn is_scalarlike(t: &TensorType) -> bool {
    t.shape.iter().all(Dim::is_one)
}

/// True when every value of `from` is a value of `to` (bf16/f16 → f32, f8e4m3 → bf16/f16/f32,
/// i32 → i64, bool → anything).
pub fn widens_exactly(from: DType, to: DType) -> bool {
    from == to
        || matches!(
            (from, to),
            (DType::BF16, DType::F32) | (DType::F16, DType::F32) | (DType::F8E4M3, DType::BF16 | DType::F16 | DType::F32) | (DType::I32, DType::I64) | (DType::Bool, _)
        )
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_ir::OP_TABLE;

    #[test]
    fn every_op_table_row_is_a_node_of_the_language() {
        for row in OP_TABLE {
            let attrs: Vec<Attr> = row
                .attrs
                .iter()
                .map(|s| s.default_value().unwrap_or(match s.kind {
                    sinter_ir::AttrKind::Int => Attr::Int(1),
                    sinter_ir::AttrKind::Float => Attr::Float(0.5),
                    sinter_ir::AttrKind::Bool => Attr::Bool(true),
                    sinter_ir::AttrKind::Enum(w) => Attr::Str(w[0].into()),
                    sinter_ir::AttrKind::Str => Attr::Str("f".into()),
                    sinter_ir::AttrKind::Ints => Attr::Ints(vec![0]),
                    sinter_ir::AttrKind::Dims => Attr::Dims(vec![Dim::constant(1)]),
                    sinter_ir::AttrKind::Dim => Attr::Dim(Dim::constant(0)),
                    sinter_ir::AttrKind::DType => Attr::DType(DType::F32),
                }))
                .collect();
            let op = Op { kind: row.kind, attrs };
            let a = Sir::Op(OpSym::new(op.clone()), vec![]);
            let b = Sir::Op(OpSym::new(op), vec![]);
            assert_eq!(a, b, "{}", row.name);
            assert!(a.matches(&b));
            assert_eq!(a.kind(), Some(row.kind));
            assert!(a.to_string().starts_with(row.name));
        }
        // Attributes are part of the symbol.
        let s1 = OpSym::new(Op::new(OpKind::Softmax, vec![("axis".into(), Attr::Int(-1))]).unwrap());
        let s2 = OpSym::new(Op::new(OpKind::Softmax, vec![("axis".into(), Attr::Int(-2))]).unwrap());
        assert_ne!(s1, s2);
    }
}
