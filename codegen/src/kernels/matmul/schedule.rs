//! The matmul schedules: the parameters of each generator ([`TiledSchedule`], [`SmallMSchedule`],
//! [`MmaSchedule`], [`WgmmaSchedule`], [`QuantMmaSchedule`]), their constraints, the
//! [`MatmulSchedule`] that names one, and the shape rule that picks one ([`choose_schedule`]).
//!
//! Design notes: book/src/design/matmul.md

use sinter_ir::{DType, Dim};

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
    pub(super) fn b_slab_offset(&self) -> u32 {
        (4 * self.bk * (self.bm + PAD)).div_ceil(16) * 16
    }

    pub(super) fn check(&self) -> Result<(), String> {
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

    pub(super) fn check(&self) -> Result<(), String> {
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

/// The Hopper GEMM's schedule ([`MatmulSchedule::Wgmma`], [`build_wgmma`](super::wgmma::build_wgmma)): the CTA tile and
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
    /// Load the stages with the Tensor Memory Accelerator ([`TmaLoads`](super::wgmma::TmaLoads): one thread issues
    /// `cp.async.bulk.tensor` copies of A's and B's boxes from tensor maps, completing on a
    /// stage's mbarrier) instead of every thread's `cp.async` chunks ([`StageLoads`](super::pipeline::StageLoads)).
    pub tma: bool,
    /// Warp specialisation ([`build_wgmma_ws`](super::wgmma::build_wgmma_ws), needs `tma`): a third warpgroup, the
    /// producer, issues the TMA copies (after `setmaxnreg.dec` to [`WS_PRODUCER_REGS`]);
    /// the two consumer warpgroups (`setmaxnreg.inc` to [`WS_CONSUMER_REGS`]) wait on each
    /// stage's *full* mbarrier, compute, and free it on its *empty* mbarrier: no CTA-wide
    /// barrier in the main loop. 384 threads.
    pub specialized: bool,
    /// Persistent CTAs (with `specialized` only): 0 launches a CTA per output tile; `c > 0`
    /// launches `c` CTAs (the launch plan's grid is `[c, 1, 1]`, which must not exceed
    /// what fits on the device at once: one CTA per SM, so at most the SM count) that loop over the output tiles `blockIdx.x + i·gridDim.x` in raster
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

impl WgmmaSchedule {
    /// Threads per CTA: the tile's warpgroups, and the producer warpgroup when specialised.
    pub fn threads(&self) -> u32 {
        self.tile.threads() + if self.specialized { 128 } else { 0 }
    }

    /// [`MmaSchedule::WGMMA`] with one K tile's products in flight, loaded by the TMA where
    /// the operands allow tensor maps: the fastest of these choices as measured (see the
    /// design page).
    pub const DEFAULT: WgmmaSchedule = WgmmaSchedule { tile: MmaSchedule::WGMMA, in_flight: 1, tma: true, specialized: false, ctas: 0 };
}

/// The tensor-core schedule of a matmul whose B operand is block-quantized (`q8_0`/`q4_1`,
/// `[N, K]`), for constant M ≤ 16 ([`build_quant_mma`](super::quant_mma::build_quant_mma)): each warp owns `tiles` column
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
    /// activations once for 64 columns (faster than 8 warps of one tile as measured: see the
    /// design page).
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

    pub(super) fn check(&self) -> Result<(), String> {
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
    /// `wgmma.mma_async` from shared memory, [`build_wgmma`](super::wgmma::build_wgmma)); the schedule's fields as for
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
///   kernel's layouts do not allow its 16-byte copies ([`generate`](super::generate)).
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
pub(super) fn small_m_schedule(rows: u32, b_k_contiguous: bool) -> SmallMSchedule {
    SmallMSchedule { rows, lanes: if b_k_contiguous { 32 } else { 1 }, columns: if b_k_contiguous { 4 } else { 128 } }
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

/// Row padding of the shared-memory slabs, in f32s (keeps rows 16-byte aligned).
pub(super) const PAD: u32 = 4;
