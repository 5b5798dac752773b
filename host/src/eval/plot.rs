//! PNG charts for `hexlora report`: bars (score per method), a histogram
//! (per-user improvement over a baseline) and lines (loss curves).
//!
//! Drawn with `plotters` (bitmap backend). Text is rendered with ab_glyph
//! from a TrueType file read at run time (DejaVu Sans, Debian package
//! `fonts-dejavu-core`, unless `HEXLORA_FONT` names another), so no
//! fontconfig or font is linked into the binary.
use crate::{Error, Result};
use plotters::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// The font used when `HEXLORA_FONT` is unset.
pub const DEFAULT_FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";

const SIZE: (u32, u32) = (900, 540);

/// Registers the font once per process; an error names the file to install.
fn ensure_font() -> Result<()> {
    static FONT: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    FONT.get_or_init(|| {
        let path = std::env::var("HEXLORA_FONT").unwrap_or_else(|_| DEFAULT_FONT.to_string());
        let bytes = std::fs::read(&path).map_err(|e| format!("font {path}: {e} (install fonts-dejavu-core or set HEXLORA_FONT)"))?;
        // plotters keeps fonts for the process lifetime.
        let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
        plotters::style::register_font("sans-serif", FontStyle::Normal, bytes)
            .map_err(|_| format!("font {path}: not a TrueType font"))
    })
    .clone()
    .map_err(|msg| Error::invalid("plot font", msg))
}

fn draw_err(path: &Path, e: impl std::fmt::Display) -> Error {
    Error::invalid(path.display().to_string(), format!("drawing failed: {e}"))
}

type Canvas<'p> = DrawingArea<BitMapBackend<'p>, plotters::coord::Shift>;

/// A white [`SIZE`] canvas that will be written to `path`.
fn canvas(path: &Path) -> Result<Canvas<'_>> {
    let root = BitMapBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|e| draw_err(path, e))?;
    Ok(root)
}

/// What every chart has around its plot: the title, a margin, and room
/// for the axis labels (`y_labels` pixels left of the y axis).
fn frame<'a, 'b, 'p>(root: &'a Canvas<'p>, title: &str, y_labels: u32) -> ChartBuilder<'a, 'b, BitMapBackend<'p>> {
    let mut builder = ChartBuilder::on(root);
    builder.caption(title, ("sans-serif", 22)).margin(16).x_label_area_size(40).y_label_area_size(y_labels);
    builder
}

/// A bar per (label, value); values are scores in [0, 1] or above.
pub fn bars(path: &Path, title: &str, y_label: &str, bars: &[(String, f64)]) -> Result<()> {
    ensure_font()?;
    let top = bars.iter().map(|b| b.1).fold(0.0f64, f64::max).max(1e-3) * 1.15;
    let root = canvas(path)?;
    let labels: Vec<String> = bars.iter().map(|b| b.0.clone()).collect();
    let mut chart = frame(&root, title, 60)
        // A segmented 0..n axis has n + 1 slots; 0..n-1 gives one per bar.
        .build_cartesian_2d((0..bars.len().saturating_sub(1)).into_segmented(), 0.0..top)
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .y_desc(y_label)
        .x_label_formatter(&|x| match x {
            SegmentValue::CenterOf(i) => labels.get(*i).cloned().unwrap_or_default(),
            _ => String::new(),
        })
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            let mut bar = Rectangle::new([(SegmentValue::Exact(i), 0.0), (SegmentValue::Exact(i + 1), *v)], BLUE.mix(0.6).filled());
            bar.set_margin(0, 0, 12, 12);
            bar
        }))
        .map_err(|e| draw_err(path, e))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(i, (_, v))| {
            Text::new(format!("{v:.3}"), (SegmentValue::CenterOf(i), *v + top * 0.02), ("sans-serif", 14))
        }))
        .map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
}

/// A histogram of `values` in `bins` equal bins over a range symmetric
/// around 0 (improvements are signed). `bins` is made odd so that 0 (ties)
/// sits in the middle of a grey bin; green bins improve, red ones regress.
pub fn histogram(path: &Path, title: &str, x_label: &str, values: &[f64], bins: usize) -> Result<()> {
    ensure_font()?;
    let bins = bins.max(1) | 1;
    let reach = values.iter().map(|v| v.abs()).fold(0.0f64, f64::max).max(1e-3) * 1.05;
    let width = 2.0 * reach / bins as f64;
    let mut counts = vec![0u32; bins];
    for v in values {
        let b = (((v + reach) / width).floor() as usize).min(bins - 1);
        counts[b] += 1;
    }
    let top = counts.iter().copied().max().unwrap_or(0).max(1) + 1;
    let root = canvas(path)?;
    let mut chart = frame(&root, title, 50)
        .build_cartesian_2d(-reach..reach, 0u32..top)
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc("users")
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    chart
        .draw_series(counts.iter().enumerate().map(|(i, &c)| {
            let x0 = -reach + i as f64 * width;
            let color = match (2 * i + 1).cmp(&bins) {
                std::cmp::Ordering::Less => RED.mix(0.5),
                std::cmp::Ordering::Equal => BLACK.mix(0.3),
                std::cmp::Ordering::Greater => GREEN.mix(0.6),
            };
            Rectangle::new([(x0, 0), (x0 + width, c)], color.filled())
        }))
        .map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
}

/// One line per (name, points); the legend names each line.
pub fn lines(path: &Path, title: &str, x_label: &str, y_label: &str, series: &[(String, Vec<(f64, f64)>)]) -> Result<()> {
    ensure_font()?;
    let pts = || series.iter().flat_map(|s| s.1.iter()).filter(|p| p.0.is_finite() && p.1.is_finite());
    let (x0, x1) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.0), b.max(p.0)));
    let (y0, y1) = pts().fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), p| (a.min(p.1), b.max(p.1)));
    if !x0.is_finite() {
        return Err(Error::invalid(path.display().to_string(), "no finite points to plot"));
    }
    let (x1, y1) = (if x1 > x0 { x1 } else { x0 + 1.0 }, if y1 > y0 { y1 } else { y0 + 1.0 });
    let root = canvas(path)?;
    let mut chart = frame(&root, title, 60)
        .build_cartesian_2d(x0..x1, y0..y1 + (y1 - y0) * 0.05)
        .map_err(|e| draw_err(path, e))?;
    chart
        .configure_mesh()
        .x_desc(x_label)
        .y_desc(y_label)
        .label_style(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    for (i, (name, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.iter().copied().filter(|p| p.1.is_finite()), color.stroke_width(2)))
            .map_err(|e| draw_err(path, e))?
            .label(name.clone())
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .draw()
        .map_err(|e| draw_err(path, e))?;
    root.present().map_err(|e| draw_err(path, e))
}
