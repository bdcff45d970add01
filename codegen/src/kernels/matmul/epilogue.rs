//! The epilogue of every matmul kernel: evaluating the body's element-wise tail from the f32
//! accumulators through the shared element evaluator and storing the outputs — from
//! registers (direct), or from the CTA's tile staged in shared memory (columns, paired; the
//! `kv_append` scatter into the paged cache).
//!
//! Design notes: book/src/design/matmul.md

use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{Dim, Function, Value};
use sinter_ir::epilogue::{self, MatmulEpilogue as Epi};

use super::schedule::TiledSchedule;
use super::spec::{Spec, MmaPlan, Bases};
use crate::isa::kit::{Kit, R};
use crate::kernels::element::{At, Ax, Buf, Eval, Scalar, Tag};
use crate::error::CodegenError;

/// Evaluates the epilogue at output element (m, n) from the f32 accumulator — the matmul
/// result rounded once to its dtype, then the body's element-wise nodes through the shared
/// element evaluator ([`Eval`]) — and stores every output there. The caller
/// has checked m < M and n < N.
pub(super) fn epilogue_and_store<'ctx>(kit: &Kit<'ctx>, spec: &Spec, bases: &Bases<'ctx>, m: IntValue<'ctx>, n: IntValue<'ctx>, acc: FloatValue<'ctx>) -> R<()> {
    epilogue_and_store_accs(kit, spec, bases, m, n, &[acc])
}

/// [`epilogue_and_store`] with one accumulator per segment (a paired epilogue: `accs[s]` is
/// segment `s`'s column `n`; each slice the epilogue reads gets its segment's value) or one
/// (direct).
pub(super) fn epilogue_and_store_accs<'ctx>(kit: &Kit<'ctx>, spec: &Spec, bases: &Bases<'ctx>, m: IntValue<'ctx>, n: IntValue<'ctx>, accs: &[FloatValue<'ctx>]) -> R<()> {
    let rank = spec.batch.len() + 2;
    // Each accumulator, as a one-element "buffer" of the matmul's dtype read at offset 0: a
    // store and a load of a private alloca, which SROA folds into a rounding to the dtype.
    let per_param: Vec<FloatValue<'ctx>> = match &spec.epi {
        Epi::Paired { slices, .. } => slices.iter().map(|(_, si)| accs.get(*si).copied().ok_or_else(|| kit.err("no accumulator for a segment"))).collect::<R<_>>()?,
        _ => vec![*accs.first().ok_or_else(|| kit.err("no accumulator"))?],
    };
    let mut results = Vec::with_capacity(per_param.len());
    for acc in per_param {
        let slot = kit.private_slot(spec.dtype)?;
        kit.store_vec(spec.dtype, slot, kit.i64c(0), &[acc])?;
        results.push(Buf { ptr: slot, dtype: spec.dtype, strides: vec![Dim::constant(0); rank], align: 16 });
    }
    eval_outputs(kit, spec, bases, m, n, results, 1)
}

/// A direct epilogue at the two output elements `(m, n)`, `(m, n + 1)` (`n` even; the caller
/// has checked both exist) from their accumulators `vals`: evaluated as two lanes, so that
/// loads of epilogue inputs and stores of outputs become 4-byte (bf16) or 8-byte (f32)
/// vector accesses wherever the layouts allow (the element evaluator decides, and accesses
/// lane by lane otherwise).
pub(super) fn epilogue_and_store_pair<'ctx>(kit: &Kit<'ctx>, spec: &Spec, bases: &Bases<'ctx>, m: IntValue<'ctx>, n: IntValue<'ctx>, vals: [FloatValue<'ctx>; 2]) -> R<()> {
    let rank = spec.batch.len() + 2;
    // R at (.., m, n + l) is slot[l]: a buffer based at slot − n with strides (0.., 0, 1).
    let slot = kit.private_slots(spec.dtype, 2)?;
    kit.store_vec(spec.dtype, slot, kit.i64c(0), &vals)?;
    let strides = (0..rank).map(|i| Dim::constant(i64::from(i == rank - 1))).collect();
    let es = spec.dtype.size_bytes() as u32;
    let result = Buf { ptr: kit.gep_raw(spec.dtype, slot, kit.sub(kit.i64c(0), n)?)?, dtype: spec.dtype, strides, align: 2 * es };
    eval_outputs(kit, spec, bases, m, n, vec![result], 2)
}

