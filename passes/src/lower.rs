//! Lowering to a [`KernelGraph`]: [`compile`] (optimise, inline, fuse) and [`lower_unfused`]
//! (one kernel per node).
//!
//! **Calls.** Every function is optimised once ([`crate::optimise`]); then the entry function
//! is flattened by inlining the *optimised* body of the callee at every call (symbols of the
//! callee substituted by the caller's dims, values renamed `callee<k>.name`), so a decoder
//! layer is saturated once and instantiated per layer. Each node remembers the call it came
//! from (its *origin*, e.g. `layer#3`), which the report uses to count kernels per layer.
//! After inlining, identical nodes are merged (CSE: the `positions + 1` of every layer is
//! computed once) and dead nodes dropped.
//!
//! **Reductions over another axis** than the last are rewritten as a `permute` moving the
//! axis last, the reduction over the last axis, and the inverse `permute` where the axis is
//! kept, so that every RowReduction kernel reduces its last axis.
//!
//! **Kernels and buffers.** Kernels follow [`crate::partition`]. Every graph parameter is an
//! `Input` buffer (named), every graph output an `Output` buffer, every other value that
//! crosses kernels a `Temp` buffer; layouts are row-major contiguous. A kernel's body is an IR
//! function whose parameters are its input buffers and whose outputs are its output buffers.
//! Bodies by family, as the code generator reads them:
//!
//! - Pointwise: a DAG of element-wise ops (broadcasting included);
//! - RowReduction: element-wise prologue, reductions / softmax / norms over the last axis,
//!   element-wise epilogue;
//! - Matmul: one matmul, then an element-wise epilogue on its output, possibly split into
//!   column slices written to separate buffers (a merged QKV or gate/up projection);
//! - Attention, PagedAttention, AttentionMerge, KvAppend, Gather, Layout: the single op;
//!
//! and in every family, **view and source ops** — `reshape`, a `slice` that is an offset range
//! of a contiguous buffer, `constant`, `iota` — may appear at the start of the body on its
//! parameters, or at the end on a result: a reshape of a contiguous buffer is the same
//! storage, so it never gets a kernel of its own in [`compile`] (in [`lower_unfused`] it is a
//! Layout copy kernel).
//!
//! **Within the code generator's contract** ([`crate::PassOptions::codegen_contract`], the
//! default; [`sinter_ir::contract`]) the bodies are what the generators accept: a Matmul body is
//! its matmul on kernel inputs (through views) and an epilogue that
//! [`sinter_ir::epilogue::analyse`] accepts — for a decoder layer, the QKV projection with
//! RoPE on Q and K that also scatters K and V into the paged cache (`kv_append`), and the
//! gate/up projection with SwiGLU over its halves; Attention and PagedAttention bodies are
//! the single op on views of kernel inputs, writing through a reshape; a KvAppend body may
//! compute its new rows (views, RoPE) but writes only the pages. An operand these generators
//! read as a buffer is read in place when it is a view of a buffer (a reshape of an
//! attention output before the output projection costs nothing), and otherwise written by the
//! kernel that computes its base or by a Layout kernel of its own. [`build_within_contract`]
//! checks every kernel and splits any the partitioner got wrong.
//!
//! **Aliasing.** `kv_append` is functional in the IR; on the device its outputs are its page
//! inputs updated in place. The report lists these aliases (`FusionReport::aliases`).
//!
//! **Load-time kernels.** The partition is cut at the load-time frontier ([`crate::hoist`]):
//! work on weights and constants (the concatenated weights of merged projections, a
//! transposed or scaled weight, a norm's `1 + w`, a table built from `iota`) gets kernels of
//! its own rather than being redone in per-step kernels, where that does not make a step read
//! more. Every kernel that reads only weights and other such kernels' results, with constant
//! shapes and no graph output ([`KernelGraph::load_time_kernels`]), is marked `load_time` in
//! the report: whoever binds the weights runs it once, instead of at every step.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Instant;

use sinter_ir::{
    Attr, Buffer, BufferData, BufferRole, Dim, Family, Function, Graph, KernelData, KernelGraph, Layout, Node, Op, OpKind, Signature, Target, TensorType, Value,
    ValueDef,
};

use crate::lang::{neg_axis, OpSym};
use crate::optimise::optimise_function_with_weights;
use crate::hoist::Hoist;
use crate::partition::{self, Partition, Role, Uses};
use crate::report::{FunctionReport, FusionReport, KernelMeta, KernelReport};
use crate::{PassError, PassOptions};

/// A function with every call inlined, and where each node came from.
#[derive(Clone, Debug)]
pub struct Flat {
    /// The flat function.
    pub func: Function,
    /// The origin of each node: an index into `origins`.
    pub origin: HashMap<Node, usize>,
    /// Origins: the entry's name, then `callee#k` (nested: `outer#i/inner#j`).
    pub origins: Vec<String>,
}

/// The maximum depth of nested calls inlined.
const MAX_DEPTH: usize = 64;

