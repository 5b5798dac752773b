//! `hexlora personalize`: the nightly job ([`NightlyJob`]) on the command
//! line. Prints what was planned, trains (rerun the same command to resume
//! after a stop), prints the report.
use super::args::{Device, DspArgs, OptimDefaults, TrainingArgs};
use hexlora::runtime::energy::EnergyRoots;
use hexlora::runtime::nightly::NightlyJob;
use hexlora::runtime::pacing::{PacingConfig, ThermalSource};
use hexlora::runtime::signals::StopRequest;
use std::path::PathBuf;
use std::time::Duration;

/// What `personalize` picks where the shared options leave a value unset.
const DEFAULTS: OptimDefaults = OptimDefaults { weight_decay: 0.01, head_chunk: 64 };

/// Arguments of `hexlora personalize`.
#[derive(clap::Args)]
pub struct Args {
    #[command(flatten)]
    training: TrainingArgs,
    /// Run directory (a rerun resumes from its last commit, or from the one
    /// before it, with a warning, when the last fails its checksums).
    #[arg(long, default_value = "runs/personalize")]
    out: PathBuf,
    /// Overwrite outputs in --out that no commit owns (an adapter, metrics
    /// or a plot from elsewhere).
    #[arg(long)]
    force: bool,
    #[command(flatten)]
    dsp: DspArgs,
    /// Battery temperature file, tenths of a degree C.
    #[arg(long)]
    battery_temp: Option<PathBuf>,
    /// Thermal status file (`Thermal Status: N` or `N`).
    #[arg(long, conflicts_with = "thermal_command")]
    thermal_status_file: Option<PathBuf>,
    /// Thermal status command (Android default: `dumpsys thermalservice`).
    #[arg(long)]
    thermal_command: Option<String>,
    /// Seconds between thermal readings while paused, finite and > 0.
    #[arg(long, default_value_t = 30.0, value_parser = super::args::seconds)]
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
    /// Start from this adapter (PEFT directory or `.gguf`: last night's, a
    /// common LoRA) instead of a fresh one; its rank, alpha and targets are
    /// used. `hexlora::personal::gate::judge` compares the result with it.
    #[arg(long)]
    init_adapter: Option<PathBuf>,
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

fn job(args: Args) -> anyhow::Result<NightlyJob> {
    // Its schedule's length is set by `prepare`, once the examples are counted.
    let train = args.training.config(0, &DEFAULTS);
    Ok(NightlyJob {
        policy: args.dsp.policy()?,
        buckets: args.dsp.buckets()?,
        plan_cache: args.dsp.plan_cache_dir(),
        transport: args.dsp.device.transport(),
        steps: args.training.optim.steps,
        pacing: pacing_config(&args),
        energy: EnergyRoots { powercap: args.powercap_root, power_supply: args.power_supply_root },
        overlap: !args.no_overlap,
        fuse: !args.no_fuse,
        progress: !args.quiet,
        init: args.init_adapter.clone(),
        model: args.training.data.model,
        data: args.training.data.data,
        max_len: args.training.data.max_len,
        out: args.out,
        force: args.force,
        train,
    })
}

/// Runs `hexlora personalize`.
pub fn run(args: Args) -> anyhow::Result<()> {
    let stop = StopRequest::install()?;
    if args.dsp.device == Device::Cpu {
        let mut given = args.dsp.dsp_only().to_vec();
        given.push(("--no-overlap", args.no_overlap));
        super::args::warn_ignored("--device cpu runs every frozen product on the CPU, in f32", &given);
    }
    let model = args.training.data.model.clone();
    let prepared = match job(args)?.prepare() {
        Err(hexlora::Error::Stopped(signal)) => {
            // Nothing trained, nothing to commit: a clean exit, as after a
            // stop between steps.
            println!("{signal}: stopped during start-up planning, before the first step; the routes probed so far are in the plan cache, rerun to continue");
            return Ok(());
        }
        other => other?,
    };
    print!("{}", prepared.describe());
    let report = prepared.run(&stop).map_err(|e| super::train::explain_non_finite(e.into(), &model))?;
    print!("{}", report.console());
    Ok(())
}
