//! Shared helpers of the passes' tests: seeded inputs for a function, the file-test corpus.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use sinter_ir::interp::Tensor;
use sinter_ir::{Bindings, DType, Function, Graph};

/// SplitMix64: deterministic numbers without an RNG crate.
pub struct Rng(pub u64);
impl Rng {
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// Which inputs to make.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// Uniform floats in [−2, 2), integers in 0..8, random bools.
    Random,
    /// Floats scaled by 1e30 (overflow in decompositions).
    Large,
    /// The first row (along the last axis) of every float input is −inf.
    NegInfRow,
    /// Element 0 of every float input is NaN.
    Nan,
}

/// Every symbol of `f`'s parameter shapes bound to `size`.
pub fn sizes(f: &Function, size: i64) -> Bindings {
    let mut syms = BTreeSet::new();
    for &p in &f.params {
        for d in &f.ty(p).shape {
            for s in d.symbols() {
                syms.insert(s.to_string());
            }
        }
    }
    syms.into_iter().map(|s| (s, size)).collect()
}

/// Inputs for every parameter of `f`.
pub fn inputs(f: &Function, b: &Bindings, seed: u64, variant: Variant) -> Vec<Tensor> {
    let mut rng = Rng(seed);
    f.params
        .iter()
        .map(|&p| {
            let ty = f.ty(p);
            let shape: Vec<usize> = ty.shape.iter().map(|d| d.eval(b).expect("bound") as usize).collect();
            let n: usize = shape.iter().product();
            let last = shape.last().copied().unwrap_or(1);
            if ty.dtype.is_quantized() {
                // Weights quantized from values in [-2, 2) (times 1e30 for `Large` is beyond
                // an f16 scale, so quantized weights stay in range).
                let vals: Vec<f32> = (0..n).map(|_| (4.0 * rng.unit() - 2.0) as f32).collect();
                return Tensor::quantize(ty.dtype, &shape, &vals).expect("quantized tensor");
            }
            let data: Vec<f64> = (0..n)
                .map(|i| {
                    let u = rng.unit();
                    match ty.dtype {
                        DType::Bool => f64::from(u < 0.7),
                        DType::I32 | DType::I64 => (u * 8.0).floor(),
                        _ => {
                            let x = 4.0 * u - 2.0;
                            match variant {
                                Variant::Random => x,
                                Variant::Large => x * 1e30,
                                Variant::NegInfRow if i < last => f64::NEG_INFINITY,
                                Variant::Nan if i == 0 => f64::NAN,
                                _ => x,
                            }
                        }
                    }
                })
                .collect();
            Tensor::new(ty.dtype, &shape, data).expect("tensor")
        })
        .collect()
}

/// The file-test corpus: `(path, source)` of every `tests/filetests/*.sir`, sorted.
pub fn corpus() -> Vec<(PathBuf, String)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/filetests");
    let mut files: Vec<PathBuf> =
        std::fs::read_dir(&dir).expect("filetests dir").filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "sir")).collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let s = std::fs::read_to_string(&p).expect("read");
            (p, s)
        })
        .collect()
}

/// Parses and verifies a corpus file.
pub fn load(path: &Path, src: &str) -> Graph {
    let g = sinter_ir::parse(src).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    sinter_ir::verify(&g).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    g
}
