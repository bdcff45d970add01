//! `f8e4m3` (OCP OFP8 E4M3, [`sinter_ir::DType::F8E4M3`]) in registers: the LLVM IR
//! that converts `f32` values to e4m3 bytes and back, shared by the element evaluator
//! (`quantize_fp8`, `dequantize_fp8`, `cast` and fp8 loads/stores in any element-wise
//! kernel, see `kernels::element`).
//!
//! An e4m3 value is held as its bit pattern, an `i8`. Both directions are bit-exact with the
//! interpreter ([`sinter_ir::dtype::f8e4m3_from_f64`], [`sinter_ir::dtype::f8e4m3_to_f64`]):
//!
//! - **f32 → e4m3** rounds to nearest even from the `f32` value and saturates (`.satfinite`):
//!   finite values beyond ±448 and ±inf give ±448 (`0x7E`/`0xFE`), NaN gives NaN (`0x7F`
//!   with or without the sign bit: the two NaN encodings, which the interpreter does not tell
//!   apart), subnormals (`m·2⁻⁹`) are kept and `|x| ≤ 2⁻¹⁰` gives ±0. On sm_89 and later
//!   (sm_90, sm_90a) two values convert in one `cvt.rn.satfinite.e4m3x2.f32` (PTX ISA
//!   §9.7.9.21, `cvt`, "requires sm_89 or higher"); on sm_80, which has no fp8 conversion, in
//!   integer arithmetic: `|x|`'s `f32` bits clamped to 448's, then the 20 low mantissa bits
//!   rounded off to nearest even and the exponent rebiased (normal results), or `|x|·2⁹`
//!   rounded to an integer by adding 2²³ (the subnormal range `|x| < 2⁻⁶`, whose integer `m`
//!   is the code itself: `m = 8` is `0x08`, the smallest normal, exactly where rounding up
//!   lands).
//! - **e4m3 → f32** is exact (every e4m3 value is an `f16`, and an `f32`): on sm_89 and later
//!   two bytes convert in one `cvt.rn.f16x2.e4m3x2` (same section), then `cvt.f32.f16`; on
//!   sm_80 the byte's magnitude bits shifted into an `f16`'s (`S.EEEE.MMM` → `S.0EEEE.MMM0000000`,
//!   exponent bias 15 instead of 7) are that `f16` value times 2⁻⁸ — subnormals included,
//!   since `cvt.f32.f16` keeps them — so the result is `f32(h)·256` (exact), with `S.1111.111`
//!   mapped to NaN.
//!
//! The kernels keep IEEE subnormals (no `.ftz` anywhere), which both routes rely on.

use inkwell::values::{FloatValue, IntValue};

use crate::isa::KernelBuilder;
use crate::error::CodegenError;

type R<T> = Result<T, CodegenError>;

/// Whether `kb`'s target converts e4m3 in hardware (`cvt … e4m3x2`, sm_89 and later).
pub(crate) fn has_cvt(kb: &KernelBuilder<'_>) -> bool {
    kb.target.sm_version() >= 89
}

