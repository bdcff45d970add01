use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: bf16[T, 4], y: f32[T, 4]) -> bf16[T, 4] {
            x + y
        }
    };
}
