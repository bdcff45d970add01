//! The attention-merge family ([`Family::AttentionMerge`]): `attention_merge(o_a, lse_a, o_b,
//! lse_b) -> (o, lse)`, the log-sum-exp merge of two partial attention states over disjoint
//! key sets — FlashInfer's "merge state" (Ye et al. 2024, "Cascade Inference"), the combine
//! step of split-KV and of cascade decoding.
//!
//! # What a kernel computes
//! For every row `r` (every index of `o` but the last axis, length `D`), with `M = max(lse_a,
//! lse_b)` (NaN-propagating) and `wₓ = exp(lseₓ − M)` (f32, the device math library's
//! precise `exp`, ≤ 3 ulp): `o = (w_a·o_a + w_b·o_b) / (w_a + w_b)`, rounded once to o's
//! dtype, and `lse = M + ln(w_a + w_b)` in f32. A state whose lse is −inf contributes nothing
//! (its `o` row is selected away, never multiplied, so NaN there cannot leak); two empty states
//! give `o = 0` and `lse = −inf`; NaN and +inf follow IEEE rules as in the interpreter.
//!
//! # Schedule
//! A thread handles `vec` consecutive elements of one row's D (8, 4, 2 or 1: the widest that
//! divides D and that every `o` operand's layout allows as one aligned vector access) per step
//! of a grid-stride loop; it reads the row's two lse values, computes the weights and writes
//! its `vec` outputs with one vector store; the row's first thread also writes `lse`. 256
//! threads a CTA, grid `⌈rows·D/vec / 256⌉`. Any strides: a row's coordinates are recovered
//! from its linear index by div/mod over the row dims.
//!
//! # Bodies
//! One `attention_merge` node whose operands are kernel inputs through views (`reshape`,
//! `slice`) and whose results are kernel outputs through `reshape`s (the `lse` result may be
//! unused).
//!
//! Design notes: book/src/design/attention.md

use inkwell::context::Context;
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::{DType, Dim, Family, Function, GridDim, Kernel, KernelGraph, LaunchPlan, OpKind, Value, ValueDef};

use super::analysis::{bad, exp0, unsupported};
use crate::isa::kit::{dims_of, Kit, R};
use crate::kernels::view::{buffer_infos, input_view, output_strides, View};
use crate::kernels::family::{Fixed, Generator};
use crate::kernels::ctx::KernelCtx;
use crate::target::Target;
use crate::error::CodegenError;

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
pub(crate) struct Merge {
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
    crate::kernels::family::compile::<AttentionMerge>(graph, kernel, target)
}

/// The attention-merge family's generator (one schedule).
pub(crate) struct AttentionMerge;

impl Generator for AttentionMerge {
    type Analysis<'g> = Merge;
    type Schedule = Fixed;
    fn analyse<'g>(graph: &'g KernelGraph, kernel: Kernel, _: &Target) -> R<Merge> {
        Merge::analyse(graph, kernel)
    }
    fn default_schedule(_: &Merge, _: &Target) -> R<Fixed> {
        Ok(Fixed)
    }
    fn build(m: &Merge, _: &Fixed, target: &Target) -> R<LaunchPlan> {
        plan(m, target)
    }
}

/// [`generate`] past the analysis.
fn plan(m: &Merge, target: &Target) -> R<LaunchPlan> {
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
        let (wa, wb) = (exp0(k, k.fsub(la, mu)?)?, exp0(k, k.fsub(lb, mu)?)?);
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
