//! The planner's memory between runs: probing every (projection, direction,
//! bucket) of SmolLM2-135M costs minutes on a software DSP model, and the
//! answer only changes when the weight, the service or the probe settings
//! change.
//!
//! An entry is keyed by everything the probe result depends on: the service
//! (transport, capabilities, crate version), the projection (name, shape,
//! stored dtype, a hash of its bytes), the resident precision, the tolerance
//! and the buckets. The key alone does not prove the service still computes
//! what it computed last time (a rebuilt firmware keeps its capabilities), so
//! a hit is only taken after a live *canary* probe of the smallest bucket in
//! both directions reproduces the cached error bit for bit; the service is
//! deterministic, so any change to its numerics shows there. A miss or a
//! failed canary probes every route as before.
//!
//! The cache is an optimisation, never a reason to fail: an unreadable or
//! corrupt file, or a directory we cannot write, is reported on stderr and
//! the run goes on probing.
use super::planner::{direction_name, plan_projection, probe, Buckets, Route};
use crate::model::source::RawTensor;
use crate::npu::Precision;
use crate::projection::{Direction, Projection, ProjectionInfo};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// File name inside the cache directory.
pub const CACHE_FILE: &str = "plan-cache.json";

/// A route as stored (the live [`Route`] names its direction with a
/// `&'static str`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct StoredRoute {
    direction: String,
    bucket: usize,
    on_dsp: bool,
    error: Option<f32>,
    tolerance: f32,
    reason: String,
}

/// On-disk layout: key -> the projection's routes, in probe order.
#[derive(Default, Serialize, Deserialize)]
struct CacheFile {
    entries: BTreeMap<String, Vec<StoredRoute>>,
}

/// Routes remembered across runs, shared by the loader threads.
pub struct PlanCache {
    path: Option<PathBuf>,
    file: Mutex<CacheFile>,
    hits: Mutex<usize>,
}

impl PlanCache {
    /// No memory: every route is probed and nothing is written.
    pub fn disabled() -> Self {
        PlanCache { path: None, file: Mutex::new(CacheFile::default()), hits: Mutex::new(0) }
    }

    /// Opens `dir/plan-cache.json`; a missing file is an empty cache, an
    /// unreadable one is reported and replaced on [`PlanCache::save`].
    pub fn open(dir: &Path) -> Self {
        let path = dir.join(CACHE_FILE);
        let file = match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                eprintln!("warning: plan cache {} is unreadable ({e}); probing every route", path.display());
                CacheFile::default()
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => CacheFile::default(),
            Err(e) => {
                eprintln!("warning: cannot read plan cache {} ({e}); probing every route", path.display());
                CacheFile::default()
            }
        };
        PlanCache { path: Some(path), file: Mutex::new(file), hits: Mutex::new(0) }
    }

    /// Projections whose routes came from the cache in this run.
    pub fn hits(&self) -> usize {
        *self.hits.lock().expect("not poisoned")
    }

    /// The routes for `key` if cached and `canary` (a live probe of the
    /// smallest bucket, both directions, in probe order) reproduces them.
    pub fn lookup(&self, key: &str, canary: &[Route]) -> Option<Vec<Route>> {
        let file = self.file.lock().expect("not poisoned");
        let stored = file.entries.get(key)?;
        let routes: Vec<Route> = stored.iter().map(|s| to_route(s, &canary[0].projection)).collect::<Option<_>>()?;
        let same = canary.iter().all(|c| routes.iter().any(|r| r.direction == c.direction && r.bucket == c.bucket && same_outcome(r, c)));
        if !same {
            return None;
        }
        *self.hits.lock().expect("not poisoned") += 1;
        Some(routes)
    }

    /// Remembers `routes` under `key` (written by [`PlanCache::save`]).
    pub fn store(&self, key: String, routes: &[Route]) {
        let stored = routes.iter().map(from_route).collect();
        self.file.lock().expect("not poisoned").entries.insert(key, stored);
    }

    /// Writes the cache atomically; failures are reported, not returned.
    pub fn save(&self) {
        let Some(path) = &self.path else { return };
        let text = serde_json::to_vec(&*self.file.lock().expect("not poisoned")).expect("cache serialises");
        let dir = path.parent().unwrap_or(Path::new("."));
        let written = std::fs::create_dir_all(dir)
            .map_err(|e| crate::Error::io(dir, e))
            .and_then(|_| crate::base::atomic_write::write_atomic(path, &text));
        if let Err(e) = written {
            eprintln!("warning: cannot write plan cache {} ({e}); the next run probes again", path.display());
        }
    }
}

/// Same decision and bit-identical error: what a deterministic service gives
/// twice.
fn same_outcome(a: &Route, b: &Route) -> bool {
    a.on_dsp == b.on_dsp && a.error.map(f32::to_bits) == b.error.map(f32::to_bits) && a.reason == b.reason
}

fn from_route(r: &Route) -> StoredRoute {
    StoredRoute { direction: r.direction.to_string(), bucket: r.bucket, on_dsp: r.on_dsp, error: r.error, tolerance: r.tolerance, reason: r.reason.clone() }
}

fn to_route(s: &StoredRoute, projection: &str) -> Option<Route> {
    let direction = [Direction::Forward, Direction::InputGrad].into_iter().map(direction_name).find(|d| *d == s.direction)?;
    Some(Route { projection: projection.to_string(), direction, bucket: s.bucket, on_dsp: s.on_dsp, error: s.error, tolerance: s.tolerance, reason: s.reason.clone() })
}

/// Everything a projection's probe results depend on, hashed. `service`
/// names the transport and its capabilities.
pub fn projection_key(service: &str, info: &ProjectionInfo, raw: &RawTensor<'_>, precision: Precision, tolerance: f32, buckets: &Buckets) -> String {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (service, env!("CARGO_PKG_VERSION"), &info.name, info.in_features, info.out_features).hash(&mut h);
    (format!("{:?}", raw.dtype), &raw.shape, raw.bytes).hash(&mut h);
    (precision.to_string(), tolerance.to_bits(), buckets.as_slice()).hash(&mut h);
    format!("{}:{:016x}", info.name, h.finish())
}

/// Plans one projection: a live canary probe of the smallest bucket, then
/// the cached routes if it reproduces them, else every route probed (and
/// remembered).
pub fn plan_with_cache(cache: &PlanCache, key: String, dsp: &dyn Projection, cpu: &dyn Projection, buckets: &Buckets, tolerance: f32) -> Vec<Route> {
    let smallest = buckets.as_slice()[0];
    let canary: Vec<Route> = [Direction::Forward, Direction::InputGrad].into_iter().map(|d| probe(dsp, cpu, d, smallest, tolerance)).collect();
    if let Some(routes) = cache.lookup(&key, &canary) {
        return routes;
    }
    let routes = plan_projection(dsp, cpu, buckets, tolerance);
    cache.store(key, &routes);
    routes
}

/// `$XDG_CACHE_HOME/hexlora`, else `$HOME/.cache/hexlora`.
pub fn default_dir() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME").map(PathBuf::from).or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("hexlora"))
}
