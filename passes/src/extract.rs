//! DAG-aware extraction: choosing one e-node per e-class so that the chosen graph is cheapest
//! under the cost model when every chosen class is paid **once**, however many uses it has.
//!
//! egg's `Extractor` minimises *tree* cost: a class used twice is paid twice. That picks the
//! wrong plan exactly where sharing matters — the projections of one input merged into one
//! matmul are paid once per projection and lose to the separate matmuls (EGRAPH-NOTES.md,
//! extraction-gym#19). egg's `LpExtractor` needs the system CBC library; it is not used.
//!
//! The extractor here is a greedy DAG heuristic with a specific fix for multi-use sharing
//! (an exact ILP was left out: no pure-Rust solver is vendored):
//!
//! 1. **Tree pass.** The classic bottom-up fixpoint: each class takes the e-node of least
//!    `own cost + Σ children's costs`. Every e-node costs at least [`EPSILON_US`], so a
//!    choice that reaches its own class is never cheapest, and the result is acyclic.
//! 2. **Sharing pass.** For every class `S` that e-nodes of two or more other classes use, a
//!    move switches *all* those classes at once to their cheapest e-node that uses `S` (the
//!    rest of the choice unchanged). The move is kept if the exact DAG cost of the whole
//!    choice — the sum of own costs over the classes reachable from the root, each once —
//!    drops and the choice stays acyclic ([`dag_cost`] refuses cycles). Passes repeat until
//!    nothing improves (at most [`MAX_ROUNDS`]).
//!
//! Step 2 is what makes a merged QKV projection win: one class `S = x·concat(Wq, Wk, Wv)`
//! used by the three projection classes through slices; switching the three together pays
//! the merged matmul once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use egg::{Id, Language};
use sinter_ir::{Function, OpKind, TensorType, Value};

use crate::cost::{node_cost, CostConfig, OperandFacts, EPSILON_US};
use crate::hoist::is_static;
use crate::lang::{Sir, SirEGraph};

/// Rounds of the sharing pass.
pub const MAX_ROUNDS: usize = 4;

/// A choice: the e-node taken in each (canonical) class.
pub type Choice = HashMap<Id, Sir>;

/// Own costs of every e-node, µs, computed once.
pub struct NodeCosts {
    costs: HashMap<(Id, usize), f64>,
}

impl NodeCosts {
    /// Costs every e-node of `eg` under `cfg`.
    pub fn new(eg: &SirEGraph, cfg: &CostConfig) -> NodeCosts {
        let mut costs = HashMap::new();
        let load_time = load_time_classes(eg);
        for class in eg.classes() {
            for (i, n) in class.nodes.iter().enumerate() {
                costs.insert((class.id, i), own_cost(eg, cfg, n, &class.data.tys, &load_time));
            }
        }
        NodeCosts { costs }
    }

    fn get(&self, class: Id, i: usize) -> f64 {
        self.costs.get(&(class, i)).copied().unwrap_or(f64::INFINITY)
    }

    /// The own cost of e-node `n` of class `class`.
    pub fn of(&self, eg: &SirEGraph, class: Id, n: &Sir) -> f64 {
        let class = eg.find(class);
        eg[class].nodes.iter().position(|m| m == n).map(|i| self.get(class, i)).unwrap_or(f64::INFINITY)
    }
}

/// The classes of `eg` that are load-time values ([`crate::hoist`]): of constant types, and
/// holding a weight parameter (flagged by [`SirAnalysis::weights`](crate::lang::SirAnalysis),
/// else as [`crate::hoist::infer_weights`] guesses them from the function's own parameter
/// types) or an e-node all of whose children are load-time (a
/// `constant`, an `iota`). A least fixpoint, so a cyclic class is load-time only through an
/// acyclic e-node.
pub fn load_time_classes(eg: &SirEGraph) -> HashSet<Id> {
    let params = &eg.analysis.params;
    let any_symbolic = params.iter().any(|t| !is_static(t));
    let weight = |i: u32| match &eg.analysis.weights {
        Some(m) => m.get(i as usize).copied().unwrap_or(false),
        None => any_symbolic && params.get(i as usize).is_some_and(|t| is_static(t) && (t.dtype.is_float() || t.dtype.is_quantized() || t.dtype.is_fp8())),
    };
    let mut lt: HashSet<Id> = HashSet::new();
    loop {
        let mut changed = false;
        for class in eg.classes() {
            if lt.contains(&class.id) || class.data.tys.is_empty() || !class.data.tys.iter().all(is_static) {
                continue;
            }
            let ok = class.nodes.iter().any(|n| match n {
                Sir::Param(i) => weight(*i),
                Sir::Proj(_, [c]) => lt.contains(&eg.find(*c)),
                Sir::Tuple(_) => false,
                Sir::Op(sym, ch) => !matches!(sym.kind(), OpKind::KvAppend | OpKind::Call) && ch.iter().all(|c| lt.contains(&eg.find(*c))),
            });
            if ok {
                lt.insert(class.id);
                changed = true;
            }
        }
        if !changed {
            return lt;
        }
    }
}

