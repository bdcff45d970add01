//! SentencePiece vocabularies as GGUF files store them (`tokenizer.ggml.model = "llama"`),
//! tokenised the way llama.cpp does it (`llm_tokenizer_spm` in its `src/llama-vocab.cpp`), the
//! reference implementation for GGUF files.
//!
//! llama.cpp's SentencePiece is not the Unigram (Viterbi) search: it starts from the text's
//! characters and repeatedly merges the adjacent pair whose concatenation is a piece with the
//! highest score (ties: the leftmost pair), until no adjacent pair forms a piece. A final symbol
//! that is a piece becomes that token, any other is written as its UTF-8 bytes (`<0xNN>`
//! pieces). Spaces are `▁` (U+2581) in the pieces; the text gets a leading space first when the
//! file says `tokenizer.ggml.add_space_prefix` (default true) and the fragment follows a special
//! token or starts the text.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::token_attr;

/// The space marker of SentencePiece pieces.
const SPACE: &str = "\u{2581}";

/// A SentencePiece vocabulary: pieces, scores, types and the options that change encoding.
pub(crate) struct Spm {
    pieces: Vec<String>,
    scores: Vec<f32>,
    /// [`token_attr`] bits of each piece.
    attrs: Vec<u32>,
    /// Piece text → id; where a text appears twice the later id wins (as in llama.cpp).
    ids: HashMap<String, u32>,
    /// The token of each byte: `<0xNN>`, else the one-byte piece.
    bytes: [Option<u32>; 256],
    /// `tokenizer.ggml.add_space_prefix`.
    pub(crate) add_space_prefix: bool,
}

/// One adjacent pair that would merge into a piece, ordered as llama.cpp's work queue: higher
/// score first, then the leftmost.
struct Bigram {
    left: usize,
    right: usize,
    score: f32,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    fn cmp(&self, other: &Self) -> Ordering {
        // Scores are finite (checked at load); -0.0 and 0.0 tie as in C++'s `<`.
        self.score.partial_cmp(&other.score).unwrap_or(Ordering::Equal).then(other.left.cmp(&self.left))
    }
}

/// A symbol of the text being merged: bytes `start..start + len`, linked to its neighbours.
#[derive(Clone, Copy)]
struct Symbol {
    start: usize,
    len: usize,
    prev: Option<usize>,
    next: Option<usize>,
}

impl Spm {
    /// A vocabulary from its pieces, scores and attributes (as long as `pieces`).
    ///
    /// # Errors
    /// A message naming the first score that is not a finite number.
    pub(crate) fn new(pieces: Vec<String>, scores: Vec<f32>, attrs: Vec<u32>, add_space_prefix: bool) -> Result<Spm, String> {
        if let Some(i) = scores.iter().position(|s| !s.is_finite()) {
            return Err(format!("score {} of piece {i} (`{}`) is not a finite number", scores[i], pieces[i]));
        }
        let ids: HashMap<String, u32> = pieces.iter().enumerate().map(|(i, p)| (p.clone(), i as u32)).collect();
        let mut bytes = [None; 256];
        for (b, slot) in bytes.iter_mut().enumerate() {
            let one = (b < 0x80).then(|| char::from(b as u8).to_string());
            *slot = ids.get(&format!("<0x{b:02X}>")).or_else(|| one.and_then(|s| ids.get(&s))).copied();
        }
        Ok(Spm { pieces, scores, attrs, ids, bytes, add_space_prefix })
    }

