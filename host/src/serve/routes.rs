//! The HTTP handlers: request bodies are parsed here (so malformed JSON
//! gets an OpenAI-style JSON error, not a framework's text), turned into
//! an [`assistant::Request`](crate::model::assistant::Request) and queued
//! for the worker; answers come back whole or as server-sent events.
use super::adapters::{self, Registry};
use super::learn_routes;
use super::guard::{self, Guard};
use super::openai::{error_body, ChatRequest, CompletionRequest, Endpoint, Prompt, Sampling, Usage};
use super::worker::{Event, Job, Queue, Refused};
use crate::lora::slots::PreparedAdapter;
use crate::model::assistant::{Assistant, Request};
use crate::model::generate;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;

/// What every handler shares.
pub struct AppState {
    /// The resident model.
    pub assistant: Arc<Assistant>,
    /// Users' adapters.
    pub registry: Arc<Registry>,
    /// The generation worker.
    pub queue: Queue,
    /// The base model's id in `model` fields.
    pub base_id: String,
    /// Prompt plus answer tokens one request may use.
    pub ctx_size: usize,
    /// `max_tokens` when a request gives none (bounded by the context).
    pub default_max_tokens: usize,
    /// Unix time the server started (`created` of the models).
    pub started: u64,
    /// Response ids.
    pub next_id: AtomicU64,
    /// Host, origin, content-type and API-key checks ([`guard`]).
    pub guard: Guard,
    /// Where `POST /v1/adapters/NAME` may load from (`--adapter-dir`,
    /// canonical); `None`: run-time registration is off.
    pub adapter_dir: Option<std::path::PathBuf>,
    /// `--learn`: users' examples, versions and the learner.
    pub learning: Option<Arc<super::learn::Learning>>,
}

/// The router over `state`.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/v1/models", get(models))
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completion))
        .route("/v1/adapters/{name}", get(show_adapter).post(add_adapter).delete(remove_adapter))
        .route("/v1/adapters/{name}/learn", post(learn_routes::learn))
        .route("/v1/adapters/{name}/rollback", post(learn_routes::rollback))
        .route("/v1/feedback", post(learn_routes::feedback))
        .route("/v1/learner", get(learn_routes::learner))
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "no such endpoint", "invalid_request_error") })
        .layer(axum::middleware::from_fn_with_state(state.clone(), guard::guard))
        .layer(axum::extract::DefaultBodyLimit::max(BODY_LIMIT))
        .with_state(state)
}

/// An error answered as OpenAI's JSON error body.
pub struct ApiError {
    status: StatusCode,
    message: String,
    kind: &'static str,
    param: Option<&'static str>,
    code: Option<&'static str>,
}

impl ApiError {
    /// An error of `status` whose `type` is `kind`.
    pub fn new(status: StatusCode, message: impl Into<String>, kind: &'static str) -> Self {
        ApiError { status, message: message.into(), kind, param: None, code: None }
    }

    /// A 400 about request field `param`.
    pub fn bad(message: impl Into<String>, param: &'static str) -> Self {
        ApiError { param: Some(param), ..Self::new(StatusCode::BAD_REQUEST, message, "invalid_request_error") }
    }

    /// With OpenAI's `param` field.
    pub fn param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    /// With OpenAI's `code` field.
    pub fn code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// The HTTP status it answers with.
    pub fn status(&self) -> StatusCode {
        self.status
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(error_body(&self.message, self.kind, self.param, self.code))).into_response()
    }
}

async fn health(State(s): State<Arc<AppState>>) -> Json<Value> {
    Json(json!({"status": "ok", "model": s.base_id, "adapters": s.registry.list().len()}))
}

async fn models(State(s): State<Arc<AppState>>) -> Json<Value> {
    let model = |id: &str, extra: Value| {
        let mut m = json!({"id": id, "object": "model", "created": s.started, "owned_by": "hexlora"});
        m.as_object_mut().expect("object").extend(extra.as_object().cloned().unwrap_or_default());
        m
    };
    let mut data = vec![model(&s.base_id, json!({}))];
    for (name, e) in s.registry.list() {
        data.push(model(&name, json!({"parent": s.base_id, "adapter": {"path": e.path, "rank": e.rank}})));
    }
    Json(json!({"object": "list", "data": data}))
}

