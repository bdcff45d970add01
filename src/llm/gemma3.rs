//! Gemma 3 (text) as an instance of the decoder contract: [`crate::zoo::gemma3`]'s graphs, the
//! Hugging Face (`model_type` `gemma3_text`, or `gemma3` with the text model under
//! `text_config`) and GGUF (`general.architecture = "gemma3"`) weight maps, the tokenizer, the
//! chat template and the end-of-turn tokens.
//!
//! The graphs take every RMSNorm weight as Hugging Face stores it, `w` for a scale of `1 + w`;
//! llama.cpp's converter stores `w + 1` (`convert_hf_to_gguf.py`, `Gemma3Model.norm_shift`),
//! so the GGUF loader subtracts the 1 again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;

use super::chat::{ChatTemplate, Message};
use super::decoder::{DecoderModel, KvGeometry};
use super::gguf::{GgufFile, ModelError};
use super::hf::HfFolder;
use super::tokenizer::Tokenizer;
use super::weights::{self, Transform, WeightSpec};
use crate::zoo::gemma3::{self, Gemma3Config};
use crate::zoo::Mode;
use crate::{DType, Error, Graph, Tensor};

/// Tokens per KV-cache page of loaded Gemma 3 models.
const PAGE_SIZE: usize = 16;

/// A Gemma 3 text model: config, weights (GGUF names, `[out, in]` matrices, norm weights `w`
/// of `1 + w`), tokenizer.
pub struct Gemma3Model {
    /// Hyper-parameters.
    pub cfg: Gemma3Config,
    /// Storage dtype of the weights and activations.
    pub dtype: DType,
    /// Weights by GGUF name ([`crate::zoo::gemma3`] lists them).
    pub weights: BTreeMap<String, Arc<Tensor>>,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template, if the model has one.
    pub chat: Option<ChatTemplate>,
    /// End-of-sequence tokens (`<eos>` and `<end_of_turn>` for Gemma's own vocabulary).
    pub eos: Vec<u32>,
    /// Where the model was loaded from.
    pub source: PathBuf,
}

/// GGUF name → Hugging Face name (under `model.layers.{i}.`), for one layer's tensors.
const LAYER_NAMES: [(&str, &str); 13] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("attn_output", "self_attn.o_proj"),
    ("post_attention_norm", "post_attention_layernorm"),
    ("ffn_norm", "pre_feedforward_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
    ("post_ffw_norm", "post_feedforward_layernorm"),
];

/// The weights of `cfg`'s graphs: `(GGUF name, Hugging Face name without the `model.` prefix,
/// shape)`; `lm_head.weight` is named in full.
fn weight_names(cfg: &Gemma3Config) -> Vec<(String, String, Vec<usize>)> {
    let (d, hd, qd, kvd) = (cfg.hidden, cfg.head_dim, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim);
    let mut w = vec![("token_embd.weight".into(), "embed_tokens.weight".into(), vec![cfg.vocab, d]), ("output_norm.weight".into(), "norm.weight".into(), vec![d])];
    if !cfg.tied_embeddings {
        w.push(("output.weight".into(), "lm_head.weight".into(), vec![cfg.vocab, d]));
    }
    for i in 0..cfg.n_layers() {
        for (gg, hf) in LAYER_NAMES {
            let shape = match gg {
                "attn_q" => vec![qd, d],
                "attn_k" | "attn_v" => vec![kvd, d],
                "attn_q_norm" | "attn_k_norm" => vec![hd],
                "attn_output" => vec![d, qd],
                "ffn_gate" | "ffn_up" => vec![cfg.ffn, d],
                "ffn_down" => vec![d, cfg.ffn],
                _ => vec![d],
            };
            w.push((format!("blk.{i}.{gg}.weight"), format!("layers.{i}.{hf}.weight"), shape));
        }
    }
    w
}

