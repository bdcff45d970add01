//! Kernel partitioning: which nodes of the (flat, optimised) function run in one kernel.
//!
//! Each node has a [`Role`]: a *view* (`reshape`, or a `slice` that is an offset range of a
//! contiguous buffer), a *source* (`constant`, `iota`), *pointwise* (element-wise ops, casts,
//! `select`, `rope`, `swiglu`, `gelu`) or an *anchor* of a kernel family (matmul, row
//! reduction, attention, paged attention, `kv_append`, gather, layout). Views and sources get
//! no kernel of their own: every kernel that reads them recomputes them in its body (a view
//! is an index remapping of its input buffer, a source a formula of the index), so the
//! body of any kernel may start with view and source ops on its parameters.
//!
//! Fusion, greedily in node order (fusion rules of DESIGN.md's "fusion" family that decide
//! kernel boundaries, so they live here rather than in the e-graph):
//!
//! - **pointwise chains → one Pointwise kernel**: a pointwise node joins the kernel of an
//!   operand's producer when that kernel is Pointwise;
//! - **matmul epilogue**: a pointwise node joins its operand's Matmul kernel when its result
//!   is no larger than the matmul's output (bias, residual add, cast, SwiGLU over the
//!   gate/up halves, RoPE on Q/K); a `slice` of the matmul's output columns joins too (the
//!   kernel writes each slice to its own buffer, as after a QKV merge);
//! - **row-reduction epilogue**: a pointwise node joins a RowReduction kernel when its result
//!   is no larger than the rows being reduced; a second reduction over the same rows joins as
//!   well (a decomposed softmax or LayerNorm stays one kernel);
//! - **row-reduction prologue**: a Pointwise kernel none of whose results is read by a third
//!   kernel becomes the prologue of the reduction that reads it (later readers may join as
//!   epilogue, as `x` does in `x·rsqrt(Σx²)`).
//!
//! A join is refused when it would make the kernel graph cyclic (some other operand of the
//! node depends on the kernel being joined). Anchored kernels are preferred over pointwise
//! ones when a node could join either.

use std::collections::{BTreeSet, HashMap, HashSet};

use sinter_ir::{Family, Function, Node, OpClass, OpKind, Value};

use crate::cost::{is_contiguous_slice, CostConfig};

/// What a node is to the partitioner.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// A view of its input (no kernel; recomputed by readers).
    View,
    /// A constant or iota (no kernel; recomputed by readers).
    Source,
    /// Element-wise work (fuses).
    Point,
    /// The anchor of a kernel of this family.
    Anchor(Family),
}

/// The role of node `n` of `f`.
pub fn role(f: &Function, n: Node) -> Role {
    let nd = &f.nodes[n];
    use OpKind::*;
    match nd.op.kind {
        Reshape => Role::View,
        Slice => match nd.inputs.first() {
            Some(&x) if is_contiguous_slice(&nd.op, f.ty(x)) => Role::View,
            _ => Role::Anchor(Family::Layout),
        },
        Constant | Iota => Role::Source,
        Rope | Swiglu => Role::Point,
        ReduceSum | ReduceMax | ReduceMin | ReduceMean | Softmax | LogSoftmax | RmsNorm | LayerNorm => Role::Anchor(Family::RowReduction),
        Matmul => Role::Anchor(Family::Matmul),
        Attention => Role::Anchor(Family::Attention),
        PagedAttention => Role::Anchor(Family::PagedAttention),
        KvAppend => Role::Anchor(Family::KvAppend),
        Gather => Role::Anchor(Family::Gather),
        Transpose | Permute | Broadcast | Concat | Call => Role::Anchor(Family::Layout),
        k => match k.info().class {
            OpClass::Unary | OpClass::Binary | OpClass::Compare => Role::Point,
            _ => Role::Anchor(Family::Layout),
        },
    }
}

/// The family of a kernel made of node `n` alone (one kernel per node).
pub fn family_alone(f: &Function, n: Node) -> Family {
    match role(f, n) {
        Role::View => Family::Layout,
        Role::Source | Role::Point => Family::Pointwise,
        Role::Anchor(fam) => fam,
    }
}

/// One kernel's nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct Group {
    /// Family.
    pub family: Family,
    /// Member nodes, in node order.
    pub nodes: Vec<Node>,
    /// Largest result an epilogue node may have, in elements at the cost config's sizes.
    limit: f64,
}

