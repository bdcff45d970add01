use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[4], w: f32[4, 4]) -> f32[4] {
            x @ w
        }
    };
}
