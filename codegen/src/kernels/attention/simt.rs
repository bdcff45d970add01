//! FlashAttention-2 on CUDA cores (Dao 2023, arXiv 2307.08691, Algorithm 1), correct for
//! every shape: the prefill kernel (what the tensor-core kernels do not take) and the
//! single-CTA paged decode kernel, over one core ([`build_core`]).
//!
//! A CTA owns a tile of `block_q` query rows (`warps` × `rows_per_warp`) and walks the keys
//! in tiles of [`BLOCK_KV`] = 32. Per key tile, all threads stage K and V in shared memory
//! (rows padded for conflict-free 16-byte accesses); lane `j` of each warp computes the scores
//! of key `j` against the warp's rows (`s = scale·q·k + mask` in f32); per row the warp takes
//! the tile maximum and the sum of `p = exp(s − m_new)` with butterflies, rescales its running
//! sum and accumulator, writes `p` to shared memory and accumulates `P·V` (lane `d` owns
//! output dims `d, d+32, …`). O is written once, as `acc / l` rounded to the output dtype.
//!
//! Paged decode: one CTA per (row tile, KV head, sequence), whose rows are the `H/Hkv · T`
//! query rows sharing that KV head, keys read through the block table
//! ([`super::analysis::PagedAddr`]). It ignores `unified_max` (the split-KV kernel takes it).
//!
//! A sliding window (`window = W`) starts the key loop at the tile holding the CTA's first
//! visible key (the tiles below are never loaded) and hides each row's keys below its window;
//! a softcap `c` makes each score `c·tanh(s/c)` before the mask.
//!
//! Design notes: book/src/design/attention.md

use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Dim, Family, GridDim, LaunchPlan};

use super::analysis::{cap_score, dynamic_bytes, exp0, shared_kind, unsupported, Paged, Prefill, T4};
use super::schedule::{AttentionSchedule, SimtSmem as Smem, BLOCK_KV};
use crate::isa::kit::{Kit, SharedKind, R};
use crate::target::Target;

/// What the core needs to know, whichever family.
struct Core {
    dtype: DType,
    d: u32,
    dv: u32,
    scale: f32,
    /// The node's sliding window (the rows' `start`s apply) and softcap.
    window: bool,
    softcap: Option<f32>,
    sched: AttentionSchedule,
    smem: Smem,
    shared: SharedKind,
    q: T4,
    out: T4,
    /// Where the rows' log-sum-exp go (`lse=true`), offsets in [`RowInfo::lse_off`].
    lse: Option<T4>,
}

/// One query row of the CTA's tile: whether it exists, where its q and o rows start, how many
/// keys it sees (the causal limit, ≤ the sequence length, as an i32: sequences are shorter
/// than 2³¹ keys) and where its mask row starts.
struct RowInfo<'ctx> {
    valid: IntValue<'ctx>,
    q_off: IntValue<'ctx>,
    o_off: IntValue<'ctx>,
    limit: IntValue<'ctx>,
    /// Its first visible key (i32): 0, or with a sliding window `max(limit − W, 0)`.
    start: IntValue<'ctx>,
    mask_off: Option<IntValue<'ctx>>,
    /// Element offset of its log-sum-exp (when the kernel writes it).
    lse_off: Option<IntValue<'ctx>>,
}

/// The offsets of key `j`'s K and V rows.
type KeyOffsets<'k, 'ctx> = &'k dyn Fn(&Kit<'ctx>, IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)>;

/// Where to read the keys and the optional mask.
struct Keys<'k, 'ctx> {
    k: &'k T4,
    v: &'k T4,
    /// Offsets of key `j`'s K and V rows (called only for `j < kv_len`).
    offsets: KeyOffsets<'k, 'ctx>,
    /// Keys of this CTA's sequence.
    kv_len: IntValue<'ctx>,
    /// The key tiles cover `kv_start..kv_end` (≤ kv_len; the causal bound of the CTA's last
    /// row), from the tile holding `kv_start` (0, or with a window a first visible key of
    /// every row of the CTA): the tiles below it are never loaded.
    kv_start: IntValue<'ctx>,
    kv_end: IntValue<'ctx>,
    /// Mask buffer, its dtype and the stride of its key axis.
    mask: Option<(usize, DType, Dim)>,
}

