//! The matmul family ([`Family::Matmul`]): a (batched) matrix product with a fused
//! epilogue, on CUDA cores, correct for every shape.
//!
//! # What a kernel computes
//! The body holds one `matmul` node `R = a · b` (`a [..., M, K]`, `b [..., K, N]` after the
//! optional `transpose_a` / `transpose_b` of the last two axes; batch axes broadcast by NumPy
//! rules; `bf16`, `f16` or `f32` operands of one dtype) whose operands are kernel inputs,
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
//! Two generators, both parameterised by a schedule ([`MatmulSchedule`]) so that issue 6's
//! tensor-core versions (`cp.async` stages, `ldmatrix`, `mma.sync`) can slot in beside them
//! and the runtime can autotune among candidates:
//! - [`TiledSchedule`]: the classic shared-memory tiled GEMM on CUDA cores (as in the CUDA C
//!   Programming Guide's shared-memory matmul, with per-thread register micro-tiles as in
//!   Volkov & Demmel 2008). A CTA computes a `bm × bn` tile of C; per `bk`-step it stages the
//!   `bm × bk` slab of A and the `bk × bn` slab of B in shared memory (converted to f32, padded
//!   by 4 floats per row), then every thread accumulates its `tm × tn` micro-tile from
//!   16-byte shared loads. Grid: `(⌈M/bm⌉, ⌈N/bn⌉, batch)`. Default 64×64×16 with 4×4
//!   micro-tiles: 256 threads, 8.5 KiB of shared memory.
//! - [`SmallMSchedule`]: a GEMV / flat GEMM for decode (M ≤ 16). `lanes` threads cooperate
//!   on one output column n for `rows` rows at once: when B is K-contiguous (the `[N, K]`
//!   weight with `transpose_b`, the LLM case) a warp splits K, reads 16-byte vectors of A and B
//!   where alignment and extent are proven, and reduces with `shfl.sync.bfly`; when B is
//!   N-contiguous, one thread per column walks K so that a warp's loads of B coalesce. Grid:
//!   `(⌈N/columns⌉, ⌈M/rows⌉, batch)`. Every weight byte is read once per `rows` rows, which is
//!   what decode (memory-bound) needs; FlashDecoding++ (Hong et al. 2023, arXiv 2311.01282,
//!   §4) motivates the flat-GEMM split.
//!
//! [`choose_schedule`] picks between them by shape: a constant M ≤ 16 gets the small-M kernel,
//! anything else (a symbolic M included) the tiled one. The small-M kernel takes every epilogue
//! mode: for a paired epilogue each group computes the n-th column of every segment (SwiGLU of
//! a merged gate/up projection from two dot products); for a columns epilogue it computes its
//! column and the column's RoPE partner in the head (n ± d/2, or n xor 1 for the interleaved
//! form), stages them in its slice of shared memory at their place in the head, and the
//! epilogue (RoPE, the `kv_append` scatter) reads R there. With a symbolic M, columns and
//! paired epilogues use the tiled kernel with a tile as wide as they need.
//!
//! # Tests
//! Every kernel is assembled by ptxas for sm_80 and sm_90a (no spills; the resource lines are
//! insta snapshots), and run on the CPU against the interpreter by an emulator (`emu`, test
//! only) that JIT-compiles the kernel's LLVM IR for the host and runs each CTA's threads as OS
//! threads, barriers and shuffles emulated: tails, batches, epilogues, NaN.

use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{Attr, DType, Dim, Family, Function, GridDim, Kernel, KernelGraph, LaunchPlan, Layout, OpKind, Value, ValueDef};

use sinter_ir::epilogue::{self, MatmulEpilogue as Epi};

use self::kit::{broadcast_strides, buffer_infos, dims_of, input_view, BufInfo, Kit, SharedKind, R};
use super::element::{At, Buf, Eval, Scalar};
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

/// Which matmul kernel to generate, with its parameters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum MatmulSchedule {
    /// Shared-memory tiled GEMM.
    Tiled(TiledSchedule),
    /// GEMV / flat GEMM for small M.
    SmallM(SmallMSchedule),
}

