//! The [`Encoder`] of a model file: its tokenizer and chat template, for
//! training on text JSONL.
use super::data::{Encoder, Message};
use crate::model::chat::ChatTemplate;
use crate::model::gguf::Gguf;
use crate::model::tokenizer::Tokenizer;
use crate::Result;
use std::path::Path;

/// Tokenizer + chat template of one model.
pub struct ModelText {
    tokenizer: Tokenizer,
    chat: ChatTemplate,
}

impl ModelText {
    /// From a GGUF file's metadata or a Hugging Face directory's
    /// `tokenizer.json`; the chat template falls back to ChatML.
    pub fn open(path: &Path) -> Result<Self> {
        if path.is_dir() {
            let chat = std::fs::read_to_string(path.join("tokenizer_config.json"))
                .ok()
                .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
                .and_then(|v| v.get("chat_template").and_then(|t| t.as_str()).map(String::from))
                .and_then(|j| ChatTemplate::from_jinja(&j).ok())
                .unwrap_or_else(ChatTemplate::chatml);
            return Ok(ModelText { tokenizer: Tokenizer::from_hf_dir(path)?, chat });
        }
        let g = Gguf::open(path)?;
        let chat = g.get_str("tokenizer.chat_template").ok().and_then(|j| ChatTemplate::from_jinja(j).ok()).unwrap_or_else(ChatTemplate::chatml);
        Ok(ModelText { tokenizer: Tokenizer::from_gguf(&g)?, chat })
    }
}

impl Encoder for ModelText {
    fn encode(&self, text: &str) -> Result<Vec<u32>> {
        self.tokenizer.encode(text)
    }

    fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        Ok(self.chat.render(messages, add_generation_prompt))
    }

    fn end_of_turn(&self) -> String {
        // Every template we support is ChatML.
        "<|im_end|>".into()
    }
}
