//! Programs the DSL must accept: they compile as part of this binary and run on the
//! interpreter. (The DSL's refusals are `sinter-dsl`'s trybuild tests, which need only
//! `cargo check` when no case there must build and run.)

use sinter::{graph, Backend, DType, Program, Tensor};

/// The MLP of the crate docs: it compiles, builds and runs on the interpreter.
#[test]
fn crate_docs_mlp_compiles_and_runs() -> Result<(), Box<dyn std::error::Error>> {
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

/// `erf` is a word of the DSL, as a function and as a method; Hugging Face's erf-GELU written
/// with it, `x·0.5·(1 + erf(x/√2))`, runs on the interpreter and compiles to one `gelu`.
#[test]
fn erf_and_the_written_out_erf_gelu() -> Result<(), Box<dyn std::error::Error>> {
    let g = graph! {
        fn main(x: f32[T, 4], h: bf16[T, 4]) -> (f32[T, 4], bf16[T, 4], f32[T, 4]) {
            let gelu = x * 0.5 * (1.0 + erf(x / 1.4142135623730951));
            (erf(x), h.erf(), gelu)
        }
    }?;
    let text = sinter::ir::print(&g);
    assert!(text.contains("erf(%x)") && text.contains("erf(%h)"), "{text}");
    // Compiled: each output one op (`erf`, `erf`, `gelu`) in a kernel of its own.
    let (_, report) = sinter_passes::compile(&g, &sinter::Target::SM_90A, &sinter_passes::PassOptions::default())?;
    let mut ops: Vec<String> = report.kernels.iter().flat_map(|k| k.ops.clone()).collect();
    ops.sort();
    assert_eq!(ops, ["erf", "erf", "gelu"], "{report}");
    let xs = vec![-3.0, -1.0, -0.0, 0.0, 1e-3, 0.5, 2.0, f64::INFINITY];
    let x = Tensor::new(DType::F32, &[2, 4], xs.clone())?;
    let h = Tensor::new(DType::BF16, &[2, 4], xs.clone())?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let out = p.run(&[("x", &x), ("h", &h)], &[])?;
    for (i, &v) in xs.iter().enumerate() {
        let e = sinter::ir::interp::erf(v);
        assert_eq!(out[0].data()[i], DType::F32.round(e), "erf({v})");
        assert_eq!(out[1].data()[i], DType::BF16.round(e), "bf16 erf({v})");
        let want = 0.5 * v * (1.0 + sinter::ir::interp::erf(v / std::f64::consts::SQRT_2));
        assert!(v.is_infinite() || (out[2].data()[i] - want).abs() <= 1e-6 * (1.0 + want.abs()), "gelu({v}) = {}", out[2].data()[i]);
    }
    Ok(())
}

/// Programs the macro's static checks must not refuse: a variable whose type changes in a
/// loop or a branch, a name shadowed by a destructuring `let`, transpose axes and matmul flags
/// given as Rust values, an `if` expression as a function's (multi-value) tail.
#[test]
fn static_checks_accept_types_that_change() -> Result<(), Box<dyn std::error::Error>> {
    let (d0, d1, tb, wide) = (0, 1, true, true);
    let g = graph! {
        fn two(x: f32[2, 4]) -> (f32[2, 4], f32[2, 4]) {
            if wide { (x, x * 2.0) } else { (x * 2.0, x) }
        }

        fn main(x: f32[2, 4], w: f32[4, 4]) -> f32[8] {
            let mut h = x;
            for _ in 0..1 {
                h = h.transpose(d0, d1);
            }
            // `h` is [4, 2] now; the macro must not use the type it had before the loop.
            let h = h.transpose(0, 1).matmul(w, transpose_b = tb);
            let a = h;
            let [a, b] = two(a);
            let s = if wide { a + b } else { a - b };
            s.reshape([8])
        }
    }?;
    let p = Program::compile(g, Backend::Interpreter)?;
    let x = Tensor::full(DType::F32, &[2, 4], 1.0);
    let w = Tensor::full(DType::F32, &[4, 4], 0.5);
    let out = p.run(&[("x", &x), ("w", &w)], &[])?;
    // x @ wᵀ = 2 everywhere; a + b = 2 + 4
    assert_eq!(out[0].data(), &[6.0; 8]);
    Ok(())
}