/// Emits the whole FlashAttention-2 loop for one CTA (see the module docs).
fn build_core<'ctx>(kit: &Kit<'ctx>, c: &Core, rows: &dyn Fn(&Kit<'ctx>, IntValue<'ctx>) -> R<RowInfo<'ctx>>, keys: &Keys<'_, 'ctx>) -> R<()> {
    let dt = c.dtype;
    let es = dt.size_bytes() as i32;
    let sm = &c.smem;
    let (bq, rpw) = (c.sched.block_q(), c.sched.rows_per_warp);
    let threads = c.sched.threads() as i32;
    let nd = c.dv.div_ceil(32);
    let smem = kit.shared(c.shared, sm.total)?;
    let tid = kit.sreg("tid.x")?;
    let warp = kit.udiv(tid, kit.i32c(32))?;
    let lane = kit.urem(tid, kit.i32c(32))?;
    let ninf = kit.f32c(f64::NEG_INFINITY);
    let zero = kit.f32c(0.0);
    let i32c = |v: u32| kit.i32c(v as i32);
    // Byte address of element `e` (i32) of the shared part at `base`.
    let at = |k: &Kit<'ctx>, base: u32, e: IntValue<'ctx>, size: i32| -> R<PointerValue<'ctx>> {
        k.sh_at(smem, k.add(k.i32c(base as i32), k.mul(e, k.i32c(size))?)?)
    };

    // 1. The Q tile: block_q rows × d, in chunks of ck.
    let (q_ptr, k_ptr, v_ptr, o_ptr) = (kit.buf(c.q.buffer)?, kit.buf(keys.k.buffer)?, kit.buf(keys.v.buffer)?, kit.buf(c.out.buffer)?);
    let q_vec = c.q.vector_ok(sm.ck);
    let q_sd = kit.dim(&c.q.st[3])?;
    let kchunks = (c.d / sm.ck) as i32;
    kit.for_range(tid, kit.i32c(bq as i32 * kchunks), kit.i32c(threads), |k, e| {
        let r = k.udiv(e, k.i32c(kchunks))?;
        let dc = k.mul(k.urem(e, k.i32c(kchunks))?, k.i32c(sm.ck as i32))?;
        let info = rows(k, r)?;
        let idx = k.add(info.q_off, k.mul(k.zext64(dc)?, q_sd)?)?;
        let vals = k.guarded_load(info.valid, dt, q_ptr, idx, sm.ck, q_vec, q_sd)?;
        k.sh_store(dt, at(k, sm.q, k.add(k.mul(r, k.i32c(sm.ldk as i32))?, dc)?, es)?, &vals)
    })?;

    // 2. Per-warp state: each warp's rows' key limits, running max m, sum l, accumulator acc.
    // (Offsets are recomputed where needed rather than kept live in registers.)
    let row_of = |k: &Kit<'ctx>, rr: u32| k.add(k.mul(warp, k.i32c(rpw as i32))?, k.i32c(rr as i32));
    let limits: Vec<(IntValue, IntValue)> = (0..rpw).map(|rr| rows(kit, row_of(kit, rr)?).map(|i| (i.limit, i.start))).collect::<R<_>>()?;
    let m: Vec<PointerValue> = (0..rpw).map(|_| kit.var_f(ninf)).collect::<R<_>>()?;
    let l: Vec<PointerValue> = (0..rpw).map(|_| kit.var_f(zero)).collect::<R<_>>()?;
    let acc: Vec<Vec<PointerValue>> = (0..rpw).map(|_| (0..nd).map(|_| kit.var_f(zero)).collect::<R<_>>()).collect::<R<_>>()?;
    // Shared-memory element indices of this lane's K row and this warp's first Q / P rows.
    let k_row = kit.mul(lane, i32c(sm.ldk))?;
    let q_row0 = kit.mul(kit.mul(warp, i32c(rpw))?, i32c(sm.ldk))?;
    let p_row0 = kit.mul(kit.mul(warp, i32c(rpw))?, i32c(BLOCK_KV))?;
    let (k_vec, v_vec) = (keys.k.vector_ok(sm.ck), keys.v.vector_ok(sm.cv));
    let (k_sd, v_sd) = (kit.dim(&keys.k.st[3])?, kit.dim(&keys.v.st[3])?);
    let vchunks = (c.dv / sm.cv) as i32;
    let scale = kit.f32c(f64::from(c.scale));

    // 3. The key tiles.
    let first = if c.window { kit.mul(kit.udiv(keys.kv_start, kit.i64c(i64::from(BLOCK_KV)))?, kit.i64c(i64::from(BLOCK_KV)))? } else { kit.i64c(0) };
    kit.for_range(first, keys.kv_end, kit.i64c(i64::from(BLOCK_KV)), |k, j0| {
        // Stage K and V (zeros past the sequence; rows read only when they exist).
        let stage = |k: &Kit<'ctx>, chunks: i32, cw: u32, ld: u32, base: u32, is_k: bool| -> R<()> {
            k.for_range(tid, k.i32c(BLOCK_KV as i32 * chunks), k.i32c(threads), |k, e| {
                let jj = k.udiv(e, k.i32c(chunks))?;
                let dc = k.mul(k.urem(e, k.i32c(chunks))?, k.i32c(cw as i32))?;
                let j = k.add(j0, k.zext64(jj)?)?;
                let valid = k.icmp(IntPredicate::SLT, j, keys.kv_len)?;
                let vars: Vec<PointerValue> = (0..cw).map(|_| k.var_f(zero)).collect::<R<_>>()?;
                k.if_then(valid, |k| {
                    let (ko, vo) = (keys.offsets)(k, j)?;
                    let (ptr, off, sd, vec) = if is_k { (k_ptr, ko, k_sd, k_vec) } else { (v_ptr, vo, v_sd, v_vec) };
                    let idx = k.add(off, k.mul(k.zext64(dc)?, sd)?)?;
                    let vals = if vec { k.load_vec(dt, ptr, idx, cw)? } else { k.load_strided(dt, ptr, idx, sd, cw)? };
                    for (p, v) in vars.iter().zip(vals) {
                        k.set(*p, v.into())?;
                    }
                    Ok(())
                })?;
                let vals: Vec<FloatValue> = vars.iter().map(|&p| k.get_f(p)).collect::<R<_>>()?;
                k.sh_store(dt, at(k, base, k.add(k.mul(jj, k.i32c(ld as i32))?, dc)?, es)?, &vals)
            })
        };
        stage(k, kchunks, sm.ck, sm.ldk, sm.k, true)?;
        stage(k, vchunks, sm.cv, sm.ldv, sm.v, false)?;
        k.barrier()?;

        // Scores of key j0 + lane against the warp's rows.
        let s: Vec<PointerValue> = (0..rpw).map(|_| k.var_f(zero)).collect::<R<_>>()?;
        k.for_range(k.i32c(0), k.i32c(c.d as i32), k.i32c(sm.ck as i32), |k, dc| {
            let kv = k.sh_load(dt, at(k, sm.k, k.add(k_row, dc)?, es)?, sm.ck)?;
            for (rr, sp) in s.iter().enumerate() {
                let qe = k.add(k.add(q_row0, k.i32c((rr as u32 * sm.ldk) as i32))?, dc)?;
                let qv = k.sh_load(dt, at(k, sm.q, qe, es)?, sm.ck)?;
                let mut sum = k.get_f(*sp)?;
                for (a, b) in qv.iter().zip(&kv) {
                    sum = k.fma(*a, *b, sum)?;
                }
                k.set(*sp, sum.into())?;
            }
            Ok(())
        })?;

        // Online softmax per row.
        let j0_32 = k.trunc32(j0)?;
        let j = k.add(j0_32, lane)?;
        let mut bounds = Vec::with_capacity(rpw as usize);
        for rr in 0..rpw as usize {
            let (limit, start) = limits[rr];
            let visible = k.icmp(IntPredicate::SLT, j, limit)?;
            let visible = if c.window { k.and(visible, k.icmp(IntPredicate::SGE, j, start)?)? } else { visible };
            let mut sc = cap_score(k, k.fmul(k.get_f(s[rr])?, scale)?, c.softcap)?;
            if let Some((mbuf, mdt, msj)) = &keys.mask {
                let moff = rows(k, row_of(k, rr as u32)?)?.mask_off.ok_or_else(|| k.err("mask without offsets"))?;
                let idx = k.add(moff, k.mul(k.zext64(j)?, k.dim(msj)?)?)?;
                let mv = k.guarded_load(visible, *mdt, k.buf(*mbuf)?, idx, 1, true, k.i64c(0))?;
                sc = k.fadd(sc, mv[0])?;
            }
            let sc = k.select_f(visible, sc, ninf)?;
            // The tile maximum (NaN-propagating).
            let tile_max = k.warp_reduce(sc, &[16, 8, 4, 2, 1], |k, a, b| k.max_nan(a, b))?;
            let m_old = k.get_f(m[rr])?;
            let m_new = k.max_nan(m_old, tile_max)?;
            let none_yet = k.fcmp(FloatPredicate::OEQ, m_new, ninf)?;
            let m_use = k.select_f(none_yet, zero, m_new)?;
            let alpha = exp0(k, k.fsub(m_old, m_use)?)?;
            let p = exp0(k, k.fsub(sc, m_use)?)?;
            let psum = k.warp_reduce(p, &[16, 8, 4, 2, 1], |k, a, b| k.fadd(a, b))?;
            let lv = k.fma(k.get_f(l[rr])?, alpha, psum)?;
            k.set(l[rr], lv.into())?;
            for a in &acc[rr] {
                let v = k.fmul(k.get_f(*a)?, alpha)?;
                k.set(*a, v.into())?;
            }
            k.set(m[rr], m_new.into())?;
            let pe = k.add(p_row0, k.add(k.i32c((rr as u32 * BLOCK_KV) as i32), lane)?)?;
            k.sh_store(DType::F32, at(k, sm.p, pe, 4)?, &[p])?;
            // Keys this row multiplies: [lo, hi) of the tile, its visible keys (masked ones
            // too, with p = 0: 0·NaN is NaN as in the reference); those below the row's
            // window are never multiplied.
            let lo = if c.window { k.smin(k.smax(k.sub(start, j0_32)?, k.i32c(0))?, k.i32c(BLOCK_KV as i32))? } else { k.i32c(0) };
            let hi = k.smin(k.smax(k.sub(limit, j0_32)?, k.i32c(0))?, k.i32c(BLOCK_KV as i32))?;
            bounds.push((lo, hi));
        }
        k.warp_sync()?;

        // acc += P·V; the guarded variant only on tiles where some row multiplies a strict
        // subset of the keys.
        let mut full = k.bool_c(true);
        for (lo, hi) in &bounds {
            let f = k.and(k.icmp(IntPredicate::EQ, *lo, k.i32c(0))?, k.icmp(IntPredicate::EQ, *hi, k.i32c(BLOCK_KV as i32))?)?;
            full = k.and(full, f)?;
        }
        let pv = |k: &Kit<'ctx>, guarded: bool| -> R<()> {
            k.for_range(k.i32c(0), k.i32c(BLOCK_KV as i32), k.i32c(1), |k, jj| {
                let mut vs = Vec::with_capacity(nd as usize);
                for i in 0..nd {
                    let dcol = k.smin(k.add(lane, k.i32c((32 * i) as i32))?, k.i32c(c.dv as i32 - 1))?;
                    let e = k.add(k.mul(jj, k.i32c(sm.ldv as i32))?, dcol)?;
                    vs.push(k.sh_load(dt, at(k, sm.v, e, es)?, 1)?[0]);
                }
                for rr in 0..rpw as usize {
                    let pe = k.add(p_row0, k.add(k.i32c((rr as u32 * BLOCK_KV) as i32), jj)?)?;
                    let p = k.sh_load(DType::F32, at(k, sm.p, pe, 4)?, 1)?[0];
                    let ok = if guarded {
                        let (lo, hi) = bounds[rr];
                        Some(k.and(k.icmp(IntPredicate::SGE, jj, lo)?, k.icmp(IntPredicate::SLT, jj, hi)?)?)
                    } else {
                        None
                    };
                    for (a, v) in acc[rr].iter().zip(&vs) {
                        let old = k.get_f(*a)?;
                        let new = k.fma(p, *v, old)?;
                        let new = match ok {
                            Some(ok) => k.select_f(ok, new, old)?,
                            None => new,
                        };
                        k.set(*a, new.into())?;
                    }
                }
                Ok(())
            })
        };
        k.if_else(full, |k| pv(k, false), |k| pv(k, true))?;
        k.barrier()
    })?;

    // 4. O = acc / l (acc = Σ 0·v for a row that never saw a score above −inf: 0 for
    // finite V), one rounding, one write;
    // lane 0 writes the log-sum-exp m + ln l (−inf for such a row) where asked.
    let o_sd = kit.dim(&c.out.st[3])?;
    for rr in 0..rpw as usize {
        let info = rows(kit, row_of(kit, rr as u32)?)?;
        let mf = kit.get_f(m[rr])?;
        let empty = kit.fcmp(FloatPredicate::OEQ, mf, ninf)?;
        let lf = kit.get_f(l[rr])?;
        if let (Some(lse), Some(off)) = (&c.lse, info.lse_off) {
            let v = kit.select_f(empty, ninf, kit.fadd(mf, kit.log(lf)?)?)?;
            let first = kit.and(info.valid, kit.icmp(IntPredicate::EQ, lane, kit.i32c(0))?)?;
            kit.if_then(first, |k| k.store_vec(DType::F32, k.buf(lse.buffer)?, off, &[v]))?;
        }
        for (i, a) in acc[rr].iter().enumerate() {
            let dcol = kit.add(lane, kit.i32c((32 * i) as i32))?;
            let av = kit.get_f(*a)?;
            let o = kit.select_f(empty, av, kit.fdiv(av, lf)?)?;
            let inside = kit.and(info.valid, kit.icmp(IntPredicate::SLT, dcol, kit.i32c(c.dv as i32))?)?;
            kit.if_then(inside, |k| {
                let idx = k.add(info.o_off, k.mul(k.zext64(dcol)?, o_sd)?)?;
                k.store_vec(dt, o_ptr, idx, &[o])
            })?;
        }
    }
    Ok(())
}

