//! One function placed for the ranks ([`shard_function`]): each node's result whole, split or
//! partial by [`super::rules`], free values (parameters and work on them alone) made in the
//! placement a reader asks for, and each call placed by sharding its callee for the kinds of
//! its arguments (one version of a decoder layer serves every layer that passes the same).

use std::collections::{HashMap, HashSet};

use sinter_ir::infer::InferCtx;
use sinter_ir::{Attr, Function, Graph, Node, Op, OpClass, OpKind, TensorType, Value, ValueDef};

use super::rules::{self, Ranks, P};
use super::{slices, ShardError};

/// A slice `(axis, start, end)` of a parameter, taken before its split.
pub(super) type Cut = (usize, usize, usize);

/// How a parameter of the function being placed arrives.
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Arg {
    /// Placed by the caller.
    Act(P),
    /// Made on demand: `split[a]`, whether the caller can give it split along axis `a`;
    /// `cut`, whether it can give a slice of it split (it is a splittable parameter there);
    /// `weight`, whether it is a weight there (strict mode checks the weights' dims).
    Free { split: Vec<bool>, cut: bool, weight: bool },
}

/// One placed version of a function.
pub(super) struct Version {
    pub(super) name: String,
    args: Vec<Arg>,
    /// Its parameters: (the original's parameter index, placement, slice).
    pub(super) params: Vec<(usize, P, Option<Cut>)>,
    pub(super) outputs: Vec<P>,
    /// The collectives one call of it runs (its callees' included).
    collectives: (usize, usize),
}

/// What the placement of a graph shares across its functions.
pub(super) struct Ctx<'g> {
    pub(super) g: &'g Graph,
    pub(super) ranks: i64,
    pub(super) strict: bool,
    versions: HashMap<String, Vec<Version>>,
    /// The placed callees.
    pub(super) funcs: Vec<Function>,
    pub(super) replicated: Vec<String>,
    depth: usize,
}

