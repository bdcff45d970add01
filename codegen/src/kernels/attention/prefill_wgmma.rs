//! Prefill attention on Hopper tensor cores (`wgmma.mma_async`, sm_90a; FlashAttention-3,
//! arXiv 2407.08608), for head dims 64 and 128 without an additive mask: the `mma.sync`
//! kernel ([`super::prefill_mma`]) with these sections replaced.
//!
//! - **CTA**: `warpgroups` consumer warpgroups of 4 warps, each owning 64 query rows,
//!   128-key tiles; a warpgroup computes a key tile when any of its rows sees a key of it.
//! - **Shared memory**: Q and two stages of K and V as 128-byte-swizzled slabs of 64 columns
//!   (the K-major canonical layout, 1024-byte aligned), then the P scratch, which also stages
//!   the output.
//! - **Products**: S = Q·Kᵀ is one `m64n{block_kv}k16` per 16 columns of D, both operands from
//!   shared memory; its accumulators are, per warp, the `m16n8` C layout, so the softmax,
//!   masking and NaN handling run unchanged. O += P·V takes A = P from registers and B = V
//!   from shared memory, MN-major (or with `pv_split` one `m64n64k16` per 64 columns).
//! - **Non-finite V**: a warpgroup takes a tile's CUDA-core P·V when any of its warps finds a
//!   non-finite V value (`bar.red.or.pred` on named barrier `1 + warpgroup`).
//!
//! Variants ([`WgSchedule`]): `ov`, the intra-warpgroup overlap (the softmax of tile t while
//! P_{t−1}·V_{t−1} is in flight, [`Tiles::overlap_loop`]); `ws`, warp specialisation (a
//! producer warpgroup loading Q, K and V with the TMA into a ring of mbarrier-guarded stages,
//! [`PrefillTc::producer`], [`Tiles::ws_loop`]); `pp`, the ping-pong of two consumer
//! warpgroups on named barriers.
//!
//! # fp8 (`f8e4m3`)
//! q, k, v `dequantize_fp8` of e4m3 inputs: tiles hold the stored bytes; S = Q·Kᵀ is an
//! e4m3 `wgmma` (k32) with sq·sk folded into the scores' scale; P = 2⁸·2^(x − m) is rounded
//! to e4m3 (the factor cancels in acc / l); 8-bit `wgmma` has no transposed B, so the threads
//! transpose V into Vᵀ ([`Tiles::transpose_v`]); O = sv·acc / l. The CPU emulator cannot run
//! `wgmma`, the TMA or mbarriers: this kernel's correctness rests on the GPU tests.
//!
//! Design notes: book/src/design/attention.md

use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{Dim, Family, LaunchPlan, TensorMap};

use super::analysis::{shared_kind, unsupported, Prefill, T4};
use super::prefill_mma::{build, get_i32, load_i32s, not, or, store_i32s, var_i32, AFrag, CFrag, PrefillTc, Tiles};
use super::schedule::{wg_eligible, TcSmem as Smem, WgSchedule, WS_CONSUMER_REGS, WS_PRODUCER_REGS, WS_STAGES};
use crate::isa::kit::{Kit, SharedKind, R};
use crate::target::Target;

/// The launch plan of the `wgmma` kernel for `p` with schedule `w`.
///
/// # Errors
/// [`crate::error::CodegenError::Unsupported`] when `p` is not [`wg_eligible`], the schedule is
/// invalid or its shared memory exceeds the target's; LLVM errors otherwise.
pub(super) fn plan_wg(p: &Prefill, target: &Target, w: &WgSchedule) -> R<LaunchPlan> {
    let fam = Family::Attention;
    w.check().map_err(|e| unsupported(&p.name, fam, e))?;
    wg_eligible(p, target).map_err(|e| unsupported(&p.name, fam, e))?;
    if p.fp8.is_some() && (w.pv_split || w.block_kv > 128 || w.block_kv % 32 != 0 || w.producer) {
        return Err(unsupported(&p.name, fam, crate::error::fp8_message(&format!("f8e4m3 attention: schedule `{}` (the fp8 kernel takes 32- to 128-key tiles, multiples of 32, without `+split` or the warp-specialised producer)", w.name()))));
    }
    let sm = Smem::wg(w, p.d, p.dv, p.fp8.is_some());
    // Dynamic always: its 1024-byte alignment is what the swizzled slabs need.
    let shared = match shared_kind(sm.total, target, &p.name, fam)? {
        SharedKind::Static => SharedKind::Dynamic(sm.total),
        k => k,
    };
    let s = w.as_tc();
    let ctx = Context::create();
    let entry = format!("{}_attention_wgmma{}", p.name, if p.fp8.is_some() { "_e4m3" } else { "" });
    let maps = if w.producer { tma_maps(p, w) } else { Vec::new() };
    let io = (p.n_inputs, p.n_buffers - p.n_inputs);
    let (ptx, params) = Kit::build_with_maps(&ctx, &entry, *target, io, &maps, &p.dims(), w.threads(), |kit| {
        kit.launch_bounds(w.threads());
        build(kit, p, &s, &sm, shared, Some(w))
    })?;
    Ok(p.launch_plan(target, (entry, ptx, params), s.block_q(), w.threads(), shared))
}

