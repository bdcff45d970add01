//! Weight maps: which stored tensor becomes which graph weight, and how it is transformed on
//! the way (a transpose, a row permutation, `+ 1`).
//!
//! A loader lists [`WeightSpec`]s — the graph's name and shape, the name in the file, the
//! transforms — and [`load`] reads each from a [`TensorSource`] (a GGUF file or a Hugging
//! Face folder's safetensors), checks the stored shape, applies the transforms in f64 and
//! rounds once to the model's dtype.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::gguf::{GgufFile, ModelError};
use crate::{DType, Tensor};

/// A load-time change to a stored tensor, applied in the order listed.
#[derive(Clone, Debug, PartialEq)]
pub enum Transform {
    /// Swap the two axes of a matrix: stored `[a, b]`, used `[b, a]` (GPT-2's `Conv1D`
    /// weights are stored `[in, out]`; the graphs take `[out, in]`).
    Transpose,
    /// Reorder the rows (outermost axis) of a tensor: row `i` of the result is stored row
    /// `perm[i]` (`perm` is a permutation of the rows).
    PermuteRows(Vec<usize>),
    /// Add a constant to every element (Gemma stores RMSNorm weights as `w` for `(1 + w)`).
    Add(f64),
}

/// One graph weight and where it comes from.
#[derive(Clone, Debug, PartialEq)]
pub struct WeightSpec {
    /// The name the graphs give it (`blk.0.attn_q.weight`).
    pub name: String,
    /// The name in the file (GGUF or Hugging Face).
    pub stored: String,
    /// The shape the graphs declare (row-major), after the transforms.
    pub shape: Vec<usize>,
    /// What to do to the stored tensor, in order.
    pub transforms: Vec<Transform>,
}

impl WeightSpec {
    /// A weight stored as the graph uses it.
    pub fn plain(name: impl Into<String>, stored: impl Into<String>, shape: &[usize]) -> WeightSpec {
        WeightSpec { name: name.into(), stored: stored.into(), shape: shape.to_vec(), transforms: vec![] }
    }

    /// This weight with `t` applied after its other transforms.
    pub fn then(mut self, t: Transform) -> WeightSpec {
        self.transforms.push(t);
        self
    }

    /// The shape the tensor must have in the file: the graph's shape with the transposes
    /// undone.
    pub fn stored_shape(&self) -> Vec<usize> {
        let mut s = self.shape.clone();
        for t in &self.transforms {
            if *t == Transform::Transpose && s.len() == 2 {
                s.swap(0, 1);
            }
        }
        s
    }
}

/// Somewhere stored tensors can be read by name.
pub trait TensorSource {
    /// The file or folder, for messages.
    fn path(&self) -> &Path;

    /// The values of the tensor `name` (row-major), checked to have shape `shape`.
    ///
    /// # Errors
    /// [`ModelError::MissingTensor`], [`ModelError::TensorShape`],
    /// [`ModelError::UnsupportedTensorType`], [`ModelError::Truncated`].
    fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f64>, ModelError>;
}

impl TensorSource for GgufFile {
    fn path(&self) -> &Path {
        GgufFile::path(self)
    }

    fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f64>, ModelError> {
        Ok(self.dequantize(name, shape)?.into_iter().map(f64::from).collect())
    }
}

/// Applies `t` to `data` of shape `shape` (updated).
///
/// # Errors
/// [`ModelError::Malformed`] for a transpose of a tensor that is not a matrix or a
/// permutation that does not fit the rows.
fn apply(t: &Transform, data: Vec<f64>, shape: &mut Vec<usize>, path: &Path, name: &str) -> Result<Vec<f64>, ModelError> {
    let bad = |reason: String| ModelError::Malformed { path: path.to_path_buf(), reason: format!("tensor `{name}`: {reason}") };
    match t {
        Transform::Transpose => {
            let [r, c] = shape[..] else {
                return Err(bad(format!("a transpose needs a matrix, the tensor has shape {shape:?}")));
            };
            *shape = vec![c, r];
            Ok((0..r * c).map(|i| data[(i % r) * c + i / r]).collect())
        }
        Transform::PermuteRows(perm) => {
            let rows = shape.first().copied().unwrap_or(0);
            let mut seen = vec![false; rows];
            if perm.len() != rows || perm.iter().any(|&p| p >= rows || std::mem::replace(&mut seen[p], true)) {
                return Err(bad(format!("the row permutation is not a permutation of its {rows} rows")));
            }
            let w = data.len() / rows.max(1);
            Ok(perm.iter().flat_map(|&p| data[p * w..(p + 1) * w].iter().copied()).collect())
        }
        Transform::Add(c) => Ok(data.into_iter().map(|x| x + c).collect()),
    }
}

/// Reads every weight of `specs` from `src` into `dtype`, calling `progress(done, total)`
/// after each.
///
/// # Errors
/// As [`TensorSource::read`]; [`ModelError::Malformed`] for a transform that does not fit
/// its tensor or a result that does not have the graph's shape.
pub fn load(src: &dyn TensorSource, specs: &[WeightSpec], dtype: DType, progress: &mut dyn FnMut(usize, usize)) -> Result<BTreeMap<String, Arc<Tensor>>, ModelError> {
    let mut out = BTreeMap::new();
    for (i, spec) in specs.iter().enumerate() {
        let mut shape = spec.stored_shape();
        let mut data = src.read(&spec.stored, &shape)?;
        for t in &spec.transforms {
            data = apply(t, data, &mut shape, src.path(), &spec.stored)?;
        }
        let bad = |reason: String| ModelError::Malformed { path: src.path().to_path_buf(), reason: format!("tensor `{}`: {reason}", spec.stored) };
        if shape != spec.shape {
            return Err(bad(format!("transformed to shape {shape:?}, the graph wants {:?}", spec.shape)));
        }
        let t = Tensor::new(dtype, &shape, data).map_err(|e| bad(e.to_string()))?;
        out.insert(spec.name.clone(), Arc::new(t));
        progress(i + 1, specs.len());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transforms_transpose_permute_and_add() {
        let p = Path::new("mem");
        let mut s = vec![2, 3];
        let t = apply(&Transform::Transpose, vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &mut s, p, "w").unwrap();
        assert_eq!((t, s.clone()), (vec![0.0, 3.0, 1.0, 4.0, 2.0, 5.0], vec![3, 2]));
        let t = apply(&Transform::PermuteRows(vec![2, 0, 1]), vec![0.0, 1.0, 2.0, 3.0, 4.0, 5.0], &mut s, p, "w").unwrap();
        assert_eq!(t, vec![4.0, 5.0, 0.0, 1.0, 2.0, 3.0]);
        assert_eq!(apply(&Transform::Add(1.0), vec![0.5], &mut vec![1], p, "w").unwrap(), vec![1.5]);
        let e = apply(&Transform::PermuteRows(vec![0, 0, 1]), vec![0.0; 6], &mut s, p, "w").unwrap_err();
        assert!(e.to_string().contains("not a permutation"), "{e}");
        let e = apply(&Transform::Transpose, vec![0.0; 8], &mut vec![2, 2, 2], p, "w").unwrap_err();
        assert!(e.to_string().contains("needs a matrix"), "{e}");
        assert_eq!(WeightSpec::plain("a", "b", &[4, 6]).then(Transform::Transpose).stored_shape(), vec![6, 4]);
    }
}
