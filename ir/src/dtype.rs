//! Element types of tensors.

use std::fmt;

/// The element type of a tensor value.
///
/// Floating types are stored in their own width on devices; the reference interpreter keeps
/// every element as an `f64` that has already been rounded to this type (see [`DType::round`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DType {
    /// bfloat16: 8 exponent bits, 7 mantissa bits.
    BF16,
    /// IEEE 754 binary16.
    F16,
    /// IEEE 754 binary32.
    F32,
    /// 32-bit signed integer (positions, block tables, sequence lengths).
    I32,
    /// 64-bit signed integer (token ids, indices).
    I64,
    /// Boolean (masks, comparison results); stored as one byte.
    Bool,
    /// GGUF `Q8_0` block quantization (llama.cpp `ggml-common.h` `block_q8_0`): blocks of 32
    /// consecutive elements of the last axis, each stored as 34 bytes — an `f16` scale `d`
    /// and 32 `i8` quants `q` — with value `q·d`. A storage-only type: only `dequantize`
    /// reads it (see [`DType::is_quantized`]).
    Q8_0,
    /// GGUF `Q4_1` block quantization (`block_q4_1`): blocks of 32 consecutive elements of the
    /// last axis, each stored as 20 bytes — `f16` scale `d`, `f16` minimum `m`, 16 bytes `qs`
    /// whose low nibbles are elements 0..16 and high nibbles elements 16..32 — with value
    /// `nibble·d + m`. A storage-only type: only `dequantize` reads it.
    Q4_1,
    /// OCP 8-bit floating point E4M3 (OFP8, "OCP 8-bit Floating Point Specification" v1.0,
    /// 2023; `float8_e4m3fn` in PyTorch and ml_dtypes, `__nv_fp8_e4m3` in CUDA): 1 sign bit,
    /// 4 exponent bits with bias 7, 3 mantissa bits, one byte per element. No infinities; the
    /// only NaNs are `S.1111.111` (`0x7F`, `0xFF`); the largest finite magnitude is
    /// `S.1111.110` = 448; subnormals (exponent field 0) are `m·2⁻⁹`, down to 2⁻⁹. A storage
    /// type, like the block-quantized ones but element-wise: only conversions and data
    /// movement accept it (see [`crate::storage::accepts_fp8`]); arithmetic reads it through
    /// `dequantize_fp8`. Rounding to it saturates ([`DType::round`], [`f8e4m3_from_f64`]).
    F8E4M3,
    /// GGUF `Q5_0` block quantization (`block_q5_0`): blocks of 32 consecutive elements of the
    /// last axis, each stored as 22 bytes — `f16` scale `d`, a little-endian `u32` `qh` whose
    /// bit `j` is the fifth bit of element `j`, 16 bytes of low nibbles as in `q4_1` — with
    /// value `(q − 16)·d`. Storage-only (see [`crate::qblock`]).
    Q5_0,
    /// GGUF `Q4_K` super-block quantization (`block_q4_K`): blocks of 256 elements of the last
    /// axis in 144 bytes — `f16 d`, `f16 dmin`, eight 6-bit scales and mins packed in 12
    /// bytes, 128 bytes of nibbles — with value `(d·sc)·q − dmin·mn` per sub-block of 32.
    /// Storage-only (see [`crate::qblock`]).
    Q4K,
    /// GGUF `Q6_K` super-block quantization (`block_q6_K`): blocks of 256 elements of the last
    /// axis in 210 bytes — 128 bytes of low nibbles, 64 bytes of high bit pairs, sixteen `i8`
    /// scales, `f16 d` — with value `(d·sc)·(q − 32)` per sub-block of 16. Storage-only (see
    /// [`crate::qblock`]).
    Q6K,
}

impl DType {
    /// Every dtype, in text-format order.
    pub const ALL: [DType; 12] = [DType::BF16, DType::F16, DType::F32, DType::I32, DType::I64, DType::Bool, DType::Q8_0, DType::Q4_1, DType::F8E4M3, DType::Q5_0, DType::Q4K, DType::Q6K];

