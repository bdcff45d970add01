//! GGUF tokenizers against llama.cpp, the reference implementation for GGUF files.
//!
//! - llama.cpp's own tokenizer tests (`models/ggml-vocab-*.gguf` with `.inp`/`.out`, vocabulary
//!   only, MIT; from the `llama-cpp-python` 0.3.36 sdist, `vendor/llama.cpp/models`): SentencePiece
//!   (`llama-spm`), BPE with the `qwen2`, `gpt-2` and `starcoder` pre-tokenizers.
//! - A corpus of our own (`corpus.json`: Unicode, digits, runs of spaces and newlines, special
//!   tokens, the empty string) tokenized by llama.cpp (`llama-cpp-python` 0.3.36,
//!   `bench/fixtures/tokenizer_fixture.py`) with each of those vocabularies and with Gemma 3
//!   270M's (whose test runs when the model is in sinter's cache).
//! - Files sinter cannot tokenize exactly: clear errors naming the key and the value.

use std::path::{Path, PathBuf};

use serde_json::Value;
use sinter::llm::gguf::{GgufFile, ModelError};
use sinter::llm::tokenizer::Tokenizer;

const FIXTURES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/llama-vocab");

fn vocab(name: &str) -> Tokenizer {
    let path = PathBuf::from(FIXTURES).join(format!("ggml-vocab-{name}.gguf"));
    Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap()
}

/// llama.cpp's test cases: inputs separated by `\n__ggml_vocab_test__\n` (a trailing separator
/// ends the list), one line of ids per input (read as `tests/test-tokenizer-0.cpp` reads them).
fn llama_cpp_cases(name: &str) -> Vec<(String, Vec<u32>)> {
    let inp = std::fs::read_to_string(format!("{FIXTURES}/ggml-vocab-{name}.gguf.inp")).unwrap();
    let out = std::fs::read_to_string(format!("{FIXTURES}/ggml-vocab-{name}.gguf.out")).unwrap();
    let sep = "\n__ggml_vocab_test__\n";
    let mut texts = Vec::new();
    let mut pos = 0;
    while pos < inp.len() {
        match inp[pos..].find(sep) {
            Some(n) => {
                texts.push(inp[pos..pos + n].to_string());
                pos += n + sep.len();
            }
            None => {
                texts.push(inp[pos..].to_string());
                break;
            }
        }
    }
    let ids: Vec<Vec<u32>> = out.lines().map(|l| l.split_whitespace().map(|t| t.parse().unwrap()).collect()).collect();
    assert_eq!(texts.len(), ids.len(), "{name}: inputs and outputs differ in number");
    texts.into_iter().zip(ids).collect()
}

fn check_llama_cpp_cases(tok: &Tokenizer, name: &str) {
    let cases = llama_cpp_cases(name);
    for (text, want) in &cases {
        assert_eq!(&tok.encode_with(text, false, false).unwrap(), want, "{name}: ids of {text:?}");
    }
    eprintln!("{name}: {} of llama.cpp's test strings tokenized identically", cases.len());
}

/// The corpus and llama.cpp's ids and text for it with one vocabulary.
struct Corpus {
    texts: Vec<String>,
    /// Per text: ids with (add_special, parse_special) = (false, false), then (true, true).
    plain: Vec<Vec<u32>>,
    special: Vec<Vec<u32>>,
    /// llama.cpp's detokenization of `special` (special tokens shown).
    decoded: Vec<String>,
}

