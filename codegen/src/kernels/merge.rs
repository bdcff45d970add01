//! The attention-merge family ([`Family::AttentionMerge`]): `attention_merge(o_a, lse_a, o_b,
//! lse_b) -> (o, lse)`, the log-sum-exp merge of two partial attention states over disjoint
//! key sets — FlashInfer's "merge state" (Ye et al. 2024, "Cascade Inference: Memory
//! Bandwidth Efficient Shared Prefix Batch Decoding"), the combine step of split-KV decoding
//! (FlashDecoding) and of cascade decoding, where a shared prefix's state meets each request's
//! suffix state.
//!
//! # What a kernel computes
//! For every row `r` (every index of `o` but the last axis, length `D`), with `M = max(lse_a,
//! lse_b)` (NaN-propagating) and `wₓ = exp(lseₓ − M)` (f32, the device math library's
//! precise `exp`, ≤ 3 ulp): `o = (w_a·o_a + w_b·o_b) / (w_a + w_b)`, rounded once to o's
//! dtype, and `lse = M + ln(w_a + w_b)` in f32. A state whose lse is −inf contributes nothing
//! (its `o` row is selected away, never multiplied, so NaN there cannot leak); two empty states
//! give `o = 0` and `lse = −inf`; NaN and +inf follow IEEE rules as in the interpreter
//! (`sinter_ir::interp`).
//!
//! # Schedule
//! A thread handles `vec` consecutive elements of one row's D (8, 4, 2 or 1: the widest that
//! divides D and that every `o` operand's layout allows as one aligned vector access) per step
//! of a grid-stride loop; it reads the row's two lse values (shared through L1 by the row's
//! `D/vec` threads), computes the weights and writes its `vec` outputs with one vector store;
//! the row's first thread also writes `lse`. 256 threads a CTA, grid `⌈rows·D/vec / 256⌉`.
//! Any strides (views of the kernel's input buffers through `reshape` and `slice`): a row's
//! coordinates are recovered from its linear index by div/mod over the row dims.
//!
//! # Bodies
//! One `attention_merge` node whose operands are kernel inputs through views (`reshape`,
//! `slice`) and whose results are kernel outputs through `reshape`s (the `lse` result may be
//! unused).

use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Dim, Family, Function, GridDim, Kernel, KernelGraph, LaunchPlan, OpKind, Value, ValueDef};

use super::attention::{bad, unsupported};
use super::matmul::kit::{buffer_infos, dims_of, input_view, output_strides, Kit, View, R};
use super::KernelCtx;
use crate::target::Target;
use crate::CodegenError;

/// Threads per CTA.
const THREADS: u32 = 256;

/// An operand or result of the merge: buffer, offset and one stride per axis.
#[derive(Clone, Debug)]
struct Operand {
    buffer: usize,
    offset: Dim,
    strides: Vec<Dim>,
    align: u32,
}

impl Operand {
    fn of(v: &View) -> Operand {
        Operand { buffer: v.param, offset: v.offset.clone(), strides: v.strides.clone(), align: v.align }
    }

    /// Whether `vec` consecutive elements of the last axis are one aligned vector access.
    fn vector_ok(&self, vec: u32, dt: DType) -> bool {
        let c = i64::from(vec);
        let n = self.strides.len();
        vec == 1
            || (self.strides[n - 1].as_const() == Some(1)
                && self.strides[..n - 1].iter().all(|s| s.div_exact(c).is_some())
                && self.offset.div_exact(c).is_some()
                && self.align >= vec * dt.size_bytes() as u32)
    }
}

/// Facts of a merge kernel.
struct Merge {
    name: String,
    n_inputs: usize,
    n_buffers: usize,
    /// o's dtype.
    dtype: DType,
    /// The row dims (o's shape without its last axis).
    rows: Vec<Dim>,
    /// D (o's last axis).
    d: Dim,
    o_a: Operand,
    lse_a: Operand,
    o_b: Operand,
    lse_b: Operand,
    o: Operand,
    lse: Option<Operand>,
    /// Elements of D per thread-step.
    vec: u32,
}

