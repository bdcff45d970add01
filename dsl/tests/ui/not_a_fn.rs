use sinter::graph;

fn main() {
    let _ = graph! {
        let y = 1;
    };
}
