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
//!   content type, API key).
//!
//! SIGTERM or SIGINT stops accepting connections, lets the requests in
//! progress and in the queue finish, then exits.
pub mod adapters;
pub mod guard;
pub mod openai;
pub mod routes;
pub mod worker;

use crate::model::assistant::Assistant;
use crate::model::checkpoint::Checkpoint;
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
    let assistant = Arc::new(Assistant::load(&ckpt)?);
    let base_id = config.model.file_stem().map_or("base".into(), |s| s.to_string_lossy().into_owned());
    let registry = adapters::Registry::default();
    for (name, path) in &config.adapters {
        adapters::check_name(name, &base_id)?;
        let entry = adapters::load(&assistant, path, 1.0)?;
        if !registry.insert(name, entry) {
            return Err(Error::invalid("--adapter", format!("name {name:?} given twice")));
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
    });
    runtime.block_on(async move {
        println!("hexlora serve: {} with {} adapter(s) on http://{local}", state.base_id, state.registry.list().len());
        let _ = std::io::stdout().flush();
        axum::serve(listener, routes::router(state)).with_graceful_shutdown(shutdown_signal()).await.map_err(|e| Error::io(&addr, e))
    })?;
    // Every queue handle went with the router: the worker answers what is
    // left and ends.
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
