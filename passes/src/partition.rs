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
//!
//! **The load-time frontier.** Hoisted nodes ([`crate::hoist`]: work on weights and constants
//! that runs once when the weights are bound) and per-step nodes never share a kernel: every
//! join above, every prologue and every root a kernel writes stays on its kernel's side, so a
//! per-step kernel reads a hoisted result as a buffer instead of recomputing it.
//!
//! **The code generator's contract** ([`sinter_ir::contract`], on by default:
//! [`crate::PassOptions::codegen_contract`]) narrows this to the bodies each generator
//! accepts:
//!
//! - every `slice` is a view (the element evaluator reads any slice strided), so the column
//!   slices of a merged QKV or gate/up output are read by the kernels that use them;
//! - a matmul epilogue takes element-wise nodes and `rope`/`rotary` (positions or cos/sin
//!   tables from elsewhere) no larger than the matmul's output that read its values directly
//!   or through `reshape`s and last-axis slices — the column segments of a merged QKV
//!   projection with RoPE, the halves of a merged gate/up projection; `rope`/`rotary` joins a
//!   RowReduction only over values of the rows' shape, positions or tables from elsewhere (a
//!   q/k norm then RoPE);
//! - a `kv_append` whose new K and V rows both come from one Matmul kernel joins it (the QKV
//!   projection's epilogue scatters K and V into the paged cache) when its pages are buffers
//!   and its block table and positions come from elsewhere; otherwise a Pointwise kernel used
//!   only by a `kv_append` becomes its prologue;
//! - a row norm whose only reader is a matmul's A operand joins that matmul's kernel as its
//!   prologue, where the generator computes it and the cost model says the launch saved
//!   pays (`norm_prologue.rs`);
//! - [`legalise`]: an operand that a generator reads as a buffer (matmul and attention
//!   operands, `kv_append`'s pages) or a graph output that is a view must be written by some
//!   kernel, unless the generator can read it as a view of a buffer (`reshape`s and `slice`s
//!   of a written value, no reshape of a strided slice): the Pointwise/Layout kernel its view
//!   chain starts from writes it when its outputs keep one shape, a Matmul kernel writes a
//!   column view of its values as an output of its own, otherwise a Layout kernel of its own
//!   does (a *root*: a view chain a kernel computes and writes); Layout kernels of roots merge
//!   into a kernel of the same output shape reading the same kernels;
//! - a kernel that still breaks the contract (checked on the built bodies) is split into
//!   one kernel per node ([`dissolve`]).

mod norm_prologue;

use std::collections::{BTreeSet, HashMap, HashSet};

use sinter_ir::{Dim, Family, Function, Node, OpClass, OpKind, Value};

use sinter_ir::contract::{is_elementwise, is_rotation, is_strict_operand, one_shape, quantized_b, reads_fp8_with};
use sinter_ir::Target;
use crate::cost::{is_contiguous_slice, CostConfig};
use crate::hoist::Hoist;

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
        // A dequantised weight is recomputed by the kernels that read it: the element
        // evaluator from the blocks, a matmul as its B operand (`contract::quantized_b`);
        // likewise an fp8 tensor's dequantisation (`contract::fp8_matmul`, `fp8_attention`).
        Reshape | Dequantize | DequantizeFp8 => Role::View,
        Slice => match nd.inputs.first() {
            Some(&x) if is_contiguous_slice(&nd.op, f.ty(x)) => Role::View,
            _ => Role::Anchor(Family::Layout),
        },
        Constant | Iota => Role::Source,
        Rope | Rotary | Swiglu => Role::Point,
        ReduceSum | ReduceMax | ReduceMin | ReduceMean | Softmax | LogSoftmax | RmsNorm | LayerNorm => Role::Anchor(Family::RowReduction),
        Matmul => Role::Anchor(Family::Matmul),
        Attention => Role::Anchor(Family::Attention),
        PagedAttention => Role::Anchor(Family::PagedAttention),
        AttentionMerge => Role::Anchor(Family::AttentionMerge),
        KvAppend => Role::Anchor(Family::KvAppend),
        Gather => Role::Anchor(Family::Gather),
        Transpose | Permute | Broadcast | Concat | Call => Role::Anchor(Family::Layout),
        k => match k.info().class {
            OpClass::Unary | OpClass::Binary | OpClass::Compare => Role::Point,
            _ => Role::Anchor(Family::Layout),
        },
    }
}

