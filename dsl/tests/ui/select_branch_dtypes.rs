use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, 4], n: i32[T, 4]) -> f32[T, 4] {
            (x > 0.0).select(x, n)
        }
    };
}
