//! What each benchmark task is: classification (with its label set) or
//! generation, and which profile fields are a profile item's (input, output).
//!
//! Profile items keep their original field names (LaMP-2 has `description`
//! and `tag`, LaMP-5 `abstract` and `title`, ...); a [`TaskSpec`] says how to
//! read them as the (query, desired response) pairs that ICL, per-user LoRA
//! and the hypernetwork all consume.

/// The 15 LaMP-2 movie tags, in the order of the LaMP-2 prompt.
pub const LAMP2_TAGS: [&str; 15] = [
    "sci-fi",
    "based on a book",
    "comedy",
    "action",
    "twist ending",
    "dystopia",
    "dark comedy",
    "classic",
    "psychology",
    "fantasy",
    "romance",
    "thought-provoking",
    "social commentary",
    "violence",
    "true story",
];

/// Classification (exact-match label) or free text (ROUGE).
#[derive(Clone, Debug, PartialEq)]
pub enum TaskKind {
    /// The answer is one of `labels`; scored by accuracy and macro-F1.
    Classification {
        /// Every valid answer.
        labels: Vec<String>,
    },
    /// The answer is text; scored by ROUGE-1/2/L.
    Generation,
}

/// How to read one task's files.
#[derive(Clone, Debug, PartialEq)]
pub struct TaskSpec {
    /// The task name as written in `*_outputs.json` (`LaMP_2`, `quotes-tag`, ...).
    pub name: String,
    /// Classification or generation.
    pub kind: TaskKind,
    /// Profile fields that, joined by newlines, form an item's input.
    pub profile_input: Vec<&'static str>,
    /// The profile field that is an item's desired output.
    pub profile_output: &'static str,
}

fn spec(name: &str, kind: TaskKind, input: &[&'static str], output: &'static str) -> TaskSpec {
    TaskSpec { name: name.to_string(), kind, profile_input: input.to_vec(), profile_output: output }
}

impl TaskSpec {
    /// The spec of a known task name; `labels` is used only by the bundled
    /// classification benchmarks, whose label set is written in their files.
    pub fn for_task(name: &str, labels: Option<Vec<String>>) -> crate::Result<TaskSpec> {
        let gen = TaskKind::Generation;
        let tags = || TaskKind::Classification {
            labels: LAMP2_TAGS.iter().map(|s| s.to_string()).collect(),
        };
        Ok(match name {
            "LaMP_1" => spec(name, TaskKind::Classification { labels: vec!["[1]".into(), "[2]".into()] }, &["abstract"], "title"),
            "LaMP_2" | "LaMP_2M" => spec(name, tags(), &["description"], "tag"),
            "LaMP_3" => spec(name, TaskKind::Classification { labels: (1..=5).map(|i| i.to_string()).collect() }, &["text"], "score"),
            "LaMP_4" | "LaMP_6" => spec(name, gen, &["text"], "title"),
            "LaMP_5" => spec(name, gen, &["abstract"], "title"),
            "LaMP_7" => spec(name, gen, &[], "text"),
            "LongLaMP_product_review" => {
                spec(name, gen, &["overall", "description", "summary"], "reviewText")
            }
            "LongLaMP_topic_writing" => spec(name, gen, &["summary"], "content"),
            "LongLaMP_abstract_generation" => spec(name, gen, &["title"], "abstract"),
            "quotes-tag" | "git-area" => {
                let labels = labels.ok_or_else(|| {
                    crate::Error::invalid(name, "the label list (labels.json) is required")
                })?;
                spec(name, TaskKind::Classification { labels }, &["text"], "category")
            }
            "mail-subject" | "commit-subject" => spec(name, gen, &["text"], "title"),
            "sotu-continue" => spec(name, gen, &["text"], "continuation"),
            other => return Err(crate::Error::Unsupported(format!("benchmark task {other:?}"))),
        })
    }

    /// The label set, if this is a classification task.
    pub fn labels(&self) -> Option<&[String]> {
        match &self.kind {
            TaskKind::Classification { labels } => Some(labels),
            TaskKind::Generation => None,
        }
    }
}
