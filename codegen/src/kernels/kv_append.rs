//! The KV-append family ([`Family::KvAppend`]): writes new K/V rows into a paged cache
//! (PagedAttention, Kwon et al. 2023).
//!
//! # What a kernel computes
//! The body holds one `kv_append(k_pages, v_pages, k_new, v_new, block_table, start_pos)`
//! (pages `[P, page_size, Hkv, D]`, new rows `[B, T, Hkv, D]`, `block_table [B, max_pages]`
//! and `start_pos [B]` of `i32`/`i64`), possibly with views (`reshape`, …) on `k_new`/`v_new`;
//! its two results are the kernel's outputs. Token `t` of sequence `b` goes to slot
//! `start_pos[b] + t`, i.e. page `block_table[b][slot / page_size]`, row `slot % page_size`.
//!
//! # Aliasing: the output pages are the input pages
//! The op is functional in the IR (it returns updated pages), but the kernel updates the cache
//! **in place**: it writes only the new rows, through the *output* pointers, and never reads
//! or copies the input pages. **The runtime must pass the same device buffer for input 0
//! (`k_pages`) and output 0 (`k_pages'`), and for input 1 and output 1**; the rows not written
//! keep their contents because they are the input's. (Given distinct output buffers, the rows
//! not appended would be whatever those buffers held.) No pointer of this family is
//! `noalias`.
//!
//! # Out-of-range slots and pages
//! The interpreter reports a slot outside `0..max_pages·page_size` or a block-table entry
//! outside `0..P` as an error; the kernel **skips that token's row** (writes nothing for it).
//! Two tokens mapping to one slot in one launch (never the case for valid positions) leave
//! either one — the interpreter keeps the later.
//!
//! # Schedule
//! One thread per 16-byte group of a `[Hkv·D]` row (`vec` = 8 `bf16`), grid-stride over
//! `B·T·Hkv·D/vec` groups, 256 threads per CTA; the group is copied with one vector load and
//! one vector store per cache where `D` is a multiple of `vec` and the rows are contiguous.
//!
//! Design notes: book/src/design/element-wise.md

use inkwell::IntPredicate;
use sinter_ir::{Dim, Family, GridDim, Kernel, KernelGraph, LaunchPlan, OpKind, ValueDef};

use super::element::{divisible, At, Ax, Eval, Tag};
use super::family::{Fixed, Generator};
use super::ctx::{build_twice, KernelCtx};
use crate::math::R;
use crate::target::Target;
use crate::error::CodegenError;

/// Threads per CTA.
const BLOCK: u32 = 256;

/// Generates kv-append kernel `kernel` of `graph` (see the module docs).
///
/// Parameters: the kernel's buffers (the six inputs, then the two output page buffers, which
/// must be the input page buffers), then its symbolic sizes. Grid `(⌈B·T·Hkv·D/(vec·256)⌉,
/// 1, 1)`, block `(256, 1, 1)`.
///
/// # Errors
/// [`CodegenError::Unsupported`] when the body is not one `kv_append` whose page operands are
/// kernel inputs and whose results are the kernel's outputs; [`CodegenError::BadKernel`] for
/// a body that does not match its buffers.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    super::family::compile::<KvAppend>(graph, kernel, target)
}

/// The kv-append family's generator (one schedule).
pub(crate) struct KvAppend;

impl Generator for KvAppend {
    type Analysis<'g> = KernelCtx<'g>;
    type Schedule = Fixed;
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, _: &Target) -> R<KernelCtx<'g>> {
        let cx = KernelCtx::new(graph, kernel)?;
        if cx.data.family != Family::KvAppend {
            return Err(cx.bad(format!("a {:?} kernel given to the kv_append generator", cx.data.family)));
        }
        Ok(cx)
    }
    fn default_schedule(_: &KernelCtx<'_>, _: &Target) -> R<Fixed> {
        Ok(Fixed)
    }
    fn build(cx: &KernelCtx<'_>, _: &Fixed, target: &Target) -> R<LaunchPlan> {
        build(cx, target)
    }
}

