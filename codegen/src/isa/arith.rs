//! Dtypes and scalar arithmetic: storage types, `f32` ⇄ bf16/f16 conversions, index helpers,
//! and `impl Ops for KernelBuilder`, through which [`crate::math`] emits into a kernel.
//!
//! Design notes: book/src/design/isa.md

use inkwell::context::Context;
use inkwell::types::{BasicTypeEnum, FloatType};
use inkwell::values::{FloatValue, IntValue};
use inkwell::{FloatPredicate, IntPredicate};
use sinter_ir::DType;

use super::KernelBuilder;
use crate::math::{Ops, R};

/// The LLVM storage type of a dtype: `bfloat`, `half`, `float`, `i32`, `i64`, `i8` (bool, and
/// the bytes of the block-quantized types and of `f8e4m3`, which only the fp8 matmul reads).
pub fn storage_type<'ctx>(cx: &'ctx Context, dtype: DType) -> BasicTypeEnum<'ctx> {
    match dtype {
        DType::BF16 => cx.bf16_type().into(),
        DType::F16 => cx.f16_type().into(),
        DType::F32 => cx.f32_type().into(),
        DType::I32 => cx.i32_type().into(),
        DType::I64 => cx.i64_type().into(),
        DType::Bool | DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K | DType::F8E4M3 => cx.i8_type().into(),
    }
}

impl<'ctx> KernelBuilder<'ctx> {
    /// A float storage value (`bfloat`, `half` or `float`) extended to `f32` (exact).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn to_f32(&self, v: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let f32t = self.cx.f32_type();
        if v.get_type() == f32t {
            return Ok(v);
        }
        Ok(self.b.build_float_ext(v, f32t, "x")?)
    }

    /// The LLVM float type of a float dtype.
    pub fn float_type(&self, dtype: DType) -> FloatType<'ctx> {
        match dtype {
            DType::BF16 => self.cx.bf16_type(),
            DType::F16 => self.cx.f16_type(),
            _ => self.cx.f32_type(),
        }
    }

    /// An `f32` rounded to nearest even into `dtype`'s storage type (`cvt.rn.bf16.f32`,
    /// `cvt.rn.f16.f32`; unchanged for `f32`). Overflow gives ±inf, NaN stays NaN.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn from_f32(&self, v: FloatValue<'ctx>, dtype: DType) -> R<FloatValue<'ctx>> {
        let t = self.float_type(dtype);
        if t == v.get_type() {
            return Ok(v);
        }
        Ok(self.b.build_float_trunc(v, t, "r")?)
    }

    /// An `f32` rounded to `dtype` and back: the value an op of dtype `dtype` produces. The
    /// identity for `f32`.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn round_to(&self, v: FloatValue<'ctx>, dtype: DType) -> R<FloatValue<'ctx>> {
        match dtype {
            DType::BF16 | DType::F16 => {
                let r = self.from_f32(v, dtype)?;
                self.to_f32(r)
            }
            _ => Ok(v),
        }
    }

    /// `a < b` on signed integers.
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn slt(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_compare(IntPredicate::SLT, a, b, "lt")?)
    }

    /// `a + b` (no signed wrap).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn add(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_nsw_add(a, b, "a")?)
    }

    /// `a · b` (no signed wrap).
    ///
    /// # Errors
    /// [`CodegenError::Builder`].
    pub fn mul(&self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_nsw_mul(a, b, "m")?)
    }
}

impl<'ctx> Ops for KernelBuilder<'ctx> {
    type F = FloatValue<'ctx>;
    type D = FloatValue<'ctx>;
    type I = IntValue<'ctx>;
    type L = IntValue<'ctx>;
    type B = IntValue<'ctx>;

