//! Prefill attention on tensor cores: FlashAttention-2 (Dao 2023, arXiv 2307.08691,
//! Algorithm 1 and §3.3) with `mma.sync.m16n8k16`, the default for bf16/f16 prefill attention;
//! and the kernel struct ([`PrefillTc`], [`Tiles`]) whose sections the `wgmma` form
//! (`prefill_wgmma.rs`) shares.
//!
//! # Schedule ([`TcSchedule`])
//! A CTA of `warps` warps owns `block_q = 16·m_tiles·warps` query rows of one (batch, head);
//! warp `w` owns `m_tiles` slabs of 16 rows (the M of one `mma`). Per key tile of `block_kv`:
//! - **Loads**: Q (once), then K and V go global → shared with 16-byte `cp.async`, rows past
//!   the sequence zero-filled, double buffered (tile `j + 1` lands while tile `j` computes);
//!   shared rows are padded by 16 bytes, so each `ldmatrix` phase hits distinct banks.
//! - **S = Q·Kᵀ** with `mma.m16n8k16.row.col`: Q's A fragments from `ldmatrix.x4` (kept in
//!   registers when `q_in_regs`), K as the "col" B operand.
//! - **Online softmax** in f32: each lane holds rows `g = lane/4` and `g + 8` of each slab
//!   (the m16n8 C layout); maxima over the quad with `shfl.sync.bfly`; `p = 2^((s − m)·c)`
//!   over raw scores with `ex2.approx.ftz` (c = scale·log2 e) when the scale is positive and
//!   there is no mask, else `p = 2^((x − m)·log2 e)` over natural-unit scores `x = scale·s +
//!   mask`: the difference always first, so finite extremes (scores of 1e20, a mask of
//!   −3.4e38) stay exact ([`PrefillTc::fused`]); the accumulator's rescaling is skipped when
//!   no row of the warp has a new maximum.
//! - **O += P·V**: the S accumulators of two adjacent n8 tiles, rounded to bf16/f16 pairs, are
//!   the A fragment; V through `ldmatrix.x4.trans`.
//! - **Output**: `acc / l` rounded once, staged through shared memory, 16-byte stores; then,
//!   with `lse=true`, `m·ln 2 + ln l` from the first lane of each quad.
//!
//! # Exact products
//! Every visible key is multiplied, a masked one (score −inf) with `p = 0` as in the
//! reference, so NaN or ±inf in its V row gives NaN. Keys the reference never multiplies
//! (hidden by the causal mask or the window) are multiplied by `p = 0` here too, which is
//! exact for finite V only. So on each tile where such
//! a product exists the warp scans the V rows concerned for non-finite values and, if it finds
//! one, computes that tile's `P·V` on CUDA cores, multiplying exactly the interpreter's
//! products ([`Tiles::decide_slow`], [`Tiles::pv_slow`]).
//!
//! # Sliding window and softcap
//! With `window = W` the key loop starts at the tile holding the CTA's first row's first
//! visible key (the tiles below it are never loaded), a warp skips the tiles wholly below its
//! first row's window, and a tile below some row's window start is masked (those keys score
//! −inf) and counts as holding products the reference does not make (its V rows are scanned
//! for non-finite values, [`Tiles::decide_slow`]). With `softcap = c` the scores are in
//! natural units (not `fused`) and each is `c·tanh(s/c)` before the mask.
//!
//! # What it takes
//! bf16 or f16; head dims multiples of 16 up to 256; q, k and v rows contiguous and 16-byte
//! aligned, as 16-byte `cp.async` needs ([`super::schedule::eligible`]).
//!
//! Design notes: book/src/design/attention.md

use inkwell::context::Context;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Family, LaunchPlan};

use super::analysis::{cap_score, shared_kind, unsupported, Mask, Prefill, T4};
use super::schedule::{eligible, TcSchedule, TcSmem as Smem, WgSchedule, WS_STAGES};
use crate::isa::kit::{Kit, SharedKind, R};
use crate::target::Target;

/// The launch plan of the tensor-core kernel for `p` with schedule `s`.
///
/// # Errors
/// [`crate::error::CodegenError::Unsupported`] when `p` is not [`eligible`], the schedule is invalid or
/// its shared memory exceeds the target's; LLVM errors otherwise.
pub(super) fn plan(p: &Prefill, target: &Target, s: &TcSchedule) -> R<LaunchPlan> {
    let fam = Family::Attention;
    s.check().map_err(|e| unsupported(&p.name, fam, e))?;
    eligible(p).map_err(|e| unsupported(&p.name, fam, e))?;
    let sm = Smem::new(s, p.d, p.dv);
    let shared = shared_kind(sm.total, target, &p.name, fam)?;
    let ctx = Context::create();
    let entry = format!("{}_attention", p.name);
    let (ptx, params) = Kit::build(&ctx, &entry, *target, p.n_inputs, p.n_buffers - p.n_inputs, &p.dims(), s.threads(), |kit| {
        kit.launch_bounds(s.threads());
        build(kit, p, s, &sm, shared, None)
    })?;
    Ok(p.launch_plan(target, (entry, ptx, params), s.block_q(), s.threads(), shared))
}

// ---- small emitters --------------------------------------------------------------------

pub(super) fn or<'ctx>(k: &Kit<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.math(|kb| Ok(kb.b.build_or(a, b, "")?))
}

pub(super) fn not<'ctx>(k: &Kit<'ctx>, a: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.math(|kb| Ok(kb.b.build_not(a, "")?))
}

/// `ex2.approx.ftz.f32` (PTX ISA §9.7.3.23): one `MUFU.EX2`, a result below 2⁻¹²⁶ flushed to
/// 0 (without `.ftz` ptxas wraps each in a range check and two multiplications to keep
/// subnormal results). A flushed probability weighs under 2⁻¹²⁶ of its row's; a flushed
/// rescaling factor drops an accumulator whose maximum grew by more than 126 (log2 units).
fn ex2_ftz<'ctx>(k: &Kit<'ctx>, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    k.math(|kb| Ok(kb.intrinsic_value("llvm.nvvm.ex2.approx.ftz", &[kb.cx.f32_type().into()], &[x.into()])?.into_float_value()))
}

/// Loads an integer vector of `n` i32s (or one i32) from shared memory at `ptr`, aligned to
/// its size.
pub(super) fn load_i32s<'ctx>(k: &Kit<'ctx>, ptr: PointerValue<'ctx>, n: u32) -> R<Vec<IntValue<'ctx>>> {
    k.math(|kb| {
        let i32t = kb.cx.i32_type();
        if n == 1 {
            return Ok(vec![kb.load(i32t.into(), ptr, 4)?.into_int_value()]);
        }
        let v = kb.load(i32t.vec_type(n).into(), ptr, 4 * n)?.into_vector_value();
        (0..n).map(|i| Ok(kb.b.build_extract_element(v, i32t.const_int(u64::from(i), false), "")?.into_int_value())).collect()
    })
}

/// Stores i32s as one vector access (aligned to its size) at `ptr`.
pub(super) fn store_i32s<'ctx>(k: &Kit<'ctx>, ptr: PointerValue<'ctx>, vals: &[IntValue<'ctx>]) -> R<()> {
    k.math(|kb| {
        let i32t = kb.cx.i32_type();
        if vals.len() == 1 {
            return kb.store(ptr, vals[0].into(), 4);
        }
        let mut v = i32t.vec_type(vals.len() as u32).get_poison();
        for (i, x) in vals.iter().enumerate() {
            v = kb.b.build_insert_element(v, *x, i32t.const_int(i as u64, false), "")?;
        }
        kb.store(ptr, BasicValueEnum::from(v), 4 * vals.len() as u32)
    })
}

/// P's power-of-two scale in the fp8 kernel (log2): probabilities are 2⁸·p ∈ [0, 256] before
/// they are rounded to e4m3 (max 448), so that e4m3's normal range (down to 2⁻⁶) covers
/// p ≥ 2⁻¹⁴ and its subnormals p ≥ 2⁻¹⁷, rather than 2⁻⁶ and 2⁻⁹ unscaled. The row sum l carries
/// the same factor, so it cancels exactly in acc / l.
const FP8_P_LOG2: u32 = 8;

/// Whether any of the `f8e4m3` bytes packed in the i32s `words` is NaN (`S.1111.111`; e4m3 has
/// no infinities), as an i1: a byte `b` is NaN when `(b & 0x7f) xor 0x7f` is zero, found
/// with the "has a zero byte" test `(y − 0x01010101) & ~y & 0x80808080` (no false positives:
/// `y`'s bytes are below 0x80).
fn any_nan_e4m3<'ctx>(k: &Kit<'ctx>, words: &[IntValue<'ctx>]) -> R<IntValue<'ctx>> {
    let mut acc = k.i32c(0);
    for &w in words {
        let y = k.xor(k.and(w, k.i32c(0x7f7f_7f7f))?, k.i32c(0x7f7f_7f7f))?;
        let z = k.and(k.and(k.sub(y, k.i32c(0x0101_0101))?, not(k, y)?)?, k.i32c(0x8080_8080u32 as i32))?;
        acc = or(k, acc, z)?;
    }
    k.icmp(IntPredicate::NE, acc, k.i32c(0))
}

/// Whether any lane of the warp has `flag` (i1) set, in every lane (`vote.sync.any`).
fn warp_any<'ctx>(k: &Kit<'ctx>, flag: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.math(|kb| kb.vote_any(flag))
}

/// A mutable i32 (a prologue alloca).
pub(super) fn var_i32<'ctx>(k: &Kit<'ctx>, init: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
    k.var_i(init)
}

pub(super) fn get_i32<'ctx>(k: &Kit<'ctx>, p: PointerValue<'ctx>) -> R<IntValue<'ctx>> {
    k.get_i(p, k.i32t)
}

