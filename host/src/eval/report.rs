//! `hexlora report`: result files -> a markdown table per (task, split,
//! temperature) with comparisons against a baseline method, plus PNG plots:
//! score by method, per-user improvement histograms, loss curves.
use super::plot;
use super::result::{compare, Comparison, RunResult};
use crate::{Error, Result};
use std::fmt::Write;
use std::path::{Path, PathBuf};

/// Seed of the bootstrap in reports (fixed, so reports are reproducible).
pub const REPORT_SEED: u64 = 20261129;

/// Results of one task, split and temperature, in input order.
pub struct Group<'a> {
    /// Task name.
    pub task: String,
    /// Split name.
    pub split: String,
    /// Decoding temperature.
    pub temperature: f32,
    /// The runs.
    pub runs: Vec<&'a RunResult>,
}

/// Groups results by (task, split, temperature), keeping first-seen order.
pub fn group(results: &[RunResult]) -> Vec<Group<'_>> {
    let mut groups: Vec<Group> = Vec::new();
    for r in results {
        let same = |g: &Group| g.task == r.task && g.split == r.split && g.temperature == r.decoding.temperature;
        match groups.iter_mut().find(|g| same(g)) {
            Some(g) => g.runs.push(r),
            None => groups.push(Group { task: r.task.clone(), split: r.split.clone(), temperature: r.decoding.temperature, runs: vec![r] }),
        }
    }
    groups
}

/// Reads a training `metrics.jsonl` (lines with `step` and `loss`; other
/// fields ignored) as (step, loss) points.
pub fn read_metrics_jsonl(path: &Path) -> Result<Vec<(f64, f64)>> {
    let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
    let mut points = Vec::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let at = || format!("{} line {}", path.display(), i + 1);
        let v: serde_json::Value = serde_json::from_str(line).map_err(|e| Error::format(at(), format!("not JSON: {e}")))?;
        let num = |k: &str| v.get(k).and_then(|x| x.as_f64()).ok_or_else(|| Error::format(at(), format!("no numeric `{k}`")));
        points.push((num("step")?, num("loss")?));
    }
    Ok(points)
}

fn pct(x: Option<f64>) -> String {
    x.map_or("-".into(), |v| format!("{:.2}", 100.0 * v))
}

fn p_value(p: Option<f64>) -> String {
    p.filter(|p| !p.is_nan()).map_or("-".into(), |p| if p < 1e-4 { "<1e-4".into() } else { format!("{p:.4}") })
}

fn row(r: &RunResult, cmp: Option<&Comparison>, classification: bool) -> String {
    let s = &r.summary;
    let improved = cmp.map_or("-".into(), |c| {
        let b = &c.breadth;
        format!("{:.0}% ({}/{}/{})", 100.0 * b.share_improved(), b.improved, b.tied, b.worse)
    });
    let prep = r.users.iter().map(|u| u.prep.seconds).sum::<f64>() / r.users.len().max(1) as f64;
    let scores = if classification {
        format!("{} | {} | {}", pct(s.accuracy), pct(s.macro_f1), pct(Some(s.depth)))
    } else {
        format!("{} | {} | {} | {} | {}", pct(s.rouge1), pct(s.rouge2), pct(s.rouge_l), pct(Some(s.depth)), pct(s.depth_rouge_l))
    };
    let test = if classification {
        let m = cmp.and_then(|c| c.mcnemar);
        format!("{} | {}", p_value(m.map(|m| m.p_value)), p_value(m.map(|m| m.p_one_sided)))
    } else {
        p_value(cmp.map(|c| c.bootstrap_queries.p_not_better))
    };
    format!(
        "| {} | {} | {} | {scores} | {improved} | {test} | {} | {:.1} | {:.2} |\n",
        r.method, s.users, s.queries, p_value(cmp.map(|c| c.bootstrap_users.p_not_better)), r.seconds, prep
    )
}

