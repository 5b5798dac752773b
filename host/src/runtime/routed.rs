//! [`RoutedProjection`]: one frozen projection with a DSP side and the CPU
//! f32 side, choosing per (direction, bucket) from the planner's table.
//! Token counts are padded with zero rows up to the bucket (rows are
//! independent, so padding never changes the real rows' results).
//!
//! The NPU client already restarts a failed service and retries; an error
//! other than bad input (shape, non-finite) that still reaches us means it
//! gave up, so every routed projection of the
//! run switches to the CPU path from then on ([`SplitState::fall_back`]),
//! says so once on stderr and records it in the metrics.
use super::planner::{direction_name, Buckets, Route};
use crate::projection::{Direction, Product, Projection, ProjectionInfo};
use crate::{Error, Result};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// State shared by all routed projections of a run: the fallback switch and
/// the time counters the run summary splits step time with.
#[derive(Default)]
pub struct SplitState {
    fell_back: AtomicBool,
    /// Run the side work before the request instead of while it is in
    /// flight (the synchronous baseline of the step-time table).
    synchronous: AtomicBool,
    reason: Mutex<Option<String>>,
    /// Nanoseconds the training thread waited on DSP products (side work
    /// run during the request excluded).
    dsp_wait_ns: AtomicU64,
    /// Nanoseconds of side work (LoRA branch) run while a request was in flight.
    overlapped_ns: AtomicU64,
    /// Nanoseconds in CPU-routed projection products.
    cpu_ns: AtomicU64,
    dsp_calls: AtomicU64,
    cpu_calls: AtomicU64,
    /// Zero rows added to reach buckets.
    padded_rows: AtomicU64,
}

/// A snapshot of [`SplitState`]'s counters.
#[derive(Clone, Copy, Debug, Default, PartialEq, serde::Serialize)]
pub struct SplitCounters {
    /// Seconds waiting on the DSP.
    pub dsp_wait_s: f64,
    /// Seconds of CPU side work overlapped with DSP requests.
    pub overlapped_s: f64,
    /// Seconds of CPU-routed projection products.
    pub cpu_projection_s: f64,
    /// DSP requests.
    pub dsp_calls: u64,
    /// CPU-routed products.
    pub cpu_calls: u64,
    /// Padding rows sent.
    pub padded_rows: u64,
}

impl SplitCounters {
    /// `self - earlier`, for per-step figures.
    pub fn since(&self, earlier: &SplitCounters) -> SplitCounters {
        SplitCounters {
            dsp_wait_s: self.dsp_wait_s - earlier.dsp_wait_s,
            overlapped_s: self.overlapped_s - earlier.overlapped_s,
            cpu_projection_s: self.cpu_projection_s - earlier.cpu_projection_s,
            dsp_calls: self.dsp_calls - earlier.dsp_calls,
            cpu_calls: self.cpu_calls - earlier.cpu_calls,
            padded_rows: self.padded_rows - earlier.padded_rows,
        }
    }
}

impl SplitState {
    /// True once the run switched to the CPU path for good.
    pub fn fell_back(&self) -> bool {
        self.fell_back.load(Ordering::SeqCst)
    }

    /// Why it switched (first failure).
    pub fn fallback_reason(&self) -> Option<String> {
        self.reason.lock().expect("not poisoned").clone()
    }

    /// Turns overlap off (`true`) or on (the default).
    pub fn set_synchronous(&self, on: bool) {
        self.synchronous.store(on, Ordering::SeqCst);
    }

    /// Switches the run to the CPU path; logs only the first time.
    pub fn fall_back(&self, what: &str) {
        let mut reason = self.reason.lock().expect("not poisoned");
        if reason.is_none() {
            eprintln!("DSP service failed ({what}) after the client's restarts; the rest of this run uses the CPU path");
            *reason = Some(what.to_string());
        }
        self.fell_back.store(true, Ordering::SeqCst);
    }

    /// The counters now.
    pub fn counters(&self) -> SplitCounters {
        let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
        SplitCounters {
            dsp_wait_s: s(&self.dsp_wait_ns),
            overlapped_s: s(&self.overlapped_ns),
            cpu_projection_s: s(&self.cpu_ns),
            dsp_calls: self.dsp_calls.load(Ordering::Relaxed),
            cpu_calls: self.cpu_calls.load(Ordering::Relaxed),
            padded_rows: self.padded_rows.load(Ordering::Relaxed),
        }
    }
}

fn add_ns(counter: &AtomicU64, since: Instant) -> u64 {
    let ns = since.elapsed().as_nanos() as u64;
    counter.fetch_add(ns, Ordering::Relaxed);
    ns
}

