//! Scores of one method and its comparison with a baseline: accuracy,
//! macro-F1, user-averaged depth, breadth (share of users improved),
//! McNemar's test for paired accuracy and a paired bootstrap for ROUGE.
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

/// Share of predictions equal to their gold answer (0 for no items).
pub fn accuracy(preds: &[&str], golds: &[&str]) -> f64 {
    assert_eq!(preds.len(), golds.len(), "accuracy: one prediction per gold");
    if preds.is_empty() {
        return 0.0;
    }
    let hits = preds.iter().zip(golds).filter(|(p, g)| p == g).count();
    hits as f64 / preds.len() as f64
}

/// Macro-averaged F1 over `labels`, as LaMP computes it (scikit-learn's
/// `f1_score(average="macro", labels=...)`): every listed label counts, a
/// label never predicted and never gold scores 0, and a prediction outside
/// `labels` is simply wrong.
pub fn macro_f1(preds: &[&str], golds: &[&str], labels: &[String]) -> f64 {
    assert_eq!(preds.len(), golds.len(), "macro_f1: one prediction per gold");
    if labels.is_empty() {
        return 0.0;
    }
    let f1s = labels.iter().map(|l| {
        let tp = preds.iter().zip(golds).filter(|(p, g)| **p == l && **g == l).count() as f64;
        let predicted = preds.iter().filter(|p| **p == l).count() as f64;
        let actual = golds.iter().filter(|g| **g == l).count() as f64;
        if tp == 0.0 {
            return 0.0;
        }
        let (precision, recall) = (tp / predicted, tp / actual);
        2.0 * precision * recall / (precision + recall)
    });
    f1s.sum::<f64>() / labels.len() as f64
}

/// Mean of per-user means: every user weighs the same, however many queries
/// they have ("depth"). Users without scores are skipped.
pub fn user_average(per_user: &[Vec<f64>]) -> f64 {
    let means: Vec<f64> = per_user.iter().filter(|s| !s.is_empty()).map(|s| mean(s)).collect();
    if means.is_empty() {
        0.0
    } else {
        mean(&means)
    }
}

fn mean(xs: &[f64]) -> f64 {
    xs.iter().sum::<f64>() / xs.len() as f64
}

/// How users fared against a baseline, by per-user mean score.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Breadth {
    /// Users whose mean beats the baseline's by more than `tie`.
    pub improved: usize,
    /// Users within `tie` of the baseline.
    pub tied: usize,
    /// Users below the baseline by more than `tie`.
    pub worse: usize,
}

impl Breadth {
    /// Share of users improved ("breadth"); ties count as not improved.
    pub fn share_improved(&self) -> f64 {
        let n = self.improved + self.tied + self.worse;
        if n == 0 {
            0.0
        } else {
            self.improved as f64 / n as f64
        }
    }
}

/// Compares per-user means of `method` and `baseline` (same users, same
/// order); differences of at most `tie` are ties.
pub fn breadth(method: &[f64], baseline: &[f64], tie: f64) -> Breadth {
    assert_eq!(method.len(), baseline.len(), "breadth: paired users");
    let mut b = Breadth { improved: 0, tied: 0, worse: 0 };
    for (m, base) in method.iter().zip(baseline) {
        let d = m - base;
        if d > tie {
            b.improved += 1;
        } else if d < -tie {
            b.worse += 1;
        } else {
            b.tied += 1;
        }
    }
    b
}

/// McNemar's test on paired correctness.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct McNemar {
    /// Items the method got right and the baseline wrong.
    pub method_only: usize,
    /// Items the baseline got right and the method wrong.
    pub baseline_only: usize,
    /// Two-sided p-value.
    pub p_value: f64,
    /// True if the exact binomial test was used (fewer than 25 discordant pairs).
    pub exact: bool,
    /// One-sided exact p-value of "the method is not better":
    /// P(X >= method_only) for X ~ Binomial(discordant pairs, 1/2), at any
    /// number of pairs. NaN in results written before it existed.
    #[serde(default = "not_computed")]
    pub p_one_sided: f64,
}

fn not_computed() -> f64 {
    f64::NAN
}

