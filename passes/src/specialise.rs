//! Arguments of known construction moved into their callees, where the rules can see them.
//!
//! A model written as Hugging Face writes it builds its attention mask (and its rotary cos/sin)
//! once and passes it into every layer as a tensor. Inside the layer that tensor is a
//! parameter, so the rules that fold a mask into `attention`'s attributes or recognise RoPE
//! from its tables have nothing to read. This pass specialises a callee on such arguments: an
//! argument computed in the caller by a small subgraph of element-wise, comparison, layout
//! and source ops (`iota`, `constant`) that builds a mask or rotary tables (it holds an
//! `iota`, a comparison, `sin` or `cos`), whose leaves are constants or the caller's
//! parameters (`positions`), is rebuilt at the start of a copy of the callee, which takes
//! those leaves instead. Call sites that pass the same argument values share one copy, so a decoder whose
//! layers get one of two masks (sliding and full) has two copies, each optimised once.
//!
//! **Chosen by the cost model.** A copy is kept only when its optimised modelled cost is at
//! most the original callee's (the mask folded away is cheaper; a mask the rules cannot fold,
//! rebuilt in every layer, is dearer, and the call keeps its argument). All arguments of a
//! call site are tried together, then each alone; the first copy that pays is taken.
//!
//! A copy is named `<callee>__spec<k>`; [`base_name`] gives the callee's name back, which the
//! lowering uses for the kernels' origins (`layer#3` whichever copy layer 3 calls).

use std::collections::{BTreeMap, BTreeSet, HashMap};

use sinter_ir::{Attr, Dim, Function, Graph, Node, Op, OpClass, OpKind, Signature, TensorType, Value, ValueDef};

use crate::optimise::{optimise_function_with_weights, OptimisedFunction};
use crate::{PassError, PassOptions};

/// Most nodes of one argument's subgraph moved into a callee.
const MAX_NODES: usize = 64;
/// Most caller parameters one argument's subgraph may read.
const MAX_LEAVES: usize = 4;
/// Most copies of one callee.
const MAX_COPIES: usize = 4;
const SUFFIX: &str = "__spec";

/// The name of the function a copy was specialised from (`layer__spec1` → `layer`); other
/// names unchanged.
pub fn base_name(name: &str) -> &str {
    match name.rfind(SUFFIX) {
        Some(i) if name[i + SUFFIX.len()..].chars().all(|c| c.is_ascii_digit()) && i + SUFFIX.len() < name.len() => &name[..i],
        _ => name,
    }
}

/// The nodes (in order) computing caller value `v` and the caller parameters they read, when
/// `v` qualifies: only element-wise/compare/layout/source ops, among them an `iota`, a
/// comparison, `sin` or `cos` (a mask or rotary tables), within the limits.
fn argument_subgraph(f: &Function, v: Value) -> Option<(Vec<Node>, Vec<Value>)> {
    let mut nodes = BTreeSet::new();
    let mut leaves = BTreeSet::new();
    let mut stack = vec![v];
    while let Some(x) = stack.pop() {
        match f.values[x].def {
            ValueDef::Param(_) => {
                leaves.insert(x);
            }
            ValueDef::Result(n, _) => {
                if !nodes.insert(n) {
                    continue;
                }
                let nd = &f.nodes[n];
                let ok = nd.results.len() == 1
                    && matches!(nd.op.kind.info().class, OpClass::Unary | OpClass::Binary | OpClass::Compare | OpClass::Layout | OpClass::Source)
                    && !matches!(nd.op.kind, OpKind::Dequantize | OpKind::QuantizeFp8 | OpKind::DequantizeFp8);
                if !ok || nodes.len() > MAX_NODES {
                    return None;
                }
                stack.extend(nd.inputs.iter().copied());
            }
        }
    }
    // Of a known construction: a mask (iota, comparisons) or rotary tables (sin, cos).
    let known = nodes.iter().any(|&n| matches!(f.nodes[n].op.kind.info().class, OpClass::Compare) || matches!(f.nodes[n].op.kind, OpKind::Iota | OpKind::Sin | OpKind::Cos));
    if !known || leaves.len() > MAX_LEAVES {
        return None;
    }
    Some((nodes.into_iter().collect(), leaves.into_iter().collect()))
}

