//! Llama-family models (Llama 2/3, SmolLM2) as an instance of the decoder contract: the zoo's
//! [`crate::zoo::llama`] graphs, the GGUF and Hugging Face weight maps, the tokenizer and
//! the chat template.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::chat::ChatTemplate;
use super::decoder::{DecoderModel, KvGeometry};
use super::gguf::{GgufFile, ModelError};
use super::hf::HfFolder;
use super::tokenizer::Tokenizer;
use super::weights::{self, WeightSpec};
use crate::zoo::llama::{self, LlamaConfig};
use crate::zoo::Mode;
use crate::{DType, Error, Graph, Tensor};

/// A Llama-family model loaded from GGUF or a Hugging Face folder: config, dequantised
/// weights, tokenizer.
pub struct LlamaModel {
    /// Hyper-parameters read from the file's metadata.
    pub cfg: LlamaConfig,
    /// Storage dtype of the weights and activations.
    pub dtype: DType,
    /// Weights by GGUF name, shared between the prefill and decode programs.
    pub weights: BTreeMap<String, Arc<Tensor>>,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The model's chat template.
    pub chat: ChatTemplate,
    /// Where the model was loaded from.
    pub source: PathBuf,
}

/// GGUF name → Hugging Face name, for one layer's tensors.
const LAYER_NAMES: [(&str, &str); 9] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The weights of `cfg`'s graphs: `(GGUF name, Hugging Face name, shape)`.
fn weight_names(cfg: &LlamaConfig) -> Vec<(String, String, Vec<usize>)> {
    let (d, qd, kvd) = (cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim);
    let mut w = vec![("token_embd.weight".into(), "model.embed_tokens.weight".into(), vec![cfg.vocab, d]), ("output_norm.weight".into(), "model.norm.weight".into(), vec![d])];
    if !cfg.tied_embeddings {
        w.push(("output.weight".into(), "lm_head.weight".into(), vec![cfg.vocab, d]));
    }
    for i in 0..cfg.n_layers {
        for (gg, hf) in LAYER_NAMES {
            let shape = match gg {
                "attn_norm" | "ffn_norm" => vec![d],
                "attn_q" => vec![qd, d],
                "attn_k" | "attn_v" => vec![kvd, d],
                "attn_output" => vec![d, qd],
                "ffn_gate" | "ffn_up" => vec![cfg.ffn, d],
                _ => vec![d, cfg.ffn],
            };
            w.push((format!("blk.{i}.{gg}.weight"), format!("model.layers.{i}.{hf}.weight"), shape));
        }
    }
    w
}

impl LlamaModel {
    /// Reads a Llama-family GGUF file and dequantises its weights to `dtype`; `progress(done,
    /// total)` is called after each tensor.
    ///
    /// The attention projections keep llama.cpp's row order: its converter permutes the rows
    /// of `attn_q`/`attn_k` within each head so that RoPE pairs adjacent elements, so the
    /// model runs with the `interleaved` RoPE form, which computes the same attention as the
    /// Hugging Face weights with `rotate_half`.
    ///
    /// # Errors
    /// [`ModelError`]: unreadable, truncated or corrupt file, an architecture other than
    /// `llama` (use [`super::open`] for any supported one), missing keys or tensors,
    /// unsupported tensor types, shapes that disagree with the metadata.
    pub fn load(path: &Path, dtype: DType, mut progress: impl FnMut(usize, usize)) -> Result<LlamaModel, ModelError> {
        let file = GgufFile::open(path)?;
        let arch = file.str("general.architecture")?.to_string();
        if arch != "llama" {
            return Err(ModelError::UnsupportedArchitecture { path: path.to_path_buf(), arch, supported: "llama".into() });
        }
        LlamaModel::from_gguf(&file, dtype, &mut progress)
    }

