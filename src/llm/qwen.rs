//! Qwen2 and Qwen3 models as an instance of the decoder contract: the zoo's
//! [`crate::zoo::qwen`] graphs, the GGUF and Hugging Face weight maps, the tokenizer, the chat
//! template and the end-of-sequence tokens.
//!
//! Neither Hugging Face nor llama.cpp reorders Qwen's `q_proj`/`k_proj` rows (llama.cpp's
//! converter permutes them for Llama only, and runs Qwen with the NeoX RoPE), so both kinds
//! of file run with the `rotate_half` RoPE form.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value as Json;

use super::chat::ChatTemplate;
use super::decoder::{DecoderModel, KvGeometry};
use super::gguf::{GgufFile, ModelError};
use super::hf::HfFolder;
use super::tokenizer::Tokenizer;
use super::weights::{self, WeightSpec};
use crate::zoo::qwen::{self, QwenArch, QwenConfig, RopeScaling};
use crate::zoo::Mode;
use crate::{DType, Error, Graph, Tensor};

/// A Qwen2 or Qwen3 model loaded from GGUF or a Hugging Face folder: config, weights,
/// tokenizer.
pub struct QwenModel {
    /// Hyper-parameters read from the file.
    pub cfg: QwenConfig,
    /// Storage dtype of the weights and activations.
    pub dtype: DType,
    /// Weights by GGUF name, shared between the prefill and decode programs.
    pub weights: BTreeMap<String, Arc<Tensor>>,
    /// The model's tokenizer.
    pub tokenizer: Tokenizer,
    /// The chat template (`source: None` for a base model without one).
    pub chat: ChatTemplate,
    /// Tokens that end a sequence.
    pub eos: Vec<u32>,
    /// Where the model was loaded from.
    pub source: PathBuf,
}

/// GGUF name → Hugging Face name of one layer's tensors (without `.weight`/`.bias`).
const LAYER_NAMES: [(&str, &str); 11] = [
    ("attn_norm", "input_layernorm"),
    ("attn_q", "self_attn.q_proj"),
    ("attn_k", "self_attn.k_proj"),
    ("attn_v", "self_attn.v_proj"),
    ("attn_q_norm", "self_attn.q_norm"),
    ("attn_k_norm", "self_attn.k_norm"),
    ("attn_output", "self_attn.o_proj"),
    ("ffn_norm", "post_attention_layernorm"),
    ("ffn_gate", "mlp.gate_proj"),
    ("ffn_up", "mlp.up_proj"),
    ("ffn_down", "mlp.down_proj"),
];

/// The weights of `cfg`'s graphs: `(GGUF name, Hugging Face name, shape)`, the biases and
/// q/k norms only where the config has them, `output.weight`/`lm_head.weight` only when the
/// embeddings are not tied.
pub fn weight_names(cfg: &QwenConfig) -> Vec<(String, String, Vec<usize>)> {
    let (d, hd, qd, kvd, f) = (
        cfg.hidden,
        cfg.head_dim,
        cfg.n_heads * cfg.head_dim,
        cfg.n_kv_heads * cfg.head_dim,
        cfg.ffn,
    );
    let mut w = vec![
        (
            "token_embd.weight".into(),
            "model.embed_tokens.weight".into(),
            vec![cfg.vocab, d],
        ),
        (
            "output_norm.weight".into(),
            "model.norm.weight".into(),
            vec![d],
        ),
    ];
    if !cfg.tied_embeddings {
        w.push((
            "output.weight".into(),
            "lm_head.weight".into(),
            vec![cfg.vocab, d],
        ));
    }
    for i in 0..cfg.n_layers {
        for (gg, hf) in LAYER_NAMES {
            let (shape, bias) = match gg {
                "attn_norm" | "ffn_norm" => (vec![d], None),
                "attn_q" => (vec![qd, d], cfg.qkv_bias.then_some(qd)),
                "attn_k" | "attn_v" => (vec![kvd, d], cfg.qkv_bias.then_some(kvd)),
                "attn_q_norm" | "attn_k_norm" if cfg.qk_norm => (vec![hd], None),
                "attn_q_norm" | "attn_k_norm" => continue,
                "attn_output" => (vec![d, qd], cfg.o_bias.then_some(d)),
                "ffn_gate" | "ffn_up" => (vec![f, d], None),
                _ => (vec![d, f], None),
            };
            w.push((
                format!("blk.{i}.{gg}.weight"),
                format!("model.layers.{i}.{hf}.weight"),
                shape,
            ));
            if let Some(b) = bias {
                w.push((
                    format!("blk.{i}.{gg}.bias"),
                    format!("model.layers.{i}.{hf}.bias"),
                    vec![b],
                ));
            }
        }
    }
    w
}

