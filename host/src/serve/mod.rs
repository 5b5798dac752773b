//! `hexlora serve`: stage 3 as a service. One process keeps one base model
//! resident and answers OpenAI-compatible requests with whichever user's
//! adapter the request's `model` field names ([`adapters`]), through the
//! same [`Assistant::complete`] that `hexlora generate` uses, so the same
//! parameters and seed give the same text.
//!
//! - [`openai`]: request and response bodies;
//! - [`routes`]: the handlers (`/v1/chat/completions`, `/v1/completions`,
//!   `/v1/models`, `/v1/adapters/{name}`, `/health`);
//! - [`worker`]: the generation thread and its bounded queue (429 beyond it);
//! - [`guard`]: the checks every request passes first (host, origin,
//!   content type, API key);
//! - [`learn`], [`learn_routes`]: `--learn DIR`, the personal loop in this
//!   process (feedback, a learner thread sharing the base weights, the
//!   gate, versions, rollback).
//!
//! SIGTERM or SIGINT stops accepting connections, lets the requests in
//! progress and in the queue finish, then exits.
pub mod adapters;
pub mod guard;
pub mod learn;
pub mod learn_routes;
pub mod openai;
pub mod routes;
pub mod worker;

use crate::model::assistant::Assistant;
use crate::model::checkpoint::Checkpoint;
use crate::ops::cpu_projection::{inference_projection, FrozenDtype};
use crate::model::source::RawTensor;
use crate::npu::{NpuClient, NpuOptions, PrecisionPolicy, TransportKind};
use crate::model::decoder::SharedProjections;
use crate::projection::ProjectionInfo;
use crate::runtime::plan_cache::PlanCache;
use crate::runtime::planner::Buckets;
use crate::runtime::split_model::{load_split_with, DspSide};
use crate::train::data::Bounds;
use crate::train::text_encoder::ModelText;
use crate::{Error, Result};
use routes::AppState;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

/// How to run the server.
pub struct Config {
    /// The base model.
    pub model: PathBuf,
    /// Adapters to register at start-up: (name, path).
    pub adapters: Vec<(String, PathBuf)>,
    /// Address to bind (`127.0.0.1`).
    pub host: String,
    /// Port (0 picks a free one; the chosen address is printed).
    pub port: u16,
    /// Requests that may wait behind the one being answered.
    pub queue: usize,
    /// Prompt plus answer tokens per request (`None`: [`DEFAULT_CTX_SIZE`],
    /// or the model's positions if fewer); at most the model's positions.
    pub ctx_size: Option<usize>,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// The only directory `POST /v1/adapters/NAME` loads from (`None`:
    /// run-time registration is off).
    pub adapter_dir: Option<PathBuf>,
    /// Bearer key every route but `/health` needs.
    pub api_key: Option<String>,
    /// `--learn`: users learn in this process.
    pub learn: Option<LearnSetup>,
}

/// `--learn`: where users live, how they learn, where the learner's frozen
/// products run.
pub struct LearnSetup {
    /// Users, idle time, bounds, rounds.
    pub config: learn::LearnConfig,
    /// Where frozen products go: `None` keeps them on the CPU.
    pub transport: Option<TransportKind>,
    /// Resident precision per projection kind.
    pub policy: PrecisionPolicy,
    /// Token buckets the planner validates.
    pub buckets: Buckets,
    /// Where validated routes are remembered (`None`: probe every route).
    pub plan_cache: Option<PathBuf>,
}

/// The learner's graph and what it holds on to.
struct Learner {
    learning: Arc<learn::Learning>,
    graph: Box<dyn crate::autograd::graph::TrainableModel>,
    /// Keeps the DSP service connected while the graph uses it.
    _side: DspSide,
}

/// The answering model and, with `--learn`, the learner's training graph
/// over the same frozen projections (one copy of the base weights: the
/// graph's CPU side is the answering model's, its DSP side the resident
/// copy a phone's NPU holds).
fn load(ckpt: &Checkpoint, setup: Option<LearnSetup>) -> Result<(Assistant, Option<Learner>)> {
    let Some(setup) = setup else { return Ok((Assistant::load(ckpt)?, None)) };
    let shared = SharedProjections::new(&inference_projection);
    let get = |info: ProjectionInfo, raw: &RawTensor<'_>| shared.get(info, raw);
    let assistant = Assistant::load_with(ckpt, &get)?;
    let side = match setup.transport {
        None => DspSide::Cpu,
        Some(kind) => DspSide::Npu { client: NpuClient::connect(kind, &NpuOptions::default())?, policy: setup.policy },
    };
    let cache = setup.plan_cache.as_deref().map_or_else(PlanCache::disabled, PlanCache::open);
    // The learner's embedding and head in bf16 tables (a quantized
    // embedding stays in its blocks): the f32 table would cost more than the
    // shared projections save.
    let split = load_split_with(ckpt, &side, Arc::new(setup.buckets), false, &cache, &get, FrozenDtype::Bf16)?;
    eprintln!("hexlora serve: learner planned: {} ({:.1} s)", split.routes.summary(), split.plan_seconds);
    let projections = split.graph.projections();
    let learning = learn::Learning::open(setup.config, ModelText::of(ckpt)?, Bounds::of(&ckpt.config), projections)?;
    Ok((assistant, Some(Learner { learning: Arc::new(learning), graph: split.graph, _side: side })))
}

