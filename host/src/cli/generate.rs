//! `hexlora generate`: text generation from a GGUF file or a Hugging Face
//! directory, the prompt wrapped in the model's chat template, output
//! streamed as it is produced.
use anyhow::Context;
use clap::Args as ClapArgs;
use crate::model::chat::{ChatTemplate, Message};
use crate::model::decoder::Model;
use crate::model::generate::{generate, Sampling};
use crate::model::gguf::Gguf;
use crate::model::tokenizer::Tokenizer;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `hexlora generate`.
#[derive(ClapArgs)]
pub struct Args {
    /// A `.gguf` file or a Hugging Face model directory.
    #[arg(long)]
    model: PathBuf,
    /// The user message (or the raw prompt with --raw).
    #[arg(long)]
    prompt: String,
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampling stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Feed the prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
}

/// Loads tokenizer and chat template from where the model came from.
fn tokenizer_and_template(path: &Path) -> anyhow::Result<(Tokenizer, Option<String>)> {
    if path.is_dir() {
        let tok = Tokenizer::from_hf_dir(path)?;
        let cfg = std::fs::read_to_string(path.join("tokenizer_config.json")).ok();
        let jinja = cfg
            .and_then(|s| serde_json::from_str::<serde_json::Value>(&s).ok())
            .and_then(|v| v.get("chat_template").and_then(|t| t.as_str()).map(String::from));
        Ok((tok, jinja))
    } else {
        let g = Gguf::open(path)?;
        let jinja = g.get_str("tokenizer.chat_template").ok().map(String::from);
        Ok((Tokenizer::from_gguf(&g)?, jinja))
    }
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let model = Model::open(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let (tok, jinja) = tokenizer_and_template(&args.model)?;
    let text = if args.raw {
        args.prompt.clone()
    } else {
        let template = match jinja {
            Some(j) => ChatTemplate::from_jinja(&j)?,
            None => ChatTemplate::chatml(),
        };
        template.render(&[Message::new("user", &args.prompt)], true)
    };
    let prompt = tok.encode(&text)?;
    let sampling = Sampling { temperature: args.temperature, top_p: args.top_p, seed: args.seed };
    let mut stop: Vec<u32> = model.config.eos_token_ids.clone();
    stop.extend(tok.eos_id);
    stop.extend(tok.token_to_id("<|im_end|>"));

    // Stream: re-decode the whole continuation and print what is new, so
    // multi-token characters come out whole.
    let mut ids = Vec::new();
    let mut printed = 0;
    let mut stdout = std::io::stdout();
    let start = std::time::Instant::now();
    let new = generate(&model, &prompt, args.max_tokens, &sampling, &stop, |id| {
        ids.push(id);
        if let Ok(s) = tok.decode(&ids, true) {
            if s.len() > printed && s.is_char_boundary(printed) {
                let _ = write!(stdout, "{}", &s[printed..]);
                let _ = stdout.flush();
                printed = s.len();
            }
        }
    })?;
    let secs = start.elapsed().as_secs_f64();
    println!();
    eprintln!(
        "[{} prompt tokens, {} generated, {:.1} tokens/s]",
        prompt.len(),
        new.len(),
        (prompt.len() + new.len()) as f64 / secs
    );
    Ok(())
}
