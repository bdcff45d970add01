//! GPT-2 as an instance of the decoder contract: [`crate::zoo::gpt2_paged`]'s graphs, the
//! GGUF (`general.architecture = "gpt2"`) and Hugging Face (`model_type = "gpt2"`) weight
//! maps. Hugging Face stores GPT-2's projections as `Conv1D` matrices `[in, out]`; the
//! loader transposes them to the `[out, in]` the graphs (and GGUF) use.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::chat::ChatTemplate;
use super::decoder::{DecoderModel, KvGeometry};
use super::gguf::{GgufFile, ModelError};
use super::hf::HfFolder;
use super::tokenizer::Tokenizer;
use super::weights::{self, Transform, WeightSpec};
use crate::zoo::gpt2::Gpt2Config;
use crate::zoo::{gpt2_paged, Mode};
use crate::{DType, Error, Graph, Tensor};

/// Tokens per KV-cache page of loaded GPT-2 models.
const PAGE_SIZE: usize = 16;

/// A GPT-2 model: config, weights (GGUF names, `[out, in]` matrices), tokenizer.
pub struct Gpt2Model {
    /// Hyper-parameters.
    pub cfg: Gpt2Config,
    /// Tokens per KV-cache page.
    pub page_size: usize,
    /// Storage dtype of the weights and activations.
    pub dtype: DType,
    /// Weights by GGUF name ([`crate::zoo::gpt2`] lists them).
    pub weights: BTreeMap<String, Arc<Tensor>>,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, if any (GPT-2 has none).
    pub chat: Option<ChatTemplate>,
    /// End-of-sequence tokens (`<|endoftext|>`, 50256, for GPT-2's own vocabulary).
    pub eos: Vec<u32>,
    /// Where the model was loaded from.
    pub source: PathBuf,
}

/// The graphs' weights: `(GGUF name, Hugging Face name without the `transformer.` prefix,
/// shape, transposed in Hugging Face's file)`.
fn weight_names(cfg: &Gpt2Config) -> Vec<(String, String, Vec<usize>, bool)> {
    let (d, f) = (cfg.hidden, cfg.ffn);
    let mut w = vec![
        ("token_embd.weight".into(), "wte.weight".into(), vec![cfg.vocab, d], false),
        ("position_embd.weight".into(), "wpe.weight".into(), vec![cfg.context, d], false),
        ("output_norm.weight".into(), "ln_f.weight".into(), vec![d], false),
        ("output_norm.bias".into(), "ln_f.bias".into(), vec![d], false),
    ];
    for i in 0..cfg.n_layers {
        for (gg, hf, shape, conv) in [
            ("attn_norm.weight", "ln_1.weight", vec![d], false),
            ("attn_norm.bias", "ln_1.bias", vec![d], false),
            ("attn_qkv.weight", "attn.c_attn.weight", vec![3 * d, d], true),
            ("attn_qkv.bias", "attn.c_attn.bias", vec![3 * d], false),
            ("attn_output.weight", "attn.c_proj.weight", vec![d, d], true),
            ("attn_output.bias", "attn.c_proj.bias", vec![d], false),
            ("ffn_norm.weight", "ln_2.weight", vec![d], false),
            ("ffn_norm.bias", "ln_2.bias", vec![d], false),
            ("ffn_up.weight", "mlp.c_fc.weight", vec![f, d], true),
            ("ffn_up.bias", "mlp.c_fc.bias", vec![f], false),
            ("ffn_down.weight", "mlp.c_proj.weight", vec![d, f], true),
            ("ffn_down.bias", "mlp.c_proj.bias", vec![d], false),
        ] {
            w.push((format!("blk.{i}.{gg}"), format!("h.{i}.{hf}"), shape, conv));
        }
    }
    w
}

impl Gpt2Model {
    /// The GPT-2 model of an open GGUF file (`general.architecture = "gpt2"`; keys
    /// `gpt2.{context_length, embedding_length, feed_forward_length, block_count,
    /// attention.head_count, attention.layer_norm_epsilon}`, llama.cpp's tensor names).
    ///
    /// # Errors
    /// Missing keys or tensors, unsupported tensor types, shapes that disagree with the
    /// metadata, an invalid config, an unreadable tokenizer.
    pub fn from_gguf(file: &GgufFile, dtype: DType, progress: &mut dyn FnMut(usize, usize)) -> Result<Gpt2Model, ModelError> {
        let u = |s: &str| file.u64(&format!("gpt2.{s}")).map(|v| v as usize);
        let tokenizer = Tokenizer::from_gguf(file)?;
        let cfg = Gpt2Config {
            vocab: u("vocab_size").unwrap_or(tokenizer.vocab_size()),
            hidden: u("embedding_length")?,
            n_layers: u("block_count")?,
            n_heads: u("attention.head_count")?,
            ffn: u("feed_forward_length")?,
            context: u("context_length")?,
            ln_eps: file.f64("gpt2.attention.layer_norm_epsilon").unwrap_or(1e-5),
        };
        cfg.validate().map_err(|e| ModelError::Malformed { path: file.path().to_path_buf(), reason: e.to_string() })?;
        let specs: Vec<WeightSpec> = weight_names(&cfg).into_iter().map(|(gg, _, s, _)| WeightSpec::plain(gg.clone(), gg, &s)).collect();
        let weights = weights::load(file, &specs, dtype, progress)?;
        let eos = vec![tokenizer.eos];
        Ok(Gpt2Model { cfg, page_size: PAGE_SIZE, dtype, weights, tokenizer, chat: None, eos, source: file.path().to_path_buf() })
    }

