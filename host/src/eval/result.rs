//! The result file of one (method, benchmark split, decoding) run, and the
//! comparison of two runs on the same split. Schema `hexlora-eval-result/1`:
//!
//! ```text
//! { schema, method, task, split, model?, decoding: {temperature, samples, max_new_tokens, seed},
//!   config: {..method settings..}, seconds,
//!   summary: { primary_metric, queries, users, depth, accuracy?, macro_f1?, rouge1?, rouge2?, rougeL? },
//!   users: [ { user, prep: {seconds, tokens, loss_curve}, mean,
//!              queries: [ { id, gold, predictions: [..], score, rouge? } ] } ] }
//! ```
//! `score` is the query's primary metric averaged over its samples
//! (accuracy for classification, ROUGE-1 F for generation); `mean` is the
//! user's mean score; `depth` the mean of user means.
use super::method::{Decoding, UserPrep};
use super::metrics::{breadth, mcnemar, paired_bootstrap, Bootstrap, Breadth, McNemar};
use super::rouge::RougeScores;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The schema tag written to every result file.
pub const SCHEMA: &str = "hexlora-eval-result/1";

/// One run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunResult {
    /// Always [`SCHEMA`].
    pub schema: String,
    /// Method name.
    pub method: String,
    /// Task name (`quotes-tag`, `LaMP_2`, ...).
    pub task: String,
    /// Split evaluated (`dev`, `test`).
    pub split: String,
    /// Model file or name, for model-backed methods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Decoding settings.
    pub decoding: Decoding,
    /// Method settings (rank, steps, learning rate, k, ...).
    #[serde(default)]
    pub config: serde_json::Value,
    /// Wall-clock seconds of the whole run.
    pub seconds: f64,
    /// Aggregates.
    pub summary: Summary,
    /// Per-user detail.
    pub users: Vec<UserResult>,
}

/// Aggregate scores of a run.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// `accuracy` or `rouge1`: what `score`, `mean` and `depth` measure.
    pub primary_metric: String,
    /// Queries answered.
    pub queries: usize,
    /// Users evaluated.
    pub users: usize,
    /// Mean over users of the user's mean primary score.
    pub depth: f64,
    /// Query-averaged accuracy (classification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accuracy: Option<f64>,
    /// Macro-F1 over the label set, all samples pooled (classification).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub macro_f1: Option<f64>,
    /// Query-averaged ROUGE-1 F (generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge1: Option<f64>,
    /// Query-averaged ROUGE-2 F (generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge2: Option<f64>,
    /// Query-averaged ROUGE-L F (generation).
    #[serde(default, rename = "rougeL", skip_serializing_if = "Option::is_none")]
    pub rouge_l: Option<f64>,
    /// User-averaged ROUGE-L F (generation depth on ROUGE-L).
    #[serde(default, rename = "depth_rougeL", skip_serializing_if = "Option::is_none")]
    pub depth_rouge_l: Option<f64>,
}

/// One user's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserResult {
    /// User id.
    pub user: String,
    /// Preparation cost and loss curve.
    pub prep: UserPrep,
    /// Mean primary score over the user's queries.
    pub mean: f64,
    /// Per-query detail.
    pub queries: Vec<QueryResult>,
}

/// One query's results.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QueryResult {
    /// Question id.
    pub id: String,
    /// Gold answer.
    pub gold: String,
    /// Every sampled answer (after label normalization for classification).
    pub predictions: Vec<String>,
    /// Primary score averaged over the samples.
    pub score: f64,
    /// ROUGE F-measures averaged over the samples (generation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rouge: Option<RougeScores>,
}

impl RunResult {
    /// Reads and checks a result file.
    pub fn read(path: &Path) -> Result<Self> {
        let what = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let r: RunResult = serde_json::from_str(&text).map_err(|e| Error::format(&what, format!("not a result file: {e}")))?;
        if r.schema != SCHEMA {
            return Err(Error::format(what, format!("schema {:?}, expected {SCHEMA:?}", r.schema)));
        }
        Ok(r)
    }

    /// Writes the result as pretty JSON.
    pub fn write(&self, path: &Path) -> Result<()> {
        super::lamp::write_json(path, self)
    }

    /// Per-user means in user order.
    pub fn user_means(&self) -> Vec<f64> {
        self.users.iter().map(|u| u.mean).collect()
    }

    /// Per-query primary scores in run order.
    pub fn query_scores(&self) -> Vec<f64> {
        self.users.iter().flat_map(|u| u.queries.iter().map(|q| q.score)).collect()
    }
}

/// A method compared with a baseline on the same split.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Comparison {
    /// The method.
    pub method: String,
    /// The baseline.
    pub baseline: String,
    /// Users improved / tied / worse, by user mean.
    pub breadth: Breadth,
    /// McNemar on per-query correctness (classification with one sample).
    pub mcnemar: Option<McNemar>,
    /// Paired bootstrap of per-query primary scores.
    pub bootstrap_queries: Bootstrap,
    /// Paired bootstrap of per-user means (resampling users).
    pub bootstrap_users: Bootstrap,
}

/// Resamples used by [`compare`].
pub const BOOTSTRAP_RESAMPLES: usize = 10_000;

/// Compares `method` with `baseline`; both must cover the same users and
/// queries in the same order (same split file).
pub fn compare(method: &RunResult, baseline: &RunResult, seed: u64) -> Result<Comparison> {
    let ids = |r: &RunResult| -> Vec<(String, Vec<String>)> {
        r.users.iter().map(|u| (u.user.clone(), u.queries.iter().map(|q| q.id.clone()).collect())).collect()
    };
    if method.task != baseline.task || method.split != baseline.split || ids(method) != ids(baseline) {
        return Err(Error::invalid(
            format!("{} vs {}", method.method, baseline.method),
            "results are not on the same task, split, users and queries",
        ));
    }
    let single = method.decoding.samples == 1 && baseline.decoding.samples == 1;
    let mcnemar = (method.summary.primary_metric == "accuracy" && single).then(|| {
        let correct = |r: &RunResult| r.query_scores().iter().map(|&s| s >= 1.0).collect::<Vec<_>>();
        mcnemar(&correct(method), &correct(baseline))
    });
    Ok(Comparison {
        method: method.method.clone(),
        baseline: baseline.method.clone(),
        breadth: breadth(&method.user_means(), &baseline.user_means(), 1e-9),
        mcnemar,
        bootstrap_queries: paired_bootstrap(&method.query_scores(), &baseline.query_scores(), BOOTSTRAP_RESAMPLES, seed),
        bootstrap_users: paired_bootstrap(&method.user_means(), &baseline.user_means(), BOOTSTRAP_RESAMPLES, seed),
    })
}
