//! The start-up planner and the routed projection, with real projections on
//! both sides: the CPU f32 reference, the same weight after Q8_0 rounding
//! (the effective weight the DSP's Q8 kernels multiply), and a weight loaded
//! with the wrong layout (transposed), which must fail every probe.
use hexlora::ops::cpu_projection::CpuProjection;
use hexlora::projection::{Direction, Product, Projection, ProjectionInfo, ProjectionKind};
use hexlora::runtime::planner::{cpu_only, max_normalised_error, plan_projection, Buckets, RouteTable};
use hexlora::runtime::routed::{RoutedProjection, SplitState};
use hexlora::{Error, Result};
use hexlora_proto::q8_0::{dequantize_block_f32, quantize_row, BlockQ8_0, QK8_0};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

const OUT: usize = 48;
const IN: usize = 64;

fn info() -> ProjectionInfo {
    ProjectionInfo { name: "model.layers.0.mlp.up_proj".into(), kind: ProjectionKind::Mlp, out_features: OUT, in_features: IN }
}

/// `[OUT, IN]`, values spread over a few orders of magnitude.
fn weight() -> Vec<f32> {
    (0..OUT * IN).map(|i| ((i * 7919 % 1000) as f32 / 500.0 - 1.0) * (1.0 + (i % 13) as f32)).collect()
}

fn q8_rounded(w: &[f32]) -> Vec<f32> {
    let mut out = Vec::with_capacity(w.len());
    for row in w.chunks(IN) {
        let mut blocks = vec![BlockQ8_0 { d: half::f16::ZERO, qs: [0; QK8_0] }; IN / QK8_0];
        quantize_row(row, &mut blocks).unwrap();
        for b in &blocks {
            let mut v = [0f32; QK8_0];
            dequantize_block_f32(b, &mut v);
            out.extend(v);
        }
    }
    out
}

fn transposed(w: &[f32]) -> Vec<f32> {
    (0..OUT * IN).map(|k| w[(k % OUT) * IN + k / OUT]).collect()
}

fn cpu() -> Arc<dyn Projection> {
    Arc::new(CpuProjection::new(info(), weight()).unwrap())
}

fn input(tokens: usize, width: usize) -> Vec<f32> {
    (0..tokens * width).map(|i| ((i * 31 % 97) as f32 - 48.0) / 48.0).collect()
}

#[test]
fn buckets_pad_up_and_reject_nonsense() {
    let b = Buckets::powers_of_two(32, 512).unwrap();
    assert_eq!(b.as_slice(), &[32, 64, 128, 256, 512]);
    assert_eq!((b.pick(1), b.pick(32), b.pick(33), b.pick(512), b.pick(513)), (Some(32), Some(32), Some(64), Some(512), None));
    assert!(Buckets::powers_of_two(48, 512).is_err());
    assert_eq!(Buckets::parse("64, 16,64").unwrap().as_slice(), &[16, 64]);
    assert!(Buckets::parse("16,x").unwrap_err().to_string().contains("\"x\""));
    assert!(Buckets::parse("0").is_err());
}

#[test]
fn q8_weight_passes_at_q8_tolerance_and_fails_at_f32_tolerance() {
    let q8: Arc<dyn Projection> = Arc::new(CpuProjection::new(info(), q8_rounded(&weight())).unwrap());
    let buckets = Buckets::parse("1,8,32").unwrap();
    let loose = plan_projection(&*q8, &*cpu(), &buckets, 2e-2);
    assert_eq!(loose.len(), 6);
    for r in &loose {
        assert!(r.on_dsp, "{r:?}");
        let e = r.error.unwrap();
        // Q8_0 rounding is real: the error is small but not zero.
        assert!(e > 1e-5 && e < 2e-2, "{r:?}");
    }
    let strict = plan_projection(&*q8, &*cpu(), &buckets, 1e-6);
    assert!(strict.iter().all(|r| !r.on_dsp && r.reason.contains("above tolerance")), "{strict:?}");
    let table = RouteTable { routes: loose.into_iter().chain(strict).collect() };
    assert_eq!(table.summary(), "6 of 12 routes on the DSP");
}

#[test]
fn wrong_layout_weight_fails_every_probe_and_runs_on_the_cpu() {
    let wrong: Arc<dyn Projection> = Arc::new(CpuProjection::new(info(), transposed(&weight())).unwrap());
    let buckets = Arc::new(Buckets::parse("8,32").unwrap());
    let routes = plan_projection(&*wrong, &*cpu(), &buckets, 2e-2);
    assert!(routes.iter().all(|r| !r.on_dsp && r.error.unwrap() > 0.1), "{routes:?}");
    let state = Arc::new(SplitState::default());
    let routed = RoutedProjection::new(cpu(), Some(wrong), &routes, buckets, state.clone());
    for (dir, w_in, w_out) in [(Direction::Forward, IN, OUT), (Direction::InputGrad, OUT, IN)] {
        let x = input(5, w_in);
        let (mut got, mut want) = (vec![0f32; 5 * w_out], vec![0f32; 5 * w_out]);
        routed.apply(dir, &x, 5, &mut got).unwrap();
        cpu().apply(dir, &x, 5, &mut want).unwrap();
        assert_eq!(got, want);
    }
    let c = state.counters();
    assert_eq!((c.dsp_calls, c.cpu_calls), (0, 2));
}

