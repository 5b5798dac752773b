//! Timing for the ignored micro-benchmarks (`--ignored --nocapture`): one
//! warm-up call, then the best of `reps` wall-clock runs, since on a shared
//! machine the minimum is the figure least disturbed by other work.
use std::time::Instant;

/// Best wall time of `f` over `reps` runs after one warm-up, in ms.
pub fn best_ms(reps: usize, mut f: impl FnMut()) -> f64 {
    f();
    (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64() * 1e3
        })
        .fold(f64::INFINITY, f64::min)
}