    /// The largest finite `f8e4m3` magnitude, `S.1111.110` = 1.75·2⁸: where rounding to
    /// `f8e4m3` saturates.
    pub const F8E4M3_MAX: f64 = 448.0;

    /// Elements per quantization block of `q8_0`, `q4_1` and `q5_0` (the k-quants `q4_k` and
    /// `q6_k` have blocks of 256: see [`DType::block_elems`]).
    pub const QBLOCK: usize = 32;

    /// The spelling in the text format and the DSL (`bf16`, `f16`, `f32`, `i32`, `i64`, `bool`,
    /// `q8_0`, `q4_1`, `f8e4m3`, `q5_0`, `q4_k`, `q6_k`).
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
            DType::Q8_0 => "q8_0",
            DType::Q4_1 => "q4_1",
            DType::F8E4M3 => "f8e4m3",
            DType::Q5_0 => "q5_0",
            DType::Q4K => "q4_k",
            DType::Q6K => "q6_k",
        }
    }

    /// Parses a dtype name as printed by [`DType::name`].
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Bytes one element occupies in device memory. Block-quantized types have no
    /// per-element size: they report 1 (they are addressed in bytes); size their buffers with
    /// [`DType::storage_bytes`].
    pub fn size_bytes(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::Bool | DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K | DType::F8E4M3 => 1,
        }
    }

    /// True for `f8e4m3`, the 8-bit floating-point storage type.
    pub fn is_fp8(self) -> bool {
        matches!(self, DType::F8E4M3)
    }

    /// True for the block-quantized storage types `q8_0`, `q4_1`, `q5_0`, `q4_k` and `q6_k`.
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K)
    }

    /// Bytes of one block of a block-quantized type (34 for `q8_0`, 20 for `q4_1`, 22 for
    /// `q5_0`, 144 for `q4_k`, 210 for `q6_k`), `None` for the others.
    pub fn block_bytes(self) -> Option<usize> {
        match self {
            DType::Q8_0 => Some(34),
            DType::Q4_1 => Some(20),
            DType::Q5_0 => Some(22),
            DType::Q4K => Some(144),
            DType::Q6K => Some(210),
            _ => None,
        }
    }

    /// Elements of one block of a block-quantized type (32; 256 for the k-quants `q4_k` and
    /// `q6_k`), `None` for the others.
    pub fn block_elems(self) -> Option<usize> {
        match self {
            DType::Q8_0 | DType::Q4_1 | DType::Q5_0 => Some(DType::QBLOCK),
            DType::Q4K | DType::Q6K => Some(256),
            _ => None,
        }
    }

    /// Bytes that `elements` elements occupy in device memory: `elements · size_bytes` for
    /// the element types, `elements / block_elems · block_bytes` for the block-quantized ones.
    /// `None` when the count overflows `usize` or is not a whole number of blocks.
    pub fn storage_bytes(self, elements: usize) -> Option<usize> {
        match (self.block_bytes(), self.block_elems()) {
            (Some(bb), Some(be)) if elements % be == 0 => (elements / be).checked_mul(bb),
            (Some(_), _) => None,
            _ => elements.checked_mul(self.size_bytes()),
        }
    }

    /// True for `bf16`, `f16` and `f32`: the float dtypes ops compute in. `f8e4m3` is a float
    /// format too, but a storage type ([`DType::is_fp8`]): it is not one of these.
    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }

    /// True for `i32` and `i64`.
    pub fn is_int(self) -> bool {
        matches!(self, DType::I32 | DType::I64)
    }

    /// Rounds an `f64` to the nearest value representable in this dtype.
    ///
    /// Floats round to nearest, ties to even (IEEE 754 §4.3.1), overflow to ±inf, NaN stays
    /// NaN. `f8e4m3`, which has no infinity, rounds to nearest even and *saturates*: finite
    /// values beyond ±448 and ±inf give ±448, NaN stays NaN (its sign kept), subnormals are
    /// kept (magnitudes up to 2⁻¹⁰ give ±0) — the `.satfinite` conversion of PTX's
    /// `cvt.rn.satfinite.e4m3x2.f32` that the GPU kernels use (see [`f8e4m3_from_f64`]). Integers truncate toward zero and saturate at the type's range (NaN gives 0), as a
    /// float-to-int cast does in PTX's `cvt.rzi.sat`. `bool` is `x != 0` (NaN is true).
    /// Block-quantized types hold per-element codes ([`QCode`]): the value is kept as the
    /// integer code it must be (non-integers truncate, out of range and NaN give 0).
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => {
                let max = (1u64 << crate::qblock::code_bits(self)) as f64;
                if x >= 0.0 && x < max {
                    x.trunc()
                } else {
                    0.0
                }
            }
            DType::F32 => x as f32 as f64,
            DType::F8E4M3 => f8e4m3_to_f64(f8e4m3_from_f64(x)),
            DType::BF16 => bf16_from_f64(x).to_f64(),
            DType::F16 => f16_from_f64(x).to_f64(),
            DType::I32 => (x as i32) as f64,
            DType::I64 => (x as i64) as f64,
            DType::Bool => {
                if x != 0.0 {
                    1.0
                } else {
                    0.0
                }
            }
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `x` rounded to the nearest bf16, ties to even, for every f64 (NaN stays NaN, overflow gives
/// ±inf). `half::bf16::from_f64` drops the low 32 bits of the f64 mantissa before rounding,
/// so a value just above a tie rounds as the tie; this rounds through f32 with round-to-odd
/// instead, which is exact for a second rounding to at most 22 bits (Boldo & Melquiond,
/// "Emulation of FMA and correctly rounded sums: proved algorithms using rounding to odd",
/// IEEE TC 2008).
pub fn bf16_from_f64(x: f64) -> half::bf16 {
    half::bf16::from_f32(f32_round_to_odd(x))
}

/// `x` rounded to the nearest f16, ties to even, for every f64 (as [`bf16_from_f64`]).
pub fn f16_from_f64(x: f64) -> half::f16 {
    half::f16::from_f32(f32_round_to_odd(x))
}

/// `x` rounded to f32 by round-to-odd: truncated toward zero, then, when that was inexact,
/// the lowest mantissa bit set (beyond f32's range: ±`f32::MAX`, which is odd).
fn f32_round_to_odd(x: f64) -> f32 {
    let t = x as f32;
    if x.is_nan() || f64::from(t) == x {
        return t;
    }
    let mut bits = if t.is_infinite() { f32::MAX.to_bits() | (t.to_bits() & 0x8000_0000) } else { t.to_bits() };
    if t.is_finite() && f64::from(t).abs() > x.abs() {
        bits -= 1;
    }
    f32::from_bits(bits | 1)
}

/// The `f8e4m3` bit pattern nearest to `x` (OCP OFP8 E4M3, see [`DType::F8E4M3`]), as
/// PTX's `cvt.rn.satfinite.e4m3x2.f32` converts (sm_89+; the x2 form packs two of these):
///
/// - round to nearest, ties to even, from the exact value of `x` (one rounding: an `f32` or
///   narrower input is converted exactly as the hardware sees it);
/// - `.satfinite`: a finite `|x|` beyond 448 (the largest finite value) and ±inf give ±448
///   (`0x7E`/`0xFE`) — never NaN, as the non-saturating OCP conversion would;
/// - NaN gives NaN, `0x7F`, with the sign bit of `x` (`0xFF` for a negative NaN; the two are
///   the only NaN encodings, and the interpreter does not tell them apart);
/// - subnormals (`m·2⁻⁹`, m = 1..7) are produced, not flushed; `|x| ≤ 2⁻¹⁰` (half the smallest
///   subnormal, a tie that goes to the even 0) gives ±0 with the sign of `x`.
///
/// This is NVIDIA's reference of the same conversion (`__nv_cvt_double_to_fp8` with
/// `__NV_SATFINITE`, `__NV_E4M3` in `cuda_fp8.hpp`, whose device path is that `cvt`).
pub fn f8e4m3_from_f64(x: f64) -> u8 {
    let sign: u8 = if x.is_sign_negative() { 0x80 } else { 0 };
    if x.is_nan() {
        return sign | 0x7F;
    }
    let a = x.abs();
    if a > DType::F8E4M3_MAX {
        return sign | 0x7E;
    }
    // The exponent of a's binade, clamped to the subnormal range: the quantum there is 2^(e-3).
    const MIN_NORMAL: f64 = 1.0 / 64.0; // 2^-6
    let e = if a >= MIN_NORMAL { ((a.to_bits() >> 52) & 0x7FF) as i32 - 1023 } else { -6 };
    let quantum = 2f64.powi(e - 3);
    // a / quantum is exact (a power-of-two scaling well inside f64's range): n is the value in
    // quanta, rounded once, at most 16 (which is the next binade's 1.000).
    let n = (a / quantum).round_ties_even();
    let v = n * quantum;
    if v < MIN_NORMAL {
        // Subnormal or zero: the mantissa field is the count of 2^-9 quanta.
        return sign | n as u8;
    }
    let ev = ((v.to_bits() >> 52) & 0x7FF) as i32 - 1023;
    let mantissa = (v / 2f64.powi(ev - 3)) as u8 - 8;
    // v ≤ 448 after rounding (448 < a ≤ 464 was refused above: 448 saturates), so the
    // exponent field ev + 7 is at most 15 and (15, 7) — NaN — is never formed.
    sign | (((ev + 7) as u8) << 3) | mantissa
}

/// The value of the `f8e4m3` bit pattern `bits` (OCP OFP8 E4M3, see [`DType::F8E4M3`]), exact
/// in `f64`: `(-1)^S · 2^(E-7) · 1.M` for an exponent field `E` of 1..15, `(-1)^S · M·2⁻⁹` for
/// `E = 0` (`0x80` is −0), NaN for `S.1111.111` (with the sign bit `S`).
pub fn f8e4m3_to_f64(bits: u8) -> f64 {
    let neg = bits & 0x80 != 0;
    let e = i32::from((bits >> 3) & 0xF);
    let m = f64::from(bits & 7);
    let mag = if e == 15 && bits & 7 == 7 {
        f64::NAN
    } else if e == 0 {
        m * 2f64.powi(-9)
    } else {
        (8.0 + m) * 2f64.powi(e - 10)
    };
    if neg {
        -mag
    } else {
        mag
    }
}

pub use crate::qblock::{qcodes_from_bytes, qcodes_to_bytes, QCode};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_and_f16_round_to_nearest_even_from_every_f64() {
        // Just above a tie, in the f64 bits half's from_f64 drops: rounds up.
        let x = f64::from_bits(0x3ff1_1000_8000_0000);
        assert_eq!(bf16_from_f64(x).to_f64(), 1.0703125);
        assert_eq!(bf16_from_f64(1.06640625).to_f64(), 1.0625, "an exact tie goes to even");
        assert_eq!(f16_from_f64(1.0 + 2f64.powi(-11) + 2f64.powi(-40)).to_f64(), 1.0 + 2f64.powi(-10));
        assert!(bf16_from_f64(f64::NAN).is_nan());
        assert_eq!(bf16_from_f64(1e39).to_f64(), f64::INFINITY);
        assert_eq!(bf16_from_f64(-1e39).to_f64(), f64::NEG_INFINITY);
        assert_eq!(f16_from_f64(65520.0).to_f64(), f64::INFINITY, "the f16 overflow tie");
        assert_eq!(f16_from_f64(65519.99).to_f64(), 65504.0);
        assert_eq!(bf16_from_f64(-0.0).to_bits(), 0x8000);
        assert_eq!(bf16_from_f64(1e-300).to_bits(), 0, "below half the least subnormal");
        // Many f64s, against the rule decided exactly: the bf16 at or below |x| (from |x|
        // truncated to f32) and the next one up; their midpoint is exact in f64.
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            let e = (state % 80) as i32 - 40;
            let m = f64::from_bits((state >> 12) | 0x3ff0_0000_0000_0000) * 2f64.powi(e);
            let x = if state & 1 == 0 { m } else { -m };
            let mut t = m as f32;
            if f64::from(t) > m {
                t = f32::from_bits(t.to_bits() - 1);
            }
            let lo_bits = (t.to_bits() >> 16) as u16;
            let (lo, hi) = (half::bf16::from_bits(lo_bits).to_f64(), half::bf16::from_bits(lo_bits + 1).to_f64());
            let mid = lo + (hi - lo) / 2.0;
            let near = if m < mid || (m == mid && lo_bits % 2 == 0) { lo } else { hi };
            let want = if x < 0.0 { -near } else { near };
            assert_eq!(bf16_from_f64(x).to_f64(), want, "x = {x:e} ({:#018x})", x.to_bits());
        }
    }

    #[test]
    fn rounding_is_nearest_even_and_saturates() {
        // 1 + 2^-8 is halfway between two bf16 values: ties to even gives 1.0.
        assert_eq!(DType::BF16.round(1.0 + 2f64.powi(-8)), 1.0);
        assert_eq!(DType::BF16.round(1e39), f64::INFINITY);
        assert!(DType::F16.round(f64::NAN).is_nan());
        assert_eq!(DType::F16.round(65520.0), f64::INFINITY);
        assert_eq!(DType::I32.round(3.9), 3.0);
        assert_eq!(DType::I32.round(-3.9), -3.0);
        assert_eq!(DType::I32.round(1e20), i32::MAX as f64);
        assert_eq!(DType::I32.round(f64::NAN), 0.0);
        assert_eq!(DType::Bool.round(-0.5), 1.0);
        for d in DType::ALL {
            assert_eq!(DType::from_name(d.name()), Some(d));
        }
    }

    /// The finite `f8e4m3` values with their codes, by an independent route: every byte
    /// decoded from the OCP table's formula, NaNs left out.
    fn f8_finite() -> Vec<(u8, f64)> {
        (0..=255u8)
            .filter(|b| b & 0x7F != 0x7F)
            .map(|b| {
                let (e, m) = (i32::from((b >> 3) & 15), f64::from(b & 7));
                let mag = if e == 0 { m / 8.0 * 2f64.powi(-6) } else { (1.0 + m / 8.0) * 2f64.powi(e - 7) };
                (b, if b & 0x80 != 0 { -mag } else { mag })
            })
            .collect()
    }

    /// Round to nearest f8e4m3 by brute force: the closest finite value, ties to the even
    /// code, beyond ±448 (and ±inf) saturated — the definition, not the implementation.
    fn f8_reference(x: f64) -> u8 {
        if x.is_nan() {
            return if x.is_sign_negative() { 0xFF } else { 0x7F };
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if x.abs() > 448.0 {
            return sign | 0x7E;
        }
        let mut best: Option<(u8, f64)> = None;
        for (b, v) in f8_finite().into_iter().filter(|(b, _)| b & 0x80 == sign) {
            let d = (v - x).abs();
            best = match best {
                Some((bb, bd)) if d > bd || (d == bd && b & 1 == 1 && bb & 1 == 0) => Some((bb, bd)),
                _ => Some((b, d)),
            };
        }
        best.map_or(0, |(b, _)| b)
    }

    #[test]
    fn f8e4m3_every_bit_pattern_round_trips() {
        let table = f8_finite();
        assert_eq!(table.len(), 254, "256 codes less two NaNs");
        for b in 0..=255u8 {
            let v = f8e4m3_to_f64(b);
            if b & 0x7F == 0x7F {
                assert!(v.is_nan(), "{b:#04x} is NaN");
                assert_eq!(v.is_sign_negative(), b & 0x80 != 0, "{b:#04x}: the sign of NaN is kept");
            } else {
                assert_eq!(v.to_bits(), table.iter().find(|(c, _)| *c == b).map(|(_, v)| v.to_bits()).unwrap_or(0), "{b:#04x}");
                assert_eq!(DType::F8E4M3.round(v).to_bits(), v.to_bits(), "{b:#04x} ({v}) is a value of the dtype");
            }
            assert_eq!(f8e4m3_from_f64(v), b, "{b:#04x} ({v}) encodes back to itself");
        }
        // The landmarks of the OCP table.
        assert_eq!((f8e4m3_to_f64(0x01), f8e4m3_to_f64(0x07)), (2f64.powi(-9), 7.0 * 2f64.powi(-9)), "subnormals");
        assert_eq!((f8e4m3_to_f64(0x08), f8e4m3_to_f64(0x38), f8e4m3_to_f64(0x7E)), (2f64.powi(-6), 1.0, 448.0));
        assert_eq!(f8e4m3_to_f64(0xFE), -448.0);
        assert!(f8e4m3_to_f64(0x80) == 0.0 && f8e4m3_to_f64(0x80).is_sign_negative(), "0x80 is -0");
        // Positive codes 0x00..=0x7E are strictly increasing (the format is sign-magnitude).
        assert!((0..0x7Eu8).all(|b| f8e4m3_to_f64(b) < f8e4m3_to_f64(b + 1)));
        assert_eq!(DType::F8E4M3.size_bytes(), 1);
        assert_eq!(DType::F8E4M3.storage_bytes(7), Some(7));
        assert_eq!(DType::from_name("f8e4m3"), Some(DType::F8E4M3));
        assert!(DType::F8E4M3.is_fp8() && !DType::F8E4M3.is_float() && !DType::F8E4M3.is_quantized());
    }

    #[test]
    fn f8e4m3_rounds_to_nearest_even() {
        let r = |x: f64| DType::F8E4M3.round(x);
        // Midpoints between neighbours go to the even mantissa.
        assert_eq!(r(1.0 + 1.0 / 16.0), 1.0, "between 1.0 (m 000) and 1.125 (m 001)");
        assert_eq!(r(1.0 + 3.0 / 16.0), 1.25, "between 1.125 (m 001) and 1.25 (m 010)");
        assert_eq!(r(-(1.0 + 3.0 / 16.0)), -1.25);
        assert_eq!(r(15.5), 16.0, "between 15 (1.111·2³) and 16 (1.000·2⁴): the next binade");
        assert_eq!(r(240.0 + 8.0), 256.0, "between 240 and 256");
        assert_eq!(r(416.0 + 16.0), 448.0, "between 416 (m 101) and 448 (m 110)");
        // Just off a midpoint goes to the nearer value.
        assert_eq!(r(1.0 + 1.0 / 16.0 + 1e-12), 1.125);
        assert_eq!(r(1.0 + 3.0 / 16.0 - 1e-12), 1.125);
        // Subnormals: quanta of 2^-9, ties to even there too; half the smallest goes to 0.
        let q = 2f64.powi(-9);
        assert_eq!(r(0.5 * q), 0.0);
        assert!(r(-0.5 * q) == 0.0 && r(-0.5 * q).is_sign_negative(), "-0 keeps its sign");
        assert_eq!(r(0.5 * q + 1e-15), q);
        assert_eq!(r(1.5 * q), 2.0 * q, "m 001 | m 010: even");
        assert_eq!(r(2.5 * q), 2.0 * q);
        assert_eq!(r(7.5 * q), 8.0 * q, "the largest subnormal rounds up to the smallest normal 2^-6");
        assert_eq!(r(3.0 * q), 3.0 * q);
        assert_eq!(r(1e-300), 0.0);
    }

    #[test]
    fn f8e4m3_saturates_and_keeps_nan() {
        let r = |x: f64| DType::F8E4M3.round(x);
        for x in [448.0, 448.5, 463.99, 464.0, 464.01, 480.0, 1e6, f64::MAX, f64::INFINITY] {
            assert_eq!(r(x), 448.0, "{x}");
            assert_eq!(r(-x), -448.0, "{}", -x);
        }
        assert_eq!(f8e4m3_from_f64(f64::INFINITY), 0x7E, "satfinite: +inf is 448, not NaN");
        assert_eq!(f8e4m3_from_f64(f64::NEG_INFINITY), 0xFE);
        assert!(r(f64::NAN).is_nan());
        assert_eq!(f8e4m3_from_f64(f64::NAN), 0x7F);
        assert_eq!(f8e4m3_from_f64(-f64::NAN), 0xFF);
    }

    #[test]
    fn f8e4m3_rounding_matches_the_definition() {
        // Every midpoint and its neighbours, every value, and a sweep of arbitrary magnitudes
        // (with f32 values, as the device sees them) against the brute-force nearest.
        let mut xs: Vec<f64> = vec![0.0, -0.0, 1e-30, 449.0, 500.0, -1e9];
        let table = f8_finite();
        let mut pos: Vec<f64> = table.iter().map(|&(_, v)| v).filter(|v| *v > 0.0).collect();
        pos.sort_by(f64::total_cmp);
        for w in pos.windows(2) {
            let mid = (w[0] + w[1]) / 2.0;
            for x in [w[0], mid, mid * (1.0 + 1e-9), mid * (1.0 - 1e-9), w[1]] {
                xs.push(x);
                xs.push(-x);
            }
        }
        let mut seed = 0x1234_5678_9ABC_DEF1u64;
        for _ in 0..20_000 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let m = (seed >> 11) as f64 / (1u64 << 53) as f64;
            let e = (seed % 24) as i32 - 13;
            let x = (m * 2f64.powi(e)) as f32 as f64;
            xs.push(if seed & 1 == 1 { -x } else { x });
        }
        for x in xs {
            assert_eq!(f8e4m3_from_f64(x), f8_reference(x), "x = {x:e}");
        }
    }

    #[test]
    fn quantized_blocks_round_trip_and_dequantise_as_gguf_does() {
        // Q4_1: d = 0.5, m = -1, nibbles: low = j, high = 15 - j (gguf.rs's hand-made block).
        let mut blk = Vec::new();
        blk.extend(half::f16::from_f32(0.5).to_le_bytes());
        blk.extend(half::f16::from_f32(-1.0).to_le_bytes());
        blk.extend((0..16u8).map(|j| j | ((15 - j) << 4)));
        let codes = qcodes_from_bytes(DType::Q4_1, &blk).unwrap();
        assert_eq!(qcodes_to_bytes(DType::Q4_1, &codes).unwrap(), blk);
        let v: Vec<f64> = codes.iter().map(|&c| QCode::from_f64(DType::Q4_1, c).value(DType::Q4_1)).collect();
        assert_eq!((v[0], v[15], v[16], v[31]), (-1.0, 6.5, 6.5, -1.0));
        // Q8_0: d = 0.25, q = -16..16.
        let mut blk = Vec::new();
        blk.extend(half::f16::from_f32(0.25).to_le_bytes());
        blk.extend((0..32i32).map(|j| (j - 16) as i8 as u8));
        let codes = qcodes_from_bytes(DType::Q8_0, &blk).unwrap();
        assert_eq!(qcodes_to_bytes(DType::Q8_0, &codes).unwrap(), blk);
        let v: Vec<f64> = codes.iter().map(|&c| QCode::from_f64(DType::Q8_0, c).value(DType::Q8_0)).collect();
        assert_eq!((v[0], v[31]), (-4.0, 3.75));
        assert_eq!(DType::Q4_1.storage_bytes(64), Some(40));
        assert_eq!(DType::Q8_0.storage_bytes(33), None);
        assert_eq!(DType::BF16.storage_bytes(3), Some(6));
    }
}
