//! The OpenAI API's shapes as `engine serve` reads and writes them: the bodies of
//! `/v1/completions` and `/v1/chat/completions`, their answers and streamed chunks, and the
//! error object every failure answers with.
//!
//! Fields the API defines that this server does not act on (`user`, `frequency_penalty`,
//! `stream_options`, ...) are accepted and ignored, as OpenAI-compatible servers do; a known
//! field with a value of the wrong type or out of range is a 400 naming the field.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{json, Value};

/// An error answered as `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub param: Option<&'static str>,
}

impl ApiError {
    pub fn bad(message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            param: None,
        }
    }

    pub fn field(param: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            param: Some(param),
            ..ApiError::bad(message)
        }
    }

    pub fn with(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            param: None,
        }
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            429 => "rate_limit_exceeded",
            400..=499 => "invalid_request_error",
            _ => "server_error",
        }
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind(),
            "param": self.param,
            "code": self.status.as_u16(),
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

/// A string or a list of them (`stop`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Strings {
    One(String),
    Many(Vec<String>),
}

impl Strings {
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Strings::One(s) => vec![s],
            Strings::Many(v) => v,
        }
    }
}

/// A completion prompt: text, token ids, or a list of one of either.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Ids(Vec<u32>),
    Texts(Vec<String>),
    IdLists(Vec<Vec<u32>>),
}

/// What both endpoints take besides the prompt.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Sampling {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    /// The chat API's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Option<Strings>,
    pub n: Option<usize>,
    /// Generate `max_tokens` even past the model's end-of-sequence tokens (an extension vLLM
    /// and llama-server share; load generators use it for fixed output lengths).
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Clone, Default, Deserialize)]
pub struct StreamOptions {
    /// Send a last chunk with `usage` before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub sampling: Sampling,
    /// The legacy API's `logprobs`: how many alternatives per token (0-20).
    pub logprobs: Option<usize>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    #[serde(flatten)]
    pub sampling: Sampling,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<usize>,
    /// The template's `enable_thinking` (Qwen3, Qwen3.5), as vLLM and SGLang take it.
    pub chat_template_kwargs: Option<TemplateKwargs>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct TemplateKwargs {
    pub enable_thinking: Option<bool>,
}

#[derive(Debug, Clone, Deserialize)]
pub struct Message {
    pub role: String,
    pub content: Content,
}

/// A message's content: text, or a list of parts of which only text parts are understood.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Clone, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

impl Content {
    pub fn text(&self) -> Result<String, ApiError> {
        match self {
            Content::Text(t) => Ok(t.clone()),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    _ => Err(ApiError::field(
                        "messages",
                        format!(
                            "content parts of type {:?} are not supported: this server reads text only",
                            p.kind
                        ),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(|v| v.concat()),
        }
    }
}

/// Parses a request body, turning serde's error into a 400 that says where it failed.
pub fn parse<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad(format!("the request body is not a valid request: {e}")))
}

/// `usage`, with the prompt tokens that came from the prefix cache.
pub fn usage(prompt: usize, completion: usize, cached: usize) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": cached},
    })
}