/// Prompt plus answer tokens per request unless `--ctx-size` says.
pub const DEFAULT_CTX_SIZE: usize = 2048;

/// Loads the model and adapters, serves until SIGTERM/SIGINT, drains.
pub fn run(config: Config) -> Result<()> {
    let ckpt = Checkpoint::open(&config.model)?;
    let positions = ckpt.config.max_position_embeddings;
    let ctx_size = match config.ctx_size {
        Some(c) if c > positions => {
            return Err(Error::invalid("--ctx-size", format!("{c} is more than the model's {positions} positions (max_position_embeddings)")));
        }
        Some(c) => c,
        None => DEFAULT_CTX_SIZE.min(positions),
    };
    let (assistant, learner) = load(&ckpt, config.learn)?;
    let assistant = Arc::new(assistant);
    let base_id = config.model.file_stem().map_or("base".into(), |s| s.to_string_lossy().into_owned());
    let registry = Arc::new(adapters::Registry::default());
    for (name, path) in &config.adapters {
        adapters::check_name(name, &base_id)?;
        if let Some(l) = &learner {
            // A learning user answers with its live version.
            if l.learning.user(name).is_some() {
                eprintln!("hexlora serve: {name}: answering with its live version in the --learn directory, not {}", path.display());
            } else {
                l.learning.create(name, Some(&crate::lora::Adapter::open(path, &assistant.model.config)?))?;
            }
            continue;
        }
        let entry = adapters::load(&assistant, path, 1.0)?;
        if !registry.insert(name, entry) {
            return Err(Error::invalid("--adapter", format!("name {name:?} given twice")));
        }
    }
    if let Some(l) = &learner {
        for name in l.learning.names() {
            adapters::check_name(&name, &base_id)?;
            learn::go_live(&name, &l.learning.user(&name).expect("listed"), &assistant, &registry)?;
        }
    }
    let adapter_dir = match &config.adapter_dir {
        Some(d) => match d.canonicalize() {
            Ok(c) if c.is_dir() => Some(c),
            _ => return Err(Error::invalid("--adapter-dir", format!("{} is not a directory", d.display()))),
        },
        None => None,
    };
    if config.api_key.as_ref().is_some_and(|k| k.is_empty() || k.chars().any(|c| c.is_whitespace() || c.is_control())) {
        return Err(Error::invalid("--api-key", "empty or with spaces or control characters"));
    }
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| Error::io("tokio runtime", e))?;
    let addr = format!("{}:{}", config.host, config.port);
    let listener = runtime.block_on(tokio::net::TcpListener::bind(&addr)).map_err(|e| Error::io(&addr, e))?;
    let local = listener.local_addr().map_err(|e| Error::io(&addr, e))?;
    let (queue, worker) = worker::start(assistant.clone(), config.queue);
    let learning = learner.as_ref().map(|l| l.learning.clone());
    let learner_thread = learner.map(|l| learn::start(l.learning, l.graph, l._side, assistant.clone(), registry.clone(), queue.activity().clone()));
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let state = Arc::new(AppState {
        assistant,
        registry,
        queue,
        base_id,
        ctx_size,
        default_max_tokens: config.default_max_tokens,
        started,
        next_id: AtomicU64::new(0),
        guard: guard::Guard { local, host_arg: config.host.clone(), api_key: config.api_key.clone() },
        adapter_dir,
        learning: learning.clone(),
    });
    runtime.block_on(async move {
        println!("hexlora serve: {} with {} adapter(s) on http://{local}", state.base_id, state.registry.list().len());
        let _ = std::io::stdout().flush();
        axum::serve(listener, routes::router(state)).with_graceful_shutdown(shutdown_signal()).await.map_err(|e| Error::io(&addr, e))
    })?;
    // Every queue handle went with the router: the worker answers what is
    // left and ends; the learner commits its step and ends (resumable).
    if let (Some(l), Some(t)) = (&learning, learner_thread) {
        l.shut_down();
        t.join().map_err(|_| Error::invalid("learner", "panicked"))?;
    }
    worker.join().map_err(|_| Error::invalid("generation worker", "panicked"))?;
    eprintln!("hexlora serve: stopped");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("installing a SIGTERM handler");
    tokio::select! {
        _ = term.recv() => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    eprintln!("hexlora serve: signal received; finishing requests in progress");
}