/// Whether any of the 16-bit floats (exponent mask `e`) packed in the i32s `words` is ±inf or
/// NaN, as an i1: per word, a half is non-finite when `~w & e` is zero there, and a zero half
/// is found with the "has a zero lane" test `(x − 0x0001_0001) & ~x & 0x8000_8000` (no false
/// positives: `x`'s halves are multiples of the exponent's lowest bit and below 0x8000).
fn any_nonfinite<'ctx>(k: &Kit<'ctx>, words: &[IntValue<'ctx>], e: u32) -> R<IntValue<'ctx>> {
    let m = k.i32c((e | (e << 16)) as i32);
    let mut acc = k.i32c(0);
    for &w in words {
        let x = k.and(not(k, w)?, m)?;
        let y = k.sub(x, k.i32c(0x0001_0001))?;
        let z = k.and(k.and(y, not(k, x)?)?, k.i32c(0x8000_8000u32 as i32))?;
        acc = or(k, acc, z)?;
    }
    k.icmp(IntPredicate::NE, acc, k.i32c(0))
}

// ---- the kernel --------------------------------------------------------------------------

/// Per-thread row facts: for slab `mi` and half `h` (rows `g` and `g + 8`).
pub(super) struct Rows<'ctx> {
    /// Key limit of the row (i32): keys `j < limit` are visible.
    pub(super) limit: Vec<[IntValue<'ctx>; 2]>,
    /// With a sliding window, the row's first visible key (i32): keys `start ≤ j` are visible.
    pub(super) start: Vec<[IntValue<'ctx>; 2]>,
    /// Whether the row exists (< Sq).
    pub(super) valid: Vec<[IntValue<'ctx>; 2]>,
    /// Query row index (i64).
    pub(super) index: Vec<[IntValue<'ctx>; 2]>,
}

/// Per warp, slab and n8 tile, the four f32 values of the m16n8 C layout (S, P or O).
pub(super) type CFrag<'ctx> = Vec<Vec<[FloatValue<'ctx>; 4]>>;
/// Per slab and k-step, the four registers of an A fragment (P packed for P·V).
pub(super) type AFrag<'ctx> = Vec<Vec<[IntValue<'ctx>; 4]>>;
/// Each row's rescaling factor α: (slab, half, α).
pub(super) type Alphas<'ctx> = Vec<(usize, usize, FloatValue<'ctx>)>;

/// Emits the tensor-core prefill kernel (`mma.sync`, or with `wg` the `wgmma` forms; see the
/// module docs of this file and of [`super::prefill_wgmma`]): the CTA's indices
/// ([`PrefillTc::new`]), Q and the first key tile ([`PrefillTc::prologue`]), the fragments'
/// addresses, the per-thread state, the key loop (overlapped, warp-specialised or plain) and
/// the epilogue (O, then the log-sum-exp).
pub(super) fn build<'ctx>(kit: &Kit<'ctx>, p: &Prefill, s: &TcSchedule, sm: &Smem, shared: SharedKind, wg: Option<&WgSchedule>) -> R<()> {
    let c = PrefillTc::new(kit, p, s, sm, shared, wg)?;
    if let Some(byte) = debug_smem_fill() {
        c.fill_smem(byte)?;
    }
    let bars = c.prologue()?;
    let f = c.fragments()?;
    let t = Tiles::new(&c, f)?;
    if c.overlap {
        t.overlap_loop()?;
    } else if let Some(bars) = bars {
        t.ws_loop(bars)?;
    } else {
        t.plain_loop()?;
    }
    let outs = t.outputs()?;
    t.store_o(&outs)?;
    t.write_lse()
}

/// A debugging aid: `SINTER_DEBUG_SMEM_FILL` set to a byte (`0x7f`, `127`) makes the
/// tensor-core prefill kernels fill their shared memory with it before anything else
/// ([`PrefillTc::fill_smem`]). With `0x7f` (NaN as `f8e4m3` and as f16 `0x7f7f`, 3.4e38 as
/// bf16) a read of shared bytes that no copy or store of the CTA wrote shows up
/// deterministically, instead of as whatever an earlier kernel left there. Read when the
/// kernel is generated (sinter's kernel cache key includes it). Unset (the default), the PTX
/// is unchanged.
pub(super) fn debug_smem_fill() -> Option<u8> {
    if let Some(b) = SMEM_FILL.with(std::cell::Cell::get) {
        return Some(b);
    }
    let v = std::env::var("SINTER_DEBUG_SMEM_FILL").ok()?;
    parse_fill_byte(&v)
}

thread_local! {
    /// The tests' [`debug_smem_fill`] for kernels generated on this thread ([`with_smem_fill`]).
    static SMEM_FILL: std::cell::Cell<Option<u8>> = const { std::cell::Cell::new(None) };
}

/// Runs `f` with the kernels generated on this thread filling their shared memory with
/// `byte` ([`debug_smem_fill`]), as `SINTER_DEBUG_SMEM_FILL` would, without the environment.
#[cfg(test)]
pub(crate) fn with_smem_fill<T>(byte: u8, f: impl FnOnce() -> T) -> T {
    SMEM_FILL.with(|c| c.set(Some(byte)));
    let out = f();
    SMEM_FILL.with(|c| c.set(None));
    out
}

/// The byte of a `SINTER_DEBUG_SMEM_FILL` value: hex with `0x`, or decimal.
pub(super) fn parse_fill_byte(v: &str) -> Option<u8> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u8::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// The (batch, head) base `offset + x·st[0] + y·st[1]` of tensor `t`.
fn base_of<'ctx>(kit: &Kit<'ctx>, t: &T4, x: IntValue<'ctx>, y: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let a = kit.add(kit.dim(&t.offset)?, kit.mul(x, kit.dim(&t.st[0])?)?)?;
    kit.add(a, kit.mul(y, kit.dim(&t.st[1])?)?)
}

