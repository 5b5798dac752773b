//! Wall time per node kind and direction, for the training benchmark's
//! per-node table. Off (one relaxed atomic load per node) unless enabled.
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::Instant;

static ENABLED: AtomicBool = AtomicBool::new(false);
static TABLE: Mutex<BTreeMap<&'static str, [f64; 3]>> = Mutex::new(BTreeMap::new());

/// Starts collecting.
pub fn enable() {
    ENABLED.store(true, Ordering::Relaxed);
}

/// Measures from creation to drop; `forward` picks the column.
pub struct Timer {
    kind: &'static str,
    forward: bool,
    start: Option<Instant>,
}

/// A timer for `kind` (no-op when profiling is off).
pub fn timer(kind: &'static str, forward: bool) -> Timer {
    Timer { kind, forward, start: ENABLED.load(Ordering::Relaxed).then(Instant::now) }
}

impl Drop for Timer {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            let secs = start.elapsed().as_secs_f64();
            let mut t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
            let row = t.entry(self.kind).or_default();
            row[if self.forward { 0 } else { 1 }] += secs;
            row[2] += if self.forward { 1.0 } else { 0.0 };
        }
    }
}

/// The table: kind, forward s, backward s, share of the total, calls.
pub fn table() -> String {
    let t = TABLE.lock().unwrap_or_else(|e| e.into_inner());
    let total: f64 = t.values().map(|r| r[0] + r[1]).sum::<f64>().max(1e-12);
    let mut s = format!("{:<12} {:>10} {:>10} {:>7} {:>8}\n", "node", "fwd s", "bwd s", "share", "calls");
    let mut rows: Vec<_> = t.iter().collect();
    rows.sort_by(|a, b| (b.1[0] + b.1[1]).total_cmp(&(a.1[0] + a.1[1])));
    for (k, r) in rows {
        s += &format!("{k:<12} {:>10.3} {:>10.3} {:>6.1}% {:>8}\n", r[0], r[1], 100.0 * (r[0] + r[1]) / total, r[2]);
    }
    s
}
