//! Chat templates: turning `[{role, content}]` into the prompt text the
//! instruct model was trained on.
//!
//! Two templates are implemented. ChatML (SmolLM2, Qwen): each message is
//! `<|im_start|>{role}\n{content}<|im_end|>\n`, and a generation prompt is
//! `<|im_start|>assistant\n`. Gemma's: each message is
//! `<start_of_turn>{role}\n{content, trimmed}<end_of_turn>\n` with the
//! assistant's role written `model`, a system message's text (and a blank
//! line) prepended to the first turn after it, and a generation prompt
//! `<start_of_turn>model\n`; the template's leading `<bos>` is left to the
//! tokenizer, which adds it. Some templates insert a system message when the
//! conversation does not start with one (SmolLM2: "You are a helpful AI
//! assistant named SmolLM, trained by Hugging Face"); [`ChatTemplate::from_jinja`]
//! recognises that pattern in the model's own Jinja template and reproduces it.
//! Anything else in a template (tools, Qwen's thinking switch) is not
//! rendered: [`ChatTemplate::from_jinja`] refuses templates it does not
//! recognise as ChatML or Gemma's.
use crate::{Error, Result};

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// The text.
    pub content: String,
}

/// The roles a chat may use: the same rule for training data, `synth`
/// contexts and `serve` requests.
pub const ROLES: [&str; 3] = ["system", "user", "assistant"];

/// `Err` naming `role` when it is not one of [`ROLES`].
pub fn check_role(role: &str) -> std::result::Result<(), String> {
    if ROLES.contains(&role) {
        Ok(())
    } else {
        Err(format!("role {role:?} (one of {})", ROLES.join(", ")))
    }
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
    /// Gemma's turns (Gemma 3 GGUFs often carry no template; this is the
    /// one of Google's Gemma 3 checkpoints, text only).
    Gemma,
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
        if jinja.contains("<start_of_turn>") && jinja.contains("<end_of_turn>") {
            return Ok(ChatTemplate::Gemma);
        }
        if !jinja.contains("<|im_start|>") || !jinja.contains("<|im_end|>") {
            return Err(Error::Unsupported("chat template is neither ChatML nor Gemma's".into()));
        }
        Ok(ChatTemplate::ChatMl { default_system: default_system(jinja) })
    }

    /// The template of a checkpoint whose own Jinja template is `jinja`:
    /// that one if hexlora renders it (an error if not), else its
    /// architecture's `default` ([`crate::model::arch::Architecture::default_chat`]).
    pub fn for_checkpoint(jinja: Option<&str>, default: ChatTemplate) -> Result<Self> {
        match jinja {
            Some(j) => Self::from_jinja(j),
            None => Ok(default),
        }
    }

    /// The text that closes a turn (training appends it to completions).
    pub fn end_of_turn(&self) -> &'static str {
        match self {
            ChatTemplate::ChatMl { .. } => "<|im_end|>",
            ChatTemplate::Gemma => "<end_of_turn>",
        }
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends
    /// with the opening of the assistant's turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> String {
        let default_system = match self {
            ChatTemplate::ChatMl { default_system } => default_system,
            ChatTemplate::Gemma => return render_gemma(messages, add_generation_prompt),
        };
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

/// Gemma's turns: a leading system message becomes a prefix of the first
/// turn after it; contents are trimmed (Jinja's `| trim`), the prefix is not.
fn render_gemma(messages: &[Message], add_generation_prompt: bool) -> String {
    let (prefix, turns) = match messages.split_first() {
        Some((first, rest)) if first.role == "system" => (format!("{}\n\n", first.content), rest),
        _ => (String::new(), messages),
    };
    let mut out = String::new();
    for (i, m) in turns.iter().enumerate() {
        let role = if m.role == "assistant" { "model" } else { &m.role };
        out.push_str("<start_of_turn>");
        out.push_str(role);
        out.push('\n');
        if i == 0 {
            out.push_str(&prefix);
        }
        out.push_str(m.content.trim());
        out.push_str("<end_of_turn>\n");
    }
    if add_generation_prompt {
        out.push_str("<start_of_turn>model\n");
    }
    out
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
    fn unknown_templates_are_refused() {
        let e = ChatTemplate::from_jinja("{{ bos_token }}[INST] {{ m }} [/INST]").unwrap_err();
        assert!(e.to_string().contains("neither ChatML nor Gemma"));
    }

    /// The text Gemma 3's Jinja template renders (without its `<bos>`) for
    /// a system prompt, two user turns and an assistant turn.
    #[test]
    fn gemma_turns() {
        let t = ChatTemplate::from_jinja("{{ bos_token }}...'<start_of_turn>' + role + '\\n'...'<end_of_turn>\\n'").unwrap();
        assert_eq!(t, ChatTemplate::Gemma);
        let m = [
            Message::new("system", "Be brief."),
            Message::new("user", "  Hi there \n"),
            Message::new("assistant", "Hello."),
            Message::new("user", "Bye"),
        ];
        assert_eq!(
            t.render(&m, true),
            "<start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
        );
        assert_eq!(t.render(&m[1..2], false), "<start_of_turn>user\nHi there<end_of_turn>\n");
    }
}
