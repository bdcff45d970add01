//! Tensor parallelism as a pass: [`shard`] turns a graph into the program every rank of a
//! group of N runs on its shard of the weights, with `all_reduce` and `all_gather` where the
//! ranks must exchange (Megatron-LM, Shoeybi et al. 2019, arXiv 1909.08053).
//!
//! The user's graph is unchanged; the plan follows from where its weights are read. Calls are
//! inlined ([`crate::lower::inline`]), then each node, in order, takes the placement of its
//! result that needs the fewest exchanges of its operands ([`rules::needs`]; ties go to
//! `Partial`, then to a split of the highest axis, then to whole). Parameters and the work on
//! them alone are placed lazily: a weight read by a matmul whose other operand is whole is
//! split along its columns (the result split along its last axis), one read by a matmul whose
//! other operand is split along the contracted axis is split along its rows (the result a
//! partial sum, reduced by an `all_reduce` where a whole value is needed). So a decoder layer
//! gets Megatron's plan: Q, K, V and gate/up by columns, attention per head, the output and
//! down projections by rows followed by an all-reduce, the LM head by vocabulary followed by
//! an `all_gather`, and the paged KV cache split by KV head. A weight read in two placements
//! (a tied embedding: whole for the lookup, by vocabulary for the LM head) becomes two
//! parameters of the rank's program.
//!
//! What does not divide stays whole on every rank (each rank computes it), and
//! [`ShardPlan::replicated`] says what and why; under [`ShardOptions::strict`] (the default)
//! attention heads or weight dimensions that do not divide by N are an error naming the node.
//!
//! [`ShardPlan::rank_inputs`] cuts the full inputs into each rank's, and
//! [`ShardPlan::assemble`] joins the ranks' outputs; the interpreter runs the ranks with
//! [`sinter_ir::interp::run_ranks`].

mod rules;
mod slices;

use std::collections::{BTreeSet, HashMap, HashSet};

use sinter_ir::infer::InferCtx;
use sinter_ir::interp::Tensor;
use sinter_ir::{Attr, Function, Graph, Node, Op, OpClass, OpKind, TensorType, Value, ValueDef};

use rules::P;

/// Options of [`shard`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardOptions {
    /// The ranks of the group (N ≥ 1).
    pub ranks: usize,
    /// Refuse, rather than keep whole, attention whose heads or weights whose dimensions do
    /// not divide by N.
    pub strict: bool,
    /// The entry's weight parameters by name; `None` guesses them as the passes do
    /// ([`crate::hoist::infer_weights`]).
    pub weights: Option<BTreeSet<String>>,
}

impl ShardOptions {
    /// N ranks, strict, weights guessed.
    pub fn new(ranks: usize) -> ShardOptions {
        ShardOptions { ranks, strict: true, weights: None }
    }
}

/// Where a parameter or an output of the rank's program lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Placement {
    /// The whole tensor on every rank.
    Replicated,
    /// Rank r holds the r-th of N equal blocks of this axis.
    Split(usize),
}

/// One parameter of the rank's program: which parameter of the original entry it is cut from,
/// and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ParamShard {
    /// Index of the original entry parameter.
    pub source: usize,
    /// Elements `start..end` of an axis of the source, taken before the split (a fused QKV
    /// weight's rows of Q, K or V): `(axis, start, end)`.
    pub slice: Option<(usize, usize, usize)>,
    /// Its placement.
    pub placement: Placement,
}

/// The program every rank runs, and how inputs and outputs map to it.
#[derive(Clone, Debug)]
pub struct ShardPlan {
    /// One function (the entry, calls inlined) with collectives over `ranks` ranks.
    pub graph: Graph,
    /// N.
    pub ranks: usize,
    /// The rank program's parameters, in order.
    pub params: Vec<ParamShard>,
    /// Each output's placement (a split output is the rank's block of a state the caller keeps
    /// per rank, such as the KV cache; everything else is gathered whole).
    pub outputs: Vec<Placement>,
    /// What stays whole on every rank where it could not be split, and why.
    pub replicated: Vec<String>,
    /// `all_reduce` and `all_gather` nodes in the program.
    pub collectives: (usize, usize),
}