/// Caller symbols → callee dims, read off every argument of a call; `None` on a clash.
fn symbol_map(caller: &Function, callee: &Function, args: &[Value]) -> Option<BTreeMap<String, Dim>> {
    let mut map: BTreeMap<String, Dim> = BTreeMap::new();
    for (&p, &a) in callee.params.iter().zip(args) {
        for (pd, ad) in callee.ty(p).shape.iter().zip(&caller.ty(a).shape) {
            if let Some(s) = ad.as_symbol() {
                if map.insert(s.to_string(), pd.clone()).is_some_and(|old| &old != pd) {
                    return None;
                }
            }
        }
    }
    Some(map)
}

fn subst_ty(t: &TensorType, map: &BTreeMap<String, Dim>) -> Option<TensorType> {
    let shape: Vec<Dim> = t.shape.iter().map(|d| d.substitute(map)).collect();
    // Every symbol must be one the callee knows through its parameters.
    let known: BTreeSet<String> = map.values().flat_map(|d| d.symbols()).map(|s| s.to_string()).collect();
    let free = t.shape.iter().flat_map(|d| d.symbols()).any(|s| !map.contains_key(&s.to_string()));
    (!free && shape.iter().flat_map(|d| d.symbols()).all(|s| known.contains(&s.to_string()))).then(|| TensorType { dtype: t.dtype, shape })
}

fn subst_op(op: &Op, map: &BTreeMap<String, Dim>) -> Option<Op> {
    let mut attrs = Vec::with_capacity(op.attrs.len());
    for a in &op.attrs {
        attrs.push(match a {
            Attr::Dims(v) => Attr::Dims(v.iter().map(|d| subst_dim(d, map)).collect::<Option<_>>()?),
            Attr::Dim(d) => Attr::Dim(subst_dim(d, map)?),
            other => other.clone(),
        });
    }
    Some(Op { kind: op.kind, attrs })
}

fn subst_dim(d: &Dim, map: &BTreeMap<String, Dim>) -> Option<Dim> {
    d.symbols().iter().all(|s| map.contains_key(&s.to_string())).then(|| d.substitute(map))
}

/// A copy of `callee` with the parameters at `sunk` computed inside from the caller's
/// subgraphs; its parameters are the callee's others, then `leaves`.
fn build_copy(caller: &Function, callee: &Function, name: &str, args: &[Value], sunk: &[usize], leaves: &[Value], sub: &[Node]) -> Option<Function> {
    let map = symbol_map(caller, callee, args)?;
    let mut out = Function::new(name);
    let mut env: HashMap<Value, Value> = HashMap::new();
    for (i, &p) in callee.params.iter().enumerate() {
        if !sunk.contains(&i) {
            env.insert(p, out.add_param(callee.values[p].name.clone(), callee.ty(p).clone()));
        }
    }
    let mut cenv: HashMap<Value, Value> = HashMap::new();
    for &l in leaves {
        let ty = subst_ty(caller.ty(l), &map)?;
        cenv.insert(l, out.add_param(caller.values[l].name.clone(), ty));
    }
    for &n in sub {
        let nd = &caller.nodes[n];
        let ins: Vec<Value> = nd.inputs.iter().map(|v| cenv.get(v).copied()).collect::<Option<_>>()?;
        let tys: Vec<TensorType> = nd.results.iter().map(|&r| subst_ty(caller.ty(r), &map)).collect::<Option<_>>()?;
        let (_, rs) = out.push_node(subst_op(&nd.op, &map)?, ins, tys);
        for (&r, v) in nd.results.iter().zip(rs) {
            out.values[v].name = caller.values[r].name.clone();
            cenv.insert(r, v);
        }
    }
    for &i in sunk {
        let v = *cenv.get(&args[i])?;
        if out.ty(v) != callee.ty(callee.params[i]) {
            return None;
        }
        env.insert(callee.params[i], v);
    }
    for nd in callee.nodes.values() {
        let ins: Vec<Value> = nd.inputs.iter().map(|v| env.get(v).copied()).collect::<Option<_>>()?;
        let (_, rs) = out.push_node(nd.op.clone(), ins, nd.results.iter().map(|&r| callee.ty(r).clone()).collect());
        for (&r, v) in nd.results.iter().zip(rs) {
            out.values[v].name = callee.values[r].name.clone();
            env.insert(r, v);
        }
    }
    out.outputs = callee.outputs.iter().map(|o| env.get(o).copied()).collect::<Option<_>>()?;
    Some(out)
}

