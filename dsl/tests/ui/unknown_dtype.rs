use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f64[T, 4]) -> f32[T, 4] {
            x
        }
    };
}
