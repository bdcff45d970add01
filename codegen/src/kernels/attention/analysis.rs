//! What an attention kernel's body says: the checked facts of a prefill ([`Prefill`]) or
//! paged-decode ([`Paged`]) attention node — dtypes, head dims, heads, causality, the
//! strided views ([`T4`]) of its operands and outputs, an additive mask, fp8 scales — and the
//! paged addressing ([`PagedAddr`]) both decode kernels share; also the family's errors and
//! its choice of static or dynamic shared memory.
//!
//! Paged decode: `paged_attention(q [B, H, T, D], k_pages [P, S, Hkv, D], v_pages,
//! block_table [B, M] i32, seq_lens [B] i32)`. Key `j` of sequence `b` is row `j mod S` of page
//! `block_table[b][j / S]` (PagedAttention, Kwon et al. 2023, arXiv 2309.06180). The length is
//! read from device memory, so one compiled kernel serves every decode step; a length is
//! clamped to `[0, M·S]` and a page number to `[0, P)`, so a corrupt table cannot fault.
//!
//! Design notes: book/src/design/attention.md

use inkwell::values::{FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{DType, Dim, Family, Function, GridDim, Kernel, KernelData, KernelGraph, LaunchPlan, OpKind};

use crate::isa::kit::{dims_of, Kit, SharedKind, R};

use crate::kernels::view::{broadcast_strides, buffer_infos, input_view, output_strides, BufInfo, View};
use crate::kernels::fp8_operand::Fp8Scale;
use crate::kernels::ctx::KernelCtx;
use crate::target::Target;
use crate::error::CodegenError;

/// The largest head dimension (of Q/K and of V) the attention families accept: the CUDA-core
/// kernels take every head dim up to it (above 256 with a smaller query tile in dynamic
/// shared memory); the tensor-core kernels stop at 256.
pub const MAX_HEAD_DIM: u32 = sinter_ir::contract::MAX_ATTENTION_HEAD_DIM;

/// Arguments below this give `e^x = 0` in f32 (`e^−104` is already below half the smallest
/// subnormal): [`exp0`] clamps to it.
const EXP_FLOOR: f64 = -128.0;

/// `e^x` in f32 for every `x` (NaN stays NaN, `−inf` gives 0): the device's precise `exp`
/// ([`Kit::exp`]) of `max(x, −128)`. The clamp keeps a finite argument below about −2.4e38
/// (a score of −3.4e38, the lowest f32, less the row maximum) away from `exp`'s `x·log2 e`,
/// which overflows there to −inf and made its correction step 0·inf = NaN.
pub(super) fn exp0<'ctx>(k: &Kit<'ctx>, x: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    k.exp(k.max_nan(x, k.f32c(EXP_FLOOR))?)
}

/// `c·tanh(s/c)` in f32 with the node's `softcap` c (Gemma 2's logit soft-capping), else `s`:
/// ±inf give ±c, NaN stays NaN.
pub(super) fn cap_score<'ctx>(k: &Kit<'ctx>, s: FloatValue<'ctx>, softcap: Option<f32>) -> R<FloatValue<'ctx>> {
    let Some(c) = softcap else { return Ok(s) };
    let cv = k.f32c(f64::from(c));
    let x = k.fdiv(s, cv)?;
    let t = k.math(|kb| crate::math::tanh(kb, x, true))?;
    k.fmul(t, cv)
}

