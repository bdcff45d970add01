//! Tokenizers: the one stored in a GGUF file, as llama.cpp (the reference implementation for
//! GGUF) builds it, or a Hugging Face `tokenizer.json` read by the `tokenizers` crate.
//!
//! GGUF files name their tokenizer in `tokenizer.ggml.model`:
//! - `gpt2` is byte-level BPE (Radford et al. 2019) over the file's `tokens` and `merges`. The
//!   text is first split by the regular expressions llama.cpp gives the pre-tokenizer
//!   `tokenizer.ggml.pre` names ([`BPE_PRE_TOKENIZERS`]; a name sinter does not know is an
//!   error, never a guess), then each piece is mapped to the byte-level alphabet and merged by
//!   the `tokenizers` crate's BPE.
//! - `llama` is SentencePiece with scores and byte fallback ([`super::spm`]).
//!
//! In both, tokens of type control, user-defined and unknown are cut out of the text first
//! (longest first), as llama.cpp does; user-defined ones always, control ones when special
//! tokens are parsed (always in [`Tokenizer::encode`]).

use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{PreTokenizerWrapper, SplitDelimiterBehavior, Tokenizer as HfTokenizer};

use super::gguf::{GgufFile, ModelError};
use super::spm::Spm;
use super::token_attr::{self, attributes};

/// The GPT-2 split (llama.cpp's `LLAMA_VOCAB_PRE_TYPE_GPT2`).
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)";
/// Qwen2's split: contractions in either case, letters with one leading non-letter, single
/// digits, punctuation runs with their newlines, newline runs, spaces.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Qwen3.5's: Qwen2's with combining marks kept with the letters they follow.
const QWEN35: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
/// Llama 3's: Qwen2's with numbers in runs of up to three digits.
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// A family of BPE pre-tokenizers: the `tokenizer.ggml.pre` names llama.cpp gives it, the
/// regular expressions it splits the text with (each splits the pieces of the one before; a
/// match and the text between matches become pieces), whether a piece that is a whole token
/// skips the merges (`ignore_merges`), and whether BOS is added unless the file says.
pub struct BpePreTokenizer {
    /// `tokenizer.ggml.pre` values.
    pub names: &'static [&'static str],
    /// The regular expressions, applied in order.
    pub regexes: &'static [&'static str],
    /// A piece that is a token is that token, unmerged.
    pub ignore_merges: bool,
    /// `add_bos_token` when the file does not say.
    pub add_bos: bool,
}

