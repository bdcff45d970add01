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

use crate::isa::KernelBuilder;
use crate::error::CodegenError;

type R<T> = Result<T, CodegenError>;

/// Bytes of a block of `dtype`, or an error for a dtype that is not block-quantized, and an
/// unsupported-kernel error for one whose blocks these kernels do not decode (`q5_0` and the
/// k-quants: a model dequantises them when it loads).
pub(crate) fn block_bytes(dtype: DType) -> R<u32> {
    if dtype.is_quantized() && !sinter_ir::contract::operands::MATMUL_BLOCK_TYPES.contains(&dtype) {
        return Err(CodegenError::Unsupported { kernel: String::new(), message: format!("the kernels do not decode {dtype} blocks (q8_0 and q4_1 only); dequantise the tensor before the device reads it") });
    }
    dtype.block_bytes().map(|b| b as u32).ok_or_else(|| CodegenError::Builder(format!("{dtype} is not a block-quantized dtype")))
}

/// An `f16` (given as its bits in an `i16`, or the low half of a wider integer) as `f32`.
pub(crate) fn f16_bits_to_f32<'ctx>(kb: &KernelBuilder<'ctx>, bits: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
    let i16t = kb.cx.i16_type();
    let h = if bits.get_type() == i16t { bits } else { kb.b.build_int_truncate(bits, i16t, "h")? };
    let f = kb.b.build_bit_cast(h, kb.cx.f16_type(), "hf")?.into_float_value();
    kb.to_f32(f)
}

/// A small unsigned integer `v` (`i32`, `0 ≤ v < 2²³`, minus `bias`) as an exact `f32`,
/// without an integer-to-float conversion: the bits `0x4B000000 | v` are the float `2²³ + v`,
/// and subtracting `2²³ + bias` is exact (Sterbenz). Two full-rate instructions (`lop3`,
/// `fadd`) where `cvt.rn.f32.u32` runs at a quarter of the FP32 rate on sm_80/sm_90 — a
/// quantized GEMV converts one quant per weight element, so the conversion would bound it.
pub(crate) fn small_uint_to_f32<'ctx>(kb: &KernelBuilder<'ctx>, v: IntValue<'ctx>, bias: u32) -> R<FloatValue<'ctx>> {
    let i32t = kb.cx.i32_type();
    let f32t = kb.cx.f32_type();
    let bits = kb.b.build_or(v, i32t.const_int(0x4B00_0000, false), "mg")?;
    let f = kb.b.build_bit_cast(bits, f32t, "mg")?.into_float_value();
    Ok(kb.b.build_float_sub(f, f32t.const_float(8_388_608.0 + f64::from(bias)), "mg")?)
}

/// Byte `shift / 8` of `w` (an `i32`) as a signed `i8` value in an exact `f32`, through
/// [`small_uint_to_f32`]: `(byte ^ 0x80)` is `q + 128`.
fn signed_byte_to_f32<'ctx>(kb: &KernelBuilder<'ctx>, w: IntValue<'ctx>, shift: u64) -> R<FloatValue<'ctx>> {
    let i32t = kb.cx.i32_type();
    let v = kb.b.build_right_shift(w, i32t.const_int(shift, false), false, "sb")?;
    let v = kb.b.build_and(v, i32t.const_int(0xFF, false), "sb")?;
    let v = kb.b.build_xor(v, i32t.const_int(0x80, false), "sb")?;
    small_uint_to_f32(kb, v, 128)
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
    let nf = small_uint_to_f32(kb, nib, 0)?;
    fma(kb, nf, d, m)
}

