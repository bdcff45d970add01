use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, 4]) -> f32[T, 4] {
            let two = 2.0;
            x * two
        }
    };
}