/// The markdown of one group; comparisons are against `baseline` when it is
/// one of the group's methods.
pub fn group_markdown(g: &Group, baseline: Option<&str>) -> Result<String> {
    let classification = g.runs[0].summary.primary_metric == "accuracy";
    let base = baseline.and_then(|b| g.runs.iter().find(|r| r.method == b).copied());
    let mut md = String::new();
    let _ = writeln!(md, "### {} / {} / T={}\n", g.task, g.split, g.temperature);
    let vs = base.map_or("baseline".to_string(), |b| b.method.clone());
    if classification {
        let _ = writeln!(md, "| method | users | queries | accuracy % | macro-F1 % | depth % | users improved vs {vs} (+/=/-) | McNemar p | McNemar p one-sided exact | bootstrap p (users) | run s | prep s/user |");
        md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    } else {
        let _ = writeln!(md, "| method | users | queries | ROUGE-1 % | ROUGE-2 % | ROUGE-L % | depth R-1 % | depth R-L % | users improved vs {vs} (+/=/-) | bootstrap p (queries) | bootstrap p (users) | run s | prep s/user |");
        md.push_str("|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    }
    for r in &g.runs {
        let cmp = match base {
            Some(b) if b.method != r.method => Some(compare(r, b, REPORT_SEED)?),
            _ => None,
        };
        md.push_str(&row(r, cmp.as_ref(), classification));
    }
    let usual = g.runs.iter().find(|r| r.method == USUAL_LABEL);
    if let (true, Some(base), Some(usual)) = (classification, base, usual) {
        md.push_str(&moved_markdown(g, base, usual)?);
    }
    Ok(md)
}

/// The run whose answer to each query is its user's most frequent profile
/// label: where a personalizing method should move answers.
pub const USUAL_LABEL: &str = "majority-user";

/// Where a method's answers moved against a baseline's (first predictions).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Moved {
    /// Queries whose answer differs from the baseline's.
    pub changed: usize,
    /// Of those, answers equal to the `usual` run's.
    pub to_usual: usize,
    /// Of those, right after the change.
    pub right_now: usize,
    /// Of those, right before (the baseline's answer).
    pub right_before: usize,
}

/// Each query's first prediction and whether it scored, by query id.
type Answers = std::collections::HashMap<String, (String, bool)>;

fn answers(r: &RunResult) -> Answers {
    let first = |q: &super::result::QueryResult| q.predictions.first().cloned().unwrap_or_default();
    r.users.iter().flat_map(|u| &u.queries).map(|q| (q.id.clone(), (first(q), q.score > 0.5))).collect()
}

/// Compares answers query by query (by id); all three runs must hold the same queries.
pub fn moved(method: &RunResult, base: &RunResult, usual: &RunResult) -> Result<Moved> {
    moved_from(&method.method, &answers(method), &answers(base), &answers(usual))
}

fn moved_from(method: &str, m: &Answers, b: &Answers, u: &Answers) -> Result<Moved> {
    let mut out = Moved::default();
    for (id, (answer, right)) in m {
        let missing = || Error::invalid("report", format!("query {id} of {method} is not in every run it is compared with"));
        let (before, was_right) = b.get(id).ok_or_else(missing)?;
        let (usual, _) = u.get(id).ok_or_else(missing)?;
        if answer != before {
            out.changed += 1;
            out.to_usual += (answer == usual) as usize;
            out.right_now += *right as usize;
            out.right_before += *was_right as usize;
        }
    }
    Ok(out)
}

fn moved_markdown(g: &Group, base: &RunResult, usual: &RunResult) -> Result<String> {
    let (b, u) = (answers(base), answers(usual));
    let vs = &base.method;
    // The baseline's own answers that already are the usual label: those
    // the usual-label run does not change against it.
    let unchanged = b.len() - moved_from(&usual.method, &u, &b, &u)?.changed;
    let mut md = format!(
        "\nAnswers that differ from {vs}'s, and how many of them became the user's most frequent label ({USUAL_LABEL}'s answer; \
         {vs} itself gives it for {:.1}% of the queries): a method that personalizes moves answers there.\n\n\
         | method | answers changed | to the user's most frequent label | right after | right before |\n|---|---|---|---|---|\n",
        100.0 * unchanged as f64 / b.len().max(1) as f64
    );
    for r in g.runs.iter().filter(|r| r.method != base.method && r.method != usual.method) {
        let m = moved_from(&r.method, &answers(r), &b, &u)?;
        let share = 100.0 * m.to_usual as f64 / m.changed.max(1) as f64;
        let _ = writeln!(md, "| {} | {} | {} ({share:.0}%) | {} | {} |", r.method, m.changed, m.to_usual, m.right_now, m.right_before);
    }
    Ok(md)
}

fn file_stem(g: &Group) -> String {
    let raw = format!("{}-{}-T{}", g.task, g.split, g.temperature);
    raw.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '.' { c } else { '_' }).collect()
}