/// A partition of a function's nodes into kernels.
#[derive(Clone, Debug, Default)]
pub struct Partition {
    /// Kernels (some may be empty after merges; [`Partition::live`] skips them).
    pub groups: Vec<Group>,
    /// The kernel of each grouped node (views and sources are not grouped when fusing).
    pub group_of: HashMap<Node, usize>,
}

impl Partition {
    /// Indices of the non-empty kernels.
    pub fn live(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups.iter().enumerate().filter(|(_, g)| !g.nodes.is_empty()).map(|(i, _)| i)
    }
}

/// Each node its own kernel (views and sources included).
pub fn one_per_node(f: &Function) -> Partition {
    let mut p = Partition::default();
    for n in f.nodes.keys() {
        p.group_of.insert(n, p.groups.len());
        p.groups.push(Group { family: family_alone(f, n), nodes: vec![n], limit: 0.0 });
    }
    p
}

/// Facts about a function the partitioner uses.
pub struct Uses {
    /// The node defining each node result.
    pub producer: HashMap<Value, Node>,
    /// For every non-view/non-source node, the non-view/non-source nodes that read its
    /// results (directly or through views and sources).
    pub users: HashMap<Node, Vec<Node>>,
}

impl Uses {
    /// Computes the facts.
    pub fn new(f: &Function) -> Uses {
        let mut producer = HashMap::new();
        for (n, nd) in f.nodes.iter() {
            for &r in &nd.results {
                producer.insert(r, n);
            }
        }
        let mut u = Uses { producer, users: HashMap::new() };
        for (m, nd) in f.nodes.iter() {
            if matches!(role(f, m), Role::View | Role::Source) {
                continue;
            }
            for &v in &nd.inputs {
                for b in u.bases(f, v) {
                    if let Some(&p) = u.producer.get(&b) {
                        let e = u.users.entry(p).or_default();
                        if !e.contains(&m) {
                            e.push(m);
                        }
                    }
                }
            }
        }
        u
    }

    /// The values a value is computed from once views and sources are looked through: itself
    /// when it is a parameter or the result of a kernel node.
    pub fn bases(&self, f: &Function, v: Value) -> Vec<Value> {
        let mut out = vec![];
        let mut stack = vec![v];
        let mut seen = HashSet::new();
        while let Some(x) = stack.pop() {
            if !seen.insert(x) {
                continue;
            }
            match self.producer.get(&x) {
                Some(&n) if matches!(role(f, n), Role::View | Role::Source) => stack.extend(f.nodes[n].inputs.iter().copied()),
                _ => out.push(x),
            }
        }
        out
    }
}

