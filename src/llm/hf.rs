//! Hugging Face model folders: `config.json` (a `LlamaForCausalLM` config), one or more
//! `*.safetensors` files (read with the `safetensors` crate) and `tokenizer.json`
//! (+ `chat_template` from `tokenizer_config.json` when present).
//!
//! Weight names are mapped to the GGUF names the zoo's graphs use
//! (`model.layers.{i}.self_attn.q_proj.weight` → `blk.{i}.attn_q.weight`, ...). Hugging Face
//! stores `q_proj`/`k_proj` rows in the order RoPE's `rotate_half` form expects, so these
//! models run with `rope_form = "rotate_half"` (GGUF files, whose rows llama.cpp permuted,
//! run with `interleaved`).

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value as Json;

use super::chat::ChatTemplate;
use super::gguf::ModelError;
use super::tokenizer::Tokenizer;
use super::LlamaModel;
use crate::zoo::llama::LlamaConfig;
use crate::{DType, Tensor};

/// Hugging Face name → GGUF name, for one layer's tensors.
const LAYER_NAMES: [(&str, &str); 9] = [
    ("input_layernorm", "attn_norm"),
    ("self_attn.q_proj", "attn_q"),
    ("self_attn.k_proj", "attn_k"),
    ("self_attn.v_proj", "attn_v"),
    ("self_attn.o_proj", "attn_output"),
    ("post_attention_layernorm", "ffn_norm"),
    ("mlp.gate_proj", "ffn_gate"),
    ("mlp.up_proj", "ffn_up"),
    ("mlp.down_proj", "ffn_down"),
];

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io { path: path.to_path_buf(), source }
}

