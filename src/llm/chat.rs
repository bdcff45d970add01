//! Chat prompts rendered with the model's own template (`tokenizer.chat_template`, Jinja),
//! through `minijinja`, as written — SmolLM2's template adds its default system prompt when
//! the conversation has none.

use minijinja::{context, Environment};

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
