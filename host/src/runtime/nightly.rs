//! The nightly job (`hexlora personalize`): load the model with every
//! frozen projection routed by the start-up planner, train a LoRA adapter
//! with a commit after every optimizer step, pause when the phone is hot,
//! stop cleanly on SIGINT/SIGTERM (the same job resumes), and account for
//! every step: where its time went, rows retried, energy. Two phases, so
//! the caller can show what was planned before the hours of training:
//! [`NightlyJob::prepare`], then [`Prepared::run`] into a [`NightlyReport`].
use super::energy::{EnergyMeter, EnergyRoots, Sampler};
use super::nightly_report::{NightlyReport, StepRuntime};
use super::pacing::{Pacer, PacingConfig};
use super::plan_cache::PlanCache;
use super::planner::Buckets;
use super::routed::{SplitCounters, SplitState};
use crate::signals::StopRequest;
use super::split_model::{load_split, resident_table, DspSide, SplitModel};
use crate::model::checkpoint::Checkpoint;
use crate::npu::{NpuClient, NpuOptions, PrecisionPolicy, TransportKind};
use crate::train::commit::TrainState;
use crate::train::data::{load_jsonl, Bounds, Encoder};
use crate::autograd::graph::Batch;
use crate::train::learner::{claim_out_dir, StepHooks, ADAPTER_RUN_OUTPUTS};
use crate::train::text_encoder::ModelText;
use crate::train::trainer::{check_grad_accum, epoch_steps, train, RunOptions, TrainConfig};
use crate::Result;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Everything the nightly job is told.
pub struct NightlyJob {
    /// GGUF file or Hugging Face directory.
    pub model: PathBuf,
    /// The owner's examples (JSONL).
    pub data: PathBuf,
    /// Run directory; a rerun resumes from its last commit.
    pub out: PathBuf,
    /// Overwrite outputs in `out` that no commit owns.
    pub force: bool,
    /// Examples are cut to this many tokens.
    pub max_len: usize,
    /// Where frozen products go: `None` keeps them all on the CPU.
    pub transport: Option<TransportKind>,
    /// Resident precision per projection kind.
    pub policy: PrecisionPolicy,
    /// Token buckets the planner validates.
    pub buckets: Buckets,
    /// Where validated routes are remembered (`None`: probe every route).
    pub plan_cache: Option<PathBuf>,
    /// The run; its `schedule.total` is replaced by `steps`, or one epoch.
    pub train: TrainConfig,
    /// Optimizer steps (default: one epoch of the examples).
    pub steps: Option<u64>,
    /// When to pause for heat.
    pub pacing: PacingConfig,
    /// Energy counters.
    pub energy: EnergyRoots,
    /// Run each LoRA branch while its DSP request is in flight.
    pub overlap: bool,
    /// Record each frozen product and its branch as one fused node.
    pub fuse: bool,
    /// Show a progress bar.
    pub progress: bool,
    /// Start from this adapter (last night's, a common LoRA) instead of a
    /// fresh one; its rank, alpha and targets replace `train.lora`'s.
    pub init: Option<PathBuf>,
}

/// The job with its model routed and its data loaded, ready to train.
pub struct Prepared {
    job: NightlyJob,
    side: DspSide,
    split: SplitModel,
    data: Vec<Batch>,
    skipped: usize,
    config: TrainConfig,
    /// Train from the commit in `out` (a resumed run, or `init`'s start).
    resume: bool,
    /// `out` held a commit before this run.
    resumed: bool,
    cache_hits: usize,
}

