use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, D], w: f32[E, F]) -> f32[T, F] {
            x @ w
        }
    };
}