fn own_cost(eg: &SirEGraph, cfg: &CostConfig, n: &Sir, outs: &[TensorType], load_time: &HashSet<Id>) -> f64 {
    match n {
        Sir::Param(_) | Sir::Proj(..) | Sir::Tuple(_) => EPSILON_US,
        Sir::Op(sym, ch) => {
            let ins: Option<Vec<&TensorType>> = ch.iter().map(|c| eg[*c].data.ty()).collect();
            let Some(ins) = ins else { return f64::INFINITY };
            let has = |c: Id, k: OpKind| eg[c].nodes.iter().any(|m| m.kind() == Some(k));
            let facts = OperandFacts {
                all_params: !ch.is_empty() && ch.iter().all(|&c| eg[c].nodes.iter().any(|m| matches!(m, Sir::Param(_)))),
                first_is_matmul: ch.first().is_some_and(|&c| has(c, OpKind::Matmul)),
                load_time: !ch.is_empty() && ch.iter().all(|c| load_time.contains(&eg.find(*c))),
            };
            node_cost(cfg, sym.op(), &ins, outs, facts)
        }
    }
}

/// The tree-cost choice (step 1): each class's cheapest e-node by own + children's tree cost,
/// with that cost.
pub fn tree_choice(eg: &SirEGraph, costs: &NodeCosts) -> HashMap<Id, (f64, Sir)> {
    let mut classes: Vec<Id> = eg.classes().map(|c| c.id).collect();
    classes.sort();
    let mut best: HashMap<Id, (f64, Sir)> = HashMap::new();
    loop {
        let mut changed = false;
        for &c in &classes {
            for (i, n) in eg[c].nodes.iter().enumerate() {
                let mut sum = costs.get(c, i);
                let mut ok = true;
                for ch in n.children() {
                    match best.get(&eg.find(*ch)) {
                        Some((v, _)) => sum += v,
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok {
                    continue;
                }
                let better = best.get(&c).is_none_or(|(v, _)| sum < *v * (1.0 - 1e-12) - 1e-12);
                if better {
                    best.insert(c, (sum, n.clone()));
                    changed = true;
                }
            }
        }
        if !changed {
            break;
        }
    }
    best
}

/// The DAG cost of a choice: the own costs of the classes reachable from `root`, each once.
/// `None` when the choice reaches a class without a choice, or a cycle.
pub fn dag_cost(eg: &SirEGraph, root: Id, choice: &Choice, costs: &NodeCosts) -> Option<f64> {
    let mut state: HashMap<Id, u8> = HashMap::new(); // 1 = on the path, 2 = done
    let mut total = 0.0;
    let root = eg.find(root);
    let mut stack: Vec<(Id, usize)> = vec![(root, 0)];
    state.insert(root, 1);
    while let Some(&(c, next)) = stack.last() {
        let node = choice.get(&c)?;
        let children = node.children();
        if next < children.len() {
            let ch = eg.find(children[next]);
            if let Some(top) = stack.last_mut() {
                top.1 += 1;
            }
            match state.get(&ch) {
                Some(1) => return None,
                Some(_) => {}
                None => {
                    state.insert(ch, 1);
                    stack.push((ch, 0));
                }
            }
        } else {
            total += costs.of(eg, c, node);
            state.insert(c, 2);
            stack.pop();
        }
    }
    Some(total)
}

/// The result of extraction.
pub struct Extraction {
    /// The chosen e-node per class (only classes reachable from the root matter).
    pub choice: Choice,
    /// Its DAG cost, µs.
    pub dag_cost: f64,
    /// The DAG cost of the tree pass's choice, µs (what a tree extractor would pay).
    pub tree_dag_cost: f64,
    /// Moves of the sharing pass that were kept.
    pub sharing_moves: usize,
}

/// Extracts the cheapest acyclic choice from `root` (the tree pass, then the sharing pass).
///
/// # Errors
/// When the root has no finite choice (which a loaded function always has).
pub fn extract(eg: &SirEGraph, root: Id, cfg: &CostConfig) -> Result<Extraction, String> {
    let costs = NodeCosts::new(eg, cfg);
    let tree = tree_choice(eg, &costs);
    let mut choice: Choice = tree.iter().map(|(k, (_, n))| (*k, n.clone())).collect();
    let tree_cost = dag_cost(eg, root, &choice, &costs).ok_or_else(|| "the tree pass found no acyclic choice for the root".to_string())?;
    let mut best = tree_cost;

    // Parents (distinct classes) of every class.
    let mut parents: BTreeMap<Id, BTreeSet<Id>> = BTreeMap::new();
    for class in eg.classes() {
        for n in &class.nodes {
            for ch in n.children() {
                let ch = eg.find(*ch);
                if ch != class.id {
                    parents.entry(ch).or_default().insert(class.id);
                }
            }
        }
    }
    let shared: Vec<Id> = parents.iter().filter(|(_, p)| p.len() >= 2).map(|(c, _)| *c).collect();
    let mut moves = 0;
    for _ in 0..MAX_ROUNDS {
        let mut improved = false;
        for &s in &shared {
            if !choice.contains_key(&s) {
                continue;
            }
            let mut cand = choice.clone();
            let mut switched = 0;
            for &p in parents.get(&s).into_iter().flatten() {
                let mut pick: Option<(f64, Sir)> = None;
                for (i, n) in eg[p].nodes.iter().enumerate() {
                    if !n.children().iter().any(|c| eg.find(*c) == s) {
                        continue;
                    }
                    let mut sum = costs.get(p, i);
                    let mut ok = true;
                    for ch in n.children() {
                        match tree.get(&eg.find(*ch)) {
                            Some((v, _)) => sum += v,
                            None => ok = false,
                        }
                    }
                    if ok && pick.as_ref().is_none_or(|(v, _)| sum < *v) {
                        pick = Some((sum, n.clone()));
                    }
                }
                if let Some((_, n)) = pick {
                    if cand.get(&p) != Some(&n) {
                        cand.insert(p, n);
                        switched += 1;
                    }
                }
            }
            if switched == 0 {
                continue;
            }
            if let Some(c) = dag_cost(eg, root, &cand, &costs) {
                if c < best - 1e-9 {
                    best = c;
                    choice = cand;
                    moves += 1;
                    improved = true;
                }
            }
        }
        if !improved {
            break;
        }
    }
    Ok(Extraction { choice, dag_cost: best, tree_dag_cost: tree_cost, sharing_moves: moves })
}

/// Builds the function a choice denotes: `template`'s name and parameters, the chosen e-nodes
/// reachable from `root` in a topological order, `root`'s tuple as the outputs. A class that
/// holds a value `names` names keeps that name.
///
/// # Errors
/// A cyclic or incomplete choice.
pub fn to_function(eg: &SirEGraph, root: Id, choice: &Choice, template: &Function, names: &HashMap<Id, String>) -> Result<Function, String> {
    let mut f = Function::new(template.name.clone());
    let params: Vec<Value> = template.params.iter().map(|&p| f.add_param(template.values[p].name.clone(), template.ty(p).clone())).collect();
    let mut used: BTreeSet<String> = template.params.iter().filter_map(|&p| template.values[p].name.clone()).collect();
    let mut memo: HashMap<Id, Vec<Value>> = HashMap::new();
    let mut on_path: BTreeSet<Id> = BTreeSet::new();
    let root = eg.find(root);
    let mut stack: Vec<(Id, bool)> = vec![(root, false)];
    let mut outputs = None;
    while let Some((c, expanded)) = stack.pop() {
        if memo.contains_key(&c) {
            continue;
        }
        let node = choice.get(&c).ok_or_else(|| format!("e-class {c} has no choice"))?;
        if !expanded {
            if !on_path.insert(c) {
                return Err(format!("the choice is cyclic at e-class {c}"));
            }
            stack.push((c, true));
            for ch in node.children().iter().rev() {
                let ch = eg.find(*ch);
                if !memo.contains_key(&ch) {
                    if on_path.contains(&ch) {
                        return Err(format!("the choice is cyclic at e-class {ch}"));
                    }
                    stack.push((ch, false));
                }
            }
            continue;
        }
        on_path.remove(&c);
        let arg = |ch: &Id, memo: &HashMap<Id, Vec<Value>>| -> Result<Vec<Value>, String> {
            memo.get(&eg.find(*ch)).cloned().ok_or_else(|| format!("e-class {ch} was not emitted before its use"))
        };
        let vals = match node {
            Sir::Param(i) => vec![*params.get(*i as usize).ok_or_else(|| format!("parameter {i} out of range"))?],
            Sir::Proj(i, [x]) => {
                let v = arg(x, &memo)?;
                vec![*v.get(*i as usize).ok_or_else(|| format!("projection {i} out of range"))?]
            }
            Sir::Tuple(ch) => {
                let mut outs = vec![];
                for x in ch {
                    outs.push(*arg(x, &memo)?.first().ok_or("an output has no value")?);
                }
                outputs = Some(outs);
                vec![]
            }
            Sir::Op(sym, ch) => {
                let mut inputs = vec![];
                for x in ch {
                    inputs.push(*arg(x, &memo)?.first().ok_or("an operand has no value")?);
                }
                let (_, results) = f.push_node(sym.op().clone(), inputs, eg[c].data.tys.clone());
                if let ([r], Some(name)) = (results.as_slice(), names.get(&c)) {
                    if used.insert(name.clone()) {
                        f.values[*r].name = Some(name.clone());
                    }
                }
                results
            }
        };
        memo.insert(c, vals);
    }
    f.outputs = outputs.ok_or("the root is not a tuple")?;
    Ok(f)
}
