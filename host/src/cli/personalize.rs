//! `hexlora personalize`: the nightly job. Loads the model with every frozen
//! projection routed (start-up planner), trains a LoRA adapter with commits
//! after every optimizer step, paces on heat, stops cleanly on
//! SIGINT/SIGTERM (rerun the same command to resume), and ends with a
//! report: loss curve, where the time went, row retries, energy.
use crate::lora::LoraConfig;
use crate::npu::{NpuClient, NpuOptions, PrecisionPolicy, TransportKind};
use crate::optim::adamw::AdamWConfig;
use crate::optim::schedule::{Decay, Schedule};
use crate::runtime::energy::{EnergyMeter, EnergyRoots, Sampler};
use crate::runtime::pacing::{Pacer, PacingConfig, ThermalSource};
use crate::runtime::plan_cache::{self, PlanCache};
use crate::runtime::planner::Buckets;
use crate::runtime::routed::SplitCounters;
use crate::runtime::signals::StopRequest;
use crate::runtime::split_model::{load_split, resident_table, DspSide};
use crate::train::atomic_write::write_atomic;
use crate::train::commit::{StepRecord, TrainState};
use crate::train::data::load_jsonl;
use crate::train::text_encoder::ModelText;
use crate::train::trainer::{train_paced, RunOptions, TrainConfig};
use serde::Serialize;
use std::cell::{Cell, RefCell};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// Arguments of `hexlora personalize`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model directory.
    #[arg(long, default_value = "models/SmolLM2-135M-Instruct.Q4_1.gguf")]
    model: PathBuf,
    /// JSONL: {"prompt","completion"}, {"messages"} or {"input_ids","labels"}.
    #[arg(long)]
    data: PathBuf,
    /// Run directory (a rerun resumes from its last commit).
    #[arg(long, default_value = "runs/personalize")]
    out: PathBuf,
    /// Where frozen products run: in-process, shm, sim (qemu-hexagon) or cpu.
    #[arg(long, default_value = "in-process")]
    transport: String,
    /// Resident precision: `default` (recurrent f16, attention and MLP
    /// q8_0), `f16`, `q8_0`, or overrides like `attention=f16`.
    #[arg(long, default_value = "default")]
    precision: String,
    /// Token buckets the planner validates (token counts are padded up).
    #[arg(long, default_value = "32,64,128,256,512")]
    buckets: String,
    /// Where validated routes are remembered between runs (default
    /// `$XDG_CACHE_HOME/hexlora` or `~/.cache/hexlora`). A cached
    /// projection is still canary-probed at the smallest bucket.
    #[arg(long)]
    plan_cache: Option<PathBuf>,
    /// Probe every route and leave the plan cache alone.
    #[arg(long)]
    no_plan_cache: bool,
    /// Optimizer steps (default: one epoch).
    #[arg(long)]
    steps: Option<u64>,
    /// Examples per optimizer step.
    #[arg(long, default_value_t = 1)]
    grad_accum: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-4)]
    lr: f32,
    /// Warm-up steps.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    /// LoRA rank.
    #[arg(long, default_value_t = 16)]
    rank: usize,
    /// LoRA alpha.
    #[arg(long, default_value_t = 32.0)]
    alpha: f32,
    /// LoRA dropout.
    #[arg(long, default_value_t = 0.05)]
    dropout: f32,
    /// Comma-separated target modules.
    #[arg(long, default_value = "q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj")]
    targets: String,
    /// Truncate examples to this many tokens.
    #[arg(long, default_value_t = 512)]
    max_len: usize,
    /// Seed (data order, init, dropout).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Battery temperature file, tenths of a degree C.
    #[arg(long)]
    battery_temp: Option<PathBuf>,
    /// Thermal status file (`Thermal Status: N` or `N`).
    #[arg(long, conflicts_with = "thermal_command")]
    thermal_status_file: Option<PathBuf>,
    /// Thermal status command (Android default: `dumpsys thermalservice`).
    #[arg(long)]
    thermal_command: Option<String>,
    /// Seconds between thermal readings while paused.
    #[arg(long, default_value_t = 30.0)]
    pacing_poll: f64,
    /// Powercap root for RAPL energy counters.
    #[arg(long, default_value = "/sys/class/powercap")]
    powercap_root: PathBuf,
    /// Power-supply root for battery current and voltage.
    #[arg(long, default_value = "/sys/class/power_supply")]
    power_supply_root: PathBuf,
    /// Run the LoRA branch before each DSP request instead of while it is
    /// in flight (the synchronous baseline; same results).
    #[arg(long)]
    no_overlap: bool,
    /// Record each frozen product and its LoRA branch as two nodes instead
    /// of the fused node (same results; the step-time table's baseline).
    #[arg(long)]
    no_fuse: bool,
    /// No progress bar.
    #[arg(long)]
    quiet: bool,
}

