//! One benchmark split in memory, grouped by user: what every method sees.
//!
//! Files differ (LaMP questions/outputs, LongLaMP rows, our bundled
//! benchmarks); after loading they are all a [`Split`]: users, each with a
//! profile (the personal training data) and the queries to answer.
use super::task::TaskSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One item of a user's history, with its original field names.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ProfileItem {
    /// Item id as in the file (may be empty when the format has none).
    pub id: String,
    /// Field name -> text (numbers are kept as their JSON text).
    pub fields: BTreeMap<String, String>,
}

impl ProfileItem {
    /// The item as a (query, desired response) pair under `spec`.
    pub fn pair(&self, spec: &TaskSpec) -> (String, String) {
        let get = |k: &str| self.fields.get(k).cloned().unwrap_or_default();
        let input: Vec<String> = spec.profile_input.iter().map(|k| get(k)).collect();
        (input.join("\n"), get(spec.profile_output))
    }
}

/// One question to answer, with its gold answer when the split has one.
#[derive(Clone, Debug, PartialEq)]
pub struct Query {
    /// Question id, unique within the split.
    pub id: String,
    /// The full prompt text of the question.
    pub input: String,
    /// The reference answer (`None` for a hidden test set).
    pub gold: Option<String>,
}

/// A user: their profile and their queries.
#[derive(Clone, Debug, PartialEq)]
pub struct User {
    /// User id (the question id in LaMP, where every question is its own user).
    pub id: String,
    /// The user's history: training data for personal methods.
    pub profile: Vec<ProfileItem>,
    /// The questions to answer for this user.
    pub queries: Vec<Query>,
}

/// The directory name a user's work is kept in (`eval --work-dir`, and the
/// per-user LoRAs `hypertrain --lora-targets` reads back): ASCII letters,
/// digits, `-` and `.` kept, anything else `_`.
pub fn user_dir_name(id: &str) -> String {
    id.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
}

/// One split (train, dev or test) of one task.
#[derive(Clone, Debug, PartialEq)]
pub struct Split {
    /// How to read the task.
    pub spec: TaskSpec,
    /// Users in file order.
    pub users: Vec<User>,
}

impl Split {
    /// All queries, in file order, with their user.
    pub fn queries(&self) -> impl Iterator<Item = (&User, &Query)> {
        self.users.iter().flat_map(|u| u.queries.iter().map(move |q| (u, q)))
    }

    /// Number of queries over all users.
    pub fn num_queries(&self) -> usize {
        self.users.iter().map(|u| u.queries.len()).sum()
    }
}

/// Converts a JSON scalar to the text a profile field holds; `what` names
/// the field for the error.
pub(crate) fn json_text(v: &serde_json::Value, what: &str) -> crate::Result<String> {
    match v {
        serde_json::Value::String(s) => Ok(s.clone()),
        serde_json::Value::Number(n) => Ok(n.to_string()),
        serde_json::Value::Bool(b) => Ok(b.to_string()),
        serde_json::Value::Null => Ok(String::new()),
        _ => Err(crate::Error::format(what, "expected a string or number, found a list or object")),
    }
}

/// Reads a profile list (`[{id?, field: text, ...}, ...]`).
pub(crate) fn profile_items(v: &serde_json::Value, what: &str) -> crate::Result<Vec<ProfileItem>> {
    let items = v
        .as_array()
        .ok_or_else(|| crate::Error::format(what, "`profile` must be a list"))?;
    items
        .iter()
        .enumerate()
        .map(|(i, item)| {
            let obj = item
                .as_object()
                .ok_or_else(|| crate::Error::format(format!("{what} profile[{i}]"), "not an object"))?;
            let mut fields = BTreeMap::new();
            let mut id = String::new();
            for (k, v) in obj {
                let text = json_text(v, &format!("{what} profile[{i}].{k}"))?;
                if k == "id" {
                    id = text;
                } else {
                    fields.insert(k.clone(), text);
                }
            }
            Ok(ProfileItem { id, fields })
        })
        .collect()
}

/// Groups (user id, profile, query) rows into users, in first-seen order.
/// Rows of one user must carry the same profile.
pub(crate) fn group_users(
    rows: Vec<(String, Vec<ProfileItem>, Query)>,
    what: &str,
) -> crate::Result<Vec<User>> {
    let mut users: Vec<User> = Vec::new();
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen_queries = std::collections::BTreeSet::new();
    for (user, profile, query) in rows {
        if !seen_queries.insert(query.id.clone()) {
            return Err(crate::Error::format(what, format!("duplicate question id {:?}", query.id)));
        }
        match index.get(&user) {
            Some(&i) if users[i].profile != profile => {
                return Err(crate::Error::format(
                    what,
                    format!("user {user:?} has questions with different profiles"),
                ))
            }
            Some(&i) => users[i].queries.push(query),
            None => {
                index.insert(user.clone(), users.len());
                users.push(User { id: user, profile, queries: vec![query] });
            }
        }
    }
    Ok(users)
}
