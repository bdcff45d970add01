use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[2, 3]) -> f32[4, 2] {
            x.reshape([4, 2])
        }
    };
}
