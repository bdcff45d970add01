use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[N]) -> (f32[N], f32[N]) {
            x.exp()
        }
    };
}