/// Loads a Llama-family model from a Hugging Face folder.
///
/// # Errors
/// Missing or malformed `config.json` keys ([`ModelError::MissingKey`]), an architecture other
/// than Llama, missing tensors, tensors of an unsupported dtype (F32, F16 and BF16 are read),
/// wrong shapes, an unreadable tokenizer.
pub fn load(dir: &Path, dtype: DType, mut progress: impl FnMut(usize, usize)) -> Result<LlamaModel, ModelError> {
    let cfg_path = dir.join("config.json");
    let text = std::fs::read_to_string(&cfg_path).map_err(io(&cfg_path))?;
    let j: Json = serde_json::from_str(&text).map_err(|e| ModelError::Malformed { path: cfg_path.clone(), reason: e.to_string() })?;
    let missing = |key: &str, expected: &'static str| ModelError::MissingKey { path: cfg_path.clone(), key: key.to_string(), expected };
    let u = |k: &str| j.get(k).and_then(Json::as_u64).map(|v| v as usize).ok_or_else(|| missing(k, "an unsigned integer"));
    let model_type = j.get("model_type").and_then(Json::as_str).unwrap_or("llama");
    if model_type != "llama" {
        return Err(ModelError::UnsupportedArchitecture { path: cfg_path.clone(), arch: model_type.to_string() });
    }
    let hidden = u("hidden_size")?;
    let n_heads = u("num_attention_heads")?;
    let cfg = LlamaConfig {
        vocab: u("vocab_size")?,
        hidden,
        n_layers: u("num_hidden_layers")?,
        n_heads,
        n_kv_heads: u("num_key_value_heads").unwrap_or(n_heads),
        head_dim: u("head_dim").unwrap_or(hidden / n_heads.max(1)),
        ffn: u("intermediate_size")?,
        rope_theta: j.get("rope_theta").and_then(Json::as_f64).unwrap_or(10000.0),
        rope_form: "rotate_half",
        rms_eps: j.get("rms_norm_eps").and_then(Json::as_f64).ok_or_else(|| missing("rms_norm_eps", "a number"))?,
        context: u("max_position_embeddings")?,
        page_size: 16,
        tied_embeddings: j.get("tie_word_embeddings").and_then(Json::as_bool).unwrap_or(false),
    };
    cfg.validate().map_err(|e| ModelError::Malformed { path: cfg_path.clone(), reason: e.to_string() })?;

    // Every tensor of every *.safetensors file, by name.
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(ModelError::MissingTensor { path: dir.to_path_buf(), name: "*.safetensors".into() });
    }
    let blobs: Vec<(std::path::PathBuf, Vec<u8>)> = files.iter().map(|p| std::fs::read(p).map(|b| (p.clone(), b)).map_err(io(p))).collect::<Result<_, _>>()?;
    let parsed: Vec<(&Path, SafeTensors<'_>)> = blobs
        .iter()
        .map(|(p, b)| SafeTensors::deserialize(b).map(|s| (p.as_path(), s)).map_err(|e| ModelError::Malformed { path: p.clone(), reason: e.to_string() }))
        .collect::<Result<_, _>>()?;

    let (d, qd, kvd) = (cfg.hidden, cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim);
    let mut wanted: Vec<(String, String, Vec<usize>)> = vec![
        ("model.embed_tokens.weight".into(), "token_embd.weight".into(), vec![cfg.vocab, d]),
        ("model.norm.weight".into(), "output_norm.weight".into(), vec![d]),
    ];
    if !cfg.tied_embeddings {
        wanted.push(("lm_head.weight".into(), "output.weight".into(), vec![cfg.vocab, d]));
    }
    for i in 0..cfg.n_layers {
        for (hf, gg) in LAYER_NAMES {
            let shape = match gg {
                "attn_norm" | "ffn_norm" => vec![d],
                "attn_q" => vec![qd, d],
                "attn_k" | "attn_v" => vec![kvd, d],
                "attn_output" => vec![d, qd],
                "ffn_gate" | "ffn_up" => vec![cfg.ffn, d],
                _ => vec![d, cfg.ffn],
            };
            wanted.push((format!("model.layers.{i}.{hf}.weight"), format!("blk.{i}.{gg}.weight"), shape));
        }
    }
    let total = wanted.len();
    let mut weights = BTreeMap::new();
    for (k, (hf_name, gguf_name, shape)) in wanted.into_iter().enumerate() {
        let (path, view) = parsed
            .iter()
            .find_map(|(p, st)| st.tensor(&hf_name).ok().map(|v| (*p, v)))
            .ok_or_else(|| ModelError::MissingTensor { path: dir.to_path_buf(), name: hf_name.clone() })?;
        if view.shape() != shape.as_slice() {
            return Err(ModelError::TensorShape { path: path.to_path_buf(), name: hf_name, expected: shape, got: view.shape().to_vec() });
        }
        let b = view.data();
        let data: Vec<f64> = match view.dtype() {
            StDtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
            StDtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            StDtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            other => return Err(ModelError::UnsupportedTensorType { path: path.to_path_buf(), name: hf_name, kind: format!("{other:?}") }),
        };
        let t = Tensor::new(dtype, &shape, data).map_err(|e| ModelError::Malformed { path: path.to_path_buf(), reason: format!("{hf_name}: {e}") })?;
        weights.insert(gguf_name, Arc::new(t));
        progress(k + 1, total);
    }

    let id = |k: &str| j.get(k).and_then(Json::as_u64).map(|v| v as u32);
    let (bos, eos) = (id("bos_token_id").unwrap_or(1), id("eos_token_id").unwrap_or(2));
    let tokenizer = Tokenizer::from_file(&dir.join("tokenizer.json"), bos, eos, false)?;
    let tc: Option<Json> = std::fs::read_to_string(dir.join("tokenizer_config.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
    let tc_str = |k: &str| tc.as_ref().and_then(|t| t.get(k)).and_then(Json::as_str).map(str::to_string);
    let chat = ChatTemplate {
        source: tc_str("chat_template"),
        bos_token: tc_str("bos_token").or_else(|| tokenizer.token(bos).map(str::to_string)).unwrap_or_default(),
        eos_token: tc_str("eos_token").or_else(|| tokenizer.token(eos).map(str::to_string)).unwrap_or_default(),
    };
    Ok(LlamaModel { cfg, dtype, weights, tokenizer, chat, source: dir.to_path_buf() })
}
