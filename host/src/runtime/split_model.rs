//! The training graph with every frozen projection routed between the DSP
//! service and the CPU: weights made resident in the precision the policy
//! picks, each (projection, direction, bucket) probed at load, a
//! [`RoutedProjection`] in the graph.
//!
//! Probe tolerances per resident precision (max-normalised error against the
//! CPU f32 product of the checkpoint's weight, see [`super::planner`]):
//! - FP16: 4e-3. The weight and activations are rounded to f16 (relative
//!   2^-11 each) and accumulated in f32; measured worst 5.4e-4 on the tiny
//!   Llama fixture.
//! - Q8_0: 3e-2. Each weight moves by up to half a quantization step (1/254
//!   of its block's largest magnitude) on top of the f16 rounding; measured
//!   on SmolLM2-135M (Q4_1 checkpoint, 420 routes at 64 tokens): median
//!   5.5e-3, worst 1.85e-2.
//! A route above its tolerance is a kernel or data-path fault, not noise,
//! and stays on the CPU, as does a weight the service refuses (Q8_0
//! cannot hold an `in_features` that is not a multiple of 32). `hexlora
//! grad` routes through here too, with one bucket of its batch's size.
use super::plan_cache::{plan_with_cache, projection_key, PlanCache};
use super::planner::{cpu_only, Buckets, RouteTable};
use super::routed::{RoutedProjection, SplitState};
use crate::model::checkpoint::Checkpoint;
use crate::ops::cpu_projection::{CpuProjection, FrozenDtype, StoredProjection};
use crate::model::decoder::ProjectionFactory;
use crate::model::source::RawTensor;
use crate::npu::{NpuClient, Precision, PrecisionPolicy};
use crate::projection::{Projection, ProjectionInfo};
use crate::autograd::graph::TrainableModel;
use crate::{Error, Result};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// Probe tolerance for a resident precision (see the module docs).
pub fn tolerance(p: Precision) -> f32 {
    match p {
        Precision::Fp16 => 4e-3,
        Precision::Q8_0 => 3e-2,
    }
}

/// Where frozen products may go.
pub enum DspSide {
    /// Everything on the CPU (the f32 reference path).
    Cpu,
    /// The DSP service, weights resident per `policy`.
    Npu {
        /// The connected client.
        client: Arc<NpuClient>,
        /// Precision per projection kind.
        policy: PrecisionPolicy,
    },
}

/// A training graph whose projections are routed, with the planner's table.
pub struct SplitModel {
    /// The graph to train, of the checkpoint's architecture
    /// ([`crate::train::trainable_with`]).
    pub graph: Box<dyn TrainableModel>,
    /// Every planner decision.
    pub routes: RouteTable,
    /// Fallback switch and time counters shared by all routed projections.
    pub state: Arc<SplitState>,
    /// Seconds spent loading and probing.
    pub plan_seconds: f64,
}

/// What routing every projection of one model shares.
struct Routing<'a> {
    cpu_side: &'a ProjectionFactory<'a>,
    side: &'a DspSide,
    buckets: Arc<Buckets>,
    state: Arc<SplitState>,
    table: Mutex<RouteTable>,
    cache: &'a PlanCache,
}

/// One routed projection: the CPU side always (the fallback and the probe
/// reference), the DSP side when the client takes the weight.
fn route_one(info: ProjectionInfo, raw: &RawTensor<'_>, r: &Routing<'_>) -> Result<Arc<dyn Projection>> {
    let Routing { cpu_side, side, buckets, state, table, cache } = r;
    // A stop signal is honoured between projections (each is one load and
    // up to 2 x buckets probes): the planner of an uncached run on a slow
    // core takes minutes, and a phone kills a job that ignores SIGTERM.
    if let Some(signal) = crate::signals::requested() {
        return Err(Error::Stopped(signal));
    }
    let cpu = cpu_side(info.clone(), raw)?;
    let (dsp, routes) = match side {
        DspSide::Cpu => (None, cpu_only(&info.name, buckets, "cpu transport")),
        DspSide::Npu { client, policy } => {
            let precision = policy.for_kind(info.kind);
            match client.load_weight(info.clone(), raw, precision) {
                Ok(dsp) => {
                    let service = format!("{} {:?}", client.kind(), client.capabilities());
                    let key = projection_key(&service, &info, raw, precision, tolerance(precision), buckets);
                    let routes = plan_with_cache(cache, key, &*dsp, &*cpu, buckets, tolerance(precision));
                    (Some(dsp), routes)
                }
                Err(e) => (None, cpu_only(&info.name, buckets, &format!("load ({precision}): {e}"))),
            }
        }
    };
    let routed = RoutedProjection::new(cpu, dsp, &routes, buckets.clone(), state.clone());
    table.lock().expect("not poisoned").routes.extend(routes);
    Ok(Arc::new(routed))
}

