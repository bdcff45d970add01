//! The model zoo: models written in the DSL, by name.
//!
//! | name | model |
//! |---|---|
//! | `smollm2-135m` | SmolLM2-135M (Llama family): hidden 576, 30 layers, 9 heads, 3 KV heads |
//! | `llama3-8b` | Llama-3-8B shape: hidden 4096, 32 layers, 32 heads, 8 KV heads |
//! | `gpt2` | GPT-2 small: hidden 768, 12 layers, 12 heads, LayerNorm, tanh-GELU, learned positions |
//! | `gpt2-124m` | the same GPT-2 small over the paged KV cache, as the engine runs it (pages of 16) |
//! | `qwen2-0.5b` | Qwen2-0.5B: hidden 896, 24 layers, 14 heads, 2 KV heads, QKV bias, tied embeddings |
//! | `qwen3-0.6b` | Qwen3-0.6B: hidden 1024, 28 layers, 16 heads, 8 KV heads of 128, q/k RMSNorm |
//! | `gemma3-270m` | Gemma-3-270M: hidden 640, 18 layers, 4 heads, 1 KV head of 256, sliding window 512 on five layers of six |
//!
//! Each model builds a prefill and a decode graph over the paged KV cache from one definition
//! ([`llama::build`], [`qwen::build`], [`gemma3::build`], [`gpt2_paged::build`]), except `gpt2`,
//! the full-recompute forward of [`gpt2::build`] (prefill only). [`cascade`] builds the cascade
//! (shared-prefix) decode attention step and the plain paged decode it replaces.

pub mod cascade;
pub mod gemma3;
pub mod gpt2;
pub mod gpt2_paged;
pub mod llama;
pub mod qwen;

use crate::{DType, Error, Graph};

/// The names [`build`] accepts.
pub const MODELS: [&str; 7] = ["smollm2-135m", "llama3-8b", "gpt2", "gpt2-124m", "qwen2-0.5b", "qwen3-0.6b", "gemma3-270m"];

/// Page size of the paged graphs [`build`] gives for the GPT-2, Qwen and Gemma models: the
/// engine's.
const PAGE_SIZE: usize = 16;

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
/// [`Error::UnknownModel`] for a name not in [`MODELS`]; [`Error::Unsupported`] for the decode
/// graph of `gpt2`, the full-recompute forward (`gpt2-124m` is the paged one); build errors
/// otherwise.
pub fn build(name: &str, mode: Mode, dtype: DType) -> Result<Graph, Error> {
    match name {
        "smollm2-135m" => llama::build(&llama::LlamaConfig::smollm2_135m(), mode, dtype),
        "llama3-8b" => llama::build(&llama::LlamaConfig::llama3_8b(), mode, dtype),
        "gpt2" => match mode {
            Mode::Prefill => gpt2::build(&gpt2::Gpt2Config::gpt2_small(), dtype),
            Mode::Decode => Err(Error::Unsupported("the gpt2 zoo model is the full-recompute forward; its paged decode graph is `gpt2-124m`".into())),
        },
        "gpt2-124m" => gpt2_paged::build(&gpt2::Gpt2Config::gpt2_small(), mode, dtype, PAGE_SIZE),
        "qwen2-0.5b" => qwen::build(&qwen::QwenConfig::qwen2_0_5b(), mode, dtype),
        "qwen3-0.6b" => qwen::build(&qwen::QwenConfig::qwen3_0_6b(), mode, dtype),
        "gemma3-270m" => gemma3::build(&gemma3::Gemma3Config::gemma3_270m(), mode, dtype),
        other => Err(Error::UnknownModel { name: other.to_string(), known: MODELS.join(", ") }),
    }
}