/// The role of node `n` under the code generator's contract: every `slice` is a view.
pub fn role_in(f: &Function, n: Node, contract: bool) -> Role {
    if contract && f.nodes[n].op.kind == OpKind::Slice {
        return Role::View;
    }
    role(f, n)
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
    /// Results of view/source chains (ungrouped nodes) that this kernel computes and writes
    /// to buffers of their own (see [`legalise`]).
    pub roots: Vec<Value>,
    /// Largest result an epilogue node may have, in elements at the cost config's sizes.
    limit: f64,
    /// The matmul's output shape (Matmul kernels).
    shape: Vec<Dim>,
    /// Split for the contract: never merged again.
    pinned: bool,
    /// A kernel of hoisted nodes and load-time roots ([`crate::hoist`]): it never takes a
    /// per-step node, nor a per-step kernel one of its nodes.
    load_time: bool,
}

impl Group {
    fn new(family: Family, nodes: Vec<Node>, limit: f64) -> Group {
        Group { family, nodes, roots: vec![], limit, shape: vec![], pinned: false, load_time: false }
    }

    /// Whether the kernel holds hoisted nodes and load-time roots ([`crate::hoist`]).
    pub fn load_time(&self) -> bool {
        self.load_time
    }
}

/// A partition of a function's nodes into kernels.
#[derive(Clone, Debug, Default)]
pub struct Partition {
    /// Kernels (some may be empty after merges; [`Partition::live`] skips them).
    pub groups: Vec<Group>,
    /// The kernel of each grouped node (views and sources are not grouped when fusing).
    pub group_of: HashMap<Node, usize>,
    /// The kernel writing each root (a materialised view/source chain result).
    pub host_of: HashMap<Value, usize>,
    /// Graph outputs that are view/source chains over one kernel's result and get a kernel of
    /// their own instead of being written at the end of that kernel's body (set when the
    /// hosting kernel would fall outside the code generator's contract, e.g. a row
    /// reduction writing a slice of its rows).
    pub own_kernel: HashSet<Value>,
    /// The hoisted nodes ([`crate::hoist::Hoist::nodes`]): kernels hold only hoisted nodes or
    /// only others.
    pub hoisted: HashSet<Node>,
    /// The values a load-time kernel can write as roots ([`crate::hoist::Hoist::available`]).
    pub available: HashSet<Value>,
}

impl Partition {
    /// Indices of the non-empty kernels.
    pub fn live(&self) -> impl Iterator<Item = usize> + '_ {
        self.groups.iter().enumerate().filter(|(_, g)| !g.nodes.is_empty() || !g.roots.is_empty()).map(|(i, _)| i)
    }

    /// The kernel that writes `v`: its root host, or the kernel of the node computing it.
    pub fn source(&self, uses: &Uses, v: Value) -> Option<usize> {
        self.host_of.get(&v).copied().or_else(|| uses.producer.get(&v).and_then(|n| self.group_of.get(n)).copied())
    }

    /// The values kernel `g` reads from its buffers to compute `v`: `v`'s view/source chain
    /// (ungrouped nodes) is looked through, up to parameters, results of grouped nodes, and
    /// roots of other kernels. `g = None`: every root is a boundary.
    pub fn reads(&self, f: &Function, uses: &Uses, v: Value, g: Option<usize>) -> Vec<Value> {
        let mut out = vec![];
        let mut stack = vec![v];
        let mut seen = HashSet::new();
        while let Some(x) = stack.pop() {
            if !seen.insert(x) {
                continue;
            }
            if let Some(&h) = self.host_of.get(&x) {
                if Some(h) != g {
                    out.push(x);
                    continue;
                }
            }
            match uses.producer.get(&x) {
                Some(&n) if !self.group_of.contains_key(&n) => stack.extend(f.nodes[n].inputs.iter().copied()),
                _ => out.push(x),
            }
        }
        out
    }
}

