//! The prefill attention schedules and how they are picked: [`AttentionSchedule`] (the
//! CUDA-core kernel), [`TcSchedule`] (`mma.sync`) and [`WgSchedule`] (`wgmma`, sm_90a), their
//! checks, the shared-memory layouts they imply ([`SimtSmem`], [`TcSmem`]), and which kernel
//! a prefill attention may take ([`eligible`], [`wg_eligible`]).
//!
//! The registers decide the tensor-core tile shapes: a warp holds its O accumulators (at
//! D = 128, 128 floats a warp slab pair) beside the scores of a key tile, and each schedule
//! here is the largest that ptxas fits in 255 registers a thread without spilling.
//!
//! Design notes: book/src/design/attention.md

use sinter_ir::{DType, Family};

use super::analysis::{unsupported, Prefill};
use crate::isa::kit::R;
use crate::target::Target;

/// Keys per tile: one per lane of a warp.
pub const BLOCK_KV: u32 = 32;

/// Work split of an attention CTA: `warps` warps, each owning `rows_per_warp` query rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionSchedule {
    /// Warps per CTA (1 to 32).
    pub warps: u32,
    /// Query rows per warp (1 to 16).
    pub rows_per_warp: u32,
}

impl AttentionSchedule {
    /// Query rows per CTA.
    pub fn block_q(&self) -> u32 {
        self.warps * self.rows_per_warp
    }

    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        self.warps * 32
    }

    /// Shared memory per CTA, in bytes, for head dims `d` (Q/K) and `dv` (V) in dtype `dt`:
    /// Q tile, K tile, V tile (input dtype, padded rows) and the f32 probabilities.
    pub fn shared_bytes(&self, d: u32, dv: u32, dt: DType) -> u32 {
        SimtSmem::new(self, d, dv, dt).total
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if (1..=32).contains(&self.warps) && (1..=16).contains(&self.rows_per_warp) {
            Ok(())
        } else {
            Err(format!("invalid attention schedule {self:?}"))
        }
    }
}

/// Most accumulator registers per thread a chosen schedule may need (`rows · ⌈dv/32⌉`).
const ACC_BUDGET: u32 = 32;

/// Candidate (warps, rows per warp), best first.
const CANDIDATES: [(u32, u32); 5] = [(8, 4), (4, 4), (4, 2), (4, 1), (1, 1)];

/// Picks the prefill schedule: the first of 8×4, 4×4, 4×2, 4×1 (warps × rows per warp)
/// whose accumulators fit 32 registers per thread and whose shared memory fits 48 KiB (when
/// none does, 4×1 in dynamic shared memory). bf16 with D = 64 or 128: 8 warps × 4 rows, a
/// 32-row query tile (29 KiB at D = 128, about 90 registers: two CTAs per SM); D = 256 or
/// f32 with D = 128: 4 × 4. (8 rows per warp doubles the registers to about 160 for a 25%
/// smaller K/V re-read; not worth it on CUDA cores.)
pub fn choose_prefill_schedule(d: u32, dv: u32, dt: DType) -> AttentionSchedule {
    pick(d, dv, dt, 64)
}

/// Picks the paged-decode schedule for `rows` query rows per KV head (`H/Hkv · T`, when
/// known): as [`choose_prefill_schedule`], but with a query tile no larger than `rows`
/// rounded up to a multiple of 4 (so GQA 32/8 with T = 1 gets 4 warps of one row each).
pub fn choose_paged_schedule(rows: Option<i64>, d: u32, dv: u32, dt: DType) -> AttentionSchedule {
    let max_q = rows.map_or(64, |r| (r.clamp(1, 64) as u32).next_power_of_two().max(4));
    pick(d, dv, dt, max_q)
}

fn pick(d: u32, dv: u32, dt: DType, max_q: u32) -> AttentionSchedule {
    let nd = dv.div_ceil(32);
    CANDIDATES
        .iter()
        .map(|&(warps, rows_per_warp)| AttentionSchedule { warps, rows_per_warp })
        .find(|s| s.block_q() <= max_q && s.rows_per_warp * nd <= ACC_BUDGET && s.shared_bytes(d, dv, dt) <= 48 * 1024)
        .unwrap_or(AttentionSchedule { warps: 4, rows_per_warp: 1 })
}

