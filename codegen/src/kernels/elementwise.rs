//! The element-wise kernel driver: the kernels of the pointwise, layout and gather families
//! (any fused element-wise DAG with views, written to outputs of one shape) are this one
//! grid-stride loop over output groups, each group's values computed by the evaluator.
//!
//! # Schedule
//! A thread handles `vec` consecutive elements of the innermost axis per step of a
//! grid-stride loop (`block` threads per CTA, grid `⌈numel / (vec·block)⌉`, so the loop
//! normally runs once; it stays correct if the runtime launches fewer CTAs).
//!
//! - **Flat** kernels — every value of the body has the outputs' element count or is a
//!   single element, every full-size buffer is contiguous, and the ops are element-wise or
//!   reshapes — index every buffer by the linear element index: `vec` is 16 bytes of the
//!   narrowest full-size buffer (8 for `bf16`, 4 for `f32`; at most 8, or 16 for `f8e4m3`),
//!   each full group is one 16-byte `ld.global.nc.v4` per input and one `st.global.v4` per
//!   output, and the last partial group (when `numel` is not provably a multiple of `vec`) is
//!   done element by element: the scalar tail.
//! - **Shaped** kernels (broadcasting, `iota`, `rope`, views) compute each group's
//!   coordinates from its linear index (div/mod by the output dims, constants folded) and
//!   vectorise along the innermost axis when its extent is provably a multiple of `vec`
//!   (else `vec` = 1); each operand load is a vector load when it is contiguous along that
//!   axis and aligned, else per element.
//! - **Paired** (a shaped kernel with a `rope` over the outputs' last axis of constant length
//!   `D`, `D/2` a multiple of `vec`): the loop runs over the outputs' shape with its last
//!   axis halved, and a group computes its `vec` elements `j…` and the `vec` elements `j +
//!   D/2…` (both groups' input loads issued first). Rotate-half: each is the other's RoPE
//!   partner: one load of each half, one sine/cosine per pair, two vector stores (see
//!   [`RopePair`]); interleaved (`vec ≥ 2`): two independent groups of adjacent pairs, one
//!   position load and one index computation for both. When the positions do not vary along
//!   the head axis (the one before the last: `[T, 1]` positions of `[T, H, D]`), a group
//!   also covers `k` consecutive heads (`k` = 4, 3 or 2, dividing `H`): its `4k` 16-byte
//!   loads are issued together and each pair's angle — the f64 reduction of
//!   [`crate::math::sincos_d`], about 28 instructions — is computed once for the `k` heads.
//!
//! Index arithmetic is 32-bit when every size is a constant and every buffer below 2³¹
//! elements, 64-bit otherwise (any symbolic size).
//!
//! Design notes: book/src/design/element-wise.md

use sinter_ir::{Dim, GridDim, LaunchPlan, Layout, OpClass, OpKind, Value, ValueDef};

use super::element::{divisible, At, Ax, Buf, Eval, RopePair, Tag};
use crate::kernels::ctx::{build_twice_occupancy, KernelCtx};
use crate::math::R;
use crate::target::Target;
use crate::error::CodegenError;

/// Threads per CTA and elements per thread-step of a pointwise kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct PointwiseSchedule {
    /// Threads per CTA (a multiple of 32, at most 1024).
    pub block: u32,
    /// Consecutive innermost elements per thread per step (a power of two ≤ 16); reduced
    /// automatically where the innermost extent is not provably a multiple of it.
    pub vec: u32,
}

impl PointwiseSchedule {
    /// The default block: 256 threads.
    pub const BLOCK: u32 = 256;
}


/// One output: the body value computed, the buffer written and the strides it is written
/// with (a trailing reshape of a contiguous output is peeled: the value before it is written
/// with contiguous strides of its own shape, the same storage order).
struct Out {
    value: Value,
    buffer: usize,
    strides: Vec<Dim>,
}

fn is_contiguous(shape: &[Dim], strides: &[Dim]) -> bool {
    let c = Layout::contiguous(shape).strides;
    shape.iter().zip(strides.iter().zip(&c)).all(|(d, (s, cs))| d.is_one() || s == cs)
}