/// Evaluates every output of a direct (or small-M paired) epilogue at `lanes` elements from
/// `(m, n)` along the last axis (`n` a multiple of `lanes`) and stores it; `results` are the
/// evaluator's buffers for the values that stand for the matmul's result (see
/// [`Spec::epilogue`]).
#[allow(clippy::too_many_arguments)]
pub(super) fn eval_outputs<'ctx>(kit: &Kit<'ctx>, spec: &Spec, bases: &Bases<'ctx>, m: IntValue<'ctx>, n: IntValue<'ctx>, results: Vec<Buf<'ctx>>, lanes: u32) -> R<()> {
    let mut bufs = Vec::with_capacity(spec.n_buffers + results.len());
    for (i, info) in spec.buffers.iter().enumerate().take(spec.n_inputs) {
        bufs.push(Buf { ptr: kit.buf(i)?, dtype: info.dtype, strides: info.strides.clone(), align: info.align });
    }
    bufs.extend(results);
    let outs: Vec<(Value, Buf)> = spec
        .epilogue
        .outputs
        .iter()
        .enumerate()
        .map(|(j, &v)| {
            let info = &spec.buffers[spec.n_inputs + j];
            Ok((v, Buf { ptr: kit.buf(spec.n_inputs + j)?, dtype: info.dtype, strides: info.strides.clone(), align: info.align }))
        })
        .collect::<R<_>>()?;
    kit.with_eval(&spec.epilogue, bufs, |ev| {
        let mut axes: Vec<_> = bases.coords.iter().map(|&c| ev.uniform_ax(c)).collect();
        axes.push(ev.uniform_ax(m));
        axes.push(if lanes == 1 { ev.uniform_ax(n) } else { Ax { base: n, step: true, aligned: true, zero: false, tag: Tag::Other } });
        let at = At { axes, lanes };
        for (v, buf) in &outs {
            let vals = ev.eval(*v, &at)?;
            ev.store(buf, &at, &vals)?;
        }
        Ok(())
    })
    .map_err(|e| name_error(e, &spec.kernel_name))
}

/// Puts the kernel's name into an evaluator error, which does not know it.
pub(super) fn name_error(e: CodegenError, kernel: &str) -> CodegenError {
    match e {
        CodegenError::Unsupported { kernel: k, message } if k.is_empty() => {
            CodegenError::Unsupported { kernel: format!("{kernel} (Matmul)"), message: format!("in the epilogue: {message}") }
        }
        CodegenError::BadKernel { kernel: k, message } if k.is_empty() => CodegenError::BadKernel { kernel: format!("{kernel} (Matmul)"), message },
        other => other,
    }
}