struct Inliner<'g> {
    g: &'g Graph,
    out: Function,
    origin: HashMap<Node, usize>,
    origins: Vec<String>,
    names: HashSet<String>,
    counters: HashMap<String, usize>,
}

fn subst_ty(t: &TensorType, map: &BTreeMap<String, Dim>) -> TensorType {
    if map.is_empty() {
        return t.clone();
    }
    TensorType { dtype: t.dtype, shape: t.shape.iter().map(|d| d.substitute(map)).collect() }
}

fn subst_op(op: &Op, map: &BTreeMap<String, Dim>) -> Op {
    if map.is_empty() {
        return op.clone();
    }
    let attrs = op
        .attrs
        .iter()
        .map(|a| match a {
            Attr::Dims(v) => Attr::Dims(v.iter().map(|d| d.substitute(map)).collect()),
            Attr::Dim(d) => Attr::Dim(d.substitute(map)),
            other => other.clone(),
        })
        .collect();
    Op { kind: op.kind, attrs }
}

impl Inliner<'_> {
    fn unique(&mut self, name: String) -> String {
        if self.names.insert(name.clone()) {
            return name;
        }
        let mut i = 1;
        loop {
            let cand = format!("{name}_{i}");
            if self.names.insert(cand.clone()) {
                return cand;
            }
            i += 1;
        }
    }

    fn emit(&mut self, f: &Function, args: &[Value], map: &BTreeMap<String, Dim>, origin: usize, prefix: &str, depth: usize) -> Result<Vec<Value>, PassError> {
        if depth > MAX_DEPTH {
            return Err(PassError::Lower(format!("calls nest deeper than {MAX_DEPTH} at @{}", f.name)));
        }
        let mut env: HashMap<Value, Value> = HashMap::new();
        for (p, a) in f.params.iter().zip(args) {
            env.insert(*p, *a);
        }
        for (n, nd) in f.nodes.iter() {
            let mut inputs = Vec::with_capacity(nd.inputs.len());
            for v in &nd.inputs {
                inputs.push(*env.get(v).ok_or_else(|| PassError::Lower(format!("@{} {n}: operand {v} undefined", f.name)))?);
            }
            if nd.op.kind == OpKind::Call {
                let name = nd.op.str("func").unwrap_or("");
                let callee = self.g.func(name).ok_or_else(|| PassError::Lower(format!("@{}: callee @{name} is not in the graph", f.name)))?;
                let mut cmap: BTreeMap<String, Dim> = BTreeMap::new();
                for (p, a) in callee.params.iter().zip(&inputs) {
                    for (pd, ad) in callee.ty(*p).shape.iter().zip(&self.out.ty(*a).shape) {
                        if let Some(s) = pd.as_symbol() {
                            cmap.entry(s.to_string()).or_insert_with(|| ad.clone());
                        }
                    }
                }
                cmap.retain(|k, v| v.as_symbol() != Some(k.as_str()));
                let k = {
                    let c = self.counters.entry(format!("{prefix}{}", crate::specialise::base_name(name))).or_insert(0);
                    *c += 1;
                    *c - 1
                };
                let parent = if origin == 0 { String::new() } else { format!("{}/", self.origins[origin]) };
                self.origins.push(format!("{parent}{}#{k}", crate::specialise::base_name(name)));
                let o = self.origins.len() - 1;
                let results = self.emit(callee, &inputs, &cmap, o, &format!("{prefix}{name}{k}."), depth + 1)?;
                if results.len() != nd.results.len() {
                    return Err(PassError::Lower(format!("@{}: call of @{name} gives {} results, the node declares {}", f.name, results.len(), nd.results.len())));
                }
                for (r, v) in nd.results.iter().zip(results) {
                    env.insert(*r, v);
                }
                continue;
            }
            let tys: Vec<TensorType> = nd.results.iter().map(|&r| subst_ty(f.ty(r), map)).collect();
            let (node, results) = self.out.push_node(subst_op(&nd.op, map), inputs, tys);
            self.origin.insert(node, origin);
            for (r, v) in nd.results.iter().zip(&results) {
                if let Some(name) = &f.values[*r].name {
                    let nm = self.unique(format!("{prefix}{name}"));
                    self.out.values[*v].name = Some(nm);
                }
                env.insert(*r, *v);
            }
        }
        let mut outs = vec![];
        for o in &f.outputs {
            outs.push(*env.get(o).ok_or_else(|| PassError::Lower(format!("@{}: output {o} undefined", f.name)))?);
        }
        Ok(outs)
    }
}

/// Inlines every call of the entry function of `g` (recursively).
///
/// # Errors
/// A graph without an entry, an unknown callee, calls nested too deep.
pub fn inline(g: &Graph) -> Result<Flat, PassError> {
    let entry = g.entry().ok_or_else(|| PassError::Lower("the graph has no function".into()))?;
    let mut out = Function::new(entry.name.clone());
    let mut names = HashSet::new();
    let args: Vec<Value> = entry
        .params
        .iter()
        .map(|&p| {
            let name = entry.values[p].name.clone();
            if let Some(n) = &name {
                names.insert(n.clone());
            }
            out.add_param(name, entry.ty(p).clone())
        })
        .collect();
    let mut inl = Inliner { g, out, origin: HashMap::new(), origins: vec![entry.name.clone()], names, counters: HashMap::new() };
    let outs = inl.emit(entry, &args, &BTreeMap::new(), 0, "", 0)?;
    inl.out.outputs = outs;
    Ok(Flat { func: inl.out, origin: inl.origin, origins: inl.origins })
}

