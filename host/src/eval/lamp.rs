//! LaMP files: `*_questions.json` (`[{id, input, profile}]`) and
//! `*_outputs.json` (`{task, golds: [{id, output}]}`).
//!
//! In LaMP every question is its own user. The bundled benchmarks reuse the
//! format with one extra optional question field, `user_id`, so one user can
//! have several questions sharing a profile; LaMP readers ignore it. A
//! classification benchmark other than LaMP's own keeps its label set in
//! `labels.json` next to the split files.
use super::dataset::{group_users, profile_items, Query, Split};
use super::task::TaskSpec;
use crate::{Error, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// One gold answer of `*_outputs.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Gold {
    /// The question id.
    pub id: String,
    /// The reference answer.
    pub output: String,
}

/// The contents of `*_outputs.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outputs {
    /// Task name (`LaMP_2`, `quotes-tag`, ...).
    pub task: String,
    /// One gold answer per question.
    pub golds: Vec<Gold>,
}

fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    serde_json::from_str(&text).map_err(|e| Error::format(path.display().to_string(), format!("not valid JSON: {e}")))
}

/// Reads an outputs file.
pub fn read_outputs(path: &Path) -> Result<Outputs> {
    let what = path.display().to_string();
    let v = read_json(path)?;
    serde_json::from_value(v)
        .map_err(|e| Error::format(what, format!("expected {{\"task\", \"golds\": [{{\"id\", \"output\"}}]}}: {e}")))
}

fn string_field(obj: &serde_json::Map<String, serde_json::Value>, key: &str, what: &str) -> Result<String> {
    let v = obj.get(key).ok_or_else(|| Error::format(what, format!("missing field `{key}`")))?;
    super::dataset::json_text(v, &format!("{what}.{key}"))
}

/// Reads a questions file and, when given, its outputs (golds matched by id;
/// every question must have exactly one gold). `task` is required when there
/// is no outputs file (a hidden test split); `labels` is the label set for a
/// bundled classification task.
pub fn read_lamp(
    questions: &Path,
    outputs: Option<&Path>,
    task: Option<&str>,
    labels: Option<Vec<String>>,
) -> Result<Split> {
    let what = questions.display().to_string();
    let golds = outputs.map(read_outputs).transpose()?;
    let task_name = match (&golds, task) {
        (Some(o), Some(t)) if o.task != t => {
            return Err(Error::format(&what, format!("outputs are for task {:?}, expected {t:?}", o.task)))
        }
        (Some(o), _) => o.task.clone(),
        (None, Some(t)) => t.to_string(),
        (None, None) => return Err(Error::invalid(&what, "no outputs file, so the task name must be given")),
    };
    let spec = TaskSpec::for_task(&task_name, labels).map_err(|e| Error::format(&what, e.to_string()))?;
    let mut gold_by_id: Option<BTreeMap<String, String>> = match &golds {
        Some(o) => {
            let mut m = BTreeMap::new();
            for g in &o.golds {
                if m.insert(g.id.clone(), g.output.clone()).is_some() {
                    return Err(Error::format(outputs.unwrap().display().to_string(), format!("duplicate gold id {:?}", g.id)));
                }
            }
            Some(m)
        }
        None => None,
    };
    let v = read_json(questions)?;
    let list = v.as_array().ok_or_else(|| Error::format(&what, "expected a list of questions"))?;
    let mut rows = Vec::with_capacity(list.len());
    let mut ids = std::collections::BTreeSet::new();
    for (i, q) in list.iter().enumerate() {
        let at = format!("{what} [{i}]");
        let obj = q.as_object().ok_or_else(|| Error::format(&at, "question is not an object"))?;
        let id = string_field(obj, "id", &at)?;
        if !ids.insert(id.clone()) {
            return Err(Error::format(&at, format!("duplicate question id {id:?}")));
        }
        let input = string_field(obj, "input", &at)?;
        let profile = profile_items(obj.get("profile").ok_or_else(|| Error::format(&at, "missing field `profile`"))?, &at)?;
        let user = match obj.get("user_id") {
            Some(u) => super::dataset::json_text(u, &format!("{at}.user_id"))?,
            None => id.clone(),
        };
        let gold = match gold_by_id.as_mut() {
            Some(m) => Some(m.remove(&id).ok_or_else(|| Error::format(&at, format!("question {id:?} has no gold output")))?),
            None => None,
        };
        rows.push((user, profile, Query { id, input, gold }));
    }
    if let Some(m) = gold_by_id {
        if let Some(extra) = m.keys().next() {
            return Err(Error::format(what, format!("gold {extra:?} matches no question ({} unmatched)", m.len())));
        }
    }
    check_labels(&spec, &rows, &what)?;
    Ok(Split { spec: spec.clone(), users: group_users(rows, &what)? })
}

