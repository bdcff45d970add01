use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, D], y: f32[T, E]) -> f32[T, D] {
            x.maximum(y)
        }
    };
}