/// The 32 exact `f32` values of block `block` (an `i64` block index) of the block-quantized
/// tensor at `base` (bytes, global memory, 4-byte aligned), read with 4-byte loads:
///
/// - `q4_1` (20-byte blocks, so every block is 4-byte aligned): five `ld.global.b32` — `d`
///   and `m` in the first word, the 16 quant bytes in the other four; element `4i + t` is the
///   low nibble of byte `t` of quant word `i`, element `16 + 4i + t` its high nibble.
/// - `q8_0` (34-byte blocks, 2-byte aligned): the block starts `s = 34·block mod 4` (0 or 2)
///   bytes past a 4-byte boundary; eight words from that boundary and a last word assembled
///   from two 16-bit loads (the second at `+32+s`, so that no byte past the block is read)
///   are funnel-shifted right by `8s` bits (`shf.r`), giving the block's bytes in order.
///
/// Nothing outside the block is read.
pub(crate) fn block_values<'ctx>(kb: &KernelBuilder<'ctx>, dtype: DType, base: PointerValue<'ctx>, block: IntValue<'ctx>) -> R<Vec<FloatValue<'ctx>>> {
    let b = &kb.b;
    let i8t = kb.cx.i8_type();
    let i16t = kb.cx.i16_type();
    let i32t = kb.cx.i32_type();
    let bb = block_bytes(dtype)?;
    let at = b.build_int_mul(block, kb.i64c(i64::from(bb)), "qat")?;
    let word = |p: PointerValue<'ctx>, i: i64| -> R<IntValue<'ctx>> { Ok(kb.load(i32t.into(), kb.gep(i32t.into(), p, kb.i64c(i))?, 4)?.into_int_value()) };
    let byte_of = |w: IntValue<'ctx>, shift: u64, signed: bool| -> R<FloatValue<'ctx>> {
        if signed {
            signed_byte_to_f32(kb, w, shift)
        } else {
            let v = b.build_right_shift(w, i32t.const_int(shift, false), false, "qn")?;
            let v = b.build_and(v, i32t.const_int(15, false), "qn")?;
            small_uint_to_f32(kb, v, 0)
        }
    };
    let mut out = Vec::with_capacity(32);
    if dtype == DType::Q4_1 {
        let p = kb.gep(i8t.into(), base, at)?;
        let w0 = word(p, 0)?;
        let d = f16_bits_to_f32(kb, w0)?;
        let m = f16_bits_to_f32(kb, b.build_right_shift(w0, i32t.const_int(16, false), false, "m")?)?;
        let ws: Vec<IntValue> = (1..5).map(|i| word(p, i)).collect::<R<_>>()?;
        let mut lo = Vec::with_capacity(16);
        let mut hi = Vec::with_capacity(16);
        for w in &ws {
            for t in 0..4u64 {
                lo.push(fma(kb, byte_of(*w, 8 * t, false)?, d, m)?);
                hi.push(fma(kb, byte_of(*w, 8 * t + 4, false)?, d, m)?);
            }
        }
        out.extend(lo);
        out.extend(hi);
        return Ok(out);
    }
    // q8_0: align down to a word, shift by 8·s bits.
    let s = b.build_and(at, kb.i64c(3), "qs")?;
    let aligned = b.build_int_sub(at, s, "qa")?;
    let p = kb.gep(i8t.into(), base, aligned)?;
    let mut w: Vec<IntValue> = (0..8).map(|i| word(p, i)).collect::<R<_>>()?;
    let lo16 = kb.load(i16t.into(), kb.gep(i8t.into(), p, kb.i64c(32))?, 2)?.into_int_value();
    let hi_at = b.build_int_add(s, kb.i64c(32), "qh")?;
    let hi16 = kb.load(i16t.into(), kb.gep(i8t.into(), p, hi_at)?, 2)?.into_int_value();
    let lo32 = b.build_int_z_extend(lo16, i32t, "w8")?;
    let hi32 = b.build_left_shift(b.build_int_z_extend(hi16, i32t, "w8")?, i32t.const_int(16, false), "w8")?;
    w.push(b.build_or(lo32, hi32, "w8")?);
    let sh = b.build_int_truncate(b.build_left_shift(s, kb.i64c(3), "sh")?, i32t, "sh")?;
    // Shifted words: sw[i] holds block bytes 4i .. 4i+4 (sw[8]: bytes 32, 33 in its low half).
    let mut sw = Vec::with_capacity(9);
    for i in 0..9 {
        let next = if i + 1 < 9 { w[i + 1] } else { i32t.const_zero() };
        sw.push(kb.intrinsic_value("llvm.fshr", &[i32t.into()], &[next.into(), w[i].into(), sh.into()])?.into_int_value());
    }
    let d = f16_bits_to_f32(kb, sw[0])?;
    for j in 0..32usize {
        let byte = j + 2;
        let q = byte_of(sw[byte / 4], 8 * (byte % 4) as u64, true)?;
        out.push(b.build_float_mul(q, d, "qv")?);
    }
    Ok(out)
}

