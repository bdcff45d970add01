//! Hugging Face model folders: `config.json`, one or more `*.safetensors` files (read with the
//! `safetensors` crate) and `tokenizer.json` (+ `chat_template` from `tokenizer_config.json`
//! when present).
//!
//! [`HfFolder`] reads the config and indexes the tensors; each architecture's loader
//! ([`super::registry`]) maps Hugging Face names to the names its graphs use, with the
//! load-time transforms of [`super::weights`]. [`load`] reads a Llama folder
//! (`model_type = "llama"`, [`super::LlamaModel`]).

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};

use safetensors::{Dtype as StDtype, SafeTensors};
use serde_json::Value as Json;

use super::chat::ChatTemplate;
use super::gguf::ModelError;
use super::tokenizer::Tokenizer;
use super::weights::TensorSource;
use super::LlamaModel;
use crate::DType;

fn io(path: &Path) -> impl Fn(std::io::Error) -> ModelError + '_ {
    move |source| ModelError::Io { path: path.to_path_buf(), source }
}

/// Where one tensor lies: its file, dtype, shape and bytes.
struct Entry {
    file: usize,
    dtype: StDtype,
    shape: Vec<usize>,
    bytes: Range<usize>,
}

/// A Hugging Face folder in memory: its `config.json` and every tensor of its
/// `*.safetensors` files.
pub struct HfFolder {
    dir: PathBuf,
    config_path: PathBuf,
    /// The parsed `config.json`.
    pub config: Json,
    blobs: Vec<(PathBuf, Vec<u8>)>,
    index: BTreeMap<String, Entry>,
}

impl HfFolder {
    /// Reads `dir/config.json` and every `dir/*.safetensors`.
    ///
    /// # Errors
    /// [`ModelError::Io`], [`ModelError::Malformed`] for a config or safetensors file that
    /// does not parse; [`ModelError::MissingTensor`] (`*.safetensors`) when there is none.
    pub fn open(dir: &Path) -> Result<HfFolder, ModelError> {
        let config_path = dir.join("config.json");
        let text = std::fs::read_to_string(&config_path).map_err(io(&config_path))?;
        let config: Json = serde_json::from_str(&text).map_err(|e| ModelError::Malformed { path: config_path.clone(), reason: e.to_string() })?;
        Ok(HfFolder { dir: dir.to_path_buf(), config_path, config, blobs: vec![], index: BTreeMap::new() })
    }

    /// Reads and indexes the folder's `*.safetensors` files (once; later calls do nothing).
    ///
    /// # Errors
    /// As [`HfFolder::open`].
    pub fn read_tensors(&mut self) -> Result<(), ModelError> {
        if !self.blobs.is_empty() {
            return Ok(());
        }
        let dir = &self.dir;
        let mut files: Vec<_> =
            std::fs::read_dir(dir).map_err(io(dir))?.filter_map(Result::ok).map(|e| e.path()).filter(|p| p.extension().is_some_and(|x| x == "safetensors")).collect();
        files.sort();
        if files.is_empty() {
            return Err(ModelError::MissingTensor { path: dir.to_path_buf(), name: "*.safetensors".into() });
        }
        for (i, p) in files.iter().enumerate() {
            let b = std::fs::read(p).map_err(io(p))?;
            let st = SafeTensors::deserialize(&b).map_err(|e| ModelError::Malformed { path: p.clone(), reason: e.to_string() })?;
            for (name, view) in st.tensors() {
                // The view's bytes are a slice of the blob: keep their range.
                let start = view.data().as_ptr() as usize - b.as_ptr() as usize;
                let bytes = start..start + view.data().len();
                self.index.entry(name).or_insert(Entry { file: i, dtype: view.dtype(), shape: view.shape().to_vec(), bytes });
            }
            drop(st);
            self.blobs.push((p.clone(), b));
        }
        Ok(())
    }

