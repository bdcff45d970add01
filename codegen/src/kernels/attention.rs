//! The attention families: prefill attention ([`Family::Attention`], [`generate_prefill`])
//! and decode attention over a paged KV cache ([`Family::PagedAttention`],
//! [`generate_paged`]): FlashAttention-2 on CUDA cores, correct for every shape.
//!
//! An fp8 attention (q, k, v all `dequantize_fp8` of `f8e4m3` kernel inputs, issue #8) has
//! one kernel, the `wgmma` one on sm_90a ([`super::attention_tc`], "fp8"); elsewhere it is
//! refused naming f8e4m3.
//!
//! [`generate_prefill`] hands bf16/f16 prefill attention whose head dims are multiples of 16
//! and whose q/k/v rows are contiguous and 16-byte aligned to the tensor-core kernel of
//! [`super::attention_tc`] (the same algorithm on `mma.sync`, `cp.async` double buffered);
//! what that kernel does not take (f32, other head dims or layouts, an additive mask beside head
//! dims over 128, a shared-memory need the target cannot meet) runs on the CUDA-core core
//! below. Both compute the same function, with the semantics below.
//!
//! # Algorithm (CUDA cores)
//! Both are FlashAttention-2 (Dao 2023, arXiv 2307.08691, Algorithm 1) with one shared core:
//! a CTA owns a tile of `block_q` query rows (`warps` warps × `rows_per_warp` rows each) and
//! walks the keys in tiles of [`BLOCK_KV`] = 32. Per key tile, all threads stage K and V in
//! shared memory (in the input dtype, rows padded to keep 16-byte accesses conflict-free);
//! lane `j` of each warp computes the scores of key `j` against the warp's rows
//! (`s = scale·q·k + mask` in f32, Q read from shared memory as a broadcast), then per row the
//! warp takes the tile maximum and the sum of `p = exp(s − m_new)` with `shfl.sync.bfly`
//! butterflies, rescales its running sum `l` and its accumulator by `exp(m_old − m_new)`,
//! writes `p` to shared memory and accumulates `P·V` (lane `d` owns output dims `d, d+32, …`).
//! O is written once, as `acc / l` rounded to the output dtype.
//!
//! # Semantics (the interpreter's, `sinter_ir::interp`; DESIGN.md "Numerical conventions")
//! - Causal masks are aligned bottom-right: query `i` sees keys `j ≤ i + Skv − Sq`; key tiles
//!   wholly above the CTA's last visible key are never loaded.
//! - GQA: query head `h` reads KV head `h / (H/Hkv)`; K/V are never repeated in memory.
//! - A row with no visible key, or whose visible scores are all −inf, gives exactly 0; a NaN
//!   score makes its row NaN (the maxima are NaN-propagating `max.NaN.f32`); a +inf score
//!   gives NaN (inf − inf) as the reference does.
//! - Keys hidden by the causal mask or past the sequence are never read (their V rows are not
//!   multiplied by 0, so NaN there cannot leak), and — as in the reference's 16-key tiles —
//!   while every score so far is −inf a 16-key half-tile is skipped rather than multiplied.
//!   (The tensor-core kernel multiplies whole tiles, and falls back to these exact products for
//!   a tile whose concerned V rows hold a non-finite value; see its module docs.)
//! - Statistics, scores and the accumulator are f32; `exp` is the device math library's
//!   precise `exp` (≤ 3 ulp) on CUDA cores, `ex2.approx.ftz` of base-2 scores on tensor cores
//!   (≤ 2 ulp; probabilities below 2⁻¹²⁶ of the row's largest flushed to 0, as are
//!   rescaling factors for a maximum that grows by more than 126 in log2 units); the output
//!   is rounded once.
//!
//! # Paged decode
//! `paged_attention(q [B, H, T, D], k_pages [P, S, Hkv, D], v_pages, block_table [B, M] i32,
//! seq_lens [B] i32)`: one CTA per (row tile, KV head, sequence), whose rows are the
//! `H/Hkv · T` query rows sharing that KV head (so each K/V byte is read once per CTA). Key
//! `j` of sequence `b` is row `j mod S` of page `block_table[b][j / S]` (PagedAttention, Kwon
//! et al. 2023, arXiv 2309.06180). The length is read from `seq_lens` in device memory, so one
//! compiled kernel (and one captured CUDA graph) serves every decode step; a length is clamped
//! to `[0, M·S]` and a page number to `[0, P)`, so a corrupt table cannot fault (the
//! interpreter reports those as errors). The node's `unified_max` (FlashDecoding++'s
//! unified-max softmax, an execution strategy) is taken by the split-KV kernel
//! ([`super::decode`]); this one ignores it and computes the same result with its online
//! softmax.
//!
//! # Bodies
//! One `attention` / `paged_attention` node whose operands are kernel inputs, possibly through
//! views (`reshape` of a contiguous buffer, `slice` — the passes reshape `[T, H, D]` rows into
//! `[1, T, H, D]` and slice one layer's block table out of all layers'), and whose result is
//! the kernel's one output, possibly through `reshape`s into a contiguous buffer. With
//! `lse=true` the node's second result, each row's log-sum-exp (f32, natural log: `m + ln l`
//! of the online softmax, −inf for a row that saw no finite score), is a second output where
//! the body outputs it (FlashInfer's cascade inference, Ye et al. 2024, merges such partial
//! states with `attention_merge`, [`super::merge`]); every generator of both families writes
//! it, from the lane or thread that holds the row's final statistics.
//!
//! # Schedules
//! [`AttentionSchedule`] (warps, rows per warp) is a parameter; [`choose_prefill_schedule`] and
//! [`choose_paged_schedule`] pick the largest query tile that fits 48 KiB of static shared
//! memory and a register budget ([`generate_prefill_with`] takes one). The tensor-core
//! kernel's [`TcSchedule`] is picked by [`super::attention_tc::choose_tc_schedule`]
//! ([`generate_prefill_tc_with`] takes one).

use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Dim, Family, Function, GridDim, Kernel, KernelData, KernelGraph, LaunchPlan, OpKind};

use super::attention_tc::{self, TcSchedule, WgSchedule};
use super::matmul::Fp8Scale;
use super::matmul::kit::{broadcast_strides, buffer_infos, dims_of, input_view, output_strides, BufInfo, Kit, SharedKind, View, R};
use super::KernelCtx;
use crate::target::Target;
use crate::CodegenError;

/// Keys per tile: one per lane of a warp.
pub const BLOCK_KV: u32 = 32;

/// The largest head dimension (of Q/K and of V) the CUDA-core kernels accept.
pub const MAX_HEAD_DIM: u32 = 256;

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
        Smem::new(self, d, dv, dt).total
    }

    fn check(&self) -> Result<(), String> {
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
struct Smem {
    /// Elements per 16-byte chunk of a Q/K row (1 when D is not a multiple).
    ck: u32,
    /// Same for V rows.
    cv: u32,
    /// Q/K row stride, elements (D + padding).
    ldk: u32,
    /// V row stride, elements.
    ldv: u32,
    q: u32,
    k: u32,
    v: u32,
    p: u32,
    total: u32,
}

impl Smem {
    fn new(s: &AttentionSchedule, d: u32, dv: u32, dt: DType) -> Smem {
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
        Smem { ck, cv, ldk, ldv, q, k, v, p, total }
    }
}

/// The error for a kernel these families cannot generate.
pub(super) fn unsupported(kernel: &str, family: Family, reason: impl Into<String>) -> CodegenError {
    CodegenError::Unsupported { kernel: format!("{kernel} ({family:?})"), message: reason.into() }
}

pub(super) fn bad(kernel: &str, family: Family, reason: impl Into<String>) -> CodegenError {
    CodegenError::BadKernel { kernel: format!("{kernel} ({family:?})"), message: reason.into() }
}

/// A 4-d tensor as the kernel reads or writes it: element `(b, h, s, d)` is element
/// `offset + b·st[0] + h·st[1] + s·st[2] + d·st[3]` of buffer `buffer` (a view of the buffer
/// when the body reshapes or slices it), its dtype and the buffer's alignment.
#[derive(Clone, Debug)]
pub(super) struct T4 {
    pub(super) buffer: usize,
    pub(super) dtype: DType,
    pub(super) offset: Dim,
    /// Strides of the b, h, s, d axes.
    pub(super) st: [Dim; 4],
    pub(super) align: u32,
}

impl T4 {
    /// `view`'s strides taken in the order `axes` (b, h, s, d axis of the value).
    fn from_view(view: &View, dtype: DType, axes: [usize; 4]) -> T4 {
        T4 { buffer: view.param, dtype, offset: view.offset.clone(), st: axes.map(|a| view.strides[a].clone()), align: view.align }
    }

    /// Whether chunks of `c` elements along d can be single aligned vector accesses.
    pub(super) fn vector_ok(&self, c: u32) -> bool {
        let c64 = i64::from(c);
        c == 1
            || (self.st[3].as_const() == Some(1)
                && self.st[..3].iter().all(|s| s.div_exact(c64).is_some())
                && self.offset.div_exact(c64).is_some()
                && self.align >= c * self.dtype.size_bytes() as u32)
    }

    pub(super) fn dims(&self) -> impl Iterator<Item = &Dim> {
        self.st.iter().chain(std::iter::once(&self.offset))
    }
}

/// The checked body of an attention kernel: one `op` node, whose operands are kernel inputs
/// through views (`reshape`, `slice`) and whose result is the kernel's one output through
/// `reshape`s; returns the node and each operand's view.
fn single_node<'a>(kd: &'a KernelData, bufs: &[BufInfo], kernel: &str, family: Family, op: OpKind) -> R<(&'a Function, &'a sinter_ir::NodeData, Vec<View>)> {
    let body = &kd.body;
    if kd.family != family {
        return Err(bad(kernel, family, format!("the kernel's family is {:?}", kd.family)));
    }
    // An fp8 attention's `dequantize_fp8`s (and constant scales) stand aside as views do: the
    // kernel reads their fp8 operands and scales ([`fp8_operands`]).
    let aside = |k: OpKind| matches!(k, OpKind::Reshape | OpKind::Slice) || (op == OpKind::Attention && matches!(k, OpKind::DequantizeFp8 | OpKind::Constant));
    let mut main = body.nodes.values().filter(|nd| !aside(nd.op.kind));
    let nd = match (main.next(), main.next()) {
        (Some(nd), None) if nd.op.kind == op => nd,
        _ => {
            return Err(unsupported(kernel, family, format!("the body must be one `{}` node with views (reshape, slice) around it; no fused prologue/epilogue yet", op.name())))
        }
    };
    let arity_ok = match op {
        OpKind::Attention => (3..=4).contains(&nd.inputs.len()),
        _ => nd.inputs.len() == 5,
    };
    let results = if nd.op.bool("lse") == Some(true) { 2 } else { 1 };
    if !arity_ok || nd.results.len() != results {
        return Err(bad(kernel, family, format!("`{}` with {} operands and {} results", op.name(), nd.inputs.len(), nd.results.len())));
    }
    // Every output is a result through reshapes; O is one of them (lse, when asked, may be
    // dead).
    let mapped: Vec<Option<usize>> = body.outputs.iter().map(|&o| nd.results.iter().position(|&r| output_strides_ok(body, o, r))).collect();
    if mapped.iter().any(Option::is_none) || output_of(body, nd.results[0]).is_none() || body.outputs.len() > results {
        return Err(unsupported(kernel, family, format!("the kernel's outputs must be the `{}` results (through reshapes)", op.name())));
    }
    // The view of an fp8 operand is its fp8 tensor's (`dequantize_fp8(x8, scale)`: x8's).
    let read = |v: sinter_ir::Value| match super::matmul::fp8_operand(body, v, bufs) {
        Some(Ok((x8, _))) if op == OpKind::Attention => x8,
        _ => v,
    };
    let views = nd.inputs.iter().map(|&v| input_view(body, read(v), bufs)).collect::<Result<Vec<_>, _>>().map_err(|e| unsupported(kernel, family, e))?;
    Ok((body, nd, views))
}

