use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, 4], b: f32[T, 5]) -> f32[T, 4] {
            x + b
        }
    };
}