/// Shared-memory layout of the core: byte offsets of each part.
pub(super) struct SimtSmem {
    /// Elements per 16-byte chunk of a Q/K row (1 when D is not a multiple).
    pub(super) ck: u32,
    /// Same for V rows.
    pub(super) cv: u32,
    /// Q/K row stride, elements (D + padding).
    pub(super) ldk: u32,
    /// V row stride, elements.
    pub(super) ldv: u32,
    pub(super) q: u32,
    pub(super) k: u32,
    pub(super) v: u32,
    pub(super) p: u32,
    pub(super) total: u32,
}

impl SimtSmem {
    pub(super) fn new(s: &AttentionSchedule, d: u32, dv: u32, dt: DType) -> SimtSmem {
        let es = dt.size_bytes() as u32;
        let vec = 16 / es;
        let ck = if d % vec == 0 { vec } else { 1 };
        let cv = if dv % vec == 0 { vec } else { 1 };
        // Padding by one chunk makes the row stride an odd number of chunks: lanes reading
        // 16-byte chunks of 32 different K rows hit distinct banks.
        let ldk = d + ck;
        let ldv = dv;
        let up = |x: u32| x.div_ceil(16) * 16;
        let q = 0;
        let k = up(q + s.block_q() * ldk * es);
        let v = up(k + BLOCK_KV * ldk * es);
        let p = up(v + BLOCK_KV * ldv * es);
        let total = up(p + s.block_q() * BLOCK_KV * 4);
        SimtSmem { ck, cv, ldk, ldv, q, k, v, p, total }
    }
}

/// Work split of a tensor-core attention CTA.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TcSchedule {
    /// Warps per CTA (1 to 8).
    pub warps: u32,
    /// 16-row slabs per warp (1 or 2): 2 halves the shared-memory reads of K and V per row.
    pub m_tiles: u32,
    /// Keys per tile (16 to 128, a multiple of 16).
    pub block_kv: u32,
    /// Whether Q's fragments are loaded once into registers (else from shared memory per tile).
    pub q_in_regs: bool,
}

impl TcSchedule {
    /// Query rows per warp.
    pub fn rows_per_warp(&self) -> u32 {
        16 * self.m_tiles
    }

    /// Query rows per CTA.
    pub fn block_q(&self) -> u32 {
        self.warps * self.rows_per_warp()
    }

    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }

    /// Shared memory per CTA, in bytes, for head dims `d` (Q/K) and `dv` (V).
    pub fn shared_bytes(&self, d: u32, dv: u32) -> u32 {
        TcSmem::new(self, d, dv).total
    }

    /// A short, stable name (`tc kv48 w4 m2`, `+q` when Q stays in registers): part of an
    /// autotuned variant's cache key, and what `sinter explain` shows.
    pub fn name(&self) -> String {
        format!("tc kv{} w{} m{}{}", self.block_kv, self.warps, self.m_tiles, if self.q_in_regs { " +q" } else { "" })
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if (1..=8).contains(&self.warps) && (1..=2).contains(&self.m_tiles) && self.block_kv % 16 == 0 && (16..=128).contains(&self.block_kv) {
            Ok(())
        } else {
            Err(format!("invalid tensor-core attention schedule {self:?}"))
        }
    }
}

/// Picks the tensor-core schedule for head dims `d`, `dv` (the larger one decides), whether an
/// additive mask is read, causality and the target, all with 4 warps (128 threads, so up to
/// 255 registers a thread still allow two CTAs, 8 warps, per SM):
/// - ≤ 64: 2 slabs a warp (128 query rows a CTA), 64-key tiles, Q in registers;
/// - `d = dv = 128`, not causal, where two CTAs of 99 KiB fit in an SM's shared memory (sm_90,
///   not sm_80): 2 slabs, **48-key tiles**, Q re-read from shared memory per tile — fewer
///   shared-memory bytes per `mma` and a third fewer barriers, reductions and rescalings per
///   key than 32-key tiles. It is at the edge of the registers: causal and the other head dims
///   spill at 48, hence 32 for them;
/// - other ≤ 128: 2 slabs, 32-key tiles, Q re-read from shared memory per tile
///   (FlashAttention-2's 64-key tile spills at D = 128);
/// - ≤ 256: 1 slab (128 accumulator registers), 32-key tiles, Q from shared memory;
/// - with a mask (≤ 128; larger heads go to CUDA cores): 1 slab, 64-key tiles
///   (each score's mask element is a global load, whose registers 2 slabs do not leave).
///
/// The register counts behind each choice are in the design notes.
pub fn choose_tc_schedule(d: u32, dv: u32, masked: bool, causal: bool, target: &Target) -> TcSchedule {
    match (d.max(dv), masked) {
        (w, true) => TcSchedule { warps: 4, m_tiles: 1, block_kv: 64, q_in_regs: w <= 64 },
        (0..=64, false) => TcSchedule { warps: 4, m_tiles: 2, block_kv: 64, q_in_regs: true },
        (65..=128, false) => {
            let s48 = TcSchedule { warps: 4, m_tiles: 2, block_kv: 48, q_in_regs: false };
            // The driver reserves 1 KiB of shared memory per CTA.
            if d == 128 && dv == 128 && !causal && 2 * (s48.shared_bytes(d, dv) + 1024) <= target.max_shared_memory_per_sm() {
                s48
            } else {
                TcSchedule { block_kv: 32, ..s48 }
            }
        }
        _ => TcSchedule { warps: 4, m_tiles: 1, block_kv: 32, q_in_regs: false },
    }
}

