//! `hexlora serve` driven by a real HTTP client (ureq) on a free loopback
//! port, against SmolLM2 with the fixture adapters: answers for two users'
//! adapters and the base equal `hexlora generate`'s text (greedy, and
//! sampled with the same seed), streamed and not; stop strings; adapters
//! added and removed at run time; 4xx errors as JSON; 429 beyond the queue;
//! SIGTERM finishes the answer in progress and exits 0; run-time adapters
//! only from `--adapter-dir`; foreign hosts, origins and content types,
//! missing API keys, absurd scales and oversized bodies refused as JSON.
use serde_json::{json, Value};
use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use crate::support;
use support::{adapter, smollm2 as model};

/// A running server, killed if the test fails before it stops it.
pub(crate) struct Server {
    pub(crate) child: Child,
    pub(crate) url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start(model: &PathBuf, extra: &[&str]) -> Server {
    let adapters = [format!("sotu={}", adapter("sotu").display()), format!("marker={}", adapter("marker").display())];
    let args: Vec<&str> = ["--adapter", &adapters[0], "--adapter", &adapters[1]].into_iter().chain(extra.iter().copied()).collect();
    spawn(support::hexlora().arg("serve").arg("--model").arg(model).args(["--port", "0"]).args(args))
}

/// Starts `command` (a `hexlora serve`) and waits for the address it prints.
pub(crate) fn spawn(command: &mut Command) -> Server {
    let mut child = command.stdout(Stdio::piped()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let url = line.trim().rsplit(' ').next().unwrap().to_string();
    assert!(url.starts_with("http://127.0.0.1:"), "unexpected first line {line:?}");
    Server { child, url }
}

pub(crate) fn agent() -> ureq::Agent {
    ureq::Agent::config_builder().http_status_as_error(false).build().into()
}

pub(crate) fn post(url: &str, body: &str) -> (u16, Value) {
    let mut r = agent().post(url).header("content-type", "application/json").send(body).unwrap();
    let status = r.status().as_u16();
    let text = r.body_mut().read_to_string().unwrap();
    (status, serde_json::from_str(&text).unwrap_or_else(|e| panic!("{url}: {status} body is not JSON ({e}): {text}")))
}

pub(crate) fn get(url: &str) -> (u16, Value) {
    let mut r = agent().get(url).call().unwrap();
    (r.status().as_u16(), serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap())
}

/// The text of a streamed chat answer, and the finish reason of its last chunk.
fn stream(url: &str, body: &Value) -> (String, String) {
    let mut r = agent().post(url).header("content-type", "application/json").send(body.to_string().as_str()).unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let mut raw = String::new();
    r.body_mut().as_reader().read_to_string(&mut raw).unwrap();
    let data: Vec<&str> = raw.lines().filter_map(|l| l.strip_prefix("data: ")).collect();
    assert_eq!(data.last(), Some(&"[DONE]"), "stream must end with [DONE]: {raw}");
    let (mut text, mut finish) = (String::new(), String::new());
    for d in &data[..data.len() - 1] {
        let v: Value = serde_json::from_str(d).unwrap();
        let c = &v["choices"][0];
        text.push_str(c["delta"]["content"].as_str().or(c["text"].as_str()).unwrap_or(""));
        if let Some(f) = c["finish_reason"].as_str() {
            finish = f.to_string();
        }
    }
    (text, finish)
}

/// `hexlora generate` with `args`, stdout without the final newline.
fn generate(model: &PathBuf, args: &[&str]) -> String {
    let out = support::hexlora().arg("generate").arg("--model").arg(model).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().strip_suffix('\n').unwrap().to_string()
}

fn chat(model: &str, prompt: &str, extra: Value) -> Value {
    let mut body = json!({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 24, "temperature": 0});
    body.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
    body
}

#[test]
fn serve_answers_as_generate_does_for_each_adapter_and_the_base() {
    let Some(m) = model() else { return };
    let s = start(&m, &[]);
    let (status, health) = get(&format!("{}/health", s.url));
    assert_eq!((status, health["status"].as_str()), (200, Some("ok")));
    let (_, models) = get(&format!("{}/v1/models", s.url));
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["SmolLM2-135M-Instruct.Q4_1", "marker", "sotu"]);

    let chat_url = format!("{}/v1/chat/completions", s.url);
    let prompt = "Write a haiku about the sea.";
    for (name, adapter_args) in [("SmolLM2-135M-Instruct.Q4_1", vec![]), ("sotu", vec!["--adapter", "SOTU"]), ("marker", vec!["--adapter", "MARKER"])] {
        let adapter_path = |a: &str| match a {
            "SOTU" => adapter("sotu").display().to_string(),
            "MARKER" => adapter("marker").display().to_string(),
            other => other.to_string(),
        };
        let extra: Vec<String> = adapter_args.iter().map(|a| adapter_path(a)).collect();
        let mut args: Vec<&str> = vec!["--prompt", prompt, "--max-tokens", "24"];
        args.extend(extra.iter().map(String::as_str));
        let want = generate(&m, &args);
        let (status, v) = post(&chat_url, &chat(name, prompt, json!({})).to_string());
        assert_eq!(status, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), want, "{name}, non-streaming");
        assert_eq!(v["model"].as_str(), Some(name));
        let (text, finish) = stream(&chat_url, &chat(name, prompt, json!({"stream": true})));
        assert_eq!(text, want, "{name}, streaming");
        assert_eq!(finish, v["choices"][0]["finish_reason"].as_str().unwrap());
    }
    assert!(post(&chat_url, &chat("marker", prompt, json!({})).to_string()).1["choices"][0]["message"]["content"].as_str().unwrap().starts_with("Ahoy!"));

