use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, 4], y: f32[T, 4]) -> f32[T, 4] {
            x.select(x, y)
        }
    };
}
