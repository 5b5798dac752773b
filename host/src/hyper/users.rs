//! Users' example pairs and how they become token ids: the context (the
//! hypernetwork's input: pairs rendered with the template, concatenated,
//! cut at the token budget) and the target examples (chat-rendered
//! prompt + completion, loss on the completion).
//!
//! Where users come from: a benchmark split in LaMP format (`hexlora
//! hypertrain --bench DIR --split train`), read by the evaluation's loader
//! and turned into pairs exactly as the evaluation's methods see them
//! ([`split_users`]); or JSONL, one user per line,
//! `{"user": "...", "examples": [{"query": "...", "response": "..."}, ...]}`
//! (`--data`). `--context` for `hexlora synth` is JSONL of `{"query", "response"}`.
use super::config::{HyperConfig, Pool};
use super::end_to_end::{Example, UserBatch};
use crate::base::counter_rng;
use crate::eval::dataset::{Split, User};
use crate::eval::model_methods::item_prompt;
use crate::eval::task::TaskSpec;
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
    check_population(&users, &path.display().to_string())?;
    Ok(users)
}

fn check_population(users: &[UserRecord], what: &str) -> Result<()> {
    if users.len() < 2 {
        return Err(Error::invalid(what, "needs at least two users with two examples each (in-batch negatives)"));
    }
    Ok(())
}

/// `text` cut to at most `max` characters, as the evaluation cuts prompts.
fn cut(text: &str, max: usize) -> String {
    text.chars().take(max).collect()
}

/// A user's profile items as pairs: the item's input wrapped in the task's
/// question prompt (the text the user's queries carry) and cut at
/// `max_prompt_chars`, its output as the response. This is what per-user
/// LoRA trains on and what the hypernetwork reads as context.
pub fn profile_pairs(spec: &TaskSpec, user: &User, max_prompt_chars: usize) -> Vec<Pair> {
    user.profile
        .iter()
        .map(|p| {
            let (input, output) = p.pair(spec);
            Pair { query: cut(&item_prompt(spec, &input), max_prompt_chars), response: output }
        })
        .collect()
}

/// The users of a benchmark split as training data: each user's profile
/// pairs plus their answered questions (the examples the common LoRA trains
/// on). Users with fewer than two examples cannot give both a context and a
/// scored example; they are left out and returned by id.
pub fn split_users(split: &Split, max_prompt_chars: usize, what: &str) -> Result<(Vec<UserRecord>, Vec<String>)> {
    let (mut users, mut skipped) = (Vec::new(), Vec::new());
    for user in &split.users {
        let mut examples = profile_pairs(&split.spec, user, max_prompt_chars);
        for q in &user.queries {
            if let Some(gold) = &q.gold {
                examples.push(Pair { query: cut(&q.input, max_prompt_chars), response: gold.clone() });
            }
        }
        match examples.len() >= 2 {
            true => users.push(UserRecord { user: user.id.clone(), examples }),
            false => skipped.push(user.id.clone()),
        }
    }
    check_population(&users, what)?;
    Ok((users, skipped))
}

/// Reads a context JSONL file of `{"query", "response"}` lines.
pub fn load_pairs(path: &Path) -> Result<Vec<Pair>> {
    let pairs: Vec<Pair> = read_lines(path, r#"{"query": ..., "response": ...}"#)?;
    if pairs.is_empty() {
        return Err(Error::invalid(path.display().to_string(), "holds no example"));
    }
    // The rule training data follows: an empty answer teaches nothing.
    if let Some(i) = pairs.iter().position(|p| p.response.trim().is_empty()) {
        return Err(Error::invalid(path.display().to_string(), format!("example {}: response is empty: nothing to learn from (drop it)", i + 1)));
    }
    Ok(pairs)
}

/// The hypernetwork's input: the rendered context's token ids and, when
/// only responses are pooled ([`Pool::Responses`]), which of them to pool.
#[derive(Clone, Debug, PartialEq)]
pub struct Context {
    /// Token ids, at most the budget.
    pub ids: Vec<u32>,
    /// `pooled[t]`: token `t` enters the embedding's mean; `None` = all do.
    pub pooled: Option<Vec<bool>>,
}

impl Context {
    /// A context of `ids` whose every token is pooled.
    pub fn all(ids: Vec<u32>) -> Context {
        Context { ids, pooled: None }
    }

    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.ids.len()
    }

    /// No token at all.
    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }
}

/// The context of the hypernetwork `cfg` for `pairs`: each pair rendered
/// with its template (queries cut to `context_query_chars`), concatenated,
/// cut at `context_tokens`. With [`Pool::Responses`] the text before, of
/// and after each response is encoded apart, so the pooled tokens are
/// exactly the response's.
pub fn render_context(enc: &dyn Encoder, cfg: &HyperConfig, pairs: &[&Pair]) -> Result<Context> {
    Ok(render_context_fitted(enc, cfg, pairs)?.0)
}