#[test]
fn dsp_routes_pad_to_the_bucket_and_run_side_work_once() {
    let q8: Arc<dyn Projection> = Arc::new(CpuProjection::new(info(), q8_rounded(&weight())).unwrap());
    let buckets = Arc::new(Buckets::parse("8,32").unwrap());
    let mut routes = plan_projection(&*q8, &*cpu(), &buckets, 2e-2);
    // Take the forward bucket 32 off the DSP: 20 tokens then go to the CPU.
    routes.iter_mut().filter(|r| r.direction == "forward" && r.bucket == 32).for_each(|r| r.on_dsp = false);
    let state = Arc::new(SplitState::default());
    let routed = RoutedProjection::new(cpu(), Some(q8.clone()), &routes, buckets, state.clone());
    let x = input(5, IN);
    let (mut got, mut want) = (vec![0f32; 5 * OUT], vec![0f32; 5 * OUT]);
    let mut sides = 0;
    routed.apply_overlapped(Product { dir: Direction::Forward, input: &x, tokens: 5, out: &mut got }, &mut || { sides += 1; Ok(()) }).unwrap();
    q8.apply(Direction::Forward, &x, 5, &mut want).unwrap();
    assert!(max_normalised_error(&got, &want) < 1e-6);
    assert_eq!(sides, 1);
    let c = state.counters();
    assert_eq!((c.dsp_calls, c.cpu_calls, c.padded_rows), (1, 0, 3));
    let x = input(20, IN);
    let mut got = vec![0f32; 20 * OUT];
    routed.apply(Direction::Forward, &x, 20, &mut got).unwrap();
    routed.apply(Direction::InputGrad, &input(20, OUT), 20, &mut vec![0f32; 20 * IN]).unwrap();
    routed.apply(Direction::Forward, &input(40, IN), 40, &mut vec![0f32; 40 * OUT]).unwrap(); // above every bucket
    let c = state.counters();
    assert_eq!((c.dsp_calls, c.cpu_calls, c.padded_rows), (2, 2, 15));
    // Bad shapes are the caller's error, not a DSP failure.
    assert!(matches!(routed.apply(Direction::Forward, &x, 19, &mut got), Err(Error::Shape { .. })));
    assert!(!state.fell_back());
}

#[test]
fn cpu_only_routes_never_touch_a_dsp_side() {
    let buckets = Arc::new(Buckets::parse("8").unwrap());
    let routes = cpu_only("p", &buckets, "cpu transport");
    assert_eq!(routes.len(), 2);
    let state = Arc::new(SplitState::default());
    let routed = RoutedProjection::new(cpu(), None, &routes, buckets, state.clone());
    routed.apply(Direction::Forward, &input(3, IN), 3, &mut vec![0f32; 3 * OUT]).unwrap();
    assert_eq!(state.counters().cpu_calls, 1);
}

/// Fault injection: the Q8 projection, failing from call `fail_from` on, as
/// the NPU client does once it has given up restarting its service.
struct GivesUp {
    inner: Arc<dyn Projection>,
    calls: AtomicUsize,
    fail_from: usize,
}

impl Projection for GivesUp {
    fn info(&self) -> &ProjectionInfo {
        self.inner.info()
    }
    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        if self.calls.fetch_add(1, Ordering::SeqCst) >= self.fail_from {
            return Err(Error::Npu("service did not answer after 3 restarts".into()));
        }
        self.inner.apply(dir, input, tokens, out)
    }
}

#[test]
fn a_dsp_that_gives_up_at_run_time_switches_the_run_to_the_cpu() {
    let q8: Arc<dyn Projection> = Arc::new(CpuProjection::new(info(), q8_rounded(&weight())).unwrap());
    let failing = Arc::new(GivesUp { inner: q8, calls: AtomicUsize::new(0), fail_from: 10 });
    let buckets = Arc::new(Buckets::parse("8").unwrap());
    let routes = plan_projection(&*failing, &*cpu(), &buckets, 2e-2); // 2 probe calls
    assert!(routes.iter().all(|r| r.on_dsp));
    let state = Arc::new(SplitState::default());
    let routed = RoutedProjection::new(cpu(), Some(failing.clone() as Arc<dyn Projection>), &routes, buckets, state.clone());
    let x = input(4, IN);
    let mut want = vec![0f32; 4 * OUT];
    cpu().apply(Direction::Forward, &x, 4, &mut want).unwrap();
    let mut sides = 0;
    for call in 0..12 {
        let mut got = vec![0f32; 4 * OUT];
        routed.apply_overlapped(Product { dir: Direction::Forward, input: &x, tokens: 4, out: &mut got }, &mut || { sides += 1; Ok(()) }).unwrap();
        if call >= 8 {
            assert_eq!(got, want, "after the failure the CPU path answers");
        }
    }
    assert_eq!(sides, 12, "the side work runs once per call, failure or not");
    assert!(state.fell_back());
    assert!(state.fallback_reason().unwrap().contains("after 3 restarts"));
    assert_eq!(failing.calls.load(Ordering::SeqCst), 11, "no DSP request after the switch");
    let c = state.counters();
    assert_eq!((c.dsp_calls, c.cpu_calls), (8, 4));
}