/// The node's sliding `window` (keys per query, `1..=i32::MAX`, causal only) and `softcap`
/// (a finite f32 above 0), checked as the verifier checks them.
fn window_softcap(op: &sinter_ir::Op, causal: bool, kernel: &str, family: Family) -> R<(Option<i64>, Option<f32>)> {
    let window = op.int("window");
    if let Some(w) = window {
        if !(1..=i64::from(i32::MAX)).contains(&w) || !causal {
            return Err(bad(kernel, family, format!("window={w} must be in 1..={} with causal=true", i32::MAX)));
        }
    }
    let softcap = match op.float("softcap") {
        Some(c) if !(c > 0.0 && (c as f32).is_finite()) => return Err(bad(kernel, family, format!("softcap must be a finite f32 above 0, got {c:?}"))),
        c => c.map(|c| c as f32),
    };
    Ok((window, softcap))
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
    let read = |v: sinter_ir::Value| match crate::kernels::fp8_operand::fp8_operand(body, v, bufs) {
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
    let ops: Vec<_> = nd.inputs.iter().take(3).map(|&v| crate::kernels::fp8_operand::fp8_operand(body, v, bufs)).collect();
    if ops.iter().all(Option::is_none) {
        return match body.values.iter().find(|(_, v)| v.ty.dtype.is_fp8()) {
            Some((v, d)) => Err(crate::error::fp8_message(&format!("f8e4m3 value {} ({}) in an attention kernel", body.label(v), d.ty))),
            None => Ok(None),
        };
    }
    let mut scales = Vec::new();
    for (i, o) in ops.into_iter().enumerate() {
        let name = ["q", "k", "v"][i];
        match o {
            Some(Ok((_, sc))) if bufs.get(views[i].param).is_some_and(|b| b.dtype == DType::F8E4M3) => scales.push(sc),
            Some(Ok(_)) => return Err(crate::error::fp8_message(&format!("f8e4m3 attention: `dequantize_fp8` of {name} does not read an f8e4m3 kernel input"))),
            Some(Err(e)) => return Err(crate::error::fp8_message(&format!("f8e4m3 attention: {e}"))),
            None => return Err(crate::error::fp8_message(&format!("an attention whose {name} is not `dequantize_fp8` of f8e4m3 while another operand is"))),
        }
    }
    if nd.inputs.len() > 3 {
        return Err(crate::error::fp8_message("f8e4m3 attention with an additive mask"));
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
        _ => Err(unsupported(kernel, family, format!("{what} must be a constant in 1..={MAX_HEAD_DIM} (head dims above {MAX_HEAD_DIM} are not supported), got {d}"))),
    }
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

/// Facts of a prefill attention kernel.
pub(crate) struct Prefill {
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
    /// An fp8 attention: q, k and v are `dequantize_fp8` of `f8e4m3` kernel inputs
    /// (the [`T4`]s `q`, `k`, `v` describe the fp8 buffers, one byte an element), with these
    /// per-tensor scales (sq, sk, sv); `dtype` is the dequantised (and output) dtype. Only
    /// the `wgmma` kernel takes it ([`super::prefill_wgmma`], "fp8").
    pub(super) fp8: Option<[Fp8Scale; 3]>,
    /// The sliding window W (causal only): query i sees keys `i + Skv − Sq − W < j`.
    pub(super) window: Option<i64>,
    /// The logit softcap c: scores `c·tanh(s/c)` before the mask ([`cap_score`]).
    pub(super) softcap: Option<f32>,
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
        let (window, softcap) = window_softcap(op, causal, &name, fam)?;
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
            window,
            softcap,
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

/// Facts of a paged attention kernel.
pub(crate) struct Paged {
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
    /// The sliding window W (causal only): query t sees keys `t + len − T − W < j`.
    pub(super) window: Option<i64>,
    /// The logit softcap c ([`cap_score`]).
    pub(super) softcap: Option<f32>,
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
        let (window, softcap) = window_softcap(op, causal, &name, fam)?;
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
            window,
            softcap,
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
            window: self.window,
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
    window: Option<i64>,
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
    /// T + t): whether it exists, its q and o element offsets, how many keys it sees (i64;
    /// the causal limit with bottom-right alignment, ≤ the length; not zeroed for a missing
    /// row) and its first visible key (i64; with a window W `max(limit − W, 0)`, else 0).
    #[allow(clippy::type_complexity)]
    pub(super) fn row(&self, k: &Kit<'ctx>, rg: IntValue<'ctx>) -> R<(IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>, IntValue<'ctx>)> {
        let valid = k.icmp(IntPredicate::SLT, rg, self.n_rows)?;
        let hh = k.udiv(rg, self.t)?;
        let ti = k.urem(rg, self.t)?;
        let head = k.add(k.mul(self.g, k.i64c(self.group))?, hh)?;
        let off = |(base, st): &(IntValue<'ctx>, Vec<IntValue<'ctx>>)| -> R<IntValue<'ctx>> { k.add(*base, k.add(k.add(k.mul(self.b, st[0])?, k.mul(head, st[1])?)?, k.mul(ti, st[2])?)?) };
        let limit = if self.causal { k.smin(k.smax(k.add(k.add(ti, self.shift)?, k.i64c(1))?, k.i64c(0))?, self.len)? } else { self.len };
        let start = match self.window {
            Some(w) => k.smax(k.sub(limit, k.i64c(w))?, k.i64c(0))?,
            None => k.i64c(0),
        };
        Ok((valid, off(&self.q)?, off(&self.o)?, limit, start))
    }

    /// A first visible key of every row of the sequence (i64): with a window W
    /// `max(len − T + 1 − W, 0)` (query 0's), else 0.
    pub(super) fn seq_start(&self, k: &Kit<'ctx>) -> R<IntValue<'ctx>> {
        match self.window {
            Some(w) => k.smax(k.sub(k.add(self.shift, k.i64c(1))?, k.i64c(w))?, k.i64c(0)),
            None => Ok(k.i64c(0)),
        }
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
