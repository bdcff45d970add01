//! Warps and the CTA: the CTA and named barriers (`bar.*`), votes, butterfly shuffles and the
//! warp all-reduce built from them.
//!
//! Design notes: book/src/design/isa.md

use inkwell::values::{FloatValue, IntValue};

use super::builder::basic;
use super::KernelBuilder;
use crate::math::R;

/// How per-thread partial values are combined in a warp or block reduction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Combine {
    /// `a + b`.
    Sum,
    /// NaN-propagating maximum (`llvm.maximum` → `max.NaN.f32`): NaN if either is NaN.
    Max,
    /// NaN-propagating minimum.
    Min,
}

impl<'ctx> KernelBuilder<'ctx> {
    /// A CTA-wide barrier: `llvm.nvvm.barrier.cta.sync.aligned.all(0)` (`bar.sync 0`); every
    /// thread of the block must reach it.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn barrier(&self) -> R<()> {
        self.intrinsic("llvm.nvvm.barrier.cta.sync.aligned.all", &[], &[self.i32c(0).into()])?;
        Ok(())
    }

    /// `bar.red.or.pred` over the `count` threads (a multiple of 32) that reach named barrier
    /// `id` (an `i32`, 1..=15; 0 is the CTA barrier of [`KernelBuilder::barrier`]) (PTX ISA
    /// §9.7.13.1, "bar, barrier"): every one of them gets whether `flag` (an `i1`) holds in any
    /// of them — a barrier and a vote over, for instance, one warpgroup. Every thread counted
    /// must reach it, with the whole warp (`.aligned`).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn bar_red_or(&self, id: IntValue<'ctx>, count: u32, flag: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let fty = i32t.fn_type(&[i32t.into(), i32t.into()], false);
        let text = format!("{{\n.reg .pred p, q;\nsetp.ne.b32 p, $1, 0;\nbar.red.or.pred q, $2, {count}, p;\nselp.b32 $0, 1, 0, q;\n}}");
        let f = self.cx.create_inline_asm(fty, text, "=r,r,r,~{memory}".to_owned(), true, false, None, false);
        let x = self.b.build_int_z_extend(flag, i32t, "")?;
        let r = self.b.build_indirect_call(fty, f, &[x.into(), id.into()], "bar_red_or")?;
        let v = basic(r.try_as_basic_value().basic(), "bar_red_or")?.into_int_value();
        Ok(self.b.build_int_compare(inkwell::IntPredicate::NE, v, i32t.const_zero(), "")?)
    }

    /// `bar.sync id, count` (PTX ISA §9.7.13.1, "bar, barrier"): waits at named barrier `id`
    /// (an `i32`, 1..=15; 0 is the CTA barrier of [`KernelBuilder::barrier`]) until `count`
    /// threads (a multiple of 32) have arrived there, this warp's included — with
    /// [`KernelBuilder::bar_arrive`]s of other warps, a one-way signal between warpgroups
    /// (FlashAttention-3's warpgroup scheduling barriers, arXiv 2407.08608 §3.1).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn bar_sync(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
        self.asm_args(&format!("bar.sync $0, {count};"), "r", &[id.into()])
    }

    /// `bar.arrive id, count` (PTX ISA §9.7.13.1): this warp's arrival at named barrier `id`
    /// (an `i32`, 1..=15) of `count` threads, without waiting; the threads that wait there
    /// ([`KernelBuilder::bar_sync`]) are released once `count` have arrived.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn bar_arrive(&self, id: IntValue<'ctx>, count: u32) -> R<()> {
        self.asm_args(&format!("bar.arrive $0, {count};"), "r", &[id.into()])
    }

    /// `vote.sync.any.pred p, pred, 0xffffffff` (PTX ISA §9.7.13.10; `llvm.nvvm.vote.any.sync`):
    /// whether `pred` (an `i1`) holds in any lane of the warp; every lane gets the answer, and
    /// ptxas knows it is warp-uniform (a branch on it is not divergent). All 32 lanes must
    /// take part.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn vote_any(&self, pred: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.intrinsic_value("llvm.nvvm.vote.any.sync", &[], &[self.i32c(-1).into(), pred.into()])?.into_int_value())
    }

    /// `vote.sync.ballot.b32 m, pred, 0xffffffff` (PTX ISA §9.7.13.10;
    /// `llvm.nvvm.vote.ballot.sync`): an `i32` whose bit `l` is `pred` (an `i1`) of lane `l`;
    /// every lane gets it. All 32 lanes must take part.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn vote_ballot(&self, pred: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.intrinsic_value("llvm.nvvm.vote.ballot.sync", &[], &[self.i32c(-1).into(), pred.into()])?.into_int_value())
    }

    /// `shfl.sync.bfly.b32 v, lane_mask, 0x1f, 0xffffffff`: the value of lane `lane ^ lane_mask`
    /// (all 32 lanes must take part).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn shfl_bfly_f32(&self, v: FloatValue<'ctx>, lane_mask: u32) -> R<FloatValue<'ctx>> {
        let args = [self.i32c(-1).into(), v.into(), self.i32c(lane_mask as i64).into(), self.i32c(0x1f).into()];
        Ok(self.intrinsic_value("llvm.nvvm.shfl.sync.bfly.f32", &[], &args)?.into_float_value())
    }

    /// [`KernelBuilder::shfl_bfly_f32`] for an `i32`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn shfl_bfly_i32(&self, v: IntValue<'ctx>, lane_mask: u32) -> R<IntValue<'ctx>> {
        let args = [self.i32c(-1).into(), v.into(), self.i32c(lane_mask as i64).into(), self.i32c(0x1f).into()];
        Ok(self.intrinsic_value("llvm.nvvm.shfl.sync.bfly.i32", &[], &args)?.into_int_value())
    }

    /// [`KernelBuilder::shfl_bfly_f32`] for an `i64` (two 32-bit shuffles).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn shfl_bfly_i64(&self, v: IntValue<'ctx>, lane_mask: u32) -> R<IntValue<'ctx>> {
        let i32t = self.cx.i32_type();
        let i64t = self.cx.i64_type();
        let lo = self.b.build_int_truncate(v, i32t, "lo")?;
        let hi = self.b.build_right_shift(v, self.i64c(32), false, "hi")?;
        let hi = self.b.build_int_truncate(hi, i32t, "hi")?;
        let lo = self.shfl_bfly_i32(lo, lane_mask)?;
        let hi = self.shfl_bfly_i32(hi, lane_mask)?;
        let lo = self.b.build_int_z_extend(lo, i64t, "lo")?;
        let hi = self.b.build_int_z_extend(hi, i64t, "hi")?;
        let hi = self.b.build_left_shift(hi, self.i64c(32), "hi")?;
        Ok(self.b.build_or(hi, lo, "v")?)
    }

    /// Combines two `f32` partials.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn combine_f32(&self, op: Combine, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        match op {
            Combine::Sum => Ok(self.b.build_float_add(a, b, "s")?),
            Combine::Max => self.float_intr("llvm.maximum", &[a, b]),
            Combine::Min => self.float_intr("llvm.minimum", &[a, b]),
        }
    }

    /// Combines two integer partials (sum wraps; the callers saturate afterwards).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn combine_int(&self, op: Combine, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        match op {
            Combine::Sum => Ok(self.b.build_int_add(a, b, "s")?),
            Combine::Max => self.int_intr("llvm.smax", &[a, b]),
            Combine::Min => self.int_intr("llvm.smin", &[a, b]),
        }
    }

    /// All-reduce over the 32 lanes of a warp by butterfly shuffles (offsets 16, 8, 4, 2, 1):
    /// every lane ends with the combination of all 32 values, combined in the same tree
    /// order, so the result is bit-identical across lanes. (CUDA C Programming Guide §7.22;
    /// PTX ISA §9.7.8.6 `shfl.sync`.)
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn warp_allreduce_f32(&self, op: Combine, mut v: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        for off in [16, 8, 4, 2, 1] {
            let o = self.shfl_bfly_f32(v, off)?;
            v = self.combine_f32(op, v, o)?;
        }
        Ok(v)
    }

    /// [`KernelBuilder::warp_allreduce_f32`] for an `i64`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn warp_allreduce_i64(&self, op: Combine, mut v: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        for off in [16, 8, 4, 2, 1] {
            let o = self.shfl_bfly_i64(v, off)?;
            v = self.combine_int(op, v, o)?;
        }
        Ok(v)
    }
}