impl<'g> Ctx<'g> {
    pub(super) fn new(g: &'g Graph, ranks: i64, strict: bool) -> Ctx<'g> {
        Ctx { g, ranks, strict, versions: HashMap::new(), funcs: Vec::new(), replicated: Vec::new(), depth: 0 }
    }
}

/// A placed function: the rank's function, its parameters, its outputs' placements and the
/// collectives a call of it runs.
pub(super) struct Placed {
    pub(super) func: Function,
    pub(super) params: Vec<(usize, P, Option<Cut>)>,
    pub(super) outputs: Vec<P>,
    pub(super) collectives: (usize, usize),
}

/// The parameter index that stands for the rank's index in [`Placed::params`].
pub(super) const RANK: usize = usize::MAX;

/// The deepest chain of calls placed.
const MAX_DEPTH: usize = 64;

/// The rank program's value of each original value, and its placement; `Free` values (the
/// parameters that arrive free and work on them and constants alone) are made on demand, in
/// the placement their reader asks for.
#[derive(Clone, Copy)]
enum St {
    Free,
    Act(Value, P),
}

struct Sharder<'a, 'g> {
    cx: &'a mut Ctx<'g>,
    src: Function,
    args: Vec<Arg>,
    out: Function,
    ranks: i64,
    strict: bool,
    st: HashMap<Value, St>,
    made: HashMap<(Value, P, Option<Cut>), Value>,
    whole: HashMap<Value, Value>,
    params: Vec<(usize, P, Option<Cut>)>,
    collectives: (usize, usize),
    /// The entry: outputs split like a parameter of the same type stay split (state).
    entry: bool,
    /// The rank's index, once a lookup needs it.
    rank: Option<Value>,
    /// Symbols of axes the arguments arrive split along: already the rank's size.
    split_symbols: Vec<sinter_ir::Dim>,
    /// `can_make`'s answers.
    makeable: std::cell::RefCell<HashMap<(Value, P), bool>>,
}

/// Places `f` for arguments of kinds `args` (see the module docs).
pub(super) fn shard_function(cx: &mut Ctx<'_>, f: &Function, args: Vec<Arg>, entry: bool) -> Result<Placed, ShardError> {
    let free: HashSet<Value> = f.params.iter().zip(&args).filter(|(_, a)| matches!(a, Arg::Free { cut: true, .. })).map(|(&p, _)| p).collect();
    let src = slices::move_slices(f, &free)?;
    let ranks = cx.ranks;
    let strict = cx.strict && ranks > 1;
    if strict {
        let weights: HashSet<Value> = src.params.iter().zip(&args).filter(|(_, a)| matches!(a, Arg::Free { weight: true, .. })).map(|(&p, _)| p).collect();
        strict_checks(&src, &weights, ranks)?;
    }
    let mut s = Sharder { cx, src, args, out: Function::new(f.name.clone()), ranks, strict, st: HashMap::new(), made: HashMap::new(), whole: HashMap::new(), params: Vec::new(), collectives: (0, 0), entry, rank: None, split_symbols: Vec::new(), makeable: Default::default() };
    for (i, &p) in s.src.params.clone().iter().enumerate() {
        match s.args[i].clone() {
            Arg::Act(q) => {
                if let P::Split(a) = q {
                    let d = s.src.ty(p).shape[a].clone();
                    if d.as_const().is_none() {
                        s.split_symbols.push(d);
                    }
                }
                let ty = s.split_type(s.src.ty(p), q);
                let v = s.out.add_param(s.src.values[p].name.clone(), ty);
                s.params.push((i, q, None));
                s.st.insert(p, St::Act(v, q));
            }
            Arg::Free { .. } => {
                s.st.insert(p, St::Free);
            }
        }
    }
    for (n, nd) in s.src.nodes.clone().iter() {
        if matches!(nd.op.kind, OpKind::AllReduce | OpKind::AllGather) {
            return Err(ShardError::Graph(format!("@{} already holds collectives", s.src.name)));
        }
        let free = nd.inputs.iter().all(|v| matches!(s.st.get(v), Some(St::Free))) && free_op(nd.op.kind);
        if free {
            for &r in &nd.results {
                s.st.insert(r, St::Free);
            }
        } else if nd.op.kind == OpKind::Call {
            s.call(n)?;
        } else {
            s.node(n)?;
        }
    }
    let outputs = s.outputs()?;
    if entry {
        // A parameter nothing reads may still bind a symbol of the types: it stays, whole.
        for (i, &p) in s.src.params.clone().iter().enumerate() {
            let unread = !s.params.iter().any(|&(j, _, _)| j == i);
            if unread && s.src.ty(p).shape.iter().any(|d| d.as_const().is_none()) {
                s.make(p, P::Rep)?;
            }
        }
    }
    s.out.outputs = outputs.iter().map(|o| o.0).collect();
    Ok(Placed { func: s.out, params: s.params, outputs: outputs.iter().map(|o| o.1).collect(), collectives: s.collectives })
}

/// Ops whose result on placed-later operands is itself placed later (re-made per placement):
/// element-wise, layout and source ops; everything else is computed where it stands.
pub(super) fn free_op(k: OpKind) -> bool {
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

impl Sharder<'_, '_> {
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

    fn rk(&self, n: i64) -> Ranks<'_> {
        Ranks { n, split_symbols: &self.split_symbols }
    }

    fn can_make(&self, v: Value, p: P) -> bool {
        if p == P::Rep {
            return true;
        }
        if let Some(&b) = self.makeable.borrow().get(&(v, p)) {
            return b;
        }
        let b = self.can_make_uncached(v, p);
        self.makeable.borrow_mut().insert((v, p), b);
        b
    }

    fn can_make_uncached(&self, v: Value, p: P) -> bool {
        match self.src.values[v].def {
            ValueDef::Param(i) => match (p, self.args.get(i)) {
                (P::Split(a), Some(Arg::Free { split, .. })) => split.get(a).copied().unwrap_or(false),
                _ => false,
            },
            ValueDef::Result(n, _) if self.param_slice(n).is_some() => {
                let (_, a, s, e) = self.param_slice(n).unwrap_or_default();
                p == P::Split(a) && (e - s) % self.ranks as usize == 0
            }
            ValueDef::Result(n, _) => {
                p != P::Partial
                    && rules::needs(&self.src, n, p, &self.rk(self.ranks), &[]).is_some_and(|ps| self.src.nodes[n].inputs.iter().zip(ps).all(|(&i, q)| self.can_make(i, q)))
            }
        }
    }

    /// A slice of a splittable parameter with constant bounds: (parameter index, axis, start,
    /// end). Split along the sliced axis it is a parameter of its own.
    fn param_slice(&self, n: Node) -> Option<(usize, usize, usize, usize)> {
        let nd = &self.src.nodes[n];
        if nd.op.kind != OpKind::Slice {
            return None;
        }
        let ValueDef::Param(i) = self.src.values[nd.inputs[0]].def else { return None };
        if !matches!(self.args.get(i), Some(Arg::Free { cut: true, .. })) {
            return None;
        }
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
            Some(St::Act(x, q)) if p == P::Rep => self.make_whole(v, x, q),
            Some(St::Free) => self.make(v, p),
            _ => Err(ShardError::Graph(format!("{} is needed as {p:?} but is not available so (a bug of the pass)", self.src.label(v)))),
        }
    }