/// A `config.json` value that is out of range or of a kind sinter does not run.
fn bad_value(folder: &HfFolder, key: &str, value: &Json, reason: String) -> ModelError {
    ModelError::BadValue {
        path: folder.dir().join("config.json"),
        key: key.to_string(),
        value: value.to_string(),
        reason,
    }
}

/// The RoPE parameters of a Hugging Face config: `rope_scaling` (transformers 4) or
/// `rope_parameters` (transformers 5, which also holds `rope_theta`), by `rope_type` (or the
/// older `type`); the name of the key they came from.
fn hf_rope_object(folder: &HfFolder) -> Result<Option<(&'static str, &Json)>, ModelError> {
    for key in ["rope_scaling", "rope_parameters"] {
        match folder.config.get(key) {
            None | Some(Json::Null) => {}
            Some(v @ Json::Object(_)) => return Ok(Some((key, v))),
            Some(v) => {
                return Err(bad_value(
                    folder,
                    key,
                    v,
                    "expected an object or null".into(),
                ))
            }
        }
    }
    Ok(None)
}

/// RoPE θ: `rope_theta`, else `rope_parameters.rope_theta` (transformers 5), else 10000.
pub(super) fn hf_rope_theta(folder: &HfFolder) -> f64 {
    let nested = || {
        folder
            .config
            .get("rope_parameters")
            .and_then(|r| r.get("rope_theta"))
            .and_then(Json::as_f64)
    };
    folder
        .config
        .get("rope_theta")
        .and_then(Json::as_f64)
        .or_else(nested)
        .unwrap_or(10000.0)
}

/// The RoPE scaling of a Hugging Face config (see [`hf_rope_object`]).
///
/// # Errors
/// [`ModelError::BadValue`] for a type the `rope` op lacks (`dynamic`, `longrope`, ...) or a
/// value that is not an object; [`ModelError::MissingKey`] for a parameter the type needs.
pub(super) fn hf_rope_scaling(folder: &HfFolder, context: usize) -> Result<RopeScaling, ModelError> {
    let Some((key, rs)) = hf_rope_object(folder)? else {
        return Ok(RopeScaling::None);
    };
    // transformers 5's `rope_parameters` holds `rope_theta` alone for unscaled models; a
    // scaling parameter without a type is an error, not silently no scaling.
    let kind = match rs.get("rope_type").or_else(|| rs.get("type")).and_then(Json::as_str) {
        Some(kind) => kind,
        None if rs.get("factor").is_some() => return Err(folder.missing(&format!("{key}.rope_type"), "a string")),
        None => "default",
    };
    // Every scaling factor of the config is a finite number above 0.
    let num = |k: &str| -> Result<f64, ModelError> {
        let v = rs
            .get(k)
            .and_then(Json::as_f64)
            .ok_or_else(|| folder.missing(&format!("{key}.{k}"), "a number"))?;
        if !(v.is_finite() && v > 0.0) {
            return Err(bad_value(folder, &format!("{key}.{k}"), &rs[k], "must be a finite number above 0".into()));
        }
        Ok(v)
    };
    let opt = |k: &str| rs.get(k).and_then(Json::as_f64);
    let orig = || {
        rs.get("original_max_position_embeddings")
            .and_then(Json::as_u64)
            .map(|v| v as usize)
    };
    Ok(match kind {
        "default" => RopeScaling::None,
        "linear" => RopeScaling::Linear {
            factor: num("factor")?,
        },
        "llama3" => RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: orig().ok_or_else(|| {
                folder.missing(
                    &format!("{key}.original_max_position_embeddings"),
                    "an unsigned integer",
                )
            })?,
        },
        "yarn" => RopeScaling::Yarn {
            factor: num("factor")?,
            original_max_position_embeddings: orig().unwrap_or(context),
            beta_fast: opt("beta_fast"),
            beta_slow: opt("beta_slow"),
            truncate: rs.get("truncate").and_then(Json::as_bool),
            mscale: opt("mscale"),
            mscale_all_dim: opt("mscale_all_dim"),
            attention_factor: opt("attention_factor"),
        },
        other => {
            return Err(bad_value(
                folder,
                &format!("{key}.rope_type"),
                &Json::String(other.into()),
                "sinter's `rope` op has the scalings default, linear, llama3 and yarn".into(),
            ));
        }
    })
}