/// The scales of an fp8 attention (q, k, v all `dequantize_fp8(x8, scale)` of `f8e4m3`
/// kernel inputs, scales f32 kernel inputs or constants; `sinter_passes::contract::fp8_attention`
/// forms such kernels): `Ok(Some(..))`; `Ok(None)` when no operand is `dequantize_fp8` and the
/// body holds no f8e4m3 value; `Err` (the reason, naming f8e4m3) for any other fp8 body.
fn fp8_operands(body: &Function, nd: &sinter_ir::NodeData, bufs: &[BufInfo], views: &[View]) -> Result<Option<[Fp8Scale; 3]>, String> {
    let ops: Vec<_> = nd.inputs.iter().take(3).map(|&v| super::matmul::fp8_operand(body, v, bufs)).collect();
    if ops.iter().all(Option::is_none) {
        return match body.values.iter().find(|(_, v)| v.ty.dtype.is_fp8()) {
            Some((v, d)) => Err(crate::fp8_message(&format!("f8e4m3 value {} ({}) in an attention kernel", body.label(v), d.ty))),
            None => Ok(None),
        };
    }
    let mut scales = Vec::new();
    for (i, o) in ops.into_iter().enumerate() {
        let name = ["q", "k", "v"][i];
        match o {
            Some(Ok((_, sc))) if bufs.get(views[i].param).is_some_and(|b| b.dtype == DType::F8E4M3) => scales.push(sc),
            Some(Ok(_)) => return Err(crate::fp8_message(&format!("f8e4m3 attention: `dequantize_fp8` of {name} does not read an f8e4m3 kernel input"))),
            Some(Err(e)) => return Err(crate::fp8_message(&format!("f8e4m3 attention: {e}"))),
            None => return Err(crate::fp8_message(&format!("an attention whose {name} is not `dequantize_fp8` of f8e4m3 while another operand is"))),
        }
    }
    if nd.inputs.len() > 3 {
        return Err(crate::fp8_message("f8e4m3 attention with an additive mask"));
    }
    Ok(Some([scales[0], scales[1], scales[2]]))
}

/// Whether body output `out` is `result` through `reshape`s.
fn output_strides_ok(body: &Function, out: sinter_ir::Value, result: sinter_ir::Value) -> bool {
    let mut cur = out;
    loop {
        if cur == result {
            return true;
        }
        match body.values.get(cur).map(|d| d.def) {
            Some(sinter_ir::ValueDef::Result(n, _)) if body.nodes[n].op.kind == OpKind::Reshape => cur = body.nodes[n].inputs[0],
            _ => return false,
        }
    }
}

/// The index of the body output that is `result` (through `reshape`s), if any.
fn output_of(body: &Function, result: sinter_ir::Value) -> Option<usize> {
    body.outputs.iter().position(|&o| output_strides_ok(body, o, result))
}

/// The output of a single-node attention body as a [`T4`] over the node's result (`axes`
/// order): the output buffer, written at the result's row-major positions when the body
/// reshapes the result.
fn output_t4(body: &Function, nd: &sinter_ir::NodeData, bufs: &[BufInfo], n_inputs: usize, axes: [usize; 4], kernel: &str, family: Family) -> R<T4> {
    let i = output_of(body, nd.results[0]).ok_or_else(|| bad(kernel, family, "O is not an output"))?;
    let buf = bufs.get(n_inputs + i).ok_or_else(|| bad(kernel, family, "no output buffer"))?;
    let strides = output_strides(body, body.outputs[i], nd.results[0], buf).map_err(|e| unsupported(kernel, family, e))?;
    if strides.len() != 4 {
        return Err(bad(kernel, family, "the result must have rank 4"));
    }
    let view = View { param: n_inputs + i, offset: Dim::constant(0), strides, align: buf.align };
    Ok(T4::from_view(&view, buf.dtype, axes))
}

/// The log-sum-exp output of a single-node attention body (`lse=true`, the node's second
/// result, f32 `[B, H, S]` or `[B, S, H]`), as a [`T4`] over (b, h, s, —) with a zero d
/// stride, so that a row's offset is computed as its O row's is; `None` when the body does
/// not output it.
fn lse_t4(body: &Function, nd: &sinter_ir::NodeData, bufs: &[BufInfo], n_inputs: usize, axes: [usize; 4], kernel: &str, family: Family) -> R<Option<T4>> {
    let Some(&r) = nd.results.get(1) else { return Ok(None) };
    let Some(i) = output_of(body, r) else { return Ok(None) };
    let buf = bufs.get(n_inputs + i).ok_or_else(|| bad(kernel, family, "no lse buffer"))?;
    if buf.dtype != DType::F32 {
        return Err(bad(kernel, family, format!("the lse buffer is {}, not f32", buf.dtype)));
    }
    let mut strides = output_strides(body, body.outputs[i], r, buf).map_err(|e| unsupported(kernel, family, e))?;
    if strides.len() != 3 {
        return Err(bad(kernel, family, "the lse result must have rank 3"));
    }
    // The (b, h, s) axes of a [B, H, S] / [B, S, H] tensor are those of the 4-d one.
    strides.push(Dim::constant(0));
    let view = View { param: n_inputs + i, offset: Dim::constant(0), strides, align: buf.align };
    Ok(Some(T4::from_view(&view, DType::F32, axes)))
}

fn const_dim(d: &Dim, what: &str, kernel: &str, family: Family) -> R<u32> {
    match d.as_const() {
        Some(v) if (1..=i64::from(MAX_HEAD_DIM)).contains(&v) => Ok(v as u32),
        _ => Err(unsupported(kernel, family, format!("{what} must be a constant in 1..={MAX_HEAD_DIM}, got {d}"))),
    }
}

/// What the core needs to know, whichever family.
struct Core {
    dtype: DType,
    d: u32,
    dv: u32,
    scale: f32,
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
    /// The key tiles cover `0..kv_end` (≤ kv_len; the causal bound of the CTA's last row).
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
    let limits: Vec<IntValue> = (0..rpw).map(|rr| rows(kit, row_of(kit, rr)?).map(|i| i.limit)).collect::<R<_>>()?;
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
    kit.for_range(kit.i64c(0), keys.kv_end, kit.i64c(i64::from(BLOCK_KV)), |k, j0| {
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
        let lo_half = k.icmp(IntPredicate::ULT, lane, k.i32c(16))?;
        let mut bounds = Vec::with_capacity(rpw as usize);
        for rr in 0..rpw as usize {
            let limit = limits[rr];
            let visible = k.icmp(IntPredicate::SLT, j, limit)?;
            let mut sc = k.fmul(k.get_f(s[rr])?, scale)?;
            if let Some((mbuf, mdt, msj)) = &keys.mask {
                let moff = rows(k, row_of(k, rr as u32)?)?.mask_off.ok_or_else(|| k.err("mask without offsets"))?;
                let idx = k.add(moff, k.mul(k.zext64(j)?, k.dim(msj)?)?)?;
                let mv = k.guarded_load(visible, *mdt, k.buf(*mbuf)?, idx, 1, true, k.i64c(0))?;
                sc = k.fadd(sc, mv[0])?;
            }
            let sc = k.select_f(visible, sc, ninf)?;
            // Max over each 16-key half, then over the tile.
            let half = k.warp_reduce(sc, &[8, 4, 2, 1], |k, a, b| k.max_nan(a, b))?;
            let other = k.shfl_xor(half, 16)?;
            let tile_max = k.max_nan(half, other)?;
            let first_half = k.select_f(lo_half, half, other)?;
            let m_old = k.get_f(m[rr])?;
            let m_new = k.max_nan(m_old, tile_max)?;
            let none_yet = k.fcmp(FloatPredicate::OEQ, m_new, ninf)?;
            let m_use = k.select_f(none_yet, zero, m_new)?;
            let alpha = k.exp(k.fsub(m_old, m_use)?)?;
            let p = k.exp(k.fsub(sc, m_use)?)?;
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
            // Keys this row multiplies: [lo, hi) of the tile.
            let old_none = k.fcmp(FloatPredicate::OEQ, m_old, ninf)?;
            let first_none = k.fcmp(FloatPredicate::OEQ, first_half, ninf)?;
            let lo = k.select_int(k.and(old_none, first_none)?, k.i32c(16), k.i32c(0))?;
            let n_vis = k.smin(k.smax(k.sub(limit, j0_32)?, k.i32c(0))?, k.i32c(BLOCK_KV as i32))?;
            let hi = k.select_int(none_yet, k.i32c(0), n_vis)?;
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

    // 4. O = acc / l (0 for a row that never saw a finite score), one rounding, one write;
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
            let o = kit.select_f(empty, zero, kit.fdiv(kit.get_f(*a)?, lf)?)?;
            let inside = kit.and(info.valid, kit.icmp(IntPredicate::SLT, dcol, kit.i32c(c.dv as i32))?)?;
            kit.if_then(inside, |k| {
                let idx = k.add(info.o_off, k.mul(k.zext64(dcol)?, o_sd)?)?;
                k.store_vec(dt, o_ptr, idx, &[o])
            })?;
        }
    }
    Ok(())
}

/// Decides static or dynamic shared memory for `smem` bytes on `target`.
pub(super) fn shared_kind(bytes: u32, target: &Target, kernel: &str, family: Family) -> R<SharedKind> {
    if bytes <= target.default_shared_memory_per_block() {
        Ok(SharedKind::Static)
    } else if bytes <= target.max_shared_memory_per_block() {
        Ok(SharedKind::Dynamic(bytes))
    } else {
        Err(unsupported(kernel, family, format!("{bytes} bytes of shared memory exceed {target}'s limit")))
    }
}

pub(super) fn dynamic_bytes(k: SharedKind) -> u32 {
    match k {
        SharedKind::Static => 0,
        SharedKind::Dynamic(b) => b,
    }
}

// ---- prefill ---------------------------------------------------------------------------

/// Facts of a prefill attention kernel.
pub(super) struct Prefill {
    pub(super) name: String,
    pub(super) n_inputs: usize,
    pub(super) n_buffers: usize,
    pub(super) dtype: DType,
    pub(super) d: u32,
    pub(super) dv: u32,
    pub(super) scale: f64,
    pub(super) causal: bool,
    pub(super) heads: i64,
    pub(super) kv_heads: i64,
    pub(super) batch: Dim,
    pub(super) sq: Dim,
    pub(super) skv: Dim,
    pub(super) q: T4,
    pub(super) k: T4,
    pub(super) v: T4,
    pub(super) out: T4,
    /// The rows' log-sum-exp output (`lse=true` and the kernel writes it).
    pub(super) lse: Option<T4>,
    pub(super) mask: Option<Mask>,
    /// An fp8 attention (issue #8): q, k and v are `dequantize_fp8` of `f8e4m3` kernel inputs
    /// (the [`T4`]s `q`, `k`, `v` describe the fp8 buffers, one byte an element), with these
    /// per-tensor scales (sq, sk, sv); `dtype` is the dequantised (and output) dtype. Only
    /// the `wgmma` kernel takes it ([`super::attention_tc`], "fp8").
    pub(super) fp8: Option<[Fp8Scale; 3]>,
}

/// An additive mask: buffer, dtype, offset and strides over [B, H, Sq, Skv] (0 where it
/// broadcasts).
pub(super) struct Mask {
    pub(super) buffer: usize,
    pub(super) dtype: DType,
    pub(super) offset: Dim,
    pub(super) st: Vec<Dim>,
}

impl Prefill {
    /// The launch plan of a prefill attention kernel built as `entry` (its PTX and
    /// parameters): grid `(⌈Sq / block_q⌉, H, B)` — a CTA per Q tile, head and sequence —,
    /// block `(threads, 1, 1)`, the dynamic shared memory of `shared`.
    pub(super) fn launch_plan(&self, target: &Target, (entry, ptx, params): (String, String, Vec<sinter_ir::KernelParam>), block_q: u32, threads: u32, shared: SharedKind) -> LaunchPlan {
        LaunchPlan {
            entry,
            ptx,
            target: *target,
            grid: [
                GridDim { numerator: self.sq.clone(), denominator: block_q },
                GridDim::fixed(self.heads as u32),
                GridDim { numerator: self.batch.clone(), denominator: 1 },
            ],
            block: [threads, 1, 1],
            shared_bytes: dynamic_bytes(shared),
            params,
        }
    }

