//! The zoo's graphs, printed: the tiny Llama's prefill and decode graphs and the tiny GPT-2, in
//! bf16, as `insta` snapshots (`tests/snapshots/main__zoo_snapshots__*.snap`). A change to a
//! model's definition, to the DSL's expansion or to the printer shows up here as a diff to
//! review with `cargo insta review`. Also `sinter explain`'s kernel totals and kernels per
//! layer for every zoo model, prefill and decode (`main__zoo_snapshots__explain_*.snap`): a
//! fusion regression shows as a changed count.

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

/// The lines of `sinter explain MODEL` that count kernels: per graph its header, the totals
/// and the kernels per layer (per kind of layer where layers differ).
fn explain_counts(model: &str) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sinter")).args(["explain", model]).output().unwrap();
    assert!(out.status.success(), "{model}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let keep: Vec<&str> = text.lines().filter(|l| l.starts_with("=== ") || l.starts_with("kernels: ") || l.starts_with("kernels per layer")).collect();
    let graphs = keep.iter().filter(|l| l.starts_with("=== ")).count();
    let per_layer = keep.iter().filter(|l| l.starts_with("kernels per layer")).count();
    assert_eq!(per_layer, graphs, "{model}: every graph of a zoo model has layers\n{}", keep.join("\n"));
    keep.join("\n") + "\n"
}

/// Every zoo model's kernels per layer, prefill and decode, pinned (the counts are in the
/// snapshot's text; `gpt2` has a prefill graph only).
#[test]
fn explain_kernels_per_layer_of_every_zoo_model() {
    for model in sinter::zoo::MODELS {
        insta::assert_snapshot!(format!("explain_{}", model.replace(['-', '.'], "_")), explain_counts(model));
    }
}