/// Why a graph could not be sharded.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum ShardError {
    /// N is 0.
    #[error("tensor parallelism needs at least 1 rank, got 0")]
    NoRanks,
    /// Heads or a weight dimension that do not divide by N (strict mode).
    #[error("{site}: {what} do not divide among {ranks} ranks (tensor parallelism splits them evenly; use a rank count that divides them, or non-strict sharding to keep them whole)")]
    Indivisible {
        /// The node (`n12 \`attention\``) or weight.
        site: String,
        /// What does not divide, with its size.
        what: String,
        /// N.
        ranks: usize,
    },
    /// The graph already holds collectives, or could not be inlined.
    #[error("cannot shard: {0}")]
    Graph(String),
    /// Inputs or outputs that do not fit the plan.
    #[error("{0}")]
    Tensors(String),
}

/// The rank program's value of each original value, and its placement; `Free` values (the
/// entry's parameters and work on them and constants alone) are made on demand, in the
/// placement their reader asks for.
#[derive(Clone, Copy)]
enum St {
    Free,
    Act(Value, P),
}

struct Sharder<'a> {
    src: &'a Function,
    out: Function,
    ranks: i64,
    strict: bool,
    /// Parameters that may be split: weights, and KV caches (pages of `kv_append` and
    /// `paged_attention`). Other parameters (tokens, positions, tables) stay whole.
    splittable: HashSet<Value>,
    st: HashMap<Value, St>,
    made: HashMap<(Value, P), Value>,
    whole: HashMap<Value, Value>,
    params: Vec<ParamShard>,
    replicated: Vec<String>,
    collectives: (usize, usize),
}

/// Shards `g`'s entry function for `opts.ranks` ranks; see the module docs.
///
/// # Errors
/// [`ShardError::NoRanks`]; [`ShardError::Indivisible`] under `strict`; [`ShardError::Graph`]
/// for a graph that does not inline or already holds collectives.
pub fn shard(g: &Graph, opts: &ShardOptions) -> Result<ShardPlan, ShardError> {
    if opts.ranks == 0 {
        return Err(ShardError::NoRanks);
    }
    let flat = crate::lower::inline(g).map_err(|e| ShardError::Graph(e.to_string()))?;
    let ranks = opts.ranks as i64;
    let weights = crate::hoist::weight_params(&flat.func, opts.weights.as_ref());
    let moved = slices::move_slices(&flat.func, &weights)?;
    let src = &moved;
    let weights = crate::hoist::weight_params(src, opts.weights.as_ref());
    let mut splittable = weights.clone();
    for nd in src.nodes.values() {
        match nd.op.kind {
            OpKind::AllReduce | OpKind::AllGather => return Err(ShardError::Graph(format!("@{} already holds collectives", src.name))),
            OpKind::KvAppend => splittable.extend(nd.inputs[..2].iter().copied()),
            OpKind::PagedAttention => splittable.extend(nd.inputs[1..3].iter().copied()),
            _ => {}
        }
    }
    splittable.retain(|v| matches!(src.values[*v].def, ValueDef::Param(_)));
    if opts.strict && ranks > 1 {
        strict_checks(src, &weights, ranks)?;
    }
    let mut s = Sharder {
        src,
        out: Function::new(src.name.clone()),
        ranks,
        strict: opts.strict && ranks > 1,
        splittable,
        st: HashMap::new(),
        made: HashMap::new(),
        whole: HashMap::new(),
        params: Vec::new(),
        replicated: Vec::new(),
        collectives: (0, 0),
    };
    for &p in &src.params {
        s.st.insert(p, St::Free);
    }
    for (n, nd) in src.nodes.iter() {
        let free = nd.inputs.iter().all(|v| matches!(s.st.get(v), Some(St::Free))) && free_op(nd.op.kind);
        if free {
            for &r in &nd.results {
                s.st.insert(r, St::Free);
            }
        } else {
            s.node(n)?;
        }
    }
    let outputs = s.outputs()?;
    let mut graph = Graph::new();
    let mut func = s.out;
    func.outputs = outputs.iter().map(|o| o.0).collect();
    graph.add_func(func);
    sinter_ir::verify(&graph).map_err(|e| ShardError::Graph(format!("the sharded program does not verify (a bug of the pass): {e}")))?;
    Ok(ShardPlan {
        graph,
        ranks: opts.ranks,
        params: s.params,
        outputs: outputs.iter().map(|o| o.1).collect(),
        replicated: s.replicated,
        collectives: s.collectives,
    })
}