    pub(super) fn analyse(graph: &KernelGraph, kernel: Kernel) -> R<Prefill> {
        let name = kernel.to_string();
        let fam = Family::Attention;
        let kd = KernelCtx::new(graph, kernel)?.data;
        let bufs = buffer_infos(graph, kd).map_err(|e| bad(&name, fam, e))?;
        let (body, nd, views) = single_node(kd, &bufs, &name, fam, OpKind::Attention)?;
        let op = &nd.op;
        let scale = op.float("scale").ok_or_else(|| bad(&name, fam, "attention without `scale`"))?;
        let causal = op.bool("causal").unwrap_or(false);
        let heads = op.int("heads").ok_or_else(|| bad(&name, fam, "attention without `heads`"))?;
        let kv_heads = op.int("kv_heads").ok_or_else(|| bad(&name, fam, "attention without `kv_heads`"))?;
        if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
            return Err(bad(&name, fam, format!("heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")));
        }
        let bshd = op.str("layout") == Some("bshd");
        let qt = body.ty(nd.inputs[0]);
        let dtype = qt.dtype;
        if !dtype.is_float() {
            return Err(unsupported(&name, fam, format!("q is {qt}: float dtypes only")));
        }
        // (b, h, s, d) axes of a tensor in the op's layout.
        let axes: [usize; 4] = if bshd { [0, 2, 1, 3] } else { [0, 1, 2, 3] };
        for (i, view) in views.iter().take(3).enumerate() {
            if view.strides.len() != 4 || body.ty(nd.inputs[i]).dtype != dtype {
                return Err(unsupported(&name, fam, "q, k and v must be rank-4 tensors of one dtype"));
            }
        }
        let fp8 = fp8_operands(body, nd, &bufs, &views).map_err(|e| unsupported(&name, fam, e))?;
        // The dtype q, k and v are read in: their fp8 bytes for an fp8 attention.
        let din = if fp8.is_some() { DType::F8E4M3 } else { dtype };
        let q = T4::from_view(&views[0], din, axes);
        let k = T4::from_view(&views[1], din, axes);
        let v = T4::from_view(&views[2], din, axes);
        let out = output_t4(body, nd, &bufs, kd.inputs.len(), axes, &name, fam)?;
        let lse = lse_t4(body, nd, &bufs, kd.inputs.len(), axes, &name, fam)?;
        let shape = |v: sinter_ir::Value, axis: usize| body.ty(v).shape[axes[axis]].clone();
        let d = const_dim(&shape(nd.inputs[0], 3), "the head dim of q and k", &name, fam)?;
        let dv = const_dim(&shape(nd.inputs[2], 3), "the head dim of v", &name, fam)?;
        for (t, want) in [(&k, din), (&v, din), (&out, dtype)] {
            if t.dtype != want {
                return Err(unsupported(&name, fam, "q, k, v and the output must share a dtype"));
            }
        }
        let mask = match views.get(3) {
            Some(mv) => {
                let mt = body.ty(nd.inputs[3]);
                if !mt.dtype.is_float() || mt.rank() > 4 {
                    return Err(unsupported(&name, fam, format!("the mask is {mt}: a float tensor broadcasting to [B, H, Sq, Skv] expected")));
                }
                Some(Mask { buffer: mv.param, dtype: mt.dtype, offset: mv.offset.clone(), st: broadcast_strides(&mt.shape, &mv.strides, 4) })
            }
            None => None,
        };
        Ok(Prefill {
            name,
            n_inputs: kd.inputs.len(),
            n_buffers: kd.inputs.len() + kd.outputs.len(),
            dtype,
            d,
            dv,
            scale,
            causal,
            heads,
            kv_heads,
            batch: shape(nd.inputs[0], 0),
            sq: shape(nd.inputs[0], 2),
            skv: shape(nd.inputs[1], 2),
            q,
            k,
            v,
            out,
            lse,
            mask,
            fp8,
        })
    }

    pub(super) fn dims(&self) -> Vec<Dim> {
        let mut v = vec![self.batch.clone(), self.sq.clone(), self.skv.clone()];
        for t in [&self.q, &self.k, &self.v, &self.out].into_iter().chain(&self.lse) {
            v.extend(t.dims().cloned());
        }
        if let Some(m) = &self.mask {
            v.extend(m.st.iter().cloned());
            v.push(m.offset.clone());
        }
        dims_of(&v)
    }
}

/// Generates prefill attention kernel `kernel` of `graph` ([`Family::Attention`], one
/// `attention` node of kernel inputs q, k, v and an optional additive mask, through views;
/// see the module docs) with the schedule [`choose_prefill_schedule`] picks.
///
/// Shapes: q `[B, H, Sq, D]`, k `[B, Hkv, Skv, D]`, v `[B, Hkv, Skv, Dv]` (`bshd`: `[B, S, H,
/// D]`; any strides), mask broadcasting to `[B, H, Sq, Skv]`; D and Dv constants ≤ 256, B,
/// Sq, Skv any (symbolic dims are [`sinter_ir::KernelParam::Size`] parameters); bf16, f16 or
/// f32. Grid `(⌈Sq/block_q⌉, H, B)`, the longest causal tiles first; block `32·warps`.
///
/// # Errors
/// [`CodegenError::Unsupported`] / [`CodegenError::BadKernel`] for other bodies or shapes;
/// LLVM and target errors otherwise.
pub fn generate_prefill(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let p = Prefill::analyse(graph, kernel)?;
    if p.fp8.is_some() {
        // The fp8 attention has one kernel: wgmma on sm_90a (it says why not elsewhere).
        return attention_tc::plan_wg(&p, target, &attention_tc::choose_fp8_schedule());
    }
    if attention_tc::wg_eligible(&p, target).is_ok() {
        match attention_tc::plan_wg(&p, target, &attention_tc::choose_wg_schedule(p.d, p.dv)) {
            Err(CodegenError::Unsupported { .. }) => {}
            done => return done,
        }
    }
    if attention_tc::eligible(&p).is_ok() {
        match attention_tc::plan(&p, target, &tc_default(&p, target)) {
            // Only a shared-memory budget the target cannot give sends it back to CUDA cores.
            Err(CodegenError::Unsupported { .. }) => {}
            done => return done,
        }
    }
    let s = choose_prefill_schedule(p.d, p.dv, p.dtype);
    prefill_plan(&p, target, &s)
}

/// The tensor-core schedule [`generate_prefill`] tries first for `p`.
fn tc_default(p: &Prefill, target: &Target) -> TcSchedule {
    let mut sched = attention_tc::choose_tc_schedule(p.d, p.dv, p.mask.is_some(), p.causal, target);
    if p.lse.is_some() && sched.block_kv == 48 {
        // The lse epilogue tips the 48-key tile over 255 registers (8 bytes spilled at
        // sm_90a, D 128, constant lengths), as causality does: 32-key tiles.
        sched.block_kv = 32;
    }
    sched
}

/// The schedule candidates of prefill attention `kernel` for autotuning
/// ([`crate::schedule_variants`]): [`generate_prefill`]'s first, then for a tensor-core kernel
/// the same CTA shape with 32-, 48- and 64-key tiles, each with its [`TcSchedule::name`] and a
/// closure that compiles it (a tile that makes ptxas spill loses on time). CUDA-core kernels
/// have no alternatives.
///
/// # Errors
/// As [`generate_prefill`], when the kernel cannot be analysed.
pub fn prefill_variants<'a>(graph: &'a KernelGraph, kernel: Kernel, target: &'a Target) -> Result<Vec<crate::Candidate<'a>>, CodegenError> {
    let p = std::rc::Rc::new(Prefill::analyse(graph, kernel)?);
    if p.fp8.is_some() {
        // fp8: the wgmma kernel's default (128-key tiles), then 64-key tiles and the
        // intra-warpgroup overlap; names end `e4m3`. None where the fp8 kernel does not
        // apply (it says why).
        attention_tc::fp8_applies(&p, target)?;
        let wd = attention_tc::choose_fp8_schedule();
        let first: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || generate_prefill(graph, kernel, target));
        let mut out: Vec<crate::Candidate<'a>> = vec![(format!("{} e4m3", wd.name()), first)];
        for alt in [WgSchedule { block_kv: 64, ..wd }, WgSchedule { overlap: true, ..wd }] {
            let p = p.clone();
            let build: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || attention_tc::plan_wg(&p, target, &alt));
            out.push((format!("{} e4m3", alt.name()), build));
        }
        return Ok(out);
    }
    if attention_tc::eligible(&p).is_err() {
        let build: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || generate_prefill(graph, kernel, target));
        return Ok(vec![("cuda-core".into(), build)]);
    }
    // The default is exactly `generate_prefill` (which falls back to CUDA cores where the
    // target's shared memory does not fit the tile); the alternatives other key tiles.
    let default = tc_default(&p, target);
    let first: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || generate_prefill(graph, kernel, target));
    let mut out: Vec<crate::Candidate<'a>> = Vec::new();
    if attention_tc::wg_eligible(&p, target).is_ok() {
        // sm_90a: the wgmma kernel first (the default), then the others: 128- and 64-key
        // tiles, the `+split` P·V, the intra-warpgroup overlap (`ov`), the warp-specialised
        // kernel (`ws`, TMA producer) and its ping-pong (`ws pp`), then the mma.sync kernel's.
        let wd = attention_tc::choose_wg_schedule(p.d, p.dv);
        out.push((wd.name(), first));
        let plain = WgSchedule { warpgroups: 2, block_kv: 128, pv_split: false, overlap: false, producer: false, pingpong: false };
        let ws = WgSchedule { producer: true, ..plain };
        let pp = WgSchedule { pingpong: true, ..ws };
        let alts = [
            plain,
            WgSchedule { pv_split: true, ..plain },
            WgSchedule { block_kv: 64, ..plain },
            WgSchedule { overlap: true, ..plain },
            WgSchedule { block_kv: 64, overlap: true, ..plain },
            ws,
            WgSchedule { block_kv: 64, ..ws },
            pp,
            WgSchedule { block_kv: 64, ..pp },
        ]
        .into_iter()
        .filter(|a| *a != wd);
        for sc in alts {
            let p = p.clone();
            let build: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || attention_tc::plan_wg(&p, target, &sc));
            out.push((sc.name(), build));
        }
        let p2 = p.clone();
        let build: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || attention_tc::plan(&p2, target, &default));
        out.push((default.name(), build));
    } else {
        out.push((default.name(), first));
    }
    let alts = [32, 48, 64].into_iter().map(|kv| TcSchedule { block_kv: kv, ..default }).filter(|a| *a != default);
    for sc in alts {
        let p = p.clone();
        let build: Box<dyn FnOnce() -> Result<LaunchPlan, CodegenError> + 'a> = Box::new(move || attention_tc::plan(&p, target, &sc));
        out.push((sc.name(), build));
    }
    Ok(out)
}

/// As [`generate_prefill`], on tensor cores with the schedule given
/// ([`attention_tc`]).
///
/// # Errors
/// As [`generate_prefill`], and [`CodegenError::Unsupported`] for a kernel the tensor-core
/// kernel does not take (f32, head dims not multiples of 16, rows not 16-byte aligned) or an
/// invalid schedule.
pub fn generate_prefill_tc_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &TcSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Prefill::analyse(graph, kernel)?;
    attention_tc::plan(&p, target, schedule)
}

/// As [`generate_prefill`], on Hopper tensor cores (`wgmma`, sm_90a) with the schedule given
/// ([`attention_tc`]).
///
/// # Errors
/// As [`generate_prefill`], and [`CodegenError::Unsupported`] for a kernel or target the
/// `wgmma` kernel does not take ([`attention_tc::wg_eligible`]) or an invalid schedule.
pub fn generate_prefill_wg_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &WgSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Prefill::analyse(graph, kernel)?;
    attention_tc::plan_wg(&p, target, schedule)
}