    fn fc(&mut self, v: f32) -> FloatValue<'ctx> {
        self.f32c(v)
    }
    fn fadd(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_add(a, b, "f")?)
    }
    fn fsub(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_sub(a, b, "f")?)
    }
    fn fmul(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_mul(a, b, "f")?)
    }
    fn fdiv(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        // Without fast-math flags the back end emits IEEE `div.rn.f32`.
        Ok(self.b.build_float_div(a, b, "f")?)
    }
    fn fdiv_fast(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        let args = [a.into(), b.into()];
        Ok(self.intrinsic_value("llvm.nvvm.div.approx.f", &[], &args)?.into_float_value())
    }
    fn ffma(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.fma", &[a, b, c])
    }
    fn fneg(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_neg(a, "f")?)
    }
    fn fabs(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.fabs", &[a])
    }
    fn fsqrt(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        // `sqrt.rn.f32` without fast-math flags.
        self.float_intr("llvm.sqrt", &[a])
    }
    fn ex2(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.nvvm.ex2.approx", &[a])
    }
    fn flt(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::OLT, a, b, "c")?)
    }
    fn feq(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::OEQ, a, b, "c")?)
    }
    fn fnan(&mut self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::UNO, a, a, "c")?)
    }
    fn fsel(&mut self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "s")?.into_float_value())
    }
    fn fbits(&mut self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.cx.i32_type(), "b")?.into_int_value())
    }
    fn ffrom_bits(&mut self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.cx.f32_type(), "f")?.into_float_value())
    }
    fn ftoi_exact(&mut self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_signed_int_to_float(a, self.cx.f32_type(), "f")?)
    }
    fn ic(&mut self, v: i32) -> IntValue<'ctx> {
        self.i32c(v as i64)
    }
    fn iadd(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_add(a, b, "i")?)
    }
    fn isub(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_sub(a, b, "i")?)
    }
    fn iand(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_and(a, b, "i")?)
    }
    fn ior(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_or(a, b, "i")?)
    }
    fn ishr(&mut self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_right_shift(a, self.i32c(s as i64), false, "i")?)
    }
    fn ixor(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_xor(a, b, "i")?)
    }
    fn ieq(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_compare(IntPredicate::EQ, a, b, "c")?)
    }
    fn isel(&mut self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "s")?.into_int_value())
    }
    fn band(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_and(a, b, "b")?)
    }
    fn bor(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_or(a, b, "b")?)
    }
    fn bnot(&mut self, a: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_not(a, "b")?)
    }
    fn dc(&mut self, v: f64) -> FloatValue<'ctx> {
        self.f64c(v)
    }
    fn dadd(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_add(a, b, "d")?)
    }
    fn dsub(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_sub(a, b, "d")?)
    }
    fn dmul(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_mul(a, b, "d")?)
    }
    fn ddiv(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_div(a, b, "d")?)
    }
    fn dfma(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.fma", &[a, b, c])
    }
    fn drint(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        self.float_intr("llvm.rint", &[a])
    }
    fn dlt(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::OLT, a, b, "c")?)
    }
    fn deq(&mut self, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_float_compare(FloatPredicate::OEQ, a, b, "c")?)
    }
    fn dsel(&mut self, c: IntValue<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "s")?.into_float_value())
    }
    fn f2d(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_ext(a, self.cx.f64_type(), "d")?)
    }
    fn d2f(&mut self, a: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_float_trunc(a, self.cx.f32_type(), "f")?)
    }
    fn d2l(&mut self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        let i64t = self.cx.i64_type();
        let v = self.intrinsic_value("llvm.fptosi.sat", &[i64t.into(), a.get_type().into()], &[a.into()])?;
        Ok(v.into_int_value())
    }
    fn dbits(&mut self, a: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.cx.i64_type(), "b")?.into_int_value())
    }
    fn dfrom_bits(&mut self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_bit_cast(a, self.cx.f64_type(), "d")?.into_float_value())
    }
    fn l2d(&mut self, a: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
        Ok(self.b.build_signed_int_to_float(a, self.cx.f64_type(), "d")?)
    }
    fn lc(&mut self, v: i64) -> IntValue<'ctx> {
        self.i64c(v)
    }
    fn ladd(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_add(a, b, "l")?)
    }
    fn land(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_and(a, b, "l")?)
    }
    fn lor(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_or(a, b, "l")?)
    }
    fn lshl(&mut self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_left_shift(a, self.i64c(s as i64), "l")?)
    }
    fn lshr(&mut self, a: IntValue<'ctx>, s: u32) -> R<IntValue<'ctx>> {
        Ok(self.b.build_right_shift(a, self.i64c(s as i64), false, "l")?)
    }
    fn l2i(&mut self, a: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_int_truncate(a, self.cx.i32_type(), "i")?)
    }
    fn llt(&mut self, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        self.slt(a, b)
    }
    fn lsel(&mut self, c: IntValue<'ctx>, a: IntValue<'ctx>, b: IntValue<'ctx>) -> R<IntValue<'ctx>> {
        Ok(self.b.build_select(c, a, b, "s")?.into_int_value())
    }
}