/// Partitions `f` into fused kernels (see the module docs).
pub fn fuse(f: &Function, cfg: &CostConfig) -> Partition {
    let uses = Uses::new(f);
    let mut p = Partition::default();
    let numel = |v: Value| cfg.numel(f.ty(v));
    for (n, nd) in f.nodes.iter() {
        let r = role(f, n);
        let operand_groups = |p: &Partition| -> Vec<usize> {
            let mut gs = vec![];
            for &v in &nd.inputs {
                for b in uses.bases(f, v) {
                    if let Some(&g) = uses.producer.get(&b).and_then(|pn| p.group_of.get(pn)) {
                        if !gs.contains(&g) {
                            gs.push(g);
                        }
                    }
                }
            }
            gs
        };
        let out_n = nd.results.iter().map(|&r| numel(r)).fold(0.0, f64::max);
        match r {
            Role::View | Role::Source => continue,
            Role::Point => {
                let mut cands = operand_groups(&p);
                cands.sort_by_key(|&g| (match p.groups[g].family {
                    Family::Matmul => 0,
                    Family::RowReduction => 1,
                    _ => 2,
                }, usize::MAX - g));
                let joined = cands.into_iter().find(|&g| {
                    let grp = &p.groups[g];
                    let fits = match grp.family {
                        Family::Pointwise => true,
                        Family::Matmul | Family::RowReduction => out_n <= grp.limit,
                        _ => false,
                    };
                    fits && !creates_cycle(f, &uses, &p, g, n)
                });
                match joined {
                    Some(g) => {
                        join(&mut p, g, n);
                        // The other Pointwise kernels feeding n merge in too (one kernel for
                        // the whole element-wise DAG) where that closes no cycle.
                        if p.groups[g].family == Family::Pointwise {
                            for h in operand_groups(&p) {
                                if h != g && p.groups[h].family == Family::Pointwise && !reaches_around(&uses, &p, h, g) && !reaches_around(&uses, &p, g, h) {
                                    let moved = std::mem::take(&mut p.groups[h].nodes);
                                    for m in &moved {
                                        p.group_of.insert(*m, g);
                                    }
                                    p.groups[g].nodes.extend(moved);
                                }
                            }
                        }
                    }
                    None => {
                        new_group(&mut p, Family::Pointwise, n, 0.0);
                    }
                }
            }
            Role::Anchor(Family::Layout) if nd.op.kind == OpKind::Slice && nd.op.int("axis").is_some_and(|a| a == -1 || a + 1 == f.ty(nd.inputs[0]).rank() as i64) => {
                let cands = operand_groups(&p);
                match cands.into_iter().find(|&g| p.groups[g].family == Family::Matmul && !creates_cycle(f, &uses, &p, g, n)) {
                    Some(g) => join(&mut p, g, n),
                    None => {
                        new_group(&mut p, Family::Layout, n, 0.0);
                    }
                }
            }
            Role::Anchor(Family::RowReduction) => {
                let row = nd.inputs.first().map(|&x| numel(x)).unwrap_or(0.0);
                let cands = operand_groups(&p);
                let same_rows = cands
                    .iter()
                    .copied()
                    .find(|&g| p.groups[g].family == Family::RowReduction && p.groups[g].limit == row && !creates_cycle(f, &uses, &p, g, n));
                if let Some(g) = same_rows {
                    join(&mut p, g, n);
                    continue;
                }
                let g = new_group(&mut p, Family::RowReduction, n, row);
                // Prologue: a Pointwise kernel used only by this reduction.
                for pg in cands {
                    if p.groups[pg].family != Family::Pointwise {
                        continue;
                    }
                    let members: BTreeSet<Node> = p.groups[pg].nodes.iter().copied().collect();
                    // No user of the prologue sits in a third kernel (that would close a cycle
                    // through it); later users may still join as epilogue or read its result.
                    let only_here = members.iter().all(|m| {
                        uses.users.get(m).into_iter().flatten().all(|u| *u == n || members.contains(u) || !p.group_of.contains_key(u))
                    });
                    if only_here {
                        let moved = std::mem::take(&mut p.groups[pg].nodes);
                        for m in &moved {
                            p.group_of.insert(*m, g);
                        }
                        p.groups[g].nodes.extend(moved);
                        p.groups[g].nodes.sort();
                    }
                }
            }
            Role::Anchor(fam) => {
                let limit = if fam == Family::Matmul { out_n } else { 0.0 };
                new_group(&mut p, fam, n, limit);
            }
        }
    }
    p
}

fn new_group(p: &mut Partition, family: Family, n: Node, limit: f64) -> usize {
    let g = p.groups.len();
    p.groups.push(Group { family, nodes: vec![n], limit });
    p.group_of.insert(n, g);
    g
}

fn join(p: &mut Partition, g: usize, n: Node) {
    p.groups[g].nodes.push(n);
    p.group_of.insert(n, g);
}

/// Whether adding `n` to group `g` closes a cycle: some other operand of `n` comes from a
/// group `h` that `g` already reaches.
fn creates_cycle(f: &Function, uses: &Uses, p: &Partition, g: usize, n: Node) -> bool {
    let mut others = vec![];
    for &v in &f.nodes[n].inputs {
        for b in uses.bases(f, v) {
            if let Some(&h) = uses.producer.get(&b).and_then(|pn| p.group_of.get(pn)) {
                if h != g && !others.contains(&h) {
                    others.push(h);
                }
            }
        }
    }
    others.iter().any(|&h| reaches(uses, p, g, h))
}

/// Whether group `from` reaches group `to` through some third group.
fn reaches_around(uses: &Uses, p: &Partition, from: usize, to: usize) -> bool {
    let mut succ = vec![];
    for m in &p.groups[from].nodes {
        for u in uses.users.get(m).into_iter().flatten() {
            if let Some(&h) = p.group_of.get(u) {
                if h != from && h != to && !succ.contains(&h) {
                    succ.push(h);
                }
            }
        }
    }
    succ.into_iter().any(|h| reaches(uses, p, h, to))
}

/// Whether group `from` reaches group `to` through the users of its nodes.
fn reaches(uses: &Uses, p: &Partition, from: usize, to: usize) -> bool {
    let mut seen = HashSet::new();
    let mut stack = vec![from];
    while let Some(g) = stack.pop() {
        if !seen.insert(g) {
            continue;
        }
        for m in &p.groups[g].nodes {
            for u in uses.users.get(m).into_iter().flatten() {
                if let Some(&h) = p.group_of.get(u) {
                    if h == to {
                        return true;
                    }
                    if h != g {
                        stack.push(h);
                    }
                }
            }
        }
    }
    false
}