    /// Appends the tokens of `text`, a fragment between special tokens (`after_special`: it
    /// starts the text or follows a special token, so it gets the space prefix if the file asks).
    ///
    /// # Errors
    /// A message naming a byte that has no piece (a vocabulary without byte fallback).
    pub(crate) fn encode_fragment(&self, text: &str, after_special: bool, out: &mut Vec<u32>) -> Result<(), String> {
        let prefix = if self.add_space_prefix && after_special { " " } else { "" };
        let text = format!("{prefix}{text}").replace(' ', SPACE);
        let mut symbols: Vec<Symbol> = Vec::new();
        for (i, (start, c)) in text.char_indices().enumerate() {
            let end = start + c.len_utf8();
            symbols.push(Symbol { start, len: c.len_utf8(), prev: i.checked_sub(1), next: (end < text.len()).then_some(i + 1) });
        }
        let mut queue = BinaryHeap::new();
        let piece_of = |a: &Symbol, b: &Symbol| &text[a.start..b.start + b.len];
        let bigram = |symbols: &[Symbol], left: Option<usize>, right: Option<usize>| -> Option<Bigram> {
            let (left, right) = (left?, right?);
            let id = *self.ids.get(piece_of(&symbols[left], &symbols[right]))?;
            Some(Bigram { left, right, score: self.scores[id as usize], size: symbols[left].len + symbols[right].len })
        };
        for i in 1..symbols.len() {
            queue.extend(bigram(&symbols, Some(i - 1), Some(i)));
        }
        while let Some(b) = queue.pop() {
            let (l, r) = (symbols[b.left], symbols[b.right]);
            // A pair one of whose symbols has merged since is stale: its sizes no longer add up.
            if l.len == 0 || r.len == 0 || l.len + r.len != b.size {
                continue;
            }
            symbols[b.left].len += r.len;
            symbols[b.right].len = 0;
            symbols[b.left].next = r.next;
            if let Some(n) = r.next {
                symbols[n].prev = Some(b.left);
            }
            queue.extend(bigram(&symbols, l.prev, Some(b.left)));
            queue.extend(bigram(&symbols, Some(b.left), r.next));
        }
        // Every merged symbol is a piece (a pair is queued only if it is one), so a final
        // symbol that is not a piece is a single character: its bytes are written instead.
        // (llama.cpp's `resegment` also looks the text up among past merges, which for that
        // reason never finds one.)
        let mut at = if symbols.is_empty() { None } else { Some(0) };
        while let Some(i) = at {
            let s = symbols[i];
            let piece = &text[s.start..s.start + s.len];
            match self.ids.get(piece) {
                Some(&id) => out.push(id),
                None => {
                    for b in piece.bytes() {
                        out.push(self.bytes[b as usize].ok_or_else(|| format!("byte 0x{b:02X} of `{piece}` has no piece (no `<0x{b:02X}>` in the vocabulary)"))?);
                    }
                }
            }
            at = s.next;
        }
        Ok(())
    }

    /// The bytes of token `id` as llama.cpp's `token_to_piece` writes them with special tokens
    /// shown: control, unknown and user-defined pieces verbatim, normal pieces with `▁` as a
    /// space, byte pieces as their byte, unused and undefined pieces as nothing. `strip_space`
    /// drops one leading space (the first token of a text when the file adds a space prefix).
    pub(crate) fn piece_bytes(&self, id: u32, strip_space: bool, out: &mut Vec<u8>) -> Result<(), String> {
        let i = id as usize;
        let piece = self.pieces.get(i).ok_or_else(|| format!("token {id} is outside the vocabulary of {} pieces", self.pieces.len()))?;
        let attr = self.attrs[i];
        let text = if attr & (token_attr::CONTROL | token_attr::UNKNOWN | token_attr::USER_DEFINED) != 0 {
            piece.clone()
        } else if attr & token_attr::NORMAL != 0 {
            piece.replace(SPACE, " ")
        } else if attr & token_attr::BYTE != 0 {
            let byte = piece.get(3..5).and_then(|h| u8::from_str_radix(h, 16).ok()).ok_or_else(|| format!("byte token {id} is `{piece}`, not `<0xNN>`"))?;
            if !(strip_space && byte == b' ') {
                out.push(byte);
            }
            return Ok(());
        } else {
            String::new()
        };
        out.extend_from_slice(text.strip_prefix(' ').filter(|_| strip_space).unwrap_or(&text).as_bytes());
        Ok(())
    }
}
