//! Block-quantized weights (`q8_0`, `q4_1`; GGUF blocks, see [`sinter_ir::DType::Q8_0`] and
//! [`sinter_ir::DType::Q4_1`]): the LLVM IR that reads a block's scale, minimum and quants
//! and turns them into `f32` values, shared by the element evaluator (`dequantize` in any
//! element-wise kernel) and the matmul kernels (a B operand read as stored blocks).
//!
//! Arithmetic (llama.cpp `dequantize_row_q8_0` / `dequantize_row_q4_1`): `q8_0` gives `q·d`
//! (`i8 → f32` exact, one rounding in the product, which is exact too: an 8-bit integer
//! times an `f16` fits `f32`'s 24-bit significand), `q4_1` gives `fma(nibble, d, m)` (one
//! rounding, as the exact value rounded once; `nibble·d` is exact, so this is also what
//! llama.cpp's separate multiply and add compute). The caller rounds to the `dequantize`
//! node's dtype where the graph does.

use inkwell::values::{FloatValue, IntValue, PointerValue};
use sinter_ir::DType;

use crate::emit::KernelBuilder;
use crate::CodegenError;

type R<T> = Result<T, CodegenError>;

/// Bytes of a block of `dtype`, or an error for a dtype that is not block-quantized.
pub(crate) fn block_bytes(dtype: DType) -> R<u32> {
    dtype.block_bytes().map(|b| b as u32).ok_or_else(|| CodegenError::Builder(format!("{dtype} is not a block-quantized dtype")))
}

/// An `f16` (given as its bits in an `i16`, or the low half of a wider integer) as `f32`.
pub(crate) fn f16_bits_to_f32<'ctx>(kb: &KernelBuilder<'ctx>, bits: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
    let i16t = kb.cx.i16_type();
    let h = if bits.get_type() == i16t { bits } else { kb.b.build_int_truncate(bits, i16t, "h")? };
    let f = kb.b.build_bit_cast(h, kb.cx.f16_type(), "hf")?.into_float_value();
    kb.to_f32(f)
}

/// `fma(a, b, c)` in `f32`.
pub(crate) fn fma<'ctx>(kb: &KernelBuilder<'ctx>, a: FloatValue<'ctx>, b: FloatValue<'ctx>, c: FloatValue<'ctx>) -> R<FloatValue<'ctx>> {
    let f32t = kb.cx.f32_type();
    Ok(kb.intrinsic_value("llvm.fma", &[f32t.into()], &[a.into(), b.into(), c.into()])?.into_float_value())
}

/// The exact `f32` value of element `e` (an `i32` or `i64` index into the row-major
/// elements) of the block-quantized tensor at `base` (bytes, global memory): element `e` is
/// quant `e mod 32` of block `e / 32`. Three scalar loads (`d`, `m` or nothing, the quant).
pub(crate) fn element<'ctx>(kb: &KernelBuilder<'ctx>, dtype: DType, base: PointerValue<'ctx>, e: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
    let b = &kb.b;
    let it = e.get_type();
    let i8t = kb.cx.i8_type();
    let i16t = kb.cx.i16_type();
    let c = |v: u64| it.const_int(v, false);
    let bb = block_bytes(dtype)?;
    let block = b.build_right_shift(e, c(5), false, "blk")?;
    let j = b.build_and(e, c(31), "j")?;
    let at = b.build_int_mul(block, c(u64::from(bb)), "at")?;
    let p = kb.gep(i8t.into(), base, at)?;
    let d = f16_bits_to_f32(kb, kb.load(i16t.into(), p, 2)?.into_int_value())?;
    let f32t = kb.cx.f32_type();
    if dtype == DType::Q8_0 {
        let qo = b.build_int_add(j, c(2), "qo")?;
        let q = kb.load(i8t.into(), kb.gep(i8t.into(), p, qo)?, 1)?.into_int_value();
        let qf = b.build_signed_int_to_float(q, f32t, "q")?;
        return Ok(b.build_float_mul(qf, d, "v")?);
    }
    let m = f16_bits_to_f32(kb, kb.load(i16t.into(), kb.gep(i8t.into(), p, c(2))?, 2)?.into_int_value())?;
    // Byte 4 + (j mod 16); the high nibble for j ≥ 16.
    let lo = b.build_and(j, c(15), "lo")?;
    let qo = b.build_int_add(lo, c(4), "qo")?;
    let byte = kb.load(i8t.into(), kb.gep(i8t.into(), p, qo)?, 1)?.into_int_value();
    let byte = b.build_int_z_extend(byte, kb.cx.i32_type(), "q")?;
    let hi = b.build_right_shift(j, c(4), false, "hi")?;
    let hi = b.build_int_truncate_or_bit_cast(hi, kb.cx.i32_type(), "hi")?;
    let sh = b.build_left_shift(hi, kb.i32c(2), "sh")?;
    let nib = b.build_and(b.build_right_shift(byte, sh, false, "n")?, kb.i32c(15), "n")?;
    let nf = b.build_unsigned_int_to_float(nib, f32t, "nf")?;
    fma(kb, nf, d, m)
}
