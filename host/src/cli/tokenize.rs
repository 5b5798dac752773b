//! `hexlora tokenize`: the token ids a model's tokenizer gives a text (raw,
//! or wrapped in the chat template as a user message), as a JSON array, for
//! token-id training data and for comparing against other tools.
use hexlora::model::chat::Message;
use hexlora::model::checkpoint::Checkpoint;
use anyhow::Context;
use std::path::PathBuf;

/// Arguments of `hexlora tokenize`.
#[derive(clap::Args)]
pub struct Args {
    /// A `.gguf` file or a Hugging Face model directory.
    #[arg(long)]
    model: PathBuf,
    /// Wrap the text in the chat template as a user message, ending with
    /// the opening of the assistant's turn (what `generate` feeds).
    #[arg(long)]
    chat: bool,
    /// The text.
    text: String,
}

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let ckpt = Checkpoint::open(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let tok = ckpt.tokenizer()?;
    let text = if args.chat {
        ckpt.template()?.render(&[Message::new("user", &args.text)], true)
    } else {
        args.text
    };
    println!("{}", serde_json::to_string(&tok.encode(&text)?)?);
    Ok(())
}