    // Sampling: the same seed gives generate's text.
    let want = generate(&m, &["--prompt", prompt, "--max-tokens", "24", "--temperature", "0.9", "--top-p", "0.9", "--seed", "7", "--adapter", &adapter("sotu").display().to_string()]);
    let (_, v) = post(&chat_url, &chat("sotu", prompt, json!({"temperature": 0.9, "top_p": 0.9, "seed": 7})).to_string());
    assert_eq!(v["choices"][0]["message"]["content"].as_str().unwrap(), want, "seeded sampling");

    // Raw completions and stop strings.
    let want = generate(&m, &["--raw", "--prompt", "Once upon a time", "--max-tokens", "16"]);
    let body = json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0});
    let (_, v) = post(&format!("{}/v1/completions", s.url), &body.to_string());
    assert_eq!(v["choices"][0]["text"].as_str().unwrap(), want);
    let (text, finish) = stream(&format!("{}/v1/completions", s.url), &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stream": true}));
    assert_eq!((text.as_str(), finish.as_str()), (want.as_str(), "length"));
    let stop_word = want.split_whitespace().nth(3).unwrap().to_string();
    let (_, v) = post(&format!("{}/v1/completions", s.url), &json!({"model": "SmolLM2-135M-Instruct.Q4_1", "prompt": "Once upon a time", "max_tokens": 16, "temperature": 0, "stop": [stop_word.clone()]}).to_string());
    let cut = v["choices"][0]["text"].as_str().unwrap();
    assert_eq!(cut, &want[..want.find(&stop_word).unwrap()]);
    assert_eq!(v["choices"][0]["finish_reason"].as_str(), Some("stop"));
}

