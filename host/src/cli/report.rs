//! `hexlora report`: result JSON files -> markdown table + PNG plots.
use hexlora::eval::report::write_report;
use hexlora::eval::result::RunResult;
use std::path::PathBuf;

/// Turn result files into a markdown report with plots.
#[derive(clap::Args)]
pub struct Args {
    /// Result files written by `hexlora eval` (or any producer of the schema).
    #[arg(required = true)]
    results: Vec<PathBuf>,
    /// Method every other method is compared with (breadth, significance).
    #[arg(long, default_value = "common-lora")]
    baseline: String,
    /// Training metrics to plot as loss curves, as NAME=PATH/metrics.jsonl.
    #[arg(long, value_parser = parse_named)]
    metrics: Vec<(String, PathBuf)>,
    /// Output directory for report.md and the PNGs.
    #[arg(long)]
    out: PathBuf,
    /// Replace a report.md (and its PNGs) that already exists in --out.
    #[arg(long)]
    force: bool,
}

fn parse_named(s: &str) -> Result<(String, PathBuf), String> {
    let (name, path) = s.split_once('=').ok_or_else(|| format!("expected NAME=PATH, got {s:?}"))?;
    Ok((name.to_string(), PathBuf::from(path)))
}

/// Reads every result and writes the report.
pub fn run(args: Args) -> anyhow::Result<()> {
    let results = args.results.iter().map(|p| RunResult::read(p)).collect::<hexlora::Result<Vec<_>>>()?;
    let mut inputs: Vec<(&str, &std::path::Path)> = args.results.iter().map(|p| ("result", p.as_path())).collect();
    inputs.extend(args.metrics.iter().map(|(_, p)| ("--metrics", p.as_path())));
    hexlora::base::outputs::check_output(&args.out.join("report.md"), &inputs, args.force)?;
    let path = write_report(&args.out, &results, Some(&args.baseline), &args.metrics)?;
    println!("{}", path.display());
    Ok(())
}