    /// The whole value of `v` (held as `x` in `q`): an `all_gather` of a split, an
    /// `all_reduce` of a partial sum.
    fn make_whole(&mut self, v: Value, x: Value, q: P) -> Result<Value, ShardError> {
        if let Some(&w) = self.whole.get(&v) {
            return Ok(w);
        }
        let ty = self.src.ty(v).clone();
        let ranks = Attr::Int(self.ranks);
        // A split symbol is the rank's size: the gathered axis is N times it.
        let ty = match q {
            P::Split(a) if ty.shape.get(a).is_some_and(|d| d.as_const().is_none()) => {
                let mut t = self.out.ty(x).clone();
                t.shape[a] = t.shape[a].mul(&sinter_ir::Dim::constant(self.ranks));
                t
            }
            _ => ty,
        };
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
        if let Some(&x) = self.made.get(&(v, p, None)) {
            return Ok(x);
        }
        let x = match self.src.values[v].def {
            ValueDef::Param(i) => {
                let ty = self.split_type(self.src.ty(v), p);
                let again = self.made.keys().any(|(w, _, _)| *w == v);
                let name = self.src.values[v].name.clone().map(|n| match p {
                    P::Split(a) if again => format!("{n}.split{a}"),
                    _ if again => format!("{n}.whole"),
                    _ => n,
                });
                self.params.push((i, p, None));
                self.out.add_param(name, ty)
            }
            ValueDef::Result(n, _) if matches!((self.param_slice(n), p), (Some((_, a, _, _)), P::Split(b)) if a == b) => {
                let (i, a, s0, e0) = self.param_slice(n).unwrap_or_default();
                let ty = self.split_type(self.src.ty(v), p);
                let name = self.src.values[self.src.params[i]].name.clone().map(|n| format!("{n}[{s0}:{e0}]"));
                self.params.push((i, p, Some((a, s0, e0))));
                self.out.add_param(name, ty)
            }
            ValueDef::Result(n, k) => {
                let ps = rules::needs(&self.src, n, p, &self.rk(self.ranks), &[]).ok_or_else(|| ShardError::Graph(format!("{} cannot be made as {p:?} (a bug of the pass)", self.src.label(v))))?;
                let ins = self.src.nodes[n].inputs.clone();
                let mut args = Vec::with_capacity(ins.len());
                for (&i, q) in ins.iter().zip(ps) {
                    args.push(self.make(i, q)?);
                }
                self.emit(n, args, p)?[k]
            }
        };
        self.made.insert((v, p, None), x);
        Ok(x)
    }

