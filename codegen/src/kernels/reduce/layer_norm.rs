//! LayerNorm statistics beyond the plain corrected two-pass: the one-read schedule's fused
//! form ([`Emitter::layer_norm_fused`]: per warp on the values in registers, the warps'
//! `(count, mean, M2)` merged once through shared memory), Chan, Golub & LeVeque's merge of
//! `(n, mean, M2)` triples ([`Emitter::chan_merge`]), and which shift the cluster schedule's
//! per-warp statistics use (the warp's own mean, its first chunk's, or the row head's).
//!
//! Design notes: book/src/design/reductions.md

use inkwell::values::{FloatValue, IntValue};
use inkwell::IntPredicate;

use super::analysis::{Stat, StatKind};
use super::emit::{Acc, Chunk, Emitter};
use crate::isa::Combine;
use crate::kernels::element::{Eval, RowScalars};
use crate::math::{Ops, R};
use crate::error::CodegenError;

impl<'p, 'ctx> Emitter<'p, 'ctx> {
    /// A `layer_norm`'s statistics in the one-read schedule ([`StatKind::LnFused`]).
    ///
    /// Warp `w` (`n_w` valid elements, a constant: `N` is) computes `b_w = Σx/n_w` (f32,
    /// shuffles), then `dev_w = Σ(x − b_w)` and `q_w = Σ(x − b_w)²` on the values in
    /// registers (shuffles): its mean is `b_w + dev_w/n_w` and `M2_w = q_w − dev_w²/n_w`, the
    /// corrected two-pass. The warps' `(b_w, dev_w/n_w, M2_w, n_w)` go through shared memory
    /// once (one barrier, one 16-byte store a warp); lane `l` of every warp then takes warp
    /// `l mod n_w`'s and butterfly shuffles sum the terms of the merge relative to warp 0's
    /// `b_0` (Chan et al.: `δ_w = (b_w − b_0) + dev_w/n_w`, `d = Σ n_w δ_w / N`,
    /// `M2 = Σ M2_w + Σ n_w δ_w² − N d²`), so the row mean is `b_0 + d` without rounding it to
    /// one f32 (rows with a large mean and a small spread stay accurate), and the output reads
    /// `(x − b_w) − (d − (b_w − b_0))` from the centred values already in registers.
    pub(super) fn layer_norm_fused(&self, ev: &mut Eval<'_, 'ctx>, st: &Stat, chs: &[Chunk<'ctx>], warp: IntValue<'ctx>, nv: IntValue<'ctx>) -> R<()> {
        let s = self.sched;
        let node = st.node;
        let eps = ev.f.nodes[node].op.float("eps").map(|e| e as f32);
        let n = self.plan.n.as_const().ok_or_else(|| CodegenError::Builder("a one-read layer_norm of a symbolic length".into()))?.max(0);
        let nw = s.threads_per_row / 32;
        let tv = i64::from(s.threads_per_row) * i64::from(s.vec);
        let wspan = 32 * i64::from(s.vec);
        // Valid elements of warp `w` of the row group.
        let count = |w: i64| -> i64 { (0..i64::from(chs.len() as u32)).map(|ci| (n - ci * tv - w * wspan).clamp(0, wspan)).sum() };
        let counts: Vec<i64> = (0..i64::from(nw)).map(count).collect();
        // This thread's warp's count (uniform over the warp), at least 1 as a divisor, and as
        // it is (0 for a warp past the row's end: its terms of the merge below vanish).
        let per_warp = |ev: &mut Eval<'_, 'ctx>, f: &dyn Fn(i64) -> i64| -> R<FloatValue<'ctx>> {
            if counts.iter().all(|&c| f(c) == f(counts[0])) {
                return Ok(ev.kb.f32c(f(counts[0]) as f32));
            }
            let mut acc = ev.kb.f32c(f(counts[0]) as f32);
            for (w, &c) in counts.iter().enumerate().skip(1) {
                let is = ev.kb.b.build_int_compare(IntPredicate::EQ, warp, ev.ic(w as i64), "isw")?;
                acc = ev.kb.fsel(is, ev.kb.f32c(f(c) as f32), acc)?;
            }
            Ok(acc)
        };
        let n_own = per_warp(ev, &|c| c.max(1))?;
        let n_count = per_warp(ev, &|c| c)?;
        // Σx over the warp, its base b_w.
        let sum_st = Stat { kind: StatKind::LnSum, ..*st };
        let mut acc = self.identities(ev, &[sum_st]);
        for ch in chs {
            acc = self.accumulate(ev, &[sum_st], ch, acc)?;
        }
        let Some(Acc::F(sum_t)) = acc.first().copied() else {
            return Err(CodegenError::Builder("layer_norm sum not in f32".into()));
        };
        let sum_w = ev.kb.warp_allreduce_f32(Combine::Sum, sum_t)?;
        let b_w = ev.kb.fdiv(sum_w, n_own)?;
        // Σ(x − b_w) and Σ(x − b_w)² (one `fma` an element) on the registers.
        let (mut dev_t, mut q_t) = (ev.kb.f32c(-0.0), ev.kb.f32c(-0.0));
        for ch in chs {
            let cs = ev.centered(node, b_w, &ch.at)?;
            let (mut dv, mut q) = (dev_t, q_t);
            for c in cs {
                let c = c.f()?;
                dv = ev.kb.fadd(dv, c)?;
                q = ev.kb.ffma(c, c, q)?;
            }
            (dev_t, q_t) = match ch.valid {
                Some(v) => (ev.kb.fsel(v, dv, dev_t)?, ev.kb.fsel(v, q, q_t)?),
                None => (dv, q),
            };
        }
        let dev_w = ev.kb.warp_allreduce_f32(Combine::Sum, dev_t)?;
        let q_w = ev.kb.warp_allreduce_f32(Combine::Sum, q_t)?;
        let f32t = ev.kb.cx.f32_type();
        let nf = ev.kb.b.build_unsigned_int_to_float(nv, f32t, "n")?;
        let (d, m2) = if nw <= 1 {
            let d = ev.kb.fdiv(dev_w, nf)?;
            let m2 = ev.kb.fdiv(q_w, nf)?;
            let nd = ev.kb.fneg(d)?;
            (d, ev.kb.ffma(nd, d, m2)?)
        } else {
            // (b_w, dev_w/n_w, M2_w, n_w) of each warp: one 16-byte store, a barrier; then lane
            // l takes warp k = l mod n_w's (one 16-byte load) and butterfly shuffles sum its
            // terms over the warps (see `fold_warps`).
            let mw = ev.kb.fdiv(dev_w, n_own)?;
            let ndv = ev.kb.fneg(dev_w)?;
            let m2w = ev.kb.ffma(ndv, mw, q_w)?;
            let v4 = f32t.vec_type(4);
            let arr = self.smem_array(ev, f32t.into(), 4, 4 * nw, &format!("ln_{}", node.as_u32()))?;
            let mut v = v4.get_undef();
            for (i, x) in [b_w, mw, m2w, n_count].into_iter().enumerate() {
                v = ev.kb.b.build_insert_element(v, x, ev.kb.cx.i32_type().const_int(i as u64, false), "ln")?;
            }
            // The warp index computed again here from `%tid.x` (made opaque): kept from the
            // prologue, its shared address is what ptxas spills at 48 registers.
            let _ = warp;
            let tid = ev.kb.tid_x()?;
            let tid = ev.kb.opaque(tid)?;
            let tid = ev.kb.b.build_int_z_extend_or_bit_cast(tid, ev.ity(), "tid")?;
            let warp = ev.kb.b.build_right_shift(tid, ev.ic(5), false, "warp")?;
            let lane = ev.kb.b.build_and(tid, ev.ic(31), "lane")?;
            let idx = ev.imul(warp, ev.ic(4))?;
            let p = ev.kb.gep(f32t.into(), arr, idx)?;
            ev.kb.store(p, v.into(), 16)?;
            ev.kb.barrier()?;
            let k = ev.kb.b.build_and(lane, ev.ic(i64::from(nw - 1)), "k")?;
            let p = ev.kb.gep(f32t.into(), arr, ev.imul(k, ev.ic(4))?)?;
            let vk = ev.kb.load(v4.into(), p, 16)?.into_vector_value();
            let mut e = [f32t.const_zero(); 4];
            for (i, slot) in e.iter_mut().enumerate() {
                *slot = ev.kb.b.build_extract_element(vk, ev.kb.cx.i32_type().const_int(i as u64, false), "ln")?.into_float_value();
            }
            let [b, mwk, m2k, ck] = e;
            let p0 = ev.kb.gep(f32t.into(), arr, ev.ic(0))?;
            let b0 = ev.kb.load(f32t.into(), p0, 16)?.into_float_value();
            // δ_k = (b_k − b_0) + dev_k/n_k; d = Σ n_k δ_k / N; M2 = Σ M2_k + Σ n_k δ_k² − N d²
            // (δ_0 ≈ 0, so |d| ≤ max |δ_k − δ_0| + |δ_0|: no cancellation that matters). A warp
            // with no element of the row has n_k = 0 and adds nothing.
            let off = ev.kb.fsub(b, b0)?;
            let delta = ev.kb.fadd(off, mwk)?;
            let cd = ev.kb.fmul(ck, delta)?;
            let cd2 = ev.kb.fmul(cd, delta)?;
            let m2k = ev.kb.fadd(m2k, cd2)?;
            let (mut sd, mut m2) = (cd, m2k);
            let mut o = 1;
            while o < nw {
                let a = ev.kb.shfl_bfly_f32(sd, o)?;
                let c = ev.kb.shfl_bfly_f32(m2, o)?;
                sd = ev.kb.fadd(sd, a)?;
                m2 = ev.kb.fadd(m2, c)?;
                o *= 2;
            }
            let d = ev.kb.fdiv(sd, nf)?;
            let nd = ev.kb.fneg(d)?;
            let m2 = ev.kb.fdiv(m2, nf)?;
            let m2 = ev.kb.ffma(nd, d, m2)?;
            // The output centres on this warp's b_w: (x − b_w) − (b_0 + d − b_w) (b_w read
            // back from shared memory rather than kept in a register across the barrier).
            let p = ev.kb.gep(f32t.into(), arr, idx)?;
            let b_own = ev.kb.load(f32t.into(), p, 16)?.into_float_value();
            let own = ev.kb.fsub(b_own, b0)?;
            (ev.kb.fsub(d, own)?, m2)
        };
        let zero = ev.kb.f32c(0.0);
        let var = ev.kb.combine_f32(Combine::Max, m2, zero)?;
        let e = ev.kb.f32c(eps.unwrap_or(0.0));
        let v = ev.kb.fadd(var, e)?;
        let sq = ev.kb.fsqrt(v)?;
        let one = ev.kb.f32c(1.0);
        let r = ev.kb.fdiv(one, sq)?;
        ev.rows.insert(node, RowScalars::LayerNorm { mean: b_w, d, r });
        Ok(())
    }