/// Picks the schedule for a kernel whose matmul has `m` rows; `b_k_contiguous` says whether B's
/// contraction axis has stride 1 (a `[N, K]` weight read with `transpose_b`).
///
/// Heuristic: a constant `m ≤ 16` → [`MatmulSchedule::SmallM`] with `rows = m` (a warp per
/// column when B is K-contiguous, four columns per CTA; else a thread per column, 128 columns
/// per CTA); anything else (a symbolic `m` such as the token count included) →
/// [`TiledSchedule::DEFAULT`].
pub fn choose_schedule(m: &Dim, b_k_contiguous: bool) -> MatmulSchedule {
    match m.as_const() {
        Some(rows) if (1..=16).contains(&rows) => MatmulSchedule::SmallM(SmallMSchedule {
            rows: rows as u32,
            lanes: if b_k_contiguous { 32 } else { 1 },
            columns: if b_k_contiguous { 4 } else { 128 },
        }),
        _ => MatmulSchedule::Tiled(TiledSchedule::DEFAULT),
    }
}

/// Generates the PTX and launch plan of matmul kernel `kernel` of `graph` with the schedule
/// [`choose_schedule`] picks.
///
/// Parameters: the kernel's buffers (inputs then outputs), then one i64 per symbolic dim the
/// kernel needs. Block and grid: see [`TiledSchedule`] / [`SmallMSchedule`]; no dynamic shared
/// memory.
///
/// # Errors
/// [`CodegenError::Unsupported`] when the body is not one `matmul` of float kernel inputs
/// followed by an epilogue the element evaluator supports, or when an output does not have
/// the matmul's shape; LLVM and target errors otherwise.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let spec = Spec::analyse(graph, kernel)?;
    let schedule = spec.default_schedule();
    generate_spec(&spec, target, &schedule)
}

/// As [`generate`], with the schedule given (for autotuning and tests). Either schedule is
/// correct for every shape ([`MatmulSchedule::SmallM`] covers M with `⌈M/rows⌉` CTAs along
/// y, so it is merely slow for a large M).
///
/// # Errors
/// As [`generate`], and [`CodegenError::Unsupported`] for a schedule that breaks its
/// constraints.
pub fn generate_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &MatmulSchedule) -> Result<LaunchPlan, CodegenError> {
    let spec = Spec::analyse(graph, kernel)?;
    generate_spec(&spec, target, schedule)
}