/// Merges identical nodes (same op, same operands) and drops nodes no output needs.
pub fn cse_dce(flat: &Flat) -> Flat {
    let f = &flat.func;
    // Liveness, backwards.
    let mut live: HashSet<Value> = f.outputs.iter().copied().collect();
    let mut live_nodes: HashSet<Node> = HashSet::new();
    for (n, nd) in f.nodes.iter().rev() {
        if nd.results.iter().any(|r| live.contains(r)) {
            live_nodes.insert(n);
            live.extend(nd.inputs.iter().copied());
        }
    }
    let mut out = Function::new(f.name.clone());
    let mut map: HashMap<Value, Value> = HashMap::new();
    for &p in &f.params {
        let v = out.add_param(f.values[p].name.clone(), f.ty(p).clone());
        map.insert(p, v);
    }
    let mut table: HashMap<(OpSym, Vec<Value>), Vec<Value>> = HashMap::new();
    let mut origin = HashMap::new();
    for (n, nd) in f.nodes.iter() {
        if !live_nodes.contains(&n) {
            continue;
        }
        let inputs: Vec<Value> = nd.inputs.iter().map(|v| map.get(v).copied().unwrap_or(*v)).collect();
        let key = (OpSym::new(nd.op.clone()), inputs.clone());
        if let Some(rs) = table.get(&key) {
            for (r, v) in nd.results.iter().zip(rs) {
                map.insert(*r, *v);
            }
            continue;
        }
        let (node, rs) = out.push_node(nd.op.clone(), inputs, nd.results.iter().map(|&r| f.ty(r).clone()).collect());
        origin.insert(node, flat.origin.get(&n).copied().unwrap_or(0));
        for (r, v) in nd.results.iter().zip(&rs) {
            out.values[*v].name = f.values[*r].name.clone();
            map.insert(*r, *v);
        }
        table.insert(key, rs);
    }
    out.outputs = f.outputs.iter().map(|v| map.get(v).copied().unwrap_or(*v)).collect();
    Flat { func: out, origin, origins: flat.origins.clone() }
}

/// Rewrites every reduction, softmax and log_softmax over an axis other than the last as
/// `permute → op over the last axis → inverse permute` (the last only where the axis is kept).
pub fn reductions_to_last_axis(flat: &Flat) -> Result<Flat, PassError> {
    let f = &flat.func;
    let mut out = Function::new(f.name.clone());
    let mut map: HashMap<Value, Value> = HashMap::new();
    for &p in &f.params {
        map.insert(p, out.add_param(f.values[p].name.clone(), f.ty(p).clone()));
    }
    let mut origin = HashMap::new();
    let lower_err = |e: String| PassError::Lower(e);
    for (n, nd) in f.nodes.iter() {
        let o = flat.origin.get(&n).copied().unwrap_or(0);
        let inputs: Vec<Value> = nd.inputs.iter().map(|v| map.get(v).copied().unwrap_or(*v)).collect();
        let k = nd.op.kind;
        let is_row = matches!(k, OpKind::ReduceSum | OpKind::ReduceMax | OpKind::ReduceMin | OpKind::ReduceMean | OpKind::Softmax | OpKind::LogSoftmax);
        let rank = inputs.first().map(|&x| out.ty(x).rank()).unwrap_or(0);
        let axis = nd.op.int("axis").map(|a| neg_axis(a, rank));
        if is_row && rank > 1 && axis.is_some_and(|a| a != -1) {
            let a = (axis.unwrap_or(-1) + rank as i64) as usize;
            let x = inputs[0];
            let tx = out.ty(x).clone();
            let mut perm: Vec<i64> = (0..rank as i64).filter(|&i| i != a as i64).collect();
            perm.push(a as i64);
            let pop = Op::new(OpKind::Permute, vec![("perm".into(), Attr::Ints(perm.clone()))]).map_err(|e| lower_err(e.to_string()))?;
            let pty = TensorType { dtype: tx.dtype, shape: perm.iter().map(|&i| tx.shape[i as usize].clone()).collect() };
            let (pn, pv) = out.push_node(pop, vec![x], vec![pty.clone()]);
            origin.insert(pn, o);
            let mut op = nd.op.clone();
            if let Some(i) = k.attr_index("axis") {
                op.attrs[i] = Attr::Int(-1);
            }
            let keep = k == OpKind::Softmax || k == OpKind::LogSoftmax || nd.op.bool("keepdim") == Some(true);
            let mut rty = pty.clone();
            if k != OpKind::Softmax && k != OpKind::LogSoftmax {
                if keep {
                    if let Some(last) = rty.shape.last_mut() {
                        *last = Dim::constant(1);
                    }
                } else {
                    rty.shape.pop();
                }
            }
            let (rn, rv) = out.push_node(op, pv, vec![rty]);
            origin.insert(rn, o);
            let result = if keep {
                let mut inv = vec![0i64; rank];
                for (i, &p) in perm.iter().enumerate() {
                    inv[p as usize] = i as i64;
                }
                let iop = Op::new(OpKind::Permute, vec![("perm".into(), Attr::Ints(inv))]).map_err(|e| lower_err(e.to_string()))?;
                let (inode, iv) = out.push_node(iop, rv, vec![f.ty(nd.results[0]).clone()]);
                origin.insert(inode, o);
                iv[0]
            } else {
                rv[0]
            };
            out.values[result].name = f.values[nd.results[0]].name.clone();
            map.insert(nd.results[0], result);
            continue;
        }
        let (node, rs) = out.push_node(nd.op.clone(), inputs, nd.results.iter().map(|&r| f.ty(r).clone()).collect());
        origin.insert(node, o);
        for (r, v) in nd.results.iter().zip(&rs) {
            out.values[*v].name = f.values[*r].name.clone();
            map.insert(*r, *v);
        }
    }
    out.outputs = f.outputs.iter().map(|v| map.get(v).copied().unwrap_or(*v)).collect();
    Ok(Flat { func: out, origin, origins: flat.origins.clone() })
}

