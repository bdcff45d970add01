//! Running language models: loading (GGUF, Hugging Face folders), tokenizer, chat template,
//! and generation with a paged KV cache.
//!
//! - [`decoder`]: the contract a model meets to be served — its prefill and decode graphs
//!   over a paged KV cache, the cache's geometry, its weights, tokenizer, chat template,
//!   end-of-sequence tokens and context ([`DecoderModel`]).
//! - [`engine`]: [`Engine`], which serves any [`DecoderModel`] on the interpreter or the GPU.
//! - [`batching`]: continuous batching over one KV page pool ([`Batcher`], from
//!   [`Engine::batcher`]): requests join and leave the running batch between decode steps.
//! - [`sample`]: greedy and seeded sampling ([`SampleOptions`], [`Sampler`]).
//! - [`registry`]: the architectures [`open`] loads, by `general.architecture` (GGUF) or
//!   `model_type` (`config.json`): [`LlamaModel`] (`llama`), [`Gpt2Model`] (`gpt2`) and
//!   [`QwenModel`] (`qwen2`, `qwen3`).
//! - [`weights`]: weight maps with load-time transforms; [`gguf`], [`hf`]: the files.
//!
//! ```no_run
//! use sinter::llm::{Engine, LlamaModel, SampleOptions};
//! let model = LlamaModel::load("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), sinter::DType::BF16, |_, _| {})?;
//! let prompt = model.chat_prompt("What is the capital of France?")?;
//! let engine = Engine::new(model)?;
//! let out = engine.generate(&[prompt], &SampleOptions::greedy(32), &mut |_, _| {})?;
//! println!("{}", engine.model().tokenizer.decode(&out.tokens[0])?);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod batching;
pub mod chat;
pub mod decoder;
pub mod engine;
pub mod fetch;
pub mod gemma3;
pub mod gguf;
pub mod gpt2;
pub mod hf;
pub mod llama;
pub mod qwen;
pub mod registry;
pub mod sample;
mod pool;
mod session;
mod spm;
mod token_attr;
pub mod tokenizer;
pub mod weights;

pub use batching::{BatchOptions, Batcher, Event, FinishReason, Rejected, Request, Sink};
pub use decoder::{DecoderModel, KvGeometry};
pub use engine::{cuda_graph_default, specialise_default, Engine, Generation};
pub use gemma3::Gemma3Model;
pub use gpt2::Gpt2Model;
pub use llama::{decode_graph_for_batch, LlamaModel};
pub use qwen::QwenModel;
pub use registry::{open, AnyDecoder};
pub use sample::{argmax, SampleOptions, Sampler};

use crate::Error;
use gguf::ModelError;

impl From<ModelError> for Error {
    fn from(e: ModelError) -> Error {
        Error::Model(e)
    }
}
