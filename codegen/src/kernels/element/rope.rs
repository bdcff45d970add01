//! Rotary position embeddings (`rope`, interleaved and rotate-half). RoPE's sines and cosines
//! are memoised per (pair, position), so the heads of one position that a thread rotates
//! share them.
//!
//! Design notes: book/src/design/element-wise.md

use inkwell::types::BasicTypeEnum;
use inkwell::values::{AsValueRef, FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{Dim, Node, Value};

use super::{bad, unsupported, At, Ax, Eval, Lanes, Scalar, Tag};
use crate::math::{self, Ops, R};
use crate::error::CodegenError;

impl<'a, 'ctx> Eval<'a, 'ctx> {
    /// `rope(x, positions)` at `at`: pair `p` of the first R = `rotary_dim` features of the
    /// last axis (length D) rotated by `pos·inv_freq[p]`, the features from R on copied. The
    /// angle is computed in **f64** (`pos` exactly, `inv_freq` from a table computed on the
    /// host by [`sinter_ir::rope::freqs`], as the interpreter computes it: θ^(−2p/R), scaled
    /// as the op's `scaling` says), reduced by `π/2` in f64 and its sine and cosine evaluated
    /// in f32 ([`math::sincos_d`], absolute error ≤ 1.2e-7), then multiplied by the attention
    /// factor (YaRN's; skipped when 1); `out_a = x_a·cos − x_b·sin`,
    /// `out_b = x_b·cos + x_a·sin` with one `fma` each, rounded once to the dtype. Error
    /// bound: `|Δout| ≤ 2.5e-7·a·(|x_a| + |x_b|)` (a the attention factor, one more f32
    /// rounding of cos and sin when a ≠ 1) before the final rounding, for positions below 2⁵⁰.
    /// With R < D a lane group (R/2 a multiple of the lanes) is rotated or copied as a whole,
    /// chosen by a `select`; the copied lanes' pair index is clamped to 0 so that the table
    /// read stays inside it.
    ///
    /// One sine/cosine per pair: the interleaved form shares it between the two lanes of a
    /// pair; the rotate-half form, under a generator's [`RopePair`] hint, computes both halves
    /// of the pair at once (one load of each half, two outputs) and memoises the second. The
    /// angles are memoised per (pair, position value): the other heads of the position that
    /// the same thread rotates reuse them ([`Eval::rope_sincos_memo`]).
    pub(super) fn rope(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let x = self.input(node, 0)?;
        let pos = self.input(node, 1)?;
        let op = &self.f.nodes[node].op;
        let interleaved = op.str("form") == Some("interleaved");
        let xshape = self.shape(x)?;
        let rank = xshape.len();
        let Some(d) = xshape.last().and_then(Dim::as_const) else {
            return unsupported("rope over a last axis that is not a constant");
        };
        if d % 2 != 0 || d == 0 {
            return bad(format!("rope over an odd last axis ({d})"));
        }
        let freqs = sinter_ir::rope::freqs(op, d as usize).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e })?;
        let r = freqs.rotary_dim as i64;
        let partial = r < d;
        let af = freqs.attention_factor;
        // Pairs are (i, i + R/2) in the rotate-half form.
        let half = r / 2;
        let lanes = at.lanes;
        let last = at.axes[rank - 1];
        let vector_ok = lanes == 1
            || (last.step
                && last.aligned
                && at.axes[..rank - 1].iter().all(|a| !a.step)
                && if interleaved { lanes % 2 == 0 && r % i64::from(lanes) == 0 } else { half % i64::from(lanes) == 0 });
        if !vector_ok {
            return self.per_lane(result, at);
        }
        let dt = self.dtype(result)?;
        // Position (uniform over the lanes).
        let pshape = self.shape(pos)?;
        let lead = At { axes: at.axes[..rank - 1].to_vec(), lanes: 1 };
        let pat = self.broadcast_at(&lead, &xshape[..rank - 1], &pshape)?;
        let p = self.eval(pos, &pat)?;
        let p = p.first().copied().ok_or_else(|| CodegenError::Builder("no position".into()))?.i()?;
        let pd = self.kb.b.build_signed_int_to_float(p, self.kb.cx.f64_type(), "pos")?;
        // Inverse frequencies, as the interpreter computes them.
        let key: Vec<u64> = freqs.inv_freq.iter().map(|f| f.to_bits()).collect();
        let table = match self.rope_tables.get(&key) {
            Some(t) => *t,
            None => {
                let t = self.kb.global_f64_table(&freqs.inv_freq, "rope_inv_freq");
                self.rope_tables.insert(key, t);
                t
            }
        };
        let base = last.base;
        // Whether this lane group rotates (R < D): its first lane is below R.
        let rotates = if partial { Some(self.ilt(base, self.ic(r))?) } else { None };
        // Rotate-half with both halves in this thread: `base` is in the first half.
        let paired = match self.rope_pair {
            Some(rp) if !interleaved && !partial && rp.d == d && rp.first.as_value_ref() == base.as_value_ref() => Some(rp.second),
            _ => None,
        };
        if let Some(second) = paired {
            let xs = self.eval(x, at)?;
            let mut axes = at.axes.clone();
            axes[rank - 1] = Ax { base: second, tag: Tag::Other, ..last };
            let at2 = At { axes, lanes };
            let xp = self.eval(x, &at2)?;
            let mut out1 = Vec::with_capacity(lanes as usize);
            let mut out2 = Vec::with_capacity(lanes as usize);
            for l in 0..lanes as usize {
                let (s, c) = self.rope_sincos_memo(table, base, l as u32, p, pd, |ev| if l > 0 { ev.iadd(base, ev.ic(l as i64)) } else { Ok(base) })?;
                let (s, c) = self.rope_scale(s, c, af)?;
                let xa = xs[l].f()?;
                let xb = xp[l].f()?;
                // First half: x_a·c − x_b·s; second: x_b·c + x_a·s.
                let xbs = self.kb.fmul(xb, s)?;
                let nxbs = self.kb.fneg(xbs)?;
                let r1 = self.kb.ffma(xa, c, nxbs)?;
                out1.push(Scalar::F(self.kb.round_to(r1, dt)?));
                let xas = self.kb.fmul(xa, s)?;
                let r2 = self.kb.ffma(xb, c, xas)?;
                out2.push(Scalar::F(self.kb.round_to(r2, dt)?));
            }
            let k2 = Self::key(result, &at2);
            self.memo.insert(k2, out2);
            return Ok(out1);
        }
        let xs = self.eval(x, at)?;
        // Partner values, pair indices and signs per lane.
        let (partner, pair_base, neg_first): (Lanes<'ctx>, IntValue<'ctx>, Option<IntValue<'ctx>>) = if interleaved {
            if lanes == 1 {
                let pb = self.kb.b.build_xor(base, self.ic(1), "pb")?;
                let mut axes = at.axes.clone();
                axes[rank - 1] = Ax { base: pb, step: false, aligned: true, zero: false, tag: Tag::Other };
                let xp = self.eval(x, &At { axes, lanes: 1 })?;
                let pair = self.kb.b.build_right_shift(base, self.ic(1), false, "pair")?;
                let odd = self.kb.b.build_and(base, self.ic(1), "odd")?;
                let even = self.kb.b.build_int_compare(IntPredicate::EQ, odd, self.ic(0), "even")?;
                (xp, pair, Some(even))
            } else {
                let xp: Lanes<'ctx> = (0..lanes as usize).map(|l| xs[l ^ 1]).collect();
                let pair = self.kb.b.build_right_shift(base, self.ic(1), false, "pair")?;
                (xp, pair, None)
            }
        } else {
            let hv = self.ic(half);
            let first = self.ilt(base, hv)?;
            let up = self.iadd(base, hv)?;
            let down = self.isub(base, hv)?;
            let pb = self.kb.b.build_select(first, up, down, "pb")?.into_int_value();
            let mut axes = at.axes.clone();
            axes[rank - 1] = Ax { base: pb, step: last.step, aligned: last.aligned, zero: false, tag: Tag::Other };
            let xp = self.eval(x, &At { axes, lanes })?;
            let pair = self.kb.b.build_select(first, base, down, "pair")?.into_int_value();
            (xp, pair, Some(first))
        };
        // A copied group reads pair 0's angle (in the table) and discards it.
        let pair_base = match rotates {
            Some(rot) => self.kb.b.build_select(rot, pair_base, self.ic(0), "pair")?.into_int_value(),
            None => pair_base,
        };
        let mut out = Vec::with_capacity(lanes as usize);
        let mut sc: Option<(FloatValue<'ctx>, FloatValue<'ctx>)> = None;
        for l in 0..lanes as usize {
            // Interleaved lanes 2i and 2i + 1 are one pair: one angle.
            if !(interleaved && lanes > 1 && l % 2 == 1) || sc.is_none() {
                // The memo key: the lane's pair relative to `base` (tagged by the form).
                let (tag, off) = if interleaved && lanes > 1 { (0x1000 | (l / 2) as u32, (l / 2) as i64) } else { (0x2000 | l as u32, l as i64) };
                sc = Some(self.rope_sincos_memo(table, base, tag, p, pd, |ev| if off > 0 { ev.iadd(pair_base, ev.ic(off)) } else { Ok(pair_base) })?);
            }
            let (s, c) = sc.ok_or_else(|| CodegenError::Builder("no angle".into()))?;
            let (s, c) = self.rope_scale(s, c, af)?;
            let xa = xs[l].f()?;
            let xb = partner[l].f()?;
            let xbs = self.kb.fmul(xb, s)?;
            // First of a pair: x·c − x_partner·s; second: x·c + x_partner·s.
            let nxbs = self.kb.fneg(xbs)?;
            let term = match neg_first {
                Some(fl) => self.kb.fsel(fl, nxbs, xbs)?,
                None => {
                    if l % 2 == 0 {
                        nxbs
                    } else {
                        xbs
                    }
                }
            };
            let v = self.kb.ffma(xa, c, term)?;
            let v = self.kb.round_to(v, dt)?;
            out.push(Scalar::F(match rotates {
                Some(rot) => self.kb.fsel(rot, v, xa)?,
                None => v,
            }));
        }
        Ok(out)
    }

    /// `(a·sin, a·cos)`: the YaRN attention factor `a` on a pair's sine and cosine, as HF
    /// scales its tables (nothing when `a` is 1).
    fn rope_scale(&mut self, s: FloatValue<'ctx>, c: FloatValue<'ctx>, a: f64) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        if a == 1.0 {
            return Ok((s, c));
        }
        let k = self.kb.f32c(a as f32);
        Ok((self.kb.fmul(s, k)?, self.kb.fmul(c, k)?))
    }

    /// [`Eval::rope_sincos`] of the pair `pi(self)` computes, memoised by (`table`, `base`,
    /// `tag`, the position `p`): the pair is `tag`'s offset from `base` under the position
    /// `p`, whichever head of the position it is for, so a thread rotating several heads of
    /// one position (the head-sharing schedule of [`super::kernel`]) evaluates each angle once.
    fn rope_sincos_memo(
        &mut self,
        table: PointerValue<'ctx>,
        base: IntValue<'ctx>,
        tag: u32,
        p: IntValue<'ctx>,
        pd: FloatValue<'ctx>,
        pi: impl FnOnce(&mut Self) -> R<IntValue<'ctx>>,
    ) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let key = (table.as_value_ref() as usize, base.as_value_ref() as usize, tag, p.as_value_ref() as usize);
        if let Some(sc) = self.sincos.get(&key) {
            return Ok(*sc);
        }
        let pi = pi(self)?;
        let sc = self.rope_sincos(table, pi, pd)?;
        self.sincos.insert(key, sc);
        Ok(sc)
    }

    /// `(sin, cos)` of RoPE pair `pi`'s angle `pos · inv_freq[pi]` (f64).
    fn rope_sincos(&mut self, table: PointerValue<'ctx>, pi: IntValue<'ctx>, pd: FloatValue<'ctx>) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let f64t: BasicTypeEnum<'ctx> = self.kb.cx.f64_type().into();
        let tp = self.kb.gep(f64t, table, pi)?;
        let inv = self.kb.load(f64t, tp, 8)?.into_float_value();
        let angle = self.kb.dmul(pd, inv)?;
        math::sincos_d(self.kb, angle)
    }
}
