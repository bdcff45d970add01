use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x, w: f32[4, 4]) -> f32[T, 4] {
            x @ w
        }
    };
}
