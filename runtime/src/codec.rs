//! Host-side encoding of tensor elements to the bytes a device buffer holds, and back.
//!
//! Device layout of each dtype (little-endian): `bf16` and `f16` as their 16-bit IEEE/bfloat
//! patterns (through the `half` crate), `f32` as IEEE binary32, `i32`/`i64` as two's complement,
//! `bool` as one byte (`0` false, `1` true; any non-zero byte reads back as true), `f8e4m3` as
//! its OCP E4M3 byte ([`sinter_ir::dtype::f8e4m3_from_f64`]: nearest even, saturating at ±448;
//! NaN as `0x7F`/`0xFF` by its sign).
//!
//! [`encode_f64`] rounds each value exactly as [`DType::round`] does, so that uploading an
//! interpreter [`Tensor`](sinter_ir::interp::Tensor)'s data and downloading it again gives the
//! same `f64`s.

use sinter_ir::DType;

use crate::error::RuntimeError;

/// Encodes `values` as `dtype` elements, rounding each with [`DType::round`]. A block-quantized
/// dtype (`q8_0`, `q4_1`) takes the interpreter's element codes
/// ([`sinter_ir::dtype::QCode`]) and gives GGUF blocks; a count that is not a whole number of
/// blocks gives no bytes (which no buffer accepts).
pub fn encode_f64(dtype: DType, values: &[f64]) -> Vec<u8> {
    if dtype.is_quantized() {
        return sinter_ir::dtype::qcodes_to_bytes(dtype, values).unwrap_or_default();
    }
    let mut out = Vec::with_capacity(values.len() * dtype.size_bytes());
    for &x in values {
        let r = dtype.round(x);
        match dtype {
            DType::BF16 => out.extend_from_slice(&sinter_ir::dtype::bf16_from_f64(r).to_le_bytes()),
            DType::F16 => out.extend_from_slice(&sinter_ir::dtype::f16_from_f64(r).to_le_bytes()),
            DType::F32 => out.extend_from_slice(&(r as f32).to_le_bytes()),
            DType::I32 => out.extend_from_slice(&(r as i32).to_le_bytes()),
            DType::I64 => out.extend_from_slice(&(r as i64).to_le_bytes()),
            DType::Bool => out.push(u8::from(r != 0.0)),
            DType::F8E4M3 => out.push(sinter_ir::dtype::f8e4m3_from_f64(r)),
            DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => {}
        }
    }
    out
}

/// Decodes `dtype` elements from `bytes` to `f64`s (exactly: every dtype but `i64` beyond ±2⁵³
/// is representable).
///
/// # Errors
/// [`RuntimeError::Buffer`] when `bytes.len()` is not a multiple of the element size.
pub fn decode_f64(dtype: DType, bytes: &[u8]) -> Result<Vec<f64>, RuntimeError> {
    if dtype.is_quantized() {
        return sinter_ir::dtype::qcodes_from_bytes(dtype, bytes)
            .ok_or_else(|| RuntimeError::Buffer(format!("{} bytes are not a whole number of {dtype} blocks", bytes.len())));
    }
    let size = dtype.size_bytes();
    if bytes.len() % size != 0 {
        return Err(RuntimeError::Buffer(format!("{} bytes are not a whole number of {dtype} elements ({size} bytes each)", bytes.len())));
    }
    Ok(bytes
        .chunks_exact(size)
        .map(|c| match dtype {
            DType::BF16 => half::bf16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F16 => half::f16::from_le_bytes([c[0], c[1]]).to_f64(),
            DType::F32 => f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I32 => f64::from(i32::from_le_bytes([c[0], c[1], c[2], c[3]])),
            DType::I64 => i64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f64,
            DType::F8E4M3 => sinter_ir::dtype::f8e4m3_to_f64(c[0]),
            DType::Bool | DType::Q8_0 | DType::Q4_1 | DType::Q5_0 | DType::Q4K | DType::Q6K => {
                if c[0] != 0 {
                    1.0
                } else {
                    0.0
                }
            }
        })
        .collect())
}

mod sealed {
    pub trait Sealed {}
}

/// A host element type with a device dtype: `half::bf16`, `half::f16`, `f32`, `i32`, `i64`,
/// `bool`. Used by the typed upload and download helpers.
pub trait Element: Copy + sealed::Sealed {
    /// The dtype whose device representation this type has.
    const DTYPE: DType;
    /// Appends the element's little-endian device bytes.
    fn write_le(self, out: &mut Vec<u8>);
    /// Reads one element from the first `DTYPE.size_bytes()` bytes of `bytes`; `None` when
    /// there are fewer.
    fn read_le(bytes: &[u8]) -> Option<Self>;
}

macro_rules! element {
    ($t:ty, $dtype:expr, $n:literal) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = $dtype;
            fn write_le(self, out: &mut Vec<u8>) {
                out.extend_from_slice(&self.to_le_bytes());
            }
            fn read_le(bytes: &[u8]) -> Option<Self> {
                Some(<$t>::from_le_bytes(bytes.get(..$n)?.try_into().ok()?))
            }
        }
    };
}

element!(half::bf16, DType::BF16, 2);
element!(half::f16, DType::F16, 2);
element!(f32, DType::F32, 4);
element!(i32, DType::I32, 4);
element!(i64, DType::I64, 8);

impl sealed::Sealed for bool {}
impl Element for bool {
    const DTYPE: DType = DType::Bool;
    fn write_le(self, out: &mut Vec<u8>) {
        out.push(u8::from(self));
    }
    fn read_le(bytes: &[u8]) -> Option<Self> {
        bytes.first().map(|b| *b != 0)
    }
}

