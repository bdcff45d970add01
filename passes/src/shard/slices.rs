//! Slices of a fused projection moved onto its weight before sharding: GPT-2's
//! `slice(x·W_qkvᵀ + b_qkv, q | k | v)` becomes `x·W_qᵀ + b_q` (W_q a slice of W_qkv), so each
//! of Q, K and V is split by columns on its own, as Megatron-LM splits a fused QKV weight per
//! head (its `ColumnParallelLinear` holds each rank's heads of all three). A slice moves down
//! through a matmul whose B operand is a weight and through element-wise ops, when every
//! reader of the value it slices is such a slice (the whole product is then never needed).

use std::collections::{HashMap, HashSet};

use sinter_ir::infer::InferCtx;
use sinter_ir::{Attr, Dim, Function, Node, Op, OpKind, Value, ValueDef};

use super::ShardError;

struct Mover<'a> {
    src: &'a Function,
    weights: &'a HashSet<Value>,
    /// Each value's readers: nodes, `None` for an output of the function.
    users: HashMap<Value, Vec<Option<Node>>>,
    out: Function,
    map: HashMap<Value, Value>,
}

fn axis_of(op: &Op, rank: usize) -> Option<usize> {
    let a = op.int("axis")?;
    let a = if a < 0 { a + rank as i64 } else { a };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

/// `f` with slices moved onto weights (see the module docs); the same function when none moves.
pub(super) fn move_slices(f: &Function, weights: &HashSet<Value>) -> Result<Function, ShardError> {
    let mut users: HashMap<Value, Vec<Option<Node>>> = HashMap::new();
    for (n, nd) in f.nodes.iter() {
        for &v in &nd.inputs {
            users.entry(v).or_default().push(Some(n));
        }
    }
    for &o in &f.outputs {
        // An output is a reader that needs the whole value.
        users.entry(o).or_default().push(None);
    }
    let mut m = Mover { src: f, weights, users, out: Function::new(f.name.clone()), map: HashMap::new() };
    for &p in &f.params {
        let v = m.out.add_param(f.values[p].name.clone(), f.ty(p).clone());
        m.map.insert(p, v);
    }
    // The values whose every reader slices them along one axis, and whose slices move.
    let moved: HashSet<Value> = f
        .nodes
        .iter()
        .flat_map(|(_, nd)| nd.results.iter().copied())
        .filter(|&v| m.slice_axis(v).is_some_and(|o| m.movable(v, o)))
        .collect();
    // The values inside a moved chain (sliced operands of its element-wise nodes): not made.
    let mut inner = HashSet::new();
    for &v in &moved {
        if let Some(o) = m.slice_axis(v) {
            m.collect_inner(v, o, &mut inner);
        }
    }
    for nd in f.nodes.values() {
        if nd.results.iter().any(|r| moved.contains(r) || inner.contains(r)) {
            continue;
        }
        if nd.op.kind == OpKind::Slice && moved.contains(&nd.inputs[0]) {
            let o = axis_of(&nd.op, f.ty(nd.inputs[0]).rank()).unwrap_or(0);
            let (s, e) = (nd.op.dim("start").cloned().unwrap_or(Dim::constant(0)), nd.op.dim("end").cloned().unwrap_or(Dim::constant(0)));
            let v = m.sliced(nd.inputs[0], o, &s, &e)?;
            m.map.insert(nd.results[0], v);
            continue;
        }
        let ins: Vec<Value> = nd.inputs.iter().map(|v| m.map[v]).collect();
        let tys = nd.results.iter().map(|&r| f.ty(r).clone()).collect();
        let rs = m.out.push_node(nd.op.clone(), ins, tys).1;
        for (r, v) in nd.results.iter().zip(rs) {
            m.map.insert(*r, v);
        }
    }
    m.out.outputs = f.outputs.iter().map(|o| m.map[o]).collect();
    Ok(m.out)
}

impl Mover<'_> {
    /// The axis every reader of `v` slices it along, if they all slice it along one.
    fn slice_axis(&self, v: Value) -> Option<usize> {
        let us = self.users.get(&v)?;
        let rank = self.src.ty(v).rank();
        let mut axis = None;
        for &u in us {
            let nd = self.src.nodes.get(u?)?;
            if nd.op.kind != OpKind::Slice {
                return None;
            }
            let a = axis_of(&nd.op, rank)?;
            if axis.is_some_and(|b| b != a) {
                return None;
            }
            axis = Some(a);
        }
        axis
    }

    fn only_reader(&self, v: Value) -> Option<Node> {
        match self.users.get(&v).map(Vec::as_slice) {
            Some([u]) => *u,
            _ => None,
        }
    }

    fn is_weight(&self, mut v: Value) -> bool {
        loop {
            if self.weights.contains(&v) {
                return true;
            }
            let ValueDef::Result(n, _) = self.src.values[v].def else { return false };
            let nd = &self.src.nodes[n];
            if !matches!(nd.op.kind, OpKind::Transpose | OpKind::Cast | OpKind::Dequantize | OpKind::Reshape) {
                return false;
            }
            v = nd.inputs[0];
        }
    }

    /// Whether slices of `v` along `o` move below its node.
    fn movable(&self, v: Value, o: usize) -> bool {
        let ValueDef::Result(n, 0) = self.src.values[v].def else { return false };
        let nd = &self.src.nodes[n];
        let r = self.src.ty(v).rank();
        match nd.op.kind {
            OpKind::Matmul => o + 1 == r && self.is_weight(nd.inputs[1]),
            OpKind::Add | OpKind::Sub | OpKind::Mul => nd.inputs.iter().all(|&p| match self.operand_axis(p, r, o) {
                None => true,
                Some(_) if self.is_weight(p) => true,
                Some(po) => self.only_reader(p) == Some(n) && self.movable(p, po),
            }),
            _ => false,
        }
    }

    /// The axis of operand `p` that result axis `o` (of rank `r`) reads; `None` if it broadcasts.
    fn operand_axis(&self, p: Value, r: usize, o: usize) -> Option<usize> {
        let s = &self.src.ty(p).shape;
        let a = o.checked_sub(r.checked_sub(s.len())?)?;
        (!s[a].is_one()).then_some(a)
    }

    /// The values below `v` (sliced along `o`) whose slices are made from their operands:
    /// as [`Mover::movable`] walks, the sliced operands of element-wise nodes that are not
    /// weights.
    fn collect_inner(&self, v: Value, o: usize, inner: &mut HashSet<Value>) {
        let ValueDef::Result(n, _) = self.src.values[v].def else { return };
        let nd = &self.src.nodes[n];
        if !matches!(nd.op.kind, OpKind::Add | OpKind::Sub | OpKind::Mul) {
            return;
        }
        let r = self.src.ty(v).rank();
        for &p in &nd.inputs {
            if let Some(po) = self.operand_axis(p, r, o) {
                if !self.is_weight(p) && inner.insert(p) {
                    self.collect_inner(p, po, inner);
                }
            }
        }
    }

    fn slice(&mut self, x: Value, axis: usize, s: &Dim, e: &Dim) -> Result<Value, ShardError> {
        let op = Op::new(OpKind::Slice, vec![("axis".into(), Attr::Int(axis as i64)), ("start".into(), Attr::Dim(s.clone())), ("end".into(), Attr::Dim(e.clone()))])
            .map_err(|e| ShardError::Graph(e.to_string()))?;
        self.push(op, vec![x])
    }

    fn push(&mut self, op: Op, ins: Vec<Value>) -> Result<Value, ShardError> {
        let tys: Vec<_> = ins.iter().map(|&v| self.out.ty(v).clone()).collect();
        let ctx = InferCtx { op: &op, inputs: tys.iter().collect(), callee: None };
        let rt = (op.kind.info().infer)(&ctx).map_err(|e| ShardError::Graph(format!("moving a slice: {e} (a bug of the pass)")))?;
        Ok(self.out.push_node(op, ins, rt).1[0])
    }

    /// `v[s..e]` along axis `o`, computed from slices of its operands.
    fn sliced(&mut self, v: Value, o: usize, s: &Dim, e: &Dim) -> Result<Value, ShardError> {
        let ValueDef::Result(n, _) = self.src.values[v].def else { return Err(ShardError::Graph("a moved slice of a parameter (a bug of the pass)".into())) };
        let nd = self.src.nodes[n].clone();
        let r = self.src.ty(v).rank();
        let mut ins = Vec::with_capacity(nd.inputs.len());
        if nd.op.kind == OpKind::Matmul {
            let b = nd.inputs[1];
            let rb = self.src.ty(b).rank();
            let bn = if nd.op.bool("transpose_b").unwrap_or(false) { rb - 2 } else { rb - 1 };
            ins.push(self.map[&nd.inputs[0]]);
            let bm = self.map[&b];
            ins.push(self.slice(bm, bn, s, e)?);
        } else {
            for &p in &nd.inputs {
                let x = match self.operand_axis(p, r, o) {
                    None => self.map[&p],
                    Some(po) if self.is_weight(p) => {
                        let pm = self.map[&p];
                        self.slice(pm, po, s, e)?
                    }
                    Some(po) => self.sliced(p, po, s, e)?,
                };
                ins.push(x);
            }
        }
        self.push(nd.op.clone(), ins)
    }
}
