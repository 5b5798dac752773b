//! The one generation worker: it owns the resident model and answers jobs
//! in arrival order, one at a time (two cores, one model: running two
//! answers at once would only interleave them). Jobs wait in a bounded
//! queue; a full queue refuses at once (the server answers 429).
use crate::lora::slots::PreparedAdapter;
use crate::model::assistant::{Answer, Assistant, Request};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use std::thread::JoinHandle;
use tokio::sync::mpsc::UnboundedSender;

/// What a job reports while it runs.
#[derive(Debug)]
pub enum Event {
    /// The next final piece of the answer.
    Piece(String),
    /// The answer, or why there is none.
    Done(Result<Answer, String>),
}

/// One request for the worker.
pub struct Job {
    /// What to generate.
    pub request: Request,
    /// The user's adapter; `None` is the base model.
    pub adapter: Option<Arc<PreparedAdapter>>,
    /// Where pieces and the end go; generation stops when its receiver is gone.
    pub events: UnboundedSender<Event>,
}

/// The worker's queue end.
#[derive(Clone)]
pub struct Queue {
    jobs: SyncSender<Job>,
    activity: Arc<Activity>,
}

/// Why a job was not queued.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// The queue is full.
    Busy,
    /// The worker has stopped.
    Closed,
}

impl Queue {
    /// Queues `job` or refuses it without waiting.
    pub fn submit(&self, job: Job) -> Result<(), Refused> {
        // Counted before it can be answered, so the count never goes below 0.
        self.activity.begin();
        self.jobs.try_send(job).map_err(|e| {
            self.activity.end();
            match e {
                TrySendError::Full(_) => Refused::Busy,
                TrySendError::Disconnected(_) => Refused::Closed,
            }
        })
    }

    /// Requests queued or being answered, and when the last one ended.
    pub fn activity(&self) -> &Arc<Activity> {
        &self.activity
    }
}

/// Whether the server is answering: a learner sharing the machine pauses
/// while it is, and starts only after it has been idle for a while.
pub struct Activity {
    state: Mutex<ActivityState>,
    changed: Condvar,
}

struct ActivityState {
    pending: usize,
    /// When the first request since [`Activity::take_arrival`] came.
    arrival: Option<Instant>,
    /// When `pending` last went to 0 (or the server started).
    idle_since: Instant,
}

impl Default for Activity {
    fn default() -> Self {
        Activity { state: Mutex::new(ActivityState { pending: 0, arrival: None, idle_since: Instant::now() }), changed: Condvar::new() }
    }
}

impl Activity {
    fn lock(&self) -> std::sync::MutexGuard<'_, ActivityState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request was queued.
    pub fn begin(&self) {
        let mut s = self.lock();
        s.arrival.get_or_insert_with(Instant::now);
        s.pending += 1;
    }

    /// A request was answered (or refused after [`Activity::begin`]).
    pub fn end(&self) {
        let mut s = self.lock();
        s.pending = s.pending.saturating_sub(1);
        if s.pending == 0 {
            s.idle_since = Instant::now();
            self.changed.notify_all();
        }
    }

    /// How long no request has been waiting or answered (`None`: one is).
    pub fn idle_for(&self) -> Option<Duration> {
        let s = self.lock();
        (s.pending == 0).then(|| s.idle_since.elapsed())
    }

    /// How long ago the first request since the last call came, if one
    /// did (a learner calling this at each step boundary learns how long a
    /// request shared the machine with its step: its yield time).
    pub fn take_arrival(&self) -> Option<Duration> {
        self.lock().arrival.take().map(|t| t.elapsed())
    }

    /// Blocks while requests are waiting or answered and for `grace`
    /// after the last one (a conversation comes in bursts), or until
    /// `stop()`.
    pub fn wait_idle(&self, grace: Duration, stop: &dyn Fn() -> bool) {
        let mut s = self.lock();
        while (s.pending > 0 || s.idle_since.elapsed() < grace) && !stop() {
            let left = if s.pending > 0 { Duration::from_millis(100) } else { grace.saturating_sub(s.idle_since.elapsed()).min(Duration::from_millis(100)) };
            s = self.changed.wait_timeout(s, left).unwrap_or_else(|p| p.into_inner()).0;
        }
    }
}

/// Starts the worker with room for `capacity` waiting jobs. It ends when
/// every [`Queue`] clone is dropped and the queued jobs are answered.
pub fn start(assistant: Arc<Assistant>, capacity: usize) -> (Queue, JoinHandle<()>) {
    let (jobs, rx) = sync_channel(capacity);
    let activity = Arc::new(Activity::default());
    let seen = activity.clone();
    let handle = std::thread::Builder::new()
        .name("hexlora-generate".into())
        .spawn(move || run(&assistant, rx, &seen))
        .expect("spawning the generation thread");
    (Queue { jobs, activity }, handle)
}

fn run(assistant: &Assistant, rx: Receiver<Job>, activity: &Activity) {
    // Not on a rayon worker while waiting for jobs: a pool thread blocked
    // in `recv` would leave a `--learn` learner one core. Each answer runs
    // on the pool (`Assistant::complete` enters it).
    for job in rx {
        let events = &job.events;
        let answer = assistant
            .complete(&job.request, job.adapter.as_deref(), |piece| events.send(Event::Piece(piece.to_string())).is_ok())
            .map_err(|e| e.to_string());
        let _ = events.send(Event::Done(answer));
        activity.end();
    }
}