/// Encodes typed host elements to device bytes.
pub fn encode<T: Element>(values: &[T]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() * T::DTYPE.size_bytes());
    for v in values {
        v.write_le(&mut out);
    }
    out
}

/// Decodes device bytes to typed host elements.
///
/// # Errors
/// [`RuntimeError::Buffer`] when `bytes.len()` is not a multiple of the element size.
pub fn decode<T: Element>(bytes: &[u8]) -> Result<Vec<T>, RuntimeError> {
    let size = T::DTYPE.size_bytes();
    if bytes.len() % size != 0 {
        return Err(RuntimeError::Buffer(format!("{} bytes are not a whole number of {} elements", bytes.len(), T::DTYPE)));
    }
    // Every chunk has `size` bytes, so `read_le` gives `Some` for each.
    bytes
        .chunks_exact(size)
        .map(T::read_le)
        .collect::<Option<Vec<T>>>()
        .ok_or_else(|| RuntimeError::Buffer(format!("{} bytes: an element of {} could not be read", bytes.len(), T::DTYPE)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn f64_round_trip_matches_dtype_round() {
        let xs = [0.0, -0.0, 1.0, -1.5, std::f64::consts::PI, 1e-8, 65520.0, 1e39, -1e39, f64::INFINITY, f64::NEG_INFINITY, 2.5e9, -7.9, 1.0 + 2f64.powi(-8)];
        for dtype in DType::ALL.into_iter().filter(|d| !d.is_quantized()) {
            let bytes = encode_f64(dtype, &xs);
            assert_eq!(bytes.len(), xs.len() * dtype.size_bytes());
            let back = decode_f64(dtype, &bytes).unwrap();
            for (x, y) in xs.iter().zip(&back) {
                let want = dtype.round(*x);
                assert!(want == *y || (want.is_nan() && y.is_nan()), "{dtype}: {x} -> {y}, want {want}");
                // Sign of zero survives for floats.
                if (dtype.is_float() || dtype.is_fp8()) && want == 0.0 {
                    assert_eq!(want.is_sign_negative(), y.is_sign_negative(), "{dtype} signed zero");
                }
            }
        }
    }

    #[test]
    fn f8e4m3_bytes_round_trip_and_saturate() {
        // Every byte decodes to its value and encodes back to itself (both NaNs included).
        let all: Vec<u8> = (0..=255).collect();
        let values = decode_f64(DType::F8E4M3, &all).unwrap();
        assert_eq!(encode_f64(DType::F8E4M3, &values), all);
        // One byte a value; beyond ±448 and ±inf saturate (satfinite), not NaN.
        assert_eq!(encode_f64(DType::F8E4M3, &[448.0, 1e6, f64::NEG_INFINITY, 0.0]), vec![0x7E, 0x7E, 0xFE, 0x00]);
        assert_eq!(DType::F8E4M3.storage_bytes(3), Some(3));
    }

    #[test]
    fn nan_survives_float_dtypes() {
        for dtype in [DType::BF16, DType::F16, DType::F32, DType::F8E4M3] {
            let back = decode_f64(dtype, &encode_f64(dtype, &[f64::NAN])).unwrap();
            assert!(back[0].is_nan(), "{dtype}");
        }
        assert_eq!(decode_f64(DType::Bool, &encode_f64(DType::Bool, &[f64::NAN])).unwrap(), vec![1.0]);
        assert_eq!(decode_f64(DType::I32, &encode_f64(DType::I32, &[f64::NAN])).unwrap(), vec![0.0]);
    }

    #[test]
    fn device_bytes_are_little_endian_native_patterns() {
        assert_eq!(encode_f64(DType::F32, &[1.0]), 1.0f32.to_le_bytes().to_vec());
        assert_eq!(encode_f64(DType::BF16, &[1.0]), vec![0x80, 0x3f]);
        assert_eq!(encode_f64(DType::F16, &[1.0]), vec![0x00, 0x3c]);
        assert_eq!(encode_f64(DType::I32, &[-2.0]), (-2i32).to_le_bytes().to_vec());
        assert_eq!(encode_f64(DType::I64, &[5.0]), 5i64.to_le_bytes().to_vec());
        assert_eq!(encode_f64(DType::Bool, &[0.0, 2.0, -0.5]), vec![0, 1, 1]);
        assert_eq!(decode_f64(DType::Bool, &[0, 7]).unwrap(), vec![0.0, 1.0]);
    }

    #[test]
    fn typed_round_trip_and_length_errors() {
        let v = vec![half::bf16::from_f32(1.5), half::bf16::from_f32(-2.0)];
        assert_eq!(decode::<half::bf16>(&encode(&v)).unwrap(), v);
        let b = vec![true, false, true];
        assert_eq!(decode::<bool>(&encode(&b)).unwrap(), b);
        let i = vec![i64::MIN, 0, i64::MAX];
        assert_eq!(decode::<i64>(&encode(&i)).unwrap(), i);
        assert!(matches!(decode::<f32>(&[0, 0, 0]), Err(RuntimeError::Buffer(_))));
        assert!(matches!(decode_f64(DType::I64, &[0; 9]), Err(RuntimeError::Buffer(_))));
        // One element from too few bytes is `None`, not a panic; extra bytes are not read.
        assert_eq!(f32::read_le(&[0, 0]), None);
        assert_eq!(bool::read_le(&[]), None);
        assert_eq!(i32::read_le(&[1, 0, 0, 0, 9]), Some(1));
    }
}
