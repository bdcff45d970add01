//! Prefill attention on tensor cores: FlashAttention-2 (Dao 2023, arXiv 2307.08691,
//! Algorithm 1 and §3.3) with `mma.sync.m16n8k16`, the default schedule of
//! [`super::attention::generate_prefill`] for bf16 and f16 — and on sm_90a, for head dims 64
//! and 128, the same algorithm on `wgmma` (see "The Hopper kernel").
//!
//! # Schedule ([`TcSchedule`])
//! A CTA of `warps` warps owns `block_q = 16·m_tiles·warps` query rows of one (batch, head);
//! warp `w` owns rows `16·m_tiles·w ..` as `m_tiles` slabs of 16 rows (the M of one `mma`).
//! The keys are walked in tiles of `block_kv` rows:
//! - **Loads.** Q (once), then per tile K and V, go global → shared with 16-byte `cp.async.cg`
//!   (PTX ISA §9.7.9.3), rows past the sequence zero-filled (`src-size` 0, nothing read);
//!   **double buffered**: at the top of tile `j` the CTA waits for tile `j`'s group, takes
//!   one barrier (tile `j` is visible and every warp is done with tile `j−1`'s buffers),
//!   issues tile `j+1` into the other buffer and computes tile `j` while it lands. Shared rows
//!   are padded by 16 bytes (an odd number of 16-byte chunks per row), so the 8 row
//!   addresses of each `ldmatrix` phase hit distinct banks.
//! - **S = Q·Kᵀ** with `mma.m16n8k16.row.col` (§9.7.14.5.14): Q's A fragments come from
//!   `ldmatrix.x4` (§9.7.14.5.15) of the Q tile — once, into registers, when `q_in_regs`
//!   (head dims ≤ 64), else again per tile as FlashAttention-2 does for D = 128, where
//!   registers would not hold them beside the accumulators; K `[kv, d]` row-major is the
//!   "col" B operand, one non-transposed `ldmatrix.x4` per two n8 tiles. Two slabs a warp
//!   share each K and V fragment, halving the shared-memory reads per MMA.
//! - **Online softmax** in f32, in the log2 domain: each lane holds rows `g = lane/4` and
//!   `g + 8` of each slab (the m16n8 C layout), keys `8n + 2·(lane%4) + {0, 1}`; the row
//!   maximum (NaN-propagating `max.NaN`) is reduced over the quad with `shfl.sync.bfly` 1
//!   and 2, `p = 2^(s·c − m)` with `c = scale·log2 e` folded into one `fma` (a positive
//!   scale, no mask) and `ex2.approx.ftz` (§9.7.3.23, ≤ 2 ulp: one `MUFU.EX2`); the running
//!   sum `l` is kept per lane and reduced over the quad once at the end; the accumulator is
//!   rescaled by `2^(m_old − m_new)`, skipped on tiles where no row of the warp has a new
//!   maximum (`vote.sync.any`; the factor would be exactly 1).
//! - **O += P·V**: the S accumulators of n8 tiles `2k, 2k+1`, rounded to bf16/f16 pairs
//!   (`cvt.rn.bf16x2.f32`), are the A fragment of k-step `k` (the m16n8 C layout of two
//!   adjacent tiles is the m16n8k16 A layout); V `[kv, d]` row-major is the B operand through
//!   `ldmatrix.x4.trans`.
//! - **Output**: `acc / l` rounded once (0 for a row that never saw a score above −inf),
//!   staged through the warp's rows of the Q tile's shared memory and written with 16-byte
//!   coalesced stores (element stores where the output's layout does not allow them).
//!
//! - **lse** (`lse=true`): after O, the first lane of each quad writes its rows'
//!   `m·ln 2 + ln l` (m is in log2 units; −inf for an empty row). At D = 128 it tips the
//!   48-key tile over 255 registers, so [`super::attention::generate_prefill`] takes 32-key
//!   tiles for it.
//!
//! Causal CTAs run longest first; key tiles wholly above the CTA's last visible key are never
//! loaded, tiles wholly above a warp's last visible key are not computed by that warp, and
//! only tiles that cross a warp's causal diagonal or the sequence end (or any tile, with an
//! additive mask, whose elements are read per score from global memory) are masked.
//!
//! The registers decide the tile shapes ([`choose_tc_schedule`]): at D = 128 a warp holds 128
//! accumulator floats (2 slabs × 16 rows × 128 / 32 lanes) and 32 scores per 32-key tile;
//! ptxas then uses about 240 of the 255 registers a thread may have at 2 CTAs of 128 threads
//! an SM, with no spills (64-key tiles, FlashAttention-2's choice, spill a few bytes). On
//! sm_90, whose shared memory holds two CTAs of 48-key tiles, non-causal D = Dv = 128 takes
//! 48-key tiles (48 scores a slab; 250 to 252 registers, no spills), for fewer shared-memory
//! bytes per `mma`; causal 48-key tiles spill 8 bytes, so causal keeps 32.
//!
//! # Semantics
//! As [`super::attention`]'s module docs: bottom-right causal alignment, GQA without repeated
//! K/V, any sequence lengths, fully masked rows exactly 0, NaN in a visible score gives a NaN
//! row, `+inf` gives NaN. Keys the reference never multiplies — hidden by the causal mask, or
//! in a 16-key group the interpreter skips while every score of the row so far is −inf —
//! are multiplied by `p = 0` in the `mma`, which is exact for finite V but would turn a NaN
//! or ±inf there into NaN. So on each tile where such a product exists (a tile crossing a
//! warp's diagonal: keys from the warp's first row's limit to the tile's end; while some row
//! of the warp has seen only −inf and skips this tile's first group: the whole tile) the warp
//! scans the V rows concerned in shared memory for non-finite values (the exponent bits, 4
//! integer operations per two elements, a `vote.sync.any`) and, if it finds one, computes that
//! tile's `P·V` on CUDA cores, key by key, multiplying exactly the products the interpreter
//! makes (P through a per-warp scratch in shared memory, rounded as the `mma` would see it).
//! Rows past the sequence are zero-filled, so they never need it. Finite inputs cost one scan
//! of part of the diagonal tile per warp (and a cheap check of each row's first tile), and
//! the products are the interpreter's for every input, NaN and ±inf included.
//!
//! # The Hopper kernel ([`WgSchedule`], sm_90a)
//! On sm_90a, for head dims D, Dv ∈ {64, 128} without an additive mask ([`wg_eligible`]),
//! [`super::attention::generate_prefill`] builds the same algorithm on `wgmma.mma_async`
//! (PTX ISA §9.7.15; FlashAttention-3, arXiv 2407.08608; its intra-warpgroup overlap, its
//! producer warpgroup with TMA loads and its ping-pong as options, not the default). It is
//! this module's kernel with three things changed:
//! - **CTA**: `warpgroups` (2) consumer warpgroups of 4 warps, each owning 64 query rows (a
//!   warp 16: the `TcSchedule` walk with one slab a warp), 128-key tiles. A warpgroup
//!   computes a key tile when any of its rows sees a key of it (not per warp: a `wgmma` needs
//!   its four warps).
//! - **Shared memory**: Q, and two stages of K and V, as 128-byte-swizzled slabs of 64
//!   columns (the K-major canonical layout of §9.7.15.5.1, 1024-byte aligned; copied with
//!   the same 16-byte `cp.async`, then `fence.proxy.async` before the barrier), then the P
//!   scratch (padded rows), which also stages the output. D = 128: 194 KiB, one CTA an SM.
//! - **Products**: S = Q·Kᵀ is one `m64n{block_kv}k16` per 16 columns of D, both operands
//!   K-major from shared memory (as the GEMM's A and B). Its f32 accumulators are, per warp,
//!   exactly the `m16n8` C layout of `block_kv / 8` tiles, so the softmax, masking and NaN
//!   handling below run unchanged. O += P·V is one `m64n{Dv}k16` per 16 keys with **A = P
//!   from registers** (the bf16/f16 pairs of two adjacent n8 tiles of S are the register A
//!   fragment, as for `mma.sync`) and B = V from shared memory, **MN-major** (`imm-trans-b`;
//!   its descriptor's leading byte offset steps 64 columns of Dv: see `mn_major` in the
//!   source), or with `pv_split` one `m64n64k16` per 64 columns. Each `wgmma` group is waited
//!   for at once (`wait_group 0`); the two warpgroups overlap each other — or, with
//!   `overlap` (below), a group stays in flight across the softmax.
//! - **Non-finite V**: a warpgroup takes a tile's CUDA-core P·V when any of its warps finds a
//!   non-finite V value in a product the interpreter does not make (`bar.red.or.pred` on
//!   named barrier `1 + warpgroup`).
//!
//! - **Intra-warpgroup overlap** (`overlap`, names ending ` ov`; FlashAttention-3 §3.2,
//!   Algorithm 2): iteration t issues S_t = Q·K_tᵀ (`commit`, no wait), then
//!   O += P_{t−1}·V_{t−1} (`commit`, no wait), waits for S_t alone (`wait_group` 1, or 2 with
//!   `pv_split`), runs S_t's masking and softmax on CUDA cores while the P·V group runs on the
//!   tensor cores, then waits for it (`wait_group 0`) and rescales O by α_t: the operations of
//!   the plain loop in the same order, so the same results. Every accumulator and P_{t−1}'s A
//!   registers are in-out operands of the inline asm that waits for them, so nothing reads or
//!   reuses them while a group runs. ptxas serializes every `wgmma` (C7513–C7520) when an
//!   issue or a wait lies under a branch it cannot prove uniform, so every warpgroup walks all
//!   the CTA's key tiles (a causal CTA's upper warpgroup one fully masked tile more), and the
//!   first tile and a tile that needs the CUDA-core P·V take an unpipelined iteration. ptxas
//!   also hoists a wait to the top of its basic block: the last wait sits in the arms of the
//!   rescaling branch, decided by the warpgroup (`bar.red.or`, as a conditional
//!   `wgmma.wait_group` needs), so the exponentials stay before it (the SASS test checks).
//!   V is loaded one tile behind K, so a stage is overwritten only after every warpgroup's
//!   products that read it were waited for. Registers (ptxas 12.9, 256 threads): D = 128
//!   with 128-key tiles 241 to 246, 64-key 179 to 194; D = 64: 201 to 207 and 134 to 143;
//!   no spills.
//!
//! - **Warp specialisation** (`producer`, names ending ` ws`; FlashAttention-3 §3.1, the
//!   producer/consumer split of the warp-specialised GEMM, `matmul::build_wgmma_ws`): 384
//!   threads, `.maxntid 384` (so ptxas budgets 168 registers a thread until `setmaxnreg`).
//!   Thread 0 initialises the mbarriers (static shared memory: `full[i]`, arrival count 1,
//!   and `empty[i]`, one arrival per consumer warp, for each of the [`WS_STAGES`] = 2 stages,
//!   and Q's), then the kernel's **only CTA-wide barrier**. Warpgroup 0, the **producer**,
//!   gives its registers back (`setmaxnreg.dec` to [`WS_PRODUCER_REGS`] = 24) and its thread 0
//!   issues every copy with the TMA (`cp.async.bulk.tensor.4d …mbarrier::complete_tx::bytes`,
//!   PTX ISA §9.7.9.25.5.2): Q once (one `arrive.expect_tx` of its bytes), then for each key
//!   tile t it waits for stage `t mod 2`'s empty barrier (parity flipped: fresh stages count
//!   as free), arrives on its full barrier expecting the K and V bytes and issues their
//!   boxes; then the warpgroup leaves the kernel. The tensor maps (kernel parameters after
//!   the buffers, encoded by the runtime per launch) view each operand as `[D, S, H, B]`
//!   (the layout's strides, `bshd` included; a broadcast head or batch axis left out), boxes
//!   of `64 × rows × 1 × 1` with 128-byte swizzling: one box is one slab of the swizzled
//!   layout above, two per operand at D = 128, the same bytes the `cp.async` kernel writes,
//!   so the descriptors are unchanged. Sequence rows past S are zero-filled by the TMA per
//!   head (the bounds are per dimension), as `cp.async`'s `src-size` 0 does. Warpgroups 1
//!   and 2, the **consumers** (`setmaxnreg.inc` to [`WS_CONSUMER_REGS`] = 240), wait for Q's
//!   barrier, then per key tile wait for the stage's full barrier (`mbarrier.try_wait.parity`,
//!   the phase `(t / 2) mod 2`; acquire, so the non-finite scan's generic loads see the TMA's
//!   bytes too), compute the tile exactly as the plain loop does — the same masking, causal
//!   skipping, non-finite V scan and CUDA-core P·V, lse and output — and free the stage: a
//!   `__syncwarp`, then lane 0 of each warp arrives on the empty barrier. Every consumer warp
//!   walks all the CTA's `n_tiles` tiles (freeing those its warpgroup skips), and the
//!   producer walks the same `n_tiles` (one expression of the CTA's indices), so each wait
//!   has its arrival — for causal CTAs with fewer tiles and CTAs without any (they wait for
//!   Q only). The warpgroup barriers of the non-finite decision (`bar.red.or`, ids 1 and 2,
//!   128 threads) are the only other barriers. The output is staged in the P scratch, which
//!   the producer never writes.
//! - **Ping-pong** (`pingpong`, names ending ` ws pp`, on top of `producer`; FlashAttention-3
//!   §3.1, Fig. 1): consumer warpgroup c waits at named barrier `3 + c` (`bar.sync`, 256
//!   threads) before issuing its tile's S = Q·Kᵀ, and right after issuing it (before waiting
//!   for it) arrives at the other's barrier (`bar.arrive`, 256): the two warpgroups issue
//!   their Q·Kᵀ in turn, one's softmax and P·V running while the other's Q·Kᵀ does.
//!   Warpgroup 0 goes first (one `bar.arrive` on its own barrier before the loop) and waits
//!   once more after the loop for warpgroup 1's last signal; skipped tiles take their turn
//!   too; so every phase of both barriers has 128 waiting and 128 arriving threads, none is
//!   left half full at exit, and a CTA without tiles touches neither.
//!
//!   Not done in the warp-specialised kernel: the intra-warpgroup overlap (`ov` with `ws` is
//!   refused; FlashAttention-3 combines them), separate K and V barriers (K's stage could be
//!   freed after S, before P·V), more than two stages (D = 64 would have room), three
//!   consumer warpgroups, persistent CTAs, the P·V inside the ping-pong's turn (FA3's
//!   non-overlapped schedule keeps it outside, as here), a bounded spin on the mbarrier waits
//!   (a deadlock hangs; the GPU tests run under `timeout`). Registers: 168 at launch (ptxas's
//!   line), no spills, ptxas does not serialize the `wgmma`s (the tests check each).
//!
//!   Measured once on an H200 (autotuning medians, `gpu_attention_candidate_timings`, bf16
//!   B2 H32 S4096 D128): non-causal `ws` kv128 975 µs = 564 TFLOP/s and `ws pp` 972 µs = 565
//!   against the default's 1173 µs = 469 (`ov` 466); causal `ws` 606 µs = 454 and `ws pp`
//!   611 µs = 450 against 709 µs = 388. The ping-pong adds nothing measurable over the
//!   producer alone in this form; 64-key tiles are slower in every form.
//!
//! Registers (ptxas 12.9, D = 128, 256 threads): 202 to 212, no spills. Not done yet: the
//! warp-specialised kernel's gaps above, a third consumer warpgroup, an additive mask, other
//! head dims (they take the `mma.sync` kernel, as sm_80 and sm_90 always do). The CPU
//! emulator cannot run `wgmma`, the TMA or mbarriers: the kernel's correctness rests on the
//! GPU tests.
//!
//! # fp8 (`f8e4m3`, issue #8; sm_90a)
//! `attention(dequantize_fp8(q8, sq), dequantize_fp8(k8, sk), dequantize_fp8(v8, sv))` —
//! q8, k8, v8 `f8e4m3` (OCP E4M3) kernel inputs in any layout [`super::attention`] takes with
//! rows contiguous and 16-byte aligned, sq, sk, sv f32 scalars (`f32[]` inputs or constants),
//! head dims 64 or 128, no mask, a bf16/f16 output (the `dequantize_fp8` dtype) — runs on the
//! Hopper kernel above with e4m3 products (FlashAttention-3, arXiv 2407.08608, §3.3; entry
//! `…_attention_wgmma_e4m3`, schedule names ending ` e4m3`). What changes:
//! - **Tiles** hold the stored bytes: a row of Q or K (≤ 128 bytes) is one 128-byte-swizzled
//!   row (half used at D = 64); 16 elements a `cp.async`.
//! - **S = Q·Kᵀ**: `wgmma.mma_async.sync.aligned.m64n{block_kv}k32.f32.e4m3.e4m3` (PTX ISA
//!   §9.7.15.5.2), both operands K-major from shared memory, 32 bytes of K a step as for
//!   bf16. The products of e4m3 values are exact; sq·sk is folded into the scores' scale
//!   (`scale·sq·sk·log2 e`, a run-time f32: the scores are scaled, then the maximum taken, so
//!   any sign of the scales is right).
//! - **P** = 2⁸·2^(x − m) ∈ [0, 256] (`FP8_P_LOG2`) in f32, rounded with
//!   `cvt.rn.satfinite.e4m3x2.f32` (§9.7.9.21) into the e4m3 A fragment of P·V. The power of
//!   two is exact and moves e4m3's range (normals ≥ 2⁻⁶, max 448) over p ≥ 2⁻¹⁴ of the row
//!   maximum (subnormals down to 2⁻¹⁷) instead of 2⁻⁶ (2⁻⁹); l is summed from the unrounded
//!   2⁸·p, so the factor cancels in acc / l and the rounding's error in O is
//!   Σ p_j·δ_j·v_j / Σ p_j with |δ_j| ≤ 2⁻⁴ (3 mantissa bits): at most 2⁻⁴·max|v| (plus, for
//!   subnormal P, Skv·2⁻¹⁸·max|v|). The lse subtracts the 8 again.
//! - **O += P·V**: 8-bit `wgmma` has no transposed B (§9.7.15.5.1: `imm-trans-b` only for
//!   .f16/.bf16), and V `[kv, Dv]` is MN-major for it. So V lands as stored and the threads
//!   transpose it into Vᵀ `[Dv, kv]` (K-major, 128-byte swizzled, `Smem::vt`): a thread reads
//!   four 16-byte V row pieces, transposes 4×4 byte blocks with `prmt`, writes 32-bit words,
//!   fences the async proxy (`fence.proxy.async.shared::cta`), then the CTA barrier. The e4m3
//!   A fragment (lane `(g, t)`: row g or g + 8, k positions 4t..4t+3 and 16+4t..) differs
//!   from the f32 S accumulator layout (keys 2t, 2t+1, 8+2t, 9+2t of each 32): rather than
//!   shuffling P, the transposition writes key `32c + 16h + 2t + (i mod 2) + 8·(i / 2)` at k
//!   position `32c + 16h + 4t + i` — the sum over keys does not care about their order — so
//!   each lane packs its own four scores into one register (no shuffles, as FA3's byte
//!   permutes achieve). `m64n{Dv}k32.f32.e4m3.e4m3` per 32 keys, A from registers.
//!   The plain loop loads V two tiles ahead (three stages) and keeps two Vᵀ buffers: tile t
//!   issues S = Q·K_tᵀ (every warpgroup, every tile of the CTA: the issue and its wait under
//!   no branch), transposes V_{t+1} into the other buffer while it runs, waits, fences; the
//!   barrier at the top of tile t + 1 publishes it, so the transposition costs no barrier of
//!   its own (H200, B2 H32 S4096 D128: a second barrier per tile cost 10%, the transposition
//!   itself 9%). The overlapped loop (` ov e4m3`) transposes V_{t−1} after its barrier, then
//!   a second barrier, before the products.
//! - **Output**: O = sv·acc / l (sv once, in f32), rounded once.
//! - **Non-finite V**: e4m3 has NaN (`S.1111.111`) and no infinities; the scan for products
//!   the interpreter does not make looks for NaN bytes, and the CUDA-core P·V reads V's bytes
//!   and P's e4m3 values (widened exactly to f16), so the products are the ones the `wgmma`
//!   would make, minus the hidden ones.
//!
//! Numerics against the interpreter, which rounds each dequantised operand to the
//! `dequantize_fp8` dtype (bf16: 2⁻⁹) and computes in f64: the P rounding dominates (H200,
//! random inputs: max |O − O_ref| / max|v·sv| 0.014 to 0.026; `tests/gpu.rs`
//! `gpu_fp8_attention_matches_the_interpreter` documents the tolerance). ptxas 12.9 crashes
//! (SIGSEGV) on a `fence.proxy.async` between a `wgmma` and its wait: the fence follows the
//! wait. Speed (H200, B2 H32 S4096 D128, the kernel alone, CUDA events): 0.99 ms against
//! the bf16 kernel's 1.16 (1.17×), causal 0.63 against 0.70 (1.10×); ` ov e4m3` 1.10 and
//! 0.68 ms. The e4m3 products take half the bf16 ones' time, but both warpgroups meet at a
//! CTA barrier every tile and run their softmax (one `MUFU.EX2` a score: about as long as
//! the fp8 products of a tile) at the same time, so the tile time is MMA + softmax rather
//! than their maximum. Not done: the fp8 kernel on the warp-specialised form (the bf16
//! kernel has it, ` ws`, and it made bf16 1.2× faster, so fp8 is now at 0.96× our autotuned
//! bf16 attention: bench/RESULTS.md), and a transposition with `ldmatrix`/`stmatrix .trans`
//! — the remaining way to the issue's ≥ 1.5×; see the bench row `attn fp8`.
//!
//! # What it takes
//! bf16 or f16; head dims (D of q/k, Dv of v) multiples of 16 up to 256; q, k and v rows
//! contiguous and 16-byte aligned (unit stride along d, every other stride and the offset
//! multiples of 8 elements, buffers 16-byte aligned) — what 16-byte `cp.async` needs;
//! anything else goes to the CUDA-core kernel (`eligible` says why).