impl NightlyJob {
    /// Reads the examples (checked against the model), takes the run
    /// directory ([`claim_out_dir`]), connects to the DSP service, loads
    /// and plans the model (routes written to `out/routes.json`), and
    /// finds any commit to resume.
    pub fn prepare(self) -> Result<Prepared> {
        let ckpt = Checkpoint::open(&self.model)?;
        // Token-id JSONL needs no tokenizer; text JSONL fails clearly without one.
        let text = ModelText::of(&ckpt).ok();
        let (data, skipped) = load_jsonl(&self.data, text.as_ref().map(|t| t as &dyn Encoder), self.max_len, Bounds::of(&ckpt.config))?;
        check_grad_accum(self.train.grad_accum, data.len())?;
        let mut inputs = vec![("--model", self.model.as_path()), ("--data", self.data.as_path())];
        inputs.extend(self.init.as_deref().map(|p| ("--init-adapter", p)));
        claim_out_dir(&self.out, ADAPTER_RUN_OUTPUTS, &inputs, self.force)?;
        let side = match self.transport {
            None => DspSide::Cpu,
            Some(kind) => DspSide::Npu { client: NpuClient::connect(kind, &NpuOptions::default())?, policy: self.policy },
        };
        let cache = self.plan_cache.as_deref().map_or_else(PlanCache::disabled, PlanCache::open);
        let split = load_split(&ckpt, &side, Arc::new(self.buckets.clone()), !self.fuse, &cache)?;
        split.state.set_synchronous(!self.overlap);
        split.routes.write(&self.out)?;
        let mut config = self.train.clone();
        config.schedule.total = self.steps.unwrap_or(epoch_steps(data.len(), config.grad_accum));
        let had_commit = crate::train::commit::has_commit(&self.out);
        if let Some(path) = &self.init {
            let init = crate::lora::Adapter::open(path, &ckpt.config)?;
            init.check(&split.graph.projections())?;
            config.lora = crate::lora::LoraConfig { dropout: config.lora.dropout, base_model: config.lora.base_model.clone(), ..init.config.clone() };
            // The first run commits the adapter as its step 0; a rerun
            // resumes that commit (its fingerprint holds the shape).
            if !had_commit {
                crate::train::trainer::commit_start(&init, &config, &data, &self.out)?;
            }
        }
        let resume = crate::train::commit::has_commit(&self.out);
        Ok(Prepared { side, split, data, skipped, config, resume, resumed: had_commit, cache_hits: cache.hits(), job: self })
    }
}

impl Prepared {
    /// What was loaded and planned, for the console.
    pub fn describe(&self) -> String {
        let mut s = resident_table(&self.split.graph.projections(), &self.job.policy);
        if let DspSide::Npu { client, .. } = &self.side {
            let r = client.resident_bytes();
            s += &format!("resident on the {} service: FP16 {:.2} MB, Q8_0 {:.2} MB\n", client.kind(), r.f16 as f64 / 1e6, r.q8_0 as f64 / 1e6);
        }
        let routes = &self.split.routes;
        let worst = routes.worst_error().map_or(String::new(), |e| format!(", worst probe error {e:.2e}"));
        let cached = if self.cache_hits > 0 { format!(", {} projections from the plan cache", self.cache_hits) } else { String::new() };
        s += &format!("planner: {} (load + probes {:.1} s{worst}{cached})\n", routes.summary(), self.split.plan_seconds);
        if self.skipped > 0 {
            s += &format!("skipped {} examples with no completion tokens left after truncation\n", self.skipped);
        }
        if self.resumed {
            s += &format!("resuming the run committed in {}\n", self.job.out.display());
        } else if let Some(init) = &self.job.init {
            s += &format!("starting from the adapter in {}\n", init.display());
        }
        s + &self.job.pacing.describe() + "\n"
    }

    /// Trains until the last step or a stop signal, then writes
    /// `summary.txt` and returns the report. `runtime.jsonl` gets a line
    /// per step as it is committed.
    pub fn run(self, stop: &StopRequest) -> Result<NightlyReport> {
        let out = &self.job.out;
        let energy = EnergyMeter::open(&self.job.energy).map(|m| Sampler::start(m, Duration::from_secs(1)));
        let mut meter = StepMeter::new(stop, Pacer::new(self.job.pacing.clone()), energy, &self.side, &self.split.state, out.join("runtime.jsonl"));
        let run = RunOptions { resume: self.resume, progress: self.job.progress, hooks: Some(&mut meter), ..RunOptions::quiet() };
        let state = train(&*self.split.graph, &self.data, &self.config, out, run)?;
        let report = NightlyReport {
            steps: std::mem::take(&mut meter.records),
            paused_s: meter.pacer.paused_seconds(),
            pauses: meter.pacer.pauses.len(),
            energy: meter.energy.as_ref().map(Sampler::source).map_err(Clone::clone),
            routes: self.split.routes.summary(),
            fallback: self.split.state.fallback_reason(),
            stopped_by: meter.stopped_by,
            write_error: meter.write_error.take(),
            service: match &self.side {
                DspSide::Npu { client, .. } => Some(client.stats()),
                DspSide::Cpu => None,
            },
            state,
        };
        crate::base::atomic_write::write_atomic(&out.join("summary.txt"), report.text().as_bytes())?;
        Ok(report)
    }
}