/// Ops whose result on placed-later operands is itself placed later (re-made per placement):
/// element-wise, layout and source ops; everything else is computed where it stands.
fn free_op(k: OpKind) -> bool {
    matches!(k.info().class, OpClass::Unary | OpClass::Binary | OpClass::Compare | OpClass::Source)
        || matches!(k, OpKind::Transpose | OpKind::Permute | OpKind::Reshape | OpKind::Broadcast | OpKind::Slice | OpKind::Concat)
}

/// Under `strict`: every attention's heads and every weight matrix a matmul reads divide.
fn strict_checks(src: &Function, weights: &HashSet<Value>, ranks: i64) -> Result<(), ShardError> {
    let site = |n: Node| format!("{n} `{}`", src.nodes[n].op.kind.name());
    let err = |n: Node, what: String| ShardError::Indivisible { site: site(n), what, ranks: ranks as usize };
    for (n, nd) in src.nodes.iter() {
        match nd.op.kind {
            OpKind::Attention | OpKind::PagedAttention if !rules::heads_divide(&nd.op, ranks) => {
                let (h, kv) = (nd.op.int("heads").unwrap_or(0), nd.op.int("kv_heads").unwrap_or(0));
                return Err(err(n, format!("its {h} query heads and {kv} KV heads")));
            }
            OpKind::Matmul => {
                for &v in &nd.inputs {
                    let Some(w) = weight_root(src, v, weights) else { continue };
                    for d in src.ty(w).shape.iter().rev().take(2) {
                        if d.div_exact(ranks).is_none() {
                            return Err(err(n, format!("the weight {} ({}) has a dimension of {d} that does", src.label(w), src.ty(w))));
                        }
                    }
                }
            }
            _ => {}
        }
    }
    Ok(())
}

/// The weight parameter `v` is read from through layout and element-wise ops, if any.
fn weight_root(f: &Function, mut v: Value, weights: &HashSet<Value>) -> Option<Value> {
    loop {
        if weights.contains(&v) {
            return Some(v);
        }
        let ValueDef::Result(n, _) = f.values[v].def else { return None };
        let nd = &f.nodes[n];
        if !free_op(nd.op.kind) || nd.inputs.len() != 1 {
            return None;
        }
        v = nd.inputs[0];
    }
}

