//! What each op needs of its operands' placements to give a result in a placement: the
//! sharding rules of tensor parallelism (Megatron-LM, Shoeybi et al. 2019, arXiv
//! 1909.08053), written as a table over the op classes, as GSPMD (Xu et al. 2021, arXiv
//! 2105.04663) propagates shardings.
//!
//! A placement is whole on every rank ([`P::Rep`]), one block of an axis on each rank in rank
//! order ([`P::Split`]), or a summand of the value on each rank ([`P::Partial`]: a matmul
//! whose contracted axis is split). [`needs`] answers, for a node and a placement of its
//! first result, the placement each operand must have (`None`: the op cannot give it), and
//! [`results`] the placement of every result.

use sinter_ir::{Dim, Function, Node, OpClass, OpKind, Value};

/// Where a value lives across the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(super) enum P {
    /// The whole value on every rank.
    Rep,
    /// Rank r holds block r of this axis (size / ranks each).
    Split(usize),
    /// Every rank holds a summand; the value is their sum.
    Partial,
}

/// The rank and dims of `v`.
fn shape(f: &Function, v: Value) -> &[Dim] {
    &f.ty(v).shape
}

/// The operand axis that result axis `o` of a broadcasting op of result rank `r` reads, or
/// `None` where the operand broadcasts along it (absent or of size 1).
fn bcast_axis(f: &Function, v: Value, r: usize, o: usize) -> Option<usize> {
    let s = shape(f, v);
    let lead = r.checked_sub(s.len())?;
    let a = o.checked_sub(lead)?;
    (!s[a].is_one()).then_some(a)
}

/// `Split` on the operand axis result axis `o` reads, or `Rep` where it broadcasts.
fn bcast(f: &Function, v: Value, r: usize, o: usize) -> P {
    bcast_axis(f, v, r, o).map_or(P::Rep, P::Split)
}

fn norm(axis: i64, rank: usize) -> Option<usize> {
    let a = if axis < 0 { axis + rank as i64 } else { axis };
    (0..rank as i64).contains(&a).then_some(a as usize)
}

/// Under a row-major reshape between shapes `known` and `other` (either direction), the axis
/// of `other` whose contiguous blocks are the `ranks` blocks of axis `axis` of `known`. The
/// axes pair into groups of equal product; the split axis must be the outermost non-1 axis
/// of its group on both sides, and divide by `ranks` on both.
pub(super) fn reshape_axis(known: &[Dim], other: &[Dim], axis: usize, rk: &Ranks<'_>) -> Option<usize> {
    let (n, m) = (known.len(), other.len());
    let (mut i, mut j) = (0usize, 0usize);
    while i < n || j < m {
        let (i0, j0) = (i, j);
        let (mut pk, mut po) = (Dim::constant(1), Dim::constant(1));
        if i < n {
            pk = pk.mul(&known[i]);
            i += 1;
        }
        if j < m {
            po = po.mul(&other[j]);
            j += 1;
        }
        while pk != po {
            let grow_known = match (pk.as_const(), po.as_const()) {
                (Some(a), Some(b)) => a < b,
                (None, Some(_)) => false,
                (Some(_), None) => true,
                (None, None) => j >= m,
            };
            if grow_known && i < n {
                pk = pk.mul(&known[i]);
                i += 1;
            } else if j < m {
                po = po.mul(&other[j]);
                j += 1;
            } else if i < n {
                pk = pk.mul(&known[i]);
                i += 1;
            } else {
                return None;
            }
        }
        // Size-1 axes that follow join this group.
        while i < n && known[i].is_one() && (j >= m || !other[j].is_one()) {
            i += 1;
        }
        while j < m && other[j].is_one() && (i >= n || !known[i].is_one()) {
            j += 1;
        }
        if (i0..i).contains(&axis) {
            let outer_k = (i0..i).find(|&k| !known[k].is_one())?;
            let outer_o = (j0..j).find(|&k| !other[k].is_one())?;
            let ok = outer_k == axis && rk.divides(&known[axis]) && rk.divides(&other[outer_o]);
            return ok.then_some(outer_o);
        }
    }
    None
}