/// The body, or the framework's refusal as a JSON error (413 over the
/// limit, with the limit named).
pub fn body(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        let status = e.status();
        let message = if status == StatusCode::PAYLOAD_TOO_LARGE {
            format!("request body over the limit of {BODY_LIMIT} bytes")
        } else {
            format!("request body unreadable: {}", e.body_text())
        };
        ApiError { param: Some("body"), ..ApiError::new(status, message, "invalid_request_error") }
    })
}

/// Largest request body (axum's default, named so errors can say it).
pub const BODY_LIMIT: usize = 2 * 1024 * 1024;

/// `body` as `T`, or a 400 naming what is wrong.
pub fn parse<T: serde::de::DeserializeOwned>(body: &Bytes) -> Result<T, ApiError> {
    serde_json::from_slice(body).map_err(|e| ApiError::bad(format!("invalid request body: {e}"), "body"))
}

async fn chat(State(s): State<Arc<AppState>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let body = body(raw)?;
        let req: ChatRequest = parse(&body)?;
        let messages = req
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| m.to_message().map_err(|e| ApiError::bad(format!("messages[{i}]: {e}"), "messages")))
            .collect::<Result<Vec<_>, _>>()?;
        let prompt = s.assistant.chat_prompt(&messages).map_err(|e| ApiError::bad(e.to_string(), "messages"))?;
        answer(&s, Endpoint::Chat, parse(&body)?, prompt).await
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

async fn completion(State(s): State<Arc<AppState>>, raw: Result<Bytes, BytesRejection>) -> Response {
    let result = async {
        let body = body(raw)?;
        let req: CompletionRequest = parse(&body)?;
        let text = match req.prompt {
            Prompt::One(t) => t,
            Prompt::Many(mut v) if v.len() == 1 => v.remove(0),
            Prompt::Many(v) => return Err(ApiError::bad(format!("{} prompts (one per request)", v.len()), "prompt")),
        };
        if text.is_empty() {
            return Err(ApiError::bad("prompt is empty", "prompt"));
        }
        let prompt = s.assistant.raw_prompt(&text).map_err(|e| ApiError::bad(e.to_string(), "prompt"))?;
        answer(&s, Endpoint::Completion, parse(&body)?, prompt).await
    };
    result.await.unwrap_or_else(IntoResponse::into_response)
}

/// Checks the sampling fields against the model and the context.
fn request(s: &AppState, endpoint: Endpoint, f: Sampling, prompt: Vec<u32>) -> Result<(Request, Option<Arc<PreparedAdapter>>), ApiError> {
    if f.n.is_some_and(|n| n != 1) {
        return Err(ApiError::bad("n must be 1", "n"));
    }
    if f.logprobs.as_ref().is_some_and(|v| !v.is_null() && v != &Value::Bool(false)) {
        return Err(ApiError::bad("logprobs are not supported", "logprobs"));
    }
    if f.tools.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(ApiError::bad("tools are not supported", "tools"));
    }
    let adapter = if f.model == s.base_id {
        None
    } else {
        let entry = s.registry.get(&f.model).ok_or_else(|| {
            ApiError { param: Some("model"), ..ApiError::new(StatusCode::NOT_FOUND, format!("model {:?} not found (GET /v1/models lists them)", f.model), "invalid_request_error") }
                .code("model_not_found")
        })?;
        Some(entry.prepared.clone())
    };
    let room = s.ctx_size.saturating_sub(prompt.len());
    if room == 0 {
        let msg = format!("the prompt has {} tokens; the context holds {} (--ctx-size)", prompt.len(), s.ctx_size);
        let param = if endpoint == Endpoint::Chat { "messages" } else { "prompt" };
        return Err(ApiError::bad(msg, param).code("context_length_exceeded"));
    }
    let max_tokens = match f.max_tokens.or(f.max_completion_tokens) {
        Some(0) => return Err(ApiError::bad("max_tokens must be at least 1", "max_tokens")),
        Some(m) if m > room as u64 => {
            let msg = format!("max_tokens {m} with a {}-token prompt exceeds the context of {} (--ctx-size)", prompt.len(), s.ctx_size);
            return Err(ApiError::bad(msg, "max_tokens").code("context_length_exceeded"));
        }
        Some(m) => m as usize,
        None => s.default_max_tokens.min(room),
    };
    let sampling = generate::Sampling { temperature: f.temperature.unwrap_or(1.0), top_p: f.top_p.unwrap_or(1.0), seed: f.seed.unwrap_or(0) };
    // generate's rule, with the field named as the API names it.
    sampling.validate().map_err(|e| {
        let param = if matches!(&e, crate::Error::Invalid { what, .. } if what == "top-p") { "top_p" } else { "temperature" };
        match e {
            crate::Error::Invalid { msg, .. } => ApiError::bad(format!("{param} {msg}"), param),
            e => ApiError::bad(e.to_string(), param),
        }
    })?;
    let stop = f.stop.map(|s| s.into_vec()).unwrap_or_default();
    if stop.len() > 4 || stop.iter().any(String::is_empty) {
        return Err(ApiError::bad("stop takes up to 4 non-empty strings", "stop"));
    }
    Ok((Request { prompt, max_tokens, sampling, stop }, adapter))
}

