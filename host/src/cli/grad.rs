//! `hexlora grad`: loss, logits and LoRA gradients of one batch, written as
//! safetensors, to compare a model port with PyTorch + PEFT, and the NPU
//! backends with the CPU.
//!
//! Devices: `cpu` is the f32 reference; `dsp` serves every frozen
//! per-layer projection from the firmware built natively (in-process
//! transport); `dsp-shm` from it on a thread behind shared memory;
//! `dsp-sim` from the Hexagon firmware under qemu-hexagon (simulator
//! transport); `dsp-fastrpc` through FastRPC. The projections are routed
//! by the split runtime's router ([`hexlora::runtime::split_model`]), the
//! one training uses, with one token bucket of the batch's size (no
//! padding): weights resident in the precision the policy (`--precision`)
//! gives their kind, each product probed against the CPU, anything the
//! service refuses (Q8_0 where `in_features` is not a multiple of 32) or
//! off its tolerance on the CPU. The vocabulary head is always on the
//! CPU. What went where is printed.
use hexlora::base::tensor_file::TensorFile;
use hexlora::lora::Adapter;
use hexlora::model::checkpoint::Checkpoint;
use super::args::Device;
use hexlora::ops::cpu_projection::FrozenDtype;
use hexlora::npu::{NpuClient, NpuOptions, PrecisionPolicy};
use hexlora::runtime::plan_cache::PlanCache;
use hexlora::runtime::planner::Buckets;
use hexlora::runtime::split_model::{load_split, DspSide};
use hexlora::tensor::Tensor;
use hexlora::train::data::Bounds;
use hexlora::train::grad::compute_grads;
use hexlora::autograd::graph::{Batch, GraphOptions, TrainableModel};
use anyhow::Context;
use std::path::PathBuf;
use std::sync::Arc;

/// Arguments of `hexlora grad`.
#[derive(clap::Args)]
pub struct Args {
    /// GGUF file or Hugging Face model directory.
    #[arg(long)]
    model: PathBuf,
    /// The adapter: a PEFT directory (adapter_config.json +
    /// adapter_model.safetensors) or a llama.cpp `.gguf` LoRA file.
    #[arg(long)]
    adapter: PathBuf,
    /// JSON `{"input_ids": [[...]], "labels": [[...]]}` (labels aligned with
    /// input_ids, shifted inside, -100 ignored).
    #[arg(long)]
    batch: PathBuf,
    /// Output safetensors: `loss` [1], `logits` [batch, seq, vocab] and one
    /// gradient per adapter tensor under the adapter's key.
    #[arg(long)]
    out: PathBuf,
    /// Replace --out if it exists (never when it is one of the inputs).
    #[arg(long)]
    force: bool,
    /// Where the frozen projections run.
    #[arg(long, value_enum, alias = "backend", default_value = "cpu")]
    device: Device,
    /// NPU precision policy: `default` (recurrent f16, attention and MLP
    /// q8_0), `f16`, `q8_0`, or overrides like `attention=f16,mlp=q8_0`.
    #[arg(long, default_value = "default")]
    precision: String,
    /// The Hexagon service ELF for `dsp-sim` (default: $HEXLORA_SIM_SERVICE).
    #[arg(long)]
    sim_service: Option<PathBuf>,
}

/// Runs `hexlora grad`.
pub fn run(args: Args) -> anyhow::Result<()> {
    hexlora::base::outputs::check_output(&args.out, &[("--model", &args.model), ("--adapter", &args.adapter), ("--batch", &args.batch)], args.force)?;
    let ckpt = Checkpoint::open(&args.model).with_context(|| format!("loading {}", args.model.display()))?;
    let text = std::fs::read_to_string(&args.batch).with_context(|| args.batch.display().to_string())?;
    let batch: Batch = serde_json::from_str(&text).with_context(|| format!("{}: expected {{\"input_ids\": [[...]], \"labels\": [[...]]}}", args.batch.display()))?;
    Bounds::of(&ckpt.config).check(&batch, &args.batch.display().to_string())?;
    if batch.target_count() == 0 {
        // The rule training data follows too (`load_jsonl` skips such
        // examples): no target, no loss to differentiate.
        let why = "no labelled target: every label after the first position is -100 (a label at position t is predicted from t - 1, so a one-token row has none)";
        return Err(hexlora::Error::invalid(args.batch.display().to_string(), why).into());
    }
    let adapter = Adapter::open(&args.adapter, &ckpt.config).with_context(|| format!("loading adapter {}", args.adapter.display()))?;
    let model = open_model(&args, &ckpt, &batch)?;
    adapter.check(&model.projections()).with_context(|| format!("adapter {}", args.adapter.display()))?;
    let r = compute_grads(model.as_ref(), &adapter, &batch, &GraphOptions::default(), true).map_err(|e| super::train::explain_non_finite(e.into(), &args.model))?;
    let mut out = r.grads;
    out.tensors.insert("loss".into(), Tensor::from_vec(&[1], vec![r.loss])?);
    out.tensors.insert("logits".into(), r.logits.context("compute_grads returned no logits although they were requested")?);
    hexlora::base::atomic_write::write_atomic(&args.out, &TensorFile::to_bytes(&out)?)?;
    println!("loss {:.6}  ({} adapter tensors) -> {}", r.loss, out.tensors.len() - 2, args.out.display());
    Ok(())
}

fn open_model(args: &Args, ckpt: &Checkpoint, batch: &Batch) -> anyhow::Result<Box<dyn TrainableModel>> {
    let Some(kind) = args.device.transport() else {
        super::args::warn_ignored("--device cpu computes every product in f32 on the CPU", &[("--precision", args.precision != super::args::DEFAULT_PRECISION)]);
        return Ok(hexlora::train::trainable(ckpt, FrozenDtype::F32, false)?);
    };
    let policy = PrecisionPolicy::parse(&args.precision)?;
    let options = NpuOptions { sim_service: args.sim_service.clone(), ..NpuOptions::default() };
    let client = NpuClient::connect(kind, &options).with_context(|| format!("connecting to the DSP service ({kind})"))?;
    let (rows, seq) = batch.dims()?;
    let buckets = Arc::new(Buckets::parse(&(rows * seq).to_string())?);
    let side = DspSide::Npu { client: client.clone(), policy };
    let split = load_split(ckpt, &side, buckets, false, &PlanCache::disabled())?;
    let on_cpu: std::collections::BTreeSet<_> = split.routes.routes.iter().filter(|r| !r.on_dsp).map(|r| r.projection.as_str()).collect();
    let bytes = client.resident_bytes();
    let worst = split.routes.worst_error().map_or("-".to_string(), |e| format!("{e:.1e}"));
    println!(
        "{kind} DSP service: {} (worst probe error {worst}; {} FP16 + {} Q8_0 bytes resident), {} on the CPU; policy {policy}",
        split.routes.summary(),
        bytes.f16,
        bytes.q8_0,
        on_cpu.len()
    );
    let mut said = std::collections::BTreeSet::new();
    for r in split.routes.routes.iter().filter(|r| !r.on_dsp && said.insert((&r.projection, &r.reason))) {
        eprintln!("{} ({}): on the CPU, {}", r.projection, r.direction, r.reason);
    }
    Ok(split.graph)
}
