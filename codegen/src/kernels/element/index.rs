//! Index arithmetic of the evaluator (in the kernel's [`IndexWidth`]) and the coordinate
//! operations every op's mapping uses: splitting into lanes, NumPy broadcasting.
//!
//! Design notes: book/src/design/element-wise.md

use inkwell::types::IntType;
use inkwell::values::{AsValueRef, IntValue};
use inkwell::IntPredicate;
use sinter_ir::{DType, Dim, Value};

use super::{bad, At, Ax, Eval, IndexWidth, Key, Lanes, Tag};
use crate::math::R;
use crate::error::CodegenError;

impl<'a, 'ctx> Eval<'a, 'ctx> {
    /// The index type.
    pub fn ity(&self) -> IntType<'ctx> {
        match self.width {
            IndexWidth::I32 => self.kb.cx.i32_type(),
            IndexWidth::I64 => self.kb.cx.i64_type(),
        }
    }

    /// An index constant.
    pub fn ic(&self, v: i64) -> IntValue<'ctx> {
        self.ity().const_int(v as u64, true)
    }

    /// The value of a dim, as an index.
    pub fn dim(&mut self, d: &Dim) -> R<IntValue<'ctx>> {
        self.sizes.get(self.kb, d)
    }

    pub fn iadd(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_add(a, b, "ix")?)
    }
    pub fn isub(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_sub(a, b, "ix")?)
    }
    pub fn imul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_mul(a, b, "ix")?)
    }
    pub fn idiv(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_unsigned_div(a, b, "ix")?)
    }
    pub fn irem(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_unsigned_rem(a, b, "ix")?)
    }
    pub fn ilt(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.kb.b.build_int_compare(IntPredicate::SLT, a, b, "lt")?)
    }

    /// An in-range `i64` (or `i32`) as an index of this kernel's width.
    pub fn to_index(&self, v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let t = self.ity();
        Ok(if v.get_type() == t {
            v
        } else if v.get_type().get_bit_width() > t.get_bit_width() {
            self.kb.b.build_int_truncate(v, t, "ix")?
        } else {
            self.kb.b.build_int_s_extend(v, t, "ix")?
        })
    }

    /// An axis pinned to 0.
    pub fn zero_ax(&self) -> Ax<'ctx> {
        Ax { base: self.ic(0), step: false, aligned: true, zero: true, tag: Tag::Other }
    }

    /// A uniform axis at `v`.
    pub fn uniform_ax(&self, v: IntValue<'ctx>) -> Ax<'ctx> {
        Ax { base: v, step: false, aligned: false, zero: false, tag: Tag::Other }
    }

    pub(super) fn key(v: Value, at: &At<'ctx>) -> Key {
        (v, at.lanes, at.axes.iter().map(|a| (a.base.as_value_ref() as usize, a.step)).collect())
    }

    /// `at` split into single lanes.
    pub fn split(&self, at: &At<'ctx>) -> R<Vec<At<'ctx>>> {
        let mut out = Vec::with_capacity(at.lanes as usize);
        for l in 0..at.lanes {
            let mut axes = Vec::with_capacity(at.axes.len());
            for a in &at.axes {
                if a.step && l > 0 {
                    let base = self.iadd(a.base, self.ic(i64::from(l)))?;
                    axes.push(Ax { base, step: false, aligned: true, zero: false, tag: Tag::Other });
                } else {
                    axes.push(Ax { step: false, aligned: true, ..*a });
                }
            }
            out.push(At { axes, lanes: 1 });
        }
        Ok(out)
    }

    pub(super) fn per_lane(&mut self, v: Value, at: &At<'ctx>) -> R<Lanes<'ctx>> {
        let mut out = Vec::with_capacity(at.lanes as usize);
        for one in self.split(at)? {
            out.extend(self.eval(v, &one)?);
        }
        Ok(out)
    }

    /// Maps a coordinate of a value of shape `from` to an operand of shape `to` by NumPy
    /// broadcasting (right-aligned; a size-1 operand axis is pinned to 0).
    pub fn broadcast_at(&self, at: &At<'ctx>, from: &[Dim], to: &[Dim]) -> R<At<'ctx>> {
        if to.len() > from.len() || at.axes.len() != from.len() {
            return bad(format!("cannot broadcast a value of shape {to:?} to {from:?}"));
        }
        let off = from.len() - to.len();
        let mut axes = Vec::with_capacity(to.len());
        for (i, d) in to.iter().enumerate() {
            if d.is_one() && !from[off + i].is_one() {
                axes.push(self.zero_ax());
            } else {
                axes.push(at.axes[off + i]);
            }
        }
        Ok(At { axes, lanes: at.lanes })
    }

    pub(super) fn shape(&self, v: Value) -> R<Vec<Dim>> {
        self.shapes.get(&v).cloned().ok_or_else(|| CodegenError::Builder(format!("no shape for {v}")))
    }

    pub(super) fn dtype(&self, v: Value) -> R<DType> {
        self.f.values.get(v).map(|d| d.ty.dtype).ok_or_else(|| CodegenError::Builder(format!("no value {v}")))
    }
}
