//! Fuzzes what `hexlora serve` does with a request before any model runs:
//! an HTTP/1.1 request head parsed as hyper parses it (httparse), the
//! guard's rules on its headers (`serve/guard.rs`: Host, Origin,
//! Content-Type, API key, body length), then the body as the route its path
//! names reads it: chat and completion requests (OpenAI's JSON), feedback
//! (`POST /v1/feedback`: a training line once `model` is taken out), an
//! adapter's name, scale and path. The first byte picks whether the server
//! has an API key. Asserts the guard's promises on every request it lets
//! through, and that no adapter path resolves outside `--adapter-dir`.
//!
//!     cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run http_request

use axum::http::{HeaderMap, HeaderName, HeaderValue, Method};
use hexlora::serve::adapters::{check_name, check_scale, inside};
use hexlora::serve::guard::Guard;
use hexlora::serve::openai::{ChatRequest, CompletionRequest, Sampling};
use hexlora::train::data::{parse_jsonl, Bounds, Encoder, Message};
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

const KEY: &str = "sk-fuzz";

/// Byte-level tokens and a ChatML-like template (as `training_jsonl`).
struct Bytes;

impl Encoder for Bytes {
    fn encode(&self, text: &str) -> hexlora::Result<Vec<u32>> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn render_chat(&self, messages: &[Message], add_generation_prompt: bool) -> hexlora::Result<String> {
        let mut s: String = messages.iter().map(|m| format!("<|{}|>{}<|end|>", m.role, m.content)).collect();
        if add_generation_prompt {
            s.push_str("<|assistant|>");
        }
        Ok(s)
    }
    fn end_of_turn(&self) -> String {
        "<|end|>".into()
    }
}

/// An `--adapter-dir` with one adapter directory and a file beside it.
fn adapter_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("hexlora-fuzz-adapters-{}", std::process::id()));
        std::fs::create_dir_all(d.join("alice")).unwrap();
        std::fs::write(d.join("alice/adapter_config.json"), b"{}").unwrap();
        std::fs::write(d.parent().unwrap().join(format!("hexlora-fuzz-outside-{}", std::process::id())), b"x").unwrap();
        d.canonicalize().unwrap()
    })
}

pub fn run(bytes: &[u8]) {
    let Some((&flags, raw)) = bytes.split_first() else {
        return;
    };
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut req = httparse::Request::new(&mut headers);
    let Ok(httparse::Status::Complete(head_len)) = req.parse(raw) else {
        return;
    };
    let (Some(method), Some(path)) = (req.method, req.path) else {
        return;
    };
    let Ok(method) = Method::from_bytes(method.as_bytes()) else {
        return;
    };
    let mut map = HeaderMap::new();
    for h in req.headers.iter() {
        if let (Ok(name), Ok(value)) = (HeaderName::from_bytes(h.name.as_bytes()), HeaderValue::from_bytes(h.value)) {
            map.append(name, value);
        }
    }
    let guard = Guard { local: "127.0.0.1:8080".parse().unwrap(), host_arg: "127.0.0.1".into(), api_key: (flags & 1 == 1).then(|| KEY.to_string()) };
    let body = &raw[head_len..];
    if guard.check(&method, path, &map).is_err() {
        return;
    }
    // Let through: the guard's promises hold.
    let header = |name: &str| map.get(name).and_then(|v| v.to_str().ok());
    let host = header("host").unwrap_or("");
    assert!(
        ["localhost", "127.0.0.1", "[::1]"].iter().any(|h| host.eq_ignore_ascii_case(h) || host.eq_ignore_ascii_case(&format!("{h}:8080"))),
        "a loopback server answered to Host {host:?}"
    );
    if let Some(origin) = map.get("origin") {
        assert!(origin.to_str().is_ok_and(|o| o.eq_ignore_ascii_case(&format!("http://{host}"))), "a foreign Origin {origin:?} let through");
    }
    if method == Method::POST {
        let ty = header("content-type").unwrap_or("");
        assert!(ty.split(';').next().unwrap_or("").trim().eq_ignore_ascii_case("application/json"), "a POST of type {ty:?} let through");
    }
    if guard.api_key.is_some() && path != "/health" {
        assert_eq!(header("authorization"), Some(format!("Bearer {KEY}").as_str()), "a request without the API key let through");
    }
    route(path, body);
}

/// The body as the route for `path` reads it.
fn route(path: &str, body: &[u8]) {
    match path {
        "/v1/chat/completions" => {
            if let Ok(req) = serde_json::from_slice::<ChatRequest>(body) {
                for m in &req.messages {
                    let _ = m.to_message();
                }
            }
            let _ = serde_json::from_slice::<Sampling>(body);
        }
        "/v1/completions" => {
            let _ = serde_json::from_slice::<CompletionRequest>(body);
            let _ = serde_json::from_slice::<Sampling>(body);
        }
        "/v1/feedback" => {
            if let Ok(serde_json::Value::Object(mut obj)) = serde_json::from_slice(body) {
                obj.remove("model");
                let line = serde_json::Value::Object(obj).to_string();
                if let Ok((batches, _)) = parse_jsonl(&line, "feedback", Some(&Bytes), 96, Bounds { vocab_size: 256, positions: 128 }) {
                    assert!(batches.iter().all(|b| b.input_ids[0].len() <= 96), "a feedback example longer than --learn-max-len");
                }
            }
        }
        _ => adapter_route(path, body),
    }
}

/// `POST /v1/adapters/NAME` with `{"path": P, "scale": S}`.
fn adapter_route(path: &str, body: &[u8]) {
    let Some(name) = path.strip_prefix("/v1/adapters/") else {
        return;
    };
    if check_name(name, "base").is_ok() {
        assert!(!name.contains('/') && !name.contains("..") && name != "base", "adapter name {name:?} accepted");
    }
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(body) else {
        return;
    };
    if let Some(scale) = v.get("scale").and_then(|s| s.as_f64()) {
        if check_scale(scale as f32).is_ok() {
            assert!((scale as f32).is_finite() && (scale as f32).abs() <= 16.0, "scale {scale} accepted");
        }
    }
    if let Some(p) = v.get("path").and_then(|p| p.as_str()) {
        let dir = adapter_dir();
        if let Ok(resolved) = inside(dir, Path::new(p)) {
            assert!(resolved.starts_with(dir) && resolved != *dir, "{p:?} resolved to {} outside {}", resolved.display(), dir.display());
        }
    }
}