/// The BPE pre-tokenizers sinter builds, with llama.cpp's expressions (`llm_tokenizer_bpe` in
/// its `src/llama-vocab.cpp`). `default` (also used when the key is missing, as llama.cpp does)
/// is llama.cpp's fallback, not GPT-2's split. `gpt2` is an older sinter spelling of `gpt-2`.
pub const BPE_PRE_TOKENIZERS: &[BpePreTokenizer] = &[
    BpePreTokenizer { names: &["default"], regexes: &[r"[\p{P}\$\+<=>\^~\|]+", GPT2, r"\p{N}+", "[0-9][0-9][0-9]"], ignore_merges: false, add_bos: false },
    BpePreTokenizer { names: &["gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "exaone4"], regexes: &[GPT2], ignore_merges: false, add_bos: false },
    BpePreTokenizer {
        names: &["smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"],
        regexes: &[r"\p{N}", GPT2],
        ignore_merges: false,
        add_bos: false,
    },
    BpePreTokenizer { names: &["qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan"], regexes: &[QWEN2], ignore_merges: false, add_bos: false },
    BpePreTokenizer { names: &["qwen35"], regexes: &[QWEN35], ignore_merges: false, add_bos: false },
    BpePreTokenizer { names: &["llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"], regexes: &[LLAMA3], ignore_merges: true, add_bos: true },
];

/// A text ⇄ token-id codec with the model's special tokens.
pub struct Tokenizer {
    kind: Kind,
    /// `tokenizer.ggml.eos_token_id` (SmolLM2: 2, `<|im_end|>`; Gemma 3: 1, `<eos>`).
    pub eos: u32,
    /// `tokenizer.ggml.bos_token_id` (SmolLM2: 1, `<|im_start|>`; Gemma 3: 2, `<bos>`).
    pub bos: u32,
    /// Whether the model expects a BOS token before the text (`tokenizer.ggml.add_bos_token`;
    /// false for SmolLM2, true for Gemma 3).
    pub add_bos: bool,
    /// Whether an EOS token follows the text (`tokenizer.ggml.add_eos_token`; rarely true).
    pub add_eos: bool,
    tokens: Vec<String>,
}

enum Kind {
    /// A Hugging Face `tokenizer.json`: the `tokenizers` crate does everything.
    Json(HfTokenizer),
    /// GGUF byte-level BPE: specials cut out here, the rest through `tokenizers`.
    Bpe { inner: HfTokenizer, specials: Specials },
    /// GGUF SentencePiece.
    Spm { spm: Spm, specials: Specials },
}

/// The tokens matched whole in the text before tokenizing: (text, id, parsed only when
/// special tokens are), longest first.
struct Specials(Vec<(String, u32, bool)>);

/// A stretch of the text: plain text, or a special token cut out of it.
#[derive(Clone, Copy)]
enum Fragment<'a> {
    Text(&'a str),
    Token(u32),
}

impl Specials {
    fn new(tokens: &[String], attrs: &[u32]) -> Specials {
        use token_attr::{CONTROL, UNKNOWN, USER_DEFINED};
        let mut v: Vec<(String, u32, bool)> = tokens
            .iter()
            .zip(attrs)
            .enumerate()
            .filter(|&(_, (t, &a))| !t.is_empty() && a & (CONTROL | USER_DEFINED | UNKNOWN) != 0)
            .map(|(i, (t, &a))| (t.clone(), i as u32, a & (CONTROL | UNKNOWN) != 0))
            .collect();
        v.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.1.cmp(&b.1)));
        Specials(v)
    }

    /// `text` cut at each occurrence of a special token, longest tokens first (llama.cpp's
    /// `tokenizer_st_partition`); control and unknown tokens only when `parse_special`.
    fn partition<'a>(&self, text: &'a str, parse_special: bool) -> Vec<Fragment<'a>> {
        let mut out = if text.is_empty() { vec![] } else { vec![Fragment::Text(text)] };
        for (s, id, only_if_parsed) in &self.0 {
            if (*only_if_parsed && !parse_special) || !text.contains(s.as_str()) {
                continue;
            }
            let mut next = Vec::with_capacity(out.len() + 2);
            for f in out {
                let Fragment::Text(mut rest) = f else {
                    next.push(f);
                    continue;
                };
                while let Some(at) = rest.find(s.as_str()) {
                    if at > 0 {
                        next.push(Fragment::Text(&rest[..at]));
                    }
                    next.push(Fragment::Token(*id));
                    rest = &rest[at + s.len()..];
                }
                if !rest.is_empty() {
                    next.push(Fragment::Text(rest));
                }
            }
            out = next;
        }
        out
    }
}

