//! Run outputs for people: `metrics.jsonl` (one step record per line) and
//! `loss.svg`, a plain loss-per-step line chart.
use crate::base::atomic_write::write_atomic;
use crate::Result;
use std::fmt::Write;
use std::path::Path;

/// Rewrites `metrics.jsonl` from the committed history, one record a line
/// (so a resumed run's file matches an uninterrupted one's, line for line,
/// up to timings).
pub fn write_metrics<R: serde::Serialize>(dir: &Path, history: &[R]) -> Result<()> {
    let text: String = history.iter().map(|r| serde_json::to_string(r).expect("records serialise") + "\n").collect();
    write_atomic(&dir.join("metrics.jsonl"), text.as_bytes())
}

/// An SVG line chart of `values` against their index (1-based steps).
pub fn loss_svg(title: &str, values: &[f32]) -> String {
    let (w, h, pad) = (640.0f32, 360.0f32, 48.0f32);
    let finite: Vec<f32> = values.iter().copied().filter(|v| v.is_finite()).collect();
    let lo = finite.iter().copied().fold(f32::INFINITY, f32::min);
    let hi = finite.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let (lo, hi) = if finite.is_empty() { (0.0, 1.0) } else if hi > lo { (lo, hi) } else { (lo - 0.5, hi + 0.5) };
    let n = values.len().max(2) - 1;
    let x = |i: usize| pad + (w - 2.0 * pad) * i as f32 / n as f32;
    let y = |v: f32| h - pad - (h - 2.0 * pad) * (v - lo) / (hi - lo);
    let mut s = String::new();
    let _ = write!(s, r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">"#);
    let _ = write!(s, r#"<rect width="{w}" height="{h}" fill="white"/><text x="{}" y="20" text-anchor="middle">{title}</text>"#, w / 2.0);
    let _ = write!(s, r#"<line x1="{pad}" y1="{0}" x2="{1}" y2="{0}" stroke="black"/><line x1="{pad}" y1="{pad}" x2="{pad}" y2="{0}" stroke="black"/>"#, h - pad, w - pad);
    let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="end">{hi:.3}</text><text x="{}" y="{}" text-anchor="end">{lo:.3}</text>"#, pad - 4.0, pad + 4.0, pad - 4.0, h - pad);
    let _ = write!(s, r#"<text x="{}" y="{}" text-anchor="middle">step (1..{})</text>"#, w / 2.0, h - 12.0, values.len());
    let points: Vec<String> = values.iter().enumerate().filter(|(_, v)| v.is_finite()).map(|(i, &v)| format!("{:.1},{:.1}", x(i), y(v))).collect();
    let _ = write!(s, r#"<polyline fill="none" stroke="steelblue" stroke-width="2" points="{}"/></svg>"#, points.join(" "));
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::commit::StepRecord;

    #[test]
    fn svg_spans_the_plot_area_and_metrics_are_json_lines() {
        let svg = loss_svg("loss", &[3.0, 2.0, 1.0]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("48.0,48.0") && svg.contains("592.0,312.0"), "{svg}"); // max at top-left, min at bottom-right
        let dir = tempfile::tempdir().unwrap();
        let r = StepRecord { step: 1, loss: 2.5, lr: 1e-3, grad_norm: 1.0, tokens: 10, seconds: 0.1 };
        write_metrics(dir.path(), &[r.clone(), r]).unwrap();
        let text = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
        assert_eq!(text.lines().count(), 2);
        let back: StepRecord = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        assert_eq!(back.loss, 2.5);
    }
}