impl Sharder<'_> {
    fn cur(&self, v: Value) -> Option<P> {
        match self.st.get(&v) {
            Some(St::Act(_, p)) => Some(*p),
            _ => None,
        }
    }

    /// Whether `v` can be had in placement `p` without an exchange: placed already so, or free
    /// and makeable so.
    fn can(&self, v: Value, p: P) -> bool {
        match self.st.get(&v) {
            Some(St::Act(_, q)) => *q == p,
            Some(St::Free) => self.can_make(v, p),
            None => false,
        }
    }

    fn can_make(&self, v: Value, p: P) -> bool {
        if p == P::Rep {
            return true;
        }
        match self.src.values[v].def {
            ValueDef::Param(_) => match p {
                P::Split(a) => self.splittable.contains(&v) && self.src.ty(v).shape.get(a).is_some_and(|d| d.div_exact(self.ranks).is_some()),
                _ => false,
            },
            ValueDef::Result(n, _) if self.param_slice(n).is_some() => {
                let (_, a, s, e) = self.param_slice(n).unwrap_or_default();
                p == P::Split(a) && (e - s) % self.ranks as usize == 0
            }
            ValueDef::Result(n, _) => {
                p != P::Partial
                    && rules::needs(self.src, n, p, self.ranks, &[]).is_some_and(|ps| self.src.nodes[n].inputs.iter().zip(ps).all(|(&i, q)| self.can_make(i, q)))
            }
        }
    }

    /// A slice of a splittable parameter with constant bounds: (parameter index, axis, start,
    /// end). Split along the sliced axis it is a parameter of its own.
    fn param_slice(&self, n: Node) -> Option<(usize, usize, usize, usize)> {
        let nd = &self.src.nodes[n];
        if nd.op.kind != OpKind::Slice || !self.splittable.contains(&nd.inputs[0]) {
            return None;
        }
        let ValueDef::Param(i) = self.src.values[nd.inputs[0]].def else { return None };
        let rank = self.src.ty(nd.inputs[0]).rank() as i64;
        let a = nd.op.int("axis").map(|a| if a < 0 { a + rank } else { a })?;
        let s = nd.op.dim("start")?.as_const()?;
        let e = nd.op.dim("end")?.as_const()?;
        Some((i, usize::try_from(a).ok()?, usize::try_from(s).ok()?, usize::try_from(e).ok()?))
    }

    /// `v` in placement `p`: made (free values) or converted to whole by a collective.
    fn get(&mut self, v: Value, p: P) -> Result<Value, ShardError> {
        match self.st.get(&v).copied() {
            Some(St::Act(x, q)) if q == p => Ok(x),
            Some(St::Act(x, q)) if p == P::Rep => self.to_whole(v, x, q),
            Some(St::Free) => self.make(v, p),
            _ => Err(ShardError::Graph(format!("{} is needed as {p:?} but is not available so (a bug of the pass)", self.src.label(v)))),
        }
    }

    /// The whole value of `v` (held as `x` in `q`): an `all_gather` of a split, an
    /// `all_reduce` of a partial sum.
    fn to_whole(&mut self, v: Value, x: Value, q: P) -> Result<Value, ShardError> {
        if let Some(&w) = self.whole.get(&v) {
            return Ok(w);
        }
        let ty = self.src.ty(v).clone();
        let ranks = Attr::Int(self.ranks);
        let w = match q {
            P::Rep => x,
            P::Split(a) => {
                self.collectives.1 += 1;
                let op = Op::new(OpKind::AllGather, vec![("axis".into(), Attr::Int(a as i64)), ("ranks".into(), ranks)]).map_err(|e| ShardError::Graph(e.to_string()))?;
                self.out.push_node(op, vec![x], vec![ty]).1[0]
            }
            P::Partial => {
                self.collectives.0 += 1;
                let op = Op::new(OpKind::AllReduce, vec![("ranks".into(), ranks)]).map_err(|e| ShardError::Graph(e.to_string()))?;
                self.out.push_node(op, vec![x], vec![ty]).1[0]
            }
        };
        self.whole.insert(v, w);
        Ok(w)
    }

    /// Makes free value `v` in placement `p` (a parameter of the rank's program, or the node
    /// again over its operands made in the placements it needs).
    fn make(&mut self, v: Value, p: P) -> Result<Value, ShardError> {
        if let Some(&x) = self.made.get(&(v, p)) {
            return Ok(x);
        }
        let x = match self.src.values[v].def {
            ValueDef::Param(i) => {
                let ty = self.split_type(self.src.ty(v), p);
                let name = self.src.values[v].name.clone().map(|n| match p {
                    P::Split(a) if self.made.keys().any(|(w, _)| *w == v) => format!("{n}.split{a}"),
                    _ if self.made.keys().any(|(w, _)| *w == v) => format!("{n}.whole"),
                    _ => n,
                });
                let placement = match p {
                    P::Split(a) => Placement::Split(a),
                    _ => Placement::Replicated,
                };
                self.params.push(ParamShard { source: i, slice: None, placement });
                self.out.add_param(name, ty)
            }
            ValueDef::Result(n, _) if matches!((self.param_slice(n), p), (Some((_, a, _, _)), P::Split(b)) if a == b) => {
                let (i, a, s0, e0) = self.param_slice(n).unwrap_or_default();
                let ty = self.split_type(self.src.ty(v), p);
                let name = self.src.values[self.src.params[i]].name.clone().map(|n| format!("{n}[{s0}:{e0}]"));
                self.params.push(ParamShard { source: i, slice: Some((a, s0, e0)), placement: Placement::Split(a) });
                self.out.add_param(name, ty)
            }
            ValueDef::Result(n, k) => {
                let ps = rules::needs(self.src, n, p, self.ranks, &[]).ok_or_else(|| ShardError::Graph(format!("{} cannot be made as {p:?} (a bug of the pass)", self.src.label(v))))?;
                let ins = self.src.nodes[n].inputs.clone();
                let mut args = Vec::with_capacity(ins.len());
                for (&i, q) in ins.iter().zip(ps) {
                    args.push(self.make(i, q)?);
                }
                self.emit(n, args, p)?[k]
            }
        };
        self.made.insert((v, p), x);
        Ok(x)
    }

    fn split_type(&self, ty: &TensorType, p: P) -> TensorType {
        let mut t = ty.clone();
        if let P::Split(a) = p {
            if let Some(d) = t.shape.get_mut(a) {
                *d = d.div_exact(self.ranks).unwrap_or_else(|| d.clone());
            }
        }
        t
    }

    /// Emits node `n` of the source over `args`, its first result in `p`: attributes that
    /// name a shape or a head count scaled to the rank's block, the types inferred again.
    fn emit(&mut self, n: Node, args: Vec<Value>, p: P) -> Result<Vec<Value>, ShardError> {
        let nd = &self.src.nodes[n];
        let mut op = nd.op.clone();
        if let P::Split(o) = p {
            for name in ["shape"] {
                if let Some(i) = op.kind.attr_index(name) {
                    if let Attr::Dims(ds) = &mut op.attrs[i] {
                        if let Some(d) = ds.get_mut(o) {
                            *d = d.div_exact(self.ranks).unwrap_or_else(|| d.clone());
                        }
                    }
                }
            }
            let head_axis = match op.kind {
                OpKind::Attention if op.str("layout") == Some("bshd") => Some(2),
                OpKind::Attention | OpKind::PagedAttention => Some(1),
                _ => None,
            };
            if head_axis == Some(o) {
                for name in ["heads", "kv_heads"] {
                    if let Some(i) = op.kind.attr_index(name) {
                        if let Attr::Int(h) = op.attrs[i] {
                            op.attrs[i] = Attr::Int(h / self.ranks);
                        }
                    }
                }
            }
        }
        let tys: Vec<TensorType> = args.iter().map(|&a| self.out.ty(a).clone()).collect();
        let ctx = InferCtx { op: &op, inputs: tys.iter().collect(), callee: None };
        let results = (op.kind.info().infer)(&ctx).map_err(|e| ShardError::Graph(format!("{n} `{}` on the rank's block: {e} (a bug of the pass)", op.kind.name())))?;
        Ok(self.out.push_node(op, args, results).1)
    }

    /// Places node `n`: the placement of its result needing the fewest exchanges.
    fn node(&mut self, n: Node) -> Result<(), ShardError> {
        let nd = &self.src.nodes[n];
        let ins = nd.inputs.clone();
        let cur: Vec<Option<P>> = ins.iter().map(|&v| self.cur(v)).collect();
        let rank = nd.results.first().map_or(0, |&r| self.src.ty(r).rank());
        let mut cands = vec![P::Partial];
        cands.extend((0..rank).rev().map(P::Split));
        cands.push(P::Rep);
        // Cost: (exchanges, operands read split although their whole value is at hand).
        let mut best: Option<((usize, usize), P, Vec<P>)> = None;
        for po in cands {
            let Some(ps) = rules::needs(self.src, n, po, self.ranks, &cur) else { continue };
            // Each operand must be had as needed, or be made whole (an exchange).
            let mut cost = (0, 0);
            let mut ok = true;
            for (&v, &q) in ins.iter().zip(&ps) {
                if q == P::Rep && self.whole.contains_key(&v) {
                    continue;
                }
                if self.can(v, q) {
                    if matches!(q, P::Split(_)) && self.whole.contains_key(&v) {
                        cost.1 += 1;
                    }
                    continue;
                }
                if q == P::Rep {
                    cost.0 += 1;
                } else {
                    ok = false;
                    break;
                }
            }
            if ok && best.as_ref().is_none_or(|b| cost < b.0) {
                best = Some((cost, po, ps));
            }
        }
        let Some((cost, po, ps)) = best else {
            return Err(ShardError::Graph(format!("{n} `{}` has no placement (a bug of the pass)", nd.op.kind.name())));
        };
        if po == P::Rep && cost.0 > 0 {
            // A split the operands already have, refused only because a size does not divide.
            let blocked = (0..rank).rev().map(P::Split).find(|&c| {
                rules::needs(self.src, n, c, self.ranks, &cur).is_none()
                    && rules::needs(self.src, n, c, 1, &cur).is_some_and(|ps| {
                        let split = |v: Value| matches!(self.cur(v), Some(P::Split(_)));
                        ins.iter().any(|&v| split(v)) && ins.iter().zip(&ps).all(|(&v, &q)| !split(v) || self.cur(v) == Some(q))
                    })
            });
            if let Some(P::Split(o)) = blocked {
                let what = match nd.op.kind {
                    OpKind::Attention | OpKind::PagedAttention => {
                        format!("its {} query heads and {} KV heads", nd.op.int("heads").unwrap_or(0), nd.op.int("kv_heads").unwrap_or(0))
                    }
                    OpKind::Reshape => format!("the blocks of {} reshaped to {}", self.src.ty(ins[0]), self.src.ty(nd.results[0])),
                    _ => format!("axis {o} of its result {}", self.src.ty(nd.results[0])),
                };
                if self.strict {
                    return Err(ShardError::Indivisible { site: format!("{n} `{}`", nd.op.kind.name()), what, ranks: self.ranks as usize });
                }
                self.replicated.push(format!("{n} `{}`: {what} do not divide; computed whole on every rank", nd.op.kind.name()));
            }
        }
        let mut args = Vec::with_capacity(ins.len());
        for (&v, q) in ins.iter().zip(ps) {
            args.push(self.get(v, q)?);
        }
        let outs = self.emit(n, args, po)?;
        let places = rules::results(self.src, n, po);
        for ((&r, x), q) in nd.results.iter().zip(outs).zip(places) {
            self.st.insert(r, St::Act(x, q));
        }
        Ok(())
    }

    /// The entry's outputs: partial sums reduced; a split output kept split when it is the
    /// rank's block of a state read back as a parameter of the same type split the same way
    /// (the KV cache), gathered whole otherwise.
    fn outputs(&mut self) -> Result<Vec<(Value, Placement)>, ShardError> {
        let mut outs = Vec::new();
        for &o in &self.src.outputs.clone() {
            let ty = self.src.ty(o).clone();
            let st = self.st.get(&o).copied();
            let out = match st {
                Some(St::Act(x, P::Split(a))) if self.is_state(&ty, a) => (x, Placement::Split(a)),
                Some(St::Act(x, q)) => (self.to_whole(o, x, q)?, Placement::Replicated),
                _ => (self.make(o, P::Rep)?, Placement::Replicated),
            };
            outs.push(out);
        }
        Ok(outs)
    }

    fn is_state(&self, ty: &TensorType, a: usize) -> bool {
        self.params.iter().zip(&self.out.params).any(|(ps, &v)| ps.placement == Placement::Split(a) && self.src.ty(self.src.params[ps.source]) == ty && self.out.ty(v) != ty)
    }
}

