//! The types of values: a tensor's dtype and shape ([`TensorType`]) and a function's
//! parameter and result types ([`Signature`]).

use std::fmt;

use crate::dim::Dim;
use crate::dtype::DType;

/// Dtype and shape of a tensor value; printed `bf16[T, 576]` (a scalar is `f32[]`).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TensorType {
    /// Element type.
    pub dtype: DType,
    /// Dimensions, outermost first (row-major).
    pub shape: Vec<Dim>,
}

impl TensorType {
    /// A tensor type from a dtype and dims.
    pub fn new(dtype: DType, shape: impl IntoIterator<Item = Dim>) -> TensorType {
        TensorType { dtype, shape: shape.into_iter().collect() }
    }

    /// Number of axes.
    pub fn rank(&self) -> usize {
        self.shape.len()
    }

    /// Element count as a dim.
    pub fn numel(&self) -> Dim {
        Dim::product(&self.shape)
    }
}

impl fmt::Display for TensorType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}[", self.dtype)?;
        for (i, d) in self.shape.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{d}")?;
        }
        f.write_str("]")
    }
}

/// The types a function takes and returns.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signature {
    /// Parameter types.
    pub params: Vec<TensorType>,
    /// Output types.
    pub results: Vec<TensorType>,
}
