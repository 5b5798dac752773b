//! `hexlora rouge --pairs FILE.jsonl`: rouge-score-identical F-measures.
use hexlora::eval::rouge::score_jsonl;
use hexlora::Error;
use std::io::BufReader;
use std::path::PathBuf;

/// Score (prediction, reference) pairs with ROUGE-1/2/L (stemming on).
#[derive(clap::Args)]
pub struct Args {
    /// JSONL file, one `{"prediction": .., "reference": ..}` per line; `-` for stdin.
    #[arg(long)]
    pairs: PathBuf,
}

/// Writes one `{"rouge1","rouge2","rougeL"}` JSON line per pair to stdout.
pub fn run(args: Args) -> anyhow::Result<()> {
    let stdout = std::io::stdout().lock();
    let out = std::io::BufWriter::new(stdout);
    if args.pairs.as_os_str() == "-" {
        score_jsonl(std::io::stdin().lock(), "stdin", out)?;
    } else {
        let file = std::fs::File::open(&args.pairs).map_err(|e| Error::io(&args.pairs, e))?;
        score_jsonl(BufReader::new(file), &args.pairs.display().to_string(), out)?;
    }
    Ok(())
}
