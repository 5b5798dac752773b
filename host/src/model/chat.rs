//! Chat templates: turning `[{role, content}]` into the prompt text the
//! instruct model was trained on.
//!
//! Only ChatML is implemented (SmolLM2, Qwen): each message is
//! `<|im_start|>{role}\n{content}<|im_end|>\n`, and a generation prompt is
//! `<|im_start|>assistant\n`. Some templates insert a system message when the
//! conversation does not start with one (SmolLM2: "You are a helpful AI
//! assistant named SmolLM, trained by Hugging Face"); [`ChatTemplate::from_jinja`]
//! recognises that pattern in the model's own Jinja template and reproduces it.
//! Anything else in a template (tools, Qwen's thinking switch) is not
//! rendered: [`ChatTemplate::from_jinja`] refuses templates it does not
//! recognise as ChatML.
use crate::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

impl Message {
    /// A message with `role` and `content`.
    pub fn new(role: &str, content: &str) -> Self {
        Message { role: role.into(), content: content.into() }
    }
}

/// A chat template hexlora can render.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ChatTemplate {
    /// ChatML, with the system prompt inserted when the first message is
    /// not a system message (`None`: nothing inserted).
    ChatMl {
        /// System prompt the template adds by default.
        default_system: Option<String>,
    },
}

/// How SmolLM2-style templates open the default system message.
const DEFAULT_SYSTEM_OPEN: &str = "'<|im_start|>system\n";

impl ChatTemplate {
    /// Plain ChatML without a default system prompt.
    pub fn chatml() -> Self {
        ChatTemplate::ChatMl { default_system: None }
    }

    /// Recognises the model's Jinja chat template (GGUF
    /// `tokenizer.chat_template`, or `chat_template` of
    /// `tokenizer_config.json`).
    pub fn from_jinja(jinja: &str) -> Result<Self> {
        if !jinja.contains("<|im_start|>") || !jinja.contains("<|im_end|>") {
            return Err(Error::Unsupported("chat template is not ChatML".into()));
        }
        // The default-system pattern: a branch taken when messages[0] is
        // not a system message, emitting a literal system block.
        let has_default = jinja.contains("messages[0]['role'] != 'system'")
            || jinja.contains("messages[0].role != 'system'")
            || jinja.contains("messages[0]['role'] != \"system\"");
        let default_system = match (has_default, jinja.find(DEFAULT_SYSTEM_OPEN)) {
            (true, Some(at)) => {
                let rest = &jinja[at + DEFAULT_SYSTEM_OPEN.len()..];
                let end = rest.find("<|im_end|>").ok_or_else(|| {
                    Error::Unsupported("chat template: default system message is not closed".into())
                })?;
                Some(rest[..end].to_string())
            }
            _ => None,
        };
        Ok(ChatTemplate::ChatMl { default_system })
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends
    /// with the opening of the assistant's turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> String {
        let ChatTemplate::ChatMl { default_system } = self;
        let mut out = String::new();
        let starts_with_system = messages.first().is_some_and(|m| m.role == "system");
        if let (Some(system), false, false) = (default_system, starts_with_system, messages.is_empty()) {
            push_turn(&mut out, "system", system);
        }
        for m in messages {
            push_turn(&mut out, &m.role, &m.content);
        }
        if add_generation_prompt {
            out.push_str("<|im_start|>assistant\n");
        }
        out
    }
}

fn push_turn(out: &mut String, role: &str, content: &str) {
    out.push_str("<|im_start|>");
    out.push_str(role);
    out.push('\n');
    out.push_str(content);
    out.push_str("<|im_end|>\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_chatml() {
        let t = ChatTemplate::chatml();
        let s = t.render(&[Message::new("user", "hi")], true);
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n");
    }

    #[test]
    fn non_chatml_is_refused() {
        let e = ChatTemplate::from_jinja("{{ bos_token }}[INST] {{ m }} [/INST]").unwrap_err();
        assert!(e.to_string().contains("not ChatML"));
    }
}