/// Each layer's sliding window from a Hugging Face config: none unless `use_sliding_window`;
/// then layer `i` slides when `layer_types[i]` is `"sliding_attention"`, or (without
/// `layer_types`) when `i ≥ max_window_layers`, as `Qwen2Config` decides.
fn hf_windows(folder: &HfFolder, n_layers: usize) -> Result<Vec<Option<usize>>, ModelError> {
    let Some(value) = folder
        .bool("use_sliding_window")
        .filter(|&u| u)
        .and_then(|_| folder.config.get("sliding_window"))
        .filter(|v| !v.is_null())
    else {
        return Ok(vec![]);
    };
    let w = value.as_u64().filter(|&w| w > 0).ok_or_else(|| {
        bad_value(folder, "sliding_window", value, "must be a whole number of keys above 0 when `use_sliding_window` is true".into())
    })? as usize;
    if let Some(types) = folder.config.get("layer_types").and_then(Json::as_array) {
        if types.len() != n_layers {
            return Err(folder.malformed(format!(
                "`layer_types` has {} entries for {n_layers} layers",
                types.len()
            )));
        }
        return types
            .iter()
            .map(|t| match t.as_str() {
                Some("sliding_attention") => Ok(Some(w)),
                Some("full_attention") => Ok(None),
                _ => Err(bad_value(folder, "layer_types", t, "each entry is \"sliding_attention\" or \"full_attention\"".into())),
            })
            .collect();
    }
    let first = folder.usize("max_window_layers").unwrap_or(n_layers);
    Ok((0..n_layers).map(|i| (i >= first).then_some(w)).collect())
}