/// Builds `ckpt`'s training graph with every per-layer projection routed.
/// `unfused` records each adapted product and its LoRA branch as two nodes
/// (Llama/Qwen3; the step-time table's baseline) instead of the fused node
/// that overlaps the branch with the DSP request. Routes validated by an
/// earlier run come from `cache` after a canary probe; the cache is saved
/// before returning.
pub fn load_split(ckpt: &Checkpoint, side: &DspSide, buckets: Arc<Buckets>, unfused: bool, cache: &PlanCache) -> Result<SplitModel> {
    // With a DSP the CPU side only computes the planner's references and the
    // rare fallback: the weight stays in the checkpoint's type there.
    let cpu_side = |info: ProjectionInfo, raw: &RawTensor<'_>| -> Result<Arc<dyn Projection>> {
        Ok(match side {
            DspSide::Cpu => Arc::new(CpuProjection::from_raw(info, raw)?),
            DspSide::Npu { .. } => Arc::new(StoredProjection::from_raw(info, raw)?),
        })
    };
    load_split_with(ckpt, side, buckets, unfused, cache, &cpu_side, FrozenDtype::F32)
}

/// [`load_split`] with the CPU side of every routed projection made by
/// `cpu_side` and the embeddings and head held in `tables`: `serve
/// --learn` passes the projections its answering model holds, so serving
/// and learning share one copy of the base weights, and bf16 tables (the
/// embedding stays in its checkpoint blocks, as `train` holds it).
pub fn load_split_with(ckpt: &Checkpoint, side: &DspSide, buckets: Arc<Buckets>, unfused: bool, cache: &PlanCache, cpu_side: &ProjectionFactory<'_>, tables: FrozenDtype) -> Result<SplitModel> {
    let start = Instant::now();
    let arch = crate::model::arch::of(&ckpt.config);
    if unfused && !arch.has_unfused_mode() {
        eprintln!("note: the {} graph has no unfused mode; --no-fuse is ignored", arch.name());
    }
    let routing = Routing { cpu_side, side, buckets, state: Arc::new(SplitState::default()), table: Mutex::new(RouteTable::default()), cache };
    let factory = |info: ProjectionInfo, raw: &RawTensor<'_>| route_one(info, raw, &routing);
    let graph = crate::train::trainable_with(ckpt, &factory, tables, unfused);
    // Saved even when stopped: a rerun reuses the routes probed so far.
    cache.save();
    let graph = graph?;
    let state = routing.state;
    let routes = routing.table.into_inner().expect("not poisoned");
    Ok(SplitModel { graph, routes, state, plan_seconds: start.elapsed().as_secs_f64() })
}

/// Resident bytes of `projections` under `policy`, `(f16, q8_0)`; a
/// projection Q8_0 cannot hold (`in % 32 != 0`) is left out (it runs on the
/// CPU).
pub fn resident_bytes(projections: &[ProjectionInfo], policy: &PrecisionPolicy) -> (u64, u64) {
    let (mut f16, mut q8) = (0u64, 0u64);
    for p in projections {
        let precision = policy.for_kind(p.kind);
        if let Some(b) = precision.weight_bytes(p.out_features, p.in_features) {
            match precision {
                Precision::Fp16 => f16 += b as u64,
                Precision::Q8_0 => q8 += b as u64,
            }
        }
    }
    (f16, q8)
}

/// The mission's resident-weights table (its 4.74 GB vs 7.14 GB) for this
/// model: the chosen policy against all-FP16, per precision.
pub fn resident_table(projections: &[ProjectionInfo], policy: &PrecisionPolicy) -> String {
    let mb = |b: u64| b as f64 / 1e6;
    let (f16, q8) = resident_bytes(projections, policy);
    let (all16, _) = resident_bytes(projections, &PrecisionPolicy::uniform(Precision::Fp16));
    let mut s = String::from("resident weights        FP16 MB    Q8_0 MB    total MB\n");
    s += &format!(
        "policy (attn {}, mlp {}, recurrent {})  {:>8.2}  {:>9.2}  {:>10.2}\n",
        policy.attention,
        policy.mlp,
        policy.recurrent,
        mb(f16),
        mb(q8),
        mb(f16 + q8)
    );
    s += &format!("all FP16                {:>8.2}  {:>9.2}  {:>10.2}\n", mb(all16), 0.0, mb(all16));
    s
}