/// Why prefill attention `p` cannot take the tensor-core kernel (`Ok` when it can).
pub(super) fn eligible(p: &Prefill) -> Result<(), String> {
    if p.d.max(p.dv) > 256 {
        return Err(format!("head dims {} and {}: the tensor-core kernels take up to 256", p.d, p.dv));
    }
    if p.fp8.is_some() {
        return Err(crate::error::fp8_message("f8e4m3 attention: the mma.sync kernel does not read f8e4m3"));
    }
    if !matches!(p.dtype, DType::BF16 | DType::F16) {
        return Err(format!("no tensor-core attention for {} (bf16 and f16 only)", p.dtype));
    }
    if p.d % 16 != 0 || p.dv % 16 != 0 {
        return Err(format!("head dims {} and {} must be multiples of 16 for mma.m16n8k16", p.d, p.dv));
    }
    if p.mask.is_some() && p.d.max(p.dv) > 128 {
        return Err(format!("an additive mask with head dims {} and {}: its loads do not fit the registers beside a 256-wide accumulator", p.d, p.dv));
    }
    for (t, n) in [(&p.q, "q"), (&p.k, "k"), (&p.v, "v")] {
        if !t.vector_ok(8) {
            return Err(format!("{n}'s rows are not contiguous and 16-byte aligned, as 16-byte cp.async needs"));
        }
    }
    Ok(())
}

/// Work split of the Hopper attention CTA (sm_90a, `wgmma`; see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgSchedule {
    /// Warpgroups per CTA (1 to 3), each owning 64 query rows.
    pub warpgroups: u32,
    /// Keys per tile: the N of the `m64nNk16` S = Q·Kᵀ product (64 to 256, a multiple of 16).
    pub block_kv: u32,
    /// P·V as one `m64n64k16` per 64 columns of Dv (no leading byte offset in V's
    /// descriptor) instead of one `m64n{Dv}k16`.
    pub pv_split: bool,
    /// FlashAttention-3's intra-warpgroup overlap (arXiv 2407.08608 §3.2, Algorithm 2): the
    /// softmax of key tile t runs while P_{t−1}·V_{t−1} is in flight, and Q·K_tᵀ is issued
    /// before that P·V (see the module docs of `prefill_wgmma.rs`). Costs the registers of
    /// P_{t−1} across the loop (`block_kv / 4` a thread) beside S and O.
    pub overlap: bool,
    /// Warp specialisation (FlashAttention-3 §3.1, arXiv 2407.08608): a producer warpgroup
    /// (warpgroup 0, `setmaxnreg.dec` to [`WS_PRODUCER_REGS`]) whose one thread loads Q once
    /// and K and V per key tile with the TMA into a ring of [`WS_STAGES`] stages guarded by
    /// full/empty mbarriers; the `warpgroups` consumer warpgroups (`setmaxnreg.inc` to
    /// [`WS_CONSUMER_REGS`]) compute, with no CTA-wide barrier in the key loop (see "The
    /// Hopper kernel" in the module docs). 128 more threads. Not with `overlap`.
    pub producer: bool,
    /// FlashAttention-3's inter-warpgroup ping-pong (§3.1, Fig. 1), with `producer` and two
    /// consumer warpgroups: named barriers make the warpgroups issue their Q·Kᵀ in turn, so
    /// one's softmax runs while the other's products do.
    pub pingpong: bool,
}

