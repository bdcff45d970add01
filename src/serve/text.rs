//! Generated tokens to text deltas, with stop strings.
//!
//! Each token re-decodes the whole completion (a tokenizer may merge pieces across tokens, and
//! byte-fallback tokens only make a character together) and sends the part after what was sent.
//! It holds back the tail that could still become a stop string, and a tail ending in U+FFFD
//! (an incomplete UTF-8 sequence of byte tokens); at a stop string the text ends before it.

/// The text of one completion as tokens arrive.
pub struct TextStream {
    ids: Vec<u32>,
    stops: Vec<String>,
    skip: Vec<u32>,
    sent: usize,
    stopped: bool,
}

impl TextStream {
    /// A stream that ends at any of `stops` and renders no `skip` token (end-of-sequence).
    pub fn new(stops: Vec<String>, skip: Vec<u32>) -> TextStream {
        TextStream { ids: Vec::new(), stops, skip, sent: 0, stopped: false }
    }

    /// True once a stop string was seen (nothing more is sent).
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Adds token `t`; returns the new text to send (possibly empty).
    ///
    /// # Errors
    /// The tokenizer's decoding error.
    pub fn push(&mut self, t: u32, decode: &dyn Fn(&[u32]) -> Result<String, String>) -> Result<String, String> {
        if self.stopped {
            return Ok(String::new());
        }
        if !self.skip.contains(&t) {
            self.ids.push(t);
        }
        let text = decode(&self.ids)?;
        // A stop string may start in text already sent, up to its length minus one back.
        let longest = self.stops.iter().map(String::len).max().unwrap_or(0);
        let mut from = self.sent.saturating_sub(longest);
        while !text.is_char_boundary(from) {
            from -= 1;
        }
        let hit = self.stops.iter().filter_map(|s| text[from..].find(s.as_str()).map(|i| from + i)).min();
        if let Some(at) = hit {
            self.stopped = true;
            let out = text.get(self.sent..at.max(self.sent)).unwrap_or("").to_string();
            self.sent = at.max(self.sent);
            return Ok(out);
        }
        let mut safe = text.len();
        if text.ends_with('\u{FFFD}') {
            safe -= '\u{FFFD}'.len_utf8();
        }
        // Hold back the longest tail that begins a stop string.
        let end = safe;
        for s in &self.stops {
            if let Some(k) = (1..s.len()).rev().find(|&k| s.is_char_boundary(k) && text[..end].ends_with(&s[..k])) {
                safe = safe.min(end - k);
            }
        }
        Ok(self.take(&text, safe))
    }

    /// The text not yet sent, at the end of the completion.
    ///
    /// # Errors
    /// The tokenizer's decoding error.
    pub fn finish(&mut self, decode: &dyn Fn(&[u32]) -> Result<String, String>) -> Result<String, String> {
        if self.stopped {
            return Ok(String::new());
        }
        let text = decode(&self.ids)?;
        let end = text.len();
        Ok(self.take(&text, end))
    }

    fn take(&mut self, text: &str, upto: usize) -> String {
        let mut upto = upto.min(text.len());
        while !text.is_char_boundary(upto) {
            upto -= 1;
        }
        if upto <= self.sent || !text.is_char_boundary(self.sent) {
            return String::new();
        }
        let out = text[self.sent..upto].to_string();
        self.sent = upto;
        out
    }
}

#[cfg(test)]
mod tests {
    use super::TextStream;

    fn words(ids: &[u32]) -> Result<String, String> {
        Ok(ids.iter().map(|&i| ["Hel", "lo", " wor", "ld", "!", "\u{FFFD}", "é"][i as usize]).collect())
    }

    fn run(stops: &[&str], ids: &[u32]) -> (Vec<String>, bool) {
        let mut s = TextStream::new(stops.iter().map(|s| s.to_string()).collect(), vec![99]);
        let mut out = vec![];
        for &t in ids {
            out.push(s.push(t, &words).unwrap());
            if s.stopped() {
                break;
            }
        }
        out.push(s.finish(&words).unwrap());
        (out, s.stopped())
    }

    #[test]
    fn text_is_sent_once_and_whole() {
        let (out, stopped) = run(&[], &[0, 1, 2, 3, 4, 99]);
        assert_eq!(out.concat(), "Hello world!");
        assert!(!stopped);
    }

    #[test]
    fn a_stop_string_across_tokens_ends_the_text_before_it() {
        let (out, stopped) = run(&["o wo"], &[0, 1, 2, 3, 4]);
        assert_eq!(out.concat(), "Hell");
        assert!(stopped);
        // The tail that could begin the stop string was held back, never sent.
        let (out, stopped) = run(&["lo!"], &[0, 1, 2, 3]);
        assert_eq!(out, vec!["He", "l", "lo wor", "ld", ""]);
        assert!(!stopped);
    }

    #[test]
    fn an_incomplete_character_is_held_back() {
        let (out, _) = run(&[], &[0, 5]);
        assert_eq!(out, vec!["Hel", "", "\u{FFFD}"]);
    }
}