/// One step's split-runtime figures (`runtime.jsonl`).
#[derive(Clone, Debug, Default, Serialize)]
struct StepRuntime {
    step: u64,
    loss: f32,
    seconds: f64,
    /// Step time not spent waiting on the DSP (all CPU nodes, including
    /// CPU-routed products and LoRA work overlapped with requests).
    cpu_nodes_s: f64,
    /// Waiting on DSP requests.
    dsp_in_flight_s: f64,
    /// CPU work run while a request was in flight.
    overlapped_s: f64,
    /// Products routed to the CPU.
    cpu_projection_s: f64,
    /// Thermal pause before the step.
    pause_before_s: f64,
    dsp_calls: u64,
    cpu_calls: u64,
    /// Token rows the DSP was sent (all ops of the step).
    rows_sent: u64,
    row_retries: u64,
    energy_j: Option<f64>,
}

fn side_for(args: &Args) -> anyhow::Result<(DspSide, PrecisionPolicy)> {
    let policy = PrecisionPolicy::parse(&args.precision)?;
    if args.transport.trim().eq_ignore_ascii_case("cpu") {
        return Ok((DspSide::Cpu, policy));
    }
    let kind: TransportKind = args.transport.parse()?;
    let client = NpuClient::connect(kind, &NpuOptions::default())?;
    Ok((DspSide::Npu { client, policy }, policy))
}

fn pacing_config(args: &Args) -> PacingConfig {
    let mut c = PacingConfig { poll: Duration::from_secs_f64(args.pacing_poll.max(0.001)), ..PacingConfig::default() };
    if let Some(p) = &args.battery_temp {
        c.battery_temp = Some(p.clone());
    }
    if let Some(p) = &args.thermal_status_file {
        c.thermal = ThermalSource::File(p.clone());
    }
    if let Some(cmd) = &args.thermal_command {
        c.thermal = ThermalSource::Command(cmd.clone());
    }
    c
}

fn train_config(args: &Args, steps: u64) -> TrainConfig {
    TrainConfig {
        lora: LoraConfig {
            r: args.rank,
            alpha: args.alpha,
            target_modules: args.targets.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect(),
            dropout: args.dropout,
            use_rslora: false,
            base_model: args.model.display().to_string(),
        },
        adamw: AdamWConfig::default(),
        schedule: Schedule { lr: args.lr, warmup: args.warmup, total: steps, decay: Decay::Cosine },
        grad_accum: args.grad_accum,
        max_grad_norm: Some(1.0),
        seed: args.seed,
        activation_cap: None,
        head_chunk: 64,
    }
}

fn append_line(path: &Path, line: &str) -> anyhow::Result<()> {
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{line}")?;
    Ok(())
}

