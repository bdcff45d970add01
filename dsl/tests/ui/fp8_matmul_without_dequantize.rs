use sinter::graph;

fn main() {
    // f8e4m3 is a storage type: a matmul reads `dequantize_fp8` of it, not the fp8 bytes.
    let _ = graph! {
        fn f(x8: f8e4m3[T, 64], w8: f8e4m3[64, 32]) -> f8e4m3[T, 32] {
            x8 @ w8
        }
    };
}
