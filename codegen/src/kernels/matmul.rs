//! The matmul family ([`Family::Matmul`]): a (batched) matrix product with a fused
//! epilogue, on tensor cores (bf16, f16) or CUDA cores, correct for every shape.
//!
//! # What a kernel computes
//! The body holds one `matmul` node `R = a · b` (`a [..., M, K]`, `b [..., K, N]` after the
//! optional `transpose_a` / `transpose_b` of the last two axes; batch axes broadcast by NumPy
//! rules; `bf16`, `f16` or `f32` operands of one dtype, or both `dequantize_fp8` of `f8e4m3`
//! inputs, see **fp8** below) whose operands are kernel inputs,
//! possibly through views (`reshape` of a contiguous buffer, `slice`: the passes leave them at
//! the start of a body), and an epilogue that the shared element evaluator
//! (`kernels::element`) computes from R, the other kernel inputs (any views, any broadcast)
//! and constants. The epilogue decides how N is tiled (`Epi`, from the shared analysis
//! [`sinter_ir::epilogue::analyse`]):
//! - **direct** — every output is R or an element-wise function of R at the same element
//!   (bias `[N]` over rows, residual `[..., M, N]`, `cast`, `silu`, `gelu`, `mul`, `select`,
//!   …): each thread evaluates it from its accumulators;
//! - **columns** — each output comes from one column segment of R (a `slice` of its last
//!   axis, or all of R, possibly after element-wise ops such as GPT-2's QKV bias) through
//!   element-wise ops, `reshape`s and `rope` (a merged QKV projection with RoPE on Q and K):
//!   the CTA's accumulator tile is staged in shared memory (rounded to R's dtype) and the
//!   epilogue reads R there, so a RoPE partner in the same head is at hand (the tile width is a
//!   multiple of the head dim: 64, or 128 / 256 for those heads); an output may be a result of
//!   a `kv_append` whose new K/V rows are such values: each element of the rows is then
//!   scattered into the paged cache through the block table (`scatter_append`, the KvAppend
//!   family's addressing), so the projection writes the cache itself;
//! - **paired** — the outputs combine 2 or 4 equal-width column segments of R element-wise
//!   (SwiGLU over a merged gate/up projection): a CTA's tile holds the matching columns of
//!   every segment side by side (its B slab is gathered from each segment), and the epilogue
//!   reads each segment from its part of the staged tile.
//!
//! Anything else — an epilogue reading R at another element than its own in another way, a
//! reduction, a transpose of R — is refused ([`CodegenError::Unsupported`] naming the op),
//! never computed wrongly.
//!
//! Numerics (DESIGN.md, "Numerical conventions"): products are accumulated in f32, the
//! matmul result is rounded once to its dtype, and then every epilogue node is computed in
//! f32 from its (rounded) operands and rounded to its own dtype, exactly where the unfused
//! graph rounds. Addresses are 64-bit; every load and store is bounds-checked, so any M, N, K
//! (1, 17, 1000, 0) is correct; strides come from the buffers' [`sinter_ir::Layout`]s (any
//! strides, not only contiguous ones), and a symbolic dim (the token count `T`) is passed as a
//! [`sinter_ir::KernelParam::Size`].
//!
//! # Schedules
//! Three generators, each parameterised by a schedule ([`MatmulSchedule`]) so that the
//! runtime can autotune among candidates:
//! - [`MmaSchedule`]: the tensor-core GEMM of the Ampere generation (the structure of
//!   CUTLASS's `MmaMultistage` and of cuBLAS's sm_80 kernels; PTX ISA §9.7.9.3 `cp.async`,
//!   §9.7.14.5.15 `ldmatrix`, §9.7.14.5.14 `mma.m16n8k16`), for bf16 and f16 operands. A CTA of
//!   `warps_m × warps_n` warps computes a `bm × bn` tile of C, each warp a grid of m16n8 tiles
//!   with f32 accumulators in registers. A `stages`-deep pipeline of 16-byte `cp.async.cg`
//!   copies (`commit_group` per stage, `wait_group stages−2`) brings `bm × bk` slabs of A and
//!   `bn × bk` slabs of B into dynamic shared memory; chunks past M, N or K are zero-filled
//!   through the copy's source size, so every shape is correct and no load is out of bounds.
//!   An operand is read along whichever axis is contiguous — K (`[M, K]` activations, the
//!   `[N, K]` weight of `transpose_b`) or its outer axis (`[K, N]`, a transposed A) — and its
//!   slab rows are that axis; `ldmatrix.x4` (`.trans` for outer-contiguous slabs) loads the
//!   fragments. The 16-byte chunks of a slab row are XOR-swizzled by the row (chunk `c` of row
//!   `r` stored at `c ^ (r mod 8)`, or `c ^ ((r/2) mod 4)` for 64-byte rows), so that both the
//!   eight row addresses of an `ldmatrix` matrix and the chunks eight consecutive threads copy
//!   fall in eight different bank groups: neither conflicts. Within a stage the warps load the
//!   fragments of k-step `kk + 1` before issuing the MMAs of `kk` (register double buffering)
//!   and the next stage's first fragments while the last MMAs of a stage issue. CTAs are
//!   ordered in groups of `group_m` row tiles (the L2-friendly grouping of Triton's matmul
//!   tutorial). Default ([`MmaSchedule::DEFAULT`]) 128×256×64, 8 warps as 2×4 (64×64 warp
//!   tiles: 128 accumulators per thread, 8 `ldmatrix.x4` per 32 MMAs), 3 stages: 144 KiB of
//!   shared memory, 255 registers, one CTA per SM — the tile of cuBLAS's fastest sm_80 bf16
//!   GEMM; 128×128 with 2×2 warps ([`MmaSchedule::NARROW`]) where that covers N with less
//!   waste. For decode-shaped products the same kernel runs as a **flat GEMM**
//!   ([`MmaSchedule::FLAT`], FlashDecoding++, Hong et al. 2023, arXiv 2311.01282, §4): M is
//!   padded to one 16-row `m16n8k16` block instead of 128 (rows past M are zero-filled copies
//!   and masked stores, as any row tail), 16×32×256 tiles with 2 warps of 16×16 and 4
//!   stages, so that a small N still spreads over `⌈N/32⌉` CTAs and each keeps 3 × 256 K
//!   elements of its weight slab in flight ([`MmaSchedule::flat`]). The layouts must allow
//!   the 16-byte copies: the read axis has stride 1, the other
//!   strides, the view offset and the batch strides are provably multiples of 8 (symbolic ones
//!   included) and the base is 16-byte aligned (`Spec::mma_plan`); where they are not (an
//!   odd row length, a symbolic K stride), [`generate`] uses the tiled kernel instead.
//! - [`TiledSchedule`]: the classic shared-memory tiled GEMM on CUDA cores (as in the CUDA C
//!   Programming Guide's shared-memory matmul, with per-thread register micro-tiles as in
//!   Volkov & Demmel 2008), for f32 and as the fallback. A CTA computes a `bm × bn` tile of C;
//!   per `bk`-step it stages the `bm × bk` slab of A and the `bk × bn` slab of B in shared
//!   memory (converted to f32, padded by 4 floats per row), then every thread accumulates its
//!   `tm × tn` micro-tile from 16-byte shared loads. Grid: `(⌈M/bm⌉, ⌈N/bn⌉, batch)`. Default
//!   64×64×16 with 4×4 micro-tiles: 256 threads, 8.5 KiB of shared memory.
//! - [`SmallMSchedule`]: a GEMV / small-M GEMM on CUDA cores for decode (M = 1, f32, and
//!   where the flat tensor-core GEMM cannot read the layouts; M ≤ 16). `lanes` threads cooperate
//!   on one output column n for `rows` rows at once: when B is K-contiguous (the `[N, K]`
//!   weight with `transpose_b`, the LLM case) a warp splits K, reads 16-byte vectors of A and B
//!   where alignment and extent are proven, and reduces with `shfl.sync.bfly`; when B is
//!   N-contiguous, one thread per column walks K so that a warp's loads of B coalesce. Grid:
//!   `(⌈N/columns⌉, ⌈M/rows⌉, batch)`. Every weight byte is read once per `rows` rows, which is
//!   what decode (memory-bound) needs; FlashDecoding++ (Hong et al. 2023, arXiv 2311.01282,
//!   §4) motivates the flat-GEMM split.
//!
//! **Block-quantized weights** (`q8_0`, `q4_1`: GGUF blocks of 32 along K, see
//! [`sinter_ir::DType::Q4_1`]): a B operand that is `dequantize(w)` of a `[N, K]` kernel
//! input read with `transpose_b` (the GGUF layout; the passes fuse it at a constant M ≤ 16,
//! `sinter_passes::contract::quantized_b`) is read as stored and dequantised in registers
//! (`crate::quant`), each value rounded to the `dequantize` dtype as the unfused graph
//! rounds it, products accumulated in f32. Two schedules:
//! - [`QuantMmaSchedule`] (bf16/f16 activations, direct epilogue, 2 ≤ M ≤ 16: the default): a
//!   warp per 8 weight rows loads exactly the bytes its lanes' `mma.m16n8k16` B fragments
//!   need (`q4_1`: the `d`/`m` word and two 16-bit quant pairs a lane per block, whose low
//!   and high nibbles are the block's two k16 steps; `q8_0`: `d` and four pairs) — no shared
//!   memory for the weights, so each weight byte crosses DRAM → registers once — while the
//!   CTA stages the activations (padded to 16 rows) in shared memory per 256-element step;
//!   the 16·N·K FLOPs of a 16-row decode batch run on tensor cores, not CUDA cores.
//! - the small-M kernel with `lanes = 32` (one row — decode at batch 1 —, f32 activations, columns/paired epilogues —
//!   RoPE, SwiGLU —, or as a schedule to compare): lane `l` of a column's warp streams
//!   blocks `l, l+32, …` with 4-byte loads (`q8_0`'s 34-byte blocks are 2-byte aligned: eight
//!   aligned words and two 16-bit loads, funnel-shifted), so a warp reads 640 (`q4_1`) or
//!   1088 (`q8_0`) contiguous bytes a step.
//!
//! Where neither applies (a symbolic M, B not `[N, K]`), the passes write the dequantised
//! weight to a buffer and the bf16 kernels read it.
//!
//! On sm_90a the tensor-core GEMM runs on warpgroup MMAs where A and B are K-major
//! ([`MatmulSchedule::Wgmma`], [`build_wgmma`]: the same `cp.async` pipeline into
//! 128-byte-swizzled slabs, `wgmma.mma_async` reading both from shared memory).
//!
//! **fp8** (`f8e4m3`, issue #8): a matmul of `dequantize_fp8(a8, sa)` and
//! `dequantize_fp8(b8, sb)` — `a8 [..., M, K]` and `b8 [N, K]` read with `transpose_b`, both
//! K-major, `sa`/`sb` f32 scalars (`f32[]` kernel inputs or constants), the `dequantize_fp8`
//! dtype (bf16, f16, f32) the result's (`sinter_passes::contract::fp8_matmul` forms such
//! kernels) — runs on the Hopper kernel with e4m3 operands (sm_90a only; PTX ISA §9.7.15.5
//! `wgmma.mma_async.sync.aligned.m64nNk32.f32.e4m3.e4m3`): the fp8 bytes are copied as stored
//! (a 16-byte chunk is 16 elements, so M/N/K rows must be multiples of 16 bytes: K a multiple
//! of 16), a K tile is 128 elements (one 128-byte swizzle row, the byte geometry of bf16's 64),
//! each `wgmma` covers 32 of K, the f32 accumulators are multiplied by `sa · sb` and the
//! epilogue is the shared one (bias, activation, cast, …: any the bf16 kernel takes). Its
//! schedule names read `wgmma 128x256x128 s4 f1` (the K tile of 128 tells it from bf16's 64).
//! On sm_80/sm_90, under any other schedule, or with one fp8 operand only, the generator
//! refuses the kernel (`Unsupported`, naming f8e4m3); fp8 in the epilogue (an fp8 result, a
//! `quantize_fp8`) is refused before the generator runs (`refuse_fp8` in `lib.rs`); the unfused
//! lowering, whose `dequantize_fp8`/`quantize_fp8` are element-wise kernels, runs anywhere. Numerics: the e4m3 products are exact and accumulate in f32,
//! scaled once — as `torch._scaled_mm` computes — whereas the unfused graph rounds each
//! dequantised operand to its dtype first (see [`build_wgmma`]).
//!
//! [`choose_schedule`] picks among them by shape and dtype: a constant M in 2..=16 of bf16/f16
//! gets the flat tensor-core GEMM (the small-M kernel where its layouts do not allow the
//! 16-byte copies); M = 1 (pure weight bandwidth: the GEMV reads the weight with more CTAs)
//! and f32 at a constant M ≤ 16 get the small-M kernel; anything else (a symbolic M
//! included) the tensor-core kernel for bf16/f16 and the tiled one for f32. The small-M kernel takes every epilogue mode: for a paired epilogue each
//! group computes the n-th column of every segment (SwiGLU of a merged gate/up projection from
//! two dot products); for a columns epilogue it computes its column and the column's RoPE
//! partner in the head (n ± d/2, or n xor 1 for the interleaved form), stages them in its slice
//! of shared memory at their place in the head, and the epilogue (RoPE, the `kv_append`
//! scatter) reads R there. The tensor-core and tiled kernels take them too: a direct epilogue
//! is evaluated from the registers (the tensor-core kernel evaluates each thread's two
//! adjacent columns as two lanes, so epilogue loads and output stores are vectors where the
//! layouts allow), a columns or paired one from the CTA's tile staged in shared memory (rows
//! padded by 8 elements in the tensor-core kernel), with a tile a multiple of the RoPE head.
//!
//! # Tests
//! Every kernel is assembled by ptxas for sm_80 and sm_90a (no spills; the resource lines are
//! insta snapshots), and run on the CPU against the interpreter by an emulator (`emu`, test
//! only) that JIT-compiles the kernel's LLVM IR for the host and runs each CTA's threads as OS
//! threads, barriers, shuffles and the tensor-core instructions emulated (`cp.async` copies
//! land when a `wait_group` needs them; `ldmatrix` and `mma` exchange the warp's operands as
//! the PTX ISA lays them out): tails, batches, epilogues, NaN and ±inf, both B layouts.

use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{Attr, DType, Dim, Family, Function, GridDim, Kernel, KernelGraph, LaunchPlan, Layout, OpKind, TensorMap, Value, ValueDef};

use sinter_ir::epilogue::{self, MatmulEpilogue as Epi};

use self::kit::{broadcast_strides, buffer_infos, dims_of, input_view, BufInfo, Kit, SharedKind, R};
use super::element::{At, Ax, Buf, Eval, Scalar, Tag};
use super::KernelCtx;
use crate::target::Target;
use crate::CodegenError;

/// The shared-memory tiled CUDA-core schedule (see the module docs).
///
/// Constraints: `bm % tm == 0`, `bn % tn == 0`, `tm, tn ∈ {1, 2, 4}`, the thread count
/// `(bm/tm)·(bn/tn)` a multiple of 32 and at most 1024, and `bm·bk` and `bk·bn` multiples of
/// it (every thread stages the same number of elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TiledSchedule {
    /// Rows of C per CTA.
    pub bm: u32,
    /// Columns of C per CTA.
    pub bn: u32,
    /// K elements staged in shared memory per step.
    pub bk: u32,
    /// Rows of each thread's register micro-tile.
    pub tm: u32,
    /// Columns of each thread's register micro-tile.
    pub tn: u32,
}

impl TiledSchedule {
    /// 64×64×16 with 4×4 micro-tiles: 256 threads, 8.5 KiB of shared memory.
    pub const DEFAULT: TiledSchedule = TiledSchedule { bm: 64, bn: 64, bk: 16, tm: 4, tn: 4 };

    /// Threads per CTA: `(bm/tm)·(bn/tn)`.
    pub fn threads(&self) -> u32 {
        (self.bm / self.tm.max(1)) * (self.bn / self.tn.max(1))
    }

    /// Shared memory per CTA in bytes: both f32 slabs, rows padded by 4 floats, the B slab
    /// starting 16-byte aligned.
    pub fn shared_bytes(&self) -> u32 {
        self.b_slab_offset() + 4 * self.bk * (self.bn + PAD)
    }

    /// Byte offset of the B slab in shared memory.
    fn b_slab_offset(&self) -> u32 {
        (4 * self.bk * (self.bm + PAD)).div_ceil(16) * 16
    }

    fn check(&self) -> Result<(), String> {
        let t = self.threads();
        let ok = self.tm > 0
            && self.tn > 0
            && matches!(self.tm, 1 | 2 | 4)
            && matches!(self.tn, 1 | 2 | 4)
            && self.bk > 0
            && self.bm % self.tm == 0
            && self.bn % self.tn == 0
            && t % 32 == 0
            && t > 0
            && t <= 1024
            && (self.bm * self.bk) % t == 0
            && (self.bk * self.bn) % t == 0
            && self.shared_bytes() <= 48 * 1024;
        if ok {
            Ok(())
        } else {
            Err(format!("invalid tiled matmul schedule {self:?}"))
        }
    }
}

/// The small-M (GEMV / flat GEMM) schedule (see the module docs).
///
/// Constraints: `lanes` a power of two ≤ 32, `lanes · columns` a multiple of 32 and at most
/// 1024, `1 ≤ rows ≤ 16`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SmallMSchedule {
    /// Rows of C (M) one CTA computes; every B element it reads is used for all of them.
    pub rows: u32,
    /// Threads per output column (they split K and reduce with shuffles).
    pub lanes: u32,
    /// Output columns per CTA.
    pub columns: u32,
}

impl SmallMSchedule {
    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        self.lanes * self.columns
    }

    fn check(&self) -> Result<(), String> {
        let t = self.threads();
        let ok = self.lanes.is_power_of_two()
            && self.lanes <= 32
            && self.columns > 0
            && t % 32 == 0
            && t <= 1024
            && (1..=16).contains(&self.rows);
        if ok {
            Ok(())
        } else {
            Err(format!("invalid small-M matmul schedule {self:?}"))
        }
    }
}

/// The tensor-core schedule (see the module docs): an Ampere-style GEMM on `mma.sync`.
///
/// A CTA of `warps_m × warps_n` warps computes a `bm × bn` tile of C; each warp a
/// `bm/warps_m × bn/warps_n` sub-tile as a grid of `m16n8k16` MMAs with f32 accumulators in
/// registers. A `stages`-deep `cp.async` pipeline brings `bm × bk` slabs of A and `bn × bk`
/// slabs of B into XOR-swizzled shared memory (dynamic, beyond 48 KiB where needed);
/// `ldmatrix.x4` loads the fragments. `group_m`: consecutive CTAs walk `group_m` row tiles
/// before moving to the next column tile, so the slabs they share stay in L2.
///
/// Constraints ([`MmaSchedule::check`]): warp tile sides powers of two, at least 16 × 16;
/// `bk` a multiple of 32 (32 or a multiple of 64 when K is the contiguous axis of an
/// operand: rows of 64 bytes or of whole 128-byte lines, which the swizzle needs); `2 ≤
/// stages ≤ 8`; at most 1024 threads; every thread copies the same number of 16-byte chunks.
/// The layouts the kernel reads (16-byte aligned chunks along a contiguous axis) are checked
/// per kernel; where they do not hold, the tiled schedule is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MmaSchedule {
    /// Rows of C per CTA.
    pub bm: u32,
    /// Columns of C per CTA.
    pub bn: u32,
    /// K elements per pipeline stage.
    pub bk: u32,
    /// Warps along M.
    pub warps_m: u32,
    /// Warps along N.
    pub warps_n: u32,
    /// Pipeline depth: stages of shared memory in flight.
    pub stages: u32,
    /// Row tiles per CTA raster group (1: plain row-major order).
    pub group_m: u32,
}

impl MmaSchedule {
    /// 128×256×64, 8 warps as 2×4 (64×64 warp tiles: 128 f32 accumulators per thread, 4 A and
    /// 4 B `ldmatrix.x4` per 32 MMAs), 3 stages (144 KiB of shared memory): the tile shape of
    /// cuBLAS's and CUTLASS's fastest sm_80 bf16 GEMMs
    /// (`…gemm_bf16…tilesize128x256x64_stage3_warpsize2x4x1_tensor16x8x16`), which keeps the
    /// tensor cores fed from one CTA per SM; L2 grouping of 16 row tiles.
    pub const DEFAULT: MmaSchedule = MmaSchedule { bm: 128, bn: 256, bk: 64, warps_m: 2, warps_n: 4, stages: 3, group_m: 16 };
    /// 128×128×64, 4 warps as 2×2 (the same 64×64 warp tile), 3 stages (96 KiB): for N that
    /// 256-column tiles would cover with more waste.
    pub const NARROW: MmaSchedule = MmaSchedule { bm: 128, bn: 128, bk: 64, warps_m: 2, warps_n: 2, stages: 3, group_m: 16 };
    /// The flat GEMM for decode-shaped products (M ≤ 16; FlashDecoding++, Hong et al. 2023,
    /// arXiv 2311.01282, §4): M padded to one `m16n8k16` row block (PTX ISA §9.7.14.5.14)
    /// instead of 64/128 rows, 16×32×256, 2 warps as 1×2 (16×16 warp tiles: 8 accumulators
    /// per thread, 2 MMAs per k-step), 4 stages (96 KiB of shared memory). See
    /// [`MmaSchedule::flat`] for the choice of the tile.
    pub const FLAT: MmaSchedule = MmaSchedule::flat(32);
    /// The Hopper schedule ([`MatmulSchedule::Wgmma`]): 128×256×64, two warpgroups of
    /// m64n256 products (128 f32 accumulators per thread), 4 stages (192 KiB of shared
    /// memory) — CUTLASS's sm90 bf16 tile shape.
    pub const WGMMA: MmaSchedule = MmaSchedule { bm: 128, bn: 256, bk: 64, warps_m: 8, warps_n: 1, stages: 4, group_m: 16 };

    /// The flat schedule with `bn` columns per CTA (32, 64, 128 or 256: a RoPE head of 64 or
    /// 128 needs the tile to be a multiple of it): `bm` 16, one warp row and `min(bn/16, 4)`
    /// warps along N (16×16 warp tiles up to 64 columns, then 32 or 64 wide), 4 stages, `bk`
    /// 256 for 32 columns, 128 for 64 and 128 columns, 64 beyond (shared memory `4·2·(16 +
    /// bn)·bk` ≤ 144 KiB, within sm_80's 163 KiB).
    ///
    /// Why these sizes: a decode GEMM is bound by the weight bytes, and without split-K the
    /// bytes a kernel has in flight are `N · bk · (stages − 1) · 2` whatever the tile width —
    /// so `bk` and `stages` are as large as the shared memory allows, and the tile is as
    /// narrow as the swizzle allows (32 columns: 64-byte rows of a `[K, N]` B slab) to spread
    /// a small N over as many CTAs as possible: 6 CTAs for SmolLM2-135M's K/V projection
    /// (N = 192), 18 for N = 576, 48 for N = 1536, 48 for its merged gate/up (2 × 1536
    /// columns, 16 of each half per CTA). Padding M to 16 costs tensor-core work only, which
    /// a decode GEMM has to spare.
    pub const fn flat(bn: u32) -> MmaSchedule {
        let warps_n = if bn / 16 < 4 { bn / 16 } else { 4 };
        let bk = if bn <= 32 {
            256
        } else if bn <= 128 {
            128
        } else {
            64
        };
        MmaSchedule { bm: 16, bn, bk, warps_m: 1, warps_n, stages: 4, group_m: 1 }
    }

    /// Threads per CTA: 32 per warp.
    pub fn threads(&self) -> u32 {
        32 * self.warps_m * self.warps_n
    }

    /// The warp tile `(rows, columns)`.
    pub fn warp_tile(&self) -> (u32, u32) {
        (self.bm / self.warps_m.max(1), self.bn / self.warps_n.max(1))
    }

    /// Shared memory of one pipeline stage in bytes: a `bm × bk` and a `bn × bk` slab of
    /// 16-bit elements.
    pub fn stage_bytes(&self) -> u32 {
        2 * (self.bm + self.bn) * self.bk
    }

    /// Checks the constraints above that do not depend on the kernel.
    ///
    /// # Errors
    /// A message naming the schedule.
    pub fn check(&self) -> Result<(), String> {
        let (wm, wn) = self.warp_tile();
        let t = self.threads();
        let ok = self.warps_m > 0
            && self.warps_n > 0
            && self.bm % self.warps_m == 0
            && self.bn % self.warps_n == 0
            && wm.is_power_of_two()
            && wn.is_power_of_two()
            && wm >= 16
            && wn >= 16
            && self.bk >= 32
            && self.bk % 32 == 0
            && (2..=8).contains(&self.stages)
            && self.group_m > 0
            && t <= 1024;
        if ok {
            Ok(())
        } else {
            Err(format!("invalid tensor-core matmul schedule {self:?}"))
        }
    }

    /// The default for a result of `n` columns whose tile width must be a multiple of
    /// `multiple` (a RoPE head, 1 otherwise): [`MmaSchedule::DEFAULT`], or
    /// [`MmaSchedule::NARROW`] where 128-column tiles cover a constant `n` with less waste
    /// (576 columns: 5 tiles of 128 instead of 3 of 256).
    pub fn for_columns(n: &Dim, multiple: u32) -> MmaSchedule {
        let narrow_fits = MmaSchedule::NARROW.bn % multiple.max(1) == 0;
        match n.as_const() {
            Some(n) if narrow_fits && n > 0 => {
                let cover = |bn: i64| (n + bn - 1) / bn * bn;
                if cover(128) < cover(256) {
                    MmaSchedule::NARROW
                } else {
                    MmaSchedule::DEFAULT
                }
            }
            _ => MmaSchedule::DEFAULT,
        }
    }
}

/// The Hopper GEMM's schedule ([`MatmulSchedule::Wgmma`], [`build_wgmma`]): the CTA tile and
/// pipeline (`tile`, as for [`MatmulSchedule::Mma`] with a warp per 16 rows) and how many of
/// a warpgroup's K-tile product groups stay in flight when it moves on (`in_flight`, 0 or 1:
/// PTX ISA §9.7.15.7 `wgmma.wait_group N`). With 1, a K tile's products overlap the next
/// tile's barrier and copies, and the copies run `stages − 2` tiles ahead (a stage is refilled
/// only when no warpgroup's products can still read it); with 0, `stages − 1` ahead.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct WgmmaSchedule {
    /// The CTA tile and pipeline depth.
    pub tile: MmaSchedule,
    /// Product groups a warpgroup leaves in flight (0 or 1).
    pub in_flight: u32,
    /// Load the stages with the Tensor Memory Accelerator ([`TmaLoads`]: one thread issues
    /// `cp.async.bulk.tensor` copies of A's and B's boxes from tensor maps, completing on a
    /// stage's mbarrier) instead of every thread's `cp.async` chunks ([`StageLoads`]).
    pub tma: bool,
    /// Warp specialisation ([`build_wgmma_ws`], needs `tma`): a third warpgroup, the
    /// producer, issues the TMA copies (after `setmaxnreg.dec` to [`WS_PRODUCER_REGS`]);
    /// the two consumer warpgroups (`setmaxnreg.inc` to [`WS_CONSUMER_REGS`]) wait on each
    /// stage's *full* mbarrier, compute, and free it on its *empty* mbarrier: no CTA-wide
    /// barrier in the main loop. 384 threads.
    pub specialized: bool,
    /// Persistent CTAs (with `specialized` only): 0 launches a CTA per output tile; `c > 0`
    /// launches `c` CTAs (the launch plan's grid is `[c, 1, 1]`, which must not exceed
    /// what fits on the device at once: one CTA per SM, so at most the SM count, 132 on an
    /// H100/H200 SXM) that loop over the output tiles `blockIdx.x + i·gridDim.x` in raster
    /// order, the pipeline running on across tiles.
    pub ctas: u32,
}

/// The producer warpgroup's registers per thread after `setmaxnreg.dec`
/// ([`WgmmaSchedule::specialized`]): it holds only the TMA coordinates and counters.
pub const WS_PRODUCER_REGS: u32 = 40;
/// The consumer warpgroups' registers per thread after `setmaxnreg.inc`: 128 accumulators
/// and the descriptors. 128·40 + 256·232 = 64512 ≤ 65536, the SM's register file; both
/// multiples of 8 (CUTLASS's sm90 warp-specialised split).
pub const WS_CONSUMER_REGS: u32 = 232;
/// Persistent CTAs of the candidate [`variants`] adds: the SM count of an H100/H200 SXM
/// (132) — the SM count is not known at code generation, and a grid of constant size is
/// what [`GridDim`] can express. On a device with fewer SMs the extra CTAs wait for a
/// second wave (correct, slower); with more, SMs idle.
pub const WS_PERSISTENT_CTAS: u32 = 132;

impl WgmmaSchedule {
    /// Threads per CTA: the tile's warpgroups, and the producer warpgroup when specialised.
    pub fn threads(&self) -> u32 {
        self.tile.threads() + if self.specialized { 128 } else { 0 }
    }

    /// [`MmaSchedule::WGMMA`] with one K tile's products in flight, loaded by the TMA where
    /// the operands allow tensor maps (H200, bf16 8192³, bench/RESULTS.md: 1404.6 µs = 782.8
    /// TFLOP/s = 1.13× cuBLAS with TMA, 1502.5 µs with every thread's cp.async; 4096³: 199.5
    /// against 206.7 µs; waiting for each tile's products: 1818.2 µs).
    pub const DEFAULT: WgmmaSchedule = WgmmaSchedule { tile: MmaSchedule::WGMMA, in_flight: 1, tma: true, specialized: false, ctas: 0 };
}

/// The tensor-core schedule of a matmul whose B operand is block-quantized (`q8_0`/`q4_1`,
/// `[N, K]`), for constant M ≤ 16 ([`build_quant_mma`]): each warp owns `tiles` column
/// tiles of 8 and reads their weight rows' blocks straight into the `mma.m16n8k16` B
/// fragments (dequantised in registers, no shared memory for the weights); the CTA stages
/// `chunk` K columns of the (≤ 16-row) activations in shared memory per step.
///
/// Constraints: `1 ≤ warps ≤ 32`, `tiles ≥ 1`, `chunk` a multiple of 32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QuantMmaSchedule {
    /// Warps per CTA.
    pub warps: u32,
    /// Column tiles of 8 per warp.
    pub tiles: u32,
    /// K elements per step (activation rows staged in shared memory).
    pub chunk: u32,
    /// Load the next step's weight words while the current step computes (register double
    /// buffering: twice the weight bytes in flight per warp, twice the registers for them).
    pub prefetch: bool,
}

impl QuantMmaSchedule {
    /// 4 warps of two 8-column tiles each (64 columns per CTA: 448 CTAs for N = 28672), 128
    /// K elements (4 blocks a row) per step with the next step prefetched: every warp keeps
    /// 8 blocks of each of its 16 rows in flight while it computes, and the CTA reads the
    /// activations once for 64 columns. On an H200 at M = 16, K 4096, N 28672 (autotuning,
    /// bench/RESULTS.md): q4_1 86.7 µs against 102.3 with 8 warps of one tile; q8_0 121.4
    /// against 135.5.
    pub const DEFAULT: QuantMmaSchedule = QuantMmaSchedule { warps: 4, tiles: 2, chunk: 128, prefetch: true };

    /// Threads per CTA.
    pub fn threads(&self) -> u32 {
        32 * self.warps
    }

    /// Output columns per CTA.
    pub fn columns(&self) -> u32 {
        8 * self.warps * self.tiles
    }

    /// Bytes of the staged activation tile: 16 rows of `chunk` 16-bit elements, padded by
    /// 8 elements a row (so the A fragment loads of a warp hit 32 different banks).
    pub fn shared_bytes(&self) -> u32 {
        16 * (self.chunk + 8) * 2
    }

    fn check(&self) -> Result<(), String> {
        if (1..=32).contains(&self.warps) && self.tiles >= 1 && self.chunk >= 32 && self.chunk % 32 == 0 && self.shared_bytes() <= 48 * 1024 {
            Ok(())
        } else {
            Err(format!("invalid quantized tensor-core schedule {self:?}"))
        }
    }
}

/// Which matmul kernel to generate, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulSchedule {
    /// Shared-memory tiled GEMM.
    Tiled(TiledSchedule),
    /// GEMV / small-M GEMM on CUDA cores.
    SmallM(SmallMSchedule),
    /// Tensor-core GEMM (`cp.async`, `ldmatrix`, `mma.sync`).
    Mma(MmaSchedule),
    /// Tensor-core small-M GEMM with a block-quantized B read into the fragments.
    QuantMma(QuantMmaSchedule),
    /// Hopper tensor-core GEMM (sm_90a: `cp.async` into 128-byte-swizzled slabs,
    /// `wgmma.mma_async` from shared memory, [`build_wgmma`]); the schedule's fields as for
    /// [`MatmulSchedule::Mma`], with `bk` one 128-byte row of the operands (64 bf16/f16
    /// elements; 128 for the fp8 matmul's `f8e4m3`), `bm` a multiple of 64, one warp per 16
    /// rows (`warps_m = bm/16`, `warps_n` 1) and `bn` ≤ 256. See [`MmaSchedule::WGMMA`] and
    /// [`WgmmaSchedule`]. The only schedule of an fp8 matmul.
    Wgmma(WgmmaSchedule),
}

/// Picks the schedule for a kernel whose matmul has `m` rows and `n` columns of `dtype`;
/// `b_k_contiguous` says whether B's contraction axis has stride 1 (a `[N, K]` weight read
/// with `transpose_b`).
///
/// Heuristic (the "heuristic dataflow" of FlashDecoding++, arXiv 2311.01282, §5: the kernel
/// by the shape of the product):
/// - a constant `m = 1` → [`MatmulSchedule::SmallM`] (the GEMV): one row is pure weight
///   bandwidth with nothing to reuse, and the GEMV reads a K-contiguous weight with the 32
///   lanes of a warp per column in 16-byte vectors over `⌈n/4⌉` CTAs, more CTAs (bytes in
///   flight) than the flat GEMM's `⌈n/32⌉` without split-K;
/// - a constant `m` in `2..=16` with bf16/f16 operands → the flat tensor-core GEMM
///   ([`MmaSchedule::FLAT`]: M padded to 16, not 128); where the kernel's layouts do not
///   allow its 16-byte copies, or for f32, the GEMV/flat CUDA-core kernel
///   [`MatmulSchedule::SmallM`] with `rows = m` (a warp per column when B is K-contiguous,
///   four columns per CTA; else a thread per column, 128 columns per CTA);
/// - otherwise (a symbolic `m` such as the token count included) bf16 and f16 operands get
///   the tensor cores ([`MmaSchedule::for_columns`]) and f32 ones [`TiledSchedule::DEFAULT`];
///   the generator falls back from the tensor-core schedule to the tiled one where a
///   kernel's layouts do not allow its 16-byte copies ([`generate`]).
pub fn choose_schedule(m: &Dim, n: &Dim, dtype: DType, b_k_contiguous: bool) -> MatmulSchedule {
    let tensor_cores = matches!(dtype, DType::BF16 | DType::F16);
    match m.as_const() {
        Some(rows) if (2..=16).contains(&rows) && tensor_cores => MatmulSchedule::Mma(MmaSchedule::FLAT),
        Some(rows) if (1..=16).contains(&rows) => MatmulSchedule::SmallM(small_m_schedule(rows as u32, b_k_contiguous)),
        _ if tensor_cores => MatmulSchedule::Mma(MmaSchedule::for_columns(n, 1)),
        _ => MatmulSchedule::Tiled(TiledSchedule::DEFAULT),
    }
}

/// The small-M schedule for `rows` rows: a warp per column and four columns per CTA when B
/// is K-contiguous, else a thread per column and 128 columns per CTA.
fn small_m_schedule(rows: u32, b_k_contiguous: bool) -> SmallMSchedule {
    SmallMSchedule { rows, lanes: if b_k_contiguous { 32 } else { 1 }, columns: if b_k_contiguous { 4 } else { 128 } }
}

/// Generates the PTX and launch plan of matmul kernel `kernel` of `graph` with the schedule
/// [`choose_schedule`] picks.
///
/// Parameters: the kernel's buffers (inputs then outputs), then one i64 per symbolic dim the
/// kernel needs. Block and grid: see [`MmaSchedule`] / [`TiledSchedule`] / [`SmallMSchedule`];
/// the tensor-core kernel uses dynamic shared memory (the plan's `shared_bytes`, beyond 48 KiB
/// at the default schedule: the runtime opts in), the others static shared memory only.
///
/// # Errors
/// [`CodegenError::Unsupported`] when the body is not one `matmul` of float kernel inputs
/// followed by an epilogue the element evaluator supports, or when an output does not have
/// the matmul's shape; LLVM and target errors otherwise.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let spec = Spec::analyse(graph, kernel)?;
    let schedule = spec.default_schedule(target);
    generate_spec(&spec, target, &schedule)
}

/// As [`generate`], with the schedule given (for autotuning and tests). Every schedule is
/// correct for every shape it accepts ([`MatmulSchedule::SmallM`] covers M with `⌈M/rows⌉`
/// CTAs along y, so it is merely slow for a large M; [`MatmulSchedule::Mma`] needs bf16/f16
/// operands whose layouts allow 16-byte copies).
///
/// # Errors
/// As [`generate`], and [`CodegenError::Unsupported`] for a schedule that breaks its
/// constraints.
pub fn generate_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &MatmulSchedule) -> Result<LaunchPlan, CodegenError> {
    let spec = Spec::analyse(graph, kernel)?;
    generate_spec(&spec, target, schedule)
}

/// The schedule candidates of matmul `kernel` for autotuning ([`crate::schedule_variants`]):
/// [`generate`]'s schedule first, then, for a tensor-core kernel, the other CTA tiles —
/// [`MmaSchedule::DEFAULT`] and [`MmaSchedule::NARROW`], or for a flat GEMM (M ≤ 16) the flat
/// tiles of 32, 64 and 128 columns ([`MmaSchedule::flat`]); for a quantized B read on tensor
/// cores, other [`QuantMmaSchedule`]s and the quantized small-M kernel — each with its
/// [`MatmulSchedule::name`] and a closure that compiles it (an alternative the kernel's layouts
/// or epilogue do not accept fails there with [`CodegenError::Unsupported`]). An fp8 matmul
/// has the wgmma tiles only.
///
/// # Errors
/// As [`generate`], when the kernel cannot be analysed or is an fp8 matmul the target's wgmma
/// kernel does not take.
pub fn variants<'a>(graph: &'a KernelGraph, kernel: Kernel, target: &'a Target) -> Result<Vec<crate::Candidate<'a>>, CodegenError> {
    let spec = std::rc::Rc::new(Spec::analyse(graph, kernel)?);
    let default = spec.default_schedule(target);
    if let (Some(_), MatmulSchedule::Wgmma(w)) = (spec.fp8, default) {
        // The fp8 matmul has no schedule where wgmma does not take it (sm_80, sm_90): no
        // candidates to name either.
        spec.wgmma_plan(&w.tile, target).map_err(|e| unsupported(&spec.kernel_name, e))?;
    }
    let mut scheds = vec![default];
    if let MatmulSchedule::Mma(d) = default {
        let alts: Vec<MmaSchedule> = if d.bm == 16 { [32, 64, 128].into_iter().map(MmaSchedule::flat).collect() } else { vec![MmaSchedule::DEFAULT, MmaSchedule::NARROW] };
        scheds.extend(alts.into_iter().map(MatmulSchedule::Mma).filter(|a| *a != default));
        if d.bm != 16 && spec.wgmma_plan(&MmaSchedule::WGMMA, target).is_ok() {
            scheds.push(MatmulSchedule::Wgmma(WgmmaSchedule { tma: false, ..WgmmaSchedule::DEFAULT }));
        }
    }
    if let MatmulSchedule::Wgmma(d) = default {
        // TMA and cp.async loads (TMA where tensor maps fit: 16-bit operands), the other
        // Hopper tile width (with the default's K tile: 64 bf16/f16, 128 e4m3 elements), then
        // the `mma.sync` kernels (not for fp8 operands).
        let base = WgmmaSchedule { tile: MmaSchedule { bk: d.tile.bk, ..MmaSchedule::WGMMA }, ..WgmmaSchedule::DEFAULT };
        let narrow = WgmmaSchedule { tile: MmaSchedule { bn: 128, ..base.tile }, ..base };
        let waiting = WgmmaSchedule { in_flight: 0, ..base };
        let chunks = |w: WgmmaSchedule| WgmmaSchedule { tma: false, ..w };
        // Warp-specialised (TMA, direct epilogue only), one CTA per tile and persistent.
        let ws = WgmmaSchedule { specialized: true, ..base };
        let persistent = WgmmaSchedule { ctas: WS_PERSISTENT_CTAS, ..ws };
        let mut wg = vec![base, chunks(base), chunks(waiting), narrow, chunks(narrow)];
        if spec.ws_ok(&ws).is_ok() {
            wg.extend([ws, persistent]);
        }
        let mut alts: Vec<MatmulSchedule> = wg.into_iter().filter(|w| !w.tma || spec.tma_maps(&w.tile).is_ok()).map(MatmulSchedule::Wgmma).collect();
        if spec.fp8.is_none() {
            alts.extend([MatmulSchedule::Mma(MmaSchedule::DEFAULT), MatmulSchedule::Mma(MmaSchedule::NARROW)]);
        }
        scheds.extend(alts.into_iter().filter(|a| *a != default));
    }
    if spec.b_quant.is_some() {
        // Quantized weights: other step lengths and warp shapes, with and without the
        // prefetch, and the small-M kernel streaming whole blocks per lane.
        let alts = [
            QuantMmaSchedule::DEFAULT,
            QuantMmaSchedule { warps: 8, tiles: 1, chunk: 128, prefetch: true },
            QuantMmaSchedule { warps: 8, tiles: 1, chunk: 256, prefetch: false },
            QuantMmaSchedule { warps: 8, tiles: 1, chunk: 256, prefetch: true },
            QuantMmaSchedule { warps: 4, tiles: 2, chunk: 128, prefetch: true },
            QuantMmaSchedule { warps: 4, tiles: 1, chunk: 64, prefetch: true },
        ];
        scheds.extend(alts.into_iter().map(MatmulSchedule::QuantMma).filter(|a| *a != default));
        let rows = spec.m.as_const().map_or(16, |m| m.clamp(1, 16)) as u32;
        let gemv = MatmulSchedule::SmallM(small_m_schedule(rows, true));
        if gemv != default {
            scheds.push(gemv);
        }
    }
    Ok(scheds
        .into_iter()
        .map(|sc| {
            let spec = spec.clone();
            let build: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || generate_spec(&spec, target, &sc));
            (sc.name(), build)
        })
        .collect())
}

impl MatmulSchedule {
    /// A short, stable name (`mma 128x256x64 w2x4 s3`, `gemv r1 l32 c4`, `tiled 64x64x16
    /// t4x4`): part of an autotuned variant's cache key, and what `sinter explain` shows.
    pub fn name(&self) -> String {
        match self {
            MatmulSchedule::Mma(s) => format!("mma {}x{}x{} w{}x{} s{}", s.bm, s.bn, s.bk, s.warps_m, s.warps_n, s.stages),
            MatmulSchedule::SmallM(s) => format!("gemv r{} l{} c{}", s.rows, s.lanes, s.columns),
            MatmulSchedule::Tiled(s) => format!("tiled {}x{}x{} t{}x{}", s.bm, s.bn, s.bk, s.tm, s.tn),
            MatmulSchedule::QuantMma(s) => format!("qmma w{} t{} k{}{}", s.warps, s.tiles, s.chunk, if s.prefetch { " prefetch" } else { "" }),
            MatmulSchedule::Wgmma(w) => format!(
                "wgmma {}x{}x{} s{}{}{}{}{}",
                w.tile.bm,
                w.tile.bn,
                w.tile.bk,
                w.tile.stages,
                if w.in_flight > 0 { format!(" f{}", w.in_flight) } else { String::new() },
                if w.tma { " tma" } else { "" },
                if w.specialized { " ws" } else { "" },
                if w.ctas > 0 { format!(" p{}", w.ctas) } else { String::new() }
            ),
        }
    }
}

fn generate_spec(spec: &Spec, target: &Target, schedule: &MatmulSchedule) -> Result<LaunchPlan, CodegenError> {
    let (tag, check, threads) = match schedule {
        MatmulSchedule::Tiled(s) => ("matmul", s.check().and_then(|()| spec.fits(s)), s.threads()),
        MatmulSchedule::SmallM(s) => ("matmul_small_m", s.check(), s.threads()),
        MatmulSchedule::Mma(s) => ("matmul_mma", s.check().and_then(|()| spec.mma_plan(s, target).map(|_| ())), s.threads()),
        MatmulSchedule::QuantMma(s) => ("matmul_mma_q", s.check().and_then(|()| spec.quant_mma_ok()), s.threads()),
        MatmulSchedule::Wgmma(w) => (
            "matmul_wgmma",
            w.tile
                .check()
                .and_then(|()| if w.in_flight <= 1 { Ok(()) } else { Err(format!("{w:?}: at most one product group in flight")) })
                .and_then(|()| spec.wgmma_plan(&w.tile, target).map(|_| ()))
                .and_then(|()| if w.tma { spec.tma_maps(&w.tile).map(|_| ()) } else { Ok(()) })
                .and_then(|()| spec.ws_ok(w)),
            w.threads(),
        ),
    };
    check.map_err(|reason| unsupported(&spec.kernel_name, reason))?;
    if spec.fp8.is_some() && !matches!(schedule, MatmulSchedule::Wgmma(_)) {
        return Err(unsupported(&spec.kernel_name, crate::fp8_message(&format!("f8e4m3 matmul: schedule `{}`", schedule.name()))));
    }
    let quant_ok = match schedule {
        MatmulSchedule::SmallM(s) => s.lanes == 32,
        MatmulSchedule::QuantMma(_) => true,
        _ => false,
    };
    if let (Some(q), false) = (spec.b_quant, quant_ok) {
        return Err(unsupported(&spec.kernel_name, format!("a {q} B operand is read by the quantized schedules only, not {schedule:?}")));
    }
    let tag = if spec.b_quant.is_some() && matches!(schedule, MatmulSchedule::SmallM(_)) { "matmul_small_m_q" } else { tag };
    let tag = if spec.fp8.is_some() { "matmul_wgmma_e4m3" } else { tag };
    let entry = format!("{}_{tag}", spec.kernel_name);
    let ctx = Context::create();
    let n_outputs = spec.n_buffers - spec.n_inputs;
    let maps = match schedule {
        MatmulSchedule::Wgmma(w) if w.tma => spec.tma_maps(&w.tile).map_err(|e| unsupported(&spec.kernel_name, e))?,
        _ => Vec::new(),
    };
    let (ptx, params) = Kit::build_with_maps(&ctx, &entry, *target, (spec.n_inputs, n_outputs), &maps, &spec.all_dims, threads, |kit| match schedule {
        MatmulSchedule::Tiled(s) => build_tiled(kit, spec, s),
        MatmulSchedule::SmallM(s) => build_small_m(kit, spec, s),
        MatmulSchedule::Mma(s) => build_mma(kit, spec, s, &spec.mma_plan(s, target).map_err(|e| kit.err(e))?),
        MatmulSchedule::QuantMma(s) => build_quant_mma(kit, spec, s),
        MatmulSchedule::Wgmma(w) => build_wgmma(kit, spec, w, &spec.wgmma_plan(&w.tile, target).map_err(|e| kit.err(e))?),
    })?;
    let batch = GridDim { numerator: Dim::product(&spec.batch), denominator: 1 };
    // Tiled and tensor-core kernels: a CTA per (row tile, column tile, batch).
    let tiles = |bm: u32, bn: u32| {
        // Paired: a CTA covers bn / segments output columns.
        let cols = match &spec.epi {
            Epi::Paired { segs, width, .. } => GridDim { numerator: width.clone(), denominator: bn / segs.len() as u32 },
            _ => GridDim { numerator: spec.n.clone(), denominator: bn },
        };
        [GridDim { numerator: spec.m.clone(), denominator: bm }, cols, batch.clone()]
    };
    let (grid, shared_bytes) = match schedule {
        MatmulSchedule::Tiled(s) => (tiles(s.bm, s.bn), 0),
        MatmulSchedule::Mma(s) => (tiles(s.bm, s.bn), spec.mma_plan(s, target).map_err(|e| unsupported(&spec.kernel_name, e))?.smem_bytes),
        MatmulSchedule::Wgmma(w) => (if w.ctas > 0 { [GridDim::fixed(w.ctas), GridDim::fixed(1), GridDim::fixed(1)] } else { tiles(w.tile.bm, w.tile.bn) }, spec.wgmma_plan(&w.tile, target).map_err(|e| unsupported(&spec.kernel_name, e))?.smem_bytes),
        MatmulSchedule::QuantMma(s) => ([GridDim { numerator: spec.n.clone(), denominator: s.columns() }, GridDim { numerator: spec.m.clone(), denominator: 16 }, batch], 0),
        MatmulSchedule::SmallM(s) => {
            let cols = match &spec.epi {
                Epi::Paired { width, .. } => width.clone(),
                _ => spec.n.clone(),
            };
            ([GridDim { numerator: cols, denominator: s.columns }, GridDim { numerator: spec.m.clone(), denominator: s.rows }, batch], 0)
        }
    };
    Ok(LaunchPlan { entry, ptx, target: *target, grid, block: [threads, 1, 1], shared_bytes, params })
}

/// When `v` is `dequantize` of a block-quantized kernel input: `Ok((parameter, dtype))`, or
/// why the kernel cannot read it as blocks; `None` when `v` is something else.
fn quantized_operand(body: &Function, v: Value, buffers: &[BufInfo]) -> Option<Result<(usize, DType), String>> {
    let ValueDef::Result(n, _) = body.values.get(v)?.def else { return None };
    let nd = body.nodes.get(n)?;
    if nd.op.kind != OpKind::Dequantize {
        return None;
    }
    let w = *nd.inputs.first()?;
    let q = body.ty(w).dtype;
    Some(match body.values[w].def {
        ValueDef::Param(i) if q.is_quantized() && buffers.get(i).is_some_and(|b| b.dtype == q) => Ok((i, q)),
        _ => Err(format!("`dequantize` of {} that is not a {q} kernel input", body.label(w))),
    })
}

/// The error for a kernel this family cannot generate (`kernel` is `k3`).
fn unsupported(kernel: &str, reason: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported { kernel: format!("{kernel} (Matmul)"), message: reason.into() }
}

/// Row padding of the shared-memory slabs, in f32s (keeps rows 16-byte aligned).
const PAD: u32 = 4;

/// One matmul operand: kernel parameter, dtype, element offset (a view of the buffer), the
/// strides of its batch axes as seen from the output's batch axes (0 where broadcast), and
/// the strides of its two matrix axes.
#[derive(Clone, Debug)]
struct MatOperand {
    buffer: usize,
    dtype: DType,
    offset: Dim,
    batch_strides: Vec<Dim>,
    /// Stride of the non-contracted axis (A: m, B: n).
    outer: Dim,
    /// Stride of the contracted axis (k).
    ks: Dim,
    /// Alignment of the buffer's base, bytes.
    align: u32,
}

impl MatOperand {
    /// Whether `c` consecutive k-elements can be one aligned vector load at every k that is a
    /// multiple of `c`: k is contiguous, the offset and every other stride are multiples of
    /// `c`, the base is aligned to the vector's bytes.
    fn vector_ok(&self, c: u32) -> bool {
        let c64 = i64::from(c);
        self.ks.as_const() == Some(1)
            && self.outer.div_exact(c64).is_some()
            && self.offset.div_exact(c64).is_some()
            && self.batch_strides.iter().all(|s| s.div_exact(c64).is_some())
            && self.align >= c * self.dtype.size_bytes() as u32
    }

    /// Whether a 16-bit or 8-bit operand can be copied in 16-byte chunks (8 or 16 elements,
    /// [`MatOperand::per_chunk`]) along its K axis (`k_contig`) or its outer axis, each chunk
    /// starting at a multiple of its element count and 16-byte aligned: that axis has stride
    /// 1; the other stride, the offset and every batch stride are provably multiples of the
    /// chunk's elements; the base is 16-byte aligned.
    fn chunks_ok(&self, k_contig: bool) -> bool {
        let (unit, other) = if k_contig { (&self.ks, &self.outer) } else { (&self.outer, &self.ks) };
        let Some(e) = self.per_chunk() else { return false };
        unit.as_const() == Some(1)
            && other.div_exact(e).is_some()
            && self.offset.div_exact(e).is_some()
            && self.batch_strides.iter().all(|s| s.div_exact(e).is_some())
            && self.align >= 16
    }

    /// Elements per 16-byte chunk: 8 of a 16-bit dtype, 16 of `f8e4m3`; `None` for the rest.
    fn per_chunk(&self) -> Option<i64> {
        match self.dtype {
            DType::BF16 | DType::F16 => Some(8),
            DType::F8E4M3 => Some(16),
            _ => None,
        }
    }
}

/// Where an fp8 operand's scale (an f32 scalar, `f32[]`) comes from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(super) enum Fp8Scale {
    /// Kernel input `i`.
    Buffer(usize),
    /// A constant of the body (its value rounded to f32, as the interpreter rounds it).
    Const(f32),
}

/// When `v` is `dequantize_fp8(x8, scale)`: `Ok((x8, scale))` for an `x8` and a scale the fp8
/// kernel reads (`x8` is checked with the operand's views; the scale is an f32 kernel input
/// or a constant), or why it cannot read them; `None` when `v` is something else.
pub(super) fn fp8_operand(body: &Function, v: Value, buffers: &[BufInfo]) -> Option<Result<(Value, Fp8Scale), String>> {
    let ValueDef::Result(n, _) = body.values.get(v)?.def else { return None };
    let nd = body.nodes.get(n)?;
    if nd.op.kind != OpKind::DequantizeFp8 {
        return None;
    }
    let [x8, scale] = nd.inputs[..] else { return Some(Err(format!("`dequantize_fp8` {} needs two operands", body.label(v)))) };
    let scale_def = body.values.get(scale).map(|d| d.def.clone());
    let scale = match scale_def {
        Some(ValueDef::Param(i)) if buffers.get(i).is_some_and(|b| b.dtype == DType::F32) => Fp8Scale::Buffer(i),
        Some(ValueDef::Result(c, _)) if body.nodes.get(c).is_some_and(|c| c.op.kind == OpKind::Constant) => match body.nodes[c].op.float("value") {
            Some(x) => Fp8Scale::Const(x as f32),
            None => return Some(Err(format!("the scale {} of `dequantize_fp8` is not a float constant", body.label(scale)))),
        },
        _ => return Some(Err(format!("the scale {} of `dequantize_fp8` is neither an f32 kernel input nor a constant", body.label(scale)))),
    };
    Some(Ok((x8, scale)))
}

/// What the generators need to know about a matmul kernel.
struct Spec {
    kernel_name: String,
    n_inputs: usize,
    n_buffers: usize,
    /// Dtype of the matmul's result (and operands).
    dtype: DType,
    a: MatOperand,
    b: MatOperand,
    /// B is `dequantize` of a block-quantized kernel input (`q8_0`/`q4_1`, `[N, K]` read with
    /// `transpose_b`): its blocks are read as stored and dequantised in registers
    /// ([`MatOperand`] `b` then describes the quantized buffer in elements).
    b_quant: Option<DType>,
    /// Both operands are `dequantize_fp8(x8, scale)` of `f8e4m3` kernel inputs (A `[.., M, K]`,
    /// B `[N, K]` with `transpose_b`): the fp8 matmul of issue #8. [`MatOperand`] `a` and `b`
    /// then describe the `f8e4m3` buffers (one byte an element), read as stored by the wgmma
    /// kernel, and the f32 accumulators are multiplied by `scale_a · scale_b` before the
    /// epilogue.
    fp8: Option<[Fp8Scale; 2]>,
    m: Dim,
    n: Dim,
    k: Dim,
    /// The output's batch axes.
    batch: Vec<Dim>,
    /// How the epilogue reads the result.
    epi: Epi,
    /// The body with the values the epilogue reads the result through turned into more
    /// parameters after the kernel inputs: the matmul's result (Direct, Columns) or each
    /// segment's slice (Paired, in `slices` order). The element evaluator computes every
    /// output from them, the kernel inputs and constants.
    epilogue: Function,
    /// Every buffer, inputs then outputs.
    buffers: Vec<BufInfo>,
    /// Every dim the kernel may read at run time (a superset: all shapes, strides and
    /// attribute dims of the body, the views' offsets).
    all_dims: Vec<Dim>,
}

impl Spec {
    fn analyse(graph: &KernelGraph, kernel: Kernel) -> R<Spec> {
        let name = kernel.to_string();
        let no = |reason: String| unsupported(&name, reason);
        // The shared checks: the body's signature matches the buffers, strides fit ranks,
        // every value a node names exists.
        let kd = KernelCtx::new(graph, kernel)?.data;
        if kd.family != Family::Matmul {
            return Err(CodegenError::BadKernel { kernel: format!("{name} ({:?})", kd.family), message: "not a Matmul kernel".into() });
        }
        let body = &kd.body;
        let buffers = buffer_infos(graph, kd).map_err(&no)?;
        let mut all_dims: Vec<Dim> = Vec::new();
        for b in &buffers {
            all_dims.extend(b.shape.iter().cloned());
            all_dims.extend(b.strides.iter().cloned());
        }
        for (_, vd) in body.values.iter() {
            all_dims.extend(vd.ty.shape.iter().cloned());
            // The evaluator unravels reshapes through row-major strides and element counts.
            all_dims.extend(Layout::contiguous(&vd.ty.shape).strides);
            all_dims.push(Dim::product(&vd.ty.shape));
        }
        for (_, nd) in body.nodes.iter() {
            for a in &nd.op.attrs {
                match a {
                    Attr::Dim(d) => all_dims.push(d.clone()),
                    Attr::Dims(ds) => all_dims.extend(ds.iter().cloned()),
                    _ => {}
                }
            }
        }
        let mut mm = body.nodes.iter().filter(|(_, nd)| nd.op.kind == OpKind::Matmul);
        let (_, mnd) = mm.next().ok_or_else(|| no("the body has no matmul".into()))?;
        if mm.next().is_some() {
            return Err(no("the body has more than one matmul".into()));
        }
        let (av, bv, mm_out) = match (mnd.inputs.as_slice(), mnd.results.as_slice()) {
            ([a, b], [c]) => (*a, *b, *c),
            _ => return Err(no("matmul needs two operands and one result".into())),
        };
        let (at, bt) = (body.ty(av), body.ty(bv));
        let dtype = at.dtype;
        if !matches!(dtype, DType::BF16 | DType::F16 | DType::F32) || bt.dtype != dtype {
            return Err(no(format!("matmul operands must be bf16, f16 or f32 of one dtype, got {at} and {bt}")));
        }
        let ta = mnd.op.bool("transpose_a").unwrap_or(false);
        let tb = mnd.op.bool("transpose_b").unwrap_or(false);
        let out_ty = body.ty(mm_out).clone();
        let rank = out_ty.rank();
        if rank < 2 || at.rank() < 2 || bt.rank() < 2 || at.rank() > rank || bt.rank() > rank {
            return Err(no(format!("matmul {at} · {bt} → {out_ty}: operands need rank 2 to the result's rank")));
        }
        let (m, n) = (out_ty.shape[rank - 2].clone(), out_ty.shape[rank - 1].clone());
        let batch: Vec<Dim> = out_ty.shape[..rank - 2].to_vec();
        let ra = at.rank();
        let k = if ta { at.shape[ra - 2].clone() } else { at.shape[ra - 1].clone() };
        // The operands are kernel inputs, possibly through views (a reshape, a slice).
        let mat = |v: Value, ty: &sinter_ir::TensorType, transposed: bool, is_a: bool| -> R<MatOperand> {
            let view = input_view(body, v, &buffers).map_err(|e| no(format!("matmul operand: {e}")))?;
            let st = &view.strides;
            let r = ty.rank();
            // A [.., M, K]: outer = m-axis; B [.., K, N]: outer = n-axis. Transposes swap.
            let (s_rows, s_cols) = (st[r - 2].clone(), st[r - 1].clone());
            let (outer, ks) = match (is_a, transposed) {
                (true, false) | (false, true) => (s_rows, s_cols),
                (true, true) | (false, false) => (s_cols, s_rows),
            };
            let bs = broadcast_strides(&ty.shape[..r - 2], &st[..r - 2], rank - 2);
            let dtype = buffers.get(view.param).map_or(dtype, |b| b.dtype);
            Ok(MatOperand { buffer: view.param, dtype, offset: view.offset, batch_strides: bs, outer, ks, align: view.align })
        };
        // An fp8 matmul: both operands `dequantize_fp8` of f8e4m3 tensors, read as stored.
        let fp8 = match (fp8_operand(body, av, &buffers), fp8_operand(body, bv, &buffers)) {
            (None, None) => None,
            (Some(fa), Some(fb)) => {
                let ((a8, sa), (b8, sb)) = (fa.map_err(&no)?, fb.map_err(&no)?);
                if ta || !tb || bt.rank() != 2 {
                    return Err(no(format!(
                        "an f8e4m3 matmul reads A [.., M, K] and B [N, K] with transpose_b, both K-major as the fp8 tensor cores take them (got {at}, {bt}, transpose_a {ta}, transpose_b {tb})"
                    )));
                }
                let (a, b) = (mat(a8, body.ty(a8), false, true)?, mat(b8, body.ty(b8), true, false)?);
                if a.dtype != DType::F8E4M3 || b.dtype != DType::F8E4M3 {
                    return Err(no(format!("`dequantize_fp8` of {} and {}: not f8e4m3 kernel inputs", body.label(a8), body.label(b8))));
                }
                Some((a, b, [sa, sb]))
            }
            _ => return Err(no(crate::fp8_message("a matmul with one `dequantize_fp8` operand"))),
        };
        let a = match &fp8 {
            Some((a, _, _)) => a.clone(),
            None => mat(av, at, ta, true)?,
        };
        let (b, b_quant) = match (fp8.as_ref().map(|f| f.1.clone()), quantized_operand(body, bv, &buffers)) {
            (Some(b), _) => (b, None),
            (None, Some(w)) => {
                let (w, q) = w.map_err(&no)?;
                if !tb || ta || bt.rank() != 2 {
                    return Err(no(format!("a {q} weight is read as blocks only as a [N, K] B operand with transpose_b (got {bt}, transpose_a {ta}, transpose_b {tb})")));
                }
                let info = &buffers[w];
                if info.strides != Layout::contiguous(&info.shape).strides || info.align < 4 {
                    return Err(no(format!("the {q} weight must be a contiguous, 4-byte aligned buffer")));
                }
                let outer = info.strides[0].clone();
                (MatOperand { buffer: w, dtype, offset: Dim::constant(0), batch_strides: vec![Dim::constant(0); rank - 2], outer, ks: Dim::constant(1), align: info.align }, Some(q))
            }
            (None, None) => (mat(bv, bt, tb, false)?, None),
        };
        let fp8 = fp8.map(|(_, _, scales)| scales);
        for op in [&a, &b] {
            all_dims.extend(op.batch_strides.iter().cloned());
            all_dims.extend([op.offset.clone(), op.outer.clone(), op.ks.clone()]);
        }
        let epi = epilogue::analyse(body, mm_out).map_err(&no)?;
        // The epilogue body: the values the epilogue reads the result through become
        // parameters after the kernel inputs.
        let mut epilogue = body.clone();
        let as_params: Vec<Value> = match &epi {
            Epi::Direct | Epi::Columns { .. } => vec![mm_out],
            Epi::Paired { slices, .. } => slices.iter().map(|(v, _)| *v).collect(),
        };
        for v in as_params {
            epilogue.values[v].def = ValueDef::Param(epilogue.params.len());
            epilogue.params.push(v);
        }
        match &epi {
            Epi::Direct => {}
            Epi::Columns { segs, .. } => all_dims.extend(segs.iter().flat_map(|s| [s.start.clone(), s.width.clone()])),
            Epi::Paired { segs, width, .. } => {
                all_dims.extend(segs.iter().map(|s| s.start.clone()));
                all_dims.push(width.clone());
            }
        }
        Ok(Spec {
            kernel_name: name,
            n_inputs: kd.inputs.len(),
            n_buffers: kd.inputs.len() + kd.outputs.len(),
            dtype,
            a,
            b,
            b_quant,
            fp8,
            m,
            n,
            k,
            batch,
            epi,
            epilogue,
            buffers,
            all_dims: dims_of(&all_dims),
        })
    }
}

impl Spec {
    /// The schedule [`generate`] uses ([`choose_schedule`]'s rule): a constant M in 2..=16 of
    /// bf16/f16 takes the flat tensor-core GEMM ([`MmaSchedule::flat`], 32 columns or the
    /// smallest tile a multiple of the RoPE head) where [`Spec::mma_plan`] accepts the
    /// layouts, and the small-M kernel where it does not, as M = 1 and f32 do (every epilogue
    /// mode: each group computes its column and the RoPE partner, or the n-th column of every
    /// segment); otherwise bf16/f16 operands take the tensor cores
    /// ([`MmaSchedule::for_columns`], the tile a multiple of the RoPE head) where
    /// [`Spec::mma_plan`] accepts the layouts, and everything else the tiled kernel, with a
    /// tile as wide as a staged epilogue needs (64 columns, or a RoPE head of 128 or 256, or 32
    /// per combined segment).
    fn default_schedule(&self, target: &Target) -> MatmulSchedule {
        let b_k = self.b.ks.as_const() == Some(1);
        if self.b_quant.is_some() {
            // One row (decode at batch 1): the small-M kernel, a warp per column streaming its
            // blocks (H200, K 4096, N 28672, q4_1: 54.3 µs against 98.1 for the tensor-core
            // kernel, whose 16-row mma computes 15 rows of padding). More rows: tensor cores
            // with the blocks read into the B fragments where the kernel takes it; else the
            // quantized small-M kernel.
            if self.m.as_const() != Some(1) && self.quant_mma_ok().is_ok() {
                return MatmulSchedule::QuantMma(QuantMmaSchedule::DEFAULT);
            }
            let rows = self.m.as_const().map_or(16, |m| m.clamp(1, 16)) as u32;
            return MatmulSchedule::SmallM(small_m_schedule(rows, true));
        }
        let multiple = match &self.epi {
            Epi::Columns { rope_d, .. } => u32::try_from(*rope_d).unwrap_or(u32::MAX),
            _ => 1,
        };
        let columns = match &self.epi {
            Epi::Paired { width, segs, .. } => width.scale(segs.len() as i64),
            _ => self.n.clone(),
        };
        if self.fp8.is_some() {
            // fp8: the wgmma kernel only (on another target it fails, saying so), with the CTA
            // tile of the bf16 kernel and a K tile of 128 e4m3 elements, TMA-loaded where the
            // tensor maps fit (H200, 8192³: 785.1 µs against 828.4 with cp.async chunks).
            let s = MmaSchedule::for_columns(&columns, multiple);
            let s = if s.bn % multiple.max(1) == 0 { s } else { MmaSchedule::DEFAULT };
            let tile = self.wgmma_tile(s);
            return MatmulSchedule::Wgmma(WgmmaSchedule { tile, tma: self.tma_maps(&tile).is_ok(), ..WgmmaSchedule::DEFAULT });
        }
        if let Some(rows) = self.m.as_const().filter(|m| (1..=16).contains(m)) {
            // The flat tensor-core GEMM with a tile a multiple of the RoPE head, where the
            // layouts allow it; the small-M kernel otherwise.
            if let MatmulSchedule::Mma(s) = choose_schedule(&self.m, &self.n, self.dtype, b_k) {
                let bn = [s.bn, 64, 128, 256].into_iter().find(|bn| bn % multiple.max(1) == 0);
                if let Some(s) = bn.map(MmaSchedule::flat) {
                    if self.mma_plan(&s, target).is_ok() {
                        return MatmulSchedule::Mma(s);
                    }
                }
                return MatmulSchedule::SmallM(small_m_schedule(rows as u32, b_k));
            }
            return choose_schedule(&self.m, &self.n, self.dtype, b_k);
        }
        if let MatmulSchedule::Mma(s) = choose_schedule(&self.m, &columns, self.dtype, b_k) {
            let s = if s.bn % multiple.max(1) == 0 { s } else { MmaSchedule::DEFAULT };
            // Hopper: the same CTA tile on warpgroup MMAs where the layouts allow, one K
            // tile's products in flight (H200, bf16 8192³: 707.1 TFLOP/s against 505 for
            // `mma.sync`; 4096³: 213.2 against 301.3 µs).
            let w = self.wgmma_tile(s);
            if self.wgmma_plan(&w, target).is_ok() {
                let tma = self.tma_maps(&w).is_ok();
                return MatmulSchedule::Wgmma(WgmmaSchedule { tile: w, tma, ..WgmmaSchedule::DEFAULT });
            }
            if self.mma_plan(&s, target).is_ok() {
                return MatmulSchedule::Mma(s);
            }
        }
        let bn = match &self.epi {
            Epi::Direct => return MatmulSchedule::Tiled(TiledSchedule::DEFAULT),
            Epi::Columns { rope_d, .. } => (*rope_d as u32).max(64),
            Epi::Paired { segs, .. } => 32 * segs.len() as u32,
        };
        let small = self.m.as_const().is_some_and(|m| m <= 16);
        MatmulSchedule::Tiled(match bn {
            64 if small => TiledSchedule { bm: 16, bn: 64, bk: 16, tm: 1, tn: 4 },
            64 => TiledSchedule::DEFAULT,
            128 => TiledSchedule { bm: 64, bn: 128, bk: 16, tm: 4, tn: 4 },
            _ => TiledSchedule { bm: 32, bn, bk: 16, tm: 4, tn: 4 },
        })
    }

    /// The warpgroup form of CTA tile `s`: a warp per 16 rows, 4 stages, a K tile of one
    /// 128-byte swizzle row of the operands (64 bf16/f16 elements, 128 e4m3).
    fn wgmma_tile(&self, s: MmaSchedule) -> MmaSchedule {
        let es = self.a.dtype.size_bytes().clamp(1, 2) as u32;
        MmaSchedule { warps_m: s.bm / 16, warps_n: 1, stages: 4, bk: 128 / es, ..s }
    }

    /// Whether the quantized tensor-core kernel takes this kernel: a block-quantized B,
    /// bf16/f16 operands, a constant M ≤ 16, a direct epilogue, and activations whose K
    /// axis is read in aligned 16-byte vectors.
    fn quant_mma_ok(&self) -> Result<(), String> {
        if self.b_quant.is_none() {
            return Err("B is not block-quantized".into());
        }
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return Err(format!("tensor cores do not take {} operands", self.dtype));
        }
        if !self.m.as_const().is_some_and(|m| (1..=16).contains(&m)) {
            return Err(format!("M = {} is not a constant in 1..=16", self.m));
        }
        if !matches!(self.epi, Epi::Direct) {
            return Err("the epilogue reads R at other columns (the small-M kernel takes it)".into());
        }
        if !self.a.vector_ok(8) {
            return Err("A's rows are not read in aligned 16-byte vectors".into());
        }
        Ok(())
    }

    /// Whether tiled schedule `s` suits this kernel's epilogue (tile width a multiple of the
    /// RoPE head or of the segment count; the staged tile fits static shared memory).
    fn fits(&self, s: &TiledSchedule) -> Result<(), String> {
        let ok = match &self.epi {
            Epi::Direct => true,
            Epi::Columns { rope_d, .. } => i64::from(s.bn) % rope_d == 0,
            Epi::Paired { segs, .. } => s.bn % segs.len() as u32 == 0,
        };
        if !ok {
            return Err(format!("{s:?} does not suit the epilogue {:?}", self.epi));
        }
        if self.epi.staged() && self.staged_bytes(s) > 48 * 1024 {
            return Err(format!("{s:?}: the staged tile needs {} bytes of shared memory", self.staged_bytes(s)));
        }
        Ok(())
    }

    /// The shared-memory plan of tensor-core schedule `s` for this kernel, or why the kernel
    /// cannot take it: bf16/f16 operands, each read in 16-byte chunks along a contiguous axis
    /// that are provably aligned ([`MatOperand::chunks_ok`], symbolic strides included),
    /// slab rows the swizzle can handle, an epilogue the tile suits (a width that is a
    /// multiple of the RoPE head or of the segment count; for paired segments of an
    /// N-contiguous B, segment starts and sub-tile widths that are multiples of 8) and
    /// shared memory within the target's limit.
    fn mma_plan(&self, s: &MmaSchedule, target: &Target) -> Result<MmaPlan, String> {
        if self.fp8.is_some() {
            return Err(crate::fp8_message("the `mma.sync` kernel does not take f8e4m3 operands"));
        }
        if !matches!(self.dtype, DType::BF16 | DType::F16) {
            return Err(format!("tensor-core matmul of {} operands", self.dtype));
        }
        self.slab_plan(s, target)
    }

    /// The shared memory of the tensor-core kernels' pipeline for schedule `s` — slabs of
    /// the operands' element size (16-bit, or 8-bit `f8e4m3` for the fp8 wgmma kernel) — or
    /// why the kernel's layouts, epilogue or the target's shared memory do not allow it (see
    /// [`Spec::mma_plan`]).
    fn slab_plan(&self, s: &MmaSchedule, target: &Target) -> Result<MmaPlan, String> {
        let es = self.a.dtype.size_bytes() as u32;
        let mode = |op: &MatOperand, what: &str| -> Result<bool, String> {
            if op.chunks_ok(true) {
                Ok(true)
            } else if op.chunks_ok(false) {
                Ok(false)
            } else {
                Err(format!(
                    "{what} (strides: {} along K, {} across; offset {}; {}-byte aligned) is not read in aligned 16-byte chunks",
                    op.ks, op.outer, op.offset, op.align
                ))
            }
        };
        let a = Slab::new(mode(&self.a, "A")?, s.bm, s.bk, 0, es);
        let b = Slab::new(mode(&self.b, "B")?, s.bn, s.bk, a.bytes(), es);
        let threads = s.threads();
        for (what, sl) in [("A", a), ("B", b)] {
            if !(sl.row_bytes() == 64 || sl.row_bytes() % 128 == 0) {
                return Err(format!("{s:?}: {what}'s slab rows of {} bytes cannot be swizzled (64 or a multiple of 128)", sl.row_bytes()));
            }
            if (sl.rows * sl.chunks()) % threads != 0 {
                return Err(format!("{s:?}: {what}'s slab of {} chunks does not split over {threads} threads", sl.rows * sl.chunks()));
            }
        }
        match &self.epi {
            Epi::Direct => {}
            Epi::Columns { rope_d, .. } => {
                if i64::from(s.bn) % rope_d != 0 {
                    return Err(format!("{s:?}: the tile width is not a multiple of the RoPE head {rope_d}"));
                }
            }
            Epi::Paired { segs, .. } => {
                let n = segs.len() as u32;
                if s.bn % n != 0 || (!b.k_contig && ((s.bn / n) % 8 != 0 || segs.iter().any(|sg| sg.start.div_exact(8).is_none()))) {
                    return Err(format!("{s:?} does not suit the paired epilogue over {n} segments"));
                }
            }
        }
        let stage_bytes = a.bytes() + b.bytes();
        let pitch = s.bn + 8;
        let staged = if self.epi.staged() { s.bm * pitch * self.dtype.size_bytes() as u32 } else { 0 };
        let smem_bytes = (s.stages * stage_bytes).max(staged);
        if smem_bytes > target.max_shared_memory_per_block() {
            return Err(format!("{s:?} needs {smem_bytes} bytes of shared memory, more than {target} allows"));
        }
        Ok(MmaPlan { a, b, stage_bytes, smem_bytes, pitch })
    }

    /// The shared-memory plan of Hopper schedule `s` ([`MatmulSchedule::Wgmma`]), or why the
    /// kernel cannot take it: [`Spec::mma_plan`]'s conditions (for bf16/f16 operands; `f8e4m3`
    /// ones of an fp8 matmul as well), an sm_90a target, K-major A and B (K contiguous in
    /// memory: the descriptors describe K-major slabs, and 8-bit `wgmma` has no transposed
    /// form), `bk` one 128-byte swizzle row (64 bf16/f16, 128 e4m3 elements), `bm` a multiple
    /// of 64 with a warp per 16 rows, `bn` a multiple of 8 up to 256. For an fp8 matmul the
    /// reason names the fp8 kernel: it has no other schedule.
    fn wgmma_plan(&self, s: &MmaSchedule, target: &Target) -> Result<MmaPlan, String> {
        let plan = || -> Result<MmaPlan, String> {
            if !target.has_wgmma() {
                return Err(format!("wgmma needs sm_90a, not {target}"));
            }
            let dt = self.a.dtype;
            let es = dt.size_bytes() as u32;
            if crate::emit::wgmma_k(dt).is_none() || self.b.dtype != dt || (self.fp8.is_none() && !matches!(self.dtype, DType::BF16 | DType::F16)) {
                return Err(format!("wgmma of {dt} · {} operands", self.b.dtype));
            }
            if s.bk * es != 128 || s.bm % 64 != 0 || s.warps_n != 1 || s.warps_m * 16 != s.bm || s.bn % 8 != 0 || s.bn > 256 {
                return Err(format!("{s:?} is not a warpgroup schedule for {dt} (bk {}, bm a multiple of 64 with a warp per 16 rows, bn ≤ 256)", 128 / es));
            }
            let plan = self.slab_plan(s, target)?;
            if !(plan.a.k_contig && plan.b.k_contig) {
                return Err("wgmma reads K-major A and B only (B as [N, K])".into());
            }
            Ok(plan)
        };
        match (plan(), self.fp8) {
            (Err(e), Some(_)) => Err(crate::fp8_message(&format!("f8e4m3 matmul: {e}"))),
            (r, _) => r,
        }
    }

    /// Whether this kernel takes the warp-specialised and persistent forms of wgmma schedule
    /// `w` ([`WgmmaSchedule::specialized`], [`WgmmaSchedule::ctas`]), or why not: they need
    /// the TMA loads and the direct epilogue — a staged epilogue writes the tile over the
    /// pipeline's shared memory behind a CTA-wide barrier, while the producer warpgroup is
    /// already filling the stages for the next tile.
    fn ws_ok(&self, w: &WgmmaSchedule) -> Result<(), String> {
        if !w.specialized {
            return if w.ctas == 0 { Ok(()) } else { Err(format!("{w:?}: persistent CTAs need the warp-specialised kernel")) };
        }
        if !w.tma {
            return Err(format!("{w:?}: the warp-specialised kernel loads with the TMA"));
        }
        if self.fp8.is_some() {
            return Err("the warp-specialised wgmma kernel has no fp8 form (fp8 loads with cp.async)".into());
        }
        if self.epi.staged() {
            return Err("the warp-specialised wgmma kernel writes its results from registers: a staged epilogue (segments, pairs) would overwrite stages the producer fills".into());
        }
        Ok(())
    }

    /// The TMA tensor maps of the wgmma kernel's operands ([`WgmmaSchedule::tma`]): A as
    /// `[batch…, M, K]` and B as `[batch…, N, K]` (K innermost; a batch axis an operand is
    /// broadcast along is left out), boxes of `64 × bm` and `64 × bn` elements (one K tile,
    /// 128 bytes a row) with 128-byte swizzling — the layout of the cp.async slabs
    /// ([`Slab::offset`]) and of the wgmma descriptors. Tails read as zero. Needs 16-bit
    /// operands copyable in 16-byte chunks along K ([`MatOperand::chunks_ok`]: the driver's
    /// 16-byte alignment of the start and strides), a direct or staged epilogue (not the paired
    /// one, whose B tile is two segments), and at most three batch axes.
    fn tma_maps(&self, s: &MmaSchedule) -> Result<Vec<TensorMap>, String> {
        if matches!(self.epi, Epi::Paired { .. }) || self.b_quant.is_some() {
            return Err("TMA loads need a direct or staged epilogue of an unquantized B".into());
        }
        let map = |op: &MatOperand, outer: &Dim, rows: u32| -> Result<TensorMap, String> {
            if !op.chunks_ok(true) {
                return Err("TMA loads need K-contiguous 16-bit operands with 16-byte-aligned rows, offset and base".into());
            }
            let mut dims = vec![self.k.clone(), outer.clone()];
            let mut strides = vec![op.outer.clone()];
            let mut box_dims = vec![s.bk, rows];
            for (d, st) in self.batch.iter().zip(&op.batch_strides) {
                if st.as_const() != Some(0) {
                    dims.push(d.clone());
                    strides.push(st.clone());
                    box_dims.push(1);
                }
            }
            if dims.len() > 5 {
                return Err("TMA loads of more than three batch axes".into());
            }
            Ok(TensorMap { buffer: op.buffer, dtype: op.dtype, offset: op.offset.clone(), dims, strides, box_dims, swizzle: 128 })
        };
        Ok(vec![map(&self.a, &self.m, s.bm)?, map(&self.b, &self.n, s.bn)?])
    }

    /// Static shared memory of the tiled kernel: the slabs, or the staged tile (in the
    /// matmul's dtype) where that is larger.
    fn staged_bytes(&self, s: &TiledSchedule) -> u32 {
        let tile = if self.epi.staged() { s.bm * s.bn * self.dtype.size_bytes() as u32 } else { 0 };
        s.shared_bytes().max(tile)
    }
}

/// One operand's slab in a pipeline stage of the tensor-core kernel: `rows × cols` elements
/// of `es` bytes (2: bf16/f16; 1: `f8e4m3`) stored row by row, each row of `cols · es / 16`
/// 16-byte chunks whose order is XOR-swizzled by the row ([`Slab::offset`]). Rows are the
/// operand's outer axis (M for A, N for B) and columns its K axis when K is contiguous in
/// memory (`k_contig`), else the reverse.
#[derive(Clone, Copy, Debug)]
struct Slab {
    k_contig: bool,
    rows: u32,
    cols: u32,
    /// Byte offset within a stage.
    base: u32,
    /// Bytes per element.
    es: u32,
}

impl Slab {
    /// The slab of an operand with `outer` rows or columns in the CTA tile and `bk` K
    /// elements per stage, at `base`.
    fn new(k_contig: bool, outer: u32, bk: u32, base: u32, es: u32) -> Slab {
        if k_contig {
            Slab { k_contig, rows: outer, cols: bk, base, es }
        } else {
            Slab { k_contig, rows: bk, cols: outer, base, es }
        }
    }
    /// Elements per 16-byte chunk.
    fn per_chunk(&self) -> u32 {
        16 / self.es
    }
    fn chunks(&self) -> u32 {
        self.cols / self.per_chunk()
    }
    fn row_bytes(&self) -> u32 {
        self.cols * self.es
    }
    fn bytes(&self) -> u32 {
        self.rows * self.row_bytes()
    }
    /// The value XORed into the chunk index of row `row` (i32): `row mod 8` for rows of
    /// whole 128-byte lines, `(row / 2) mod 4` for 64-byte rows (two rows to a line). Eight
    /// consecutive rows then place a given chunk in eight different 16-byte bank groups, so
    /// the eight row addresses of an `ldmatrix` matrix and the chunks eight threads copy
    /// never share a bank (the "XOR swizzle" of CUTLASS's `Swizzle<3, 3, 3>` layouts).
    fn swizzle<'ctx>(&self, k: &Kit<'ctx>, row: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        if self.chunks() == 4 {
            k.and(k.lshr(row, 1)?, k.i32c(3))
        } else {
            k.and(row, k.i32c(7))
        }
    }
    /// Byte offset (i32, from the slab's base) of chunk `chunk` of row `row`.
    fn offset<'ctx>(&self, k: &Kit<'ctx>, row: IntValue<'ctx>, chunk: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let phys = k.xor(chunk, self.swizzle(k, row)?)?;
        k.add(k.mul(row, k.i32c(self.row_bytes() as i32))?, k.shl(phys, 4)?)
    }
}

/// The shared memory of a tensor-core kernel ([`Spec::mma_plan`]).
#[derive(Clone, Copy, Debug)]
struct MmaPlan {
    a: Slab,
    b: Slab,
    /// Bytes per pipeline stage (A's slab, then B's).
    stage_bytes: u32,
    /// Dynamic shared memory: the stages, or the staged accumulator tile where larger.
    smem_bytes: u32,
    /// Elements per row of the staged accumulator tile (`bn + 8`: the padding spreads the
    /// rows of a fragment store over the banks).
    pitch: u32,
}

/// Per-CTA facts shared by both generators: the output's batch coordinates and the base
/// offsets of A and B for them.
struct Bases<'ctx> {
    coords: Vec<IntValue<'ctx>>,
    a: IntValue<'ctx>,
    b: IntValue<'ctx>,
}

/// Splits the batch index `z` (`ctaid.z`) into the output's batch coordinates and computes
/// A's and B's offsets for them.
fn batch_bases<'ctx>(kit: &Kit<'ctx>, spec: &Spec, z: IntValue<'ctx>) -> R<Bases<'ctx>> {
    let nb = spec.batch.len();
    let mut coords = vec![kit.i64c(0); nb];
    let mut rest = z;
    for i in (0..nb).rev() {
        if i == 0 {
            coords[i] = rest;
        } else {
            let size = kit.dim(&spec.batch[i])?;
            coords[i] = kit.urem(rest, size)?;
            rest = kit.udiv(rest, size)?;
        }
    }
    let base = |strides: &[Dim]| -> R<IntValue<'ctx>> {
        let mut acc = kit.i64c(0);
        for (c, s) in coords.iter().zip(strides) {
            if s.as_const() != Some(0) {
                acc = kit.add(acc, kit.mul(*c, kit.dim(s)?)?)?;
            }
        }
        Ok(acc)
    };
    let a = kit.add(kit.dim(&spec.a.offset)?, base(&spec.a.batch_strides)?)?;
    let b = kit.add(kit.dim(&spec.b.offset)?, base(&spec.b.batch_strides)?)?;
    Ok(Bases { coords, a, b })
}

/// Evaluates the epilogue at output element (m, n) from the f32 accumulator — the matmul
/// result rounded once to its dtype, then the body's element-wise nodes through the shared
/// element evaluator ([`super::element::Eval`]) — and stores every output there. The caller
/// has checked m < M and n < N.
fn epilogue_and_store<'ctx>(kit: &Kit<'ctx>, spec: &Spec, bases: &Bases<'ctx>, m: IntValue<'ctx>, n: IntValue<'ctx>, acc: FloatValue<'ctx>) -> R<()> {
    epilogue_and_store_accs(kit, spec, bases, m, n, &[acc])
}

/// [`epilogue_and_store`] with one accumulator per segment (a paired epilogue: `accs[s]` is
/// segment `s`'s column `n`; each slice the epilogue reads gets its segment's value) or one
/// (direct).
fn epilogue_and_store_accs<'ctx>(kit: &Kit<'ctx>, spec: &Spec, bases: &Bases<'ctx>, m: IntValue<'ctx>, n: IntValue<'ctx>, accs: &[FloatValue<'ctx>]) -> R<()> {
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
fn epilogue_and_store_pair<'ctx>(kit: &Kit<'ctx>, spec: &Spec, bases: &Bases<'ctx>, m: IntValue<'ctx>, n: IntValue<'ctx>, vals: [FloatValue<'ctx>; 2]) -> R<()> {
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
fn eval_outputs<'ctx>(kit: &Kit<'ctx>, spec: &Spec, bases: &Bases<'ctx>, m: IntValue<'ctx>, n: IntValue<'ctx>, results: Vec<Buf<'ctx>>, lanes: u32) -> R<()> {
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
fn name_error(e: CodegenError, kernel: &str) -> CodegenError {
    match e {
        CodegenError::Unsupported { kernel: k, message } if k.is_empty() => {
            CodegenError::Unsupported { kernel: format!("{kernel} (Matmul)"), message: format!("in the epilogue: {message}") }
        }
        CodegenError::BadKernel { kernel: k, message } if k.is_empty() => CodegenError::BadKernel { kernel: format!("{kernel} (Matmul)"), message },
        other => other,
    }
}

/// An index (i64), the index that decides whether it exists, and the bound that one must stay
/// below.
type Bounded<'ctx> = (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>);

/// The column of R that virtual column `v` (i32) of column tile `tile` (a CTA's `bn` columns)
/// computes: `tile·bn + v`, or for a paired epilogue column `tile·sub + v mod sub` of segment
/// `v / sub` (`sub = bn / segments`: the tile holds the matching columns of every segment side
/// by side). Returns that column, the index that decides whether it exists and its bound:
/// `(n, n, N)`, or `(start + j, j, width)` for paired segments.
fn tile_column<'ctx>(k: &Kit<'ctx>, spec: &Spec, bn: u32, tile: IntValue<'ctx>, v: IntValue<'ctx>) -> R<Bounded<'ctx>> {
    match &spec.epi {
        Epi::Paired { segs, width, .. } => {
            let sub = bn / segs.len() as u32;
            let seg = k.udiv(v, k.i32c(sub as i32))?;
            let j = k.add(k.mul(tile, k.i64c(i64::from(sub)))?, k.zext64(k.urem(v, k.i32c(sub as i32))?)?)?;
            let mut start = k.dim(&segs[0].start)?;
            for (i, sg) in segs.iter().enumerate().skip(1) {
                let here = k.icmp(IntPredicate::EQ, seg, k.i32c(i as i32))?;
                start = k.select_int(here, k.dim(&sg.start)?, start)?;
            }
            Ok((k.add(start, j)?, j, k.dim(width)?))
        }
        _ => {
            let n = k.add(k.mul(tile, k.i64c(i64::from(bn)))?, k.zext64(v)?)?;
            Ok((n, n, k.dim(&spec.n)?))
        }
    }
}

/// The tiled kernel (see [`TiledSchedule`]).
fn build_tiled<'ctx>(kit: &Kit<'ctx>, spec: &Spec, s: &TiledSchedule) -> R<()> {
    let threads = s.threads();
    let tid = kit.sreg("tid.x")?;
    let bx = kit.zext64(kit.sreg("ctaid.x")?)?;
    let by = kit.zext64(kit.sreg("ctaid.y")?)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let m0 = kit.mul(bx, kit.i64c(i64::from(s.bm)))?;
    let n0 = kit.mul(by, kit.i64c(i64::from(s.bn)))?;
    let bases = batch_bases(kit, spec, bz)?;
    let (mdim, ndim, kdim) = (kit.dim(&spec.m)?, kit.dim(&spec.n)?, kit.dim(&spec.k)?);
    let (a_ptr, b_ptr) = (kit.buf(spec.a.buffer)?, kit.buf(spec.b.buffer)?);
    let (a_outer, a_ks) = (kit.dim(&spec.a.outer)?, kit.dim(&spec.a.ks)?);
    let (b_outer, b_ks) = (kit.dim(&spec.b.outer)?, kit.dim(&spec.b.ks)?);
    // Which axis of each operand is contiguous decides the staging order (coalescing).
    let a_k_contig = spec.a.ks.as_const() == Some(1);
    let b_k_contig = spec.b.ks.as_const() == Some(1);

    let a_row = s.bm + PAD; // f32s per k-row of the A slab
    let b_row = s.bn + PAD;
    let smem = kit.shared(SharedKind::Static, spec.staged_bytes(s))?;
    let b_off = s.b_slab_offset();
    // The column of R that virtual tile column `v` (i32) computes, and whether it exists.
    let tile = by;
    let colmap = |k: &Kit<'ctx>, v: IntValue<'ctx>| -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let (n, j, limit) = tile_column(k, spec, s.bn, tile, v)?;
        Ok((n, k.icmp(IntPredicate::SLT, j, limit)?))
    };

    let acc: Vec<PointerValue> = (0..s.tm * s.tn).map(|_| kit.var_f(kit.f32c(0.0))).collect::<R<_>>()?;
    let tx = kit.urem(tid, kit.i32c((s.bn / s.tn) as i32))?;
    let ty = kit.udiv(tid, kit.i32c((s.bn / s.tn) as i32))?;
    let zero64 = kit.i64c(0);

    kit.for_range(zero64, kdim, kit.i64c(i64::from(s.bk)), |k, k0| {
        // Stage A: bm × bk elements, `per` per thread.
        for l in 0..(s.bm * s.bk) / threads {
            let e = k.add(tid, k.i32c((l * threads) as i32))?;
            let (mm, kk) = if a_k_contig {
                (k.udiv(e, k.i32c(s.bk as i32))?, k.urem(e, k.i32c(s.bk as i32))?)
            } else {
                (k.urem(e, k.i32c(s.bm as i32))?, k.udiv(e, k.i32c(s.bm as i32))?)
            };
            let m = k.add(m0, k.zext64(mm)?)?;
            let kk64 = k.add(k0, k.zext64(kk)?)?;
            let valid = k.and(k.icmp(IntPredicate::SLT, m, mdim)?, k.icmp(IntPredicate::SLT, kk64, kdim)?)?;
            let idx = k.add(bases.a, k.add(k.mul(m, a_outer)?, k.mul(kk64, a_ks)?)?)?;
            let v = k.guarded_load(valid, spec.dtype, a_ptr, idx, 1, true, zero64)?;
            let off = k.mul(k.add(k.mul(kk, k.i32c(a_row as i32))?, mm)?, k.i32c(4))?;
            k.sh_store(DType::F32, k.sh_at(smem, off)?, &v)?;
        }
        // Stage B: bk × bn elements.
        for l in 0..(s.bk * s.bn) / threads {
            let e = k.add(tid, k.i32c((l * threads) as i32))?;
            let (kk, nn) = if b_k_contig {
                (k.urem(e, k.i32c(s.bk as i32))?, k.udiv(e, k.i32c(s.bk as i32))?)
            } else {
                (k.udiv(e, k.i32c(s.bn as i32))?, k.urem(e, k.i32c(s.bn as i32))?)
            };
            let (n, n_ok) = colmap(k, nn)?;
            let kk64 = k.add(k0, k.zext64(kk)?)?;
            let valid = k.and(n_ok, k.icmp(IntPredicate::SLT, kk64, kdim)?)?;
            let idx = k.add(bases.b, k.add(k.mul(n, b_outer)?, k.mul(kk64, b_ks)?)?)?;
            let v = k.guarded_load(valid, spec.dtype, b_ptr, idx, 1, true, zero64)?;
            let off = k.add(k.i32c(b_off as i32), k.mul(k.add(k.mul(kk, k.i32c(b_row as i32))?, nn)?, k.i32c(4))?)?;
            k.sh_store(DType::F32, k.sh_at(smem, off)?, &v)?;
        }
        k.barrier()?;
        // Accumulate: per k-row, tm values of A and tn of B from shared memory (16-byte
        // loads), tm·tn FMAs.
        let a_col = k.mul(ty, k.i32c(s.tm as i32))?;
        let b_col = k.mul(tx, k.i32c(s.tn as i32))?;
        for kk in 0..s.bk {
            let ao = k.mul(k.add(k.i32c((kk * a_row) as i32), a_col)?, k.i32c(4))?;
            let bo = k.add(k.i32c(b_off as i32), k.mul(k.add(k.i32c((kk * b_row) as i32), b_col)?, k.i32c(4))?)?;
            let av = k.sh_load(DType::F32, k.sh_at(smem, ao)?, s.tm)?;
            let bv = k.sh_load(DType::F32, k.sh_at(smem, bo)?, s.tn)?;
            for i in 0..s.tm as usize {
                for j in 0..s.tn as usize {
                    let p = acc[i * s.tn as usize + j];
                    let v = k.fma(av[i], bv[j], k.get_f(p)?)?;
                    k.set(p, v.into())?;
                }
            }
        }
        k.barrier()
    })?;

    if spec.epi.staged() {
        return staged_epilogue(kit, spec, s, smem, (m0, tile, bz), &acc, (tid, tx, ty));
    }
    // Epilogue: every thread its micro-tile, bounds-checked.
    let mbase = kit.add(m0, kit.zext64(kit.mul(ty, kit.i32c(s.tm as i32))?)?)?;
    let nbase = kit.add(n0, kit.zext64(kit.mul(tx, kit.i32c(s.tn as i32))?)?)?;
    for i in 0..s.tm {
        for j in 0..s.tn {
            let m = kit.add(mbase, kit.i64c(i64::from(i)))?;
            let n = kit.add(nbase, kit.i64c(i64::from(j)))?;
            let inside = kit.and(kit.icmp(IntPredicate::SLT, m, mdim)?, kit.icmp(IntPredicate::SLT, n, ndim)?)?;
            let a = kit.get_f(acc[(i * s.tn + j) as usize])?;
            kit.if_then(inside, |k| epilogue_and_store(k, spec, &bases, m, n, a))?;
        }
    }
    Ok(())
}

/// The epilogue of [`Epi::Columns`] and [`Epi::Paired`] for the tiled kernel: thread
/// `(ty, tx)` stages its micro-tile (rows `ty·tm..`, columns `tx·tn..`), rounded to the
/// matmul's dtype, into the CTA's tile in shared memory, then [`staged_outputs`] writes every
/// output from it.
#[allow(clippy::too_many_arguments)]
fn staged_epilogue<'ctx>(
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
struct StagedTile {
    bm: u32,
    bn: u32,
    pitch: u32,
    threads: u32,
}

/// The outputs of [`Epi::Columns`] and [`Epi::Paired`] from the CTA's accumulator tile, which
/// the caller has staged in shared memory at `smem` (rounded to the matmul's dtype; virtual
/// columns as [`tile_column`] maps them: R's columns `tile·bn + v`, or for Paired segment
/// `v / sub`'s columns `tile·sub + v mod sub` with `sub = bn / segments`) and made visible
/// with a barrier: the threads walk the tile's elements and evaluate every output whose
/// element it is, through the element evaluator, reading R (or the segments) from the tile.
fn staged_outputs<'ctx>(kit: &Kit<'ctx>, spec: &Spec, t: StagedTile, smem: PointerValue<'ctx>, (m0, tile, z): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>), tid: IntValue<'ctx>) -> R<()> {
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
fn columns_output<'ctx>(
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
fn scatter_append<'ctx>(ev: &mut Eval<'_, 'ctx>, body: &Function, a: &epilogue::Append, coords: &[IntValue<'ctx>], obuf: &Buf<'ctx>, vals: &[Scalar<'ctx>]) -> R<()> {
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

/// The small-M kernel (see [`SmallMSchedule`]).
fn build_small_m(kit: &Kit<'_>, spec: &Spec, s: &SmallMSchedule) -> R<()> {
    let tid = kit.sreg("tid.x")?;
    let bx = kit.zext64(kit.sreg("ctaid.x")?)?;
    let by = kit.zext64(kit.sreg("ctaid.y")?)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let bases = batch_bases(kit, spec, bz)?;
    let (mdim, kdim) = (kit.dim(&spec.m)?, kit.dim(&spec.k)?);
    let (a_ptr, b_ptr) = (kit.buf(spec.a.buffer)?, kit.buf(spec.b.buffer)?);
    let (a_outer, a_ks) = (kit.dim(&spec.a.outer)?, kit.dim(&spec.a.ks)?);
    let (b_outer, b_ks) = (kit.dim(&spec.b.outer)?, kit.dim(&spec.b.ks)?);
    // The columns of R a group computes for its output column n: n itself, or (paired) the
    // n-th column of every segment, each with its own accumulators.
    let lanes = s.lanes;
    let g = kit.zext64(kit.udiv(tid, kit.i32c(lanes as i32))?)?;
    let lane = kit.zext64(kit.urem(tid, kit.i32c(lanes as i32))?)?;
    let n = kit.add(kit.mul(bx, kit.i64c(i64::from(s.columns)))?, g)?;
    let m0 = kit.mul(by, kit.i64c(i64::from(s.rows)))?;
    // Columns (QKV + RoPE): column n and its RoPE partners in the same head (rotate-half:
    // n ± d/2; interleaved: n xor 1), so that the epilogue reads R at either.
    let mut rope_head = 1i64;
    let (ncols, cols) = match &spec.epi {
        Epi::Paired { segs, width, .. } => (kit.dim(width)?, segs.iter().map(|sg| kit.add(n, kit.dim(&sg.start)?)).collect::<R<Vec<_>>>()?),
        Epi::Direct => (kit.dim(&spec.n)?, vec![n]),
        Epi::Columns { rope_d, .. } => {
            let mut cols = vec![n];
            let d = *rope_d;
            if d > 1 {
                rope_head = d;
                let forms: std::collections::BTreeSet<bool> = spec.epilogue.nodes.values().filter(|nd| nd.op.kind == OpKind::Rope).map(|nd| nd.op.str("form") == Some("interleaved")).collect();
                let within = kit.urem(n, kit.i64c(d))?;
                if forms.contains(&false) {
                    let first = kit.icmp(IntPredicate::SLT, within, kit.i64c(d / 2))?;
                    let up = kit.add(n, kit.i64c(d / 2))?;
                    let down = kit.sub(n, kit.i64c(d / 2))?;
                    cols.push(kit.select_i(first, up, down)?);
                }
                if forms.contains(&true) {
                    cols.push(kit.xor(n, kit.i64c(1))?);
                }
            }
            (kit.dim(&spec.n)?, cols)
        }
    };
    let n_valid = kit.icmp(IntPredicate::SLT, n, ncols)?;
    // Columns: each group stages its head of R in shared memory for the epilogue (a private
    // array indexed by column would live on the stack).
    let group_tile = if matches!(spec.epi, Epi::Columns { .. }) {
        let head_bytes = rope_head as u32 * spec.dtype.size_bytes() as u32;
        let smem = kit.shared(SharedKind::Static, s.columns * head_bytes)?;
        let gi = kit.udiv(tid, kit.i32c(lanes as i32))?;
        Some(kit.sh_at(smem, kit.mul(gi, kit.i32c(head_bytes as i32))?)?)
    } else {
        None
    };

    // acc[column][row]
    let acc: Vec<Vec<PointerValue>> = cols.iter().map(|_| (0..s.rows).map(|_| kit.var_f(kit.f32c(0.0))).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
    let m_valid: Vec<IntValue> = (0..s.rows)
        .map(|i| kit.icmp(IntPredicate::SLT, kit.add(m0, kit.i64c(i64::from(i)))?, mdim))
        .collect::<R<_>>()?;
    if let Some(q) = spec.b_quant {
        small_m_quant_loop(kit, spec, q, (lane, lanes), &cols, n_valid, (m0, &m_valid), &acc, &bases)?;
    } else {
    // Vector width along K: 16 bytes where both operands allow it and K is a multiple.
    let es = spec.dtype.size_bytes() as u32;
    let vw = 16 / es;
    let c = if lanes > 1 && spec.a.vector_ok(vw) && spec.b.vector_ok(vw) && spec.k.div_exact(i64::from(vw)).is_some() { vw } else { 1 };

    let start = kit.mul(lane, kit.i64c(i64::from(c)))?;
    let step = kit.i64c(i64::from(c * lanes));
    kit.for_range(start, kdim, step, |k, kk| {
        let mut bvs = Vec::with_capacity(cols.len());
        for &col in &cols {
            let bidx = k.add(bases.b, k.add(k.mul(col, b_outer)?, k.mul(kk, b_ks)?)?)?;
            bvs.push(k.guarded_load(n_valid, spec.dtype, b_ptr, bidx, c, c > 1, b_ks)?);
        }
        for i in 0..s.rows as usize {
            let m = k.add(m0, k.i64c(i as i64))?;
            let aidx = k.add(bases.a, k.add(k.mul(m, a_outer)?, k.mul(kk, a_ks)?)?)?;
            let av = k.guarded_load(m_valid[i], spec.dtype, a_ptr, aidx, c, c > 1, a_ks)?;
            for (seg_acc, bv) in acc.iter().zip(&bvs) {
                let p = seg_acc[i];
                let mut sum = k.get_f(p)?;
                for (x, y) in av.iter().zip(bv) {
                    sum = k.fma(*x, *y, sum)?;
                }
                k.set(p, sum.into())?;
            }
        }
        Ok(())
    })?;
    }
    // Reduce over the lanes of a column (lanes are aligned groups of a warp).
    let masks: Vec<u32> = (0..lanes.trailing_zeros()).rev().map(|b| 1 << b).collect();
    let mut sums: Vec<Vec<FloatValue>> = Vec::with_capacity(acc.len());
    for seg_acc in &acc {
        let mut v = Vec::with_capacity(seg_acc.len());
        for p in seg_acc {
            v.push(kit.warp_reduce(kit.get_f(*p)?, &masks, |k, x, y| k.fadd(x, y))?);
        }
        sums.push(v);
    }
    let writer = kit.and(kit.icmp(IntPredicate::EQ, lane, kit.i64c(0))?, n_valid)?;
    kit.if_then(writer, |k| {
        for i in 0..s.rows as usize {
            let m = k.add(m0, k.i64c(i as i64))?;
            let row: Vec<FloatValue> = sums.iter().map(|v| v[i]).collect();
            match &spec.epi {
                Epi::Columns { segs, appends, .. } => k.if_then(m_valid[i], |k| small_m_columns(k, spec, (bz, m, n), &cols, &row, (group_tile, rope_head), segs, appends))?,
                _ => k.if_then(m_valid[i], |k| epilogue_and_store_accs(k, spec, &bases, m, n, &row))?,
            }
        }
        Ok(())
    })
}

/// The K loop of the small-M kernel when B is block-quantized (`q8_0`/`q4_1`, `[N, K]`):
/// lane `l` of a column's group takes blocks `l, l + lanes, …` of the column's row of blocks
/// (so a warp reads `lanes` consecutive blocks, 640 contiguous bytes of `q4_1` or 1088 of
/// `q8_0`, per step), decodes the block's 32 values in registers ([`crate::quant::block_values`]:
/// 4-byte loads), rounds each to the `dequantize` dtype (where the unfused graph rounds), and
/// accumulates them against the 32 matching elements of each row of A (16-byte vectors where
/// A's layout allows) in f32. A column past N reads nothing.
#[allow(clippy::too_many_arguments)]
fn small_m_quant_loop<'ctx>(
    kit: &Kit<'ctx>,
    spec: &Spec,
    q: DType,
    (lane, lanes): (IntValue<'ctx>, u32),
    cols: &[IntValue<'ctx>],
    n_valid: IntValue<'ctx>,
    (m0, m_valid): (IntValue<'ctx>, &[IntValue<'ctx>]),
    acc: &[Vec<PointerValue<'ctx>>],
    bases: &Bases<'ctx>,
) -> R<()> {
    let dt = spec.dtype;
    let (a_ptr, b_ptr) = (kit.buf(spec.a.buffer)?, kit.buf(spec.b.buffer)?);
    let (a_outer, a_ks) = (kit.dim(&spec.a.outer)?, kit.dim(&spec.a.ks)?);
    let kdim = kit.dim(&spec.k)?;
    let kblocks = kit.udiv(kdim, kit.i64c(32))?;
    // A's 32 elements of a block: vectors of 16 bytes where its layout allows.
    let vw = 16 / dt.size_bytes() as u32;
    let vector = spec.a.vector_ok(vw);
    let (chunk, nchunks) = if vector { (vw, 32 / vw) } else { (32, 1) };
    kit.if_then(n_valid, |k| {
        k.for_range(lane, kblocks, k.i64c(i64::from(lanes)), |k, kb| {
            let mut bvs = Vec::with_capacity(cols.len());
            for &col in cols {
                let block = k.add(k.mul(col, kblocks)?, kb)?;
                let vals = k.math(|b| crate::quant::block_values(b, q, b_ptr, block))?;
                let vals: Vec<FloatValue> = vals.into_iter().map(|v| k.math(|b| b.round_to(v, dt))).collect::<R<_>>()?;
                bvs.push(vals);
            }
            let k0 = k.mul(kb, k.i64c(32))?;
            for (i, &mv) in m_valid.iter().enumerate() {
                let m = k.add(m0, k.i64c(i as i64))?;
                let mut av = Vec::with_capacity(32);
                for c in 0..nchunks {
                    let kk = k.add(k0, k.i64c(i64::from(c * chunk)))?;
                    let aidx = k.add(bases.a, k.add(k.mul(m, a_outer)?, k.mul(kk, a_ks)?)?)?;
                    av.extend(k.guarded_load(mv, dt, a_ptr, aidx, chunk, vector, a_ks)?);
                }
                for (seg_acc, bv) in acc.iter().zip(&bvs) {
                    let p = seg_acc[i];
                    let mut sum = k.get_f(p)?;
                    for (x, y) in av.iter().zip(bv) {
                        sum = k.fma(*x, *y, sum)?;
                    }
                    k.set(p, sum.into())?;
                }
            }
            Ok(())
        })
    })
}

/// The quantized tensor-core kernel ([`QuantMmaSchedule`]): `C[16, 8·tiles·warps]` tiles of
/// `x · dequantize(W)ᵀ` with `x` ≤ 16 rows (padded to 16 with zeros) and `W` `[N, K]` in
/// `q8_0`/`q4_1` blocks. Per step of `chunk` K columns:
/// 1. each warp loads, for each of its tiles (8 weight rows) and each of the step's blocks,
///    the words its lanes' B fragments need ([`crate::quant::fragment_words`]: 3 or 5 naturally
///    aligned loads a lane per block, a row's four lanes reading the whole block) — all of
///    the step's loads issued before any is used;
/// 2. the CTA stages the step's activation columns (16 rows, zeros past M and K) in shared
///    memory with 16-byte loads, rows padded by 16 bytes (4·g + t distinct banks);
/// 3. after a barrier, each lane dequantises its 8 values per block
///    ([`crate::quant::fragment_values`], f32), rounds them to the operand dtype in pairs
///    (`pack_x2`: where the unfused graph rounds the dequantised weight), and issues two
///    `mma.m16n8k16` per block with A fragments read from shared memory (32-bit loads);
/// 4. a barrier before the next step overwrites the tile.
///
/// Accumulators are f32; the direct epilogue runs per element from them. Weight rows past N
/// and blocks past K read nothing (their fragments are zero).
fn build_quant_mma<'ctx>(kit: &Kit<'ctx>, spec: &Spec, s: &QuantMmaSchedule) -> R<()> {
    let q = spec.b_quant.ok_or_else(|| kit.err("no quantized B"))?;
    let dt = spec.dtype;
    let tid = kit.sreg("tid.x")?;
    let bx = kit.zext64(kit.sreg("ctaid.x")?)?;
    let by = kit.zext64(kit.sreg("ctaid.y")?)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let bases = batch_bases(kit, spec, bz)?;
    let (mdim, ndim, kdim) = (kit.dim(&spec.m)?, kit.dim(&spec.n)?, kit.dim(&spec.k)?);
    let (a_ptr, b_ptr) = (kit.buf(spec.a.buffer)?, kit.buf(spec.b.buffer)?);
    let (a_outer, a_ks) = (kit.dim(&spec.a.outer)?, kit.dim(&spec.a.ks)?);
    let kblocks = kit.udiv(kdim, kit.i64c(32))?;
    let warp = kit.zext64(kit.udiv(tid, kit.i32c(32))?)?;
    let lane = kit.zext64(kit.urem(tid, kit.i32c(32))?)?;
    let g = kit.udiv(lane, kit.i64c(4))?;
    let t = kit.urem(lane, kit.i64c(4))?;
    let m0 = kit.mul(by, kit.i64c(16))?;
    let cta_n0 = kit.mul(bx, kit.i64c(i64::from(s.columns())))?;
    let warp_n0 = kit.add(cta_n0, kit.mul(warp, kit.i64c(i64::from(8 * s.tiles)))?)?;
    let pitch = (s.chunk + 8) * 2;
    let smem = kit.shared(SharedKind::Static, s.shared_bytes())?;
    let steps = s.chunk / 32;
    let acc: Vec<[PointerValue; 4]> = (0..s.tiles).map(|_| Ok([kit.var_f(kit.f32c(0.0))?, kit.var_f(kit.f32c(0.0))?, kit.var_f(kit.f32c(0.0))?, kit.var_f(kit.f32c(0.0))?])).collect::<R<_>>()?;
    // Each thread's 16-byte pieces of the staged tile: 16 rows × chunk/8 pieces.
    let pieces = 16 * s.chunk / 8;
    let nwords = if q == DType::Q4_1 { 3 } else { 5 };
    let i32t = kit.i32t;
    // The B fragment words of the step starting at block `kb0`: one i32 variable per word
    // (zero for rows past N and blocks past K), every load issued before any is used.
    let load_words = |k: &Kit<'ctx>, kb0: IntValue<'ctx>| -> R<Vec<Vec<Vec<PointerValue<'ctx>>>>> {
        let mut words = Vec::with_capacity(s.tiles as usize);
        for tile in 0..s.tiles {
            let row = k.add(k.add(warp_n0, k.i64c(i64::from(8 * tile)))?, g)?;
            let row_ok = k.icmp(IntPredicate::SLT, row, ndim)?;
            let mut per_block = Vec::with_capacity(steps as usize);
            for j in 0..steps {
                let blk = k.add(kb0, k.i64c(i64::from(j)))?;
                let ok = k.and(row_ok, k.icmp(IntPredicate::SLT, blk, kblocks)?)?;
                let vars: Vec<PointerValue> = (0..nwords).map(|_| k.var_i(i32t.const_zero())).collect::<R<_>>()?;
                k.if_then(ok, |k| {
                    let block = k.add(k.mul(row, kblocks)?, blk)?;
                    let w = k.math(|b| crate::quant::fragment_words(b, q, b_ptr, block, t))?;
                    for (p, v) in vars.iter().zip(w) {
                        k.set(*p, v.into())?;
                    }
                    Ok(())
                })?;
                per_block.push(vars);
            }
            words.push(per_block);
        }
        Ok(words)
    };
    // With prefetch, `cur` holds the words of the step about to compute (loaded one step
    // ahead); the loop loads the next step's into fresh variables and moves them over.
    let cur = if s.prefetch { Some(load_words(kit, kit.i64c(0))?) } else { None };
    kit.for_range(kit.i64c(0), kit.add(kblocks, kit.i64c(i64::from(steps - 1)))?, kit.i64c(i64::from(steps)), |k, kb0| {
        // 1. The B fragment words: this step's (no prefetch) or the next step's (prefetch).
        let fresh = load_words(k, if s.prefetch { k.add(kb0, k.i64c(i64::from(steps)))? } else { kb0 })?;
        let this = cur.as_ref().unwrap_or(&fresh);
        let words: Vec<Vec<Vec<IntValue>>> = this.iter().map(|t| t.iter().map(|b| b.iter().map(|&p| k.get_i(p, i32t)).collect::<R<Vec<_>>>()).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
        // 2. The activation tile: 16 rows × chunk columns, zeros past M and K.
        let k0 = k.mul(kb0, k.i64c(32))?;
        for r in 0..pieces.div_ceil(s.threads()) {
            let piece = k.add(k.zext64(tid)?, k.i64c(i64::from(r * s.threads())))?;
            let inside = k.icmp(IntPredicate::SLT, piece, k.i64c(i64::from(pieces)))?;
            k.if_then(inside, |k| {
                let per_row = i64::from(s.chunk / 8);
                let (row, col) = (k.udiv(piece, k.i64c(per_row))?, k.mul(k.urem(piece, k.i64c(per_row))?, k.i64c(8))?);
                let m = k.add(m0, row)?;
                let kk = k.add(k0, col)?;
                let ok = k.and(k.icmp(IntPredicate::SLT, m, mdim)?, k.icmp(IntPredicate::SLT, kk, kdim)?)?;
                let aidx = k.add(bases.a, k.add(k.mul(m, a_outer)?, k.mul(kk, a_ks)?)?)?;
                let vals = k.guarded_load(ok, dt, a_ptr, aidx, 8, true, a_ks)?;
                let off = k.add(k.mul(k.trunc32(row)?, k.i32c(pitch as i32))?, k.mul(k.trunc32(col)?, k.i32c(2))?)?;
                k.sh_store(dt, k.sh_at(smem, off)?, &vals)
            })?;
        }
        k.barrier()?;
        // 3. Dequantise into the fragments; two MMAs a block.
        let g32 = k.trunc32(g)?;
        let t32 = k.trunc32(t)?;
        let a_word = |k: &Kit<'ctx>, row: IntValue<'ctx>, col: u32| -> R<IntValue<'ctx>> {
            // Row `row` (i32), columns `col + 2t`, `+1` of the staged tile, as one 32-bit word.
            let off = k.add(k.mul(row, k.i32c(pitch as i32))?, k.add(k.i32c(2 * col as i32), k.mul(t32, k.i32c(4))?)?)?;
            let p = k.sh_at(smem, off)?;
            k.math(|b| Ok(b.load(b.cx.i32_type().into(), p, 4)?.into_int_value()))
        };
        let g8 = k.add(g32, k.i32c(8))?;
        for j in 0..steps {
            let mut a_frags = Vec::with_capacity(2);
            for step in 0..2u32 {
                let col = 32 * j + 16 * step;
                a_frags.push([a_word(k, g32, col)?, a_word(k, g8, col)?, a_word(k, g32, col + 8)?, a_word(k, g8, col + 8)?]);
            }
            for (tile, per_block) in words.iter().enumerate() {
                let vals = k.math(|b| crate::quant::fragment_values(b, q, &per_block[j as usize]))?;
                let packed: Vec<IntValue> = vals.chunks(2).map(|p| k.math(|b| b.pack_x2(dt, p[0], p[1]))).collect::<R<_>>()?;
                let mut c = [k.get_f(acc[tile][0])?, k.get_f(acc[tile][1])?, k.get_f(acc[tile][2])?, k.get_f(acc[tile][3])?];
                for (step, a) in a_frags.iter().enumerate() {
                    c = k.mma(dt, *a, [packed[2 * step], packed[2 * step + 1]], c)?;
                }
                for (p, v) in acc[tile].iter().zip(c) {
                    k.set(*p, v.into())?;
                }
            }
        }
        // 4. The tile is rewritten by the next step; the prefetched words become current.
        if let Some(cur) = &cur {
            for (c, f) in cur.iter().flatten().flatten().zip(fresh.iter().flatten().flatten()) {
                k.set(*c, k.get_i(*f, i32t)?.into())?;
            }
        }
        k.barrier()
    })?;
    // The direct epilogue at each lane's four elements of each tile.
    for (tile, a) in acc.iter().enumerate() {
        let n_base = k_tile_col(kit, warp_n0, tile as u32, t)?;
        for (i, p) in a.iter().enumerate() {
            let m = kit.add(m0, kit.add(g, kit.i64c(if i >= 2 { 8 } else { 0 }))?)?;
            let n = kit.add(n_base, kit.i64c((i % 2) as i64))?;
            let ok = kit.and(kit.icmp(IntPredicate::SLT, m, mdim)?, kit.icmp(IntPredicate::SLT, n, ndim)?)?;
            let v = kit.get_f(*p)?;
            kit.if_then(ok, |k| epilogue_and_store(k, spec, &bases, m, n, v))?;
        }
    }
    Ok(())
}

/// The first of the two columns lane `t` holds in tile `tile` of a warp whose tiles start at
/// column `warp_n0`: `warp_n0 + 8·tile + 2t`.
fn k_tile_col<'ctx>(k: &Kit<'ctx>, warp_n0: IntValue<'ctx>, tile: u32, t: IntValue<'ctx>) -> R<IntValue<'ctx>> {
    k.add(k.add(warp_n0, k.i64c(i64::from(8 * tile)))?, k.mul(t, k.i64c(2))?)
}

/// The columns epilogue of the small-M kernel at R's element (row `m` of batch `z`, column
/// `n`): the accumulators of `cols` (n and its RoPE partners) are rounded to R's dtype into
/// the group's shared-memory copy of n's head of `head` columns (`tile`; written and read by
/// the same thread, so no barrier), which the evaluator reads as R (row stride 0, column
/// stride 1, based at the head's first column); then every output whose segment holds column
/// n is written ([`columns_output`]).
#[allow(clippy::too_many_arguments)]
fn small_m_columns<'ctx>(
    k: &Kit<'ctx>,
    spec: &Spec,
    (z, m, n): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    cols: &[IntValue<'ctx>],
    accs: &[FloatValue<'ctx>],
    (tile, head): (Option<PointerValue<'ctx>>, i64),
    segs: &[epilogue::Seg],
    appends: &[Option<epilogue::Append>],
) -> R<()> {
    let dt = spec.dtype;
    let arr = tile.ok_or_else(|| k.err("no staging tile for a columns epilogue"))?;
    let first = k.sub(n, k.urem(n, k.i64c(head))?)?;
    let es = dt.size_bytes() as i32;
    for (&col, &acc) in cols.iter().zip(accs) {
        let off = k.mul(k.trunc32(k.sub(col, first)?)?, k.i32c(es))?;
        k.sh_store(dt, k.sh_at(arr, off)?, &[acc])?;
    }
    let rank = spec.batch.len() + 2;
    let strides: Vec<Dim> = (0..rank).map(|i| Dim::constant(i64::from(i == rank - 1))).collect();
    let rbuf = Buf { ptr: k.gep_raw(dt, arr, k.sub(k.i64c(0), first)?)?, dtype: dt, strides, align: dt.size_bytes() as u32 };
    for (j, seg) in segs.iter().enumerate() {
        let (a, w) = (k.dim(&seg.start)?, k.dim(&seg.width)?);
        let c = k.sub(n, a)?;
        let inside = k.and(k.icmp(IntPredicate::SGE, c, k.i64c(0))?, k.icmp(IntPredicate::SLT, c, w)?)?;
        let append = appends.get(j).cloned().flatten();
        k.if_then(inside, |k| columns_output(k, spec, j, append.as_ref(), (z, m, c, w), vec![rbuf.clone()]))?;
    }
    Ok(())
}

/// A 16-byte chunk of an operand that one thread of the tensor-core kernel copies into every
/// stage (see [`mma_chunks`]).
struct Chunk<'ctx> {
    /// Element offset from the thread's first chunk (i64; a constant where the layout is).
    delta: IntValue<'ctx>,
    /// Byte offset of the chunk in a stage (i32).
    dst: IntValue<'ctx>,
    guard: ChunkGuard<'ctx>,
}

/// What decides how many of a chunk's bytes exist.
enum ChunkGuard<'ctx> {
    /// A K-contiguous slab: whether the chunk's row (M or N) exists (`None`: provably), and
    /// its first K element within the k-tile `kc` (i64); the bytes before K's end are read.
    Outer { ok: Option<IntValue<'ctx>>, kc: IntValue<'ctx> },
    /// An outer-contiguous slab: the chunk's K row within the k-tile is `row` (i64); where it
    /// is below K, `bytes` (i32) exist along M or N.
    K { row: IntValue<'ctx>, bytes: IntValue<'ctx> },
}

/// The chunks one thread copies of an operand's slab per stage (see [`mma_chunks`]).
struct Chunks<'ctx> {
    /// Element offset of the first chunk at k-tile 0 (i64).
    first: IntValue<'ctx>,
    chunks: Vec<Chunk<'ctx>>,
    /// Every k-tile is whole (K a provable multiple of `bk`): no K bounds to check.
    k_whole: bool,
}

/// The chunks thread `tid` copies of an operand's slab per stage: chunk `tid + i·threads`
/// of the slab's row-major chunks, for every `i`. `base` is the operand's element offset for
/// the CTA's batch; `outer_of(v)` maps the slab's outer index `v` (i32: a row of A's tile, a
/// virtual column of B's) to the operand's outer index, the index that decides whether it
/// exists and its bound ([`tile_column`]'s triple). `segments`: for a paired epilogue, the
/// sub-tile width and the segments' first columns (the slab's rows `v` are column
/// `start[v / sub] + tile·sub + v mod sub`), else `None` (`outer_of(v) = c + v`); either way
/// the chunks lie at distances known without `outer_of` (constants where the strides and
/// starts are, which ptxas folds into the copies' address offsets). `whole`: every CTA's tile
/// lies inside the bound (no outer bounds to check).
#[allow(clippy::too_many_arguments)]
fn mma_chunks<'ctx>(
    k: &Kit<'ctx>,
    spec: &Spec,
    op: &MatOperand,
    slab: &Slab,
    (bk, threads): (u32, u32),
    tid: IntValue<'ctx>,
    base: IntValue<'ctx>,
    (segments, whole): (Option<(u32, &[Dim])>, bool),
    outer_of: &dyn Fn(&Kit<'ctx>, IntValue<'ctx>) -> R<Bounded<'ctx>>,
) -> R<Chunks<'ctx>> {
    let c = slab.chunks();
    let (outer, ks) = (k.dim(&op.outer)?, k.dim(&op.ks)?);
    let k_whole = spec.k.div_exact(i64::from(bk)).is_some();
    let keeps_column = threads % c == 0;
    let step = threads / c;
    let mut first = None;
    let mut chunks: Vec<Chunk<'ctx>> = Vec::new();
    for i in 0..slab.rows * c / threads {
        // With threads a multiple of the chunks per row, a thread keeps its chunk column and
        // moves down `threads / c` rows per chunk.
        let (row, col) = if keeps_column {
            (k.add(k.udiv(tid, k.i32c(c as i32))?, k.i32c((i * step) as i32))?, k.urem(tid, k.i32c(c as i32))?)
        } else {
            let e = k.add(tid, k.i32c((i * threads) as i32))?;
            (k.udiv(e, k.i32c(c as i32))?, k.urem(e, k.i32c(c as i32))?)
        };
        // The swizzle repeats every 8 rows: chunk i's destination is then the first's plus a
        // constant (one register for all, the rest address offsets).
        let dst = match &chunks.first() {
            Some(c0) if keeps_column && step % 8 == 0 => k.add(c0.dst, k.i32c((i * step * slab.row_bytes()) as i32))?,
            _ => k.add(k.i32c(slab.base as i32), slab.offset(k, row, col)?)?,
        };
        // The chunk's first element along its row (K, or M/N for an outer-contiguous slab).
        let first_el = k.mul(col, k.i32c(slab.per_chunk() as i32))?;
        let kc = k.zext64(first_el)?;
        let (elem, guard) = if slab.k_contig {
            let (o, idx, limit) = outer_of(k, row)?;
            let ok = if whole { None } else { Some(k.icmp(IntPredicate::SLT, idx, limit)?) };
            (k.add(k.mul(o, outer)?, kc)?, ChunkGuard::Outer { ok, kc })
        } else {
            let (o, idx, limit) = outer_of(k, first_el)?;
            let row64 = k.zext64(row)?;
            let bytes = if whole { k.i32c(16) } else { clamp_bytes(k, k.sub(limit, idx)?, slab.es)? };
            (k.add(o, k.mul(row64, ks)?)?, ChunkGuard::K { row: row64, bytes })
        };
        let delta = match (first, segments) {
            (None, _) => {
                first = Some(elem);
                k.i64c(0)
            }
            // Chunk i is i·step rows below the first: i·step·(row stride) elements.
            (Some(_), None) if keeps_column => k.mul(k.i64c(i64::from(i * step)), if slab.k_contig { outer } else { ks })?,
            (Some(_), Some(_)) if keeps_column && !slab.k_contig => k.mul(k.i64c(i64::from(i * step)), ks)?,
            // Paired rows: the first row is below `step` and `sub` a multiple of `step`, so
            // row i·step + row₀ is in segment i·step / sub, at i·step mod sub in it.
            (Some(_), Some((sub, starts))) if keeps_column && sub % step == 0 => {
                let seg = ((i * step) / sub) as usize;
                let shift = k.sub(k.dim(&starts[seg])?, k.dim(&starts[0])?)?;
                k.mul(k.add(shift, k.i64c(i64::from((i * step) % sub)))?, outer)?
            }
            (Some(f), _) => k.sub(elem, f)?,
        };
        chunks.push(Chunk { delta, dst, guard });
    }
    let first = first.ok_or_else(|| k.err("a slab without chunks"))?;
    Ok(Chunks { first: k.add(base, first)?, chunks, k_whole })
}

/// `es·clamp(n, 0, 16/es)` as an i32: the bytes of a 16-byte chunk of `es`-byte elements (2
/// or 1) that exist when `n` (i64) elements are left.
fn clamp_bytes<'ctx>(k: &Kit<'ctx>, n: IntValue<'ctx>, es: u32) -> R<IntValue<'ctx>> {
    let n = k.smin(k.smax(n, k.i64c(0))?, k.i64c(i64::from(16 / es)))?;
    k.mul(k.trunc32(n)?, k.i32c(es as i32))
}

/// Issues one stage's `cp.async` copies of an operand: its chunks at k-tile offset `k0`
/// (i64, elements) into the stage at byte `stage` (i32) of `smem`, zero-filling what lies
/// past K, M or N.
fn issue_chunks<'ctx>(k: &Kit<'ctx>, op: &MatOperand, cs: &Chunks<'ctx>, k0: IntValue<'ctx>, kdim: IntValue<'ctx>, smem: PointerValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
    let ptr = k.buf(op.buffer)?;
    let at = k.gep_raw(op.dtype, ptr, k.add(cs.first, k.mul(k0, k.dim(&op.ks)?)?)?)?;
    let full = k.i32c(16);
    for c in &cs.chunks {
        let bytes = match c.guard {
            ChunkGuard::Outer { ok, kc } => {
                let left = if cs.k_whole { full } else { clamp_bytes(k, k.sub(kdim, k.add(k0, kc)?)?, op.dtype.size_bytes() as u32)? };
                match ok {
                    Some(ok) => k.select_i(ok, left, k.i32c(0))?,
                    None => left,
                }
            }
            ChunkGuard::K { row, bytes } => {
                if cs.k_whole {
                    bytes
                } else {
                    let inside = k.icmp(IntPredicate::SLT, k.add(k0, row)?, kdim)?;
                    k.select_i(inside, bytes, k.i32c(0))?
                }
            }
        };
        let src = k.gep_raw(op.dtype, at, c.delta)?;
        let dst = k.sh_at(smem, k.add(stage, c.dst)?)?;
        k.cp_async_16(dst, src, bytes)?;
    }
    Ok(())
}

/// The CTA's tile coordinates `(row tile, column tile)` (i64) from `ctaid.x` (row tiles) and
/// `ctaid.y` (column tiles), regrouped so that CTAs launched one after another cover `group`
/// row tiles × the column tiles in turn (the grouped ordering of Triton's matmul tutorial):
/// the A and B slabs a wave of CTAs reads then stay in L2.
fn raster<'ctx>(k: &Kit<'ctx>, group: u32) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    let x = k.zext64(k.sreg("ctaid.x")?)?;
    let y = k.zext64(k.sreg("ctaid.y")?)?;
    if group <= 1 {
        return Ok((x, y));
    }
    let nx = k.zext64(k.sreg("nctaid.x")?)?;
    let ny = k.zext64(k.sreg("nctaid.y")?)?;
    group_tiles(k, k.add(x, k.mul(y, nx)?)?, (nx, ny), group)
}

/// [`raster`]'s order: the `linear`-th tile (i64) of a grid of `nx` row tiles × `ny` column
/// tiles → `(row tile, column tile)`, `group` row tiles at a time.
fn group_tiles<'ctx>(k: &Kit<'ctx>, linear: IntValue<'ctx>, (nx, ny): (IntValue<'ctx>, IntValue<'ctx>), group: u32) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
    if group <= 1 {
        return Ok((k.urem(linear, nx)?, k.udiv(linear, nx)?));
    }
    let g = k.i64c(i64::from(group));
    let per_group = k.mul(g, ny)?;
    let first = k.mul(k.udiv(linear, per_group)?, g)?;
    let size = k.smin(k.sub(nx, first)?, g)?;
    let r = k.urem(linear, per_group)?;
    Ok((k.add(first, k.urem(r, size)?)?, k.udiv(r, size)?))
}

/// The tensor-core kernel (see [`MmaSchedule`] and the module docs).
///
/// Pipeline (as CUTLASS's `MmaMultistage`): the prologue issues the copies of k-tiles
/// `0 .. stages−1`, one `cp.async` group each; at k-tile `kt` the warps compute from stage
/// `kt mod stages` in `bk/16` steps, loading the fragments of step `kk+1` before the MMAs of
/// step `kk` (register double buffering); at the first step they issue k-tile
/// `kt + stages − 1` into the stage freed by k-tile `kt − 1`, and before the last step they
/// wait for k-tile `kt + 1` (`cp.async.wait_group stages−2`, then a barrier, which also
/// tells every thread that the stage about to be overwritten has been read), so that its
/// first fragments load while the last MMAs of `kt` issue.
/// The `cp.async` copies of a tensor-core kernel's pipeline stage ([`build_mma`],
/// [`build_wgmma`]): the 16-byte chunks of A's and B's slabs this thread copies per stage
/// ([`mma_chunks`]; B's in segments for the paired epilogue), and where they go.
struct StageLoads<'a, 'ctx> {
    spec: &'a Spec,
    bk: u32,
    a: Chunks<'ctx>,
    b: Chunks<'ctx>,
    kdim: IntValue<'ctx>,
    smem: PointerValue<'ctx>,
}

impl<'a, 'ctx> StageLoads<'a, 'ctx> {
    /// This thread's chunks of the CTA tile at row `m0` (i64) and column tile `pid_n` (i64).
    #[allow(clippy::too_many_arguments)]
    fn new(kit: &Kit<'ctx>, spec: &'a Spec, s: &MmaSchedule, plan: &MmaPlan, tid: IntValue<'ctx>, bases: &Bases<'ctx>, (m0, pid_n): (IntValue<'ctx>, IntValue<'ctx>), smem: PointerValue<'ctx>) -> R<Self> {
        let threads = s.threads();
        let (mdim, kdim) = (kit.dim(&spec.m)?, kit.dim(&spec.k)?);
        let a_whole = spec.m.div_exact(i64::from(s.bm)).is_some();
        let a = mma_chunks(kit, spec, &spec.a, &plan.a, (s.bk, threads), tid, bases.a, (None, a_whole), &|k, v| {
            let m = k.add(m0, k.zext64(v)?)?;
            Ok((m, m, mdim))
        })?;
        let starts: Vec<Dim>;
        let (b_segments, b_whole) = match &spec.epi {
            Epi::Paired { segs, width, .. } => {
                let sub = s.bn / segs.len() as u32;
                starts = segs.iter().map(|sg| sg.start.clone()).collect();
                (Some((sub, starts.as_slice())), width.div_exact(i64::from(sub)).is_some())
            }
            _ => (None, spec.n.div_exact(i64::from(s.bn)).is_some()),
        };
        let b = mma_chunks(kit, spec, &spec.b, &plan.b, (s.bk, threads), tid, bases.b, (b_segments, b_whole), &|k, v| tile_column(k, spec, s.bn, pid_n, v))?;
        Ok(StageLoads { spec, bk: s.bk, a, b, kdim, smem })
    }

    /// K tiles (i32: K < 2³¹·bk, a row of 2³⁷ 16-bit elements would not fit in a device's
    /// memory), saving the main loop a register pair.
    fn ktiles(&self, kit: &Kit<'ctx>) -> R<IntValue<'ctx>> {
        let bk = i64::from(self.bk);
        kit.trunc32(kit.udiv(kit.add(self.kdim, kit.i64c(bk - 1))?, kit.i64c(bk))?)
    }

    /// Issues K tile `kt`'s copies into the stage at byte offset `stage`.
    fn issue(&self, k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        let k0 = k.mul(k.zext64(kt)?, k.i64c(i64::from(self.bk)))?;
        issue_chunks(k, &self.spec.a, &self.a, k0, self.kdim, self.smem, stage)?;
        issue_chunks(k, &self.spec.b, &self.b, k0, self.kdim, self.smem, stage)
    }

    /// The pipeline's prologue: K tiles `0 … ahead − 1` (those that exist) into stages
    /// `0 … ahead − 1`, a commit group each.
    fn prologue(&self, kit: &Kit<'ctx>, ktiles: IntValue<'ctx>, ahead: u32, stage_bytes: u32) -> R<()> {
        for st in 0..ahead {
            kit.if_then(kit.icmp(IntPredicate::SLT, kit.i32c(st as i32), ktiles)?, |k| self.issue(k, k.i32c(st as i32), k.i32c((st * stage_bytes) as i32)))?;
            kit.cp_async_commit()?;
        }
        Ok(())
    }
}

fn build_mma<'ctx>(kit: &Kit<'ctx>, spec: &Spec, s: &MmaSchedule, plan: &MmaPlan) -> R<()> {
    let threads = s.threads();
    kit.launch_bounds(threads);
    let dt = spec.dtype;
    let (wm, wn) = s.warp_tile();
    let (mt, nt) = ((wm / 16) as usize, (wn / 8) as usize);
    let steps = s.bk / 16;
    let stages = s.stages;
    let tid = kit.sreg("tid.x")?;
    let lane = kit.and(tid, kit.i32c(31))?;
    let warp = kit.lshr(tid, 5)?;
    let warp_m = kit.urem(warp, kit.i32c(s.warps_m as i32))?;
    let warp_n = kit.udiv(warp, kit.i32c(s.warps_m as i32))?;
    let (pid_m, pid_n) = raster(kit, s.group_m)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let m0 = kit.mul(pid_m, kit.i64c(i64::from(s.bm)))?;
    let bases = batch_bases(kit, spec, bz)?;
    let smem = kit.shared(SharedKind::Dynamic(plan.smem_bytes), plan.smem_bytes)?;

    let loads = StageLoads::new(kit, spec, s, plan, tid, &bases, (m0, pid_n), smem)?;
    // k-tiles are counted in 32 bits (K < 2³¹·bk: a row of 2³⁷ 16-bit elements would not
    // fit in a device's memory), saving the main loop a register pair.
    let ktiles = loads.ktiles(kit)?;
    loads.prologue(kit, ktiles, stages - 1, plan.stage_bytes)?;
    let issue = |k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>| loads.issue(k, kt, stage);

    // Each lane's ldmatrix row address within a 16×16 (outer × K) block of a slab: lane
    // 8j + r points at row r of matrix j; A's matrices are (rows 0–7, k 0–7), (8–15, 0–7),
    // (0–7, 8–15), (8–15, 8–15) — its fragment registers a0..a3 — and B's (n 0–7, k 0–7),
    // (0–7, 8–15), (8–15, 0–7), (8–15, 8–15) — b0, b1 of two n8 tiles. `warp_o` is the
    // warp's first row (A) or column (B) of the CTA tile. The block at (outer 16·blk, K
    // 16·kk) is then at `lane_addr(kk, blk)` (see `frag_addr`): the swizzle XORs only chunk
    // bits, so block offsets along the chunk axis are XORs and along the row axis adds.
    let j = kit.lshr(lane, 3)?;
    let r = kit.and(lane, kit.i32c(7))?;
    let lane_base = |slab: &Slab, is_a: bool, warp_o: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let (hi, lo) = (kit.lshr(j, 1)?, kit.and(j, kit.i32c(1))?);
        let (o_off, k_off) = if is_a { (lo, hi) } else { (hi, lo) };
        let (row, chunk) = if slab.k_contig { (kit.add(kit.shl(o_off, 3)?, r)?, k_off) } else { (kit.add(kit.shl(k_off, 3)?, r)?, o_off) };
        let off = slab.offset(kit, row, chunk)?;
        if slab.k_contig {
            kit.add(off, kit.mul(warp_o, kit.i32c(slab.row_bytes() as i32))?)
        } else {
            kit.xor(off, kit.shl(warp_o, 1)?)
        }
    };
    let a_lane = lane_base(&plan.a, true, kit.mul(warp_m, kit.i32c(wm as i32))?)?;
    let b_lane = lane_base(&plan.b, false, kit.mul(warp_n, kit.i32c(wn as i32))?)?;
    let frag_addr = |k: &Kit<'ctx>, slab: &Slab, lane_off: IntValue<'ctx>, stage: IntValue<'ctx>, kk: u32, blk: u32| -> R<PointerValue<'ctx>> {
        let rb = slab.row_bytes();
        let (xor, add) = if slab.k_contig { (32 * kk, 16 * blk * rb) } else { (32 * blk, 16 * kk * rb) };
        let off = k.add(k.xor(lane_off, k.i32c(xor as i32))?, k.i32c((add + slab.base) as i32))?;
        k.sh_at(smem, k.add(stage, off)?)
    };

    // Accumulators acc[mi][ni][0..4] and two buffers of fragments (i32 registers).
    let zero = kit.f32c(0.0);
    let acc: Vec<PointerValue> = (0..mt * nt * 4).map(|_| kit.var_f(zero)).collect::<R<_>>()?;
    let fa: Vec<PointerValue> = (0..2 * mt * 4).map(|_| kit.var_i(kit.i32c(0))).collect::<R<_>>()?;
    let fb: Vec<PointerValue> = (0..2 * nt * 2).map(|_| kit.var_i(kit.i32c(0))).collect::<R<_>>()?;
    let load_frags = |k: &Kit<'ctx>, kk: u32, stage: IntValue<'ctx>, buf: usize| -> R<()> {
        for mi in 0..mt {
            let v = k.ldmatrix_x4(frag_addr(k, &plan.a, a_lane, stage, kk, mi as u32)?, !plan.a.k_contig)?;
            for (q, x) in v.iter().enumerate() {
                k.set(fa[(buf * mt + mi) * 4 + q], (*x).into())?;
            }
        }
        for p in 0..nt / 2 {
            let v = k.ldmatrix_x4(frag_addr(k, &plan.b, b_lane, stage, kk, p as u32)?, !plan.b.k_contig)?;
            for (q, x) in v.iter().enumerate() {
                // Registers 0, 1: n8 tile 2p; 2, 3: tile 2p + 1.
                k.set(fb[(buf * nt + 2 * p + q / 2) * 2 + q % 2], (*x).into())?;
            }
        }
        Ok(())
    };
    let mmas = |k: &Kit<'ctx>, buf: usize| -> R<()> {
        let i32t = k.i32t;
        for mi in 0..mt {
            let fr = |q: usize| k.get_i(fa[(buf * mt + mi) * 4 + q], i32t);
            let a = [fr(0)?, fr(1)?, fr(2)?, fr(3)?];
            for jn in 0..nt {
                // Serpentine over the n8 tiles (consecutive MMAs share a B fragment).
                let ni = if mi % 2 == 0 { jn } else { nt - 1 - jn };
                let b = [k.get_i(fb[(buf * nt + ni) * 2], i32t)?, k.get_i(fb[(buf * nt + ni) * 2 + 1], i32t)?];
                let at = (mi * nt + ni) * 4;
                let c = [k.get_f(acc[at])?, k.get_f(acc[at + 1])?, k.get_f(acc[at + 2])?, k.get_f(acc[at + 3])?];
                let d = k.mma(dt, a, b, c)?;
                for (q, v) in d.iter().enumerate() {
                    k.set(acc[at + q], (*v).into())?;
                }
            }
        }
        Ok(())
    };
    let next_stage = |k: &Kit<'ctx>, v: PointerValue<'ctx>| -> R<()> {
        let cur = k.get_i(v, k.i32t)?;
        let nxt = k.add(cur, k.i32c(plan.stage_bytes as i32))?;
        let wrap = k.icmp(IntPredicate::EQ, nxt, k.i32c((stages * plan.stage_bytes) as i32))?;
        k.set(v, k.select_i(wrap, k.i32c(0), nxt)?.into())
    };

    kit.cp_async_wait(stages - 2)?;
    kit.barrier()?;
    let read = kit.var_i(kit.i32c(0))?;
    let write = kit.var_i(kit.i32c(((stages - 1) * plan.stage_bytes) as i32))?;
    load_frags(kit, 0, kit.i32c(0), 0)?;
    kit.for_range(kit.i32c(0), ktiles, kit.i32c(1), |k, kt| {
        for kk in 0..steps {
            if kk == steps - 1 {
                k.cp_async_wait(stages - 2)?;
                k.barrier()?;
                next_stage(k, read)?;
            }
            let rs = k.get_i(read, k.i32t)?;
            load_frags(k, (kk + 1) % steps, rs, ((kk + 1) % 2) as usize)?;
            if kk == 0 {
                let nk = k.add(kt, k.i32c((stages - 1) as i32))?;
                let ws = k.get_i(write, k.i32t)?;
                k.if_then(k.icmp(IntPredicate::SLT, nk, ktiles)?, |k| issue(k, nk, ws))?;
                k.cp_async_commit()?;
                next_stage(k, write)?;
            }
            mmas(k, (kk % 2) as usize)?;
        }
        Ok(())
    })?;
    kit.cp_async_wait(0)?;

    let tile = MmaTile { mt, nt, wm, wn, warps_m: s.warps_m, bm: s.bm, bn: s.bn, threads, first_thread: 0, m0, pid_n, bz };
    mma_epilogue(kit, spec, plan, smem, &acc, &tile, &bases)
}

/// One warpgroup's `wgmma` products of a K tile ([`build_wgmma`], [`build_wgmma_ws`]): the
/// matrix descriptors (PTX ISA §9.7.15.5.1: start address >> 4 in bits 0–13, leading byte
/// offset — unused for swizzled K-major operands: 1 — in 16–29, stride byte offset 1024 >> 4 in
/// 32–45, 128-byte swizzle (1) in 62–63) of the warpgroup's A rows and the CTA's B rows in a
/// stage, stepped `k_step_bytes` per instruction (16 of K for bf16/f16, 32 for e4m3).
struct WgmmaProducts<'ctx> {
    a_wg: IntValue<'ctx>,
    b_cta: IntValue<'ctx>,
    dt: DType,
    ik: u32,
    k_step_bytes: u32,
    bk: u32,
    bn: u32,
    in_flight: u32,
}

impl<'ctx> WgmmaProducts<'ctx> {
    /// The products of warpgroup `wg` (i32) over the slabs at shared address `sbase` (i32).
    fn new(kit: &Kit<'ctx>, spec: &Spec, w: &WgmmaSchedule, plan: &MmaPlan, sbase: IntValue<'ctx>, wg: IntValue<'ctx>) -> R<Self> {
        let dt = spec.a.dtype;
        let ik = crate::emit::wgmma_k(dt).ok_or_else(|| kit.err(format!("wgmma of {dt} operands")))?;
        let a_wg = kit.add(sbase, kit.add(kit.mul(wg, kit.i32c((64 * plan.a.row_bytes()) as i32))?, kit.i32c(plan.a.base as i32))?)?;
        let b_cta = kit.add(sbase, kit.i32c(plan.b.base as i32))?;
        Ok(WgmmaProducts { a_wg, b_cta, dt, ik, k_step_bytes: ik * dt.size_bytes() as u32, bk: w.tile.bk, bn: w.tile.bn, in_flight: w.in_flight })
    }

    /// Issues the K tile in the stage at byte offset `stage` (i32) onto the accumulators `acc`
    /// (their variables, updated in place; [`KernelBuilder::wgmma_k_tile`]).
    fn k_tile(&self, k: &Kit<'ctx>, stage: IntValue<'ctx>, acc: &[PointerValue<'ctx>]) -> R<()> {
        let desc_fixed = k.i64c((1i64 << 16) | (64i64 << 32) | (1i64 << 62));
        let desc = |addr: IntValue<'ctx>| -> R<IntValue<'ctx>> {
            let enc = k.lshr(k.and(addr, k.i32c(0x3FFFF))?, 4)?;
            k.add(desc_fixed, k.zext64(enc)?)
        };
        let mut descs = Vec::with_capacity((self.bk / self.ik) as usize);
        for kk in 0..self.bk / self.ik {
            let off = k.add(stage, k.i32c((self.k_step_bytes * kk) as i32))?;
            descs.push((desc(k.add(self.a_wg, off)?)?, desc(k.add(self.b_cta, off)?)?));
        }
        let cur: Vec<FloatValue> = acc.iter().map(|&p| k.get_f(p)).collect::<R<_>>()?;
        let out = k.wgmma_k_tile(self.dt, self.bn, &cur, &descs, self.in_flight)?;
        for (&p, v) in acc.iter().zip(out) {
            k.set(p, v.into())?;
        }
        Ok(())
    }
}

/// The TMA loads of the wgmma kernel's pipeline ([`WgmmaSchedule::tma`], PTX ISA §9.7.9.25.5.2
/// and §9.7.13.15 "mbarrier"): stage `i` has an mbarrier (arrival count 1); thread 0 fills a
/// stage by arriving with the expected transaction bytes (A's and B's boxes) and issuing one
/// `cp.async.bulk.tensor` per operand from its tensor map (`Kit` maps 0 and 1,
/// [`Spec::tma_maps`]), which completes the barrier's phase as the bytes land; every thread
/// waits on the phase's parity (`(kt / stages) mod 2` for K tile `kt`) before reading the
/// stage. The boxes land 128-byte swizzled, as the descriptors expect.
struct TmaLoads<'ctx> {
    /// Shared address of stage 0's mbarrier (i32).
    bars: IntValue<'ctx>,
    /// Shared address of the dynamic shared memory (i32).
    sbase: IntValue<'ctx>,
    /// Whether this is thread 0 (i1).
    leader: IntValue<'ctx>,
    /// The box coordinates after K: (M row, N column, batch coordinates…) for A and B (i32).
    a_at: Vec<IntValue<'ctx>>,
    b_at: Vec<IntValue<'ctx>>,
    a_base: u32,
    b_base: u32,
    tx_bytes: u32,
    stage_bytes: u32,
    stages: u32,
    bk: u32,
}

impl<'ctx> TmaLoads<'ctx> {
    /// Initialises the stages' mbarriers (thread 0, then a fence and a CTA barrier).
    #[allow(clippy::too_many_arguments)]
    fn new(kit: &Kit<'ctx>, spec: &Spec, s: &MmaSchedule, plan: &MmaPlan, tid: IntValue<'ctx>, bases: &Bases<'ctx>, (m0, pid_n): (IntValue<'ctx>, IntValue<'ctx>), smem: PointerValue<'ctx>) -> R<Self> {
        let bars = kit.mbarriers(s.stages)?;
        let leader = kit.icmp(IntPredicate::EQ, tid, kit.i32c(0))?;
        kit.if_then(leader, |k| {
            for i in 0..s.stages {
                k.mbarrier_init(k.add(bars, k.i32c((8 * i) as i32))?, 1)?;
            }
            k.fence_mbarrier_init()
        })?;
        kit.barrier()?;
        let n0 = kit.mul(pid_n, kit.i64c(i64::from(s.bn)))?;
        let at = |op: &MatOperand, outer: IntValue<'ctx>| tma_box_at(kit, op, outer, bases);
        Ok(TmaLoads {
            bars,
            sbase: kit.smem_addr(smem)?,
            leader,
            a_at: at(&spec.a, m0)?,
            b_at: at(&spec.b, n0)?,
            a_base: plan.a.base,
            b_base: plan.b.base,
            tx_bytes: plan.a.bytes() + plan.b.bytes(),
            stage_bytes: plan.stage_bytes,
            stages: s.stages,
            bk: s.bk,
        })
    }

    /// The mbarrier of the stage at byte offset `stage` (i32).
    fn bar(&self, k: &Kit<'ctx>, stage: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let idx = k.udiv(stage, k.i32c(self.stage_bytes as i32))?;
        k.add(self.bars, k.shl(idx, 3)?)
    }

    /// Thread 0 issues K tile `kt`'s boxes into the stage at byte offset `stage`.
    fn issue(&self, k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        k.if_then(self.leader, |k| {
            let bar = self.bar(k, stage)?;
            k.mbarrier_arrive_expect_tx(bar, self.tx_bytes)?;
            let k0 = k.mul(kt, k.i32c(self.bk as i32))?;
            let dst = k.add(self.sbase, stage)?;
            let mut a = vec![k0];
            a.extend(self.a_at.iter().copied());
            k.tma_load(k.add(dst, k.i32c(self.a_base as i32))?, 0, &a, bar)?;
            let mut b = vec![k0];
            b.extend(self.b_at.iter().copied());
            k.tma_load(k.add(dst, k.i32c(self.b_base as i32))?, 1, &b, bar)
        })
    }

    /// Waits until K tile `kt`'s boxes are in the stage at byte offset `stage`.
    fn wait(&self, k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>) -> R<()> {
        let parity = k.and(k.udiv(kt, k.i32c(self.stages as i32))?, k.i32c(1))?;
        k.mbarrier_wait_parity(self.bar(k, stage)?, parity)
    }

    /// K tiles `0 … ahead − 1` (those that exist) into stages `0 … ahead − 1`.
    fn prologue(&self, kit: &Kit<'ctx>, ktiles: IntValue<'ctx>, ahead: u32) -> R<()> {
        for st in 0..ahead {
            kit.if_then(kit.icmp(IntPredicate::SLT, kit.i32c(st as i32), ktiles)?, |k| self.issue(k, k.i32c(st as i32), k.i32c((st * self.stage_bytes) as i32)))?;
        }
        Ok(())
    }
}

/// The coordinates after K of an operand's TMA box (i32): its first row along M or N
/// (`outer`, i64), then the batch coordinates of `bases` along the axes the operand is not
/// broadcast on (the tensor map's axes, [`Spec::tma_maps`]).
fn tma_box_at<'ctx>(kit: &Kit<'ctx>, op: &MatOperand, outer: IntValue<'ctx>, bases: &Bases<'ctx>) -> R<Vec<IntValue<'ctx>>> {
    let mut v = vec![kit.trunc32(outer)?];
    for (c, st) in bases.coords.iter().zip(&op.batch_strides) {
        if st.as_const() != Some(0) {
            v.push(kit.trunc32(*c)?);
        }
    }
    Ok(v)
}

/// The stage loads of the wgmma kernel: every thread's `cp.async` chunks or the TMA's boxes.
enum WgmmaLoads<'a, 'ctx> {
    Chunks(StageLoads<'a, 'ctx>),
    Tma(TmaLoads<'ctx>),
}

/// The Hopper tensor-core GEMM ([`MatmulSchedule::Wgmma`], sm_90a): the pipeline of
/// [`build_mma`] — every thread copies its 16-byte chunks of A's and B's slabs of a stage
/// with `cp.async` into 128-byte-swizzled rows, `stages − 1` K tiles in flight — with the
/// products on warpgroup MMAs (PTX ISA §9.7.15, `wgmma.mma_async` m64nNk16 for bf16/f16,
/// m64nNk32 `.e4m3.e4m3` for the fp8 matmul, both operands
/// read by the tensor cores straight from shared memory through matrix descriptors:
/// no `ldmatrix`, no fragment registers). Warpgroup `j` (threads `128j …`) owns rows
/// `64j … 64j + 63` of the CTA tile and all its `bn` columns: `bn/2` f32 accumulators per
/// thread. Per K tile: wait for its copies, `fence.proxy.async.shared::cta` (the copies are
/// generic-proxy writes, `wgmma` reads through the async proxy), a CTA barrier, `bk/16`
/// (`bk/32` for e4m3: four either way)
/// `wgmma`s committed as one group and waited for ([`KernelBuilder::wgmma_k_tile`]), then
/// the copies of K tile `kt + stages − 1` into the stage K tile `kt − 1` used (every
/// warpgroup has finished with it: it waited for its products before this tile's barrier).
///
/// The slab layout is [`Slab`]'s: for `bk` = 64 16-bit or 128 8-bit elements, rows of 128
/// bytes whose 16-byte chunks are XOR-swizzled by `row mod 8` — exactly the K-major
/// 128-byte-swizzle canonical layout of §9.7.15.5.1 (8-row, 1024-byte swizzle atoms, stacked
/// along M/N: stride byte offset 1024; the leading byte offset unused), given a
/// 1024-byte-aligned slab; the layout is defined in bytes (16-byte units), so the same
/// descriptors serve both element sizes. A `k16` (bf16/f16) or `k32` (e4m3) step advances a
/// descriptor's start address by 32 bytes inside the atom.
///
/// **fp8** ([`Spec::fp8`]): A and B are the `f8e4m3` bytes of `dequantize_fp8(a8, scale_a)`
/// and `dequantize_fp8(b8, scale_b)`, copied as stored; the products of the e4m3 values
/// accumulate in f32 on the tensor cores, and after the last K tile every accumulator is
/// multiplied by `scale_a · scale_b` (the two f32 scalars loaded once) before the shared
/// epilogue rounds R to its dtype. The unfused graph instead rounds each dequantised operand
/// to the `dequantize_fp8` dtype before the product (for bf16, a relative 2⁻⁹ per element);
/// the fused kernel computes the exact products — as `torch._scaled_mm` and cuBLAS do — so
/// it differs from the interpreter by those roundings as well as by the accumulation order.
fn build_wgmma<'ctx>(kit: &Kit<'ctx>, spec: &Spec, w: &WgmmaSchedule, plan: &MmaPlan) -> R<()> {
    if w.specialized {
        return build_wgmma_ws(kit, spec, w, plan);
    }
    let s = &w.tile;
    let threads = s.threads();
    kit.launch_bounds(threads);
    let stages = s.stages;
    let tid = kit.sreg("tid.x")?;
    let wg = kit.lshr(tid, 7)?;
    let (pid_m, pid_n) = raster(kit, s.group_m)?;
    let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
    let m0 = kit.mul(pid_m, kit.i64c(i64::from(s.bm)))?;
    let bases = batch_bases(kit, spec, bz)?;
    let smem = kit.shared(SharedKind::Dynamic(plan.smem_bytes), plan.smem_bytes)?;
    kit.align_dynamic_shared(1024)?;

    let loads = if w.tma {
        WgmmaLoads::Tma(TmaLoads::new(kit, spec, s, plan, tid, &bases, (m0, pid_n), smem)?)
    } else {
        WgmmaLoads::Chunks(StageLoads::new(kit, spec, s, plan, tid, &bases, (m0, pid_n), smem)?)
    };
    let kdim = kit.dim(&spec.k)?;
    let bk = i64::from(s.bk);
    let ktiles = kit.trunc32(kit.udiv(kit.add(kdim, kit.i64c(bk - 1))?, kit.i64c(bk))?)?;
    // K tiles the copies run ahead: a stage is refilled once no warpgroup's products can
    // still read it (with a group left in flight, the one two tiles back).
    let ahead = stages - 1 - w.in_flight;
    if ahead < 1 {
        return Err(kit.err(format!("{w:?}: too few stages")));
    }
    match &loads {
        WgmmaLoads::Chunks(l) => l.prologue(kit, ktiles, ahead, plan.stage_bytes)?,
        WgmmaLoads::Tma(l) => l.prologue(kit, ktiles, ahead)?,
    }
    let issue = |k: &Kit<'ctx>, kt: IntValue<'ctx>, stage: IntValue<'ctx>| match &loads {
        WgmmaLoads::Chunks(l) => l.issue(k, kt, stage),
        WgmmaLoads::Tma(l) => l.issue(k, kt, stage),
    };

    let products = WgmmaProducts::new(kit, spec, w, plan, kit.smem_addr(smem)?, wg)?;

    let n_acc = (s.bn / 2) as usize;
    let zero = kit.f32c(0.0);
    let acc: Vec<PointerValue> = (0..n_acc).map(|_| kit.var_f(zero)).collect::<R<_>>()?;
    let next_stage = |k: &Kit<'ctx>, v: PointerValue<'ctx>| -> R<()> {
        let cur = k.get_i(v, k.i32t)?;
        let nxt = k.add(cur, k.i32c(plan.stage_bytes as i32))?;
        let wrap = k.icmp(IntPredicate::EQ, nxt, k.i32c((stages * plan.stage_bytes) as i32))?;
        k.set(v, k.select_i(wrap, k.i32c(0), nxt)?.into())
    };
    let read = kit.var_i(kit.i32c(0))?;
    let write = kit.var_i(kit.i32c((ahead * plan.stage_bytes) as i32))?;
    kit.for_range(kit.i32c(0), ktiles, kit.i32c(1), |k, kt| {
        let rs = k.get_i(read, k.i32t)?;
        match &loads {
            WgmmaLoads::Chunks(_) => {
                k.cp_async_wait(ahead - 1)?;
                k.fence_proxy_async()?;
            }
            // The TMA writes through the async proxy, as wgmma reads: no proxy fence.
            WgmmaLoads::Tma(l) => l.wait(k, kt, rs)?,
        }
        k.barrier()?;
        products.k_tile(k, rs, &acc)?;
        next_stage(k, read)?;
        let nk = k.add(kt, k.i32c(ahead as i32))?;
        let ws = k.get_i(write, k.i32t)?;
        k.if_then(k.icmp(IntPredicate::SLT, nk, ktiles)?, |k| issue(k, nk, ws))?;
        if !w.tma {
            k.cp_async_commit()?;
        }
        next_stage(k, write)
    })?;
    if !w.tma {
        kit.cp_async_wait(0)?;
    }
    if w.in_flight > 0 {
        // The last group, waited for with the accumulators as its operands.
        let cur: Vec<FloatValue> = acc.iter().map(|&p| kit.get_f(p)).collect::<R<_>>()?;
        let out = kit.wgmma_wait(&cur)?;
        for (&p, v) in acc.iter().zip(out) {
            kit.set(p, v.into())?;
        }
    }
    if let Some(scales) = spec.fp8 {
        // The fp8 matmul's dequantisation, once per accumulator: Σ a8·b8 · (scale_a·scale_b).
        let scale = kit.fmul(fp8_scale(kit, scales[0])?, fp8_scale(kit, scales[1])?)?;
        for &p in &acc {
            kit.set(p, kit.fmul(kit.get_f(p)?, scale)?.into())?;
        }
    }
    let tile = MmaTile { mt: 1, nt: (s.bn / 8) as usize, wm: 16, wn: s.bn, warps_m: s.warps_m, bm: s.bm, bn: s.bn, threads, first_thread: 0, m0, pid_n, bz };
    mma_epilogue(kit, spec, plan, smem, &acc, &tile, &bases)
}

/// Runs `body(kit, row tile, column tile, batch index)` (i64s) for each output tile this CTA
/// computes: with [`WgmmaSchedule::ctas`] 0, the CTA's one tile ([`raster`] of `ctaid.x/y`,
/// batch `ctaid.z`); otherwise the persistent walk — tiles `ctaid.x + i·nctaid.x` of the
/// `⌈M/bm⌉ · ⌈N/bn⌉ · batch` tiles, batch-major, each batch's tiles in [`group_tiles`]'s
/// order. Every role of the warp-specialised kernel walks the same sequence.
fn for_each_tile<'ctx>(kit: &Kit<'ctx>, spec: &Spec, w: &WgmmaSchedule, body: impl Fn(&Kit<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>) -> R<()>) -> R<()> {
    let s = &w.tile;
    if w.ctas == 0 {
        let (pid_m, pid_n) = raster(kit, s.group_m)?;
        let bz = kit.zext64(kit.sreg("ctaid.z")?)?;
        return body(kit, pid_m, pid_n, bz);
    }
    let ceil = |d: &Dim, by: u32| -> R<IntValue<'ctx>> { kit.udiv(kit.add(kit.dim(d)?, kit.i64c(i64::from(by) - 1))?, kit.i64c(i64::from(by))) };
    let (tm, tn) = (ceil(&spec.m, s.bm)?, ceil(&spec.n, s.bn)?);
    let per_batch = kit.mul(tm, tn)?;
    let total = kit.mul(per_batch, kit.dim(&Dim::product(&spec.batch))?)?;
    let first = kit.zext64(kit.sreg("ctaid.x")?)?;
    let step = kit.zext64(kit.sreg("nctaid.x")?)?;
    kit.for_range(first, total, step, |k, t| {
        let bz = k.udiv(t, per_batch)?;
        let (pid_m, pid_n) = group_tiles(k, k.urem(t, per_batch)?, (tm, tn), s.group_m)?;
        body(k, pid_m, pid_n, bz)
    })
}

/// The warp-specialised Hopper GEMM ([`WgmmaSchedule::specialized`], sm_90a; the
/// producer/consumer split of CUTLASS's `KernelTmaWarpSpecialized*`), 384 threads:
///
/// - **warpgroup 0, the producer**: `setmaxnreg.dec` to [`WS_PRODUCER_REGS`]; thread 0
///   alone then walks the K tiles of its tiles: waits on stage `s`'s *empty* mbarrier, arrives
///   on its *full* mbarrier with the boxes' transaction bytes and issues the two
///   `cp.async.bulk.tensor` copies (PTX ISA §9.7.9.25.5.2) that complete it. Its other 127
///   threads exit.
/// - **warpgroups 1 and 2, the consumers**: `setmaxnreg.inc` to [`WS_CONSUMER_REGS`];
///   consumer warpgroup `j` (threads `128 + 128j …`) owns rows `64j … 64j + 63` of the CTA
///   tile, as in [`build_wgmma`]. Per K tile: wait on the stage's *full* mbarrier, one group
///   of `bk/16` `wgmma`s ([`KernelBuilder::wgmma_k_tile`], `wgmma.wait_group in_flight`),
///   then free the stage whose products are known complete — this tile's with `in_flight`
///   0, the previous tile's with 1 (the last one after the final `wgmma.wait_group 0`) —
///   by an arrival on its *empty* mbarrier from lane 0 of every consumer warp (the wait is
///   `.sync.aligned`: the warp is converged and its products done). Then the direct
///   epilogue ([`mma_epilogue`], from registers: no shared memory, so it overlaps the
///   producer's copies for the next tile).
///
/// Mbarriers (PTX ISA §9.7.13.15), `2·stages` of them in static shared memory: *full* `i`
/// at `8i` (arrival count 1: the producer's `arrive.expect_tx`, then the TMA's bytes),
/// *empty* `i` at `8(stages + i)` (arrival count: the consumer warps, `bm/16` = 8). Both
/// sides count K tiles across output tiles with a stage index and a phase bit that flips
/// each time the stage index wraps; a consumer waits for the full barrier's phase of that
/// parity, the producer for the empty barrier's previous phase (parity flipped: on the
/// first round a fresh barrier's "previous phase" counts as complete, so the stages start
/// free). The only CTA-wide barrier is the one publishing the barriers' initialisation.
///
/// With [`WgmmaSchedule::ctas`] > 0 the CTAs are persistent ([`for_each_tile`]): the stage
/// counters run on across tiles, so the producer fills the first stages of tile `i + 1`
/// while the consumers finish and write tile `i`.
///
/// The launch bound is 384 threads, so ptxas budgets at most 65536/384 = 168 registers per
/// thread for the kernel; `setmaxnreg` then moves them between the roles.
fn build_wgmma_ws<'ctx>(kit: &Kit<'ctx>, spec: &Spec, w: &WgmmaSchedule, plan: &MmaPlan) -> R<()> {
    let s = &w.tile;
    spec.ws_ok(w).map_err(|e| kit.err(e))?;
    kit.launch_bounds(w.threads());
    let stages = s.stages;
    let stage_bytes = plan.stage_bytes;
    let tid = kit.sreg("tid.x")?;
    let smem = kit.shared(SharedKind::Dynamic(plan.smem_bytes), plan.smem_bytes)?;
    kit.align_dynamic_shared(1024)?;
    let sbase = kit.smem_addr(smem)?;
    let bars = kit.mbarriers(2 * stages)?;
    kit.if_then(kit.icmp(IntPredicate::EQ, tid, kit.i32c(0))?, |k| {
        for i in 0..stages {
            k.mbarrier_init(k.add(bars, k.i32c((8 * i) as i32))?, 1)?;
            k.mbarrier_init(k.add(bars, k.i32c((8 * (stages + i)) as i32))?, s.threads() / 32)?;
        }
        k.fence_mbarrier_init()
    })?;
    kit.barrier()?;
    let full = |k: &Kit<'ctx>, st: IntValue<'ctx>| k.add(bars, k.shl(st, 3)?);
    let empty = |k: &Kit<'ctx>, st: IntValue<'ctx>| k.add(bars, k.shl(k.add(st, k.i32c(stages as i32))?, 3)?);
    // (stage, phase) += 1 K tile.
    let advance = |k: &Kit<'ctx>, st: PointerValue<'ctx>, ph: PointerValue<'ctx>| -> R<()> {
        let nxt = k.add(k.get_i(st, k.i32t)?, k.i32c(1))?;
        let wrap = k.icmp(IntPredicate::EQ, nxt, k.i32c(stages as i32))?;
        k.set(st, k.select_i(wrap, k.i32c(0), nxt)?.into())?;
        k.set(ph, k.select_i(wrap, k.xor(k.get_i(ph, k.i32t)?, k.i32c(1))?, k.get_i(ph, k.i32t)?)?.into())
    };
    let kdim = kit.dim(&spec.k)?;
    let bk = i64::from(s.bk);
    let ktiles = kit.trunc32(kit.udiv(kit.add(kdim, kit.i64c(bk - 1))?, kit.i64c(bk))?)?;
    let producer = kit.icmp(IntPredicate::ULT, tid, kit.i32c(128))?;
    kit.if_else(
        producer,
        |k| {
            k.setmaxnreg(false, WS_PRODUCER_REGS)?;
            k.if_then(k.icmp(IntPredicate::EQ, tid, k.i32c(0))?, |k| {
                let (st, ph) = (k.var_i(k.i32c(0))?, k.var_i(k.i32c(0))?);
                let tx = plan.a.bytes() + plan.b.bytes();
                for_each_tile(k, spec, w, |k, pid_m, pid_n, bz| {
                    let bases = batch_bases(k, spec, bz)?;
                    let a_at = tma_box_at(k, &spec.a, k.mul(pid_m, k.i64c(i64::from(s.bm)))?, &bases)?;
                    let b_at = tma_box_at(k, &spec.b, k.mul(pid_n, k.i64c(i64::from(s.bn)))?, &bases)?;
                    k.for_range(k.i32c(0), ktiles, k.i32c(1), |k, kt| {
                        let stv = k.get_i(st, k.i32t)?;
                        k.mbarrier_wait_parity(empty(k, stv)?, k.xor(k.get_i(ph, k.i32t)?, k.i32c(1))?)?;
                        let bar = full(k, stv)?;
                        k.mbarrier_arrive_expect_tx(bar, tx)?;
                        let dst = k.add(sbase, k.mul(stv, k.i32c(stage_bytes as i32))?)?;
                        let k0 = k.mul(kt, k.i32c(s.bk as i32))?;
                        for (map, base, at) in [(0, plan.a.base, &a_at), (1, plan.b.base, &b_at)] {
                            let mut c = vec![k0];
                            c.extend(at.iter().copied());
                            k.tma_load(k.add(dst, k.i32c(base as i32))?, map, &c, bar)?;
                        }
                        advance(k, st, ph)
                    })
                })
            })
        },
        |k| {
            k.setmaxnreg(true, WS_CONSUMER_REGS)?;
            let cwg = k.lshr(k.sub(tid, k.i32c(128))?, 7)?;
            let lane0 = k.icmp(IntPredicate::EQ, k.and(tid, k.i32c(31))?, k.i32c(0))?;
            let release = |k: &Kit<'ctx>, stv: IntValue<'ctx>| k.if_then(lane0, |k| k.mbarrier_arrive(empty(k, stv)?));
            let products = WgmmaProducts::new(k, spec, w, plan, sbase, cwg)?;
            let zero = k.f32c(0.0);
            let acc: Vec<PointerValue> = (0..s.bn / 2).map(|_| k.var_f(zero)).collect::<R<_>>()?;
            let (st, ph, prev) = (k.var_i(k.i32c(0))?, k.var_i(k.i32c(0))?, k.var_i(k.i32c(0))?);
            for_each_tile(k, spec, w, |k, pid_m, pid_n, bz| {
                for &p in &acc {
                    k.set(p, zero.into())?;
                }
                k.for_range(k.i32c(0), ktiles, k.i32c(1), |k, kt| {
                    let stv = k.get_i(st, k.i32t)?;
                    k.mbarrier_wait_parity(full(k, stv)?, k.get_i(ph, k.i32t)?)?;
                    let rs = k.mul(stv, k.i32c(stage_bytes as i32))?;
                    products.k_tile(k, rs, &acc)?;
                    if w.in_flight == 0 {
                        release(k, stv)?;
                    } else {
                        // K tile kt − 1's products are complete: free its stage.
                        k.if_then(k.icmp(IntPredicate::SGT, kt, k.i32c(0))?, |k| release(k, k.get_i(prev, k.i32t)?))?;
                        k.set(prev, stv.into())?;
                    }
                    advance(k, st, ph)
                })?;
                if w.in_flight > 0 {
                    let cur: Vec<FloatValue> = acc.iter().map(|&p| k.get_f(p)).collect::<R<_>>()?;
                    let out = k.wgmma_wait(&cur)?;
                    for (&p, v) in acc.iter().zip(out) {
                        k.set(p, v.into())?;
                    }
                    k.if_then(k.icmp(IntPredicate::SGT, ktiles, k.i32c(0))?, |k| release(k, k.get_i(prev, k.i32t)?))?;
                }
                let bases = batch_bases(k, spec, bz)?;
                let m0 = k.mul(pid_m, k.i64c(i64::from(s.bm)))?;
                let tile = MmaTile { mt: 1, nt: (s.bn / 8) as usize, wm: 16, wn: s.bn, warps_m: s.warps_m, bm: s.bm, bn: s.bn, threads: s.threads(), first_thread: 128, m0, pid_n, bz };
                mma_epilogue(k, spec, plan, smem, &acc, &tile, &bases)
            })
        },
    )
}

/// An fp8 operand's scale as an f32: loaded from its kernel input (a scalar, `f32[]`) or
/// the constant.
pub(super) fn fp8_scale<'ctx>(kit: &Kit<'ctx>, scale: Fp8Scale) -> R<FloatValue<'ctx>> {
    match scale {
        Fp8Scale::Buffer(i) => kit.load_vec(DType::F32, kit.buf(i)?, kit.i64c(0), 1)?.pop().ok_or_else(|| kit.err("no scale loaded")),
        Fp8Scale::Const(x) => Ok(kit.f32c(f64::from(x))),
    }
}

/// The tile of a tensor-core kernel's epilogue ([`mma_epilogue`]).
struct MmaTile<'ctx> {
    /// m16 row blocks and n8 column blocks of a warp's accumulators.
    mt: usize,
    nt: usize,
    /// The warp tile (rows, columns) and the warps along M (warp `w` is at `(w % warps_m,
    /// w / warps_m)`).
    wm: u32,
    wn: u32,
    warps_m: u32,
    /// The CTA tile and its threads.
    bm: u32,
    bn: u32,
    threads: u32,
    /// The first thread holding accumulators (`tid.x` of warp 0 of the tile: 128 in the
    /// warp-specialised kernel, whose warpgroup 0 is the producer).
    first_thread: u32,
    /// The tile's first row (i64), column tile and batch index.
    m0: IntValue<'ctx>,
    pid_n: IntValue<'ctx>,
    bz: IntValue<'ctx>,
}

/// The epilogue of the tensor-core kernels: each warp's accumulators `acc[(mi·nt + ni)·4 + q]`
/// in the `m16n8` fragment layout (lane `(g, t) = (lane/4, lane%4)` holds columns `2t, 2t+1`
/// of rows `g` and `g + 8` of each block) through the kernel's epilogue to the outputs —
/// directly from registers, or staged through shared memory (`smem`) as a whole tile.
fn mma_epilogue<'ctx>(kit: &Kit<'ctx>, spec: &Spec, plan: &MmaPlan, smem: PointerValue<'ctx>, acc: &[PointerValue<'ctx>], tl: &MmaTile<'ctx>, bases: &Bases<'ctx>) -> R<()> {
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

/// The toolkit the matmul and attention generators build with: a thin layer over
/// [`crate::emit::KernelBuilder`].
///
/// A [`Kit`] owns one [`KernelBuilder`] whose kernel takes one global pointer per kernel buffer
/// (inputs `noalias readonly`, outputs `noalias`) and one i64 per symbolic [`Dim`] the
/// kernel reads ([`KernelParam::Size`]; [`Kit::build`] builds with a superset of dims, then
/// once more with only those used). It adds what these families use beyond `emit`: every instruction as one call on
/// `&self` returning [`CodegenError`] (so that generators can pass the kit into closures for
/// loop bodies), counted loops and conditionals, mutable variables (`alloca`s in the prologue,
/// which `default<O3>`'s SROA turns into registers), guarded and vector loads of any float
/// dtype converted to f32, shared memory static or dynamic, and the device math library
/// ([`crate::math`]) through the builder's [`crate::math::Ops`].
pub(crate) mod kit {
    use std::cell::{Ref, RefCell};

    use inkwell::basic_block::BasicBlock;
    use inkwell::context::Context;
    use inkwell::module::Linkage;
    use inkwell::types::{BasicTypeEnum, FloatType, IntType};
    use inkwell::values::{BasicMetadataValueEnum, BasicValue, BasicValueEnum, FloatValue, IntValue, PointerValue};
    use inkwell::{AddressSpace, FloatPredicate, IntPredicate};
    use sinter_ir::{DType, Dim, Function, KernelData, KernelGraph, KernelParam, Layout, OpKind, TensorMap, Value, ValueDef};

    use crate::emit::{KernelBuilder, ParamKind, SizeTable};
    use crate::kernels::element::{Buf, Eval, IndexWidth};
    use crate::math;
    use crate::target::Target;
    use crate::{CodegenError, ADDRESS_SPACE_SHARED};

    /// Results of this module.
    pub(crate) type R<T> = Result<T, CodegenError>;

    #[cfg(test)]
    thread_local! {
        /// Tests set it to get the kernel's LLVM IR in [`sinter_ir::LaunchPlan::ptx`] instead of
        /// PTX (see `tests::emu`).
        pub(crate) static EMIT_IR: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    }

    /// Where a kernel's shared memory comes from.
    #[derive(Clone, Copy, Debug, PartialEq, Eq)]
    pub(crate) enum SharedKind {
        /// One static `.shared` array (≤ 48 KiB); the launch passes no dynamic bytes.
        Static,
        /// `extern .shared` dynamic memory of this many bytes (the launch passes them, and
        /// beyond 48 KiB the runtime must opt in with `CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`).
        Dynamic(u32),
    }

    /// One kernel under construction. See the module docs.
    pub(crate) struct Kit<'ctx> {
        kb: RefCell<KernelBuilder<'ctx>>,
        pub ctx: &'ctx Context,
        name: String,
        pub f32t: FloatType<'ctx>,
        pub i1t: IntType<'ctx>,
        pub i32t: IntType<'ctx>,
        pub i64t: IntType<'ctx>,
        n_inputs: usize,
        n_buffers: usize,
        /// TMA tensor maps, parameters after the buffers ([`Kit::tensor_map`]).
        maps: Vec<TensorMap>,
        sizes: Vec<Dim>,
        requested: RefCell<Vec<Dim>>,
    }

    impl<'ctx> Kit<'ctx> {
        /// Kernel `name` for `target` with `n_inputs` read-only input buffers, `n_outputs`
        /// output buffers, one i64 parameter per distinct non-constant dim of `dims`, and a
        /// launch bound of `threads` threads per block; positioned in its body.
        /// TMA tensor maps `maps` are parameters after the buffers ([`Kit::tensor_map`]).
        pub(crate) fn with_maps(ctx: &'ctx Context, name: &str, target: Target, (n_inputs, n_outputs): (usize, usize), maps: &[TensorMap], dims: &[Dim], threads: u32) -> R<Kit<'ctx>> {
            let mut sizes: Vec<Dim> = Vec::new();
            for d in dims {
                if d.as_const().is_none() && !sizes.contains(d) {
                    sizes.push(d.clone());
                }
            }
            let mut params = vec![ParamKind::input(); n_inputs];
            params.extend(std::iter::repeat_n(ParamKind::output(), n_outputs));
            params.extend(std::iter::repeat_n(ParamKind::TensorMap, maps.len()));
            params.extend(std::iter::repeat_n(ParamKind::Size, sizes.len()));
            let kb = KernelBuilder::new(ctx, name, &params, target)?;
            // No `.maxntid` by default: with it, ptxas 12.9 trades registers for occupancy on
            // these kernels (capping the attention core at 80–128 registers) and spills;
            // without it every schedule here assembles spill-free. The tensor-core matmul
            // declares it ([`Kit::launch_bounds`]) to get 255 registers at 256 threads.
            let _ = threads;
            Ok(Kit {
                kb: RefCell::new(kb),
                ctx,
                name: name.to_owned(),
                f32t: ctx.f32_type(),
                i1t: ctx.bool_type(),
                i32t: ctx.i32_type(),
                i64t: ctx.i64_type(),
                n_inputs,
                n_buffers: n_inputs + n_outputs,
                maps: maps.to_vec(),
                sizes,
                requested: RefCell::new(Vec::new()),
            })
        }

        /// The size dims the generator asked for ([`Kit::dim`]) or whose parameters the built
        /// code reads (the element evaluator asks its own table).
        fn used_sizes(&self) -> Vec<Dim> {
            let kb = self.bld();
            let requested = self.requested.borrow();
            self.sizes
                .iter()
                .enumerate()
                .filter(|(i, d)| requested.contains(d) || kb.func.get_nth_param((self.first_size() + i) as u32).is_some_and(|p| p.get_first_use().is_some()))
                .map(|(_, d)| d.clone())
                .collect()
        }

        /// Builds kernel `name` with `build` and returns its PTX and parameter list. The
        /// kernel is built with every non-constant dim of `dims` as a size parameter, and once
        /// more with only those the code reads when some went unused, so that the launch plan
        /// lists exactly the sizes the kernel needs.
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn build(
            ctx: &'ctx Context,
            name: &str,
            target: Target,
            n_inputs: usize,
            n_outputs: usize,
            dims: &[Dim],
            threads: u32,
            build: impl Fn(&Kit<'ctx>) -> R<()>,
        ) -> R<(String, Vec<KernelParam>)> {
            Self::build_with_maps(ctx, name, target, (n_inputs, n_outputs), &[], dims, threads, build)
        }

        /// [`Kit::build`] of a kernel that also takes the TMA tensor maps `maps` (parameters
        /// after the buffers, [`Kit::tensor_map`]).
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn build_with_maps(
            ctx: &'ctx Context,
            name: &str,
            target: Target,
            io: (usize, usize),
            maps: &[TensorMap],
            dims: &[Dim],
            threads: u32,
            build: impl Fn(&Kit<'ctx>) -> R<()>,
        ) -> R<(String, Vec<KernelParam>)> {
            let kit = Kit::with_maps(ctx, name, target, io, maps, dims, threads)?;
            build(&kit)?;
            let used = kit.used_sizes();
            let kit = if used.len() == kit.sizes.len() {
                kit
            } else {
                drop(kit);
                let kit = Kit::with_maps(ctx, name, target, io, maps, &used, threads)?;
                build(&kit)?;
                kit
            };
            let params = kit.params();
            #[cfg(test)]
            if EMIT_IR.with(|f| f.get()) {
                return Ok((kit.ir_text()?, params));
            }
            Ok((kit.finish()?, params))
        }

        /// The kernel's LLVM IR as built (no optimisation), the prologue closed: what the
        /// CPU emulator of the tests runs.
        #[cfg(test)]
        fn ir_text(self) -> R<String> {
            let kb = self.kb.into_inner();
            kb.ret()?;
            let first = kb.func.get_first_basic_block().ok_or_else(|| CodegenError::Builder("no prologue".into()))?;
            let body = first.get_next_basic_block().ok_or_else(|| CodegenError::Builder("no body".into()))?;
            kb.position(first);
            kb.br(body)?;
            if EMIT_IR.with(|f| f.get()) && std::env::var_os("SINTER_EMU_O3").is_some() {
                let machine = crate::target_machine(&kb.target)?;
                kb.module.set_triple(&machine.get_triple());
                kb.module.set_data_layout(&machine.get_target_data().get_data_layout());
                kb.module
                    .run_passes("default<O3>", &machine, inkwell::passes::PassBuilderOptions::create())
                    .map_err(|e| CodegenError::Builder(e.to_string()))?;
            }
            Ok(kb.ir_text())
        }

        /// The builder (borrowed for one call).
        fn bld(&self) -> Ref<'_, KernelBuilder<'ctx>> {
            self.kb.borrow()
        }

        /// Runs a [`crate::math`] function on the builder.
        pub(crate) fn math<T>(&self, f: impl FnOnce(&mut KernelBuilder<'ctx>) -> R<T>) -> R<T> {
            let mut kb = self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?;
            f(&mut kb)
        }

        /// The kernel's parameter list: every buffer, then every size.
        pub(crate) fn params(&self) -> Vec<KernelParam> {
            let mut p: Vec<KernelParam> = (0..self.n_buffers).map(KernelParam::Buffer).collect();
            p.extend(self.maps.iter().cloned().map(KernelParam::TensorMap));
            p.extend(self.sizes.iter().cloned().map(KernelParam::Size));
            p
        }

        /// The parameter index of the first size (after the buffers and tensor maps).
        fn first_size(&self) -> usize {
            self.n_buffers + self.maps.len()
        }

        /// Tensor map `i`'s parameter: a pointer to its 128 bytes in the parameter space.
        pub(crate) fn tensor_map(&self, i: usize) -> R<PointerValue<'ctx>> {
            if i >= self.maps.len() {
                return Err(self.err(format!("no tensor map {i}")));
            }
            let p = self.bld().func.get_nth_param((self.n_buffers + i) as u32).ok_or_else(|| self.err(format!("no parameter for tensor map {i}")))?;
            Ok(p.into_pointer_value())
        }

        /// An internal error of the generator.
        pub(crate) fn err(&self, e: impl std::fmt::Display) -> CodegenError {
            CodegenError::Builder(format!("{}: {e}", self.name))
        }

        /// The pointer to buffer `i` (inputs then outputs).
        pub(crate) fn buf(&self, i: usize) -> R<PointerValue<'ctx>> {
            if i >= self.n_buffers {
                return Err(self.err(format!("no buffer parameter {i}")));
            }
            self.bld().param_ptr(i)
        }

        /// Whether buffer `i` is an input.
        #[allow(dead_code)]
        pub(crate) fn is_input(&self, i: usize) -> bool {
            i < self.n_inputs
        }

        /// `d` as an i64: a constant, or the size parameter that carries it.
        pub(crate) fn dim(&self, d: &Dim) -> R<IntValue<'ctx>> {
            if let Some(c) = d.as_const() {
                return Ok(self.i64c(c));
            }
            let pos = self.sizes.iter().position(|s| s == d).ok_or_else(|| self.err(format!("dim {d} is not a kernel parameter")))?;
            let mut req = self.requested.borrow_mut();
            if !req.contains(d) {
                req.push(d.clone());
            }
            drop(req);
            self.bld().param_int(self.first_size() + pos)
        }

        // ---- constants -------------------------------------------------------------------
        pub(crate) fn i64c(&self, v: i64) -> IntValue<'ctx> {
            self.i64t.const_int(v as u64, true)
        }
        pub(crate) fn i32c(&self, v: i32) -> IntValue<'ctx> {
            self.i32t.const_int(v as i64 as u64, true)
        }
        pub(crate) fn f32c(&self, v: f64) -> FloatValue<'ctx> {
            self.f32t.const_float(v)
        }
        pub(crate) fn bool_c(&self, v: bool) -> IntValue<'ctx> {
            self.i1t.const_int(u64::from(v), false)
        }

        // ---- integer arithmetic ----------------------------------------------------------
        pub(crate) fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_add(a, b, "")?)
        }
        pub(crate) fn sub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_sub(a, b, "")?)
        }
        pub(crate) fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_mul(a, b, "")?)
        }
        /// Unsigned division (operands known non-negative).
        pub(crate) fn udiv(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_unsigned_div(a, b, "")?)
        }
        /// Unsigned remainder (operands known non-negative).
        pub(crate) fn urem(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_unsigned_rem(a, b, "")?)
        }
        pub(crate) fn icmp(&self, p: IntPredicate, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_compare(p, a, b, "")?)
        }
        pub(crate) fn and(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_and(a, b, "")?)
        }
        /// Signed minimum.
        pub(crate) fn smin(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            let c = self.icmp(IntPredicate::SLT, a, b)?;
            self.select_int(c, a, b)
        }
        /// Signed maximum.
        pub(crate) fn smax(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            let c = self.icmp(IntPredicate::SGT, a, b)?;
            self.select_int(c, a, b)
        }
        pub(crate) fn select_int(&self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_select(c, a, b, "")?.into_int_value())
        }
        pub(crate) fn select_f(&self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            Ok(self.bld().b.build_select(c, a, b, "")?.into_float_value())
        }
        /// `c ? a : b` on integers.
        pub(crate) fn select_i(&self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_select(c, a, b, "")?.into_int_value())
        }
        /// Bitwise exclusive or.
        pub(crate) fn xor(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_xor(a, b, "")?)
        }
        /// i32 → i64, zero-extended (indices known non-negative).
        pub(crate) fn zext64(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_z_extend(v, self.i64t, "")?)
        }
        /// i32 → i64, sign-extended.
        pub(crate) fn sext64(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_s_extend(v, self.i64t, "")?)
        }
        /// i64 → i32 (value known to fit).
        pub(crate) fn trunc32(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_int_truncate(v, self.i32t, "")?)
        }

        // ---- float arithmetic ------------------------------------------------------------
        pub(crate) fn fadd(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            Ok(self.bld().b.build_float_add(a, b, "")?)
        }
        pub(crate) fn fsub(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            Ok(self.bld().b.build_float_sub(a, b, "")?)
        }
        pub(crate) fn fmul(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            Ok(self.bld().b.build_float_mul(a, b, "")?)
        }
        /// IEEE division (`div.rn.f32`).
        pub(crate) fn fdiv(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            Ok(self.bld().b.build_float_div(a, b, "")?)
        }
        pub(crate) fn fcmp(&self, p: FloatPredicate, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_float_compare(p, a, b, "")?)
        }
        /// `a·b + c` with one rounding (`fma.rn.f32`).
        pub(crate) fn fma(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            self.call_f("llvm.fma", &[a, b, c])
        }
        /// max that is NaN when either operand is (`max.NaN.f32`, sm_80+).
        pub(crate) fn max_nan(&self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            self.call_f("llvm.maximum", &[a, b])
        }
        /// eˣ to ≤ 3 ulp ([`crate::math::exp`], precise): exp(−inf) = 0, NaN stays NaN.
        pub(crate) fn exp(&self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            self.math(|kb| math::exp(kb, x, true))
        }
        /// ln x ([`crate::math::log`]): ln 0 = −inf, ln(x < 0) = NaN, ln(+inf) = +inf.
        pub(crate) fn log(&self, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
            self.math(|kb| math::log(kb, x))
        }

        /// Calls an overloaded float intrinsic `name.f32` on `args`.
        fn call_f(&self, name: &str, args: &[FloatValue<'ctx>]) -> R<FloatValue<'ctx>> {
            let args: Vec<BasicMetadataValueEnum> = args.iter().map(|&a| a.into()).collect();
            Ok(self.bld().intrinsic_value(name, &[self.f32t.into()], &args)?.into_float_value())
        }

        // ---- GPU specifics ---------------------------------------------------------------
        /// A special register (`tid.x`, `ctaid.y`, ...) as i32, read once in the prologue.
        pub(crate) fn sreg(&self, name: &'static str) -> R<IntValue<'ctx>> {
            self.math(|kb| kb.sreg(name))
        }

        /// `bar.sync 0`: every thread of the CTA.
        pub(crate) fn barrier(&self) -> R<()> {
            self.bld().barrier()
        }

        /// `bar.warp.sync 0xffffffff`: orders shared-memory accesses within a warp.
        pub(crate) fn warp_sync(&self) -> R<()> {
            self.bld().intrinsic("llvm.nvvm.bar.warp.sync", &[], &[self.i32c(-1).into()])?;
            Ok(())
        }

        /// `shfl.sync.bfly.b32` over the full warp: the value of lane `lane ^ mask`.
        pub(crate) fn shfl_xor(&self, v: FloatValue<'ctx>, mask: u32) -> R<FloatValue<'ctx>> {
            self.bld().shfl_bfly_f32(v, mask)
        }

        /// Declares the launch bound (`.maxntid threads`, `.minnctapersm 1`): ptxas may then
        /// give each thread up to `65536 / threads` registers (255 at 256 threads), which the
        /// tensor-core kernels' register tiles need.
        pub(crate) fn launch_bounds(&self, threads: u32) {
            let kb = self.bld();
            kb.set_max_threads(threads);
            kb.set_min_ctas_per_sm(1);
        }

        // ---- tensor cores (see the primitives of `KernelBuilder`) ------------------------
        /// [`KernelBuilder::cp_async_16`]: 16 bytes global → shared, `src_bytes` (i32) read.
        pub(crate) fn cp_async_16(&self, dst: PointerValue<'ctx>, src: PointerValue<'ctx>, src_bytes: IntValue<'ctx>) -> R<()> {
            self.bld().cp_async_16(dst, src, src_bytes)
        }
        /// [`KernelBuilder::fence_proxy_async_shared`].
        pub(crate) fn fence_proxy_async(&self) -> R<()> {
            self.bld().fence_proxy_async_shared()
        }
        /// [`KernelBuilder::wgmma_k_tile`].
        pub(crate) fn wgmma_k_tile(&self, dt: DType, n: u32, acc: &[FloatValue<'ctx>], descs: &[(IntValue<'ctx>, IntValue<'ctx>)], in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
            self.bld().wgmma_k_tile(dt, n, acc, descs, in_flight)
        }
        /// [`KernelBuilder::wgmma_rs_k_tile`].
        pub(crate) fn wgmma_rs_k_tile(&self, dt: DType, n: u32, acc: &[FloatValue<'ctx>], steps: &[([IntValue<'ctx>; 4], IntValue<'ctx>)], trans_b: bool, in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
            self.bld().wgmma_rs_k_tile(dt, n, acc, steps, trans_b, in_flight)
        }
        /// [`KernelBuilder::pack_e4m3x4`].
        pub(crate) fn pack_e4m3x4(&self, x: [FloatValue<'ctx>; 4]) -> R<IntValue<'ctx>> {
            self.bld().pack_e4m3x4(x)
        }
        /// [`KernelBuilder::e4m3x2_to_f32`].
        pub(crate) fn e4m3x2_to_f32(&self, x: IntValue<'ctx>) -> R<[FloatValue<'ctx>; 2]> {
            self.bld().e4m3x2_to_f32(x)
        }
        /// [`KernelBuilder::e4m3x2_to_f16x2`].
        pub(crate) fn e4m3x2_to_f16x2(&self, x: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            self.bld().e4m3x2_to_f16x2(x)
        }
        /// [`KernelBuilder::transpose_bytes_4x4`].
        pub(crate) fn transpose_bytes_4x4(&self, rows: [IntValue<'ctx>; 4]) -> R<[IntValue<'ctx>; 4]> {
            self.bld().transpose_bytes_4x4(rows)
        }
        /// [`KernelBuilder::bar_red_or`].
        pub(crate) fn bar_red_or(&self, id: IntValue<'ctx>, count: u32, flag: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            self.bld().bar_red_or(id, count, flag)
        }
        /// [`KernelBuilder::bar_sync`].
        pub(crate) fn bar_sync(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
            self.bld().bar_sync(id, count)
        }
        /// [`KernelBuilder::bar_arrive`].
        pub(crate) fn bar_arrive(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
            self.bld().bar_arrive(id, count)
        }
        /// [`KernelBuilder::wgmma_wait`].
        pub(crate) fn wgmma_wait(&self, acc: &[FloatValue<'ctx>]) -> R<Vec<FloatValue<'ctx>>> {
            self.bld().wgmma_wait(acc)
        }
        /// [`KernelBuilder::wgmma_wait_group`].
        pub(crate) fn wgmma_wait_group(&self, acc: &[FloatValue<'ctx>], in_flight: u32) -> R<Vec<FloatValue<'ctx>>> {
            self.bld().wgmma_wait_group(acc, in_flight)
        }
        /// [`KernelBuilder::wgmma_wait_group_noted`].
        pub(crate) fn wgmma_wait_group_noted(&self, acc: &[FloatValue<'ctx>], in_flight: u32, note: &str) -> R<Vec<FloatValue<'ctx>>> {
            self.bld().wgmma_wait_group_noted(acc, in_flight, note)
        }
        /// `n` mbarriers (8 bytes each, a static shared array): the shared address (i32) of
        /// the first; barrier `i` is 8·i bytes further.
        pub(crate) fn mbarriers(&self, n: u32) -> R<IntValue<'ctx>> {
            let p = self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?.shared_array(self.i64t.into(), n.max(1), 8, "mbar");
            self.smem_addr(p)
        }
        /// [`KernelBuilder::mbarrier_init`].
        pub(crate) fn mbarrier_init(&self, bar: IntValue<'ctx>, count: u32) -> R<()> {
            self.bld().mbarrier_init(bar, count)
        }
        /// [`KernelBuilder::fence_mbarrier_init`].
        pub(crate) fn fence_mbarrier_init(&self) -> R<()> {
            self.bld().fence_mbarrier_init()
        }
        /// [`KernelBuilder::mbarrier_arrive_expect_tx`].
        pub(crate) fn mbarrier_arrive_expect_tx(&self, bar: IntValue<'ctx>, bytes: u32) -> R<()> {
            self.bld().mbarrier_arrive_expect_tx(bar, bytes)
        }
        /// [`KernelBuilder::mbarrier_arrive`].
        pub(crate) fn mbarrier_arrive(&self, bar: IntValue<'ctx>) -> R<()> {
            self.bld().mbarrier_arrive(bar)
        }
        /// [`KernelBuilder::setmaxnreg`].
        pub(crate) fn setmaxnreg(&self, inc: bool, regs: u32) -> R<()> {
            self.bld().setmaxnreg(inc, regs)
        }
        /// [`KernelBuilder::mbarrier_wait_parity`].
        pub(crate) fn mbarrier_wait_parity(&self, bar: IntValue<'ctx>, parity: IntValue<'ctx>) -> R<()> {
            self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?.mbarrier_wait_parity(bar, parity)
        }
        /// [`KernelBuilder::tma_load`] from tensor map `map` ([`Kit::tensor_map`]).
        pub(crate) fn tma_load(&self, dst: IntValue<'ctx>, map: usize, coords: &[IntValue<'ctx>], bar: IntValue<'ctx>) -> R<()> {
            let m = self.tensor_map(map)?;
            self.bld().tma_load(dst, m, coords, bar)
        }
        /// The shared-memory address (i32, in the CTA's shared window) of `p`.
        pub(crate) fn smem_addr(&self, p: PointerValue<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_ptr_to_int(p, self.i32t, "saddr")?)
        }
        /// [`KernelBuilder::cp_async_commit`].
        pub(crate) fn cp_async_commit(&self) -> R<()> {
            self.bld().cp_async_commit()
        }
        /// [`KernelBuilder::cp_async_wait`].
        pub(crate) fn cp_async_wait(&self, n: u32) -> R<()> {
            self.bld().cp_async_wait(n)
        }
        /// [`KernelBuilder::ldmatrix_x4`].
        pub(crate) fn ldmatrix_x4(&self, p: PointerValue<'ctx>, trans: bool) -> R<[IntValue<'ctx>; 4]> {
            self.bld().ldmatrix_x4(p, trans)
        }
        /// [`KernelBuilder::mma_m16n8k16`].
        pub(crate) fn mma(&self, dt: DType, a: [IntValue<'ctx>; 4], b: [IntValue<'ctx>; 2], c: [FloatValue<'ctx>; 4]) -> R<[FloatValue<'ctx>; 4]> {
            self.bld().mma_m16n8k16(dt, a, b, c)
        }
        /// Logical shift right.
        pub(crate) fn lshr(&self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_right_shift(a, a.get_type().const_int(u64::from(s), false), false, "")?)
        }
        /// Shift left.
        pub(crate) fn shl(&self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_left_shift(a, a.get_type().const_int(u64::from(s), false), "")?)
        }

        /// Butterfly reduction over lanes differing in the bits of `masks` (16, 8, 4, 2, 1 for
        /// the whole warp): every lane ends with the same result.
        pub(crate) fn warp_reduce(
            &self,
            mut v: FloatValue<'ctx>,
            masks: &[u32],
            op: impl Fn(&Self, FloatValue<'ctx>, FloatValue<'ctx>) -> R<FloatValue<'ctx>>,
        ) -> R<FloatValue<'ctx>> {
            for &m in masks {
                let o = self.shfl_xor(v, m)?;
                v = op(self, v, o)?;
            }
            Ok(v)
        }

        // ---- types and memory ------------------------------------------------------------
        /// The LLVM type of a float dtype's elements.
        pub(crate) fn float_type(&self, dt: DType) -> R<FloatType<'ctx>> {
            match dt {
                DType::BF16 | DType::F16 | DType::F32 => Ok(self.bld().float_type(dt)),
                other => Err(self.err(format!("{other} is not a float dtype"))),
            }
        }


        /// `&ptr[idx]` for elements of type `ty`.
        pub(crate) fn gep(&self, ty: BasicTypeEnum<'ctx>, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
            self.bld().gep(ty, ptr, idx)
        }

        /// Loads `n` consecutive elements of float dtype `dt` at `ptr[idx..]` as f32s, as one
        /// vector access of `n · size` bytes aligned to that (the caller has proven it).
        pub(crate) fn load_vec(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>, n: u32) -> R<Vec<FloatValue<'ctx>>> {
            let et = self.float_type(dt)?;
            let p = self.gep(et.into(), ptr, idx)?;
            let es = dt.size_bytes() as u32;
            let kb = self.bld();
            if n == 1 {
                let v = kb.load(et.into(), p, es)?.into_float_value();
                return Ok(vec![kb.to_f32(v)?]);
            }
            let v = kb.load(et.vec_type(n).into(), p, es * n)?.into_vector_value();
            let mut out = Vec::with_capacity(n as usize);
            for i in 0..n {
                let e = kb.b.build_extract_element(v, self.i32c(i as i32), "")?.into_float_value();
                out.push(kb.to_f32(e)?);
            }
            Ok(out)
        }

        /// Stores f32s, rounded to `dt`, at `ptr[idx..]` as one vector access (aligned as
        /// [`Kit::load_vec`] requires).
        pub(crate) fn store_vec(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>, vals: &[FloatValue<'ctx>]) -> R<()> {
            let et = self.float_type(dt)?;
            let p = self.gep(et.into(), ptr, idx)?;
            let es = dt.size_bytes() as u32;
            let n = vals.len() as u32;
            let kb = self.bld();
            if n == 1 {
                let v = kb.from_f32(vals[0], dt)?;
                return kb.store(p, v.into(), es);
            }
            let mut v = et.vec_type(n).get_poison();
            for (i, &x) in vals.iter().enumerate() {
                let e = kb.from_f32(x, dt)?;
                v = kb.b.build_insert_element(v, e, self.i32c(i as i32), "")?;
            }
            kb.store(p, v.into(), es * n)
        }

        /// Loads `n` elements of `dt` (as f32s) that are `stride` elements apart, starting at
        /// `ptr[idx]`, one scalar access each.
        pub(crate) fn load_strided(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>, stride: IntValue<'ctx>, n: u32) -> R<Vec<FloatValue<'ctx>>> {
            let mut out = Vec::with_capacity(n as usize);
            let mut at = idx;
            for i in 0..n {
                if i > 0 {
                    at = self.add(at, stride)?;
                }
                out.extend(self.load_vec(dt, ptr, at, 1)?);
            }
            Ok(out)
        }

        /// Loads one i32 at `ptr[idx]`.
        pub(crate) fn load_i32(&self, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<IntValue<'ctx>> {
            let p = self.gep(self.i32t.into(), ptr, idx)?;
            Ok(self.bld().load(self.i32t.into(), p, 4)?.into_int_value())
        }


        /// A shared-memory block of `bytes` bytes, 16-byte aligned: a static `.shared` array
        /// for [`SharedKind::Static`], the dynamic `extern .shared` area otherwise.
        pub(crate) fn shared(&self, kind: SharedKind, bytes: u32) -> R<PointerValue<'ctx>> {
            let i8t = self.ctx.i8_type();
            match kind {
                SharedKind::Static => Ok(self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?.shared_array(i8t.into(), bytes.max(16), 16, "smem")),
                SharedKind::Dynamic(_) => {
                    let kb = self.bld();
                    let g = kb.module.add_global(i8t.array_type(0), Some(AddressSpace::from(ADDRESS_SPACE_SHARED)), "smem_dyn");
                    g.set_linkage(Linkage::External);
                    g.set_alignment(16);
                    Ok(g.as_pointer_value())
                }
            }
        }

        /// Raises the dynamic shared memory's declared alignment to `align` bytes (after
        /// [`Kit::shared`] with [`SharedKind::Dynamic`]).
        pub(crate) fn align_dynamic_shared(&self, align: u32) -> R<()> {
            let kb = self.bld();
            let g = kb.module.get_global("smem_dyn").ok_or_else(|| self.err("no dynamic shared memory"))?;
            g.set_alignment(align);
            Ok(())
        }

        /// `&ptr[idx]` for elements of float dtype `dt` (or the bytes of `f8e4m3`), as a plain
        /// (not `inbounds`) GEP: the result may lie outside the object (a pre-offset base that
        /// later indices bring back).
        pub(crate) fn gep_raw(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
            let ty: BasicTypeEnum<'ctx> = if dt.is_fp8() { self.ctx.i8_type().into() } else { self.float_type(dt)?.into() };
            // SAFETY (of the IR, not of Rust): nothing is dereferenced here.
            Ok(unsafe { self.bld().b.build_gep(ty, ptr, &[idx], "") }?)
        }

        /// A byte offset into shared memory: `&base[off]` (i32 offset).
        pub(crate) fn sh_at(&self, base: PointerValue<'ctx>, byte_off: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
            self.gep(self.ctx.i8_type().into(), base, byte_off)
        }

        /// `n` consecutive f32-converted elements of `dt` from shared memory at `p`, one
        /// vector access aligned to its size.
        pub(crate) fn sh_load(&self, dt: DType, p: PointerValue<'ctx>, n: u32) -> R<Vec<FloatValue<'ctx>>> {
            self.load_vec(dt, p, self.i32c(0), n)
        }

        /// Stores f32s rounded to `dt` into shared memory at `p` (one vector access).
        pub(crate) fn sh_store(&self, dt: DType, p: PointerValue<'ctx>, vals: &[FloatValue<'ctx>]) -> R<()> {
            self.store_vec(dt, p, self.i32c(0), vals)
        }

        // ---- variables and control flow --------------------------------------------------
        /// A mutable f32 (a prologue alloca, promoted to a register by SROA) set to `init`.
        pub(crate) fn var_f(&self, init: FloatValue<'ctx>) -> R<PointerValue<'ctx>> {
            let ty = self.f32t;
            let p = self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty, "")?)))?;
            self.set(p, init.into())?;
            Ok(p)
        }
        /// A private (per-thread) slot for one element of float dtype `dt`: a prologue
        /// alloca, which SROA removes when every access is a plain store then load.
        pub(crate) fn private_slot(&self, dt: DType) -> R<PointerValue<'ctx>> {
            self.private_slots(dt, 1)
        }
        /// A private slot for `n` consecutive elements of float dtype `dt` (a vector, aligned
        /// to its size), as [`Kit::private_slot`].
        pub(crate) fn private_slots(&self, dt: DType, n: u32) -> R<PointerValue<'ctx>> {
            let ty = self.float_type(dt)?;
            if n == 1 {
                return self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty, "")?)));
            }
            self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty.vec_type(n), "")?)))
        }
        /// A mutable integer of `init`'s type (a prologue alloca, promoted by SROA).
        pub(crate) fn var_i(&self, init: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
            let ty = init.get_type();
            let p = self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty, "")?)))?;
            self.set(p, init.into())?;
            Ok(p)
        }
        /// Reads an integer variable of type `ty`.
        pub(crate) fn get_i(&self, p: PointerValue<'ctx>, ty: IntType<'ctx>) -> R<IntValue<'ctx>> {
            Ok(self.bld().b.build_load(ty, p, "")?.into_int_value())
        }

        /// Runs `f` with the shared element evaluator ([`Eval`]) over `body`, whose
        /// parameter `i` is read from `params[i]`; the kernel's size parameters serve its
        /// dims. Kit methods must not be called inside `f` (the evaluator holds the builder).
        pub(crate) fn with_eval<T>(&self, body: &Function, params: Vec<Buf<'ctx>>, f: impl FnOnce(&mut Eval<'_, 'ctx>) -> R<T>) -> R<T> {
            let mut kb = self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?;
            let mut sizes = SizeTable::fixed(self.sizes.clone(), self.first_size(), true);
            let mut ev = Eval::new(&mut kb, &mut sizes, body, params, IndexWidth::I64);
            f(&mut ev)
        }

        pub(crate) fn set(&self, p: PointerValue<'ctx>, v: BasicValueEnum<'ctx>) -> R<()> {
            self.bld().b.build_store(p, v)?;
            Ok(())
        }
        pub(crate) fn get_f(&self, p: PointerValue<'ctx>) -> R<FloatValue<'ctx>> {
            Ok(self.bld().b.build_load(self.f32t, p, "")?.into_float_value())
        }

        fn block(&self, name: &str) -> BasicBlock<'ctx> {
            self.bld().block(name)
        }
        fn here(&self) -> R<BasicBlock<'ctx>> {
            self.bld().current_block()
        }

        /// `for (i = start; i < end; i += step) body(i)` on integers of `start`'s type
        /// (signed compare). The body may build any control flow.
        pub(crate) fn for_range(
            &self,
            start: IntValue<'ctx>,
            end: IntValue<'ctx>,
            step: IntValue<'ctx>,
            body: impl FnOnce(&Self, IntValue<'ctx>) -> R<()>,
        ) -> R<()> {
            let pre = self.here()?;
            let head = self.block("loop");
            let bodyb = self.block("body");
            let exit = self.block("endloop");
            self.bld().br(head)?;
            self.bld().position(head);
            let phi = self.bld().b.build_phi(start.get_type(), "i")?;
            let i = phi.as_basic_value().into_int_value();
            let c = self.icmp(IntPredicate::SLT, i, end)?;
            self.bld().cond_br(c, bodyb, exit)?;
            self.bld().position(bodyb);
            body(self, i)?;
            let next = self.add(i, step)?;
            let latch = self.here()?;
            self.bld().br(head)?;
            phi.add_incoming(&[(&start, pre), (&next, latch)]);
            self.bld().position(exit);
            Ok(())
        }

        /// `if cond { then() }`.
        pub(crate) fn if_then(&self, cond: IntValue<'ctx>, then: impl FnOnce(&Self) -> R<()>) -> R<()> {
            let tb = self.block("then");
            let done = self.block("endif");
            self.bld().cond_br(cond, tb, done)?;
            self.bld().position(tb);
            then(self)?;
            self.bld().br(done)?;
            self.bld().position(done);
            Ok(())
        }

        /// `if cond { body(); return }`: the threads for which `cond` holds run `body` and
        /// leave the kernel (the producer warpgroup of a warp-specialised kernel, whose
        /// registers then never meet the consumers' code).
        pub(crate) fn return_if(&self, cond: IntValue<'ctx>, body: impl FnOnce(&Self) -> R<()>) -> R<()> {
            let tb = self.block("leave");
            let cont = self.block("stay");
            self.bld().cond_br(cond, tb, cont)?;
            self.bld().position(tb);
            body(self)?;
            self.bld().ret()?;
            self.bld().position(cont);
            Ok(())
        }

        /// `if cond { then() } else { other() }`.
        pub(crate) fn if_else(
            &self,
            cond: IntValue<'ctx>,
            then: impl FnOnce(&Self) -> R<()>,
            other: impl FnOnce(&Self) -> R<()>,
        ) -> R<()> {
            let tb = self.block("then");
            let eb = self.block("else");
            let done = self.block("endif");
            self.bld().cond_br(cond, tb, eb)?;
            self.bld().position(tb);
            then(self)?;
            self.bld().br(done)?;
            self.bld().position(eb);
            other(self)?;
            self.bld().br(done)?;
            self.bld().position(done);
            Ok(())
        }

        /// `n` elements of `dt` at `ptr[idx..]` as f32s when `valid`, else zeros; `vector`
        /// says one aligned vector access is proven safe, otherwise `n` scalar accesses
        /// `stride` apart. Nothing is read when `valid` is false.
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn guarded_load(
            &self,
            valid: IntValue<'ctx>,
            dt: DType,
            ptr: PointerValue<'ctx>,
            idx: IntValue<'ctx>,
            n: u32,
            vector: bool,
            stride: IntValue<'ctx>,
        ) -> R<Vec<FloatValue<'ctx>>> {
            let vars: Vec<PointerValue> = (0..n).map(|_| self.var_f(self.f32c(0.0))).collect::<R<_>>()?;
            self.if_then(valid, |k| {
                let vals = if vector { k.load_vec(dt, ptr, idx, n)? } else { k.load_strided(dt, ptr, idx, stride, n)? };
                for (p, v) in vars.iter().zip(vals) {
                    k.set(*p, v.into())?;
                }
                Ok(())
            })?;
            vars.iter().map(|&p| self.get_f(p)).collect()
        }

        /// Closes the kernel, runs `default<O3>` and returns the PTX.
        pub(crate) fn finish(self) -> R<String> {
            let kb = self.kb.into_inner();
            kb.ret()?;
            kb.finish()
        }
    }

    /// A kernel buffer as the generators see it.
    #[derive(Clone, Debug)]
    pub(crate) struct BufInfo {
        pub dtype: DType,
        pub shape: Vec<Dim>,
        pub strides: Vec<Dim>,
        pub align: u32,
    }

    /// Every buffer of kernel `kd`, inputs then outputs.
    pub(crate) fn buffer_infos(graph: &KernelGraph, kd: &KernelData) -> Result<Vec<BufInfo>, String> {
        kd.inputs
            .iter()
            .chain(&kd.outputs)
            .map(|&b| {
                let bd = graph.buffers.get(b).ok_or_else(|| format!("buffer {b} is missing"))?;
                Ok(BufInfo { dtype: bd.ty.dtype, shape: bd.ty.shape.clone(), strides: bd.layout.strides.clone(), align: bd.layout.align.max(1) })
            })
            .collect()
    }

    /// A value of a kernel body read straight from a kernel input buffer: element `(i…)` of the
    /// value is element `offset + Σ i·strides` of buffer `param`.
    #[derive(Clone, Debug)]
    pub(crate) struct View {
        pub param: usize,
        pub offset: Dim,
        pub strides: Vec<Dim>,
        /// Alignment of the buffer's base, bytes.
        pub align: u32,
    }

    /// Follows `v` back through `reshape` and `slice` nodes (the views the passes leave at
    /// the start of a body) to a parameter, and says where its elements live. A `reshape`
    /// needs a contiguous input (row-major order is then the storage order); a `slice` adds
    /// `start · stride` to the offset.
    ///
    /// # Errors
    /// A message when `v` is computed by another op or is a reshape of a strided view.
    pub(crate) fn input_view(body: &Function, v: Value, bufs: &[BufInfo]) -> Result<View, String> {
        let mut chain = Vec::new();
        let mut cur = v;
        let param = loop {
            let vd = body.values.get(cur).ok_or_else(|| format!("value {cur} does not exist"))?;
            match vd.def {
                ValueDef::Param(i) => break i,
                ValueDef::Result(n, _) => {
                    let nd = body.nodes.get(n).ok_or_else(|| format!("node {n} does not exist"))?;
                    if !matches!(nd.op.kind, OpKind::Reshape | OpKind::Slice) {
                        return Err(format!("{} is computed in the kernel (`{}`), not read from a buffer", body.label(v), nd.op.kind.name()));
                    }
                    chain.push(n);
                    cur = *nd.inputs.first().ok_or_else(|| format!("{n} has no operand"))?;
                }
            }
        };
        let info = bufs.get(param).ok_or_else(|| format!("no buffer for parameter {param}"))?;
        let mut shape = info.shape.clone();
        let mut strides = info.strides.clone();
        let mut offset = Dim::constant(0);
        let mut contiguous = strides == Layout::contiguous(&shape).strides;
        for &n in chain.iter().rev() {
            let nd = &body.nodes[n];
            let out = body.ty(*nd.results.first().ok_or_else(|| format!("{n} has no result"))?).shape.clone();
            match nd.op.kind {
                OpKind::Reshape => {
                    if !contiguous {
                        return Err(format!("{} reshapes a strided view", body.label(v)));
                    }
                    strides = Layout::contiguous(&out).strides;
                }
                _ => {
                    let axis = nd.op.int("axis").ok_or("slice without an axis")?;
                    let axis = sinter_ir::infer::norm_axis(axis, shape.len()).map_err(|e| e.to_string())?;
                    let start = nd.op.dim("start").ok_or("slice without a start")?;
                    offset = offset.add(&start.mul(&strides[axis]));
                    contiguous = contiguous && shape[..axis].iter().all(Dim::is_one);
                }
            }
            shape = out;
        }
        if strides.len() != body.ty(v).rank() {
            return Err(format!("{} has {} strides for rank {}", body.label(v), strides.len(), body.ty(v).rank()));
        }
        Ok(View { param, offset, strides, align: info.align })
    }

    /// For a kernel output `out` that is `core` through `reshape`s (the views the passes
    /// leave at the end of a body), the strides at which `core`'s elements are written into
    /// output buffer `buf` (row-major order is storage order when the buffer is contiguous).
    ///
    /// # Errors
    /// When another op lies between them or a reshape meets a strided output buffer.
    pub(crate) fn output_strides(body: &Function, out: Value, core: Value, buf: &BufInfo) -> Result<Vec<Dim>, String> {
        if out == core {
            return Ok(buf.strides.clone());
        }
        let mut cur = out;
        while cur != core {
            match body.values.get(cur).map(|d| d.def) {
                Some(ValueDef::Result(n, _)) if body.nodes[n].op.kind == OpKind::Reshape => cur = body.nodes[n].inputs[0],
                _ => return Err(format!("output {} is not a reshape of the result", body.label(out))),
            }
        }
        if buf.strides != Layout::contiguous(&buf.shape).strides {
            return Err(format!("output {} reshapes into a strided buffer", body.label(out)));
        }
        Ok(Layout::contiguous(&body.ty(core).shape).strides)
    }

    /// Strides of a tensor of shape `shape` (layout `strides`) as seen from an output of rank
    /// `out_rank` it broadcasts to (NumPy rules, right-aligned): one stride per output axis,
    /// 0 where the tensor has no such axis or a size-1 axis.
    pub(crate) fn broadcast_strides(shape: &[Dim], strides: &[Dim], out_rank: usize) -> Vec<Dim> {
        let mut out = vec![Dim::constant(0); out_rank];
        let r = shape.len();
        for (a, (d, s)) in shape.iter().zip(strides).enumerate() {
            if out_rank + a >= r && !d.is_one() {
                out[out_rank + a - r] = s.clone();
            }
        }
        out
    }

    /// The non-constant dims among `dims`, each once, in order.
    pub(crate) fn dims_of(dims: &[Dim]) -> Vec<Dim> {
        let mut out: Vec<Dim> = Vec::new();
        for d in dims {
            if d.as_const().is_none() && !out.contains(d) {
                out.push(d.clone());
            }
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sinter_ir::interp::Tensor;
    use sinter_ir::{Buffer, BufferData, BufferRole, FunctionBuilder, Graph, KernelData, KernelParam, Layout, TensorType};

    use crate::ptxas;

    /// A kernel graph holding one kernel of `family` with `body`, every buffer contiguous.
    pub(crate) fn single_kernel(family: Family, body: Function) -> (KernelGraph, Kernel) {
        let mut g = KernelGraph::default();
        let mut add = |v: Value, role: BufferRole| -> Buffer {
            let ty = body.ty(v).clone();
            let layout = Layout::contiguous(&ty.shape);
            g.buffers.push(BufferData { name: body.values[v].name.clone(), ty, role, layout })
        };
        let inputs: Vec<Buffer> = body.params.iter().map(|&p| add(p, BufferRole::Input)).collect();
        let outputs: Vec<Buffer> = body.outputs.iter().map(|&o| add(o, BufferRole::Output)).collect();
        let k = g.kernels.push(KernelData { family, body, inputs: inputs.clone(), outputs: outputs.clone() });
        g.inputs = inputs;
        g.outputs = outputs;
        (g, k)
    }

    pub(crate) fn ty(dt: DType, dims: &[Dim]) -> TensorType {
        TensorType::new(dt, dims.iter().cloned())
    }

    pub(crate) fn d(n: i64) -> Dim {
        Dim::constant(n)
    }

    pub(crate) fn sym(s: &str) -> Dim {
        Dim::symbol(s)
    }

    /// One line about a plan: entry, target, launch geometry, parameters.
    pub(crate) fn plan_line(plan: &LaunchPlan) -> String {
        let grid: Vec<String> = plan.grid.iter().map(|g| format!("⌈{}/{}⌉", g.numerator, g.denominator)).collect();
        let sizes: Vec<String> = plan
            .params
            .iter()
            .filter_map(|p| match p {
                KernelParam::Size(d) => Some(d.to_string()),
                KernelParam::TensorMap(t) => Some(format!("tmap(buffer {}, box {:?})", t.buffer, t.box_dims)),
                KernelParam::Buffer(_) => None,
            })
            .collect();
        format!(
            "{} {}: grid [{}], block {:?}, dynamic smem {}, {} buffers, sizes [{}]",
            plan.entry,
            plan.target,
            grid.join(", "),
            plan.block,
            plan.shared_bytes,
            plan.params.len() - sizes.len(),
            sizes.join(", ")
        )
    }

    /// Assembles `plan` with ptxas for its target, asserts no spills, no stack and no
    /// warnings, and returns ptxas's line for the kernel; `None` when ptxas is missing outside
    /// CI (it is an error in CI).
    pub(crate) fn assemble(plan: &LaunchPlan) -> Option<String> {
        let ptxas = ptxas::find_ptxas_for_tests().unwrap_or_else(|e| panic!("{e}"))?;
        let target = plan.target;
        let report = ptxas::assemble_with(&ptxas, &plan.ptx, &target).unwrap_or_else(|e| panic!("{}: {e}", plan.entry));
        let k = report.function(&plan.entry).unwrap_or_else(|| panic!("{report:?}"));
        assert!(!report.spills(), "{}: spills\n{report}", plan.entry);
        assert_eq!(k.stack_frame_bytes, 0, "{}: stack\n{report}", plan.entry);
        assert!(report.warnings.is_empty(), "{report}");
        assert!(!plan.ptx.contains("call."), "{}: a call in the PTX", plan.entry);
        Some(report.to_string())
    }

    /// The tensor-core primitives on one warp, emulated (and assembled for sm_80 and sm_90a):
    /// `cp.async` of a 16×16 A and a 16×16 B into shared memory (one chunk of A zero-filled
    /// past 3 elements), `ldmatrix.x4` (B both ways: `[N, K]` without `.trans`, `[K, N]`
    /// with), two `mma.m16n8k16` accumulating onto 0.5, and `pack_x2` of the result — checked
    /// against a CPU product, in bf16 and f16.
    #[test]
    fn mma_primitives() {
        use super::emu::{from_bytes, random, run, to_bytes};
        for dt in [DType::BF16, DType::F16] {
            for b_k_contig in [true, false] {
                let build = |kit: &Kit<'_>| -> R<()> {
                    let smem = kit.shared(SharedKind::Static, 1024)?;
                    let lane = kit.sreg("tid.x")?;
                    let (a, b) = (kit.buf(0)?, kit.buf(1)?);
                    // Chunk `lane` of each 16 × 16 tile: row lane/2, 8 elements from 8·(lane%2).
                    let row = kit.lshr(lane, 1)?;
                    let half = kit.and(lane, kit.i32c(1))?;
                    let at = kit.zext64(kit.add(kit.mul(row, kit.i32c(16))?, kit.shl(half, 3)?)?)?;
                    let boff = kit.add(kit.mul(row, kit.i32c(32))?, kit.shl(half, 4)?)?;
                    let last = kit.icmp(IntPredicate::EQ, lane, kit.i32c(31))?;
                    let bytes = kit.select_i(last, kit.i32c(6), kit.i32c(16))?;
                    kit.cp_async_16(kit.sh_at(smem, boff)?, kit.gep_raw(dt, a, at)?, bytes)?;
                    kit.cp_async_16(kit.sh_at(smem, kit.add(boff, kit.i32c(512))?)?, kit.gep_raw(dt, b, at)?, kit.i32c(16))?;
                    kit.cp_async_commit()?;
                    kit.cp_async_wait(0)?;
                    kit.warp_sync()?;
                    // A: lane l at row l % 16, column 8·(l / 16).
                    let aoff = kit.add(kit.mul(kit.and(lane, kit.i32c(15))?, kit.i32c(32))?, kit.shl(kit.lshr(lane, 4)?, 4)?)?;
                    let af = kit.ldmatrix_x4(kit.sh_at(smem, aoff)?, false)?;
                    // B [N, K]: lane l at row (l % 8) + 8·(l / 16), column 8·((l / 8) % 2);
                    // B [K, N] (.trans): row (l % 16), column 8·(l / 16).
                    let r8 = kit.and(lane, kit.i32c(7))?;
                    let j1 = kit.and(kit.lshr(lane, 3)?, kit.i32c(1))?;
                    let j2 = kit.lshr(lane, 4)?;
                    let (brow, bcol) = if b_k_contig { (kit.add(r8, kit.shl(j2, 3)?)?, j1) } else { (kit.add(r8, kit.shl(j1, 3)?)?, j2) };
                    let bo = kit.add(kit.i32c(512), kit.add(kit.mul(brow, kit.i32c(32))?, kit.shl(bcol, 4)?)?)?;
                    let bf = kit.ldmatrix_x4(kit.sh_at(smem, bo)?, !b_k_contig)?;
                    let g = kit.zext64(kit.lshr(lane, 2)?)?;
                    let t2 = kit.zext64(kit.shl(kit.and(lane, kit.i32c(3))?, 1)?)?;
                    let c = kit.f32c(0.5);
                    for nt in 0..2usize {
                        let d = kit.mma(dt, af, [bf[2 * nt], bf[2 * nt + 1]], [c; 4])?;
                        for h in 0..2usize {
                            let row = kit.add(g, kit.i64c(8 * h as i64))?;
                            let e = kit.add(kit.mul(row, kit.i64c(16))?, kit.add(t2, kit.i64c(8 * nt as i64))?)?;
                            kit.store_vec(DType::F32, kit.buf(2)?, e, &[d[2 * h], d[2 * h + 1]])?;
                            let packed = kit.math(|kb| kb.pack_x2(dt, d[2 * h], d[2 * h + 1]))?;
                            let p = kit.gep(kit.i32t.into(), kit.buf(3)?, kit.udiv(e, kit.i64c(2))?)?;
                            kit.set(p, packed.into())?;
                        }
                    }
                    Ok(())
                };
                let make = |emit_ir: bool, target: Target| -> LaunchPlan {
                    super::kit::EMIT_IR.with(|f| f.set(emit_ir));
                    let ctx = Context::create();
                    let (ptx, params) = Kit::build(&ctx, "mma_unit", target, 2, 2, &[], 32, build).unwrap();
                    super::kit::EMIT_IR.with(|f| f.set(false));
                    LaunchPlan { entry: "mma_unit".into(), ptx, target, grid: [GridDim::fixed(1), GridDim::fixed(1), GridDim::fixed(1)], block: [32, 1, 1], shared_bytes: 0, params }
                };
                for t in [Target::SM_80, Target::SM_90A] {
                    let plan = make(false, t);
                    for want in ["cp.async.cg.shared.global", "cp.async.wait_group", "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32"] {
                        assert!(plan.ptx.contains(want), "{dt} {t}: no {want}:\n{}", plan.ptx);
                    }
                    assert_eq!(plan.ptx.contains("ldmatrix.sync.aligned.m8n8.x4.trans"), !b_k_contig);
                    assemble(&plan);
                }
                let a = random(dt, &[16, 16], 70);
                let b = random(dt, &[16, 16], 71);
                let mut bufs = vec![to_bytes(&a), to_bytes(&b), vec![0u8; 16 * 16 * 4], vec![0u8; 16 * 16 * 2]];
                run(&make(true, Target::SM_80), &sinter_ir::Bindings::new(), &mut bufs);
                let got = from_bytes(DType::F32, &bufs[2], 256);
                let packed = from_bytes(dt, &bufs[3], 256);
                for i in 0..16 {
                    for j in 0..16 {
                        let mut want = 0.5;
                        for kk in 0..16 {
                            // The last chunk of A (row 15, k 8..16) kept 3 elements.
                            let av = if i == 15 && kk >= 11 { 0.0 } else { a.data()[i * 16 + kk] };
                            let bv = if b_k_contig { b.data()[j * 16 + kk] } else { b.data()[kk * 16 + j] };
                            want += av * bv;
                        }
                        let o = got[i * 16 + j];
                        assert!((o - want).abs() <= 1e-5 * (1.0 + want.abs()), "{dt} B k-contiguous {b_k_contig}: D[{i}][{j}] = {o}, want {want}");
                        assert_eq!(packed[i * 16 + j], dt.round(o), "{dt}: pack_x2 at [{i}][{j}]");
                    }
                }
            }
        }
    }

    /// `x [M, 576] · w [1536, 576]ᵀ + bias [1536]`, then silu: a projection with an epilogue.
    fn projection(m: Dim, dt: DType) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
        let x = fb.param("x", ty(dt, &[m, d(576)]));
        let w = fb.param("w", ty(dt, &[d(1536), d(576)]));
        let bias = fb.param("bias", ty(dt, &[d(1536)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let y = fb.op1(OpKind::Add, &[mm, bias], vec![]).unwrap();
        let z = fb.op1(OpKind::Silu, &[y], vec![]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[z]).unwrap())
    }

    /// `x + attn · wo [576, 576]ᵀ` (the residual add of a decoder layer), M rows.
    fn residual(m: Dim) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "o_proj");
        let attn = fb.param("attn", ty(DType::BF16, &[m.clone(), d(576)]));
        let wo = fb.param("wo", ty(DType::BF16, &[d(576), d(576)]));
        let x = fb.param("x", ty(DType::BF16, &[m, d(576)]));
        let mm = fb.op1(OpKind::Matmul, &[attn, wo], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let y = fb.op1(OpKind::Add, &[x, mm], vec![]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
    }

    /// Batched scores `q [9, T, 64] · k [3→9 broadcast? no: 9, S, 64]ᵀ · 0.125` in f32 with a
    /// second output (the unscaled product).
    fn batched_scores() -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "scores");
        let q = fb.param("q", ty(DType::F32, &[sym("B"), d(9), sym("T"), d(64)]));
        let k = fb.param("k", ty(DType::F32, &[d(9), sym("S"), d(64)]));
        let mm = fb.op1(OpKind::Matmul, &[q, k], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let c = fb.op1(OpKind::Constant, &[], vec![("value", Attr::Float(0.125)), ("dtype", Attr::DType(DType::F32))]).unwrap();
        let s = fb.op1(OpKind::Mul, &[mm, c], vec![]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[s, mm]).unwrap())
    }

    /// `x [4, 100] · w [100, 200]` in f16 (B N-contiguous: a thread per column), cast to f32.
    fn n_contiguous() -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "nc");
        let x = fb.param("x", ty(DType::F16, &[d(4), d(100)]));
        let w = fb.param("w", ty(DType::F16, &[d(100), d(200)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
        let y = fb.op1(OpKind::Cast, &[mm], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
    }

    /// `x [m, 512] · w [512, 1000]` in f16 (B N-contiguous) plus a bias, cast to f32.
    fn n_contiguous_f16(m: Dim) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "nc");
        let x = fb.param("x", ty(DType::F16, &[m, d(512)]));
        let w = fb.param("w", ty(DType::F16, &[d(512), d(1000)]));
        let b = fb.param("b", ty(DType::F16, &[d(1000)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
        let y = fb.op1(OpKind::Add, &[mm, b], vec![]).unwrap();
        let y = fb.op1(OpKind::Cast, &[y], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
    }

    /// [`n_contiguous_f16`] with `m = T`: the tensor-core GEMM with `ldmatrix.trans`.
    fn n_contiguous_mma() -> (KernelGraph, Kernel) {
        n_contiguous_f16(sym("T"))
    }

    /// [`n_contiguous_f16`] with `m = 8`: the flat tensor-core GEMM with `ldmatrix.trans`.
    fn n_contiguous_flat() -> (KernelGraph, Kernel) {
        n_contiguous_f16(d(8))
    }

    /// Every case at sm_80 and sm_90a: plan and ptxas resource line (no spills).
    #[test]
    fn ptxas_reports() {
        let cases: Vec<(&str, (KernelGraph, Kernel))> = vec![
            ("projection bf16 M=T (tensor cores)", projection(sym("T"), DType::BF16)),
            ("projection bf16 M=1 (small M)", projection(d(1), DType::BF16)),
            ("residual bf16 M=16 (flat tensor cores)", residual(d(16))),
            ("projection bf16 M=5 (flat tensor cores)", projection(d(5), DType::BF16)),
            ("f16 N-contiguous M=8 (flat tensor cores, ldmatrix.trans)", n_contiguous_flat()),
            ("residual bf16 M=T (tensor cores, 128-column tiles)", residual(sym("T"))),
            ("batched scores f32, two outputs (tiled)", batched_scores()),
            ("f16 N-contiguous M=4 (small M, thread per column)", n_contiguous()),
            ("f16 N-contiguous M=T (tensor cores, ldmatrix.trans)", n_contiguous_mma()),
            ("projection f32 M=T (tiled)", projection(sym("T"), DType::F32)),
        ];
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in &cases {
                let plan = generate(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("matmul_ptxas", text);
    }

    #[test]
    fn launch_plans() {
        // bf16 at a symbolic M: the tensor cores, 128×256 tiles, 144 KiB of dynamic shared
        // memory, the launch bound declared.
        let (g, k) = projection(sym("T"), DType::BF16);
        // sm_90a: the same tile on warpgroup MMAs, 4 stages (192 KiB), 8 warps, the stages
        // loaded by the TMA from two tensor maps (parameters after the buffers).
        let hopper = generate(&g, k, &Target::SM_90A).unwrap();
        assert_eq!((hopper.entry.as_str(), hopper.block, hopper.shared_bytes), ("k0_matmul_wgmma", [256, 1, 1], 192 * 1024));
        assert_eq!(hopper.grid[..2], [GridDim { numerator: sym("T"), denominator: 128 }, GridDim { numerator: d(1536), denominator: 256 }]);
        assert!(hopper.ptx.contains("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16") && hopper.ptx.contains("cp.async.bulk.tensor.2d"));
        assert!(matches!(hopper.params[..], [KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Buffer(3), KernelParam::TensorMap(_), KernelParam::TensorMap(_), KernelParam::Size(_)]), "{:?}", hopper.params);
        let plan = generate(&g, k, &Target::SM_90).unwrap();
        assert_eq!(plan.entry, "k0_matmul_mma");
        assert_eq!(plan.block, [256, 1, 1]);
        assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 128 });
        assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 256 });
        assert_eq!(plan.grid[2], GridDim::fixed(1));
        assert_eq!(plan.shared_bytes, 144 * 1024);
        assert_eq!(&plan.params[..4], &[KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Buffer(3)]);
        assert!(plan.params[4..].iter().all(|p| matches!(p, KernelParam::Size(_))), "{:?}", plan.params);
        assert!(plan.params.contains(&KernelParam::Size(sym("T"))));
        assert!(plan.ptx.contains(".entry k0_matmul_mma("), "{}", plan.ptx);
        assert!(plan.ptx.contains(".maxntid 256"), "{}", plan.ptx);
        for want in ["cp.async.cg.shared.global", "cp.async.wait_group", "ldmatrix.sync.aligned.m8n8.x4.shared.b16", "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", "cvt.rn.bf16x2.f32"] {
            assert!(plan.ptx.contains(want), "no {want}");
        }
        assert!(!plan.ptx.contains(".trans"), "both operands K-contiguous: no transposed ldmatrix");
        // f32 stays on the CUDA cores.
        let (g, k) = projection(sym("T"), DType::F32);
        let plan = generate(&g, k, &Target::SM_90A).unwrap();
        assert_eq!(plan.entry, "k0_matmul");
        assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 64 });
        assert_eq!(plan.shared_bytes, 0);
        // A layout the 16-byte copies cannot prove (rows of 577 elements) falls back to the
        // tiled kernel, and the tensor-core schedule given explicitly is refused.
        let mut fb = FunctionBuilder::new(&Graph::new(), "odd");
        let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(577)]));
        let w = fb.param("w", ty(DType::BF16, &[d(64), d(577)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
        assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul");
        let e = generate_with(&g, k, &Target::SM_80, &MatmulSchedule::Mma(MmaSchedule::DEFAULT)).unwrap_err();
        assert!(e.to_string().contains("aligned 16-byte chunks"), "{e}");
        // More stages than sm_80's shared memory holds.
        let (g, k) = projection(sym("T"), DType::BF16);
        let deep = MmaSchedule { stages: 4, ..MmaSchedule::DEFAULT };
        assert!(generate_with(&g, k, &Target::SM_80, &MatmulSchedule::Mma(deep)).is_err());
        assert!(generate_with(&g, k, &Target::SM_90A, &MatmulSchedule::Mma(deep)).is_ok());
        // The small-M path reads 16-byte vectors of x and w and reduces with shuffles.
        let (g, k) = projection(d(1), DType::BF16);
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.entry, "k0_matmul_small_m");
        assert_eq!(plan.grid[0], GridDim { numerator: d(1536), denominator: 4 });
        assert!(plan.ptx.contains("ld.global.nc.v4.b32"), "{}", plan.ptx);
        assert!(plan.ptx.contains("shfl.sync.bfly.b32"), "{}", plan.ptx);
        // M = 5: the flat tensor-core GEMM, one 16-row tile, 32 columns per CTA, 2 warps,
        // 4 stages of 16×256 and 32×256 slabs (96 KiB).
        let (g, k) = projection(d(5), DType::BF16);
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.entry, "k0_matmul_mma");
        assert_eq!(plan.grid[0], GridDim { numerator: d(5), denominator: 16 });
        assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 32 });
        assert_eq!(plan.block, [64, 1, 1]);
        assert_eq!(plan.shared_bytes, 96 * 1024);
        assert!(plan.ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
        // f32 at M = 5 and a layout without 16-byte chunks (rows of 577) keep the small-M kernel.
        let (g, k) = projection(d(5), DType::F32);
        assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
        let mut fb = FunctionBuilder::new(&Graph::new(), "odd");
        let x = fb.param("x", ty(DType::BF16, &[d(5), d(577)]));
        let w = fb.param("w", ty(DType::BF16, &[d(64), d(577)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
        assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
        // Batched: grid.z is the batch.
        let (g, k) = batched_scores();
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.grid[2], GridDim { numerator: sym("B").scale(9), denominator: 1 });
    }

    #[test]
    fn schedule_heuristic() {
        let bf = DType::BF16;
        assert_eq!(choose_schedule(&sym("T"), &d(1536), bf, true), MatmulSchedule::Mma(MmaSchedule::DEFAULT));
        assert_eq!(choose_schedule(&sym("T"), &sym("N"), DType::F16, false), MatmulSchedule::Mma(MmaSchedule::DEFAULT));
        assert_eq!(choose_schedule(&d(17), &d(576), bf, true), MatmulSchedule::Mma(MmaSchedule::NARROW));
        assert_eq!(choose_schedule(&sym("T"), &d(64), bf, true), MatmulSchedule::Mma(MmaSchedule::NARROW));
        assert_eq!(choose_schedule(&sym("T"), &d(64), DType::F32, true), MatmulSchedule::Tiled(TiledSchedule::DEFAULT));
        assert_eq!(choose_schedule(&d(17), &d(64), DType::F32, true), MatmulSchedule::Tiled(TiledSchedule::DEFAULT));
        assert_eq!(choose_schedule(&d(1), &d(64), bf, true), MatmulSchedule::SmallM(SmallMSchedule { rows: 1, lanes: 32, columns: 4 }));
        assert_eq!(choose_schedule(&d(1), &d(64), bf, false), MatmulSchedule::SmallM(SmallMSchedule { rows: 1, lanes: 1, columns: 128 }));
        // M in 2..=16 of bf16/f16: the flat tensor-core GEMM; f32 keeps the small-M kernel.
        for m in [2, 5, 16] {
            assert_eq!(choose_schedule(&d(m), &d(576), bf, true), MatmulSchedule::Mma(MmaSchedule::FLAT));
            assert_eq!(choose_schedule(&d(m), &d(192), DType::F16, false), MatmulSchedule::Mma(MmaSchedule::FLAT));
        }
        assert_eq!(choose_schedule(&d(16), &d(64), DType::F32, false), MatmulSchedule::SmallM(SmallMSchedule { rows: 16, lanes: 1, columns: 128 }));
        assert_eq!(MmaSchedule::FLAT, MmaSchedule { bm: 16, bn: 32, bk: 256, warps_m: 1, warps_n: 2, stages: 4, group_m: 1 });
        for bn in [32, 64, 128, 256] {
            let s = MmaSchedule::flat(bn);
            s.check().unwrap();
            assert_eq!(s.warp_tile().0, 16);
            assert!(s.stages * s.stage_bytes() <= 144 * 1024, "{s:?}");
        }
        assert_eq!(MmaSchedule::DEFAULT.threads(), 256);
        assert_eq!(MmaSchedule::DEFAULT.warp_tile(), (64, 64));
        assert_eq!(3 * MmaSchedule::DEFAULT.stage_bytes(), 144 * 1024);
        assert_eq!(MmaSchedule::for_columns(&d(4096), 128), MmaSchedule::DEFAULT);
        assert_eq!(MmaSchedule::for_columns(&d(576), 256), MmaSchedule::DEFAULT, "a 256-wide RoPE head needs 256-column tiles");
        assert_eq!(TiledSchedule::DEFAULT.threads(), 256);
        assert_eq!(TiledSchedule::DEFAULT.shared_bytes(), 8704);
        // Other schedules generate and assemble too (the autotuner's candidates).
        let (g, k) = residual(sym("T"));
        for s in [
            MatmulSchedule::Tiled(TiledSchedule { bm: 32, bn: 64, bk: 8, tm: 2, tn: 4 }),
            MatmulSchedule::Tiled(TiledSchedule { bm: 128, bn: 64, bk: 8, tm: 4, tn: 4 }),
            MatmulSchedule::Tiled(TiledSchedule { bm: 32, bn: 32, bk: 8, tm: 1, tn: 4 }),
            MatmulSchedule::SmallM(SmallMSchedule { rows: 8, lanes: 8, columns: 16 }),
        ] {
            let plan = generate_with(&g, k, &Target::SM_80, &s).unwrap_or_else(|e| panic!("{s:?}: {e}"));
            assemble(&plan);
        }
        let bad = MatmulSchedule::Tiled(TiledSchedule { bm: 64, bn: 64, bk: 16, tm: 3, tn: 4 });
        assert!(matches!(generate_with(&g, k, &Target::SM_80, &bad), Err(CodegenError::Unsupported { .. })));
    }

    #[test]
    fn rejects_what_it_cannot_do() {
        let unsupported = |f: Function| {
            let (g, k) = single_kernel(Family::Matmul, f);
            match generate(&g, k, &Target::SM_80) {
                Err(CodegenError::Unsupported { kernel, message }) => format!("{kernel}: {message}"),
                other => panic!("{other:?}"),
            }
        };
        // A prologue (the operand is computed in the kernel).
        let mut fb = FunctionBuilder::new(&Graph::new(), "k");
        let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
        let w = fb.param("w", ty(DType::F32, &[d(8), d(8)]));
        let xn = fb.op1(OpKind::Neg, &[x], vec![]).unwrap();
        let mm = fb.op1(OpKind::Matmul, &[xn, w], vec![]).unwrap();
        let msg = unsupported(fb.finish(&[mm]).unwrap());
        assert!(msg.contains("k0 (Matmul)") && msg.contains("computed in the kernel"), "{msg}");
        // An output of another shape.
        let mut fb = FunctionBuilder::new(&Graph::new(), "k");
        let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
        let w = fb.param("w", ty(DType::F32, &[d(8), d(8)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
        let r = fb.op1(OpKind::ReduceSum, &[mm], vec![]).unwrap();
        let msg = unsupported(fb.finish(&[r]).unwrap());
        assert!(msg.contains("`reduce_sum` on the matmul's result"), "{msg}");
        // Integer operands.
        let mut fb = FunctionBuilder::new(&Graph::new(), "k");
        let x = fb.param("x", ty(DType::I32, &[d(4), d(8)]));
        let w = fb.param("w", ty(DType::I32, &[d(8), d(8)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
        let msg = unsupported(fb.finish(&[mm]).unwrap());
        assert!(msg.contains("bf16, f16 or f32"), "{msg}");
        // A kernel of another family.
        let (g, k) = projection(d(2), DType::F32);
        let mut g2 = g.clone();
        g2.kernels[k].family = Family::Pointwise;
        assert!(generate(&g2, k, &Target::SM_80).is_err());
    }

    /// The merged QKV projection as the passes fuse it (SmolLM2 sizes): one matmul, column
    /// slices for Q, K, V, RoPE on Q and K after a reshape to heads.
    pub(crate) fn qkv_rope(m: Dim, dt: DType) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "qkv");
        let x = fb.param("x", ty(dt, &[m.clone(), d(576)]));
        let w = fb.param("w", ty(dt, &[d(960), d(576)]));
        let pos = fb.param("positions", ty(DType::I32, std::slice::from_ref(&m)));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let p2 = fb.op1(OpKind::Reshape, &[pos], vec![("shape", Attr::Dims(vec![m.clone(), d(1)]))]).unwrap();
        let slice = |fb: &mut FunctionBuilder, a: i64, b: i64| {
            fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(a))), ("end", Attr::Dim(d(b)))]).unwrap()
        };
        let q = slice(&mut fb, 0, 576);
        let q = fb.op1(OpKind::Reshape, &[q], vec![("shape", Attr::Dims(vec![m.clone(), d(9), d(64)]))]).unwrap();
        let q = fb.op1(OpKind::Rope, &[q, p2], vec![("theta", Attr::Float(100000.0))]).unwrap();
        let k = slice(&mut fb, 576, 768);
        let k = fb.op1(OpKind::Reshape, &[k], vec![("shape", Attr::Dims(vec![m.clone(), d(3), d(64)]))]).unwrap();
        let k = fb.op1(OpKind::Rope, &[k, p2], vec![("theta", Attr::Float(100000.0))]).unwrap();
        let v = slice(&mut fb, 768, 960);
        single_kernel(Family::Matmul, fb.finish(&[q, k, v]).unwrap())
    }

    /// The merged gate/up projection with SwiGLU over its halves.
    pub(crate) fn gate_up(m: Dim, dt: DType) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "mlp");
        let x = fb.param("x", ty(dt, &[m, d(576)]));
        let w = fb.param("w", ty(dt, &[d(3072), d(576)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let g = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(1536)))]).unwrap();
        let u = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(1536))), ("end", Attr::Dim(d(3072)))]).unwrap();
        let o = fb.op1(OpKind::Swiglu, &[g, u], vec![]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[o]).unwrap())
    }

    /// The warp-specialised wgmma kernel writes from registers only: a staged epilogue (the
    /// gate/up pairs) is refused with the reason and is not among the candidates, persistent
    /// CTAs need the specialised kernel, and specialisation needs the TMA.
    #[test]
    fn wgmma_ws_refuses_what_it_cannot_run() {
        let ws = WgmmaSchedule { specialized: true, ..WgmmaSchedule::DEFAULT };
        let (g, k) = gate_up(d(256), DType::BF16);
        let err = generate_with(&g, k, &Target::SM_90A, &MatmulSchedule::Wgmma(ws)).unwrap_err();
        assert!(err.to_string().contains("staged epilogue"), "{err}");
        let names: Vec<String> = variants(&g, k, &Target::SM_90A).unwrap().into_iter().map(|(n, _)| n).collect();
        assert!(names.iter().all(|n| !n.contains(" ws")), "{names:?}");
        let (g, k) = o_proj_view(d(256));
        for (w, why) in [(WgmmaSchedule { ctas: 132, ..WgmmaSchedule::DEFAULT }, "persistent"), (WgmmaSchedule { tma: false, ..ws }, "TMA")] {
            let err = generate_with(&g, k, &Target::SM_90A, &MatmulSchedule::Wgmma(w)).unwrap_err();
            assert!(err.to_string().contains(why), "{err}");
        }
        assert_eq!(MatmulSchedule::Wgmma(WgmmaSchedule { ctas: 132, ..ws }).name(), "wgmma 128x256x64 s4 f1 tma ws p132");
    }

    /// `x + reshape(attn [1, M, 9, 64]) · wo` — the operand through a view, as the passes
    /// leave the attention output.
    fn o_proj_view(m: Dim) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "o_proj");
        let attn = fb.param("attn", ty(DType::BF16, &[d(1), m.clone(), d(9), d(64)]));
        let wo = fb.param("wo", ty(DType::BF16, &[d(576), d(576)]));
        let x = fb.param("x", ty(DType::BF16, &[m.clone(), d(576)]));
        let a = fb.op1(OpKind::Reshape, &[attn], vec![("shape", Attr::Dims(vec![m, d(576)]))]).unwrap();
        let mm = fb.op1(OpKind::Matmul, &[a, wo], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let y = fb.op1(OpKind::Add, &[x, mm], vec![]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
    }

    /// SmolLM2's prefill QKV projection as the passes fuse it: RoPE on Q and K, and K and V
    /// appended to the paged cache (the prefill form: one sequence's block table, its start
    /// from the first position).
    pub(crate) fn qkv_append_prefill() -> (KernelGraph, Kernel) {
        let text = "func @k3_matmul(%block_tables: i32[2, 1, M], %x: bf16[T, 576], %w: bf16[960, 576], %positions: i32[T], %k_pages: bf16[P, 16, 3, 64], %v_pages: bf16[P, 16, 3, 64]) {
  %v6: i32[1, 1, M] = slice(%block_tables) {axis=-3, start=0, end=1}
  %v7: i32[1, M] = reshape(%v6) {shape=[1, M]}
  %v8: bf16[T, 960] = matmul(%x, %w) {transpose_b=true}
  %v9: bf16[T, 576] = slice(%v8) {start=0, end=576}
  %v10: bf16[T, 9, 64] = reshape(%v9) {shape=[T, 9, 64]}
  %v11: i32[T, 1] = reshape(%positions) {shape=[T, 1]}
  %v12: bf16[T, 9, 64] = rope(%v10, %v11) {theta=100000.0}
  %v13: bf16[T, 192] = slice(%v8) {start=576, end=768}
  %v14: bf16[T, 3, 64] = reshape(%v13) {shape=[T, 3, 64]}
  %v15: bf16[T, 3, 64] = rope(%v14, %v11) {theta=100000.0}
  %v16: bf16[1, T, 3, 64] = reshape(%v15) {shape=[1, T, 3, 64]}
  %v17: bf16[T, 192] = slice(%v8) {start=768, end=960}
  %v18: bf16[1, T, 3, 64] = reshape(%v17) {shape=[1, T, 3, 64]}
  %v19: i32[1] = slice(%positions) {start=0, end=1}
  %v20: bf16[P, 16, 3, 64], %v21: bf16[P, 16, 3, 64] = kv_append(%k_pages, %v_pages, %v16, %v18, %v7, %v19)
  return %v12, %v15, %v20, %v21, %v18
}
";
        let g = sinter_ir::parse(text).unwrap();
        let f = g.funcs.values().next().unwrap().clone();
        single_kernel(Family::Matmul, f)
    }

    /// The fused bodies the passes produce for a Llama layer generate and assemble, prefill
    /// (symbolic M) and decode (M = 1), with the staged epilogue where they need it.
    #[test]
    fn llama_layer_bodies() {
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in [
                ("qkv+rope M=T", qkv_rope(sym("T"), DType::BF16)),
                ("qkv+rope M=1", qkv_rope(d(1), DType::BF16)),
                ("qkv+rope M=8 (flat)", qkv_rope(d(8), DType::BF16)),
                ("gate/up swiglu M=T", gate_up(sym("T"), DType::BF16)),
                ("gate/up swiglu M=1", gate_up(d(1), DType::BF16)),
                ("gate/up swiglu M=8 (flat)", gate_up(d(8), DType::BF16)),
                ("o_proj through a view M=T", o_proj_view(sym("T"))),
                ("o_proj through a view M=1", o_proj_view(d(1))),
                ("o_proj through a view M=8 (flat)", o_proj_view(d(8))),
                ("qkv+rope+kv_append (prefill) M=T", qkv_append_prefill()),
            ] {
                let plan = generate(&g, k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("matmul_llama_ptxas", text);
        // The tiling each epilogue needs.
        let spec = |(g, k): (KernelGraph, Kernel)| Spec::analyse(&g, k).unwrap();
        assert!(matches!(spec(qkv_rope(sym("T"), DType::BF16)).epi, Epi::Columns { rope_d: 64, .. }));
        assert!(matches!(spec(gate_up(sym("T"), DType::BF16)).epi, Epi::Paired { .. }));
        assert!(matches!(spec(o_proj_view(sym("T"))).epi, Epi::Direct));
        let (g, k) = gate_up(sym("T"), DType::BF16);
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.entry, "k0_matmul_mma");
        assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 128 }, "128 output columns (of each half) per 256-column CTA");
        // The same in f32: the tiled kernel, 32 columns of each half per CTA.
        let (g, k) = gate_up(sym("T"), DType::F32);
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 32 }, "32 output columns per CTA");
        let (g, k) = o_proj_view(d(1));
        assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
        // At a constant M the paired and columns epilogues take the small-M kernel too (each
        // group computes the n-th column of both halves, or its column and RoPE partner).
        let (g, k) = gate_up(d(1), DType::BF16);
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.entry, "k0_matmul_small_m");
        assert_eq!(plan.grid[0], GridDim { numerator: d(1536), denominator: 4 }, "4 output columns per CTA");
        let (g, k) = qkv_rope(d(1), DType::BF16);
        assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
        // M = 8: the flat GEMM; 16 columns of each half per CTA, a 64-column tile (the RoPE
        // head) for QKV, 32 for o_proj.
        for (what, (g, k), cols, den) in [("gate/up", gate_up(d(8), DType::BF16), 1536, 16), ("qkv", qkv_rope(d(8), DType::BF16), 960, 64), ("o_proj", o_proj_view(d(8)), 576, 32)] {
            let plan = generate(&g, k, &Target::SM_80).unwrap();
            assert_eq!(plan.entry, "k0_matmul_mma", "{what}");
            assert_eq!(plan.grid[1], GridDim { numerator: d(cols), denominator: den }, "{what}");
        }
    }

    /// Epilogues no mode covers are refused, never computed wrongly: RoPE across the whole
    /// width with a head that does not divide the tile, a broadcast of the result.
    #[test]
    fn rejects_cross_element_epilogues() {
        let mut fb = FunctionBuilder::new(&Graph::new(), "k");
        let x = fb.param("x", ty(DType::F32, &[sym("T"), d(32)]));
        let w = fb.param("w", ty(DType::F32, &[d(96), d(32)]));
        let pos = fb.param("pos", ty(DType::I32, &[sym("T"), d(1)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let r = fb.op1(OpKind::Reshape, &[mm], vec![("shape", Attr::Dims(vec![sym("T"), d(1), d(96)]))]).unwrap();
        let p3 = fb.op1(OpKind::Reshape, &[pos], vec![("shape", Attr::Dims(vec![sym("T"), d(1)]))]).unwrap();
        let o = fb.op1(OpKind::Rope, &[r, p3], vec![("theta", Attr::Float(10000.0))]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
        let e = generate(&g, k, &Target::SM_80).unwrap_err();
        assert!(e.to_string().contains("rope over 96 columns"), "{e}");
        // A reduction of the result.
        let mut fb = FunctionBuilder::new(&Graph::new(), "k");
        let x = fb.param("x", ty(DType::F32, &[d(4), d(8)]));
        let w = fb.param("w", ty(DType::F32, &[d(8), d(8)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![]).unwrap();
        let t = fb.op1(OpKind::Transpose, &[mm], vec![]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[t]).unwrap());
        let e = generate(&g, k, &Target::SM_80).unwrap_err();
        assert!(e.to_string().contains("`transpose` on the matmul's result"), "{e}");
    }

    fn bind(pairs: &[(&str, i64)]) -> sinter_ir::Bindings {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// Emulated on the CPU against the interpreter (see [`super::emu`]): the tiled and the
    /// small-M kernels, tails in M, N and K, epilogues, batches.
    #[test]
    fn emulated_matches_interpreter() {
        use super::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
        // x [T, 40] · w [N=70, 40]ᵀ + bias, silu: tiled (T symbolic), tails everywhere.
        let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
        let x = fb.param("x", ty(DType::F32, &[sym("T"), d(40)]));
        let w = fb.param("w", ty(DType::F32, &[d(70), d(40)]));
        let bias = fb.param("bias", ty(DType::F32, &[d(70)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let y = fb.op1(OpKind::Add, &[mm, bias], vec![]).unwrap();
        let z = fb.op1(OpKind::Silu, &[y], vec![]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[z]).unwrap());
        for t in [1usize, 17, 65] {
            let ins = [random(DType::F32, &[t, 40], 1), random(DType::F32, &[70, 40], 2), random(DType::F32, &[70], 3)];
            check(&format!("f32 proj T={t}"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
        }
        // The same in bf16 at M = 3 (small-M, warp per column, 16-byte vectors of x and w).
        let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
        let x = fb.param("x", ty(DType::BF16, &[d(3), d(64)]));
        let w = fb.param("w", ty(DType::BF16, &[d(70), d(64)]));
        let r = fb.param("r", ty(DType::BF16, &[d(3), d(70)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let y = fb.op1(OpKind::Add, &[r, mm], vec![]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[y]).unwrap());
        let ins = [random(DType::BF16, &[3, 64], 4), random(DType::BF16, &[70, 64], 5), random(DType::BF16, &[3, 70], 6)];
        check("bf16 small-M residual", &g, k, gen, &ins, &bind(&[]));
        // f32 at M = 2: a warp per column with 16-byte vectors (4 floats).
        let mut fb = FunctionBuilder::new(&Graph::new(), "proj32");
        let x = fb.param("x", ty(DType::F32, &[d(2), d(64)]));
        let w = fb.param("w", ty(DType::F32, &[d(45), d(64)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let (g32, k32) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
        let ins32 = [random(DType::F32, &[2, 64], 40), random(DType::F32, &[45, 64], 41)];
        check("f32 small-M warp per column", &g32, k32, gen, &ins32, &bind(&[]));
        // K-contiguous B at small M through the tiled kernel too.
        let tiled = |g: &KernelGraph, k: Kernel| generate_with(g, k, &Target::SM_80, &MatmulSchedule::Tiled(TiledSchedule::DEFAULT));
        check("bf16 residual, tiled", &g, k, tiled, &ins, &bind(&[]));
        // Batched, A broadcast over the batch, B not transposed (N contiguous), K = 1000.
        let (g, k) = matmul_kernel(ty(DType::F32, &[d(5), d(1000)]), ty(DType::F32, &[d(2), d(1000), d(17)]), vec![]);
        let ins = [random(DType::F32, &[5, 1000], 7), random(DType::F32, &[2, 1000, 17], 8)];
        check("f32 batched N-contiguous (small-M, thread per column)", &g, k, gen, &ins, &bind(&[]));
        check("f32 batched N-contiguous, tiled", &g, k, tiled, &ins, &bind(&[]));
        // transpose_a, M = 0 rows-worth of nothing: K = 0 gives zeros.
        let mut fb = FunctionBuilder::new(&Graph::new(), "ta");
        let a = fb.param("a", ty(DType::F32, &[sym("K"), d(33)]));
        let b = fb.param("b", ty(DType::F32, &[sym("K"), d(9)]));
        let mm = fb.op1(OpKind::Matmul, &[a, b], vec![("transpose_a", Attr::Bool(true))]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
        for kk in [0usize, 1, 19] {
            let ins = [random(DType::F32, &[kk, 33], 9), random(DType::F32, &[kk, 9], 10)];
            check(&format!("f32 transpose_a K={kk}"), &g, k, gen, &ins, &bind(&[("K", kk as i64)]));
        }
        emulated_mma_direct();
    }

    /// `x [m, k] · dequantize(w [n, k] of q, dtype)ᵀ`, then `epi`: "none", "bias_silu" (+ bias
    /// [n], silu) or "residual" (+ r [m, n]); the kernel reads w as stored blocks.
    fn quant_proj(q: DType, dt: DType, m: Dim, n: i64, k: i64, epi: &str) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "qproj");
        let x = fb.param("x", ty(dt, &[m.clone(), d(k)]));
        let w = fb.param("w", ty(q, &[d(n), d(k)]));
        let wd = fb.op1(OpKind::Dequantize, &[w], vec![("dtype", Attr::DType(dt))]).unwrap();
        let mut y = fb.op1(OpKind::Matmul, &[x, wd], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        match epi {
            "bias_silu" => {
                let bias = fb.param("bias", ty(dt, &[d(n)]));
                y = fb.op1(OpKind::Add, &[y, bias], vec![]).unwrap();
                y = fb.op1(OpKind::Silu, &[y], vec![]).unwrap();
            }
            "residual" => {
                let r = fb.param("r", ty(dt, &[m, d(n)]));
                y = fb.op1(OpKind::Add, &[r, y], vec![]).unwrap();
            }
            _ => {}
        }
        single_kernel(Family::Matmul, fb.finish(&[y]).unwrap())
    }

    /// Random quantized weights: values in [−1, 1) with a few blocks of larger range,
    /// quantized as llama.cpp's reference quantizers do.
    fn random_q(q: DType, shape: &[usize], seed: u64) -> Tensor {
        let v = super::emu::random(DType::F32, shape, seed);
        let vals: Vec<f32> = v.data().iter().enumerate().map(|(i, &x)| if (i / 32) % 7 == 3 { (x * 40.0) as f32 } else { x as f32 }).collect();
        Tensor::quantize(q, shape, &vals).unwrap()
    }

    #[test]
    fn emulated_quantized() {
        use super::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
        for q in [DType::Q4_1, DType::Q8_0] {
            // M 1 / 3 / 16; N tails (a column group of 4 partly past N); K 32, 96, 4096.
            for (m, n, k, epi) in [(1usize, 70i64, 32i64, "none"), (3, 37, 96, "bias_silu"), (16, 9, 4096, "residual"), (1, 5, 4096, "none"), (2, 33, 160, "none")] {
                for dt in [DType::BF16, DType::F32] {
                    let (g, kk) = quant_proj(q, dt, d(m as i64), n, k, epi);
                    let plan = gen(&g, kk).unwrap();
                    // bf16/f16 with a direct epilogue and M > 1: the tensor-core kernel; f32 or
                    // one row: small-M.
                    let want = if dt == DType::F32 || m == 1 { "matmul_small_m_q" } else { "matmul_mma_q" };
                    assert!(plan.entry.ends_with(want), "{}", plan.entry);
                    // NaN and ±inf in the activations where some rows stay finite (M ≥ 3), and
                    // in the one row at M = 1, N = 70 (every output NaN: it propagates).
                    let x = random(dt, &[m, k as usize], 1);
                    let x = if m >= 3 || n == 70 { with_specials(x) } else { x };
                    let mut ins = vec![x, random_q(q, &[n as usize, k as usize], 2)];
                    match epi {
                        "bias_silu" => ins.push(random(dt, &[n as usize], 3)),
                        "residual" => ins.push(random(dt, &[m, n as usize], 4)),
                        _ => {}
                    }
                    check(&format!("{q} {dt} M={m} N={n} K={k} {epi}"), &g, kk, gen, &ins, &bind(&[]));
                    if dt != DType::F32 {
                        let small = |g: &KernelGraph, k: Kernel| generate_with(g, k, &Target::SM_80, &MatmulSchedule::SmallM(small_m_schedule(m as u32, true)));
                        check(&format!("{q} {dt} M={m} N={n} K={k} {epi} (small-M)"), &g, kk, small, &ins, &bind(&[]));
                        // Two tiles a warp, 64-column steps (a K tail when K is not a multiple).
                        let two = |g: &KernelGraph, k: Kernel| generate_with(g, k, &Target::SM_80, &MatmulSchedule::QuantMma(QuantMmaSchedule { warps: 2, tiles: 2, chunk: 64, prefetch: false }));
                        check(&format!("{q} {dt} M={m} N={n} K={k} {epi} (2 warps x 2 tiles, chunk 64)"), &g, kk, two, &ins, &bind(&[]));
                    }
                }
            }
        }
        // Every autotuning variant of a quantized projection (K = 160: a partial step for
        // every step length) computes what the interpreter does.
        for q in [DType::Q4_1, DType::Q8_0] {
            let (g, kn) = quant_proj(q, DType::BF16, d(3), 37, 160, "bias_silu");
            let ins = [random(DType::BF16, &[3, 160], 80), random_q(q, &[37, 160], 81), random(DType::BF16, &[37], 82)];
            let built = crate::schedule_variants(&g, kn, &Target::SM_80).unwrap();
            assert!(built.len() >= 5, "{:?}", built.iter().map(|v| v.name.clone()).collect::<Vec<_>>());
            assert_eq!(built[0].plan, generate(&g, kn, &Target::SM_80).unwrap(), "the first variant is the default");
            for v in &built {
                let name = v.name.clone();
                check(&format!("{q} variant `{name}`"), &g, kn, |g, k| crate::compile_variant(g, k, &Target::SM_80, &name), &ins, &bind(&[]));
            }
        }
        // f16 activations, a symbolic M bound to 1 and 5 (16 rows per CTA).
        let (g, kk) = quant_proj(DType::Q4_1, DType::F16, sym("T"), 40, 64, "none");
        for t in [1usize, 5] {
            let ins = [random(DType::F16, &[t, 64], 5), random_q(DType::Q4_1, &[40, 64], 6)];
            check(&format!("q4_1 f16 T={t}"), &g, kk, gen, &ins, &bind(&[("T", t as i64)]));
        }
    }

    #[test]
    fn quantized_ptxas_reports() {
        let cases: Vec<(&str, (KernelGraph, Kernel))> = vec![
            ("q4_1 bf16 M=1 K=4096 N=28672 (tensor cores)", quant_proj(DType::Q4_1, DType::BF16, d(1), 28672, 4096, "none")),
            ("q8_0 bf16 M=1 K=4096 N=28672 (tensor cores)", quant_proj(DType::Q8_0, DType::BF16, d(1), 28672, 4096, "none")),
            ("q4_1 bf16 M=16 K=4096 N=28672 (tensor cores)", quant_proj(DType::Q4_1, DType::BF16, d(16), 28672, 4096, "none")),
            ("q8_0 bf16 M=16 K=4096 N=28672 (tensor cores)", quant_proj(DType::Q8_0, DType::BF16, d(16), 28672, 4096, "none")),
            ("q4_1 bf16 M=1 K=4096 N=28672 (GEMV)", quant_proj(DType::Q4_1, DType::BF16, d(1), 28672, 4096, "none")),
            ("q8_0 bf16 M=1 K=4096 N=28672 (GEMV)", quant_proj(DType::Q8_0, DType::BF16, d(1), 28672, 4096, "none")),
            ("q4_1 bf16 M=16 K=4096 N=28672 (small M)", quant_proj(DType::Q4_1, DType::BF16, d(16), 28672, 4096, "none")),
            ("q8_0 bf16 M=16 K=4096 N=28672 (small M)", quant_proj(DType::Q8_0, DType::BF16, d(16), 28672, 4096, "none")),
            ("q4_1 f32 M=3 bias+silu", quant_proj(DType::Q4_1, DType::F32, d(3), 70, 96, "bias_silu")),
        ];
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in &cases {
                let plan = if what.contains("GEMV") || what.contains("small M") {
                    let rows = if what.contains("M=16") { 16 } else { 1 };
                    generate_with(g, *k, &t, &MatmulSchedule::SmallM(small_m_schedule(rows, true)))
                } else {
                    generate(g, *k, &t)
                };
                let plan = plan.unwrap_or_else(|e| panic!("{what}: {e}"));
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("matmul_quant_ptxas", text);
        // The kernels' PTX for sm_90a: block loads of the weights, mma, no local memory.
        let (g, k) = quant_proj(DType::Q4_1, DType::BF16, d(1), 28672, 4096, "none");
        let plan = generate_with(&g, k, &Target::SM_90A, &MatmulSchedule::SmallM(small_m_schedule(1, true))).unwrap();
        assert!(plan.ptx.contains("ld.global.nc.b32"), "no 4-byte block loads");
        assert!(!plan.ptx.contains(".local"), "local memory in the quantized GEMV");
        insta::assert_snapshot!("matmul_quant_q4_1_gemv_sm_90a_ptx", plan.ptx);
        let (g, k) = quant_proj(DType::Q4_1, DType::BF16, d(16), 28672, 4096, "none");
        let plan = generate(&g, k, &Target::SM_90A).unwrap();
        assert!(plan.ptx.contains("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"), "no mma");
        assert!(!plan.ptx.contains(".local"), "local memory in the quantized tensor-core kernel");
        insta::assert_snapshot!("matmul_quant_q4_1_mma_sm_90a_ptx", plan.ptx);
    }

    /// Small tensor-core schedules for the emulator: one warp and a 2-stage pipeline; four
    /// warps, a 3-stage pipeline and grouped CTA order.
    pub(crate) const MMA_ONE_WARP: MmaSchedule = MmaSchedule { bm: 32, bn: 32, bk: 32, warps_m: 1, warps_n: 1, stages: 2, group_m: 1 };
    pub(crate) const MMA_FOUR_WARPS: MmaSchedule = MmaSchedule { bm: 64, bn: 64, bk: 64, warps_m: 2, warps_n: 2, stages: 3, group_m: 2 };

    /// `gen` with tensor-core schedule `s` on sm_80.
    pub(crate) fn mma_gen(s: MmaSchedule) -> impl Fn(&KernelGraph, Kernel) -> Result<LaunchPlan, CodegenError> {
        move |g: &KernelGraph, k: Kernel| generate_with(g, k, &Target::SM_80, &MatmulSchedule::Mma(s))
    }

    /// `t` with NaN, +inf and −inf at a few places.
    fn with_specials(t: Tensor) -> Tensor {
        let mut v = t.data().to_vec();
        let n = v.len();
        for (i, x) in [(n / 3, f64::NAN), (n / 2, f64::INFINITY), (n - 1, f64::NEG_INFINITY)] {
            v[i] = x;
        }
        Tensor::new(t.dtype(), t.shape(), v).unwrap()
    }

    /// One matmul `a · b` (with `attrs`, e.g. `transpose_b`) of kernel inputs as a kernel.
    fn matmul_kernel(a: TensorType, b: TensorType, attrs: Vec<(&'static str, Attr)>) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "bmm");
        let (a, b) = (fb.param("a", a), fb.param("b", b));
        let mm = fb.op1(OpKind::Matmul, &[a, b], attrs).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap())
    }

    /// `silu(x · wᵀ + bias)` with `x [m, kbuf]`, `w [n, kbuf]` of `dt` read through a slice of
    /// their first `k` columns (a partial last chunk when `k < kbuf`): one matmul kernel.
    fn proj_silu(dt: DType, m: Dim, n: i64, k: i64, kbuf: i64) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
        let x = fb.param("x", ty(dt, &[m, d(kbuf)]));
        let w = fb.param("w", ty(dt, &[d(n), d(kbuf)]));
        let bias = fb.param("bias", ty(dt, &[d(n)]));
        let mut view = |x: Value| fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(k)))]).unwrap();
        let (xs, ws) = if k == kbuf { (x, w) } else { (view(x), view(w)) };
        let mm = fb.op1(OpKind::Matmul, &[xs, ws], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let y = fb.op1(OpKind::Add, &[mm, bias], vec![]).unwrap();
        let z = fb.op1(OpKind::Silu, &[y], vec![]).unwrap();
        single_kernel(Family::Matmul, fb.finish(&[z]).unwrap())
    }

    /// The tensor-core kernel with direct epilogues, emulated: tails in M, N and K (zero-filled
    /// `cp.async` chunks, partial ones included), both B layouts, a transposed A, batches with
    /// a broadcast operand, NaN and ±inf, bf16 and f16, an odd N (a last column alone).
    fn emulated_mma_direct() {
        use super::emu::{check, random};
        let view = |fb: &mut FunctionBuilder, x: Value, end: i64| fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(end)))]).unwrap();
        // x [T, K] · w [N, K]ᵀ + bias, silu; K read through a slice of a wider buffer (rows
        // of 24 or 136 elements) so that its tail is a partial chunk.
        for dt in [DType::BF16, DType::F16] {
            for (n, k, kbuf) in [(69i64, 40i64, 40i64), (33, 17, 24), (40, 1, 8), (16, 129, 136), (24, 0, 8)] {
                let (g, kn) = proj_silu(dt, sym("T"), n, k, kbuf);
                assert!(generate(&g, kn, &Target::SM_80).unwrap().entry.ends_with("_mma"), "{dt} N={n} K={k}: the default takes the tensor cores");
                let ts: &[usize] = if dt == DType::BF16 && n == 69 { &[1, 17, 129] } else { &[17] };
                for &t in ts {
                    let x_in = random(dt, &[t, kbuf as usize], 50);
                    let ins = [if t == 17 && n == 69 { with_specials(x_in) } else { x_in }, random(dt, &[n as usize, kbuf as usize], 51), random(dt, &[n as usize], 52)];
                    let b = bind(&[("T", t as i64)]);
                    for (what, s) in [("one warp", MMA_ONE_WARP), ("four warps", MMA_FOUR_WARPS)] {
                        check(&format!("{dt} proj T={t} N={n} K={k}, mma {what}"), &g, kn, mma_gen(s), &ins, &b);
                    }
                    if t == 129 {
                        check(&format!("{dt} proj T={t} N={n} K={k}, mma default"), &g, kn, mma_gen(MmaSchedule::DEFAULT), &ins, &b);
                    }
                }
            }
        }
        // B N-contiguous ([K, N], ldmatrix.trans) + a residual, N = 40 and N = 20 (a slice of
        // rows of 24: a partial chunk); A transposed ([K, M], M-contiguous).
        for (n, nbuf, ta) in [(40i64, 40i64, false), (20, 24, false), (40, 40, true)] {
            let mut fb = FunctionBuilder::new(&Graph::new(), "nc");
            let a = if ta { fb.param("a", ty(DType::BF16, &[d(48), d(40)])) } else { fb.param("a", ty(DType::BF16, &[d(40), d(48)])) };
            let b = fb.param("b", ty(DType::BF16, &[d(48), d(nbuf)]));
            let r = fb.param("r", ty(DType::BF16, &[d(40), d(n)]));
            let bs = if n == nbuf { b } else { view(&mut fb, b, n) };
            let mm = fb.op1(OpKind::Matmul, &[a, bs], vec![("transpose_a", Attr::Bool(ta))]).unwrap();
            let y = fb.op1(OpKind::Add, &[r, mm], vec![]).unwrap();
            let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[y]).unwrap());
            let spec = Spec::analyse(&g, kn).unwrap();
            let plan = spec.mma_plan(&MMA_FOUR_WARPS, &Target::SM_80).unwrap();
            assert!(!plan.b.k_contig && plan.a.k_contig != ta, "N={n} transpose_a={ta}: {plan:?}");
            let ashape = if ta { [48, 40] } else { [40, 48] };
            let ins = [with_specials(random(DType::BF16, &ashape, 53)), random(DType::BF16, &[48, nbuf as usize], 54), random(DType::BF16, &[40, n as usize], 55)];
            for (what, s) in [("one warp", MMA_ONE_WARP), ("four warps", MMA_FOUR_WARPS)] {
                check(&format!("bf16 [K, N] B, N={n}, transpose_a={ta}, mma {what}"), &g, kn, mma_gen(s), &ins, &bind(&[]));
            }
        }
        // Batched: a [T, 32] broadcast over b [3, 32, 24]; q [2, T, 32] · k [2, S, 32]ᵀ.
        let mut fb = FunctionBuilder::new(&Graph::new(), "bmm");
        let a = fb.param("a", ty(DType::BF16, &[sym("T"), d(32)]));
        let b = fb.param("b", ty(DType::BF16, &[d(3), d(32), d(24)]));
        let mm = fb.op1(OpKind::Matmul, &[a, b], vec![]).unwrap();
        let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
        let ins = [random(DType::BF16, &[37, 32], 56), random(DType::BF16, &[3, 32, 24], 57)];
        check("bf16 batched, A broadcast, mma one warp", &g, kn, mma_gen(MMA_ONE_WARP), &ins, &bind(&[("T", 37)]));
        let mut fb = FunctionBuilder::new(&Graph::new(), "scores");
        let q = fb.param("q", ty(DType::BF16, &[d(2), sym("T"), d(32)]));
        let kk = fb.param("k", ty(DType::BF16, &[d(2), sym("S"), d(32)]));
        let mm = fb.op1(OpKind::Matmul, &[q, kk], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
        let ins = [random(DType::BF16, &[2, 19, 32], 58), random(DType::BF16, &[2, 70, 32], 59)];
        check("bf16 batched scores, mma four warps", &g, kn, mma_gen(MMA_FOUR_WARPS), &ins, &bind(&[("T", 19), ("S", 70)]));
    }

    /// The flat tensor-core GEMM ([`MmaSchedule::flat`]: 16-row tiles for M ≤ 16), emulated
    /// against the interpreter with direct epilogues: constant M = 1, 3, 8, 16 (rows past M
    /// zero-filled, their stores masked) and a symbolic M over several row tiles, tails in N
    /// and K (K read through a slice of wider rows: partial and empty chunks; K past one
    /// 256-element stage), both B layouts, a batch with a broadcast A, NaN and ±inf, bf16
    /// and f16. The staged epilogues (RoPE + `kv_append`, paired SwiGLU) at a constant M are
    /// in `emulated_staged_epilogues`, and SmolLM2's layer bodies at M = 3 in
    /// `emulated_llama_bodies`.
    #[test]
    fn emulated_flat() {
        use super::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
        let view = |fb: &mut FunctionBuilder, x: Value, end: i64| fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(end)))]).unwrap();
        // x [M, K] · w [N, K]ᵀ + bias, silu.
        for dt in [DType::BF16, DType::F16] {
            for (n, k, kbuf) in [(200i64, 40i64, 40i64), (576, 64, 64), (33, 17, 24), (40, 1, 8), (24, 0, 8), (70, 300, 304)] {
                let ms: &[i64] = match (dt, n) {
                    (DType::BF16, 200) => &[1, 3, 8, 16],
                    (DType::BF16, 70) => &[16],
                    (DType::BF16, _) => &[5],
                    _ => &[3],
                };
                for &m in ms {
                    let mdim = if m == 16 && n == 200 { sym("T") } else { d(m) };
                    let (g, kn) = proj_silu(dt, mdim.clone(), n, k, kbuf);
                    let x_in = random(dt, &[m as usize, kbuf as usize], 60);
                    let ins = [if m == 8 { with_specials(x_in) } else { x_in }, random(dt, &[n as usize, kbuf as usize], 61), random(dt, &[n as usize], 62)];
                    if mdim.as_const().is_some() {
                        let entry = generate(&g, kn, &Target::SM_80).unwrap().entry;
                        assert_eq!(entry, if m == 1 { "k0_matmul_small_m" } else { "k0_matmul_mma" }, "{dt} M={m} N={n} K={k}");
                        check(&format!("{dt} proj M={m} N={n} K={k} ({entry})"), &g, kn, gen, &ins, &bind(&[]));
                    }
                    let b = bind(&[("T", m)]);
                    check(&format!("{dt} proj M={mdim} N={n} K={k}, flat"), &g, kn, mma_gen(MmaSchedule::FLAT), &ins, &b);
                    if n == 200 && m >= 8 {
                        check(&format!("{dt} proj M={mdim} N={n} K={k}, flat 64"), &g, kn, mma_gen(MmaSchedule::flat(64)), &ins, &b);
                    }
                }
            }
        }
        // A symbolic M of 37 rows: three 16-row tiles, the last one partial.
        let mut fb = FunctionBuilder::new(&Graph::new(), "proj");
        let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(48)]));
        let w = fb.param("w", ty(DType::BF16, &[d(50), d(48)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
        let ins = [random(DType::BF16, &[37, 48], 63), random(DType::BF16, &[50, 48], 64)];
        check("bf16 M=T=37 N=50 K=48, flat", &g, kn, mma_gen(MmaSchedule::FLAT), &ins, &bind(&[("T", 37)]));
        // B N-contiguous ([K, N], ldmatrix.trans) + a residual: N = 40, N = 20 (a slice of
        // rows of 24: a partial chunk), N = 192 (SmolLM2's K/V width); M = 5 and 16.
        for (n, nbuf) in [(40i64, 40i64), (20, 24), (192, 192)] {
            for m in [5i64, 16] {
                let mut fb = FunctionBuilder::new(&Graph::new(), "nc");
                let a = fb.param("a", ty(DType::BF16, &[d(m), d(48)]));
                let b = fb.param("b", ty(DType::BF16, &[d(48), d(nbuf)]));
                let r = fb.param("r", ty(DType::BF16, &[d(m), d(n)]));
                let bs = if n == nbuf { b } else { view(&mut fb, b, n) };
                let mm = fb.op1(OpKind::Matmul, &[a, bs], vec![]).unwrap();
                let y = fb.op1(OpKind::Add, &[r, mm], vec![]).unwrap();
                let (g, kn) = single_kernel(Family::Matmul, fb.finish(&[y]).unwrap());
                let spec = Spec::analyse(&g, kn).unwrap();
                let plan = spec.mma_plan(&MmaSchedule::FLAT, &Target::SM_80).unwrap();
                assert!(!plan.b.k_contig && plan.a.k_contig, "{plan:?}");
                assert_eq!(generate(&g, kn, &Target::SM_80).unwrap().entry, "k0_matmul_mma");
                let ins = [with_specials(random(DType::BF16, &[m as usize, 48], 65)), random(DType::BF16, &[48, nbuf as usize], 66), random(DType::BF16, &[m as usize, n as usize], 67)];
                check(&format!("bf16 [K, N] B, M={m} N={n}, flat"), &g, kn, gen, &ins, &bind(&[]));
            }
        }
        // A transposed A ([K, M]: 16-element slab rows the swizzle does not take) keeps the
        // small-M kernel.
        let (g, kn) = matmul_kernel(ty(DType::BF16, &[d(48), d(8)]), ty(DType::BF16, &[d(48), d(40)]), vec![("transpose_a", Attr::Bool(true))]);
        assert_eq!(generate(&g, kn, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
        let ins = [random(DType::BF16, &[48, 8], 68), random(DType::BF16, &[48, 40], 69)];
        check("bf16 transpose_a M=8 (small M)", &g, kn, gen, &ins, &bind(&[]));
        // Batched: a [3, 32] broadcast over b [3, 32, 24].
        let (g, kn) = matmul_kernel(ty(DType::BF16, &[d(3), d(32)]), ty(DType::BF16, &[d(3), d(32), d(24)]), vec![]);
        assert_eq!(generate(&g, kn, &Target::SM_80).unwrap().entry, "k0_matmul_mma");
        let ins = [random(DType::BF16, &[3, 32], 70), random(DType::BF16, &[3, 32, 24], 71)];
        check("bf16 batched, A broadcast, flat", &g, kn, gen, &ins, &bind(&[]));
    }

    /// The staged epilogues, emulated: QKV with RoPE (Columns) and gate/up SwiGLU (Paired),
    /// at tiny sizes with tails.
    #[test]
    fn emulated_staged_epilogues() {
        use super::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
        // QKV: x [T, 24] · w [(4+2+2)·16 = 128, 24]ᵀ; q, k roped with head dim 16.
        let mut fb = FunctionBuilder::new(&Graph::new(), "qkv");
        let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(24)]));
        let w = fb.param("w", ty(DType::BF16, &[d(128), d(24)]));
        let pos = fb.param("positions", ty(DType::I32, &[sym("T")]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let p2 = fb.op1(OpKind::Reshape, &[pos], vec![("shape", Attr::Dims(vec![sym("T"), d(1)]))]).unwrap();
        let sl = |fb: &mut FunctionBuilder, a: i64, b: i64| fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(a))), ("end", Attr::Dim(d(b)))]).unwrap();
        let q = sl(&mut fb, 0, 64);
        let q = fb.op1(OpKind::Reshape, &[q], vec![("shape", Attr::Dims(vec![sym("T"), d(4), d(16)]))]).unwrap();
        let q = fb.op1(OpKind::Rope, &[q, p2], vec![("theta", Attr::Float(10000.0))]).unwrap();
        let kk = sl(&mut fb, 64, 96);
        let kk = fb.op1(OpKind::Reshape, &[kk], vec![("shape", Attr::Dims(vec![sym("T"), d(2), d(16)]))]).unwrap();
        let kk = fb.op1(OpKind::Rope, &[kk, p2], vec![("theta", Attr::Float(10000.0)), ("form", Attr::Str("interleaved".into()))]).unwrap();
        let v = sl(&mut fb, 96, 128);
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[q, kk, v]).unwrap());
        assert!(generate(&g, k, &Target::SM_80).unwrap().entry.ends_with("_mma"));
        for t in [1usize, 5, 70] {
            let posv = Tensor::new(DType::I32, &[t], (0..t).map(|i| (i * 3 + 1) as f64).collect()).unwrap();
            let ins = [random(DType::BF16, &[t, 24], 11), random(DType::BF16, &[128, 24], 12), posv];
            check(&format!("bf16 qkv+rope T={t}"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
            if t > 1 {
                for (what, s) in [("one warp", MMA_ONE_WARP), ("four warps", MMA_FOUR_WARPS), ("flat", MmaSchedule::FLAT), ("flat 64", MmaSchedule::flat(64))] {
                    check(&format!("bf16 qkv+rope T={t}, mma {what}"), &g, k, mma_gen(s), &ins, &bind(&[("T", t as i64)]));
                }
            }
        }
        // The same QKV in f32 (also emulated from optimised IR under SINTER_EMU_O3).
        let (g32, k32) = {
            let kd = &g.kernels[k];
            let mut body = kd.body.clone();
            for (_, vd) in body.values.iter_mut() {
                if vd.ty.dtype == DType::BF16 {
                    vd.ty.dtype = DType::F32;
                }
            }
            single_kernel(Family::Matmul, body)
        };
        let posv = Tensor::new(DType::I32, &[9], (0..9).map(|i| (i * 5) as f64).collect()).unwrap();
        let ins = [random(DType::F32, &[9, 24], 18), random(DType::F32, &[128, 24], 19), posv];
        check("f32 qkv+rope T=9", &g32, k32, gen, &ins, &bind(&[("T", 9)]));
        // QKV with RoPE whose K and V also go into a paged cache (kv_append in the epilogue),
        // in the prefill form (one sequence, new rows [1, T, 2, 16], start_pos [1]) and the
        // decode form (T sequences of one token, rows [T, 1, 2, 16], start_pos [T]); pages
        // [4, 4, 2, 16], a block table of 3 pages per sequence.
        // Built with a symbolic T (the tiled kernel with staged tiles) and with T a constant
        // (a batch-specialised step: the small-M kernel, each group computing its column and
        // the RoPE partner), with both RoPE forms.
        let qkv_append = |tdim: Dim, decode: bool, form: &str| {
            let nb = if decode { tdim.clone() } else { d(1) };
            let mut fb = FunctionBuilder::new(&Graph::new(), "qkv_append");
            let x = fb.param("x", ty(DType::BF16, &[tdim.clone(), d(24)]));
            let w = fb.param("w", ty(DType::BF16, &[d(128), d(24)]));
            let pos = fb.param("positions", ty(DType::I32, std::slice::from_ref(&tdim)));
            let kp = fb.param("k_pages", ty(DType::BF16, &[d(4), d(4), d(2), d(16)]));
            let vp = fb.param("v_pages", ty(DType::BF16, &[d(4), d(4), d(2), d(16)]));
            let bt = fb.param("block_table", ty(DType::I32, &[nb.clone(), d(3)]));
            let sp = fb.param("start_pos", ty(DType::I32, std::slice::from_ref(&nb)));
            let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
            let p2 = fb.op1(OpKind::Reshape, &[pos], vec![("shape", Attr::Dims(vec![tdim.clone(), d(1)]))]).unwrap();
            let sl = |fb: &mut FunctionBuilder, a: i64, b: i64| fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(a))), ("end", Attr::Dim(d(b)))]).unwrap();
            let rs = |fb: &mut FunctionBuilder, x: Value, dims: Vec<Dim>| fb.op1(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(dims))]).unwrap();
            let rope_attrs = || vec![("theta", Attr::Float(10000.0)), ("form", Attr::Str(form.to_string()))];
            let q = sl(&mut fb, 0, 64);
            let q = rs(&mut fb, q, vec![tdim.clone(), d(4), d(16)]);
            let q = fb.op1(OpKind::Rope, &[q, p2], rope_attrs()).unwrap();
            let kk = sl(&mut fb, 64, 96);
            let kk = rs(&mut fb, kk, vec![tdim.clone(), d(2), d(16)]);
            let kk = fb.op1(OpKind::Rope, &[kk, p2], rope_attrs()).unwrap();
            let v = sl(&mut fb, 96, 128);
            let rows = |t: Dim| if decode { vec![t, d(1), d(2), d(16)] } else { vec![d(1), t, d(2), d(16)] };
            let k4 = rs(&mut fb, kk, rows(tdim.clone()));
            let v4 = rs(&mut fb, v, rows(tdim.clone()));
            let res = fb.op(OpKind::KvAppend, &[kp, vp, k4, v4, bt, sp], vec![]).unwrap();
            single_kernel(Family::Matmul, fb.finish(&[q, kk, res[0], res[1]]).unwrap())
        };
        for decode in [false, true] {
            for form in ["rotate_half", "interleaved"] {
                for t in [1usize, 5, 11] {
                    let posv = Tensor::new(DType::I32, &[t], (0..t).map(|i| (i * 3 + 1) as f64).collect()).unwrap();
                    let nseq = if decode { t } else { 1 };
                    let table = Tensor::new(DType::I32, &[nseq, 3], (0..nseq * 3).map(|i| [2.0, 0.0, 3.0][i % 3]).collect()).unwrap();
                    // Prefill: slots 1..=t; decode: sequence b at slot (b·5) mod 12.
                    let starts = Tensor::new(DType::I32, &[nseq], (0..nseq).map(|b| if decode { ((b * 5) % 12) as f64 } else { 1.0 }).collect()).unwrap();
                    let ins = [
                        random(DType::BF16, &[t, 24], 21),
                        random(DType::BF16, &[128, 24], 22),
                        posv,
                        random(DType::BF16, &[4, 4, 2, 16], 23),
                        random(DType::BF16, &[4, 4, 2, 16], 24),
                        table,
                        starts,
                    ];
                    for constant in [false, true] {
                        let (g, k) = qkv_append(if constant { d(t as i64) } else { sym("T") }, decode, form);
                        let entry = generate(&g, k, &Target::SM_80).unwrap().entry;
                        assert_eq!(entry.ends_with("small_m"), constant && t == 1, "{entry}");
                        check(&format!("bf16 qkv+rope({form})+kv_append decode={decode} T={t} ({entry})"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
                        if constant && t == 1 {
                            // The flat GEMM given explicitly at M = 1 (the default is the GEMV).
                            check(&format!("bf16 qkv+rope({form})+kv_append decode={decode} T=1, flat"), &g, k, mma_gen(MmaSchedule::FLAT), &ins, &bind(&[]));
                        }
                    }
                }
            }
        }
        // gate/up: x [T, 24] · w [2·40, 24]ᵀ, swiglu over the halves (40 = one 32-column
        // tile and a tail).
        let mut fb = FunctionBuilder::new(&Graph::new(), "mlp");
        let x = fb.param("x", ty(DType::F32, &[sym("T"), d(24)]));
        let w = fb.param("w", ty(DType::F32, &[d(80), d(24)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let g0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(40)))]).unwrap();
        let u0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(40))), ("end", Attr::Dim(d(80)))]).unwrap();
        let o = fb.op1(OpKind::Swiglu, &[g0, u0], vec![]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
        for t in [1usize, 17] {
            let ins = [random(DType::F32, &[t, 24], 13), random(DType::F32, &[80, 24], 14)];
            check(&format!("f32 gate/up swiglu T={t}"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
        }
        // The same in bf16 on the tensor cores, B as [N, K] (transpose_b) and as [K, N]
        // (ldmatrix.trans; the segments' chunks gathered at columns 0 and 40).
        for b_kn in [false, true] {
            let mut fb = FunctionBuilder::new(&Graph::new(), "mlp");
            let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(24)]));
            let wdims = if b_kn { [d(24), d(80)] } else { [d(80), d(24)] };
            let w = fb.param("w", ty(DType::BF16, &wdims));
            let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(!b_kn))]).unwrap();
            let g0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(40)))]).unwrap();
            let u0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(40))), ("end", Attr::Dim(d(80)))]).unwrap();
            let o = fb.op1(OpKind::Swiglu, &[g0, u0], vec![]).unwrap();
            let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
            assert!(generate(&g, k, &Target::SM_80).unwrap().entry.ends_with("_mma"));
            let wshape: &[usize] = if b_kn { &[24, 80] } else { &[80, 24] };
            for t in [1usize, 17] {
                let ins = [random(DType::BF16, &[t, 24], 13), random(DType::BF16, wshape, 14)];
                let b = bind(&[("T", t as i64)]);
                check(&format!("bf16 gate/up swiglu T={t} [K, N] B={b_kn}, mma default"), &g, k, gen, &ins, &b);
                for (what, s) in [("one warp", MMA_ONE_WARP), ("four warps", MMA_FOUR_WARPS)] {
                    check(&format!("bf16 gate/up swiglu T={t} [K, N] B={b_kn}, mma {what}"), &g, k, mma_gen(s), &ins, &b);
                }
            }
        }
        // The same at constant M (a batch-specialised decode step): the small-M kernel at M = 1
        // (K a multiple of 8 for its 16-byte vectors in bf16), the flat tensor-core GEMM above
        // (16 columns of each half per CTA: 37 = two sub-tiles and a tail), both B layouts
        // (for [K, N] the halves start at 0 and 40: multiples of 8 for the gathered chunks).
        for b_kn in [false, true] {
            for m in [1i64, 3, 16] {
                let (half, wdims): (i64, [i64; 2]) = if b_kn { (40, [64, 80]) } else { (37, [74, 64]) };
                let mut fb = FunctionBuilder::new(&Graph::new(), "mlp_m");
                let x = fb.param("x", ty(DType::BF16, &[d(m), d(64)]));
                let w = fb.param("w", ty(DType::BF16, &[d(wdims[0]), d(wdims[1])]));
                let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(!b_kn))]).unwrap();
                let g0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(half)))]).unwrap();
                let u0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(half))), ("end", Attr::Dim(d(2 * half)))]).unwrap();
                let o = fb.op1(OpKind::Swiglu, &[g0, u0], vec![]).unwrap();
                let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
                let entry = generate(&g, k, &Target::SM_80).unwrap().entry;
                assert_eq!(entry, if m == 1 { "k0_matmul_small_m" } else { "k0_matmul_mma" }, "M={m}");
                let ins = [random(DType::BF16, &[m as usize, 64], 25), random(DType::BF16, &[wdims[0] as usize, wdims[1] as usize], 26)];
                check(&format!("bf16 gate/up swiglu M={m} [K, N] B={b_kn} ({entry})"), &g, k, gen, &ins, &bind(&[]));
                if m == 1 {
                    check(&format!("bf16 gate/up swiglu M={m} [K, N] B={b_kn}, flat"), &g, k, mma_gen(MmaSchedule::FLAT), &ins, &bind(&[]));
                }
            }
        }
        // GPT-2's QKV: a bias added before the column slices.
        let mut fb = FunctionBuilder::new(&Graph::new(), "qkv_bias");
        let x = fb.param("x", ty(DType::F32, &[sym("T"), d(8)]));
        let w = fb.param("w", ty(DType::F32, &[d(96), d(8)]));
        let b = fb.param("b", ty(DType::F32, &[d(96)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let y = fb.op1(OpKind::Add, &[mm, b], vec![]).unwrap();
        let outs: Vec<Value> = (0..3).map(|i| fb.op1(OpKind::Slice, &[y], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(32 * i))), ("end", Attr::Dim(d(32 * i + 32)))]).unwrap()).collect();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&outs).unwrap());
        let ins = [random(DType::F32, &[9, 8], 15), random(DType::F32, &[96, 8], 16), random(DType::F32, &[96], 17)];
        check("f32 qkv with bias", &g, k, gen, &ins, &bind(&[("T", 9)]));
    }

    /// The Llama layer bodies at SmolLM2's sizes, emulated for a decode step (M = 1) or a
    /// short prefill (M = 3) (the emulator's barriers make large grids slow).
    #[test]
    /// Every schedule variant autotuning may pick computes what the interpreter does: the flat
    /// tiles of a decode projection (M = 5, bias + silu), the CTA tiles of a symbolic-M
    /// projection (37 rows).
    fn emulated_variants() {
        use super::emu::{check, random};
        for (m, sym_m) in [(5i64, false), (37, true)] {
            let mdim = if sym_m { sym("T") } else { d(m) };
            let (g, kn) = proj_silu(DType::BF16, mdim, 200, 64, 64);
            let ins = [random(DType::BF16, &[m as usize, 64], 70), random(DType::BF16, &[200, 64], 71), random(DType::BF16, &[200], 72)];
            let names = crate::schedule_names(&g, kn, &Target::SM_80).unwrap();
            let built = crate::schedule_variants(&g, kn, &Target::SM_80).unwrap();
            assert!(built.len() >= 2, "M={m}: {names:?}");
            assert_eq!(built[0].plan, generate(&g, kn, &Target::SM_80).unwrap(), "M={m}: the first variant is the default");
            for v in &built {
                let name = v.name.clone();
                check(&format!("variant `{name}` M={m}"), &g, kn, |g, k| crate::compile_variant(g, k, &Target::SM_80, &name), &ins, &bind(&[("T", m)]));
            }
        }
    }

    #[test]
    fn emulated_llama_bodies() {
        use super::emu::{check, random};
        // sm_90 (not sm_90a): the `mma.sync` kernels the emulator runs; sm_90a takes `wgmma`
        // for these, which only the GPU runs (`tests/gpu.rs`).
        let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_90);
        for m in [1usize, 3] {
            let md = d(m as i64);
            if m == 3 {
                let posv = Tensor::new(DType::I32, &[m], (0..m).map(|i| (i + 100) as f64).collect()).unwrap();
                let (g, k) = qkv_rope(md.clone(), DType::BF16);
                let ins = [random(DType::BF16, &[m, 576], 30), random(DType::BF16, &[960, 576], 31), posv];
                check(&format!("SmolLM2 qkv+rope M={m}"), &g, k, gen, &ins, &bind(&[]));
            } else {
                let (g, k) = gate_up(md.clone(), DType::BF16);
                let ins = [random(DType::BF16, &[m, 576], 32), random(DType::BF16, &[3072, 576], 33)];
                check(&format!("SmolLM2 gate/up M={m}"), &g, k, gen, &ins, &bind(&[]));
            }
            let (g, k) = o_proj_view(md);
            let ins = [random(DType::BF16, &[1, m, 9, 64], 34), random(DType::BF16, &[576, 576], 35), random(DType::BF16, &[m, 576], 36)];
            check(&format!("SmolLM2 o_proj M={m}"), &g, k, gen, &ins, &bind(&[]));
        }
        // A short prefill (M = T symbolic): the tensor-core kernel at its default schedules
        // (256-column tiles for QKV's 960 columns and gate/up's 3072, 128 for o_proj's 576).
        let t = 5usize;
        let b = bind(&[("T", t as i64)]);
        let posv = Tensor::new(DType::I32, &[t], (0..t).map(|i| (i + 100) as f64).collect()).unwrap();
        for (what, (g, k), ins) in [
            ("qkv+rope", qkv_rope(sym("T"), DType::BF16), vec![random(DType::BF16, &[t, 576], 37), random(DType::BF16, &[960, 576], 38), posv]),
            ("gate/up", gate_up(sym("T"), DType::BF16), vec![random(DType::BF16, &[t, 576], 39), random(DType::BF16, &[3072, 576], 40)]),
            ("o_proj", o_proj_view(sym("T")), vec![random(DType::BF16, &[1, t, 9, 64], 41), random(DType::BF16, &[576, 576], 42), random(DType::BF16, &[t, 576], 43)]),
        ] {
            let entry = generate(&g, k, &Target::SM_90).unwrap().entry;
            assert!(entry.ends_with("_mma"), "{what}: {entry}");
            check(&format!("SmolLM2 {what} M=T={t} ({entry})"), &g, k, gen, &ins, &b);
        }
    }

    /// Epilogues use the shared element evaluator: gelu, a broadcast bias of another dtype
    /// through a cast, select on a comparison.
    #[test]
    fn rich_epilogue_assembles() {
        let mut fb = FunctionBuilder::new(&Graph::new(), "k");
        let x = fb.param("x", ty(DType::BF16, &[sym("T"), d(64)]));
        let w = fb.param("w", ty(DType::BF16, &[d(100), d(64)]));
        let b = fb.param("b", ty(DType::F32, &[d(1), d(100)]));
        let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
        let m32 = fb.op1(OpKind::Cast, &[mm], vec![("dtype", Attr::DType(DType::F32))]).unwrap();
        let y = fb.op1(OpKind::Add, &[m32, b], vec![]).unwrap();
        let g = fb.op1(OpKind::Gelu, &[y], vec![("form", Attr::Str("tanh".into()))]).unwrap();
        let zero = fb.op1(OpKind::Constant, &[], vec![("value", Attr::Float(0.0)), ("dtype", Attr::DType(DType::F32))]).unwrap();
        let pos = fb.op1(OpKind::Gt, &[y, zero], vec![]).unwrap();
        let o = fb.op1(OpKind::Select, &[pos, g, y], vec![]).unwrap();
        let o = fb.op1(OpKind::Cast, &[o], vec![("dtype", Attr::DType(DType::BF16))]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
        for t in [Target::SM_80, Target::SM_90A] {
            for s in [MatmulSchedule::Tiled(TiledSchedule::DEFAULT), MatmulSchedule::SmallM(SmallMSchedule { rows: 2, lanes: 32, columns: 4 }), MatmulSchedule::Mma(MmaSchedule::DEFAULT), MatmulSchedule::Mma(MmaSchedule::NARROW)] {
                let plan = generate_with(&g, k, &t, &s).unwrap();
                assemble(&plan);
            }
        }
    }
}


/// A CPU emulator for the tests: runs a kernel's LLVM IR (as built, before the NVPTX back
/// end; [`kit::EMIT_IR`]) on the host and compares it with the interpreter.
///
/// The IR is rewritten for the host — address spaces dropped, the PTX calling convention
/// dropped, NVVM intrinsics (special registers, `bar.sync`, `bar.warp.sync`,
/// `shfl.sync.bfly`, `ex2.approx`) and bf16 conversions turned into calls of the functions
/// below — and compiled with MCJIT. CTAs run one after another (the kernel's shared memory is
/// one global); the threads of a CTA run as OS threads, with `std::sync::Barrier`s for the
/// CTA barrier and for each warp (shuffles exchange values through per-warp slots). A kernel
/// with a thread-block cluster (`"nvvm.cluster_dim"`) runs a cluster at a time: the module is
/// compiled once per CTA of the cluster, so each CTA has its own shared memory, all their
/// threads run at once, `mapa.shared::cluster` maps an address into another CTA's copy,
/// `barrier.cluster.wait` is a barrier of every thread of the cluster (an arrive is a no-op,
/// which is stricter, never looser), and `%cluster_ctarank` is the CTA's rank. This
/// checks the generators' index arithmetic, masking, tiling and synchronisation structure on
/// edge cases; it does not check the NVPTX back end or ptxas (ptxas assembles every kernel
/// in the other tests) nor the device's `ex2.approx` (the host's `exp2` stands in).
#[cfg(test)]
pub(crate) mod emu {
    use std::cell::RefCell;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::{Arc, Barrier};

    use inkwell::context::Context;
    use inkwell::memory_buffer::MemoryBuffer;
    use inkwell::targets::{InitializationConfig, Target as LlvmTarget};
    use inkwell::OptimizationLevel;
    use sinter_ir::interp::{self, Tensor};
    use sinter_ir::{Bindings, DType, Graph, Kernel, KernelGraph, KernelParam, LaunchPlan};

    use super::kit::EMIT_IR;
    use crate::CodegenError;

    struct Warp {
        barrier: Barrier,
        slots: [AtomicU32; 32],
        /// Two buffers of [`XCHG`] words per lane for the warp-collective tensor-core
        /// instructions (`ldmatrix`, `mma`), used alternately: a lane writes its part into
        /// buffer `n mod 2` of its `n`-th collective, waits on the warp barrier, then reads
        /// the others'. A lane can only write that buffer again two collectives later, after
        /// every lane has passed the barrier of the collective in between, so one barrier per
        /// collective suffices.
        xchg: [Vec<AtomicU32>; 2],
    }

    /// Words per lane in a warp's exchange buffers: an `mma`'s A (4), B (2) and C (4).
    const XCHG: usize = 10;

    struct Cta {
        barrier: Barrier,
        warps: Vec<Warp>,
    }

    /// The CTAs of a thread-block cluster running together.
    struct Cluster {
        /// Every thread of the cluster (`barrier.cluster.wait`, and between clusters).
        barrier: Barrier,
        /// Per rank: the address ranges `(start, bytes)` of that CTA's shared-memory globals,
        /// in one order for every rank.
        shared: Vec<Vec<(usize, usize)>>,
    }

    struct ThreadCtx {
        tid: u32,
        ntid: u32,
        ctaid: [u32; 3],
        nctaid: [u32; 3],
        cta: Arc<Cta>,
        /// The CTA's rank in its cluster.
        rank: u32,
        cluster: Arc<Cluster>,
    }

    /// One 16-byte `cp.async` copy: destination and source addresses and the bytes read.
    #[derive(Clone, Copy)]
    struct AsyncCopy {
        dst: usize,
        src: usize,
        bytes: u32,
    }

    /// A thread's `cp.async` state: committed groups not yet waited for (oldest first) and
    /// the copies issued since the last commit.
    #[derive(Default)]
    struct AsyncState {
        committed: std::collections::VecDeque<Vec<AsyncCopy>>,
        open: Vec<AsyncCopy>,
    }

    thread_local! {
        static CTX: RefCell<Option<ThreadCtx>> = const { RefCell::new(None) };
        /// The collectives this thread has executed (its exchange-buffer parity).
        static COLLECTIVES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
        /// The registers the last `ldmatrix` or `mma` returned (read by `emu_frag_*`).
        static FRAG: std::cell::Cell<[u32; 4]> = const { std::cell::Cell::new([0; 4]) };
        static ASYNC: RefCell<AsyncState> = RefCell::new(AsyncState::default());
    }

    fn with<T>(f: impl FnOnce(&ThreadCtx) -> T) -> T {
        CTX.with(|c| f(c.borrow().as_ref().expect("an emulated thread")))
    }

    extern "C" fn emu_tid_x() -> i32 {
        with(|c| c.tid as i32)
    }
    extern "C" fn emu_ntid_x() -> i32 {
        with(|c| c.ntid as i32)
    }
    extern "C" fn emu_ctaid_x() -> i32 {
        with(|c| c.ctaid[0] as i32)
    }
    extern "C" fn emu_ctaid_y() -> i32 {
        with(|c| c.ctaid[1] as i32)
    }
    extern "C" fn emu_ctaid_z() -> i32 {
        with(|c| c.ctaid[2] as i32)
    }
    extern "C" fn emu_nctaid_x() -> i32 {
        with(|c| c.nctaid[0] as i32)
    }
    extern "C" fn emu_nctaid_y() -> i32 {
        with(|c| c.nctaid[1] as i32)
    }
    extern "C" fn emu_nctaid_z() -> i32 {
        with(|c| c.nctaid[2] as i32)
    }
    extern "C" fn emu_barrier(_: i32) {
        let cta = with(|c| c.cta.clone());
        cta.barrier.wait();
    }
    extern "C" fn emu_warp_sync(_: i32) {
        let (cta, w) = with(|c| (c.cta.clone(), c.tid / 32));
        cta.warps[w as usize].barrier.wait();
    }
    extern "C" fn emu_shfl(_: i32, v: f32, lane_mask: i32, _: i32) -> f32 {
        let (cta, tid) = with(|c| (c.cta.clone(), c.tid));
        let warp = &cta.warps[(tid / 32) as usize];
        let lane = (tid % 32) as usize;
        warp.slots[lane].store(v.to_bits(), Ordering::SeqCst);
        warp.barrier.wait();
        let r = f32::from_bits(warp.slots[lane ^ (lane_mask as usize & 31)].load(Ordering::SeqCst));
        warp.barrier.wait();
        r
    }
    /// `vote.sync.any.pred`: the `i1` arrives in bit 0 of a byte (the rest undefined).
    extern "C" fn emu_vote_any(_: i32, p: u8) -> u8 {
        let (cta, tid) = with(|c| (c.cta.clone(), c.tid));
        let warp = &cta.warps[(tid / 32) as usize];
        warp.slots[(tid % 32) as usize].store(u32::from(p & 1), Ordering::SeqCst);
        warp.barrier.wait();
        let any = warp.slots.iter().any(|s| s.load(Ordering::SeqCst) != 0);
        warp.barrier.wait();
        u8::from(any)
    }
    extern "C" fn emu_cluster_ctarank() -> i32 {
        with(|c| c.rank as i32)
    }
    extern "C" fn emu_cluster_arrive() {}
    extern "C" fn emu_cluster_wait() {
        let cluster = with(|c| c.cluster.clone());
        cluster.barrier.wait();
    }
    /// `mapa.shared::cluster`: `p` (in this CTA's shared memory) moved to CTA `rank`'s copy.
    extern "C" fn emu_mapa(p: usize, rank: i32) -> usize {
        with(|c| {
            let own = &c.cluster.shared[c.rank as usize];
            let i = own.iter().position(|&(start, bytes)| (start..start + bytes).contains(&p)).expect("mapa of an address outside shared memory");
            c.cluster.shared[rank as usize][i].0 + (p - own[i].0)
        })
    }
    /// `vote.sync.ballot.b32`: the `i1` arrives in bit 0 of a byte (the rest undefined).
    extern "C" fn emu_vote_ballot(_: i32, p: u8) -> i32 {
        let (cta, tid) = with(|c| (c.cta.clone(), c.tid));
        let warp = &cta.warps[(tid / 32) as usize];
        warp.slots[(tid % 32) as usize].store(u32::from(p & 1), Ordering::SeqCst);
        warp.barrier.wait();
        let bits = warp.slots.iter().enumerate().fold(0u32, |m, (l, s)| m | (s.load(Ordering::SeqCst) << l));
        warp.barrier.wait();
        bits as i32
    }
    extern "C" fn emu_ex2(x: f32) -> f32 {
        x.exp2()
    }
    extern "C" fn emu_div_approx(a: f32, b: f32) -> f32 {
        a / b
    }
    extern "C" fn emu_f2bf(x: f32) -> u16 {
        f32_to_bf16(x)
    }
    extern "C" fn emu_bf2f(b: u16) -> f32 {
        f32::from_bits(u32::from(b) << 16)
    }
    extern "C" fn emu_f2h(x: f32) -> u16 {
        half::f16::from_f32(x).to_bits()
    }
    extern "C" fn emu_h2f(b: u16) -> f32 {
        half::f16::from_bits(b).to_f32()
    }

    /// `cp.async` (16 bytes, `bytes` of them read): queued in the thread's open group and
    /// performed when a `cp.async.wait_group` needs its group — so a kernel that reads a
    /// stage before waiting for it reads stale data here as it may on the device.
    extern "C" fn emu_cp_async(dst: *mut u8, src: *const u8, bytes: i32) {
        assert_eq!(dst as usize % 16, 0, "cp.async: destination {dst:?} not 16-byte aligned");
        assert!((0..=16).contains(&bytes), "cp.async: src-size {bytes}");
        if bytes > 0 {
            assert_eq!(src as usize % 16, 0, "cp.async: source {src:?} not 16-byte aligned");
        }
        ASYNC.with(|a| a.borrow_mut().open.push(AsyncCopy { dst: dst as usize, src: src as usize, bytes: bytes as u32 }));
    }
    extern "C" fn emu_cp_commit() {
        ASYNC.with(|a| {
            let mut a = a.borrow_mut();
            let group = std::mem::take(&mut a.open);
            a.committed.push_back(group);
        });
    }
    extern "C" fn emu_cp_wait(n: i32) {
        ASYNC.with(|a| {
            let mut a = a.borrow_mut();
            while a.committed.len() > n.max(0) as usize {
                for c in a.committed.pop_front().unwrap_or_default() {
                    // SAFETY: the kernel's addresses: a shared-memory chunk and `bytes`
                    // bytes of an input buffer (what the emulated kernel is tested on).
                    unsafe {
                        std::ptr::copy_nonoverlapping(c.src as *const u8, c.dst as *mut u8, c.bytes as usize);
                        std::ptr::write_bytes((c.dst + c.bytes as usize) as *mut u8, 0, 16 - c.bytes as usize);
                    }
                }
            }
        });
    }

    /// Runs a warp collective: writes this lane's `mine` words into the warp's exchange
    /// buffer, waits for the warp, and returns `f(lane, buffer)`.
    fn collective<T>(mine: &[u32], f: impl FnOnce(usize, &[AtomicU32]) -> T) -> T {
        let (cta, tid) = with(|c| (c.cta.clone(), c.tid));
        let warp = &cta.warps[(tid / 32) as usize];
        let lane = (tid % 32) as usize;
        let n = COLLECTIVES.with(|c| {
            let n = c.get();
            c.set(n + 1);
            n
        });
        let buf = &warp.xchg[n % 2];
        for (i, w) in mine.iter().enumerate() {
            buf[lane * XCHG + i].store(*w, Ordering::SeqCst);
        }
        warp.barrier.wait();
        f(lane, buf)
    }

    /// `ldmatrix.sync.aligned.m8n8.x{count}{.trans}.b16`: lane `8j + r` supplies the address
    /// of row `r` of matrix `j`; lane `l` receives, of each matrix, elements (l/4, 2(l%4)) and
    /// (l/4, 2(l%4)+1) — with `trans` (2(l%4), l/4) and (2(l%4)+1, l/4) — low half first.
    extern "C" fn emu_ldmatrix(p: *const u8, count: i32, trans: i32) {
        let a = p as usize as u64;
        let regs = collective(&[a as u32, (a >> 32) as u32], |lane, buf| {
            let row = |i: usize| -> usize {
                let v = u64::from(buf[i * XCHG].load(Ordering::SeqCst)) | (u64::from(buf[i * XCHG + 1].load(Ordering::SeqCst)) << 32);
                assert_eq!(v % 16, 0, "ldmatrix: row address {v:#x} of lane {i} not 16-byte aligned");
                v as usize
            };
            // SAFETY: shared-memory rows the kernel addresses (16 bytes each).
            let rd16 = |at: usize| unsafe { std::ptr::read_unaligned(at as *const u16) };
            let mut regs = [0u32; 4];
            for (j, reg) in regs.iter_mut().enumerate().take(count as usize) {
                let (lo, hi) = if trans == 0 {
                    let r = row(8 * j + lane / 4) + 4 * (lane % 4);
                    (rd16(r), rd16(r + 2))
                } else {
                    let c = 2 * (lane / 4);
                    (rd16(row(8 * j + 2 * (lane % 4)) + c), rd16(row(8 * j + 2 * (lane % 4) + 1) + c))
                };
                *reg = u32::from(lo) | (u32::from(hi) << 16);
            }
            regs
        });
        FRAG.with(|f| f.set(regs));
    }

    /// `mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32` (`kind` 0: bf16, 1:
    /// f16): gathers the warp's fragments (layouts as `KernelBuilder::mma_m16n8k16` documents
    /// them), computes this lane's part of D = A·B + C exactly (in f64) and rounds it to f32.
    #[allow(clippy::too_many_arguments)]
    extern "C" fn emu_mma(kind: i32, a0: u32, a1: u32, a2: u32, a3: u32, b0: u32, b1: u32, c0: f32, c1: f32, c2: f32, c3: f32) {
        let mine = [a0, a1, a2, a3, b0, b1, c0.to_bits(), c1.to_bits(), c2.to_bits(), c3.to_bits()];
        let d = collective(&mine, |lane, buf| {
            let word = |l: usize, i: usize| buf[l * XCHG + i].load(Ordering::SeqCst);
            let elem = |w: u32, half: usize| -> f64 {
                let bits = (w >> (16 * half)) as u16;
                f64::from(if kind == 0 { emu_bf2f(bits) } else { emu_h2f(bits) })
            };
            // A(row, k): lane 4·(row mod 8) + (k mod 8)/2, register (row ≥ 8) + 2·(k ≥ 8).
            let a = |row: usize, k: usize| elem(word(4 * (row % 8) + (k % 8) / 2, usize::from(row >= 8) + 2 * usize::from(k >= 8)), k % 2);
            // B(k, col): lane 4·col + (k mod 8)/2, register 4 + (k ≥ 8).
            let b = |k: usize, col: usize| elem(word(4 * col + (k % 8) / 2, 4 + usize::from(k >= 8)), k % 2);
            let (g, t) = (lane / 4, lane % 4);
            let mut d = [0u32; 4];
            for (q, out) in d.iter_mut().enumerate() {
                let (row, col) = (g + 8 * (q / 2), 2 * t + q % 2);
                let mut sum = f64::from(f32::from_bits(word(lane, 6 + q)));
                for k in 0..16 {
                    sum += a(row, k) * b(k, col);
                }
                *out = (sum as f32).to_bits();
            }
            d
        });
        FRAG.with(|f| f.set(d));
    }
    extern "C" fn emu_frag_i(i: i32) -> u32 {
        FRAG.with(|f| f.get()[i as usize])
    }
    extern "C" fn emu_frag_f(i: i32) -> f32 {
        f32::from_bits(FRAG.with(|f| f.get()[i as usize]))
    }

    /// f32 → bf16 bits, round to nearest even (NaN stays NaN).
    fn f32_to_bf16(x: f32) -> u16 {
        if x.is_nan() {
            return 0x7fc0;
        }
        let b = x.to_bits();
        let round = 0x7fff + ((b >> 16) & 1);
        (b.wrapping_add(round) >> 16) as u16
    }

    /// An `ldmatrix` or `mma` call (struct-returning intrinsics, whose results do not come
    /// back through the C ABI as LLVM returns them) rewritten as a void call of the
    /// emulator's function, then one getter call per register and `insertvalue`s that
    /// rebuild the result under its name; f16 operands (`<2 x half>`) are passed as `i32`.
    /// `None` for any other line.
    fn collective_call(t: &str, indent: &str, tmp: &mut usize) -> Option<String> {
        let (lhs, rhs) = t.split_once(" = call ")?;
        let (ret, rest) = rhs.split_once(" @")?;
        let (name, args) = rest.split_once('(')?;
        let args = &args[..args.rfind(')')?];
        let mut out = String::new();
        let (count, getter, elem) = if let Some(shape) = name.strip_prefix("llvm.nvvm.ldmatrix.sync.aligned.m8n8.x") {
            let count: u32 = shape.split('.').next()?.parse().ok()?;
            let trans = u32::from(shape.contains(".trans"));
            out.push_str(&format!("{indent}call void @emu_ldmatrix({args}, i32 {count}, i32 {trans})\n"));
            (count, "emu_frag_i", "i32")
        } else if let Some(kind) = name.strip_prefix("llvm.nvvm.mma.m16n8k16.row.col.") {
            let kind = match kind {
                "bf16" => 0,
                "f32.f32" => 1,
                other => panic!("the emulator has no mma {other}"),
            };
            let mut pass = Vec::new();
            for a in args.split(", ") {
                if let Some(v) = a.strip_prefix("<2 x half> ") {
                    *tmp += 1;
                    out.push_str(&format!("{indent}%emu.t{tmp} = bitcast <2 x half> {v} to i32\n"));
                    pass.push(format!("i32 %emu.t{tmp}"));
                } else {
                    pass.push(a.to_string());
                }
            }
            out.push_str(&format!("{indent}call void @emu_mma(i32 {kind}, {})\n", pass.join(", ")));
            (4, "emu_frag_f", "float")
        } else {
            return None;
        };
        if count == 1 {
            out.push_str(&format!("{indent}{lhs} = call {elem} @{getter}(i32 0)\n"));
            return Some(out);
        }
        let mut agg = "poison".to_string();
        for i in 0..count {
            *tmp += 1;
            let v = format!("%emu.t{tmp}");
            out.push_str(&format!("{indent}{v} = call {elem} @{getter}(i32 {i})\n"));
            let dst = if i + 1 == count {
                lhs.to_string()
            } else {
                *tmp += 1;
                format!("%emu.t{tmp}")
            };
            out.push_str(&format!("{indent}{dst} = insertvalue {ret} {agg}, {elem} {v}, {i}\n"));
            agg = dst;
        }
        Some(out)
    }

    /// The kernel's IR rewritten for the host (see the module docs), plus `emu_entry(ptr
    /// args)` that calls the kernel with parameters loaded from an array of 8-byte slots.
    fn host_ir(ir: &str, entry: &str, params: &[KernelParam]) -> String {
        let renames = [
            ("llvm.nvvm.read.ptx.sreg.tid.x", "emu_tid_x"),
            ("llvm.nvvm.read.ptx.sreg.ntid.x", "emu_ntid_x"),
            ("llvm.nvvm.read.ptx.sreg.ctaid.x", "emu_ctaid_x"),
            ("llvm.nvvm.read.ptx.sreg.ctaid.y", "emu_ctaid_y"),
            ("llvm.nvvm.read.ptx.sreg.ctaid.z", "emu_ctaid_z"),
            ("llvm.nvvm.read.ptx.sreg.nctaid.x", "emu_nctaid_x"),
            ("llvm.nvvm.read.ptx.sreg.nctaid.y", "emu_nctaid_y"),
            ("llvm.nvvm.read.ptx.sreg.nctaid.z", "emu_nctaid_z"),
            ("llvm.nvvm.barrier.cta.sync.aligned.all", "emu_barrier"),
            ("llvm.nvvm.bar.warp.sync", "emu_warp_sync"),
            ("llvm.nvvm.shfl.sync.bfly.f32", "emu_shfl"),
            ("llvm.nvvm.ex2.approx.f32", "emu_ex2"),
            ("llvm.nvvm.ex2.approx.ftz.f", "emu_ex2"),
            ("llvm.nvvm.div.approx.f", "emu_div_approx"),
            ("llvm.nvvm.cp.async.cg.shared.global.16.s", "emu_cp_async"),
            ("llvm.nvvm.cp.async.commit.group", "emu_cp_commit"),
            ("llvm.nvvm.cp.async.wait.group", "emu_cp_wait"),
            ("llvm.nvvm.ex2.approx.ftz.f32", "emu_ex2"),
            ("llvm.nvvm.vote.any.sync", "emu_vote_any"),
            ("llvm.nvvm.vote.ballot.sync", "emu_vote_ballot"),
            ("llvm.nvvm.read.ptx.sreg.cluster.ctarank", "emu_cluster_ctarank"),
            ("llvm.nvvm.barrier.cluster.arrive.aligned", "emu_cluster_arrive"),
            ("llvm.nvvm.barrier.cluster.arrive.relaxed.aligned", "emu_cluster_arrive"),
            ("llvm.nvvm.barrier.cluster.wait.aligned", "emu_cluster_wait"),
            ("llvm.nvvm.mapa.shared.cluster", "emu_mapa"),
        ];
        let mut text = ir.replace("ptx_kernel ", "").replace("addrspace(1)", "").replace("addrspace(3)", "").replace("addrspace(7)", "").replace("addrspacecast", "bitcast");
        for (from, to) in renames {
            text = text.replace(&format!("@{from}("), &format!("@{to}("));
        }
        // `KernelBuilder::opaque`: an inline-asm `mov`, the identity.
        text = text.replace("asm \"mov.b32 $0, $1;\", \"=r,r\"", "@emu_id32").replace("asm \"mov.b64 $0, $1;\", \"=l,l\"", "@emu_id64");
        let mut out = String::new();
        let mut tmp = 0;
        for line in text.lines() {
            let t = line.trim_start();
            let indent = &line[..line.len() - t.len()];
            if t.starts_with("target triple") || t.starts_with("target datalayout") {
                continue;
            }
            if t.starts_with("declare") && t.contains("@emu_") {
                // Drop the intrinsic's attributes (`memory(none)` would allow merging calls;
                // `immarg` is for intrinsics only).
                let cut = t.rfind(')').map_or(t.len(), |i| i + 1);
                out.push_str(&t[..cut].replace(" immarg", ""));
                out.push('\n');
                continue;
            }
            if t.starts_with("declare") && (t.contains("@llvm.nvvm.ldmatrix") || t.contains("@llvm.nvvm.mma.")) {
                continue;
            }
            if let Some(lines) = collective_call(t, indent, &mut tmp) {
                out.push_str(&lines);
                continue;
            }
            if let Some((lhs, rhs)) = t.split_once(" = fptrunc float ") {
                if let Some(op) = rhs.strip_suffix(" to bfloat") {
                    tmp += 1;
                    out.push_str(&format!("{indent}%emu.t{tmp} = call i16 @emu_f2bf(float {op})\n{indent}{lhs} = bitcast i16 %emu.t{tmp} to bfloat\n"));
                    continue;
                }
            }
            if let Some((lhs, rhs)) = t.split_once(" = fpext bfloat ") {
                if let Some(op) = rhs.strip_suffix(" to float") {
                    tmp += 1;
                    out.push_str(&format!("{indent}%emu.t{tmp} = bitcast bfloat {op} to i16\n{indent}{lhs} = call float @emu_bf2f(i16 %emu.t{tmp})\n"));
                    continue;
                }
            }
            if let Some((lhs, rhs)) = t.split_once(" = fptrunc float ") {
                if let Some(op) = rhs.strip_suffix(" to half") {
                    tmp += 1;
                    out.push_str(&format!("{indent}%emu.t{tmp} = call i16 @emu_f2h(float {op})\n{indent}{lhs} = bitcast i16 %emu.t{tmp} to half\n"));
                    continue;
                }
            }
            if let Some((lhs, rhs)) = t.split_once(" = fpext half ") {
                if let Some(op) = rhs.strip_suffix(" to float") {
                    tmp += 1;
                    out.push_str(&format!("{indent}%emu.t{tmp} = bitcast half {op} to i16\n{indent}{lhs} = call float @emu_h2f(i16 %emu.t{tmp})\n"));
                    continue;
                }
            }
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("declare i16 @emu_f2bf(float)\ndeclare float @emu_bf2f(i16)\ndeclare i16 @emu_f2h(float)\ndeclare float @emu_h2f(i16)\n");
        out.push_str("declare void @emu_ldmatrix(ptr, i32, i32)\ndeclare void @emu_mma(i32, i32, i32, i32, i32, i32, i32, float, float, float, float)\n");
        out.push_str("declare i32 @emu_frag_i(i32)\ndeclare float @emu_frag_f(i32)\n");
        out.push_str("define i32 @emu_id32(i32 %x) {\n  ret i32 %x\n}\ndefine i64 @emu_id64(i64 %x) {\n  ret i64 %x\n}\n");
        // `emu_shared_<i>()`: the address of the kernel's i-th shared-memory global.
        for (i, (name, _)) in shared_globals(ir).iter().enumerate() {
            out.push_str(&format!("define ptr @emu_shared_{i}() {{\n  ret ptr @{name}\n}}\n"));
        }
        out.push_str("define void @emu_entry(ptr %args) {\n");
        let mut call = Vec::new();
        for (i, p) in params.iter().enumerate() {
            let ty = match p {
                KernelParam::Buffer(_) => "ptr",
                KernelParam::Size(_) => "i64",
                KernelParam::TensorMap(_) => panic!("the CPU emulator runs no TMA kernel (emulate an sm_90 target)"),
            };
            out.push_str(&format!("  %p{i} = getelementptr i64, ptr %args, i64 {i}\n  %a{i} = load {ty}, ptr %p{i}\n"));
            call.push(format!("{ty} %a{i}"));
        }
        out.push_str(&format!("  call void @{entry}({})\n  ret void\n}}\n", call.join(", ")));
        out
    }

    /// The kernel IR's shared-memory globals (`addrspace(3)`), with their sizes in bytes (0
    /// for the dynamic `smem_dyn`), in order of definition.
    fn shared_globals(ir: &str) -> Vec<(String, usize)> {
        ir.lines()
            .filter_map(|l| {
                let (name, rest) = l.strip_prefix('@')?.split_once(" = ")?;
                let ty = rest.split_once("addrspace(3) global [")?.1;
                let bytes = ty.split_once(" x i8]")?.0.trim().parse().ok()?;
                Some((name.to_string(), bytes))
            })
            .collect()
    }

    /// The cluster shape of the kernel (`"nvvm.cluster_dim"="x,y,z"`), `[1, 1, 1]` without one.
    fn cluster_dims(ir: &str) -> [u32; 3] {
        let Some(rest) = ir.split_once("\"nvvm.cluster_dim\"=\"").map(|(_, r)| r) else { return [1, 1, 1] };
        let dims: Vec<u32> = rest.split('"').next().unwrap_or("").split(',').map(|d| d.trim().parse().expect("a cluster dim")).collect();
        [dims[0], dims[1], dims[2]]
    }

    /// Runs `plan` (whose `ptx` holds the kernel's IR) on the host over `bufs` (every
    /// kernel buffer's bytes, inputs then outputs) with the symbols of `bindings`.
    pub(crate) fn run(plan: &LaunchPlan, bindings: &Bindings, bufs: &mut [Vec<u8>]) {
        LlvmTarget::initialize_native(&InitializationConfig::default()).expect("a native LLVM target");
        let ir = host_ir(&plan.ptx, &plan.entry, &plan.params);
        if let Some(dir) = std::env::var_os("SINTER_EMU_DUMP") {
            let _ = std::fs::write(std::path::Path::new(&dir).join(format!("{}_{}.ll", plan.entry, ir.len())), &ir);
        }
        let cdims = cluster_dims(&plan.ptx);
        let nrank = (cdims[0] * cdims[1] * cdims[2]) as usize;
        let globals = shared_globals(&plan.ptx);
        let ctx = Context::create();
        // One module per CTA of a cluster, so that each has its own shared memory.
        let mut engines = Vec::with_capacity(nrank);
        let mut dynamic: Vec<Vec<u8>> = Vec::with_capacity(nrank);
        let mut shared = Vec::with_capacity(nrank);
        let mut entries = Vec::with_capacity(nrank);
        for _ in 0..nrank {
            let module = ctx
                .create_module_from_ir(MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "emu"))
                .unwrap_or_else(|e| panic!("{}: the host IR does not parse: {e}\n{ir}", plan.entry));
            let ee = module.create_jit_execution_engine(OptimizationLevel::None).expect("MCJIT");
            map_functions(&module, &ee);
            let mut dyn_bytes = vec![0u8; plan.shared_bytes as usize + 16];
            let dyn_addr = (dyn_bytes.as_mut_ptr() as usize).div_ceil(16) * 16;
            if let Some(g) = module.get_global("smem_dyn") {
                ee.add_global_mapping(&g, dyn_addr);
            }
            let ranges: Vec<(usize, usize)> = globals
                .iter()
                .enumerate()
                .map(|(i, (name, bytes))| {
                    if name == "smem_dyn" {
                        return (dyn_addr, plan.shared_bytes as usize);
                    }
                    // SAFETY: `emu_shared_<i>` has this signature (built by `host_ir`).
                    let f = unsafe { ee.get_function::<unsafe extern "C" fn() -> usize>(&format!("emu_shared_{i}")) }.expect("emu_shared");
                    (unsafe { f.call() }, *bytes)
                })
                .collect();
            // SAFETY: `emu_entry` has this signature (built by `host_ir`).
            let entry = unsafe { ee.get_function::<unsafe extern "C" fn(*const u64)>("emu_entry") }.expect("emu_entry");
            entries.push(unsafe { entry.as_raw() });
            shared.push(ranges);
            dynamic.push(dyn_bytes);
            engines.push((module, ee));
        }
        let args: Vec<u64> = plan
            .params
            .iter()
            .map(|p| match p {
                KernelParam::Buffer(i) => bufs[*i].as_mut_ptr() as u64,
                KernelParam::Size(d) => d.eval(bindings).expect("a bound size") as u64,
                KernelParam::TensorMap(_) => panic!("the CPU emulator runs no TMA kernel"),
            })
            .collect();
        let grid: Vec<u32> = plan.grid.iter().map(|g| g.eval(bindings).expect("a bound grid")).collect();
        assert!((0..3).all(|i| grid[i] % cdims[i] == 0), "{}: grid {grid:?} is not a whole number of clusters {cdims:?}", plan.entry);
        let threads = plan.block[0];
        let args_addr = args.as_ptr() as usize;
        // One OS thread per kernel thread of a cluster, reused for every cluster in turn: a
        // barrier of all its threads separates clusters (their shared memory is reused).
        let cluster = Arc::new(Cluster { barrier: Barrier::new(threads as usize * nrank), shared });
        let ctas: Vec<Arc<Cta>> = (0..nrank)
            .map(|_| {
                Arc::new(Cta {
                    barrier: Barrier::new(threads as usize),
                    warps: (0..threads.div_ceil(32))
                        .map(|_| Warp {
                            barrier: Barrier::new(32),
                            slots: std::array::from_fn(|_| AtomicU32::new(0)),
                            xchg: std::array::from_fn(|_| (0..32 * XCHG).map(|_| AtomicU32::new(0)).collect()),
                        })
                        .collect(),
                })
            })
            .collect();
        let (nx, ny, nz) = (grid[0] / cdims[0], grid[1] / cdims[1], grid[2] / cdims[2]);
        let clusters: Vec<[u32; 3]> = (0..nz).flat_map(|z| (0..ny).flat_map(move |y| (0..nx).map(move |x| [x, y, z]))).collect();
        std::thread::scope(|s| {
            for rank in 0..nrank as u32 {
                let f = entries[rank as usize];
                let local = [rank % cdims[0], (rank / cdims[0]) % cdims[1], rank / (cdims[0] * cdims[1])];
                for tid in 0..threads {
                    let cta = ctas[rank as usize].clone();
                    let cluster = cluster.clone();
                    let nctaid = [grid[0], grid[1], grid[2]];
                    let clusters = &clusters;
                    std::thread::Builder::new()
                        .stack_size(8 << 20)
                        .spawn_scoped(s, move || {
                            for c in clusters {
                                let ctaid = std::array::from_fn(|i| c[i] * cdims[i] + local[i]);
                                CTX.with(|x| *x.borrow_mut() = Some(ThreadCtx { tid, ntid: threads, ctaid, nctaid, cta: cta.clone(), rank, cluster: cluster.clone() }));
                                ASYNC.with(|a| *a.borrow_mut() = AsyncState::default());
                                // SAFETY: the kernel reads the argument slots and the buffers
                                // they point to, which outlive the scope; its own bounds checks
                                // are what this tests.
                                unsafe { f(args_addr as *const u64) };
                                cluster.barrier.wait();
                            }
                            CTX.with(|x| *x.borrow_mut() = None);
                        })
                        .expect("a thread");
                }
            }
        });
        drop(engines);
        drop(dynamic);
    }

    /// Maps the `emu_*` functions the host IR calls to their Rust definitions.
    fn map_functions(module: &inkwell::module::Module<'_>, ee: &inkwell::execution_engine::ExecutionEngine<'_>) {
        let fns: [(&str, usize); 31] = [
            ("emu_tid_x", emu_tid_x as *const () as usize),
            ("emu_ntid_x", emu_ntid_x as *const () as usize),
            ("emu_ctaid_x", emu_ctaid_x as *const () as usize),
            ("emu_ctaid_y", emu_ctaid_y as *const () as usize),
            ("emu_ctaid_z", emu_ctaid_z as *const () as usize),
            ("emu_nctaid_x", emu_nctaid_x as *const () as usize),
            ("emu_nctaid_y", emu_nctaid_y as *const () as usize),
            ("emu_nctaid_z", emu_nctaid_z as *const () as usize),
            ("emu_barrier", emu_barrier as *const () as usize),
            ("emu_warp_sync", emu_warp_sync as *const () as usize),
            ("emu_shfl", emu_shfl as *const () as usize),
            ("emu_ex2", emu_ex2 as *const () as usize),
            ("emu_div_approx", emu_div_approx as *const () as usize),
            ("emu_f2bf", emu_f2bf as *const () as usize),
            ("emu_bf2f", emu_bf2f as *const () as usize),
            ("emu_tid_x", emu_tid_x as *const () as usize),
            ("emu_f2h", emu_f2h as *const () as usize),
            ("emu_h2f", emu_h2f as *const () as usize),
            ("emu_cp_async", emu_cp_async as *const () as usize),
            ("emu_cp_commit", emu_cp_commit as *const () as usize),
            ("emu_cp_wait", emu_cp_wait as *const () as usize),
            ("emu_ldmatrix", emu_ldmatrix as *const () as usize),
            ("emu_mma", emu_mma as *const () as usize),
            ("emu_frag_i", emu_frag_i as *const () as usize),
            ("emu_frag_f", emu_frag_f as *const () as usize),
            ("emu_vote_any", emu_vote_any as *const () as usize),
            ("emu_vote_ballot", emu_vote_ballot as *const () as usize),
            ("emu_cluster_ctarank", emu_cluster_ctarank as *const () as usize),
            ("emu_cluster_arrive", emu_cluster_arrive as *const () as usize),
            ("emu_cluster_wait", emu_cluster_wait as *const () as usize),
            ("emu_mapa", emu_mapa as *const () as usize),
        ];
        for (name, addr) in fns {
            if let Some(f) = module.get_function(name) {
                ee.add_global_mapping(&f, addr);
            }
        }
    }

    /// Bytes past each output's extent, filled with a canary and checked after the run.
    const GUARD: usize = 256;

    pub(crate) fn to_bytes(t: &Tensor) -> Vec<u8> {
        let mut v = t.to_blocks().unwrap_or_default();
        for &x in t.data().iter().filter(|_| !t.dtype().is_quantized()) {
            match t.dtype() {
                DType::BF16 => v.extend(f32_to_bf16(x as f32).to_le_bytes()),
                DType::F32 => v.extend((x as f32).to_le_bytes()),
                DType::I32 => v.extend((x as i32).to_le_bytes()),
                DType::I64 => v.extend((x as i64).to_le_bytes()),
                DType::Bool => v.push(u8::from(x != 0.0)),
                DType::F16 => v.extend(half::f16::from_f64(x).to_bits().to_le_bytes()),
                DType::F8E4M3 => v.push(sinter_ir::dtype::f8e4m3_from_f64(x)),
                DType::Q8_0 | DType::Q4_1 => {}
            }
        }
        v.extend(std::iter::repeat_n(0xA5, GUARD));
        v
    }

    pub(crate) fn from_bytes(dt: DType, b: &[u8], n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| match dt {
                DType::BF16 => f64::from(emu_bf2f(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))),
                DType::F16 => f64::from(emu_h2f(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))),
                DType::F32 => f64::from(f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])),
                DType::F8E4M3 => sinter_ir::dtype::f8e4m3_to_f64(b[i]),
                other => panic!("output dtype {other} not compared"),
            })
            .collect()
    }

    /// Generates kernel `k` with `gen` (as IR), runs it on `inputs` under `bindings` and
    /// compares every output with the interpreter's run of the kernel's body: element-wise
    /// within DESIGN.md's tolerance (bf16: rtol 1.6e-2, atol 1e-2·max|ref|; f32: rtol 1e-5,
    /// atol 1e-6·max|ref| — loosened to 2e-5 for the host's exp2), NaN exactly where the
    /// reference has NaN, and nothing written past any output.
    pub(crate) fn check(what: &str, g: &KernelGraph, k: Kernel, gen: impl Fn(&KernelGraph, Kernel) -> Result<LaunchPlan, CodegenError>, inputs: &[Tensor], bindings: &Bindings) {
        let body = &g.kernels[k].body;
        if std::env::var_os("SINTER_EMU_O3").is_some() && body.values.values().any(|v| v.ty.dtype == DType::BF16) {
            // Optimised IR computes in bf16 where it can prove it exact (`fadd bfloat`), which
            // the host JIT cannot lower without compiler-rt's bf16 routines.
            eprintln!("{what}: skipped under SINTER_EMU_O3 (bf16)");
            return;
        }
        let mut graph = Graph::new();
        graph.add_func(body.clone());
        let refs: Vec<&Tensor> = inputs.iter().collect();
        let want = interp::run(&graph, &body.name, &refs, bindings).unwrap_or_else(|e| panic!("{what}: reference: {e}"));
        EMIT_IR.with(|f| f.set(true));
        let plan = gen(g, k);
        EMIT_IR.with(|f| f.set(false));
        let plan = plan.unwrap_or_else(|e| panic!("{what}: {e}"));
        let mut bufs: Vec<Vec<u8>> = inputs.iter().map(to_bytes).collect();
        // A kv_append result is its page input updated in place (as the runtime passes one
        // buffer for both): the output starts as a copy of the input.
        let mut in_place = std::collections::HashMap::new();
        for nd in body.nodes.values().filter(|nd| nd.op.kind == sinter_ir::OpKind::KvAppend) {
            for (page, r) in nd.inputs.iter().zip(&nd.results) {
                if let (Some(i), Some(j)) = (body.params.iter().position(|p| p == page), body.outputs.iter().position(|o| o == r)) {
                    in_place.insert(j, i);
                }
            }
        }
        for (j, w) in want.iter().enumerate() {
            let mut b = match in_place.get(&j) {
                Some(&i) => bufs[i].clone(),
                None => vec![0xFFu8; w.data().len() * w.dtype().size_bytes()],
            };
            b.extend(std::iter::repeat_n(0xA5, GUARD));
            bufs.push(b);
        }
        run(&plan, bindings, &mut bufs);
        for (j, w) in want.iter().enumerate() {
            let b = &bufs[inputs.len() + j];
            let n = w.data().len();
            let bytes = n * w.dtype().size_bytes();
            assert!(b[bytes..].iter().all(|&x| x == 0xA5), "{what}: output {j} written past its end");
            let got = from_bytes(w.dtype(), b, n);
            let maxref = w.data().iter().filter(|x| x.is_finite()).fold(0.0f64, |m, x| m.max(x.abs()));
            let (rtol, atol) = match w.dtype() {
                DType::BF16 | DType::F16 => (1.6e-2, 1e-2 * maxref),
                _ => (2e-5, 2e-6 * maxref),
            };
            let mut worst = 0.0f64;
            for (i, (&o, &r)) in got.iter().zip(w.data()).enumerate() {
                if r.is_nan() || o.is_nan() {
                    assert!(r.is_nan() && o.is_nan(), "{what}: output {j} element {i}: {o} vs reference {r}");
                    continue;
                }
                if r.is_infinite() || o.is_infinite() {
                    assert_eq!(o, r, "{what}: output {j} element {i}");
                    continue;
                }
                let err = (o - r).abs();
                assert!(err <= atol + rtol * r.abs(), "{what}: output {j} element {i} (of {:?}): {o} vs reference {r} (max |ref| {maxref})", w.shape());
                worst = worst.max(err);
            }
            eprintln!("{what}: output {j} {:?} matches (max abs error {worst:.3e}, max |ref| {maxref:.3e})", w.shape());
        }
    }

    /// Deterministic values in [−1, 1) (a 64-bit LCG), rounded to `dt`.
    pub(crate) fn random(dt: DType, shape: &[usize], seed: u64) -> Tensor {
        let n: usize = shape.iter().product();
        let mut s = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let data = (0..n)
            .map(|_| {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                ((s >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
            })
            .collect();
        Tensor::new(dt, shape, data).expect("a tensor")
    }
}