    /// Parameter `v`'s slice `cut`, in placement `p`: a parameter of this function's own,
    /// which its caller (or the entry's inputs) cut.
    fn make_cut(&mut self, v: Value, cut: Cut, p: P) -> Result<Value, ShardError> {
        if let Some(&x) = self.made.get(&(v, p, Some(cut))) {
            return Ok(x);
        }
        let ValueDef::Param(i) = self.src.values[v].def else {
            return Err(ShardError::Graph(format!("{} is sliced as a parameter but is not one (a bug of the pass)", self.src.label(v))));
        };
        let mut ty = self.src.ty(v).clone();
        ty.shape[cut.0] = sinter_ir::Dim::constant((cut.2 - cut.1) as i64);
        let ty = self.split_type(&ty, p);
        let name = self.src.values[v].name.clone().map(|n| format!("{n}[{}:{}]", cut.1, cut.2));
        self.params.push((i, p, Some(cut)));
        let x = self.out.add_param(name, ty);
        self.made.insert((v, p, Some(cut)), x);
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
        let nd = self.src.nodes[n].clone();
        let ins = nd.inputs.clone();
        let cur: Vec<Option<P>> = ins.iter().map(|&v| self.cur(v)).collect();
        let rank = nd.results.first().map_or(0, |&r| self.src.ty(r).rank());
        let mut cands = vec![P::Partial];
        cands.extend((0..rank).rev().map(P::Split));
        cands.push(P::Rep);
        // Cost: (exchanges, operands read split although their whole value is at hand).
        let mut best: Option<((usize, usize), P, Vec<P>)> = None;
        for po in cands {
            // The rows' lookup (of a table that is a parameter) needs the rank's index: a
            // parameter of the entry only.
            if po == P::Partial && nd.op.kind == OpKind::Gather && !(self.entry && matches!(self.src.values[ins[0]].def, ValueDef::Param(_))) {
                continue;
            }
            // A partial sum is reduced by `all_reduce`: float results only.
            if po == P::Partial && nd.results.first().is_none_or(|&r| !self.src.ty(r).dtype.is_float() || self.src.ty(r).dtype.is_fp8()) {
                continue;
            }
            let Some(ps) = rules::needs(&self.src, n, po, &self.rk(self.ranks), &cur) else { continue };
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
                rules::needs(&self.src, n, c, &self.rk(self.ranks), &cur).is_none()
                    && rules::needs(&self.src, n, c, &self.rk(1), &cur).is_some_and(|ps| {
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
                    return Err(ShardError::Indivisible { site: format!("@{} {n} `{}`", self.src.name, nd.op.kind.name()), what, ranks: self.ranks as usize });
                }
                let site = format!("@{} {n} `{}`", self.src.name, nd.op.kind.name());
                self.cx.replicated.push(format!("{site}: {what} do not divide; computed whole on every rank"));
            }
        }
        let mut args = Vec::with_capacity(ins.len());
        for (&v, q) in ins.iter().zip(ps) {
            args.push(self.get(v, q)?);
        }
        let outs = if po == P::Partial && nd.op.kind == OpKind::Gather { vec![self.rows_lookup(n, &args)?] } else { self.emit(n, args, po)? };
        let places = rules::results(&self.src, n, po);
        for ((&r, x), q) in nd.results.iter().zip(outs).zip(places) {
            self.st.insert(r, St::Act(x, q));
        }
        Ok(())
    }

    /// The rank's index, an `i64` scalar parameter of the entry (made once).
    fn rank_index(&mut self) -> Value {
        if let Some(x) = self.rank {
            return x;
        }
        let x = self.out.add_param(Some("tp_rank".into()), TensorType { dtype: sinter_ir::DType::I64, shape: vec![] });
        self.params.push((RANK, P::Rep, None));
        self.rank = Some(x);
        x
    }

    fn push(&mut self, kind: OpKind, attrs: Vec<(&str, Attr)>, ins: Vec<Value>) -> Result<Value, ShardError> {
        let op = Op::new(kind, attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()).map_err(|e| ShardError::Graph(e.to_string()))?;
        let tys: Vec<TensorType> = ins.iter().map(|&a| self.out.ty(a).clone()).collect();
        let ctx = InferCtx { op: &op, inputs: tys.iter().collect(), callee: None };
        let rt = (op.kind.info().infer)(&ctx).map_err(|e| ShardError::Graph(format!("`{}` of the rows' lookup: {e} (a bug of the pass)", kind.name())))?;
        Ok(self.out.push_node(op, ins, rt).1[0])
    }