/// A TMA tensor map of attention operand `t` ([`WgSchedule::producer`]): the tensor as
/// `[D, S, H, B]` (innermost first; `d` elements a row, `rows` the sequence length `S`,
/// `heads` its heads), boxes of `64 × box_rows × 1 × 1` — one 64-column, 128-byte-wide slab
/// of one head's rows — with 128-byte swizzling, the layout of [`Smem::swz`] and of the
/// `wgmma` descriptors. Sequence rows past `S` read as zero **within the head** (the bounds
/// are per dimension), so a tile at a sequence's end never sees the next head's rows. A head
/// or batch axis of constant stride 0 (broadcast) is left out (the driver takes no zero
/// stride); [`TmaAxes`] says which are kept.
fn tma_map(t: &T4, d: u32, rows: &Dim, heads: i64, batch: &Dim, box_rows: u32) -> TensorMap {
    let mut dims = vec![Dim::from(i64::from(d)), rows.clone()];
    let mut strides = vec![t.st[2].clone()];
    let mut box_dims = vec![64, box_rows];
    let axes = TmaAxes::of(t);
    for (kept, extent, st) in [(axes.head, Dim::from(heads), &t.st[1]), (axes.batch, batch.clone(), &t.st[0])] {
        if kept {
            dims.push(extent);
            strides.push(st.clone());
            box_dims.push(1);
        }
    }
    TensorMap { buffer: t.buffer, dtype: t.dtype, offset: t.offset.clone(), dims, strides, box_dims, swizzle: 128 }
}

/// Which of the head and batch axes a map of [`tma_map`] has (after D and S): those whose
/// stride is not the constant 0.
#[derive(Clone, Copy)]
pub(super) struct TmaAxes {
    pub(super) head: bool,
    pub(super) batch: bool,
}

impl TmaAxes {
    pub(super) fn of(t: &T4) -> TmaAxes {
        TmaAxes { head: t.st[1].as_const() != Some(0), batch: t.st[0].as_const() != Some(0) }
    }
}

/// The maps of Q (boxes of the CTA's `block_q` rows), K and V (boxes of a key tile),
/// kernel parameters 0, 1 and 2 after the buffers ([`Kit::tensor_map`]).
fn tma_maps(p: &Prefill, w: &WgSchedule) -> Vec<TensorMap> {
    let q = tma_map(&p.q, p.d, &p.sq, p.heads, &p.batch, w.block_q());
    let k = tma_map(&p.k, p.d, &p.skv, p.kv_heads, &p.batch, w.block_kv);
    let v = tma_map(&p.v, p.dv, &p.skv, p.kv_heads, &p.batch, w.block_kv);
    vec![q, k, v]
}

// ---- the warp-specialised producer ------------------------------------------------------

/// Matrix descriptors (§9.7.15.5.1, "Matrix Descriptor Format"): start address >> 4 in bits
/// 0–13, leading byte offset >> 4 in 16–29, stride byte offset >> 4 in 32–45, the swizzle
/// mode in 62–63 (1: 128 bytes). Every operand tile here is stored as 128-byte rows (64
/// elements of its contiguous axis) XOR-swizzled by `row mod 8` in 1024-byte atoms of 8
/// rows, "slabs" of 64 columns one after the other ([`Smem::swz`]).
/// - Q [q, d] (A, K-major) and K [kv, d] (B, K-major): exactly the GEMM's operands
///   (`matmul::build_wgmma`): leading byte offset unused for swizzled K-major layouts (1),
///   stride byte offset 1024 (the next 8 rows of M or N); a k16 step is +32 bytes inside
///   the 128-byte row, the next 64 columns of d the next slab.
/// - V [kv, d] as B of P·V ([K = kv, N = d], N contiguous: **MN-major**, `imm-trans-b` 1),
///   see [`PrefillTc::mn_major`].
const K_MAJOR: i64 = (1i64 << 16) | (64i64 << 32) | (1i64 << 62);

impl<'a, 'ctx> PrefillTc<'a, 'ctx> {
    /// The MN-major 128-byte-swizzle canonical layout (§9.7.15.5.1; CUTLASS
    /// `make_gmma_desc<Major::MN>`: `Swizzle<3,4,3> o ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))`,
    /// T = 8 elements) is 64 contiguous N elements per 128-byte row, 8 rows of K per 1024-byte
    /// atom: the same bytes as a slab. The **stride** byte offset steps K by 8 rows (1024);
    /// the **leading** byte offset steps N by 64 columns (one atom along MN), i.e. the slab
    /// stride `block_kv · 128` — used only by an `n` over 64 (Dv = 128 in one `wgmma`; the
    /// `pv_split` schedules issue one n64 per slab and never use it). A k16 step is 16 rows:
    /// +2048 bytes, atom-aligned.
    fn mn_major(&self) -> i64 {
        (i64::from(self.bkv * 128 / 16) << 16) | (64i64 << 32) | (1i64 << 62)
    }