/// McNemar's test: the exact two-sided binomial test on the discordant pairs
/// when there are fewer than 25 of them, otherwise the chi-square statistic
/// with continuity correction, `(|b - c| - 1)^2 / (b + c)`, on 1 degree of
/// freedom (the conventions of statsmodels' `mcnemar`).
pub fn mcnemar(method_correct: &[bool], baseline_correct: &[bool]) -> McNemar {
    assert_eq!(method_correct.len(), baseline_correct.len(), "mcnemar: paired items");
    let pairs = method_correct.iter().zip(baseline_correct);
    let b = pairs.clone().filter(|(m, base)| **m && !**base).count();
    let c = pairs.filter(|(m, base)| !**m && **base).count();
    let n = b + c;
    let exact = n < 25;
    let p_value = if n == 0 {
        1.0
    } else if exact {
        (2.0 * binomial_cdf_half(b.min(c), n)).min(1.0)
    } else {
        let stat = ((b as f64 - c as f64).abs() - 1.0).max(0.0).powi(2) / n as f64;
        // Survival function of chi-square with 1 dof: P(X > s) = erfc(sqrt(s / 2)).
        libm::erfc((stat / 2.0).sqrt())
    };
    // P(X >= b) = P(n - X <= c), and n - X ~ Binomial(n, 1/2) too.
    let p_one_sided = if n == 0 { 1.0 } else { binomial_cdf_half(c, n) };
    McNemar { method_only: b, baseline_only: c, p_value, exact, p_one_sided }
}

/// P(X <= k) for X ~ Binomial(n, 1/2), summed in log space so large `n`
/// does not underflow.
pub fn binomial_cdf_half(k: usize, n: usize) -> f64 {
    let ln_half_n = n as f64 * 0.5f64.ln();
    let mut ln_choose = 0.0; // ln C(n, 0)
    let mut total = 0.0;
    for i in 0..=k.min(n) {
        if i > 0 {
            ln_choose += ((n - i + 1) as f64).ln() - (i as f64).ln();
        }
        total += (ln_choose + ln_half_n).exp();
    }
    total.min(1.0)
}

/// Result of a paired bootstrap of mean(method - baseline).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Bootstrap {
    /// The observed mean difference.
    pub mean_diff: f64,
    /// 2.5th percentile of resampled mean differences.
    pub ci_low: f64,
    /// 97.5th percentile of resampled mean differences.
    pub ci_high: f64,
    /// Share of resamples whose mean difference is <= 0: the one-sided
    /// p-value that the method is not better (Koehn 2004).
    pub p_not_better: f64,
    /// Number of resamples.
    pub resamples: usize,
}

/// Paired bootstrap over units (queries, or per-user means for a user-level
/// test): resample `n` unit indices with replacement `resamples` times from a
/// ChaCha8 stream seeded with `seed`, so the result is reproducible.
pub fn paired_bootstrap(method: &[f64], baseline: &[f64], resamples: usize, seed: u64) -> Bootstrap {
    assert_eq!(method.len(), baseline.len(), "paired_bootstrap: paired units");
    let diffs: Vec<f64> = method.iter().zip(baseline).map(|(m, b)| m - b).collect();
    let n = diffs.len();
    if n == 0 || resamples == 0 {
        return Bootstrap { mean_diff: 0.0, ci_low: 0.0, ci_high: 0.0, p_not_better: 1.0, resamples };
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut means: Vec<f64> = (0..resamples)
        .map(|_| {
            let sum: f64 = (0..n).map(|_| diffs[uniform_index(&mut rng, n)]).sum();
            sum / n as f64
        })
        .collect();
    means.sort_by(f64::total_cmp);
    let not_better = means.iter().filter(|&&m| m <= 0.0).count();
    Bootstrap {
        mean_diff: mean(&diffs),
        ci_low: percentile(&means, 0.025),
        ci_high: percentile(&means, 0.975),
        p_not_better: not_better as f64 / resamples as f64,
        resamples,
    }
}

/// An index in `0..n` by widening multiply (bias below n / 2^64).
fn uniform_index(rng: &mut ChaCha8Rng, n: usize) -> usize {
    ((rng.next_u64() as u128 * n as u128) >> 64) as usize
}

/// Linear-interpolated percentile of sorted `xs` (numpy's default method).
pub fn percentile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let pos = q * (sorted.len() - 1) as f64;
    let (lo, hi) = (pos.floor() as usize, pos.ceil() as usize);
    sorted[lo] + (sorted[hi] - sorted[lo]) * (pos - lo as f64)
}
