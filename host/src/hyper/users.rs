//! Users' example pairs and how they become token ids: the context (the
//! hypernetwork's input: pairs rendered with the template, concatenated,
//! cut at the token budget) and the target examples (chat-rendered
//! prompt + completion, loss on the completion).
//!
//! Files: `--data` for `hexlora hypertrain` is JSONL, one user per line,
//! `{"user": "...", "examples": [{"query": "...", "response": "..."}, ...]}`;
//! `--context` for `hexlora synth` is JSONL of `{"query", "response"}`.
use super::end_to_end::{Example, UserBatch};
use crate::autograd::counter_rng;
use crate::train::data::{Encoder, Message};
use crate::{Error, Result};
use serde::Deserialize;
use std::path::Path;

/// One (query, desired response) example.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct Pair {
    /// The input.
    pub query: String,
    /// What this user wants back.
    pub response: String,
}

/// A user and their examples.
#[derive(Clone, Debug, PartialEq, Deserialize)]
pub struct UserRecord {
    /// User id.
    #[serde(alias = "id")]
    pub user: String,
    /// Their example pairs.
    pub examples: Vec<Pair>,
}

fn read_lines<T: for<'de> Deserialize<'de>>(path: &Path, form: &str) -> Result<Vec<T>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| Error::format(format!("{}:{}", path.display(), i + 1), format!("expected {form}: {e}"))))
        .collect()
}

/// Reads a users JSONL file; every user needs at least two examples (one
/// for the context, one to score the generated LoRA on).
pub fn load_users(path: &Path) -> Result<Vec<UserRecord>> {
    let users: Vec<UserRecord> = read_lines(path, r#"{"user": ..., "examples": [{"query", "response"}]}"#)?;
    if let Some(u) = users.iter().find(|u| u.examples.len() < 2) {
        return Err(Error::invalid(path.display().to_string(), format!("user {} has fewer than two examples", u.user)));
    }
    if users.len() < 2 {
        return Err(Error::invalid(path.display().to_string(), "needs at least two users (in-batch negatives)"));
    }
    Ok(users)
}

/// Reads a context JSONL file of `{"query", "response"}` lines.
pub fn load_pairs(path: &Path) -> Result<Vec<Pair>> {
    let pairs: Vec<Pair> = read_lines(path, r#"{"query": ..., "response": ...}"#)?;
    if pairs.is_empty() {
        return Err(Error::invalid(path.display().to_string(), "holds no example"));
    }
    Ok(pairs)
}

/// The context token ids: each pair rendered with `template`, concatenated,
/// cut at `budget` tokens.
pub fn render_context(enc: &dyn Encoder, template: &str, pairs: &[&Pair], budget: usize) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for p in pairs {
        if ids.len() >= budget {
            break;
        }
        ids.extend(enc.encode(&template.replace("{query}", &p.query).replace("{response}", &p.response))?);
    }
    ids.truncate(budget);
    Ok(ids)
}

/// A target example: the chat-rendered query as prompt, the response (plus
/// end of turn) as completion, cut at `max_len` tokens.
pub fn render_example(enc: &dyn Encoder, pair: &Pair, max_len: usize) -> Result<Example> {
    let prompt = enc.encode(&enc.render_chat(&[Message::new("user", &pair.query)], true)?)?;
    let completion = enc.encode(&format!("{}{}", pair.response, enc.end_of_turn()))?;
    let mut labels: Vec<i64> = prompt.iter().map(|_| -100).chain(completion.iter().map(|&t| t as i64)).collect();
    let mut ids = [prompt, completion].concat();
    ids.truncate(max_len);
    labels.truncate(max_len);
    Ok(Example { ids, labels })
}

/// A seeded permutation of `0..n`.
pub fn permutation(seed: u64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&j| (counter_rng::bits(seed, j as u64), j));
    order
}

/// Splits a user's examples into two disjoint sets with `seed`: up to
/// `targets` (at least one) scored examples, taken in seeded order among
/// those that keep a response token within `max_len`, and the rest as
/// context; the teacher's prefix is the context in a fresh order.
pub fn sample_user(enc: &dyn Encoder, template: &str, budget: usize, user: &UserRecord, seed: u64, targets: usize, max_len: usize) -> Result<UserBatch> {
    let order = permutation(seed, user.examples.len());
    let n_t = targets.clamp(1, user.examples.len() - 1);
    let (mut examples, mut ctx) = (Vec::new(), Vec::new());
    for &i in &order {
        if examples.len() < n_t {
            let ex = render_example(enc, &user.examples[i], max_len)?;
            if ex.labels.iter().skip(1).any(|&l| l >= 0) {
                examples.push(ex);
                continue;
            }
        }
        ctx.push(&user.examples[i]);
    }
    if examples.is_empty() || ctx.is_empty() {
        return Err(Error::invalid(format!("user {}", user.user), format!("no example keeps a response token within {max_len} tokens")));
    }
    let teacher: Vec<&Pair> = permutation(counter_rng::derive(seed, 1), ctx.len()).iter().map(|&i| ctx[i]).collect();
    Ok(UserBatch {
        context: render_context(enc, template, &ctx, budget)?,
        examples,
        teacher_prefix: render_context(enc, template, &teacher, budget)?,
    })
}