#[test]
fn serve_adds_and_removes_adapters_refuses_bad_requests_queues_and_drains_on_sigterm() {
    let Some(m) = model() else { return };
    let dir = adapter("marker").parent().unwrap().parent().unwrap().to_path_buf();
    let s = start(&m, &["--queue", "1", "--ctx-size", "256", "--adapter-dir", dir.to_str().unwrap()]);
    let chat_url = format!("{}/v1/chat/completions", s.url);
    let adapters = format!("{}/v1/adapters", s.url);
    let prompt = "What is the capital of France?";

    let (status, v) = post(&format!("{adapters}/user-7"), &json!({"path": adapter("marker")}).to_string());
    assert_eq!(status, 201, "{v}");
    let (_, v) = post(&chat_url, &chat("user-7", prompt, json!({})).to_string());
    assert!(v["choices"][0]["message"]["content"].as_str().unwrap().starts_with("Ahoy!"), "{v}");
    assert_eq!(post(&format!("{adapters}/user-7"), &json!({"path": adapter("sotu")}).to_string()).0, 409);
    let mut r = agent().delete(&format!("{adapters}/user-7")).call().unwrap();
    assert_eq!(r.status().as_u16(), 200, "{}", r.body_mut().read_to_string().unwrap());
    assert_eq!(agent().delete(&format!("{adapters}/user-7")).call().unwrap().status().as_u16(), 404);

    let error = |status: u16, v: &Value, needle: &str| {
        let msg = v["error"]["message"].as_str().unwrap_or_else(|| panic!("no JSON error body: {v}"));
        assert!((400..500).contains(&status) && msg.contains(needle), "{status} {msg:?} should mention {needle:?}");
    };
    let (st, v) = post(&chat_url, &chat("user-7", prompt, json!({})).to_string());
    assert_eq!(st, 404);
    error(st, &v, "not found");
    let (st, v) = post(&chat_url, "{\"model\": \"sotu\", \"messages\": [");
    error(st, &v, "invalid request body");
    let (st, v) = post(&chat_url, &chat("sotu", prompt, json!({"max_tokens": 100000})).to_string());
    error(st, &v, "exceeds the context");
    let (st, v) = post(&chat_url, &chat("sotu", &"word ".repeat(400), json!({})).to_string());
    error(st, &v, "the context holds 256");
    assert_eq!(v["error"]["param"].as_str(), Some("messages"));
    let long = json!({"model": "sotu", "prompt": "word ".repeat(400)});
    let (st, v) = post(&format!("{}/v1/completions", s.url), &long.to_string());
    error(st, &v, "the context holds 256");
    assert_eq!(v["error"]["param"].as_str(), Some("prompt"));
    let (st, v) = post(&chat_url, &chat("sotu", prompt, json!({"temperature": -1})).to_string());
    error(st, &v, "temperature");
    let (st, v) = post(&chat_url, &chat("sotu", prompt, json!({"top_p": 0})).to_string());
    error(st, &v, "top_p");
    assert_eq!(v["error"]["param"].as_str(), Some("top_p"));
    let (st, v) = post(&format!("{}/v1/completions", s.url), &json!({"model": "sotu", "prompt": ""}).to_string());
    error(st, &v, "prompt is empty");

    // Run-time adapters: only from inside --adapter-dir, one error for
    // every path refused (missing, outside, the directory itself).
    let refused = |path: &str| {
        let (st, v) = post(&format!("{adapters}/bad"), &json!({"path": path}).to_string());
        error(st, &v, "is not an adapter inside --adapter-dir");
    };
    refused("/nonexistent/adapter");
    refused(m.to_str().unwrap());
    refused("../../../Cargo.toml");
    refused(".");
    refused("sotu/adapter/../../../training");
    let (st, v) = post(&format!("{adapters}/relative"), &json!({"path": "sotu/adapter"}).to_string());
    assert_eq!(st, 201, "{v}");
    let (st, v) = post(&format!("{adapters}/huge"), &json!({"path": "sotu/adapter", "scale": 1e30}).to_string());
    error(st, &v, "scale");
    for name in ["no%20spaces", "%2E%2E", "a.b", "-x"] {
        let (st, v) = post(&format!("{adapters}/{name}"), &json!({"path": "sotu/adapter"}).to_string());
        error(st, &v, "adapter name");
    }

    // What a web page could send: text/plain (no CORS preflight), a foreign
    // Origin; and a body over the limit. Each a JSON error.
    let raw = |ct: &str, origin: Option<&str>, body: String| {
        let mut r = agent().post(&chat_url).header("content-type", ct);
        if let Some(o) = origin {
            r = r.header("origin", o);
        }
        let mut r = r.send(body.as_str()).unwrap();
        (r.status().as_u16(), serde_json::from_str::<Value>(&r.body_mut().read_to_string().unwrap()).unwrap())
    };
    let ok_body = chat("sotu", prompt, json!({"max_tokens": 1})).to_string();
    let (st, v) = raw("text/plain", None, ok_body.clone());
    assert_eq!(st, 415);
    error(st, &v, "application/json");
    let (st, v) = raw("application/json", Some("https://evil.example"), ok_body.clone());
    assert_eq!(st, 403);
    error(st, &v, "cross-origin");
    // Refused on its Content-Length, before the body is read.
    let addr = s.url.trim_start_matches("http://");
    let head = format!("POST /v1/chat/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", 3 << 20);
    let (st, body) = raw_http(&s.url, &head);
    assert_eq!(st, 413, "{body}");
    error(st, &serde_json::from_str(&body).unwrap(), "over the limit");

    // One answering, one waiting: of six at once, at least three are refused.
    let codes: Vec<u16> = std::thread::scope(|sc| {
        let handles: Vec<_> = (0..6).map(|_| sc.spawn(|| post(&chat_url, &chat("sotu", prompt, json!({"max_tokens": 48})).to_string()).0)).collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    assert!(codes.iter().all(|&c| c == 200 || c == 429), "{codes:?}");
    assert!(codes.iter().filter(|&&c| c == 429).count() >= 3 && codes.contains(&200), "{codes:?}");

    // SIGTERM during a streamed answer: the answer completes, then the process exits 0.
    let mut s = s;
    let body = chat("sotu", "Write a haiku about the sea.", json!({"stream": true, "max_tokens": 48}));
    let mut r = agent().post(&chat_url).header("content-type", "application/json").send(body.to_string().as_str()).unwrap();
    let mut reader = BufReader::new(r.body_mut().as_reader());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    assert!(first.starts_with("data: "), "{first:?}");
    // SAFETY: a signal to our own child process.
    unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(rest.trim_end().ends_with("data: [DONE]"), "the stream was cut: {rest}");
    let status = s.child.wait().unwrap();
    assert!(status.success(), "exit after SIGTERM: {status}");
    s.child = Command::new("true").spawn().unwrap();
}

/// One request written as raw HTTP/1.1 (to send a `Host` or a length no
/// client library would): the status and the body of the answer.
pub(crate) fn raw_http(url: &str, request: &str) -> (u16, String) {
    use std::io::Write;
    let mut c = std::net::TcpStream::connect(url.trim_start_matches("http://")).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    c.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the head and a Content-Length's worth of body are in (the
    // server may keep the connection open).
    loop {
        let n = c.read(&mut buf).unwrap_or(0);
        out.extend_from_slice(&buf[..n]);
        let text = String::from_utf8_lossy(&out).into_owned();
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let len = head.lines().find_map(|l| l.to_ascii_lowercase().strip_prefix("content-length:").map(|v| v.trim().parse::<usize>().unwrap()));
            if n == 0 || len.is_some_and(|l| body.len() >= l) {
                return (head.split_whitespace().nth(1).unwrap().parse().unwrap(), body.to_string());
            }
        }
        assert!(n > 0, "connection closed before an answer: {text:?}");
    }
}

fn raw_get(url: &str, path: &str, headers: &str) -> u16 {
    raw_http(url, &format!("GET {path} HTTP/1.1\r\n{headers}Connection: close\r\n\r\n")).0
}

#[test]
fn serve_without_adapter_dir_keeps_adapters_fixed_and_guards_hosts_and_keys() {
    let Some(m) = model() else { return };
    let s = start(&m, &["--api-key", "k3y"]);
    let addr = s.url.trim_start_matches("http://").to_string();
    let auth = "Authorization: Bearer k3y\r\n";
    assert_eq!(raw_get(&s.url, "/health", &format!("Host: {addr}\r\n")), 200);
    assert_eq!(raw_get(&s.url, "/v1/models", &format!("Host: {addr}\r\n")), 401);
    assert_eq!(raw_get(&s.url, "/v1/models", &format!("Host: {addr}\r\nAuthorization: Bearer nope\r\n")), 401);
    assert_eq!(raw_get(&s.url, "/v1/models", &format!("Host: {addr}\r\n{auth}")), 200);
    // A DNS-rebinding page reaches 127.0.0.1 under its own name.
    assert_eq!(raw_get(&s.url, "/v1/models", &format!("Host: attacker.example:{}\r\n{auth}", addr.rsplit(':').next().unwrap())), 403);
    assert_eq!(raw_get(&s.url, "/health", "Host: attacker.example\r\n"), 403);

    let mut r = agent()
        .post(&format!("{}/v1/adapters/x", s.url))
        .header("content-type", "application/json")
        .header("authorization", "Bearer k3y")
        .send(json!({"path": adapter("sotu")}).to_string().as_str())
        .unwrap();
    let v: Value = serde_json::from_str(&r.body_mut().read_to_string().unwrap()).unwrap();
    assert_eq!(r.status().as_u16(), 403, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("--adapter-dir"), "{v}");
}
