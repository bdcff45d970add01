//! Attentions the code generator refuses, lowered as their decomposition before the e-graph.
//!
//! An `attention` or `paged_attention` node is one kernel or nothing: a node the kernel
//! contract refuses for the target ([`sinter_ir::contract::attention_node`], e.g. a head dim
//! over [`sinter_ir::contract::MAX_ATTENTION_HEAD_DIM`]) cannot be split by
//! [`crate::lower::build_within_contract`]. [`refused_attention`] rewrites each such node of
//! the input graph into ops every target takes, computing what the op's row of the op table
//! says (the interpreter's attention is the reference):
//!
//! ```text
//! s = scale · (f32(Q) · f32(K)ᵀ)           [B, H, Sq, Skv], f32 accumulation (DESIGN.md)
//! s = c · tanh(s / c)                       with `softcap=c`
//! s = s + f32(mask)                         an additive mask, broadcast
//! s = select(j ≤ i + Skv − Sq, s, −inf)     causal, aligned bottom-right
//! s = select(i + Skv − Sq − j < W, s, −inf) with `window=W` (a dense mask: only here)
//! O = dt(softmax(s) · f32(V))               one rounding to the dtype, as the op
//! lse = m + log Σ exp(s − m)                with `lse=true` (−inf for a row with no key)
//! ```
//!
//! GQA is read without copying K and V per query head: the query heads of one KV head are
//! stacked as rows (`[B, Hkv, G·Sq, D]`, `G = H/Hkv`), so each matmul's batch is the KV
//! heads. `paged_attention` gathers each sequence's pages (`gather(pages, block_table)` →
//! `[B, M·S, Hkv, D]`) and masks keys at or past its length (`seq_lens`), causal per
//! sequence. A fully masked row gives 0, as `softmax` and the op do.
//!
//! The extraction side of the same rule is in [`crate::cost::node_cost`]: an attention e-node
//! the contract refuses is never chosen, so a recognised attention that the generator cannot
//! build stays in its written form.

use std::collections::{BTreeMap, HashMap};

use sinter_ir::contract::attention_node;
use sinter_ir::{Attr, DType, Dim, Function, Graph, Op, OpKind, Target, TensorType, Value};

use crate::PassError;

/// `g` with every `attention` / `paged_attention` node that the contract refuses on `target`
/// replaced by its decomposition (module docs); `None` when there is none (nothing to do).
///
/// # Errors
/// [`PassError::Lower`] where a decomposition does not type (a bug).
pub fn refused_attention(g: &Graph, target: &Target) -> Result<Option<Graph>, PassError> {
    let refused = |f: &Function, nd: &sinter_ir::NodeData| {
        matches!(nd.op.kind, OpKind::Attention | OpKind::PagedAttention) && {
            let tys: Vec<&TensorType> = nd.inputs.iter().map(|&v| f.ty(v)).collect();
            attention_node(&nd.op, &tys, target).is_err()
        }
    };
    if !g.funcs.values().any(|f| f.nodes.values().any(|nd| refused(f, nd))) {
        return Ok(None);
    }
    let mut out = g.clone();
    for f in out.funcs.values_mut() {
        if f.nodes.values().any(|nd| refused(f, nd)) {
            *f = rebuild(f, &|nd| refused(f, nd))?;
        }
    }
    Ok(Some(out))
}

/// `f` with the nodes `decompose` selects replaced by their decomposition.
fn rebuild(f: &Function, decompose: &dyn Fn(&sinter_ir::NodeData) -> bool) -> Result<Function, PassError> {
    let mut e = Emit { f: Function::new(f.name.clone()) };
    let mut map: HashMap<Value, Value> = HashMap::new();
    for &p in &f.params {
        let np = e.f.add_param(f.values[p].name.clone(), f.ty(p).clone());
        map.insert(p, np);
    }
    for nd in f.nodes.values() {
        let ins: Vec<Value> = nd.inputs.iter().map(|v| map[v]).collect();
        let results = if decompose(nd) {
            let r = match nd.op.kind {
                OpKind::Attention => e.attention(&nd.op, &ins),
                _ => e.paged_attention(&nd.op, &ins),
            };
            r.map_err(|m| PassError::Lower(format!("@{}: decomposing `{}`: {m}", f.name, nd.op.kind.name())))?
        } else {
            let tys: Vec<TensorType> = nd.results.iter().map(|&v| f.ty(v).clone()).collect();
            e.f.push_node(nd.op.clone(), ins, tys).1
        };
        for (old, new) in nd.results.iter().zip(results) {
            if e.f.values[new].name.is_none() {
                e.f.values[new].name = f.values[*old].name.clone();
            }
            map.insert(*old, new);
        }
    }
    e.f.outputs = f.outputs.iter().map(|v| map[v]).collect();
    Ok(e.f)
}

