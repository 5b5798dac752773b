//! Runs one [`Method`] over one split under one [`Decoding`] and scores it
//! into a [`RunResult`].
use super::dataset::Split;
use super::method::{Decoding, Method};
use super::progress::Progress;
use super::metrics::{macro_f1, user_average};
use super::result::{QueryResult, RunResult, Summary, UserResult, SCHEMA};
use super::rouge::{Rouge, RougeScores};
use super::task::TaskKind;
use crate::{Error, Result};
use std::time::Instant;

/// Maps a model's answer onto the label set: trimmed, trailing punctuation
/// and surrounding quotes removed, matched case-insensitively; an answer
/// that matches no label is returned trimmed (and scores as wrong).
pub fn normalize_label(answer: &str, labels: &[String]) -> String {
    let t = answer.trim().trim_matches(['"', '\'', '.', ',', ';', ':', '!', ' ']).trim();
    labels.iter().find(|l| l.eq_ignore_ascii_case(t)).cloned().unwrap_or_else(|| t.to_string())
}

/// Evaluates `method` on `split` under one decoding; see [`run_sweep`].
pub fn run(method: &mut dyn Method, train: Option<&Split>, split: &Split, split_name: &str, decoding: &Decoding) -> Result<RunResult> {
    let mut results = run_sweep(method, train, split, split_name, std::slice::from_ref(decoding))?;
    Ok(results.remove(0))
}

/// Evaluates `method` on `split` under every decoding of a sweep:
/// population preparation on `train` (if given) once, each user prepared
/// once, then that user's queries answered under each decoding (so a
/// per-user adapter is trained once for the whole sweep). Preparation time
/// is counted in every result's `seconds`. Queries without a gold answer
/// are an error (scoring needs them).
pub fn run_sweep(method: &mut dyn Method, train: Option<&Split>, split: &Split, split_name: &str, decodings: &[Decoding]) -> Result<Vec<RunResult>> {
    run_sweep_with(method, train, split, split_name, decodings, None)
}

/// What identifies a sweep in its [`Progress`] file: a resume with other
/// settings must not mix their results. Taken before any preparation.
pub fn fingerprint(method: &dyn Method, split: &Split, split_name: &str, decodings: &[Decoding]) -> String {
    let users: Vec<&str> = split.users.iter().map(|u| u.id.as_str()).collect();
    serde_json::json!({ "method": method.name(), "config": method.config(), "task": split.spec.name, "split": split_name, "users": users, "decodings": decodings })
        .to_string()
}

/// [`run_sweep`] recording each finished user in `progress` and taking the
/// users it already holds from there instead of running them again.
pub fn run_sweep_with(
    method: &mut dyn Method,
    train: Option<&Split>,
    split: &Split,
    split_name: &str,
    decodings: &[Decoding],
    mut progress: Option<&mut Progress>,
) -> Result<Vec<RunResult>> {
    let start = Instant::now();
    let pending = split.users.iter().any(|u| !progress.as_ref().is_some_and(|p| p.has(&u.id)));
    if let Some(train) = train.filter(|_| pending) {
        method.prepare_population(train)?;
    }
    let population_seconds = start.elapsed().as_secs_f64();
    let rouge = Rouge::new();
    let mut users: Vec<Vec<UserResult>> = vec![Vec::with_capacity(split.users.len()); decodings.len()];
    let mut seconds = vec![population_seconds; decodings.len()];
    for user in &split.users {
        if let Some((done, secs)) = progress.as_mut().and_then(|p| p.take(&user.id)) {
            for (d, (r, s)) in done.into_iter().zip(secs).enumerate().take(decodings.len()) {
                users[d].push(r);
                seconds[d] += s;
            }
            continue;
        }
        stop_check()?;
        let mut user_seconds = vec![0.0; decodings.len()];
        let t = Instant::now();
        let prep = method.prepare_user(&split.spec, user)?;
        let prep_seconds = t.elapsed().as_secs_f64();
        // Stopped during the user's training: do not spend its questions.
        stop_check()?;
        for (d, decoding) in decodings.iter().enumerate() {
            let t = Instant::now();
            let mut queries = Vec::with_capacity(user.queries.len());
            for query in &user.queries {
                let gold = query.gold.clone().ok_or_else(|| Error::invalid(&query.id, "query has no gold answer to score against"))?;
                let answers = method.predict(&split.spec, user, query, decoding)?;
                if answers.len() != decoding.samples {
                    return Err(Error::invalid(
                        method.name(),
                        format!("returned {} answers for query {}, expected {}", answers.len(), query.id, decoding.samples),
                    ));
                }
                queries.push(score_query(&split.spec.kind, &rouge, &query.id, gold, answers));
            }
            user_seconds[d] = prep_seconds + t.elapsed().as_secs_f64();
            seconds[d] += user_seconds[d];
            let mean = queries.iter().map(|q| q.score).sum::<f64>() / queries.len().max(1) as f64;
            users[d].push(UserResult { user: user.id.clone(), prep: prep.clone(), mean, queries });
        }
        // A signal during this user may have cut its training short (the
        // training loop stops at the next step): its results are not kept.
        stop_check()?;
        if let Some(p) = progress.as_mut() {
            let latest: Vec<UserResult> = users.iter().map(|u| u.last().expect("just pushed").clone()).collect();
            p.record(&user.id, &latest, &user_seconds)?;
        }
    }
    Ok(decodings
        .iter()
        .zip(users)
        .zip(seconds)
        .map(|((decoding, users), seconds)| RunResult {
            schema: SCHEMA.to_string(),
            method: method.name(),
            task: split.spec.name.clone(),
            split: split_name.to_string(),
            model: None,
            decoding: *decoding,
            config: method.config(),
            seconds,
            summary: summarize(&split.spec.kind, &users),
            users,
        })
        .collect())
}

