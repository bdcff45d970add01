//! The OpenAI API's request and response bodies (the subset `sinter serve` implements) and its
//! error body.
//!
//! Requests are parsed field by field (`serde_path_to_error`, from the body's JSON value: the
//! sampling fields and the endpoint's own are read separately), so a bad field is named in the
//! 400 response; fields this server does not use are ignored, as OpenAI's clients send many.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// An error as the OpenAI API returns it: a status and `{"error": {message, type, param, code}}`.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable message.
    pub message: String,
    /// `invalid_request_error`, `not_found_error`, `server_error`, `overloaded_error`.
    pub kind: &'static str,
    /// The request field at fault, if any.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, `context_length_exceeded`, …).
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param`.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> ApiError {
        ApiError { status: StatusCode::BAD_REQUEST, message: message.into(), kind: "invalid_request_error", param: param.map(str::to_string), code: None }
    }

    /// A 500 `server_error`.
    pub fn server(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::INTERNAL_SERVER_ERROR, message: message.into(), kind: "server_error", param: None, code: None }
    }

    /// A 503 `overloaded_error` (a full queue, a server shutting down).
    pub fn unavailable(message: impl Into<String>) -> ApiError {
        ApiError { status: StatusCode::SERVICE_UNAVAILABLE, message: message.into(), kind: "overloaded_error", param: None, code: None }
    }

    /// The same error with `code`.
    pub fn with_code(mut self, code: &'static str) -> ApiError {
        self.code = Some(code);
        self
    }

    /// The JSON body.
    pub fn body(&self) -> Value {
        json!({ "error": { "message": self.message, "type": self.kind, "param": self.param, "code": self.code } })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            r.headers_mut().insert("retry-after", axum::http::HeaderValue::from_static("1"));
        }
        r
    }
}

/// Parses a request body: a JSON object.
///
/// # Errors
/// A 400 [`ApiError`] for a body that is not a JSON object.
pub fn parse_body(body: &[u8]) -> Result<Value, ApiError> {
    match serde_json::from_slice::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(ApiError::invalid("the request body must be a JSON object", None)),
        Err(e) => Err(ApiError::invalid(format!("the request body is not valid JSON: {e}"), None)),
    }
}

/// The fields of `body` that `T` takes (others are ignored), naming a field at fault.
///
/// # Errors
/// A 400 [`ApiError`] for a missing field or one of the wrong type.
pub fn fields<T: for<'de> Deserialize<'de>>(body: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(body).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        let inner = e.into_inner();
        let message = match &param {
            Some(p) => format!("invalid field `{p}`: {inner}"),
            None => format!("invalid request: {inner}"),
        };
        ApiError { param, ..ApiError::invalid(message, None) }
    })
}

/// A string or a list of strings (`stop`, `prompt`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany<T> {
    /// One.
    One(T),
    /// Several.
    Many(Vec<T>),
}

impl<T> OneOrMany<T> {
    /// The values as a list.
    pub fn into_vec(self) -> Vec<T> {
        match self {
            OneOrMany::One(t) => vec![t],
            OneOrMany::Many(v) => v,
        }
    }
}

/// A completion prompt: text or token ids, one or a list of one.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// A list of texts (one is served).
    Texts(Vec<String>),
    /// A list of token-id lists (one is served).
    TokenLists(Vec<Vec<u32>>),
}

/// `stream_options`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with the usage counts.
    #[serde(default)]
    pub include_usage: bool,
}

/// The sampling fields both endpoints share (read from the same body as the endpoint's own).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    /// Tokens to generate at most.
    pub max_tokens: Option<usize>,
    /// Chat's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    /// 0 = greedy; default 1.
    pub temperature: Option<f64>,
    /// Nucleus threshold; default 1.
    pub top_p: Option<f64>,
    /// Seed of the sampler; default: a random one.
    pub seed: Option<u64>,
    /// Up to 4 strings that end the text (not included).
    pub stop: Option<OneOrMany<String>>,
    /// Stream by server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Choices per prompt: only 1.
    pub n: Option<usize>,
    /// Not served: log-probabilities (refused unless absent, null, false or 0).
    pub logprobs: Option<Value>,
    /// Not served: the top log-probabilities of chat.
    pub top_logprobs: Option<Value>,
    /// Not served: echoing the prompt.
    pub echo: Option<bool>,
    /// Not served: best-of sampling beyond 1.
    pub best_of: Option<usize>,
    /// Not served: a suffix after the completion.
    pub suffix: Option<Value>,
    /// Not served: presence and frequency penalties other than 0.
    pub presence_penalty: Option<f64>,
    /// See `presence_penalty`.
    pub frequency_penalty: Option<f64>,
    /// Not served: a logit bias.
    pub logit_bias: Option<Value>,
}

impl Sampling {
    /// The first field set to something this server does not do, if any.
    pub fn unsupported(&self) -> Option<&'static str> {
        let set = |v: &Option<Value>| v.as_ref().is_some_and(|v| !matches!(v, Value::Null | Value::Bool(false)) && v.as_u64() != Some(0) && v.as_object().is_none_or(|o| !o.is_empty()));
        [
            ("logprobs", set(&self.logprobs)),
            ("top_logprobs", set(&self.top_logprobs)),
            ("echo", self.echo == Some(true)),
            ("best_of", self.best_of.is_some_and(|b| b != 1)),
            ("suffix", set(&self.suffix)),
            ("presence_penalty", self.presence_penalty.is_some_and(|p| p != 0.0)),
            ("frequency_penalty", self.frequency_penalty.is_some_and(|p| p != 0.0)),
            ("logit_bias", set(&self.logit_bias)),
        ]
        .into_iter()
        .find_map(|(name, on)| on.then_some(name))
    }
}

/// `POST /v1/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    /// The served model's id.
    pub model: String,
    /// The prompt.
    pub prompt: Prompt,
}

/// One chat message.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`.
    pub role: String,
    /// Text, or a list of `{"type": "text", "text": …}` parts.
    pub content: Value,
}

/// `POST /v1/chat/completions`.
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    /// The served model's id.
    pub model: String,
    /// The conversation.
    pub messages: Vec<ChatMessage>,
}

/// Token counts of a response.
#[derive(Debug, Clone, Copy, Serialize, PartialEq, Eq)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens (an end-of-sequence token included).
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

impl Usage {
    /// Counts of a prompt and a completion.
    pub fn new(prompt_tokens: usize, completion_tokens: usize) -> Usage {
        Usage { prompt_tokens, completion_tokens, total_tokens: prompt_tokens + completion_tokens }
    }
}

/// The text of a chat message's `content` (a string or text parts).
///
/// # Errors
/// A 400 naming `messages[i].content` for anything else.
pub fn content_text(content: &Value, i: usize) -> Result<String, ApiError> {
    let param = format!("messages[{i}].content");
    match content {
        Value::String(s) => Ok(s.clone()),
        Value::Null => Ok(String::new()),
        Value::Array(parts) => parts
            .iter()
            .map(|p| match (p.get("type").and_then(Value::as_str), p.get("text").and_then(Value::as_str)) {
                (Some("text"), Some(t)) => Ok(t.to_string()),
                _ => Err(ApiError::invalid("only text content parts ({\"type\": \"text\", \"text\": …}) are supported", Some(&param))),
            })
            .collect::<Result<Vec<_>, _>>()
            .map(|v| v.concat()),
        _ => Err(ApiError::invalid("content must be a string or a list of text parts", Some(&param))),
    }
}