/// Appends typed nodes to a function.
struct Emit {
    f: Function,
}

type R<T> = Result<T, String>;

impl Emit {
    fn op(&mut self, kind: OpKind, ins: &[Value], attrs: Vec<(&str, Attr)>) -> R<Value> {
        let op = Op::new(kind, attrs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()).map_err(|e| e.to_string())?;
        let tys: Vec<&TensorType> = ins.iter().map(|&v| self.f.ty(v)).collect();
        let out = crate::lang::infer(&op, &tys, &BTreeMap::new())?;
        Ok(self.f.push_node(op, ins.to_vec(), out).1[0])
    }
    fn ty(&self, v: Value) -> TensorType {
        self.f.ty(v).clone()
    }
    fn cast(&mut self, x: Value, dt: DType) -> R<Value> {
        if self.f.ty(x).dtype == dt {
            return Ok(x);
        }
        self.op(OpKind::Cast, &[x], vec![("dtype", Attr::DType(dt))])
    }
    fn reshape(&mut self, x: Value, shape: Vec<Dim>) -> R<Value> {
        if self.f.ty(x).shape == shape {
            return Ok(x);
        }
        self.op(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(shape))])
    }
    fn permute(&mut self, x: Value, perm: &[i64]) -> R<Value> {
        self.op(OpKind::Permute, &[x], vec![("perm", Attr::Ints(perm.to_vec()))])
    }
    fn konst(&mut self, v: f64, dt: DType) -> R<Value> {
        self.op(OpKind::Constant, &[], vec![("value", Attr::Float(v)), ("dtype", Attr::DType(dt))])
    }
    fn bin(&mut self, k: OpKind, a: Value, b: Value) -> R<Value> {
        self.op(k, &[a, b], vec![])
    }
    fn iota(&mut self, shape: Vec<Dim>, axis: i64) -> R<Value> {
        self.op(OpKind::Iota, &[], vec![("dtype", Attr::DType(DType::I32)), ("shape", Attr::Dims(shape)), ("axis", Attr::Int(axis))])
    }
    fn reduce(&mut self, k: OpKind, x: Value, axis: i64, keepdim: bool) -> R<Value> {
        self.op(k, &[x], vec![("axis", Attr::Int(axis)), ("keepdim", Attr::Bool(keepdim))])
    }

    /// The i32 scalar-like value of `d` (shape `[1, 1]`): a constant, or for a symbolic `d`
    /// one more than the largest index of an `iota` of that length.
    fn dim_value(&mut self, d: &Dim) -> R<Value> {
        if let Some(c) = d.as_const() {
            return self.op(
                OpKind::Constant,
                &[],
                vec![("value", Attr::Float(c as f64)), ("dtype", Attr::DType(DType::I32)), ("shape", Attr::Dims(vec![Dim::constant(1), Dim::constant(1)]))],
            );
        }
        let i = self.iota(vec![Dim::constant(1), d.clone()], 1)?;
        let m = self.reduce(OpKind::ReduceMax, i, -1, true)?;
        let one = self.op(OpKind::Constant, &[], vec![("value", Attr::Float(1.0)), ("dtype", Attr::DType(DType::I32))])?;
        self.bin(OpKind::Add, m, one)
    }

    /// `O = dt(softmax(s) · v32)` (and the lse) from f32 scores `s` `[B, H, Sq, Skv]` and
    /// `v32` `[B, Hkv, Skv, Dv]`; results in `bhsd` order.
    fn finish(&mut self, s: Value, v32: Value, heads: i64, kv_heads: i64, dt: DType, lse: bool) -> R<Vec<Value>> {
        let ts = self.ty(s);
        let (b, sq, skv) = (ts.shape[0].clone(), ts.shape[2].clone(), ts.shape[3].clone());
        let g = heads / kv_heads;
        let p = self.op(OpKind::Softmax, &[s], vec![("axis", Attr::Int(-1))])?;
        let pg = self.reshape(p, vec![b.clone(), Dim::constant(kv_heads), Dim::constant(g).mul(&sq), skv])?;
        let o = self.op(OpKind::Matmul, &[pg, v32], vec![])?;
        let dv = self.ty(v32).shape[3].clone();
        let o = self.reshape(o, vec![b, Dim::constant(heads), sq, dv])?;
        let mut out = vec![self.cast(o, dt)?];
        if lse {
            // m + log Σ exp(s − m), with m taken as 0 where the row is all −inf.
            let m = self.reduce(OpKind::ReduceMax, s, -1, true)?;
            let ninf = self.konst(f64::NEG_INFINITY, DType::F32)?;
            let zero = self.konst(0.0, DType::F32)?;
            let empty = self.bin(OpKind::Eq, m, ninf)?;
            let m = self.op(OpKind::Select, &[empty, zero, m], vec![])?;
            let d = self.bin(OpKind::Sub, s, m)?;
            let ex = self.op(OpKind::Exp, &[d], vec![])?;
            let sum = self.reduce(OpKind::ReduceSum, ex, -1, true)?;
            let l = self.op(OpKind::Log, &[sum], vec![])?;
            let l = self.bin(OpKind::Add, m, l)?;
            let mut rows = self.ty(l).shape;
            rows.pop();
            out.push(self.reshape(l, rows)?);
        }
        Ok(out)
    }

    /// `scale · f32(q)·f32(k)ᵀ` with the query heads of each KV head stacked as rows:
    /// q `[B, H, Sq, D]`, k `[B, Hkv, Skv, D]` → `[B, H, Sq, Skv]` f32.
    fn scores(&mut self, q: Value, k32: Value, heads: i64, kv_heads: i64, scale: f64) -> R<Value> {
        let tq = self.ty(q);
        let (b, sq, d) = (tq.shape[0].clone(), tq.shape[2].clone(), tq.shape[3].clone());
        let skv = self.ty(k32).shape[2].clone();
        let q32 = self.cast(q, DType::F32)?;
        let qg = self.reshape(q32, vec![b.clone(), Dim::constant(kv_heads), Dim::constant(heads / kv_heads).mul(&sq), d])?;
        let s = self.op(OpKind::Matmul, &[qg, k32], vec![("transpose_b", Attr::Bool(true))])?;
        let s = self.reshape(s, vec![b, Dim::constant(heads), sq, skv])?;
        let c = self.konst(scale, DType::F32)?;
        self.bin(OpKind::Mul, s, c)
    }

    /// `select(j ≤ i + lim, s, −inf)` over the last two axes of `s`, `lim` an i32 value that
    /// broadcasts against `[.., Sq, 1]`; with a sliding window W also `select(i + lim − j <
    /// W, s, −inf)` (the difference, not `j > i + lim − W`, so that no i32 overflows).
    fn causal(&mut self, s: Value, lim: Value, window: Option<i64>) -> R<Value> {
        let ts = self.ty(s);
        let r = ts.rank();
        let sh = ts.shape[r - 2..].to_vec();
        let i = self.iota(sh.clone(), 0)?;
        let j = self.iota(sh, 1)?;
        let last = self.bin(OpKind::Add, i, lim)?;
        let keep = self.bin(OpKind::Le, j, last)?;
        let ninf = self.konst(f64::NEG_INFINITY, DType::F32)?;
        let s = self.op(OpKind::Select, &[keep, s, ninf], vec![])?;
        let Some(w) = window else { return Ok(s) };
        let back = self.bin(OpKind::Sub, last, j)?;
        let wv = self.op(OpKind::Constant, &[], vec![("value", Attr::Float(w as f64)), ("dtype", Attr::DType(DType::I32))])?;
        let inside = self.bin(OpKind::Lt, back, wv)?;
        self.op(OpKind::Select, &[inside, s, ninf], vec![])
    }

    /// `c · tanh(s / c)` (Gemma 2's logit soft-capping) with `softcap=c`, else `s`.
    fn softcap(&mut self, s: Value, op: &Op) -> R<Value> {
        let Some(c) = op.float("softcap") else { return Ok(s) };
        let cv = self.konst(c, DType::F32)?;
        let x = self.bin(OpKind::Div, s, cv)?;
        let t = self.op(OpKind::Tanh, &[x], vec![])?;
        self.bin(OpKind::Mul, t, cv)
    }

    fn attention(&mut self, op: &Op, ins: &[Value]) -> R<Vec<Value>> {
        let scale = op.float("scale").ok_or("no scale")?;
        let (heads, kv_heads) = (op.int("heads").ok_or("no heads")?, op.int("kv_heads").ok_or("no kv_heads")?);
        let bshd = op.str("layout") == Some("bshd");
        let lse = op.bool("lse").unwrap_or(false);
        let dt = self.ty(ins[0]).dtype;
        let swap = [0, 2, 1, 3];
        let [q, k, v] = [ins[0], ins[1], ins[2]].map(|x| if bshd { self.permute(x, &swap) } else { Ok(x) });
        let (q, k, v) = (q?, k?, v?);
        let k32 = self.cast(k, DType::F32)?;
        let v32 = self.cast(v, DType::F32)?;
        let mut s = self.scores(q, k32, heads, kv_heads, scale)?;
        s = self.softcap(s, op)?;
        if let Some(&m) = ins.get(3) {
            let m32 = self.cast(m, DType::F32)?;
            s = self.bin(OpKind::Add, s, m32)?;
        }
        if op.bool("causal") == Some(true) {
            let ts = self.ty(s);
            let (sq, skv) = (&ts.shape[2], &ts.shape[3]);
            let lim = match skv.sub(sq).as_const() {
                Some(c) => self.op(OpKind::Constant, &[], vec![("value", Attr::Float(c as f64)), ("dtype", Attr::DType(DType::I32))])?,
                None => {
                    let (a, b) = (self.dim_value(skv)?, self.dim_value(sq)?);
                    self.bin(OpKind::Sub, a, b)?
                }
            };
            s = self.causal(s, lim, op.int("window"))?;
        }
        let mut out = self.finish(s, v32, heads, kv_heads, dt, lse)?;
        if bshd {
            out[0] = self.permute(out[0], &swap)?;
            if lse {
                out[1] = self.permute(out[1], &[0, 2, 1])?;
            }
        }
        Ok(out)
    }

    fn paged_attention(&mut self, op: &Op, ins: &[Value]) -> R<Vec<Value>> {
        let scale = op.float("scale").ok_or("no scale")?;
        let (heads, kv_heads) = (op.int("heads").ok_or("no heads")?, op.int("kv_heads").ok_or("no kv_heads")?);
        let lse = op.bool("lse").unwrap_or(false);
        let (q, kp, vp, table, lens) = (ins[0], ins[1], ins[2], ins[3], ins[4]);
        let (tq, tp, tt) = (self.ty(q), self.ty(kp), self.ty(table));
        let dt = tq.dtype;
        let (b, t) = (tq.shape[0].clone(), tq.shape[2].clone());
        let n = tt.shape[1].mul(&tp.shape[1]); // M·S key slots per sequence
                                               // [B, M, S, Hkv, D] → [B, Hkv, M·S, D], in f32.
        let mut kv = vec![];
        for pages in [kp, vp] {
            let g = self.op(OpKind::Gather, &[pages, table], vec![])?;
            let tg = self.ty(g);
            let r = self.reshape(g, vec![b.clone(), n.clone(), tg.shape[3].clone(), tg.shape[4].clone()])?;
            let r = self.permute(r, &[0, 2, 1, 3])?;
            kv.push(self.cast(r, DType::F32)?);
        }
        let mut s = self.scores(q, kv[0], heads, kv_heads, scale)?;
        s = self.softcap(s, op)?;
        // Key j of sequence b is visible where j < len[b] (and, causal, j ≤ i + len[b] − T).
        let len = self.reshape(lens, vec![b.clone(), Dim::constant(1), Dim::constant(1), Dim::constant(1)])?;
        let j = self.iota(vec![Dim::constant(1), Dim::constant(1), Dim::constant(1), n.clone()], 3)?;
        let inside = self.bin(OpKind::Lt, j, len)?;
        let ninf = self.konst(f64::NEG_INFINITY, DType::F32)?;
        s = self.op(OpKind::Select, &[inside, s, ninf], vec![])?;
        if op.bool("causal") != Some(false) {
            let tv = self.dim_value(&t)?;
            let tv = self.reshape(tv, vec![Dim::constant(1), Dim::constant(1), Dim::constant(1), Dim::constant(1)])?;
            let lim = self.bin(OpKind::Sub, len, tv)?;
            s = self.causal(s, lim, op.int("window"))?;
        }
        self.finish(s, kv[1], heads, kv_heads, dt, lse)
    }
}