/// The token ids of `key` in `dir/generation_config.json`, if that file exists.
fn generation_ids(dir: &Path, key: &str) -> Vec<u32> {
    let Some(j) = std::fs::read_to_string(dir.join("generation_config.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Json>(&t).ok())
    else {
        return vec![];
    };
    match j.get(key) {
        Some(Json::Array(a)) => a
            .iter()
            .filter_map(Json::as_u64)
            .map(|v| v as u32)
            .collect(),
        Some(v) => v.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
        None => vec![],
    }
}

impl QwenModel {
    /// The Qwen model of a Hugging Face folder (`model_type` `qwen2` or `qwen3`; keys
    /// `vocab_size`, `hidden_size`, `num_hidden_layers`, `num_attention_heads`,
    /// `num_key_value_heads`, `head_dim`, `intermediate_size`, `hidden_act` (`silu`),
    /// `rope_theta`, `rope_scaling` (or transformers 5's `rope_parameters`), `rms_norm_eps`, `max_position_embeddings`,
    /// `tie_word_embeddings`, `attention_bias` (Qwen3), `use_sliding_window`,
    /// `sliding_window`, `max_window_layers`, `layer_types`, `bos_token_id`,
    /// `eos_token_id`); the end-of-sequence tokens are `eos_token_id` of `config.json` and
    /// of `generation_config.json`; the chat template comes from `tokenizer_config.json`.
    ///
    /// # Errors
    /// Another `model_type`; missing or malformed keys ([`ModelError::MissingKey`]); a
    /// `rope_scaling` type the `rope` op lacks or a `hidden_act` other than `silu`
    /// ([`ModelError::BadValue`]); missing tensors, tensors of an unsupported dtype, shapes
    /// that disagree with the config (each naming the tensor); an unreadable tokenizer.
    pub fn from_hf(
        mut folder: HfFolder,
        dtype: DType,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<QwenModel, ModelError> {
        let f = &folder;
        let arch = match f.model_type() {
            Some("qwen2") => QwenArch::Qwen2,
            Some("qwen3") => QwenArch::Qwen3,
            other => {
                return Err(ModelError::UnsupportedArchitecture {
                    path: f.dir().join("config.json"),
                    arch: other.unwrap_or("").into(),
                    supported: "qwen2, qwen3".into(),
                })
            }
        };
        if let Some(act) = f
            .config
            .get("hidden_act")
            .filter(|a| a.as_str() != Some("silu"))
        {
            return Err(bad_value(
                f,
                "hidden_act",
                act,
                "Qwen's MLP is written with silu".into(),
            ));
        }
        let hidden = f.usize("hidden_size")?;
        let n_heads = f.usize("num_attention_heads")?;
        let n_layers = f.usize("num_hidden_layers")?;
        let context = f.usize("max_position_embeddings")?;
        let bias = f.bool("attention_bias").unwrap_or(false);
        let cfg = QwenConfig {
            arch,
            vocab: f.usize("vocab_size")?,
            hidden,
            n_layers,
            n_heads,
            n_kv_heads: f.usize("num_key_value_heads").unwrap_or(n_heads),
            head_dim: match f.config.get("head_dim") {
                None | Some(Json::Null) => hidden / n_heads.max(1),
                Some(_) => f.usize("head_dim")?,
            },
            ffn: f.usize("intermediate_size")?,
            rope_theta: hf_rope_theta(f),
            rope_scaling: hf_rope_scaling(f, context)?,
            rms_eps: f.f64("rms_norm_eps").unwrap_or(1e-6),
            context,
            page_size: 16,
            tied_embeddings: f.bool("tie_word_embeddings").unwrap_or(false),
            qkv_bias: arch == QwenArch::Qwen2 || bias,
            o_bias: arch == QwenArch::Qwen3 && bias,
            qk_norm: arch == QwenArch::Qwen3,
            windows: hf_windows(f, n_layers)?,
        };
        cfg.validate().map_err(|e| f.malformed(e.to_string()))?;
        check_rope(&cfg).map_err(|e| f.malformed(e.to_string()))?;
        folder.read_tensors()?;
        let specs: Vec<WeightSpec> = weight_names(&cfg)
            .into_iter()
            .map(|(gg, hf, s)| WeightSpec::plain(gg, hf, &s))
            .collect();
        let weights = weights::load(&folder, &specs, dtype, progress)?;
        let mut eos = folder.token_ids("eos_token_id");
        for t in generation_ids(folder.dir(), "eos_token_id") {
            if !eos.contains(&t) {
                eos.push(t);
            }
        }
        let bos = folder
            .token_id("bos_token_id")
            .or_else(|| eos.first().copied())
            .unwrap_or(0);
        let (tokenizer, chat) = folder.tokenizer(bos, eos.first().copied().unwrap_or(bos))?;
        Ok(QwenModel {
            cfg,
            dtype,
            weights,
            tokenizer,
            chat,
            eos,
            source: folder.dir().to_path_buf(),
        })
    }

    /// The Qwen model of an open GGUF file (`general.architecture` `qwen2` or `qwen3`; keys
    /// `{arch}.embedding_length`, `block_count`, `attention.head_count`,
    /// `attention.head_count_kv`, `attention.key_length` (head dim), `feed_forward_length`,
    /// `rope.freq_base`, `rope.scaling.type` (`none`, `linear`, `yarn`) with
    /// `rope.scaling.factor` and `rope.scaling.original_context_length`,
    /// `attention.layer_norm_rms_epsilon`, `context_length`); the tokenizer and chat template
    /// from the file; tied embeddings when `output.weight` is absent; Qwen3's q/k/v biases
    /// when `blk.0.attn_q.bias` is present.
    ///
    /// # Errors
    /// Missing keys or tensors, unsupported tensor types, shapes that disagree with the
    /// metadata, a RoPE scaling type other than those above, an unreadable tokenizer.
    pub fn from_gguf(
        file: &GgufFile,
        dtype: DType,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<QwenModel, ModelError> {
        let path = file.path().to_path_buf();
        let arch_name = file.str("general.architecture")?.to_string();
        let arch = match arch_name.as_str() {
            "qwen2" => QwenArch::Qwen2,
            "qwen3" => QwenArch::Qwen3,
            _ => {
                return Err(ModelError::UnsupportedArchitecture {
                    path,
                    arch: arch_name,
                    supported: "qwen2, qwen3".into(),
                })
            }
        };
        let k = |s: &str| format!("{arch_name}.{s}");
        let u = |s: &str| file.u64(&k(s)).map(|v| v as usize);
        let hidden = u("embedding_length")?;
        let n_heads = u("attention.head_count")?;
        let context = u("context_length")?;
        let tokenizer = Tokenizer::from_gguf(file)?;
        let rope_scaling = match file.str(&k("rope.scaling.type")).unwrap_or("none") {
            "none" => RopeScaling::None,
            "linear" => RopeScaling::Linear {
                factor: file.f64(&k("rope.scaling.factor"))?,
            },
            "yarn" => RopeScaling::Yarn {
                factor: file.f64(&k("rope.scaling.factor"))?,
                original_max_position_embeddings: u("rope.scaling.original_context_length")
                    .unwrap_or(context),
                beta_fast: None,
                beta_slow: None,
                truncate: None,
                mscale: None,
                mscale_all_dim: None,
                attention_factor: None,
            },
            other => {
                return Err(ModelError::BadValue {
                    path,
                    key: k("rope.scaling.type"),
                    value: other.into(),
                    reason: "sinter's `rope` op has the scalings none, linear and yarn here".into(),
                });
            }
        };
        let qkv_bias = arch == QwenArch::Qwen2 || file.info("blk.0.attn_q.bias").is_some();
        let cfg = QwenConfig {
            arch,
            vocab: u("vocab_size").unwrap_or(tokenizer.vocab_size()),
            hidden,
            n_layers: u("block_count")?,
            n_heads,
            n_kv_heads: u("attention.head_count_kv").unwrap_or(n_heads),
            head_dim: u("attention.key_length").unwrap_or(hidden / n_heads.max(1)),
            ffn: u("feed_forward_length")?,
            rope_theta: file.f64(&k("rope.freq_base")).unwrap_or(10000.0),
            rope_scaling,
            rms_eps: file.f64(&k("attention.layer_norm_rms_epsilon"))?,
            context,
            page_size: 16,
            tied_embeddings: file.info("output.weight").is_none(),
            qkv_bias,
            o_bias: arch == QwenArch::Qwen3 && file.info("blk.0.attn_output.bias").is_some(),
            qk_norm: arch == QwenArch::Qwen3,
            windows: vec![],
        };
        let malformed = |e: Error| ModelError::Malformed {
            path: path.clone(),
            reason: e.to_string(),
        };
        cfg.validate().map_err(malformed)?;
        check_rope(&cfg).map_err(malformed)?;
        let specs: Vec<WeightSpec> = weight_names(&cfg)
            .into_iter()
            .map(|(gg, _, s)| WeightSpec::plain(gg.clone(), gg, &s))
            .collect();
        let weights = weights::load(file, &specs, dtype, progress)?;
        let tokens = file.strings("tokenizer.ggml.tokens").unwrap_or_default();
        let name = |k: &str| {
            file.u64(k)
                .ok()
                .and_then(|i| tokens.get(i as usize).map(|t| t.to_string()))
                .unwrap_or_default()
        };
        let chat = ChatTemplate {
            source: file.str("tokenizer.chat_template").ok().map(str::to_string),
            bos_token: name("tokenizer.ggml.bos_token_id"),
            eos_token: name("tokenizer.ggml.eos_token_id"),
        };
        let eos = vec![tokenizer.eos];
        Ok(QwenModel {
            cfg,
            dtype,
            weights,
            tokenizer,
            chat,
            eos,
            source: path,
        })
    }
}

/// Builds the prefill graph once so that a rope scaling whose parameters the `rope` op
/// refuses is an error at load time, naming the attribute.
fn check_rope(cfg: &QwenConfig) -> Result<(), Error> {
    if cfg.rope_scaling == RopeScaling::None {
        return Ok(());
    }
    let g = qwen::build(cfg, Mode::Prefill, DType::F32)?;
    sinter_ir::verify(&g)
        .map_err(|e| Error::Unsupported(format!("rope_scaling {:?}: {e}", cfg.rope_scaling)))
}

impl DecoderModel for QwenModel {
    fn architecture(&self) -> &str {
        self.cfg.arch.name()
    }

    fn graph(&self, mode: Mode) -> Result<Graph, Error> {
        qwen::build(&self.cfg, mode, self.dtype)
    }

    fn kv(&self) -> KvGeometry {
        KvGeometry {
            layers: self.cfg.n_layers,
            kv_heads: self.cfg.n_kv_heads,
            head_dim: self.cfg.head_dim,
            page_size: self.cfg.page_size,
            dtype: self.dtype,
        }
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
        self.eos.clone()
    }

    fn source(&self) -> &Path {
        &self.source
    }
}
