//! One way to open a model: a `.gguf` file or a Hugging Face directory,
//! read once into its tensor source, configuration, tokenizer and chat
//! template.
use crate::model::chat::ChatTemplate;
use crate::model::config::ModelConfig;
use crate::model::gguf::Gguf;
use crate::model::hf_dir::HfDir;
use crate::model::source::TensorSource;
use crate::model::tokenizer::Tokenizer;
use crate::{Error, Result};
use std::path::{Path, PathBuf};

/// Where a checkpoint's tensors come from.
pub enum Source {
    /// A memory-mapped GGUF file.
    Gguf(Gguf),
    /// A safetensors directory.
    HfDir(HfDir),
}

/// An opened model checkpoint.
pub struct Checkpoint {
    /// What was opened.
    pub path: PathBuf,
    /// The tensors.
    pub source: Source,
    /// Sizes and architecture.
    pub config: ModelConfig,
    /// Jinja chat template (GGUF `tokenizer.chat_template`, or
    /// `chat_template` of `tokenizer_config.json`), if the model has one.
    pub chat_template: Option<String>,
}

impl Checkpoint {
    /// Opens `path`: a `.gguf` file or a directory with `config.json`.
    pub fn open(path: &Path) -> Result<Self> {
        let (source, config, chat_template) = if path.is_dir() {
            let dir = HfDir::open(path)?;
            let config = ModelConfig::from_hf_json(dir.config())?;
            let jinja = std::fs::read_to_string(path.join("tokenizer_config.json"))
                .ok()
                .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
                .and_then(|v| v.get("chat_template").and_then(|t| t.as_str()).map(String::from));
            (Source::HfDir(dir), config, jinja)
        } else if path.extension().is_some_and(|e| e == "gguf") {
            let g = Gguf::open(path)?;
            let config = ModelConfig::from_gguf(&g)?;
            let jinja = g.get_str("tokenizer.chat_template").ok().map(String::from);
            (Source::Gguf(g), config, jinja)
        } else if path.exists() {
            return Err(Error::invalid(path.display().to_string(), "not a .gguf file or a model directory"));
        } else {
            return Err(Error::io(path, std::io::Error::from_raw_os_error(libc::ENOENT)));
        };
        Ok(Checkpoint { path: path.to_path_buf(), source, config, chat_template })
    }

    /// The tensors, in Hugging Face names and shapes.
    pub fn tensors(&self) -> &dyn TensorSource {
        match &self.source {
            Source::Gguf(g) => g,
            Source::HfDir(d) => d,
        }
    }

    /// The chat template hexlora renders for this model (when the
    /// checkpoint has none: Gemma's for Gemma 3, ChatML otherwise; an
    /// error for templates it cannot render).
    pub fn template(&self) -> Result<ChatTemplate> {
        ChatTemplate::for_checkpoint(self.chat_template.as_deref(), super::arch::of(&self.config).default_chat())
    }

    /// The first tensor holding a NaN or an infinity, and the element: a
    /// scan of every weight (tensors that cannot be read are passed over),
    /// to explain a non-finite loss after the fact rather than to run on
    /// every load.
    pub fn first_non_finite(&self) -> Option<(String, usize)> {
        let src = self.tensors();
        src.names().into_iter().find_map(|name| {
            let values = src.get(&name).and_then(|raw| raw.to_f32()).ok()?;
            values.iter().position(|v| !v.is_finite()).map(|i| (name, i))
        })
    }

    /// The tokenizer the checkpoint carries.
    pub fn tokenizer(&self) -> Result<Tokenizer> {
        match &self.source {
            Source::Gguf(g) => Tokenizer::from_gguf(g),
            Source::HfDir(_) => Tokenizer::from_hf_dir(&self.path),
        }
    }
}
