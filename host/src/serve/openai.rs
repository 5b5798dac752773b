//! The OpenAI API's request and response bodies, the subset `serve`
//! implements: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.
//! Unknown request fields are ignored, as OpenAI-compatible servers do;
//! fields we cannot honour (`n > 1`, `logprobs`, tools) are refused.
use crate::model::chat::Message;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `stop`: one string or a list.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    /// A single stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// As a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// Sampling fields both endpoints share.
#[derive(Clone, Debug, Deserialize)]
pub struct Sampling {
    /// Picks the base model or a user's adapter.
    pub model: String,
    /// Most tokens to generate (`max_completion_tokens` is the newer name).
    pub max_tokens: Option<u64>,
    /// See `max_tokens`.
    pub max_completion_tokens: Option<u64>,
    /// Default 1.0 as in OpenAI's API; 0 is greedy.
    pub temperature: Option<f32>,
    /// Default 1.0.
    pub top_p: Option<f32>,
    /// Seed of the sampling stream; default 0 (so a request repeats).
    pub seed: Option<u64>,
    /// Stop strings.
    pub stop: Option<Stop>,
    /// Server-sent events instead of one JSON body.
    #[serde(default)]
    pub stream: bool,
    /// Choices to return; only 1 is supported.
    pub n: Option<u64>,
    /// Not supported.
    pub logprobs: Option<Value>,
    /// Not supported.
    pub tools: Option<Value>,
}

/// `POST /v1/chat/completions`, besides the [`Sampling`] fields (each
/// body is parsed twice, once per struct: `serde(flatten)` cannot carry
/// numbers when serde_json's arbitrary precision is on, as it is here).
#[derive(Clone, Debug, Deserialize)]
pub struct ChatRequest {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
}

/// A chat message; `content` may be a string or a list of text parts.
#[derive(Clone, Debug, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: Content,
}

/// Message content.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": ...}]`.
    Parts(Vec<Part>),
}

/// One content part.
#[derive(Clone, Debug, Deserialize)]
pub struct Part {
    /// Only `text` is supported.
    #[serde(rename = "type")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

impl ChatMessage {
    /// As a chat-template message, or the reason it cannot be one.
    pub fn to_message(&self) -> Result<Message, String> {
        crate::model::chat::check_role(&self.role)?;
        let text = match &self.content {
            Content::Text(t) => t.clone(),
            Content::Parts(parts) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => Ok(t.as_str()),
                    _ => Err(format!("content part of type {:?} (only text)", p.kind)),
                })
                .collect::<Result<Vec<_>, _>>()?
                .concat(),
        };
        Ok(Message::new(&self.role, &text))
    }
}

/// `POST /v1/completions`, besides the [`Sampling`] fields.
#[derive(Clone, Debug, Deserialize)]
pub struct CompletionRequest {
    /// The raw prompt (no chat template).
    pub prompt: Prompt,
}

/// `prompt`: a string, or a list holding one string.
#[derive(Clone, Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    /// One prompt.
    One(String),
    /// Batched prompts: only a list of one is supported.
    Many(Vec<String>),
}

/// `usage` of a response.
#[derive(Clone, Copy, Debug, Serialize)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
}

/// Which endpoint a response belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completion,
}

impl Endpoint {
    fn object(self, chunk: bool) -> &'static str {
        match (self, chunk) {
            (Endpoint::Chat, false) => "chat.completion",
            (Endpoint::Chat, true) => "chat.completion.chunk",
            (Endpoint::Completion, _) => "text_completion",
        }
    }

    /// The whole response body.
    pub fn response(self, id: &str, created: u64, model: &str, text: &str, finish: &str, usage: Usage) -> Value {
        let choice = match self {
            Endpoint::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish}),
            Endpoint::Completion => json!({"index": 0, "text": text, "logprobs": null, "finish_reason": finish}),
        };
        json!({"id": id, "object": self.object(false), "created": created, "model": model, "choices": [choice], "usage": usage})
    }

    /// One streamed chunk carrying `text` (and `finish` on the last).
    pub fn chunk(self, id: &str, created: u64, model: &str, text: Option<&str>, finish: Option<&str>) -> Value {
        let choice = match self {
            Endpoint::Chat => {
                let delta = match text {
                    Some(t) => json!({"role": "assistant", "content": t}),
                    None => json!({}),
                };
                json!({"index": 0, "delta": delta, "finish_reason": finish})
            }
            Endpoint::Completion => json!({"index": 0, "text": text.unwrap_or(""), "logprobs": null, "finish_reason": finish}),
        };
        json!({"id": id, "object": self.object(true), "created": created, "model": model, "choices": [choice]})
    }
}

/// An OpenAI error body.
pub fn error_body(message: &str, kind: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": param, "code": code}})
}