    /// The descriptor of the tile at shared address `addr` with the fixed bits `fixed`.
    fn desc(&self, k: &Kit<'ctx>, addr: IntValue<'ctx>, fixed: i64) -> R<IntValue<'ctx>> {
        let enc = k.lshr(k.and(addr, self.c32(0x3FFFF))?, 4)?;
        k.add(k.i64c(fixed), k.zext64(enc)?)
    }

    /// The full barrier of stage `st` (i32) of the mbarriers at `bars`.
    fn full(&self, k: &Kit<'ctx>, bars: IntValue<'ctx>, st: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        k.add(bars, k.shl(st, 3)?)
    }

    /// The empty barrier of stage `st`.
    fn empty(&self, k: &Kit<'ctx>, bars: IntValue<'ctx>, st: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        k.add(bars, k.shl(k.add(st, self.c32(WS_STAGES))?, 3)?)
    }

    /// Stage and phase parity of key tile t (i32): tile t fills stage t mod S in round t / S.
    fn ring(&self, k: &Kit<'ctx>, t: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        Ok((k.urem(t, self.c32(WS_STAGES))?, k.and(k.udiv(t, self.c32(WS_STAGES))?, self.c32(1))?))
    }

    /// The warp-specialised prologue: thread 0 initialises the mbarriers at `bars`, the
    /// kernel's one CTA-wide barrier, the producer warpgroup's loads
    /// ([`PrefillTc::producer_loads`]) after which it leaves, and the consumers' registers and
    /// wait for Q.
    pub(super) fn producer(&self, bars: IntValue<'ctx>, w: &WgSchedule) -> R<()> {
        let (kit, raw_tid) = (self.kit, self.raw_tid);
        let c32 = |v: u32| self.c32(v);
        let q_full = kit.add(bars, c32(16 * WS_STAGES))?;
        kit.if_then(kit.icmp(IntPredicate::EQ, raw_tid, c32(0))?, |k| {
            for i in 0..WS_STAGES {
                k.mbarrier_init(self.full(k, bars, c32(i))?, 1)?;
                k.mbarrier_init(self.empty(k, bars, c32(i))?, 4 * w.warpgroups)?;
            }
            k.mbarrier_init(q_full, 1)?;
            k.fence_mbarrier_init()
        })?;
        // The kernel's one CTA-wide barrier: the mbarriers initialised, for every role.
        kit.barrier()?;
        // The producer: its registers to the pool, then thread 0 issues every TMA copy, and
        // the warpgroup leaves.
        kit.return_if(kit.icmp(IntPredicate::ULT, raw_tid, c32(128))?, |k| {
            k.setmaxnreg(false, WS_PRODUCER_REGS)?;
            k.if_then(k.icmp(IntPredicate::EQ, raw_tid, c32(0))?, |k| self.producer_loads(k, bars, q_full))
        })?;
        kit.setmaxnreg(true, WS_CONSUMER_REGS)?;
        // Q landed (waited for even without key tiles: no copy is left in flight at exit).
        kit.mbarrier_wait_parity(q_full, c32(0))
    }

    /// The producer's thread 0: Q once, then each key tile's K and V into stage t mod S once
    /// the consumers have freed it (its empty barrier's previous phase: on the first round, a
    /// fresh barrier's phase −1 counts as complete, so the stages start free). It walks
    /// exactly the consumers' `n_tiles` tiles (the same expression of the CTA's indices), so
    /// every wait on either side has its arrival.
    fn producer_loads(&self, k: &Kit<'ctx>, bars: IntValue<'ctx>, q_full: IntValue<'ctx>) -> R<()> {
        let (p, sm, d, dv, bq, bkv) = (self.p, self.sm, self.d, self.dv, self.bq, self.bkv);
        let c32 = |v: u32| self.c32(v);
        let sbase = k.smem_addr(self.smem)?;
        let (hq, bz) = (k.sreg("ctaid.y")?, k.sreg("ctaid.z")?);
        let hkv = k.udiv(hq, c32((p.heads / p.kv_heads) as u32))?;
        let axes = |t: &T4, h: IntValue<'ctx>| -> Vec<IntValue<'ctx>> {
            let a = TmaAxes::of(t);
            let mut c = Vec::new();
            if a.head {
                c.push(h);
            }
            if a.batch {
                c.push(bz);
            }
            c
        };
        let (q_hb, k_hb, v_hb) = (axes(&p.q, hq), axes(&p.k, hkv), axes(&p.v, hkv));
        // A tile of `width` columns at shared offset `at`: one box per 64-column slab
        // of `rows` rows, rows from `row0` (i32).
        #[allow(clippy::too_many_arguments)]
        let boxes = |k: &Kit<'ctx>, map: usize, at: IntValue<'ctx>, width: u32, rows: u32, row0: IntValue<'ctx>, hb: &[IntValue<'ctx>], bar: IntValue<'ctx>| -> R<()> {
            for slab in 0..width / 64 {
                let mut c = vec![c32(64 * slab), row0];
                c.extend_from_slice(hb);
                k.tma_load(k.add(sbase, k.add(at, c32(slab * rows * 128))?)?, map, &c, bar)?;
            }
            Ok(())
        };
        k.mbarrier_arrive_expect_tx(q_full, bq * d * 2)?;
        boxes(k, 0, c32(0), d, bq, k.trunc32(self.q0)?, &q_hb, q_full)?;
        k.for_range(c32(0), self.n_tiles, c32(1), |k, t| {
            let (st, ph) = self.ring(k, t)?;
            k.mbarrier_wait_parity(self.empty(k, bars, st)?, k.xor(ph, c32(1))?)?;
            let bar = self.full(k, bars, st)?;
            k.mbarrier_arrive_expect_tx(bar, bkv * (d + dv) * 2)?;
            let k_sm = k.add(c32(sm.k[0]), k.mul(st, c32(sm.k[1] - sm.k[0]))?)?;
            let v_sm = k.add(c32(sm.v[0]), k.mul(st, c32(sm.v[1] - sm.v[0]))?)?;
            let j0 = k.mul(t, c32(bkv))?;
            boxes(k, 1, k_sm, d, bkv, j0, &k_hb, bar)?;
            boxes(k, 2, v_sm, dv, bkv, j0, &v_hb, bar)
        })
    }
}

