//! Model-free baselines: the floor every model-backed method must clear,
//! and real methods for exercising the harness without a model.
//!
//! - `majority-global`: the most frequent answer over the train split's
//!   profiles (classification);
//! - `majority-user`: the most frequent answer in the user's own profile
//!   (classification; a one-line personalization baseline);
//! - `nearest-profile`: the answer of the profile item whose input shares
//!   the most ROUGE-1 with the query (any task; retrieval, no generation).
use super::dataset::{Query, Split, User};
use super::method::{Decoding, Method, UserPrep};
use super::rouge::Rouge;
use super::task::TaskSpec;
use crate::{Error, Result};
use std::collections::BTreeMap;

/// The model-free baselines by name.
pub fn by_name(name: &str) -> Option<Box<dyn Method>> {
    match name {
        "majority-global" => Some(Box::new(Majority { per_user: false, global: None, user: None })),
        "majority-user" => Some(Box::new(Majority { per_user: true, global: None, user: None })),
        "nearest-profile" => Some(Box::new(NearestProfile { rouge: Rouge::new() })),
        _ => None,
    }
}

/// Names accepted by [`by_name`].
pub const NAMES: [&str; 3] = ["majority-global", "majority-user", "nearest-profile"];

/// Most frequent answer; ties go to the alphabetically first, so the
/// result does not depend on item order.
fn most_frequent<'a>(answers: impl Iterator<Item = &'a str>) -> Option<String> {
    let mut counts: BTreeMap<&str, usize> = BTreeMap::new();
    for a in answers {
        *counts.entry(a).or_default() += 1;
    }
    let best = counts.values().copied().max()?;
    counts.into_iter().find(|(_, c)| *c == best).map(|(a, _)| a.to_string())
}

struct Majority {
    per_user: bool,
    global: Option<String>,
    user: Option<String>,
}

impl Method for Majority {
    fn name(&self) -> String {
        if self.per_user { "majority-user" } else { "majority-global" }.to_string()
    }

    fn prepare_population(&mut self, train: &Split) -> Result<()> {
        let answers = train.users.iter().flat_map(|u| &u.profile).map(|p| p.pair(&train.spec).1);
        let answers: Vec<String> = answers.collect();
        self.global = most_frequent(answers.iter().map(String::as_str));
        Ok(())
    }

    fn prepare_user(&mut self, spec: &TaskSpec, user: &User) -> Result<UserPrep> {
        let answers: Vec<String> = user.profile.iter().map(|p| p.pair(spec).1).collect();
        self.user = most_frequent(answers.iter().map(String::as_str));
        Ok(UserPrep::default())
    }

    fn predict(&mut self, _spec: &TaskSpec, _user: &User, _query: &Query, decoding: &Decoding) -> Result<Vec<String>> {
        let answer = if self.per_user { self.user.clone().or_else(|| self.global.clone()) } else { self.global.clone() };
        let answer = answer.ok_or_else(|| {
            Error::invalid(self.name(), "no answer: majority-global needs the train split (--train)")
        })?;
        Ok(vec![answer; decoding.samples])
    }
}

struct NearestProfile {
    rouge: Rouge,
}

impl Method for NearestProfile {
    fn name(&self) -> String {
        "nearest-profile".to_string()
    }

    fn predict(&mut self, spec: &TaskSpec, user: &User, query: &Query, decoding: &Decoding) -> Result<Vec<String>> {
        let mut best: Option<(f64, String)> = None;
        for item in &user.profile {
            let (input, output) = item.pair(spec);
            let s = self.rouge.score(&input, &query.input).rouge1;
            if best.as_ref().is_none_or(|(b, _)| s > *b) {
                best = Some((s, output));
            }
        }
        let answer = best.map(|(_, a)| a).unwrap_or_default();
        Ok(vec![answer; decoding.samples])
    }
}
