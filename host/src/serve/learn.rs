//! `serve --learn DIR`: the personal loop inside the serving process. The
//! users live under DIR ([`crate::personal`]); the handlers store approved
//! examples and answer; one learner thread runs a user's learning round
//! ([`round::run`]) on the training graph that shares the resident base
//! weights with the answering model, when the server has been idle for
//! `--learn-idle` or at once on `POST /v1/adapters/NAME/learn`. It pauses at
//! the next step boundary while a request waits or is answered, and a
//! version that passes the gate replaces the user's adapter in the
//! registry at once (requests in flight finish on the adapter they began
//! with).
use super::adapters::{self, Registry};
use super::worker::Activity;
use crate::lora::{Adapter, LoraConfig};
use crate::model::assistant::Assistant;
use crate::personal::round::{self, Outcome, RoundConfig};
use crate::personal::{Limits, User};
use crate::train::commit::TrainState;
use crate::train::data::{parse_jsonl, Bounds, Encoder};
use crate::autograd::graph::TrainableModel;
use crate::train::learner::StepHooks;
use crate::train::text_encoder::ModelText;
use crate::{Error, Result};
use serde_json::{json, Value};
use std::collections::{BTreeMap, VecDeque};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

/// How the server learns.
#[derive(Clone, Debug)]
pub struct LearnConfig {
    /// Where the users live.
    pub dir: PathBuf,
    /// Idle time before the learner starts a round on its own.
    pub idle: Duration,
    /// Per-user bounds.
    pub limits: Limits,
    /// How rounds train.
    pub round: RoundConfig,
    /// The LoRA shape of a user created fresh.
    pub fresh: LoraConfig,
}

/// What the learner is doing, for `GET /v1/adapters/NAME` and `/v1/learner`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Status {
    /// `idle`, `learning NAME`, `paused NAME (answering)`, `stopped`.
    pub state: String,
    /// Steps done of the round in progress.
    pub step: Option<u64>,
    /// Rounds finished (any outcome), per user.
    pub rounds: BTreeMap<String, u64>,
    /// The last outcome per user, in words.
    pub last: BTreeMap<String, Value>,
    /// Steps during which a request came (the learner paused after them).
    pub yields: u64,
    /// How long such a request shared the machine with the step before
    /// the learner paused (ms from its arrival to the step's end): worst.
    pub yield_ms_max: f64,
    /// See `yield_ms_max`.
    pub yield_ms_last: f64,
}

/// The learning side of the server, shared by handlers and the learner thread.
pub struct Learning {
    /// Its configuration.
    pub config: LearnConfig,
    users: Mutex<BTreeMap<String, Arc<User>>>,
    requested: Mutex<VecDeque<String>>,
    status: Mutex<Status>,
    stop: AtomicBool,
    encoder: ModelText,
    bounds: Bounds,
    /// The model's adapted projections (a fresh user's adapter covers them).
    projections: Vec<crate::projection::ProjectionInfo>,
}

impl Learning {
    /// Opens every user under `config.dir` (created if missing).
    pub fn open(config: LearnConfig, encoder: ModelText, bounds: Bounds, projections: Vec<crate::projection::ProjectionInfo>) -> Result<Learning> {
        std::fs::create_dir_all(&config.dir).map_err(|e| Error::io(&config.dir, e))?;
        let mut users = BTreeMap::new();
        for name in crate::personal::user_names(&config.dir)? {
            let user = User::open(&config.dir.join(&name), config.limits)?;
            users.insert(name, Arc::new(user));
        }
        let status = Status { state: "idle".into(), ..Default::default() };
        Ok(Learning { config, users: Mutex::new(users), requested: Mutex::default(), status: Mutex::new(status), stop: AtomicBool::new(false), encoder, bounds, projections })
    }