fn corpus(name: &str) -> Corpus {
    let j: Value = serde_json::from_str(&std::fs::read_to_string(format!("{FIXTURES}/corpus.json")).unwrap()).unwrap();
    let texts: Vec<String> = j["texts"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    let v = &j["vocabularies"][name];
    let ids = |k: &str| -> Vec<Vec<u32>> { v[k].as_array().unwrap().iter().map(|r| r.as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect()).collect() };
    let decoded = v["decoded"].as_array().unwrap().iter().map(|t| t.as_str().unwrap().to_string()).collect();
    Corpus { plain: ids("plain"), special: ids("special"), decoded, texts }
}

/// Our corpus against llama.cpp; `decode`: whether sinter's decoding must equal llama.cpp's.
/// sinter decodes BPE as `tokenizers` does, giving back the text that was encoded; llama.cpp
/// also removes spaces before `?!.,` and some apostrophes unless the pre-tokenizer turns that
/// off (`qwen2` does, `gpt-2` and `starcoder` do not: " 😁 ?" decodes to " 😁?" there).
fn check_corpus(tok: &Tokenizer, name: &str, decode: bool) {
    let c = corpus(name);
    for (i, text) in c.texts.iter().enumerate() {
        assert_eq!(tok.encode_with(text, false, false).unwrap(), c.plain[i], "{name}: ids of {text:?} (plain)");
        assert_eq!(tok.encode(text).unwrap(), c.special[i], "{name}: ids of {text:?} (BOS, special tokens parsed)");
        if decode {
            assert_eq!(tok.decode(&c.special[i]).unwrap(), c.decoded[i], "{name}: text of {:?}", c.special[i]);
        }
    }
    eprintln!("{name}: {} corpus strings tokenized identically to llama.cpp, twice each", c.texts.len());
}

#[test]
fn spm_matches_llama_cpp() {
    let tok = vocab("llama-spm");
    check_llama_cpp_cases(&tok, "llama-spm");
    check_corpus(&tok, "llama-spm", true);
}

#[test]
fn bpe_qwen2_matches_llama_cpp() {
    let tok = vocab("qwen2");
    check_llama_cpp_cases(&tok, "qwen2");
    check_corpus(&tok, "qwen2", true);
}

#[test]
fn bpe_gpt2_matches_llama_cpp() {
    let tok = vocab("gpt-2");
    check_llama_cpp_cases(&tok, "gpt-2");
    check_corpus(&tok, "gpt-2", false);
}

/// StarCoder's pre-tokenizer is SmolLM2's: single digits, then GPT-2's split.
#[test]
fn bpe_starcoder_matches_llama_cpp() {
    let tok = vocab("starcoder");
    check_llama_cpp_cases(&tok, "starcoder");
    check_corpus(&tok, "starcoder", false);
}

/// Gemma 3 270M's GGUF, if the cache has it.
fn gemma3() -> Option<Tokenizer> {
    let path = sinter::llm::fetch::cache_dir().join("models").join("gemma-3-270m-q4_k_m.gguf");
    if !path.exists() {
        eprintln!("skipped: {} is missing", path.display());
        return None;
    }
    Some(Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap())
}

#[test]
fn gemma3_tokenizer_matches_llama_cpp() {
    let Some(tok) = gemma3() else { return };
    assert_eq!((tok.bos, tok.eos, tok.add_bos, tok.vocab_size()), (2, 1, true, 262_144));
    assert_eq!(tok.encode("The capital of France is").unwrap(), [2, 818, 5279, 529, 7001, 563]);
    check_corpus(&tok, "gemma-3-270m", true);
}

/// SentencePiece decoding inverts encoding, except for text with the special tokens' spelling
/// or with `▁` itself (which decodes as a space).
#[test]
fn spm_decode_inverts_encode() {
    let tok = vocab("llama-spm");
    for text in corpus("llama-spm").texts.iter().filter(|t| !t.contains("<s>") && !t.contains("</s>") && !t.contains('\u{2581}')) {
        let ids = tok.encode_with(text, false, false).unwrap();
        // The space prefix is added and taken away again.
        assert_eq!(&tok.decode(&ids).unwrap(), text, "ids {ids:?}");
    }
}

/// A metadata value of [`write_vocab`].
enum Meta<'a> {
    Str(&'a str),
    Strs(&'a [&'a str]),
}

/// A GGUF file with only tokenizer metadata.
fn write_vocab(path: &Path, kv: &[(&str, Meta)]) {
    let s = |x: &str| [(x.len() as u64).to_le_bytes().to_vec(), x.as_bytes().to_vec()].concat();
    let mut b = b"GGUF".to_vec();
    b.extend(3u32.to_le_bytes());
    b.extend(0u64.to_le_bytes());
    b.extend((kv.len() as u64).to_le_bytes());
    for (k, v) in kv {
        b.extend(s(k));
        match v {
            Meta::Str(x) => {
                b.extend(8u32.to_le_bytes());
                b.extend(s(x));
            }
            Meta::Strs(xs) => {
                b.extend(9u32.to_le_bytes());
                b.extend(8u32.to_le_bytes());
                b.extend((xs.len() as u64).to_le_bytes());
                xs.iter().for_each(|x| b.extend(s(x)));
            }
        }
    }
    b.resize(b.len().div_ceil(32) * 32, 0);
    std::fs::write(path, b).unwrap();
}

fn tokenizer_error(model: &str, pre: Option<&str>) -> String {
    let dir = std::env::temp_dir().join(format!("sinter-tokenizer-{}-{model}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("vocab.gguf");
    let mut kv = vec![("tokenizer.ggml.model", Meta::Str(model)), ("tokenizer.ggml.tokens", Meta::Strs(&["a", "b", "ab"])), ("tokenizer.ggml.merges", Meta::Strs(&["a b"]))];
    if let Some(p) = pre {
        kv.push(("tokenizer.ggml.pre", Meta::Str(p)));
    }
    write_vocab(&path, &kv);
    let err = match Tokenizer::from_gguf(&GgufFile::open(&path).unwrap()) {
        Err(e @ ModelError::Tokenizer { .. }) => e.to_string(),
        Err(e) => panic!("expected a tokenizer error, got {e}"),
        Ok(_) => panic!("model {model} pre {pre:?} built a tokenizer"),
    };
    let _ = std::fs::remove_dir_all(&dir);
    err
}

#[test]
fn unknown_tokenizers_are_errors_naming_key_and_value() {
    let e = tokenizer_error("gpt2", Some("klingon"));
    assert!(e.contains("tokenizer.ggml.pre") && e.contains("`klingon`") && e.contains("qwen2"), "{e}");
    let e = tokenizer_error("rwkv", None);
    assert!(e.contains("tokenizer.ggml.model") && e.contains("`rwkv`"), "{e}");
}