use inkwell::context::Context;
use inkwell::values::{BasicValueEnum, FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Dim, Family, LaunchPlan, TensorMap};

use super::attention::{shared_kind, unsupported, Prefill};
use super::matmul::kit::{Kit, SharedKind, R};
use crate::target::Target;

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
        Smem::new(self, d, dv).total
    }

    /// A short, stable name (`tc kv48 w4 m2`, `+q` when Q stays in registers): part of an
    /// autotuned variant's cache key, and what `sinter explain` shows.
    pub fn name(&self) -> String {
        format!("tc kv{} w{} m{}{}", self.block_kv, self.warps, self.m_tiles, if self.q_in_regs { " +q" } else { "" })
    }

    fn check(&self) -> Result<(), String> {
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
/// - `d = dv = 128`, not causal, where two CTAs of 99 KiB fit in an SM's shared memory (sm_90:
///   228 KiB; not sm_80's 164 KiB): 2 slabs, **48-key tiles**, Q re-read from shared memory per
///   tile. Per warp and tile that reads K and V (48 × 256 × 2 bytes) and Q (32 × 128 × 2) from
///   shared memory for 192 `mma`s: 171 bytes an `mma` against 192 with 32-key tiles, and a third
///   fewer barriers, softmax reductions and rescalings per key. ptxas 12.9 (sm_90a, bf16 and
///   f16): 250 registers with symbolic sequence lengths, 252 with constant ones, no spills
///   (32-key tiles: 239 to 241). It is at the edge: causal (254 registers symbolic, but 8 bytes
///   spilled with constant lengths), sm_80 causal, D = 112 causal and D 96/112 with Dv 128 all
///   spill at 48, hence 32 for them;
/// - other ≤ 128: 2 slabs, 32-key tiles, Q re-read from shared memory per tile
///   (FlashAttention-2's 128×64 tile needs 64 accumulator, 32 score and 8 Q registers per
///   slab and warp, which ptxas 12.9 fits only by spilling at D = 128: 255 registers, 8 bytes;
///   32-key tiles leave it about 240);
/// - ≤ 256: 1 slab (128 accumulator registers), 32-key tiles, Q from shared memory;
/// - with a mask (≤ 128; larger heads go to CUDA cores): 1 slab, 64-key tiles
///   (each score's mask element is a global load, whose registers 2 slabs do not leave).
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
    if p.fp8.is_some() {
        return Err(crate::fp8_message("f8e4m3 attention: the mma.sync kernel does not read f8e4m3"));
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
    /// before that P·V (see "The Hopper kernel" in the module docs). Costs the registers of
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
        Smem::wg(self, d, dv, false).total
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
    fn as_tc(&self) -> TcSchedule {
        TcSchedule { warps: 4 * self.warpgroups, m_tiles: 1, block_kv: self.block_kv, q_in_regs: false }
    }

    fn check(&self) -> Result<(), String> {
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
/// 64-key tiles: measured on an H200 (bench/RESULTS.md, 2026-11-30, 0174000) 1.28× faster than
/// 128-key tiles non-causal and 1.15× causal at B2 H32 S4096 (twice the CTAs an SM: half
/// the S registers and shared memory). The warp-specialised kernel (`ws`) is a candidate, not
/// the default (see "The Hopper kernel").
pub fn choose_wg_schedule(d: u32, dv: u32) -> WgSchedule {
    let block_kv = if d.max(dv) <= 64 { 64 } else { 128 };
    WgSchedule { warpgroups: 2, block_kv, pv_split: false, overlap: false, producer: false, pingpong: false }
}

/// The fp8 attention's schedule: two warpgroups, 128-key tiles at both head dims (measured
/// at D 128 only; `wgmma kv64 g2 e4m3` is its autotuning alternative), no producer.
pub fn choose_fp8_schedule() -> WgSchedule {
    WgSchedule { warpgroups: 2, block_kv: 128, pv_split: false, overlap: false, producer: false, pingpong: false }
}

/// Why prefill attention `p` cannot take the `wgmma` kernel on `target` (`Ok` when it can):
/// what [`eligible`] asks, and sm_90a, head dims 64 or 128, no additive mask.
pub(super) fn wg_eligible(p: &Prefill, target: &Target) -> Result<(), String> {
    if p.fp8.is_some() {
        return fp8_eligible(p, target).map_err(|e| crate::fp8_message(&format!("f8e4m3 attention: {e}")));
    }
    eligible(p)?;
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
/// [`crate::CodegenError::Unsupported`] naming f8e4m3, the reason and where fp8 is supported.
pub(super) fn fp8_applies(p: &Prefill, target: &Target) -> R<()> {
    let fam = Family::Attention;
    wg_eligible(p, target).map_err(|e| unsupported(&p.name, fam, e))
}

/// The launch plan of the `wgmma` kernel for `p` with schedule `w`.
///
/// # Errors
/// [`crate::CodegenError::Unsupported`] when `p` is not [`wg_eligible`], the schedule is
/// invalid or its shared memory exceeds the target's; LLVM errors otherwise.
pub(super) fn plan_wg(p: &Prefill, target: &Target, w: &WgSchedule) -> R<LaunchPlan> {
    let fam = Family::Attention;
    w.check().map_err(|e| unsupported(&p.name, fam, e))?;
    wg_eligible(p, target).map_err(|e| unsupported(&p.name, fam, e))?;
    if p.fp8.is_some() && (w.pv_split || w.block_kv > 128 || w.block_kv % 32 != 0 || w.producer) {
        return Err(unsupported(&p.name, fam, crate::fp8_message(&format!("f8e4m3 attention: schedule `{}` (the fp8 kernel takes 32- to 128-key tiles, multiples of 32, without `+split` or the warp-specialised producer)", w.name()))));
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
fn tma_map(t: &super::attention::T4, d: u32, rows: &Dim, heads: i64, batch: &Dim, box_rows: u32) -> TensorMap {
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
struct TmaAxes {
    head: bool,
    batch: bool,
}

impl TmaAxes {
    fn of(t: &super::attention::T4) -> TmaAxes {
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

/// Shared-memory layout: byte offsets and row strides (elements).
struct Smem {
    /// Row stride of the Q tile (also the output staging and, with Q in registers, the P
    /// scratch of the CUDA-core fallback): `max(d, dv, block_kv) + 8`.
    ldq: u32,
    ldk: u32,
    ldv: u32,
    /// Row stride of the P scratch.
    ldp: u32,
    /// K and V buffers of the two stages.
    k: [u32; 2],
    v: [u32; 2],
    /// The P scratch (the Q tile when Q lives in registers).
    p: u32,
    /// Where the output is staged (byte offset) and its row stride (elements): the Q tile
    /// (`ldq`), or with `wgmma` the P scratch (`ldp`); each warp uses its own rows.
    stage: u32,
    ldst: u32,
    /// Whether Q, K and V are stored as `wgmma` operands (sm_90a): rows of 128 bytes (64
    /// elements) whose 16-byte chunks are XOR-swizzled by `row mod 8`, a tile of width D as
    /// D / 64 such slabs one after the other (chunk `c` of row `r` at
    /// `(c / 8)·rows·128 + r·128 + 16·((c mod 8) xor (r mod 8))`), every slab 1024-byte
    /// aligned — the 128-byte-swizzle canonical layout of PTX ISA §9.7.15.5.1, as the
    /// `wgmma` GEMM's slabs (`matmul::Slab`). Padded rows otherwise.
    swz: bool,
    /// fp8 (`f8e4m3` q, k, v): the byte offsets of the two Vᵀ buffers (`dv` rows of a tile's
    /// keys, 128-byte swizzled, K-major: the B operand of the e4m3 P·V), else 0; and of V's
    /// third stage (the plain loop loads V two tiles ahead), else 0.
    vt: [u32; 2],
    v2: u32,
    total: u32,
}

impl Smem {
    fn new(s: &TcSchedule, d: u32, dv: u32) -> Smem {
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
        Smem { ldq, ldk, ldv, ldp, k, v, p, stage: 0, ldst: ldq, swz: false, vt: [0; 2], v2: 0, total }
    }

    /// The `wgmma` kernel's: Q (`block_q × d`), two stages of K (`block_kv × d`) and V
    /// (`block_kv × dv`), all swizzled slabs ([`Smem::swz`]), then the padded P scratch of the
    /// CUDA-core P·V (rows of `max(block_kv, dv) + 8`), which also stages the output.
    ///
    /// With `fp8` the tiles hold e4m3 bytes: a tile of width D ≤ 128 is one slab of 128-byte
    /// rows (at D = 64 half of each row is used), V's two stages are copied as stored (keys
    /// outer, three stages) and transposed by the threads into Vᵀ (two buffers of `dv` rows of
    /// 128 bytes, [`Smem::vt`]), after the stages and before the P scratch.
    fn wg(w: &WgSchedule, d: u32, dv: u32, fp8: bool) -> Smem {
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
        Smem { ldq: d, ldk: d, ldv: dv, ldp, k, v, p, stage: p, ldst: ldp, swz: true, vt, v2, total }
    }
}

/// The launch plan of the tensor-core kernel for `p` with schedule `s`.
///
/// # Errors
/// [`crate::CodegenError::Unsupported`] when `p` is not [`eligible`], the schedule is invalid or
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

fn or<'ctx>(k: &Kit<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.math(|kb| Ok(kb.b.build_or(a, b, "")?))
}

fn not<'ctx>(k: &Kit<'ctx>, a: IntValue<'ctx>) -> R<IntValue<'ctx>> {
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
fn load_i32s<'ctx>(k: &Kit<'ctx>, ptr: PointerValue<'ctx>, n: u32) -> R<Vec<IntValue<'ctx>>> {
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
fn store_i32s<'ctx>(k: &Kit<'ctx>, ptr: PointerValue<'ctx>, vals: &[IntValue<'ctx>]) -> R<()> {
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
fn var_i32<'ctx>(k: &Kit<'ctx>, init: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
    k.var_i(init)
}

fn get_i32<'ctx>(k: &Kit<'ctx>, p: PointerValue<'ctx>) -> R<IntValue<'ctx>> {
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
struct Rows<'ctx> {
    /// Key limit of the row (i32): keys `j < limit` are visible.
    limit: Vec<[IntValue<'ctx>; 2]>,
    /// Whether the row exists (< Sq).
    valid: Vec<[IntValue<'ctx>; 2]>,
    /// Query row index (i64).
    index: Vec<[IntValue<'ctx>; 2]>,
}

// Fragment coordinates index several parallel arrays at once: index loops read better here.
#[allow(clippy::too_many_lines, clippy::needless_range_loop)]
fn build<'ctx>(kit: &Kit<'ctx>, p: &Prefill, s: &TcSchedule, sm: &Smem, shared: SharedKind, wg: Option<&WgSchedule>) -> R<()> {
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
    // fp8 (the `wgmma` kernel only; see "fp8" in the module docs): q, k, v are e4m3 bytes,
    // 16 to a 16-byte chunk, 32 to a k-step; sq·sk is folded into the scores' scale, sv into
    // the output's.
    let fp8 = p.fp8.filter(|_| wg.is_some());
    let ein = if fp8.is_some() { DType::F8E4M3 } else { dt };
    let epc = if fp8.is_some() { 16 } else { 8 };
    let kstep = if fp8.is_some() { 32 } else { 16 };
    // Scores in the log2 domain: x = s·c (+ mask·log2 e). With a positive scale and no mask,
    // the row maximum is taken over the raw scores and `s·c − m` is one fma.
    let c = p.scale * std::f64::consts::LOG2_E;
    let fused = c > 0.0 && p.mask.is_none() && fp8.is_none();
    let (cf, v_scale) = match fp8 {
        Some(sc) => {
            let qk = kit.fmul(super::matmul::fp8_scale(kit, sc[0])?, super::matmul::fp8_scale(kit, sc[1])?)?;
            (kit.fmul(kit.f32c(c), qk)?, Some(super::matmul::fp8_scale(kit, sc[2])?))
        }
        None => (kit.f32c(c), None),
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
    let base = |t: &super::attention::T4, x: IntValue<'ctx>, y: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let a = kit.add(kit.dim(&t.offset)?, kit.mul(x, kit.dim(&t.st[0])?)?)?;
        kit.add(a, kit.mul(y, kit.dim(&t.st[1])?)?)
    };
    let q_base = base(&p.q, b, h)?;
    let o_base = base(&p.out, b, h)?;
    let k_base = base(&p.k, b, hk)?;
    let v_base = base(&p.v, b, hk)?;
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
        let mut r = Rows { limit: Vec::new(), valid: Vec::new(), index: Vec::new() };
        for mi in 0..mt {
            let mut lim = Vec::new();
            let mut val = Vec::new();
            let mut idx = Vec::new();
            for hh in 0..2u32 {
                let i = kit.add(w0, kit.zext64(kit.add(g, c32(16 * mi as u32 + 8 * hh))?)?)?;
                lim.push(kit.trunc32(limit_of(kit, i)?)?);
                val.push(kit.icmp(IntPredicate::SLT, i, sq)?);
                idx.push(i);
            }
            r.limit.push([lim[0], lim[1]]);
            r.valid.push([val[0], val[1]]);
            r.index.push([idx[0], idx[1]]);
        }
        r
    };

    // ---- global → shared copies ----------------------------------------------------------
    // The byte offset (i32) of 16-byte chunk `col` of row `r` of a `rows`-row tile at
    // `sm_off`: padded rows of `ld` elements, or (wgmma) the 128-byte-swizzled K-major
    // canonical layout ([`Smem::swz`]).
    let sm_at = |k: &Kit<'ctx>, sm_off: IntValue<'ctx>, rows: u32, ld: u32, r: IntValue<'ctx>, col: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        if sm.swz {
            let slab = k.mul(k.lshr(col, 3)?, c32(rows * 128))?;
            let phys = k.xor(k.and(col, c32(7))?, k.and(r, c32(7))?)?;
            k.add(sm_off, k.add(slab, k.add(k.mul(r, c32(128))?, k.shl(phys, 4)?)?)?)
        } else {
            k.add(sm_off, k.add(k.mul(r, c32(ld * 2))?, k.mul(col, c32(16))?)?)
        }
    };
    // `rows` rows of `chunks` 16-byte chunks: row r (< nvalid, i64, else zero-filled) starts
    // at element `row0 + r·rstride` of `gptr`, lands at byte `sm_off + r·ld·2`.
    #[allow(clippy::too_many_arguments)]
    let copy_rows = |k: &Kit<'ctx>, rows: u32, chunks: u32, ld: u32, sm_off: IntValue<'ctx>, gptr: PointerValue<'ctx>, row0: IntValue<'ctx>, rstride: IntValue<'ctx>, nvalid: IntValue<'ctx>| -> R<()> {
        let total = rows * chunks;
        if threads % chunks == 0 && (!sm.swz || (threads / chunks) % 8 == 0) {
            // Every copy of this thread is at column tid % chunks, rows tid / chunks + i·step.
            let step = threads / chunks;
            let r0 = k.udiv(tid, c32(chunks))?;
            let col = k.urem(tid, c32(chunks))?;
            let g0 = k.add(row0, k.add(k.mul(k.zext64(r0)?, rstride)?, k.zext64(k.mul(col, c32(epc))?)?)?)?;
            let s0 = k.sh_at(smem, sm_at(k, sm_off, rows, ld, r0, col)?)?;
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
                let dst = k.sh_at(smem, sm_at(k, sm_off, rows, ld, r, col)?)?;
                k.cp_async_16(dst, k.gep_raw(ein, gptr, gi)?, k.select_int(valid, c32(16), c32(0))?)
            };
            if (i + 1) * threads <= total {
                go(k)?;
            } else {
                k.if_then(k.icmp(IntPredicate::ULT, e, c32(total))?, go)?;
            }
        }
        Ok(())
    };
    // K (or V) of tile t (i32) into its stage t & 1.
    let issue_k = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<()> {
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let ks = k.add(c32(sm.k[0]), k.mul(k.and(t, c32(1))?, c32(sm.k[1] - sm.k[0]))?)?;
        copy_rows(k, bkv, d / epc, sm.ldk, ks, k_ptr, k.add(k_base, k.mul(j0, k_ss)?)?, k_ss, k.sub(skv, j0)?)
    };
    let issue_v = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<()> {
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let vs = k.add(c32(sm.v[0]), k.mul(k.and(t, c32(1))?, c32(sm.v[1] - sm.v[0]))?)?;
        copy_rows(k, bkv, dv / epc, sm.ldv, vs, v_ptr, k.add(v_base, k.mul(j0, v_ss)?)?, v_ss, k.sub(skv, j0)?)
    };
    // K and V of tile t into stage t & 1.
    let issue_tile = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<()> {
        let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
        let stage = k.and(t, c32(1))?;
        let nvalid = k.sub(skv, j0)?;
        let ks = k.add(c32(sm.k[0]), k.mul(stage, c32(sm.k[1] - sm.k[0]))?)?;
        let vs = k.add(c32(sm.v[0]), k.mul(stage, c32(sm.v[1] - sm.v[0]))?)?;
        copy_rows(k, bkv, d / epc, sm.ldk, ks, k_ptr, k.add(k_base, k.mul(j0, k_ss)?)?, k_ss, nvalid)?;
        copy_rows(k, bkv, dv / epc, sm.ldv, vs, v_ptr, k.add(v_base, k.mul(j0, v_ss)?)?, v_ss, nvalid)
    };
    let overlap = wg.is_some_and(|w| w.overlap);

    // ---- prologue: Q and tile 0 ------------------------------------------------------------
    // The warp-specialised kernel's mbarriers (static shared memory, 8 bytes each): full[i]
    // (arrival count 1: the producer's `arrive.expect_tx`, then the TMA's bytes) and empty[i]
    // (one arrival from each consumer warp) of stage i, and Q's full barrier.
    let bars = if ws { Some(kit.mbarriers(2 * WS_STAGES + 1)?) } else { None };
    let full = |k: &Kit<'ctx>, bars: IntValue<'ctx>, st: IntValue<'ctx>| k.add(bars, k.shl(st, 3)?);
    let empty = |k: &Kit<'ctx>, bars: IntValue<'ctx>, st: IntValue<'ctx>| k.add(bars, k.shl(k.add(st, c32(WS_STAGES))?, 3)?);
    // Stage and phase parity of key tile t (i32): tile t fills stage t mod S in round t / S.
    let ring = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> { Ok((k.urem(t, c32(WS_STAGES))?, k.and(k.udiv(t, c32(WS_STAGES))?, c32(1))?)) };
    if let (Some(bars), Some(w)) = (bars, wg.filter(|w| w.producer)) {
        let q_full = kit.add(bars, c32(16 * WS_STAGES))?;
        kit.if_then(kit.icmp(IntPredicate::EQ, raw_tid, c32(0))?, |k| {
            for i in 0..WS_STAGES {
                k.mbarrier_init(full(k, bars, c32(i))?, 1)?;
                k.mbarrier_init(empty(k, bars, c32(i))?, 4 * w.warpgroups)?;
            }
            k.mbarrier_init(q_full, 1)?;
            k.fence_mbarrier_init()
        })?;
        // The kernel's one CTA-wide barrier: the mbarriers initialised, for every role.
        kit.barrier()?;
        // The producer: its registers to the pool, then thread 0 issues every TMA copy —
        // Q once, then each key tile's K and V into stage t mod S once the consumers have
        // freed it (its empty barrier's previous phase: on the first round, a fresh barrier's
        // phase −1 counts as complete, so the stages start free) — and the warpgroup leaves.
        // It walks exactly the consumers' `n_tiles` tiles (the same expression of the CTA's
        // indices), so every wait on either side has its arrival.
        kit.return_if(kit.icmp(IntPredicate::ULT, raw_tid, c32(128))?, |k| {
            k.setmaxnreg(false, WS_PRODUCER_REGS)?;
            k.if_then(k.icmp(IntPredicate::EQ, raw_tid, c32(0))?, |k| {
                let sbase = k.smem_addr(smem)?;
                let (hq, bz) = (k.sreg("ctaid.y")?, k.sreg("ctaid.z")?);
                let hkv = k.udiv(hq, c32((p.heads / p.kv_heads) as u32))?;
                let axes = |t: &super::attention::T4, h: IntValue<'ctx>| -> Vec<IntValue<'ctx>> {
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
                let boxes = |k: &Kit<'ctx>, map: usize, at: IntValue<'ctx>, width: u32, rows: u32, row0: IntValue<'ctx>, hb: &[IntValue<'ctx>], bar: IntValue<'ctx>| -> R<()> {
                    for slab in 0..width / 64 {
                        let mut c = vec![c32(64 * slab), row0];
                        c.extend_from_slice(hb);
                        k.tma_load(k.add(sbase, k.add(at, c32(slab * rows * 128))?)?, map, &c, bar)?;
                    }
                    Ok(())
                };
                k.mbarrier_arrive_expect_tx(q_full, bq * d * 2)?;
                boxes(k, 0, c32(0), d, bq, k.trunc32(q0)?, &q_hb, q_full)?;
                k.for_range(c32(0), n_tiles, c32(1), |k, t| {
                    let (st, ph) = ring(k, t)?;
                    k.mbarrier_wait_parity(empty(k, bars, st)?, k.xor(ph, c32(1))?)?;
                    let bar = full(k, bars, st)?;
                    k.mbarrier_arrive_expect_tx(bar, bkv * (d + dv) * 2)?;
                    let k_sm = k.add(c32(sm.k[0]), k.mul(st, c32(sm.k[1] - sm.k[0]))?)?;
                    let v_sm = k.add(c32(sm.v[0]), k.mul(st, c32(sm.v[1] - sm.v[0]))?)?;
                    let j0 = k.mul(t, c32(bkv))?;
                    boxes(k, 1, k_sm, d, bkv, j0, &k_hb, bar)?;
                    boxes(k, 2, v_sm, dv, bkv, j0, &v_hb, bar)
                })
            })
        })?;
        kit.setmaxnreg(true, WS_CONSUMER_REGS)?;
        // Q landed (waited for even without key tiles: no copy is left in flight at exit).
        kit.mbarrier_wait_parity(q_full, c32(0))?;
    } else {
        copy_rows(kit, bq, d / epc, sm.ldq, c32(0), q_ptr, kit.add(q_base, kit.mul(q0, q_ss)?)?, q_ss, kit.sub(sq, q0)?)?;
        // (The overlapped `wgmma` loop takes V one tile after K: V_0 in its first iteration.)
        kit.if_then(kit.icmp(IntPredicate::SGT, n_tiles, c32(0))?, |k| if overlap { issue_k(k, c32(0)) } else { issue_tile(k, c32(0)) })?;
        kit.cp_async_commit()?;
        kit.cp_async_wait(0)?;
        if wg.is_some() {
            // The copies (generic proxy) before the `wgmma`s' reads (async proxy), §9.7.15.1.
            kit.fence_proxy_async()?;
        }
        kit.barrier()?;
    }
    // Matrix descriptors (§9.7.15.5.1, "Matrix Descriptor Format"): start address >> 4 in bits
    // 0–13, leading byte offset >> 4 in 16–29, stride byte offset >> 4 in 32–45, the swizzle
    // mode in 62–63 (1: 128 bytes). Every operand tile here is stored as 128-byte rows (64
    // elements of its contiguous axis) XOR-swizzled by `row mod 8` in 1024-byte atoms of 8
    // rows, "slabs" of 64 columns one after the other ([`Smem::swz`]).
    // - Q [q, d] (A, K-major) and K [kv, d] (B, K-major): exactly the GEMM's operands
    //   (`matmul::build_wgmma`): leading byte offset unused for swizzled K-major layouts (1),
    //   stride byte offset 1024 (the next 8 rows of M or N); a k16 step is +32 bytes inside
    //   the 128-byte row, the next 64 columns of d the next slab.
    // - V [kv, d] as B of P·V ([K = kv, N = d], N contiguous: **MN-major**, `imm-trans-b` 1).
    //   The MN-major 128-byte-swizzle canonical layout (§9.7.15.5.1; CUTLASS
    //   `make_gmma_desc<Major::MN>`: `Swizzle<3,4,3> o ((T,8,m),(8,k)) : ((1,T,LBO),(8T,SBO))`,
    //   T = 8 elements) is 64 contiguous N elements per 128-byte row, 8 rows of K per 1024-byte
    //   atom: the same bytes as a slab. The **stride** byte offset steps K by 8 rows (1024);
    //   the **leading** byte offset steps N by 64 columns (one atom along MN), i.e. the slab
    //   stride `block_kv · 128` — used only by an `n` over 64 (Dv = 128 in one `wgmma`; the
    //   `pv_split` schedules issue one n64 per slab and never use it). A k16 step is 16 rows:
    //   +2048 bytes, atom-aligned.
    let sbase = kit.smem_addr(smem)?;
    let k_major = (1i64 << 16) | (64i64 << 32) | (1i64 << 62);
    let mn_major = (i64::from(bkv * 128 / 16) << 16) | (64i64 << 32) | (1i64 << 62);
    let desc = |k: &Kit<'ctx>, addr: IntValue<'ctx>, fixed: i64| -> R<IntValue<'ctx>> {
        let enc = k.lshr(k.and(addr, c32(0x3FFFF))?, 4)?;
        k.add(k.i64c(fixed), k.zext64(enc)?)
    };
    // The warpgroup's 64 rows of Q (slab 0).
    let q_wg = kit.add(sbase, kit.mul(wg_id, c32(64 * 128))?)?;
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
    let q_ptr_sm = kit.sh_at(smem, q_lane)?;
    let q_frag = |k: &Kit<'ctx>, mi: usize, ks: u32| -> R<[IntValue<'ctx>; 4]> {
        k.ldmatrix_x4(k.sh_at(q_ptr_sm, c32(16 * mi as u32 * sm.ldq * 2 + ks * 32))?, false)
    };
    let qf: Vec<Vec<[IntValue<'ctx>; 4]>> = if s.q_in_regs {
        (0..mt).map(|mi| (0..d / 16).map(|ks| q_frag(kit, mi, ks)).collect::<R<Vec<_>>>()).collect::<R<_>>()?
    } else {
        Vec::new()
    };

    // ---- per-thread state ------------------------------------------------------------------
    let m: Vec<[PointerValue<'ctx>; 2]> = (0..mt).map(|_| Ok([kit.var_f(ninf)?, kit.var_f(ninf)?])).collect::<R<_>>()?;
    let l: Vec<[PointerValue<'ctx>; 2]> = (0..mt).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<_>>()?;
    // acc[mi][n][e]: O(row g + 8·(e / 2), column 8n + 2·t4 + e % 2) of slab mi.
    let acc: Vec<Vec<[PointerValue<'ctx>; 4]>> =
        (0..mt).map(|_| (0..n_ov).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
    // Scores of the current tile, same layout as acc over the tile's keys.
    let sv: Vec<Vec<[PointerValue<'ctx>; 4]>> =
        (0..mt).map(|_| (0..n_nt).map(|_| Ok([kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?, kit.var_f(zero)?])).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
    // While some row of the warp has seen only −inf, the interpreter may skip 16-key groups:
    // first[mi][h] is the key (tile-relative) of the row's first group it multiplies.
    let maybe_skipping = var_i32(kit, c32(1))?;
    let (lo_var, slow_var) = (var_i32(kit, c32(0))?, var_i32(kit, c32(0))?);
    let first: Vec<[PointerValue<'ctx>; 2]> = (0..mt).map(|_| Ok([var_i32(kit, c32(0))?, var_i32(kit, c32(0))?])).collect::<R<_>>()?;
    let mask_rows: Vec<[Option<IntValue<'ctx>>; 2]> = match &p.mask {
        Some(mk) => {
            let mb = base_mask(kit, mk, b, h)?;
            (0..mt)
                .map(|mi| -> R<[Option<IntValue<'ctx>>; 2]> {
                    let at = |hh: usize| -> R<Option<IntValue<'ctx>>> {
                        let i = kit.smin(rows.index[mi][hh], kit.sub(sq, kit.i64c(1))?)?;
                        Ok(Some(kit.add(mb, kit.mul(i, kit.dim(&mk.st[2])?)?)?))
                    };
                    Ok([at(0)?, at(1)?])
                })
                .collect::<R<_>>()?
        }
        None => vec![[None, None]; mt],
    };

    // ---- the steps of a key tile -------------------------------------------------------------
    // The K and V stages of tile t (byte offsets from the shared base).
    let stage_of = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let stage = k.and(t, c32(1))?;
        Ok((k.add(c32(sm.k[0]), k.mul(stage, c32(sm.k[1] - sm.k[0]))?)?, k.add(c32(sm.v[0]), k.mul(stage, c32(sm.v[1] - sm.v[0]))?)?))
    };
    // S = Q·Kᵀ on `wgmma` (K at `k_sm`): m64n{bkv}k16 per 16 columns of d, A = the
    // warpgroup's Q rows, B = the K tile, as one group, `in_flight` groups left pending;
    // this warp's 16 rows come back in the m16n8 C layout of each n8 tile (`bkv / 2` floats).
    let qk_wg = |k: &Kit<'ctx>, k_sm: IntValue<'ctx>, in_flight: u32| -> R<Vec<FloatValue<'ctx>>> {
        let k_addr = k.add(sbase, k_sm)?;
        let descs = (0..d / kstep)
            .map(|ks| {
                let (slab, kb) = (ks / 4, (ks % 4) * 32);
                Ok((desc(k, k.add(q_wg, c32(slab * bq * 128 + kb))?, k_major)?, desc(k, k.add(k_addr, c32(slab * bkv * 128 + kb))?, k_major)?))
            })
            .collect::<R<Vec<_>>>()?;
        k.wgmma_k_tile(ein, bkv, &vec![zero; (bkv / 2) as usize], &descs, in_flight)
    };
    // The scores of the tile at key j0 (`sacc`, raw products) into `sv`, in the log2 domain;
    // masked; and the skipping state (`first`, `lo_var`, `maybe_skipping`) of this tile.
    let scores = |k: &Kit<'ctx>, j0: IntValue<'ctx>, sacc: &[Vec<[FloatValue<'ctx>; 4]>]| -> R<()> {
        for mi in 0..mt {
            for n in 0..n_nt {
                for e in 0..4 {
                    let v = if fused { sacc[mi][n][e] } else { k.fmul(sacc[mi][n][e], cf)? };
                    k.set(sv[mi][n][e], v.into())?;
                }
            }
        }

        // Mask keys past each row's limit (and add the additive mask) where the tile
        // crosses a row's limit.
        let col0 = k.add(j0, k.mul(t4, c32(2))?)?;
        let crosses = k.icmp(IntPredicate::SGT, k.add(j0, c32(bkv))?, min_limit)?;
        let crosses = if p.mask.is_some() { k.bool_c(true) } else { crosses };
        k.if_then(crosses, |k| {
            for mi in 0..mt {
                for n in 0..n_nt {
                    for e in 0..4 {
                        let hh = e / 2;
                        let col = k.add(col0, c32(8 * n as u32 + (e % 2) as u32))?;
                        let vis = k.icmp(IntPredicate::SLT, col, rows.limit[mi][hh])?;
                        let mut x = k.get_f(sv[mi][n][e])?;
                        if let (Some(mk), Some(mrow)) = (&p.mask, mask_rows[mi][hh]) {
                            // Row clamped below Sq, key below Skv: always in bounds, no branch.
                            let j = k.select_int(vis, col, c32(0))?;
                            let idx = k.add(mrow, k.mul(k.zext64(j)?, k.dim(&mk.st[3])?)?)?;
                            let mv = k.load_vec(mk.dtype, k.buf(mk.buffer)?, idx, 1)?[0];
                            x = k.fma(mv, k.f32c(std::f64::consts::LOG2_E), x)?;
                        }
                        k.set(sv[mi][n][e], k.select_f(vis, x, ninf)?.into())?;
                    }
                }
            }
            Ok(())
        })?;

        // Rows that have seen only −inf: the interpreter skips their leading 16-key groups
        // whose scores are all −inf. Count them (first[mi][h]), and note whether any row
        // skips a group here and whether any is still without a score after this tile.
        let n_grp = n_nt / 2;
        k.set(lo_var, k.smax(min_limit, j0)?.into())?;
        for f in first.iter().flatten() {
            k.set(*f, c32(0).into())?;
        }
        k.if_then(k.icmp(IntPredicate::NE, get_i32(k, maybe_skipping)?, c32(0))?, |k| {
            let mut skip = k.bool_c(false);
            let mut dead = k.bool_c(false);
            for mi in 0..mt {
                for hh in 0..2 {
                    let mut live = k.fcmp(FloatPredicate::UNE, k.get_f(m[mi][hh])?, ninf)?;
                    let mut count = c32(0);
                    for grp in 0..n_grp {
                        let mut gm = ninf;
                        for n in [2 * grp, 2 * grp + 1] {
                            for e in [2 * hh, 2 * hh + 1] {
                                gm = k.max_nan(gm, k.get_f(sv[mi][n][e])?)?;
                            }
                        }
                        gm = k.max_nan(gm, k.shfl_xor(gm, 1)?)?;
                        gm = k.max_nan(gm, k.shfl_xor(gm, 2)?)?;
                        live = or(k, live, k.fcmp(FloatPredicate::UNE, gm, ninf)?)?;
                        count = k.add(count, k.select_int(live, c32(0), c32(16))?)?;
                    }
                    k.set(first[mi][hh], count.into())?;
                    skip = or(k, skip, k.icmp(IntPredicate::NE, count, c32(0))?)?;
                    dead = or(k, dead, k.icmp(IntPredicate::EQ, count, c32(16 * n_grp as u32))?)?;
                }
            }
            let skip = warp_any(k, skip)?;
            let dead = warp_any(k, dead)?;
            k.set(maybe_skipping, k.select_int(dead, c32(1), c32(0))?.into())?;
            k.if_then(skip, |k| k.set(lo_var, j0.into()))
        })
    };
    // Online softmax per row of `sv`: updates m and l, and gives P (pf, the layout of `sv`),
    // whether any row of the warp has a new maximum, and each row's rescaling factor α (the
    // accumulator is not touched here).
    #[allow(clippy::type_complexity)]
    let softmax = |k: &Kit<'ctx>| -> R<(Vec<Vec<[FloatValue<'ctx>; 4]>>, IntValue<'ctx>, Vec<(usize, usize, FloatValue<'ctx>)>)> {
        let mut pf: Vec<Vec<[FloatValue<'ctx>; 4]>> = vec![vec![[zero; 4]; n_nt]; mt];
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
                let mx = if fused { k.fmul(mx, cf)? } else { mx };
                let mo = k.get_f(m[mi][hh])?;
                let mn = k.max_nan(mo, mx)?;
                let none = k.fcmp(FloatPredicate::OEQ, mn, ninf)?;
                let mu = k.select_f(none, zero, mn)?;
                let alpha = ex2_ftz(k, k.fsub(mo, mu)?)?;
                let neg = k.fsub(zero, mu)?;
                // fp8: p·2⁸ (P's e4m3 rounding keeps 2⁻¹⁷ of the row maximum, not 2⁻⁹; l
                // carries the same factor, so O = acc / l is unchanged).
                let mu_p = if fp8.is_some() { k.fsub(mu, k.f32c(f64::from(FP8_P_LOG2)))? } else { mu };
                let mut sum = zero;
                for (i, &x) in xs.iter().enumerate() {
                    let arg = if fused { k.fma(x, cf, neg)? } else { k.fsub(x, mu_p)? };
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
    };
    // P as A fragments (pa[mi][kk]: keys 16kk..16kk+16), rounded to bf16/f16 pairs.
    let pack = |k: &Kit<'ctx>, pf: &[Vec<[FloatValue<'ctx>; 4]>]| -> R<Vec<Vec<[IntValue<'ctx>; 4]>>> {
        if fp8.is_some() {
            // The e4m3 A fragment of k-step kk (32 keys): register r holds row g (r even) or
            // g + 8 (r odd) at k positions 4·t4 + 16·(r / 2) .. +3, which Vᵀ's transposition
            // assigns the keys this lane's S accumulators hold: 2·t4, 2·t4 + 1 of n8 tiles
            // 4kk + 2·(r / 2) and 4kk + 2·(r / 2) + 1 (see `vt_key`). No shuffles.
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
    };
    // acc ·= α, skipped when no row of the warp has a new maximum (α = 1 exactly).
    let rescale_acc = |k: &Kit<'ctx>, rescale: IntValue<'ctx>, alphas: &[(usize, usize, FloatValue<'ctx>)]| -> R<()> {
        k.if_then(warp_any(k, rescale)?, |k| {
            for &(mi, hh, alpha) in alphas {
                for a in &acc[mi] {
                    for e in [2 * hh, 2 * hh + 1] {
                        k.set(a[e], k.fmul(k.get_f(a[e])?, alpha)?.into())?;
                    }
                }
            }
            Ok(())
        })
    };
    // Products the interpreter does not make (see the module docs) in the tile at key j0
    // (V at `v_sm`), after its `scores`: keys at or past the warp's first row's limit, and
    // the groups some row skips. Whether V holds a non-finite value there, so that this
    // tile's P·V must go the CUDA-core way (the warpgroup's decision with `wgmma`).
    let decide_slow = |k: &Kit<'ctx>, j0: IntValue<'ctx>, v_sm: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let hi = k.smin(k.add(j0, c32(bkv))?, skv32)?;
        k.set(slow_var, c32(0).into())?;
        let lo = get_i32(k, lo_var)?;
        k.if_then(k.icmp(IntPredicate::SLT, lo, hi)?, |k| {
            // Lanes scan 16-byte chunks of V rows lo..hi (tile-relative rows lo − j0..).
            let cv = dv / epc;
            let r0 = k.sub(lo, j0)?;
            let total = k.mul(k.sub(hi, lo)?, c32(cv))?;
            let found = var_i32(k, c32(0))?;
            k.for_range(lane, total, c32(32), |k, e| {
                let r = k.add(r0, k.udiv(e, c32(cv))?)?;
                let col = k.urem(e, c32(cv))?;
                let at = sm_at(k, v_sm, bkv, sm.ldv, r, col)?;
                let words = load_i32s(k, k.sh_at(smem, at)?, 4)?;
                let bad = if fp8.is_some() { any_nan_e4m3(k, &words)? } else { any_nonfinite(k, &words, exp_mask)? };
                k.if_then(bad, |k| k.set(found, c32(1).into()))
            })?;
            if wg.is_some() {
                return k.set(slow_var, get_i32(k, found)?.into());
            }
            let any = warp_any(k, k.icmp(IntPredicate::NE, get_i32(k, found)?, c32(0))?)?;
            k.set(slow_var, k.select_int(any, c32(1), c32(0))?.into())
        })?;
        let slow = k.icmp(IntPredicate::NE, get_i32(k, slow_var)?, c32(0))?;
        // The warpgroup decides together (its P·V is one `wgmma`): named barrier 1 + wg.
        if wg.is_some() {
            k.bar_red_or(k.add(wg_id, c32(1))?, 128, slow)
        } else {
            Ok(slow)
        }
    };
    // CUDA-core P·V of the tile at key j0 (V at `v_sm`, P in `pa`), exactly the
    // interpreter's products: per row, keys below its limit from its first multiplied group on.
    // fp8: P is the e4m3 fragments (`pack`), read back as f16 pairs in the mma.sync A layout
    // of 16-key steps (exactly the values the `wgmma` multiplies), and V is e4m3 bytes.
    let pdt = if fp8.is_some() { DType::F16 } else { dt };
    let pv_slow = |k: &Kit<'ctx>, j0: IntValue<'ctx>, v_sm: IntValue<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>]| -> R<()> {
        let pa16: Vec<Vec<[IntValue<'ctx>; 4]>>;
        let pa = if fp8.is_some() {
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
        let first: Vec<[IntValue<'ctx>; 2]> = first.iter().map(|f| Ok([get_i32(k, f[0])?, get_i32(k, f[1])?])).collect::<R<_>>()?;
        // P (rounded as the mma would see it) to the warp's scratch rows: row
        // 16mi + 8h + g of the warp, keys as in the A fragments.
        let prow0 = k.add(c32(sm.p), k.mul(k.add(k.mul(warp, c32(rpw))?, g)?, c32(sm.ldp * 2))?)?;
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
            let vs: Vec<Vec<FloatValue<'ctx>>> = if fp8.is_some() {
                // Bytes 8·(n % 2) + 2·t4 of chunk n / 2 of V row jj: columns 8n + 2·t4 + {0, 1}.
                (0..n_ov)
                    .map(|n| {
                        let at = k.add(sm_at(k, v_sm, bkv, sm.ldv, jj, c32(n as u32 / 2))?, k.add(k.mul(t4, c32(2))?, c32(8 * (n as u32 % 2)))?)?;
                        let ptr = k.sh_at(smem, at)?;
                        let pair = k.math(|kb| Ok(kb.load(kb.cx.i16_type().into(), ptr, 2)?.into_int_value()))?;
                        Ok(k.e4m3x2_to_f32(k.math(|kb| Ok(kb.b.build_int_z_extend(pair, kb.cx.i32_type(), "")?))?)?.to_vec())
                    })
                    .collect::<R<_>>()?
            } else if sm.swz {
                (0..n_ov).map(|n| k.sh_load(dt, k.sh_at(smem, k.add(sm_at(k, v_sm, bkv, sm.ldv, jj, c32(n as u32))?, k.mul(t4, c32(4))?)?)?, 2)).collect::<R<_>>()?
            } else {
                let vrow = k.sh_at(smem, k.add(k.add(v_sm, k.mul(jj, c32(sm.ldv * 2))?)?, k.mul(t4, c32(4))?)?)?;
                (0..n_ov).map(|n| k.sh_load(dt, k.sh_at(vrow, c32(16 * n as u32))?, 2)).collect::<R<_>>()?
            };
            let pcol = k.sh_at(smem, k.add(prow0, k.mul(jj, c32(2))?)?)?;
            for mi in 0..mt {
                for hh in 0..2 {
                    let pj = k.sh_load(pdt, k.sh_at(pcol, c32((16 * mi as u32 + 8 * hh as u32) * sm.ldp * 2))?, 1)?[0];
                    let made = k.and(k.icmp(IntPredicate::SLT, j, rows.limit[mi][hh])?, k.icmp(IntPredicate::SGE, jj, first[mi][hh])?)?;
                    for (a, v) in acc[mi].iter().zip(&vs) {
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
    };
    // fp8: the Vᵀ buffer the next P·V reads (byte offset).
    // (Only an fp8 kernel allocates it: the other kernels' PTX stays as it was.)
    let vt_var = if fp8.is_some() { Some(var_i32(kit, c32(sm.vt[0]))?) } else { None };
    // The `wgmma` P·V's groups: one, or Dv / 64 with `pv_split`.
    let pv_parts = wg.map_or(1, |w| if w.pv_split { dv / 64 } else { 1 });
    // O += P·V on tensor cores (V at `v_sm`, P in `pa`). With `wgmma`, each of the
    // `pv_parts` groups is waited for at once, or with `overlapped` (one Q·Kᵀ group issued
    // before them) none is: part i's wait leaves its `2 + i` groups pending.
    let pv_tc = |k: &Kit<'ctx>, v_sm: IntValue<'ctx>, v_at: PointerValue<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>], overlapped: bool| -> R<()> {
        if fp8.is_some() {
            // A = P's e4m3 fragments (k-step kk: the 32 keys 32kk..), B = Vᵀ (K-major, its
            // k positions permuted as `pack` needs): one m64n{Dv}k32 per 32 keys.
            let vt_addr = k.add(sbase, get_i32(k, vt_var.ok_or_else(|| k.err("no Vᵀ offset"))?)?)?;
            let flat: Vec<PointerValue<'ctx>> = acc[0].iter().flatten().copied().collect();
            let steps = (0..n_nt / 4).map(|kk| Ok((pa[0][kk], desc(k, k.add(vt_addr, c32(kk as u32 * 32))?, k_major)?))).collect::<R<Vec<_>>>()?;
            let cur: Vec<FloatValue<'ctx>> = flat.iter().map(|&a| k.get_f(a)).collect::<R<_>>()?;
            let out = k.wgmma_rs_k_tile(ein, dv, &cur, &steps, false, if overlapped { 2 } else { 0 })?;
            for (&a, v) in flat.iter().zip(out) {
                k.set(a, v.into())?;
            }
            return Ok(());
        }
        if wg.is_some() {
            // A = P from registers (k-step kk: keys 16kk..), B = V rows 16kk.. of
            // each slab (MN-major, see `mn_major`): Dv / n products of m64n{n}k16.
            let n = dv / pv_parts;
            let v_addr = k.add(sbase, v_sm)?;
            let flat: Vec<PointerValue<'ctx>> = acc[0].iter().flatten().copied().collect();
            for part in 0..pv_parts as usize {
                let steps = (0..n_nt / 2)
                    .map(|kk| Ok((pa[0][kk], desc(k, k.add(v_addr, c32(part as u32 * bkv * 128 + kk as u32 * 2048))?, mn_major)?)))
                    .collect::<R<Vec<_>>>()?;
                let regs = &flat[part * (n / 2) as usize..(part + 1) * (n / 2) as usize];
                let cur: Vec<FloatValue<'ctx>> = regs.iter().map(|&a| k.get_f(a)).collect::<R<_>>()?;
                let out = k.wgmma_rs_k_tile(dt, n, &cur, &steps, true, if overlapped { 2 + part as u32 } else { 0 })?;
                for (&a, v) in regs.iter().zip(out) {
                    k.set(a, v.into())?;
                }
            }
            return Ok(());
        }
        for kk in 0..n_nt / 2 {
            for np in 0..n_ov / 2 {
                let vb = k.ldmatrix_x4(k.sh_at(v_at, c32(kk as u32 * 16 * sm.ldv * 2 + np as u32 * 32))?, true)?;
                for mi in 0..mt {
                    for (half, bb) in [[vb[0], vb[1]], [vb[2], vb[3]]].into_iter().enumerate() {
                        let a = &acc[mi][2 * np + half];
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
    };

    // ---- the key tiles -------------------------------------------------------------------------
    // fp8: V_t (keys outer, as stored) → Vᵀ, the K-major B operand of P·V (8-bit `wgmma`
    // has no transposed B). Thread u of the CTA takes a 4-key × 16-column block: keys
    // a, a + 1, a + 8, a + 9 (a = 32·g + 16·hh + 2·t, the keys lane t4 = t holds in n8
    // tiles 4g + 2hh and 4g + 2hh + 1 of S) and V columns 16·cn ..: four 16-byte row
    // reads, four 4×4 byte transposes, and column n's four bytes are one 32-bit word of
    // Vᵀ row n at k positions 32g + 16hh + 4t .. +3 (`pack`'s A fragment order). Vᵀ
    // rows are 128-byte swizzled (chunk c of row n at c xor (n mod 8)). Every thread's
    // `wgmma`s of the previous tile were waited for before the barrier that precedes
    // this, so the one Vᵀ buffer is free.
    let transpose_v = |k: &Kit<'ctx>, v_sm: IntValue<'ctx>, vt_sm: IntValue<'ctx>| -> R<()> {
        let ng = bkv / 32;
        let units = bkv * dv / 64;
        for i in 0..units.div_ceil(threads) {
            let u = k.add(tid, c32(i * threads))?;
            let go = |k: &Kit<'ctx>| -> R<()> {
                let t = k.and(u, c32(3))?;
                let cn0 = k.and(k.lshr(u, 2)?, c32(1))?;
                let hh = k.and(k.lshr(u, 3)?, c32(1))?;
                let r = k.lshr(u, 4)?;
                let g = k.urem(r, c32(ng))?;
                let cn = k.add(k.mul(k.udiv(r, c32(ng))?, c32(2))?, cn0)?;
                let a = k.add(k.add(k.mul(g, c32(32))?, k.mul(hh, c32(16))?)?, k.mul(t, c32(2))?)?;
                let rows = [0u32, 1, 8, 9].map(|o| -> R<Vec<IntValue<'ctx>>> {
                    let at = sm_at(k, v_sm, bkv, sm.ldv, k.add(a, c32(o))?, cn)?;
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
    };
    if overlap {
        // FlashAttention-3's intra-warpgroup pipelining (arXiv 2407.08608 §3.2, Algorithm 2):
        // iteration t issues S_t = Q·K_tᵀ, then O += P_{t−1}·V_{t−1}, waits for S_t alone
        // and runs its softmax while the P·V group is in flight, then waits for it and
        // rescales O by α_t. The same operations in the same order as the loop below (O is
        // rescaled by α_t after P_{t−1}·V_{t−1} is added, before P_t·V_t), so the same results.
        // - P_{t−1} crosses the back edge in registers (`pa_prev`), and is an operand of the
        //   wait for its P·V: the `wgmma` reads A registers asynchronously (§9.7.15.6), so
        //   P_t, packed during the softmax, must not take P_{t−1}'s registers while it runs.
        // - ptxas serializes every `wgmma` (C7520) when a group is in flight across a branch
        //   it cannot prove uniform, and a warpgroup's tile range (`grp_end`) comes from the
        //   thread index: so every warpgroup walks all `n_tiles` tiles (a causal CTA's upper
        //   warpgroup computes up to one tile above its diagonal, fully masked: α = 1, p = 0,
        //   and the non-finite scan of V keeps the products exact), and the rare CUDA-core
        //   P·V (non-finite V where p = 0) takes a separate, unpipelined iteration.
        // - Loads: iteration t takes K_{t+1} and V_t (V one tile later than K), so its barrier
        //   finds K_t and V_{t−1} landed, and the stages it overwrites — K_{t−1}'s (its Q·Kᵀ
        //   was waited for in iteration t − 1) and V_{t−2}'s (its P·V too) — are free in
        //   every warpgroup. One iteration more than there are tiles, for the last P·V.
        let i32t = kit.i32t;
        let f32t = kit.f32t;
        // (fp8: 32-key steps, half as many.)
        let pa_prev: Vec<[PointerValue<'ctx>; 4]> = (0..n_nt / if fp8.is_some() { 4 } else { 2 }).map(|_| Ok([kit.var_i(c32(0))?, kit.var_i(c32(0))?, kit.var_i(c32(0))?, kit.var_i(c32(0))?])).collect::<R<_>>()?;
        let flat: Vec<PointerValue<'ctx>> = acc[0].iter().flatten().copied().collect();
        let keep_pa = |k: &Kit<'ctx>, pa: &[Vec<[IntValue<'ctx>; 4]>]| -> R<()> {
            for (v, w) in pa_prev.iter().zip(&pa[0]) {
                for e in 0..4 {
                    k.set(v[e], w[e].into())?;
                }
            }
            Ok(())
        };
        kit.for_range(c32(0), kit.add(n_tiles, c32(1))?, c32(1), |k, t| {
            k.cp_async_wait(0)?;
            k.fence_proxy_async()?;
            k.barrier()?;
            let next = k.add(t, c32(1))?;
            k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| issue_k(k, next))?;
            k.if_then(k.icmp(IntPredicate::SLT, t, n_tiles)?, |k| issue_v(k, t))?;
            k.cp_async_commit()?;
            if fp8.is_some() {
                // V_{t−1} (landed) → Vᵀ for this iteration's P_{t−1}·V_{t−1}: its previous
                // readers, P_{t−2}·V_{t−2}, were waited for in iteration t − 1. The writers
                // fence the async proxy, then the barrier (CTA-uniform condition).
                k.if_then(k.icmp(IntPredicate::SGT, t, c32(0))?, |k| {
                    transpose_v(k, stage_of(k, k.sub(t, c32(1))?)?.1, c32(sm.vt[0]))?;
                    k.fence_proxy_async()?;
                    k.barrier()
                })?;
            }
            let j0 = k.mul(t, c32(bkv))?;
            let jp = k.sub(j0, c32(bkv))?;
            // Uniform in the CTA (the trip count is), which ptxas sees.
            let cur = k.icmp(IntPredicate::SLT, t, n_tiles)?;
            let prev = k.icmp(IntPredicate::SGT, t, c32(0))?;
            let (k_sm, _) = stage_of(k, t)?;
            let (_, vp_sm) = stage_of(k, k.sub(t, c32(1))?)?;
            let vp_at = k.sh_at(smem, k.add(vp_sm, v_lane)?)?; // (the mma.sync form's; unused)
            let pa_old = |k: &Kit<'ctx>| -> R<Vec<Vec<[IntValue<'ctx>; 4]>>> {
                Ok(vec![pa_prev.iter().map(|v| Ok([k.get_i(v[0], i32t)?, k.get_i(v[1], i32t)?, k.get_i(v[2], i32t)?, k.get_i(v[3], i32t)?])).collect::<R<Vec<_>>>()?])
            };
            let slow = var_i32(k, c32(0))?;
            k.if_then(prev, |k| {
                let s = decide_slow(k, jp, vp_sm)?;
                k.set(slow, k.select_int(s, c32(1), c32(0))?.into())
            })?;
            let slow = k.icmp(IntPredicate::NE, get_i32(k, slow)?, c32(0))?;
            k.if_else(
                or(k, slow, not(k, prev)?)?,
                |k| {
                    // The first tile, or tile t − 1's CUDA-core P·V: tile t as the loop below
                    // does, nothing left in flight.
                    k.if_then(slow, |k| pv_slow(k, jp, vp_sm, &pa_old(k)?))?;
                    k.if_then(cur, |k| {
                        let out = qk_wg(k, k_sm, 0)?;
                        let sacc = vec![(0..n_nt).map(|n| [out[4 * n], out[4 * n + 1], out[4 * n + 2], out[4 * n + 3]]).collect::<Vec<_>>()];
                        scores(k, j0, &sacc)?;
                        let (pf, rescale, alphas) = softmax(k)?;
                        rescale_acc(k, rescale, &alphas)?;
                        keep_pa(k, &pack(k, &pf)?)
                    })
                },
                |k| {
                    k.if_else(
                        cur,
                        |k| {
                            // No branch from here to the last wait: S_t's group, then the
                            // `pv_parts` P·V groups, S_t waited for alone.
                            let s_next = qk_wg(k, k_sm, 1)?;
                            let pa = pa_old(k)?;
                            pv_tc(k, vp_sm, vp_at, &pa, true)?;
                            let out = k.wgmma_wait_group(&s_next, pv_parts)?;
                            let sacc = vec![(0..n_nt).map(|n| [out[4 * n], out[4 * n + 1], out[4 * n + 2], out[4 * n + 3]]).collect::<Vec<_>>()];
                            scores(k, j0, &sacc)?;
                            let (pf, rescale, alphas) = softmax(k)?;
                            let pa_new = pack(k, &pf)?;
                            // O readable again (P_{t−1} free): the P·V groups done. ptxas
                            // schedules a wait as early as its basic block allows, so it is
                            // in each arm of the rescaling branch, after the softmax, not in
                            // the softmax's block; the branch is the warpgroup's decision
                            // (`bar.red.or`: a `wgmma.wait_group` under a condition must see
                            // the whole warpgroup take the same way, §9.7.15.7.3), rescaling
                            // when any of its rows has a new maximum (α = 1 exactly for the
                            // others).
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
                                k.bar_red_or(k.add(wg_id, c32(1))?, 128, rescale)?,
                                |k| {
                                    wait(k, "rescale")?;
                                    for &(mi, hh, alpha) in &alphas {
                                        for a in &acc[mi] {
                                            for e in [2 * hh, 2 * hh + 1] {
                                                k.set(a[e], k.fmul(k.get_f(a[e])?, alpha)?.into())?;
                                            }
                                        }
                                    }
                                    Ok(())
                                },
                                |k| wait(k, "as is"),
                            )?;
                            keep_pa(k, &pa_new)
                        },
                        // The last tile's P·V.
                        |k| pv_tc(k, vp_sm, vp_at, &pa_old(k)?, false),
                    )
                },
            )
        })?;
    } else if let Some(bars) = bars {
        // The warp-specialised consumers: per key tile, wait for its stage's full barrier
        // (the TMA's bytes landed: acquire, so the generic loads of the non-finite scan see
        // them too), compute it as the loop below does when the warpgroup sees any of its
        // keys, then free the stage: each warp, converged after its last read of it (the
        // `wgmma`s waited for, the scans behind the warpgroup's `bar.red`), arrives on its
        // empty barrier from lane 0. Every warp walks all `n_tiles` tiles and frees each
        // once, so the producer, walking the same tiles, is never left waiting.
        //
        // Ping-pong (FlashAttention-3 §3.1): warpgroup c waits at its scheduling barrier
        // `3 + c` before issuing S = Q·Kᵀ and, once it is issued, signals the other's
        // (`bar.arrive`, 256 threads: the other warpgroup's 128 waiting and this one's 128) —
        // so the warpgroups issue their products in turn and one's softmax and P·V run while
        // the other's Q·Kᵀ does. Warpgroup 0 goes first (it signals its own barrier once
        // before the loop) and waits once more after it, for warpgroup 1's last signal: on
        // each barrier every phase has its 128 waiting and 128 arriving threads, and none is
        // left half full at exit. Tiles a warpgroup skips (above its causal diagonal) still
        // take their turn, so the counts match whatever the tiles.
        let mine = kit.add(wg_id, c32(3))?;
        let other = kit.sub(c32(4), wg_id)?;
        let first_wg = kit.and(kit.icmp(IntPredicate::EQ, wg_id, c32(0))?, kit.icmp(IntPredicate::SGT, n_tiles, c32(0))?)?;
        if pingpong {
            kit.if_then(first_wg, |k| k.bar_arrive(mine, 256))?;
        }
        let lane0 = kit.icmp(IntPredicate::EQ, lane, c32(0))?;
        kit.for_range(c32(0), n_tiles, c32(1), |k, t| {
            let (st, ph) = ring(k, t)?;
            k.mbarrier_wait_parity(full(k, bars, st)?, ph)?;
            if pingpong {
                k.bar_sync(mine, 256)?;
            }
            let j0 = k.mul(t, c32(bkv))?;
            k.if_else(
                k.icmp(IntPredicate::SLT, j0, grp_end)?,
                |k| {
                    let (k_sm, v_sm) = stage_of(k, t)?;
                    let v_at = k.sh_at(smem, k.add(v_sm, v_lane)?)?;
                    // S = Q·Kᵀ: issued, the other warpgroup signalled, then waited for.
                    let out = if pingpong {
                        let out = qk_wg(k, k_sm, 1)?;
                        k.bar_arrive(other, 256)?;
                        k.wgmma_wait_group(&out, 0)?
                    } else {
                        qk_wg(k, k_sm, 0)?
                    };
                    let sacc = vec![(0..n_nt).map(|n| [out[4 * n], out[4 * n + 1], out[4 * n + 2], out[4 * n + 3]]).collect::<Vec<_>>()];
                    scores(k, j0, &sacc)?;
                    let (pf, rescale, alphas) = softmax(k)?;
                    rescale_acc(k, rescale, &alphas)?;
                    let pa = pack(k, &pf)?;
                    let slow = decide_slow(k, j0, v_sm)?;
                    k.if_else(slow, |k| pv_slow(k, j0, v_sm, &pa), |k| pv_tc(k, v_sm, v_at, &pa, false))
                },
                |k| if pingpong { k.bar_arrive(other, 256) } else { Ok(()) },
            )?;
            k.warp_sync()?;
            k.if_then(lane0, |k| k.mbarrier_arrive(empty(k, bars, st)?))
        })?;
        if pingpong {
            kit.if_then(first_wg, |k| k.bar_sync(mine, 256))?;
        }
    } else {
        // fp8: V is loaded two tiles ahead of its use (three stages, t mod 3) and transposed
        // one tile ahead into Vᵀ buffer t mod 2, so that the barrier at the top of the next
        // tile publishes it (no second barrier). The prologue took K_0 and V_0: V_1 now, and
        // V_0's transposition.
        let v_stage = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            let r = k.urem(t, c32(3))?;
            k.select_int(k.icmp(IntPredicate::EQ, r, c32(0))?, c32(sm.v[0]), k.select_int(k.icmp(IntPredicate::EQ, r, c32(1))?, c32(sm.v[1]), c32(sm.v2))?)
        };
        let vt_of = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<IntValue<'ctx>> { k.add(c32(sm.vt[0]), k.mul(k.and(t, c32(1))?, c32(sm.vt[1] - sm.vt[0]))?) };
        let issue_v3 = |k: &Kit<'ctx>, t: IntValue<'ctx>| -> R<()> {
            let j0 = k.mul(k.zext64(t)?, k.i64c(i64::from(bkv)))?;
            copy_rows(k, bkv, dv / epc, sm.ldv, v_stage(k, t)?, v_ptr, k.add(v_base, k.mul(j0, v_ss)?)?, v_ss, k.sub(skv, j0)?)
        };
        if fp8.is_some() {
            kit.if_then(kit.icmp(IntPredicate::SGT, n_tiles, c32(1))?, |k| issue_v3(k, c32(1)))?;
            kit.cp_async_commit()?;
            transpose_v(kit, c32(sm.v[0]), c32(sm.vt[0]))?;
            kit.fence_proxy_async()?;
        }
        kit.for_range(c32(0), n_tiles, c32(1), |k, t| {
            k.cp_async_wait(0)?;
            if wg.is_some() {
                k.fence_proxy_async()?;
            }
            k.barrier()?;
            let next = k.add(t, c32(1))?;
            if fp8.is_some() {
                k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| issue_k(k, next))?;
                let after = k.add(t, c32(2))?;
                k.if_then(k.icmp(IntPredicate::SLT, after, n_tiles)?, |k| issue_v3(k, after))?;
                k.cp_async_commit()?;
            } else {
                k.if_then(k.icmp(IntPredicate::SLT, next, n_tiles)?, |k| {
                    issue_tile(k, next)?;
                    k.cp_async_commit()
                })?;
            }
            let j0 = k.mul(t, c32(bkv))?;
            // fp8: every warpgroup issues its S = Q·K_tᵀ (for every tile of the CTA, so that the
            // issue and its wait are under no condition ptxas cannot prove uniform; a causal
            // CTA's upper warpgroup computes up to one fully masked tile it then skips), the
            // threads transpose V_{t+1} into the other Vᵀ buffer while it runs (on the last
            // tile, a stage no tile reads: harmless), then wait for it and fence the async
            // proxy for the transposed bytes (PTX ISA §9.7.15.1; the next tile's barrier
            // publishes them). ptxas 12.9 crashes on a fence between the issue and the wait.
            let s_fp8 = if fp8.is_some() {
                let pending = qk_wg(k, stage_of(k, t)?.0, 1)?;
                transpose_v(k, v_stage(k, next)?, vt_of(k, next)?)?;
                let out = k.wgmma_wait_group(&pending, 0)?;
                k.fence_proxy_async()?;
                if let Some(v) = vt_var {
                    k.set(v, vt_of(k, t)?.into())?;
                }
                Some(out)
            } else {
                None
            };
            k.if_then(k.icmp(IntPredicate::SLT, j0, grp_end)?, |k| {
                let (k_sm, v_sm) = stage_of(k, t)?;
                let v_sm = if fp8.is_some() { v_stage(k, t)? } else { v_sm };
                let (k_at, v_at) = (k.sh_at(smem, k.add(k_sm, k_lane)?)?, k.sh_at(smem, k.add(v_sm, v_lane)?)?);

                // S = Q·Kᵀ.
                let mut sacc: Vec<Vec<[FloatValue<'ctx>; 4]>> = vec![vec![[zero; 4]; n_nt]; mt];
                if wg.is_some() {
                    let out = match &s_fp8 {
                        Some(out) => out.clone(),
                        None => qk_wg(k, k_sm, 0)?,
                    };
                    for n in 0..n_nt {
                        for e in 0..4 {
                            sacc[0][n][e] = out[4 * n + e];
                        }
                    }
                }
                for ks in 0..if wg.is_some() { 0 } else { d / 16 } {
                    let qa: Vec<[IntValue<'ctx>; 4]> = (0..mt).map(|mi| if s.q_in_regs { Ok(qf[mi][ks as usize]) } else { q_frag(k, mi, ks) }).collect::<R<_>>()?;
                    for np in 0..(bkv / 16) as usize {
                        let kb = k.ldmatrix_x4(k.sh_at(k_at, c32(np as u32 * 16 * sm.ldk * 2 + ks * 32))?, false)?;
                        for mi in 0..mt {
                            sacc[mi][2 * np] = k.mma(dt, qa[mi], [kb[0], kb[1]], sacc[mi][2 * np])?;
                            sacc[mi][2 * np + 1] = k.mma(dt, qa[mi], [kb[2], kb[3]], sacc[mi][2 * np + 1])?;
                        }
                    }
                }
                scores(k, j0, &sacc)?;
                let (pf, rescale, alphas) = softmax(k)?;
                rescale_acc(k, rescale, &alphas)?;
                let pa = pack(k, &pf)?;
                let slow = decide_slow(k, j0, v_sm)?;
                k.if_else(slow, |k| pv_slow(k, j0, v_sm, &pa), |k| pv_tc(k, v_sm, v_at, &pa, false))
            })
        })?;
    }
    // ---- O = acc / l, rounded once ------------------------------------------------------------
    let mut outs: Vec<[Vec<FloatValue<'ctx>>; 2]> = Vec::new();
    for mi in 0..mt {
        let mut pair: [Vec<FloatValue<'ctx>>; 2] = [Vec::new(), Vec::new()];
        for (hh, o) in pair.iter_mut().enumerate() {
            let mut lt = kit.get_f(l[mi][hh])?;
            lt = kit.fadd(lt, kit.shfl_xor(lt, 1)?)?;
            lt = kit.fadd(lt, kit.shfl_xor(lt, 2)?)?;
            let empty = kit.fcmp(FloatPredicate::OEQ, kit.get_f(m[mi][hh])?, ninf)?;
            // fp8: O = sv · Σ p·v8 / l.
            let inv = kit.fdiv(v_scale.unwrap_or(kit.f32c(1.0)), lt)?;
            for a in &acc[mi] {
                for e in [2 * hh, 2 * hh + 1] {
                    o.push(kit.select_f(empty, zero, kit.fmul(kit.get_f(a[e])?, inv)?)?);
                }
            }
        }
        outs.push(pair);
    }
    let o_sd = kit.dim(&p.out.st[3])?;
    if p.out.vector_ok(8) {
        // Stage the warp's rows in its rows of the Q tile (which only this warp reads), then
        // 16-byte stores.
        kit.warp_sync()?;
        let wrow0 = kit.mul(warp, c32(rpw))?;
        let staged = |k: &Kit<'ctx>, x: IntValue<'ctx>| if sm.stage == 0 { Ok(x) } else { k.add(c32(sm.stage), x) };
        for (mi, pair) in outs.iter().enumerate() {
            for (hh, o) in pair.iter().enumerate() {
                let row = kit.add(wrow0, kit.add(g, c32(16 * mi as u32 + 8 * hh as u32))?)?;
                for n in 0..n_ov {
                    let col = kit.add(kit.mul(t4, c32(2))?, c32(8 * n as u32))?;
                    let word = kit.math(|kb| kb.pack_x2(dt, o[2 * n], o[2 * n + 1]))?;
                    let at = staged(kit, kit.add(kit.mul(row, c32(sm.ldst * 2))?, kit.mul(col, c32(2))?)?)?;
                    store_i32s(kit, kit.sh_at(smem, at)?, &[word])?;
                }
            }
        }
        kit.warp_sync()?;
        let cv = dv / 8;
        let total = rpw * cv;
        for i in 0..total.div_ceil(32) {
            let e = kit.add(lane, c32(32 * i))?;
            let r = kit.udiv(e, c32(cv))?;
            let col = kit.urem(e, c32(cv))?;
            let grow = kit.add(w0, kit.zext64(r)?)?;
            let ok = kit.and(kit.icmp(IntPredicate::ULT, e, c32(total))?, kit.icmp(IntPredicate::SLT, grow, sq)?)?;
            kit.if_then(ok, |k| {
                let at = staged(k, k.add(k.mul(k.add(wrow0, r)?, c32(sm.ldst * 2))?, k.mul(col, c32(16))?)?)?;
                let words = load_i32s(k, k.sh_at(smem, at)?, 4)?;
                let gi = k.add(o_base, k.add(k.mul(grow, o_ss)?, k.zext64(k.mul(col, c32(8))?)?)?)?;
                store_i32s(k, k.gep_raw(dt, o_ptr, gi)?, &words)
            })?;
        }
    } else {
        for (mi, pair) in outs.iter().enumerate() {
            for (hh, o) in pair.iter().enumerate() {
                kit.if_then(rows.valid[mi][hh], |k| {
                    let row = k.add(o_base, k.mul(rows.index[mi][hh], o_ss)?)?;
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
    // ---- lse = m·ln 2 + ln l (m is in log2 units), after O so that O's registers are free --
    if let Some(t) = &p.lse {
        let (lb, ls, lptr) = (base(t, b, h)?, kit.dim(&t.st[2])?, kit.buf(t.buffer)?);
        for mi in 0..mt {
            for hh in 0..2 {
                let mut lt = kit.get_f(l[mi][hh])?;
                lt = kit.fadd(lt, kit.shfl_xor(lt, 1)?)?;
                lt = kit.fadd(lt, kit.shfl_xor(lt, 2)?)?;
                let mv = kit.get_f(m[mi][hh])?;
                let empty = kit.fcmp(FloatPredicate::OEQ, mv, ninf)?;
                // fp8: l carries P's 2⁸ (m − 8 is the log2 of the scale p's are relative to).
                let mv2 = if fp8.is_some() { kit.fsub(mv, kit.f32c(f64::from(FP8_P_LOG2)))? } else { mv };
                let v = kit.select_f(empty, ninf, kit.fma(mv2, kit.f32c(std::f64::consts::LN_2), kit.log(lt)?)?)?;
                // The quad's four lanes hold the row's m and l; the first writes.
                let first = kit.and(rows.valid[mi][hh], kit.icmp(IntPredicate::EQ, t4, c32(0))?)?;
                kit.if_then(first, |k| k.store_vec(DType::F32, lptr, k.add(lb, k.mul(rows.index[mi][hh], ls)?)?, &[v]))?;
            }
        }
    }
    Ok(())
}

/// The (batch, head) base of the additive mask.
fn base_mask<'ctx>(kit: &Kit<'ctx>, mk: &super::attention::Mask, b: IntValue<'ctx>, h: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    let a = kit.add(kit.dim(&mk.offset)?, kit.mul(b, kit.dim(&mk.st[0])?)?)?;
    kit.add(a, kit.mul(h, kit.dim(&mk.st[1])?)?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::attention::generate_prefill;
    use crate::kernels::attention::tests::prefill;
    use crate::kernels::matmul::tests::{assemble, d, sym};

    /// The default schedule of every head dim the kernel takes (multiples of 16; bf16, and f16
    /// at 64 and 128), causal or not, with and without a mask, assembles for sm_80 and sm_90a
    /// without spills.
    #[test]
    fn default_schedules_assemble_without_spills() {
        for t in [Target::SM_80, Target::SM_90A] {
            let cases = [16, 48, 64, 80, 96, 112, 128, 192, 256].map(|hd| (DType::BF16, hd)).into_iter().chain([(DType::F16, 64), (DType::F16, 128)]);
            for (dt, hd) in cases {
                for (causal, mask) in [(true, false), (false, false), (true, true)] {
                    let (g, k) = prefill(dt, 8, 2, sym("T"), sym("S"), hd, hd, causal, mask);
                    let plan = generate_prefill(&g, k, &t).unwrap_or_else(|e| panic!("D{hd}: {e}"));
                    // sm_90a takes the wgmma kernel for head dims 64 and 128 without a mask.
                    let wgmma = t == Target::SM_90A && matches!(hd, 64 | 128) && !mask;
                    assert_eq!(plan.ptx.contains("wgmma.mma_async"), wgmma, "{t} D{hd} mask={mask}");
                    assert_eq!(plan.ptx.contains("mma.sync"), !wgmma && !(mask && hd > 128), "{t} D{hd} mask={mask}");
                    if assemble(&plan).is_none() {
                        return;
                    }
                }
            }
            // Constant sequence lengths take more registers (D = 128: 2 more, no spills).
            for causal in [true, false] {
                let (g, k) = prefill(DType::BF16, 32, 8, d(4096), d(4096), 128, 128, causal, false);
                assemble(&generate_prefill(&g, k, &t).unwrap());
            }
        }
    }

    /// With `check`, that ptxas does not serialize `ptx`'s `wgmma`s (no "wgmma.mma_async
    /// instructions are serialized", C7510 to C7520: the overlapped and warp-specialised
    /// kernels rely on groups staying in flight); with `SINTER_DUMP_WGMMA_ATTN` set, `ptx` is
    /// written to `/tmp/{tag}.ptx`.
    fn not_serialized_and_dumped(ptx: &str, w: &WgSchedule, tag: &str, check: bool) {
        if check {
            if let Some(ptxas) = crate::ptxas::find_ptxas_for_tests().unwrap() {
                let log = crate::ptxas::assemble_with(&ptxas, ptx, &Target::SM_90A).unwrap().log;
                assert!(!log.contains("serialized"), "{tag} ({w:?}): {log}");
            }
        }
        if std::env::var_os("SINTER_DUMP_WGMMA_ATTN").is_some() {
            std::fs::write(format!("/tmp/{}.ptx", tag.replace(' ', "_")), ptx).unwrap();
        }
    }

    /// The `wgmma` kernel (sm_90a) at head dims 64 and 128 (Dv 64 with D 128 too), bf16 and
    /// f16, causal or not, symbolic and constant lengths, with lse, each schedule candidate
    /// and the intra-warpgroup overlap at 128 and 64 keys (with `pv_split` too, whose S wait
    /// counts two P·V groups): it assembles without spills (and the overlap without ptxas
    /// serializing its `wgmma`s), holds the `wgmma` forms it is built on (A from shared
    /// memory for Q·Kᵀ, from registers with a transposed B for P·V) and no `mma.sync`; and
    /// sm_90 (no `a`) and sm_80 keep the `mma.sync` kernel.
    #[test]
    fn wgmma_kernel_assembles_without_spills() {
        use crate::kernels::attention::generate_prefill_wg_with;
        let h = Target::SM_90A;
        let wd = choose_wg_schedule(128, 128);
        let scheds = [
            wd,
            WgSchedule { pv_split: true, ..wd },
            WgSchedule { block_kv: 64, ..wd },
            WgSchedule { overlap: true, ..wd },
            WgSchedule { overlap: true, block_kv: 64, ..wd },
            WgSchedule { overlap: true, pv_split: true, ..wd },
        ];
        for (dt, hd, dv) in [(DType::BF16, 128, 128), (DType::BF16, 64, 64), (DType::F16, 128, 128), (DType::BF16, 128, 64)] {
            for causal in [false, true] {
                for (sq, skv) in [(sym("T"), sym("S")), (d(4096), d(4096))] {
                    let (g, k) = prefill(dt, 8, 2, sq.clone(), skv.clone(), hd, dv, causal, false);
                    for w in &scheds {
                        let plan = generate_prefill_wg_with(&g, k, &h, w).unwrap_or_else(|e| panic!("{w:?} D{hd}: {e}"));
                        let ty = if dt == DType::BF16 { "bf16" } else { "f16" };
                        let n = if w.pv_split { 64 } else { dv };
                        assert!(plan.ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{}k16.f32.{ty}.{ty}", w.block_kv)), "{w:?}");
                        assert!(plan.ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{n}k16.f32.{ty}.{ty}")), "{w:?}");
                        assert!(plan.ptx.contains("bar.red.or.pred") && !plan.ptx.contains("mma.sync"), "{w:?}");
                        assert!(plan.ptx.contains(".align 1024 .b8 smem_dyn[]"), "{w:?}");
                        assert_eq!(plan.block, [w.threads(), 1, 1]);
                        let Some(r) = assemble(&plan) else { return };
                        eprintln!("{} D{hd}/{dv} causal={causal} {sq}: {r}", w.name());
                        // The overlap holds only if ptxas keeps the groups in flight.
                        not_serialized_and_dumped(&plan.ptx, w, &format!("wgattn_{}_{hd}_{causal}", w.name()), w.overlap);
                    }
                }
            }
        }
        for t in [Target::SM_80, Target::SM_90] {
            let (g, k) = prefill(DType::BF16, 8, 2, sym("T"), sym("S"), 128, 128, false, false);
            let plan = generate_prefill(&g, k, &t).unwrap();
            assert!(plan.ptx.contains("mma.sync") && !plan.ptx.contains("wgmma"), "{t}");
            assert!(generate_prefill_wg_with(&g, k, &t, &choose_wg_schedule(128, 128)).is_err(), "{t}");
        }
        // Other head dims and a mask keep the mma.sync kernel on sm_90a.
        for (hd, mask) in [(96, false), (256, false), (128, true)] {
            let (g, k) = prefill(DType::BF16, 8, 2, sym("T"), sym("S"), hd, hd, false, mask);
            assert!(!generate_prefill(&g, k, &h).unwrap().ptx.contains("wgmma"), "D{hd} mask={mask}");
        }
    }

    /// `attention(q, k, v)` with the rows' log-sum-exp, layout `bshd` (q `[B, Sq, H, D]`,
    /// k `[B, Skv, Hkv, D]`, v `[B, Skv, Hkv, Dv]`): the TMA maps' strides out of order.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prefill_lse(dt: DType, h: i64, hkv: i64, sq: sinter_ir::Dim, skv: sinter_ir::Dim, hd: i64, dv: i64, causal: bool) -> (sinter_ir::KernelGraph, sinter_ir::Kernel) {
        use crate::kernels::matmul::tests::{single_kernel, ty};
        use sinter_ir::{Attr, FunctionBuilder, Graph, OpKind};
        let b = sym("B");
        let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
        let q = fb.param("q", ty(dt, &[b.clone(), sq, d(h), d(hd)]));
        let k = fb.param("k", ty(dt, &[b.clone(), skv.clone(), d(hkv), d(hd)]));
        let v = fb.param("v", ty(dt, &[b, skv, d(hkv), d(dv)]));
        let attrs = vec![
            ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
            ("causal", Attr::Bool(causal)),
            ("heads", Attr::Int(h)),
            ("kv_heads", Attr::Int(hkv)),
            ("layout", Attr::Str("bshd".into())),
            ("lse", Attr::Bool(true)),
        ];
        let r = fb.op(OpKind::Attention, &[q, k, v], attrs).unwrap();
        single_kernel(Family::Attention, fb.finish(&r).unwrap())
    }

    /// The warp-specialised kernel (`producer`, names ` ws`) and its ping-pong (` pp`) at
    /// head dims 128 and 64 (Dv 64 with D 128 too), 128- and 64-key tiles, bf16 and f16,
    /// causal or not, symbolic and constant lengths, with lse: 384 threads (`.maxntid 384`),
    /// `setmaxnreg` 24/240, the TMA copies of Q, K and V (4-d maps: D, S, head, batch) with
    /// their mbarriers, no `cp.async`, one CTA-wide barrier (the mbarriers' initialisation)
    /// and, for the ping-pong, the scheduling barriers 3 and 4; it assembles without spills
    /// and without ptxas serializing its `wgmma`s.
    #[test]
    fn wgmma_ws_kernel_assembles_without_spills() {
        use crate::kernels::attention::generate_prefill_wg_with;
        let h = Target::SM_90A;
        let ws = WgSchedule { producer: true, ..choose_wg_schedule(128, 128) };
        let pp = WgSchedule { pingpong: true, ..ws };
        let scheds = [ws, pp, WgSchedule { block_kv: 64, ..ws }, WgSchedule { block_kv: 64, ..pp }];
        for (dt, hd, dv) in [(DType::BF16, 128, 128), (DType::BF16, 64, 64), (DType::F16, 128, 128), (DType::BF16, 128, 64)] {
            for causal in [false, true] {
                for (sq, skv) in [(sym("T"), sym("S")), (d(4096), d(4096))] {
                    for lse in [false, true] {
                        let (g, k) = if lse { prefill_lse(dt, 8, 2, sq.clone(), skv.clone(), hd, dv, causal) } else { prefill(dt, 8, 2, sq.clone(), skv.clone(), hd, dv, causal, false) };
                        for w in &scheds {
                            let plan = generate_prefill_wg_with(&g, k, &h, w).unwrap_or_else(|e| panic!("{w:?} D{hd}: {e}"));
                            let ptx = &plan.ptx;
                            assert_eq!(plan.block, [384, 1, 1]);
                            for want in [".maxntid 384", "setmaxnreg.dec.sync.aligned.u32 24", "setmaxnreg.inc.sync.aligned.u32 240", "cp.async.bulk.tensor.4d", "mbarrier.arrive.expect_tx", "mbarrier.try_wait.parity", "mbarrier.arrive.shared::cta.b64", "wgmma.mma_async", "bar.red.or.pred"] {
                                assert!(ptx.contains(want), "{} D{hd}: no `{want}`", w.name());
                            }
                            assert!(!ptx.contains("cp.async.cg") && !ptx.contains("mma.sync"), "{}", w.name());
                            let cta_barriers = ptx.lines().filter(|l| l.split_whitespace().collect::<String>().starts_with("bar.sync0;")).count();
                            assert_eq!(cta_barriers, 1, "{}: CTA barriers", w.name());
                            assert_eq!(ptx.contains("bar.arrive"), w.pingpong, "{}", w.name());
                            let params = plan.params.iter().filter(|p| matches!(p, sinter_ir::KernelParam::TensorMap(_))).count();
                            assert_eq!(params, 3, "{}", w.name());
                            let Some(r) = assemble(&plan) else { return };
                            eprintln!("{} D{hd}/{dv} {dt} causal={causal} {sq} lse={lse}: {r}", w.name());
                            not_serialized_and_dumped(ptx, w, &format!("wgattn_{}_{hd}_{causal}", w.name()), true);
                        }
                    }
                }
            }
        }
    }

    /// Snapshots of the warp-specialised kernel: its launch plans (384 threads, the three
    /// tensor maps among the parameters) and ptxas resource lines (sm_90a, no spills) for
    /// ` ws` and ` ws pp` at D 128 (GQA 32/8, causal, symbolic lengths) and D 64 (SmolLM2's
    /// 9/3, causal), 128- and 64-key tiles; and the whole PTX of the ping-pong at D 64, not
    /// causal (the producer's TMA loop, the mbarrier waits and releases, the scheduling
    /// barriers).
    #[test]
    fn wgmma_ws_snapshots() {
        use crate::kernels::attention::generate_prefill_wg_with;
        use crate::kernels::matmul::tests::plan_line;
        let h = Target::SM_90A;
        let mut text = String::new();
        for (what, hd, hq, hkv) in [("bf16 D128 GQA 32/8 causal Sq=T Skv=S", 128, 32, 8), ("bf16 D64 GQA 9/3 causal Sq=T Skv=T", 64, 9, 3)] {
            let skv = if hd == 128 { sym("S") } else { sym("T") };
            let (g, k) = prefill(DType::BF16, hq, hkv, sym("T"), skv, hd, hd, true, false);
            let ws = WgSchedule { producer: true, ..choose_wg_schedule(hd as u32, hd as u32) };
            let pp = WgSchedule { pingpong: true, ..ws };
            for w in [ws, WgSchedule { block_kv: 64, ..ws }, pp, WgSchedule { block_kv: 64, ..pp }] {
                let plan = generate_prefill_wg_with(&g, k, &h, &w).unwrap();
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what} [{}]\n{}\n{report}", w.name(), plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("attention_wgmma_ws_ptxas", text);
        let (g, k) = prefill(DType::BF16, 8, 2, sym("T"), sym("S"), 64, 64, false, false);
        let pp = WgSchedule { producer: true, pingpong: true, ..choose_wg_schedule(64, 64) };
        insta::assert_snapshot!("attention_wgmma_ws_pp_d64_ptx", generate_prefill_wg_with(&g, k, &h, &pp).unwrap().ptx);
    }

    /// The fp8 kernel (sm_90a): head dims 64 and 128 (and 128/64), causal or not, symbolic
    /// and constant lengths, bf16 and f16 outputs, 128- and 64-key tiles and the overlap
    /// (without ptxas serializing its `wgmma`s): e4m3 `wgmma`s with
    /// A from shared memory for Q·Kᵀ and from registers for P·V (K-major Vᵀ, no transpose),
    /// P converted with `cvt.rn.satfinite.e4m3x2.f32`, V transposed with `prmt`, the async
    /// proxy fenced after the transposition; it assembles without spills. Other targets, the
    /// `+split` schedules, tiles over 128 keys and an f32 output are refused naming f8e4m3.
    #[test]
    fn fp8_kernel_assembles_without_spills() {
        use crate::kernels::attention::generate_prefill_wg_with;
        use crate::kernels::attention::tests::prefill_fp8;
        let h = Target::SM_90A;
        let wd = choose_fp8_schedule();
        for (out, hd, dv) in [(DType::BF16, 128, 128), (DType::BF16, 64, 64), (DType::F16, 128, 128), (DType::BF16, 128, 64)] {
            for causal in [false, true] {
                for (sq, skv) in [(sym("T"), sym("S")), (d(4096), d(4096))] {
                    let (g, k) = prefill_fp8(out, 8, 2, sq.clone(), skv.clone(), hd, dv, causal);
                    for w in [wd, WgSchedule { block_kv: 64, ..wd }, WgSchedule { overlap: true, ..wd }] {
                        let plan = generate_prefill_wg_with(&g, k, &h, &w).unwrap_or_else(|e| panic!("{w:?} D{hd}: {e}"));
                        assert!(plan.entry.ends_with("_attention_wgmma_e4m3"), "{}", plan.entry);
                        assert!(plan.ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{}k32.f32.e4m3.e4m3", w.block_kv)), "{w:?}");
                        assert!(plan.ptx.contains(&format!("wgmma.mma_async.sync.aligned.m64n{dv}k32.f32.e4m3.e4m3")), "{w:?}");
                        for needle in ["cvt.rn.satfinite.e4m3x2.f32", "prmt.b32", "fence.proxy.async.shared::cta", "bar.red.or.pred", ".align 1024 .b8 smem_dyn[]"] {
                            assert!(plan.ptx.contains(needle), "{w:?}: no {needle}");
                        }
                        assert!(!plan.ptx.contains("mma.sync") && !plan.ptx.contains("k16.f32"), "{w:?}");
                        assert_eq!(plan.block, [w.threads(), 1, 1]);
                        let Some(r) = assemble(&plan) else { return };
                        eprintln!("fp8 {} D{hd}/{dv} causal={causal} {sq}: {r}", w.name());
                        not_serialized_and_dumped(&plan.ptx, &w, &format!("wgattn8_{}_{hd}_{causal}", w.name()), w.overlap);
                    }
                }
            }
        }
        // Shared memory: Q 128 rows, two K stages, three V stages of 128-byte rows (half used
        // at D 64), two Vᵀ buffers of Dv rows × 128 keys, the P scratch / output staging
        // 128 × 136 × 2 bytes.
        let p_scratch = 128 * 136 * 2;
        assert_eq!(Smem::wg(&wd, 128, 128, true).total, 16384 * (1 + 2 + 3) + 2 * 128 * 128 + p_scratch);
        assert_eq!(Smem::wg(&wd, 128, 128, true).total, 165888);
        assert_eq!(Smem::wg(&wd, 64, 64, true).total, 16384 * (1 + 2 + 3) + 2 * 64 * 128 + p_scratch);
        let sm = Smem::wg(&wd, 128, 128, true);
        assert!(sm.vt.iter().chain([&sm.v2]).all(|o| o % 1024 == 0), "swizzled buffers 1024-byte aligned");
        let (g, k) = prefill_fp8(DType::BF16, 8, 2, sym("T"), sym("S"), 128, 128, true);
        assert!(generate_prefill(&g, k, &h).unwrap().entry.ends_with("_attention_wgmma_e4m3"));
        for t in [Target::SM_80, Target::SM_90] {
            // `sinter explain --schedules` lists no kernel it would refuse.
            assert!(matches!(crate::schedule_variants(&g, k, &t), Err(crate::CodegenError::Unsupported { .. })), "{t}");
            let e = generate_prefill(&g, k, &t).unwrap_err().to_string();
            assert!(e.contains(&format!("f8e4m3 attention: wgmma needs sm_90a, not {t}: {}", crate::FP8_SUPPORT)), "{e}");
        }
        for w in [WgSchedule { pv_split: true, ..wd }, WgSchedule { block_kv: 256, ..wd }] {
            let e = generate_prefill_wg_with(&g, k, &h, &w).unwrap_err().to_string();
            assert!(e.contains("f8e4m3 attention: schedule"), "{e}");
        }
        for (out, hd) in [(DType::F32, 128), (DType::BF16, 96)] {
            let (g, k) = prefill_fp8(out, 8, 2, sym("T"), sym("S"), hd, hd, false);
            assert!(matches!(crate::schedule_variants(&g, k, &h), Err(crate::CodegenError::Unsupported { .. })), "{out} D{hd}");
            let e = generate_prefill(&g, k, &h).unwrap_err().to_string();
            assert!(e.contains("f8e4m3 attention: ") && e.contains(crate::FP8_SUPPORT), "{e}");
        }
    }

    /// The warp-specialised options' names, threads, and what they refuse: the ping-pong
    /// without the producer or with other than two consumer warpgroups, the producer with the
    /// intra-warpgroup overlap (not built) or three consumer warpgroups (240 registers each).
    #[test]
    fn ws_schedules() {
        let wd = choose_wg_schedule(128, 128);
        assert!(!wd.producer && !wd.pingpong, "the default stays the cp.async kernel");
        let ws = WgSchedule { producer: true, ..wd };
        let pp = WgSchedule { pingpong: true, ..ws };
        assert_eq!((ws.name(), pp.name(), WgSchedule { block_kv: 64, ..pp }.name()), ("wgmma kv128 g2 ws".into(), "wgmma kv128 g2 ws pp".into(), "wgmma kv64 g2 ws pp".into()));
        assert_eq!((wd.threads(), ws.threads(), pp.threads()), (256, 384, 384));
        assert_eq!((ws.block_q(), ws.as_tc().threads()), (128, 256), "the consumers' walk");
        assert!(ws.check().is_ok() && pp.check().is_ok() && WgSchedule { block_kv: 64, ..pp }.check().is_ok());
        for bad in [WgSchedule { pingpong: true, ..wd }, WgSchedule { overlap: true, ..ws }, WgSchedule { warpgroups: 3, ..ws }, WgSchedule { warpgroups: 1, ..pp }] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
        // 128 · 24 + 256 · 240 registers fit the SM's 65536; the D 128 shared memory (Q, two
        // stages of K and V, the P scratch) an sm_90 CTA's 227 KiB.
        assert!(128 * WS_PRODUCER_REGS + 256 * WS_CONSUMER_REGS <= 65536);
        assert_eq!(ws.shared_bytes(128, 128), 128 * 128 * 2 + WS_STAGES * 2 * 128 * 128 * 2 + 128 * 136 * 2);
        assert!(ws.shared_bytes(128, 128) + 1024 <= Target::SM_90A.max_shared_memory_per_block());
    }

    #[test]
    fn schedules() {
        let s = |warps, m_tiles, block_kv, q_in_regs| TcSchedule { warps, m_tiles, block_kv, q_in_regs };
        let (a, h) = (&Target::SM_80, &Target::SM_90A);
        assert_eq!(choose_tc_schedule(64, 64, false, false, h), s(4, 2, 64, true));
        assert_eq!(choose_tc_schedule(128, 128, false, false, h), s(4, 2, 48, false));
        assert_eq!(choose_tc_schedule(128, 128, false, false, &Target::SM_90), s(4, 2, 48, false));
        // Two CTAs of 48-key tiles (2 × 100 KiB) do not fit in sm_80's 164 KiB.
        assert_eq!(choose_tc_schedule(128, 128, false, false, a), s(4, 2, 32, false));
        // Causal 48-key tiles spill (8 bytes with constant sequence lengths).
        assert_eq!(choose_tc_schedule(128, 128, false, true, h), s(4, 2, 32, false));
        assert_eq!(choose_tc_schedule(112, 112, false, false, h), s(4, 2, 32, false));
        assert_eq!(choose_tc_schedule(80, 96, false, false, h), s(4, 2, 32, false));
        assert_eq!(choose_tc_schedule(256, 256, false, false, h), s(4, 1, 32, false));
        assert_eq!(choose_tc_schedule(128, 128, true, false, h), s(4, 1, 64, false));
        assert_eq!(choose_tc_schedule(64, 64, true, false, a), s(4, 1, 64, true));
        // Q 128 × 136, two stages of K and V 48 × 136, the P scratch 128 × 56: 99 KiB.
        assert_eq!(s(4, 2, 48, false).shared_bytes(128, 128), 128 * 136 * 2 + 4 * 48 * 136 * 2 + 128 * 56 * 2);
        assert_eq!(s(4, 2, 48, false).shared_bytes(128, 128), 101376);
        // Q 128 rows × (64 + 8), two stages of K and V 64 × 72 (bf16); P in Q's rows.
        assert_eq!(s(4, 2, 64, true).shared_bytes(64, 64), 128 * 72 * 2 + 4 * 64 * 72 * 2);
        // Plus the P scratch 128 × (32 + 8) when Q is re-read from shared memory.
        assert_eq!(s(4, 2, 32, false).shared_bytes(128, 128), 128 * 136 * 2 + 4 * 32 * 136 * 2 + 128 * 40 * 2);
        assert!(s(0, 1, 64, true).check().is_err() && s(4, 3, 64, true).check().is_err() && s(4, 1, 40, true).check().is_err());
    }
}