/// [`generate`] past the analysis.
fn build(cx: &KernelCtx<'_>, target: &Target) -> R<LaunchPlan> {
    let body = &cx.data.body;
    let mut found = None;
    for (n, nd) in body.nodes.iter() {
        if nd.op.kind == OpKind::KvAppend {
            if found.is_some() {
                return Err(cx.unsupported("more than one kv_append in one kernel"));
            }
            found = Some(n);
        }
    }
    let node = found.ok_or_else(|| cx.unsupported("no kv_append in a KvAppend kernel"))?;
    let nd = &body.nodes[node];
    if nd.inputs.len() != 6 || nd.results.len() != 2 {
        return Err(cx.bad("kv_append needs 6 operands and 2 results"));
    }
    // The page operands are kernel inputs; the results are the kernel outputs.
    for (i, &v) in nd.inputs[..2].iter().enumerate() {
        if !matches!(body.values[v].def, ValueDef::Param(_)) {
            return Err(cx.unsupported(format!("page operand {i} of kv_append is computed in the kernel; it must be a kernel input (updated in place)")));
        }
    }
    let n_in = cx.data.inputs.len();
    let mut out_buf = [0usize; 2];
    for (r, slot) in nd.results.iter().zip(out_buf.iter_mut()) {
        let j = body.outputs.iter().position(|o| o == r).ok_or_else(|| cx.unsupported("a kv_append result is not a kernel output"))?;
        *slot = n_in + j;
    }
    let (kp, kn, bt, sp) = (nd.inputs[0], nd.inputs[2], nd.inputs[4], nd.inputs[5]);
    let pshape = body.ty(kp).shape.clone();
    let nshape = body.ty(kn).shape.clone();
    let btshape = body.ty(bt).shape.clone();
    if pshape.len() != 4 || nshape.len() != 4 || btshape.len() != 2 {
        return Err(cx.bad("kv_append: pages and new rows must have rank 4, the block table rank 2"));
    }
    let elem = body.ty(kp).dtype.size_bytes();
    let mut vec = (16 / elem.max(1)).clamp(1, 8) as u32;
    while vec > 1 && !divisible(&nshape[3], vec) {
        vec /= 2;
    }
    let numel = Dim::product(&nshape);
    let width = cx.index_width();
    let entry = cx.entry();
    let (ptx, params) = build_twice(&cx, target, &entry, BLOCK, width, |kb, sizes| {
        let mut pbufs = Vec::with_capacity(n_in);
        for i in 0..n_in {
            pbufs.push(cx.buf(kb, i)?);
        }
        let ko = cx.buf(kb, out_buf[0])?;
        let vo = cx.buf(kb, out_buf[1])?;
        let mut ev = Eval::new(kb, sizes, body, pbufs, width);
        let ity = ev.ity();
        let i64t = ev.kb.cx.i64_type();
        let tid = ev.kb.tid_x()?;
        let ntid = ev.kb.ntid_x()?;
        let ctaid = ev.kb.ctaid_x()?;
        let nctaid = ev.kb.nctaid_x()?;
        let n = ev.dim(&numel)?;
        let (g0, gs, groups) = ev.kb.in_prologue(|kb| {
            let z = |v| kb.b.build_int_z_extend_or_bit_cast(v, ity, "w");
            let (tid, ntid, ctaid, nctaid) = (z(tid)?, z(ntid)?, z(ctaid)?, z(nctaid)?);
            let g0 = kb.b.build_int_add(kb.b.build_int_mul(ctaid, ntid, "cs")?, tid, "g0")?;
            let gs = kb.b.build_int_mul(nctaid, ntid, "gs")?;
            let groups = kb.b.build_int_unsigned_div(n, ity.const_int(u64::from(vec), false), "groups")?;
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
        let more = ev.kb.b.build_int_compare(IntPredicate::ULT, gv, groups, "more")?;
        ev.kb.cond_br(more, bodyb, exit)?;
        ev.kb.position(bodyb);
        ev.forget();
        // Coordinates (b, t, h, d0) of the group.
        let e0 = ev.imul(gv, ev.ic(i64::from(vec)))?;
        let mut c = [ev.ic(0); 4];
        let mut rem = e0;
        for a in (1..4).rev() {
            let dv = ev.dim(&nshape[a])?;
            c[a] = ev.irem(rem, dv)?;
            rem = ev.idiv(rem, dv)?;
        }
        c[0] = rem;
        let uni = |v| Ax { base: v, step: false, aligned: false, zero: false, tag: Tag::Other };
        let src = At { axes: vec![uni(c[0]), uni(c[1]), uni(c[2]), Ax { base: c[3], step: vec > 1, aligned: true, zero: false, tag: Tag::Other }], lanes: vec };
        // Slot and page, checked in 64 bits.
        let sp_v = ev.eval(sp, &At { axes: vec![uni(c[0])], lanes: 1 })?[0].i()?;
        let sp64 = if sp_v.get_type() == i64t { sp_v } else { ev.kb.b.build_int_s_extend(sp_v, i64t, "sp")? };
        let t64 = if c[1].get_type() == i64t { c[1] } else { ev.kb.b.build_int_z_extend(c[1], i64t, "t")? };
        let slot = ev.kb.b.build_int_add(sp64, t64, "slot")?;
        let page_size = ev.dim(&pshape[1])?;
        let max_pages = ev.dim(&btshape[1])?;
        let npages = ev.dim(&pshape[0])?;
        let ps64 = if page_size.get_type() == i64t { page_size } else { ev.kb.b.build_int_z_extend(page_size, i64t, "ps")? };
        let mp64 = if max_pages.get_type() == i64t { max_pages } else { ev.kb.b.build_int_z_extend(max_pages, i64t, "mp")? };
        let np64 = if npages.get_type() == i64t { npages } else { ev.kb.b.build_int_z_extend(npages, i64t, "np")? };
        let cap = ev.kb.b.build_int_mul(ps64, mp64, "cap")?;
        let ge0 = ev.kb.b.build_int_compare(IntPredicate::SGE, slot, i64t.const_zero(), "ge0")?;
        let ltc = ev.kb.b.build_int_compare(IntPredicate::SLT, slot, cap, "ltc")?;
        let slot_ok = ev.kb.b.build_and(ge0, ltc, "slot_ok")?;
        let then = ev.kb.block("slot_ok");
        let skip = ev.kb.block("skip");
        ev.kb.cond_br(slot_ok, then, skip)?;
        ev.kb.position(then);
        // slot ≥ 0 here: unsigned division.
        let pidx = ev.kb.b.build_int_unsigned_div(slot, ps64, "pidx")?;
        let row = ev.kb.b.build_int_unsigned_rem(slot, ps64, "row")?;
        let pidx_i = ev.to_index(pidx)?;
        let page = ev.eval(bt, &At { axes: vec![uni(c[0]), uni(pidx_i)], lanes: 1 })?[0].i()?;
        let page64 = if page.get_type() == i64t { page } else { ev.kb.b.build_int_s_extend(page, i64t, "page")? };
        let pge0 = ev.kb.b.build_int_compare(IntPredicate::SGE, page64, i64t.const_zero(), "pge0")?;
        let pltn = ev.kb.b.build_int_compare(IntPredicate::SLT, page64, np64, "pltn")?;
        let page_ok = ev.kb.b.build_and(pge0, pltn, "page_ok")?;
        let write = ev.kb.block("write");
        ev.kb.cond_br(page_ok, write, skip)?;
        ev.kb.position(write);
        let page_i = ev.to_index(page64)?;
        let row_i = ev.to_index(row)?;
        let dst = At { axes: vec![uni(page_i), uni(row_i), uni(c[2]), Ax { base: c[3], step: vec > 1, aligned: true, zero: false, tag: Tag::Other }], lanes: vec };
        let kvals = ev.eval(kn, &src)?;
        ev.store(&ko, &dst, &kvals)?;
        let vvals = ev.eval(nd.inputs[3], &src)?;
        ev.store(&vo, &dst, &vvals)?;
        ev.kb.br(skip)?;
        ev.kb.position(skip);
        let next = ev.iadd(gv, gs)?;
        let latch = ev.kb.current_block()?;
        g.add_incoming(&[(&next, latch)]);
        ev.kb.br(header)?;
        ev.kb.position(exit);
        ev.kb.ret()
    })?;
    Ok(LaunchPlan {
        entry,
        ptx,
        target: *target,
        grid: [GridDim { numerator: numel, denominator: vec * BLOCK }, GridDim::fixed(1), GridDim::fixed(1)],
        block: [BLOCK, 1, 1],
        shared_bytes: 0,
        params,
    })
}
