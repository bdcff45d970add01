use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: f32[T], m: bool[T]) -> bool[T] {
            m.logical_and(x)
        }
    };
}
