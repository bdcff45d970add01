//! The decoder contract: what a model gives the [`super::Engine`] so that the engine can serve
//! it without knowing its architecture.
//!
//! A decoder is its two DSL graphs over a paged KV cache, the geometry of that cache, its
//! weights by name, a tokenizer, an optional chat template, its end-of-sequence tokens and
//! its context length ([`DecoderModel`]).
//!
//! **The graphs.** [`DecoderModel::graph`] builds both from one definition; the entry
//! function (`@main`) of each has exactly these inputs (any other parameter must be a weight
//! the model binds) and at least these outputs, in this order:
//!
//! - inputs `tokens: i64[T]`, `positions: i32[T]`, `block_tables: i32[L, B, M]`,
//!   `k_pages`/`v_pages: dtype[P, page_size, kv_heads, head_dim]` (the pools of
//!   [`KvGeometry`]; page `block_tables[l, b, j]` holds tokens `j·page_size ..` of sequence `b`
//!   in layer `l`);
//! - outputs `(logits: dtype[T, vocab], k_pages, v_pages, next: i32[T])`: the pools after
//!   `kv_append` wrote the new tokens' keys and values (on the GPU they must alias the inputs:
//!   `kv_append` updates in place), and `next` the greedy token after each row (the lowest id
//!   of the largest logit; `vocab`, no id, for a row holding a NaN, whose token the engine
//!   then takes on the host).
//! - [`Mode::Prefill`]: the `T` tokens of one fresh sequence (`B = 1`), positions `0..T`.
//! - [`Mode::Decode`]: one new token for each of `T` sequences (`B = T`, `T` symbolic);
//!   `positions[b]` is the number of tokens sequence `b` already has in the cache, so its
//!   attention covers `positions[b] + 1` tokens.
//!
//! [`check_graph`] checks the signature; the engine calls it on both graphs.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use super::chat::{ChatTemplate, Message};
use super::gguf::ModelError;
use super::tokenizer::Tokenizer;
use crate::zoo::Mode;
use crate::{DType, Error, Graph, Tensor};

/// The shape of a decoder's paged KV cache: one pool of pages for the keys and one for the
/// values, each `dtype[pages, page_size, kv_heads, head_dim]`, every layer's pages in the
/// same pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KvGeometry {
    /// Decoder layers `L` (rows of the block tables).
    pub layers: usize,
    /// Key/value heads per token.
    pub kv_heads: usize,
    /// Width of one key or value head.
    pub head_dim: usize,
    /// Tokens per page.
    pub page_size: usize,
    /// Element type of the pools (the model's activation dtype).
    pub dtype: DType,
}

impl KvGeometry {
    /// The shape of a pool of `pages` pages: `[pages, page_size, kv_heads, head_dim]`.
    pub fn pool_shape(&self, pages: usize) -> [usize; 4] {
        [pages, self.page_size, self.kv_heads, self.head_dim]
    }

    /// Pages a sequence of `tokens` tokens needs in each layer (at least one).
    pub fn pages_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.page_size.max(1)).max(1)
    }
}

/// A decoder-only language model the [`super::Engine`] can serve: the contract every
/// architecture implements (see the module documentation for the graphs' signature).
///
/// Implementations: [`super::LlamaModel`] (`llama`), [`super::Gpt2Model`] (`gpt2`); a boxed
/// `dyn DecoderModel`, as [`super::open`] returns, is one too.
pub trait DecoderModel: Send + Sync {
    /// The architecture's name as the registry knows it (`llama`, `gpt2`).
    fn architecture(&self) -> &str;

    /// The prefill or the (batch-symbolic) decode graph, with weights of the model's dtype.
    ///
    /// # Errors
    /// Graph build errors.
    fn graph(&self, mode: Mode) -> Result<Graph, Error>;

    /// The decode graph specialised to a batch of `b` sequences (`T = b`,
    /// [`sinter_ir::Graph::specialize`]): with the batch a constant, the code generator can
    /// take the small-M GEMV for projections with element-wise epilogues and 16-row tiles for
    /// the others, instead of the 64-row tiles a symbolic batch gets.
    ///
    /// # Errors
    /// Graph build or verification errors.
    fn decode_graph_for_batch(&self, b: usize) -> Result<Graph, Error> {
        let g = self.graph(Mode::Decode)?;
        let s = g.specialize(&[("T".to_string(), b as i64)].into_iter().collect());
        sinter_ir::verify(&s)?;
        Ok(s)
    }

    /// The KV cache's geometry; `dtype` is also the dtype of the weights and logits.
    fn kv(&self) -> KvGeometry;

    /// Vocabulary size: the width of the logits.
    fn vocab(&self) -> usize;

    /// Tokens a sequence may hold (prompt plus generated).
    fn context(&self) -> usize;

    /// The weights the graphs name, by name, in the model's dtype and the shapes the graphs
    /// declare (after the load-time transforms of [`super::weights`]).
    fn weights(&self) -> &BTreeMap<String, Arc<Tensor>>;