/// The text part of a Gemma 3 `config.json`: the object itself (`gemma3_text`) or its
/// `text_config` (`gemma3`), with the key prefix for messages.
struct TextConfig<'a> {
    folder: &'a HfFolder,
    json: &'a Json,
    prefix: &'static str,
}

impl TextConfig<'_> {
    fn get(&self, key: &str) -> Option<&Json> {
        self.json.get(key).filter(|v| !v.is_null())
    }
    fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.get(key).and_then(Json::as_u64).map(|v| v as usize).ok_or_else(|| self.folder.missing(&format!("{}{key}", self.prefix), "an unsigned integer"))
    }
    /// `key`, or Hugging Face's default when absent (`Gemma3TextConfig`).
    fn usize_or(&self, key: &str, default: usize) -> Result<usize, ModelError> {
        if self.get(key).is_none() {
            return Ok(default);
        }
        self.usize(key)
    }
    fn f64_or(&self, key: &str, default: f64) -> Result<f64, ModelError> {
        match self.get(key) {
            None => Ok(default),
            Some(v) => v.as_f64().ok_or_else(|| self.folder.missing(&format!("{}{key}", self.prefix), "a number")),
        }
    }
    fn opt_f64(&self, key: &str) -> Result<Option<f64>, ModelError> {
        self.get(key).map(|v| v.as_f64().ok_or_else(|| self.folder.missing(&format!("{}{key}", self.prefix), "a number or null"))).transpose()
    }
    fn bad(&self, key: &str, reason: String) -> ModelError {
        self.folder.malformed(format!("`{}{key}`: {reason}", self.prefix))
    }
}

/// `(θ, linear factor)` of one RoPE parameter object (`rope_type`/`type` `default` or
/// `linear`), the θ defaulting to `theta`.
fn rope_params(tc: &TextConfig<'_>, key: &str, v: &Json, theta: f64) -> Result<(f64, Option<f64>), ModelError> {
    let theta = v.get("rope_theta").and_then(Json::as_f64).unwrap_or(theta);
    let kind = v.get("rope_type").or_else(|| v.get("type")).and_then(Json::as_str).unwrap_or("default");
    match kind {
        "default" => Ok((theta, None)),
        "linear" => v.get("factor").and_then(Json::as_f64).map(|f| (theta, Some(f))).ok_or_else(|| tc.bad(key, "a linear RoPE scaling needs a numeric `factor`".into())),
        other => Err(tc.bad(key, format!("RoPE type `{other}` is not supported for Gemma 3 (supported: default, linear)"))),
    }
}

