//! Tests of the reference interpreter: hand-computed values, errors, and (in `decomp`) each
//! composite op against its decomposition; `llama` runs a small decoder layer through `call`.

mod cascade;
mod decomp;
mod errors;
mod fp8;
mod llama;
mod ops;
mod ranks;
mod rope_logical;
mod rotary;
mod window;

use crate::dtype::DType;
use crate::graph::Graph;
use crate::interp::{run, run_entry, InterpError, Tensor};
use crate::{parse, verify, Bindings};

const NEG_INF: f64 = f64::NEG_INFINITY;

/// A tensor from literal data (rounded to `dtype`).
fn t(dtype: DType, shape: &[usize], data: Vec<f64>) -> Tensor {
    Tensor::new(dtype, shape, data).expect("test tensor")
}

/// Parses and verifies a `.sir` text.
fn graph(src: &str) -> Graph {
    let g = parse(src).unwrap_or_else(|e| panic!("parse: {e}\n{src}"));
    verify(&g).unwrap_or_else(|e| panic!("verify: {e}\n{src}"));
    g
}

/// Runs the entry function of `src` and returns its outputs.
fn eval(src: &str, inputs: &[&Tensor]) -> Vec<Tensor> {
    run_entry(&graph(src), inputs, &Bindings::new()).unwrap_or_else(|e| panic!("run: {e}\n{src}"))
}

/// Runs the entry function of `src` and returns its first output.
fn eval1(src: &str, inputs: &[&Tensor]) -> Tensor {
    eval(src, inputs).into_iter().next().expect("one output")
}

/// Runs the entry function of `src`, which must fail, with `bindings`.
fn eval_err(src: &str, inputs: &[&Tensor], bindings: &Bindings) -> InterpError {
    match run_entry(&graph(src), inputs, bindings) {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e,
    }
}

/// Runs function `name` of `g`.
fn call_fn(g: &Graph, name: &str, inputs: &[&Tensor]) -> Vec<Tensor> {
    run(g, name, inputs, &Bindings::new()).unwrap_or_else(|e| panic!("run @{name}: {e}"))
}

/// `|got − want| ≤ atol + rtol·|want|` element-wise with the tolerances of DESIGN.md
/// (atol relative to max|want|), NaN exactly where `want` has NaN, infinities equal.
fn assert_close(got: &Tensor, want: &Tensor, dtype: DType, what: &str) {
    assert_close_with(got, want, dtype, 0.0, what);
}

/// [`assert_close`] with `extra` added to the absolute tolerance.
fn assert_close_with(got: &Tensor, want: &Tensor, dtype: DType, extra: f64, what: &str) {
    assert_eq!(got.shape(), want.shape(), "{what}: shapes");
    let max = want.data().iter().filter(|v| v.is_finite()).fold(0.0f64, |a, v| a.max(v.abs()));
    // Floors at the smallest subnormal: a decomposition can underflow where the fused op
    // does not.
    let (atol, rtol) = match dtype {
        DType::BF16 => ((1e-2 * max).max(2f64.powi(-133)), 1.6e-2),
        DType::F16 => ((1e-3 * max).max(2f64.powi(-24)), 2e-3),
        _ => ((1e-6 * max).max(2f64.powi(-149)), 1e-5),
    };
    for (i, (&g, &w)) in got.data().iter().zip(want.data()).enumerate() {
        let ok = if w.is_nan() {
            g.is_nan()
        } else if w.is_infinite() {
            g == w
        } else {
            !g.is_nan() && (g - w).abs() <= atol + extra + rtol * w.abs()
        };
        assert!(ok, "{what}: element {i}: got {g}, want {w} (atol {atol} + {extra}, rtol {rtol})\n got {:?}\nwant {:?}", got.data(), want.data());
    }
}

/// Deterministic pseudo-random numbers in [-1, 1) (SplitMix64), for tests that need data
/// without proptest.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> f64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        (z >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
    fn tensor(&mut self, dtype: DType, shape: &[usize], scale: f64) -> Tensor {
        Tensor::from_fn(dtype, shape, |_| self.next() * scale)
    }
}
