use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, D]) -> f32[T, D] {
            x.softmax(axis = -3)
        }
    };
}