    /// The Llama model of an open GGUF file (its `general.architecture` already checked).
    ///
    /// # Errors
    /// As [`LlamaModel::load`].
    pub fn from_gguf(file: &GgufFile, dtype: DType, progress: &mut dyn FnMut(usize, usize)) -> Result<LlamaModel, ModelError> {
        let path = file.path().to_path_buf();
        let k = |s: &str| format!("llama.{s}");
        let u = |s: &str| file.u64(&k(s)).map(|v| v as usize);
        let hidden = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        // Llama 3.1's frequency scaling is stored as a `rope_freqs` tensor, other scalings as
        // `rope.scaling.*` keys: the graph computes neither, so such a file is refused, not run
        // with unscaled positions.
        if let Ok(kind) = file.str(&k("rope.scaling.type")) {
            if kind != "none" {
                return Err(ModelError::BadValue { path, key: k("rope.scaling.type"), value: kind.into(), reason: "RoPE scaling is not read from Llama GGUF files (supported: none); load the model's Hugging Face folder, whose rope_scaling is".into() });
            }
        }
        if file.info("rope_freqs.weight").is_some() {
            return Err(ModelError::Malformed { path, reason: "the tensor `rope_freqs.weight` (Llama 3.1's RoPE frequency factors) is not read from GGUF files: load the model's Hugging Face folder instead".into() });
        }
        let tokenizer = Tokenizer::from_gguf(file)?;
        let cfg = LlamaConfig {
            vocab: u("vocab_size").unwrap_or(tokenizer.vocab_size()),
            hidden,
            n_layers: u("block_count")?,
            n_heads,
            n_kv_heads: u("attention.head_count_kv").unwrap_or(n_heads),
            head_dim: u("rope.dimension_count").unwrap_or(hidden / n_heads.max(1)),
            ffn: u("feed_forward_length")?,
            rope_theta: file.f64(&k("rope.freq_base")).unwrap_or(10000.0),
            rope_form: "interleaved",
            rope_scaling: crate::zoo::qwen::RopeScaling::None,
            rms_eps: file.f64(&k("attention.layer_norm_rms_epsilon"))?,
            context: u("context_length")?,
            page_size: 16,
            tied_embeddings: file.info("output.weight").is_none(),
        };
        cfg.validate().map_err(|e| ModelError::Malformed { path: path.clone(), reason: e.to_string() })?;
        let specs: Vec<WeightSpec> = weight_names(&cfg).into_iter().map(|(gg, _, s)| WeightSpec::plain(gg.clone(), gg, &s)).collect();
        let weights = weights::load(file, &specs, dtype, progress)?;
        let tokens = file.strings("tokenizer.ggml.tokens").unwrap_or_default();
        let name = |k: &str| file.u64(k).ok().and_then(|i| tokens.get(i as usize).map(|t| t.to_string())).unwrap_or_default();
        let chat = ChatTemplate {
            source: file.str("tokenizer.chat_template").ok().map(str::to_string),
            bos_token: name("tokenizer.ggml.bos_token_id"),
            eos_token: name("tokenizer.ggml.eos_token_id"),
        };
        Ok(LlamaModel { cfg, dtype, weights, tokenizer, chat, source: path })
    }

    /// The Llama model of a Hugging Face folder (`config.json` keys `hidden_size`,
    /// `num_hidden_layers`, `num_attention_heads`, `num_key_value_heads`, `head_dim`,
    /// `intermediate_size`, `rope_theta` (or `rope_parameters.rope_theta`, transformers 5),
    /// `rms_norm_eps`, `max_position_embeddings`,
    /// `tie_word_embeddings`, `bos_token_id`, `eos_token_id`). Hugging Face stores
    /// `q_proj`/`k_proj` rows in the order RoPE's `rotate_half` form expects, so these models
    /// run with `rope_form = "rotate_half"`.
    ///
    /// # Errors
    /// Missing or malformed `config.json` keys, a RoPE scaling other than `default`, missing
    /// tensors, tensors of an unsupported dtype (F32, F16 and BF16 are read), wrong shapes,
    /// an unreadable tokenizer.
    pub fn from_hf(mut folder: HfFolder, dtype: DType, progress: &mut dyn FnMut(usize, usize)) -> Result<LlamaModel, ModelError> {
        let f = &folder;
        use serde_json::json;
        f.require("hidden_act", &[json!("silu")], "the Llama graph's MLP is SwiGLU")?;
        f.require("attention_bias", &[json!(false)], "the Llama graph's projections have no bias")?;
        f.require("mlp_bias", &[json!(false)], "the Llama graph's MLP has no bias")?;
        let hidden = f.usize("hidden_size")?;
        let n_heads = f.usize("num_attention_heads")?;
        let cfg = LlamaConfig {
            vocab: f.usize("vocab_size")?,
            hidden,
            n_layers: f.usize("num_hidden_layers")?,
            n_heads,
            n_kv_heads: f.usize("num_key_value_heads").unwrap_or(n_heads),
            head_dim: f.usize("head_dim").unwrap_or(hidden / n_heads.max(1)),
            ffn: f.usize("intermediate_size")?,
            rope_theta: super::qwen::hf_rope_theta(f),
            rope_form: "rotate_half",
            rope_scaling: super::qwen::hf_rope_scaling(f, f.usize("max_position_embeddings")?)?,
            rms_eps: f.f64("rms_norm_eps")?,
            context: f.usize("max_position_embeddings")?,
            page_size: 16,
            tied_embeddings: f.bool("tie_word_embeddings").unwrap_or(false),
        };
        cfg.validate().map_err(|e| f.malformed(e.to_string()))?;
        folder.read_tensors()?;
        let specs: Vec<WeightSpec> = weight_names(&cfg).into_iter().map(|(gg, hf, s)| WeightSpec::plain(gg, hf, &s)).collect();
        let weights = weights::load(&folder, &specs, dtype, progress)?;
        let (bos, eos) = (folder.token_id("bos_token_id").unwrap_or(1), folder.token_id("eos_token_id").unwrap_or(2));
        let (tokenizer, chat) = folder.tokenizer(bos, eos)?;
        Ok(LlamaModel { cfg, dtype, weights, tokenizer, chat, source: folder.dir().to_path_buf() })
    }