async fn answer(s: &Arc<AppState>, endpoint: Endpoint, f: Sampling, prompt: Vec<u32>) -> Result<Response, ApiError> {
    let (model, stream) = (f.model.clone(), f.stream);
    let (request, adapter) = request(s, endpoint, f, prompt)?;
    let (events, mut rx) = mpsc::unbounded_channel();
    s.queue.submit(Job { request, adapter, events }).map_err(|e| match e {
        Refused::Busy => ApiError::new(StatusCode::TOO_MANY_REQUESTS, "the queue is full; retry later", "rate_limit_error").code("queue_full"),
        Refused::Closed => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down", "server_error"),
    })?;
    let id = format!("{}-{}", if endpoint == Endpoint::Chat { "chatcmpl" } else { "cmpl" }, s.next_id.fetch_add(1, Ordering::Relaxed));
    let created = unix_now();
    if stream {
        return Ok(sse(endpoint, id, created, model, rx).into_response());
    }
    let mut text = String::new();
    while let Some(ev) = rx.recv().await {
        match ev {
            Event::Piece(p) => text.push_str(&p),
            Event::Done(Ok(a)) => {
                let usage = Usage { prompt_tokens: a.prompt_tokens, completion_tokens: a.completion_tokens, total_tokens: a.prompt_tokens + a.completion_tokens };
                return Ok(Json(endpoint.response(&id, created, &model, &a.text, a.finish.as_str(), usage)).into_response());
            }
            Event::Done(Err(e)) => return Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e, "server_error")),
        }
    }
    Err(ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "the generation worker stopped", "server_error"))
}

/// Worker events as OpenAI's stream: chunks, a last chunk with the finish
/// reason, then `[DONE]`. A client that goes away drops the stream, which
/// drops the worker's receiver and so ends the generation.
fn sse(endpoint: Endpoint, id: String, created: u64, model: String, mut rx: mpsc::UnboundedReceiver<Event>) -> impl IntoResponse {
    let (tx, out) = mpsc::channel::<Result<SseEvent, Infallible>>(64);
    tokio::spawn(async move {
        let data = |v: Value| Ok(SseEvent::default().data(v.to_string()));
        while let Some(ev) = rx.recv().await {
            let (msg, last) = match ev {
                Event::Piece(p) => (data(endpoint.chunk(&id, created, &model, Some(&p), None)), false),
                Event::Done(Ok(a)) => (data(endpoint.chunk(&id, created, &model, None, Some(a.finish.as_str()))), true),
                Event::Done(Err(e)) => (data(error_body(&e, "server_error", None, None)), true),
            };
            if tx.send(msg).await.is_err() || last {
                break;
            }
        }
        let _ = tx.send(Ok(SseEvent::default().data("[DONE]"))).await;
    });
    Sse::new(ReceiverStream::new(out))
}

