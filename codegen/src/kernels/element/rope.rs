//! Rotary position embeddings, interleaved and rotate-half: `rope` (angles from positions)
//! and `rotary` (caller-supplied cos/sin tables), one pairing logic for both; only where each
//! element's cosine and sine come from differs ([`Source`]). RoPE's sines and cosines are
//! memoised per (pair, position), so the heads of one position that a thread rotates share
//! them; `rotary`'s table entries are loads at the element's own coordinate.
//!
//! Design notes: book/src/design/element-wise.md

use inkwell::types::BasicTypeEnum;
use inkwell::values::{AsValueRef, FloatValue, IntValue, PointerValue};
use inkwell::IntPredicate;
use sinter_ir::{Dim, Node, OpKind, Value};

use super::{bad, unsupported, At, Ax, Eval, Lanes, Scalar, Tag};
use crate::math::{self, Ops, R};
use crate::error::CodegenError;

/// Where a rotation's cosines and sines come from.
enum Source<'ctx> {
    /// `rope`: the angle pos·inv_freq[pair] (`table` of inverse frequencies, `p` the row's
    /// position, `pd` it in f64), scaled by the attention factor `af`.
    Angles { table: PointerValue<'ctx>, p: IntValue<'ctx>, pd: FloatValue<'ctx>, af: f64 },
    /// `rotary`: the caller's tables, read at each element's coordinate in x (of `xshape`).
    Tables { cos: Value, sin: Value, xshape: Vec<Dim> },
}

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
    ///
    /// `rotary(x, cos, sin)` takes the same path with each element's own `cos` and `sin`
    /// entries (loaded at its coordinate, broadcast as the op broadcasts them) in place of
    /// the pair's angle: `out_a = x_a·cos_a − x_b·sin_a`, `out_b = x_b·cos_b + x_a·sin_b`,
    /// one `fma` each in f32 and one rounding; a copied group (R < D) reads the tables' first
    /// entries and discards them.
    pub(super) fn rope(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let x = self.input(node, 0)?;
        let op = &self.f.nodes[node].op;
        let tables = op.kind == OpKind::Rotary;
        let interleaved = op.str("form") == Some("interleaved");
        let xshape = self.shape(x)?;
        let rank = xshape.len();
        let Some(d) = xshape.last().and_then(Dim::as_const) else {
            return unsupported(format!("{} over a last axis that is not a constant", op.kind.name()));
        };
        let rd = sinter_ir::rope::rotary_dim(op, Some(d)).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e })?;
        let freqs = if tables {
            None
        } else {
            if d % 2 != 0 || d == 0 {
                return bad(format!("rope over an odd last axis ({d})"));
            }
            Some(sinter_ir::rope::freqs(op, d as usize).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e })?)
        };
        let r = freqs.as_ref().map_or(rd.unwrap_or(d), |f| f.rotary_dim as i64);
        if r % 2 != 0 || r == 0 {
            return bad(format!("{} over an odd number of rotated features ({r})", op.kind.name()));
        }
        let partial = r < d;
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
        let src = match freqs {
            Some(freqs) => self.angle_source(node, &xshape, at, &freqs)?,
            None => Source::Tables { cos: self.input(node, 1)?, sin: self.input(node, 2)?, xshape: xshape.clone() },
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
            // Tables: each half's own entries; angles: one per pair, shared by both halves.
            let (t1, t2) = match &src {
                Source::Tables { .. } => (Some(self.table_lanes(&src, at, None)?), Some(self.table_lanes(&src, &at2, None)?)),
                Source::Angles { .. } => (None, None),
            };
            let mut out1 = Vec::with_capacity(lanes as usize);
            let mut out2 = Vec::with_capacity(lanes as usize);
            for l in 0..lanes as usize {
                let ((s1, c1), (s2, c2)) = match (&t1, &t2) {
                    (Some(a), Some(b)) => (a[l], b[l]),
                    _ => {
                        let sc = self.angle_sincos(&src, base, l as u32, |ev| if l > 0 { ev.iadd(base, ev.ic(l as i64)) } else { Ok(base) })?;
                        (sc, sc)
                    }
                };
                let xa = xs[l].f()?;
                let xb = xp[l].f()?;
                // First half: x_a·c − x_b·s; second: x_b·c + x_a·s.
                let xbs = self.kb.fmul(xb, s1)?;
                let nxbs = self.kb.fneg(xbs)?;
                let r1 = self.kb.ffma(xa, c1, nxbs)?;
                out1.push(Scalar::F(self.kb.round_to(r1, dt)?));
                let xas = self.kb.fmul(xa, s2)?;
                let r2 = self.kb.ffma(xb, c2, xas)?;
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
        // A copied group reads pair 0's angle (in the table) and discards it; likewise the
        // first entries of cos/sin tables (their last axis is R).
        let pair_base = match rotates {
            Some(rot) => self.kb.b.build_select(rot, pair_base, self.ic(0), "pair")?.into_int_value(),
            None => pair_base,
        };
        let tab = match &src {
            Source::Tables { .. } => Some(self.table_lanes(&src, at, rotates)?),
            Source::Angles { .. } => None,
        };
        let mut out = Vec::with_capacity(lanes as usize);
        let mut sc: Option<(FloatValue<'ctx>, FloatValue<'ctx>)> = None;
        for l in 0..lanes as usize {
            if let Some(t) = &tab {
                sc = Some(t[l]);
            } else if !(interleaved && lanes > 1 && l % 2 == 1) || sc.is_none() {
                // Interleaved lanes 2i and 2i + 1 are one pair: one angle. The memo key: the
                // lane's pair relative to `base` (tagged by the form).
                let (tag, off) = if interleaved && lanes > 1 { (0x1000 | (l / 2) as u32, (l / 2) as i64) } else { (0x2000 | l as u32, l as i64) };
                sc = Some(self.angle_sincos(&src, base, tag, |ev| if off > 0 { ev.iadd(pair_base, ev.ic(off)) } else { Ok(pair_base) })?);
            }
            let (s, c) = sc.ok_or_else(|| CodegenError::Builder("no angle".into()))?;
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

    /// A `rope`'s angle source: its position at the row of `at` (uniform over the lanes) and
    /// its inverse-frequency table, as the interpreter computes it ([`sinter_ir::rope::freqs`]).
    fn angle_source(&mut self, node: Node, xshape: &[Dim], at: &At<'ctx>, freqs: &sinter_ir::rope::RopeFreqs) -> R<Source<'ctx>> {
        let pos = self.input(node, 1)?;
        let rank = xshape.len();
        let pshape = self.shape(pos)?;
        let lead = At { axes: at.axes[..rank - 1].to_vec(), lanes: 1 };
        let pat = self.broadcast_at(&lead, &xshape[..rank - 1], &pshape)?;
        let p = self.eval(pos, &pat)?;
        let p = p.first().copied().ok_or_else(|| CodegenError::Builder("no position".into()))?.i()?;
        let pd = self.kb.b.build_signed_int_to_float(p, self.kb.cx.f64_type(), "pos")?;
        let key: Vec<u64> = freqs.inv_freq.iter().map(|f| f.to_bits()).collect();
        let table = match self.rope_tables.get(&key) {
            Some(t) => *t,
            None => {
                let t = self.kb.global_f64_table(&freqs.inv_freq, "rope_inv_freq");
                self.rope_tables.insert(key, t);
                t
            }
        };
        Ok(Source::Angles { table, p, pd, af: freqs.attention_factor })
    }

    /// `(sin, cos)` of one lane from an angle source: the pair `pi(self)` computes, memoised
    /// by (`base`, `tag`) and the position ([`Eval::rope_sincos_memo`]), scaled by the
    /// attention factor.
    fn angle_sincos(&mut self, src: &Source<'ctx>, base: IntValue<'ctx>, tag: u32, pi: impl FnOnce(&mut Self) -> R<IntValue<'ctx>>) -> R<(FloatValue<'ctx>, FloatValue<'ctx>)> {
        let Source::Angles { table, p, pd, af } = *src else {
            return Err(CodegenError::Builder("an angle of a rotation by tables".into()));
        };
        let (s, c) = self.rope_sincos_memo(table, base, tag, p, pd, pi)?;
        self.rope_scale(s, c, af)
    }

    /// `(sin, cos)` of every lane of `at` (x's coordinate) from a tables source: cos and sin
    /// read at the element's own coordinate, broadcast as the op broadcasts them. With R < D
    /// (`clamp`: whether this group rotates) a copied group reads the tables' first entries
    /// instead (their last axis is R) and discards them.
    fn table_lanes(&mut self, src: &Source<'ctx>, at: &At<'ctx>, clamp: Option<IntValue<'ctx>>) -> R<Vec<(FloatValue<'ctx>, FloatValue<'ctx>)>> {
        let Source::Tables { cos, sin, xshape } = src else {
            return Err(CodegenError::Builder("tables of a rotation by angles".into()));
        };
        let mut at = at.clone();
        if let (Some(rot), Some(ax)) = (clamp, at.axes.last_mut()) {
            let b = self.kb.b.build_select(rot, ax.base, self.ic(0), "tcol")?.into_int_value();
            *ax = Ax { base: b, zero: false, tag: Tag::Other, ..*ax };
        }
        let mut both = Vec::with_capacity(2);
        for &t in [cos, sin] {
            let tshape = self.shape(t)?;
            let tat = self.broadcast_at(&at, xshape, &tshape)?;
            both.push(self.eval(t, &tat)?);
        }
        (0..at.lanes as usize).map(|l| Ok((both[1][l].f()?, both[0][l].f()?))).collect()
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