pub(super) fn prefill_plan(p: &Prefill, target: &Target, s: &AttentionSchedule) -> R<LaunchPlan> {
    let fam = Family::Attention;
    if p.fp8.is_some() {
        return Err(unsupported(&p.name, fam, crate::error::fp8_message("f8e4m3 attention: the CUDA-core kernel does not read f8e4m3")));
    }
    s.check().map_err(|e| unsupported(&p.name, fam, e))?;
    let smem = Smem::new(s, p.d, p.dv, p.dtype);
    let shared = shared_kind(smem.total, target, &p.name, fam)?;
    let ctx = Context::create();
    let entry = format!("{}_attention", p.name);
    let core = Core { dtype: p.dtype, d: p.d, dv: p.dv, scale: p.scale as f32, window: p.window.is_some(), softcap: p.softcap, sched: *s, smem, shared, q: p.q.clone(), out: p.out.clone(), lse: p.lse.clone() };
    let (ptx, params) = Kit::build(&ctx, &entry, *target, p.n_inputs, p.n_buffers - p.n_inputs, &p.dims(), s.threads(), |kit| build_prefill(kit, p, &core))?;
    Ok(p.launch_plan(target, (entry, ptx, params), s.block_q(), s.threads(), shared))
}

fn build_prefill<'ctx>(kit: &Kit<'ctx>, p: &Prefill, c: &Core) -> R<()> {
    let bq = i64::from(c.sched.block_q());
    // Causal CTAs in reverse order: the longest (bottom) tiles start first.
    let qtile = kit.zext64(kit.sub(kit.sub(kit.sreg("nctaid.x")?, kit.i32c(1))?, kit.sreg("ctaid.x")?)?)?;
    let h = kit.zext64(kit.sreg("ctaid.y")?)?;
    let b = kit.zext64(kit.sreg("ctaid.z")?)?;
    let hk = kit.udiv(h, kit.i64c(p.heads / p.kv_heads))?;
    let q0 = kit.mul(qtile, kit.i64c(bq))?;
    let (sq, skv) = (kit.dim(&p.sq)?, kit.dim(&p.skv)?);
    // offset + x·t[0] + y·t[1]: the (batch, head) base of a tensor.
    let base = |offset: &Dim, t: &[Dim], x: IntValue<'ctx>, y: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let a = kit.add(kit.dim(offset)?, kit.mul(x, kit.dim(&t[0])?)?)?;
        kit.add(a, kit.mul(y, kit.dim(&t[1])?)?)
    };
    let q_base = base(&p.q.offset, &p.q.st, b, h)?;
    let o_base = base(&p.out.offset, &p.out.st, b, h)?;
    let lse_base = match &p.lse {
        Some(t) => Some((base(&t.offset, &t.st, b, h)?, kit.dim(&t.st[2])?)),
        None => None,
    };
    let k_base = base(&p.k.offset, &p.k.st, b, hk)?;
    let v_base = base(&p.v.offset, &p.v.st, b, hk)?;
    let m_base = match &p.mask {
        Some(m) => Some(base(&m.offset, &m.st, b, h)?),
        None => None,
    };
    let (q_ss, o_ss) = (kit.dim(&p.q.st[2])?, kit.dim(&p.out.st[2])?);
    let shift = kit.sub(skv, sq)?; // Skv − Sq: query i sees keys j ≤ i + shift
    let rows = |k: &Kit<'ctx>, r: IntValue<'ctx>| -> R<RowInfo<'ctx>> {
        let i = k.add(q0, k.zext64(r)?)?;
        let valid = k.icmp(IntPredicate::SLT, i, sq)?;
        let limit = if p.causal { k.smin(k.smax(k.add(k.add(i, shift)?, k.i64c(1))?, k.i64c(0))?, skv)? } else { skv };
        let start = match p.window {
            Some(w) => k.trunc32(k.smax(k.sub(limit, k.i64c(w))?, k.i64c(0))?)?,
            None => k.i32c(0),
        };
        let limit = k.trunc32(limit)?;
        let mask_off = match (&p.mask, m_base) {
            (Some(m), Some(mb)) => Some(k.add(mb, k.mul(i, k.dim(&m.st[2])?)?)?),
            _ => None,
        };
        let lse_off = match lse_base {
            Some((lb, ls)) => Some(k.add(lb, k.mul(i, ls)?)?),
            None => None,
        };
        Ok(RowInfo { valid, q_off: k.add(q_base, k.mul(i, q_ss)?)?, o_off: k.add(o_base, k.mul(i, o_ss)?)?, limit, start, mask_off, lse_off })
    };
    let (k_ss, v_ss) = (kit.dim(&p.k.st[2])?, kit.dim(&p.v.st[2])?);
    let offsets = |k: &Kit<'ctx>, j: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        Ok((k.add(k_base, k.mul(j, k_ss)?)?, k.add(v_base, k.mul(j, v_ss)?)?))
    };
    let kv_end = if p.causal {
        // The CTA's last row: min(q0 + bq, Sq) − 1.
        let last = kit.sub(kit.smin(kit.add(q0, kit.i64c(bq))?, sq)?, kit.i64c(1))?;
        kit.smin(kit.smax(kit.add(kit.add(last, shift)?, kit.i64c(1))?, kit.i64c(0))?, skv)?
    } else {
        skv
    };
    // With a window, the CTA's first row's first visible key: max(q0 + Skv − Sq + 1 − W, 0).
    let kv_start = match p.window {
        Some(w) => kit.smax(kit.sub(kit.add(kit.add(q0, shift)?, kit.i64c(1))?, kit.i64c(w))?, kit.i64c(0))?,
        None => kit.i64c(0),
    };
    let keys = Keys {
        k: &p.k,
        v: &p.v,
        offsets: &offsets,
        kv_len: skv,
        kv_start,
        kv_end,
        mask: p.mask.as_ref().map(|m| (m.buffer, m.dtype, m.st[3].clone())),
    };
    build_core(kit, c, &rows, &keys)
}