/// The e4m3 bytes (`i8`) nearest to `xs` (`f32`), rounded to nearest even with saturation
/// (see the module docs), in order. Pairs go through one `cvt.rn.satfinite.e4m3x2.f32` where
/// the target has it.
///
/// # Errors
/// [`CodegenError::Builder`].
pub(crate) fn from_f32<'ctx>(kb: &KernelBuilder<'ctx>, xs: &[FloatValue<'ctx>]) -> R<Vec<IntValue<'ctx>>> {
    if !has_cvt(kb) {
        return xs.iter().map(|&x| from_f32_soft(kb, x)).collect();
    }
    let (i8t, i16t, f32t) = (kb.cx.i8_type(), kb.cx.i16_type(), kb.cx.f32_type());
    let fty = i16t.fn_type(&[f32t.into(), f32t.into()], false);
    // `cvt.rn.satfinite.e4m3x2.f32 d, a, b`: a's byte in d's upper half, b's in the lower.
    let cvt = kb.cx.create_inline_asm(fty, "cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;".to_owned(), "=h,f,f".to_owned(), false, false, None, false);
    let mut out = Vec::with_capacity(xs.len());
    for pair in xs.chunks(2) {
        let (lo, hi) = (pair[0], pair.get(1).copied().unwrap_or(pair[0]));
        let r = kb.b.build_indirect_call(fty, cvt, &[hi.into(), lo.into()], "e4m3x2")?;
        let d = r.try_as_basic_value().basic().ok_or_else(|| CodegenError::Builder("cvt e4m3x2 without a result".into()))?.into_int_value();
        out.push(kb.b.build_int_truncate(d, i8t, "e4m3")?);
        if pair.len() == 2 {
            let h = kb.b.build_right_shift(d, i16t.const_int(8, false), false, "hi")?;
            out.push(kb.b.build_int_truncate(h, i8t, "e4m3")?);
        }
    }
    Ok(out)
}

/// One `f32` to its e4m3 byte without fp8 instructions (sm_80; see the module docs).
fn from_f32_soft<'ctx>(kb: &KernelBuilder<'ctx>, x: FloatValue<'ctx>) -> R<IntValue<'ctx>> {
    let b = &kb.b;
    let (i32t, f32t) = (kb.cx.i32_type(), kb.cx.f32_type());
    let c = |v: u32| i32t.const_int(u64::from(v), false);
    let u = b.build_bit_cast(x, i32t, "u")?.into_int_value();
    let sign = b.build_right_shift(u, c(24), false, "s")?;
    let sign = b.build_and(sign, c(0x80), "s")?;
    let a = b.build_and(u, c(0x7FFF_FFFF), "a")?;
    let nan = b.build_int_compare(inkwell::IntPredicate::UGT, a, c(0x7F80_0000), "nan")?;
    // Normal results: |x| clamped to 448 (0x43E00000; ±inf and larger finite values
    // saturate), rounded to 3 mantissa bits (nearest even), rebiased from 127 to 7.
    let m = kb.intrinsic_value("llvm.umin", &[i32t.into()], &[a.into(), c(0x43E0_0000).into()])?.into_int_value();
    let odd = b.build_right_shift(m, c(20), false, "odd")?;
    let odd = b.build_and(odd, c(1), "odd")?;
    let r = b.build_int_add(m, c(0x7_FFFF), "r")?;
    let r = b.build_int_add(r, odd, "r")?;
    let r = b.build_right_shift(r, c(20), false, "r")?;
    let normal = b.build_int_sub(r, c(120 << 3), "n")?;
    // Subnormal results (|x| < 2⁻⁶, 0x3C800000): |x|·2⁹ (exact) rounded to an integer by
    // the f32 adder (2²³ + v, v ≤ 8, has a quantum of 1): the code m of m·2⁻⁹.
    let af = b.build_bit_cast(a, f32t, "af")?.into_float_value();
    let t = b.build_float_mul(af, f32t.const_float(512.0), "t")?;
    let t = b.build_float_add(t, f32t.const_float(8_388_608.0), "t")?;
    let t = b.build_bit_cast(t, i32t, "t")?.into_int_value();
    let sub = b.build_int_sub(t, c(0x4B00_0000), "sub")?;
    let small = b.build_int_compare(inkwell::IntPredicate::ULT, a, c(0x3C80_0000), "small")?;
    let code = b.build_select(small, sub, normal, "code")?.into_int_value();
    let code = b.build_select(nan, c(0x7F), code, "code")?.into_int_value();
    let code = b.build_or(code, sign, "code")?;
    Ok(b.build_int_truncate(code, kb.cx.i8_type(), "e4m3")?)
}

/// The `f32` values of e4m3 bytes `bs` (`i8`), exact (see the module docs), in order. Pairs go
/// through one `cvt.rn.f16x2.e4m3x2` where the target has it.
///
/// # Errors
/// [`CodegenError::Builder`].
pub(crate) fn to_f32<'ctx>(kb: &KernelBuilder<'ctx>, bs: &[IntValue<'ctx>]) -> R<Vec<FloatValue<'ctx>>> {
    if !has_cvt(kb) {
        return bs.iter().map(|&x| to_f32_soft(kb, x)).collect();
    }
    let (i16t, i32t) = (kb.cx.i16_type(), kb.cx.i32_type());
    let fty = i32t.fn_type(&[i16t.into()], false);
    // `cvt.rn.f16x2.e4m3x2 d, a`: a's upper byte to d's upper half, the lower to the lower.
    let cvt = kb.cx.create_inline_asm(fty, "cvt.rn.f16x2.e4m3x2 $0, $1;".to_owned(), "=r,h".to_owned(), false, false, None, false);
    let mut out = Vec::with_capacity(bs.len());
    for pair in bs.chunks(2) {
        let lo = kb.b.build_int_z_extend(pair[0], i16t, "lo")?;
        let a = match pair.get(1) {
            Some(&hi) => {
                let hi = kb.b.build_int_z_extend(hi, i16t, "hi")?;
                let hi = kb.b.build_left_shift(hi, i16t.const_int(8, false), "hi")?;
                kb.b.build_or(hi, lo, "x2")?
            }
            None => lo,
        };
        let r = kb.b.build_indirect_call(fty, cvt, &[a.into()], "f16x2")?;
        let d = r.try_as_basic_value().basic().ok_or_else(|| CodegenError::Builder("cvt f16x2 without a result".into()))?.into_int_value();
        out.push(crate::quant::f16_bits_to_f32(kb, d)?);
        if pair.len() == 2 {
            let h = kb.b.build_right_shift(d, i32t.const_int(16, false), false, "hi")?;
            out.push(crate::quant::f16_bits_to_f32(kb, h)?);
        }
    }
    Ok(out)
}

/// One e4m3 byte to `f32` without fp8 instructions (sm_80; see the module docs).
fn to_f32_soft<'ctx>(kb: &KernelBuilder<'ctx>, x: IntValue<'ctx>) -> R<FloatValue<'ctx>> {
    let b = &kb.b;
    let (i16t, f32t) = (kb.cx.i16_type(), kb.cx.f32_type());
    let c = |v: u64| i16t.const_int(v, false);
    let w = b.build_int_z_extend(x, i16t, "w")?;
    let mag = b.build_and(w, c(0x7F), "mag")?;
    let sign = b.build_and(w, c(0x80), "sign")?;
    let h = b.build_left_shift(mag, c(7), "h")?;
    let s = b.build_left_shift(sign, c(8), "s")?;
    let h = b.build_or(h, s, "h")?;
    let f = crate::quant::f16_bits_to_f32(kb, h)?;
    let f = b.build_float_mul(f, f32t.const_float(256.0), "f")?;
    let nan = b.build_int_compare(inkwell::IntPredicate::EQ, mag, c(0x7F), "nan")?;
    Ok(b.build_select(nan, f32t.const_float(f64::NAN), f, "f")?.into_float_value())
}

#[cfg(test)]
mod tests {
    use sinter_ir::dtype::{f8e4m3_from_f64, f8e4m3_to_f64};

    /// The integer steps of `from_f32_soft`, in Rust (the same constants, in the same order):
    /// what the sm_80 kernels compute.
    fn soft_encode(x: f32) -> u8 {
        let u = x.to_bits();
        let sign = (u >> 24) & 0x80;
        let a = u & 0x7FFF_FFFF;
        let nan = a > 0x7F80_0000;
        let m = a.min(0x43E0_0000);
        let odd = (m >> 20) & 1;
        let normal = ((m + 0x7_FFFF + odd) >> 20).wrapping_sub(120 << 3);
        let t = f32::from_bits(a) * 512.0 + 8_388_608.0;
        let sub = t.to_bits().wrapping_sub(0x4B00_0000);
        let code = if nan { 0x7F } else if a < 0x3C80_0000 { sub } else { normal };
        (code | sign) as u8
    }

    /// The steps of `to_f32_soft`: the magnitude bits moved into an f16, times 256.
    fn soft_decode(b: u8) -> f32 {
        let mag = u16::from(b & 0x7F);
        if mag == 0x7F {
            return f32::NAN;
        }
        let h = (mag << 7) | (u16::from(b & 0x80) << 8);
        half::f16::from_bits(h).to_f32() * 256.0
    }

    fn same(a: u8, want: u8) -> bool {
        // The two NaN encodings are one value to the interpreter.
        a == want || (a & 0x7F == 0x7F && want & 0x7F == 0x7F)
    }

    #[test]
    fn software_decode_is_exact_for_every_byte() {
        for b in 0..=255u8 {
            let (got, want) = (soft_decode(b), f8e4m3_to_f64(b));
            assert!((got.is_nan() && want.is_nan()) || (f64::from(got).to_bits() == want.to_bits()), "{b:#04x}: {got} vs {want}");
        }
    }

    #[test]
    fn software_encode_matches_the_interpreter() {
        let check = |x: f32| {
            let (got, want) = (soft_encode(x), f8e4m3_from_f64(f64::from(x)));
            assert!(same(got, want), "{x:e} ({:#010x}): {got:#04x} vs {want:#04x}", x.to_bits());
        };
        // Every code's value, the midpoints between neighbours (ties) and one f32 ulp either
        // side of each, in both signs; the saturation edge; specials.
        for b in 0..0x7Eu8 {
            let (lo, hi) = (f8e4m3_to_f64(b) as f32, f8e4m3_to_f64(b + 1) as f32);
            let mid = ((f64::from(lo) + f64::from(hi)) / 2.0) as f32;
            for v in [lo, hi, mid, f32::from_bits(mid.to_bits() - 1), f32::from_bits(mid.to_bits() + 1)] {
                check(v);
                check(-v);
            }
        }
        for v in [448.0f32, 448.00003, 463.9, 464.0, 464.1, 479.0, 480.0, 1e30, f32::MAX, f32::INFINITY, f32::NEG_INFINITY, f32::NAN, -f32::NAN, 0.0, -0.0, f32::MIN_POSITIVE, 1e-45, 2f32.powi(-10), 2f32.powi(-10) * 1.0000001] {
            check(v);
            check(-v);
        }
        // A sweep of the f32 bit patterns.
        let mut u = 0u32;
        while let Some(n) = u.checked_add(104_729) {
            check(f32::from_bits(u));
            u = n;
        }
    }

    /// The element evaluator's fp8 kernels for sm_80 (the integer conversions: the CPU
    /// emulator cannot run the `cvt … e4m3x2` inline PTX of sm_89+), emulated on the CPU
    /// (`kernels::matmul::emu`, running the kernel's IR before the optimisation pipeline)
    /// against the interpreter, bit for bit: `quantize_fp8` of every bf16 bit pattern and of
    /// f32 values around every e4m3 tie, `dequantize_fp8` of every e4m3 code to bf16 and f32,
    /// the fake-quant round trip; scales 0.37, 1.9 and 0.5; odd lengths.
    #[test]
    fn emulated_sm80_kernels_match_the_interpreter_bit_for_bit() {
        use crate::emu::{from_bytes, run, to_bytes};
        use crate::testing::{d, single_kernel, ty};
        use crate::target::Target;
        use sinter_ir::interp::{self, Tensor};
        use sinter_ir::{Attr, Bindings, DType, Family, FunctionBuilder, Graph, OpKind};
        let run_exact = |what: &str, g: &sinter_ir::KernelGraph, k: sinter_ir::Kernel, ins: &[Tensor]| {
            let body = &g.kernels[k].body;
            let mut graph = Graph::new();
            graph.add_func(body.clone());
            let refs: Vec<&Tensor> = ins.iter().collect();
            let want = interp::run(&graph, &body.name, &refs, &Bindings::new()).unwrap();
            // The kernel's IR before the optimisation pipeline, run in place of its PTX.
            let (plan, irs) = crate::isa::capture_ir(|| crate::compile_kernel(g, k, &Target::SM_80));
            let mut plan = plan.unwrap_or_else(|e| panic!("{what}: {e}"));
            plan.ptx = irs.last().cloned().unwrap_or_else(|| panic!("{what}: no IR captured"));
            let mut bufs: Vec<Vec<u8>> = ins.iter().map(to_bytes).collect();
            let n = want[0].data().len();
            bufs.push(vec![0xA5; n * want[0].dtype().size_bytes() + 64]);
            run(&plan, &Bindings::new(), &mut bufs);
            let out = &bufs[ins.len()];
            assert!(out[n * want[0].dtype().size_bytes()..].iter().all(|&b| b == 0xA5), "{what}: written past the end");
            let got = from_bytes(want[0].dtype(), out, n);
            for (i, (o, r)) in got.iter().zip(want[0].data()).enumerate() {
                assert!(o.to_bits() == r.to_bits() || (o.is_nan() && r.is_nan()), "{what}: element {i} (input {}): {o:e} vs the interpreter's {r:e}", ins[0].data()[i]);
            }
        };
        let scale = |s: f64| Tensor::scalar(DType::F32, s);
        for s in [0.37, 1.9, 0.5] {
            // quantize_fp8 of every bf16 pattern (65536 elements) and of f32 values at and
            // around the e4m3 ties (times s), ±inf, NaN, beyond 448.
            let mut fb = FunctionBuilder::new(&Graph::new(), "quantize_fp8");
            let (x, sc) = (fb.param("x", ty(DType::BF16, &[d(65536)])), fb.param("s", ty(DType::F32, &[])));
            let q = fb.op1(OpKind::QuantizeFp8, &[x, sc], vec![]).unwrap();
            let (g, k) = single_kernel(Family::Pointwise, fb.finish(&[q]).unwrap());
            let xs: Vec<f64> = (0..=u16::MAX).map(|b| f64::from(f32::from_bits(u32::from(b) << 16))).collect();
            run_exact(&format!("quantize bf16 s={s}"), &g, k, &[Tensor::new(DType::BF16, &[65536], xs).unwrap(), scale(s)]);
            let mut f32s = vec![f64::INFINITY, f64::NEG_INFINITY, f64::NAN, 0.0, -0.0, 1e30, -449.0 * s, 464.0 * s, 2f64.powi(-10) * s];
            for b in 0..0x7Eu8 {
                let mid = (f8e4m3_to_f64(b) + f8e4m3_to_f64(b + 1)) / 2.0;
                let t = mid * s;
                let tf = t as f32;
                f32s.extend([t, -t, f64::from(f32::from_bits(tf.to_bits() + 1)), f64::from(f32::from_bits(tf.to_bits() - 1)), f8e4m3_to_f64(b) * s]);
            }
            let n = f32s.len();
            let mut fb = FunctionBuilder::new(&Graph::new(), "quantize_fp8");
            let (x, sc) = (fb.param("x", ty(DType::F32, &[d(n as i64)])), fb.param("s", ty(DType::F32, &[])));
            let q = fb.op1(OpKind::QuantizeFp8, &[x, sc], vec![]).unwrap();
            let (g, k) = single_kernel(Family::Pointwise, fb.finish(&[q]).unwrap());
            run_exact(&format!("quantize f32[{n}] s={s}"), &g, k, &[Tensor::new(DType::F32, &[n], f32s.clone()).unwrap(), scale(s)]);
            // The fake-quant round trip of the same f32 values, to bf16.
            let mut fb = FunctionBuilder::new(&Graph::new(), "fake_quant");
            let (x, sc) = (fb.param("x", ty(DType::F32, &[d(n as i64)])), fb.param("s", ty(DType::F32, &[])));
            let q = fb.op1(OpKind::QuantizeFp8, &[x, sc], vec![]).unwrap();
            let y = fb.op1(OpKind::DequantizeFp8, &[q, sc], vec![("dtype", Attr::DType(DType::BF16))]).unwrap();
            let (g, k) = single_kernel(Family::Pointwise, fb.finish(&[y]).unwrap());
            run_exact(&format!("fake quant f32[{n}] s={s}"), &g, k, &[Tensor::new(DType::F32, &[n], f32s).unwrap(), scale(s)]);
            // dequantize_fp8 of every code (257: one odd tail), to bf16 and f32.
            for dt in [DType::BF16, DType::F32] {
                let mut fb = FunctionBuilder::new(&Graph::new(), "dequantize_fp8");
                let (x, sc) = (fb.param("x8", ty(DType::F8E4M3, &[d(257)])), fb.param("s", ty(DType::F32, &[])));
                let y = fb.op1(OpKind::DequantizeFp8, &[x, sc], vec![("dtype", Attr::DType(dt))]).unwrap();
                let (g, k) = single_kernel(Family::Pointwise, fb.finish(&[y]).unwrap());
                let codes: Vec<f64> = (0..257).map(|i| f8e4m3_to_f64((i % 256) as u8)).collect();
                run_exact(&format!("dequantize to {dt} s={s}"), &g, k, &[Tensor::new(DType::F8E4M3, &[257], codes).unwrap(), scale(s)]);
            }
        }
    }
}