/// The outputs with trailing reshapes peeled.
fn outputs(cx: &KernelCtx<'_>) -> R<Vec<Out>> {
    let body = &cx.data.body;
    let n_in = cx.data.inputs.len();
    let mut outs = Vec::new();
    for (j, &o) in body.outputs.iter().enumerate() {
        let b = cx.buffer(n_in + j)?;
        let mut value = o;
        let mut strides = b.layout.strides.clone();
        if is_contiguous(&b.ty.shape, &strides) {
            while let ValueDef::Result(n, _) = body.values[value].def {
                let nd = &body.nodes[n];
                if nd.op.kind != OpKind::Reshape {
                    break;
                }
                let Some(&x) = nd.inputs.first() else { break };
                value = x;
                strides = Layout::contiguous(&body.ty(x).shape).strides;
            }
        }
        outs.push(Out { value, buffer: n_in + j, strides });
    }
    Ok(outs)
}

/// Whether the flat (linear-index) schedule applies: see the module docs.
fn flat_shapes(cx: &KernelCtx<'_>, n: &Dim, outs: &[Out]) -> Option<std::collections::HashMap<Value, Vec<Dim>>> {
    let body = &cx.data.body;
    let one = Dim::constant(1);
    let mut shapes = std::collections::HashMap::new();
    for (v, d) in body.values.iter() {
        let numel = d.ty.numel();
        if &numel == n {
            shapes.insert(v, vec![n.clone()]);
        } else if numel == one {
            shapes.insert(v, vec![]);
        } else {
            return None;
        }
    }
    for (_, nd) in body.nodes.iter() {
        let ok = match nd.op.kind.info().class {
            OpClass::Unary | OpClass::Binary | OpClass::Compare => true,
            _ => matches!(nd.op.kind, OpKind::Swiglu | OpKind::Constant | OpKind::Broadcast | OpKind::Reshape),
        };
        if !ok {
            return None;
        }
    }
    for (i, &p) in body.params.iter().enumerate() {
        let b = cx.buffer(i).ok()?;
        if &body.ty(p).numel() == n && !is_contiguous(&b.ty.shape, &b.layout.strides) {
            return None;
        }
    }
    for o in outs {
        if !is_contiguous(&body.ty(o.value).shape, &o.strides) {
            return None;
        }
    }
    Some(shapes)
}

