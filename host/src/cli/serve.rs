//! `hexlora serve`: an OpenAI-compatible HTTP server answering with the
//! base model or a user's LoRA adapter (see [`hexlora::serve`]).
use std::path::PathBuf;

/// Arguments of `hexlora serve`.
#[derive(clap::Args)]
pub struct Args {
    /// The base model: a `.gguf` file or a Hugging Face directory.
    #[arg(long)]
    model: PathBuf,
    /// A user's adapter as NAME=PATH (PEFT directory or `.gguf`); requests
    /// pick it with `"model": "NAME"`. Repeatable.
    #[arg(long, value_parser = parse_adapter)]
    adapter: Vec<(String, PathBuf)>,
    /// Address to bind.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port; 0 picks a free one (the address is printed).
    #[arg(long, default_value_t = 8080)]
    port: u16,
    /// Requests that may wait behind the one being answered (more get 429).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=4096))]
    queue: u64,
    /// Prompt plus answer tokens one request may use, at most the model's
    /// max_position_embeddings [default: 2048, or the model's positions if fewer].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    ctx_size: Option<u64>,
    /// The only directory `POST /v1/adapters/NAME` may load adapters from
    /// (paths in requests are resolved inside it). Without it, adapters are
    /// fixed at start-up by --adapter.
    #[arg(long)]
    adapter_dir: Option<PathBuf>,
    /// Require `Authorization: Bearer KEY` on every route but /health (also
    /// read from HEXLORA_API_KEY, which keeps it out of the process list).
    #[arg(long, env = "HEXLORA_API_KEY", hide_env_values = true)]
    api_key: Option<String>,
    /// `max_tokens` for requests that give none.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    max_tokens: u64,
}

fn parse_adapter(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s.split_once('=').ok_or_else(|| format!("{s:?}: expected NAME=PATH"))?;
    Ok((name.to_string(), PathBuf::from(path)))
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    hexlora::serve::run(hexlora::serve::Config {
        model: args.model,
        adapters: args.adapter,
        host: args.host,
        port: args.port,
        queue: args.queue as usize,
        ctx_size: args.ctx_size.map(|c| c as usize),
        default_max_tokens: args.max_tokens as usize,
        adapter_dir: args.adapter_dir,
        api_key: args.api_key,
    })?;
    Ok(())
}
