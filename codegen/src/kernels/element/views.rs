//! The view ops that remap a coordinate with arithmetic or branches: `reshape` (through the
//! row-major linear index), `concat` (a branch per input) and `gather` (the index is loaded,
//! the table row follows), with [`Eval::branch`], the `if/else` they emit.
//!
//! Design notes: book/src/design/element-wise.md

use inkwell::values::{BasicValue, BasicValueEnum, IntValue};
use inkwell::IntPredicate;
use sinter_ir::{Dim, Node, Value};

use super::{divisible, Arm, At, Ax, Eval, IndexWidth, Lanes, Scalar, Tag};
use crate::math::R;
use crate::error::CodegenError;

impl<'a, 'ctx> Eval<'a, 'ctx> {
    pub(super) fn reshape(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let x = self.input(node, 0)?;
        let out_shape = self.shape(result)?;
        let in_shape = self.shape(x)?;
        // Only size-1 axes added or removed: each axis maps to its own, tags kept (a row
        // statistic read through a squeeze stays at its own row).
        let (oi, ii): (Vec<usize>, Vec<usize>) = (
            (0..out_shape.len()).filter(|&i| !out_shape[i].is_one()).collect(),
            (0..in_shape.len()).filter(|&i| !in_shape[i].is_one()).collect(),
        );
        if oi.len() == ii.len() && oi.iter().zip(&ii).all(|(&o, &i)| out_shape[o] == in_shape[i]) {
            let mut axes = vec![self.zero_ax(); in_shape.len()];
            for (&o, &i) in oi.iter().zip(&ii) {
                axes[i] = at.axes[o];
            }
            // A lane axis on a dropped size-1 axis has one valid lane; go lane by lane.
            if at.lanes > 1 && (0..out_shape.len()).any(|o| out_shape[o].is_one() && at.axes[o].step) {
                return self.per_lane(result, at);
            }
            return self.eval(x, &At { axes, lanes: at.lanes });
        }
        // The longest common suffix maps unchanged.
        let mut k = 0;
        while k < out_shape.len() && k < in_shape.len() && out_shape[out_shape.len() - 1 - k] == in_shape[in_shape.len() - 1 - k] {
            k += 1;
        }
        let (po, pi) = (out_shape.len() - k, in_shape.len() - k);
        let lead_step = at.axes[..po].iter().any(|a| a.step) && at.lanes > 1;
        if lead_step {
            // The lane axis is in the reshaped prefix: lanes may straddle rows; go lane by lane
            // unless the prefix's last axis carries it with room to spare.
            let ok = at.axes[po - 1].step && at.axes[po - 1].aligned && pi > 0 && divisible(&in_shape[pi - 1], at.lanes) && at.axes[..po - 1].iter().all(|a| !a.step);
            if !ok {
                return self.per_lane(result, at);
            }
        }
        // Linear index of the prefix coordinate (row-major over out_shape[..po]).
        let mut lin = self.ic(0);
        let mut stride = Dim::constant(1);
        let mut lin_aligned = true;
        let mut lin_step = false;
        for i in (0..po).rev() {
            let a = at.axes[i];
            if !a.zero {
                let sv = self.dim(&stride)?;
                let t = self.imul(a.base, sv)?;
                lin = self.iadd(lin, t)?;
                if !(a.aligned || divisible(&stride, at.lanes)) {
                    lin_aligned = false;
                }
                if a.step && at.lanes > 1 {
                    lin_step = true;
                    if stride.as_const() != Some(1) {
                        return self.per_lane(result, at);
                    }
                }
            }
            stride = stride.mul(&out_shape[i]);
        }
        // Input prefix coordinates from the linear index, innermost first.
        let mut axes = vec![self.zero_ax(); in_shape.len()];
        let mut rem = lin;
        for i in (0..pi).rev() {
            let d = in_shape[i].clone();
            if d.is_one() {
                continue;
            }
            let first = i == 0 || in_shape[..i].iter().all(Dim::is_one);
            let (c, next) = if first {
                (rem, rem)
            } else {
                let dv = self.dim(&d)?;
                (self.irem(rem, dv)?, self.idiv(rem, dv)?)
            };
            let innermost = i == pi - 1;
            axes[i] = Ax { base: c, step: lin_step && innermost, aligned: lin_aligned, zero: false, tag: Tag::Other };
            rem = next;
        }
        axes[pi..pi + k].copy_from_slice(&at.axes[po..po + k]);
        self.eval(x, &At { axes, lanes: at.lanes })
    }