/// As [`generate_prefill`], on CUDA cores with the schedule given (for autotuning and tests).
///
/// # Errors
/// As [`generate_prefill`], and [`CodegenError::Unsupported`] for an invalid schedule.
pub fn generate_prefill_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &AttentionSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Prefill::analyse(graph, kernel)?;
    prefill_plan(&p, target, schedule)
}

fn prefill_plan(p: &Prefill, target: &Target, s: &AttentionSchedule) -> R<LaunchPlan> {
    let fam = Family::Attention;
    if p.fp8.is_some() {
        return Err(unsupported(&p.name, fam, crate::fp8_message("f8e4m3 attention: the CUDA-core kernel does not read f8e4m3")));
    }
    s.check().map_err(|e| unsupported(&p.name, fam, e))?;
    let smem = Smem::new(s, p.d, p.dv, p.dtype);
    let shared = shared_kind(smem.total, target, &p.name, fam)?;
    let ctx = Context::create();
    let entry = format!("{}_attention", p.name);
    let core = Core { dtype: p.dtype, d: p.d, dv: p.dv, scale: p.scale as f32, sched: *s, smem, shared, q: p.q.clone(), out: p.out.clone(), lse: p.lse.clone() };
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
        let limit = k.trunc32(limit)?;
        let mask_off = match (&p.mask, m_base) {
            (Some(m), Some(mb)) => Some(k.add(mb, k.mul(i, k.dim(&m.st[2])?)?)?),
            _ => None,
        };
        let lse_off = match lse_base {
            Some((lb, ls)) => Some(k.add(lb, k.mul(i, ls)?)?),
            None => None,
        };
        Ok(RowInfo { valid, q_off: k.add(q_base, k.mul(i, q_ss)?)?, o_off: k.add(o_base, k.mul(i, o_ss)?)?, limit, mask_off, lse_off })
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
    let keys = Keys {
        k: &p.k,
        v: &p.v,
        offsets: &offsets,
        kv_len: skv,
        kv_end,
        mask: p.mask.as_ref().map(|m| (m.buffer, m.dtype, m.st[3].clone())),
    };
    build_core(kit, c, &rows, &keys)
}

// ---- paged decode ----------------------------------------------------------------------

/// Facts of a paged attention kernel.
pub(super) struct Paged {
    pub(super) name: String,
    pub(super) n_inputs: usize,
    pub(super) n_buffers: usize,
    pub(super) dtype: DType,
    pub(super) d: u32,
    pub(super) scale: f64,
    pub(super) causal: bool,
    pub(super) heads: i64,
    pub(super) kv_heads: i64,
    pub(super) batch: Dim,
    /// Query rows per sequence and head (T).
    pub(super) t: Dim,
    pub(super) pages: Dim,
    pub(super) page_size: Dim,
    /// Columns of the block table (max pages per sequence).
    pub(super) max_pages: Dim,
    pub(super) q: T4,
    pub(super) out: T4,
    /// The rows' log-sum-exp output (`lse=true` and the kernel writes it).
    pub(super) lse: Option<T4>,
    /// Pages as T4 over (page, slot, kv head, d).
    pub(super) kp: T4,
    pub(super) vp: T4,
    /// Block table: buffer, offset, row stride, column stride.
    pub(super) table: (usize, Dim, Dim, Dim),
    /// Sequence lengths: buffer, offset, stride.
    pub(super) lens: (usize, Dim, Dim),
    /// The node's `unified_max` φ as f32 (FlashDecoding++'s unified maximum; `None`: the
    /// online softmax), see [`super::decode`].
    pub(super) unified_max: Option<f32>,
}

impl Paged {
    pub(super) fn analyse(graph: &KernelGraph, kernel: Kernel) -> R<Paged> {
        let name = kernel.to_string();
        let fam = Family::PagedAttention;
        let kd = KernelCtx::new(graph, kernel)?.data;
        let bufs = buffer_infos(graph, kd).map_err(|e| bad(&name, fam, e))?;
        let (body, nd, views) = single_node(kd, &bufs, &name, fam, OpKind::PagedAttention)?;
        let op = &nd.op;
        let scale = op.float("scale").ok_or_else(|| bad(&name, fam, "paged_attention without `scale`"))?;
        let causal = op.bool("causal").unwrap_or(true);
        let heads = op.int("heads").ok_or_else(|| bad(&name, fam, "paged_attention without `heads`"))?;
        let kv_heads = op.int("kv_heads").ok_or_else(|| bad(&name, fam, "paged_attention without `kv_heads`"))?;
        if heads <= 0 || kv_heads <= 0 || heads % kv_heads != 0 {
            return Err(bad(&name, fam, format!("heads ({heads}) must be a positive multiple of kv_heads ({kv_heads})")));
        }
        let unified_max = match op.float("unified_max") {
            Some(phi) if !(phi as f32).is_finite() => return Err(bad(&name, fam, format!("attribute `unified_max` must be a finite f32 number, got {phi:?}"))),
            phi => phi.map(|phi| phi as f32),
        };
        let ty = |i: usize| body.ty(nd.inputs[i]);
        let (qt, pt, tbt, lnt) = (ty(0), ty(1), ty(3), ty(4));
        let dtype = qt.dtype;
        if !dtype.is_float() || qt.rank() != 4 || pt.rank() != 4 || pt.dtype != dtype || ty(2) != pt {
            return Err(unsupported(&name, fam, format!("q and the pages must be rank-4 tensors of one float dtype, got {qt} and {pt}")));
        }
        if tbt.dtype != DType::I32 || tbt.rank() != 2 || lnt.dtype != DType::I32 || lnt.rank() != 1 {
            return Err(bad(&name, fam, format!("block_table must be i32[B, M] and seq_lens i32[B], got {tbt} and {lnt}")));
        }
        let ident = [0, 1, 2, 3];
        let q = T4::from_view(&views[0], dtype, ident);
        let kp = T4::from_view(&views[1], dtype, ident);
        let vp = T4::from_view(&views[2], dtype, ident);
        let out = output_t4(body, nd, &bufs, kd.inputs.len(), ident, &name, fam)?;
        let lse = lse_t4(body, nd, &bufs, kd.inputs.len(), ident, &name, fam)?;
        if out.dtype != dtype {
            return Err(unsupported(&name, fam, "the output must have q's dtype"));
        }
        let d = const_dim(&qt.shape[3], "the head dim", &name, fam)?;
        let (tv, lv) = (&views[3], &views[4]);
        Ok(Paged {
            name,
            n_inputs: kd.inputs.len(),
            n_buffers: kd.inputs.len() + kd.outputs.len(),
            dtype,
            d,
            scale,
            causal,
            heads,
            kv_heads,
            batch: qt.shape[0].clone(),
            t: qt.shape[2].clone(),
            pages: pt.shape[0].clone(),
            page_size: pt.shape[1].clone(),
            max_pages: tbt.shape[1].clone(),
            q,
            out,
            lse,
            kp,
            vp,
            table: (tv.param, tv.offset.clone(), tv.strides[0].clone(), tv.strides[1].clone()),
            lens: (lv.param, lv.offset.clone(), lv.strides[0].clone()),
            unified_max,
        })
    }

    pub(super) fn dims(&self) -> Vec<Dim> {
        let mut v = vec![self.batch.clone(), self.t.clone(), self.pages.clone(), self.page_size.clone(), self.max_pages.clone()];
        for t in [&self.q, &self.out, &self.kp, &self.vp].into_iter().chain(&self.lse) {
            v.extend(t.dims().cloned());
        }
        v.extend([self.table.1.clone(), self.table.2.clone(), self.table.3.clone(), self.lens.1.clone(), self.lens.2.clone()]);
        v.push(self.rows());
        dims_of(&v)
    }

    /// Query rows per (sequence, KV head): `H/Hkv · T`.
    pub(super) fn rows(&self) -> Dim {
        self.t.scale(self.heads / self.kv_heads)
    }

    /// The addressing of sequence `b` (i64) and KV head `g` (i64) that both paged decode
    /// generators share ([`build_paged`] here, `decode::build`): the sequence's length from
    /// device memory clamped to `[0, max_pages · page_size]`, then [`PagedAddr::row`] and
    /// [`PagedAddr::key`].
    pub(super) fn addressing<'ctx>(&self, kit: &Kit<'ctx>, g: IntValue<'ctx>, b: IntValue<'ctx>) -> R<PagedAddr<'ctx>> {
        let dims = |v: &[Dim]| -> R<Vec<IntValue<'ctx>>> { v.iter().map(|d| kit.dim(d)).collect() };
        let (ps, npages, maxp) = (kit.dim(&self.page_size)?, kit.dim(&self.pages)?, kit.dim(&self.max_pages)?);
        let (lens_buf, lens_off, lens_s) = &self.lens;
        let len_at = kit.add(kit.dim(lens_off)?, kit.mul(b, kit.dim(lens_s)?)?)?;
        let len = kit.sext64(kit.load_i32(kit.buf(*lens_buf)?, len_at)?)?;
        let len = kit.smin(kit.smax(len, kit.i64c(0))?, kit.mul(maxp, ps)?)?;
        let t = kit.dim(&self.t)?;
        let (tbuf, toff, ts0, ts1) = &self.table;
        Ok(PagedAddr {
            causal: self.causal,
            group: self.heads / self.kv_heads,
            g,
            b,
            t,
            n_rows: kit.dim(&self.rows())?,
            len,
            // Query t sees keys j ≤ t + len − T.
            shift: kit.sub(len, t)?,
            q: (kit.dim(&self.q.offset)?, dims(&self.q.st[..3])?),
            o: (kit.dim(&self.out.offset)?, dims(&self.out.st[..3])?),
            lse: match &self.lse {
                Some(t) => Some((kit.dim(&t.offset)?, dims(&t.st[..3])?)),
                None => None,
            },
            table: kit.buf(*tbuf)?,
            tb_row: kit.add(kit.dim(toff)?, kit.mul(b, kit.dim(ts0)?)?)?,
            ts1: kit.dim(ts1)?,
            ps,
            npages,
            k: (kit.dim(&self.kp.offset)?, dims(&self.kp.st[..3])?),
            v: (kit.dim(&self.vp.offset)?, dims(&self.vp.st[..3])?),
        })
    }
}

/// Paged decode addressing of one (sequence, KV head), from [`Paged::addressing`]; every
/// value i64.
pub(super) struct PagedAddr<'ctx> {
    causal: bool,
    group: i64,
    g: IntValue<'ctx>,
    b: IntValue<'ctx>,
    t: IntValue<'ctx>,
    n_rows: IntValue<'ctx>,
    /// The sequence's length, clamped to what its block-table row can hold.
    pub(super) len: IntValue<'ctx>,
    shift: IntValue<'ctx>,
    q: (IntValue<'ctx>, Vec<IntValue<'ctx>>),
    o: (IntValue<'ctx>, Vec<IntValue<'ctx>>),
    lse: Option<(IntValue<'ctx>, Vec<IntValue<'ctx>>)>,
    table: PointerValue<'ctx>,
    tb_row: IntValue<'ctx>,
    ts1: IntValue<'ctx>,
    ps: IntValue<'ctx>,
    npages: IntValue<'ctx>,
    k: (IntValue<'ctx>, Vec<IntValue<'ctx>>),
    v: (IntValue<'ctx>, Vec<IntValue<'ctx>>),
}

impl<'ctx> PagedAddr<'ctx> {
    /// Query row `rg` (i64) of the KV head's `H/Hkv · T` rows (row = head within the group ·
    /// T + t): whether it exists, its q and o element offsets, and how many keys it sees
    /// (i64; the causal limit with bottom-right alignment, ≤ the length; not zeroed for a
    /// missing row).
    pub(super) fn row(&self, k: &Kit<'ctx>, rg: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let valid = k.icmp(IntPredicate::SLT, rg, self.n_rows)?;
        let hh = k.udiv(rg, self.t)?;
        let ti = k.urem(rg, self.t)?;
        let head = k.add(k.mul(self.g, k.i64c(self.group))?, hh)?;
        let off = |(base, st): &(IntValue<'ctx>, Vec<IntValue<'ctx>>)| -> R<IntValue<'ctx>> { k.add(*base, k.add(k.add(k.mul(self.b, st[0])?, k.mul(head, st[1])?)?, k.mul(ti, st[2])?)?) };
        let limit = if self.causal { k.smin(k.smax(k.add(k.add(ti, self.shift)?, k.i64c(1))?, k.i64c(0))?, self.len)? } else { self.len };
        Ok((valid, off(&self.q)?, off(&self.o)?, limit))
    }

