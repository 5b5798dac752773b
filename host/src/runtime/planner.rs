//! Start-up kernel planner: before training, every (projection, direction,
//! token bucket) is probed through the DSP projection and compared with the
//! CPU f32 reference; routes that fail or error run on the CPU path.
//!
//! A probe feeds `bucket` rows of seeded normal values and checks
//! [`SAMPLED_ROWS`] of the output rows (always the first and the last, the
//! rest spread evenly) against the CPU product of the same rows. Rows are
//! independent in both directions, so the sampled reference is exact, and
//! start-up costs one DSP product per route instead of two full products.
//!
//! The error measure is the per-tensor max-normalised error used across the
//! project: `max |dsp - cpu| / max |cpu|` over the sampled rows.
use crate::base::counter_rng;
use crate::projection::{Direction, Projection};
use crate::{Error, Result};
use serde::Serialize;
use std::path::Path;

/// Output rows compared per probe.
pub const SAMPLED_ROWS: usize = 8;

/// Token buckets, ascending: token counts are padded up to the next bucket,
/// so the DSP only ever sees shapes the planner validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Buckets(Vec<usize>);

impl Buckets {
    /// Powers of two from `min` to `max` inclusive (e.g. 32..=512).
    pub fn powers_of_two(min: usize, max: usize) -> Result<Self> {
        if min == 0 || !min.is_power_of_two() || !max.is_power_of_two() || min > max {
            return Err(Error::invalid("token buckets", format!("{min}..={max} is not a range of powers of two")));
        }
        Ok(Buckets(std::iter::successors(Some(min), |b| Some(b * 2)).take_while(|&b| b <= max).collect()))
    }

    /// Parses a comma-separated list such as `32,64,128`.
    pub fn parse(text: &str) -> Result<Self> {
        let mut v: Vec<usize> = text
            .split(',')
            .map(|s| s.trim().parse::<usize>().map_err(|_| Error::invalid("--buckets", format!("{s:?} is not a token count"))))
            .collect::<Result<_>>()?;
        v.sort_unstable();
        v.dedup();
        if v.is_empty() || v[0] == 0 {
            return Err(Error::invalid("--buckets", "needs at least one positive token count"));
        }
        Ok(Buckets(v))
    }

    /// The smallest bucket holding `tokens` rows, if any.
    pub fn pick(&self, tokens: usize) -> Option<usize> {
        self.0.iter().copied().find(|&b| b >= tokens)
    }

    /// The buckets, ascending.
    pub fn as_slice(&self) -> &[usize] {
        &self.0
    }
}

/// Direction as it appears in the metrics.
pub fn direction_name(dir: Direction) -> &'static str {
    match dir {
        Direction::Forward => "forward",
        Direction::InputGrad => "input_grad",
    }
}

/// One planner decision.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Route {
    /// Projection name.
    pub projection: String,
    /// `forward` or `input_grad`.
    pub direction: &'static str,
    /// Padded token count.
    pub bucket: usize,
    /// Served by the DSP (otherwise the CPU path).
    pub on_dsp: bool,
    /// Max-normalised error of the probe, when the DSP answered.
    pub error: Option<f32>,
    /// The tolerance the probe was held to.
    pub tolerance: f32,
    /// Why a route stays on the CPU (empty when on the DSP).
    pub reason: String,
}

/// Seeded probe input `[rows, width]`: the same for every run, different per
/// projection shape, direction and bucket.
fn probe_input(rows: usize, width: usize, dir: Direction) -> Vec<f32> {
    let seed = counter_rng::derive(0x9e0b_e5, (rows * 1_000_003 + width) as u64 * 2 + (dir == Direction::InputGrad) as u64);
    (0..rows * width).map(|i| counter_rng::normal(seed, i as u64)).collect()
}

/// The output rows a probe compares: first, last, and evenly spread.
fn sampled_rows(bucket: usize) -> Vec<usize> {
    let k = SAMPLED_ROWS.min(bucket);
    let mut rows: Vec<usize> = (0..k).map(|j| if k == 1 { 0 } else { j * (bucket - 1) / (k - 1) }).collect();
    rows.dedup();
    rows
}

