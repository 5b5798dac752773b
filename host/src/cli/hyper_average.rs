//! `hexlora hyper-average`: one hypernetwork whose weights are the mean of
//! several checkpoints of one run (`hypertrain --keep-dev-checkpoints`).
use hexlora::hyper::average::{average_checkpoints, SOURCES_FILE};
use hexlora::hyper::hypernet::{CONFIG_FILE, WEIGHTS_FILE};
use hexlora::train::learner::claim_out_dir;
use std::path::PathBuf;

/// Arguments of `hexlora hyper-average`.
#[derive(clap::Args)]
pub struct Args {
    /// Hypernetwork directories of one run (at least two), e.g.
    /// `H/hypernet-step100 H/hypernet-step150 H/hypernet-step200`.
    #[arg(required = true, num_args = 2..)]
    checkpoints: Vec<PathBuf>,
    /// Hypernetwork directory to write (hypernet.json, hypernet.safetensors, average.json).
    #[arg(long)]
    out: PathBuf,
    /// Overwrite a hypernetwork already in --out.
    #[arg(long)]
    force: bool,
}

/// Runs `hexlora hyper-average`.
pub fn run(args: Args) -> anyhow::Result<()> {
    // Read and checked first: a refused set leaves no --out behind.
    let averaged = average_checkpoints(&args.checkpoints)?;
    // The files, not the directories: `--out` one of the checkpoints would
    // replace its files, which a directory input does not catch.
    let files: Vec<PathBuf> = args.checkpoints.iter().flat_map(|d| [d.join(CONFIG_FILE), d.join(WEIGHTS_FILE)]).collect();
    let inputs: Vec<(&str, &std::path::Path)> = files.iter().map(|f| ("checkpoint", f.as_path())).collect();
    claim_out_dir(&args.out, &[CONFIG_FILE, WEIGHTS_FILE, SOURCES_FILE], &inputs, args.force)?;
    averaged.write(&args.out)?;
    eprintln!("wrote the mean of {} checkpoints to {}", args.checkpoints.len(), args.out.display());
    Ok(())
}