impl Tokenizer {
    /// Builds the tokenizer of a GGUF file.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] for a tokenizer model or pre-tokenizer sinter does not have
    /// (naming the key and its value), merges that do not parse, scores or types that do not
    /// match the tokens; [`ModelError::MissingKey`] for absent metadata.
    pub fn from_gguf(f: &GgufFile) -> Result<Tokenizer, ModelError> {
        let bad = |reason: String| ModelError::Tokenizer { path: f.path().to_path_buf(), reason };
        let model = f.str("tokenizer.ggml.model")?;
        // llama.cpp renames empty tokens so that they cannot match.
        let tokens: Vec<String> = f
            .strings("tokenizer.ggml.tokens")?
            .into_iter()
            .enumerate()
            .map(|(i, t)| if t.is_empty() { format!("[EMPTY_{i}]") } else { t.to_string() })
            .collect();
        // Without types every token is normal.
        let types = if f.metadata().contains_key("tokenizer.ggml.token_type") { f.ints("tokenizer.ggml.token_type")? } else { vec![1; tokens.len()] };
        if types.len() < tokens.len() {
            return Err(bad(format!("tokenizer.ggml.token_type has {} entries for {} tokens", types.len(), tokens.len())));
        }
        let attrs = attributes(f, &tokens, &types[..tokens.len()]);
        let specials = Specials::new(&tokens, &attrs);
        let id = |k: &str, default: Option<u32>| match f.u64(k) {
            Ok(v) => Ok(v as u32),
            Err(e) => default.ok_or(e),
        };
        let flag = |k: &str, default: bool| f.bool(k).unwrap_or(default);
        let (kind, bos, eos, add_bos) = match model {
            "gpt2" => {
                let pre = f.str("tokenizer.ggml.pre").unwrap_or("default");
                let family = BPE_PRE_TOKENIZERS.iter().find(|p| p.names.contains(&pre)).ok_or_else(|| {
                    let known: Vec<&str> = BPE_PRE_TOKENIZERS.iter().flat_map(|p| p.names.iter().copied()).collect();
                    bad(format!("tokenizer.ggml.pre = `{pre}` is a BPE pre-tokenizer sinter does not have (it has: {})", known.join(", ")))
                })?;
                let inner = bpe(f, &tokens, family).map_err(bad)?;
                let kind = Kind::Bpe { inner, specials };
                (kind, id("tokenizer.ggml.bos_token_id", None)?, id("tokenizer.ggml.eos_token_id", None)?, flag("tokenizer.ggml.add_bos_token", family.add_bos))
            }
            "llama" => {
                let scores: Vec<f32> = match f.metadata().get("tokenizer.ggml.scores") {
                    None => vec![0.0; tokens.len()],
                    Some(v) => v
                        .as_array()
                        .map(|a| a.iter().map(|s| s.as_f64().map(|x| x as f32).unwrap_or(f32::NAN)).collect())
                        .ok_or_else(|| bad("tokenizer.ggml.scores is not an array of numbers".into()))?,
                };
                if scores.len() < tokens.len() {
                    return Err(bad(format!("tokenizer.ggml.scores has {} entries for {} tokens", scores.len(), tokens.len())));
                }
                let spm = Spm::new(tokens.clone(), scores[..tokens.len()].to_vec(), attrs, flag("tokenizer.ggml.add_space_prefix", true)).map_err(|e| bad(format!("tokenizer.ggml.scores: {e}")))?;
                (Kind::Spm { spm, specials }, id("tokenizer.ggml.bos_token_id", Some(1))?, id("tokenizer.ggml.eos_token_id", Some(2))?, flag("tokenizer.ggml.add_bos_token", true))
            }
            other => return Err(bad(format!("tokenizer.ggml.model = `{other}` is not supported (supported: gpt2, byte-level BPE; llama, SentencePiece)"))),
        };
        for (what, v) in [("bos", bos), ("eos", eos)] {
            if v as usize >= tokens.len() {
                return Err(bad(format!("tokenizer.ggml.{what}_token_id = {v} is outside the vocabulary of {} tokens", tokens.len())));
            }
        }
        Ok(Tokenizer { kind, eos, bos, add_bos, add_eos: flag("tokenizer.ggml.add_eos_token", false), tokens })
    }

    /// Loads a Hugging Face `tokenizer.json` (any model the `tokenizers` crate reads).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when the file cannot be read or parsed.
    pub fn from_file(path: &std::path::Path, bos: u32, eos: u32, add_bos: bool) -> Result<Tokenizer, ModelError> {
        let inner = HfTokenizer::from_file(path).map_err(|e| ModelError::Tokenizer { path: path.to_path_buf(), reason: e.to_string() })?;
        let n = inner.get_vocab_size(true);
        let tokens = (0..n as u32).map(|i| inner.id_to_token(i).unwrap_or_default()).collect();
        Ok(Tokenizer { kind: Kind::Json(inner), eos, bos, add_bos, add_eos: false, tokens })
    }