/// Reads the Gemma 3 config of the text model (Hugging Face's `Gemma3TextConfig` and its
/// defaults for absent keys; `hidden_size`, `intermediate_size` and `num_hidden_layers`
/// required).
fn config_from_hf(tc: &TextConfig<'_>, tied: bool) -> Result<Gemma3Config, ModelError> {
    let n_layers = tc.usize("num_hidden_layers")?;
    for (key, ok) in [("use_bidirectional_attention", false), ("attention_bias", false)] {
        if tc.get(key).and_then(Json::as_bool).is_some_and(|b| b != ok) {
            return Err(tc.bad(key, format!("Gemma 3 with `{key} = {}` is not supported", !ok)));
        }
    }
    let sliding: Vec<bool> = match tc.get("layer_types") {
        Some(Json::Array(a)) => a
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(true),
                Some("full_attention") => Ok(false),
                _ => Err(tc.bad("layer_types", format!("{t} is neither \"sliding_attention\" nor \"full_attention\""))),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(tc.bad("layer_types", format!("{other} is not a list"))),
        // Older configs: every `sliding_window_pattern`-th layer is full (transformers' default 6).
        None => {
            let pattern = tc.usize_or("sliding_window_pattern", 6)?;
            if pattern == 0 {
                return Err(tc.bad("sliding_window_pattern", "0: every layer would be sliding and none full; it must be at least 1".into()));
            }
            (0..n_layers).map(|i| (i + 1) % pattern != 0).collect()
        }
    };
    if sliding.len() != n_layers {
        return Err(tc.bad("layer_types", format!("{} entries for {n_layers} layers (`num_hidden_layers`)", sliding.len())));
    }
    let (mut theta, mut local_theta) = (tc.f64_or("rope_theta", 1e6)?, tc.f64_or("rope_local_base_freq", 1e4)?);
    let mut factor = match tc.get("rope_scaling") {
        Some(v) => rope_params(tc, "rope_scaling", v, theta)?.1,
        None => None,
    };
    // Newer transformers: `rope_parameters` per layer type.
    if let Some(p) = tc.get("rope_parameters") {
        if let Some(full) = p.get("full_attention") {
            (theta, factor) = rope_params(tc, "rope_parameters.full_attention", full, theta)?;
        } else if p.get("rope_theta").is_some() {
            (theta, factor) = rope_params(tc, "rope_parameters", p, theta)?;
        }
        if let Some(local) = p.get("sliding_attention") {
            let (t, f) = rope_params(tc, "rope_parameters.sliding_attention", local, local_theta)?;
            if f.is_some() {
                return Err(tc.bad("rope_parameters.sliding_attention", "a scaled RoPE on the sliding layers is not supported".into()));
            }
            local_theta = t;
        }
    }
    let gelu_form = match tc.get("hidden_activation").or_else(|| tc.get("hidden_act")).and_then(Json::as_str).unwrap_or("gelu_pytorch_tanh") {
        "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast" => "tanh",
        "gelu" => "erf",
        other => return Err(tc.bad("hidden_activation", format!("`{other}` is not supported (supported: gelu_pytorch_tanh, gelu)"))),
    };
    let cfg = Gemma3Config {
        vocab: tc.usize_or("vocab_size", 262208)?,
        hidden: tc.usize("hidden_size")?,
        n_heads: tc.usize_or("num_attention_heads", 8)?,
        n_kv_heads: tc.usize_or("num_key_value_heads", 4)?,
        head_dim: tc.usize_or("head_dim", 256)?,
        ffn: tc.usize("intermediate_size")?,
        rms_eps: tc.f64_or("rms_norm_eps", 1e-6)?,
        query_pre_attn_scalar: tc.f64_or("query_pre_attn_scalar", 256.0)?,
        sliding_window: tc.usize_or("sliding_window", 4096)?,
        sliding,
        rope_theta: theta,
        rope_local_theta: local_theta,
        rope_linear_factor: factor,
        attn_softcap: tc.opt_f64("attn_logit_softcapping")?,
        final_softcap: tc.opt_f64("final_logit_softcapping")?,
        gelu_form,
        context: tc.usize_or("max_position_embeddings", 131072)?,
        page_size: PAGE_SIZE,
        tied_embeddings: tied,
    };
    cfg.validate().map_err(|e| tc.folder.malformed(e.to_string()))?;
    Ok(cfg)
}

/// The id of the token spelled `text`, if the vocabulary has it.
fn token_id(tokenizer: &Tokenizer, text: &str) -> Option<u32> {
    (0..tokenizer.vocab_size() as u32).find(|&i| tokenizer.token(i) == Some(text))
}

/// `ids` plus Gemma's end tokens (`<eos>`, `<end_of_turn>`) where the vocabulary has them,
/// without repeats.
fn with_end_tokens(mut ids: Vec<u32>, tokenizer: &Tokenizer) -> Vec<u32> {
    for t in ["<eos>", "<end_of_turn>"] {
        if let Some(id) = token_id(tokenizer, t) {
            ids.push(id);
        }
    }
    let mut seen = std::collections::BTreeSet::new();
    ids.retain(|i| seen.insert(*i));
    ids
}