/// Bytes of a tensor type whose dims are all constants; `None` otherwise.
fn static_bytes(t: &TensorType) -> Option<usize> {
    let n = t.shape.iter().map(|d| d.as_const().and_then(|c| usize::try_from(c).ok())).product::<Option<usize>>()?;
    t.dtype.storage_bytes(n)
}

impl ShardPlan {
    /// A summary for people: the parameters split and kept whole, the bytes of the parameters
    /// of a fixed size (the weights) on each rank against the original's, the collectives,
    /// and what stays whole.
    pub fn describe(&self, original: &Graph) -> String {
        let (Some(src), Some(f)) = (original.entry(), self.graph.entry()) else { return String::new() };
        let full: usize = src.params.iter().filter_map(|&p| static_bytes(src.ty(p))).sum();
        let rank: usize = f.params.iter().filter_map(|&p| static_bytes(f.ty(p))).sum();
        let split = self.params.iter().filter(|p| p.placement != Placement::Replicated).count();
        let mb = |b: usize| b as f64 / 1e6;
        let mut s = format!(
            "tensor parallel over {} ranks: {} parameters, {split} split, {} whole; fixed-size parameters {:.1} MB a rank of {:.1} MB ({:.2}x); {} all_reduce, {} all_gather a step\n",
            self.ranks,
            self.params.len(),
            self.params.len() - split,
            mb(rank),
            mb(full),
            if full > 0 { rank as f64 / full as f64 } else { 1.0 },
            self.collectives.0,
            self.collectives.1
        );
        for r in &self.replicated {
            s.push_str(&format!("  kept whole: {r}\n"));
        }
        s
    }