fn check_labels(spec: &TaskSpec, rows: &[(String, Vec<super::dataset::ProfileItem>, Query)], what: &str) -> Result<()> {
    let Some(labels) = spec.labels() else { return Ok(()) };
    for (_, profile, q) in rows {
        if let Some(g) = &q.gold {
            if !labels.contains(g) {
                return Err(Error::format(what, format!("gold {g:?} of question {:?} is not one of the task's labels", q.id)));
            }
        }
        for item in profile {
            let label = item.fields.get(spec.profile_output).map(String::as_str).unwrap_or("");
            if !labels.iter().any(|l| l == label) {
                return Err(Error::format(what, format!("profile item {:?} has label {label:?}, not one of the task's labels", item.id)));
            }
        }
    }
    Ok(())
}

/// The split names a benchmark directory may hold.
pub const SPLITS: [&str; 3] = ["train", "dev", "test"];

/// Reads `{dir}/{split}_questions.json` with `{split}_outputs.json` (if
/// present) and `labels.json` (if present).
pub fn read_lamp_dir(dir: &Path, split: &str, task: Option<&str>) -> Result<Split> {
    let q = dir.join(format!("{split}_questions.json"));
    let o = dir.join(format!("{split}_outputs.json"));
    let labels_path = dir.join("labels.json");
    let labels = if labels_path.exists() {
        let v = read_json(&labels_path)?;
        Some(serde_json::from_value(v).map_err(|e| Error::format(labels_path.display().to_string(), format!("expected a list of strings: {e}")))?)
    } else {
        None
    };
    read_lamp(&q, o.exists().then_some(o.as_path()), task, labels)
}

/// One question as written by the benchmark builder.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionRow {
    /// Question id.
    pub id: String,
    /// The prompt.
    pub input: String,
    /// The user's profile items (objects with `id` and the task's fields).
    pub profile: Vec<BTreeMap<String, String>>,
    /// The user the question belongs to.
    pub user_id: String,
}

/// Writes `{dir}/{split}_questions.json` and `{split}_outputs.json`.
pub fn write_lamp_split(dir: &Path, split: &str, task: &str, rows: &[(QuestionRow, String)]) -> Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    let questions: Vec<&QuestionRow> = rows.iter().map(|(q, _)| q).collect();
    let outputs = Outputs {
        task: task.to_string(),
        golds: rows.iter().map(|(q, g)| Gold { id: q.id.clone(), output: g.clone() }).collect(),
    };
    let qp = dir.join(format!("{split}_questions.json"));
    let op = dir.join(format!("{split}_outputs.json"));
    write_json(&qp, &questions)?;
    write_json(&op, &outputs)?;
    Ok(vec![qp, op])
}

/// Writes `value` as pretty JSON (stable bytes for determinism checks).
pub fn write_json(path: &Path, value: &impl Serialize) -> Result<()> {
    let text = serde_json::to_string_pretty(value).map_err(|e| Error::format(path.display().to_string(), e.to_string()))?;
    std::fs::write(path, text + "\n").map_err(|e| Error::io(path, e))
}
