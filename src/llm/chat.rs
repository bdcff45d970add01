//! Chat prompts rendered with the model's own template (`tokenizer.chat_template`, Jinja),
//! through `minijinja`, as written — SmolLM2's template adds its default system prompt when
//! the conversation has none.
//!
//! The environment is Hugging Face transformers' (`render_jinja_template` in
//! `utils/chat_template_utils.py`): `trim_blocks` and `lstrip_blocks` on, loop controls
//! (`break`, `continue`), the `tojson` filter, Python's string and dict methods
//! (`startswith`, `strip`, `items`, … through `minijinja_contrib::pycompat`), and the globals
//! `raise_exception(message)` (the template's own error, e.g. for roles out of order) and
//! `strftime_now(format)` (the local date, as Llama 3.1's template prints it).

use std::fmt::Write as _;

use minijinja::{context, Environment, ErrorKind};

use super::gguf::ModelError;

/// One message of a conversation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// A chat template with the names of the special tokens it may use.
#[derive(Clone, Debug, Default)]
pub struct ChatTemplate {
    /// The Jinja source (`tokenizer.chat_template` in GGUF, `chat_template` in
    /// `tokenizer_config.json`); `None` when the model has none.
    pub source: Option<String>,
    /// Text of the BOS token.
    pub bos_token: String,
    /// Text of the EOS token.
    pub eos_token: String,
}

impl ChatTemplate {
    /// Renders `messages` with the generation prompt appended. A model without a template gets
    /// the messages' text joined by newlines.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when the template does not parse or render.
    pub fn render(&self, messages: &[Message]) -> Result<String, ModelError> {
        let Some(template) = &self.source else {
            return Ok(messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n"));
        };
        let bad = |e: minijinja::Error| ModelError::Tokenizer { path: "<chat template>".into(), reason: format!("chat template: {e}") };
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", |message: String| -> Result<String, minijinja::Error> { Err(minijinja::Error::new(ErrorKind::InvalidOperation, message)) });
        env.add_function("strftime_now", |format: String| -> Result<String, minijinja::Error> {
            let mut out = String::new();
            write!(out, "{}", chrono::Local::now().format(&format)).map_err(|_| minijinja::Error::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {format:?}")))?;
            Ok(out)
        });
        env.add_template("chat", template).map_err(bad)?;
        env.get_template("chat")
            .and_then(|t| {
                t.render(context! {
                    messages => messages,
                    add_generation_prompt => true,
                    bos_token => self.bos_token.as_str(),
                    eos_token => self.eos_token.as_str(),
                })
            })
            .map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &[(&str, &str)]) -> Result<String, ModelError> {
        let t = ChatTemplate { source: Some(source.into()), bos_token: "<s>".into(), eos_token: "</s>".into() };
        t.render(&messages.iter().map(|(r, c)| Message { role: (*r).into(), content: (*c).into() }).collect::<Vec<_>>())
    }

    /// The parts of Hugging Face's environment that Qwen3's, Llama 3.1's and Gemma's templates
    /// use: Python string methods on message contents, reversed slices and `namespace`,
    /// `tojson`, loop controls, `trim_blocks`/`lstrip_blocks`, and `raise_exception`.
    #[test]
    fn templates_render_in_hugging_faces_environment() {
        let qwen3_like = "{%- set ns = namespace(last=messages|length - 1) %}\n{%- for m in messages[::-1] %}\n    {%- if m.role == 'user' and not (m.content.startswith('<tool_response>') and m.content.endswith('</tool_response>')) %}\n        {%- set ns.last = (messages|length - 1) - loop.index0 %}\n        {%- break %}\n    {%- endif %}\n{%- endfor %}\n{%- for m in messages %}\n{{- '<|im_start|>' + m.role + '\\n' + m.content.strip() + '<|im_end|>\\n' }}\n{%- endfor %}\n{{- 'last=' ~ ns.last ~ ' ' ~ {'a': [1, 'x']}|tojson }}";
        let out = render(qwen3_like, &[("user", "  hi  "), ("assistant", "yo"), ("user", "<tool_response>r</tool_response>")]).unwrap();
        assert_eq!(out, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\nyo<|im_end|>\n<|im_start|>user\n<tool_response>r</tool_response><|im_end|>\nlast=0 {\"a\":[1,\"x\"]}");
        // trim_blocks drops the newline after a block tag, lstrip_blocks the indent before one.
        let blocks = "{% for m in messages %}\n    {% if m.role == 'user' %}\nU:{{ m.content }}\n    {% endif %}\n{% endfor %}";
        assert_eq!(render(blocks, &[("user", "a"), ("assistant", "b")]).unwrap(), "U:a\n");
        let strict = "{% if messages[0].role != 'user' %}{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}ok";
        let e = render(strict, &[("assistant", "x")]).unwrap_err().to_string();
        assert!(e.contains("Conversation roles must alternate"), "{e}");
        let date = render("{{ strftime_now('%Y') }}", &[]).unwrap();
        assert!(date.len() == 4 && date.starts_with('2'), "{date}");
        // chrono refuses an unknown specifier by failing the write: an error, not a panic.
        let e = render("{{ strftime_now('%Q') }}", &[]).unwrap_err().to_string();
        assert!(e.contains("strftime_now: bad format"), "{e}");
    }
}