    /// Rank `rank`'s inputs from the full inputs of the original entry (in its parameter
    /// order): each split parameter cut to the rank's block.
    ///
    /// # Errors
    /// [`ShardError::Tensors`] for a wrong input count or rank, or an axis that does not
    /// divide.
    pub fn rank_inputs(&self, inputs: &[&Tensor], rank: usize) -> Result<Vec<Tensor>, ShardError> {
        if rank >= self.ranks {
            return Err(ShardError::Tensors(format!("rank {rank} of a group of {}", self.ranks)));
        }
        let mut out = Vec::with_capacity(self.params.len());
        for ps in &self.params {
            let t = inputs.get(ps.source).ok_or_else(|| ShardError::Tensors(format!("the program reads input {} but {} were given", ps.source, inputs.len())))?;
            let sliced;
            let t = match ps.slice {
                Some((a, s, e)) => {
                    let d = *t.shape().get(a).ok_or_else(|| ShardError::Tensors(format!("input {} has no axis {a}", ps.source)))?;
                    if s > e || e > d || (e - s) % self.ranks != 0 {
                        return Err(ShardError::Tensors(format!("input {}: rows {s}..{e} of axis {a} (of {d}) for {} ranks", ps.source, self.ranks)));
                    }
                    // The slice is `ranks` blocks of the axis from `s`: block `s/b + rank` of a
                    // view of `e - s` rows.
                    sliced = cut(t, a, s, e)?;
                    &sliced
                }
                None => *t,
            };
            out.push(match ps.placement {
                Placement::Replicated => t.clone(),
                Placement::Split(a) => block(t, a, rank, self.ranks)?,
            });
        }
        Ok(out)
    }