/// The operand placements node `n` needs for its first result to be `po`; `None` when the op
/// cannot give `po`. `cur` is each operand's placement now (`None`: not yet placed), which
/// picks between the ways to a `Partial` result.
pub(super) fn needs(f: &Function, n: Node, po: P, rk: &Ranks<'_>, cur: &[Option<P>]) -> Option<Vec<P>> {
    let ranks = rk.n;
    use OpKind::*;
    let nd = &f.nodes[n];
    let op = &nd.op;
    let ins = &nd.inputs;
    let out = shape(f, *nd.results.first()?);
    let r = out.len();
    let all = |p: P| Some(vec![p; ins.len()]);
    if let P::Split(o) = po {
        // Every split result axis divides.
        if o >= r || !rk.divides(&out[o]) {
            return None;
        }
    }
    let is_partial = |i: usize| cur.get(i).copied().flatten() == Some(P::Partial);
    match (op.kind.info().class, op.kind, po) {
        (_, AllReduce | AllGather | Call, _) => None,
        (_, _, P::Rep) => all(P::Rep),
        // --- element-wise ---
        (_, Add | Sub, P::Partial) => all(P::Partial),
        (_, Neg, P::Partial) => all(P::Partial),
        (_, Mul, P::Partial) if is_partial(0) && !is_partial(1) => Some(vec![P::Partial, P::Rep]),
        (_, Mul, P::Partial) if is_partial(1) && !is_partial(0) => Some(vec![P::Rep, P::Partial]),
        (_, Div, P::Partial) if is_partial(0) && !is_partial(1) => Some(vec![P::Partial, P::Rep]),
        (OpClass::Unary | OpClass::Binary | OpClass::Compare, _, P::Split(o)) | (_, Swiglu, P::Split(o)) => {
            if op.kind == Dequantize && o + 1 == r {
                let block = f.ty(ins[0]).dtype.block_elems().unwrap_or(1) as i64;
                out[o].div_exact(ranks)?.as_const().filter(|c| c % block == 0)?;
            }
            Some(ins.iter().map(|&v| bcast(f, v, r, o)).collect())
        }
        // --- reductions ---
        (OpClass::Reduce, _, P::Split(o)) => {
            let xr = shape(f, ins[0]).len();
            let ax = norm(op.int("axis")?, xr)?;
            let keep = op.bool("keepdim").unwrap_or(true);
            let a = if keep { o } else { o + usize::from(o >= ax) };
            (a != ax).then(|| vec![P::Split(a)])
        }
        (_, ReduceSum, P::Partial) => {
            let ax = norm(op.int("axis")?, shape(f, ins[0]).len())?;
            Some(vec![if cur.first().copied().flatten() == Some(P::Split(ax)) { P::Split(ax) } else { P::Partial }])
        }
        (_, ReduceMean, P::Partial) => Some(vec![P::Partial]),
        // --- rows ---
        (_, Softmax | LogSoftmax, P::Split(o)) => (Some(o) != norm(op.int("axis")?, r)).then(|| vec![P::Split(o)]),
        (_, RmsNorm | LayerNorm, P::Split(o)) => (o + 1 != r).then(|| std::iter::once(P::Split(o)).chain(ins[1..].iter().map(|_| P::Rep)).collect()),
        // --- layout ---
        (_, Transpose, p) => {
            let (d0, d1) = (norm(op.int("dim0")?, r)?, norm(op.int("dim1")?, r)?);
            Some(vec![match p {
                P::Split(o) if o == d0 => P::Split(d1),
                P::Split(o) if o == d1 => P::Split(d0),
                p => p,
            }])
        }
        (_, Permute, p) => Some(vec![match p {
            P::Split(o) => P::Split(usize::try_from(*op.ints("perm")?.get(o)?).ok()?),
            p => p,
        }]),
        (_, Reshape, P::Split(o)) => reshape_axis(out, shape(f, ins[0]), o, rk).map(|a| vec![P::Split(a)]),
        (_, Reshape | Broadcast | Slice | Concat, P::Partial) => all(P::Partial),
        (_, Broadcast, P::Split(o)) => Some(vec![bcast(f, ins[0], r, o)]),
        (_, Slice, P::Split(o)) => (Some(o) != norm(op.int("axis")?, r)).then(|| vec![P::Split(o)]),
        (_, Concat, P::Split(o)) => (Some(o) != norm(op.int("axis")?, r)).then(|| vec![P::Split(o); ins.len()]),
        // Megatron's vocabulary-parallel embedding: each rank looks up the ids in its rows (the
        // others give 0), so the lookups sum to the whole one.
        (_, Gather, P::Partial) => Some(vec![P::Split(0), P::Rep]),
        (_, Gather, P::Split(o)) => {
            let ir = shape(f, ins[1]).len();
            (o < ir).then(|| vec![P::Rep, P::Split(o)])
        }
        (_, Constant | Iota, P::Split(o)) => (op.kind == Constant || norm(op.int("axis")?, r) != Some(o)).then(Vec::new),
        // --- matmul ---
        (_, Matmul, p) => matmul(f, n, p, cur),
        // --- positions ---
        (_, Rope, P::Split(o)) => (o + 1 < r).then(|| vec![P::Split(o), bcast(f, ins[1], r - 1, o)]),
        (_, Rotary, P::Split(o)) => (o + 1 < r).then(|| vec![P::Split(o), bcast(f, ins[1], r, o), bcast(f, ins[2], r, o)]),
        // --- attention ---
        (_, Attention, P::Split(o)) => {
            let h = if op.str("layout") == Some("bshd") { 2 } else { 1 };
            let heads_ok = o != h || heads_divide(op, ranks);
            if !(heads_ok && (o == 0 || o == h)) {
                return None;
            }
            let mut v = vec![P::Split(o); 3];
            if let Some(&m) = ins.get(3) {
                // The mask broadcasts against [B, H, Sq, Skv].
                v.push(bcast(f, m, 4, if o == 0 { 0 } else { 1 }));
            }
            Some(v)
        }
        (_, PagedAttention, P::Split(1)) => heads_divide(op, ranks).then(|| vec![P::Split(1), P::Split(2), P::Split(2), P::Rep, P::Rep]),
        (_, KvAppend, P::Split(2)) => Some(vec![P::Split(2), P::Split(2), P::Split(2), P::Split(2), P::Rep, P::Rep]),
        (_, AttentionMerge, P::Split(o)) => (o + 1 < r).then(|| vec![P::Split(o); 4]),
        _ => None,
    }
}