    /// The rank's part of `gather(table, ids)` from its block of the table's rows
    /// (`args[0]`, rows r·V/N ..): ids outside the block give 0, so the ranks' parts sum to
    /// the lookup (Megatron-LM's `VocabParallelEmbedding`).
    fn rows_lookup(&mut self, n: Node, args: &[Value]) -> Result<Value, ShardError> {
        let (table, ids) = (args[0], args[1]);
        let rows = self.out.ty(table).shape[0].clone();
        let it = self.out.ty(ids).dtype;
        let dt = self.out.ty(table).dtype;
        let ir = self.out.ty(ids).rank();
        let rank = self.rank_index();
        let r = if it == sinter_ir::DType::I64 { rank } else { self.push(OpKind::Cast, vec![("dtype", Attr::DType(it))], vec![rank])? };
        let b = self.push(OpKind::Constant, vec![("value", Attr::Float(rows.as_const().unwrap_or(0) as f64)), ("dtype", Attr::DType(it))], vec![])?;
        let start = self.push(OpKind::Mul, vec![], vec![r, b])?;
        let local = self.push(OpKind::Sub, vec![], vec![ids, start])?;
        let zero_i = self.push(OpKind::Constant, vec![("value", Attr::Float(0.0)), ("dtype", Attr::DType(it))], vec![])?;
        let ge = self.push(OpKind::Ge, vec![], vec![local, zero_i])?;
        let lt = self.push(OpKind::Lt, vec![], vec![local, b])?;
        let mine = self.push(OpKind::LogicalAnd, vec![], vec![ge, lt])?;
        let safe = self.push(OpKind::Select, vec![], vec![mine, local, zero_i])?;
        let got = self.push(OpKind::Gather, vec![], vec![table, safe])?;
        // The mask over the looked-up rows' trailing axes.
        let mut shape = self.out.ty(mine).shape.clone();
        shape.extend(std::iter::repeat_n(sinter_ir::Dim::constant(1), self.out.ty(got).rank() - ir));
        let mask = self.push(OpKind::Reshape, vec![("shape", Attr::Dims(shape))], vec![mine])?;
        let zero = self.push(OpKind::Constant, vec![("value", Attr::Float(0.0)), ("dtype", Attr::DType(dt))], vec![])?;
        let _ = n;
        self.push(OpKind::Select, vec![], vec![mask, got, zero])
    }

    /// The outputs: partial sums reduced, free values made whole; in the entry, a split output
    /// stays split when it is the rank's block of a state read back as a parameter of the same
    /// type split the same way (the KV cache), and is gathered whole otherwise.
    fn outputs(&mut self) -> Result<Vec<(Value, P)>, ShardError> {
        let mut outs = Vec::new();
        for &o in &self.src.outputs.clone() {
            let ty = self.src.ty(o).clone();
            let out = match self.st.get(&o).copied() {
                Some(St::Act(x, P::Split(a))) if !self.entry || self.is_state(&ty, a) => (x, P::Split(a)),
                Some(St::Act(x, q)) => (self.make_whole(o, x, q)?, P::Rep),
                _ => (self.make(o, P::Rep)?, P::Rep),
            };
            outs.push(out);
        }
        Ok(outs)
    }

    fn is_state(&self, ty: &TensorType, a: usize) -> bool {
        self.params.iter().any(|&(i, p, cut)| p == P::Split(a) && cut.is_none() && self.src.params.get(i).is_some_and(|&v| self.src.ty(v) == ty))
    }

    /// The kind each argument of call node `n` arrives as in the callee.
    fn arg_kinds(&self, n: Node) -> Vec<Arg> {
        self.src.nodes[n]
            .inputs
            .iter()
            .map(|&v| match self.st.get(&v) {
                Some(St::Act(_, p)) => Arg::Act(*p),
                _ => Arg::Free {
                    split: (0..self.src.ty(v).rank()).map(|a| self.can_make(v, P::Split(a))).collect(),
                    cut: matches!(self.src.values[v].def, ValueDef::Param(i) if matches!(self.args.get(i), Some(Arg::Free { cut: true, .. }))),
                    weight: matches!(self.src.values[v].def, ValueDef::Param(i) if matches!(self.args.get(i), Some(Arg::Free { weight: true, .. }))),
                },
            })
            .collect()
    }