/// The per-step accounting around the training loop: stop signals and
/// thermal pauses before a step, its split-runtime figures after it.
struct StepMeter<'a> {
    stop: &'a StopRequest,
    pacer: Pacer,
    energy: std::result::Result<Sampler, String>,
    side: &'a DspSide,
    split: &'a SplitState,
    runtime_path: PathBuf,
    /// Taken when the step starts, after any pause.
    at_start: (SplitCounters, (u64, u64), Option<f64>),
    last_pause: f64,
    records: Vec<StepRuntime>,
    stopped_by: Option<&'static str>,
    write_error: Option<String>,
}

impl<'a> StepMeter<'a> {
    fn new(stop: &'a StopRequest, pacer: Pacer, energy: std::result::Result<Sampler, String>, side: &'a DspSide, split: &'a SplitState, runtime_path: PathBuf) -> Self {
        let mut m = StepMeter { stop, pacer, energy, side, split, runtime_path, at_start: Default::default(), last_pause: 0.0, records: Vec::new(), stopped_by: None, write_error: None };
        m.at_start = m.snapshot();
        m
    }

    /// Split counters, (row retries, rows sent) and joules so far.
    fn snapshot(&self) -> (SplitCounters, (u64, u64), Option<f64>) {
        let rows = match self.side {
            DspSide::Npu { client, .. } => (client.row_retries(), client.rows_sent()),
            DspSide::Cpu => (0, 0),
        };
        (self.split.counters(), rows, self.energy.as_ref().ok().and_then(|s| s.joules().ok()))
    }

    fn stopped(&mut self) -> bool {
        self.stopped_by = self.stop.requested();
        self.stopped_by.is_some()
    }
}

impl StepHooks<TrainState> for StepMeter<'_> {
    fn before_step(&mut self, next: u64) -> bool {
        if self.stopped() {
            return false;
        }
        let stop = self.stop;
        self.last_pause = self.pacer.wait_until_cool(next, &|| stop.requested().is_some());
        if self.stopped() {
            return false;
        }
        self.at_start = self.snapshot();
        true
    }

    fn after_step(&mut self, state: &TrainState) -> Result<()> {
        let Some(r) = state.history.last() else { return Ok(()) };
        let (counters, rows, joules) = self.snapshot();
        let (c0, rows0, joules0) = &self.at_start;
        let c = counters.since(c0);
        let rt = StepRuntime {
            step: r.step,
            loss: r.loss,
            seconds: r.seconds,
            cpu_nodes_s: (r.seconds - c.dsp_wait_s).max(0.0),
            dsp_in_flight_s: c.dsp_wait_s,
            overlapped_s: c.overlapped_s,
            cpu_projection_s: c.cpu_projection_s,
            pause_before_s: self.last_pause,
            dsp_calls: c.dsp_calls,
            cpu_calls: c.cpu_calls,
            row_retries: rows.0 - rows0.0,
            rows_sent: rows.1 - rows0.1,
            energy_j: joules.zip(*joules0).map(|(b, a)| b - a),
        };
        // A failed append loses a line of figures, not the run: reported at the end.
        if let Err(e) = append_line(&self.runtime_path, &serde_json::to_string(&rt).expect("serialises")) {
            self.write_error.get_or_insert(format!("could not append to {}: {e}", self.runtime_path.display()));
        }
        self.records.push(rt);
        Ok(())
    }
}

fn append_line(path: &Path, line: &str) -> std::io::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{line}")
}
