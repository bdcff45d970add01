use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[4, 8], w: f32[6, 2]) -> f32[4, 2] {
            x @ w
        }
    };
}
