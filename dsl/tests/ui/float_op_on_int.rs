use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(x: i32[T]) -> i32[T] {
            x.exp()
        }
    };
}