pub(super) fn paged_plan(p: &Paged, target: &Target, s: &AttentionSchedule) -> R<LaunchPlan> {
    let fam = Family::PagedAttention;
    s.check().map_err(|e| unsupported(&p.name, fam, e))?;
    let smem = Smem::new(s, p.d, p.d, p.dtype);
    let shared = shared_kind(smem.total, target, &p.name, fam)?;
    let ctx = Context::create();
    let entry = format!("{}_paged_attention", p.name);
    let core = Core { dtype: p.dtype, d: p.d, dv: p.d, scale: p.scale as f32, window: p.window.is_some(), softcap: p.softcap, sched: *s, smem, shared, q: p.q.clone(), out: p.out.clone(), lse: p.lse.clone() };
    let (ptx, params) = Kit::build(&ctx, &entry, *target, p.n_inputs, p.n_buffers - p.n_inputs, &p.dims(), s.threads(), |kit| build_paged(kit, p, &core))?;
    Ok(LaunchPlan {
        entry,
        ptx,
        target: *target,
        grid: [
            GridDim { numerator: p.rows(), denominator: s.block_q() },
            GridDim::fixed(p.kv_heads as u32),
            GridDim { numerator: p.batch.clone(), denominator: 1 },
        ],
        block: [s.threads(), 1, 1],
        shared_bytes: dynamic_bytes(shared),
        params,
    })
}

