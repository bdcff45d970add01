//! The model zoo: models written in the DSL, by name.
//!
//! | name | model |
//! |---|---|
//! | `smollm2-135m` | SmolLM2-135M (Llama family): hidden 576, 30 layers, 9 heads, 3 KV heads |
//! | `llama3-8b` | Llama-3-8B shape: hidden 4096, 32 layers, 32 heads, 8 KV heads |
//! | `gpt2` | GPT-2 small: hidden 768, 12 layers, 12 heads, LayerNorm, tanh-GELU, learned positions |
//!
//! Each model builds a prefill graph and (for the Llama family) a decode graph from one
//! definition; see [`llama::build`] and [`gpt2::build`]. [`cascade`] builds the cascade
//! (shared-prefix) decode attention step and the plain paged decode it replaces.

pub mod cascade;
pub mod gemma3;
pub mod gpt2;
pub mod gpt2_paged;
pub mod llama;
pub mod qwen;

use crate::{DType, Error, Graph};

/// The names [`build`] accepts.
pub const MODELS: [&str; 3] = ["smollm2-135m", "llama3-8b", "gpt2"];

/// Which graph of a model to build.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// The prompt at once: `T` tokens of one sequence, attention written decomposed as
    /// `softmax(Q·Kᵀ·scale + causal mask)·V`; the keys and values are also written to the
    /// paged KV cache so decoding can continue.
    Prefill,
    /// One new token for each of `T` sequences, attention over the paged KV cache
    /// (`kv_append` then `paged_attention`).
    Decode,
}

/// Builds a zoo model by name.
///
/// ```
/// let g = sinter::zoo::build("smollm2-135m", sinter::zoo::Mode::Decode, sinter::DType::BF16)?;
/// assert!(g.func("layer").is_some());
/// assert!(sinter::zoo::build("gpt5", sinter::zoo::Mode::Prefill, sinter::DType::BF16).is_err());
/// # Ok::<(), sinter::Error>(())
/// ```
///
/// # Errors
/// [`Error::UnknownModel`] for a name not in [`MODELS`]; [`Error::Unsupported`] for GPT-2's
/// decode graph (not written yet); build errors otherwise.
pub fn build(name: &str, mode: Mode, dtype: DType) -> Result<Graph, Error> {
    match name {
        "smollm2-135m" => llama::build(&llama::LlamaConfig::smollm2_135m(), mode, dtype),
        "llama3-8b" => llama::build(&llama::LlamaConfig::llama3_8b(), mode, dtype),
        "gpt2" => match mode {
            Mode::Prefill => gpt2::build(&gpt2::Gpt2Config::gpt2_small(), dtype),
            Mode::Decode => Err(Error::Unsupported("the gpt2 zoo model is the full-recompute forward; its paged decode graph is `sinter::zoo::gpt2_paged::build`".into())),
        },
        other => Err(Error::UnknownModel { name: other.to_string(), known: MODELS.join(", ") }),
    }
}
