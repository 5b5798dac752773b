//! `hexlora report`: result JSON files -> markdown table + PNG plots.
use hexlora::eval::report::write_report;
use hexlora::eval::result::RunResult;
use std::path::PathBuf;

/// Turn result files into a markdown report with plots.
#[derive(clap::Args)]
pub struct Args {
    /// Result files written by `hexlora eval` (or any producer of the schema),
    /// each PATH or NAME=PATH: NAME replaces the method's name in the
    /// report, so two runs of one method (a variant) can sit in one group.
    #[arg(required = true, value_parser = parse_result)]
    results: Vec<(Option<String>, PathBuf)>,
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

/// `NAME=PATH` (a name without `/` or `=`) or a plain path.
fn parse_result(s: &str) -> Result<(Option<String>, PathBuf), String> {
    match s.split_once('=') {
        Some((name, path)) if !name.contains('/') => match name.is_empty() || path.is_empty() {
            true => Err(format!("expected NAME=PATH or PATH, got {s:?}")),
            false => Ok((Some(name.to_string()), PathBuf::from(path))),
        },
        _ => Ok((None, PathBuf::from(s))),
    }
}

/// Reads each result, renamed where the argument named it; two runs of
/// one name in one (task, split, temperature) group are refused, since
/// every row and comparison is keyed by the name.
fn read_results(args: &[(Option<String>, PathBuf)]) -> anyhow::Result<Vec<RunResult>> {
    let mut results: Vec<RunResult> = Vec::new();
    for (name, path) in args {
        let mut r = RunResult::read(path)?;
        if let Some(name) = name {
            r.method = name.clone();
        }
        let same = |o: &RunResult| o.method == r.method && o.task == r.task && o.split == r.split && o.decoding.temperature == r.decoding.temperature;
        if results.iter().any(same) {
            let msg = format!("a second run named {:?} for {} {} T={}: name it NAME={}", r.method, r.task, r.split, r.decoding.temperature, path.display());
            return Err(hexlora::Error::invalid(path.display().to_string(), msg).into());
        }
        results.push(r);
    }
    Ok(results)
}

/// Reads every result and writes the report.
pub fn run(args: Args) -> anyhow::Result<()> {
    let results = read_results(&args.results)?;
    let mut inputs: Vec<(&str, &std::path::Path)> = args.results.iter().map(|(_, p)| ("result", p.as_path())).collect();
    inputs.extend(args.metrics.iter().map(|(_, p)| ("--metrics", p.as_path())));
    hexlora::base::outputs::check_output(&args.out.join("report.md"), &inputs, args.force)?;
    let path = write_report(&args.out, &results, Some(&args.baseline), &args.metrics)?;
    println!("{}", path.display());
    Ok(())
}