    fn users(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Arc<User>>> {
        self.users.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The user called `name`.
    pub fn user(&self, name: &str) -> Option<Arc<User>> {
        self.users().get(name).cloned()
    }

    /// Every user's name.
    pub fn names(&self) -> Vec<String> {
        self.users().keys().cloned().collect()
    }

    /// Starts user `name` with `adapter` (or a fresh one when `None`).
    pub fn create(&self, name: &str, adapter: Option<&Adapter>) -> Result<Arc<User>> {
        let mut users = self.users();
        if users.contains_key(name) {
            return Err(Error::invalid("user", format!("{name:?} exists")));
        }
        let fresh;
        let (adapter, origin) = match adapter {
            Some(a) => (a, "adapter"),
            None => {
                // B = 0: a fresh adapter answers as the base model does.
                fresh = Adapter::init(self.config.fresh.clone(), &self.projections, 0)?;
                (&fresh, "fresh")
            }
        };
        let user = Arc::new(User::create(&self.config.dir.join(name), adapter, origin, self.config.limits)?);
        users.insert(name.to_string(), user.clone());
        Ok(user)
    }

    /// Checks `example` (a training JSONL line) as training would, naming
    /// the field at fault.
    pub fn check_example(&self, example: &Value) -> Result<()> {
        let max_len = self.config.round.max_len;
        parse_jsonl(&example.to_string(), "feedback", Some(&self.encoder as &dyn Encoder), max_len, self.bounds).map(|_| ())
    }

    /// Asks for a round for `name` as soon as the learner is free.
    pub fn request(&self, name: &str) {
        let mut q = self.requested.lock().unwrap_or_else(|p| p.into_inner());
        if !q.iter().any(|n| n == name) {
            q.push_back(name.to_string());
        }
    }

    /// The learner's status.
    pub fn status(&self) -> Status {
        self.status.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    fn set_status(&self, f: impl FnOnce(&mut Status)) {
        f(&mut self.status.lock().unwrap_or_else(|p| p.into_inner()));
    }

    /// Ends the learner at its next step boundary (its round stays resumable).
    pub fn shut_down(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    fn stopping(&self) -> bool {
        self.stop.load(Ordering::SeqCst)
    }

    /// The next user to learn for: one asked for, or after `idle`, the
    /// user with the most new examples (at least `min_new`) whose last
    /// round did not fail on the same examples.
    fn next_user(&self, activity: &Activity, failed: &BTreeMap<String, usize>) -> Option<String> {
        if let Some(name) = self.requested.lock().unwrap_or_else(|p| p.into_inner()).pop_front() {
            return Some(name);
        }
        if activity.idle_for().is_none_or(|d| d < self.config.idle) {
            return None;
        }
        let min_new = self.config.round.min_new.max(2);
        let users: Vec<(String, Arc<User>)> = self.users().iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        users
            .into_iter()
            .filter_map(|(name, u)| u.unseen().ok().map(|s| (name, s.len())))
            .filter(|(name, n)| *n >= min_new && failed.get(name) != Some(n))
            .max_by_key(|(_, n)| *n)
            .map(|(name, _)| name)
    }
}

/// Starts the learner thread. `graph` shares its frozen projections with
/// `assistant`'s model; `keep` (the DSP connection) lives as long as it.
pub fn start<K: Send + 'static>(learning: Arc<Learning>, graph: Box<dyn TrainableModel>, keep: K, assistant: Arc<Assistant>, registry: Arc<Registry>, activity: Arc<Activity>) -> JoinHandle<()> {
    std::thread::Builder::new()
        .name("hexlora-learn".into())
        .spawn(move || {
            // Not inside the pool: its pauses block this thread only, so an
            // answer gets both cores while the learner waits.
            learn_loop(&learning, &*graph, &assistant, &registry, &activity);
            drop(keep);
        })
        .expect("spawning the learner thread")
}

fn learn_loop(l: &Learning, graph: &dyn TrainableModel, assistant: &Assistant, registry: &Registry, activity: &Activity) {
    // Users whose last round failed, with the new-example count it failed
    // on: not retried until more feedback arrives.
    let mut failed: BTreeMap<String, usize> = BTreeMap::new();
    while !l.stopping() {
        let Some(name) = l.next_user(activity, &failed) else {
            std::thread::sleep(Duration::from_millis(100));
            continue;
        };
        let Some(user) = l.user(&name) else { continue };
        l.set_status(|s| s.state = format!("learning {name}"));
        let mut hooks = Yield { l, activity, name: &name, stepped: false };
        let outcome = round::run(&user, graph, &l.encoder, l.bounds, &l.config.round, Some(&mut hooks as &mut dyn StepHooks<TrainState>));
        let last = match outcome {
            Ok(Outcome::Done(v)) => {
                failed.remove(&name);
                if v.accepted {
                    if let Err(e) = go_live(&name, &user, assistant, registry) {
                        eprintln!("hexlora serve: {name}: version {} passed the gate but could not be loaded: {e}", v.version);
                    }
                }
                eprintln!("hexlora serve: {name}: version {}: {}", v.version, v.reason);
                json!({"outcome": if v.accepted { "live" } else { "kept-aside" }, "version": v.version, "reason": v.reason, "heldout": v.heldout})
            }
            Ok(Outcome::Paused { step, total }) => json!({"outcome": "paused", "step": step, "total": total}),
            Ok(Outcome::Nothing { unseen }) => json!({"outcome": "nothing", "reason": format!("{unseen} new examples; a round needs {}", l.config.round.min_new.max(2))}),
            Err(e) => {
                eprintln!("hexlora serve: {name}: learning failed: {e}");
                failed.insert(name.clone(), user.unseen().map_or(0, |s| s.len()));
                json!({"outcome": "failed", "reason": e.to_string()})
            }
        };
        l.set_status(|s| {
            *s.rounds.entry(name.clone()).or_default() += 1;
            s.last.insert(name.clone(), last);
            s.state = "idle".into();
            s.step = None;
        });
    }
    l.set_status(|s| s.state = "stopped".into());
}

/// Loads the user's live version and puts it in the registry.
pub fn go_live(name: &str, user: &User, assistant: &Assistant, registry: &Registry) -> Result<()> {
    let path = user.versions.live_adapter()?;
    registry.replace(name, adapters::load(assistant, &path, 1.0)?);
    Ok(())
}

/// The learner's step hook: pauses while the server answers, ends the
/// round (resumable) when the server stops.
struct Yield<'a> {
    l: &'a Learning,
    activity: &'a Activity,
    name: &'a str,
    /// A step has run in this round (so arrivals happened during one).
    stepped: bool,
}

/// How long the learner stays paused after the last answer: the next
/// message of a conversation usually follows within it, and should not
/// find a step in its way.
pub const GRACE: Duration = Duration::from_secs(2);

impl StepHooks<TrainState> for Yield<'_> {
    fn before_step(&mut self, next: u64) -> bool {
        let stop = || self.l.stopping();
        let arrival = self.activity.take_arrival();
        // Before the round's first step, an arrival is from before the round.
        if let Some(shared) = arrival.filter(|_| std::mem::replace(&mut self.stepped, true)) {
            // A request came during the step that just ended.
            let ms = shared.as_secs_f64() * 1e3;
            self.l.set_status(|s| {
                s.yields += 1;
                s.yield_ms_last = ms;
                s.yield_ms_max = s.yield_ms_max.max(ms);
            });
        }
        if self.activity.idle_for().is_none_or(|d| d < GRACE) {
            self.l.set_status(|s| s.state = format!("paused {} (answering)", self.name));
            self.activity.wait_idle(GRACE, &stop);
            // Requests answered during the pause never met a step.
            self.activity.take_arrival();
            self.l.set_status(|s| s.state = format!("learning {}", self.name));
        }
        self.l.set_status(|s| s.step = Some(next - 1));
        !stop()
    }
}
