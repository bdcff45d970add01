use sinter::graph;

fn main() {
    // The scale of quantize_fp8 is one f32 per tensor: a scalar f32[].
    let _ = graph! {
        fn f(x: bf16[T, 64], s: f32[64]) -> f8e4m3[T, 64] {
            x.quantize_fp8(s)
        }
    };
}