/// Stages of the K/V ring of the warp-specialised attention kernel ([`WgSchedule::producer`]):
/// at D = 128 two stages of 128-key K and V tiles (128 KiB) beside Q (32 KiB) and the P
/// scratch (34 KiB) fill the 227 KiB an sm_90 CTA may have.
pub const WS_STAGES: u32 = 2;
/// The producer warpgroup's registers per thread after `setmaxnreg.dec`: it holds only the
/// loop counter and TMA coordinates; 24 is what leaves two consumer warpgroups 240
/// (128 · 24 + 256 · 240 = 64512 ≤ 65536, the SM's registers).
pub const WS_PRODUCER_REGS: u32 = 24;
/// The consumer warpgroups' registers per thread after `setmaxnreg.inc`: FlashAttention-3's
/// 240 (O and S accumulators, 64 + 64 at D = 128, and the softmax beside them).
pub const WS_CONSUMER_REGS: u32 = 240;

impl WgSchedule {
    /// Query rows per CTA.
    pub fn block_q(&self) -> u32 {
        64 * self.warpgroups
    }

    /// Threads per CTA: 128 a consumer warpgroup, and 128 for the producer warpgroup.
    pub fn threads(&self) -> u32 {
        128 * (self.warpgroups + u32::from(self.producer))
    }

    /// Shared memory per CTA, in bytes, for head dims `d` (Q/K) and `dv` (V) (the
    /// mbarriers of `producer`, 8 bytes each, are static and not counted).
    pub fn shared_bytes(&self, d: u32, dv: u32) -> u32 {
        TcSmem::wg(self, d, dv, false).total
    }

    /// A short, stable name (`wgmma kv128 g2`, `+split` for `pv_split`, `ov` for
    /// `overlap`, `ws` for `producer`, `pp` for `pingpong`): part of an autotuned variant's
    /// cache key, and what `sinter explain` shows.
    pub fn name(&self) -> String {
        format!(
            "wgmma kv{} g{}{}{}{}{}",
            self.block_kv,
            self.warpgroups,
            if self.pv_split { " +split" } else { "" },
            if self.overlap { " ov" } else { "" },
            if self.producer { " ws" } else { "" },
            if self.pingpong { " pp" } else { "" }
        )
    }

    /// The layout the mma.sync kernel's builder walks: a warp per 16 rows.
    pub(super) fn as_tc(&self) -> TcSchedule {
        TcSchedule { warps: 4 * self.warpgroups, m_tiles: 1, block_kv: self.block_kv, q_in_regs: false }
    }

    pub(super) fn check(&self) -> Result<(), String> {
        if !((1..=3).contains(&self.warpgroups) && self.block_kv % 16 == 0 && (64..=256).contains(&self.block_kv)) {
            return Err(format!("invalid wgmma attention schedule {self:?}"));
        }
        if self.producer && self.overlap {
            return Err(format!("{self:?}: the warp-specialised attention kernel has no intra-warpgroup overlap yet"));
        }
        if self.producer && self.warpgroups > 2 {
            return Err(format!("{self:?}: the warp-specialised attention kernel takes at most 2 consumer warpgroups (their 240 registers a thread)"));
        }
        if self.pingpong && !(self.producer && self.warpgroups == 2) {
            return Err(format!("{self:?}: the ping-pong needs the producer warpgroup and two consumer warpgroups"));
        }
        Ok(())
    }
}

/// The Hopper schedule for head dims `d`, `dv` ≤ 128: two warpgroups (128 query rows, 256
/// threads, so up to 255 registers a thread at one CTA an SM), 128-key tiles — a 64×128 f32
/// S and a 64×Dv f32 O accumulator a warpgroup (64 + 64 registers a thread at D = 128), as
/// FlashAttention-3's (arXiv 2407.08608) 128×128 tile for D = 128. Head dims of 64 take
/// 64-key tiles, the faster there (twice the CTAs an SM: half the S registers and shared
/// memory; figures in the design notes). The warp-specialised kernel (`ws`) is a candidate,
/// not the default.
pub fn choose_wg_schedule(d: u32, dv: u32) -> WgSchedule {
    let block_kv = if d.max(dv) <= 64 { 64 } else { 128 };
    WgSchedule { warpgroups: 2, block_kv, pv_split: false, overlap: false, producer: false, pingpong: false }
}