fn build_paged<'ctx>(kit: &Kit<'ctx>, p: &Paged, c: &Core) -> R<()> {
    let bq = i64::from(c.sched.block_q());
    let row0 = kit.mul(kit.zext64(kit.sreg("ctaid.x")?)?, kit.i64c(bq))?;
    let g = kit.zext64(kit.sreg("ctaid.y")?)?;
    let b = kit.zext64(kit.sreg("ctaid.z")?)?;
    let a = p.addressing(kit, g, b)?;
    let rows = |k: &Kit<'ctx>, r: IntValue<'ctx>| -> R<RowInfo<'ctx>> {
        let rg = k.add(row0, k.zext64(r)?)?;
        let (valid, q_off, o_off, limit, start) = a.row(k, rg)?;
        Ok(RowInfo { valid, q_off, o_off, limit: k.trunc32(limit)?, start: k.trunc32(start)?, mask_off: None, lse_off: a.lse_off(k, rg)? })
    };
    let offsets = |k: &Kit<'ctx>, j: IntValue<'ctx>| a.key(k, j);
    let keys = Keys { k: &p.kp, v: &p.vp, offsets: &offsets, kv_len: a.len, kv_start: a.seq_start(kit)?, kv_end: a.len, mask: None };
    build_core(kit, c, &rows, &keys)
}
