use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T, 4], w: f32[4]) -> f32[T, 4] {
            x.rms_norm(w, 1e-5, 2)
        }
    };
}