/// The fp8 attention's schedule: two warpgroups, 64-key tiles at both head dims, no
/// producer (`wgmma kv64 g2 ov e4m3` is its autotuning alternative). 128-key tiles are
/// faster but not offered: ptxas 12.9 miscompiles them (NaN rows; the design notes say how
/// that was found), so they wait for a newer assembler.
pub fn choose_fp8_schedule() -> WgSchedule {
    WgSchedule { warpgroups: 2, block_kv: 64, pv_split: false, overlap: false, producer: false, pingpong: false }
}

/// Why prefill attention `p` cannot take the `wgmma` kernel on `target` (`Ok` when it can):
/// what [`eligible`] asks, and sm_90a, head dims 64 or 128, no additive mask.
pub(super) fn wg_eligible(p: &Prefill, target: &Target) -> Result<(), String> {
    if p.fp8.is_some() {
        return fp8_eligible(p, target).map_err(|e| crate::error::fp8_message(&format!("f8e4m3 attention: {e}")));
    }
    eligible(p)?;
    if p.window.is_some() || p.softcap.is_some() {
        return Err("a sliding window or a softcap: the wgmma kernel has neither yet (the mma.sync kernel takes them)".into());
    }
    if !target.has_wgmma() {
        return Err(format!("wgmma needs sm_90a, not {target}"));
    }
    if !matches!(p.d, 64 | 128) || !matches!(p.dv, 64 | 128) {
        return Err(format!("the wgmma kernel takes head dims 64 and 128, not {} and {}", p.d, p.dv));
    }
    if p.mask.is_some() {
        return Err("an additive mask (the wgmma kernel has none yet)".into());
    }
    Ok(())
}

/// Why fp8 attention `p` cannot take the `wgmma` kernel's fp8 form on `target`: sm_90a,
/// head dims 64 or 128, no additive mask, a bf16/f16 output, q/k/v rows contiguous and
/// 16-byte aligned (16 e4m3 elements a `cp.async`).
fn fp8_eligible(p: &Prefill, target: &Target) -> Result<(), String> {
    if p.window.is_some() || p.softcap.is_some() {
        return Err("a sliding window or a softcap (the fp8 kernel has neither)".into());
    }
    if !target.has_wgmma() {
        return Err(format!("wgmma needs sm_90a, not {target}"));
    }
    if !matches!(p.dtype, DType::BF16 | DType::F16) {
        return Err(format!("a {} output (bf16 and f16 only)", p.dtype));
    }
    if !matches!(p.d, 64 | 128) || !matches!(p.dv, 64 | 128) {
        return Err(format!("head dims {} and {} (64 and 128 only)", p.d, p.dv));
    }
    if p.mask.is_some() {
        return Err("an additive mask".into());
    }
    for (t, n) in [(&p.q, "q"), (&p.k, "k"), (&p.v, "v")] {
        if !t.vector_ok(16) {
            return Err(format!("{n}'s rows are not contiguous and 16-byte aligned, as 16-byte cp.async needs"));
        }
    }
    Ok(())
}

/// [`wg_eligible`] (for fp8, [`fp8_eligible`]) as the code generator's error for fp8 attention `p`
/// on `target` (what `plan_wg` refuses before any schedule), so that the schedule list of an
/// fp8 attention the kernel does not take is an error, not a kernel that fails to build.
///
/// # Errors
/// [`crate::error::CodegenError::Unsupported`] naming f8e4m3, the reason and where fp8 is supported.
pub(super) fn fp8_applies(p: &Prefill, target: &Target) -> R<()> {
    let fam = Family::Attention;
    wg_eligible(p, target).map_err(|e| unsupported(&p.name, fam, e))
}

