//! What a matmul kernel's epilogue reads of the matmul's result — the one analysis that the
//! code generator (which tiles by it) and the passes (whose contract predicts what the
//! generator accepts) share.
//!
//! A Matmul kernel body holds one `matmul` node with result `R [batch.., M, N]` and an
//! epilogue computed from `R`, the other kernel inputs and constants. [`analyse`] sorts the
//! epilogue into one of three modes ([`MatmulEpilogue`]), or names what no mode covers:
//!
//! - **direct** — every output is `R` or an element-wise function of `R` at the same
//!   coordinate, of `R`'s shape (bias, residual add, `cast`, `gelu`, …);
//! - **columns** — each output comes from one column segment of `R` (a `slice` of its last
//!   axis, or all of `R`, possibly after element-wise ops of all of `R` such as a QKV bias)
//!   through element-wise ops, `reshape`s and `rope` or `rotary` (a merged QKV projection with
//!   RoPE on Q and K, angles from positions or cos/sin tables); an output may also be a result
//!   of a `kv_append` whose new rows are such values (the projection writes K and V into the
//!   paged cache: PagedAttention, Kwon et al. 2023), scattered through the block table instead
//!   of written row-major;
//! - **paired** — the outputs combine 2 or 4 equal-width column segments of `R` element-wise
//!   (SwiGLU over a merged gate/up projection).
//!
//! Anything else — a reduction of `R`, a transpose, a broadcast of a value computed from `R`,
//! ropes of two head dims — is an error naming the op.

use std::collections::{BTreeSet, HashMap};

use crate::{Dim, Function, Node, OpClass, OpKind, Value};

/// A column segment of the matmul's result: columns `start .. start + width` (the whole
/// result: `0 .. N`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Seg {
    /// First column.
    pub start: Dim,
    /// Number of columns.
    pub width: Dim,
}

/// An output of a columns epilogue that is a result of a `kv_append` (the updated K or V
/// pages): written by scattering `new` (its row-major elements `[B, T, Hkv, D]` being the
/// segment's `[rows, width]`) into the pages through the block table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Append {
    /// The `kv_append` node.
    pub node: Node,
    /// Which result (0: K pages, 1: V pages).
    pub which: usize,
    /// The new rows written (`k_new` or `v_new`, computed from the segment).
    pub new: Value,
}

/// How a matmul kernel's epilogue reads the matmul's result `R` (see the module docs).
#[derive(Clone, Debug)]
pub enum MatmulEpilogue {
    /// Every output is `R` or an element-wise function of `R` at the same coordinate, with
    /// `R`'s shape.
    Direct,
    /// Each output comes from one column segment of `R` (`segs[j]` for output `j`) through
    /// element-wise ops, `reshape`s and `rope`; `rope_d` (1 without rope) divides every
    /// segment's start and width. `appends[j]` is set for an output that is a `kv_append`
    /// result.
    Columns {
        /// The segment of each output.
        segs: Vec<Seg>,
        /// The RoPE head dim (1: no rope).
        rope_d: i64,
        /// Per output: the `kv_append` it is a result of, if any.
        appends: Vec<Option<Append>>,
    },
    /// The outputs combine `segs.len()` column segments of `R` of one width element-wise.
    Paired {
        /// Each segment's `slice` value in the body and its index into `segs`.
        slices: Vec<(Value, usize)>,
        /// The distinct segments, by start.
        segs: Vec<Seg>,
        /// Their common width.
        width: Dim,
    },
}

impl MatmulEpilogue {
    /// Whether the epilogue reads the accumulator tile from shared memory (every mode but
    /// [`MatmulEpilogue::Direct`]).
    pub fn staged(&self) -> bool {
        !matches!(self, MatmulEpilogue::Direct)
    }
}