/// The epilogue of [`Epi::Columns`] and [`Epi::Paired`] for the tiled kernel: thread
/// `(ty, tx)` stages its micro-tile (rows `ty·tm..`, columns `tx·tn..`), rounded to the
/// matmul's dtype, into the CTA's tile in shared memory, then [`staged_outputs`] writes every
/// output from it.
#[allow(clippy::too_many_arguments)]
pub(super) fn staged_epilogue<'ctx>(
    kit: &Kit<'ctx>,
    spec: &Spec,
    s: &TiledSchedule,
    smem: PointerValue<'ctx>,
    cta: (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    acc: &[PointerValue<'ctx>],
    (tid, tx, ty): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
) -> R<()> {
    let dt = spec.dtype;
    let es = dt.size_bytes() as i32;
    // The k loop ended on a barrier, so the slabs' memory is free.
    for i in 0..s.tm {
        let row = kit.add(kit.mul(ty, kit.i32c(s.tm as i32))?, kit.i32c(i as i32))?;
        let e = kit.add(kit.mul(row, kit.i32c(s.bn as i32))?, kit.mul(tx, kit.i32c(s.tn as i32))?)?;
        let vals: Vec<FloatValue> = (0..s.tn).map(|j| kit.get_f(acc[(i * s.tn + j) as usize])).collect::<R<_>>()?;
        kit.sh_store(dt, kit.sh_at(smem, kit.mul(e, kit.i32c(es))?)?, &vals)?;
    }
    kit.barrier()?;
    staged_outputs(kit, spec, StagedTile { bm: s.bm, bn: s.bn, pitch: s.bn, threads: s.threads() }, smem, cta, tid)
}

/// The CTA's accumulator tile staged in shared memory for a staged epilogue: `bm × bn`
/// elements of the matmul's dtype, row `r` at element `r·pitch`, read by `threads` threads.
#[derive(Clone, Copy, Debug)]
pub(super) struct StagedTile {
    pub(super) bm: u32,
    pub(super) bn: u32,
    pub(super) pitch: u32,
    pub(super) threads: u32,
}

/// The outputs of [`Epi::Columns`] and [`Epi::Paired`] from the CTA's accumulator tile, which
/// the caller has staged in shared memory at `smem` (rounded to the matmul's dtype; virtual
/// columns as [`tile_column`](super::spec::tile_column) maps them: R's columns `tile·bn + v`, or for Paired segment
/// `v / sub`'s columns `tile·sub + v mod sub` with `sub = bn / segments`) and made visible
/// with a barrier: the threads walk the tile's elements and evaluate every output whose
/// element it is, through the element evaluator, reading R (or the segments) from the tile.
pub(super) fn staged_outputs<'ctx>(kit: &Kit<'ctx>, spec: &Spec, t: StagedTile, smem: PointerValue<'ctx>, (m0, tile, z): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>), tid: IntValue<'ctx>) -> R<()> {
    let dt = spec.dtype;
    let es = dt.size_bytes() as i32;
    let bn = t.bn as i32;
    // The element evaluator reads R (Columns) or each segment (Paired) from the tile: a
    // "buffer" whose element (.., m, c) is tile[(m − m0)·pitch + (c − c0)] (+ the segment's
    // block), i.e. based at tile − (m0·pitch + c0) with strides (0.., pitch, 1).
    let rank = spec.batch.len() + 2;
    let tile_strides: Vec<Dim> = (0..rank).map(|i| Dim::constant(if i == rank - 2 { i64::from(t.pitch) } else if i == rank - 1 { 1 } else { 0 })).collect();
    let row_base = kit.mul(m0, kit.i64c(i64::from(t.pitch)))?;
    let tile_buf = |k: &Kit<'ctx>, first_col: IntValue<'ctx>, block: i64| -> R<Buf<'ctx>> {
        let shift = k.sub(k.i64c(block), k.add(row_base, first_col)?)?;
        Ok(Buf { ptr: k.gep_raw(dt, smem, shift)?, dtype: dt, strides: tile_strides.clone(), align: es as u32 })
    };
    let mdim = kit.dim(&spec.m)?;
    let n_out = spec.n_buffers - spec.n_inputs;
    let total = (t.bm * t.bn) as i32;
    kit.for_range(tid, kit.i32c(total), kit.i32c(t.threads as i32), |k, e| {
        let r = k.udiv(e, k.i32c(bn))?;
        let v = k.urem(e, k.i32c(bn))?;
        let m = k.add(m0, k.zext64(r)?)?;
        let m_ok = k.icmp(IntPredicate::SLT, m, mdim)?;
        // (output index, element valid, column within its segment, segment width)
        let mut todo = Vec::new();
        let mut extra = Vec::new();
        let mut appends: &[Option<epilogue::Append>] = &[];
        match &spec.epi {
            Epi::Columns { segs, appends: a, .. } => {
                appends = a;
                let n = k.add(k.mul(tile, k.i64c(i64::from(t.bn)))?, k.zext64(v)?)?;
                let n_ok = k.and(m_ok, k.icmp(IntPredicate::SLT, n, k.dim(&spec.n)?)?)?;
                for (j, seg) in segs.iter().enumerate() {
                    let (a, w) = (k.dim(&seg.start)?, k.dim(&seg.width)?);
                    let c = k.sub(n, a)?;
                    let inside = k.and(k.icmp(IntPredicate::SGE, c, k.i64c(0))?, k.icmp(IntPredicate::SLT, c, w)?)?;
                    todo.push((j, k.and(n_ok, inside)?, c, w));
                }
                extra.push(tile_buf(k, k.mul(tile, k.i64c(i64::from(t.bn)))?, 0)?);
            }
            Epi::Paired { slices, segs, width } => {
                let sub = t.bn / segs.len() as u32;
                let jj = k.add(k.mul(tile, k.i64c(i64::from(sub)))?, k.zext64(v)?)?;
                let w = k.dim(width)?;
                let ok = k.and(m_ok, k.and(k.icmp(IntPredicate::ULT, v, k.i32c(sub as i32))?, k.icmp(IntPredicate::SLT, jj, w)?)?)?;
                for j in 0..n_out {
                    todo.push((j, ok, jj, w));
                }
                let first = k.mul(tile, k.i64c(i64::from(sub)))?;
                for (_, si) in slices {
                    extra.push(tile_buf(k, first, (*si as i64) * i64::from(sub))?);
                }
            }
            Epi::Direct => return Err(k.err("a direct epilogue is not staged")),
        }
        for (j, ok, c, w) in todo {
            let append = appends.get(j).cloned().flatten();
            k.if_then(ok, |k| columns_output(k, spec, j, append.as_ref(), (z, m, c, w), extra.clone()))?;
        }
        Ok(())
    })
}