    /// The element offset of query row `rg`'s log-sum-exp, when the kernel writes it.
    pub(super) fn lse_off(&self, k: &Kit<'ctx>, rg: IntValue<'ctx>) -> R<Option<IntValue<'ctx>>> {
        let Some((base, st)) = &self.lse else { return Ok(None) };
        let hh = k.udiv(rg, self.t)?;
        let ti = k.urem(rg, self.t)?;
        let head = k.add(k.mul(self.g, k.i64c(self.group))?, hh)?;
        Ok(Some(k.add(*base, k.add(k.add(k.mul(self.b, st[0])?, k.mul(head, st[1])?)?, k.mul(ti, st[2])?)?)?))
    }

    /// Key `j` (i64, `< len`): the element offsets of its K and V rows, through the block
    /// table (a page number outside `[0, pages)` is clamped into it).
    pub(super) fn key(&self, k: &Kit<'ctx>, j: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>)> {
        let col = k.udiv(j, self.ps)?;
        let slot = k.urem(j, self.ps)?;
        let page = k.sext64(k.load_i32(self.table, k.add(self.tb_row, k.mul(col, self.ts1)?)?)?)?;
        let page = k.smin(k.smax(page, k.i64c(0))?, k.sub(self.npages, k.i64c(1))?)?;
        let off = |(base, st): &(IntValue<'ctx>, Vec<IntValue<'ctx>>)| -> R<IntValue<'ctx>> { k.add(*base, k.add(k.add(k.mul(page, st[0])?, k.mul(slot, st[1])?)?, k.mul(self.g, st[2])?)?) };
        Ok((off(&self.k)?, off(&self.v)?))
    }
}

/// Generates paged decode attention kernel `kernel` of `graph` ([`Family::PagedAttention`],
/// one `paged_attention` node of kernel inputs, through views; see the module docs) with the
/// schedule [`choose_paged_schedule`] picks.
///
/// Shapes: q `[B, H, T, D]`, k_pages / v_pages `[P, S, Hkv, D]`, block_table `[B, M]` i32,
/// seq_lens `[B]` i32, output like q; D a constant ≤ 256; B, T, P, S, M any. Grid
/// `(⌈(H/Hkv)·T / block_q⌉, Hkv, B)`; block `32·warps`.
///
/// # Errors
/// As [`generate_prefill`].
pub fn generate_paged(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let p = Paged::analyse(graph, kernel)?;
    let s = choose_paged_schedule(p.rows().as_const(), p.d, p.d, p.dtype);
    paged_plan(&p, target, &s)
}

/// As [`generate_paged`], with the schedule given.
///
/// # Errors
/// As [`generate_paged`], and [`CodegenError::Unsupported`] for an invalid schedule.
pub fn generate_paged_with(graph: &KernelGraph, kernel: Kernel, target: &Target, schedule: &AttentionSchedule) -> Result<LaunchPlan, CodegenError> {
    let p = Paged::analyse(graph, kernel)?;
    paged_plan(&p, target, schedule)
}