/// Classifies the epilogue of `body`, whose matmul result is `r` (see the module docs).
///
/// # Errors
/// What no mode covers, in words (the op and why).
pub fn analyse(body: &Function, r: Value) -> Result<MatmulEpilogue, String> {
    let r_ty = body.ty(r);
    let rank = r_ty.rank();
    if rank < 2 {
        return Err(format!("a matmul result of rank {rank}"));
    }
    let full = Seg { start: Dim::constant(0), width: r_ty.shape[rank - 1].clone() };
    let mut segs: HashMap<Value, BTreeSet<Seg>> = HashMap::new();
    segs.insert(r, BTreeSet::from([full.clone()]));
    let mut rope_d: Option<i64> = None;
    let mut reshaped = false;
    let mut slices: Vec<(Value, Seg)> = Vec::new();
    let mut sliced_derived = false;
    let mut kv_appends: Vec<Node> = Vec::new();
    for (node, nd) in body.nodes.iter() {
        if nd.op.kind == OpKind::Matmul {
            continue;
        }
        let derived: Vec<usize> = (0..nd.inputs.len()).filter(|&i| segs.contains_key(&nd.inputs[i])).collect();
        if derived.is_empty() {
            continue;
        }
        if nd.op.kind == OpKind::KvAppend {
            if derived.iter().any(|&i| i != 2 && i != 3) {
                return Err(format!("{node} `kv_append` whose pages, block table or positions are computed from the matmul's result"));
            }
            kv_appends.push(node);
            continue;
        }
        let res = match nd.results.as_slice() {
            [v] => *v,
            _ => return Err(format!("{node} `{}` has {} results", nd.op.kind.name(), nd.results.len())),
        };
        let res_shape = &body.ty(res).shape;
        let set = match nd.op.kind {
            OpKind::Slice => {
                let axis = nd.op.int("axis").ok_or("slice without an axis")?;
                let axis = crate::infer::norm_axis(axis, body.ty(nd.inputs[0]).rank()).map_err(|e| e.to_string())?;
                // A column slice of R, or of a value computed from all of R element by element
                // (same columns).
                let x = nd.inputs[0];
                if segs[&x] != BTreeSet::from([full.clone()]) || body.ty(x).shape != r_ty.shape || axis != rank - 1 {
                    return Err("a slice in the epilogue that is not a column slice of the matmul's result".into());
                }
                if x != r {
                    sliced_derived = true;
                }
                let start = nd.op.dim("start").ok_or("slice without start")?.clone();
                let end = nd.op.dim("end").ok_or("slice without end")?.clone();
                let seg = Seg { width: end.sub(&start), start };
                slices.push((res, seg.clone()));
                BTreeSet::from([seg])
            }
            OpKind::Reshape => {
                reshaped = true;
                segs[&nd.inputs[0]].clone()
            }
            OpKind::Rope | OpKind::Rotary => {
                if derived != [0] {
                    let what = if nd.op.kind == OpKind::Rope { "rope positions" } else { "rotary cos/sin tables" };
                    return Err(format!("{what} computed from the matmul's result"));
                }
                let d = body.ty(nd.inputs[0]).shape.last().and_then(Dim::as_const).ok_or("rope over a symbolic last axis")?;
                if rope_d.is_some_and(|x| x != d) {
                    return Err("ropes of two head dims in one epilogue".into());
                }
                rope_d = Some(d);
                segs[&nd.inputs[0]].clone()
            }
            k if matches!(k.info().class, OpClass::Unary | OpClass::Binary | OpClass::Compare) || matches!(k, OpKind::Swiglu | OpKind::Broadcast) => {
                let mut set = BTreeSet::new();
                for &i in &derived {
                    if &body.ty(nd.inputs[i]).shape != res_shape {
                        return Err(format!("`{}` broadcasts a value computed from the matmul's result", k.name()));
                    }
                    set.extend(segs[&nd.inputs[i]].iter().cloned());
                }
                set
            }
            other => return Err(format!("`{}` on the matmul's result (the epilogue takes element-wise ops, column slices, reshapes, rope and kv_append)", other.name())),
        };
        segs.insert(res, set);
    }
    // Per output: the value whose segment it takes (a kv_append result takes its new rows').
    let mut appends: Vec<Option<Append>> = Vec::new();
    let mut out_vals: Vec<Value> = Vec::new();
    for &o in &body.outputs {
        let found = kv_appends.iter().find_map(|&n| body.nodes[n].results.iter().position(|&x| x == o).map(|w| (n, w)));
        match found {
            Some((node, which)) => {
                let new = body.nodes[node].inputs[2 + which];
                if !segs.contains_key(&new) {
                    return Err(format!("output {}: kv_append rows not computed from the matmul's result", body.label(o)));
                }
                appends.push(Some(Append { node, which, new }));
                out_vals.push(new);
            }
            None => {
                appends.push(None);
                out_vals.push(o);
            }
        }
    }
    let mut out_sets = Vec::new();
    for (&o, &v) in body.outputs.iter().zip(&out_vals) {
        out_sets.push(segs.get(&v).ok_or_else(|| format!("output {} does not depend on the matmul", body.label(o)))?);
    }
    let any_append = appends.iter().any(Option::is_some);
    if !any_append && slices.is_empty() && rope_d.is_none() && !reshaped && body.outputs.iter().all(|&o| body.ty(o).shape == r_ty.shape) {
        return Ok(MatmulEpilogue::Direct);
    }
    // Every output (or appended value) is [batch.., M, width] in row-major order.
    let rows = Dim::product(&r_ty.shape[..rank - 1]);
    let fits = |v: Value, width: &Dim| Dim::product(&body.ty(v).shape) == rows.mul(width);
    if segs.values().all(|s| s.len() == 1) {
        let d = rope_d.unwrap_or(1);
        if d > 1 && 64 % d != 0 && d != 128 && d != 256 {
            return Err(format!("rope over {d} columns (head dims dividing 64, or 128 or 256, are supported)"));
        }
        let mut per_out = Vec::new();
        for ((&o, &v), set) in body.outputs.iter().zip(&out_vals).zip(&out_sets) {
            let seg = set.iter().next().ok_or("an output without a segment")?.clone();
            if !fits(v, &seg.width) {
                return Err(format!("output {} is not a row-major view of its columns of the matmul's result", body.label(o)));
            }
            if d > 1 && (seg.start.div_exact(d).is_none() || seg.width.div_exact(d).is_none()) {
                return Err(format!("rope heads of {d} columns do not align with the columns {}..{}+{}", seg.start, seg.start, seg.width));
            }
            per_out.push(seg);
        }
        for a in appends.iter().flatten() {
            if body.ty(a.new).rank() != 4 {
                return Err(format!("kv_append rows {} are not [B, T, Hkv, D]", body.label(a.new)));
            }
        }
        return Ok(MatmulEpilogue::Columns { segs: per_out, rope_d: d, appends });
    }
    if any_append {
        return Err("a kv_append in an epilogue that combines column segments".into());
    }
    if rope_d.is_some() || sliced_derived {
        return Err("an epilogue that combines column segments, with rope or with slices of computed values".into());
    }
    let distinct: Vec<Seg> = segs.iter().filter(|(v, _)| **v != r).flat_map(|(_, s)| s.iter().cloned()).collect::<BTreeSet<_>>().into_iter().collect();
    if distinct.contains(&full) || !matches!(distinct.len(), 2 | 4) {
        return Err(format!("an epilogue combining {} column segments of the matmul's result (2 or 4 slices of one width are supported)", distinct.len()));
    }
    let width = distinct[0].width.clone();
    if distinct.iter().any(|s| s.width != width) {
        return Err("combined column segments of different widths".into());
    }
    for &o in &body.outputs {
        if !fits(o, &width) {
            return Err(format!("output {} is not a row-major view of the combined columns", body.label(o)));
        }
    }
    let slices = slices.into_iter().map(|(v, seg)| (v, distinct.iter().position(|d| *d == seg).unwrap_or(0))).collect();
    Ok(MatmulEpilogue::Paired { slices, segs: distinct, width })
}