/// Writes output `j` of a columns epilogue at its element for R's row `m` of batch `z` and
/// column `c` of the output's segment (of width `w`): the output's coordinate is the
/// row-major position `(z·M + m)·w + c` unravelled over its shape (for a `kv_append` result,
/// over its new rows' shape, then scattered into the pages). `extra` are the evaluator's
/// buffers after the kernel inputs (R, as the caller stages it).
pub(super) fn columns_output<'ctx>(
    k: &Kit<'ctx>,
    spec: &Spec,
    j: usize,
    append: Option<&epilogue::Append>,
    (z, m, c, w): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    extra: Vec<Buf<'ctx>>,
) -> R<()> {
    let mdim = k.dim(&spec.m)?;
    let out = spec.epilogue.outputs[j];
    let val = append.map_or(out, |a| a.new);
    let shape = spec.epilogue.ty(val).shape.clone();
    let mut rest = k.add(k.mul(k.add(k.mul(z, mdim)?, m)?, w)?, c)?;
    let mut coords = vec![k.i64c(0); shape.len()];
    for (i, d) in shape.iter().enumerate().rev() {
        if i == 0 {
            coords[i] = rest;
        } else {
            let dv = k.dim(d)?;
            coords[i] = k.urem(rest, dv)?;
            rest = k.udiv(rest, dv)?;
        }
    }
    let info = &spec.buffers[spec.n_inputs + j];
    let obuf = Buf { ptr: k.buf(spec.n_inputs + j)?, dtype: info.dtype, strides: info.strides.clone(), align: info.align };
    let mut bufs = Vec::with_capacity(spec.n_inputs + extra.len());
    for (i, info) in spec.buffers.iter().enumerate().take(spec.n_inputs) {
        bufs.push(Buf { ptr: k.buf(i)?, dtype: info.dtype, strides: info.strides.clone(), align: info.align });
    }
    bufs.extend(extra);
    k.with_eval(&spec.epilogue, bufs, |ev| {
        let at = At { axes: coords.iter().map(|&c| ev.uniform_ax(c)).collect(), lanes: 1 };
        let vals = ev.eval(val, &at)?;
        match append {
            None => ev.store(&obuf, &at, &vals),
            Some(a) => scatter_append(ev, &spec.epilogue, a, &coords, &obuf, &vals),
        }
    })
    .map_err(|e| name_error(e, &spec.kernel_name))
}

