//! `hexlora bench build --out DIR`: the bundled benchmarks from packaged text.
use hexlora::eval::bench::{self, commit_subject, git_area, mail, quotes, sotu};
use std::path::{Path, PathBuf};

/// Build the bundled benchmarks.
#[derive(clap::Args)]
pub struct Args {
    #[command(subcommand)]
    action: Action,
}

#[derive(clap::Subcommand)]
enum Action {
    /// Write quotes-tag, mail-subject, sotu-continue, git-area and commit-subject in LaMP format under OUT/<name>/.
    Build(BuildArgs),
}

#[derive(clap::Args)]
struct BuildArgs {
    /// Output directory (one sub-directory per benchmark).
    #[arg(long)]
    out: PathBuf,
    /// Build only these benchmarks (comma-separated); default all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Seed of the user split and held-out choice.
    #[arg(long, default_value_t = 20261129)]
    seed: u64,
    /// Debian `fortunes` directory.
    #[arg(long, default_value = quotes::DEFAULT_DIR)]
    fortunes_dir: PathBuf,
    /// The spam-assassin package's `data/` directory.
    #[arg(long, default_value = mail::DEFAULT_DIR)]
    spam_dir: PathBuf,
    /// The sotu package's `data/` directory.
    #[arg(long, default_value = sotu::DEFAULT_DIR)]
    sotu_dir: PathBuf,
    /// The gunzipped shortlog of Debian `git` (toolchain/fetch-bench-data.sh).
    #[arg(long, default_value = git_area::DEFAULT_PATH)]
    git_shortlog: PathBuf,
    /// Directory of the gunzipped git logs, one PACKAGE.txt each.
    #[arg(long, default_value = commit_subject::DEFAULT_DIR)]
    gitlog_dir: PathBuf,
    /// Replace a benchmark directory that already exists in --out.
    #[arg(long)]
    force: bool,
}

/// Builds and writes each requested benchmark, printing its counts.
pub fn run(args: Args) -> anyhow::Result<()> {
    let Action::Build(a) = args.action;
    let all = ["quotes-tag", "mail-subject", "sotu-continue", "git-area", "commit-subject"];
    for name in &a.only {
        anyhow::ensure!(all.contains(&name.as_str()), "unknown benchmark {name:?} (known: {})", all.join(", "));
    }
    for name in all.iter().filter(|n| a.only.is_empty() || a.only.iter().any(|o| o == *n)) {
        let built = match *name {
            "quotes-tag" => quotes::build_from_dir(&a.fortunes_dir, a.seed)?,
            "mail-subject" => mail::build_from_dir(&a.spam_dir, a.seed)?,
            "sotu-continue" => sotu::build_from_dir(&a.sotu_dir, a.seed)?,
            "git-area" => git_area::build_from_path(&a.git_shortlog, a.seed)?,
            _ => commit_subject::build_from_dir(&a.gitlog_dir, a.seed)?,
        };
        let dir = a.out.join(name);
        let inputs = [
            ("--fortunes-dir", a.fortunes_dir.as_path()),
            ("--spam-dir", a.spam_dir.as_path()),
            ("--sotu-dir", a.sotu_dir.as_path()),
            ("--git-shortlog", a.git_shortlog.as_path()),
            ("--gitlog-dir", a.gitlog_dir.as_path()),
        ];
        hexlora::base::outputs::check_output(&dir, &inputs, a.force)?;
        bench::write(&dir, &built)?;
        report(name, &dir, &built.manifest);
    }
    Ok(())
}

fn report(name: &str, dir: &Path, m: &bench::Manifest) {
    let counts: Vec<String> = m.users.iter().map(|(s, u)| format!("{s} {u} users/{} questions", m.questions[s])).collect();
    println!("{name}: {} -> {}", counts.join(", "), dir.display());
}