/// `max |got - want| / max |want|` (absolute when `want` is all zero).
pub fn max_normalised_error(got: &[f32], want: &[f32]) -> f32 {
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = got.iter().zip(want).fold(0f32, |m, (g, w)| m.max((g - w).abs()));
    if scale > 0.0 {
        diff / scale
    } else {
        diff
    }
}

/// Probes one (direction, bucket) of `dsp` against the CPU reference `cpu`
/// (same weight, f32).
pub fn probe(dsp: &dyn Projection, cpu: &dyn Projection, dir: Direction, bucket: usize, tolerance: f32) -> Route {
    let info = cpu.info();
    let (w_in, w_out) = info.widths(dir);
    let mut route = Route { projection: info.name.clone(), direction: direction_name(dir), bucket, on_dsp: false, error: None, tolerance, reason: String::new() };
    let input = probe_input(bucket, w_in, dir);
    let mut got = vec![0f32; bucket * w_out];
    if let Err(e) = dsp.apply(dir, &input, bucket, &mut got) {
        route.reason = format!("service: {e}");
        return route;
    }
    let rows = sampled_rows(bucket);
    let sub_in: Vec<f32> = rows.iter().flat_map(|&r| input[r * w_in..(r + 1) * w_in].iter().copied()).collect();
    let mut want = vec![0f32; rows.len() * w_out];
    if let Err(e) = cpu.apply(dir, &sub_in, rows.len(), &mut want) {
        route.reason = format!("cpu reference: {e}");
        return route;
    }
    let sub_got: Vec<f32> = rows.iter().flat_map(|&r| got[r * w_out..(r + 1) * w_out].iter().copied()).collect();
    if sub_got.iter().any(|v| !v.is_finite()) {
        route.reason = "non-finite output".into();
        return route;
    }
    let err = max_normalised_error(&sub_got, &want);
    route.error = Some(err);
    route.on_dsp = err <= tolerance;
    if !route.on_dsp {
        route.reason = format!("error {err:.3e} above tolerance {tolerance:.1e}");
    }
    route
}

/// Probes both directions of a projection at every bucket.
pub fn plan_projection(dsp: &dyn Projection, cpu: &dyn Projection, buckets: &Buckets, tolerance: f32) -> Vec<Route> {
    [Direction::Forward, Direction::InputGrad]
        .into_iter()
        .flat_map(|dir| buckets.as_slice().iter().map(move |&b| probe(dsp, cpu, dir, b, tolerance)))
        .collect()
}

/// Routes for projections with no DSP side at all (CPU transport, or a
/// weight the client refused to load).
pub fn cpu_only(name: &str, buckets: &Buckets, reason: &str) -> Vec<Route> {
    [Direction::Forward, Direction::InputGrad]
        .into_iter()
        .flat_map(|dir| {
            buckets.as_slice().iter().map(move |&bucket| Route {
                projection: name.to_string(),
                direction: direction_name(dir),
                bucket,
                on_dsp: false,
                error: None,
                tolerance: 0.0,
                reason: reason.to_string(),
            })
        })
        .collect()
}

/// The whole run's routing table.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RouteTable {
    /// Every decision, in load order.
    pub routes: Vec<Route>,
}

impl RouteTable {
    /// `(on the DSP, total)`.
    pub fn counts(&self) -> (usize, usize) {
        (self.routes.iter().filter(|r| r.on_dsp).count(), self.routes.len())
    }

    /// `N of M routes on the DSP`.
    pub fn summary(&self) -> String {
        let (n, m) = self.counts();
        format!("{n} of {m} routes on the DSP")
    }

    /// Largest probe error among DSP routes.
    pub fn worst_error(&self) -> Option<f32> {
        self.routes.iter().filter(|r| r.on_dsp).filter_map(|r| r.error).reduce(f32::max)
    }

    /// Writes `routes.json` (kept with the run's metrics).
    pub fn write(&self, dir: &Path) -> Result<()> {
        let text = serde_json::to_string_pretty(self).expect("routes serialise");
        crate::base::atomic_write::write_atomic(&dir.join("routes.json"), text.as_bytes())
    }
}