/// Stores `vals`, the element `(b, t, h, d)` = `coords` of a `kv_append`'s new rows, into
/// its output pages `obuf` at `[block_table[b][slot / S], slot % S, h, d]` with `slot =
/// start_pos[b] + t` — the kv_append family's addressing (`kernels::kv_append`), including
/// its rule for bad input: a slot outside `0 .. max_pages·S` or a page outside `0 .. P`
/// writes nothing. The output pages are the input pages updated in place (the runtime passes
/// one buffer for both); the input page pointer is never read.
pub(super) fn scatter_append<'ctx>(ev: &mut Eval<'_, 'ctx>, body: &Function, a: &epilogue::Append, coords: &[IntValue<'ctx>], obuf: &Buf<'ctx>, vals: &[Scalar<'ctx>]) -> R<()> {
    let nd = &body.nodes[a.node];
    let (pages, bt, sp) = (nd.inputs[a.which], nd.inputs[4], nd.inputs[5]);
    let pshape = body.ty(pages).shape.clone();
    let btshape = body.ty(bt).shape.clone();
    if pshape.len() != 4 || btshape.len() != 2 || coords.len() != 4 {
        return Err(CodegenError::BadKernel { kernel: String::new(), message: "kv_append: pages and new rows must have rank 4, the block table rank 2".into() });
    }
    let i64t = ev.ity();
    let uni = |ev: &Eval<'_, 'ctx>, v| ev.uniform_ax(v);
    let sext = |ev: &Eval<'_, 'ctx>, v: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        Ok(if v.get_type() == i64t { v } else { ev.kb.b.build_int_s_extend(v, i64t, "sx")? })
    };
    let start = ev.eval(sp, &At { axes: vec![uni(ev, coords[0])], lanes: 1 })?[0].i()?;
    let start = sext(ev, start)?;
    let slot = ev.iadd(start, coords[1])?;
    let (ps, mp, np) = (ev.dim(&pshape[1])?, ev.dim(&btshape[1])?, ev.dim(&pshape[0])?);
    let cap = ev.imul(ps, mp)?;
    let ge0 = ev.kb.b.build_int_compare(IntPredicate::SGE, slot, i64t.const_zero(), "ge0")?;
    let ltc = ev.kb.b.build_int_compare(IntPredicate::SLT, slot, cap, "ltc")?;
    let slot_ok = ev.kb.b.build_and(ge0, ltc, "slot_ok")?;
    let then = ev.kb.block("append_slot");
    let skip = ev.kb.block("append_skip");
    ev.kb.cond_br(slot_ok, then, skip)?;
    ev.kb.position(then);
    let pidx = ev.kb.b.build_int_unsigned_div(slot, ps, "pidx")?;
    let row = ev.kb.b.build_int_unsigned_rem(slot, ps, "row")?;
    let page = ev.eval(bt, &At { axes: vec![uni(ev, coords[0]), uni(ev, pidx)], lanes: 1 })?[0].i()?;
    let page = sext(ev, page)?;
    let pge0 = ev.kb.b.build_int_compare(IntPredicate::SGE, page, i64t.const_zero(), "pge0")?;
    let pltn = ev.kb.b.build_int_compare(IntPredicate::SLT, page, np, "pltn")?;
    let page_ok = ev.kb.b.build_and(pge0, pltn, "page_ok")?;
    let write = ev.kb.block("append_write");
    ev.kb.cond_br(page_ok, write, skip)?;
    ev.kb.position(write);
    let dst = At { axes: vec![uni(ev, page), uni(ev, row), uni(ev, coords[2]), uni(ev, coords[3])], lanes: 1 };
    ev.store(obuf, &dst, vals)?;
    ev.kb.br(skip)?;
    ev.kb.position(skip);
    ev.forget();
    Ok(())
}

/// The tile of a tensor-core kernel's epilogue ([`mma_epilogue`]).
pub(super) struct MmaTile<'ctx> {
    /// m16 row blocks and n8 column blocks of a warp's accumulators.
    pub(super) mt: usize,
    pub(super) nt: usize,
    /// The warp tile (rows, columns) and the warps along M (warp `w` is at `(w % warps_m,
    /// w / warps_m)`).
    pub(super) wm: u32,
    pub(super) wn: u32,
    pub(super) warps_m: u32,
    /// The CTA tile and its threads.
    pub(super) bm: u32,
    pub(super) bn: u32,
    pub(super) threads: u32,
    /// The first thread holding accumulators (`tid.x` of warp 0 of the tile: 128 in the
    /// warp-specialised kernel, whose warpgroup 0 is the producer).
    pub(super) first_thread: u32,
    /// The tile's first row (i64), column tile and batch index.
    pub(super) m0: IntValue<'ctx>,
    pub(super) pid_n: IntValue<'ctx>,
    pub(super) bz: IntValue<'ctx>,
}

