use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[2, 3]) -> f32[3, 2] {
            x.transpose(0, 2)
        }
    };
}
