use sinter::graph;

fn main() {
    let _ = graph! {
        fn g(x: f32[T, 4]) -> f32[T, 4] {
            x.exp()
        }
        fn f(x: f32[T, 4]) -> f32[T, 4] {
            let [a, b] = g(x);
            a + b
        }
    };
}
