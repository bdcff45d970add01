//! Row-reduction nodes read element by element: a `reduce_*`, `softmax`, `rms_norm` or
//! `layer_norm` node's value at a coordinate, from the row statistics the row-reduction
//! generator computed ([`RowScalars`]). A `layer_norm`'s intermediate `bf16` rounding is done
//! in pairs (`cvt.rn.bf16x2.f32`, [`Eval::round_lanes`]).
//!
//! Design notes: book/src/design/element-wise.md

use inkwell::values::{AsValueRef, FloatValue};
use sinter_ir::{DType, Dim, Node, OpKind, Value};

use super::{unsupported, At, Eval, Lanes, RowScalars, Scalar, Tag};
use crate::isa::KernelBuilder;
use crate::math::{Ops, R};

impl<'a, 'ctx> Eval<'a, 'ctx> {
    /// Checks that a row-scalar node (a reduction's result, shape `[L…, 1]` or `[L…]`) is
    /// read at the current row: each leading coordinate is the row's own (or a size-1 axis).
    fn check_row_coord(&self, node: Node, shape: &[Dim], at: &At<'ctx>, keep_last: bool) -> R<()> {
        let lead = if keep_last { shape.len().saturating_sub(1) } else { shape.len() };
        for (i, (a, d)) in at.axes.iter().zip(shape).enumerate().take(lead) {
            if !(a.tag == Tag::Ref(i) || (d.is_one() && a.zero)) {
                return unsupported(format!(
                    "the result of {node} `{}` is read at another row than its own (broadcast across rows)",
                    self.f.nodes[node].op.kind.name()
                ));
            }
        }
        // The reduced (size-1) axis: every in-bounds coordinate is 0.
        Ok(())
    }

    /// `e^(x − max)` of a softmax node at `at` (memoised: the sum pass and the output pass
    /// share it in the one-read schedule).
    pub fn softmax_exp(&mut self, node: Node, m_safe: FloatValue<'ctx>, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let key = (node, 1u8, at.axes.iter().map(|a| (a.base.as_value_ref() as usize, a.step)).collect::<Vec<_>>(), at.lanes);
        if let Some(v) = self.derived.get(&key) {
            return Ok(v.clone());
        }
        let x = self.input(node, 0)?;
        let xs = self.eval(x, at)?;
        let mut out = Vec::with_capacity(xs.len());
        for s in xs {
            out.push(Scalar::F(exp_shifted_ftz(self.kb, s.f()?, m_safe)?));
        }
        self.derived.insert(key, out.clone());
        Ok(out)
    }

    /// `x − mean` of a layer_norm node at `at` (memoised).
    pub fn centered(&mut self, node: Node, mean: FloatValue<'ctx>, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let key = (node, 2u8, at.axes.iter().map(|a| (a.base.as_value_ref() as usize, a.step)).collect::<Vec<_>>(), at.lanes);
        if let Some(v) = self.derived.get(&key) {
            return Ok(v.clone());
        }
        let x = self.input(node, 0)?;
        let xs = self.eval(x, at)?;
        let mut out = Vec::with_capacity(xs.len());
        for s in xs {
            out.push(Scalar::F(self.kb.fsub(s.f()?, mean)?));
        }
        self.derived.insert(key, out.clone());
        Ok(out)
    }