/// The element-wise kernel of `cx`: a pointwise, layout or gather kernel (see the module docs).
pub(crate) fn generate_elementwise(cx: &KernelCtx<'_>, target: &Target, schedule: Option<PointwiseSchedule>) -> Result<LaunchPlan, CodegenError> {
    let body = &cx.data.body;
    let mut outs = outputs(cx)?;
    if outs.is_empty() {
        return Err(cx.bad("the kernel has no outputs"));
    }
    let same = |outs: &[Out]| outs.iter().all(|o| body.ty(o.value).shape == body.ty(outs[0].value).shape);
    if !same(&outs) {
        // Peeling made the shapes differ: write every output through its own shape.
        outs = body
            .outputs
            .iter()
            .enumerate()
            .map(|(j, &o)| Ok(Out { value: o, buffer: cx.data.inputs.len() + j, strides: cx.buffer(cx.data.inputs.len() + j)?.layout.strides.clone() }))
            .collect::<R<Vec<Out>>>()?;
        if !same(&outs) {
            return Err(cx.unsupported("the outputs have different shapes"));
        }
    }
    let shape = body.ty(outs[0].value).shape.clone();
    let n = Dim::product(&shape);
    let flat = flat_shapes(cx, &n, &outs);
    // Vector width: 16 bytes of the narrowest full-size buffer (at most 8 elements, 16 where
    // that buffer is `f8e4m3`: a 16-byte access of fp8 activations, their wider side two).
    let mut min_size = usize::MAX;
    let mut fp8 = false;
    for (i, &p) in body.params.iter().enumerate() {
        if body.ty(p).numel() == n {
            let dt = cx.buffer(i)?.ty.dtype;
            min_size = min_size.min(dt.size_bytes());
            fp8 |= dt.is_fp8();
        }
    }
    for o in &outs {
        let dt = cx.buffer(o.buffer)?.ty.dtype;
        min_size = min_size.min(dt.size_bytes());
        fp8 |= dt.is_fp8();
    }
    let max_vec = if fp8 && min_size == 1 { 16 } else { 8 };
    let block = schedule.map_or(PointwiseSchedule::BLOCK, |s| s.block);
    if block == 0 || block % 32 != 0 || block > 1024 {
        return Err(cx.unsupported(format!("block {block} is not a multiple of 32 in 32..=1024")));
    }
    let mut vec = schedule.map_or_else(|| (16 / min_size.max(1)).clamp(1, max_vec) as u32, |s| s.vec);
    if !vec.is_power_of_two() || vec > 16 {
        return Err(cx.unsupported(format!("vec {vec} is not a power of two ≤ 16")));
    }
    if flat.is_none() {
        match shape.last() {
            None => vec = 1,
            Some(last) => {
                while vec > 1 && !divisible(last, vec) {
                    vec /= 2;
                }
            }
        }
    }
    // Rotate-half RoPE over the outputs' last axis: a thread takes `vec` elements of the
    // first half and the `vec` elements half an axis later (each the other's partner).
    let pair_half = if flat.is_none() { rope_pair_half(body, &shape, vec) } else { None };
    // ... and several heads of one position: one angle for all of them.
    let heads = if pair_half.is_some() { rope_heads(body, &shape) } else { 1 };
    let (loop_shape, loop_n) = match pair_half {
        Some(h) => {
            let mut ls = shape.clone();
            if let Some(l) = ls.last_mut() {
                *l = Dim::constant(h);
            }
            if heads > 1 {
                let a = ls.len() - 2;
                ls[a] = Dim::constant(ls[a].as_const().unwrap_or(0) / i64::from(heads));
            }
            let ln = Dim::product(&ls);
            (ls, ln)
        }
        None => (shape.clone(), n.clone()),
    };
    let width = cx.index_width();
    let entry = cx.entry();
    // The head-sharing schedule holds `4·heads` 16-byte vectors a thread: three CTAs of 256
    // threads per SM (at most 85 registers) keep every load of a group in flight together
    // (with fewer registers ptxas issues them in batches).
    let min_ctas = if heads > 1 { 3 } else { 1 };
    let (ptx, params) = build_twice_occupancy(cx, target, &entry, block, min_ctas, width, |kb, sizes| {
        let n_in = cx.data.inputs.len();
        let mut pbufs = Vec::with_capacity(n_in);
        for i in 0..n_in {
            let mut b = cx.buf(kb, i)?;
            if let Some(fs) = &flat {
                b.strides = if fs.get(&body.params[i]).is_some_and(|s| s.len() == 1) { vec![Dim::constant(1)] } else { vec![] };
            }
            pbufs.push(b);
        }
        let mut obufs = Vec::with_capacity(outs.len());
        for o in &outs {
            let mut b = cx.buf(kb, o.buffer)?;
            b.strides = if flat.is_some() { vec![Dim::constant(1)] } else { o.strides.clone() };
            obufs.push(b);
        }
        let mut ev = Eval::new(kb, sizes, body, pbufs, width);
        ev.bf16_words = super::element::words_params(body);
        if let Some(fs) = &flat {
            ev.shapes = fs.clone();
        }
        let pairing = pair_half.map(|half| Pairing { half, heads, out_shape: &shape });
        emit_loop(&mut ev, &loop_n, &loop_shape, vec, flat.is_some(), pairing, &outs, &obufs)
    })?;
    Ok(LaunchPlan {
        entry,
        ptx,
        target: *target,
        grid: [GridDim { numerator: loop_n, denominator: vec * block }, GridDim::fixed(1), GridDim::fixed(1)],
        block: [block, 1, 1],
        shared_bytes: 0,
        params,
    })
}

/// `Some(D/2)` when the body has a rotate-half `rope` over the outputs' last axis (of
/// constant length `D`, `D/2` a multiple of `vec`, every feature rotating): the paired schedule, where a thread
/// computes elements `j` and `j + D/2` of the last axis (see [`RopePair`]).
///
/// An interleaved `rope` (`vec ≥ 2`) takes the same schedule: its pairs are adjacent lanes, so
/// the two groups are independent, but a thread then has two 16-byte loads in flight (both
/// issued before any arithmetic, see [`emit_loop`]) and computes one position and one set of
/// coordinates for 2·`vec` elements — as many bytes in flight per thread as the rotate-half
/// form's (the interleaved kernel was latency-bound with one group per thread).
fn rope_pair_half(body: &sinter_ir::Function, shape: &[Dim], vec: u32) -> Option<i64> {
    let d = shape.last()?.as_const()?;
    if d < 2 || d % 2 != 0 || (d / 2) % i64::from(vec) != 0 {
        return None;
    }
    body.nodes
        .iter()
        .any(|(_, nd)| {
            sinter_ir::contract::is_rotation(nd.op.kind)
                && (nd.op.str("form") != Some("interleaved") || vec >= 2)
                && nd.op.int("rotary_dim").is_none_or(|r| r == d)
                && nd.inputs.first().is_some_and(|&x| body.ty(x).shape.last().and_then(Dim::as_const) == Some(d))
        })
        .then_some(d / 2)
}

