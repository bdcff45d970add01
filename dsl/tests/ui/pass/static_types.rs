//! Programs the macro's static checks must not refuse: a variable whose type changes in a
//! loop or a branch, a name shadowed by a destructuring `let`, transpose axes and matmul flags
//! given as Rust values, an `if` expression as a function's (multi-value) tail.

use sinter::{graph, Backend, DType, Program, Tensor};

fn main() -> Result<(), Box<dyn std::error::Error>> {
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