/// A tensor-core prefill attention CTA: its schedule's sizes, the fp8 scales, its indices,
/// bases and strides of Q, K, V and O, its key range and its threads' rows.
pub(super) struct PrefillTc<'a, 'ctx> {
    pub(super) kit: &'a Kit<'ctx>,
    pub(super) p: &'a Prefill,
    pub(super) s: &'a TcSchedule,
    pub(super) sm: &'a Smem,
    /// The `wgmma` schedule (sm_90a), or `None` for `mma.sync`.
    pub(super) wg: Option<&'a WgSchedule>,
    pub(super) dt: DType,
    pub(super) d: u32,
    pub(super) dv: u32,
    pub(super) bkv: u32,
    /// Slabs of 16 rows a warp.
    pub(super) mt: usize,
    pub(super) bq: u32,
    pub(super) threads: u32,
    pub(super) rpw: u32,
    /// n8 tiles of S and of O.
    pub(super) n_nt: usize,
    pub(super) n_ov: usize,
    pub(super) smem: PointerValue<'ctx>,
    pub(super) ninf: FloatValue<'ctx>,
    pub(super) zero: FloatValue<'ctx>,
    /// The exponent bits of a 16-bit float of `dt`.
    pub(super) exp_mask: u32,
    /// fp8 (the `wgmma` kernel only; see "fp8" in the module docs): q, k, v are e4m3 bytes,
    /// 16 to a 16-byte chunk, 32 to a k-step; sq·sk is folded into the scores' scale, sv into
    /// the output's.
    pub(super) fp8: Option<[crate::kernels::fp8_operand::Fp8Scale; 3]>,
    pub(super) ein: DType,
    /// Elements a 16-byte chunk, and a k-step of the `wgmma` S = Q·Kᵀ.
    pub(super) epc: u32,
    pub(super) kstep: u32,
    /// `fused` (a positive scale, no mask, not fp8): the scores x are the raw products s and
    /// the row maximum m is theirs; p = 2^((x − m)·c), c = scale·log2 e. Otherwise scores are
    /// in natural units, x = s·cf (+ mask), m their maximum, and p = 2^((x − m)·log2 e). In
    /// both the difference is formed first (exact near the maximum), never `x·c − m·c`: m·c
    /// rounded is off by up to half its ulp (2⁴⁰ at scores of 1e20, so p of the row's
    /// largest score was 0 or inf), and a finite mask of −3.4e38 (the lowest f32) times
    /// log2 e overflowed to −inf. `cf` is c (fused) or the scale (·sq·sk for fp8).
    pub(super) fused: bool,
    pub(super) cf: FloatValue<'ctx>,
    /// The sliding window: the CTA's first key tile (i32; 0 without one) and the first
    /// visible keys of the warp's first and last rows (i32; 0 without one).
    pub(super) t_lo: IntValue<'ctx>,
    pub(super) w_start: [IntValue<'ctx>; 2],
    pub(super) v_scale: Option<FloatValue<'ctx>>,
    /// The producer warpgroup, the ping-pong and the intra-warpgroup overlap of `wg`.
    pub(super) ws: bool,
    pub(super) pingpong: bool,
    pub(super) overlap: bool,
    pub(super) raw_tid: IntValue<'ctx>,
    pub(super) tid: IntValue<'ctx>,
    pub(super) warp: IntValue<'ctx>,
    pub(super) lane: IntValue<'ctx>,
    pub(super) g: IntValue<'ctx>,
    pub(super) t4: IntValue<'ctx>,
    pub(super) h: IntValue<'ctx>,
    pub(super) b: IntValue<'ctx>,
    pub(super) q0: IntValue<'ctx>,
    pub(super) sq: IntValue<'ctx>,
    pub(super) skv: IntValue<'ctx>,
    pub(super) skv32: IntValue<'ctx>,
    pub(super) q_base: IntValue<'ctx>,
    pub(super) o_base: IntValue<'ctx>,
    pub(super) k_base: IntValue<'ctx>,
    pub(super) v_base: IntValue<'ctx>,
    pub(super) q_ss: IntValue<'ctx>,
    pub(super) o_ss: IntValue<'ctx>,
    pub(super) k_ss: IntValue<'ctx>,
    pub(super) v_ss: IntValue<'ctx>,
    pub(super) q_ptr: PointerValue<'ctx>,
    pub(super) k_ptr: PointerValue<'ctx>,
    pub(super) v_ptr: PointerValue<'ctx>,
    pub(super) o_ptr: PointerValue<'ctx>,
    /// Key tiles the CTA needs (i32).
    pub(super) n_tiles: IntValue<'ctx>,
    /// The warp's first row (i64) and its first row's key limit (i32).
    pub(super) w0: IntValue<'ctx>,
    pub(super) min_limit: IntValue<'ctx>,
    pub(super) wg_id: IntValue<'ctx>,
    /// Where the tiles this warp (warpgroup, with `wgmma`) computes end (i32).
    pub(super) grp_end: IntValue<'ctx>,
    pub(super) rows: Rows<'ctx>,
}

impl<'a, 'ctx> PrefillTc<'a, 'ctx> {
    /// The shared memory, the constants, and the indices: the thread's warp, lane and quad
    /// coordinates, the CTA's (batch, head, query tile), the tensors' bases and strides, the
    /// key range of the CTA, of the warp and of its rows.
    fn new(kit: &'a Kit<'ctx>, p: &'a Prefill, s: &'a TcSchedule, sm: &'a Smem, shared: SharedKind, wg: Option<&'a WgSchedule>) -> R<Self> {
        let dt = p.dtype;
        let (d, dv, bkv, mt) = (p.d, p.dv, s.block_kv, s.m_tiles as usize);
        let (bq, threads, rpw) = (s.block_q(), s.threads(), s.rows_per_warp());
        let n_nt = (bkv / 8) as usize; // n8 tiles of S
        let n_ov = (dv / 8) as usize; // n8 tiles of O
        let smem = kit.shared(shared, sm.total)?;
        if wg.is_some() {
            kit.align_dynamic_shared(1024)?;
        }
        let c32 = |v: u32| kit.i32c(v as i32);
        let ninf = kit.f32c(f64::NEG_INFINITY);
        let zero = kit.f32c(0.0);
        let exp_mask = if dt == DType::BF16 { 0x7f80 } else { 0x7c00 };
        let fp8 = p.fp8.filter(|_| wg.is_some());
        let ein = if fp8.is_some() { DType::F8E4M3 } else { dt };
        let epc = if fp8.is_some() { 16 } else { 8 };
        let kstep = if fp8.is_some() { 32 } else { 16 };
        let c = p.scale * std::f64::consts::LOG2_E;
        let fused = c > 0.0 && p.mask.is_none() && fp8.is_none() && p.softcap.is_none();
        let (cf, v_scale) = match fp8 {
            Some(sc) => {
                let qk = kit.fmul(crate::kernels::fp8_operand::fp8_scale(kit, sc[0])?, crate::kernels::fp8_operand::fp8_scale(kit, sc[1])?)?;
                (kit.fmul(kit.f32c(p.scale), qk)?, Some(crate::kernels::fp8_operand::fp8_scale(kit, sc[2])?))
            }
            None => (kit.f32c(if fused { c } else { p.scale }), None),
        };

        // ---- indices -----------------------------------------------------------------------
        // With the producer warpgroup (warpgroup 0), the consumers' thread index counts from 0
        // after it: everything below but the producer's loop is the consumers'.
        let ws = wg.is_some_and(|w| w.producer);
        let pingpong = wg.is_some_and(|w| w.pingpong);
        let raw_tid = kit.sreg("tid.x")?;
        let tid = if ws { kit.sub(raw_tid, c32(128))? } else { raw_tid };
        let warp = kit.udiv(tid, c32(32))?;
        let lane = kit.urem(tid, c32(32))?;
        let g = kit.udiv(lane, c32(4))?;
        let t4 = kit.urem(lane, c32(4))?;
        // Causal CTAs in reverse order: the longest (bottom) tiles start first.
        let qtile = kit.zext64(kit.sub(kit.sub(kit.sreg("nctaid.x")?, c32(1))?, kit.sreg("ctaid.x")?)?)?;
        let h = kit.zext64(kit.sreg("ctaid.y")?)?;
        let b = kit.zext64(kit.sreg("ctaid.z")?)?;
        let hk = kit.udiv(h, kit.i64c(p.heads / p.kv_heads))?;
        let q0 = kit.mul(qtile, kit.i64c(i64::from(bq)))?;
        let (sq, skv) = (kit.dim(&p.sq)?, kit.dim(&p.skv)?);
        let skv32 = kit.trunc32(skv)?;
        let shift = kit.sub(skv, sq)?; // query i sees keys j ≤ i + shift
        let q_base = base_of(kit, &p.q, b, h)?;
        let o_base = base_of(kit, &p.out, b, h)?;
        let k_base = base_of(kit, &p.k, b, hk)?;
        let v_base = base_of(kit, &p.v, b, hk)?;
        let (q_ss, o_ss, k_ss, v_ss) = (kit.dim(&p.q.st[2])?, kit.dim(&p.out.st[2])?, kit.dim(&p.k.st[2])?, kit.dim(&p.v.st[2])?);
        let (q_ptr, k_ptr, v_ptr, o_ptr) = (kit.buf(p.q.buffer)?, kit.buf(p.k.buffer)?, kit.buf(p.v.buffer)?, kit.buf(p.out.buffer)?);
        // The key limit of query row i (i64): causal min(max(i + shift + 1, 0), Skv), else Skv.
        let limit_of = |k: &Kit<'ctx>, i: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            if p.causal {
                k.smin(k.smax(k.add(k.add(i, shift)?, k.i64c(1))?, k.i64c(0))?, skv)
            } else {
                Ok(skv)
            }
        };
        // With a window W, row i's first visible key: max(limit − W, 0) (i32).
        let start_of = |k: &Kit<'ctx>, i: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            match p.window {
                Some(w) => k.trunc32(k.smax(k.sub(limit_of(k, i)?, k.i64c(w))?, k.i64c(0))?),
                None => Ok(k.i32c(0)),
            }
        };
        // Keys the CTA needs: up to its last row's limit.
        let kv_end = {
            let last = kit.sub(kit.smin(kit.add(q0, kit.i64c(i64::from(bq)))?, sq)?, kit.i64c(1))?;
            limit_of(kit, last)?
        };
        let n_tiles = kit.trunc32(kit.udiv(kit.add(kit.smax(kv_end, kit.i64c(0))?, kit.i64c(i64::from(bkv - 1)))?, kit.i64c(i64::from(bkv)))?)?;
        // The warp's rows: [w0, w_end) ∩ [0, Sq); its key range [min_limit, warp_end).
        let w0 = kit.add(q0, kit.zext64(kit.mul(warp, c32(rpw))?)?)?;
        let w_last = kit.sub(kit.smin(kit.add(w0, kit.i64c(i64::from(rpw)))?, sq)?, kit.i64c(1))?;
        let has_rows = kit.icmp(IntPredicate::SLT, w0, sq)?;
        let min_limit = kit.trunc32(limit_of(kit, w0)?)?;
        // From the tile holding the CTA's first row's first visible key.
        let t_lo = if p.window.is_some() { kit.udiv(start_of(kit, q0)?, c32(bkv))? } else { c32(0) };
        let w_start = [start_of(kit, w0)?, start_of(kit, kit.smax(w_last, w0)?)?];
        let warp_end = kit.select_int(has_rows, kit.trunc32(limit_of(kit, w_last)?)?, c32(0))?;
        // The tiles a warp computes end at its last row's limit; a warpgroup's `wgmma` needs all
        // four warps, so there they end at the warpgroup's (64 rows from 64·(warp / 4)).
        let wg_id = kit.lshr(tid, 7)?;
        let grp_end = if wg.is_some() {
            let g0 = kit.add(q0, kit.zext64(kit.mul(wg_id, c32(64))?)?)?;
            let g_last = kit.sub(kit.smin(kit.add(g0, kit.i64c(64))?, sq)?, kit.i64c(1))?;
            kit.select_int(kit.icmp(IntPredicate::SLT, g0, sq)?, kit.trunc32(limit_of(kit, g_last)?)?, c32(0))?
        } else {
            warp_end
        };
        let rows = {
            let mut r = Rows { limit: Vec::new(), start: Vec::new(), valid: Vec::new(), index: Vec::new() };
            for mi in 0..mt {
                let mut st = Vec::new();
                let mut lim = Vec::new();
                let mut val = Vec::new();
                let mut idx = Vec::new();
                for hh in 0..2u32 {
                    let i = kit.add(w0, kit.zext64(kit.add(g, c32(16 * mi as u32 + 8 * hh))?)?)?;
                    lim.push(kit.trunc32(limit_of(kit, i)?)?);
                    st.push(start_of(kit, i)?);
                    val.push(kit.icmp(IntPredicate::SLT, i, sq)?);
                    idx.push(i);
                }
                r.limit.push([lim[0], lim[1]]);
                r.start.push([st[0], st[1]]);
                r.valid.push([val[0], val[1]]);
                r.index.push([idx[0], idx[1]]);
            }
            r
        };
        let overlap = wg.is_some_and(|w| w.overlap);
        Ok(PrefillTc {
            kit, p, s, sm, wg, dt, d, dv, bkv, mt, bq, threads, rpw, n_nt, n_ov, smem, ninf, zero, exp_mask, fp8, ein, epc, kstep, fused, cf, t_lo, w_start, v_scale, ws, pingpong, overlap,
            raw_tid, tid, warp, lane, g, t4, h, b, q0, sq, skv, skv32, q_base, o_base, k_base, v_base, q_ss, o_ss, k_ss, v_ss, q_ptr, k_ptr, v_ptr, o_ptr, n_tiles, w0, min_limit, wg_id,
            grp_end, rows,
        })
    }

    pub(super) fn c32(&self, v: u32) -> IntValue<'ctx> {
        self.kit.i32c(v as i32)
    }

    /// Fills the CTA's shared memory (`sm.total` bytes) with `byte`, 16 bytes a store from
    /// every thread (the producer warpgroup's too), then a CTA barrier ([`debug_smem_fill`]).
    fn fill_smem(&self, byte: u8) -> R<()> {
        let kit = self.kit;
        let word = kit.i32c(i32::from_ne_bytes([byte; 4]));
        let step = kit.mul(kit.sreg("ntid.x")?, self.c32(16))?;
        kit.for_range(kit.mul(self.raw_tid, self.c32(16))?, self.c32(self.sm.total), step, |k, off| store_i32s(k, k.sh_at(self.smem, off)?, &[word; 4]))?;
        kit.barrier()
    }

    // ---- global → shared copies ----------------------------------------------------------

    /// The byte offset (i32) of 16-byte chunk `col` of row `r` of a `rows`-row tile at
    /// `sm_off`: padded rows of `ld` elements, or (wgmma) the 128-byte-swizzled K-major
    /// canonical layout ([`Smem::swz`]).
    pub(super) fn sm_at(&self, k: &Kit<'ctx>, sm_off: IntValue<'ctx>, rows: u32, ld: u32, r: IntValue<'ctx>, col: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let c32 = |v: u32| self.c32(v);
        if self.sm.swz {
            let slab = k.mul(k.lshr(col, 3)?, c32(rows * 128))?;
            let phys = k.xor(k.and(col, c32(7))?, k.and(r, c32(7))?)?;
            k.add(sm_off, k.add(slab, k.add(k.mul(r, c32(128))?, k.shl(phys, 4)?)?)?)
        } else {
            k.add(sm_off, k.add(k.mul(r, c32(ld * 2))?, k.mul(col, c32(16))?)?)
        }
    }

    /// `rows` rows of `chunks` 16-byte chunks: row r (< nvalid, i64, else zero-filled) starts
    /// at element `row0 + r·rstride` of `gptr`, lands at byte `sm_off + r·ld·2`.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn copy_rows(&self, k: &Kit<'ctx>, rows: u32, chunks: u32, ld: u32, sm_off: IntValue<'ctx>, gptr: PointerValue<'ctx>, row0: IntValue<'ctx>, rstride: IntValue<'ctx>, nvalid: IntValue<'ctx>) -> R<()> {
        let (threads, tid, smem, sm, ein, epc) = (self.threads, self.tid, self.smem, self.sm, self.ein, self.epc);
        let c32 = |v: u32| self.c32(v);
        let total = rows * chunks;
        if threads % chunks == 0 && (!sm.swz || (threads / chunks) % 8 == 0) {
            // Every copy of this thread is at column tid % chunks, rows tid / chunks + i·step.
            let step = threads / chunks;
            let r0 = k.udiv(tid, c32(chunks))?;
            let col = k.urem(tid, c32(chunks))?;
            let g0 = k.add(row0, k.add(k.mul(k.zext64(r0)?, rstride)?, k.zext64(k.mul(col, c32(epc))?)?)?)?;
            let s0 = k.sh_at(smem, self.sm_at(k, sm_off, rows, ld, r0, col)?)?;
            // Rows step·i apart: `step` is a multiple of 8 when swizzled (checked below), so
            // their swizzle is the first row's.
            let row_bytes = if sm.swz { 128 } else { ld * 2 };
            let left = k.sub(nvalid, k.zext64(r0)?)?; // copy i is valid when i·step < left
            // The source walks by `step` rows from one pointer (no per-copy offsets for LLVM
            // to hoist out of the tile loop into registers).
            let jump = k.mul(rstride, k.i64c(i64::from(step)))?;
            let mut src = k.gep_raw(ein, gptr, g0)?;
            for i in 0..rows.div_ceil(step) {
                if i > 0 {
                    src = k.gep_raw(ein, src, jump)?;
                }
                let go = |k: &Kit<'ctx>| -> R<()> {
                    let valid = k.icmp(IntPredicate::SLT, k.i64c(i64::from(i * step)), left)?;
                    let dst = k.sh_at(s0, c32(i * step * row_bytes))?;
                    k.cp_async_16(dst, src, k.select_int(valid, c32(16), c32(0))?)
                };
                if (i + 1) * step <= rows {
                    go(k)?;
                } else {
                    k.if_then(k.icmp(IntPredicate::ULT, k.add(r0, c32(i * step))?, c32(rows))?, go)?;
                }
            }
            return Ok(());
        }
        for i in 0..total.div_ceil(threads) {
            let e = k.add(tid, c32(i * threads))?;
            let go = |k: &Kit<'ctx>| -> R<()> {
                let r = k.udiv(e, c32(chunks))?;
                let col = k.urem(e, c32(chunks))?;
                let r64 = k.zext64(r)?;
                let gi = k.add(row0, k.add(k.mul(r64, rstride)?, k.zext64(k.mul(col, c32(epc))?)?)?)?;
                let valid = k.icmp(IntPredicate::SLT, r64, nvalid)?;
                let dst = k.sh_at(smem, self.sm_at(k, sm_off, rows, ld, r, col)?)?;
                k.cp_async_16(dst, k.gep_raw(ein, gptr, gi)?, k.select_int(valid, c32(16), c32(0))?)
            };
            if (i + 1) * threads <= total {
                go(k)?;
            } else {
                k.if_then(k.icmp(IntPredicate::ULT, e, c32(total))?, go)?;
            }
        }
        Ok(())
    }

    /// K of tile t (i32) into its stage t & 1.
    pub(super) fn issue_k(&self, k: &Kit<'ctx>, t: IntValue<'ctx>) -> R<()> {
        let (sm, bkv) = (self.sm, self.bkv);
        let c32 = |v: u32| self.c32(v);
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let ks = k.add(c32(sm.k[0]), k.mul(k.and(t, c32(1))?, c32(sm.k[1] - sm.k[0]))?)?;
        self.copy_rows(k, bkv, self.d / self.epc, sm.ldk, ks, self.k_ptr, k.add(self.k_base, k.mul(j0, self.k_ss)?)?, self.k_ss, k.sub(self.skv, j0)?)
    }

    /// V of tile t (i32) into its stage t & 1.
    pub(super) fn issue_v(&self, k: &Kit<'ctx>, t: IntValue<'ctx>) -> R<()> {
        let (sm, bkv) = (self.sm, self.bkv);
        let c32 = |v: u32| self.c32(v);
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let vs = k.add(c32(sm.v[0]), k.mul(k.and(t, c32(1))?, c32(sm.v[1] - sm.v[0]))?)?;
        self.copy_rows(k, bkv, self.dv / self.epc, sm.ldv, vs, self.v_ptr, k.add(self.v_base, k.mul(j0, self.v_ss)?)?, self.v_ss, k.sub(self.skv, j0)?)
    }

    /// K and V of tile t into stage t & 1.
    fn issue_tile(&self, k: &Kit<'ctx>, t: IntValue<'ctx>) -> R<()> {
        let (sm, bkv) = (self.sm, self.bkv);
        let c32 = |v: u32| self.c32(v);
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let stage = k.and(t, c32(1))?;
        let nvalid = k.sub(self.skv, j0)?;
        let ks = k.add(c32(sm.k[0]), k.mul(stage, c32(sm.k[1] - sm.k[0]))?)?;
        let vs = k.add(c32(sm.v[0]), k.mul(stage, c32(sm.v[1] - sm.v[0]))?)?;
        self.copy_rows(k, bkv, self.d / self.epc, sm.ldk, ks, self.k_ptr, k.add(self.k_base, k.mul(j0, self.k_ss)?)?, self.k_ss, nvalid)?;
        self.copy_rows(k, bkv, self.dv / self.epc, sm.ldv, vs, self.v_ptr, k.add(self.v_base, k.mul(j0, self.v_ss)?)?, self.v_ss, nvalid)
    }

    // ---- prologue: Q and tile 0 ------------------------------------------------------------

    /// Q and the first key tile in shared memory: with the producer warpgroup, its mbarriers
    /// (returned) and the producer's TMA loop ([`PrefillTc::producer`]); else `cp.async`
    /// copies, waited for, and a barrier.
    fn prologue(&self) -> R<Option<IntValue<'ctx>>> {
        let kit = self.kit;
        let c32 = |v: u32| self.c32(v);
        // The warp-specialised kernel's mbarriers (static shared memory, 8 bytes each): full[i]
        // (arrival count 1: the producer's `arrive.expect_tx`, then the TMA's bytes) and empty[i]
        // (one arrival from each consumer warp) of stage i, and Q's full barrier.
        let bars = if self.ws { Some(kit.mbarriers(2 * WS_STAGES + 1)?) } else { None };
        if let (Some(bars), Some(w)) = (bars, self.wg.filter(|w| w.producer)) {
            self.producer(bars, w)?;
        } else {
            let (q0, sq) = (self.q0, self.sq);
            self.copy_rows(kit, self.bq, self.d / self.epc, self.sm.ldq, c32(0), self.q_ptr, kit.add(self.q_base, kit.mul(q0, self.q_ss)?)?, self.q_ss, kit.sub(sq, q0)?)?;
            // (The overlapped `wgmma` loop takes V one tile after K: V_0 in its first iteration.)
            kit.if_then(kit.icmp(IntPredicate::SGT, self.n_tiles, self.t_lo)?, |k| if self.overlap { self.issue_k(k, self.t_lo) } else { self.issue_tile(k, self.t_lo) })?;
            kit.cp_async_commit()?;
            kit.cp_async_wait(0)?;
            if self.wg.is_some() {
                // The copies (generic proxy) before the `wgmma`s' reads (async proxy), §9.7.15.1.
                kit.fence_proxy_async()?;
            }
            kit.barrier()?;
        }
        Ok(bars)
    }

    /// The shared-memory addresses the products read: the base address, the warpgroup's Q
    /// rows (`wgmma`), the lanes' `ldmatrix` offsets, and Q's fragments when they stay in
    /// registers.
    fn fragments(&self) -> R<Frags<'ctx>> {
        let (kit, sm, lane, warp, rpw) = (self.kit, self.sm, self.lane, self.warp, self.rpw);
        let c32 = |v: u32| self.c32(v);
        let sbase = kit.smem_addr(self.smem)?;
        // The warpgroup's 64 rows of Q (slab 0).
        let q_wg = kit.add(sbase, kit.mul(self.wg_id, c32(64 * 128))?)?;
        // ldmatrix lane offsets (bytes). A (Q, row-major 16×16): lane l → row l % 16, column
        // chunk l / 16. B from K ([key, d], two n8 tiles): row (l % 8) + 8·(l / 16), chunk
        // (l / 8) % 2. B from V ([key, d], transposed, two n8 tiles): row (l % 8) + 8·((l / 8) % 2),
        // chunk l / 16.
        let l8 = kit.urem(lane, c32(8))?;
        let l16 = kit.udiv(lane, c32(16))?;
        let l8b = kit.urem(kit.udiv(lane, c32(8))?, c32(2))?;
        let q_lane = kit.add(kit.mul(kit.add(kit.mul(warp, c32(rpw))?, kit.urem(lane, c32(16))?)?, c32(sm.ldq * 2))?, kit.mul(l16, c32(16))?)?;
        let k_lane = kit.add(kit.mul(kit.add(l8, kit.mul(l16, c32(8))?)?, c32(sm.ldk * 2))?, kit.mul(l8b, c32(16))?)?;
        let v_lane = kit.add(kit.mul(kit.add(l8, kit.mul(l8b, c32(8))?)?, c32(sm.ldv * 2))?, kit.mul(l16, c32(16))?)?;
        let q_ptr_sm = kit.sh_at(self.smem, q_lane)?;
        let mut f = Frags { sbase, q_wg, k_lane, v_lane, q_ptr_sm, qf: Vec::new() };
        if self.s.q_in_regs {
            f.qf = (0..self.mt).map(|mi| (0..self.d / 16).map(|ks| f.q_frag(kit, sm, mi, ks)).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
        }
        Ok(f)
    }
}

