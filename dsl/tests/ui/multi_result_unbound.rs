use sinter::graph;

fn main() {
    let _ = graph! {
        fn f(k_pages: f32[P, 4, 2, 8], v_pages: f32[P, 4, 2, 8], k: f32[1, T, 2, 8], v: f32[1, T, 2, 8],
             block_table: i32[1, M], start: i32[1]) -> f32[P, 4, 2, 8] {
            let kv = k_pages.kv_append(v_pages, k, v, block_table, start);
            kv
        }
    };
}