/// The body output that is `result` through `reshape`s.
fn output_of(body: &Function, result: Value) -> Option<usize> {
    body.outputs.iter().position(|&o| {
        let mut cur = o;
        loop {
            if cur == result {
                return true;
            }
            match body.values.get(cur).map(|d| d.def) {
                Some(ValueDef::Result(n, _)) if body.nodes[n].op.kind == OpKind::Reshape => cur = body.nodes[n].inputs[0],
                _ => return false,
            }
        }
    })
}

impl Merge {
    fn analyse(graph: &KernelGraph, kernel: Kernel) -> R<Merge> {
        let name = kernel.to_string();
        let fam = Family::AttentionMerge;
        let kd = KernelCtx::new(graph, kernel)?.data;
        if kd.family != fam {
            return Err(bad(&name, fam, format!("the kernel's family is {:?}", kd.family)));
        }
        let bufs = buffer_infos(graph, kd).map_err(|e| bad(&name, fam, e))?;
        let body = &kd.body;
        let mut main = body.nodes.values().filter(|nd| !matches!(nd.op.kind, OpKind::Reshape | OpKind::Slice));
        let nd = match (main.next(), main.next()) {
            (Some(nd), None) if nd.op.kind == OpKind::AttentionMerge && nd.inputs.len() == 4 && nd.results.len() == 2 => nd,
            _ => return Err(unsupported(&name, fam, "the body must be one `attention_merge` node with views (reshape, slice) around it")),
        };
        let views = nd.inputs.iter().map(|&v| input_view(body, v, &bufs)).collect::<Result<Vec<_>, _>>().map_err(|e| unsupported(&name, fam, e))?;
        let ot = body.ty(nd.inputs[0]);
        let dtype = ot.dtype;
        let rank = ot.rank();
        if !dtype.is_float() || rank == 0 || body.ty(nd.inputs[2]) != ot {
            return Err(bad(&name, fam, format!("o_a and o_b must be one float type of rank ≥ 1, got {ot} and {}", body.ty(nd.inputs[2]))));
        }
        for i in [1, 3] {
            let lt = body.ty(nd.inputs[i]);
            if lt.dtype != DType::F32 || lt.shape[..] != ot.shape[..rank - 1] {
                return Err(bad(&name, fam, format!("an lse operand is {lt}, not f32 of o's rows")));
            }
        }
        let result = |i: usize| -> R<Option<Operand>> {
            let Some(j) = output_of(body, nd.results[i]) else { return Ok(None) };
            let buf = bufs.get(kd.inputs.len() + j).ok_or_else(|| bad(&name, fam, "missing output buffer"))?;
            let strides = output_strides(body, body.outputs[j], nd.results[i], buf).map_err(|e| unsupported(&name, fam, e))?;
            Ok(Some(Operand { buffer: kd.inputs.len() + j, offset: Dim::constant(0), strides, align: buf.align }))
        };
        let o = result(0)?.ok_or_else(|| unsupported(&name, fam, "the merged o must be a kernel output"))?;
        let lse = result(1)?;
        if body.outputs.len() != 1 + usize::from(lse.is_some()) {
            return Err(unsupported(&name, fam, "the kernel's outputs must be the `attention_merge` results (through reshapes)"));
        }
        let (o_a, lse_a, o_b, lse_b) = (Operand::of(&views[0]), Operand::of(&views[1]), Operand::of(&views[2]), Operand::of(&views[3]));
        let d = ot.shape[rank - 1].clone();
        let vec = [8u32, 4, 2, 1]
            .into_iter()
            .find(|&v| d.as_const().is_some_and(|n| n % i64::from(v) == 0) && [&o_a, &o_b, &o].iter().all(|t| t.vector_ok(v, dtype)))
            .unwrap_or(1);
        Ok(Merge {
            name,
            n_inputs: kd.inputs.len(),
            n_buffers: kd.inputs.len() + kd.outputs.len(),
            dtype,
            rows: ot.shape[..rank - 1].to_vec(),
            d,
            o_a,
            lse_a,
            o_b,
            lse_b,
            o,
            lse,
            vec,
        })
    }

    /// Thread-steps: rows · D / vec.
    fn groups(&self) -> Dim {
        let per_row = self.d.div_exact(i64::from(self.vec)).unwrap_or_else(|| self.d.clone());
        Dim::product(&self.rows).mul(&per_row)
    }

