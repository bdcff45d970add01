//! Token attributes of a GGUF vocabulary as llama.cpp derives them (`llama_vocab::impl::load`
//! in its `src/llama-vocab.cpp`): from `tokenizer.ggml.token_type`, then overridden by token
//! text, since converters have not always marked end-of-generation and fill-in-the-middle tokens
//! as control tokens. The attributes decide which tokens are cut out of the text before
//! tokenizing (control and unknown ones only when special tokens are parsed) and how a token
//! decodes.

use std::collections::HashMap;

use super::gguf::GgufFile;

/// `<unk>`.
pub const UNKNOWN: u32 = 1 << 0;
/// Never produced (`<unusedN>`).
pub const UNUSED: u32 = 1 << 1;
/// An ordinary token.
pub const NORMAL: u32 = 1 << 2;
/// Control tokens (`<bos>`, `<|im_end|>`).
pub const CONTROL: u32 = 1 << 3;
/// User-defined tokens: always matched whole in the text.
pub const USER_DEFINED: u32 = 1 << 4;
/// A byte-fallback piece `<0xNN>`.
pub const BYTE: u32 = 1 << 5;

/// The attribute of a GGUF token type (`llama_token_type`: 1 normal, 2 unknown, 3 control,
/// 4 user-defined, 5 unused, 6 byte; anything else undefined).
fn of_type(ty: i64) -> u32 {
    match ty {
        1 => NORMAL,
        2 => UNKNOWN,
        3 => CONTROL,
        4 => USER_DEFINED,
        5 => UNUSED,
        6 => BYTE,
        _ => 0,
    }
}

/// End-of-generation tokens by text: llama.cpp makes each a control token.
const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Fill-in-the-middle tokens by text, each family made control when the file does not give
/// its id (the key, then its deprecated spelling).
const FILL_IN_THE_MIDDLE: &[(&str, &str, &[&str])] = &[
    ("fim_pre", "prefix", &["<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>", "<|prefix|>"]),
    ("fim_suf", "suffix", &["<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>", "<|suffix|>"]),
    ("fim_mid", "middle", &["<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>", "<|middle|>"]),
    ("fim_pad", "", &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"]),
    ("fim_rep", "", &["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"]),
    ("fim_sep", "", &["<|file_sep|>"]),
];

/// The attributes of every token of `f`'s vocabulary `tokens` with GGUF types `types`.
///
/// Not reproduced: llama.cpp's strip flags set by model name (Phi-3's specials swallow the
/// spaces after them, some BERT masks those before), and its choice of *one* token per
/// fill-in-the-middle family when several texts match (here all of them are control tokens).
pub(crate) fn attributes(f: &GgufFile, tokens: &[String], types: &[i64]) -> Vec<u32> {
    let mut attrs: Vec<u32> = types.iter().map(|&t| of_type(t)).collect();
    // Text → id, the later id where a text repeats (llama.cpp's `token_to_id`).
    let ids: HashMap<&str, usize> = tokens.iter().enumerate().map(|(i, t)| (t.as_str(), i)).collect();
    let id_of = |text: &str| ids.get(text).copied();
    let has_key = |k: &str| !k.is_empty() && f.metadata().contains_key(&format!("tokenizer.ggml.{k}_token_id"));
    for (key, old_key, texts) in FILL_IN_THE_MIDDLE {
        if !has_key(key) && !has_key(old_key) {
            texts.iter().filter_map(|t| id_of(t)).for_each(|i| attrs[i] |= CONTROL);
        }
    }
    END_OF_GENERATION.iter().filter_map(|t| id_of(t)).for_each(|i| attrs[i] |= CONTROL);
    // gpt-oss's channel markers are always written out.
    for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
        if let Some(i) = id_of(t) {
            attrs[i] = USER_DEFINED;
        }
    }
    // With gpt-oss's `<|return|>` and `<|call|>` (solar-open's `<|calls|>` and `<|flush|>`),
    // `<|end|>` ends a message, not the generation.
    let has = |t: &str| id_of(t).is_some();
    if let Some(end) = id_of("<|end|>") {
        if (has("<|return|>") && has("<|call|>")) || (has("<|calls|>") && has("<|flush|>")) {
            attrs[end] = USER_DEFINED;
        }
    }
    // Gemma 4 and PLaMo have an ordinary `</s>`.
    if let Some(s) = id_of("</s>") {
        if has("<|tool_response>") || has("<|plamo:eos|>") {
            attrs[s] = NORMAL;
        }
    }
    attrs
}