/// Each node its own kernel (views and sources included).
pub fn one_per_node(f: &Function) -> Partition {
    let mut p = Partition::default();
    for n in f.nodes.keys() {
        p.group_of.insert(n, p.groups.len());
        p.groups.push(Group::new(family_alone(f, n), vec![n], 0.0));
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
    /// Roles are taken under the code generator's contract ([`role_in`]).
    pub contract: bool,
}

impl Uses {
    /// Computes the facts.
    pub fn new(f: &Function) -> Uses {
        Uses::with(f, false)
    }

    /// Computes the facts, with roles under the contract or not.
    pub fn with(f: &Function, contract: bool) -> Uses {
        let mut producer = HashMap::new();
        for (n, nd) in f.nodes.iter() {
            for &r in &nd.results {
                producer.insert(r, n);
            }
        }
        let mut u = Uses { producer, users: HashMap::new(), contract };
        for (m, nd) in f.nodes.iter() {
            if matches!(role_in(f, m, contract), Role::View | Role::Source) {
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
                Some(&n) if matches!(role_in(f, n, self.contract), Role::View | Role::Source) => stack.extend(f.nodes[n].inputs.iter().copied()),
                _ => out.push(x),
            }
        }
        out
    }
}

/// Partitions `f` into fused kernels (see the module docs), without the code generator's
/// contract.
pub fn fuse(f: &Function, cfg: &CostConfig, hoist: &Hoist) -> Partition {
    fuse_with(f, cfg, false, hoist)
}

/// Partitions `f` into fused kernels; `contract`: within the code generator's contract (then
/// [`legalise`] is still to run). Hoisted nodes ([`Hoist`]) and the others never share a
/// kernel.
pub fn fuse_with(f: &Function, cfg: &CostConfig, contract: bool, hoist: &Hoist) -> Partition {
    let uses = Uses::with(f, contract);
    let mut p = Partition { hoisted: hoist.nodes.clone(), available: hoist.available.clone(), ..Partition::default() };
    let numel = |v: Value| cfg.numel(f.ty(v));
    for (n, nd) in f.nodes.iter() {
        let r = role_in(f, n, contract);
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
                let side = p.hoisted.contains(&n);
                let joined = cands.into_iter().find(|&g| {
                    let grp = &p.groups[g];
                    let fits = grp.load_time == side && match grp.family {
                        Family::Pointwise => true,
                        Family::Matmul => out_n <= grp.limit && (!contract || epilogue_ok(f, &uses, &p, g, n)),
                        Family::RowReduction => out_n <= grp.limit && (!contract || !is_rotation(nd.op.kind) || rope_on_rows(f, &uses, &p, g, n)),
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
                                if h != g && p.groups[h].family == Family::Pointwise && p.groups[h].load_time == side && !reaches_around(&uses, &p, h, g) && !reaches_around(&uses, &p, g, h) {
                                    absorb(&mut p, h, g);
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
                let side = p.hoisted.contains(&n);
                match cands.into_iter().find(|&g| p.groups[g].family == Family::Matmul && p.groups[g].load_time == side && !creates_cycle(f, &uses, &p, g, n)) {
                    Some(g) => join(&mut p, g, n),
                    None => {
                        new_group(&mut p, Family::Layout, n, 0.0);
                    }
                }
            }
            Role::Anchor(Family::RowReduction) => {
                let row = nd.inputs.first().map(|&x| numel(x)).unwrap_or(0.0);
                let cands = operand_groups(&p);
                let side = p.hoisted.contains(&n);
                let same_rows = cands
                    .iter()
                    .copied()
                    .find(|&g| p.groups[g].family == Family::RowReduction && p.groups[g].limit == row && p.groups[g].load_time == side && !creates_cycle(f, &uses, &p, g, n));
                let g = match same_rows {
                    Some(g) => {
                        join(&mut p, g, n);
                        g
                    }
                    None => new_group(&mut p, Family::RowReduction, n, row),
                };
                // Prologue: a Pointwise kernel used only by this reduction (a second norm's
                // weight computed from a parameter, Gemma's `1 + w`, included).
                for pg in cands {
                    if p.groups[pg].family != Family::Pointwise || p.groups[pg].load_time != side {
                        continue;
                    }
                    let members: BTreeSet<Node> = p.groups[pg].nodes.iter().copied().collect();
                    // No user of the prologue sits in a third kernel (that would close a cycle
                    // through it); later users may still join as epilogue or read its result.
                    let only_here = members.iter().all(|m| {
                        uses.users.get(m).into_iter().flatten().all(|u| *u == n || members.contains(u) || !p.group_of.contains_key(u))
                    });
                    if only_here && !reaches(&uses, &p, g, pg) {
                        absorb(&mut p, pg, g);
                        p.groups[g].nodes.sort();
                    }
                }
            }
            Role::Anchor(Family::KvAppend) if contract && kv_append_joins(f, &uses, &p, n).is_some() => {
                if let Some(g) = kv_append_joins(f, &uses, &p, n) {
                    join(&mut p, g, n);
                }
            }
            Role::Anchor(fam) => {
                let limit = if fam == Family::Matmul { out_n } else { 0.0 };
                let g = new_group(&mut p, fam, n, limit);
                if fam == Family::Matmul {
                    p.groups[g].shape = nd.results.first().map(|&r| f.ty(r).shape.clone()).unwrap_or_default();
                    if contract {
                        norm_prologue::join_norm(f, &uses, &mut p, g, n, cfg);
                    }
                }
                if contract && fam == Family::KvAppend {
                    // Prologue: a Pointwise kernel whose results only this kv_append reads
                    // (through its new rows, block table or positions, never its pages).
                    let outputs: HashSet<Value> = f.outputs.iter().copied().collect();
                    let mut cands = vec![];
                    for &v in nd.inputs.iter().skip(2) {
                        for b in uses.bases(f, v) {
                            if let Some(&h) = uses.producer.get(&b).and_then(|pn| p.group_of.get(pn)) {
                                if !cands.contains(&h) {
                                    cands.push(h);
                                }
                            }
                        }
                    }
                    let pages: Vec<Value> = nd.inputs.iter().take(2).flat_map(|&v| uses.bases(f, v)).collect();
                    for h in cands {
                        if p.groups[h].family != Family::Pointwise || p.groups[h].load_time != p.groups[g].load_time {
                            continue;
                        }
                        let members: BTreeSet<Node> = p.groups[h].nodes.iter().copied().collect();
                        let only_here = members.iter().all(|m| {
                            uses.users.get(m).into_iter().flatten().all(|u| *u == n || members.contains(u))
                                && f.nodes[*m].results.iter().all(|r| !outputs.contains(r) && !pages.contains(r))
                        });
                        if only_here {
                            absorb(&mut p, h, g);
                            p.groups[g].nodes.sort();
                        }
                    }
                }
            }
        }
    }
    p
}

/// Whether node `n` may join Matmul kernel `g` as epilogue under the contract (what
/// [`sinter_ir::epilogue::analyse`] accepts; the built kernel is checked again): an
/// element-wise node or a `rope` (positions not from `g`) whose result is no larger than the
/// matmul's and not `f8e4m3`, reading `g`'s values directly or through `reshape`s and column slices (a merged
/// QKV or gate/up projection's parts).
fn epilogue_ok(f: &Function, uses: &Uses, p: &Partition, g: usize, n: Node) -> bool {
    let nd = &f.nodes[n];
    if !(is_elementwise(nd.op.kind) || is_rotation(nd.op.kind)) {
        return false;
    }
    // An `f8e4m3` result (`quantize_fp8`, a cast to fp8) is computed in its own element-wise
    // kernel: the matmul generators store no one-byte results (they refuse fp8 epilogues).
    if nd.results.iter().any(|&r| f.ty(r).dtype.is_fp8()) {
        return false;
    }
    let in_g = |x: Value| uses.producer.get(&x).and_then(|pn| p.group_of.get(pn)) == Some(&g);
    nd.inputs.iter().enumerate().all(|(i, &v)| {
        let from_g = uses.bases(f, v).iter().any(|b| in_g(*b));
        if !from_g {
            return true;
        }
        if is_rotation(nd.op.kind) && i != 0 {
            return false;
        }
        // Walk the view chain back to g: reshapes and last-axis slices only.
        let mut x = v;
        loop {
            if in_g(x) {
                return true;
            }
            let Some(&pn) = uses.producer.get(&x) else { return false };
            let vnd = &f.nodes[pn];
            let last_axis_slice = vnd.op.kind == OpKind::Slice && vnd.op.int("axis").is_some_and(|a| a == -1 || a + 1 == f.ty(vnd.inputs[0]).rank() as i64);
            if !(vnd.op.kind == OpKind::Reshape || last_axis_slice) {
                return false;
            }
            x = vnd.inputs[0];
        }
    })
}

/// Whether `rope`/`rotary` node `n` may join RowReduction kernel `g` under the contract: it
/// rotates values of the rows' own shape (a pair's partner is the same row at another column,
/// recomputed from the row's statistics) with positions or tables from elsewhere (a norm then RoPE,
/// as Gemma's and Qwen3's q/k norms, is one kernel).
fn rope_on_rows(f: &Function, uses: &Uses, p: &Partition, g: usize, n: Node) -> bool {
    let nd = &f.nodes[n];
    let rows = p.groups[g].nodes.iter().find(|&&m| sinter_ir::contract::is_row_node(f.nodes[m].op.kind)).map(|&m| f.ty(f.nodes[m].inputs[0]).shape.clone());
    let in_g = |x: &Value| uses.producer.get(x).and_then(|pn| p.group_of.get(pn)) == Some(&g);
    let pos_outside = nd.inputs.len() > 1 && nd.inputs[1..].iter().all(|&v| !uses.bases(f, v).iter().any(in_g));
    pos_outside && rows.is_some_and(|r| f.ty(nd.inputs[0]).shape == r)
}

/// The Matmul kernel a `kv_append` node `n` joins under the contract: the one computing both
/// its new K and V rows (through views), when its pages are buffers (graph parameters or
/// another kernel's results, updated in place), its block table and positions are not computed there, and joining closes no
/// cycle — the projection's epilogue then scatters K and V into the cache.
fn kv_append_joins(f: &Function, uses: &Uses, p: &Partition, n: Node) -> Option<usize> {
    let nd = &f.nodes[n];
    if nd.inputs.len() != 6 {
        return None;
    }
    let group = |v: Value| -> Vec<Option<usize>> { uses.bases(f, v).iter().map(|b| uses.producer.get(b).and_then(|pn| p.group_of.get(pn)).copied()).collect() };
    let (gk, gv) = (group(nd.inputs[2]), group(nd.inputs[3]));
    let g = match (gk.as_slice(), gv.as_slice()) {
        ([Some(a)], [Some(b)]) if a == b && p.groups[*a].family == Family::Matmul && !p.groups[*a].pinned && p.groups[*a].load_time == p.hoisted.contains(&n) => *a,
        _ => return None,
    };
    let pages_outside = nd.inputs[..2].iter().all(|&v| {
        let computed = uses.producer.get(&v).is_some_and(|&pn| !matches!(role_in(f, pn, uses.contract), Role::View | Role::Source));
        (computed || !uses.producer.contains_key(&v)) && !group(v).contains(&Some(g))
    });
    let others_outside = nd.inputs[4..].iter().all(|&v| !group(v).contains(&Some(g)));
    (pages_outside && others_outside && !creates_cycle(f, uses, p, g, n)).then_some(g)
}

/// Moves every node of group `from` into group `into` (appended; `from` is left empty).
fn absorb(p: &mut Partition, from: usize, into: usize) {
    let moved = std::mem::take(&mut p.groups[from].nodes);
    for m in &moved {
        p.group_of.insert(*m, into);
    }
    p.groups[into].nodes.extend(moved);
}

fn new_group(p: &mut Partition, family: Family, n: Node, limit: f64) -> usize {
    let g = p.groups.len();
    let mut grp = Group::new(family, vec![n], limit);
    grp.load_time = p.hoisted.contains(&n);
    p.groups.push(grp);
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

/// What the kernels of a partition read from each other.
#[derive(Clone, Debug)]
pub struct Flow {
    /// Per kernel: the values it writes for other kernels and the graph outputs, in the order
    /// they are first read.
    pub exports: Vec<Vec<Value>>,
    /// Per kernel: the kernels it reads.
    pub deps: Vec<BTreeSet<usize>>,
    /// Per kernel: the kernels reading it.
    pub readers: Vec<BTreeSet<usize>>,
}

/// Computes the [`Flow`] of `p`.
pub fn flow(f: &Function, uses: &Uses, p: &Partition) -> Flow {
    let n = p.groups.len();
    let mut exports: Vec<Vec<Value>> = vec![vec![]; n];
    let mut deps = vec![BTreeSet::new(); n];
    let mut readers = vec![BTreeSet::new(); n];
    for g in p.live() {
        let grp = &p.groups[g];
        let vals = grp.nodes.iter().flat_map(|&m| f.nodes[m].inputs.iter().copied()).chain(grp.roots.iter().copied());
        for v in vals {
            for x in p.reads(f, uses, v, Some(g)) {
                if let Some(s) = p.source(uses, x) {
                    if s != g {
                        deps[g].insert(s);
                        readers[s].insert(g);
                        if !exports[s].contains(&x) {
                            exports[s].push(x);
                        }
                    }
                }
            }
        }
    }
    for &o in &f.outputs {
        if let Some(s) = p.source(uses, o) {
            if !exports[s].contains(&o) {
                exports[s].push(o);
            }
        }
    }
    Flow { exports, deps, readers }
}

/// The shape of `v` once trailing reshapes (ungrouped, computed in the kernel) are peeled, as
/// the pointwise generator writes its outputs.
fn peeled_shape(f: &Function, uses: &Uses, p: &Partition, g: usize, mut v: Value) -> Vec<Dim> {
    loop {
        match uses.producer.get(&v) {
            Some(&n) if !p.group_of.contains_key(&n) && f.nodes[n].op.kind == OpKind::Reshape && p.host_of.get(&v).is_none_or(|&h| h == g) => {
                v = f.nodes[n].inputs[0];
            }
            _ => return f.ty(v).shape.clone(),
        }
    }
}

/// Whether kernel `g` of a pointwise family can write `values` (one shape, peeled or not).
fn writes_one_shape(f: &Function, uses: &Uses, p: &Partition, g: usize, values: &[Value]) -> bool {
    let plain: Vec<Vec<Dim>> = values.iter().map(|&v| f.ty(v).shape.clone()).collect();
    let peeled: Vec<Vec<Dim>> = values.iter().map(|&v| peeled_shape(f, uses, p, g, v)).collect();
    one_shape(&plain, &peeled)
}

fn pointwise_engine(fam: Family) -> bool {
    matches!(fam, Family::Pointwise | Family::Layout | Family::Gather)
}

/// A new kernel writing root `v` alone: Layout when its chain has a view, else Pointwise.
fn root_group(f: &Function, uses: &Uses, p: &mut Partition, v: Value, pinned: bool) -> usize {
    let mut has_view = false;
    let mut stack = vec![v];
    let mut seen = HashSet::new();
    while let Some(x) = stack.pop() {
        if !seen.insert(x) || (x != v && p.host_of.contains_key(&x)) {
            continue;
        }
        if let Some(&n) = uses.producer.get(&x) {
            if !p.group_of.contains_key(&n) {
                has_view |= role_in(f, n, uses.contract) == Role::View;
                stack.extend(f.nodes[n].inputs.iter().copied());
            }
        }
    }
    let g = p.groups.len();
    let mut grp = Group::new(if has_view { Family::Layout } else { Family::Pointwise }, vec![], 0.0);
    grp.pinned = pinned;
    grp.load_time = p.available.contains(&v);
    grp.roots.push(v);
    p.groups.push(grp);
    p.host_of.insert(v, g);
    g
}

/// Makes a fused partition meet the code generator's contract where kernels read buffers
/// (see the module docs): every operand a generator needs as a kernel input and every graph
/// output that a view/source chain computes becomes a root of some kernel; roots stay out of
/// kernels whose outputs would then differ in shape; kernels of roots alone merge into kernels
/// of the same output shape that read the same kernels, where that closes no cycle.
pub fn legalise(f: &Function, uses: &Uses, p: &mut Partition, target: &Target) {
    // 1. Roots.
    let mut need: Vec<Value> = vec![];
    for g in p.live().collect::<Vec<_>>() {
        for &m in &p.groups[g].nodes {
            let nd = &f.nodes[m];
            // Values a kernel reads from a buffer: parameters, and values of other kernels.
            let buffer = |x: Value| !uses.producer.contains_key(&x) || p.source(uses, x).is_some_and(|h| h != g);
            for (i, &v) in nd.inputs.iter().enumerate() {
                // A matmul reads a dequantised weight as stored blocks where it can, an fp8
                // matmul or attention its fp8 operands as stored bytes (on targets that
                // multiply e4m3).
                let blocks = uses.contract && ((i == 1 && quantized_b(f, m)) || reads_fp8_with(f, m, i, &buffer, target));
                if is_strict_operand(nd.op.kind, i) && !blocks && !need.contains(&v) {
                    need.push(v);
                }
            }
        }
    }
    for &o in &f.outputs {
        if !need.contains(&o) {
            need.push(o);
        }
    }
    need.retain(|v| uses.producer.contains_key(v) && p.source(uses, *v).is_none() && !buffer_view(f, uses, p, *v));
    for v in need {
        let srcs: BTreeSet<usize> = p.reads(f, uses, v, None).into_iter().filter_map(|x| p.source(uses, x)).collect();
        match srcs.first() {
            Some(&h) if srcs.len() == 1 && !p.groups[h].pinned && p.groups[h].load_time == p.available.contains(&v) && (pointwise_engine(p.groups[h].family) || (p.groups[h].family == Family::Matmul && column_view(f, uses, p, h, v))) => {
                p.groups[h].roots.push(v);
                p.host_of.insert(v, h);
            }
            _ => {
                root_group(f, uses, p, v, false);
            }
        }
    }
    // 2. A kernel whose outputs would differ in shape writes none of its roots.
    loop {
        let fl = flow(f, uses, p);
        let mut changed = false;
        for g in p.live().collect::<Vec<_>>() {
            if !pointwise_engine(p.groups[g].family) || p.groups[g].roots.is_empty() || writes_one_shape(f, uses, p, g, &fl.exports[g]) {
                continue;
            }
            let keep = usize::from(p.groups[g].nodes.is_empty());
            if p.groups[g].roots.len() <= keep {
                continue;
            }
            let moved: Vec<Value> = p.groups[g].roots.drain(keep..).collect();
            let pinned = p.groups[g].pinned;
            for r in moved {
                p.host_of.remove(&r);
                root_group(f, uses, p, r, pinned);
            }
            changed = true;
        }
        if !changed {
            break;
        }
    }
    // 3. Kernels of roots alone merge into a kernel of the same output shape (kernels with
    //    nodes first) that reads every kernel they read, unless a reader of theirs reaches it;
    //    one merge per round (two merges checked on the same flow could close a cycle
    //    together).
    loop {
        let fl = flow(f, uses, p);
        let live: Vec<usize> = p.live().collect();
        let mut order: Vec<usize> = live.iter().copied().filter(|&q| !p.groups[q].nodes.is_empty()).collect();
        order.extend(live.iter().copied().filter(|&q| p.groups[q].nodes.is_empty()));
        // The kernels reaching `q` (its ancestors), computed once per kernel per round.
        let mut ancestors: HashMap<usize, HashSet<usize>> = HashMap::new();
        let mut merged = None;
        'outer: for &pg in &live {
            let grp = &p.groups[pg];
            if !grp.nodes.is_empty() || grp.pinned || grp.roots.is_empty() {
                continue;
            }
            for &q in &order {
                let qg = &p.groups[q];
                if q == pg || qg.pinned || qg.load_time != grp.load_time || !pointwise_engine(qg.family) || !fl.deps[pg].is_subset(&fl.deps[q]) {
                    continue;
                }
                let mut vals = fl.exports[q].clone();
                vals.extend(fl.exports[pg].iter().copied());
                if !writes_one_shape(f, uses, p, q, &vals) {
                    continue;
                }
                let anc = ancestors.entry(q).or_insert_with(|| {
                    let mut seen = HashSet::new();
                    let mut stack = vec![q];
                    while let Some(g) = stack.pop() {
                        if seen.insert(g) {
                            stack.extend(fl.deps[g].iter().copied());
                        }
                    }
                    seen
                });
                if fl.readers[pg].iter().any(|r| anc.contains(r)) {
                    continue;
                }
                merged = Some((pg, q));
                break 'outer;
            }
        }
        let Some((pg, q)) = merged else { break };
        let roots = std::mem::take(&mut p.groups[pg].roots);
        for &r in &roots {
            p.host_of.insert(r, q);
        }
        p.groups[q].roots.extend(roots);
        if p.groups[pg].family == Family::Pointwise && p.groups[q].family == Family::Layout {
            p.groups[q].family = Family::Pointwise;
        }
    }
}

/// Whether `v` is a chain of `reshape`s and last-axis `slice`s of a value of Matmul kernel
/// `g`: a columns epilogue writes it as an output of its own.
fn column_view(f: &Function, uses: &Uses, p: &Partition, g: usize, v: Value) -> bool {
    let mut x = v;
    loop {
        let Some(&n) = uses.producer.get(&x) else { return false };
        if p.group_of.get(&n) == Some(&g) {
            return x != v;
        }
        let nd = &f.nodes[n];
        let last_axis_slice = nd.op.kind == OpKind::Slice && nd.op.int("axis").is_some_and(|a| a == -1 || a + 1 == f.ty(nd.inputs[0]).rank() as i64);
        if p.group_of.contains_key(&n) || !(nd.op.kind == OpKind::Reshape || last_axis_slice) {
            return false;
        }
        x = nd.inputs[0];
    }
}

/// Whether `v` is a view the generators read straight from a buffer (`sinter_ir::epilogue::
/// viewed_param`): `reshape`s and `slice`s of a graph parameter or of a value some kernel
/// writes, no `reshape` of a strided slice (buffers are contiguous).
fn buffer_view(f: &Function, uses: &Uses, p: &Partition, v: Value) -> bool {
    let mut chain = vec![];
    let mut x = v;
    loop {
        let written = x != v && (p.source(uses, x).is_some() || !uses.producer.contains_key(&x));
        if written {
            break;
        }
        match uses.producer.get(&x) {
            Some(&n) if matches!(f.nodes[n].op.kind, OpKind::Reshape | OpKind::Slice) && !p.group_of.contains_key(&n) => {
                chain.push(n);
                x = f.nodes[n].inputs[0];
            }
            _ => return false,
        }
    }
    let mut contiguous = true;
    for &n in chain.iter().rev() {
        let nd = &f.nodes[n];
        let shape = &f.ty(nd.inputs[0]).shape;
        if nd.op.kind == OpKind::Reshape {
            if !contiguous {
                return false;
            }
        } else {
            let Some(axis) = nd.op.int("axis").and_then(|a| sinter_ir::infer::norm_axis(a, shape.len()).ok()) else { return false };
            contiguous = contiguous && shape[..axis].iter().all(Dim::is_one);
        }
    }
    true
}

/// Splits kernel `g` into one kernel per node and one per root, none of which merges again
/// (for a kernel the contract check refused).
pub fn dissolve(f: &Function, uses: &Uses, p: &mut Partition, g: usize) {
    let nodes = std::mem::take(&mut p.groups[g].nodes);
    let roots = std::mem::take(&mut p.groups[g].roots);
    for n in nodes {
        let h = new_group(p, family_alone(f, n), n, 0.0);
        p.groups[h].pinned = true;
        if p.groups[h].family == Family::Matmul {
            p.groups[h].shape = f.nodes[n].results.first().map(|&r| f.ty(r).shape.clone()).unwrap_or_default();
        }
    }
    for r in roots {
        p.host_of.remove(&r);
        root_group(f, uses, p, r, true);
    }
}