    /// The token ids of a one-turn chat: `user_text` rendered with the file's chat template
    /// (with its default system prompt) and the assistant's turn opened.
    ///
    /// # Errors
    /// Template or tokenizer errors.
    pub fn chat_prompt(&self, user_text: &str) -> Result<Vec<u32>, ModelError> {
        let text = self.chat.render(&[super::chat::Message { role: "user".into(), content: user_text.into() }])?;
        self.tokenizer.encode(&text)
    }

    /// Loads a model from a file or folder: a `.gguf` file, or a Hugging Face folder
    /// (`config.json`, `*.safetensors`, `tokenizer.json`; see [`super::hf::load`]).
    ///
    /// # Errors
    /// As [`LlamaModel::load`] and [`super::hf::load`].
    pub fn open(path: &Path, dtype: DType, progress: impl FnMut(usize, usize)) -> Result<LlamaModel, ModelError> {
        if path.is_dir() {
            super::hf::load(path, dtype, progress)
        } else {
            LlamaModel::load(path, dtype, progress)
        }
    }
}

/// The decode graph of a Llama model of config `cfg` specialised to a batch of `b` sequences
/// (what [`DecoderModel::decode_graph_for_batch`] of a [`LlamaModel`] returns).
///
/// # Errors
/// Graph build or verification errors.
pub fn decode_graph_for_batch(cfg: &LlamaConfig, dtype: DType, b: usize) -> Result<Graph, Error> {
    let g = llama::build(cfg, Mode::Decode, dtype)?;
    let s = g.specialize(&[("T".to_string(), b as i64)].into_iter().collect());
    sinter_ir::verify(&s)?;
    Ok(s)
}

impl DecoderModel for LlamaModel {
    fn architecture(&self) -> &str {
        "llama"
    }

    fn graph(&self, mode: Mode) -> Result<Graph, Error> {
        llama::build(&self.cfg, mode, self.dtype)
    }

    fn kv(&self) -> KvGeometry {
        KvGeometry { layers: self.cfg.n_layers, kv_heads: self.cfg.n_kv_heads, head_dim: self.cfg.head_dim, page_size: self.cfg.page_size, dtype: self.dtype }
    }

    fn vocab(&self) -> usize {
        self.cfg.vocab
    }

    fn context(&self) -> usize {
        self.cfg.context
    }

    fn weights(&self) -> &BTreeMap<String, Arc<Tensor>> {
        &self.weights
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn chat_template(&self) -> Option<&ChatTemplate> {
        Some(&self.chat)
    }

    fn eos_tokens(&self) -> Vec<u32> {
        vec![self.tokenizer.eos]
    }

    fn source(&self) -> &Path {
        &self.source
    }

    fn chat_prompt(&self, user_text: &str) -> Result<Vec<u32>, ModelError> {
        LlamaModel::chat_prompt(self, user_text)
    }
}