/// The epilogue of the tensor-core kernels: each warp's accumulators `acc[(mi·nt + ni)·4 + q]`
/// in the `m16n8` fragment layout (lane `(g, t) = (lane/4, lane%4)` holds columns `2t, 2t+1`
/// of rows `g` and `g + 8` of each block) through the kernel's epilogue to the outputs —
/// directly from registers, or staged through shared memory (`smem`) as a whole tile.
pub(super) fn mma_epilogue<'ctx>(kit: &Kit<'ctx>, spec: &Spec, plan: &MmaPlan, smem: PointerValue<'ctx>, acc: &[PointerValue<'ctx>], tl: &MmaTile<'ctx>, bases: &Bases<'ctx>) -> R<()> {
    let MmaTile { mt, nt, wm, wn, threads, m0, pid_n, bz, .. } = *tl;
    let dt = spec.dtype;
    let mdim = kit.dim(&spec.m)?;
    let tid = kit.sreg("tid.x")?;
    // Epilogue. Lane (g, t) = (lane / 4, lane % 4) holds, of each m16n8 tile, columns 2t,
    // 2t + 1 of rows g and g + 8.
    // The lane's coordinates afresh from an opaque copy of `tid.x`, so that LLVM does not
    // keep them (or what they share with the loop's addresses) live through the main loop,
    // whose registers are all taken.
    let tid = kit.sub(kit.math(|kb| kb.opaque(tid))?, kit.i32c(tl.first_thread as i32))?;
    let lane = kit.and(tid, kit.i32c(31))?;
    let warp = kit.lshr(tid, 5)?;
    let warp_m = kit.urem(warp, kit.i32c(tl.warps_m as i32))?;
    let warp_n = kit.udiv(warp, kit.i32c(tl.warps_m as i32))?;
    let g = kit.lshr(lane, 2)?;
    let t2 = kit.shl(kit.and(lane, kit.i32c(3))?, 1)?;
    let row0 = kit.add(kit.mul(warp_m, kit.i32c(wm as i32))?, g)?;
    let col0 = kit.add(kit.mul(warp_n, kit.i32c(wn as i32))?, t2)?;
    let frag = |mi: usize, ni: usize, h: usize| -> R<(u32, u32, [FloatValue<'ctx>; 2])> {
        let at = (mi * nt + ni) * 4 + 2 * h;
        Ok(((mi * 16 + 8 * h) as u32, (ni * 8) as u32, [kit.get_f(acc[at])?, kit.get_f(acc[at + 1])?]))
    };
    if spec.epi.staged() {
        // Stage the tile (rounded to R's dtype) over the pipeline's memory once every warp
        // has read its last fragments, then write the outputs from it.
        kit.barrier()?;
        let es = dt.size_bytes() as i32;
        for mi in 0..mt {
            for ni in 0..nt {
                for h in 0..2 {
                    let (dr, dc, v) = frag(mi, ni, h)?;
                    let row = kit.add(row0, kit.i32c(dr as i32))?;
                    let col = kit.add(col0, kit.i32c(dc as i32))?;
                    let e = kit.add(kit.mul(row, kit.i32c(plan.pitch as i32))?, col)?;
                    kit.sh_store(dt, kit.sh_at(smem, kit.mul(e, kit.i32c(es))?)?, &v)?;
                }
            }
        }
        kit.barrier()?;
        let t = StagedTile { bm: tl.bm, bn: tl.bn, pitch: plan.pitch, threads };
        return staged_outputs(kit, spec, t, smem, (m0, pid_n, bz), tid);
    }
    // Direct: each pair of columns evaluated from the registers, as two lanes (vector loads
    // and stores where the layouts allow); a last odd column alone.
    let n0 = kit.mul(pid_n, kit.i64c(i64::from(tl.bn)))?;
    let ndim = kit.dim(&spec.n)?;
    let n_even = spec.n.div_exact(2).is_some();
    let mbase = kit.add(m0, kit.zext64(row0)?)?;
    let nbase = kit.add(n0, kit.zext64(col0)?)?;
    for mi in 0..mt {
        for ni in 0..nt {
            for h in 0..2 {
                let (dr, dc, v) = frag(mi, ni, h)?;
                let m = kit.add(mbase, kit.i64c(i64::from(dr)))?;
                let n = kit.add(nbase, kit.i64c(i64::from(dc)))?;
                let m_ok = kit.icmp(IntPredicate::SLT, m, mdim)?;
                let both = kit.icmp(IntPredicate::SLT, kit.add(n, kit.i64c(1))?, ndim)?;
                kit.if_then(kit.and(m_ok, both)?, |k| epilogue_and_store_pair(k, spec, bases, m, n, v))?;
                if !n_even {
                    let last = kit.icmp(IntPredicate::EQ, kit.add(n, kit.i64c(1))?, ndim)?;
                    kit.if_then(kit.and(m_ok, last)?, |k| epilogue_and_store(k, spec, bases, m, n, v[0]))?;
                }
            }
        }
    }
    Ok(())
}
