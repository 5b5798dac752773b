//! `hexlora generate`: text from a GGUF file or a Hugging Face directory,
//! optionally with a user's LoRA adapter (PEFT directory or llama.cpp GGUF
//! file) applied beside the frozen weights; the prompt wrapped in the
//! model's chat template, output streamed as it is produced.
use super::args::{finite, fraction, non_negative, usize_in, MAX_TOKENS};
use hexlora::lora::Adapter;
use hexlora::model::assistant::{Assistant, Request};
use hexlora::model::chat::Message;
use hexlora::model::checkpoint::Checkpoint;
use hexlora::model::generate::Sampling;
use anyhow::Context;
use clap::Args as ClapArgs;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `hexlora generate`.
#[derive(ClapArgs)]
pub struct Args {
    /// A `.gguf` file or a Hugging Face model directory.
    #[arg(long)]
    model: PathBuf,
    /// A LoRA adapter: a PEFT directory or a llama.cpp `.gguf` adapter.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// Multiplies the adapter's own scaling (alpha / r); finite.
    #[arg(long, default_value_t = 1.0, requires = "adapter", value_parser = finite)]
    adapter_scale: f32,
    /// The user message (or the raw prompt with --raw).
    #[arg(long)]
    prompt: String,
    /// Most tokens to generate, >= 1; with the prompt they must fit the
    /// model's max_position_embeddings.
    #[arg(long, default_value_t = 128, value_parser = usize_in(1..=MAX_TOKENS))]
    max_tokens: usize,
    /// Sampling temperature, finite and >= 0; 0 is greedy.
    #[arg(long, default_value_t = 0.0, value_parser = non_negative)]
    temperature: f32,
    /// Nucleus sampling mass, in (0, 1].
    #[arg(long, default_value_t = 1.0, value_parser = fraction)]
    top_p: f32,
    /// Seed of the sampling stream.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// End the answer before this string (repeatable).
    #[arg(long)]
    stop: Vec<String>,
    /// Feed the prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let ckpt = Checkpoint::open(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let positions = ckpt.config.max_position_embeddings;
    let too_many = |room: String| Err(hexlora::Error::invalid("--max-tokens", format!("{} {room} in the model's {positions} positions (max_position_embeddings)", args.max_tokens)).into());
    // A prompt holds at least one token: refused before the model is loaded.
    if args.max_tokens >= positions {
        return too_many("leaves no room for a prompt".into());
    }
    let assistant = Assistant::load(&ckpt).with_context(|| format!("loading {}", args.model.display()))?;
    let adapter = match &args.adapter {
        Some(p) => {
            let ad = Adapter::open(p, &ckpt.config).with_context(|| format!("loading adapter {}", p.display()))?;
            Some(assistant.prepare(&ad, args.adapter_scale).with_context(|| format!("applying adapter {}", p.display()))?)
        }
        None => None,
    };
    let prompt = if args.raw { assistant.raw_prompt(&args.prompt)? } else { assistant.chat_prompt(&[Message::new("user", &args.prompt)])? };
    if prompt.len() + args.max_tokens > positions {
        return too_many(format!("does not fit after the {}-token prompt", prompt.len()));
    }
    let req = Request {
        prompt,
        max_tokens: args.max_tokens,
        sampling: Sampling { temperature: args.temperature, top_p: args.top_p, seed: args.seed },
        stop: args.stop,
    };
    let mut stdout = std::io::stdout();
    let answer = assistant.complete(&req, adapter.as_ref(), |piece| {
        let _ = write!(stdout, "{piece}");
        let _ = stdout.flush();
        true
    })
    .map_err(|e| super::train::explain_non_finite(e.into(), &args.model))?;
    println!();
    // The first generated token comes out of the prefill; the rest are decoding steps.
    let steps = answer.completion_tokens.saturating_sub(1);
    eprintln!(
        "[{} prompt tokens in {:.3} s ({:.1} tok/s), {} generated in {:.3} s ({:.1} tok/s), finish: {}]",
        answer.prompt_tokens,
        answer.prompt_seconds,
        answer.prompt_tokens as f64 / answer.prompt_seconds,
        answer.completion_tokens,
        answer.decode_seconds,
        steps as f64 / answer.decode_seconds.max(1e-9),
        answer.finish.as_str()
    );
    Ok(())
}