/// Scores every sample of one query and averages over samples.
fn score_query(kind: &TaskKind, rouge: &Rouge, id: &str, gold: String, answers: Vec<String>) -> QueryResult {
    let n = answers.len().max(1) as f64;
    match kind {
        TaskKind::Classification { labels } => {
            let predictions: Vec<String> = answers.iter().map(|a| normalize_label(a, labels)).collect();
            let score = predictions.iter().filter(|p| **p == gold).count() as f64 / n;
            QueryResult { id: id.to_string(), gold, predictions, score, rouge: None }
        }
        TaskKind::Generation => {
            let mut sum = RougeScores::default();
            for a in &answers {
                let s = rouge.score(&gold, a);
                sum.rouge1 += s.rouge1 / n;
                sum.rouge2 += s.rouge2 / n;
                sum.rouge_l += s.rouge_l / n;
            }
            QueryResult { id: id.to_string(), gold, predictions: answers, score: sum.rouge1, rouge: Some(sum) }
        }
    }
}

fn summarize(kind: &TaskKind, users: &[UserResult]) -> Summary {
    let queries: Vec<&QueryResult> = users.iter().flat_map(|u| &u.queries).collect();
    let nq = queries.len().max(1) as f64;
    let per_user = |f: &dyn Fn(&QueryResult) -> f64| -> Vec<Vec<f64>> {
        users.iter().map(|u| u.queries.iter().map(f).collect()).collect()
    };
    let mut s = Summary { queries: queries.len(), users: users.len(), depth: user_average(&per_user(&|q| q.score)), ..Summary::default() };
    match kind {
        TaskKind::Classification { labels } => {
            s.primary_metric = "accuracy".into();
            s.accuracy = Some(queries.iter().map(|q| q.score).sum::<f64>() / nq);
            // Every sample is one prediction of its query's gold.
            let (preds, golds): (Vec<&str>, Vec<&str>) =
                queries.iter().flat_map(|q| q.predictions.iter().map(|p| (p.as_str(), q.gold.as_str()))).unzip();
            s.macro_f1 = Some(macro_f1(&preds, &golds, labels));
        }
        TaskKind::Generation => {
            s.primary_metric = "rouge1".into();
            let mean = |f: &dyn Fn(&RougeScores) -> f64| queries.iter().map(|q| q.rouge.as_ref().map_or(0.0, f)).sum::<f64>() / nq;
            s.rouge1 = Some(mean(&|r| r.rouge1));
            s.rouge2 = Some(mean(&|r| r.rouge2));
            s.rouge_l = Some(mean(&|r| r.rouge_l));
            s.depth_rouge_l = Some(user_average(&per_user(&|q| q.rouge.as_ref().map_or(0.0, |r| r.rouge_l))));
        }
    }
    s
}

/// [`Error::Stopped`] once SIGTERM or SIGINT asked the evaluation to stop:
/// checked between users, so the progress file holds whole users only.
fn stop_check() -> Result<()> {
    match crate::signals::requested() {
        Some(signal) => Err(Error::Stopped(signal)),
        None => Ok(()),
    }
}
