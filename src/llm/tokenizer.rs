//! The tokenizer stored in a GGUF file, rebuilt with the `tokenizers` crate.
//!
//! `tokenizer.ggml.model = "gpt2"` is byte-level BPE (Radford et al. 2019) over the file's
//! `tokens` and `merges`. The pre-tokenizer follows `tokenizer.ggml.pre`: `smollm` splits every
//! digit on its own before the GPT-2 byte-level split (as SmolLM2's `tokenizer.json` does);
//! `gpt2`/`default` is the byte-level split alone. Tokens of type 3 (control: `<|im_start|>`,
//! `<|im_end|>`, ...) are special: matched whole in the text and never split.

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{AddedToken, PreTokenizerWrapper, Tokenizer as HfTokenizer};

use super::gguf::{GgufFile, ModelError};

/// A text ⇄ token-id codec with the model's special tokens.
pub struct Tokenizer {
    inner: HfTokenizer,
    /// `tokenizer.ggml.eos_token_id` (SmolLM2: 2, `<|im_end|>`).
    pub eos: u32,
    /// `tokenizer.ggml.bos_token_id` (SmolLM2: 1, `<|im_start|>`).
    pub bos: u32,
    /// Whether the model expects a BOS token before the text (`tokenizer.ggml.add_bos_token`;
    /// false for SmolLM2).
    pub add_bos: bool,
    tokens: Vec<String>,
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF file.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] for a tokenizer model or pre-tokenizer sinter does not have,
    /// or merges that do not parse; [`ModelError::MissingKey`] for absent metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, ModelError> {
        let bad = |reason: String| ModelError::Tokenizer { path: f.path().to_path_buf(), reason };
        let model = f.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(bad(format!("tokenizer model `{model}` is not supported (supported: gpt2, byte-level BPE)")));
        }
        let pre = f.str("tokenizer.ggml.pre").unwrap_or("default");
        let tokens: Vec<String> = f.strings("tokenizer.ggml.tokens")?.into_iter().map(str::to_string).collect();
        let types = f.ints("tokenizer.ggml.token_type").unwrap_or_default();
        let merges: Vec<(String, String)> = f
            .strings("tokenizer.ggml.merges")?
            .into_iter()
            .map(|m| m.split_once(' ').map(|(a, b)| (a.to_string(), b.to_string())).ok_or_else(|| bad(format!("merge `{m}` is not two tokens"))))
            .collect::<Result<_, _>>()?;
        let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
        let bpe = BPE::builder().vocab_and_merges(vocab, merges).build().map_err(|e| bad(e.to_string()))?;
        let mut inner = HfTokenizer::new(bpe);
        let byte_level: PreTokenizerWrapper = ByteLevel::new(false, true, true).into();
        let pre_tok = match pre {
            "smollm" => Sequence::new(vec![Digits::new(true).into(), byte_level]),
            "gpt2" | "default" => Sequence::new(vec![byte_level]),
            other => return Err(bad(format!("pre-tokenizer `{other}` is not supported (supported: smollm, gpt2, default)"))),
        };
        inner.with_pre_tokenizer(Some(pre_tok));
        inner.with_decoder(Some(ByteLevelDecoder::default()));
        let specials: Vec<AddedToken> =
            tokens.iter().zip(types.iter().chain(std::iter::repeat(&1))).filter(|(_, &ty)| ty == 3).map(|(t, _)| AddedToken::from(t.clone(), true)).collect();
        inner.add_special_tokens(&specials);
        let id = |k: &str| f.u64(k).map(|v| v as u32);
        Ok(Tokenizer { inner, eos: id("tokenizer.ggml.eos_token_id")?, bos: id("tokenizer.ggml.bos_token_id")?, add_bos: f.bool("tokenizer.ggml.add_bos_token").unwrap_or(false), tokens })
    }

    /// Loads a Hugging Face `tokenizer.json` (any model the `tokenizers` crate reads).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when the file cannot be read or parsed.
    pub fn from_file(path: &std::path::Path, bos: u32, eos: u32, add_bos: bool) -> Result<Tokenizer, ModelError> {
        let inner = HfTokenizer::from_file(path).map_err(|e| ModelError::Tokenizer { path: path.to_path_buf(), reason: e.to_string() })?;
        let n = inner.get_vocab_size(true);
        let tokens = (0..n as u32).map(|i| inner.id_to_token(i).unwrap_or_default()).collect();
        Ok(Tokenizer { inner, eos, bos, add_bos, tokens })
    }

    /// Token ids of `text` (special tokens in the text are recognised; BOS added if the model
    /// asks for it).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] if the text cannot be encoded.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        let enc = self.inner.encode(text, false).map_err(|e| ModelError::Tokenizer { path: "<tokenizer>".into(), reason: e.to_string() })?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            ids.push(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The text of `ids` (special tokens kept, so a chat transcript reads as written).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] for ids outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        self.inner.decode(ids, false).map_err(|e| ModelError::Tokenizer { path: "<tokenizer>".into(), reason: e.to_string() })
    }

    /// The raw token string of an id (`Ġthe`), if any.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
}
