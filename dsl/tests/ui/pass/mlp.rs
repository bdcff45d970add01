//! The MLP of the crate docs: it compiles, builds and runs on the interpreter.

use sinter::{graph, Backend, DType, Program, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let g = graph! {
        fn mlp(x: f32[T, 4], w_gate: f32[4, 8], w_up: f32[4, 8], w_down: f32[8, 4]) -> f32[T, 4] {
            ((x @ w_gate).silu() * (x @ w_up)) @ w_down
        }
    }?;
    let mut p = Program::compile(g, Backend::Interpreter)?;
    p.bind("w_gate", Tensor::full(DType::F32, &[4, 8], 0.5))?;
    p.bind("w_up", Tensor::full(DType::F32, &[4, 8], 1.0))?;
    p.bind("w_down", Tensor::full(DType::F32, &[8, 4], 0.25))?;
    let out = p.run(&[("x", &Tensor::full(DType::F32, &[3, 4], 1.0))], &[])?;
    assert_eq!(out[0].shape(), &[3, 4]);
    // silu(2) · 4 · 8 · 0.25
    assert!((out[0].data()[0] - 14.0928).abs() < 1e-3);
    Ok(())
}