/// The weight flags of a copy [`build_copy`] makes: its parameters are the callee's not sunk
/// (flagged as the callee's are), then the leaves (weights when load-time values of the caller).
fn copy_mask(caller: &Function, callee: &Function, masks: &BTreeMap<String, Vec<bool>>, sunk: &[usize], leaves: &[Value]) -> Vec<bool> {
    let callee_mask = masks.get(&callee.name);
    let caller_w = crate::hoist::masked_weights(caller, masks.get(&caller.name).map(Vec::as_slice));
    let lt = crate::hoist::load_time_values(caller, &caller_w);
    let kept = (0..callee.params.len()).filter(|i| !sunk.contains(i)).map(|i| callee_mask.and_then(|m| m.get(i).copied()).unwrap_or(false));
    kept.chain(leaves.iter().map(|l| lt.contains(l) && crate::hoist::is_static(caller.ty(*l)))).collect()
}

/// The call sites in one caller that pass the same qualifying arguments (by position) to
/// one callee; `args` are the first call's arguments.
struct Group {
    caller: String,
    callee: String,
    key: Vec<usize>,
    args: Vec<Value>,
    calls: Vec<Node>,
}

/// `g` with callees specialised on their arguments of known construction where the cost
/// model prefers it, and the optimised functions computed on the way (by name), for reuse.
///
/// # Errors
/// As [`optimise_function`].
pub fn specialise(g: &Graph, sigs: &BTreeMap<String, Signature>, opts: &PassOptions, masks: &BTreeMap<String, Vec<bool>>) -> Result<(Graph, HashMap<String, OptimisedFunction>), PassError> {
    let mut cache: HashMap<String, OptimisedFunction> = HashMap::new();
    let mut groups: Vec<Group> = vec![];
    for f in g.funcs.values() {
        for (n, nd) in f.nodes.iter() {
            if nd.op.kind != OpKind::Call {
                continue;
            }
            let callee = nd.op.str("func").unwrap_or("").to_string();
            let key: Vec<usize> = nd.inputs.iter().enumerate().filter(|(_, &a)| argument_subgraph(f, a).is_some()).map(|(i, _)| i).collect();
            if key.is_empty() {
                continue;
            }
            let same = |gr: &Group| gr.caller == f.name && gr.callee == callee && gr.key == key && key.iter().all(|&i| gr.args[i] == nd.inputs[i]);
            match groups.iter_mut().find(|gr| same(gr)) {
                Some(gr) => gr.calls.push(n),
                None => groups.push(Group { caller: f.name.clone(), callee, key, args: nd.inputs.clone(), calls: vec![n] }),
            }
        }
    }
    // A callee called with many different such arguments is left alone (a copy each would
    // multiply the compile time).
    let mut per_callee: HashMap<&str, usize> = HashMap::new();
    for gr in &groups {
        *per_callee.entry(gr.callee.as_str()).or_insert(0) += 1;
    }
    let many: BTreeSet<String> = per_callee.into_iter().filter(|&(_, n)| n > MAX_COPIES).map(|(c, _)| c.to_string()).collect();
    groups.retain(|gr| !many.contains(&gr.callee));
    // Accepted copies: (group index, copy function, sunk positions, leaves).
    let mut accepted: Vec<(usize, Function, Vec<usize>, Vec<Value>)> = vec![];
    let mut counter: HashMap<String, usize> = HashMap::new();
    for (gi, gr) in groups.iter().enumerate() {
        let (Some(caller), Some(callee)) = (g.func(&gr.caller), g.func(&gr.callee)) else { continue };
        let cands: Vec<(usize, Vec<Node>, Vec<Value>)> =
            gr.args.iter().enumerate().filter_map(|(i, &a)| argument_subgraph(caller, a).map(|(ns, ls)| (i, ns, ls))).collect();
        if cands.is_empty() {
            continue;
        }
        let mut tries: Vec<Vec<usize>> = vec![(0..cands.len()).collect()];
        if cands.len() > 1 {
            tries.extend((0..cands.len()).map(|c| vec![c]));
        }
        let base_cost = match cache.get(&callee.name) {
            Some(o) => o.cost_after,
            None => {
                let o = optimise_function_with_weights(callee, sigs, opts, masks.get(&callee.name).map(Vec::as_slice))?;
                let c = o.cost_after;
                cache.insert(callee.name.clone(), o);
                c
            }
        };
        let k = counter.entry(callee.name.clone()).or_insert(0);
        let name = format!("{}{SUFFIX}{k}", callee.name);
        // All arguments together first, then each alone; the first that pays is taken.
        let mut best: Option<(Function, Vec<usize>, Vec<Value>, OptimisedFunction)> = None;
        for t in tries {
            let sunk: Vec<usize> = t.iter().map(|&c| cands[c].0).collect();
            let sub: BTreeSet<Node> = t.iter().flat_map(|&c| cands[c].1.iter().copied()).collect();
            let sub: Vec<Node> = sub.into_iter().collect();
            let leaves: BTreeSet<Value> = t.iter().flat_map(|&c| cands[c].2.iter().copied()).collect();
            let leaves: Vec<Value> = leaves.into_iter().collect();
            let Some(copy) = build_copy(caller, callee, &name, &gr.args, &sunk, &leaves, &sub) else { continue };
            let mut sigs2 = sigs.clone();
            sigs2.insert(name.clone(), copy.signature());
            let mask = copy_mask(caller, callee, masks, &sunk, &leaves);
            let Ok(o) = optimise_function_with_weights(&copy, &sigs2, opts, Some(&mask)) else { continue };
            if o.cost_after <= base_cost {
                best = Some((copy, sunk, leaves, o));
                break;
            }
        }
        if let Some((copy, sunk, leaves, o)) = best {
            *k += 1;
            cache.insert(name, o);
            accepted.push((gi, copy, sunk, leaves));
        }
    }
    if accepted.is_empty() {
        return Ok((g.clone(), cache));
    }
    // Rebuild: each copy right after its callee (callees come before callers), call sites
    // rewritten to the copy with the sunk arguments replaced by the leaves.
    let mut out = Graph::new();
    for f in g.funcs.values() {
        let mut nf = f.clone();
        for (gi, copy, sunk, leaves) in &accepted {
            let gr = &groups[*gi];
            if gr.caller != f.name {
                continue;
            }
            for &n in &gr.calls {
                let mut ins: Vec<Value> = f.nodes[n].inputs.iter().enumerate().filter(|(i, _)| !sunk.contains(i)).map(|(_, &a)| a).collect();
                ins.extend(leaves.iter().copied());
                let op = Op::new(OpKind::Call, vec![("func".into(), Attr::Str(copy.name.clone()))]).map_err(|e| PassError::Lower(format!("internal: {e}")))?;
                nf.nodes[n].op = op;
                nf.nodes[n].inputs = ins;
            }
        }
        out.add_func(nf);
        for (_, copy, _, _) in accepted.iter().filter(|(gi, ..)| groups[*gi].callee == f.name) {
            out.add_func(copy.clone());
        }
    }
    // A specialised callee no call reaches any more is dropped.
    let called: BTreeSet<String> = out.funcs.values().flat_map(|f| f.nodes.values().filter(|nd| nd.op.kind == OpKind::Call).filter_map(|nd| nd.op.str("func").map(str::to_string))).collect();
    let replaced: BTreeSet<&str> = accepted.iter().map(|(gi, ..)| groups[*gi].callee.as_str()).collect();
    let mut pruned = Graph::new();
    for f in out.funcs.values() {
        if called.contains(&f.name) || !replaced.contains(f.name.as_str()) {
            pruned.add_func(f.clone());
        }
    }
    sinter_ir::verify(&pruned).map_err(|e| PassError::Lower(format!("internal: the specialised graph does not verify: {e}")))?;
    Ok((pruned, cache))
}