/// The ranks, and the symbols that are already a rank's size (in a callee, those bound by an
/// argument split along them).
pub(super) struct Ranks<'a> {
    pub(super) n: i64,
    pub(super) split_symbols: &'a [Dim],
}

impl Ranks<'_> {
    /// Whether a split of an axis of size `d` gives equal blocks: a constant that divides, or
    /// a symbol that is already the rank's size. No other symbol divides (T is whole).
    pub(super) fn divides(&self, d: &Dim) -> bool {
        d.div_exact(self.n).is_some() || self.split_symbols.contains(d)
    }
}

/// Whether `heads` and `kv_heads` of an attention op divide by `ranks`.
pub(super) fn heads_divide(op: &sinter_ir::Op, ranks: i64) -> bool {
    op.int("heads").is_some_and(|h| h % ranks == 0) && op.int("kv_heads").is_some_and(|h| h % ranks == 0)
}

/// `matmul`'s operands for a result placement: the result's last axis from B's columns, the
/// one before from A's rows, batch axes from both; `Partial` from the contracted axis split on
/// both, or from one `Partial` operand and a whole other.
fn matmul(f: &Function, n: Node, po: P, cur: &[Option<P>]) -> Option<Vec<P>> {
    let nd = &f.nodes[n];
    let (a, b) = (nd.inputs[0], nd.inputs[1]);
    let (ra, rb) = (shape(f, a).len(), shape(f, b).len());
    let ta = nd.op.bool("transpose_a").unwrap_or(false);
    let tb = nd.op.bool("transpose_b").unwrap_or(false);
    let r = shape(f, nd.results[0]).len();
    // Physical axes of M, K (A) and K, N (B).
    let (am, ak) = if ta { (ra - 1, ra - 2) } else { (ra - 2, ra - 1) };
    let (bk, bn) = if tb { (rb - 1, rb - 2) } else { (rb - 2, rb - 1) };
    let is = |i: usize, p: P| cur.get(i).copied().flatten() == Some(p);
    match po {
        P::Rep => Some(vec![P::Rep, P::Rep]),
        P::Split(o) if o + 1 == r => Some(vec![P::Rep, P::Split(bn)]),
        P::Split(o) if o + 2 == r => Some(vec![P::Split(am), P::Rep]),
        P::Split(o) => {
            // A batch axis: each operand's own, or whole where it broadcasts.
            let pa = bcast_axis(f, a, r, o).filter(|&x| x + 2 < ra).map_or(P::Rep, P::Split);
            let pb = bcast_axis(f, b, r, o).filter(|&x| x + 2 < rb).map_or(P::Rep, P::Split);
            Some(vec![pa, pb])
        }
        P::Partial if is(0, P::Partial) && !is(1, P::Partial) => Some(vec![P::Partial, P::Rep]),
        P::Partial if is(1, P::Partial) && !is(0, P::Partial) => Some(vec![P::Rep, P::Partial]),
        P::Partial => Some(vec![P::Split(ak), P::Split(bk)]),
    }
}

/// The placement of every result of `n` when its first is `po`.
pub(super) fn results(f: &Function, n: Node, po: P) -> Vec<P> {
    let nd = &f.nodes[n];
    match (nd.op.kind, po) {
        // The log-sum-exp [B, H, Sq] (bshd: [B, Sq, H]) follows the output's head axis.
        (OpKind::Attention, P::Split(o)) if o > 0 => {
            let lse_h = if nd.op.str("layout") == Some("bshd") { 2 } else { 1 };
            vec![po, P::Split(lse_h)]
        }
        // The merged log-sum-exp drops the head dim: leading axes agree.
        _ => vec![po; nd.results.len()],
    }
}