    /// Chan, Golub & LeVeque's merge of two `(n, mean, M2)` triples of `f64`s carried as
    /// their bits (`i64`, so that the exchange and the shuffles move them whole), in a form
    /// symmetric in `a` and `b` (see [`Emitter::cluster_level`]); two empty triples give
    /// `(0, 0, 0)`.
    ///
    /// `uniform`: the caller guarantees `n_a = n_b` (whole slices, a power of two of them), so
    /// `mean = (mean_a + mean_b)/2` and `M2 = M2_a + M2_b + δ²·n_a/2` — no division (an `f64`
    /// division is a long dependent sequence, and a row's statistics wait for six merges).
    pub(super) fn chan_merge(&self, ev: &mut Eval<'_, 'ctx>, a: &[Acc<'ctx>], b: &[Acc<'ctx>], uniform: bool) -> R<Vec<Acc<'ctx>>> {
        let f64t = ev.kb.cx.f64_type();
        let i64t = ev.kb.cx.i64_type();
        let mut v = Vec::with_capacity(6);
        for x in a.iter().take(3).chain(b.iter().take(3)) {
            let Acc::I(i) = x else {
                return Err(CodegenError::Builder("layer_norm cluster triples".into()));
            };
            v.push(ev.kb.b.build_bit_cast(*i, f64t, "f")?.into_float_value());
        }
        let [na, ma, qa, nb, mb, qb] = v[..] else {
            return Err(CodegenError::Builder("layer_norm cluster triples".into()));
        };
        let zero = ev.kb.f64c(0.0);
        let n = ev.kb.fadd(na, nb)?;
        // The merged mean and the weight `n_a·n_b/n` of δ².
        let (mean, w) = if uniform {
            let half = ev.kb.f64c(0.5);
            let s = ev.kb.fadd(ma, mb)?;
            (ev.kb.fmul(s, half)?, ev.kb.fmul(na, half)?)
        } else {
            let empty = ev.kb.feq(n, zero)?;
            let inv = ev.kb.fdiv(ev.kb.f64c(1.0), n)?;
            let inv = ev.kb.fsel(empty, zero, inv)?;
            let sa = ev.kb.fmul(na, ma)?;
            let sb = ev.kb.fmul(nb, mb)?;
            let s = ev.kb.fadd(sa, sb)?;
            let nn = ev.kb.fmul(na, nb)?;
            (ev.kb.fmul(s, inv)?, ev.kb.fmul(nn, inv)?)
        };
        let delta = ev.kb.fsub(mb, ma)?;
        let d2 = ev.kb.fmul(delta, delta)?;
        let q = ev.kb.fadd(qa, qb)?;
        let dw = ev.kb.fmul(d2, w)?;
        let m2 = ev.kb.fadd(q, dw)?;
        let mut out = Vec::with_capacity(3);
        for x in [n, mean, m2] {
            out.push(Acc::I(ev.kb.b.build_bit_cast(x, i64t, "bits")?.into_int_value()));
        }
        Ok(out)
    }

    /// Whether statistic `st` is combined over the warp only by [`Emitter::combine_group`]:
    /// a `layer_norm`'s in the cluster schedule, whose statistics are corrected two-pass per
    /// warp and merged once as `(n, mean, M2)` triples (see [`Emitter::cluster_level`]).
    ///
    /// Only where every slice is whole loop iterations (`Split::exact`): elsewhere (an odd
    /// row length, a short last slice) the bounds checks leave no registers for the warps'
    /// `f64` triples (a `bf16` LayerNorm of 262147 spilled 12 bytes at 40 registers), and the
    /// CTA's statistics are merged as before.
    pub(super) fn warp_only(&self, st: &Stat) -> bool {
        self.ln_per_warp()
            && match st.kind {
                // A shift from the row's head is the same in every warp: no fold.
                StatKind::LnSum => true,
                StatKind::LnDev | StatKind::LnVar => !self.head_shift(),
                _ => false,
            }
    }

    /// Whether this kernel's LayerNorm shift is the mean of the row's head
    /// ([`RowSchedule::head_shift`]).
    pub(super) fn head_shift(&self) -> bool {
        self.sched.head_shift && self.sampled()
    }

    /// Whether this kernel's LayerNorm shifts are sampled ([`RowSchedule::sampled_shift`]):
    /// only where the statistics are the warp's ([`Emitter::ln_per_warp`]).
    pub(super) fn sampled(&self) -> bool {
        self.sched.sampled_shift && self.ln_per_warp()
    }

    /// Whether a `layer_norm`'s statistics are the warp's until the exchange (see
    /// [`Emitter::warp_only`]).
    pub(super) fn ln_per_warp(&self) -> bool {
        self.split.as_ref().is_some_and(|s| s.exact)
    }
}