    /// Each of `vals` rounded to `dt` ([`KernelBuilder::round_to`]); `bf16` pairs under
    /// [`Eval::bf16_words`] are rounded together (`cvt.rn.bf16x2.f32`, PTX ISA §9.7.9.21)
    /// and split back into f32 with integer operations: 1.5 instructions an element where
    /// `cvt.rn.bf16.f32` and a shift cost 2. Rounds the same as one at a time.
    pub(super) fn round_lanes(&self, vals: Vec<FloatValue<'ctx>>, dt: DType) -> R<Vec<FloatValue<'ctx>>> {
        if !(self.pair_rounding && dt == DType::BF16 && vals.len() % 2 == 0) {
            return vals.into_iter().map(|v| self.kb.round_to(v, dt)).collect();
        }
        let (f32t, i32t) = (self.kb.cx.f32_type(), self.kb.cx.i32_type());
        let v2 = f32t.vec_type(2);
        let mut out = Vec::with_capacity(vals.len());
        for pair in vals.chunks(2) {
            // One `fptrunc <2 x float>`: `cvt.rn.bf16x2.f32` (two scalar ones inserted into a
            // vector are not paired by the back end).
            let mut v = v2.get_undef();
            for (i, x) in pair.iter().enumerate() {
                v = self.kb.b.build_insert_element(v, *x, self.kb.i32c(i as i64), "p")?;
            }
            let h = self.kb.b.build_float_trunc(v, self.kb.cx.bf16_type().vec_type(2), "h2")?;
            let w = self.kb.b.build_bit_cast(h, i32t, "w")?.into_int_value();
            let lo = self.kb.b.build_left_shift(w, self.kb.i32c(16), "lo")?;
            let hi = self.kb.b.build_and(w, self.kb.i32c(-65536), "hi")?;
            out.push(self.kb.b.build_bit_cast(lo, f32t, "lo")?.into_float_value());
            out.push(self.kb.b.build_bit_cast(hi, f32t, "hi")?.into_float_value());
        }
        Ok(out)
    }

    pub(super) fn row_node(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        use OpKind::*;
        let kind = self.f.nodes[node].op.kind;
        let Some(stats) = self.rows.get(&node).copied() else {
            return unsupported(format!(
                "`{}` ({node}) needs a row-reduction kernel (family RowReduction) over the last axis",
                kind.name()
            ));
        };
        let dt = self.dtype(result)?;
        let shape = self.shape(result)?;
        match (kind, stats) {
            (ReduceSum | ReduceMax | ReduceMin | ReduceMean, RowScalars::Reduce(s)) => {
                let keep = self.f.nodes[node].op.bool("keepdim").unwrap_or(true);
                self.check_row_coord(node, &shape, at, keep)?;
                Ok(vec![s; at.lanes as usize])
            }
            (Softmax | LogSoftmax, RowScalars::Softmax { m_safe, m, inv_s, log_s, all_neg_inf }) => {
                let mut out = Vec::with_capacity(at.lanes as usize);
                // An all −inf row's special case once per row, not per element: its `e` are 0
                // (x − 0 = −inf) and its 1/Σe is taken as 0, so e·(1/Σe) = 0; its x − m_safe
                // is −inf and log Σe is taken as 0. Elsewhere m_safe = m (NaN included).
                let _ = m;
                let zero = self.kb.f32c(0.0);
                if kind == Softmax {
                    let inv = self.kb.fsel(all_neg_inf, zero, inv_s)?;
                    let e = self.softmax_exp(node, m_safe, at)?;
                    for s in e {
                        let p = self.kb.fmul(s.f()?, inv)?;
                        out.push(Scalar::F(self.kb.round_to(p, dt)?));
                    }
                } else {
                    let ls = self.kb.fsel(all_neg_inf, zero, log_s)?;
                    let x = self.input(node, 0)?;
                    let xs = self.eval(x, at)?;
                    // −((m − x) + log Σe), not (x − m) − log Σe: at the row max, where log Σe
                    // rounds to +0 in f32, the result is −0 like the exact value's sign (≤ 0).
                    for s in xs {
                        let d = self.kb.fsub(m_safe, s.f()?)?;
                        let t = self.kb.fadd(d, ls)?;
                        let r = self.kb.fneg(t)?;
                        out.push(Scalar::F(self.kb.round_to(r, dt)?));
                    }
                }
                Ok(out)
            }
            (RmsNorm, RowScalars::RmsNorm { r }) => {
                let x = self.input(node, 0)?;
                let xs = self.eval(x, at)?;
                let ws = self.operand(node, 1, result, at)?;
                let mut hs = Vec::with_capacity(xs.len());
                for s in xs {
                    hs.push(self.kb.fmul(s.f()?, r)?);
                }
                        // One at a time: LLVM turns `round(round(x·r)·w)` into a `bf16x2` multiply.
                let hs: Vec<FloatValue<'ctx>> = hs.into_iter().map(|h| self.kb.round_to(h, dt)).collect::<R<_>>()?;
                let mut out = Vec::with_capacity(hs.len());
                for (h, w) in hs.into_iter().zip(ws) {
                    let o = self.kb.fmul(h, w.f()?)?;
                    out.push(Scalar::F(self.kb.round_to(o, dt)?));
                }
                Ok(out)
            }
            (LayerNorm, RowScalars::LayerNorm { mean, d, r }) => {
                let cs = self.centered(node, mean, at)?;
                let ws = self.operand(node, 1, result, at)?;
                let bs = self.operand(node, 2, result, at)?;
                let mut out = Vec::with_capacity(cs.len());
                // (c − d)·r as one `fma`, c·r − d·r (|d| is a small correction of the mean:
                // the rounding of d·r is far below an f32 ulp of the result).
                let dr = self.kb.fmul(d, r)?;
                let ndr = self.kb.fneg(dr)?;
                let mut hs = Vec::with_capacity(cs.len());
                for c in cs {
                    hs.push(self.kb.ffma(c.f()?, r, ndr)?);
                }
                if self.ln_bf16_fma && dt == DType::BF16 && hs.len() % 2 == 0 {
                    let (f32t, bf16t) = (self.kb.cx.f32_type(), self.kb.cx.bf16_type());
                    let pack = |kb: &KernelBuilder<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>| -> R<inkwell::values::VectorValue<'ctx>> {
                        let mut v = f32t.vec_type(2).get_undef();
                        for (i, x) in [a, b].into_iter().enumerate() {
                            v = kb.b.build_insert_element(v, x, kb.i32c(i as i64), "p")?;
                        }
                        Ok(kb.b.build_float_trunc(v, bf16t.vec_type(2), "h2")?)
                    };
                    for i in (0..hs.len()).step_by(2) {
                        let h2 = pack(self.kb, hs[i], hs[i + 1])?;
                        let w2 = pack(self.kb, ws[i].f()?, ws[i + 1].f()?)?;
                        let b2 = pack(self.kb, bs[i].f()?, bs[i + 1].f()?)?;
                        let o2 = self.kb.intrinsic_value("llvm.fma", &[bf16t.vec_type(2).into()], &[h2.into(), w2.into(), b2.into()])?.into_vector_value();
                        for j in 0..2 {
                            let o = self.kb.b.build_extract_element(o2, self.kb.i32c(j), "o")?.into_float_value();
                            out.push(Scalar::F(self.kb.b.build_float_ext(o, f32t, "o")?));
                        }
                    }
                    return Ok(out);
                }
                let hs = self.round_lanes(hs, dt)?;
                for ((h, w), b) in hs.into_iter().zip(ws).zip(bs) {
                    let o = self.kb.ffma(h, w.f()?, b.f()?)?;
                    out.push(Scalar::F(self.kb.round_to(o, dt)?));
                }
                Ok(out)
            }
            _ => unsupported(format!("`{}` ({node}) is used before its row statistics are complete", kind.name())),
        }
    }
}

/// `e^(x − y)` for softmax: [`math::exp_shifted`]'s `ex2((x − y)·log2e)` with
/// `ex2.approx.ftz.f32` (PTX ISA §9.7.4.12): a result below 2⁻¹²⁶ is flushed to 0, an
/// absolute error below 1.2e-38, and the instruction is one `MUFU.EX2` where the non-`ftz`
/// form costs four (a range test and two rescalings around it). A softmax's exponent is
/// never positive, so nothing else changes; −inf gives 0 and NaN stays NaN.
pub(crate) fn exp_shifted_ftz<'ctx>(kb: &mut KernelBuilder<'ctx>, x: FloatValue<'ctx>, y: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    let d = kb.fsub(x, y)?;
    let l2e = kb.f32c(std::f32::consts::LOG2_E);
    let p = kb.fmul(d, l2e)?;
    Ok(kb.intrinsic_value("llvm.nvvm.ex2.approx.ftz", &[kb.cx.f32_type().into()], &[p.into()])?.into_float_value())
}
