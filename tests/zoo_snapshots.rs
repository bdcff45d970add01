//! The zoo's graphs, printed: the tiny Llama's prefill and decode graphs and the tiny GPT-2, in
//! bf16, as `insta` snapshots (`tests/snapshots/main__zoo_snapshots__*.snap`). A change to a
//! model's definition, to the DSL's expansion or to the printer shows up here as a diff to
//! review with `cargo insta review`.

use sinter::zoo::{gpt2, llama, Mode};
use sinter::DType;

/// The graph's text, after checking that it verifies and that the text reads back to itself.
fn printed(g: &sinter::Graph) -> String {
    sinter::ir::verify(g).unwrap();
    let text = sinter::ir::print(g);
    let back = sinter::ir::parse(&text).unwrap_or_else(|e| panic!("the printed graph does not parse: {e}"));
    assert_eq!(sinter::ir::print(&back), text, "print ∘ parse is not the identity on this graph");
    text
}

#[test]
fn tiny_llama_prefill_ir() {
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Prefill, DType::BF16).unwrap();
    insta::assert_snapshot!("tiny_llama_prefill_bf16", printed(&g));
}

#[test]
fn tiny_llama_decode_ir() {
    let g = llama::build(&llama::LlamaConfig::tiny(), Mode::Decode, DType::BF16).unwrap();
    insta::assert_snapshot!("tiny_llama_decode_bf16", printed(&g));
}

#[test]
fn tiny_gpt2_ir() {
    let g = gpt2::build(&gpt2::Gpt2Config::tiny(), DType::BF16).unwrap();
    insta::assert_snapshot!("tiny_gpt2_bf16", printed(&g));
}