/// The raw words thread `t` (`lane mod 4`, an `i64`) of an `mma.m16n8k16` B fragment needs
/// from block `block` (an `i64` block index) of one weight row: with `B(k, n) = W[n][k]`,
/// its fragments of the block's two k16 steps hold elements `2t, 2t+1, 2t+8, 2t+9` and the
/// same plus 16 (PTX ISA §9.7.14.5.14). Loads (all naturally aligned):
/// - `q4_1`: the word of `d` and `m`, and the 16-bit pairs of quant bytes `2t, 2t+1` and
///   `2t+8, 2t+9`, whose low nibbles are the first step's elements and high nibbles the
///   second's (3 loads);
/// - `q8_0`: `d`, and the quant byte pairs `2t`, `2t+8`, `16+2t`, `24+2t` (5 loads).
///
/// Every load is of the block itself; the four threads of a row read the whole block.
pub(crate) fn fragment_words<'ctx>(kb: &KernelBuilder<'ctx>, dtype: DType, base: PointerValue<'ctx>, block: IntValue<'ctx>, t: IntValue<'ctx>) -> R<Vec<IntValue<'ctx>>> {
    let b = &kb.b;
    let i8t = kb.cx.i8_type();
    let i16t = kb.cx.i16_type();
    let i32t = kb.cx.i32_type();
    let bb = block_bytes(dtype)?;
    let at = b.build_int_mul(block, kb.i64c(i64::from(bb)), "qat")?;
    let p = kb.gep(i8t.into(), base, at)?;
    let two_t = b.build_left_shift(t, kb.i64c(1), "t2")?;
    let half = |off: IntValue<'ctx>| -> R<IntValue<'ctx>> {
        let v = kb.load(i16t.into(), kb.gep(i8t.into(), p, off)?, 2)?.into_int_value();
        Ok(b.build_int_z_extend(v, i32t, "h")?)
    };
    let at_t = |c: i64| -> R<IntValue<'ctx>> { Ok(b.build_int_add(two_t, kb.i64c(c), "o")?) };
    if dtype == DType::Q4_1 {
        let dm = kb.load(i32t.into(), p, 4)?.into_int_value();
        return Ok(vec![dm, half(at_t(4)?)?, half(at_t(12)?)?]);
    }
    Ok(vec![half(kb.i64c(0))?, half(at_t(2)?)?, half(at_t(10)?)?, half(at_t(18)?)?, half(at_t(26)?)?])
}

/// The eight exact `f32` values of [`fragment_words`]'s words, in fragment order: the first
/// k16 step's `b[0]` (elements `2t`, `2t+1`) and `b[1]` (`2t+8`, `2t+9`), then the second
/// step's (the same plus 16).
pub(crate) fn fragment_values<'ctx>(kb: &KernelBuilder<'ctx>, dtype: DType, w: &[IntValue<'ctx>]) -> R<Vec<FloatValue<'ctx>>> {
    let b = &kb.b;
    let i32t = kb.cx.i32_type();
    let bits = |v: IntValue<'ctx>, shift: u64, mask: u64| -> R<IntValue<'ctx>> {
        let s = b.build_right_shift(v, i32t.const_int(shift, false), false, "q")?;
        Ok(b.build_and(s, i32t.const_int(mask, false), "q")?)
    };
    if dtype == DType::Q4_1 {
        let [dm, w0, w1] = w else { return Err(CodegenError::Builder("q4_1 fragment words".into())) };
        let d = f16_bits_to_f32(kb, *dm)?;
        let m = f16_bits_to_f32(kb, b.build_right_shift(*dm, i32t.const_int(16, false), false, "m")?)?;
        let mut out = Vec::with_capacity(8);
        // Step 0: low nibbles of bytes (2t, 2t+1), (2t+8, 2t+9); step 1: the high nibbles.
        for hi in [0u64, 4] {
            for word in [*w0, *w1] {
                for byte in [0u64, 8] {
                    let n = small_uint_to_f32(kb, bits(word, byte + hi, 15)?, 0)?;
                    out.push(fma(kb, n, d, m)?);
                }
            }
        }
        return Ok(out);
    }
    let [dw, rest @ ..] = w else { return Err(CodegenError::Builder("q8_0 fragment words".into())) };
    let d = f16_bits_to_f32(kb, *dw)?;
    let mut out = Vec::with_capacity(8);
    for word in rest {
        for byte in [0u64, 8] {
            let qf = signed_byte_to_f32(kb, *word, byte)?;
            out.push(b.build_float_mul(qf, d, "qv")?);
        }
    }
    Ok(out)
}