    /// The full outputs from every rank's outputs: split ones joined in rank order, whole
    /// ones taken from rank 0.
    ///
    /// # Errors
    /// [`ShardError::Tensors`] when the ranks' outputs do not fit the plan.
    pub fn assemble(&self, per_rank: &[Vec<Tensor>]) -> Result<Vec<Tensor>, ShardError> {
        let bad = |m: String| ShardError::Tensors(m);
        if per_rank.len() != self.ranks {
            return Err(bad(format!("{} ranks' outputs for a group of {}", per_rank.len(), self.ranks)));
        }
        let mut out = Vec::with_capacity(self.outputs.len());
        for (k, p) in self.outputs.iter().enumerate() {
            let parts: Vec<&Tensor> = per_rank.iter().map(|o| o.get(k).ok_or_else(|| bad(format!("a rank has no output {k}")))).collect::<Result<_, _>>()?;
            out.push(match p {
                Placement::Replicated => parts[0].clone(),
                Placement::Split(a) => join(&parts, *a)?,
            });
        }
        Ok(out)
    }
}

/// Block `rank` of `ranks` of axis `a` of `t`.
fn block(t: &Tensor, a: usize, rank: usize, ranks: usize) -> Result<Tensor, ShardError> {
    let shape = t.shape();
    let d = *shape.get(a).ok_or_else(|| ShardError::Tensors(format!("axis {a} of a rank-{} input", shape.len())))?;
    if d % ranks != 0 {
        return Err(ShardError::Tensors(format!("axis {a} of an input of shape {shape:?} does not divide among {ranks} ranks")));
    }
    let b = d / ranks;
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a + 1..].iter().product();
    let mut data = Vec::with_capacity(outer * b * inner);
    for o in 0..outer {
        let base = (o * d + rank * b) * inner;
        data.extend_from_slice(&t.data()[base..base + b * inner]);
    }
    let mut s = shape.to_vec();
    s[a] = b;
    Tensor::new(t.dtype(), &s, data).map_err(|e| ShardError::Tensors(e.to_string()))
}