/// Writes `out/report.md` and its PNGs; `metrics` are (name, metrics.jsonl)
/// loss curves to plot. Returns the report path.
pub fn write_report(out: &Path, results: &[RunResult], baseline: Option<&str>, metrics: &[(String, PathBuf)]) -> Result<PathBuf> {
    if results.is_empty() {
        return Err(Error::invalid("report", "no result files given"));
    }
    std::fs::create_dir_all(out).map_err(|e| Error::io(out, e))?;
    let mut md = String::from("# Evaluation report\n\nScores in percent. depth = mean over users of the user's mean score; \
        p-values test \"method not better than the baseline\" (McNemar on accuracy with one sample per query: two-sided, exact below 25 discordant pairs and \
        chi-square above, then one-sided exact at any count; \
        paired bootstrap one-sided, 10,000 resamples, on queries and on users).\n\n");
    for g in group(results) {
        md.push_str(&group_markdown(&g, baseline)?);
        let stem = file_stem(&g);
        let metric = g.runs[0].summary.primary_metric.clone();
        let bars: Vec<(String, f64)> = g.runs.iter().map(|r| (r.method.clone(), r.summary.accuracy.or(r.summary.rouge1).unwrap_or(0.0))).collect();
        let png = format!("{stem}-by-method.png");
        plot::bars(&out.join(&png), &format!("{} {} T={}: {metric} by method", g.task, g.split, g.temperature), &metric, &bars)?;
        let _ = write!(md, "\n![{metric} by method]({png})\n");
        if let Some(base) = baseline.and_then(|b| g.runs.iter().find(|r| r.method == b)) {
            for r in g.runs.iter().filter(|r| r.method != base.method) {
                compare(r, base, REPORT_SEED)?;
                let diffs: Vec<f64> = r.user_means().iter().zip(base.user_means()).map(|(m, b)| m - b).collect();
                let png = format!("{stem}-{}-vs-{}.png", r.method, base.method);
                let title = format!("{}: per-user {metric} change vs {}", r.method, base.method);
                plot::histogram(&out.join(&png), &title, &format!("user mean {metric} difference"), &diffs, 20)?;
                let _ = write!(md, "\n![{} vs {}]({png})\n", r.method, base.method);
            }
        }
        md.push('\n');
    }
    let curves = loss_curves(results, metrics)?;
    if !curves.is_empty() {
        plot::lines(&out.join("loss-curves.png"), "training loss", "step", "loss", &curves)?;
        md.push_str("### Loss curves\n\n![loss curves](loss-curves.png)\n");
    }
    let path = out.join("report.md");
    std::fs::write(&path, md).map_err(|e| Error::io(&path, e))?;
    Ok(path)
}

/// Loss curves from metrics files, and per method the mean over users of
/// each step's per-user training loss (when the method trains per user).
fn loss_curves(results: &[RunResult], metrics: &[(String, PathBuf)]) -> Result<Vec<(String, Vec<(f64, f64)>)>> {
    let mut curves = Vec::new();
    for (name, path) in metrics {
        curves.push((name.clone(), read_metrics_jsonl(path)?));
    }
    let mut seen = std::collections::BTreeSet::new();
    for r in results.iter().filter(|r| seen.insert(r.method.clone())) {
        let longest = r.users.iter().map(|u| u.prep.loss_curve.len()).max().unwrap_or(0);
        let mean: Vec<(f64, f64)> = (0..longest)
            .map(|i| {
                let at: Vec<f64> = r.users.iter().filter_map(|u| u.prep.loss_curve.get(i).copied()).collect();
                ((i + 1) as f64, at.iter().sum::<f64>() / at.len() as f64)
            })
            .collect();
        if !mean.is_empty() {
            curves.push((format!("{} (mean per-user)", r.method), mean));
        }
    }
    Ok(curves)
}
