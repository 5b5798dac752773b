//! LongLaMP rows: `{<user field>, input, output, profile}`, as a JSON list or
//! as JSON lines (what exporting the published dataset gives).
//!
//! The user field differs per task: `reviewerId` (product_review), `author`
//! (topic_writing), `name` (abstract_generation). Rows of one user share a
//! profile and become one [`User`](super::dataset::User) with several queries.
use super::dataset::{group_users, json_text, profile_items, Query, Split};
use super::task::TaskSpec;
use crate::{Error, Result};
use std::path::Path;

/// The three LongLaMP tasks this crate reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LongLampTask {
    /// LongLaMP-3: Amazon product review writing.
    ProductReview,
    /// LongLaMP-4: Reddit topic writing.
    TopicWriting,
    /// LongLaMP-2: paper abstract generation.
    AbstractGeneration,
}

impl LongLampTask {
    /// Parses `product_review`, `topic_writing` or `abstract_generation`
    /// (a `_user` / `_temporal` suffix, as in the dataset's config names, is accepted).
    pub fn parse(name: &str) -> Result<Self> {
        let base = name.trim_end_matches("_user").trim_end_matches("_temporal");
        match base {
            "product_review" => Ok(Self::ProductReview),
            "topic_writing" => Ok(Self::TopicWriting),
            "abstract_generation" => Ok(Self::AbstractGeneration),
            _ => Err(Error::invalid("LongLaMP task", format!("{name:?} is not product_review, topic_writing or abstract_generation"))),
        }
    }

    /// The row field holding the user id.
    pub fn user_field(self) -> &'static str {
        match self {
            Self::ProductReview => "reviewerId",
            Self::TopicWriting => "author",
            Self::AbstractGeneration => "name",
        }
    }

    /// The task name used in result files.
    pub fn task_name(self) -> &'static str {
        match self {
            Self::ProductReview => "LongLaMP_product_review",
            Self::TopicWriting => "LongLaMP_topic_writing",
            Self::AbstractGeneration => "LongLaMP_abstract_generation",
        }
    }
}

fn rows_of(text: &str, what: &str) -> Result<Vec<serde_json::Value>> {
    let trimmed = text.trim_start();
    if trimmed.starts_with('[') {
        let v: serde_json::Value = serde_json::from_str(text).map_err(|e| Error::format(what, format!("not valid JSON: {e}")))?;
        return Ok(v.as_array().cloned().unwrap_or_default());
    }
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| Error::format(format!("{what} line {}", i + 1), format!("not valid JSON: {e}"))))
        .collect()
}

/// Reads a LongLaMP file of `task`. Query ids are `<user>-<row index>`.
pub fn read_longlamp(path: &Path, task: LongLampTask) -> Result<Split> {
    let what = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let spec = TaskSpec::for_task(task.task_name(), None)?;
    let mut rows = Vec::new();
    for (i, row) in rows_of(&text, &what)?.iter().enumerate() {
        let at = format!("{what} row {i}");
        let obj = row.as_object().ok_or_else(|| Error::format(&at, "row is not an object"))?;
        let field = |k: &str| -> Result<&serde_json::Value> {
            obj.get(k).ok_or_else(|| Error::format(&at, format!("missing field `{k}` (is this a LongLaMP {} file?)", task.task_name())))
        };
        let user = json_text(field(task.user_field())?, &format!("{at}.{}", task.user_field()))?;
        let input = json_text(field("input")?, &format!("{at}.input"))?;
        let output = json_text(field("output")?, &format!("{at}.output"))?;
        let profile = profile_items(field("profile")?, &at)?;
        let missing = profile.iter().position(|p| !p.fields.contains_key(spec.profile_output));
        if let Some(j) = missing {
            return Err(Error::format(&at, format!("profile[{j}] has no `{}` field", spec.profile_output)));
        }
        let id = format!("{user}-{i}");
        rows.push((user, profile, Query { id, input, gold: Some(output) }));
    }
    if rows.is_empty() {
        return Err(Error::format(what, "no rows"));
    }
    Ok(Split { spec, users: group_users(rows, &what)? })
}