// ---- the wgmma products and the key loops ------------------------------------------------

// Fragment coordinates index several parallel arrays at once: index loops read better here.
#[allow(clippy::needless_range_loop)]
impl<'a, 'ctx> Tiles<'a, 'ctx> {
    /// S = Q·Kᵀ on `wgmma` (K at `k_sm`): m64n{bkv}k16 per 16 columns of d, A = the
    /// warpgroup's Q rows, B = the K tile, as one group, `in_flight` groups left pending;
    /// this warp's 16 rows come back in the m16n8 C layout of each n8 tile (`bkv / 2` floats).
    pub(super) fn qk_wg(&self, k: &Kit<'ctx>, k_sm: IntValue<'ctx>, in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
        let (bq, bkv) = (self.bq, self.bkv);
        let c32 = |v: u32| self.c32(v);
        let k_addr = k.add(self.f.sbase, k_sm)?;
        let descs = (0..self.d / self.kstep)
            .map(|ks| {
                let (slab, kb) = (ks / 4, (ks % 4) * 32);
                Ok((self.desc(k, k.add(self.f.q_wg, c32(slab * bq * 128 + kb))?, K_MAJOR)?, self.desc(k, k.add(k_addr, c32(slab * bkv * 128 + kb))?, K_MAJOR)?))
            })
            .collect::<R<Vec<_>>>()?;
        k.wgmma_k_tile(self.ein, bkv, &vec![self.zero; (bkv / 2) as usize], &descs, in_flight)
    }

    /// O += P·V on `wgmma` (V at `v_sm`, P in `pa`). Each of the `pv_parts` groups is waited
    /// for at once, or with `overlapped` (one Q·Kᵀ group issued before them) none is: part i's
    /// wait leaves its `2 + i` groups pending.
    pub(super) fn pv_wgmma(&self, k: &Kit<'ctx>, v_sm: IntValue<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>], overlapped: bool) -> R<()> {
        let (dv, bkv, n_nt, pv_parts) = (self.dv, self.bkv, self.n_nt, self.pv_parts);
        let c32 = |v: u32| self.c32(v);
        if self.fp8.is_some() {
            // A = P's e4m3 fragments (k-step kk: the 32 keys 32kk..), B = Vᵀ (K-major, its
            // k positions permuted as `pack` needs): one m64n{Dv}k32 per 32 keys.
            let vt_addr = k.add(self.f.sbase, get_i32(k, self.vt_var.ok_or_else(|| k.err("no Vᵀ offset"))?)?)?;
            let flat: Vec<PointerValue<'ctx>> = self.acc[0].iter().flatten().copied().collect();
            let steps = (0..n_nt / 4).map(|kk| Ok((pa[0][kk], self.desc(k, k.add(vt_addr, c32(kk as u32 * 32))?, K_MAJOR)?))).collect::<R<Vec<_>>>()?;
            let cur: Vec<FloatValue<'ctx>> = flat.iter().map(|&a| k.get_f(a)).collect::<R<_>>()?;
            let out = k.wgmma_rs_k_tile(self.ein, dv, &cur, &steps, false, if overlapped { 2 } else { 0 })?;
            for (&a, v) in flat.iter().zip(out) {
                k.set(a, v.into())?;
            }
            return Ok(());
        }
        // A = P from registers (k-step kk: keys 16kk..), B = V rows 16kk.. of
        // each slab (MN-major, see `mn_major`): Dv / n products of m64n{n}k16.
        let n = dv / pv_parts;
        let v_addr = k.add(self.f.sbase, v_sm)?;
        let flat: Vec<PointerValue<'ctx>> = self.acc[0].iter().flatten().copied().collect();
        for part in 0..pv_parts as usize {
            let steps = (0..n_nt / 2)
                .map(|kk| Ok((pa[0][kk], self.desc(k, k.add(v_addr, c32(part as u32 * bkv * 128 + kk as u32 * 2048))?, self.mn_major())?)))
                .collect::<R<Vec<_>>>()?;
            let regs = &flat[part * (n / 2) as usize..(part + 1) * (n / 2) as usize];
            let cur: Vec<FloatValue<'ctx>> = regs.iter().map(|&a| k.get_f(a)).collect::<R<_>>()?;
            let out = k.wgmma_rs_k_tile(self.dt, n, &cur, &steps, true, if overlapped { 2 + part as u32 } else { 0 })?;
            for (&a, v) in regs.iter().zip(out) {
                k.set(a, v.into())?;
            }
        }
        Ok(())
    }