/// The paired schedule of a RoPE kernel: each group covers `vec` elements of the last axis
/// and those `half` later, for `heads` consecutive heads (the axis before the last).
struct Pairing<'s> {
    half: i64,
    heads: u32,
    /// The outputs' shape (the loop's has its last axis halved and its head axis divided by
    /// `heads`).
    out_shape: &'s [Dim],
}

/// Heads per thread in the paired RoPE schedule: the largest of 4, 3, 2 that divides the
/// outputs' head axis (the one before the last, of constant length) when every `rope` of the
/// body rotates the outputs' shape with positions that do not vary along that axis (`[T,
/// 1]` broadcast over the heads of `[T, H, D]`); 1 otherwise. A thread then computes each
/// angle once for its heads: its sine and cosine (the f64 reduction of `math::sincos_d`,
/// about 28 instructions a pair) are shared by `heads` heads, and it has `2·heads` 16-byte
/// loads in flight.
fn rope_heads(body: &sinter_ir::Function, shape: &[Dim]) -> u32 {
    let rank = shape.len();
    let Some(h) = (rank >= 2).then(|| shape[rank - 2].as_const()).flatten() else { return 1 };
    let ropes: Vec<_> = body.nodes.iter().filter(|(_, nd)| nd.op.kind == OpKind::Rope).collect();
    let shared = !ropes.is_empty()
        && ropes.iter().all(|(_, nd)| {
            let (Some(&x), Some(&p)) = (nd.inputs.first(), nd.inputs.get(1)) else { return false };
            let ps = &body.ty(p).shape;
            body.ty(x).shape == shape && ps.last().is_none_or(Dim::is_one)
        });
    if !shared {
        return 1;
    }
    [4u32, 3, 2].into_iter().find(|&k| h % i64::from(k) == 0 && h >= i64::from(k)).unwrap_or(1)
}