async fn add_adapter(State(s): State<Arc<AppState>>, Path(name): Path<String>, raw: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Add {
        path: Option<std::path::PathBuf>,
        scale: Option<f32>,
        #[serde(default)]
        fresh: bool,
    }
    adapters::check_name(&name, &s.base_id).map_err(|e| ApiError::bad(e.to_string(), "name"))?;
    let add: Add = parse(&body(raw)?)?;
    let taken = || ApiError::new(StatusCode::CONFLICT, format!("adapter {name:?} exists (DELETE it first)"), "invalid_request_error");
    // Checked before the load it would waste, and again on insertion (a
    // concurrent request may have taken the name meanwhile).
    if s.registry.get(&name).is_some() {
        return Err(taken());
    }
    let path = match (&add.path, add.fresh) {
        (Some(_), true) => return Err(ApiError::bad("give path or fresh, not both", "fresh")),
        (None, false) => return Err(ApiError::bad("path is required (or, with --learn, fresh: true)", "path")),
        (None, true) => None,
        (Some(p), false) => {
            let Some(dir) = &s.adapter_dir else {
                return Err(ApiError::new(StatusCode::FORBIDDEN, "run-time adapter registration is off (start the server with --adapter-dir DIR)", "invalid_request_error"));
            };
            Some(adapters::inside(dir, p).map_err(|e| ApiError::bad(e.to_string(), "path"))?)
        }
    };
    if let Some(l) = s.learning.clone() {
        if add.scale.is_some_and(|x| x != 1.0) {
            return Err(ApiError::bad("a learning user's adapter answers at scale 1", "scale"));
        }
        return add_user(&s, l, name, path).await;
    }
    let Some(path) = path else {
        return Err(ApiError::new(StatusCode::FORBIDDEN, "fresh adapters are for learning users (start the server with --learn DIR)", "invalid_request_error"));
    };
    let scale = add.scale.unwrap_or(1.0);
    adapters::check_scale(scale).map_err(|e| ApiError::bad(e.to_string(), "scale"))?;
    let assistant = s.assistant.clone();
    let entry = tokio::task::spawn_blocking(move || adapters::load(&assistant, &path, scale))
        .await
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "server_error"))?
        .map_err(|e| ApiError::bad(e.to_string(), "path"))?;
    let (path, rank) = (entry.path.clone(), entry.rank);
    if !s.registry.insert(&name, entry) {
        return Err(taken());
    }
    let body = json!({"id": name, "object": "model", "parent": s.base_id, "adapter": {"path": path, "rank": rank}});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// With `--learn`: starts user `name` from the adapter at `path` (or a
/// fresh one) and answers with it.
async fn add_user(s: &Arc<AppState>, l: Arc<super::learn::Learning>, name: String, path: Option<std::path::PathBuf>) -> Result<Response, ApiError> {
    if l.user(&name).is_some() {
        return Err(ApiError::new(StatusCode::CONFLICT, format!("user {name:?} exists"), "invalid_request_error"));
    }
    let (assistant, registry, n) = (s.assistant.clone(), s.registry.clone(), name.clone());
    let created = tokio::task::spawn_blocking(move || -> crate::Result<std::path::PathBuf> {
        let adapter = path.as_deref().map(|p| crate::lora::Adapter::open(p, &assistant.model.config)).transpose()?;
        let user = l.create(&n, adapter.as_ref())?;
        super::learn::go_live(&n, &user, &assistant, &registry)?;
        user.versions.live_adapter()
    })
    .await
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "server_error"))?
    .map_err(|e| ApiError::bad(e.to_string(), "path"))?;
    let rank = s.registry.get(&name).map_or(0, |e| e.rank);
    let body = json!({"id": name, "object": "model", "parent": s.base_id, "adapter": {"path": created, "rank": rank}, "live": 1});
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `GET /v1/adapters/NAME`: the adapter, and with `--learn` the user's
/// versions (gate figures, which is live), examples and last round.
async fn show_adapter(State(s): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    let e = s.registry.get(&name).ok_or_else(|| ApiError::new(StatusCode::NOT_FOUND, format!("adapter {name:?} not found"), "invalid_request_error"))?;
    let mut body = json!({"id": name, "object": "model", "parent": s.base_id, "adapter": {"path": e.path, "rank": e.rank}});
    if let Some(l) = &s.learning {
        if let Some(user) = learn_routes::user_view(l, &name)? {
            body["user"] = user;
        }
    }
    Ok(Json(body))
}

async fn remove_adapter(State(s): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Json<Value>, ApiError> {
    if s.learning.as_ref().is_some_and(|l| l.user(&name).is_some()) {
        let msg = format!("{name:?} is a learning user: its adapter stays while the server runs (its files are in the --learn directory)");
        return Err(ApiError::new(StatusCode::CONFLICT, msg, "invalid_request_error"));
    }
    if !s.registry.remove(&name) {
        return Err(ApiError::new(StatusCode::NOT_FOUND, format!("adapter {name:?} not found"), "invalid_request_error"));
    }
    Ok(Json(json!({"id": name, "object": "model", "deleted": true})))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}