    /// The folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Whether a tensor of this name was read ([`HfFolder::read_tensors`]).
    pub fn has(&self, name: &str) -> bool {
        self.index.contains_key(name)
    }

    /// The names of the tensors read ([`HfFolder::read_tensors`]), sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.index.keys().map(String::as_str)
    }

    /// `model_type` from `config.json`, if any.
    pub fn model_type(&self) -> Option<&str> {
        self.config.get("model_type").and_then(Json::as_str)
    }

    /// The architecture's name: `model_type`, or where a (older) config has none, the one its
    /// first `architectures` class names (`LlamaForCausalLM` → `llama`, `GPT2LMHeadModel` →
    /// `gpt2`, `Qwen2ForCausalLM` → `qwen2`, `Qwen3ForCausalLM` → `qwen3`,
    /// `Gemma3ForCausalLM` → `gemma3_text`, `Gemma3ForConditionalGeneration` → `gemma3`; any
    /// other class is returned as written, for the caller's unsupported-architecture error).
    ///
    /// # Errors
    /// [`ModelError::MissingKey`] (`model_type`) when the config has neither.
    pub fn architecture(&self) -> Result<String, ModelError> {
        if let Some(t) = self.model_type() {
            return Ok(t.to_string());
        }
        let class = self.config.get("architectures").and_then(Json::as_array).and_then(|a| a.first()).and_then(Json::as_str);
        let Some(class) = class else { return Err(self.missing("model_type", "a string naming the architecture (or an `architectures` list)")) };
        Ok(match class {
            "LlamaForCausalLM" => "llama",
            "GPT2LMHeadModel" => "gpt2",
            "Qwen2ForCausalLM" => "qwen2",
            "Qwen3ForCausalLM" => "qwen3",
            "Gemma3ForCausalLM" => "gemma3_text",
            "Gemma3ForConditionalGeneration" => "gemma3",
            other => other,
        }
        .to_string())
    }

    /// A missing-key error for `config.json`.
    pub fn missing(&self, key: &str, expected: &'static str) -> ModelError {
        ModelError::MissingKey { path: self.config_path.clone(), key: key.to_string(), expected }
    }

    /// An unsigned integer of `config.json`.
    ///
    /// # Errors
    /// [`ModelError::MissingKey`].
    pub fn usize(&self, key: &str) -> Result<usize, ModelError> {
        self.config.get(key).and_then(Json::as_u64).map(|v| v as usize).ok_or_else(|| self.missing(key, "an unsigned integer"))
    }

    /// A number of `config.json`.
    ///
    /// # Errors
    /// [`ModelError::MissingKey`].
    pub fn f64(&self, key: &str) -> Result<f64, ModelError> {
        self.config.get(key).and_then(Json::as_f64).ok_or_else(|| self.missing(key, "a number"))
    }

    /// A boolean of `config.json`, if present.
    pub fn bool(&self, key: &str) -> Option<bool> {
        self.config.get(key).and_then(Json::as_bool)
    }

    /// Refuses a `config.json` value the architecture's graph does not compute: `key`, when
    /// present and not null, must be one of `supported` (strings, booleans or numbers as
    /// `serde_json` prints them), else [`ModelError::BadValue`] with `what` as the reason —
    /// a model is never run silently with a different activation, bias or head.
    ///
    /// # Errors
    /// [`ModelError::BadValue`] naming the key and its value.
    pub fn require(&self, key: &str, supported: &[Json], what: &str) -> Result<(), ModelError> {
        match self.config.get(key) {
            Some(v) if !v.is_null() && !supported.contains(v) => {
                let list: Vec<String> = supported.iter().map(Json::to_string).collect();
                Err(ModelError::BadValue { path: self.config_path.clone(), key: key.into(), value: v.to_string(), reason: format!("{what} (supported: {})", list.join(", ")) })
            }
            _ => Ok(()),
        }
    }

    /// A config error: the numbers do not fit together.
    pub fn malformed(&self, reason: String) -> ModelError {
        ModelError::Malformed { path: self.config_path.clone(), reason }
    }

    /// The token id `key` of `config.json` (`bos_token_id`, `eos_token_id`), the first one
    /// when it is a list.
    pub fn token_id(&self, key: &str) -> Option<u32> {
        let v = self.config.get(key)?;
        v.as_u64().or_else(|| v.as_array().and_then(|a| a.first()).and_then(Json::as_u64)).map(|v| v as u32)
    }

    /// Every token id `key` names (`eos_token_id` may be a list).
    pub fn token_ids(&self, key: &str) -> Vec<u32> {
        match self.config.get(key) {
            Some(Json::Array(a)) => a.iter().filter_map(Json::as_u64).map(|v| v as u32).collect(),
            Some(v) => v.as_u64().map(|v| vec![v as u32]).unwrap_or_default(),
            None => vec![],
        }
    }

    /// `tokenizer.json` with `bos`/`eos`, and the chat template of `tokenizer_config.json`
    /// (`source: None` when it has none).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when `tokenizer.json` cannot be read or parsed.
    pub fn tokenizer(&self, bos: u32, eos: u32) -> Result<(Tokenizer, ChatTemplate), ModelError> {
        let tokenizer = Tokenizer::from_file(&self.dir.join("tokenizer.json"), bos, eos, false)?;
        let tc: Option<Json> = std::fs::read_to_string(self.dir.join("tokenizer_config.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        let tc_str = |k: &str| tc.as_ref().and_then(|t| t.get(k)).and_then(Json::as_str).map(str::to_string);
        let chat = ChatTemplate {
            source: tc_str("chat_template"),
            bos_token: tc_str("bos_token").or_else(|| tokenizer.token(bos).map(str::to_string)).unwrap_or_default(),
            eos_token: tc_str("eos_token").or_else(|| tokenizer.token(eos).map(str::to_string)).unwrap_or_default(),
        };
        Ok((tokenizer, chat))
    }
}

impl TensorSource for HfFolder {
    fn path(&self) -> &Path {
        &self.dir
    }

    fn read(&self, name: &str, shape: &[usize]) -> Result<Vec<f64>, ModelError> {
        let e = self.index.get(name).ok_or_else(|| ModelError::MissingTensor { path: self.dir.clone(), name: name.to_string() })?;
        let (path, blob) = &self.blobs[e.file];
        if e.shape != shape {
            return Err(ModelError::TensorShape { path: path.clone(), name: name.to_string(), expected: shape.to_vec(), got: e.shape.clone() });
        }
        let b = &blob[e.bytes.clone()];
        Ok(match e.dtype {
            StDtype::F32 => b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f64).collect(),
            StDtype::F16 => b.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            StDtype::BF16 => b.chunks_exact(2).map(|c| half::bf16::from_le_bytes([c[0], c[1]]).to_f64()).collect(),
            other => return Err(ModelError::UnsupportedTensorType { path: path.clone(), name: name.to_string(), kind: format!("{other:?}") }),
        })
    }
}

/// Loads a Llama-family model from a Hugging Face folder (see [`LlamaModel::from_hf`]).
///
/// # Errors
/// Missing or malformed `config.json` keys ([`ModelError::MissingKey`]), an architecture other
/// than Llama, missing tensors, tensors of an unsupported dtype (F32, F16 and BF16 are read),
/// wrong shapes, an unreadable tokenizer.
pub fn load(dir: &Path, dtype: DType, mut progress: impl FnMut(usize, usize)) -> Result<LlamaModel, ModelError> {
    let folder = HfFolder::open(dir)?;
    let arch = folder.architecture()?;
    if arch != "llama" {
        return Err(ModelError::UnsupportedArchitecture { path: dir.join("config.json"), arch, supported: "llama".into() });
    }
    LlamaModel::from_hf(folder, dtype, &mut progress)
}