/// One kernel before buffers are assigned.
struct Spec {
    family: Family,
    members: Vec<Node>,
    pull_roots: Vec<Value>,
    exports: Vec<Value>,
    origin: usize,
    /// The partition's kernel it comes from (none for a graph output's view kernel).
    group: Option<usize>,
}

/// Builds the kernel graph of a flat function under a partition.
///
/// # Errors
/// A value that a kernel reads but nothing materialises (an internal error).
pub fn build_kernel_graph(flat: &Flat, part: &Partition) -> Result<(KernelGraph, Vec<KernelMeta>), PassError> {
    let f = &flat.func;
    let uses = Uses::new(f);
    let mut specs: Vec<Spec> = vec![];
    let mut spec_of_group: HashMap<usize, usize> = HashMap::new();
    for g in part.live() {
        let grp = &part.groups[g];
        let mut members = grp.nodes.clone();
        members.sort();
        let origin_node = members
            .iter()
            .copied()
            .find(|&n| partition::role(f, n) != Role::Point)
            .or(members.first().copied())
            .or_else(|| grp.roots.first().and_then(|r| uses.producer.get(r).copied()));
        let origin = origin_node.and_then(|n| flat.origin.get(&n)).copied().unwrap_or(0);
        spec_of_group.insert(g, specs.len());
        specs.push(Spec { family: grp.family, members, pull_roots: grp.roots.clone(), exports: vec![], origin, group: Some(g) });
    }
    // The kernel writing a value: its root's host, or the kernel of the node computing it.
    let spec_of_value = |v: Value| part.source(&uses, v).and_then(|g| spec_of_group.get(&g)).copied();
    // Which values each kernel reads (through views and sources it recomputes).
    let mut value_users: HashMap<Value, Vec<usize>> = HashMap::new();
    for (si, spec) in specs.iter().enumerate() {
        let g = spec.group;
        let vals = spec.members.iter().flat_map(|&m| f.nodes[m].inputs.iter().copied()).chain(spec.pull_roots.iter().copied());
        for v in vals {
            for b in part.reads(f, &uses, v, g) {
                value_users.entry(b).or_default().push(si);
            }
        }
    }
    // Exports: results (and roots) read by another kernel.
    for (si, spec) in specs.iter_mut().enumerate() {
        let written = spec.members.iter().flat_map(|&n| f.nodes[n].results.iter().copied()).chain(spec.pull_roots.iter().copied()).collect::<Vec<_>>();
        for r in written {
            let crosses = value_users.get(&r).into_iter().flatten().any(|&u| u != si);
            if crosses && !spec.exports.contains(&r) {
                spec.exports.push(r);
            }
        }
    }
    // Graph outputs.
    for &o in &f.outputs {
        if matches!(f.values[o].def, ValueDef::Param(_)) {
            continue;
        }
        let Some(&p) = uses.producer.get(&o) else { continue };
        if let Some(si) = spec_of_value(o) {
            if !specs[si].exports.contains(&o) {
                specs[si].exports.push(o);
            }
            continue;
        }
        // A view/source chain over one kernel's result: that kernel writes it (a view at the
        // end of its body); otherwise (over inputs, or several kernels) a kernel of its own.
        let bases = part.reads(f, &uses, o, None);
        let host = match bases.as_slice() {
            [b] if !part.own_kernel.contains(&o) => spec_of_value(*b),
            _ => None,
        };
        match host {
            Some(si) => {
                specs[si].pull_roots.push(o);
                specs[si].exports.push(o);
            }
            None => {
                let has_view = chain_nodes(f, &uses, part, o).iter().any(|&n| partition::role(f, n) == Role::View);
                let origin = flat.origin.get(&p).copied().unwrap_or(0);
                specs.push(Spec { family: if has_view { Family::Layout } else { Family::Pointwise }, members: vec![], pull_roots: vec![o], exports: vec![o], origin, group: None });
            }
        }
    }
    // Bodies: the members, and the view/source chains they and the roots need, up to
    // parameters, grouped nodes' results and other kernels' roots.
    let mut bodies = Vec::with_capacity(specs.len());
    for spec in &specs {
        let mut set: BTreeSet<Node> = spec.members.iter().copied().collect();
        let mut stack: Vec<Value> = spec.members.iter().flat_map(|&n| f.nodes[n].inputs.iter().copied()).collect();
        stack.extend(spec.pull_roots.iter().copied());
        let own = |v: &Value| spec.pull_roots.contains(v);
        while let Some(v) = stack.pop() {
            if part.host_of.contains_key(&v) && !own(&v) && part.host_of.get(&v).copied() != spec.group {
                continue;
            }
            if let Some(&p) = uses.producer.get(&v) {
                if !part.group_of.contains_key(&p) && set.insert(p) {
                    stack.extend(f.nodes[p].inputs.iter().copied());
                }
            }
        }
        let nodes: Vec<Node> = set.into_iter().collect();
        let produced: HashSet<Value> = nodes.iter().flat_map(|&n| f.nodes[n].results.iter().copied()).collect();
        let mut params = vec![];
        for &n in &nodes {
            for &v in &f.nodes[n].inputs {
                if !produced.contains(&v) && !params.contains(&v) {
                    params.push(v);
                }
            }
        }
        bodies.push(Body { nodes, params });
    }
    // Every value a body reads from another kernel is exported by that kernel.
    for (si, b) in bodies.iter().enumerate() {
        for &v in &b.params {
            if let Some(sj) = spec_of_value(v) {
                if sj != si && !specs[sj].exports.contains(&v) {
                    specs[sj].exports.push(v);
                }
            }
        }
    }
    // An attention kernel writes O even when only its log-sum-exp is read (the generators'
    // contract): an O nothing reads gets a buffer of its own.
    for (si, b) in bodies.iter().enumerate() {
        for &n in &b.nodes {
            let nd = &f.nodes[n];
            if !matches!(nd.op.kind, OpKind::Attention | OpKind::PagedAttention) {
                continue;
            }
            let Some(&o) = nd.results.first() else { continue };
            let read = f.outputs.contains(&o) || f.nodes.values().any(|m| m.inputs.contains(&o));
            if !read && !specs[si].exports.contains(&o) {
                specs[si].exports.push(o);
            }
        }
    }
    let order = launch_order(f, &specs, &bodies)?;
    // Buffers.
    let mut kg = KernelGraph::default();
    let mut buf_of: HashMap<Value, Buffer> = HashMap::new();
    for &p in &f.params {
        let ty = f.ty(p).clone();
        let b = kg.buffers.push(BufferData { name: f.values[p].name.clone(), layout: Layout::contiguous(&ty.shape), ty, role: BufferRole::Input });
        buf_of.insert(p, b);
        kg.inputs.push(b);
    }
    let outputs: Vec<Value> = f.outputs.clone();
    let mut metas = vec![];
    for &si in &order {
        let spec = &specs[si];
        let body = &bodies[si];
        for &e in &spec.exports {
            if buf_of.contains_key(&e) {
                continue;
            }
            let ty = f.ty(e).clone();
            let out_idx = outputs.iter().position(|&o| o == e);
            let role = if out_idx.is_some() { BufferRole::Output } else { BufferRole::Temp };
            let name = f.values[e].name.clone().or_else(|| out_idx.map(|i| format!("out{i}")));
            let b = kg.buffers.push(BufferData { name, layout: Layout::contiguous(&ty.shape), ty, role });
            buf_of.insert(e, b);
        }
        let idx = kg.kernels.len();
        let mut bf = Function::new(format!("k{idx}_{}", spec.family.name()));
        let mut vmap: HashMap<Value, Value> = HashMap::new();
        let mut inputs = vec![];
        for &v in &body.params {
            let nv = bf.add_param(f.values[v].name.clone(), f.ty(v).clone());
            vmap.insert(v, nv);
            inputs.push(*buf_of.get(&v).ok_or_else(|| PassError::Lower(format!("internal: {} has no buffer", f.label(v))))?);
        }
        for &n in &body.nodes {
            let nd = &f.nodes[n];
            let ins: Vec<Value> = nd.inputs.iter().map(|v| vmap.get(v).copied().unwrap_or(*v)).collect();
            let (_, rs) = bf.push_node(nd.op.clone(), ins, nd.results.iter().map(|&r| f.ty(r).clone()).collect());
            for (r, v) in nd.results.iter().zip(rs) {
                bf.values[v].name = f.values[*r].name.clone();
                vmap.insert(*r, v);
            }
        }
        let mut outs = vec![];
        for &e in &spec.exports {
            bf.outputs.push(*vmap.get(&e).ok_or_else(|| PassError::Lower(format!("internal: export {} is not computed by its kernel", f.label(e))))?);
            outs.push(buf_of[&e]);
        }
        metas.push(KernelMeta { origin: flat.origins.get(spec.origin).cloned().unwrap_or_default(), load_time: false, group: spec.group });
        kg.kernels.push(KernelData { family: spec.family, body: bf, inputs, outputs: outs });
    }
    for &o in &outputs {
        kg.outputs.push(*buf_of.get(&o).ok_or_else(|| PassError::Lower(format!("internal: output {} has no buffer", f.label(o))))?);
    }
    Ok((kg, metas))
}

