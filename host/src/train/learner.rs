//! The one training loop. AdamW ([`super::trainer`]), MeZO
//! ([`super::mezo_loop`]), the hypernetwork's stages
//! ([`crate::hyper::trainer`]) and the evaluation's per-user runs each
//! supply their state and their step; the [`Learner`] owns everything
//! around it: resume with a fingerprint check, a commit after every step
//! (or every N), `metrics.jsonl`, the progress bar, the caller's hooks
//! (pacing, stop signals, per-step accounting) and the final outputs.
use crate::base::atomic_write::write_atomic;
use super::metrics::{loss_svg, write_metrics};
use crate::{Error, Result};
use serde::Serialize;
use std::path::Path;

/// One step's figures: a `metrics.jsonl` line, a point of the loss curve.
pub trait Record: Clone + Serialize {
    /// The loss plotted in `loss.svg`.
    fn loss(&self) -> f32;
    /// The progress bar's message after this step.
    fn progress(&self) -> String;
}

/// The whole state of a run: committed after a step, resumed from later.
pub trait Checkpointed: Sized {
    /// What each step records.
    type Record: Record;
    /// Steps done.
    fn step(&self) -> u64;
    /// Every step's record so far (the commit holds them too).
    fn history(&self) -> &[Self::Record];
    /// Whether the records may begin after step 0: a federated
    /// hypernetwork worker starts at the global step it is given and
    /// records only the steps it ran. Every other run records each step.
    fn records_may_start_late(&self) -> bool {
        false
    }
    /// Appends a finished step's record.
    fn push(&mut self, record: Self::Record);
    /// Identifies the configuration and data the run was started with.
    fn fingerprint(&self) -> &str;
    /// Writes `out/commit.safetensors` atomically.
    fn commit(&self, out: &Path) -> Result<()>;
    /// The run's product once the last step is done (`adapter/`, `hypernet/`).
    fn save_final(&self, out: &Path) -> Result<()>;
}

/// [`Checkpointed`] for a LoRA run's state (AdamW's, MeZO's): fields
/// `adapter`, `history` (of [`super::commit::StepRecord`]) and
/// `fingerprint`, its own `commit`, and `$step` giving the steps done; the
/// product is the PEFT adapter in `out/adapter`.
macro_rules! adapter_run_checkpointed {
    ($state:ty, |$s:ident| $step:expr) => {
        impl $crate::train::learner::Checkpointed for $state {
            type Record = $crate::train::commit::StepRecord;
            fn step(&self) -> u64 {
                let $s = self;
                $step
            }
            fn history(&self) -> &[Self::Record] {
                &self.history
            }
            fn push(&mut self, record: Self::Record) {
                self.history.push(record);
            }
            fn fingerprint(&self) -> &str {
                &self.fingerprint
            }
            fn commit(&self, out: &std::path::Path) -> $crate::Result<()> {
                <$state>::commit(self, out)
            }
            fn save_final(&self, out: &std::path::Path) -> $crate::Result<()> {
                self.adapter.save(&out.join("adapter"))
            }
        }
    };
}
pub(crate) use adapter_run_checkpointed;

/// What a caller sees at step boundaries. Both default to doing nothing.
pub trait StepHooks<S> {
    /// Before step `next` (1-based), after the previous commit. May block
    /// (thermal pacing); false ends the run here, resumable later.
    fn before_step(&mut self, _next: u64) -> bool {
        true
    }
    /// After a step is recorded (and committed, unless `commit_every`
    /// skips it).
    fn after_step(&mut self, _state: &S) -> Result<()> {
        Ok(())
    }
}

/// Hooks that only watch finished steps: `AfterStep(|state| ...)`.
pub struct AfterStep<F>(pub F);

impl<S, F: FnMut(&S) -> Result<()>> StepHooks<S> for AfterStep<F> {
    fn after_step(&mut self, state: &S) -> Result<()> {
        (self.0)(state)
    }
}

/// Options a caller passes besides the configuration.
pub struct RunOptions<'a, S> {
    /// Continue from the commit in the output directory.
    pub resume: bool,
    /// Show an indicatif progress bar.
    pub progress: bool,
    /// Stop after this many steps in this invocation (tests).
    pub stop_after: Option<u64>,
    /// Commit every N steps and the last one (1: every step). A large
    /// state (the hypernetwork and its moments) can cost more to write
    /// than a step.
    pub commit_every: u64,
    /// Pacing, stop signals, accounting.
    pub hooks: Option<&'a mut dyn StepHooks<S>>,
}

impl<S> RunOptions<'_, S> {
    /// A fresh run without progress bar or hooks, committing every step.
    pub fn quiet() -> Self {
        RunOptions { resume: false, progress: false, stop_after: None, commit_every: 1, hooks: None }
    }
}

/// The resumed state in `out` when `resume` is set and its fingerprint is
/// `fp`; otherwise `fresh()`, unless `out` already holds a commit.
pub fn open_state<S: Checkpointed>(out: &Path, fp: &str, resume: bool, loaded: Option<S>, fresh: impl FnOnce() -> Result<S>) -> Result<S> {
    match loaded {
        Some(s) if resume => {
            if s.fingerprint() != fp {
                let what = super::fingerprint::difference(s.fingerprint(), fp);
                return Err(Error::invalid("--resume", format!("the commit in {} was made with different inputs: {what}; rerun with the inputs it was made with, or start over in another --out", out.display())));
            }
            Ok(s)
        }
        Some(_) => Err(Error::invalid(out.display().to_string(), format!("holds a run's commit ({}); pass --resume to continue it or choose another --out", super::commit::COMMIT_FILE))),
        None if resume => Err(Error::invalid("--resume", format!("{} holds no run's commit, so there is nothing to resume; leave out --resume to start a run there", out.display()))),
        None => fresh(),
    }
}