    /// The GPT-2 model of a Hugging Face folder (`config.json` keys `vocab_size`, `n_embd`,
    /// `n_layer`, `n_head`, `n_inner` (absent or null: `4·n_embd`), `n_positions`,
    /// `layer_norm_epsilon`, `bos_token_id`, `eos_token_id`; tensors named with or without
    /// the `transformer.` prefix, `Conv1D` matrices transposed on load).
    ///
    /// # Errors
    /// Missing or malformed `config.json` keys, missing tensors, tensors of an unsupported
    /// dtype, wrong shapes, an unreadable tokenizer.
    pub fn from_hf(mut folder: HfFolder, dtype: DType, progress: &mut dyn FnMut(usize, usize)) -> Result<Gpt2Model, ModelError> {
        let f = &folder;
        use serde_json::json;
        f.require("activation_function", &[json!("gelu_new"), json!("gelu_pytorch_tanh")], "the GPT-2 graph computes the tanh GELU")?;
        f.require("tie_word_embeddings", &[json!(true)], "the GPT-2 graph reads its output projection from wte")?;
        f.require("scale_attn_by_inverse_layer_idx", &[json!(false)], "the GPT-2 graph scales attention by 1/sqrt(head_dim) only")?;
        f.require("scale_attn_weights", &[json!(true)], "the GPT-2 graph scales attention by 1/sqrt(head_dim)")?;
        f.require("add_cross_attention", &[json!(false)], "the GPT-2 graph is a decoder without cross-attention")?;
        let hidden = f.usize("n_embd")?;
        let cfg = Gpt2Config {
            vocab: f.usize("vocab_size")?,
            hidden,
            n_layers: f.usize("n_layer")?,
            n_heads: f.usize("n_head")?,
            ffn: f.usize("n_inner").unwrap_or(4 * hidden),
            context: f.usize("n_positions")?,
            ln_eps: f.f64("layer_norm_epsilon").unwrap_or(1e-5),
        };
        cfg.validate().map_err(|e| f.malformed(e.to_string()))?;
        folder.read_tensors()?;
        // Named from any tensor, so that a missing one is reported with the folder's prefix.
        let prefix = if folder.names().any(|n| n.starts_with("transformer.")) { "transformer." } else { "" };
        let specs: Vec<WeightSpec> = weight_names(&cfg)
            .into_iter()
            .map(|(gg, hf, s, conv)| {
                let w = WeightSpec::plain(gg, format!("{prefix}{hf}"), &s);
                if conv {
                    w.then(Transform::Transpose)
                } else {
                    w
                }
            })
            .collect();
        let weights = weights::load(&folder, &specs, dtype, progress)?;
        let (bos, eos) = (folder.token_id("bos_token_id").unwrap_or(50256), folder.token_id("eos_token_id").unwrap_or(50256));
        let mut eos_all = folder.token_ids("eos_token_id");
        if eos_all.is_empty() {
            eos_all.push(eos);
        }
        let (tokenizer, chat) = folder.tokenizer(bos, eos)?;
        let chat = chat.source.is_some().then_some(chat);
        Ok(Gpt2Model { cfg, page_size: PAGE_SIZE, dtype, weights, tokenizer, chat, eos: eos_all, source: folder.dir().to_path_buf() })
    }
}

impl DecoderModel for Gpt2Model {
    fn architecture(&self) -> &str {
        "gpt2"
    }

    fn graph(&self, mode: Mode) -> Result<Graph, Error> {
        gpt2_paged::build(&self.cfg, mode, self.dtype, self.page_size)
    }

    fn kv(&self) -> KvGeometry {
        KvGeometry { layers: self.cfg.n_layers, kv_heads: self.cfg.n_heads, head_dim: self.cfg.head_dim(), page_size: self.page_size, dtype: self.dtype }
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
        self.chat.as_ref()
    }

    fn eos_tokens(&self) -> Vec<u32> {
        self.eos.clone()
    }

    fn source(&self) -> &Path {
        &self.source
    }
}