/// Runs `hexlora personalize`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let stop = StopRequest::install()?;
    let buckets = Arc::new(Buckets::parse(&args.buckets)?);
    let (side, policy) = side_for(&args)?;
    let cache = match (args.no_plan_cache, args.plan_cache.clone().or_else(plan_cache::default_dir)) {
        (false, Some(dir)) => PlanCache::open(&dir),
        _ => PlanCache::disabled(),
    };
    let split = load_split(&args.model, &side, buckets, args.no_fuse, &cache)?;
    split.state.set_synchronous(args.no_overlap);
    let model = &*split.graph;
    print!("{}", resident_table(&model.projections(), &policy));
    if let DspSide::Npu { client, .. } = &side {
        let r = client.resident_bytes();
        println!("resident on the {} service: FP16 {:.2} MB, Q8_0 {:.2} MB", client.kind(), r.f16 as f64 / 1e6, r.q8_0 as f64 / 1e6);
    }
    let worst = split.routes.worst_error().map_or(String::new(), |e| format!(", worst probe error {e:.2e}"));
    let cached = if cache.hits() > 0 { format!(", {} projections from the plan cache", cache.hits()) } else { String::new() };
    println!("planner: {} (load + probes {:.1} s{worst}{cached})", split.routes.summary(), split.plan_seconds);
    std::fs::create_dir_all(&args.out)?;
    split.routes.write(&args.out)?;

    let text = ModelText::open(&args.model).ok();
    let enc = text.as_ref().map(|t| t as &dyn crate::train::data::Encoder);
    let (data, skipped) = load_jsonl(&args.data, enc, args.max_len)?;
    if skipped > 0 {
        eprintln!("skipped {skipped} examples with no completion tokens left after truncation");
    }
    let steps = args.steps.unwrap_or((data.len() / args.grad_accum.max(1)).max(1) as u64);
    let config = train_config(&args, steps);
    let resume = TrainState::load(&args.out)?.is_some();
    if resume {
        println!("resuming the run committed in {}", args.out.display());
    }

    let pacing = pacing_config(&args);
    println!("{}", pacing.describe());
    let pacer = RefCell::new(Pacer::new(pacing));
    let energy = match EnergyMeter::open(&EnergyRoots { powercap: args.powercap_root.clone(), power_supply: args.power_supply_root.clone() }) {
        Ok(m) => Ok(Sampler::start(m, Duration::from_secs(1))),
        Err(why) => Err(why),
    };
    let retries = || match &side {
        DspSide::Npu { client, .. } => (client.row_retries(), client.rows_sent()),
        DspSide::Cpu => (0, 0),
    };

    let (last_pause, step_start_j) = (Cell::new(0.0f64), Cell::new(None::<f64>));
    let (last_counters, last_retries) = (Cell::new(split.state.counters()), Cell::new(retries()));
    let stopped_by = Cell::new(None::<&'static str>);
    let records = RefCell::new(Vec::<StepRuntime>::new());
    let joules = || energy.as_ref().ok().and_then(|s| s.joules().ok());
    let mut before_step = |next: u64| -> bool {
        if let Some(sig) = stop.requested() {
            stopped_by.set(Some(sig));
            return false;
        }
        last_pause.set(pacer.borrow_mut().wait_until_cool(next, &|| stop.requested().is_some()));
        if let Some(sig) = stop.requested() {
            stopped_by.set(Some(sig));
            return false;
        }
        // The figures of the step start here, after any pause.
        last_counters.set(split.state.counters());
        last_retries.set(retries());
        step_start_j.set(joules());
        true
    };
    let runtime_path = args.out.join("runtime.jsonl");
    let mut write_error = None;
    let mut on_step = |r: &StepRecord| {
        let c: SplitCounters = split.state.counters().since(&last_counters.get());
        let energy_j = match (step_start_j.get(), joules()) {
            (Some(a), Some(b)) => Some(b - a),
            _ => None,
        };
        let retried_sent = retries();
        let rt = StepRuntime {
            step: r.step,
            loss: r.loss,
            seconds: r.seconds,
            cpu_nodes_s: (r.seconds - c.dsp_wait_s).max(0.0),
            dsp_in_flight_s: c.dsp_wait_s,
            overlapped_s: c.overlapped_s,
            cpu_projection_s: c.cpu_projection_s,
            pause_before_s: last_pause.get(),
            dsp_calls: c.dsp_calls,
            cpu_calls: c.cpu_calls,
            row_retries: retried_sent.0 - last_retries.get().0,
            rows_sent: retried_sent.1 - last_retries.get().1,
            energy_j,
        };
        if let Err(e) = append_line(&runtime_path, &serde_json::to_string(&rt).expect("serialises")) {
            write_error.get_or_insert(e);
        }
        records.borrow_mut().push(rt);
    };
    let run = RunOptions { resume, progress: !args.quiet, stop_after: None, on_step: Some(&mut on_step) };
    let state = train_paced(model, &data, &config, &args.out, run, &mut before_step)?;
    if let Some(e) = write_error {
        eprintln!("warning: could not append to {}: {e}", runtime_path.display());
    }
    if let Some(reason) = split.state.fallback_reason() {
        println!("DSP fallback: {reason}; later steps ran on the CPU path");
    }
    if let Some(sig) = stopped_by.get() {
        println!("{sig}: stopped after step {} (committed); run the same command again to resume", state.step());
    }
    let report = Report { state: &state, steps_here: &records.borrow(), pacer: &pacer.borrow(), energy: &energy, routes: &split.routes.summary(), fallback: split.state.fallback_reason() };
    let text = report.text();
    print!("{text}");
    write_atomic(&args.out.join("summary.txt"), text.as_bytes())?;
    if let DspSide::Npu { client, .. } = &side {
        let s = client.stats();
        println!("service: {} requests, {} restarts, {} row retries, {} rows recomputed on the CPU", s.requests, s.restarts, s.row_retries, s.rows_failed);
    }
    Ok(())
}

