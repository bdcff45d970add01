//! The architectures sinter can load, by the name files give them: GGUF's
//! `general.architecture` and Hugging Face's `config.json` `model_type`.
//!
//! Adding one is one entry of [`ARCHITECTURES`]: a loader from an open GGUF file and one from
//! a Hugging Face folder, each returning a [`DecoderModel`].

use std::path::Path;

use super::decoder::DecoderModel;
use super::gguf::{GgufFile, ModelError};
use super::hf::HfFolder;
use super::{Gemma3Model, Gpt2Model, LlamaModel, QwenModel};
use crate::DType;

/// A boxed decoder, as the loaders return it.
pub type AnyDecoder = Box<dyn DecoderModel>;

/// Progress callback of a loader: `(tensors done, total)`.
pub type Progress<'a> = &'a mut dyn FnMut(usize, usize);

/// One loadable architecture.
pub struct Architecture {
    /// The name (`general.architecture` in GGUF, `model_type` in `config.json`).
    pub name: &'static str,
    /// Loads a GGUF file of this architecture.
    pub gguf: fn(&GgufFile, DType, Progress<'_>) -> Result<AnyDecoder, ModelError>,
    /// Loads a Hugging Face folder of this architecture.
    pub hf: fn(HfFolder, DType, Progress<'_>) -> Result<AnyDecoder, ModelError>,
}

/// Every architecture sinter loads.
pub const ARCHITECTURES: &[Architecture] = &[
    Architecture {
        name: "llama",
        gguf: |f, dt, p| Ok(Box::new(LlamaModel::from_gguf(f, dt, p)?)),
        hf: |f, dt, p| Ok(Box::new(LlamaModel::from_hf(f, dt, p)?)),
    },
    Architecture {
        name: "gpt2",
        gguf: |f, dt, p| Ok(Box::new(Gpt2Model::from_gguf(f, dt, p)?)),
        hf: |f, dt, p| Ok(Box::new(Gpt2Model::from_hf(f, dt, p)?)),
    },
    Architecture {
        name: "qwen2",
        gguf: |f, dt, p| Ok(Box::new(QwenModel::from_gguf(f, dt, p)?)),
        hf: |f, dt, p| Ok(Box::new(QwenModel::from_hf(f, dt, p)?)),
    },
    Architecture {
        name: "qwen3",
        gguf: |f, dt, p| Ok(Box::new(QwenModel::from_gguf(f, dt, p)?)),
        hf: |f, dt, p| Ok(Box::new(QwenModel::from_hf(f, dt, p)?)),
    },
    Architecture {
        name: "gemma3",
        gguf: |f, dt, p| Ok(Box::new(Gemma3Model::from_gguf(f, dt, p)?)),
        hf: |f, dt, p| Ok(Box::new(Gemma3Model::from_hf(f, dt, p)?)),
    },
    Architecture {
        name: "gemma3_text",
        gguf: |f, dt, p| Ok(Box::new(Gemma3Model::from_gguf(f, dt, p)?)),
        hf: |f, dt, p| Ok(Box::new(Gemma3Model::from_hf(f, dt, p)?)),
    },
];

/// The supported architectures' names, comma-separated (for messages).
pub fn supported() -> String {
    ARCHITECTURES.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
}

/// The architecture called `name`.
///
/// # Errors
/// [`ModelError::UnsupportedArchitecture`] listing the supported ones; `path` is the file
/// the name was read from.
pub fn architecture(name: &str, path: &Path) -> Result<&'static Architecture, ModelError> {
    ARCHITECTURES.iter().find(|a| a.name == name).ok_or_else(|| ModelError::UnsupportedArchitecture { path: path.to_path_buf(), arch: name.to_string(), supported: supported() })
}

/// Loads any supported model from a `.gguf` file or a Hugging Face folder, choosing the
/// architecture from the file (`general.architecture`, or `model_type`, or the class an older
/// config's `architectures` names), with weights and activations of `dtype`; `progress(done, total)` is
/// called after each tensor.
///
/// ```no_run
/// use sinter::llm::{open, DecoderModel, Engine, SampleOptions};
/// let model = open("gpt2.gguf".as_ref(), sinter::DType::F32, &mut |_, _| {})?;
/// let prompt = model.tokenizer().encode("Hello")?;
/// let engine = Engine::new(model)?;
/// let out = engine.generate(&[prompt], &SampleOptions::greedy(16), &mut |_, _| {})?;
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
///
/// # Errors
/// [`ModelError::UnsupportedArchitecture`] (naming the supported architectures); the
/// architecture loader's errors (missing keys or tensors, wrong shapes, bad files).
pub fn open(path: &Path, dtype: DType, progress: Progress<'_>) -> Result<AnyDecoder, ModelError> {
    if path.is_dir() {
        let folder = HfFolder::open(path)?;
        let name = folder.architecture()?;
        let arch = architecture(&name, &path.join("config.json"))?;
        (arch.hf)(folder, dtype, progress)
    } else {
        let file = GgufFile::open(path)?;
        let name = file.str("general.architecture")?.to_string();
        (architecture(&name, path)?.gguf)(&file, dtype, progress)
    }
}