    /// fp8: V_t (keys outer, as stored) at `v_sm` → Vᵀ at `vt_sm`, the K-major B operand of
    /// P·V (8-bit `wgmma` has no transposed B). Thread u of the CTA takes a 4-key × 16-column
    /// block: keys a, a + 1, a + 8, a + 9 (a = 32·g + 16·hh + 2·t, the keys lane t4 = t holds
    /// in n8 tiles 4g + 2hh and 4g + 2hh + 1 of S) and V columns 16·cn ..: four 16-byte row
    /// reads, four 4×4 byte transposes, and column n's four bytes are one 32-bit word of
    /// Vᵀ row n at k positions 32g + 16hh + 4t .. +3 (`pack`'s A fragment order). Vᵀ
    /// rows are 128-byte swizzled (chunk c of row n at c xor (n mod 8)). Every thread's
    /// `wgmma`s of the previous tile were waited for before the barrier that precedes
    /// this, so the one Vᵀ buffer is free.
    pub(super) fn transpose_v(&self, k: &Kit<'ctx>, v_sm: IntValue<'ctx>, vt_sm: IntValue<'ctx>) -> R<()> {
        let (bkv, threads, sm, smem) = (self.bkv, self.threads, self.sm, self.smem);
        let c32 = |v: u32| self.c32(v);
        let ng = bkv / 32;
        let units = bkv * self.dv / 64;
        for i in 0..units.div_ceil(threads) {
            let u = k.add(self.tid, c32(i * threads))?;
            let go = |k: &Kit<'ctx>| -> R<()> {
                let t = k.and(u, c32(3))?;
                let cn0 = k.and(k.lshr(u, 2)?, c32(1))?;
                let hh = k.and(k.lshr(u, 3)?, c32(1))?;
                let r = k.lshr(u, 4)?;
                let g = k.urem(r, c32(ng))?;
                let cn = k.add(k.mul(k.udiv(r, c32(ng))?, c32(2))?, cn0)?;
                let a = k.add(k.add(k.mul(g, c32(32))?, k.mul(hh, c32(16))?)?, k.mul(t, c32(2))?)?;
                let rows = [0u32, 1, 8, 9].map(|o| -> R<Vec<IntValue<'ctx>>> {
                    let at = self.sm_at(k, v_sm, bkv, sm.ldv, k.add(a, c32(o))?, cn)?;
                    load_i32s(k, k.sh_at(smem, at)?, 4)
                });
                let rows: Vec<Vec<IntValue<'ctx>>> = rows.into_iter().collect::<R<_>>()?;
                let kc = k.add(k.mul(g, c32(2))?, hh)?; // k-position chunk of the word
                for w in 0..4u32 {
                    let cols = k.transpose_bytes_4x4([rows[0][w as usize], rows[1][w as usize], rows[2][w as usize], rows[3][w as usize]])?;
                    for (b, &word) in cols.iter().enumerate() {
                        let n = k.add(k.mul(cn, c32(16))?, c32(4 * w + b as u32))?;
                        let chunk = k.xor(kc, k.and(n, c32(7))?)?;
                        let at = k.add(vt_sm, k.add(k.mul(n, c32(128))?, k.add(k.shl(chunk, 4)?, k.shl(t, 2)?)?)?)?;
                        store_i32s(k, k.sh_at(smem, at)?, &[word])?;
                    }
                }
                Ok(())
            };
            if (i + 1) * threads <= units {
                go(k)?;
            } else {
                k.if_then(k.icmp(IntPredicate::ULT, u, c32(units))?, go)?;
            }
        }
        Ok(())
    }

    /// fp8, the plain loop: V's stage of tile t (three stages, t mod 3).
    pub(super) fn v_stage(&self, k: &Kit<'ctx>, t: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let (sm, c32) = (self.sm, |v: u32| self.c32(v));
        let r = k.urem(t, c32(3))?;
        k.select_int(k.icmp(IntPredicate::EQ, r, c32(0))?, c32(sm.v[0]), k.select_int(k.icmp(IntPredicate::EQ, r, c32(1))?, c32(sm.v[1]), c32(sm.v2))?)
    }

    /// fp8, the plain loop: the Vᵀ buffer of tile t (t mod 2).
    fn vt_of(&self, k: &Kit<'ctx>, t: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let (sm, c32) = (self.sm, |v: u32| self.c32(v));
        k.add(c32(sm.vt[0]), k.mul(k.and(t, c32(1))?, c32(sm.vt[1] - sm.vt[0]))?)
    }

    /// fp8, the plain loop: V of tile t into its stage t mod 3.
    pub(super) fn issue_v3(&self, k: &Kit<'ctx>, t: IntValue<'ctx>) -> R<()> {
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(self.bkv)))?;
        self.copy_rows(k, self.bkv, self.dv / self.epc, self.sm.ldv, self.v_stage(k, t)?, self.v_ptr, k.add(self.v_base, k.mul(j0, self.v_ss)?)?, self.v_ss, k.sub(self.skv, j0)?)
    }

    /// fp8, the plain loop: every warpgroup issues its S = Q·K_tᵀ (for every tile of the CTA,
    /// so that the issue and its wait are under no condition ptxas cannot prove uniform; a
    /// causal CTA's upper warpgroup computes up to one fully masked tile it then skips), the
    /// threads transpose V_{t+1} into the other Vᵀ buffer while it runs (on the last tile, a
    /// stage no tile reads: harmless), then wait for it and fence the async proxy for the
    /// transposed bytes (PTX ISA §9.7.15.1; the next tile's barrier publishes them). ptxas
    /// crashes on a fence between the issue and the wait (see the design notes).
    pub(super) fn qk_fp8_ahead(&self, k: &Kit<'ctx>, t: IntValue<'ctx>, next: IntValue<'ctx>) -> R<Vec<FloatValue<'ctx>>> {
        let pending = self.qk_wg(k, self.stage_of(k, t)?.0, 1)?;
        self.transpose_v(k, self.v_stage(k, next)?, self.vt_of(k, next)?)?;
        let out = k.wgmma_wait_group(&pending, 0)?;
        k.fence_proxy_async()?;
        if let Some(v) = self.vt_var {
            k.set(v, self.vt_of(k, t)?.into())?;
        }
        Ok(out)
    }

    /// The S accumulators of one warp (`wgmma` C layout) as [`CFrag`] of one slab.
    fn sacc_of(&self, out: &[FloatValue<'ctx>]) -> CFrag<'ctx> {
        vec![(0..self.n_nt).map(|n| [out[4 * n], out[4 * n + 1], out[4 * n + 2], out[4 * n + 3]]).collect::<Vec<_>>()]
    }

    /// FlashAttention-3's intra-warpgroup pipelining (arXiv 2407.08608 §3.2, Algorithm 2):
    /// iteration t issues S_t = Q·K_tᵀ, then O += P_{t−1}·V_{t−1}, waits for S_t alone and
    /// runs its softmax while the P·V group is in flight, then waits for it and rescales O by
    /// α_t. The same operations in the same order as the plain loop (O is rescaled by α_t
    /// after P_{t−1}·V_{t−1} is added, before P_t·V_t), so the same results.
    /// - P_{t−1} crosses the back edge in registers (`pa_prev`), and is an operand of the
    ///   wait for its P·V: the `wgmma` reads A registers asynchronously (§9.7.15.6), so
    ///   P_t, packed during the softmax, must not take P_{t−1}'s registers while it runs.
    /// - ptxas serializes every `wgmma` (C7520) when a group is in flight across a branch
    ///   it cannot prove uniform, and a warpgroup's tile range (`grp_end`) comes from the
    ///   thread index: so every warpgroup walks all `n_tiles` tiles (a causal CTA's upper
    ///   warpgroup computes up to one tile above its diagonal, fully masked: α = 1, p = 0,
    ///   and the non-finite scan of V keeps the products exact), and the rare CUDA-core
    ///   P·V (non-finite V where p = 0) takes a separate, unpipelined iteration.
    /// - Loads: iteration t takes K_{t+1} and V_t (V one tile later than K), so its barrier
    ///   finds K_t and V_{t−1} landed, and the stages it overwrites — K_{t−1}'s (its Q·Kᵀ
    ///   was waited for in iteration t − 1) and V_{t−2}'s (its P·V too) — are free in
    ///   every warpgroup. One iteration more than there are tiles, for the last P·V.
    pub(super) fn overlap_loop(&self) -> R<()> {
        let (kit, n_tiles) = (self.kit, self.n_tiles);
        let c32 = |v: u32| self.c32(v);
        // (fp8: 32-key steps, half as many.)
        let pa_prev: Vec<[PointerValue<'ctx>; 4]> = (0..self.n_nt / if self.fp8.is_some() { 4 } else { 2 }).map(|_| Ok([kit.var_i(c32(0))?, kit.var_i(c32(0))?, kit.var_i(c32(0))?, kit.var_i(c32(0))?])).collect::<R<_>>()?;
        kit.for_range(c32(0), kit.add(n_tiles, c32(1))?, c32(1), |k, t| self.overlap_tile(k, t, &pa_prev))
    }

    /// P's A registers into `pa_prev`, for the next iteration.
    fn keep_pa(&self, k: &Kit<'ctx>, pa_prev: &[[PointerValue<'ctx>; 4]], pa: &[Vec<[IntValue<'ctx>; 4]>]) -> R<()> {
        for (v, w) in pa_prev.iter().zip(&pa[0]) {
            for e in 0..4 {
                k.set(v[e], w[e].into())?;
            }
        }
        Ok(())
    }

    /// P_{t−1}'s A registers, from `pa_prev`.
    fn pa_old(&self, k: &Kit<'ctx>, pa_prev: &[[PointerValue<'ctx>; 4]]) -> R<AFrag<'ctx>> {
        let i32t = k.i32t;
        Ok(vec![pa_prev.iter().map(|v| Ok([k.get_i(v[0], i32t)?, k.get_i(v[1], i32t)?, k.get_i(v[2], i32t)?, k.get_i(v[3], i32t)?])).collect::<R<Vec<_>>>()?])
    }

    /// Iteration t of [`Tiles::overlap_loop`]: the copies, fp8's Vᵀ of V_{t−1}, whether tile
    /// t − 1's P·V must go the CUDA-core way, then an unpipelined iteration (the first tile,
    /// or after the CUDA-core P·V) or a pipelined one ([`Tiles::overlap_steady`]).
    fn overlap_tile(&self, k: &Kit<'ctx>, t: IntValue<'ctx>, pa_prev: &[[PointerValue<'ctx>; 4]]) -> R<()> {
        let (n_tiles, bkv) = (self.n_tiles, self.bkv);
        let c32 = |v: u32| self.c32(v);
        k.cp_async_wait(0)?;
        k.fence_proxy_async()?;
        k.barrier()?;
        let next = k.add(t, c32(1))?;
        k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| self.issue_k(k, next))?;
        k.if_then(k.icmp(IntPredicate::SLT, t, n_tiles)?, |k| self.issue_v(k, t))?;
        k.cp_async_commit()?;
        if self.fp8.is_some() {
            // V_{t−1} (landed) → Vᵀ for this iteration's P_{t−1}·V_{t−1}: its previous
            // readers, P_{t−2}·V_{t−2}, were waited for in iteration t − 1. The writers
            // fence the async proxy, then the barrier (CTA-uniform condition).
            k.if_then(k.icmp(IntPredicate::SGT, t, c32(0))?, |k| {
                self.transpose_v(k, self.stage_of(k, k.sub(t, c32(1))?)?.1, c32(self.sm.vt[0]))?;
                k.fence_proxy_async()?;
                k.barrier()
            })?;
        }
        let j0 = k.mul(t, c32(bkv))?;
        let jp = k.sub(j0, c32(bkv))?;
        // Uniform in the CTA (the trip count is), which ptxas sees.
        let cur = k.icmp(IntPredicate::SLT, t, n_tiles)?;
        let prev = k.icmp(IntPredicate::SGT, t, c32(0))?;
        let (k_sm, _) = self.stage_of(k, t)?;
        let (_, vp_sm) = self.stage_of(k, k.sub(t, c32(1))?)?;
        let vp_at = k.sh_at(self.smem, k.add(vp_sm, self.f.v_lane)?)?; // (the mma.sync form's; unused)
        let slow = var_i32(k, c32(0))?;
        k.if_then(prev, |k| {
            let s = self.decide_slow(k, jp, vp_sm)?;
            k.set(slow, k.select_int(s, c32(1), c32(0))?.into())
        })?;
        let slow = k.icmp(IntPredicate::NE, get_i32(k, slow)?, c32(0))?;
        k.if_else(
            or(k, slow, not(k, prev)?)?,
            |k| {
                // The first tile, or tile t − 1's CUDA-core P·V: tile t as the plain loop
                // does, nothing left in flight.
                k.if_then(slow, |k| self.pv_slow(k, jp, vp_sm, &self.pa_old(k, pa_prev)?))?;
                k.if_then(cur, |k| {
                    let out = self.qk_wg(k, k_sm, 0)?;
                    let sacc = self.sacc_of(&out);
                    self.scores(k, j0, &sacc)?;
                    let (pf, rescale, alphas) = self.softmax(k)?;
                    self.rescale_acc(k, rescale, &alphas)?;
                    self.keep_pa(k, pa_prev, &self.pack(k, &pf)?)
                })
            },
            |k| {
                k.if_else(
                    cur,
                    |k| self.overlap_steady(k, j0, k_sm, vp_sm, vp_at, pa_prev),
                    // The last tile's P·V.
                    |k| self.pv_tc(k, vp_sm, vp_at, &self.pa_old(k, pa_prev)?, false),
                )
            },
        )
    }

    /// A pipelined iteration: no branch from here to the last wait — S_t's group, then the
    /// `pv_parts` P·V groups of tile t − 1 (V at `vp_sm`), S_t waited for alone, its softmax,
    /// then the wait for the P·V and O's rescaling.
    fn overlap_steady(&self, k: &Kit<'ctx>, j0: IntValue<'ctx>, k_sm: IntValue<'ctx>, vp_sm: IntValue<'ctx>, vp_at: PointerValue<'ctx>, pa_prev: &[[PointerValue<'ctx>; 4]]) -> R<()> {
        let f32t = k.f32t;
        let flat: Vec<PointerValue<'ctx>> = self.acc[0].iter().flatten().copied().collect();
        let s_next = self.qk_wg(k, k_sm, 1)?;
        let pa = self.pa_old(k, pa_prev)?;
        self.pv_tc(k, vp_sm, vp_at, &pa, true)?;
        let out = k.wgmma_wait_group(&s_next, self.pv_parts)?;
        let sacc = self.sacc_of(&out);
        self.scores(k, j0, &sacc)?;
        let (pf, rescale, alphas) = self.softmax(k)?;
        let pa_new = self.pack(k, &pf)?;
        // O readable again (P_{t−1} free): the P·V groups done. ptxas schedules a wait as
        // early as its basic block allows, so it is in each arm of the rescaling branch,
        // after the softmax, not in the softmax's block; the branch is the warpgroup's
        // decision (`bar.red.or`: a `wgmma.wait_group` under a condition must see the whole
        // warpgroup take the same way, §9.7.15.7.3), rescaling when any of its rows has a new
        // maximum (α = 1 exactly for the others).
        let mut o: Vec<FloatValue<'ctx>> = flat.iter().map(|&a| k.get_f(a)).collect::<R<_>>()?;
        for w in pa[0].iter().flatten() {
            o.push(k.math(|kb| Ok(kb.b.build_bit_cast(*w, f32t, "")?.into_float_value()))?);
        }
        let wait = |k: &Kit<'ctx>, note: &str| -> R<()> {
            for (&a, v) in flat.iter().zip(k.wgmma_wait_group_noted(&o, 0, note)?) {
                k.set(a, v.into())?;
            }
            Ok(())
        };
        k.if_else(
            k.bar_red_or(k.add(self.wg_id, self.c32(1))?, 128, rescale)?,
            |k| {
                wait(k, "rescale")?;
                for &(mi, hh, alpha) in &alphas {
                    for a in &self.acc[mi] {
                        for e in [2 * hh, 2 * hh + 1] {
                            k.set(a[e], k.fmul(k.get_f(a[e])?, alpha)?.into())?;
                        }
                    }
                }
                Ok(())
            },
            |k| wait(k, "as is"),
        )?;
        self.keep_pa(k, pa_prev, &pa_new)
    }

    /// The warp-specialised consumers: per key tile, wait for its stage's full barrier (the
    /// TMA's bytes landed: acquire, so the generic loads of the non-finite scan see them too),
    /// compute it as the plain loop does when the warpgroup sees any of its keys, then free
    /// the stage: each warp, converged after its last read of it (the `wgmma`s waited for,
    /// the scans behind the warpgroup's `bar.red`), arrives on its empty barrier from lane 0.
    /// Every warp walks all `n_tiles` tiles and frees each once, so the producer, walking the
    /// same tiles, is never left waiting.
    ///
    /// Ping-pong (FlashAttention-3 §3.1): warpgroup c waits at its scheduling barrier `3 + c`
    /// before issuing S = Q·Kᵀ and, once it is issued, signals the other's (`bar.arrive`, 256
    /// threads: the other warpgroup's 128 waiting and this one's 128) — so the warpgroups
    /// issue their products in turn and one's softmax and P·V run while the other's Q·Kᵀ
    /// does. Warpgroup 0 goes first (it signals its own barrier once before the loop) and
    /// waits once more after it, for warpgroup 1's last signal: on each barrier every phase
    /// has its 128 waiting and 128 arriving threads, and none is left half full at exit.
    /// Tiles a warpgroup skips (above its causal diagonal) still take their turn, so the
    /// counts match whatever the tiles.
    pub(super) fn ws_loop(&self, bars: IntValue<'ctx>) -> R<()> {
        let (kit, n_tiles, wg_id, pingpong) = (self.kit, self.n_tiles, self.wg_id, self.pingpong);
        let c32 = |v: u32| self.c32(v);
        let mine = kit.add(wg_id, c32(3))?;
        let other = kit.sub(c32(4), wg_id)?;
        let first_wg = kit.and(kit.icmp(IntPredicate::EQ, wg_id, c32(0))?, kit.icmp(IntPredicate::SGT, n_tiles, c32(0))?)?;
        if pingpong {
            kit.if_then(first_wg, |k| k.bar_arrive(mine, 256))?;
        }
        let lane0 = kit.icmp(IntPredicate::EQ, self.lane, c32(0))?;
        kit.for_range(c32(0), n_tiles, c32(1), |k, t| {
            let (st, ph) = self.ring(k, t)?;
            k.mbarrier_wait_parity(self.full(k, bars, st)?, ph)?;
            if pingpong {
                k.bar_sync(mine, 256)?;
            }
            let j0 = k.mul(t, c32(self.bkv))?;
            k.if_else(
                k.icmp(IntPredicate::SLT, j0, self.grp_end)?,
                |k| {
                    let (k_sm, v_sm) = self.stage_of(k, t)?;
                    let v_at = k.sh_at(self.smem, k.add(v_sm, self.f.v_lane)?)?;
                    // S = Q·Kᵀ: issued, the other warpgroup signalled, then waited for.
                    let out = if pingpong {
                        let out = self.qk_wg(k, k_sm, 1)?;
                        k.bar_arrive(other, 256)?;
                        k.wgmma_wait_group(&out, 0)?
                    } else {
                        self.qk_wg(k, k_sm, 0)?
                    };
                    let sacc = self.sacc_of(&out);
                    self.scores(k, j0, &sacc)?;
                    let (pf, rescale, alphas) = self.softmax(k)?;
                    self.rescale_acc(k, rescale, &alphas)?;
                    let pa = self.pack(k, &pf)?;
                    let slow = self.decide_slow(k, j0, v_sm)?;
                    k.if_else(slow, |k| self.pv_slow(k, j0, v_sm, &pa), |k| self.pv_tc(k, v_sm, v_at, &pa, false))
                },
                |k| if pingpong { k.bar_arrive(other, 256) } else { Ok(()) },
            )?;
            k.warp_sync()?;
            k.if_then(lane0, |k| k.mbarrier_arrive(self.empty(k, bars, st)?))
        })?;
        if pingpong {
            kit.if_then(first_wg, |k| k.bar_sync(mine, 256))?;
        }
        Ok(())
    }
}