impl Gemma3Model {
    /// The Gemma 3 model of a Hugging Face folder: `model_type` `gemma3_text` (keys at the top
    /// level, tensors `model.*`) or `gemma3` (keys under `text_config`, tensors
    /// `language_model.model.*` or `model.language_model.*`; the vision tower is not read).
    /// Keys: `hidden_size`, `intermediate_size`, `num_hidden_layers` (required);
    /// `vocab_size`, `num_attention_heads`, `num_key_value_heads`, `head_dim`,
    /// `rms_norm_eps`, `query_pre_attn_scalar`, `sliding_window`, `layer_types` (or
    /// `sliding_window_pattern`), `rope_theta`, `rope_local_base_freq`, `rope_scaling` (or
    /// `rope_parameters`), `attn_logit_softcapping`, `final_logit_softcapping`,
    /// `hidden_activation`, `max_position_embeddings`, `tie_word_embeddings` (Hugging Face's
    /// defaults when absent). End tokens: `eos_token_id` of the config and of
    /// `generation_config.json`, `<eos>` and `<end_of_turn>`; BOS is added to encoded text
    /// when `tokenizer_config.json` says `add_bos_token`; the chat template is
    /// `tokenizer_config.json`'s `chat_template`, else `chat_template.jinja` or
    /// `chat_template.json`.
    ///
    /// # Errors
    /// Missing or malformed keys (named, with `text_config.` where they were looked up there),
    /// an unsupported RoPE type, activation or bidirectional attention, missing tensors, wrong
    /// shapes, tensors of an unsupported dtype, an unreadable tokenizer.
    pub fn from_hf(mut folder: HfFolder, dtype: DType, progress: &mut dyn FnMut(usize, usize)) -> Result<Gemma3Model, ModelError> {
        let multimodal = folder.model_type() == Some("gemma3");
        let text = if multimodal { folder.config.get("text_config").cloned().ok_or_else(|| folder.missing("text_config", "an object (the text model of a `gemma3` config)"))? } else { folder.config.clone() };
        let tied = text.get("tie_word_embeddings").or_else(|| folder.config.get("tie_word_embeddings")).and_then(Json::as_bool).unwrap_or(true);
        let cfg = config_from_hf(&TextConfig { folder: &folder, json: &text, prefix: if multimodal { "text_config." } else { "" } }, tied)?;
        folder.read_tensors()?;
        let prefix = ["model.", "language_model.model.", "model.language_model."].into_iter().find(|p| folder.has(&format!("{p}embed_tokens.weight"))).unwrap_or("model.");
        let head_prefix = if prefix == "language_model.model." { "language_model." } else { "" };
        let specs: Vec<WeightSpec> = weight_names(&cfg)
            .into_iter()
            .map(|(gg, hf, s)| {
                let stored = if hf == "lm_head.weight" { format!("{head_prefix}{hf}") } else { format!("{prefix}{hf}") };
                WeightSpec::plain(gg, stored, &s)
            })
            .collect();
        let weights = weights::load(&folder, &specs, dtype, progress)?;
        let id = |key: &str| folder.token_id(key).or_else(|| text.get(key).and_then(Json::as_u64).map(|v| v as u32));
        let (bos, eos) = (id("bos_token_id").unwrap_or(2), id("eos_token_id").unwrap_or(1));
        let (mut tokenizer, mut chat) = folder.tokenizer(bos, eos)?;
        // Newer folders keep the template beside `tokenizer_config.json`.
        if chat.source.is_none() {
            let dir = folder.dir();
            chat.source = std::fs::read_to_string(dir.join("chat_template.jinja")).ok().or_else(|| {
                let j: Json = serde_json::from_str(&std::fs::read_to_string(dir.join("chat_template.json")).ok()?).ok()?;
                j.get("chat_template").and_then(Json::as_str).map(str::to_string)
            });
        }
        let tc: Option<Json> = std::fs::read_to_string(folder.dir().join("tokenizer_config.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        tokenizer.add_bos = tc.as_ref().and_then(|t| t.get("add_bos_token")).and_then(Json::as_bool).unwrap_or(false);
        let mut eos_ids = folder.token_ids("eos_token_id");
        let generation: Option<Json> = std::fs::read_to_string(folder.dir().join("generation_config.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        match generation.as_ref().and_then(|g| g.get("eos_token_id")) {
            Some(Json::Array(a)) => eos_ids.extend(a.iter().filter_map(Json::as_u64).map(|v| v as u32)),
            Some(v) => eos_ids.extend(v.as_u64().map(|v| v as u32)),
            None => {}
        }
        eos_ids.push(eos);
        let eos = with_end_tokens(eos_ids, &tokenizer);
        let chat = chat.source.is_some().then_some(chat);
        Ok(Gemma3Model { cfg, dtype, weights, tokenizer, chat, eos, source: folder.dir().to_path_buf() })
    }

    /// The Gemma 3 model of an open GGUF file (`general.architecture = "gemma3"`; keys
    /// `gemma3.{embedding_length, block_count, feed_forward_length, attention.head_count,
    /// attention.head_count_kv, attention.key_length, attention.layer_norm_rms_epsilon,
    /// attention.sliding_window, context_length, rope.freq_base}`, optional
    /// `rope.scaling.type`/`rope.scaling.factor` and `final_logit_softcapping`; llama.cpp's
    /// tensor names). As llama.cpp reads these files: every 6th layer is full (or
    /// `attention.sliding_window_pattern` when the file has it), the sliding layers' RoPE base
    /// is 10 000, and the attention scale is `key_length^-½` except for the 62-layer (27B)
    /// model, whose `query_pre_attn_scalar` is `hidden / heads`. The norm weights, stored as
    /// `w + 1`, are read back as `w`. Every tensor is dequantised to `dtype` as it loads
    /// (Q4_K, Q6_K, Q5_0 and Q8_0 in the published Q4_K_M file; no kernel reads k-quant
    /// blocks).
    ///
    /// # Errors
    /// Missing keys or tensors, unsupported tensor types, shapes that disagree with the
    /// metadata, an invalid config, a tokenizer sinter cannot build.
    pub fn from_gguf(file: &GgufFile, dtype: DType, progress: &mut dyn FnMut(usize, usize)) -> Result<Gemma3Model, ModelError> {
        let path = file.path().to_path_buf();
        let k = |s: &str| format!("gemma3.{s}");
        let u = |s: &str| file.u64(&k(s)).map(|v| v as usize);
        let hidden = u("embedding_length")?;
        let n_layers = u("block_count")?;
        let n_heads = u("attention.head_count")?;
        let head_dim = u("attention.key_length").unwrap_or(256);
        let sliding: Vec<bool> = match file.metadata().get(&k("attention.sliding_window_pattern")) {
            Some(Json::Array(a)) => a.iter().map(|v| v.as_bool().or_else(|| v.as_i64().map(|x| x != 0)).unwrap_or(true)).collect(),
            Some(v) => {
                let p = v.as_u64().unwrap_or(6).max(1) as usize;
                (0..n_layers).map(|i| (i + 1) % p != 0).collect()
            }
            None => (0..n_layers).map(|i| (i + 1) % 6 != 0).collect(),
        };
        if sliding.len() != n_layers {
            return Err(ModelError::BadValue { path, key: k("attention.sliding_window_pattern"), value: format!("{} entries", sliding.len()), reason: format!("the model has {n_layers} layers") });
        }
        let factor = match file.str(&k("rope.scaling.type")) {
            Ok("linear") => Some(file.f64(&k("rope.scaling.factor"))?),
            Ok("none") | Err(_) => None,
            Ok(other) => return Err(ModelError::BadValue { path, key: k("rope.scaling.type"), value: other.into(), reason: "not supported for Gemma 3 (supported: none, linear)".into() }),
        };
        let tokenizer = Tokenizer::from_gguf(file)?;
        let vocab = file.info("token_embd.weight").and_then(|t| t.shape.first().copied()).unwrap_or(tokenizer.vocab_size());
        let cfg = Gemma3Config {
            vocab,
            hidden,
            n_heads,
            n_kv_heads: u("attention.head_count_kv").unwrap_or(n_heads),
            head_dim,
            ffn: u("feed_forward_length")?,
            rms_eps: file.f64(&k("attention.layer_norm_rms_epsilon")).unwrap_or(1e-6),
            query_pre_attn_scalar: if n_layers == 62 { (hidden / n_heads.max(1)) as f64 } else { head_dim as f64 },
            sliding_window: u("attention.sliding_window")?,
            sliding,
            rope_theta: file.f64(&k("rope.freq_base")).unwrap_or(1e6),
            rope_local_theta: 1e4,
            rope_linear_factor: factor,
            attn_softcap: file.f64(&k("attn_logit_softcapping")).ok(),
            final_softcap: file.f64(&k("final_logit_softcapping")).ok(),
            gelu_form: "tanh",
            context: u("context_length")?,
            page_size: PAGE_SIZE,
            tied_embeddings: file.info("output.weight").is_none(),
        };
        cfg.validate().map_err(|e| ModelError::Malformed { path: path.clone(), reason: e.to_string() })?;
        let specs: Vec<WeightSpec> = weight_names(&cfg)
            .into_iter()
            .map(|(gg, _, s)| {
                let w = WeightSpec::plain(gg.clone(), gg.clone(), &s);
                if gg.ends_with("norm.weight") {
                    w.then(Transform::Add(-1.0))
                } else {
                    w
                }
            })
            .collect();
        let weights = weights::load(file, &specs, dtype, progress)?;
        let tokens = file.strings("tokenizer.ggml.tokens").unwrap_or_default();
        let name = |key: &str| file.u64(key).ok().and_then(|i| tokens.get(i as usize).map(|t| t.to_string())).unwrap_or_default();
        let chat = file.str("tokenizer.chat_template").ok().map(|s| ChatTemplate {
            source: Some(s.to_string()),
            bos_token: name("tokenizer.ggml.bos_token_id"),
            eos_token: name("tokenizer.ggml.eos_token_id"),
        });
        let eos = with_end_tokens(vec![tokenizer.eos], &tokenizer);
        Ok(Gemma3Model { cfg, dtype, weights, tokenizer, chat, eos, source: path })
    }
}

impl DecoderModel for Gemma3Model {
    fn architecture(&self) -> &str {
        "gemma3"
    }

    fn graph(&self, mode: Mode) -> Result<Graph, Error> {
        gemma3::build(&self.cfg, mode, self.dtype)
    }

    fn kv(&self) -> KvGeometry {
        KvGeometry { layers: self.cfg.n_layers(), kv_heads: self.cfg.n_kv_heads, head_dim: self.cfg.head_dim, page_size: self.cfg.page_size, dtype: self.dtype }
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

    /// As the default, but Gemma's template writes `<bos>` itself: the tokenizer's own BOS is
    /// not added a second time.
    fn chat_prompt(&self, user_text: &str) -> Result<Vec<u32>, ModelError> {
        let chat = self.chat.as_ref().ok_or_else(|| ModelError::Tokenizer { path: self.source.clone(), reason: "the model has no chat template: feed the prompt as plain text".into() })?;
        let text = chat.render(&[Message { role: "user".into(), content: user_text.into() }])?;
        let mut ids = self.tokenizer.encode(&text)?;
        if self.tokenizer.add_bos && ids.len() >= 2 && ids[0] == self.tokenizer.bos && ids[1] == self.tokenizer.bos {
            ids.remove(0);
        }
        Ok(ids)
    }
}