    fn dims(&self) -> Vec<Dim> {
        let mut v = self.rows.clone();
        v.push(self.d.clone());
        v.push(self.groups());
        for t in [&self.o_a, &self.lse_a, &self.o_b, &self.lse_b, &self.o].into_iter().chain(&self.lse) {
            v.push(t.offset.clone());
            v.extend(t.strides.iter().cloned());
        }
        dims_of(&v)
    }
}

/// Generates merge kernel `kernel` of `graph` (see the module docs).
///
/// Shapes: o_a, o_b `[..., D]` (bf16, f16 or f32; any strides), lse_a, lse_b f32 `[...]`;
/// results o `[..., D]` and lse f32 `[...]`. Parameters: the kernel's buffers, then its
/// symbolic sizes. Grid `(⌈rows·D/vec / 256⌉, 1, 1)`, block `(256, 1, 1)`.
///
/// # Errors
/// [`CodegenError::Unsupported`] for another body; [`CodegenError::BadKernel`] for a body
/// that does not match its buffers; LLVM errors otherwise.
pub fn generate(graph: &KernelGraph, kernel: Kernel, target: &Target) -> Result<LaunchPlan, CodegenError> {
    let m = Merge::analyse(graph, kernel)?;
    let ctx = Context::create();
    let entry = format!("{}_attention_merge", m.name);
    let (ptx, params) = Kit::build(&ctx, &entry, *target, m.n_inputs, m.n_buffers - m.n_inputs, &m.dims(), THREADS, |kit| build(kit, &m))?;
    Ok(LaunchPlan {
        entry,
        ptx,
        target: *target,
        grid: [GridDim { numerator: m.groups(), denominator: THREADS }, GridDim::fixed(1), GridDim::fixed(1)],
        block: [THREADS, 1, 1],
        shared_bytes: 0,
        params,
    })
}

