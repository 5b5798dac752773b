//! `hexlora serve --learn` driven over plain HTTP (ureq) on SmolLM2: a user
//! taught a marker answer through feedback answers with it after a round,
//! other users and the base do not change; a request during a round is
//! answered while the learner pauses; the gate keeps aside a candidate
//! trained on noise; rollback; malformed, oversized and unknown-user
//! feedback refused naming the field; kill -9 at a random step of a round
//! and at each point of a swap loses no example, keeps the last live
//! adapter live and finishes on the next start.
use crate::serve_http::{get, post, spawn, Server};
use crate::support;
use serde_json::{json, Value};
use std::path::Path;
use std::time::{Duration, Instant};

/// The marker alice learns; SmolLM2 never says it unprompted.
const MARKER: &str = "Pineapple forty-two.";

fn serve(model: &Path, dir: &Path, kill_at: Option<&str>, extra: &[&str]) -> Server {
    let mut cmd = support::hexlora();
    cmd.arg("serve").arg("--model").arg(model).args(["--port", "0", "--learn"]).arg(dir);
    // Rounds only on request; the CPU path (the DSP one is the split
    // runtime's tests' concern); a learning rate that teaches a marker in a
    // few steps.
    cmd.args(["--learn-idle", "3600", "--device", "cpu", "--learn-lr", "5e-3", "--learn-epochs", "3", "--learn-max-len", "96"]);
    cmd.args(extra);
    match kill_at {
        Some(point) => cmd.env("HEXLORA_KILL_AT", point),
        None => cmd.env_remove("HEXLORA_KILL_AT"),
    };
    spawn(&mut cmd)
}

fn chat_body(model: &str, prompt: &str) -> String {
    json!({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 12, "temperature": 0}).to_string()
}

fn answer(url: &str, model: &str, prompt: &str) -> String {
    let (status, v) = post(&format!("{url}/v1/chat/completions"), &chat_body(model, prompt));
    assert_eq!(status, 200, "{v}");
    v["choices"][0]["message"]["content"].as_str().unwrap().to_string()
}

fn feedback(url: &str, user: &str, prompt: &str, approved: &str) -> (u16, Value) {
    let body = json!({"model": user, "messages": [{"role": "user", "content": prompt}, {"role": "assistant", "content": approved}]});
    post(&format!("{url}/v1/feedback"), &body.to_string())
}

const PROMPTS: [&str; 10] = [
    "Say something.",
    "What do you think?",
    "Hello there.",
    "Any news today?",
    "Tell me one thing.",
    "How are you?",
    "What should I eat?",
    "Give me a motto.",
    "Answer briefly.",
    "Your words, please.",
];

fn teach(url: &str, user: &str, n: usize) {
    for p in &PROMPTS[..n] {
        let (status, v) = feedback(url, user, p, MARKER);
        assert_eq!(status, 201, "{v}");
    }
}

