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

/// How templates open a literal system block, with the newline written
/// raw (SmolLM2's GGUF) or as a Jinja escape (tokenizer_config.json files).
const SYSTEM_OPENINGS: [&str; 2] = ["'<|im_start|>system\n", "'<|im_start|>system\\n"];

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
        Ok(ChatTemplate::ChatMl { default_system: default_system(jinja) })
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

/// The system prompt a template writes as a literal: the first system
/// block whose text up to `<|im_end|>` is plain (no quote, so no Jinja
/// expression is spliced in, as in `'<|im_start|>system\n' + content`).
fn default_system(jinja: &str) -> Option<String> {
    for open in SYSTEM_OPENINGS {
        for (at, _) in jinja.match_indices(open) {
            let rest = &jinja[at + open.len()..];
            let Some(end) = rest.find("<|im_end|>") else { continue };
            let text = &rest[..end];
            if !text.contains(['\'', '"', '{', '}']) {
                return Some(text.replace("\\n", "\n"));
            }
        }
    }
    None
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
    fn default_system_prompts() {
        // Qwen2.5 style: escaped newlines, default system in an else branch.
        let qwen25 = "{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud.<|im_end|>\\n' }}{%- endif %}";
        let t = ChatTemplate::from_jinja(qwen25).unwrap();
        assert_eq!(t, ChatTemplate::ChatMl { default_system: Some("You are Qwen, created by Alibaba Cloud.".into()) });
        // Qwen3 style: system block only when the user gives one.
        let qwen3 = "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}{%- endif %}";
        assert_eq!(ChatTemplate::from_jinja(qwen3).unwrap(), ChatTemplate::chatml());
        let t = ChatTemplate::ChatMl { default_system: Some("S".into()) };
        assert_eq!(t.render(&[], true), "<|im_start|>assistant\n");
        assert_eq!(
            t.render(&[Message::new("system", "X"), Message::new("user", "u")], false),
            "<|im_start|>system\nX<|im_end|>\n<|im_start|>user\nu<|im_end|>\n"
        );
    }

    #[test]
    fn non_chatml_is_refused() {
        let e = ChatTemplate::from_jinja("{{ bos_token }}[INST] {{ m }} [/INST]").unwrap_err();
        assert!(e.to_string().contains("not ChatML"));
    }
}