    /// The model's tokenizer.
    fn tokenizer(&self) -> &Tokenizer;

    /// The chat template, if the model has one (base models do not).
    fn chat_template(&self) -> Option<&ChatTemplate>;

    /// Tokens that end a sequence (generation stops after producing one).
    fn eos_tokens(&self) -> Vec<u32>;

    /// Where the model was loaded from (empty for a model built in memory).
    fn source(&self) -> &Path;

    /// The token ids of a one-turn chat: `user_text` rendered with the chat template (with
    /// its default system prompt) and the assistant's turn opened.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when the model has no chat template; template or tokenizer
    /// errors.
    fn chat_prompt(&self, user_text: &str) -> Result<Vec<u32>, ModelError> {
        let chat = self.chat_template().filter(|c| c.source.is_some()).ok_or_else(|| ModelError::Tokenizer {
            path: self.source().to_path_buf(),
            reason: "the model has no chat template: feed the prompt as plain text".into(),
        })?;
        let text = chat.render(&[Message { role: "user".into(), content: user_text.into() }])?;
        self.tokenizer().encode(&text)
    }
}

impl<M: DecoderModel + ?Sized> DecoderModel for Box<M> {
    fn architecture(&self) -> &str {
        (**self).architecture()
    }
    fn graph(&self, mode: Mode) -> Result<Graph, Error> {
        (**self).graph(mode)
    }
    fn decode_graph_for_batch(&self, b: usize) -> Result<Graph, Error> {
        (**self).decode_graph_for_batch(b)
    }
    fn kv(&self) -> KvGeometry {
        (**self).kv()
    }
    fn vocab(&self) -> usize {
        (**self).vocab()
    }
    fn context(&self) -> usize {
        (**self).context()
    }
    fn weights(&self) -> &BTreeMap<String, Arc<Tensor>> {
        (**self).weights()
    }
    fn tokenizer(&self) -> &Tokenizer {
        (**self).tokenizer()
    }
    fn chat_template(&self) -> Option<&ChatTemplate> {
        (**self).chat_template()
    }
    fn eos_tokens(&self) -> Vec<u32> {
        (**self).eos_tokens()
    }
    fn source(&self) -> &Path {
        (**self).source()
    }
    fn chat_prompt(&self, user_text: &str) -> Result<Vec<u32>, ModelError> {
        (**self).chat_prompt(user_text)
    }
}

/// The inputs every decoder graph's entry function takes, in this order.
pub const GRAPH_INPUTS: [&str; 5] = ["tokens", "positions", "block_tables", "k_pages", "v_pages"];

/// Checks that `g` has the decoder signature (module documentation): an entry function whose
/// parameters include [`GRAPH_INPUTS`], any others being bound by `weights`, and at least
/// four outputs; with `kv`, also that the page pools are `kv.dtype[P, page_size, kv_heads,
/// head_dim]` and the block tables have `kv.layers` rows.
///
/// # Errors
/// [`Error::Unsupported`] naming what is missing or disagrees.
pub fn check_graph(g: &Graph, weights: &BTreeMap<String, Arc<Tensor>>, kv: Option<&KvGeometry>, what: &str) -> Result<(), Error> {
    let f = g.entry().ok_or(Error::NoEntry)?;
    let bad = |m: String| Err(Error::Unsupported(format!("the {what} graph does not follow the decoder contract: {m}")));
    for name in GRAPH_INPUTS {
        if f.param_named(name).is_none() {
            return bad(format!("@{} has no input `{name}` (a decoder graph takes {})", f.name, GRAPH_INPUTS.join(", ")));
        }
    }
    for &p in &f.params {
        let name = f.values[p].name.as_deref().unwrap_or("");
        if !GRAPH_INPUTS.contains(&name) && !weights.contains_key(name) {
            return bad(format!("parameter `{name}` of @{} is neither a decoder input nor one of the model's weights", f.name));
        }
    }
    if f.outputs.len() < 4 {
        return bad(format!("@{} returns {} values; a decoder graph returns (logits, k_pages, v_pages, next)", f.name, f.outputs.len()));
    }
    let Some(kv) = kv else { return Ok(()) };
    let dims = |name: &str| f.param_named(name).map(|p| f.ty(p).clone());
    let want = [kv.page_size, kv.kv_heads, kv.head_dim].map(|d| Some(d as i64));
    for name in ["k_pages", "v_pages"] {
        let Some(t) = dims(name) else { continue };
        let got: Vec<Option<i64>> = t.shape.iter().skip(1).map(|d| d.as_const()).collect();
        if t.dtype != kv.dtype || t.shape.len() != 4 || got != want {
            return bad(format!("`{name}` is {t}, the model's KV geometry says {}[P, {}, {}, {}]", kv.dtype, kv.page_size, kv.kv_heads, kv.head_dim));
        }
    }
    if let Some(t) = dims("block_tables") {
        if t.shape.first().and_then(|d| d.as_const()) != Some(kv.layers as i64) {
            return bad(format!("`block_tables` is {t}, the model has {} layers", kv.layers));
        }
    }
    Ok(())
}
