//! The one generation worker: it owns the resident model and answers jobs
//! in arrival order, one at a time (two cores, one model: running two
//! answers at once would only interleave them). Jobs wait in a bounded
//! queue; a full queue refuses at once (the server answers 429).
use crate::lora::slots::PreparedAdapter;
use crate::model::assistant::{Answer, Assistant, Request};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender, TrySendError};
use std::sync::Arc;
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
        self.jobs.try_send(job).map_err(|e| match e {
            TrySendError::Full(_) => Refused::Busy,
            TrySendError::Disconnected(_) => Refused::Closed,
        })
    }
}

/// Starts the worker with room for `capacity` waiting jobs. It ends when
/// every [`Queue`] clone is dropped and the queued jobs are answered.
pub fn start(assistant: Arc<Assistant>, capacity: usize) -> (Queue, JoinHandle<()>) {
    let (jobs, rx) = sync_channel(capacity);
    let handle = std::thread::Builder::new()
        .name("hexlora-generate".into())
        .spawn(move || run(&assistant, rx))
        .expect("spawning the generation thread");
    (Queue { jobs }, handle)
}

fn run(assistant: &Assistant, rx: Receiver<Job>) {
    // On a rayon worker, so parallel sections do not inject from outside
    // the pool (see `cli::on_rayon_worker`).
    rayon::scope(|_| {
        for job in rx {
            let events = &job.events;
            let answer = assistant
                .complete(&job.request, job.adapter.as_deref(), |piece| events.send(Event::Piece(piece.to_string())).is_ok())
                .map_err(|e| e.to_string());
            let _ = events.send(Event::Done(answer));
        }
    });
}