/// A kernel body: its nodes and the values it reads as buffers.
struct Body {
    nodes: Vec<Node>,
    params: Vec<Value>,
}

/// The launch order of the kernels: topological over what each reads, with in-place
/// `kv_append`s after every other reader of the pages they update.
///
/// # Errors
/// A value read but written by no kernel, a cycle (internal errors), and a kernel that reads
/// pages both before and after one in-place append.
fn launch_order(f: &Function, specs: &[Spec], bodies: &[Body]) -> Result<Vec<usize>, PassError> {
    // Launch order: topological over specs.
    let mut producer_spec: HashMap<Value, usize> = HashMap::new();
    for (si, s) in specs.iter().enumerate() {
        for &e in &s.exports {
            producer_spec.entry(e).or_insert(si);
        }
    }
    let mut deps: Vec<BTreeSet<usize>> = vec![BTreeSet::new(); specs.len()];
    for (si, b) in bodies.iter().enumerate() {
        for v in &b.params {
            if matches!(f.values[*v].def, ValueDef::Param(_)) {
                continue;
            }
            match producer_spec.get(v) {
                Some(&ps) if ps != si => {
                    deps[si].insert(ps);
                }
                Some(_) => {}
                None => return Err(PassError::Lower(format!("internal: {} is read by a kernel but no kernel writes it", f.label(*v)))),
            }
        }
    }
    // In-place updates: a `kv_append` writes its page operands' storage (the executor aliases
    // its results to them), so every other kernel reading those pages as they were launches
    // before it (a write-after-read order the values alone do not give).
    let mut anti: Vec<(usize, usize)> = vec![];
    for (si, b) in bodies.iter().enumerate() {
        for nd in b.nodes.iter().map(|&n| &f.nodes[n]).filter(|nd| nd.op.kind == OpKind::KvAppend) {
            for page in nd.inputs.iter().take(2) {
                for (sj, bj) in bodies.iter().enumerate() {
                    if sj != si && bj.params.contains(page) && deps[si].insert(sj) {
                        anti.push((sj, si));
                    }
                }
            }
        }
    }
    // A kernel launches, among those ready, in the order of its first member (a kernel of
    // roots alone: of its first view; a graph output's view copy: of its last).
    let key = |si: usize| -> usize {
        let s = &specs[si];
        let chain = if s.group.is_some() { bodies[si].nodes.first() } else { bodies[si].nodes.last() };
        s.members.first().or(chain).map(|n| n.as_u32() as usize).unwrap_or(0)
    };
    let mut order = vec![];
    let mut done = vec![false; specs.len()];
    let mut ready: BTreeSet<(usize, usize)> = BTreeSet::new();
    let mut remaining: Vec<usize> = deps.iter().map(|d| d.len()).collect();
    let mut rdeps: Vec<Vec<usize>> = vec![vec![]; specs.len()];
    for (si, d) in deps.iter().enumerate() {
        for &p in d {
            rdeps[p].push(si);
        }
        if d.is_empty() {
            ready.insert((key(si), si));
        }
    }
    while let Some(&(k, si)) = ready.iter().next() {
        ready.remove(&(k, si));
        done[si] = true;
        order.push(si);
        for &c in &rdeps[si] {
            remaining[c] -= 1;
            if remaining[c] == 0 && !done[c] {
                ready.insert((key(c), c));
            }
        }
    }
    if order.len() != specs.len() {
        let stuck: Vec<String> = (0..specs.len())
            .filter(|&si| !done[si])
            .take(6)
            .map(|si| {
                let ops: Vec<&str> = specs[si].members.iter().map(|&n| f.nodes[n].op.kind.name()).collect();
                let waits: Vec<usize> = deps[si].iter().copied().filter(|&d| !done[d]).collect();
                format!("kernel of [{}] waits for {waits:?}", ops.join(" "))
            })
            .collect();
        if let Some(&(r, a)) = anti.iter().find(|(r, a)| !done[*r] && !done[*a]) {
            let ops = |si: usize| specs[si].members.iter().map(|&n| f.nodes[n].op.kind.name()).collect::<Vec<_>>().join(" ");
            return Err(PassError::Lower(format!(
                "a kernel of [{}] reads KV pages as they were before a kv_append (kernel of [{}]) updates them in place, and also needs that append's results: unsupported (read the pages after the append, or copy them first)",
                ops(r),
                ops(a)
            )));
        }
        return Err(PassError::Lower(format!("internal: the kernel graph is cyclic: {}", stuck.join("; "))));
    }
    Ok(order)
}

