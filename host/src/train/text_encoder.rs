//! The [`Encoder`] of a model file: its tokenizer and chat template, for
//! training on text JSONL.
use super::data::{Encoder, Message};
use crate::model::chat::ChatTemplate;
use crate::model::checkpoint::Checkpoint;
use crate::model::tokenizer::Tokenizer;
use crate::Result;
use std::path::Path;

/// Tokenizer + chat template of one model.
pub struct ModelText {
    tokenizer: Tokenizer,
    /// The model's template, or why it cannot be used. Kept as an error
    /// rather than failing `open`: prompt/completion data never needs it.
    chat: std::result::Result<ChatTemplate, String>,
}

/// ChatML when the model names no template (SmolLM2 and Qwen ship ChatML;
/// Gemma's for a Gemma 3 file); a template we do not implement is an
/// error at first use, never silently replaced by ChatML, since training
/// on the wrong template teaches the model the wrong turn markers.
fn chat_from(jinja: Option<&str>, default: ChatTemplate) -> std::result::Result<ChatTemplate, String> {
    ChatTemplate::for_checkpoint(jinja, default).map_err(|e| e.to_string())
}

impl ModelText {
    /// From a GGUF file's metadata or a Hugging Face directory's
    /// `tokenizer.json`; see [`chat_from`] for the chat template.
    pub fn open(path: &Path) -> Result<Self> {
        Self::of(&Checkpoint::open(path)?)
    }

    /// The tokenizer and chat template `ckpt` carries.
    pub fn of(ckpt: &Checkpoint) -> Result<Self> {
        Ok(ModelText { tokenizer: ckpt.tokenizer()?, chat: chat_from(ckpt.chat_template.as_deref(), crate::model::arch::of(&ckpt.config).default_chat()) })
    }
}

impl Encoder for ModelText {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text)
    }

    fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        match &self.chat {
            Ok(chat) => Ok(chat.render(messages, add_generation_prompt)),
            Err(why) => Err(crate::Error::Unsupported(format!("chat data needs the model's chat template: {why}"))),
        }
    }

    fn end_of_turn(&self) -> String {
        // Without a usable template there is no chat data; ChatML's marker
        // keeps prompt/completion data as it was.
        self.chat.as_ref().map_or("<|im_end|>", ChatTemplate::end_of_turn).into()
    }
}

#[cfg(test)]
mod tests {
    use super::{chat_from, ChatTemplate};
    use crate::model::arch::Architecture;
    use crate::model::{gemma3::Gemma3, llama::Llama, qwen35::Qwen35};

    #[test]
    fn missing_template_is_chatml_or_gemmas_and_foreign_template_is_refused() {
        for arch in [&Llama as &dyn Architecture, &Qwen35] {
            assert_eq!(chat_from(None, arch.default_chat()), Ok(ChatTemplate::chatml()), "{}", arch.name());
        }
        assert_eq!(chat_from(None, Gemma3.default_chat()), Ok(ChatTemplate::Gemma));
        let llama3 = "{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>{% endfor %}";
        let why = chat_from(Some(llama3), Llama.default_chat()).unwrap_err();
        assert!(why.contains("neither ChatML nor Gemma"), "{why}");
        assert!(chat_from(Some("{{ '<|im_start|>' + m + '<|im_end|>' }}"), Llama.default_chat()).is_ok());
    }
}