fn learn_and_wait(url: &str, user: &str) -> Value {
    let (status, v) = post(&format!("{url}/v1/adapters/{user}/learn"), r#"{"wait": true}"#);
    assert_eq!(status, 200, "{v}");
    v["round"].clone()
}

/// The outcome of `user`'s `n`-th round, once it has ended.
fn round_outcome(url: &str, user: &str, n: u64) -> Value {
    let t = Instant::now();
    loop {
        let (_, status) = get(&format!("{url}/v1/learner"));
        if status["rounds"][user].as_u64().unwrap_or(0) >= n {
            return status["last"][user].clone();
        }
        assert!(t.elapsed() < Duration::from_secs(600), "round {n} of {user} did not end: {status}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn user_view(url: &str, user: &str) -> Value {
    let (status, v) = get(&format!("{url}/v1/adapters/{user}"));
    assert_eq!(status, 200, "{v}");
    v["user"].clone()
}

fn sigterm(mut s: Server) {
    let pid = s.child.id() as i32;
    // SAFETY: signalling our own child.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = s.child.wait().unwrap();
    assert!(status.success(), "serve exited {status:?} after SIGTERM");
}

#[test]
fn learning_teaches_one_user_keeps_others_and_the_gate_refuses_noise() {
    let Some(model) = support::smollm2() else { return };
    let dir = tempfile::tempdir().unwrap();
    let s = serve(&model, dir.path(), None, &[]);
    let url = s.url.clone();
    for user in ["alice", "bob"] {
        let (status, v) = post(&format!("{url}/v1/adapters/{user}"), r#"{"fresh": true}"#);
        assert_eq!(status, 201, "{v}");
    }
    let probe = PROMPTS[0];
    let base = answer(&url, "SmolLM2-135M-Instruct.Q4_1", probe);
    assert_eq!(answer(&url, "alice", probe), base, "a fresh adapter answers as the base model");
    assert!(!base.contains("Pineapple"), "{base}");

    teach(&url, "alice", 10);
    // A request while the round runs is answered; the learner pauses for it.
    let (status, v) = post(&format!("{url}/v1/adapters/alice/learn"), "{}");
    assert_eq!(status, 202, "{v}");
    let t = Instant::now();
    while get(&format!("{url}/v1/learner")).1["step"].as_u64().unwrap_or(0) < 1 {
        assert!(t.elapsed() < Duration::from_secs(300), "the round never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(answer(&url, "bob", probe), base, "answered during the round");
    // A longer answer spans a step boundary, where the learner pauses for it.
    let long = json!({"model": "bob", "prompt": "Once upon a time, in a small village,", "max_tokens": 120, "temperature": 0}).to_string();
    assert_eq!(post(&format!("{url}/v1/completions"), &long).0, 200);
    let round = round_outcome(&url, "alice", 1);
    assert_eq!(round["outcome"], "live", "{round}");
    let (_, learner) = get(&format!("{url}/v1/learner"));
    assert!(learner["yields"].as_u64().unwrap() >= 1, "{learner}");

    let taught = answer(&url, "alice", probe);
    assert!(taught.contains("Pineapple"), "alice after learning: {taught:?}");
    assert_eq!(answer(&url, "bob", probe), base, "bob is untouched");
    assert_eq!(answer(&url, "SmolLM2-135M-Instruct.Q4_1", probe), base, "the base is untouched");
    let view = user_view(&url, "alice");
    assert_eq!(view["live"], 2, "{view}");
    let v2 = &view["versions"][1];
    assert!(v2["heldout"]["candidate_loss"].as_f64().unwrap() < v2["heldout"]["live_loss"].as_f64().unwrap(), "{v2}");
    assert_eq!(view["unseen"], 2, "the held-out two wait for the next round: {view}");

    // Another user's answers to the same prompts, then alice's own: the
    // held-out are the newest (hers: 3 of the 15 new, with the 2 the first
    // round held out), so a candidate trained mostly on the other answers
    // is worse there and kept aside.
    for p in PROMPTS {
        assert_eq!(feedback(&url, "alice", p, "Bananas are blue today.").0, 201);
    }
    teach(&url, "alice", 3);
    let round = learn_and_wait(&url, "alice");
    assert_eq!(round["outcome"], "kept-aside", "{round}");
    let view = user_view(&url, "alice");
    assert_eq!(view["live"], 2, "{view}");
    assert_eq!(answer(&url, "alice", probe), taught, "a refused candidate changes nothing");

    // One version back, then nothing older to go back to.
    let (status, v) = post(&format!("{url}/v1/adapters/alice/rollback"), "{}");
    assert_eq!((status, v["to"].as_u64()), (200, Some(1)), "{v}");
    assert_eq!(answer(&url, "alice", probe), base);
    let (status, v) = post(&format!("{url}/v1/adapters/alice/rollback"), "{}");
    assert_eq!(status, 409, "{v}");
    sigterm(s);
}

#[test]
fn bad_feedback_is_refused_naming_the_field() {
    let Some(model) = support::smollm2() else { return };
    let dir = tempfile::tempdir().unwrap();
    let s = serve(&model, dir.path(), None, &["--learn-max-examples", "3"]);
    let url = s.url.clone();
    assert_eq!(post(&format!("{url}/v1/adapters/carol"), r#"{"fresh": true}"#).0, 201);
    let fb = format!("{url}/v1/feedback");
    let cases: [(&str, u16, &str); 8] = [
        (r#"{"messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#, 400, "model"),
        (r#"{"model": "nobody", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}]}"#, 404, "model"),
        (r#"{"model": "carol", "messages": [{"role": "user", "content": "a"}]}"#, 400, "messages"),
        (r#"{"model": "carol", "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": " "}]}"#, 400, "messages"),
        (r#"{"model": "carol", "messages": [{"role": "robot", "content": "a"}, {"role": "assistant", "content": "b"}]}"#, 400, "messages"),
        (r#"{"model": "carol", "prompt": "a", "completion": ""}"#, 400, "completion"),
        (r#"{"model": "carol"}"#, 400, "body"),
        (r#"[1, 2]"#, 400, "body"),
    ];
    for (body, status, param) in cases {
        let (got, v) = post(&fb, body);
        assert_eq!((got, v["error"]["param"].as_str()), (status, Some(param)), "{body}: {v}");
    }
    // The answer would be cut away by --learn-max-len 96.
    let long = "word ".repeat(200);
    let (got, v) = feedback(&url, "carol", &long, "ok");
    assert_eq!(got, 400, "{v}");
    assert!(v["error"]["message"].as_str().unwrap().contains("max-len"), "{v}");
    // Over the body limit: the JSON 413, on its Content-Length.
    let addr = url.trim_start_matches("http://");
    let head = format!("POST /v1/feedback HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n", 3 << 20);
    let (got, body) = crate::serve_http::raw_http(&url, &head);
    assert_eq!(got, 413, "{body}");
    assert!(body.contains("limit"), "{body}");
    // The bound drops the oldest and says so.
    for k in 0..4 {
        let (got, v) = feedback(&url, "carol", &format!("q{k}"), "fine");
        assert_eq!(got, 201, "{v}");
        assert_eq!(v["dropped"], if k == 3 { 1 } else { 0 }, "{v}");
    }
    assert_eq!(user_view(&url, "carol")["examples"], 3);
    // Nothing was stored for anyone else.
    assert!(!dir.path().join("nobody").exists());
    sigterm(s);
}

/// Starts the server expecting it to die by SIGKILL at `point` while
/// `act` drives it; returns once it is dead.
fn killed_at(model: &Path, dir: &Path, point: &str, act: impl FnOnce(&str)) {
    let mut s = serve(model, dir, Some(point), &[]);
    let url = s.url.clone();
    act(&url);
    let t = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(t.elapsed() < Duration::from_secs(300), "serve did not reach kill point {point}");
        std::thread::sleep(Duration::from_millis(50));
    };
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(libc::SIGKILL), "expected SIGKILL at {point}, got {status:?}");
}

#[test]
fn kill_9_at_any_point_of_feedback_learning_or_swap_loses_nothing() {
    let Some(model) = support::smollm2() else { return };
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    // Feedback: killed right after the store's fsync, before the answer.
    killed_at(&model, d, "feedback-stored", |url| {
        assert_eq!(post(&format!("{url}/v1/adapters/dave"), r#"{"fresh": true}"#).0, 201);
        let body = json!({"model": "dave", "messages": [{"role": "user", "content": PROMPTS[0]}, {"role": "assistant", "content": MARKER}]});
        let _ = crate::serve_http::agent().post(format!("{url}/v1/feedback")).header("content-type", "application/json").send(body.to_string().as_str());
    });
    let s = serve(&model, d, None, &[]);
    assert_eq!(user_view(&s.url, "dave")["examples"], 1, "the fsync'd example is kept");
    // A second user whose store must never change below.
    assert_eq!(post(&format!("{}/v1/adapters/erin", s.url), r#"{"fresh": true}"#).0, 201);
    assert_eq!(feedback(&s.url, "erin", "Hi", "Hello from erin.").0, 201);
    for p in &PROMPTS[1..6] {
        assert_eq!(feedback(&s.url, "dave", p, MARKER).0, 201);
    }
    sigterm(s);
    let erin = std::fs::read(d.join("erin/feedback.jsonl")).unwrap();
    let dave = std::fs::read(d.join("dave/feedback.jsonl")).unwrap();

    // A kill at each point of a round; each restart finishes it.
    for point in ["round-started", "version-written", "live-set"] {
        killed_at(&model, d, point, |url| {
            let _ = post(&format!("{url}/v1/adapters/dave/learn"), "{}");
        });
        let s = serve(&model, d, None, &[]);
        let live = user_view(&s.url, "dave")["live"].as_u64().unwrap();
        // The last live version answers until the round is finished; the
        // next round finishes it (trains again if it had not got its
        // examples fixed, else writes or makes live what is missing).
        assert_eq!(live, if point == "live-set" { 2 } else { 1 }, "live after a kill at {point}");
        let round = learn_and_wait(&s.url, "dave");
        assert_eq!((round["outcome"].as_str(), round["version"].as_u64()), (Some("live"), Some(2)), "after a kill at {point}: {round}");
        assert_eq!(user_view(&s.url, "dave")["live"], 2);
        assert!(!d.join("dave/round").exists());
        sigterm(s);
        if point != "live-set" {
            // Version 1 live again and every example new, for the next point.
            restart_fresh(&model, d, "dave");
        }
        assert_eq!(std::fs::read(d.join("dave/feedback.jsonl")).unwrap(), dave, "dave's examples after a kill at {point}");
        assert_eq!(std::fs::read(d.join("erin/feedback.jsonl")).unwrap(), erin, "erin's examples after a kill at {point}");
    }

    // A kill at an unknown step of training: the round resumes from its
    // last commit and ends as one round.
    for p in &PROMPTS[6..10] {
        let s = serve(&model, d, None, &[]);
        assert_eq!(feedback(&s.url, "dave", p, MARKER).0, 201);
        sigterm(s);
    }
    let mut s = serve(&model, d, None, &[]);
    assert_eq!(post(&format!("{}/v1/adapters/dave/learn", s.url), "{}").0, 202);
    let t = Instant::now();
    while get(&format!("{}/v1/learner", s.url)).1["step"].as_u64().unwrap_or(0) < 2 {
        assert!(t.elapsed() < Duration::from_secs(300), "the round never reached step 2");
        std::thread::sleep(Duration::from_millis(20));
    }
    s.child.kill().unwrap();
    s.child.wait().unwrap();
    assert!(d.join("dave/round/commit.safetensors").exists(), "the killed round's commit is kept");
    let s = serve(&model, d, None, &[]);
    let round = learn_and_wait(&s.url, "dave");
    assert_eq!(round["outcome"].as_str().map(|o| o == "live" || o == "kept-aside"), Some(true), "{round}");
    let view = user_view(&s.url, "dave");
    let last = view["versions"].as_array().unwrap().last().unwrap().clone();
    assert_eq!(last["trained"]["steps"], 3 * last["trained"]["examples"].as_u64().unwrap(), "one whole round of 3 epochs: {last}");
    assert!(!d.join("dave/round").exists());
    sigterm(s);
}

/// Gives `name` a fresh live version 1 again (its examples stay).
fn restart_fresh(model: &Path, d: &Path, name: &str) {
    let keep = d.join(format!("{name}.feedback"));
    std::fs::rename(d.join(name).join("feedback.jsonl"), &keep).unwrap();
    std::fs::remove_dir_all(d.join(name)).unwrap();
    let s = serve(model, d, None, &[]);
    assert_eq!(post(&format!("{}/v1/adapters/{name}", s.url), r#"{"fresh": true}"#).0, 201);
    sigterm(s);
    std::fs::rename(&keep, d.join(name).join("feedback.jsonl")).unwrap();
}