/// The nodes of the view/source chain behind `v` (not crossing grouped nodes).
fn chain_nodes(f: &Function, uses: &Uses, part: &Partition, v: Value) -> Vec<Node> {
    let mut out = vec![];
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        if let Some(&p) = uses.producer.get(&x) {
            if !part.group_of.contains_key(&p) && !out.contains(&p) {
                out.push(p);
                stack.extend(f.nodes[p].inputs.iter().copied());
            }
        }
    }
    out
}

/// One kernel per node of the graph (calls inlined, no rewriting, no fusion): the baseline the
/// fused graph is compared with. Reductions over other axes get a Layout transpose first; a
/// `reshape` is a Layout copy kernel; sources are Pointwise kernels.
///
/// # Errors
/// A graph that does not verify; see [`inline`].
pub fn lower_unfused(g: &Graph) -> Result<KernelGraph, PassError> {
    sinter_ir::verify(g)?;
    let g = &crate::expand::expand(g)?;
    let flat = reductions_to_last_axis(&inline(g)?)?;
    let part = partition::one_per_node(&flat.func);
    Ok(build_kernel_graph(&flat, &part)?.0)
}

/// How many times [`build_within_contract`] splits refused kernels before giving up.
const CONTRACT_ROUNDS: usize = 8;

/// Fuses `flat` within the code generator's contract ([`sinter_ir::contract`]): the contract-aware
/// partition cut at the load-time frontier `hoist` ([`crate::hoist::plan`]),
/// [`partition::legalise`], then every built kernel is checked; a kernel outside the contract
/// is split ([`partition::dissolve`]) and the graph rebuilt.
///
/// # Errors
/// Kernels still outside the contract after `CONTRACT_ROUNDS` (8) rounds (a bug), and
/// [`build_kernel_graph`]'s errors.
pub fn build_within_contract(flat: &Flat, cost: &crate::CostConfig, target: &Target, hoist: &Hoist) -> Result<(KernelGraph, Vec<KernelMeta>), PassError> {
    let f = &flat.func;
    let uses = Uses::with(f, true);
    let mut part = partition::fuse_with(f, cost, true, hoist);
    partition::legalise(f, &uses, &mut part, target);
    for round in 0.. {
        let (kg, metas) = build_kernel_graph(flat, &part)?;
        let mut refused = vec![];
        for ((k, kd), meta) in kg.kernels.iter().zip(&metas) {
            if let Err(e) = sinter_ir::contract::check(kd, target) {
                refused.push((k, kd.family, meta.group, e));
            }
        }
        if refused.is_empty() {
            return Ok((kg, metas));
        }
        let splittable: Vec<usize> = refused.iter().filter_map(|r| r.2).filter(|&g| part.groups[g].nodes.len() + part.groups[g].roots.len() > 1).collect();
        // Graph outputs written through a view at the end of another kernel's body: each gets
        // a kernel of its own (the view may be what the refused kernel cannot write).
        let hosted: Vec<Value> = f.outputs.iter().copied().filter(|o| uses.producer.get(o).is_some_and(|n| !part.group_of.contains_key(n)) && !part.own_kernel.contains(o)).collect();
        if round + 1 >= CONTRACT_ROUNDS || (splittable.is_empty() && hosted.is_empty()) {
            let list: Vec<String> = refused.iter().map(|(k, fam, _, e)| format!("{k} ({fam:?}): {e}")).collect();
            return Err(PassError::Lower(format!("kernels outside the code generator's contract: {}", list.join("; "))));
        }
        part.own_kernel.extend(hosted);
        for g in splittable {
            partition::dissolve(f, &uses, &mut part, g);
        }
        partition::legalise(f, &uses, &mut part, target);
    }
    unreachable!("the loop returns")
}