    /// Token ids of `text`: special tokens in the text are recognised, BOS (and EOS) added if
    /// the model asks for them.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] if the text cannot be encoded.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, ModelError> {
        self.encode_with(text, true, true)
    }

    /// Token ids of `text` as llama.cpp's `llama_tokenize(text, add_special, parse_special)`:
    /// `add_special` adds BOS/EOS where the model asks for them; without `parse_special` the
    /// text of control tokens is tokenized as text (user-defined tokens are still matched).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] if the text cannot be encoded, or for `parse_special = false`
    /// on a `tokenizer.json` (the `tokenizers` crate always matches its added tokens).
    pub fn encode_with(&self, text: &str, add_special: bool, parse_special: bool) -> Result<Vec<u32>, ModelError> {
        let err = |reason: String| ModelError::Tokenizer { path: "<tokenizer>".into(), reason };
        let mut ids = Vec::new();
        if add_special && self.add_bos {
            ids.push(self.bos);
        }
        match &self.kind {
            Kind::Json(inner) => {
                if !parse_special {
                    return Err(err("a tokenizer.json always matches its special tokens: parse_special = false needs a GGUF tokenizer".into()));
                }
                ids.extend_from_slice(inner.encode(text, false).map_err(|e| err(e.to_string()))?.get_ids());
            }
            Kind::Bpe { inner, specials } => {
                for f in specials.partition(text, parse_special) {
                    match f {
                        Fragment::Token(id) => ids.push(id),
                        Fragment::Text(t) => ids.extend_from_slice(inner.encode(t, false).map_err(|e| err(e.to_string()))?.get_ids()),
                    }
                }
            }
            Kind::Spm { spm, specials } => {
                let mut after_special = true;
                for f in specials.partition(text, parse_special) {
                    match f {
                        Fragment::Token(id) => ids.push(id),
                        Fragment::Text(t) => spm.encode_fragment(t, after_special, &mut ids).map_err(err)?,
                    }
                    after_special = matches!(f, Fragment::Token(_));
                }
            }
        }
        if add_special && self.add_eos {
            ids.push(self.eos);
        }
        Ok(ids)
    }

    /// The text of `ids` (special tokens kept, so a chat transcript reads as written). Bytes
    /// that do not form UTF-8 (a token sequence cut inside a character) become U+FFFD.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] for ids outside the vocabulary.
    pub fn decode(&self, ids: &[u32]) -> Result<String, ModelError> {
        let err = |reason: String| ModelError::Tokenizer { path: "<tokenizer>".into(), reason };
        match &self.kind {
            Kind::Json(inner) | Kind::Bpe { inner, .. } => inner.decode(ids, false).map_err(|e| err(e.to_string())),
            Kind::Spm { spm, .. } => {
                let mut bytes = Vec::new();
                for (i, &id) in ids.iter().enumerate() {
                    spm.piece_bytes(id, i == 0 && spm.add_space_prefix, &mut bytes).map_err(err)?;
                }
                Ok(String::from_utf8_lossy(&bytes).into_owned())
            }
        }
    }

    /// The raw token string of an id (`Ġthe`, `▁the`), if any.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }
}

/// The `tokenizers` BPE of a GGUF `gpt2` tokenizer: the file's merges (llama.cpp splits each at
/// its first space after the first character), the family's splits, then the byte-level map.
fn bpe(f: &GgufFile, tokens: &[String], family: &BpePreTokenizer) -> Result<HfTokenizer, String> {
    let merges: Vec<(String, String)> = f
        .strings("tokenizer.ggml.merges")
        .map_err(|e| e.to_string())?
        .into_iter()
        .map(|m| {
            let at = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1).ok_or_else(|| format!("merge `{m}` is not two tokens"))?;
            Ok((m[..at].to_string(), m[at + 1..].to_string()))
        })
        .collect::<Result<_, String>>()?;
    let vocab: Vocab = tokens.iter().enumerate().map(|(i, t)| (t.clone(), i as u32)).collect();
    let model = BPE::builder().vocab_and_merges(vocab, merges).ignore_merges(family.ignore_merges).build().map_err(|e| e.to_string())?;
    let mut inner = HfTokenizer::new(model);
    let mut steps: Vec<PreTokenizerWrapper> = Vec::new();
    for r in family.regexes {
        let split = Split::new(SplitPattern::Regex((*r).to_string()), SplitDelimiterBehavior::Isolated, false).map_err(|e| format!("pre-tokenizer regex `{r}`: {e}"))?;
        steps.push(split.into());
    }
    steps.push(ByteLevel::new(false, true, false).into());
    inner.with_pre_tokenizer(Some(Sequence::new(steps)));
    inner.with_decoder(Some(ByteLevelDecoder::default()));
    Ok(inner)
}
