//! The handlers of `serve --learn` ([`super::learn`]): approved examples in
//! (`POST /v1/feedback`), a round on demand (`POST
//! /v1/adapters/NAME/learn`), a user's versions with their gate figures
//! (`GET /v1/adapters/NAME`), one version back (`POST
//! /v1/adapters/NAME/rollback`) and the learner's state (`GET
//! /v1/learner`). Without `--learn` each answers 403 saying so.
use super::learn::{self, Learning};
use super::routes::{body, parse, ApiError, AppState};
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde_json::{json, Value};
use std::sync::Arc;

/// The learning side, or the 403 that says how to turn it on.
fn learning(s: &AppState) -> Result<Arc<Learning>, ApiError> {
    s.learning.clone().ok_or_else(|| ApiError::new(StatusCode::FORBIDDEN, "learning is off (start the server with --learn DIR)", "invalid_request_error"))
}

fn no_user(name: &str) -> ApiError {
    let msg = format!("user {name:?} not found: create it with POST /v1/adapters/{name} (body {{\"fresh\": true}} or {{\"path\": ...}})");
    ApiError::new(StatusCode::NOT_FOUND, msg, "invalid_request_error").param("model").code("model_not_found")
}

fn internal(e: impl ToString) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string(), "server_error")
}

/// The request field an example's error is about: the field its message
/// starts with (`messages[2]: ...`, `completion is empty`; "chat example"
/// means `messages`), or the one serde names (``missing field `prompt` ``);
/// `body` otherwise. Only those two places are read, never the rest of the
/// message, which may quote the caller's text.
fn field_of(e: &crate::Error) -> &'static str {
    const FIELDS: [&str; 5] = ["messages", "completion", "prompt", "input_ids", "labels"];
    let msg = match e {
        crate::Error::Invalid { msg, .. } | crate::Error::Format { msg, .. } => msg.as_str(),
        _ => return "body",
    };
    let lead: String = msg.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    if lead == "chat" {
        return "messages";
    }
    let serde_named = ["missing field `", "unknown field `", "duplicate field `"]
        .iter()
        .find_map(|p| msg.strip_prefix(p))
        .and_then(|rest| rest.split('`').next());
    FIELDS.into_iter().find(|f| *f == lead || serde_named == Some(*f)).unwrap_or("body")
}

/// `POST /v1/feedback`: `{"model": NAME, "messages": [..., {"role":
/// "assistant", "content": approved answer}]}` (or `"prompt"` and
/// `"completion"`) is checked as a training line and stored for NAME.
pub async fn feedback(State(s): State<Arc<AppState>>, raw: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    let l = learning(&s)?;
    let mut v: Value = parse(&body(raw)?)?;
    let obj = v.as_object_mut().ok_or_else(|| ApiError::bad("the body must be a JSON object", "body"))?;
    let name = match obj.remove("model") {
        Some(Value::String(n)) => n,
        _ => return Err(ApiError::bad("model must name the user (one of the server's adapters)", "model")),
    };
    let user = l.user(&name).ok_or_else(|| no_user(&name))?;
    if obj.is_empty() {
        return Err(ApiError::bad("no example: give messages (ending with the approved assistant answer), or prompt and completion", "body"));
    }
    let example = Value::Object(std::mem::take(obj));
    l.check_example(&example).map_err(|e| {
        ApiError::bad(e.to_string(), field_of(&e))
    })?;
    let held = user.clone();
    let appended = tokio::task::spawn_blocking(move || held.append(example)).await.map_err(internal)?.map_err(internal)?;
    crate::personal::kill_point("feedback-stored");
    let unseen = user.unseen().map_err(internal)?.len();
    let mut body = json!({"object": "feedback", "model": name, "id": appended.id, "stored": appended.stored, "dropped": appended.dropped, "unseen": unseen});
    if appended.dropped > 0 {
        body["note"] = json!(format!("the oldest {} example(s) were dropped to keep {} (--learn-max-examples)", appended.dropped, l.config.limits.max_examples));
    }
    Ok((StatusCode::CREATED, Json(body)).into_response())
}

/// `POST /v1/adapters/NAME/learn`, body `{}` or `{"wait": true}`: a round
/// for NAME as soon as the learner is free; with `wait`, answers with the
/// round's outcome.
pub async fn learn(State(s): State<Arc<AppState>>, Path(name): Path<String>, raw: Result<Bytes, BytesRejection>) -> Result<Response, ApiError> {
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Learn {
        #[serde(default)]
        wait: bool,
    }
    let l = learning(&s)?;
    let raw = body(raw)?;
    let opts: Learn = if raw.is_empty() { Learn { wait: false } } else { parse(&raw)? };
    let user = l.user(&name).ok_or_else(|| no_user(&name))?;
    let before = l.status().rounds.get(&name).copied().unwrap_or(0);
    l.request(&name);
    if !opts.wait {
        let unseen = user.unseen().map_err(internal)?.len();
        return Ok((StatusCode::ACCEPTED, Json(json!({"model": name, "queued": true, "unseen": unseen}))).into_response());
    }
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        let status = l.status();
        if status.rounds.get(&name).copied().unwrap_or(0) > before {
            let last = status.last.get(&name).cloned().unwrap_or(Value::Null);
            return Ok(Json(json!({"model": name, "round": last})).into_response());
        }
        if status.state == "stopped" {
            return Err(ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "the server is shutting down; the round resumes at the next start", "server_error"));
        }
    }
}

/// A learning user's versions and examples, for `GET /v1/adapters/NAME`.
pub fn user_view(l: &Learning, name: &str) -> Result<Option<Value>, ApiError> {
    let Some(user) = l.user(name) else { return Ok(None) };
    let live = user.versions.live().map_err(internal)?;
    let versions: Vec<Value> = user
        .versions
        .list()
        .map_err(internal)?
        .into_iter()
        .map(|v| {
            let mut j = serde_json::to_value(&v).expect("serialises");
            j["live"] = json!(Some(v.version) == live);
            j
        })
        .collect();
    let status = l.status();
    Ok(Some(json!({
        "live": live,
        "versions": versions,
        "examples": user.stored(),
        "unseen": user.unseen().map_err(internal)?.len(),
        "last_round": status.last.get(name),
    })))
}

/// `POST /v1/adapters/NAME/rollback`: the newest accepted version older
/// than the live one goes live.
pub async fn rollback(State(s): State<Arc<AppState>>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let l = learning(&s)?;
    let user = l.user(&name).ok_or_else(|| no_user(&name))?;
    let (assistant, registry, n) = (s.assistant.clone(), s.registry.clone(), name.clone());
    let moved = tokio::task::spawn_blocking(move || -> crate::Result<(u64, u64)> {
        let moved = user.changing(|v| v.rollback())?;
        learn::go_live(&n, &user, &assistant, &registry)?;
        Ok(moved)
    })
    .await
    .map_err(internal)?;
    let (from, to) = moved.map_err(|e| ApiError::new(StatusCode::CONFLICT, e.to_string(), "invalid_request_error"))?;
    Ok(Json(json!({"id": name, "from": from, "to": to, "live": to})).into_response())
}

/// `GET /v1/learner`: what the learner is doing, rounds per user, and how
/// long requests waited for it to pause.
pub async fn learner(State(s): State<Arc<AppState>>) -> Result<Json<Value>, ApiError> {
    let l = learning(&s)?;
    Ok(Json(serde_json::to_value(l.status()).expect("serialises")))
}