/// The grid-stride loop over groups of `vec` elements, and the stores. `shape` and `n` are
/// the loop's index space: the outputs' shape, or (`pairing` set) the outputs' shape with
/// its last axis halved (and its head axis divided by the heads per group), each group then
/// covering its elements and those half an axis later, for each of its heads.
#[allow(clippy::too_many_arguments)]
fn emit_loop<'ctx>(ev: &mut Eval<'_, 'ctx>, n: &Dim, shape: &[Dim], vec: u32, flat: bool, pairing: Option<Pairing<'_>>, outs: &[Out], obufs: &[Buf<'ctx>]) -> R<()> {
    let ity = ev.ity();
    // Prologue: first group and stride.
    let tid = ev.kb.tid_x()?;
    let ntid = ev.kb.ntid_x()?;
    let ctaid = ev.kb.ctaid_x()?;
    let nctaid = ev.kb.nctaid_x()?;
    let numel = ev.dim(n)?;
    let (g0, gs, groups) = ev.kb.in_prologue(|kb| {
        let z = |v| kb.b.build_int_z_extend_or_bit_cast(v, ity, "w");
        let (tid, ntid, ctaid, nctaid) = (z(tid)?, z(ntid)?, z(ctaid)?, z(nctaid)?);
        let g0 = kb.b.build_int_add(kb.b.build_int_mul(ctaid, ntid, "cs")?, tid, "g0")?;
        let gs = kb.b.build_int_mul(nctaid, ntid, "gs")?;
        let vm1 = ity.const_int(u64::from(vec - 1), false);
        let v = ity.const_int(u64::from(vec), false);
        let groups = kb.b.build_int_unsigned_div(kb.b.build_int_add(numel, vm1, "n")?, v, "groups")?;
        Ok((g0, gs, groups))
    })?;
    let pre = ev.kb.current_block()?;
    let header = ev.kb.block("loop");
    let bodyb = ev.kb.block("group");
    let exit = ev.kb.block("exit");
    ev.kb.br(header)?;
    ev.kb.position(header);
    let g = ev.kb.b.build_phi(ity, "g")?;
    g.add_incoming(&[(&g0, pre)]);
    let gv = g.as_basic_value().into_int_value();
    let more = ev.kb.b.build_int_compare(inkwell::IntPredicate::ULT, gv, groups, "more")?;
    ev.kb.cond_br(more, bodyb, exit)?;
    ev.kb.position(bodyb);
    let e0 = ev.imul(gv, ev.ic(i64::from(vec)))?;
    if flat {
        let at = At { axes: vec![Ax { base: e0, step: vec > 1, aligned: true, zero: false, tag: Tag::Other }], lanes: vec };
        if divisible(n, vec) {
            ev.forget();
            store_all(ev, &at, outs, obufs)?;
        } else {
            // Full groups vectorised; the last, partial one element by element.
            let full_bb = ev.kb.block("full");
            let tail_bb = ev.kb.block("tail");
            let join = ev.kb.block("join");
            let end = ev.iadd(e0, ev.ic(i64::from(vec)))?;
            let full = ev.kb.b.build_int_compare(inkwell::IntPredicate::ULE, end, numel, "full")?;
            ev.kb.cond_br(full, full_bb, tail_bb)?;
            ev.kb.position(full_bb);
            ev.forget();
            store_all(ev, &at, outs, obufs)?;
            ev.kb.br(join)?;
            ev.kb.position(tail_bb);
            for l in 0..vec {
                let e = ev.iadd(e0, ev.ic(i64::from(l)))?;
                let ok = ev.kb.b.build_int_compare(inkwell::IntPredicate::ULT, e, numel, "ok")?;
                let one = ev.kb.block("one");
                let next = ev.kb.block("next");
                ev.kb.cond_br(ok, one, next)?;
                ev.kb.position(one);
                ev.forget();
                let at1 = At { axes: vec![Ax { base: e, step: false, aligned: true, zero: false, tag: Tag::Other }], lanes: 1 };
                store_all(ev, &at1, outs, obufs)?;
                ev.kb.br(next)?;
                ev.kb.position(next);
            }
            ev.kb.br(join)?;
            ev.kb.position(join);
        }
    } else {
        // Coordinates of the group's first element, innermost first.
        let rank = shape.len();
        let mut axes = vec![ev.zero_ax(); rank];
        let mut rem = e0;
        for a in (0..rank).rev() {
            let d = &shape[a];
            if d.is_one() {
                continue;
            }
            let outer_all_one = shape[..a].iter().all(Dim::is_one);
            let (c, next) = if outer_all_one {
                (rem, rem)
            } else {
                let dv = ev.dim(d)?;
                (ev.irem(rem, dv)?, ev.idiv(rem, dv)?)
            };
            let lane = a == rank - 1 && vec > 1;
            axes[a] = Ax { base: c, step: lane, aligned: lane, zero: false, tag: Tag::Other };
            rem = next;
        }
        let at = At { axes, lanes: if rank == 0 { 1 } else { vec } };
        ev.forget();
        match pairing {
            Some(Pairing { half: h, heads, out_shape }) if rank > 0 => {
                let first = at.axes[rank - 1].base;
                let second = ev.iadd(first, ev.ic(h))?;
                ev.rope_pair = Some(RopePair { first, second, d: 2 * h });
                // The group's coordinates: its heads (head axis `hb·heads + j`), each at its
                // two halves.
                let mut ats = Vec::with_capacity(2 * heads as usize);
                for j in 0..heads {
                    let mut a1 = at.clone();
                    if heads > 1 {
                        let hb = at.axes[rank - 2].base;
                        let hj = ev.imul(hb, ev.ic(i64::from(heads)))?;
                        let hj = ev.iadd(hj, ev.ic(i64::from(j)))?;
                        a1.axes[rank - 2] = Ax { base: hj, step: false, aligned: false, zero: false, tag: Tag::Other };
                    }
                    let mut a2 = a1.clone();
                    a2.axes[rank - 1].base = second;
                    ats.push(a1);
                    ats.push(a2);
                }
                // Every group's loads of the full-shape inputs first (memoised), so that they
                // are in flight together.
                let full: Vec<Value> = ev
                    .f
                    .params
                    .iter()
                    .copied()
                    .filter(|&p| {
                        let ps = &ev.f.ty(p).shape;
                        ps.len() == rank && ps[rank - 1].as_const() == Some(2 * h) && ps[..rank - 1] == out_shape[..rank - 1]
                    })
                    .collect();
                for p in full {
                    for a in &ats {
                        ev.eval(p, a)?;
                    }
                }
                for a in &ats {
                    store_all(ev, a, outs, obufs)?;
                }
                ev.rope_pair = None;
            }
            _ => store_all(ev, &at, outs, obufs)?,
        }
    }
    // Latch.
    let next = ev.iadd(gv, gs)?;
    let latch = ev.kb.current_block()?;
    g.add_incoming(&[(&next, latch)]);
    ev.kb.br(header)?;
    ev.kb.position(exit);
    ev.kb.ret()
}

fn store_all<'ctx>(ev: &mut Eval<'_, 'ctx>, at: &At<'ctx>, outs: &[Out], obufs: &[Buf<'ctx>]) -> R<()> {
    for (o, b) in outs.iter().zip(obufs) {
        let vals = ev.eval(o.value, at)?;
        ev.store(b, at, &vals)?;
    }
    Ok(())
}