/// The shared-memory addresses of the products (see [`PrefillTc::fragments`]).
pub(super) struct Frags<'ctx> {
    pub(super) sbase: IntValue<'ctx>,
    pub(super) q_wg: IntValue<'ctx>,
    pub(super) k_lane: IntValue<'ctx>,
    pub(super) v_lane: IntValue<'ctx>,
    pub(super) q_ptr_sm: PointerValue<'ctx>,
    /// Q's A fragments per slab and k16 step, when Q stays in registers.
    pub(super) qf: Vec<Vec<[IntValue<'ctx>; 4]>>,
}

impl<'ctx> Frags<'ctx> {
    /// Q's A fragment of slab `mi`, k16 step `ks`, from shared memory.
    fn q_frag(&self, k: &Kit<'ctx>, sm: &Smem, mi: usize, ks: u32) -> R<[IntValue<'ctx>; 4]> {
        k.ldmatrix_x4(k.sh_at(self.q_ptr_sm, k.i32c((16 * mi as u32 * sm.ldq * 2 + ks * 32) as i32))?, false)
    }
}

/// The key loop of a tensor-core prefill CTA ([`PrefillTc`], reached through `Deref`): the
/// fragments' addresses and each thread's running state.
pub(super) struct Tiles<'a, 'ctx> {
    pub(super) c: &'a PrefillTc<'a, 'ctx>,
    pub(super) f: Frags<'ctx>,
    /// Running maximum and sum of each of the thread's rows.
    pub(super) m: Vec<[PointerValue<'ctx>; 2]>,
    pub(super) l: Vec<[PointerValue<'ctx>; 2]>,
    /// acc[mi][n][e]: O(row g + 8·(e / 2), column 8n + 2·t4 + e % 2) of slab mi.
    pub(super) acc: Vec<Vec<[PointerValue<'ctx>; 4]>>,
    /// Scores of the current tile, same layout as acc over the tile's keys.
    pub(super) sv: Vec<Vec<[PointerValue<'ctx>; 4]>>,
    /// The tile's first key some row of the warp does not multiply ([`Tiles::skipping`]), and
    /// whether its P·V goes the CUDA-core way ([`Tiles::decide_slow`]).
    pub(super) lo_var: PointerValue<'ctx>,
    pub(super) slow_var: PointerValue<'ctx>,
    pub(super) mask_rows: Vec<[Option<IntValue<'ctx>>; 2]>,
    /// fp8: the Vᵀ buffer the next P·V reads (byte offset). (Only an fp8 kernel allocates
    /// it: the other kernels' PTX stays as it was.)
    pub(super) vt_var: Option<PointerValue<'ctx>>,
    /// The `wgmma` P·V's groups: one, or Dv / 64 with `pv_split`.
    pub(super) pv_parts: u32,
    /// The dtype of P as the CUDA-core P·V reads it.
    pub(super) pdt: DType,
}

impl<'a, 'ctx> std::ops::Deref for Tiles<'a, 'ctx> {
    type Target = PrefillTc<'a, 'ctx>;

    fn deref(&self) -> &PrefillTc<'a, 'ctx> {
        self.c
    }
}

// Fragment coordinates index several parallel arrays at once: index loops read better here.
#[allow(clippy::needless_range_loop)]
impl<'a, 'ctx> Tiles<'a, 'ctx> {
    /// The per-thread state: m, l, the O accumulators, the scores, the slow-path state and
    /// the additive mask's row offsets.
    fn new(c: &'a PrefillTc<'a, 'ctx>, f: Frags<'ctx>) -> R<Self> {
        let (kit, mt, n_ov, n_nt, ninf, zero) = (c.kit, c.mt, c.n_ov, c.n_nt, c.ninf, c.zero);
        let c32 = |v: u32| c.c32(v);
        let m: Vec<[PointerValue<'ctx>; 2]> = (0..mt).map(|_| Ok([kit.var_f(ninf)?, kit.var_f(ninf)?])).collect::<R<_>>()?;
        let l: Vec<[PointerValue<'ctx>; 2]> = (0..mt).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<_>>()?;
        let acc: Vec<Vec<[PointerValue<'ctx>; 4]>> =
            (0..mt).map(|_| (0..n_ov).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
        let sv: Vec<Vec<[PointerValue<'ctx>; 4]>> =
            (0..mt).map(|_| (0..n_nt).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
        let (lo_var, slow_var) = (var_i32(kit, c32(0))?, var_i32(kit, c32(0))?);
        let mask_rows: Vec<[Option<IntValue<'ctx>>; 2]> = match &c.p.mask {
            Some(mk) => {
                let mb = base_mask(kit, mk, c.b, c.h)?;
                (0..mt)
                    .map(|mi| -> R<[Option<IntValue<'ctx>>; 2]> {
                        let at = |hh: usize| -> R<Option<IntValue<'ctx>>> {
                            let i = kit.smin(c.rows.index[mi][hh], kit.sub(c.sq, kit.i64c(1))?)?;
                            Ok(Some(kit.add(mb, kit.mul(i, kit.dim(&mk.st[2])?)?)?))
                        };
                        Ok([at(0)?, at(1)?])
                    })
                    .collect::<R<_>>()?
            }
            None => vec![[None, None]; mt],
        };
        let pdt = if c.fp8.is_some() { DType::F16 } else { c.dt };
        let vt_var = if c.fp8.is_some() { Some(var_i32(kit, c32(c.sm.vt[0]))?) } else { None };
        let pv_parts = c.wg.map_or(1, |w| if w.pv_split { c.dv / 64 } else { 1 });
        Ok(Tiles { c, f, m, l, acc, sv, lo_var, slow_var, mask_rows, vt_var, pv_parts, pdt })
    }

    // ---- the steps of a key tile -------------------------------------------------------------

    /// The K and V stages of tile t (byte offsets from the shared base).
    pub(super) fn stage_of(&self, k: &Kit<'ctx>, t: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let (sm, c32) = (self.sm, |v: u32| self.c32(v));
        let stage = k.and(t, c32(1))?;
        Ok((k.add(c32(sm.k[0]), k.mul(stage, c32(sm.k[1] - sm.k[0]))?)?, k.add(c32(sm.v[0]), k.mul(stage, c32(sm.v[1] - sm.v[0]))?)?))
    }

    /// The scores of the tile at key j0 (`sacc`, raw products) into `sv` (raw when `fused`,
    /// else s·cf + mask in f32, see [`PrefillTc::fused`]); masked; and the first key of this
    /// tile some row does not multiply (`lo_var`).
    pub(super) fn scores(&self, k: &Kit<'ctx>, j0: IntValue<'ctx>, sacc: &[Vec<[FloatValue<'ctx>; 4]>]) -> R<()> {
        let (mt, n_nt, sv, p, ninf, bkv) = (self.mt, self.n_nt, &self.sv, self.p, self.ninf, self.bkv);
        let c32 = |v: u32| self.c32(v);
        for mi in 0..mt {
            for n in 0..n_nt {
                for e in 0..4 {
                    let v = if self.fused { sacc[mi][n][e] } else { cap_score(k, k.fmul(sacc[mi][n][e], self.cf)?, p.softcap)? };
                    k.set(sv[mi][n][e], v.into())?;
                }
            }
        }

        // Mask keys past each row's limit (and add the additive mask) where the tile
        // crosses a row's limit.
        let col0 = k.add(j0, k.mul(self.t4, c32(2))?)?;
        let crosses = k.icmp(IntPredicate::SGT, k.add(j0, c32(bkv))?, self.min_limit)?;
        // A tile below some row's window start crosses it.
        let crosses = if p.window.is_some() { or(k, crosses, k.icmp(IntPredicate::SLT, j0, self.w_start[1])?)? } else { crosses };
        let crosses = if p.mask.is_some() { k.bool_c(true) } else { crosses };
        k.if_then(crosses, |k| {
            for mi in 0..mt {
                for n in 0..n_nt {
                    for e in 0..4 {
                        let hh = e / 2;
                        let col = k.add(col0, c32(8 * n as u32 + (e % 2) as u32))?;
                        let vis = k.icmp(IntPredicate::SLT, col, self.rows.limit[mi][hh])?;
                        let vis = if p.window.is_some() { k.and(vis, k.icmp(IntPredicate::SGE, col, self.rows.start[mi][hh])?)? } else { vis };
                        let mut x = k.get_f(sv[mi][n][e])?;
                        if let (Some(mk), Some(mrow)) = (&p.mask, self.mask_rows[mi][hh]) {
                            // Row clamped below Sq, key below Skv: always in bounds, no branch.
                            let j = k.select_int(vis, col, c32(0))?;
                            let idx = k.add(mrow, k.mul(k.zext64(j)?, k.dim(&mk.st[3])?)?)?;
                            let mv = k.load_vec(mk.dtype, k.buf(mk.buffer)?, idx, 1)?[0];
                            x = k.fadd(x, mv)?;
                        }
                        k.set(sv[mi][n][e], k.select_f(vis, x, ninf)?.into())?;
                    }
                }
            }
            Ok(())
        })?;
        self.skipping(k, j0)
    }

    /// The first key of the tile at j0 whose product some row of the warp does not make
    /// (`lo_var`): its first row's causal limit, or with a sliding window below some row's
    /// window start the whole tile.
    fn skipping(&self, k: &Kit<'ctx>, j0: IntValue<'ctx>) -> R<()> {
        let lo = k.smax(self.min_limit, j0)?;
        let lo = if self.p.window.is_some() { k.select_int(k.icmp(IntPredicate::SLT, j0, self.w_start[1])?, j0, lo)? } else { lo };
        k.set(self.lo_var, lo.into())
    }

    /// Online softmax per row of `sv`: updates m and l, and gives P (pf, the layout of `sv`),
    /// whether any row of the warp has a new maximum, and each row's rescaling factor α (the
    /// accumulator is not touched here).
    pub(super) fn softmax(&self, k: &Kit<'ctx>) -> R<(CFrag<'ctx>, IntValue<'ctx>, Alphas<'ctx>)> {
        let (mt, n_nt, sv, m, l, zero, ninf, fused, cf) = (self.mt, self.n_nt, &self.sv, &self.m, &self.l, self.zero, self.ninf, self.fused, self.cf);
        let mut pf: CFrag<'ctx> = vec![vec![[zero; 4]; n_nt]; mt];
        let mut rescale = k.bool_c(false);
        let mut alphas = Vec::new();
        for mi in 0..mt {
            for hh in 0..2 {
                let xs: Vec<FloatValue<'ctx>> = (0..n_nt).flat_map(|n| [2 * hh, 2 * hh + 1].map(|e| (n, e))).map(|(n, e)| k.get_f(sv[mi][n][e])).collect::<R<_>>()?;
                let mut mx = xs[0];
                for &x in &xs[1..] {
                    mx = k.max_nan(mx, x)?;
                }
                mx = k.max_nan(mx, k.shfl_xor(mx, 1)?)?;
                mx = k.max_nan(mx, k.shfl_xor(mx, 2)?)?;
                let mo = k.get_f(m[mi][hh])?;
                let mn = k.max_nan(mo, mx)?;
                let none = k.fcmp(FloatPredicate::OEQ, mn, ninf)?;
                let mu = k.select_f(none, zero, mn)?;
                // The difference first, then to log2 units (−inf − m = −inf: α = 0).
                let c2 = if fused { cf } else { k.f32c(std::f64::consts::LOG2_E) };
                let alpha = ex2_ftz(k, k.fmul(k.fsub(mo, mu)?, c2)?)?;
                // fp8: p·2⁸ (P's e4m3 rounding keeps 2⁻¹⁷ of the row maximum, not 2⁻⁹; l
                // carries the same factor, so O = acc / l is unchanged).
                let p_log2 = k.f32c(if self.fp8.is_some() { f64::from(FP8_P_LOG2) } else { 0.0 });
                let mut sum = zero;
                for (i, &x) in xs.iter().enumerate() {
                    let arg = if self.fp8.is_some() { k.fma(k.fsub(x, mu)?, c2, p_log2)? } else { k.fmul(k.fsub(x, mu)?, c2)? };
                    let pv = ex2_ftz(k, arg)?;
                    sum = if i == 0 { pv } else { k.fadd(sum, pv)? };
                    pf[mi][i / 2][2 * hh + i % 2] = pv;
                }
                k.set(l[mi][hh], k.fma(k.get_f(l[mi][hh])?, alpha, sum)?.into())?;
                k.set(m[mi][hh], mn.into())?;
                rescale = or(k, rescale, k.fcmp(FloatPredicate::UNE, alpha, k.f32c(1.0))?)?;
                alphas.push((mi, hh, alpha));
            }
        }
        Ok((pf, rescale, alphas))
    }

    /// P as A fragments (pa[mi][kk]: keys 16kk..16kk+16), rounded to bf16/f16 pairs.
    pub(super) fn pack(&self, k: &Kit<'ctx>, pf: &[Vec<[FloatValue<'ctx>; 4]>]) -> R<AFrag<'ctx>> {
        let (mt, n_nt, dt) = (self.mt, self.n_nt, self.dt);
        if self.fp8.is_some() {
            // The e4m3 A fragment of k-step kk (32 keys): register r holds row g (r even) or
            // g + 8 (r odd) at k positions 4·t4 + 16·(r / 2) .. +3, which Vᵀ's transposition
            // assigns the keys this lane's S accumulators hold: 2·t4, 2·t4 + 1 of n8 tiles
            // 4kk + 2·(r / 2) and 4kk + 2·(r / 2) + 1 (see `transpose_v`). No shuffles.
            return (0..mt)
                .map(|mi| {
                    (0..n_nt / 4)
                        .map(|kk| {
                            let pk = |n: usize, e: usize| k.pack_e4m3x4([pf[mi][n][e], pf[mi][n][e + 1], pf[mi][n + 1][e], pf[mi][n + 1][e + 1]]);
                            Ok([pk(4 * kk, 0)?, pk(4 * kk, 2)?, pk(4 * kk + 2, 0)?, pk(4 * kk + 2, 2)?])
                        })
                        .collect::<R<Vec<_>>>()
                })
                .collect::<R<_>>();
        }
        (0..mt)
            .map(|mi| {
                (0..n_nt / 2)
                    .map(|kk| {
                        let pk = |n: usize, e: usize| k.math(|kb| kb.pack_x2(dt, pf[mi][n][e], pf[mi][n][e + 1]));
                        Ok([pk(2 * kk, 0)?, pk(2 * kk, 2)?, pk(2 * kk + 1, 0)?, pk(2 * kk + 1, 2)?])
                    })
                    .collect::<R<Vec<_>>>()
            })
            .collect::<R<_>>()
    }

    /// acc ·= α, skipped when no row of the warp has a new maximum (α = 1 exactly).
    pub(super) fn rescale_acc(&self, k: &Kit<'ctx>, rescale: IntValue<'ctx>, alphas: &[(usize, usize, FloatValue<'ctx>)]) -> R<()> {
        k.if_then(warp_any(k, rescale)?, |k| {
            for &(mi, hh, alpha) in alphas {
                for a in &self.acc[mi] {
                    for e in [2 * hh, 2 * hh + 1] {
                        k.set(a[e], k.fmul(k.get_f(a[e])?, alpha)?.into())?;
                    }
                }
            }
            Ok(())
        })
    }

    /// Products the interpreter does not make (see the module docs) in the tile at key j0
    /// (V at `v_sm`), after its `scores`: keys at or past the warp's first row's limit, or
    /// below some row's window start. Whether V holds a non-finite value there, so that this
    /// tile's P·V must go the CUDA-core way (the warpgroup's decision with `wgmma`).
    pub(super) fn decide_slow(&self, k: &Kit<'ctx>, j0: IntValue<'ctx>, v_sm: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let (bkv, sm, slow_var) = (self.bkv, self.sm, self.slow_var);
        let c32 = |v: u32| self.c32(v);
        let hi = k.smin(k.add(j0, c32(bkv))?, self.skv32)?;
        k.set(slow_var, c32(0).into())?;
        let lo = get_i32(k, self.lo_var)?;
        k.if_then(k.icmp(IntPredicate::SLT, lo, hi)?, |k| {
            // Lanes scan 16-byte chunks of V rows lo..hi (tile-relative rows lo − j0..).
            let cv = self.dv / self.epc;
            let r0 = k.sub(lo, j0)?;
            let total = k.mul(k.sub(hi, lo)?, c32(cv))?;
            let found = var_i32(k, c32(0))?;
            k.for_range(self.lane, total, c32(32), |k, e| {
                let r = k.add(r0, k.udiv(e, c32(cv))?)?;
                let col = k.urem(e, c32(cv))?;
                let at = self.sm_at(k, v_sm, bkv, sm.ldv, r, col)?;
                let words = load_i32s(k, k.sh_at(self.smem, at)?, 4)?;
                let bad = if self.fp8.is_some() { any_nan_e4m3(k, &words)? } else { any_nonfinite(k, &words, self.exp_mask)? };
                k.if_then(bad, |k| k.set(found, c32(1).into()))
            })?;
            if self.wg.is_some() {
                return k.set(slow_var, get_i32(k, found)?.into());
            }
            let any = warp_any(k, k.icmp(IntPredicate::NE, get_i32(k, found)?, c32(0))?)?;
            k.set(slow_var, k.select_int(any, c32(1), c32(0))?.into())
        })?;
        let slow = k.icmp(IntPredicate::NE, get_i32(k, slow_var)?, c32(0))?;
        // The warpgroup decides together (its P·V is one `wgmma`): named barrier 1 + wg.
        if self.wg.is_some() {
            k.bar_red_or(k.add(self.wg_id, c32(1))?, 128, slow)
        } else {
            Ok(slow)
        }
    }

    /// CUDA-core P·V of the tile at key j0 (V at `v_sm`, P in `pa`), exactly the
    /// interpreter's products: per row, the keys below its limit (and from its window start).
    /// fp8: P is the e4m3 fragments (`pack`), read back as f16 pairs in the mma.sync A layout
    /// of 16-key steps (exactly the values the `wgmma` multiplies), and V is e4m3 bytes.
    pub(super) fn pv_slow(&self, k: &Kit<'ctx>, j0: IntValue<'ctx>, v_sm: IntValue<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>]) -> R<()> {
        let (mt, sm, smem, t4, dt, bkv, n_ov, pdt) = (self.mt, self.sm, self.smem, self.t4, self.dt, self.bkv, self.n_ov, self.pdt);
        let c32 = |v: u32| self.c32(v);
        let pa16: Vec<Vec<[IntValue<'ctx>; 4]>>;
        let pa = if self.fp8.is_some() {
            // Register r of 32-key step kk holds the pairs (n8 tile 4kk + 2·(r / 2), rows
            // g + 8·(r % 2)) in its low half and (tile 4kk + 2·(r / 2) + 1) in its high half.
            let lo = |k: &Kit<'ctx>, w: IntValue<'ctx>| k.e4m3x2_to_f16x2(w);
            let hi = |k: &Kit<'ctx>, w: IntValue<'ctx>| k.e4m3x2_to_f16x2(k.lshr(w, 16)?);
            pa16 = pa
                .iter()
                .map(|steps| {
                    let mut v = Vec::new();
                    for f in steps {
                        v.push([lo(k, f[0])?, lo(k, f[1])?, hi(k, f[0])?, hi(k, f[1])?]);
                        v.push([lo(k, f[2])?, lo(k, f[3])?, hi(k, f[2])?, hi(k, f[3])?]);
                    }
                    Ok(v)
                })
                .collect::<R<_>>()?;
            &pa16[..]
        } else {
            pa
        };
        // P (rounded as the mma would see it) to the warp's scratch rows: row
        // 16mi + 8h + g of the warp, keys as in the A fragments.
        let prow0 = k.add(c32(sm.p), k.mul(k.add(k.mul(self.warp, c32(self.rpw))?, self.g)?, c32(sm.ldp * 2))?)?;
        let pst = k.sh_at(smem, k.add(prow0, k.mul(t4, c32(4))?)?)?;
        for mi in 0..mt {
            for (kk, frag) in pa[mi].iter().enumerate() {
                for (r, &word) in frag.iter().enumerate() {
                    let off = (16 * mi as u32 + 8 * (r % 2) as u32) * sm.ldp * 2 + (16 * kk as u32 + 8 * (r / 2) as u32) * 2;
                    store_i32s(k, k.sh_at(pst, c32(off))?, &[word])?;
                }
            }
        }
        k.warp_sync()?;
        k.for_range(c32(0), c32(bkv), c32(1), |k, jj| {
            let j = k.add(j0, jj)?;
            // V(j, 8n + 2·t4 ..) at constant offsets from one pointer.
            let vs: Vec<Vec<FloatValue<'ctx>>> = if self.fp8.is_some() {
                // Bytes 8·(n % 2) + 2·t4 of chunk n / 2 of V row jj: columns 8n + 2·t4 + {0, 1}.
                (0..n_ov)
                    .map(|n| {
                        let at = k.add(self.sm_at(k, v_sm, bkv, sm.ldv, jj, c32(n as u32 / 2))?, k.add(k.mul(t4, c32(2))?, c32(8 * (n as u32 % 2)))?)?;
                        let ptr = k.sh_at(smem, at)?;
                        let pair = k.math(|kb| Ok(kb.load(kb.cx.i16_type().into(), ptr, 2)?.into_int_value()))?;
                        Ok(k.e4m3x2_to_f32(k.math(|kb| Ok(kb.b.build_int_z_extend(pair, kb.cx.i32_type(), "")?))?)?.to_vec())
                    })
                    .collect::<R<_>>()?
            } else if sm.swz {
                (0..n_ov).map(|n| k.sh_load(dt, k.sh_at(smem, k.add(self.sm_at(k, v_sm, bkv, sm.ldv, jj, c32(n as u32))?, k.mul(t4, c32(4))?)?)?, 2)).collect::<R<_>>()?
            } else {
                let vrow = k.sh_at(smem, k.add(k.add(v_sm, k.mul(jj, c32(sm.ldv * 2))?)?, k.mul(t4, c32(4))?)?)?;
                (0..n_ov).map(|n| k.sh_load(dt, k.sh_at(vrow, c32(16 * n as u32))?, 2)).collect::<R<_>>()?
            };
            let pcol = k.sh_at(smem, k.add(prow0, k.mul(jj, c32(2))?)?)?;
            for mi in 0..mt {
                for hh in 0..2 {
                    let pj = k.sh_load(pdt, k.sh_at(pcol, c32((16 * mi as u32 + 8 * hh as u32) * sm.ldp * 2))?, 1)?[0];
                    let made = k.icmp(IntPredicate::SLT, j, self.rows.limit[mi][hh])?;
                    let made = if self.p.window.is_some() { k.and(made, k.icmp(IntPredicate::SGE, j, self.rows.start[mi][hh])?)? } else { made };
                    for (a, v) in self.acc[mi].iter().zip(&vs) {
                        for e in 0..2 {
                            let old = k.get_f(a[2 * hh + e])?;
                            let new = k.fma(pj, v[e], old)?;
                            k.set(a[2 * hh + e], k.select_f(made, new, old)?.into())?;
                        }
                    }
                }
            }
            Ok(())
        })?;
        k.warp_sync()
    }

    /// O += P·V on tensor cores (V at `v_sm`, its lane's `ldmatrix` address `v_at`, P in
    /// `pa`): `mma.sync`, or the `wgmma` groups ([`Tiles::pv_wgmma`]).
    pub(super) fn pv_tc(&self, k: &Kit<'ctx>, v_sm: IntValue<'ctx>, v_at: PointerValue<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>], overlapped: bool) -> R<()> {
        if self.wg.is_some() {
            return self.pv_wgmma(k, v_sm, pa, overlapped);
        }
        let (mt, n_nt, n_ov, sm, dt) = (self.mt, self.n_nt, self.n_ov, self.sm, self.dt);
        let c32 = |v: u32| self.c32(v);
        for kk in 0..n_nt / 2 {
            for np in 0..n_ov / 2 {
                let vb = k.ldmatrix_x4(k.sh_at(v_at, c32(kk as u32 * 16 * sm.ldv * 2 + np as u32 * 32))?, true)?;
                for mi in 0..mt {
                    for (half, bb) in [[vb[0], vb[1]], [vb[2], vb[3]]].into_iter().enumerate() {
                        let a = &self.acc[mi][2 * np + half];
                        let cur = [k.get_f(a[0])?, k.get_f(a[1])?, k.get_f(a[2])?, k.get_f(a[3])?];
                        let out = k.mma(dt, pa[mi][kk], bb, cur)?;
                        for e in 0..4 {
                            k.set(a[e], out[e].into())?;
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// S = Q·Kᵀ on `mma.sync` for the tile whose K lane address is `k_at`.
    fn qk_mma(&self, k: &Kit<'ctx>, k_at: PointerValue<'ctx>, sacc: &mut CFrag<'ctx>) -> R<()> {
        let (mt, bkv, sm, dt) = (self.mt, self.bkv, self.sm, self.dt);
        let c32 = |v: u32| self.c32(v);
        for ks in 0..self.d / 16 {
            let qa: Vec<[IntValue<'ctx>; 4]> = (0..mt).map(|mi| if self.s.q_in_regs { Ok(self.f.qf[mi][ks as usize]) } else { self.f.q_frag(k, sm, mi, ks) }).collect::<R<_>>()?;
            for np in 0..(bkv / 16) as usize {
                let kb = k.ldmatrix_x4(k.sh_at(k_at, c32(np as u32 * 16 * sm.ldk * 2 + ks * 32))?, false)?;
                for mi in 0..mt {
                    sacc[mi][2 * np] = k.mma(dt, qa[mi], [kb[0], kb[1]], sacc[mi][2 * np])?;
                    sacc[mi][2 * np + 1] = k.mma(dt, qa[mi], [kb[2], kb[3]], sacc[mi][2 * np + 1])?;
                }
            }
        }
        Ok(())
    }

    /// The plain key loop (`mma.sync`, and `wgmma` without the overlap or the producer): per
    /// tile, wait for its copies and a barrier, issue the next tile's, then S = Q·Kᵀ, the
    /// scores, the softmax and P·V. fp8: V is loaded two tiles ahead of its use (three
    /// stages, t mod 3) and transposed one tile ahead into Vᵀ buffer t mod 2, so that the
    /// barrier at the top of the next tile publishes it (no second barrier). The prologue took
    /// K_0 and V_0: V_1 now, and V_0's transposition.
    fn plain_loop(&self) -> R<()> {
        let (kit, sm, n_tiles, bkv, fp8) = (self.kit, self.sm, self.n_tiles, self.bkv, self.fp8);
        let c32 = |v: u32| self.c32(v);
        if fp8.is_some() {
            kit.if_then(kit.icmp(IntPredicate::SGT, n_tiles, c32(1))?, |k| self.issue_v3(k, c32(1)))?;
            kit.cp_async_commit()?;
            self.transpose_v(kit, c32(sm.v[0]), c32(sm.vt[0]))?;
            kit.fence_proxy_async()?;
        }
        kit.for_range(self.t_lo, n_tiles, c32(1), |k, t| {
            k.cp_async_wait(0)?;
            if self.wg.is_some() {
                k.fence_proxy_async()?;
            }
            k.barrier()?;
            let next = k.add(t, c32(1))?;
            if fp8.is_some() {
                k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| self.issue_k(k, next))?;
                let after = k.add(t, c32(2))?;
                k.if_then(k.icmp(IntPredicate::SLT, after, n_tiles)?, |k| self.issue_v3(k, after))?;
                k.cp_async_commit()?;
            } else {
                k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| {
                    self.issue_tile(k, next)?;
                    k.cp_async_commit()
                })?;
            }
            let j0 = k.mul(t, c32(bkv))?;
            let s_fp8 = if fp8.is_some() { Some(self.qk_fp8_ahead(k, t, next)?) } else { None };
            // (With a window, a warp also skips the tiles wholly below its first row's window.)
            let computes = k.icmp(IntPredicate::SLT, j0, self.grp_end)?;
            let computes = if self.p.window.is_some() { k.and(computes, k.icmp(IntPredicate::SGT, k.add(j0, c32(bkv))?, self.w_start[0])?)? } else { computes };
            k.if_then(computes, |k| {
                let (k_sm, v_sm) = self.stage_of(k, t)?;
                let v_sm = if fp8.is_some() { self.v_stage(k, t)? } else { v_sm };
                let (k_at, v_at) = (k.sh_at(self.smem, k.add(k_sm, self.f.k_lane)?)?, k.sh_at(self.smem, k.add(v_sm, self.f.v_lane)?)?);

                // S = Q·Kᵀ.
                let mut sacc: CFrag<'ctx> = vec![vec![[self.zero; 4]; self.n_nt]; self.mt];
                if self.wg.is_some() {
                    let out = match &s_fp8 {
                        Some(out) => out.clone(),
                        None => self.qk_wg(k, k_sm, 0)?,
                    };
                    for n in 0..self.n_nt {
                        for e in 0..4 {
                            sacc[0][n][e] = out[4 * n + e];
                        }
                    }
                } else {
                    self.qk_mma(k, k_at, &mut sacc)?;
                }
                self.scores(k, j0, &sacc)?;
                let (pf, rescale, alphas) = self.softmax(k)?;
                self.rescale_acc(k, rescale, &alphas)?;
                let pa = self.pack(k, &pf)?;
                let slow = self.decide_slow(k, j0, v_sm)?;
                k.if_else(slow, |k| self.pv_slow(k, j0, v_sm, &pa), |k| self.pv_tc(k, v_sm, v_at, &pa, false))
            })
        })
    }

    // ---- O = acc / l, rounded once ------------------------------------------------------------

    /// Each row's outputs `acc / l` (`acc` = Σ 0·v for a row that never saw a score above
    /// −inf: 0 for finite V), per slab and half, in the order of `acc`.
    fn outputs(&self) -> R<Vec<[Vec<FloatValue<'ctx>>; 2]>> {
        let (kit, ninf) = (self.kit, self.ninf);
        let mut outs: Vec<[Vec<FloatValue<'ctx>>; 2]> = Vec::new();
        for mi in 0..self.mt {
            let mut pair: [Vec<FloatValue<'ctx>>; 2] = [Vec::new(), Vec::new()];
            for (hh, o) in pair.iter_mut().enumerate() {
                let mut lt = kit.get_f(self.l[mi][hh])?;
                lt = kit.fadd(lt, kit.shfl_xor(lt, 1)?)?;
                lt = kit.fadd(lt, kit.shfl_xor(lt, 2)?)?;
                let empty = kit.fcmp(FloatPredicate::OEQ, kit.get_f(self.m[mi][hh])?, ninf)?;
                // fp8: O = sv · Σ p·v8 / l.
                let sv = self.v_scale.unwrap_or(kit.f32c(1.0));
                let inv = kit.select_f(empty, sv, kit.fdiv(sv, lt)?)?;
                for a in &self.acc[mi] {
                    for e in [2 * hh, 2 * hh + 1] {
                        o.push(kit.fmul(kit.get_f(a[e])?, inv)?);
                    }
                }
            }
            outs.push(pair);
        }
        Ok(outs)
    }

    /// O to global memory: staged through the warp's rows of shared memory and written with
    /// 16-byte stores, or element by element where the output's layout does not allow them.
    fn store_o(&self, outs: &[[Vec<FloatValue<'ctx>>; 2]]) -> R<()> {
        let (kit, p, sm, dt, t4, g, n_ov, rpw) = (self.kit, self.p, self.sm, self.dt, self.t4, self.g, self.n_ov, self.rpw);
        let (o_base, o_ss, o_ptr) = (self.o_base, self.o_ss, self.o_ptr);
        let c32 = |v: u32| self.c32(v);
        let o_sd = kit.dim(&p.out.st[3])?;
        if p.out.vector_ok(8) {
            // Stage the warp's rows in its rows of the Q tile (which only this warp reads), then
            // 16-byte stores.
            kit.warp_sync()?;
            let wrow0 = kit.mul(self.warp, c32(rpw))?;
            let staged = |k: &Kit<'ctx>, x: IntValue<'ctx>| if sm.stage == 0 { Ok(x) } else { k.add(c32(sm.stage), x) };
            for (mi, pair) in outs.iter().enumerate() {
                for (hh, o) in pair.iter().enumerate() {
                    let row = kit.add(wrow0, kit.add(g, c32(16 * mi as u32 + 8 * hh as u32))?)?;
                    for n in 0..n_ov {
                        let col = kit.add(kit.mul(t4, c32(2))?, c32(8 * n as u32))?;
                        let word = kit.math(|kb| kb.pack_x2(dt, o[2 * n], o[2 * n + 1]))?;
                        let at = staged(kit, kit.add(kit.mul(row, c32(sm.ldst * 2))?, kit.mul(col, c32(2))?)?)?;
                        store_i32s(kit, kit.sh_at(self.smem, at)?, &[word])?;
                    }
                }
            }
            kit.warp_sync()?;
            let cv = self.dv / 8;
            let total = rpw * cv;
            for i in 0..total.div_ceil(32) {
                let e = kit.add(self.lane, c32(32 * i))?;
                let r = kit.udiv(e, c32(cv))?;
                let col = kit.urem(e, c32(cv))?;
                let grow = kit.add(self.w0, kit.zext64(r)?)?;
                let ok = kit.and(kit.icmp(IntPredicate::ULT, e, c32(total))?, kit.icmp(IntPredicate::SLT, grow, self.sq)?)?;
                kit.if_then(ok, |k| {
                    let at = staged(k, k.add(k.mul(k.add(wrow0, r)?, c32(sm.ldst * 2))?, k.mul(col, c32(16))?)?)?;
                    let words = load_i32s(k, k.sh_at(self.smem, at)?, 4)?;
                    let gi = k.add(o_base, k.add(k.mul(grow, o_ss)?, k.zext64(k.mul(col, c32(8))?)?)?)?;
                    store_i32s(k, k.gep_raw(dt, o_ptr, gi)?, &words)
                })?;
            }
        } else {
            for (mi, pair) in outs.iter().enumerate() {
                for (hh, o) in pair.iter().enumerate() {
                    kit.if_then(self.rows.valid[mi][hh], |k| {
                        let row = k.add(o_base, k.mul(self.rows.index[mi][hh], o_ss)?)?;
                        for n in 0..n_ov {
                            for e in 0..2 {
                                let col = k.add(k.mul(t4, c32(2))?, c32(8 * n as u32 + e as u32))?;
                                let idx = k.add(row, k.mul(k.zext64(col)?, o_sd)?)?;
                                k.store_vec(dt, o_ptr, idx, &[o[2 * n + e]])?;
                            }
                        }
                        Ok(())
                    })?;
                }
            }
        }
        Ok(())
    }

    /// lse = m + ln l (`fused`: scale·m, m over raw scores; fp8: l carries P's 2⁸, − 8·ln 2),
    /// after O so that O's registers are free.
    fn write_lse(&self) -> R<()> {
        let (kit, ninf) = (self.kit, self.ninf);
        let c32 = |v: u32| self.c32(v);
        if let Some(t) = &self.p.lse {
            let (lb, ls, lptr) = (base_of(kit, t, self.b, self.h)?, kit.dim(&t.st[2])?, kit.buf(t.buffer)?);
            for mi in 0..self.mt {
                for hh in 0..2 {
                    let mut lt = kit.get_f(self.l[mi][hh])?;
                    lt = kit.fadd(lt, kit.shfl_xor(lt, 1)?)?;
                    lt = kit.fadd(lt, kit.shfl_xor(lt, 2)?)?;
                    let mv = kit.get_f(self.m[mi][hh])?;
                    let empty = kit.fcmp(FloatPredicate::OEQ, mv, ninf)?;
                    let ln_l = kit.log(lt)?;
                    let lse = if self.fused {
                        kit.fma(mv, kit.f32c(self.p.scale), ln_l)?
                    } else if self.fp8.is_some() {
                        kit.fadd(mv, kit.fsub(ln_l, kit.f32c(f64::from(FP8_P_LOG2) * std::f64::consts::LN_2))?)?
                    } else {
                        kit.fadd(mv, ln_l)?
                    };
                    let v = kit.select_f(empty, ninf, lse)?;
                    // The quad's four lanes hold the row's m and l; the first writes.
                    let first = kit.and(self.rows.valid[mi][hh], kit.icmp(IntPredicate::EQ, self.t4, c32(0))?)?;
                    kit.if_then(first, |k| k.store_vec(DType::F32, lptr, k.add(lb, k.mul(self.rows.index[mi][hh], ls)?)?, &[v]))?;
                }
            }
        }
        Ok(())
    }
}

/// The (batch, head) base of the additive mask.
fn base_mask<'ctx>(kit: &Kit<'ctx>, mk: &Mask, b: IntValue<'ctx>, h: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let a = kit.add(kit.dim(&mk.offset)?, kit.mul(b, kit.dim(&mk.st[0])?)?)?;
    kit.add(a, kit.mul(h, kit.dim(&mk.st[1])?)?)
}
