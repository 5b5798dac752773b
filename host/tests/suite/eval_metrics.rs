//! Metrics against hand-computed values, Python-computed McNemar p-values
//! (fixtures/eval/mcnemar.json from make_mcnemar.py) and the bootstrap's
//! agreement with the analytic standard error.
use hexlora::eval::metrics::*;

#[test]
fn accuracy_and_macro_f1_hand_computed() {
    let golds = ["a", "a", "b", "c"];
    let preds = ["a", "b", "b", "x"];
    assert_eq!(accuracy(&preds, &golds), 0.5);
    let labels: Vec<String> = ["a", "b", "c", "d"].iter().map(|s| s.to_string()).collect();
    // a: P=1, R=1/2 -> 2/3; b: P=1/2, R=1 -> 2/3; c, d: 0.  Mean over 4 labels = 1/3.
    assert!((macro_f1(&preds, &golds, &labels) - 1.0 / 3.0).abs() < 1e-12);
    // Perfect predictions over the labels present: (1 + 1 + 1 + 0) / 4.
    assert!((macro_f1(&golds, &golds, &labels) - 0.75).abs() < 1e-12);
    assert_eq!(accuracy(&[], &[]), 0.0);
}

#[test]
fn depth_weighs_users_equally_and_breadth_counts_ties() {
    // User 1 has 4 queries, user 2 one: the query mean would be 0.2, the user mean is 0.5.
    let per_user = vec![vec![0.0, 0.0, 0.0, 0.0], vec![1.0], vec![]];
    assert!((user_average(&per_user) - 0.5).abs() < 1e-12);
    let b = breadth(&[0.5, 0.4, 0.3, 0.30000000001], &[0.4, 0.4, 0.35, 0.3], 1e-9);
    assert_eq!(b, Breadth { improved: 1, tied: 2, worse: 1 });
    assert_eq!(b.share_improved(), 0.25);
}

#[test]
fn mcnemar_matches_python_exact_and_chi_square() {
    #[derive(serde::Deserialize)]
    struct Case {
        b: usize,
        c: usize,
        exact: bool,
        p: f64,
        p_exact: f64,
        p_one_sided: f64,
    }
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/eval/mcnemar.json");
    let cases: Vec<Case> = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    for case in cases {
        let mut method = vec![true; case.b];
        method.extend(vec![false; case.c]);
        let mut baseline = vec![false; case.b];
        baseline.extend(vec![true; case.c]);
        // Concordant pairs must not matter.
        method.extend([true, true, false]);
        baseline.extend([true, true, false]);
        let m = mcnemar(&method, &baseline);
        assert_eq!((m.method_only, m.baseline_only, m.exact), (case.b, case.c, case.exact));
        assert!((m.p_value - case.p).abs() < 1e-9 * case.p.max(1e-300) + 1e-15, "b={} c={}: {} vs {}", case.b, case.c, m.p_value, case.p);
        let one = case.p_one_sided;
        assert!((m.p_one_sided - one).abs() <= 1e-9 * one + 1e-300, "one-sided b={} c={}: {} vs {one}", case.b, case.c, m.p_one_sided);
        let n = case.b + case.c;
        if n > 0 {
            let exact = (2.0 * binomial_cdf_half(case.b.min(case.c), n)).min(1.0);
            assert!((exact - case.p_exact).abs() <= 1e-9 * case.p_exact + 1e-300, "exact b={} c={}", case.b, case.c);
        }
    }
    // Hand check: b=1, c=5 -> 2 * (1 + 6) / 64.
    let m = mcnemar(&[true, false, false, false, false, false], &[false, true, true, true, true, true]);
    assert!((m.p_value - 14.0 / 64.0).abs() < 1e-15);
}

#[test]
fn paired_bootstrap_is_seeded_and_matches_the_analytic_standard_error() {
    // Differences with known mean and spread: d_i = 0.05 + 0.2 * sin(i).
    let n = 400;
    let baseline: Vec<f64> = (0..n).map(|i| 0.3 + 0.1 * ((i * 7 % 13) as f64 / 13.0)).collect();
    let method: Vec<f64> = baseline.iter().enumerate().map(|(i, b)| b + 0.05 + 0.2 * (i as f64).sin()).collect();
    let a = paired_bootstrap(&method, &baseline, 4000, 7);
    let again = paired_bootstrap(&method, &baseline, 4000, 7);
    assert_eq!(a, again, "same seed, same result");
    assert_ne!(a, paired_bootstrap(&method, &baseline, 4000, 8));

    let diffs: Vec<f64> = method.iter().zip(&baseline).map(|(m, b)| m - b).collect();
    let mean = diffs.iter().sum::<f64>() / n as f64;
    let var = diffs.iter().map(|d| (d - mean).powi(2)).sum::<f64>() / n as f64;
    let se = (var / n as f64).sqrt();
    assert!((a.mean_diff - mean).abs() < 1e-12);
    // The bootstrap 95% interval is mean +- 1.96 SE to within sampling noise.
    let half_width = (a.ci_high - a.ci_low) / 2.0;
    assert!((half_width / (1.96 * se) - 1.0).abs() < 0.08, "half width {half_width} vs {}", 1.96 * se);
    assert!(a.ci_low < mean && mean < a.ci_high);
    // p(not better) ~ Phi(-mean / se).
    let z = mean / se;
    let want = 0.5 * as_erfc(z / std::f64::consts::SQRT_2);
    assert!((a.p_not_better - want).abs() < 0.01, "p {} vs normal {}", a.p_not_better, want);

    let same = paired_bootstrap(&baseline, &baseline, 100, 1);
    assert_eq!((same.mean_diff, same.p_not_better), (0.0, 1.0));
}

/// erfc by Abramowitz & Stegun 7.1.26 (|error| < 1.5e-7), independent of the
/// libm erfc the crate uses; precise enough for a 0.01 tolerance.
fn as_erfc(x: f64) -> f64 {
    let t = 1.0 / (1.0 + 0.3275911 * x.abs());
    let poly = t * (0.254829592 + t * (-0.284496736 + t * (1.421413741 + t * (-1.453152027 + t * 1.061405429))));
    let erfc = poly * (-x * x).exp();
    if x >= 0.0 { erfc } else { 2.0 - erfc }
}

#[test]
fn percentile_is_numpys_linear_method() {
    let xs = [1.0, 2.0, 3.0, 4.0];
    assert_eq!(percentile(&xs, 0.0), 1.0);
    assert_eq!(percentile(&xs, 1.0), 4.0);
    assert!((percentile(&xs, 0.5) - 2.5).abs() < 1e-12);
    assert!((percentile(&xs, 0.025) - 1.075).abs() < 1e-12);
}