    /// Places call node `n`: a version of the callee placed for these argument kinds (made
    /// now unless one made earlier takes them), called with its parameters in the placements
    /// it asked for.
    fn call(&mut self, n: Node) -> Result<(), ShardError> {
        let nd = self.src.nodes[n].clone();
        // Partial sums are made whole before a call: a callee sees whole or split values.
        for &a in &nd.inputs {
            if let Some(St::Act(x, P::Partial)) = self.st.get(&a).copied() {
                let w = self.make_whole(a, x, P::Partial)?;
                self.st.insert(a, St::Act(w, P::Rep));
            }
        }
        let name = nd.op.str("func").unwrap_or_default().to_string();
        let kinds = self.arg_kinds(n);
        let found = self.cx.versions.get(&name).and_then(|vs| vs.iter().position(|v| compatible(v, &kinds)));
        let k = match found {
            Some(k) => k,
            None => {
                let callee = self.cx.g.func(&name).ok_or_else(|| ShardError::Graph(format!("@{name} is not a function of the graph")))?.clone();
                if self.cx.depth >= MAX_DEPTH {
                    return Err(ShardError::Graph(format!("calls nest deeper than {MAX_DEPTH}")));
                }
                self.cx.depth += 1;
                let placed = shard_function(self.cx, &callee, kinds.clone(), false);
                self.cx.depth -= 1;
                let mut placed = placed?;
                let versions = self.cx.versions.entry(name.clone()).or_default();
                let vname = if versions.is_empty() { name.clone() } else { format!("{name}.tp{}", versions.len()) };
                placed.func.name = vname.clone();
                versions.push(Version { name: vname, args: kinds, params: placed.params, outputs: placed.outputs, collectives: placed.collectives });
                self.cx.funcs.push(placed.func);
                versions.len() - 1
            }
        };
        let v = &self.cx.versions[&name][k];
        let (vname, params, outputs, coll) = (v.name.clone(), v.params.clone(), v.outputs.clone(), v.collectives);
        let mut args = Vec::with_capacity(params.len());
        for (j, p, cut) in params {
            let a = nd.inputs[j];
            args.push(match cut {
                Some(c) => self.make_cut(a, c, p)?,
                None => self.get(a, p)?,
            });
        }
        let op = Op::new(OpKind::Call, vec![("func".into(), Attr::Str(vname))]).map_err(|e| ShardError::Graph(e.to_string()))?;
        // The caller's own result types (the callee's may name its own symbols), split as placed.
        let tys = nd.results.iter().zip(&outputs).map(|(&r, &q)| self.split_type(self.src.ty(r), q)).collect();
        let rs = self.out.push_node(op, args, tys).1;
        for ((&r, x), q) in nd.results.iter().zip(rs).zip(outputs) {
            self.st.insert(r, St::Act(x, q));
        }
        self.collectives.0 += coll.0;
        self.collectives.1 += coll.1;
        Ok(())
    }
}

/// Whether version `v` takes arguments of kinds `kinds`: a placed argument in the placement
/// the version received or asked for, a free one makeable in every placement it asked for.
fn compatible(v: &Version, kinds: &[Arg]) -> bool {
    kinds.len() == v.args.len()
        && kinds.iter().enumerate().all(|(j, k)| {
            let asks = v.params.iter().filter(|(i, _, _)| *i == j);
            match (k, &v.args[j]) {
                (Arg::Act(q), Arg::Act(q2)) => q == q2,
                (Arg::Act(q), Arg::Free { .. }) => asks.clone().all(|&(_, p, cut)| p == *q && cut.is_none()),
                (Arg::Free { split, cut, .. }, _) => asks.clone().all(|&(_, p, c)| match (p, c) {
                    (_, Some(_)) => *cut,
                    (P::Rep, None) => true,
                    (P::Split(a), None) => split.get(a).copied().unwrap_or(false),
                    (P::Partial, None) => false,
                }),
            }
        })
}