fn build<'ctx>(kit: &Kit<'ctx>, m: &Merge) -> R<()> {
    let dt = m.dtype;
    let vec = m.vec;
    let per_row = kit.dim(&m.d.div_exact(i64::from(vec)).unwrap_or_else(|| m.d.clone()))?;
    let groups = kit.dim(&m.groups())?;
    let tid = kit.zext64(kit.sreg("tid.x")?)?;
    let cta = kit.zext64(kit.sreg("ctaid.x")?)?;
    let ncta = kit.zext64(kit.sreg("nctaid.x")?)?;
    let start = kit.add(kit.mul(cta, kit.i64c(i64::from(THREADS)))?, tid)?;
    let step = kit.mul(ncta, kit.i64c(i64::from(THREADS)))?;
    let ninf = kit.f32c(f64::NEG_INFINITY);
    let zero = kit.f32c(0.0);
    let rows = m.rows.iter().map(|d| kit.dim(d)).collect::<R<Vec<_>>>()?;
    kit.for_range(start, groups, step, |k, gi| {
        let row = k.udiv(gi, per_row)?;
        let col = k.mul(k.urem(gi, per_row)?, k.i64c(i64::from(vec)))?;
        // Row coordinates, innermost first.
        let mut idx: Vec<IntValue<'ctx>> = vec![k.i64c(0); rows.len()];
        let mut rest = row;
        for a in (0..rows.len()).rev() {
            idx[a] = k.urem(rest, rows[a])?;
            rest = k.udiv(rest, rows[a])?;
        }
        // Element offset of (row, col) in `t` (col ignored for an lse of rank rows.len()).
        let at = |k: &Kit<'ctx>, t: &Operand| -> R<IntValue<'ctx>> {
            let mut off = k.dim(&t.offset)?;
            for (i, s) in idx.iter().zip(&t.strides) {
                off = k.add(off, k.mul(*i, k.dim(s)?)?)?;
            }
            if t.strides.len() > idx.len() {
                off = k.add(off, k.mul(col, k.dim(&t.strides[idx.len()])?)?)?;
            }
            Ok(off)
        };
        let load = |k: &Kit<'ctx>, t: &Operand| -> R<Vec<FloatValue<'ctx>>> {
            let off = at(k, t)?;
            let ptr = k.buf(t.buffer)?;
            if t.vector_ok(vec, dt) {
                k.load_vec(dt, ptr, off, vec)
            } else {
                let sd = k.dim(&t.strides[t.strides.len() - 1])?;
                k.load_strided(dt, ptr, off, sd, vec)
            }
        };
        let la = k.load_vec(DType::F32, k.buf(m.lse_a.buffer)?, at(k, &m.lse_a)?, 1)?[0];
        let lb = k.load_vec(DType::F32, k.buf(m.lse_b.buffer)?, at(k, &m.lse_b)?, 1)?[0];
        let (oa, ob) = (load(k, &m.o_a)?, load(k, &m.o_b)?);
        let mx = k.max_nan(la, lb)?;
        let empty = k.fcmp(FloatPredicate::OEQ, mx, ninf)?;
        let mu = k.select_f(empty, zero, mx)?;
        let (wa, wb) = (k.exp(k.fsub(la, mu)?)?, k.exp(k.fsub(lb, mu)?)?);
        let (none_a, none_b) = (k.fcmp(FloatPredicate::OEQ, la, ninf)?, k.fcmp(FloatPredicate::OEQ, lb, ninf)?);
        let sum = k.fadd(wa, wb)?;
        let inv = k.fdiv(k.f32c(1.0), sum)?;
        let mut outs = Vec::with_capacity(vec as usize);
        for (&a, &b) in oa.iter().zip(&ob) {
            let ta = k.select_f(none_a, zero, k.fmul(wa, a)?)?;
            let tb = k.select_f(none_b, zero, k.fmul(wb, b)?)?;
            outs.push(k.select_f(empty, zero, k.fmul(k.fadd(ta, tb)?, inv)?)?);
        }
        let o_off = at(k, &m.o)?;
        if m.o.vector_ok(vec, dt) {
            k.store_vec(dt, k.buf(m.o.buffer)?, o_off, &outs)?;
        } else {
            let sd = k.dim(&m.o.strides[m.o.strides.len() - 1])?;
            for (e, v) in outs.iter().enumerate() {
                k.store_vec(dt, k.buf(m.o.buffer)?, k.add(o_off, k.mul(k.i64c(e as i64), sd)?)?, &[*v])?;
            }
        }
        if let Some(lse) = &m.lse {
            let lv = k.select_f(empty, ninf, k.fadd(mx, k.log(sum)?)?)?;
            let first = k.icmp(IntPredicate::EQ, col, k.i64c(0))?;
            k.if_then(first, |k| k.store_vec(DType::F32, k.buf(lse.buffer)?, at(k, lse)?, &[lv]))?;
        }
        Ok(())
    })
}

