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
}

impl DType {
    /// Every dtype, in text-format order.
    pub const ALL: [DType; 6] = [DType::BF16, DType::F16, DType::F32, DType::I32, DType::I64, DType::Bool];

    /// The spelling in the text format and the DSL (`bf16`, `f16`, `f32`, `i32`, `i64`, `bool`).
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Bool => "bool",
        }
    }

    /// Parses a dtype name as printed by [`DType::name`].
    pub fn from_name(s: &str) -> Option<DType> {
        DType::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Bytes one element occupies in device memory.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::I64 => 8,
            DType::Bool => 1,
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
    pub fn round(self, x: f64) -> f64 {
        match self {
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
}