/// What an adapter run (AdamW, MeZO, the nightly job) writes beside its
/// commit.
pub const ADAPTER_RUN_OUTPUTS: &[&str] = &["adapter", "metrics.jsonl", "loss.svg"];

/// Takes `out` as a run directory before any work: a directory holding any
/// of `outputs` without a commit that owns them (another run's results, a
/// copied adapter) is refused unless `force`, since the run would overwrite
/// them; a directory with a commit is left to [`open_state`] (resume or
/// refuse). Never, `force` or not, when an output (or the commit) would be
/// one of `inputs` (option name, path) or hold one. Creates `out` and checks
/// that a file can be written in it.
pub fn claim_out_dir(out: &Path, outputs: &[&str], inputs: &[(&str, &Path)], force: bool) -> Result<()> {
    crate::base::outputs::check_run_outputs(out, outputs, inputs)?;
    let committed = super::commit::has_commit(out);
    let found: Vec<&str> = outputs.iter().copied().filter(|o| out.join(o).exists()).collect();
    if !committed && !force && !found.is_empty() {
        let msg = format!("holds {}, which this run would overwrite and no run's commit owns; pass --force to overwrite, or choose another --out", found.join(", "));
        return Err(Error::invalid(format!("--out {}", out.display()), msg));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let probe = out.join(".hexlora-write-check");
    std::fs::write(&probe, b"").map_err(|e| Error::io(out, e))?;
    std::fs::remove_file(&probe).map_err(|e| Error::io(&probe, e))
}

/// Drives a run of `total` steps into `out`.
pub struct Learner<'a> {
    /// The run directory.
    pub out: &'a Path,
    /// Steps of the whole run (a resumed run counts those done before).
    pub total: u64,
    /// Title of `loss.svg`.
    pub title: &'a str,
}

impl Learner<'_> {
    /// Runs `step` until `total` (or a hook or `stop_after` ends it),
    /// committing and writing `metrics.jsonl` after each; at `total`,
    /// [`Checkpointed::save_final`] and `loss.svg`.
    pub fn run<S: Checkpointed>(&self, mut state: S, mut run: RunOptions<'_, S>, mut step: impl FnMut(&mut S) -> Result<S::Record>) -> Result<S> {
        self.check_counters(&state)?;
        std::fs::create_dir_all(self.out).map_err(|e| Error::io(self.out, e))?;
        let bar = run.progress.then(|| progress_bar(self.total, state.step()));
        let mut done_here = 0;
        // Hooks first: the nightly job's hook records which signal stopped it.
        while state.step() < self.total
            && run.stop_after.is_none_or(|n| done_here < n)
            && run.hooks.as_deref_mut().is_none_or(|h| h.before_step(state.step() + 1))
            && crate::signals::requested().is_none()
        {
            let record = step(&mut state)?;
            if let Some(bar) = &bar {
                bar.set_position(state.step());
                bar.set_message(record.progress());
            }
            state.push(record);
            if state.step() % run.commit_every.max(1) == 0 || state.step() == self.total {
                state.commit(self.out)?;
            }
            write_metrics(self.out, state.history())?;
            if let Some(h) = run.hooks.as_deref_mut() {
                h.after_step(&state)?;
            }
            done_here += 1;
        }
        if state.step() < self.total && state.step() % run.commit_every.max(1) != 0 {
            // Stopped between commits (a signal, a hook): keep the steps done.
            state.commit(self.out)?;
        }
        if state.step() >= self.total {
            state.save_final(self.out)?;
            let losses: Vec<f32> = state.history().iter().map(Record::loss).collect();
            write_atomic(&self.out.join("loss.svg"), loss_svg(self.title, &losses).as_bytes())?;
        }
        if let Some(bar) = bar {
            bar.finish();
        }
        Ok(state)
    }

    /// A resumed state must be a point of this run: no more steps than
    /// `total` (a commit saying 9 of 6 would end the run on step-2
    /// weights) and one record per step (at most one, for a state whose
    /// records may start late). Checksums catch damage; this catches a
    /// commit written consistently with wrong counters.
    fn check_counters<S: Checkpointed>(&self, state: &S) -> Result<()> {
        let what = || self.out.join(super::commit::COMMIT_FILE).display().to_string();
        let (step, records) = (state.step(), state.history().len() as u64);
        if step > self.total {
            return Err(Error::format(what(), format!("its step counter says {step} steps done, but the run has {} steps", self.total)));
        }
        if records > step || (records < step && !state.records_may_start_late()) {
            return Err(Error::format(what(), format!("it holds {records} step records, but its step counter says {step}")));
        }
        Ok(())
    }
}

fn progress_bar(total: u64, pos: u64) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(total);
    let style = indicatif::ProgressStyle::with_template("{elapsed_precise} [{bar:30}] step {pos}/{len}  {msg}").expect("static template");
    bar.set_style(style.progress_chars("=> "));
    bar.set_position(pos);
    bar
}