/// Emulated tests of the cascade pieces: the log-sum-exp outputs of the attention generators
/// (CUDA-core prefill and paged, tensor-core prefill, split-KV decode) and the merge kernel,
/// all against the interpreter (`matmul::emu`), and their ptxas reports.
#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::kernels::attention::{generate_paged, generate_prefill, generate_prefill_with, AttentionSchedule};
    use crate::kernels::matmul::emu::{check, random};
    use crate::kernels::matmul::tests::{assemble, d, plan_line, single_kernel, sym, ty};
    use sinter_ir::interp::Tensor;
    use sinter_ir::{Attr, Bindings, FunctionBuilder, Graph};

    fn bind(pairs: &[(&str, i64)]) -> Bindings {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    /// `attention(q, k, v) {lse=true}` returning (o, lse); `bshd` puts S before H.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn prefill_lse(dt: DType, b: Dim, h: i64, hkv: i64, sq: Dim, skv: Dim, hd: i64, causal: bool, bshd: bool) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "prefix");
        let shape = |heads: i64, s: &Dim| if bshd { vec![b.clone(), s.clone(), d(heads), d(hd)] } else { vec![b.clone(), d(heads), s.clone(), d(hd)] };
        let q = fb.param("q", ty(dt, &shape(h, &sq)));
        let k = fb.param("k", ty(dt, &shape(hkv, &skv)));
        let v = fb.param("v", ty(dt, &shape(hkv, &skv)));
        let attrs = vec![
            ("scale", Attr::Float(1.0 / (hd as f64).sqrt())),
            ("causal", Attr::Bool(causal)),
            ("heads", Attr::Int(h)),
            ("kv_heads", Attr::Int(hkv)),
            ("layout", Attr::Str(if bshd { "bshd" } else { "bhsd" }.into())),
            ("lse", Attr::Bool(true)),
        ];
        let r = fb.op(OpKind::Attention, &[q, k, v], attrs).unwrap();
        single_kernel(Family::Attention, fb.finish(&r).unwrap())
    }

    /// `paged_attention(...) {lse=true}` over pages `[P, page, Hkv, D]`, returning (o, lse).
    pub(crate) fn paged_lse(dt: DType, h: i64, hkv: i64, t: Dim, hd: i64, page: i64) -> (KernelGraph, Kernel) {
        let b = sym("B");
        let mut fb = FunctionBuilder::new(&Graph::new(), "suffix");
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
            ("lse", Attr::Bool(true)),
        ];
        let r = fb.op(OpKind::PagedAttention, &[q, kp, vp, bt, lens], attrs).unwrap();
        single_kernel(Family::PagedAttention, fb.finish(&r).unwrap())
    }

    /// `attention_merge` of o `[rows…, D]`: contiguous operands, or (`halves`) o_a and o_b as
    /// the two last-axis halves of one `[rows…, 2D]` input and lse_a, lse_b as the two
    /// leading-axis halves of one `[2, rows…]` input (strided and offset views).
    pub(crate) fn merge_graph(dt: DType, rows: &[Dim], hd: i64, halves: bool) -> (KernelGraph, Kernel) {
        let mut fb = FunctionBuilder::new(&Graph::new(), "merge");
        let mut os: Vec<Dim> = rows.to_vec();
        os.push(d(hd));
        let (oa, la, ob, lb) = if halves {
            let mut wide = rows.to_vec();
            wide.push(d(2 * hd));
            let mut two = vec![d(2)];
            two.extend(rows.iter().cloned());
            let o = fb.param("o", ty(dt, &wide));
            let l = fb.param("lse", ty(DType::F32, &two));
            let last = rows.len() as i64;
            let sl = |fb: &mut FunctionBuilder, x, axis: i64, a: i64, b: i64| {
                fb.op1(OpKind::Slice, &[x], vec![("axis", Attr::Int(axis)), ("start", Attr::Int(a)), ("end", Attr::Int(b))]).unwrap()
            };
            let oa = sl(&mut fb, o, last, 0, hd);
            let ob = sl(&mut fb, o, last, hd, 2 * hd);
            let la = sl(&mut fb, l, 0, 0, 1);
            let lb = sl(&mut fb, l, 0, 1, 2);
            let la = fb.op1(OpKind::Reshape, &[la], vec![("shape", Attr::Dims(rows.to_vec()))]).unwrap();
            let lb = fb.op1(OpKind::Reshape, &[lb], vec![("shape", Attr::Dims(rows.to_vec()))]).unwrap();
            (oa, la, ob, lb)
        } else {
            let oa = fb.param("o_a", ty(dt, &os));
            let la = fb.param("lse_a", ty(DType::F32, rows));
            let ob = fb.param("o_b", ty(dt, &os));
            let lb = fb.param("lse_b", ty(DType::F32, rows));
            (oa, la, ob, lb)
        };
        let r = fb.op(OpKind::AttentionMerge, &[oa, la, ob, lb], vec![]).unwrap();
        single_kernel(Family::AttentionMerge, fb.finish(&r).unwrap())
    }

    fn with_values(t: Tensor, at: &[(usize, f64)]) -> Tensor {
        let mut data = t.data().to_vec();
        for &(i, v) in at {
            data[i] = v;
        }
        Tensor::new(t.dtype(), t.shape(), data).unwrap()
    }

    /// The merge: rows where both states are finite, one is −inf (its o NaN: not read), both
    /// are −inf (0, −inf), a NaN lse, +inf lse; bf16 vectorised with symbolic rows; f32 with
    /// an odd D (element by element) through strided and offset views.
    #[test]
    fn emulated_merge_matches_interpreter() {
        let gen = |g: &KernelGraph, k: Kernel| generate(g, k, &Target::SM_80);
        let (g, k) = merge_graph(DType::BF16, &[sym("B"), d(4), d(1)], 64, false);
        let b = 3usize;
        let rows = b * 4;
        let la = with_values(random(DType::F32, &[b, 4, 1], 1), &[(1, f64::NEG_INFINITY), (2, f64::NEG_INFINITY), (5, f64::NAN), (6, f64::INFINITY)]);
        let lb = with_values(random(DType::F32, &[b, 4, 1], 2), &[(2, f64::NEG_INFINITY), (3, f64::NEG_INFINITY), (7, 40.0)]);
        // NaN in o_a of row 1 (lse_a −inf: never read) and of row 3's o_b (lse_b −inf).
        let oa = with_values(random(DType::BF16, &[b, 4, 1, 64], 3), &[(64 + 7, f64::NAN)]);
        let ob = with_values(random(DType::BF16, &[b, 4, 1, 64], 4), &[(3 * 64 + 9, f64::NAN)]);
        assert_eq!(rows, 12);
        check("merge bf16 B×4×1×64", &g, k, gen, &[oa, la, ob, lb], &bind(&[("B", b as i64)]));
        let (g, k) = merge_graph(DType::F32, &[sym("R")], 5, true);
        let r = 9usize;
        let l = with_values(random(DType::F32, &[2, r], 5), &[(0, f64::NEG_INFINITY), (r, f64::NEG_INFINITY), (r + 1, f64::NEG_INFINITY)]);
        check("merge f32 D5 views", &g, k, gen, &[random(DType::F32, &[r, 10], 6), l], &bind(&[("R", r as i64)]));
    }

    /// Rows' lse from the CUDA-core prefill kernel (f32, and bf16 with another schedule),
    /// with fully masked rows (causal, more queries than keys) and no keys at all.
    #[test]
    fn emulated_prefill_lse_cuda_cores() {
        let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
        let (g, k) = prefill_lse(DType::F32, sym("B"), 4, 2, sym("T"), sym("S"), 40, true, false);
        for (t, s) in [(7usize, 3usize), (5, 40), (3, 0)] {
            let ins = [random(DType::F32, &[1, 4, t, 40], 10), random(DType::F32, &[1, 2, s, 40], 11), random(DType::F32, &[1, 2, s, 40], 12)];
            check(&format!("f32 lse Sq={t} Skv={s}"), &g, k, gen, &ins, &bind(&[("B", 1), ("T", t as i64), ("S", s as i64)]));
        }
        let sch = AttentionSchedule { warps: 2, rows_per_warp: 4 };
        let gen_s = |g: &KernelGraph, k: Kernel| generate_prefill_with(g, k, &Target::SM_80, &sch);
        let (g, k) = prefill_lse(DType::BF16, d(2), 3, 1, sym("T"), sym("S"), 32, false, true);
        let ins = [random(DType::BF16, &[2, 9, 3, 32], 13), random(DType::BF16, &[2, 33, 1, 32], 14), random(DType::BF16, &[2, 33, 1, 32], 15)];
        check("bf16 bshd lse CUDA cores", &g, k, gen_s, &ins, &bind(&[("T", 9), ("S", 33)]));
    }

    /// Rows' lse from the tensor-core prefill kernel: the cascade's prefix shape in small
    /// (`bshd`, the batch axis holding key chunks, every query row of a chunk over one KV
    /// head), GQA 8, causal with fully masked rows, tails.
    #[test]
    fn emulated_prefill_lse_tensor_cores() {
        let gen = |g: &KernelGraph, k: Kernel| generate_prefill(g, k, &Target::SM_80);
        let (g, k) = prefill_lse(DType::BF16, d(2), 2, 2, sym("T"), sym("S"), 64, false, true);
        let plan = generate_prefill(&g, k, &Target::SM_80).unwrap();
        assert!(plan.ptx.contains("mma.sync"), "not the tensor-core kernel");
        let ins = [random(DType::BF16, &[2, 17, 2, 64], 20), random(DType::BF16, &[2, 70, 2, 64], 21), random(DType::BF16, &[2, 70, 2, 64], 22)];
        check("tc bshd lse", &g, k, gen, &ins, &bind(&[("T", 17), ("S", 70)]));
        let (g, k) = prefill_lse(DType::BF16, d(1), 8, 1, sym("T"), sym("S"), 128, true, false);
        let ins = [random(DType::BF16, &[1, 8, 20, 128], 23), random(DType::BF16, &[1, 1, 9, 128], 24), random(DType::BF16, &[1, 1, 9, 128], 25)];
        check("tc GQA 8 causal Sq>Skv lse", &g, k, gen, &ins, &bind(&[("T", 20), ("S", 9)]));
    }

    /// Rows' lse from the split-KV decode kernel (sm_80: the split across warps) and the
    /// CUDA-core paged kernel: sequence lengths 0 (−inf), 1, a partly filled page and several
    /// tiles a worker; GQA 1, 3 and 8.
    #[test]
    fn emulated_paged_lse() {
        let (b, pages, page, m) = (4usize, 40usize, 16usize, 10usize);
        let table = Tensor::new(DType::I32, &[b, m], (0..b * m).map(|i| ((i * 7 + 3) % pages) as f64).collect()).unwrap();
        let lens = Tensor::new(DType::I32, &[b], vec![0.0, 1.0, 37.0, 160.0]).unwrap();
        let sizes = bind(&[("B", b as i64), ("P", pages as i64), ("M", m as i64)]);
        for (h, hkv, hd) in [(2i64, 2i64, 64usize), (3, 1, 64), (8, 1, 128)] {
            let (g, k) = paged_lse(DType::BF16, h, hkv, d(1), hd as i64, page as i64);
            let ins = [
                random(DType::BF16, &[b, h as usize, 1, hd], 30),
                random(DType::BF16, &[pages, page, hkv as usize, hd], 31),
                random(DType::BF16, &[pages, page, hkv as usize, hd], 32),
                table.clone(),
                lens.clone(),
            ];
            let decode = |g: &KernelGraph, k: Kernel| crate::kernels::decode::generate(g, k, &Target::SM_80);
            check(&format!("split-KV lse GQA {h}/{hkv} D{hd}"), &g, k, decode, &ins, &sizes);
            let cuda = |g: &KernelGraph, k: Kernel| generate_paged(g, k, &Target::SM_80);
            check(&format!("CUDA-core paged lse GQA {h}/{hkv} D{hd}"), &g, k, cuda, &ins, &sizes);
        }
    }

    /// The cascade kernels at the bench shape (prefix attention on tensor cores with lse, the
    /// suffix decode with lse, the merge), sm_80 and sm_90a: plans and ptxas reports, no
    /// spills.
    #[test]
    fn cascade_ptxas_reports() {
        let cases = vec![
            ("prefix bf16 D128 bshd [16, 256, 8, 128] over [16, 2048, 8, 128] lse", prefill_lse(DType::BF16, d(16), 8, 8, d(256), d(2048), 128, false, true)),
            ("prefix bf16 D128 bshd symbolic lse", prefill_lse(DType::BF16, sym("N"), 8, 8, sym("R"), sym("S"), 128, false, true)),
            ("prefix f32 D64 CUDA cores lse", prefill_lse(DType::F32, sym("B"), 4, 4, sym("T"), sym("S"), 64, true, false)),
            ("suffix bf16 D128 GQA 32/8 T=1 page 16 lse", paged_lse(DType::BF16, 32, 8, d(1), 128, 16)),
            ("merge bf16 [B, 32, 1, 128]", merge_graph(DType::BF16, &[sym("B"), d(32), d(1)], 128, false)),
            ("merge f32 [R, 5] views", merge_graph(DType::F32, &[sym("R")], 5, true)),
        ];
        let mut text = String::new();
        for t in [Target::SM_80, Target::SM_90A] {
            for (what, (g, k)) in &cases {
                let plan = crate::compile_kernel(g, *k, &t).unwrap_or_else(|e| panic!("{what}: {e}"));
                let Some(report) = assemble(&plan) else { return };
                text.push_str(&format!("# {what}\n{}\n{report}", plan_line(&plan)));
            }
        }
        insta::assert_snapshot!("cascade_ptxas", text);
    }
}