/// Elements `s..e` of axis `a` of `t`.
fn cut(t: &Tensor, a: usize, s: usize, e: usize) -> Result<Tensor, ShardError> {
    let shape = t.shape();
    let d = shape[a];
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a + 1..].iter().product();
    let mut data = Vec::with_capacity(outer * (e - s) * inner);
    for o in 0..outer {
        data.extend_from_slice(&t.data()[(o * d + s) * inner..(o * d + e) * inner]);
    }
    let mut sh = shape.to_vec();
    sh[a] = e - s;
    Tensor::new(t.dtype(), &sh, data).map_err(|e| ShardError::Tensors(e.to_string()))
}

/// `parts` joined along axis `a`.
fn join(parts: &[&Tensor], a: usize) -> Result<Tensor, ShardError> {
    let first = parts[0];
    let shape = first.shape();
    if a >= shape.len() || parts.iter().any(|p| p.shape() != shape || p.dtype() != first.dtype()) {
        return Err(ShardError::Tensors(format!("the ranks' blocks differ or have no axis {a}")));
    }
    let b = shape[a];
    let outer: usize = shape[..a].iter().product();
    let inner: usize = shape[a + 1..].iter().product();
    let mut data = Vec::with_capacity(first.numel() * parts.len());
    for o in 0..outer {
        for p in parts {
            data.extend_from_slice(&p.data()[o * b * inner..(o + 1) * b * inner]);
        }
    }
    let mut s = shape.to_vec();
    s[a] = b * parts.len();
    Tensor::new(first.dtype(), &s, data).map_err(|e| ShardError::Tensors(e.to_string()))
}
