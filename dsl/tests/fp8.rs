//! The DSL's f8e4m3 words: fp8 parameters, `quantize_fp8` / `dequantize_fp8` with per-tensor
//! scales as methods and as functions, the fp8 matmul spelling, and the errors the builder
//! reports when a scale's shape is known only when the graph is built.

use sinter::{graph, Backend, DType, Dim, Program, Tensor};

#[test]
fn an_fp8_matmul_builds_and_runs_on_the_interpreter() -> Result<(), Box<dyn std::error::Error>> {
    let g = graph! {
        fn main(x: bf16[T, 4], sx: f32[], w8: f8e4m3[2, 4], sw: f32[]) -> (bf16[T, 2], f8e4m3[T, 4]) {
            let x8 = x.quantize_fp8(sx);
            let a = x8.dequantize_fp8(sx, bf16);
            let w = dequantize_fp8(w8, sw, dtype = bf16);
            (a.matmul(w, transpose_b = true), x8)
        }
    }?;
    let text = sinter::ir::print(&g);
    assert!(text.contains("quantize_fp8(%x, %sx)") && text.contains("dequantize_fp8(%w8, %sw) {dtype=bf16}"), "{text}");
    let p = Program::compile(g, Backend::Interpreter)?;
    // x = [1, 2, 3, 1000] / 4 and a scale of 0.25: x/scale = [1, 2, 3, 1000] → [1, 2, 3, 448].
    let x = Tensor::new(DType::BF16, &[1, 4], vec![0.25, 0.5, 0.75, 250.0])?;
    let w8 = Tensor::new(DType::F8E4M3, &[2, 4], vec![1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0])?;
    let (sx, sw) = (Tensor::scalar(DType::F32, 0.25), Tensor::scalar(DType::F32, 2.0));
    let out = p.run(&[("x", &x), ("sx", &sx), ("w8", &w8), ("sw", &sw)], &[])?;
    assert_eq!(out[1].dtype(), DType::F8E4M3);
    assert_eq!(out[1].data(), &[1.0, 2.0, 3.0, 448.0], "x/scale, saturated at 448");
    // y = dequant(x8) · dequant(w8)ᵀ = [0.25·2, 112·2].
    assert_eq!(out[0].data(), &[0.5, 224.0]);
    Ok(())
}

#[test]
fn a_scale_typed_from_rust_is_refused_when_the_graph_is_built() {
    // The macro sees neither the scale's dtype nor the operand's: the builder does.
    let (dt, n) = (DType::F16, Dim::constant(4));
    let r = graph! {
        fn f(x: f32[T, 4], s: {dt}[]) -> f8e4m3[T, 4] {
            x.quantize_fp8(s)
        }
    };
    let e = r.expect_err("the scale is f16[]").to_string();
    assert!(e.contains("`quantize_fp8`(f32[T, 4], f16[])") && e.contains("operand 1 (`scale`) is f16[]"), "{e}");
    let r = graph! {
        fn f(x8: {DType::F8E4M3}[{&n}], y8: {DType::F8E4M3}[{&n}]) -> f8e4m3[4] {
            x8 + y8
        }
    };
    let e = r.expect_err("add on fp8").to_string();
    assert!(e.contains("`add` does not compute on f8e4m3 (a storage type): operand 0 (`a`) is f8e4m3[4]"), "{e}");
}