/// Shared-memory layout: byte offsets and row strides (elements).
pub(super) struct TcSmem {
    /// Row stride of the Q tile (also the output staging and, with Q in registers, the P
    /// scratch of the CUDA-core fallback): `max(d, dv, block_kv) + 8`.
    pub(super) ldq: u32,
    pub(super) ldk: u32,
    pub(super) ldv: u32,
    /// Row stride of the P scratch.
    pub(super) ldp: u32,
    /// K and V buffers of the two stages.
    pub(super) k: [u32; 2],
    pub(super) v: [u32; 2],
    /// The P scratch (the Q tile when Q lives in registers).
    pub(super) p: u32,
    /// Where the output is staged (byte offset) and its row stride (elements): the Q tile
    /// (`ldq`), or with `wgmma` the P scratch (`ldp`); each warp uses its own rows.
    pub(super) stage: u32,
    pub(super) ldst: u32,
    /// Whether Q, K and V are stored as `wgmma` operands (sm_90a): rows of 128 bytes (64
    /// elements) whose 16-byte chunks are XOR-swizzled by `row mod 8`, a tile of width D as
    /// D / 64 such slabs one after the other (chunk `c` of row `r` at
    /// `(c / 8)·rows·128 + r·128 + 16·((c mod 8) xor (r mod 8))`), every slab 1024-byte
    /// aligned — the 128-byte-swizzle canonical layout of PTX ISA §9.7.15.5.1, as the
    /// `wgmma` GEMM's slabs (`matmul::Slab`). Padded rows otherwise.
    pub(super) swz: bool,
    /// fp8 (`f8e4m3` q, k, v): the byte offsets of the two Vᵀ buffers (`dv` rows of a tile's
    /// keys, 128-byte swizzled, K-major: the B operand of the e4m3 P·V), else 0; and of V's
    /// third stage (the plain loop loads V two tiles ahead), else 0.
    pub(super) vt: [u32; 2],
    pub(super) v2: u32,
    pub(super) total: u32,
}

impl TcSmem {
    pub(super) fn new(s: &TcSchedule, d: u32, dv: u32) -> TcSmem {
        // 16 bytes of padding per row: with D a multiple of 16 a row is an odd number of
        // 16-byte chunks, so 8 consecutive rows at one column are 8 distinct bank groups.
        let ldq = d.max(dv).max(s.block_kv) + 8;
        let (ldk, ldv) = (d + 8, dv + 8);
        let q_bytes = s.block_q() * ldq * 2;
        let (kb, vb) = (s.block_kv * ldk * 2, s.block_kv * ldv * 2);
        let k = [q_bytes, q_bytes + kb];
        let v = [q_bytes + 2 * kb, q_bytes + 2 * kb + vb];
        let mut total = v[1] + vb;
        let (p, ldp) = if s.q_in_regs {
            (0, ldq)
        } else {
            let p = total;
            total += s.block_q() * (s.block_kv + 8) * 2;
            (p, s.block_kv + 8)
        };
        TcSmem { ldq, ldk, ldv, ldp, k, v, p, stage: 0, ldst: ldq, swz: false, vt: [0; 2], v2: 0, total }
    }

    /// The `wgmma` kernel's: Q (`block_q × d`), two stages of K (`block_kv × d`) and V
    /// (`block_kv × dv`), all swizzled slabs ([`TcSmem::swz`]), then the padded P scratch of the
    /// CUDA-core P·V (rows of `max(block_kv, dv) + 8`), which also stages the output.
    ///
    /// With `fp8` the tiles hold e4m3 bytes: a tile of width D ≤ 128 is one slab of 128-byte
    /// rows (at D = 64 half of each row is used), V's two stages are copied as stored (keys
    /// outer, three stages) and transposed by the threads into Vᵀ (two buffers of `dv` rows of
    /// 128 bytes, [`TcSmem::vt`]), after the stages and before the P scratch.
    pub(super) fn wg(w: &WgSchedule, d: u32, dv: u32, fp8: bool) -> TcSmem {
        let (bq, bkv) = (w.block_q(), w.block_kv);
        // Bytes of a tile of `rows` rows of width `x`: whole 128-byte slabs.
        let es = if fp8 { 1 } else { 2 };
        let tile = |rows: u32, x: u32| rows * 128 * (x * es).div_ceil(128);
        let (kb, vb) = (tile(bkv, d), tile(bkv, dv));
        let q_bytes = tile(bq, d);
        let k = [q_bytes, q_bytes + kb];
        let v = [q_bytes + 2 * kb, q_bytes + 2 * kb + vb];
        let v2 = if fp8 { v[1] + vb } else { 0 };
        let vt = if fp8 { [v2 + vb, v2 + vb + dv * 128] } else { [0; 2] };
        let p = v[1] + vb + if fp8 { vb + 2 * dv * 128 } else { 0 };
        let ldp = bkv.max(dv) + 8;
        let total = p + bq * ldp * 2;
        TcSmem { ldq: d, ldk: d, ldv: dv, ldp, k, v, p, stage: p, ldst: ldp, swz: true, vt, v2, total }
    }
}