/// A projection routed between the DSP and the CPU.
pub struct RoutedProjection {
    cpu: Arc<dyn Projection>,
    dsp: Option<Arc<dyn Projection>>,
    /// (direction, bucket) pairs the planner put on the DSP.
    on_dsp: HashSet<(Direction, usize)>,
    buckets: Arc<Buckets>,
    state: Arc<SplitState>,
}

impl RoutedProjection {
    /// Builds from the planner's routes for this projection. `dsp` is `None`
    /// when there is no DSP side (then every route must be off the DSP).
    pub fn new(cpu: Arc<dyn Projection>, dsp: Option<Arc<dyn Projection>>, routes: &[Route], buckets: Arc<Buckets>, state: Arc<SplitState>) -> Self {
        let on_dsp = [Direction::Forward, Direction::InputGrad]
            .into_iter()
            .flat_map(|d| routes.iter().filter(move |r| r.on_dsp && r.direction == direction_name(d)).map(move |r| (d, r.bucket)))
            .filter(|_| dsp.is_some())
            .collect();
        RoutedProjection { cpu, dsp, on_dsp, buckets, state }
    }

    /// The DSP side and bucket serving `tokens` rows in `dir`, if any.
    fn dsp_route(&self, dir: Direction, tokens: usize) -> Option<(&Arc<dyn Projection>, usize)> {
        if self.state.fell_back() {
            return None;
        }
        let bucket = self.buckets.pick(tokens)?;
        let dsp = self.dsp.as_ref()?;
        self.on_dsp.contains(&(dir, bucket)).then_some((dsp, bucket))
    }

    fn cpu_apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32], side: Option<&mut dyn FnMut() -> Result<()>>) -> Result<()> {
        if let Some(side) = side {
            side()?;
        }
        let t = Instant::now();
        let r = self.cpu.apply(dir, input, tokens, out);
        add_ns(&self.state.cpu_ns, t);
        self.state.cpu_calls.fetch_add(1, Ordering::Relaxed);
        r
    }
}

impl Projection for RoutedProjection {
    fn info(&self) -> &ProjectionInfo {
        self.cpu.info()
    }

    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        self.apply_overlapped(Product { dir, input, tokens, out }, &mut || Ok(()))
    }

    fn apply_overlapped(&self, p: Product<'_>, side: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        let Product { dir, input, tokens, out } = p;
        self.info().check_io(dir, input, tokens, out)?;
        let Some((dsp, bucket)) = self.dsp_route(dir, tokens) else {
            return self.cpu_apply(dir, input, tokens, out, Some(side));
        };
        let (w_in, w_out) = self.info().widths(dir);
        let padded_in;
        let x = if bucket == tokens {
            input
        } else {
            let mut p = vec![0f32; bucket * w_in];
            p[..input.len()].copy_from_slice(input);
            padded_in = p;
            &padded_in[..]
        };
        let mut y = vec![0f32; bucket * w_out];
        let synchronous = self.state.synchronous.load(Ordering::Relaxed);
        let (mut side_ran, mut side_failed, mut side_ns) = (false, false, 0u64);
        let mut timed_side = || -> Result<()> {
            side_ran = true;
            let t = Instant::now();
            let r = side();
            side_ns = t.elapsed().as_nanos() as u64;
            side_failed = r.is_err();
            r
        };
        let t = Instant::now();
        let result = if synchronous {
            timed_side().and_then(|()| dsp.apply(dir, x, bucket, &mut y))
        } else {
            dsp.apply_overlapped(Product { dir, input: x, tokens: bucket, out: &mut y }, &mut timed_side)
        };
        let wait = (t.elapsed().as_nanos() as u64).saturating_sub(side_ns);
        if !synchronous {
            self.state.overlapped_ns.fetch_add(side_ns, Ordering::Relaxed);
        }
        match result {
            // Bad input is the caller's problem on either path.
            Err(e @ (Error::Shape { .. } | Error::NonFinite(_))) => Err(e),
            Ok(()) => {
                self.state.dsp_wait_ns.fetch_add(wait, Ordering::Relaxed);
                self.state.dsp_calls.fetch_add(1, Ordering::Relaxed);
                self.state.padded_rows.fetch_add((bucket - tokens) as u64, Ordering::Relaxed);
                out.copy_from_slice(&y[..tokens * w_out]);
                Ok(())
            }
            // A failing side (LoRA branch) is not the DSP's fault.
            Err(e) if side_failed => Err(e),
            // The side work is CPU work that must run exactly once.
            Err(e) if side_ran => {
                self.state.fall_back(&format!("{} {}: {e}", self.info().name, direction_name(dir)));
                self.cpu_apply(dir, input, tokens, out, None)
            }
            Err(e) => {
                self.state.fall_back(&format!("{} {}: {e}", self.info().name, direction_name(dir)));
                self.cpu_apply(dir, input, tokens, out, Some(side))
            }
        }
    }
}
