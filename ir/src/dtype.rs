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
}

impl DType {
    /// Every dtype, in text-format order.
    pub const ALL: [DType; 8] = [DType::BF16, DType::F16, DType::F32, DType::I32, DType::I64, DType::Bool, DType::Q8_0, DType::Q4_1];

    /// Elements per quantization block of the block-quantized types.
    pub const QBLOCK: usize = 32;

    /// The spelling in the text format and the DSL (`bf16`, `f16`, `f32`, `i32`, `i64`, `bool`,
    /// `q8_0`, `q4_1`).
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
            DType::Bool | DType::Q8_0 | DType::Q4_1 => 1,
        }
    }

    /// True for the block-quantized storage types `q8_0` and `q4_1`.
    pub fn is_quantized(self) -> bool {
        matches!(self, DType::Q8_0 | DType::Q4_1)
    }

    /// Bytes of one block of [`DType::QBLOCK`] elements of a block-quantized type (34 for
    /// `q8_0`, 20 for `q4_1`), `None` for the others.
    pub fn block_bytes(self) -> Option<usize> {
        match self {
            DType::Q8_0 => Some(34),
            DType::Q4_1 => Some(20),
            _ => None,
        }
    }

    /// Bytes that `elements` elements occupy in device memory: `elements · size_bytes` for
    /// the element types, `elements / 32 · block_bytes` for the block-quantized ones. `None`
    /// when the count overflows `usize` or is not a whole number of blocks.
    pub fn storage_bytes(self, elements: usize) -> Option<usize> {
        match self.block_bytes() {
            Some(bb) if elements % DType::QBLOCK == 0 => (elements / DType::QBLOCK).checked_mul(bb),
            Some(_) => None,
            None => elements.checked_mul(self.size_bytes()),
        }
    }

    /// True for `bf16`, `f16` and `f32`.
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
    /// NaN. Integers truncate toward zero and saturate at the type's range (NaN gives 0), as a
    /// float-to-int cast does in PTX's `cvt.rzi.sat`. `bool` is `x != 0` (NaN is true).
    /// Block-quantized types hold per-element codes ([`QCode`]): the value is kept as the
    /// integer code it must be (non-integers truncate, out of range and NaN give 0).
    pub fn round(self, x: f64) -> f64 {
        match self {
            DType::Q8_0 | DType::Q4_1 => {
                let max = if self == DType::Q8_0 { (1u64 << 24) as f64 } else { (1u64 << 36) as f64 };
                if x >= 0.0 && x < max {
                    x.trunc()
                } else {
                    0.0
                }
            }
            DType::F32 => x as f32 as f64,
            // half's from_f64 rounds directly from f64 (no double rounding through f32).
            DType::BF16 => half::bf16::from_f64(x).to_f64(),
            DType::F16 => half::f16::from_f64(x).to_f64(),
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

/// One element of a block-quantized tensor as the reference interpreter holds it: its block's
/// scale `d` and minimum `m` (`q4_1`; 0 for `q8_0`) as `f16` bit patterns and its own quant `q`
/// (an `i8` for `q8_0`, a nibble 0..16 for `q4_1`).
///
/// The interpreter keeps every element of a tensor as one `f64`; for the block types that
/// `f64` is the integer code `d << 8 | q as u8` (`q8_0`, 24 bits) or `d << 20 | m << 4 |
/// nibble` (`q4_1`, 36 bits), exact in an `f64`. Every element of a block carries its block's
/// `d` (and `m`); encoding to bytes takes them from the block's first element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QCode {
    /// The block's `f16` scale, as bits.
    pub d: u16,
    /// The block's `f16` minimum, as bits (`q4_1`; 0 for `q8_0`).
    pub m: u16,
    /// The element's quant: `i8` bits for `q8_0`, a nibble for `q4_1`.
    pub q: u8,
}

impl QCode {
    /// The `f64` code of this element in a tensor of `dtype` (see [`QCode`]).
    pub fn to_f64(self, dtype: DType) -> f64 {
        match dtype {
            DType::Q8_0 => ((u64::from(self.d) << 8) | u64::from(self.q)) as f64,
            _ => ((u64::from(self.d) << 20) | (u64::from(self.m) << 4) | u64::from(self.q & 15)) as f64,
        }
    }

    /// The parts of code `x` of a tensor of `dtype` (see [`QCode`]).
    pub fn from_f64(dtype: DType, x: f64) -> QCode {
        let c = dtype.round(x) as u64;
        match dtype {
            DType::Q8_0 => QCode { d: (c >> 8) as u16, m: 0, q: c as u8 },
            _ => QCode { d: (c >> 20) as u16, m: (c >> 4) as u16, q: (c & 15) as u8 },
        }
    }

    /// The element's value in f64, as llama.cpp's `dequantize_row_q8_0` / `_q4_1` compute it in
    /// f32: `q·d` (`q8_0`) or `nibble·d + m` (`q4_1`, the product exact, so one rounding to
    /// f32 of the sum; here exact in f64 — round the result to the target dtype once).
    pub fn value(self, dtype: DType) -> f64 {
        let d = half::f16::from_bits(self.d).to_f64();
        match dtype {
            DType::Q8_0 => f64::from(self.q as i8) * d,
            _ => f64::from(self.q & 15) * d + half::f16::from_bits(self.m).to_f64(),
        }
    }
}

/// Element codes ([`QCode`]) of a block-quantized tensor from its stored bytes (GGUF block
/// layout, little-endian), 32 codes per block; `None` when `dtype` is not block-quantized or
/// `bytes` is not a whole number of blocks.
pub fn qcodes_from_bytes(dtype: DType, bytes: &[u8]) -> Option<Vec<f64>> {
    let bb = dtype.block_bytes()?;
    if bytes.len() % bb != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len() / bb * DType::QBLOCK);
    for blk in bytes.chunks_exact(bb) {
        let d = u16::from_le_bytes([blk[0], blk[1]]);
        if dtype == DType::Q8_0 {
            out.extend(blk[2..34].iter().map(|&q| QCode { d, m: 0, q }.to_f64(dtype)));
        } else {
            let m = u16::from_le_bytes([blk[2], blk[3]]);
            out.extend(blk[4..20].iter().map(|&q| QCode { d, m, q: q & 15 }.to_f64(dtype)));
            out.extend(blk[4..20].iter().map(|&q| QCode { d, m, q: q >> 4 }.to_f64(dtype)));
        }
    }
    Some(out)
}

/// The stored bytes (GGUF block layout) of a block-quantized tensor from its element codes
/// ([`QCode`]): each block's `d` and `m` come from its first element. `None` when `dtype` is
/// not block-quantized or the count is not a whole number of blocks.
pub fn qcodes_to_bytes(dtype: DType, codes: &[f64]) -> Option<Vec<u8>> {
    let bb = dtype.block_bytes()?;
    if codes.len() % DType::QBLOCK != 0 {
        return None;
    }
    let mut out = Vec::with_capacity(codes.len() / DType::QBLOCK * bb);
    for blk in codes.chunks_exact(DType::QBLOCK) {
        let c: Vec<QCode> = blk.iter().map(|&x| QCode::from_f64(dtype, x)).collect();
        out.extend(c[0].d.to_le_bytes());
        if dtype == DType::Q8_0 {
            out.extend(c.iter().map(|e| e.q));
        } else {
            out.extend(c[0].m.to_le_bytes());
            out.extend((0..16).map(|j| (c[j].q & 15) | ((c[j + 16].q & 15) << 4)));
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

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