/// Compiles a graph to a [`KernelGraph`] for `target`: writes the attentions the target's
/// generators refuse as their decomposition ([`crate::decompose`]), optimises every function once
/// (saturation in phases, DAG-aware extraction), inlines the optimised bodies at their calls,
/// merges duplicates, fuses kernels, and reports what happened. The cost model takes the
/// target's figures (`opts.cost.target` is replaced by `target`), and under
/// [`PassOptions::codegen_contract`] every kernel is one the target's generators take.
///
/// # Errors
/// [`PassError`]: a graph that does not verify, an unsound rule (by the analysis), an
/// extraction or lowering failure.
pub fn compile(g: &Graph, target: &Target, opts: &PassOptions) -> Result<(KernelGraph, FusionReport), PassError> {
    let opts = &PassOptions { cost: crate::CostConfig { target: *target, ..opts.cost.clone() }, ..opts.clone() };
    sinter_ir::verify(g)?;
    let g = &crate::expand::expand(g)?;
    let start = Instant::now();
    let decomposed = crate::decompose::refused_attention(g, target)?;
    let input = decomposed.as_ref().unwrap_or(g);
    let mut opt_graph = Graph::new();
    let mut functions = vec![];
    let sigs: BTreeMap<String, Signature> = input.funcs.values().map(|f| (f.name.clone(), f.signature())).collect();
    let masks = crate::hoist::weight_masks(input, opts.weights.as_ref());
    let (specialised, mut done) = crate::specialise::specialise(input, &sigs, opts, &masks)?;
    let input = &specialised;
    let masks = crate::hoist::weight_masks(input, opts.weights.as_ref());
    let sigs: BTreeMap<String, Signature> = input.funcs.values().map(|f| (f.name.clone(), f.signature())).collect();
    for f in input.funcs.values() {
        let o = match done.remove(&f.name) {
            Some(o) if o.function.signature() == f.signature() => o,
            _ => optimise_function_with_weights(f, &sigs, opts, masks.get(&f.name).map(Vec::as_slice))?,
        };
        functions.push(FunctionReport::from_optimised(&f.name, &o));
        opt_graph.add_func(o.function);
    }
    sinter_ir::verify(&opt_graph).map_err(|e| PassError::Lower(format!("internal: the optimised graph does not verify: {e}")))?;
    let flat = reductions_to_last_axis(&cse_dce(&inline(&opt_graph)?))?;
    let weights = crate::hoist::weight_params(&flat.func, opts.weights.as_ref());
    let hoist = crate::hoist::plan(&flat.func, &Uses::with(&flat.func, opts.codegen_contract), &opts.cost, weights);
    let (kg, mut metas) = if opts.fuse && opts.codegen_contract {
        build_within_contract(&flat, &opts.cost, target, &hoist)?
    } else {
        let part = if opts.fuse { partition::fuse(&flat.func, &opts.cost, &hoist) } else { partition::one_per_node(&flat.func) };
        build_kernel_graph(&flat, &part)?
    };
    // Load-time kernels: those reading only weights and other load-time kernels' results, as
    // the GPU backend folds them once the weights are bound.
    let weight_names: HashSet<&str> = hoist.weights.iter().filter_map(|&w| flat.func.values[w].name.as_deref()).collect();
    let fixed = |b: sinter_ir::Buffer| kg.buffers[b].name.as_deref().is_some_and(|n| weight_names.contains(n));
    for (m, lt) in metas.iter_mut().zip(kg.load_time_kernels(fixed)) {
        m.load_time = lt;
    }
    let seconds = start.elapsed().as_secs_f64();
    // The baseline: one kernel per node of the original graph.
    let base_flat = reductions_to_last_axis(&inline(g)?)?;
    let base_part = partition::one_per_node(&base_flat.func);
    let (base_kg, _) = build_kernel_graph(&base_flat, &base_part)?;
    let kernels: Vec<KernelReport> = kg.kernels.iter().zip(&metas).map(|((k, kd), m)| KernelReport::new(k, kd, &kg, m, &opts.cost)).collect();
    let report = FusionReport::new(opts, functions, base_flat.func.nodes.len(), &base_kg, kernels, &kg, seconds);
    Ok((kg, report))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sinter_ir::DType;

    #[test]
    fn bad_graphs_are_errors_not_panics() {
        // A node whose declared type is wrong.
        let mut f = Function::new("main");
        let x = f.add_param(Some("x".into()), TensorType::new(DType::F32, [Dim::constant(4)]));
        let (_, r) = f.push_node(Op::plain(OpKind::Exp).unwrap(), vec![x], vec![TensorType::new(DType::F32, [Dim::constant(5)])]);
        f.outputs = r;
        let mut g = Graph::new();
        g.add_func(f);
        assert!(matches!(compile(&g, &Target::SM_90A, &PassOptions::default()), Err(PassError::Verify(_))));
        assert!(matches!(lower_unfused(&g), Err(PassError::Verify(_))));
        // No function at all.
        assert!(compile(&Graph::new(), &Target::SM_90A, &PassOptions::default()).is_err());
    }

    #[test]
    fn unfused_lowering_is_one_kernel_per_node_with_reductions_over_the_last_axis() {
        let g = sinter_ir::parse(
            "func @main(%x: f32[T, 8]) {
  %s: f32[1, 8] = reduce_sum(%x) {axis=0}
  %r: f32[8] = reshape(%s) {shape=[8]}
  %p: f32[T, 8] = softmax(%x) {axis=0}
  return %r, %p
}",
        )
        .unwrap();
        let kg = lower_unfused(&g).unwrap();
        let fams: Vec<Family> = kg.kernels.values().map(|k| k.family).collect();
        // permute, reduce over the last axis, permute back, reshape (a copy), and the same
        // three for the softmax.
        assert_eq!(
            fams,
            [Family::Layout, Family::RowReduction, Family::Layout, Family::Layout, Family::Layout, Family::RowReduction, Family::Layout]
        );
        for k in kg.kernels.values() {
            for n in k.body.nodes.values() {
                if let Some(a) = n.op.int("axis") {
                    assert_eq!(neg_axis(a, k.body.ty(n.inputs[0]).rank()), -1);
                }
            }
        }
        assert_eq!(kg.buffers[kg.inputs[0]].role, BufferRole::Input);
        assert!(kg.outputs.iter().all(|&b| kg.buffers[b].role == BufferRole::Output));
    }
}
