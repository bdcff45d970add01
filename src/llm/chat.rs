//! Chat prompts rendered with the model's own template (`tokenizer.chat_template`, Jinja),
//! through `minijinja`, as written — SmolLM2's template adds its default system prompt when
//! the conversation has none.

use minijinja::{context, Environment};

use super::gguf::{GgufFile, ModelError};

/// One message of a conversation.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// Renders `messages` with the file's chat template and the generation prompt appended.
/// A file without a template gets the prompt text alone.
///
/// # Errors
/// [`ModelError::Tokenizer`] when the template does not parse or render.
pub fn render(f: &GgufFile, messages: &[Message]) -> Result<String, ModelError> {
    let Ok(template) = f.str("tokenizer.chat_template") else {
        return Ok(messages.iter().map(|m| m.content.as_str()).collect::<Vec<_>>().join("\n"));
    };
    let bad = |e: minijinja::Error| ModelError::Tokenizer { path: f.path().to_path_buf(), reason: format!("chat template: {e}") };
    let mut env = Environment::new();
    env.add_template("chat", template).map_err(bad)?;
    let tokens = f.strings("tokenizer.ggml.tokens").unwrap_or_default();
    let name = |k: &str| f.u64(k).ok().and_then(|i| tokens.get(i as usize).copied()).unwrap_or("");
    env.get_template("chat")
        .and_then(|t| {
            t.render(context! {
                messages => messages,
                add_generation_prompt => true,
                bos_token => name("tokenizer.ggml.bos_token_id"),
                eos_token => name("tokenizer.ggml.eos_token_id"),
            })
        })
        .map_err(bad)
}