/// The end-of-run report.
struct Report<'a> {
    state: &'a TrainState,
    steps_here: &'a [StepRuntime],
    pacer: &'a Pacer,
    energy: &'a Result<Sampler, String>,
    routes: &'a str,
    fallback: Option<String>,
}

impl Report<'_> {
    fn text(&self) -> String {
        let mut s = String::new();
        let h = &self.state.history;
        s += &format!("steps: {} committed ({} in this invocation); routes: {}\n", self.state.step(), self.steps_here.len(), self.routes);
        if !h.is_empty() {
            let picks: Vec<usize> = (0..h.len().min(10)).map(|i| i * (h.len() - 1) / (h.len().min(10) - 1).max(1)).collect();
            let curve: Vec<String> = picks.iter().map(|&i| format!("{}:{:.4}", h[i].step, h[i].loss)).collect();
            s += &format!("loss curve (step:loss): {}  (loss.svg, metrics.jsonl)\n", curve.join(" "));
        }
        // `0.0 +`: an empty f64 sum is -0.0.
        let sum = |f: fn(&StepRuntime) -> f64| 0.0 + self.steps_here.iter().map(f).sum::<f64>();
        let (total, cpu, dsp, overl, cpu_proj) = (sum(|r| r.seconds), sum(|r| r.cpu_nodes_s), sum(|r| r.dsp_in_flight_s), sum(|r| r.overlapped_s), sum(|r| r.cpu_projection_s));
        let pauses = 0.0 + self.pacer.paused_seconds();
        let pct = |x: f64| if total + pauses > 0.0 { 100.0 * x / (total + pauses) } else { 0.0 };
        s += &format!("time: steps {total:.2} s + pacing pauses {pauses:.2} s ({} pauses)\n", self.pacer.pauses.len());
        s += &format!("  CPU nodes        {cpu:>10.2} s  {:>5.1}%  (of which CPU-routed products {cpu_proj:.2} s, LoRA overlapped with requests {overl:.2} s)\n", pct(cpu));
        s += &format!("  DSP in flight    {dsp:>10.2} s  {:>5.1}%\n", pct(dsp));
        s += &format!("  pacing pauses    {pauses:>10.2} s  {:>5.1}%\n", pct(pauses));
        let later: Vec<f64> = self.steps_here.iter().skip(1).map(|r| r.seconds).collect();
        if !later.is_empty() {
            s += &format!("step time: mean {:.3} s over {} steps (the first step of this invocation excluded)\n", later.iter().sum::<f64>() / later.len() as f64, later.len());
        }
        let retries: Vec<String> = self.steps_here.iter().map(|r| r.row_retries.to_string()).collect();
        s += &format!("row retries per step: [{}]\n", retries.join(", "));
        let (retried, sent) = (self.steps_here.iter().map(|r| r.row_retries).sum::<u64>(), self.steps_here.iter().map(|r| r.rows_sent).sum::<u64>());
        if sent > 0 {
            s += &format!("row retries per 1,000 rows: {:.3} ({retried} over {sent} rows sent to the DSP)\n", 1000.0 * retried as f64 / sent as f64);
        }
        let tokens: u64 = self.state.history.iter().rev().take(self.steps_here.len()).map(|r| r.tokens).sum();
        if total > 0.0 {
            s += &format!("throughput: {:.1} tok/s over {tokens} tokens\n", tokens as f64 / total);
        }
        s += &match self.energy {
            Err(why) => format!("energy: not available ({why})\n"),
            Ok(sampler) => {
                let parts: Option<Vec<f64>> = self.steps_here.iter().map(|r| r.energy_j).collect();
                match parts {
                    Some(p) if tokens > 0 => {
                        let j: f64 = p.iter().sum();
                        format!("energy: {j:.2} J in steps, {:.4} J/token ({})\n", j / tokens as f64, sampler.source())
                    }
                    _ => format!("energy: not available ({}: a reading failed during the run)\n", sampler.source()),
                }
            }
        };
        if let Some(f) = &self.fallback {
            s += &format!("fallback: {f}\n");
        }
        s
    }
}