    /// Emits `if/else` branches, evaluating `arms[i]` in arm `i`, and merges the lanes with
    /// phis. `conds[i]` selects arm `i` (the last arm takes what is left).
    pub(super) fn branch(&mut self, conds: Vec<IntValue<'ctx>>, arms: Vec<Arm<'_, 'ctx>>) -> R<Lanes<'ctx>> {
        let merge = self.kb.block("merge");
        let mut incoming: Vec<(Lanes<'ctx>, inkwell::basic_block::BasicBlock<'ctx>)> = Vec::new();
        let n = arms.len();
        let mut conds = conds.into_iter();
        for (i, arm) in arms.into_iter().enumerate() {
            let body = self.kb.block("arm");
            if i + 1 < n {
                let next = self.kb.block("next");
                let c = conds.next().ok_or_else(|| CodegenError::Builder("branch without condition".into()))?;
                self.kb.cond_br(c, body, next)?;
                self.kb.position(body);
                let snap = self.snapshot();
                self.branch_depth += 1;
                let v = arm(self);
                self.branch_depth -= 1;
                let v = v?;
                self.restore(snap);
                let end = self.kb.current_block()?;
                self.kb.br(merge)?;
                incoming.push((v, end));
                self.kb.position(next);
            } else {
                self.kb.br(body)?;
                self.kb.position(body);
                let snap = self.snapshot();
                self.branch_depth += 1;
                let v = arm(self);
                self.branch_depth -= 1;
                let v = v?;
                self.restore(snap);
                let end = self.kb.current_block()?;
                self.kb.br(merge)?;
                incoming.push((v, end));
            }
        }
        self.kb.position(merge);
        let lanes = incoming.first().map(|(v, _)| v.len()).unwrap_or(0);
        let mut out = Vec::with_capacity(lanes);
        for l in 0..lanes {
            let first = incoming[0].0[l].basic();
            let phi = self.kb.b.build_phi(first.get_type(), "phi")?;
            for (v, bb) in &incoming {
                let s = v[l].basic();
                phi.add_incoming(&[(&s as &dyn BasicValue<'ctx>, *bb)]);
            }
            let pv = phi.as_basic_value();
            out.push(match pv {
                BasicValueEnum::FloatValue(f) => Scalar::F(f),
                other => Scalar::I(other.into_int_value()),
            });
        }
        Ok(out)
    }

    pub(super) fn concat(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let rank = at.axes.len();
        let axis = sinter_ir::infer::norm_axis(self.f.nodes[node].op.int("axis").unwrap_or(-1), rank).map_err(|e| CodegenError::BadKernel { kernel: String::new(), message: e.to_string() })?;
        let inputs = self.f.nodes[node].inputs.clone();
        let a = at.axes[axis];
        let lanes = at.lanes;
        // Offsets of the inputs along the axis.
        let mut offs = Vec::with_capacity(inputs.len());
        let mut off = Dim::constant(0);
        for &x in &inputs {
            offs.push(off.clone());
            let s = self.shape(x)?;
            off = off.add(&s[axis]);
        }
        if a.step && lanes > 1 {
            let ok = a.aligned && inputs.iter().all(|&x| self.shape(x).map(|s| divisible(&s[axis], lanes)).unwrap_or(false));
            if !ok {
                return self.per_lane(result, at);
            }
        }
        if inputs.len() == 1 {
            return self.eval(inputs[0], at);
        }
        let mut conds = Vec::new();
        for o in offs.iter().skip(1) {
            let ov = self.dim(o)?;
            conds.push(self.ilt(a.base, ov)?);
        }
        let mut arms: Vec<Arm<'_, 'ctx>> = Vec::new();
        for (x, o) in inputs.into_iter().zip(offs) {
            let at = at.clone();
            arms.push(Box::new(move |ev: &mut Eval<'_, 'ctx>| {
                let ov = ev.dim(&o)?;
                let base = ev.isub(a.base, ov)?;
                let mut axes = at.axes.clone();
                axes[axis] = Ax { base, step: a.step, aligned: a.aligned && divisible(&o, at.lanes), zero: false, tag: Tag::Other };
                ev.eval(x, &At { axes, lanes: at.lanes })
            }));
        }
        self.branch(conds, arms)
    }

    /// `gather(table, indices)`: `out[i…, j…] = table[indices[i…], j…]`. An index outside
    /// `0..V` gives NaN (float tables) or 0 (integer tables) for the whole row and reads
    /// nothing — the interpreter reports an error there; the GPU kernel has no error channel
    /// in its launch plan (see the module docs of `kernels::gather`).
    pub(super) fn gather(&mut self, node: Node, result: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let table = self.input(node, 0)?;
        let indices = self.input(node, 1)?;
        let ishape = self.shape(indices)?;
        let tshape = self.shape(table)?;
        let ri = ishape.len();
        if at.axes[..ri].iter().any(|a| a.step) && at.lanes > 1 {
            return self.per_lane(result, at);
        }
        let idx_at = At { axes: at.axes[..ri].to_vec(), lanes: 1 };
        let idx = self.eval(indices, &idx_at)?;
        let idx = idx.first().copied().ok_or_else(|| CodegenError::Builder("no index".into()))?.i()?;
        // Range check in 64 bits.
        let i64t = self.kb.cx.i64_type();
        let idx64 = if idx.get_type() == i64t { idx } else { self.kb.b.build_int_s_extend(idx, i64t, "ix")? };
        let v = tshape.first().cloned().ok_or_else(|| CodegenError::BadKernel { kernel: String::new(), message: "gather from a rank-0 table".into() })?;
        let vv = self.dim(&v)?;
        let vv64 = if vv.get_type() == i64t { vv } else { self.kb.b.build_int_s_extend(vv, i64t, "v")? };
        let ge0 = self.kb.b.build_int_compare(IntPredicate::SGE, idx64, i64t.const_zero(), "ge")?;
        let ltv = self.kb.b.build_int_compare(IntPredicate::SLT, idx64, vv64, "lt")?;
        let ok = self.kb.b.build_and(ge0, ltv, "ok")?;
        let idx_ix = if self.width == IndexWidth::I64 { idx64 } else { self.kb.b.build_int_truncate(idx64, self.ity(), "ix")? };
        let dt = self.dtype(result)?;
        let lanes = at.lanes;
        let mut taxes = vec![self.uniform_ax(idx_ix)];
        taxes.extend_from_slice(&at.axes[ri..]);
        let tat = At { axes: taxes, lanes };
        let arms: Vec<Arm<'_, 'ctx>> = vec![
            Box::new(move |ev: &mut Eval<'_, 'ctx>| ev.eval(table, &tat)),
            Box::new(move |ev: &mut Eval<'_, 'ctx>| {
                let fill = if dt.is_float() { f64::NAN } else { 0.0 };
                let s = ev.constant_scalar(dt, fill)?;
                Ok(vec![s; lanes as usize])
            }),
        ];
        self.branch(vec![ok], arms)
    }
}
