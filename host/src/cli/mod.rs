//! `hexlora` subcommands: one file each; this file only dispatches.
use clap::{Parser, Subcommand};

mod args;
mod bench;
mod grad;
mod hyper_average;
mod hypertrain;
mod info;
mod personalize;
mod train;
mod eval;
mod export_gguf;
mod generate;
mod report;
mod rouge;
mod serve;
mod synth;
mod tokenize;
use std::process::ExitCode;

/// hexlora: on-device LLM personalization.
#[derive(Parser)]
#[command(name = "hexlora", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the version, target, CPU features and the kernel of each product family.
    Info,
    /// Score prediction/reference pairs with ROUGE-1/2/L (rouge-score compatible).
    Rouge(rouge::Args),
    /// Build the bundled benchmarks (quotes-tag, mail-subject, sotu-continue, git-area, commit-subject).
    Bench(bench::Args),
    /// Loss, logits and LoRA gradients of one batch (verify a port against PyTorch + PEFT).
    Grad(grad::Args),
    /// LoRA fine-tuning from JSONL into a PEFT adapter (commits every step, --resume).
    Train(train::Args),
    /// Train the LoRA-synthesizing hypernetwork for a population (SimCSE, then end to end).
    Hypertrain(hypertrain::Args),
    /// Average the weights of checkpoints of one hypertrain run into one hypernetwork.
    HyperAverage(hyper_average::Args),
    /// Synthesize a user's PEFT adapter from their examples with a trained hypernetwork.
    Synth(synth::Args),
    /// The nightly job: split-runtime LoRA training (planner, pacing, commits, resume, report).
    Personalize(personalize::Args),
    /// Generate text from a model, optionally with a LoRA adapter (PEFT or GGUF).
    Generate(generate::Args),
    /// Write a LoRA adapter as a llama.cpp GGUF adapter file.
    ExportGguf(export_gguf::Args),
    /// OpenAI-compatible HTTP server: one resident model, an adapter per user.
    Serve(serve::Args),
    /// Print the token ids of a text (raw or in the chat template) as JSON.
    Tokenize(tokenize::Args),
    /// Evaluate a method on a benchmark split (one result JSON per temperature).
    Eval(eval::Args),
    /// Turn result files into a markdown report with PNG plots.
    Report(report::Args),
}

/// Runs `f` on a worker of rayon's global pool. Called from `main`, every
/// parallel section would be injected into the pool from outside, `main`
/// sleeping until the workers finish: with RAYON_NUM_THREADS=2 that is
/// three threads on two cores, and the spinning workers preempt the one
/// that has the sequential work (measured on `hexlora train`, SmolLM2,
/// 4 steps: ~26,000 involuntary context switches, ~250 when run on a
/// worker). On a worker the caller takes its share of each section.
/// Only for commands whose work never blocks on another thread that needs
/// the pool.
fn on_rayon_worker<R: Send>(f: impl FnOnce() -> R + Send) -> R {
    rayon::scope(|_| f())
}

/// `hexlora train ... | head`: Rust ignores SIGPIPE, so once `head` exits
/// every `println!` fails and panics. Restoring the default action ends the
/// process quietly instead, as `cat` would. Safe for the work: nothing
/// else here writes to a pipe (children get null stdin, the transports use
/// shared memory), and training commits every step, so a rerun resumes.
fn die_quietly_on_closed_stdout() {
    #[cfg(unix)]
    // SAFETY: setting a signal's disposition to its default, before any
    // thread is started.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Parses arguments, runs the subcommand, prints errors in one line.
pub fn main() -> ExitCode {
    hexlora::runtime::allocator::keep_freed_memory();
    die_quietly_on_closed_stdout();
    let cli = Cli::parse();
    let result: anyhow::Result<()> = match cli.command {
        Command::Info => info::run(),
        Command::Rouge(args) => rouge::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Grad(args) => grad::run(args),
        Command::Train(args) => on_rayon_worker(|| train::run(args)),
        Command::Hypertrain(args) => hypertrain::run(args),
        Command::HyperAverage(args) => hyper_average::run(args),
        Command::Synth(args) => synth::run(args),
        Command::Personalize(args) => on_rayon_worker(|| personalize::run(args)),
        Command::Eval(args) => eval::run(args),
        Command::Generate(args) => on_rayon_worker(|| generate::run(args)),
        Command::ExportGguf(args) => export_gguf::run(args),
        Command::Serve(args) => serve::run(args),
        Command::Tokenize(args) => tokenize::run(args),
        Command::Report(args) => report::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
