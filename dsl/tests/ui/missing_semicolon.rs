use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, 4]) -> f32[T, 4] {
            let y = x.exp()
            let z = y.neg();
            z
        }
    };
}