fn generate_spec(spec: &Spec, target: &Target, schedule: &MatmulSchedule) -> Result<LaunchPlan, CodegenError> {
    let (tag, check, threads) = match schedule {
        MatmulSchedule::Tiled(s) => ("matmul", s.check().and_then(|()| spec.fits(s)), s.threads()),
        MatmulSchedule::SmallM(s) => ("matmul_small_m", s.check(), s.threads()),
    };
    check.map_err(|reason| unsupported(&spec.kernel_name, reason))?;
    let entry = format!("{}_{tag}", spec.kernel_name);
    let ctx = Context::create();
    let n_outputs = spec.n_buffers - spec.n_inputs;
    let (ptx, params) = Kit::build(&ctx, &entry, *target, spec.n_inputs, n_outputs, &spec.all_dims, threads, |kit| match schedule {
        MatmulSchedule::Tiled(s) => build_tiled(kit, spec, s),
        MatmulSchedule::SmallM(s) => build_small_m(kit, spec, s),
    })?;
    let batch = GridDim { numerator: Dim::product(&spec.batch), denominator: 1 };
    let grid = match schedule {
        MatmulSchedule::Tiled(s) => {
            // Paired: a CTA covers bn / segments output columns.
            let cols = match &spec.epi {
                Epi::Paired { segs, width, .. } => GridDim { numerator: width.clone(), denominator: s.bn / segs.len() as u32 },
                _ => GridDim { numerator: spec.n.clone(), denominator: s.bn },
            };
            [GridDim { numerator: spec.m.clone(), denominator: s.bm }, cols, batch]
        }
        MatmulSchedule::SmallM(s) => {
            let cols = match &spec.epi {
                Epi::Paired { width, .. } => width.clone(),
                _ => spec.n.clone(),
            };
            [GridDim { numerator: cols, denominator: s.columns }, GridDim { numerator: spec.m.clone(), denominator: s.rows }, batch]
        }
    };
    Ok(LaunchPlan { entry, ptx, target: target.name().to_owned(), grid, block: [threads, 1, 1], shared_bytes: 0, params })
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
            Ok(MatOperand { buffer: view.param, dtype, offset: view.offset, batch_strides: bs, outer, ks, align: view.align })
        };
        let a = mat(av, at, ta, true)?;
        let b = mat(bv, bt, tb, false)?;
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
    /// The schedule [`generate`] uses: [`choose_schedule`] for an element-wise epilogue; for a
    /// staged one (see [`Epi`]) the tiled kernel with a tile as wide as the epilogue needs
    /// (64 columns, or a RoPE head of 128 or 256, or 32 per combined segment), 16 rows when M
    /// is a constant ≤ 16.
    fn default_schedule(&self) -> MatmulSchedule {
        let bn = match &self.epi {
            Epi::Direct => return choose_schedule(&self.m, self.b.ks.as_const() == Some(1)),
            // A constant M ≤ 16 (a batch-specialised decode step): the flat GEMM, each group
            // computing its column and the RoPE partner (columns) or the n-th column of every
            // segment (paired).
            _ if self.m.as_const().is_some_and(|m| (1..=16).contains(&m)) => return choose_schedule(&self.m, self.b.ks.as_const() == Some(1)),
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

    /// Static shared memory of the tiled kernel: the slabs, or the staged tile (in the
    /// matmul's dtype) where that is larger.
    fn staged_bytes(&self, s: &TiledSchedule) -> u32 {
        let tile = if self.epi.staged() { s.bm * s.bn * self.dtype.size_bytes() as u32 } else { 0 };
        s.shared_bytes().max(tile)
    }
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
    let mut bufs = Vec::with_capacity(spec.n_buffers + accs.len());
    for (i, info) in spec.buffers.iter().enumerate().take(spec.n_inputs) {
        bufs.push(Buf { ptr: kit.buf(i)?, dtype: info.dtype, strides: info.strides.clone(), align: info.align });
    }
    let rank = spec.batch.len() + 2;
    // Each accumulator, as a one-element "buffer" of the matmul's dtype read at offset 0: a
    // store and a load of a private alloca, which SROA folds into a rounding to the dtype.
    let per_param: Vec<FloatValue<'ctx>> = match &spec.epi {
        Epi::Paired { slices, .. } => slices.iter().map(|(_, si)| accs.get(*si).copied().ok_or_else(|| kit.err("no accumulator for a segment"))).collect::<R<_>>()?,
        _ => vec![*accs.first().ok_or_else(|| kit.err("no accumulator"))?],
    };
    for acc in per_param {
        let slot = kit.private_slot(spec.dtype)?;
        kit.store_vec(spec.dtype, slot, kit.i64c(0), &[acc])?;
        bufs.push(Buf { ptr: slot, dtype: spec.dtype, strides: vec![Dim::constant(0); rank], align: 16 });
    }
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
        axes.push(ev.uniform_ax(n));
        let at = At { axes, lanes: 1 };
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
        match &spec.epi {
            Epi::Paired { segs, width, .. } => {
                let sub = s.bn / segs.len() as u32;
                let seg = k.udiv(v, k.i32c(sub as i32))?;
                let j = k.add(k.mul(tile, k.i64c(i64::from(sub)))?, k.zext64(k.urem(v, k.i32c(sub as i32))?)?)?;
                let mut start = k.dim(&segs[0].start)?;
                for (i, sg) in segs.iter().enumerate().skip(1) {
                    let here = k.icmp(IntPredicate::EQ, seg, k.i32c(i as i32))?;
                    start = k.select_int(here, k.dim(&sg.start)?, start)?;
                }
                Ok((k.add(start, j)?, k.icmp(IntPredicate::SLT, j, k.dim(width)?)?))
            }
            _ => {
                let n = k.add(n0, k.zext64(v)?)?;
                Ok((n, k.icmp(IntPredicate::SLT, n, ndim)?))
            }
        }
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

/// The epilogue of [`Epi::Columns`] and [`Epi::Paired`]: the accumulators, rounded to the
/// matmul's dtype, are staged in shared memory as the CTA's `bm × bn` tile (virtual columns:
/// R's columns `tile·bn + v`, or for Paired segment `v / sub`'s columns `tile·sub + v mod sub`
/// with `sub = bn / segments`); then the threads walk the tile's elements and evaluate every
/// output whose element it is, through the element evaluator, reading R (or the segments)
/// from the tile.
#[allow(clippy::too_many_arguments)]
fn staged_epilogue<'ctx>(
    kit: &Kit<'ctx>,
    spec: &Spec,
    s: &TiledSchedule,
    smem: PointerValue<'ctx>,
    (m0, tile, z): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
    acc: &[PointerValue<'ctx>],
    (tid, tx, ty): (IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>),
) -> R<()> {
    let dt = spec.dtype;
    let es = dt.size_bytes() as i32;
    let bn = s.bn as i32;
    // 1. Stage: thread (ty, tx) owns rows ty·tm.., columns tx·tn.. (the k loop ended on a
    // barrier, so the slabs' memory is free).
    for i in 0..s.tm {
        let row = kit.add(kit.mul(ty, kit.i32c(s.tm as i32))?, kit.i32c(i as i32))?;
        let e = kit.add(kit.mul(row, kit.i32c(bn))?, kit.mul(tx, kit.i32c(s.tn as i32))?)?;
        let vals: Vec<FloatValue> = (0..s.tn).map(|j| kit.get_f(acc[(i * s.tn + j) as usize])).collect::<R<_>>()?;
        kit.sh_store(dt, kit.sh_at(smem, kit.mul(e, kit.i32c(es))?)?, &vals)?;
    }
    kit.barrier()?;
    // 2. The element evaluator reads R (Columns) or each segment (Paired) from the tile: a
    // "buffer" whose element (.., m, c) is tile[(m − m0)·bn + (c − c0)] (+ the segment's
    // block), i.e. based at tile − (m0·bn + c0) with strides (0.., bn, 1).
    let rank = spec.batch.len() + 2;
    let tile_strides: Vec<Dim> = (0..rank).map(|i| Dim::constant(if i == rank - 2 { i64::from(s.bn) } else if i == rank - 1 { 1 } else { 0 })).collect();
    let row_base = kit.mul(m0, kit.i64c(i64::from(s.bn)))?;
    let tile_buf = |k: &Kit<'ctx>, first_col: IntValue<'ctx>, block: i64| -> R<Buf<'ctx>> {
        let shift = k.sub(k.i64c(block), k.add(row_base, first_col)?)?;
        Ok(Buf { ptr: k.gep_raw(dt, smem, shift)?, dtype: dt, strides: tile_strides.clone(), align: es as u32 })
    };
    let mdim = kit.dim(&spec.m)?;
    let n_out = spec.n_buffers - spec.n_inputs;
    let total = (s.bm * s.bn) as i32;
    kit.for_range(tid, kit.i32c(total), kit.i32c(s.threads() as i32), |k, e| {
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
                let n = k.add(k.mul(tile, k.i64c(i64::from(s.bn)))?, k.zext64(v)?)?;
                let n_ok = k.and(m_ok, k.icmp(IntPredicate::SLT, n, k.dim(&spec.n)?)?)?;
                for (j, seg) in segs.iter().enumerate() {
                    let (a, w) = (k.dim(&seg.start)?, k.dim(&seg.width)?);
                    let c = k.sub(n, a)?;
                    let inside = k.and(k.icmp(IntPredicate::SGE, c, k.i64c(0))?, k.icmp(IntPredicate::SLT, c, w)?)?;
                    todo.push((j, k.and(n_ok, inside)?, c, w));
                }
                extra.push(tile_buf(k, k.mul(tile, k.i64c(i64::from(s.bn)))?, 0)?);
            }
            Epi::Paired { slices, segs, width } => {
                let sub = s.bn / segs.len() as u32;
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

    // Vector width along K: 16 bytes where both operands allow it and K is a multiple.
    let es = spec.dtype.size_bytes() as u32;
    let vw = 16 / es;
    let c = if lanes > 1 && spec.a.vector_ok(vw) && spec.b.vector_ok(vw) && spec.k.div_exact(i64::from(vw)).is_some() { vw } else { 1 };

    // acc[column][row]
    let acc: Vec<Vec<PointerValue>> = cols.iter().map(|_| (0..s.rows).map(|_| kit.var_f(kit.f32c(0.0))).collect::<R<Vec<_>>>()).collect::<R<_>>()?;
    let m_valid: Vec<IntValue> = (0..s.rows)
        .map(|i| kit.icmp(IntPredicate::SLT, kit.add(m0, kit.i64c(i64::from(i)))?, mdim))
        .collect::<R<_>>()?;
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
    use sinter_ir::{DType, Dim, Function, KernelData, KernelGraph, KernelParam, Layout, OpKind, Value, ValueDef};

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
        sizes: Vec<Dim>,
        requested: RefCell<Vec<Dim>>,
    }

    impl<'ctx> Kit<'ctx> {
        /// Kernel `name` for `target` with `n_inputs` read-only input buffers, `n_outputs`
        /// output buffers, one i64 parameter per distinct non-constant dim of `dims`, and a
        /// launch bound of `threads` threads per block; positioned in its body.
        pub(crate) fn new(ctx: &'ctx Context, name: &str, target: Target, n_inputs: usize, n_outputs: usize, dims: &[Dim], threads: u32) -> R<Kit<'ctx>> {
            let mut sizes: Vec<Dim> = Vec::new();
            for d in dims {
                if d.as_const().is_none() && !sizes.contains(d) {
                    sizes.push(d.clone());
                }
            }
            let mut params = vec![ParamKind::input(); n_inputs];
            params.extend(std::iter::repeat_n(ParamKind::output(), n_outputs));
            params.extend(std::iter::repeat_n(ParamKind::Size, sizes.len()));
            let kb = KernelBuilder::new(ctx, name, &params, target)?;
            // No `.maxntid`: with it, ptxas 12.9 trades registers for occupancy on these
            // kernels (capping the attention core at 80–128 registers) and spills; without
            // it every schedule here assembles spill-free. `threads` is kept for when the
            // tensor-core versions want the bound.
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
                .filter(|(i, d)| requested.contains(d) || kb.func.get_nth_param((self.n_buffers + i) as u32).is_some_and(|p| p.get_first_use().is_some()))
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
            let kit = Kit::new(ctx, name, target, n_inputs, n_outputs, dims, threads)?;
            build(&kit)?;
            let used = kit.used_sizes();
            let kit = if used.len() == kit.sizes.len() {
                kit
            } else {
                drop(kit);
                let kit = Kit::new(ctx, name, target, n_inputs, n_outputs, &used, threads)?;
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
            p.extend(self.sizes.iter().cloned().map(KernelParam::Size));
            p
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
            self.bld().param_int(self.n_buffers + pos)
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

        /// `&ptr[idx]` for elements of float dtype `dt`, as a plain (not `inbounds`) GEP: the
        /// result may lie outside the object (a pre-offset base that later indices bring back).
        pub(crate) fn gep_raw(&self, dt: DType, ptr: PointerValue<'ctx>, idx: IntValue<'ctx>) -> R<PointerValue<'ctx>> {
            let ty = self.float_type(dt)?;
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
            let ty = self.float_type(dt)?;
            self.math(|kb| kb.in_prologue(|kb| Ok(kb.b.build_alloca(ty, "")?)))
        }

        /// Runs `f` with the shared element evaluator ([`Eval`]) over `body`, whose
        /// parameter `i` is read from `params[i]`; the kernel's size parameters serve its
        /// dims. Kit methods must not be called inside `f` (the evaluator holds the builder).
        pub(crate) fn with_eval<T>(&self, body: &Function, params: Vec<Buf<'ctx>>, f: impl FnOnce(&mut Eval<'_, 'ctx>) -> R<T>) -> R<T> {
            let mut kb = self.kb.try_borrow_mut().map_err(|_| self.err("builder in use"))?;
            let mut sizes = SizeTable::fixed(self.sizes.clone(), self.n_buffers, true);
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
        let target = Target::parse(&plan.target).unwrap();
        let report = ptxas::assemble_with(&ptxas, &plan.ptx, &target).unwrap_or_else(|e| panic!("{}: {e}", plan.entry));
        let k = report.function(&plan.entry).unwrap_or_else(|| panic!("{report:?}"));
        assert!(!report.spills(), "{}: spills\n{report}", plan.entry);
        assert_eq!(k.stack_frame_bytes, 0, "{}: stack\n{report}", plan.entry);
        assert!(report.warnings.is_empty(), "{report}");
        assert!(!plan.ptx.contains("call."), "{}: a call in the PTX", plan.entry);
        Some(report.to_string())
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

    /// Every case at sm_80 and sm_90a: plan and ptxas resource line (no spills).
    #[test]
    fn ptxas_reports() {
        let cases: Vec<(&str, (KernelGraph, Kernel))> = vec![
            ("projection bf16 M=T (tiled)", projection(sym("T"), DType::BF16)),
            ("projection bf16 M=1 (small M)", projection(d(1), DType::BF16)),
            ("residual bf16 M=16 (small M)", residual(d(16))),
            ("residual bf16 M=T (tiled)", residual(sym("T"))),
            ("batched scores f32, two outputs (tiled)", batched_scores()),
            ("f16 N-contiguous M=4 (small M, thread per column)", n_contiguous()),
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
        let (g, k) = projection(sym("T"), DType::BF16);
        let plan = generate(&g, k, &Target::SM_90A).unwrap();
        assert_eq!(plan.entry, "k0_matmul");
        assert_eq!(plan.block, [256, 1, 1]);
        assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 64 });
        assert_eq!(plan.grid[1], GridDim { numerator: d(1536), denominator: 64 });
        assert_eq!(plan.grid[2], GridDim::fixed(1));
        assert_eq!(plan.shared_bytes, 0);
        assert_eq!(&plan.params[..4], &[KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Buffer(3)]);
        assert!(plan.params[4..].iter().all(|p| matches!(p, KernelParam::Size(_))), "{:?}", plan.params);
        assert!(plan.params.contains(&KernelParam::Size(sym("T"))));
        assert!(plan.ptx.contains(".entry k0_matmul("), "{}", plan.ptx);
        // The small-M path reads 16-byte vectors of x and w and reduces with shuffles.
        let (g, k) = projection(d(1), DType::BF16);
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.entry, "k0_matmul_small_m");
        assert_eq!(plan.grid[0], GridDim { numerator: d(1536), denominator: 4 });
        assert!(plan.ptx.contains("ld.global.nc.v4.b32"), "{}", plan.ptx);
        assert!(plan.ptx.contains("shfl.sync.bfly.b32"), "{}", plan.ptx);
        // Batched: grid.z is the batch.
        let (g, k) = batched_scores();
        let plan = generate(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.grid[2], GridDim { numerator: sym("B").scale(9), denominator: 1 });
    }

    #[test]
    fn schedule_heuristic() {
        assert_eq!(choose_schedule(&sym("T"), true), MatmulSchedule::Tiled(TiledSchedule::DEFAULT));
        assert_eq!(choose_schedule(&d(17), true), MatmulSchedule::Tiled(TiledSchedule::DEFAULT));
        assert_eq!(choose_schedule(&d(1), true), MatmulSchedule::SmallM(SmallMSchedule { rows: 1, lanes: 32, columns: 4 }));
        assert_eq!(choose_schedule(&d(16), false), MatmulSchedule::SmallM(SmallMSchedule { rows: 16, lanes: 1, columns: 128 }));
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

    /// The fused bodies the passes produce for a Llama layer generate and assemble, prefill
    /// (symbolic M) and decode (M = 1), with the staged epilogue where they need it.
    #[test]
    fn llama_layer_bodies() {
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in [
                ("qkv+rope M=T", qkv_rope(sym("T"), DType::BF16)),
                ("qkv+rope M=1", qkv_rope(d(1), DType::BF16)),
                ("gate/up swiglu M=T", gate_up(sym("T"), DType::BF16)),
                ("gate/up swiglu M=1", gate_up(d(1), DType::BF16)),
                ("o_proj through a view M=T", o_proj_view(sym("T"))),
                ("o_proj through a view M=1", o_proj_view(d(1))),
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
        let mut fb = FunctionBuilder::new(&Graph::new(), "bmm");
        let a = fb.param("a", ty(DType::F32, &[d(5), d(1000)]));
        let b = fb.param("b", ty(DType::F32, &[d(2), d(1000), d(17)]));
        let mm = fb.op1(OpKind::Matmul, &[a, b], vec![]).unwrap();
        let (g, k) = single_kernel(Family::Matmul, fb.finish(&[mm]).unwrap());
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
        for t in [1usize, 5, 70] {
            let posv = Tensor::new(DType::I32, &[t], (0..t).map(|i| (i * 3 + 1) as f64).collect()).unwrap();
            let ins = [random(DType::BF16, &[t, 24], 11), random(DType::BF16, &[128, 24], 12), posv];
            check(&format!("bf16 qkv+rope T={t}"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
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
                        assert_eq!(entry.ends_with("small_m"), constant, "{entry}");
                        check(&format!("bf16 qkv+rope({form})+kv_append decode={decode} T={t} ({entry})"), &g, k, gen, &ins, &bind(&[("T", t as i64)]));
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
        // The same at constant M (a batch-specialised decode step): the small-M kernel, K a
        // multiple of 8 for its 16-byte vectors in bf16, and a tail of columns.
        for m in [1i64, 3, 16] {
            let mut fb = FunctionBuilder::new(&Graph::new(), "mlp_m");
            let x = fb.param("x", ty(DType::BF16, &[d(m), d(64)]));
            let w = fb.param("w", ty(DType::BF16, &[d(2 * 37), d(64)]));
            let mm = fb.op1(OpKind::Matmul, &[x, w], vec![("transpose_b", Attr::Bool(true))]).unwrap();
            let g0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(0))), ("end", Attr::Dim(d(37)))]).unwrap();
            let u0 = fb.op1(OpKind::Slice, &[mm], vec![("axis", Attr::Int(-1)), ("start", Attr::Dim(d(37))), ("end", Attr::Dim(d(74)))]).unwrap();
            let o = fb.op1(OpKind::Swiglu, &[g0, u0], vec![]).unwrap();
            let (g, k) = single_kernel(Family::Matmul, fb.finish(&[o]).unwrap());
            assert_eq!(generate(&g, k, &Target::SM_80).unwrap().entry, "k0_matmul_small_m");
            let ins = [random(DType::BF16, &[m as usize, 64], 25), random(DType::BF16, &[74, 64], 26)];
            check(&format!("bf16 gate/up swiglu small-M M={m}"), &g, k, gen, &ins, &bind(&[]));
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
    fn emulated_llama_bodies() {
        use super::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_90A);
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
            for s in [MatmulSchedule::Tiled(TiledSchedule::DEFAULT), MatmulSchedule::SmallM(SmallMSchedule { rows: 2, lanes: 32, columns: 4 })] {
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
/// CTA barrier and for each warp (shuffles exchange values through per-warp slots). This
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
    }

    struct Cta {
        barrier: Barrier,
        warps: Vec<Warp>,
    }

    struct ThreadCtx {
        tid: u32,
        ntid: u32,
        ctaid: [u32; 3],
        nctaid: [u32; 3],
        cta: Arc<Cta>,
    }

    thread_local! {
        static CTX: RefCell<Option<ThreadCtx>> = const { RefCell::new(None) };
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

    /// f32 → bf16 bits, round to nearest even (NaN stays NaN).
    fn f32_to_bf16(x: f32) -> u16 {
        if x.is_nan() {
            return 0x7fc0;
        }
        let b = x.to_bits();
        let round = 0x7fff + ((b >> 16) & 1);
        (b.wrapping_add(round) >> 16) as u16
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
        ];
        let mut text = ir.replace("ptx_kernel ", "").replace("addrspace(1)", "").replace("addrspace(3)", "").replace("addrspacecast", "bitcast");
        for (from, to) in renames {
            text = text.replace(&format!("@{from}("), &format!("@{to}("));
        }
        let mut out = String::new();
        let mut tmp = 0;
        for line in text.lines() {
            let t = line.trim_start();
            let indent = &line[..line.len() - t.len()];
            if t.starts_with("target triple") || t.starts_with("target datalayout") {
                continue;
            }
            if t.starts_with("declare") && t.contains("@emu_") {
                // Drop the intrinsic's attributes (`memory(none)` would allow merging calls).
                let cut = t.rfind(')').map_or(t.len(), |i| i + 1);
                out.push_str(&t[..cut]);
                out.push('\n');
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
            assert!(!t.contains(" half ") && !t.contains(" to half"), "the emulator does not convert f16: {t}");
            out.push_str(line);
            out.push('\n');
        }
        out.push_str("declare i16 @emu_f2bf(float)\ndeclare float @emu_bf2f(i16)\n");
        out.push_str("define void @emu_entry(ptr %args) {\n");
        let mut call = Vec::new();
        for (i, p) in params.iter().enumerate() {
            let ty = match p {
                KernelParam::Buffer(_) => "ptr",
                KernelParam::Size(_) => "i64",
            };
            out.push_str(&format!("  %p{i} = getelementptr i64, ptr %args, i64 {i}\n  %a{i} = load {ty}, ptr %p{i}\n"));
            call.push(format!("{ty} %a{i}"));
        }
        out.push_str(&format!("  call void @{entry}({})\n  ret void\n}}\n", call.join(", ")));
        out
    }

    /// Runs `plan` (whose `ptx` holds the kernel's IR) on the host over `bufs` (every
    /// kernel buffer's bytes, inputs then outputs) with the symbols of `bindings`.
    fn run(plan: &LaunchPlan, bindings: &Bindings, bufs: &mut [Vec<u8>]) {
        LlvmTarget::initialize_native(&InitializationConfig::default()).expect("a native LLVM target");
        let ir = host_ir(&plan.ptx, &plan.entry, &plan.params);
        if let Some(dir) = std::env::var_os("SINTER_EMU_DUMP") {
            let _ = std::fs::write(std::path::Path::new(&dir).join(format!("{}_{}.ll", plan.entry, ir.len())), &ir);
        }
        let ctx = Context::create();
        let module = ctx
            .create_module_from_ir(MemoryBuffer::create_from_memory_range_copy(ir.as_bytes(), "emu"))
            .unwrap_or_else(|e| panic!("{}: the host IR does not parse: {e}\n{ir}", plan.entry));
        let ee = module.create_jit_execution_engine(OptimizationLevel::None).expect("MCJIT");
        let fns: [(&str, usize); 16] = [
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
        ];
        for (name, addr) in fns {
            if let Some(f) = module.get_function(name) {
                ee.add_global_mapping(&f, addr);
            }
        }
        let mut dynamic = vec![0u8; plan.shared_bytes as usize + 16];
        if let Some(g) = module.get_global("smem_dyn") {
            let addr = (dynamic.as_mut_ptr() as usize).div_ceil(16) * 16;
            ee.add_global_mapping(&g, addr);
        }
        // SAFETY: `emu_entry` has this signature (built just above).
        let entry = unsafe { ee.get_function::<unsafe extern "C" fn(*const u64)>("emu_entry") }.expect("emu_entry");
        let f = unsafe { entry.as_raw() };
        let args: Vec<u64> = plan
            .params
            .iter()
            .map(|p| match p {
                KernelParam::Buffer(i) => bufs[*i].as_mut_ptr() as u64,
                KernelParam::Size(d) => d.eval(bindings).expect("a bound size") as u64,
            })
            .collect();
        let grid: Vec<u32> = plan.grid.iter().map(|g| g.eval(bindings).expect("a bound grid")).collect();
        let threads = plan.block[0];
        let args_addr = args.as_ptr() as usize;
        // One OS thread per kernel thread, reused for every CTA in turn: a barrier of all
        // threads separates CTAs (their shared memory is one global).
        let cta = Arc::new(Cta {
            barrier: Barrier::new(threads as usize),
            warps: (0..threads.div_ceil(32)).map(|_| Warp { barrier: Barrier::new(32), slots: std::array::from_fn(|_| AtomicU32::new(0)) }).collect(),
        });
        let (gx, gy, gz) = (grid[0], grid[1], grid[2]);
        let ctas: Vec<[u32; 3]> = (0..gz).flat_map(|z| (0..gy).flat_map(move |y| (0..gx).map(move |x| [x, y, z]))).collect();
        std::thread::scope(|s| {
            for tid in 0..threads {
                let cta = cta.clone();
                let nctaid = [grid[0], grid[1], grid[2]];
                let ctas = &ctas;
                std::thread::Builder::new()
                    .stack_size(8 << 20)
                    .spawn_scoped(s, move || {
                        for &ctaid in ctas {
                            CTX.with(|c| *c.borrow_mut() = Some(ThreadCtx { tid, ntid: threads, ctaid, nctaid, cta: cta.clone() }));
                            // SAFETY: the kernel reads the argument slots and the buffers they
                            // point to, which outlive the scope; its own bounds checks are
                            // what this tests.
                            unsafe { f(args_addr as *const u64) };
                            cta.barrier.wait();
                        }
                        CTX.with(|c| *c.borrow_mut() = None);
                    })
                    .expect("a thread");
            }
        });
        drop(dynamic);
    }

    /// Bytes past each output's extent, filled with a canary and checked after the run.
    const GUARD: usize = 256;

    fn to_bytes(t: &Tensor) -> Vec<u8> {
        let mut v = Vec::new();
        for &x in t.data() {
            match t.dtype() {
                DType::BF16 => v.extend(f32_to_bf16(x as f32).to_le_bytes()),
                DType::F32 => v.extend((x as f32).to_le_bytes()),
                DType::I32 => v.extend((x as i32).to_le_bytes()),
                DType::I64 => v.extend((x as i64).to_le_bytes()),
                DType::Bool => v.push(u8::from(x != 0.0)),
                DType::F16 => panic!("the emulator does not convert f16"),
            }
        }
        v.extend(std::iter::repeat_n(0xA5, GUARD));
        v
    }

    fn from_bytes(dt: DType, b: &[u8], n: usize) -> Vec<f64> {
        (0..n)
            .map(|i| match dt {
                DType::BF16 => f64::from(emu_bf2f(u16::from_le_bytes([b[2 * i], b[2 * i + 1]]))),
                DType::F32 => f64::from(f32::from_le_bytes([b[4 * i], b[4 * i + 1], b[4 * i + 2], b[4 * i + 3]])),
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
                DType::BF16 => (1.6e-2, 1e-2 * maxref),
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