fn paged_plan(p: &Paged, target: &Target, s: &AttentionSchedule) -> R<LaunchPlan> {
    let fam = Family::PagedAttention;
    s.check().map_err(|e| unsupported(&p.name, fam, e))?;
    let smem = Smem::new(s, p.d, p.d, p.dtype);
    let shared = shared_kind(smem.total, target, &p.name, fam)?;
    let ctx = Context::create();
    let entry = format!("{}_paged_attention", p.name);
    let core = Core { dtype: p.dtype, d: p.d, dv: p.d, scale: p.scale as f32, sched: *s, smem, shared, q: p.q.clone(), out: p.out.clone(), lse: p.lse.clone() };
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
        let (valid, q_off, o_off, limit) = a.row(k, rg)?;
        Ok(RowInfo { valid, q_off, o_off, limit: k.trunc32(limit)?, mask_off: None, lse_off: a.lse_off(k, rg)? })
    };
    let offsets = |k: &Kit<'ctx>, j: IntValue<'ctx>| a.key(k, j);
    let keys = Keys { k: &p.kp, v: &p.vp, offsets: &offsets, kv_len: a.len, kv_end: a.len, mask: None };
    build_core(kit, c, &rows, &keys)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::matmul::tests::{assemble, d, plan_line, single_kernel, sym, ty};
    use sinter_ir::interp::Tensor;
    use sinter_ir::{Attr, FunctionBuilder, Graph, KernelParam};

    /// `attention(q [B, H, Sq, D], k [B, Hkv, Skv, D], v [B, Hkv, Skv, Dv], mask [Sq, Skv]?)`.
    #[allow(clippy::too_many_arguments)]
    /// An fp8 attention kernel (issue #8): `attention(dequantize_fp8(q8, sq),
    /// dequantize_fp8(k8, sk), dequantize_fp8(v8, sv))` of `f8e4m3` `[B, H, S, D]` inputs and
    /// `f32[]` scales, dequantised to (and output in) `out`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prefill_fp8(out: DType, h: i64, hkv: i64, sq: Dim, skv: Dim, hd: i64, dv: i64, causal: bool) -> (KernelGraph, Kernel) {
        let b = sym("B");
        let mut fb = FunctionBuilder::new(&Graph::new(), "attn8");
        let f8 = DType::F8E4M3;
        let q8 = fb.param("q8", ty(f8, &[b.clone(), d(h), sq.clone(), d(hd)]));
        let s_q = fb.param("sq", ty(DType::F32, &[]));
        let k8 = fb.param("k8", ty(f8, &[b.clone(), d(hkv), skv.clone(), d(hd)]));
        let s_k = fb.param("sk", ty(DType::F32, &[]));
        let v8 = fb.param("v8", ty(f8, &[b, d(hkv), skv, d(dv)]));
        let s_v = fb.param("sv", ty(DType::F32, &[]));
        let deq = |fb: &mut FunctionBuilder, x, s| fb.op1(OpKind::DequantizeFp8, &[x, s], vec![("dtype", Attr::DType(out))]).unwrap();
        let (q, k, v) = (deq(&mut fb, q8, s_q), deq(&mut fb, k8, s_k), deq(&mut fb, v8, s_v));
        let attrs = vec![
            ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
            ("causal", Attr::Bool(causal)),
            ("heads", Attr::Int(h)),
            ("kv_heads", Attr::Int(hkv)),
        ];
        let o = fb.op1(OpKind::Attention, &[q, k, v], attrs).unwrap();
        single_kernel(Family::Attention, fb.finish(&[o]).unwrap())
    }

    pub(crate) fn prefill(dt: DType, h: i64, hkv: i64, sq: Dim, skv: Dim, hd: i64, dv: i64, causal: bool, mask: bool) -> (KernelGraph, Kernel) {
        let b = sym("B");
        let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
        let q = fb.param("q", ty(dt, &[b.clone(), d(h), sq.clone(), d(hd)]));
        let k = fb.param("k", ty(dt, &[b.clone(), d(hkv), skv.clone(), d(hd)]));
        let v = fb.param("v", ty(dt, &[b, d(hkv), skv.clone(), d(dv)]));
        let mut args = vec![q, k, v];
        if mask {
            args.push(fb.param("mask", ty(dt, &[sq, skv])));
        }
        let attrs = vec![
            ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
            ("causal", Attr::Bool(causal)),
            ("heads", Attr::Int(h)),
            ("kv_heads", Attr::Int(hkv)),
        ];
        let o = fb.op1(OpKind::Attention, &args, attrs).unwrap();
        single_kernel(Family::Attention, fb.finish(&[o]).unwrap())
    }

    /// `paged_attention(q [B, H, T, D], pages [P, S, Hkv, D], block_table [B, M], seq_lens [B])`.
    pub(crate) fn paged(dt: DType, h: i64, hkv: i64, t: Dim, hd: i64, page: i64) -> (KernelGraph, Kernel) {
        let b = sym("B");
        let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
        let q = fb.param("q", ty(dt, &[b.clone(), d(h), t, d(hd)]));
        let kp = fb.param("k_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
        let vp = fb.param("v_pages", ty(dt, &[sym("P"), d(page), d(hkv), d(hd)]));
        let bt = fb.param("block_table", ty(DType::I32, &[b.clone(), sym("M")]));
        let lens = fb.param("seq_lens", ty(DType::I32, &[b]));
        let attrs = vec![
            ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
            ("causal", Attr::Bool(true)),
            ("heads", Attr::Int(h)),
            ("kv_heads", Attr::Int(hkv)),
        ];
        let o = fb.op1(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
        single_kernel(Family::PagedAttention, fb.finish(&[o]).unwrap())
    }

    /// Prefill at sm_80 and sm_90a: plans and ptxas resource lines (no spills).
    #[test]
    fn prefill_ptxas_reports() {
        let cases = vec![
            ("bf16 D64 GQA 9/3 causal Sq=T Skv=T (SmolLM2)", prefill(DType::BF16, 9, 3, sym("T"), sym("T"), 64, 64, true, false)),
            ("bf16 D128 GQA 32/8 causal Sq=T Skv=S", prefill(DType::BF16, 32, 8, sym("T"), sym("S"), 128, 128, true, false)),
            ("f32 D128 MHA 4/4 additive mask", prefill(DType::F32, 4, 4, sym("T"), sym("S"), 128, 128, false, true)),
            ("bf16 D256 GQA 8/2 causal", prefill(DType::BF16, 8, 2, sym("T"), sym("S"), 256, 256, true, false)),
            ("f16 D80 Dv96 causal with mask", prefill(DType::F16, 4, 2, d(100), d(130), 80, 96, true, true)),
        ];
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in &cases {
                let plan = generate_prefill(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("attention_ptxas", text);
    }

    /// Paged decode at sm_80 and sm_90a.
    #[test]
    fn paged_ptxas_reports() {
        let cases = vec![
            ("bf16 D64 GQA 9/3 T=1 page 16 (SmolLM2)", paged(DType::BF16, 9, 3, d(1), 64, 16)),
            ("bf16 D128 GQA 32/8 T=1 page 16", paged(DType::BF16, 32, 8, d(1), 128, 16)),
            ("bf16 D128 GQA 32/8 T=4 page 32", paged(DType::BF16, 32, 8, d(4), 128, 32)),
            ("f32 D128 GQA 8/2 T symbolic", paged(DType::F32, 8, 2, sym("T"), 128, 16)),
        ];
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in &cases {
                let plan = generate_paged(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("paged_attention_ptxas", text);
    }

    #[test]
    fn launch_plans() {
        // bf16, D = 128, causal: the tensor-core kernel, 4 warps × 32 rows, 78 KiB of dynamic
        // shared memory (Q 128×136, two stages of K and V 32×136, the P scratch 128×40). On
        // sm_90 (sm_90a takes the wgmma kernel: below).
        let (g, k) = prefill(DType::BF16, 32, 8, sym("T"), sym("S"), 128, 128, true, false);
        let plan = generate_prefill(&g, k, &Target::SM_90).unwrap();
        assert_eq!(plan.entry, "k0_attention");
        assert_eq!(plan.block, [128, 1, 1]);
        assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 128 });
        assert_eq!(plan.grid[1], GridDim::fixed(32));
        assert_eq!(plan.grid[2], GridDim { numerator: sym("B"), denominator: 1 });
        assert_eq!(plan.shared_bytes, 79872);
        assert_eq!(TcSchedule { warps: 4, m_tiles: 2, block_kv: 32, q_in_regs: false }.shared_bytes(128, 128), 79872);
        // Not causal, on sm_90: 48-key tiles, 99 KiB (K and V 48×136, the P scratch 128×56);
        // on sm_80, whose 164 KiB would not hold two CTAs of 99, 32-key tiles.
        let (gn, kn) = prefill(DType::BF16, 32, 8, sym("T"), sym("S"), 128, 128, false, false);
        assert_eq!(generate_prefill(&gn, kn, &Target::SM_90).unwrap().shared_bytes, 101376);
        // sm_90a: the wgmma kernel, 2 warpgroups × 64 rows, 194 KiB (Q 128×128, two stages of
        // K and V 128×128, all swizzled slabs, and the P scratch 128×136).
        let hw = generate_prefill(&gn, kn, &Target::SM_90A).unwrap();
        assert_eq!((hw.entry.as_str(), hw.block, hw.shared_bytes), ("k0_attention_wgmma", [256, 1, 1], 128 * 128 * 2 * 5 + 128 * 136 * 2));
        assert_eq!(hw.grid[0], GridDim { numerator: sym("T"), denominator: 128 });
        assert_eq!(generate_prefill(&gn, kn, &Target::SM_80).unwrap().shared_bytes, 79872);
        assert_eq!(&plan.params[..4], &[KernelParam::Buffer(0), KernelParam::Buffer(1), KernelParam::Buffer(2), KernelParam::Buffer(3)]);
        for s in ["T", "S"] {
            assert!(plan.params.contains(&KernelParam::Size(sym(s))), "{:?}", plan.params);
        }
        for needle in [
            "cp.async.cg.shared.global",
            "cp.async.wait_group",
            "ldmatrix.sync.aligned.m8n8.x4.shared.b16",
            "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16",
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32",
            "cvt.rn.bf16x2.f32",
            "max.NaN.f32",
            "shfl.sync.bfly.b32",
            "vote.sync.any.pred",
            "ex2.approx.ftz.f32",
            "bar.sync",
            "st.global.v4",
        ] {
            assert!(plan.ptx.contains(needle), "no {needle}");
        }
        // The same on CUDA cores.
        let plan = generate_prefill_with(&g, k, &Target::SM_90A, &choose_prefill_schedule(128, 128, DType::BF16)).unwrap();
        assert_eq!(plan.block, [256, 1, 1]);
        assert_eq!(plan.grid[0], GridDim { numerator: sym("T"), denominator: 32 });
        assert_eq!(plan.shared_bytes, 0);
        for needle in ["max.NaN.f32", "shfl.sync.bfly.b32", "ex2.approx", "bar.sync", "bar.warp.sync", "ld.global.nc.v4"] {
            assert!(plan.ptx.contains(needle), "no {needle}");
        }
        assert!(!plan.ptx.contains("mma.sync"));
        // Which kernel: tensor cores for bf16/f16 with head dims multiples of 16 and 16-byte
        // aligned rows; CUDA cores for f32, D = 40, a strided head dim, a mask beside D = 256.
        let tc = |g: &KernelGraph, k| generate_prefill(g, k, &Target::SM_80).unwrap().ptx.contains("mma.sync");
        assert!(tc(&prefill(DType::F16, 4, 2, sym("T"), sym("T"), 64, 64, true, false).0, k));
        assert!(tc(&prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 80, 96, false, true).0, k));
        assert!(tc(&prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 256, 256, true, false).0, k));
        assert!(!tc(&prefill(DType::F32, 4, 2, sym("T"), sym("T"), 64, 64, true, false).0, k));
        assert!(!tc(&prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 40, 40, true, false).0, k));
        assert!(!tc(&prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 256, 256, false, true).0, k));
        let (mut g2, k2) = prefill(DType::BF16, 4, 2, sym("T"), sym("T"), 64, 64, true, false);
        let vb = g2.kernels[k2].inputs[2];
        g2.buffers[vb].layout.align = 8;
        assert!(!tc(&g2, k2), "v's buffer is only 8-byte aligned");
        assert!(matches!(generate_prefill_tc_with(&g2, k2, &Target::SM_80, &attention_tc::choose_tc_schedule(64, 64, false, true, &Target::SM_80)), Err(CodegenError::Unsupported { .. })));
        let (g, k) = paged(DType::BF16, 32, 8, d(1), 128, 16);
        let plan = generate_paged(&g, k, &Target::SM_80).unwrap();
        assert_eq!(plan.entry, "k0_paged_attention");
        assert_eq!(plan.block, [128, 1, 1]);
        assert_eq!(plan.grid[0], GridDim { numerator: d(4), denominator: 4 });
        assert_eq!(plan.grid[1], GridDim::fixed(8));
        assert_eq!(plan.grid[2], GridDim { numerator: sym("B"), denominator: 1 });
        assert_eq!(plan.params.len(), 6 + plan.params.iter().filter(|p| matches!(p, KernelParam::Size(_))).count());
        // f32 with D = 256 needs more than 48 KiB: dynamic shared memory.
        let (g, k) = prefill(DType::F32, 2, 1, sym("T"), sym("T"), 256, 256, true, false);
        let plan = generate_prefill(&g, k, &Target::SM_80).unwrap();
        assert!(plan.shared_bytes > 48 * 1024, "{}", plan.shared_bytes);
        assert!(plan.ptx.contains(".extern .shared"), "{}", plan.ptx);
        assemble(&plan);
    }

    #[test]
    fn schedules() {
        let s = |w, r| AttentionSchedule { warps: w, rows_per_warp: r };
        assert_eq!(choose_prefill_schedule(64, 64, DType::BF16), s(8, 4));
        assert_eq!(choose_prefill_schedule(128, 128, DType::BF16), s(8, 4));
        assert_eq!(choose_prefill_schedule(256, 256, DType::BF16), s(4, 4));
        assert_eq!(choose_prefill_schedule(128, 128, DType::F32), s(4, 4));
        assert_eq!(choose_paged_schedule(Some(4), 128, 128, DType::BF16), s(4, 1));
        assert_eq!(choose_paged_schedule(Some(3), 64, 64, DType::BF16), s(4, 1));
        assert_eq!(choose_paged_schedule(Some(8), 128, 128, DType::BF16), s(4, 2));
        assert_eq!(choose_paged_schedule(None, 128, 128, DType::BF16), s(8, 4));
        assert_eq!(s(8, 4).shared_bytes(128, 128, DType::BF16), 29696);
        // Other schedules generate and assemble (the autotuner's candidates).
        let (g, k) = prefill(DType::BF16, 8, 2, sym("T"), sym("S"), 64, 64, true, false);
        for sch in [s(4, 8), s(2, 2), s(1, 1), s(8, 1)] {
            let plan = generate_prefill_with(&g, k, &Target::SM_80, &sch).unwrap_or_else(|e| panic!("{sch:?}: {e}"));
            assemble(&plan);
        }
        assert!(matches!(generate_prefill_with(&g, k, &Target::SM_80, &s(0, 4)), Err(CodegenError::Unsupported { .. })));
    }

    #[test]
    fn rejects_what_it_cannot_do() {
        // A symbolic head dim.
        let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
        let shape = [d(1), d(2), sym("T"), sym("D")];
        let q = fb.param("q", ty(DType::BF16, &shape));
        let k = fb.param("k", ty(DType::BF16, &shape));
        let v = fb.param("v", ty(DType::BF16, &shape));
        let attrs = vec![("scale", Attr::Float(0.1)), ("heads", Attr::Int(2)), ("kv_heads", Attr::Int(2))];
        let o = fb.op1(OpKind::Attention, &[q, k, v], attrs).unwrap();
        let (g, kk) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
        let e = generate_prefill(&g, kk, &Target::SM_80).unwrap_err();
        assert!(e.to_string().contains("head dim"), "{e}");
        // A fused epilogue.
        let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
        let shape = [d(1), d(2), sym("T"), d(64)];
        let q = fb.param("q", ty(DType::BF16, &shape));
        let k = fb.param("k", ty(DType::BF16, &shape));
        let v = fb.param("v", ty(DType::BF16, &shape));
        let attrs = vec![("scale", Attr::Float(0.1)), ("heads", Attr::Int(2)), ("kv_heads", Attr::Int(2))];
        let o = fb.op1(OpKind::Attention, &[q, k, v], attrs).unwrap();
        let o = fb.op1(OpKind::Neg, &[o], vec![]).unwrap();
        let (g, kk) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
        assert!(matches!(generate_prefill(&g, kk, &Target::SM_80), Err(CodegenError::Unsupported { .. })));
        // The wrong generator for the family.
        let (g, kk) = paged(DType::BF16, 4, 2, d(1), 64, 16);
        assert!(matches!(generate_prefill(&g, kk, &Target::SM_80), Err(CodegenError::BadKernel { .. })));
    }

    /// The attention kernels the passes produce for a Llama layer (SmolLM2 sizes): operands
    /// are reshaped kernel inputs, the paged kernel's block table a slice of the per-layer
    /// tables.
    #[test]
    fn llama_layer_bodies() {
        // Prefill: q [T, 9, 64], k [T, 3, 64], v [T, 192] viewed as [1, T, H, 64] (bshd).
        let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
        let q = fb.param("q", ty(DType::BF16, &[sym("T"), d(9), d(64)]));
        let k = fb.param("k", ty(DType::BF16, &[sym("T"), d(3), d(64)]));
        let v = fb.param("v", ty(DType::BF16, &[sym("T"), d(192)]));
        let view = |fb: &mut FunctionBuilder, x, h| fb.op1(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(vec![d(1), sym("T"), d(h), d(64)]))]).unwrap();
        let (q4, k4, v4) = (view(&mut fb, q, 9), view(&mut fb, k, 3), view(&mut fb, v, 3));
        let attrs = vec![("scale", Attr::Float(0.125)), ("causal", Attr::Bool(true)), ("heads", Attr::Int(9)), ("kv_heads", Attr::Int(3)), ("layout", Attr::Str("bshd".into()))];
        let o = fb.op1(OpKind::Attention, &[q4, k4, v4], attrs).unwrap();
        let (g, kk) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
        // Decode: block_tables [L, T, M] sliced to layer 1, q [T, 9, 64] viewed as [T, 9, 1, 64].
        let mut fb = FunctionBuilder::new(&Graph::new(), "decode");
        let tables = fb.param("block_tables", ty(DType::I32, &[d(2), sym("T"), sym("M")]));
        let q = fb.param("q", ty(DType::BF16, &[sym("T"), d(9), d(64)]));
        let kp = fb.param("k_pages", ty(DType::BF16, &[sym("P"), d(16), d(3), d(64)]));
        let vp = fb.param("v_pages", ty(DType::BF16, &[sym("P"), d(16), d(3), d(64)]));
        let lens = fb.param("seq_lens", ty(DType::I32, &[sym("T")]));
        let t1 = fb.op1(OpKind::Slice, &[tables], vec![("axis", Attr::Int(-3)), ("start", Attr::Dim(d(1))), ("end", Attr::Dim(d(2)))]).unwrap();
        let bt = fb.op1(OpKind::Reshape, &[t1], vec![("shape", Attr::Dims(vec![sym("T"), sym("M")]))]).unwrap();
        let q4 = fb.op1(OpKind::Reshape, &[q], vec![("shape", Attr::Dims(vec![sym("T"), d(9), d(1), d(64)]))]).unwrap();
        let attrs = vec![("scale", Attr::Float(0.125)), ("causal", Attr::Bool(true)), ("heads", Attr::Int(9)), ("kv_heads", Attr::Int(3))];
        let o = fb.op1(OpKind::PagedAttention, &[q4, kp, vp, bt, lens], attrs).unwrap();
        let o3 = fb.op1(OpKind::Reshape, &[o], vec![("shape", Attr::Dims(vec![sym("T"), d(576)]))]).unwrap();
        let (gp, kp) = single_kernel(Family::PagedAttention, fb.finish(&[o3]).unwrap());
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            let plans = [generate_prefill(&g, kk, &t).unwrap(), generate_paged(&gp, kp, &t).unwrap()];
            for plan in &plans {
                let Some(report) = assemble(plan) else { return };
                text.push_str(&format!("{}\n{report}", plan_line(plan)));
            }
            // sm_90a: the wgmma kernel (bf16, D 64), on the same cp.async copies.
            let mma = if t == Target::SM_90A { "wgmma.mma_async" } else { "mma.sync" };
            assert!(plans[0].ptx.contains("cp.async.cg.shared.global") && plans[0].ptx.contains(mma), "the reshaped operands are still contiguous");
        }
        insta::assert_snapshot!("attention_llama_ptxas", text);
        // The block table's view: layer 1 starts T·M elements in.
        let p = Paged::analyse(&gp, kp).unwrap();
        assert_eq!(p.table.1, sym("M").mul(&sym("T")));
        // A reshape of a strided input is refused.
        let mut g2 = g.clone();
        let qb = g2.kernels[kk].inputs[0];
        g2.buffers[qb].layout.strides = vec![d(1), sym("T"), sym("T").scale(9)];
        let e = generate_prefill(&g2, kk, &Target::SM_80).unwrap_err();
        assert!(e.to_string().contains("reshapes a strided view"), "{e}");
    }

    pub(crate) fn bind(pairs: &[(&str, i64)]) -> sinter_ir::Bindings {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    fn with_values(t: Tensor, edits: &[(usize, f64)]) -> Tensor {
        let mut data = t.data().to_vec();
        for &(i, v) in edits {
            data[i] = v;
        }
        Tensor::new(t.dtype(), t.shape(), data).unwrap()
    }

    /// Prefill attention emulated on the CPU against the interpreter (see
    /// `matmul::emu`): causal with Sq ≠ Skv both ways, GQA, tails, an additive mask with
    /// fully masked rows, NaN where the reference reads it and where it does not.
    #[test]
    fn emulated_prefill_matches_interpreter() {
        use crate::kernels::matmul::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
        // GQA 4/2, D = 64, causal, Sq = T, Skv = S.
        let (g, k) = prefill(DType::BF16, 4, 2, sym("T"), sym("S"), 64, 64, true, false);
        for (b, t, sk) in [(1usize, 37usize, 50usize), (2, 50, 37), (1, 1, 70), (1, 33, 0), (1, 3, 1)] {
            let ins = [random(DType::BF16, &[b, 4, t, 64], 1), random(DType::BF16, &[b, 2, sk, 64], 2), random(DType::BF16, &[b, 2, sk, 64], 3)];
            check(&format!("bf16 causal GQA B={b} Sq={t} Skv={sk}"), &g, k, gen, &ins, &bind(&[("B", b as i64), ("T", t as i64), ("S", sk as i64)]));
        }
        // f32, not causal, D = 40 (no 16-byte chunks), an additive mask [Sq, Skv] with one row
        // fully −inf, scattered −inf, and NaN in K at a key row 5 cannot see (causal off here:
        // every row sees it, so rows become NaN exactly as in the reference).
        let (g, k) = prefill(DType::F32, 2, 1, sym("T"), sym("S"), 40, 40, false, true);
        let (t, sk) = (19usize, 45usize);
        let mut mask = vec![0.0; t * sk];
        for j in 0..sk {
            mask[4 * sk + j] = f64::NEG_INFINITY; // row 4: fully masked → 0
        }
        for (i, m) in mask.iter_mut().enumerate() {
            if i % 7 == 3 {
                *m = f64::NEG_INFINITY;
            }
        }
        let mask = Tensor::new(DType::F32, &[t, sk], mask).unwrap();
        let ins = [random(DType::F32, &[1, 2, t, 40], 4), random(DType::F32, &[1, 1, sk, 40], 5), random(DType::F32, &[1, 1, sk, 40], 6), mask.clone()];
        check("f32 masked, fully masked row", &g, k, gen, &ins, &bind(&[("B", 1), ("T", t as i64), ("S", sk as i64)]));
        // NaN in V at keys the mask hides from every row (−inf in all rows for key 40..45) but
        // in a tile that also holds visible keys: the reference multiplies 0·NaN there, so
        // every row whose 16-key tile holding key 40 is not all −inf becomes NaN.
        let mut mdata = mask.data().to_vec();
        for i in 0..t {
            for j in 40..sk {
                mdata[i * sk + j] = f64::NEG_INFINITY;
            }
        }
        let mask2 = Tensor::new(DType::F32, &[t, sk], mdata).unwrap();
        let v_nan = with_values(random(DType::F32, &[1, 1, sk, 40], 6), &[(41 * 40 + 3, f64::NAN)]);
        let ins = [ins[0].clone(), ins[1].clone(), v_nan, mask2];
        check("f32 NaN in V under a −inf mask", &g, k, gen, &ins, &bind(&[("B", 1), ("T", t as i64), ("S", sk as i64)]));
        // Causal: NaN in K and V at keys hidden from early rows stays out of them; NaN in q
        // row 2 makes exactly that row NaN.
        let (g, k) = prefill(DType::F32, 2, 2, sym("T"), sym("T"), 32, 32, true, false);
        let t = 40usize;
        let q = with_values(random(DType::F32, &[1, 2, t, 32], 7), &[(2 * 32 + 5, f64::NAN)]);
        let kk = with_values(random(DType::F32, &[1, 2, t, 32], 8), &[(30 * 32 + 1, f64::NAN)]);
        let v = with_values(random(DType::F32, &[1, 2, t, 32], 9), &[(35 * 32 + 2, f64::NAN)]);
        check("f32 causal NaN", &g, k, gen, &[q, kk, v], &bind(&[("B", 1), ("T", t as i64)]));
        // D = 80, Dv = 96 (two head dims), bf16, causal with Sq > Skv (the first rows see nothing).
        let (g, k) = prefill(DType::BF16, 2, 1, sym("T"), sym("S"), 80, 96, true, false);
        let ins = [random(DType::BF16, &[1, 2, 20, 80], 10), random(DType::BF16, &[1, 1, 9, 80], 11), random(DType::BF16, &[1, 1, 9, 96], 12)];
        check("bf16 D80 Dv96 Sq>Skv", &g, k, gen, &ins, &bind(&[("B", 1), ("T", 20), ("S", 9)]));
        // Other schedules agree.
        let (g, k) = prefill(DType::BF16, 4, 2, sym("T"), sym("S"), 64, 64, true, false);
        let ins = [random(DType::BF16, &[1, 4, 21, 64], 13), random(DType::BF16, &[1, 2, 40, 64], 14), random(DType::BF16, &[1, 2, 40, 64], 15)];
        for sch in [AttentionSchedule { warps: 4, rows_per_warp: 1 }, AttentionSchedule { warps: 2, rows_per_warp: 8 }] {
            let gen_s = |g: &KernelGraph, k: Kernel| generate_prefill_with(g, k, &Target::SM_80, &sch);
            check(&format!("bf16 schedule {sch:?}"), &g, k, gen_s, &ins, &bind(&[("B", 1), ("T", 21), ("S", 40)]));
        }
    }

    /// The tensor-core kernel (the default for bf16/f16) emulated against the interpreter:
    /// sequence lengths 1, 17, 129 (one and three key tiles, tails), Sq ≠ Skv both ways,
    /// causal with more queries than keys, GQA 1, 3 and 8, head dims 64, 128, 80, 96, 16 (Dv
    /// 48), 112 and 256, f16, every schedule shape.
    #[test]
    fn emulated_prefill_tc_matches_interpreter() {
        use crate::kernels::matmul::emu::{check, random};
        let tc = |s: TcSchedule| move |g: &KernelGraph, k: Kernel| generate_prefill_tc_with(g, k, &Target::SM_80, &s);
        // sm_90 (not sm_90a, whose wgmma kernel the emulator cannot run): the same schedules.
        let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_90);
        let sizes = |b: usize, t: usize, s: usize| bind(&[("B", b as i64), ("T", t as i64), ("S", s as i64)]);
        // Self-attention at three lengths, causal and not, D = 64 (GQA 3) and 128 (GQA 1).
        for (h, hkv, hd) in [(6, 2, 64), (2, 2, 128)] {
            for causal in [true, false] {
                let (g, k) = prefill(DType::BF16, h, hkv, sym("T"), sym("S"), hd, hd, causal, false);
                for n in [1usize, 17, 129] {
                    let hd = hd as usize;
                    let ins = [random(DType::BF16, &[1, h as usize, n, hd], 30), random(DType::BF16, &[1, hkv as usize, n, hd], 31), random(DType::BF16, &[1, hkv as usize, n, hd], 32)];
                    check(&format!("tc bf16 D{hd} H{h}/{hkv} causal={causal} S={n}"), &g, k, gen, &ins, &sizes(1, n, n));
                }
            }
        }
        // Sq ≠ Skv both ways (causal: bottom-right; Sq > Skv leaves the first rows with no
        // key, exactly 0), GQA 8, B = 2.
        let (g, k) = prefill(DType::BF16, 8, 1, sym("T"), sym("S"), 64, 64, true, false);
        for (t, s) in [(20usize, 83usize), (83, 20), (130, 3), (5, 200)] {
            let ins = [random(DType::BF16, &[2, 8, t, 64], 33), random(DType::BF16, &[2, 1, s, 64], 34), random(DType::BF16, &[2, 1, s, 64], 35)];
            check(&format!("tc bf16 causal GQA 8 Sq={t} Skv={s}"), &g, k, gen, &ins, &sizes(2, t, s));
        }
        // D = 80 and 96, Dv ≠ D, and 256 (its own schedule); f16.
        for (hd, dv, dt) in [(80, 80, DType::BF16), (96, 64, DType::BF16), (16, 48, DType::BF16), (112, 112, DType::BF16), (256, 256, DType::BF16), (128, 128, DType::F16)] {
            let (g, k) = prefill(dt, 2, 1, sym("T"), sym("S"), hd, dv, true, false);
            let (hd, dv) = (hd as usize, dv as usize);
            let ins = [random(dt, &[1, 2, 70, hd], 36), random(dt, &[1, 1, 75, hd], 37), random(dt, &[1, 1, 75, dv], 38)];
            check(&format!("tc {dt} D{hd} Dv{dv} causal Sq=70 Skv=75"), &g, k, gen, &ins, &sizes(1, 70, 75));
        }
        // The prefill kernel of a Llama layer (SmolLM2 sizes): `bshd` views of [T, H, 64] rows
        // (V reshaped from [T, 192]); row strides 576, 192 and 192 elements.
        let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
        let q = fb.param("q", ty(DType::BF16, &[sym("T"), d(9), d(64)]));
        let kk = fb.param("k", ty(DType::BF16, &[sym("T"), d(3), d(64)]));
        let v = fb.param("v", ty(DType::BF16, &[sym("T"), d(192)]));
        let view = |fb: &mut FunctionBuilder, x, h| fb.op1(OpKind::Reshape, &[x], vec![("shape", Attr::Dims(vec![d(1), sym("T"), d(h), d(64)]))]).unwrap();
        let (q4, k4, v4) = (view(&mut fb, q, 9), view(&mut fb, kk, 3), view(&mut fb, v, 3));
        let attrs = vec![("scale", Attr::Float(0.125)), ("causal", Attr::Bool(true)), ("heads", Attr::Int(9)), ("kv_heads", Attr::Int(3)), ("layout", Attr::Str("bshd".into()))];
        let o = fb.op1(OpKind::Attention, &[q4, k4, v4], attrs).unwrap();
        let (g, k) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
        let t = 150usize;
        let ins = [random(DType::BF16, &[t, 9, 64], 42), random(DType::BF16, &[t, 3, 64], 43), random(DType::BF16, &[t, 192], 44)];
        check("tc bf16 bshd views (Llama layer)", &g, k, gen, &ins, &bind(&[("T", t as i64)]));
        // Every schedule shape: 1 and 2 slabs a warp, Q in registers or not, 16- to 128-key
        // tiles, 1 to 8 warps.
        let (g, k) = prefill(DType::BF16, 3, 3, sym("T"), sym("S"), 64, 64, true, false);
        let ins = [random(DType::BF16, &[1, 3, 77, 64], 39), random(DType::BF16, &[1, 3, 90, 64], 40), random(DType::BF16, &[1, 3, 90, 64], 41)];
        for (warps, m_tiles, block_kv, q_in_regs) in [(4, 1, 64, true), (8, 1, 64, true), (4, 2, 32, false), (4, 2, 48, false), (2, 2, 16, true), (1, 1, 128, false)] {
            let s = TcSchedule { warps, m_tiles, block_kv, q_in_regs };
            check(&format!("tc schedule {s:?}"), &g, k, tc(s), &ins, &sizes(1, 77, 90));
        }
    }

    /// The tensor-core kernel's special values, against the interpreter: an additive mask with
    /// a fully masked row and leading −inf groups; NaN and ±inf in V at keys the interpreter
    /// never multiplies (hidden by the causal mask, or in a 16-key group it skips because the
    /// row has seen only −inf) and at keys it multiplies by 0 (which the CUDA-core fallback of
    /// a tile must reproduce); NaN in q; an infinite K element making a score −inf; +inf
    /// scores; rows the output writes element by element (a 2-byte-aligned output).
    #[test]
    /// Every key-tile variant autotuning may pick computes what the interpreter does (causal,
    /// GQA 3, D = 64, 129 keys: a partial last tile for each of 32, 48 and 64).
    fn emulated_prefill_variants() {
        use crate::kernels::matmul::emu::{check, random};
        let (g, k) = prefill(DType::BF16, 6, 2, sym("T"), sym("S"), 64, 64, true, false);
        // sm_90a's candidates: the wgmma kernel's (not emulated: the GPU tests run them), then
        // the mma.sync kernel's, which sm_90 has alone.
        let hopper = crate::schedule_variants(&g, k, &Target::SM_90A).unwrap();
        let names: Vec<&str> = hopper.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["wgmma kv64 g2", "wgmma kv128 g2", "wgmma kv128 g2 +split", "wgmma kv128 g2 ov", "wgmma kv64 g2 ov", "wgmma kv128 g2 ws", "wgmma kv64 g2 ws", "wgmma kv128 g2 ws pp", "wgmma kv64 g2 ws pp", "tc kv64 w4 m2 +q", "tc kv32 w4 m2 +q", "tc kv48 w4 m2 +q"]);
        let built = crate::schedule_variants(&g, k, &Target::SM_90).unwrap();
        let names: Vec<&str> = built.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["tc kv64 w4 m2 +q", "tc kv32 w4 m2 +q", "tc kv48 w4 m2 +q"]);
        let ins = [random(DType::BF16, &[1, 6, 129, 64], 40), random(DType::BF16, &[1, 2, 129, 64], 41), random(DType::BF16, &[1, 2, 129, 64], 42)];
        for name in names {
            check(&format!("variant `{name}`"), &g, k, |g, k| crate::compile_variant(g, k, &Target::SM_90, name), &ins, &bind(&[("B", 1), ("T", 129), ("S", 129)]));
        }
        assert!(crate::compile_variant(&g, k, &Target::SM_90A, "tc kv99").is_err());
    }

    #[test]
    fn emulated_prefill_tc_special_values() {
        use crate::kernels::matmul::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
        let sizes = |t: usize, s: usize| bind(&[("B", 1), ("T", t as i64), ("S", s as i64)]);
        let d = 64usize;
        // Causal self-attention over 100 keys (two tiles): NaN in V at key 35 (column 3) and
        // +inf at key 70 (column 9), −inf at key 71 (column 9 too): rows before them never see
        // them; NaN in K at key 50 hidden from rows < 50; NaN in q row 7.
        let (g, k) = prefill(DType::BF16, 2, 1, sym("T"), sym("T"), 64, 64, true, false);
        let t = 100usize;
        let q = with_values(random(DType::BF16, &[1, 2, t, d], 50), &[(7 * d + 4, f64::NAN)]);
        let kk = with_values(random(DType::BF16, &[1, 1, t, d], 51), &[(50 * d + 1, f64::NAN)]);
        let v = with_values(random(DType::BF16, &[1, 1, t, d], 52), &[(35 * d + 3, f64::NAN), (70 * d + 9, f64::INFINITY), (80 * d + 10, f64::INFINITY), (81 * d + 10, f64::NEG_INFINITY)]);
        check("tc causal NaN/inf in hidden keys", &g, k, gen, &[q, kk, v], &bind(&[("B", 1), ("T", t as i64)]));
        // An additive mask [Sq, Skv]: row 2 fully −inf (→ 0), row 5 −inf on keys 0..20 (group
        // 0 skipped, keys 16..20 multiplied by 0), row 9 −inf on keys 0..40 except key 33;
        // NaN in V at key 5 (skipped by rows 5 and 9, multiplied by the others) and at key 18
        // (multiplied by 0 in row 5, skipped by row 9), +inf at key 3 of another column.
        let (g, k) = prefill(DType::BF16, 2, 2, sym("T"), sym("S"), 64, 64, false, true);
        let (t, s) = (12usize, 45usize);
        let mut mask = vec![0.0; t * s];
        for j in 0..s {
            mask[2 * s + j] = f64::NEG_INFINITY;
            if j < 21 {
                mask[5 * s + j] = f64::NEG_INFINITY;
            }
            if j < 41 && j != 33 {
                mask[9 * s + j] = f64::NEG_INFINITY;
            }
        }
        let mask = Tensor::new(DType::BF16, &[t, s], mask).unwrap();
        let v = with_values(random(DType::BF16, &[1, 2, s, d], 53), &[(5 * d + 1, f64::NAN), (18 * d + 2, f64::NAN), (3 * d + 6, f64::INFINITY)]);
        let ins = [random(DType::BF16, &[1, 2, t, d], 54), random(DType::BF16, &[1, 2, s, d], 55), v, mask.clone()];
        check("tc mask: fully masked row, skipped groups, NaN/inf in V", &g, k, gen, &ins, &sizes(t, s));
        // An infinite K element: with q > 0, key 20's score is −inf in every row (multiplied by
        // 0 with NaN in its V row), key 40's +inf (its rows NaN).
        let q = Tensor::new(DType::BF16, &[1, 2, t, d], random(DType::BF16, &[1, 2, t, d], 56).data().iter().map(|x| x.abs() + 0.01).collect()).unwrap();
        let kk = with_values(random(DType::BF16, &[1, 2, s, d], 57), &[(20 * d + 7, f64::NEG_INFINITY), ((s + 40) * d + 7, f64::INFINITY)]);
        let v = with_values(random(DType::BF16, &[1, 2, s, d], 58), &[(20 * d + 2, f64::NAN)]);
        let ins = [q, kk, v, Tensor::new(DType::BF16, &[t, s], vec![0.0; t * s]).unwrap()];
        check("tc infinite K elements", &g, k, gen, &ins, &sizes(t, s));
        // Causal with more queries than keys and NaN in V: the first rows see nothing (0).
        let (g, k) = prefill(DType::BF16, 1, 1, sym("T"), sym("S"), 64, 64, true, false);
        let (t, s) = (40usize, 30usize);
        let v = with_values(random(DType::BF16, &[1, 1, s, d], 59), &[(25 * d, f64::NAN)]);
        let ins = [random(DType::BF16, &[1, 1, t, d], 60), random(DType::BF16, &[1, 1, s, d], 61), v];
        check("tc causal Sq > Skv, NaN in V", &g, k, gen, &ins, &sizes(t, s));
        // A 2-byte-aligned output: element stores instead of staged 16-byte ones.
        let (mut g, k) = prefill(DType::BF16, 2, 1, sym("T"), sym("S"), 64, 64, true, false);
        let ob = g.kernels[k].outputs[0];
        g.buffers[ob].layout.align = 2;
        let ins = [random(DType::BF16, &[1, 2, 33, d], 62), random(DType::BF16, &[1, 1, 33, d], 63), random(DType::BF16, &[1, 1, 33, d], 64)];
        check("tc element stores", &g, k, gen, &ins, &sizes(33, 33));
        // D = 128 on sm_90, not causal (48-key tiles: 0..48, 48..96, 96..100, the last
        // zero-filled past the sequence): NaN in V at key 35, +inf at key 70, NaN in q row 7.
        let gen90 = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_90);
        let (g, k) = prefill(DType::BF16, 2, 1, sym("T"), sym("T"), 128, 128, false, false);
        let (t, d) = (100usize, 128usize);
        let q = with_values(random(DType::BF16, &[1, 2, t, d], 65), &[(7 * d + 4, f64::NAN)]);
        let v = with_values(random(DType::BF16, &[1, 1, t, d], 66), &[(35 * d + 3, f64::NAN), (70 * d + 9, f64::INFINITY)]);
        let ins = [q, random(DType::BF16, &[1, 1, t, d], 67), v];
        check("tc D128 sm_90 NaN/inf in V, NaN in q", &g, k, gen90, &ins, &bind(&[("B", 1), ("T", t as i64)]));
    }

    /// Paged decode emulated against the interpreter: lengths 0, 1, a partly filled last
    /// page, a full table; pages in scrambled order; T = 1 and T = 3 (causal within the
    /// step); GQA 4/2.
    #[test]
    fn emulated_paged_matches_interpreter() {
        use crate::kernels::matmul::emu::{check, random};
        let gen = |g: &KernelGraph, k: Kernel| generate_paged(g, k, &Target::SM_80);
        let (b, pages, page, m) = (4usize, 12usize, 4usize, 3usize);
        let table: Vec<f64> = (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect();
        let table = Tensor::new(DType::I32, &[b, m], table).unwrap();
        let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1.0, 6.0, 12.0]).unwrap();
        for tq in [1usize, 3] {
            let (g, k) = paged(DType::BF16, 4, 2, d(tq as i64), 64, page as i64);
            let ins = [
                random(DType::BF16, &[b, 4, tq, 64], 20),
                random(DType::BF16, &[pages, page, 2, 64], 21),
                random(DType::BF16, &[pages, page, 2, 64], 22),
                table.clone(),
                lens.clone(),
            ];
            check(&format!("bf16 paged T={tq}"), &g, k, gen, &ins, &bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]));
        }
        // f32, D = 32, T symbolic, one sequence much longer than a tile (40 keys).
        let (g, k) = paged(DType::F32, 2, 1, sym("T"), 32, 16);
        let table = Tensor::new(DType::I32, &[2, 3], vec![2.0, 0.0, 1.0, 5.0, 4.0, 3.0]).unwrap();
        let lens = Tensor::new(DType::I32, &[2], vec![40.0, 17.0]).unwrap();
        let ins = [random(DType::F32, &[2, 2, 2, 32], 23), random(DType::F32, &[6, 16, 1, 32], 24), random(DType::F32, &[6, 16, 1, 32], 25), table, lens];
        check("f32 paged T=2", &g, k, gen, &ins, &bind(&[("B", 2), ("T", 2), ("P", 6), ("M", 3)]));
    }

    /// The `bshd` layout and non-contiguous strides (q a transposed view) generate and
    /// assemble; scalar loads are used where 16-byte ones are not proven.
    #[test]
    fn bshd_and_strided_inputs() {
        let mut fb = FunctionBuilder::new(&Graph::new(), "attn");
        let q = fb.param("q", ty(DType::BF16, &[d(1), sym("T"), d(8), d(64)]));
        let k = fb.param("k", ty(DType::BF16, &[d(1), sym("T"), d(2), d(64)]));
        let v = fb.param("v", ty(DType::BF16, &[d(1), sym("T"), d(2), d(64)]));
        let attrs = vec![("scale", Attr::Float(0.125)), ("causal", Attr::Bool(true)), ("heads", Attr::Int(8)), ("kv_heads", Attr::Int(2)), ("layout", Attr::Str("bshd".into()))];
        let o = fb.op1(OpKind::Attention, &[q, k, v], attrs).unwrap();
        let (mut g, kk) = single_kernel(Family::Attention, fb.finish(&[o]).unwrap());
        let plan = generate_prefill(&g, kk, &Target::SM_80).unwrap();
        assert!(plan.ptx.contains("cp.async.cg.shared.global") && plan.ptx.contains("mma.sync"), "bshd rows are contiguous");
        assemble(&plan);
        // Make k's head-dim stride 2 (an odd view): no vector loads of k, and no cp.async, so
        // the CUDA-core kernel.
        let kb = g.kernels[kk].inputs[1];
        g.buffers[kb].layout.strides[3] = d(2);
        let plan = generate_prefill(&g, kk, &Target::SM_80).unwrap();
        assert!(!plan.ptx.contains("mma.sync"));
        assemble(&plan);
    }
}