/// [`render_context`] and how many of `pairs` the context holds (what
/// `hexlora synth` reports).
pub fn render_context_fitted(enc: &dyn Encoder, cfg: &HyperConfig, pairs: &[&Pair]) -> Result<(Context, Fitted)> {
    let budget = cfg.context_tokens;
    let query = |q: &str| match cfg.context_query_chars {
        Some(n) => tail(q, n),
        None => q.to_string(),
    };
    let cut: Vec<Pair> = pairs.iter().map(|p| Pair { query: query(&p.query), response: p.response.clone() }).collect();
    let refs: Vec<&Pair> = cut.iter().collect();
    match cfg.pool {
        Pool::Mean => {
            let (ids, fitted) = prefix_fitted(enc, &cfg.template, &refs, budget)?;
            Ok((Context::all(ids), fitted))
        }
        Pool::Responses => render_marked(enc, &cfg.template, &refs, budget),
    }
}

/// How many of the pairs a context built from them holds: `whole` of them
/// entirely, and when `cut` one more whose rendering the budget cut; the
/// rest did not fit at all.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fitted {
    /// Pairs inside the budget entirely.
    pub whole: usize,
    /// Whether the pair after them was cut at the budget.
    pub cut: bool,
}

/// `template` split around `{response}` and each piece encoded apart.
fn render_marked(enc: &dyn Encoder, template: &str, pairs: &[&Pair], budget: usize) -> Result<(Context, Fitted)> {
    let (before, after) = template.split_once("{response}").ok_or_else(|| Error::invalid("template", "must contain {response}"))?;
    let (mut ids, mut pooled, mut whole) = (Vec::new(), Vec::new(), 0);
    for p in pairs {
        if ids.len() >= budget {
            break;
        }
        for (text, mark) in [(before.replace("{query}", &p.query), false), (p.response.clone(), true), (after.replace("{query}", &p.query), false)] {
            let t = enc.encode(&text)?;
            pooled.extend(std::iter::repeat_n(mark, t.len()));
            ids.extend(t);
        }
        whole += usize::from(ids.len() <= budget);
    }
    let cut = ids.len() > budget;
    ids.truncate(budget);
    pooled.truncate(budget);
    Ok((Context { ids, pooled: Some(pooled) }, Fitted { whole, cut }))
}

/// Token ids of `pairs` rendered with `template`, concatenated, cut at
/// `budget` tokens (the hypernetwork's all-token context and the ICL
/// teacher's prefix).
pub fn render_prefix(enc: &dyn Encoder, template: &str, pairs: &[&Pair], budget: usize) -> Result<Vec<u32>> {
    Ok(prefix_fitted(enc, template, pairs, budget)?.0)
}

/// [`render_prefix`] and how many of `pairs` it holds.
fn prefix_fitted(enc: &dyn Encoder, template: &str, pairs: &[&Pair], budget: usize) -> Result<(Vec<u32>, Fitted)> {
    let (mut ids, mut whole) = (Vec::new(), 0);
    for p in pairs {
        if ids.len() >= budget {
            break;
        }
        ids.extend(enc.encode(&template.replace("{query}", &p.query).replace("{response}", &p.response))?);
        whole += usize::from(ids.len() <= budget);
    }
    let cut = ids.len() > budget;
    ids.truncate(budget);
    Ok((ids, Fitted { whole, cut }))
}

/// The last `max` characters of `text`.
fn tail(text: &str, max: usize) -> String {
    let n = text.chars().count();
    text.chars().skip(n.saturating_sub(max)).collect()
}

/// A target example: the chat-rendered query as prompt, the response (plus
/// end of turn) as completion, as the evaluation's trainers build it
/// ([`crate::eval::model_runtime::EvalModel::example`]): the prompt is cut
/// from the left so the sequence keeps the whole response within `max_len`
/// tokens (the personal text sits at the end of the bundled prompts).
pub fn render_example(enc: &dyn Encoder, pair: &Pair, max_len: usize) -> Result<Example> {
    let mut prompt = enc.encode(&enc.render_chat(&[Message::new("user", &pair.query)], true)?)?;
    let completion = enc.encode(&format!("{}{}", pair.response, enc.end_of_turn()))?;
    let keep = max_len.saturating_sub(completion.len()).max(1);
    if prompt.len() > keep {
        prompt.drain(..prompt.len() - keep);
    }
    let labels: Vec<i64> = prompt.iter().map(|_| -100).chain(completion.iter().map(|&t| t as i64)).collect();
    Ok(Example { ids: [prompt, completion].concat(), labels })
}

/// A seeded permutation of `0..n`.
pub fn permutation(seed: u64, n: usize) -> Vec<usize> {
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&j| (counter_rng::bits(seed, j as u64), j));
    order
}

/// Splits a user's examples into two disjoint sets with `seed`: up to
/// `targets` (at least one) scored examples, taken in seeded order among
/// those with a response token to score, and the rest as context; the teacher's prefix is the context in a fresh order.
pub fn sample_user(enc: &dyn Encoder, cfg: &HyperConfig, user: &UserRecord, seed: u64, targets: usize, max_len: usize) -> Result<UserBatch> {
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
        return Err(Error::invalid(format!("user {}", user.user), "no example has a response token to score"));
    }
    let teacher: Vec<&Pair> = permutation(counter_rng::derive(seed, 1), ctx.len()).iter().map(|&i| ctx[i]).collect();
    Ok(UserBatch {
        context: render_context(enc, cfg, &ctx)?,
        examples,
        teacher_prefix: render_prefix(enc, &cfg.template, &teacher, cfg.context_tokens)?,
    })
}
