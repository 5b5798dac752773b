//! The NPU client over every transport: products against an f64 reference
//! computed from the effective weight (FP16 rounding, or the Q8_0 blocks
//! through the shared dequantizer), bit-identical results across
//! transports, clear errors, and recovery from a killed or hung simulator
//! service.
//!
//! The simulator tests need the Hexagon service ELF (`HEXLORA_SIM_SERVICE`,
//! built by ci/sim-test.sh) and qemu-hexagon: without them the test skips,
//! and fails under CI (`CI` set).
use hexlora::model::source::{DType, RawTensor};
use hexlora::npu::{NpuClient, NpuOptions, Precision, TransportKind};
use hexlora::projection::{Direction, Product, ProjectionInfo, ProjectionKind};
use hexlora::Error;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::support;

const OUT: usize = 48;
const IN: usize = 64;
const TOKENS: usize = 5;

fn weight() -> Vec<f32> {
    (0..OUT * IN).map(|i| (((i * 7919) % 211) as f32 - 105.0) / 97.0).collect()
}

fn input(width: usize, salt: usize) -> Vec<f32> {
    (0..TOKENS * width).map(|i| (((i * 31 + salt) % 61) as f32 - 30.0) / 13.0).collect()
}

fn raw(w: &[f32]) -> RawTensor<'_> {
    RawTensor { name: "layers.0.mlp.up_proj.weight".into(), dtype: DType::F32, shape: vec![OUT, IN], bytes: bytemuck_bytes(w) }
}

fn bytemuck_bytes(w: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding; the slice covers exactly w's memory.
    unsafe { std::slice::from_raw_parts(w.as_ptr().cast(), std::mem::size_of_val(w)) }
}

fn info() -> ProjectionInfo {
    ProjectionInfo { name: "layers.0.mlp.up_proj".into(), kind: ProjectionKind::Mlp, out_features: OUT, in_features: IN }
}

/// The weight the NPU multiplies, built here from the f32 weight.
fn effective(w: &[f32], p: Precision) -> Vec<f64> {
    use hexlora_proto::q8_0::{dequantize_block, quantize_row, BlockQ8_0, QK8_0};
    match p {
        Precision::Fp16 => w.iter().map(|&v| half::f16::from_f32(v).to_f64()).collect(),
        Precision::Q8_0 => w
            .chunks_exact(IN)
            .flat_map(|row| {
                let mut blocks = vec![BlockQ8_0 { d: half::f16::ZERO, qs: [0; QK8_0] }; IN / QK8_0];
                quantize_row(row, &mut blocks).unwrap();
                blocks.into_iter().flat_map(|b| {
                    let mut out = [half::f16::ZERO; QK8_0];
                    dequantize_block(&b, &mut out);
                    out.map(|v| v.to_f64())
                })
            })
            .collect(),
    }
}

/// Checks `y` against f64 with the bound of one f16 rounding of each
/// activation: |err| <= 2^-10 * sum |x w| (plus the f32 accumulation).
fn check_against_f64(w: &[f64], dir: Direction, x: &[f32], y: &[f32]) {
    check_shape_against_f64(w, (OUT, IN), dir, x, y)
}

fn check_shape_against_f64(w: &[f64], (out, inn): (usize, usize), dir: Direction, x: &[f32], y: &[f32]) {
    let (n_in, n_out) = match dir {
        Direction::Forward => (inn, out),
        Direction::InputGrad => (out, inn),
    };
    let tokens = x.len() / n_in;
    for t in 0..tokens {
        for j in 0..n_out {
            let terms: Vec<f64> = (0..n_in)
                .map(|i| {
                    let wv = match dir {
                        Direction::Forward => w[j * inn + i],
                        Direction::InputGrad => w[i * inn + j],
                    };
                    x[t * n_in + i] as f64 * wv
                })
                .collect();
            let want: f64 = terms.iter().sum();
            let bound = terms.iter().map(|v| v.abs()).sum::<f64>() * 2f64.powi(-10) + 1e-6;
            let got = y[t * n_out + j] as f64;
            assert!((got - want).abs() <= bound, "{dir:?} [{t}][{j}]: {got} vs f64 {want} (bound {bound})");
        }
    }
}

fn options() -> NpuOptions {
    NpuOptions { weight_bytes: 1 << 20, activation_bytes: 1 << 20, ..NpuOptions::default() }
}

/// The Hexagon service ELF, or None (skipped; a failure under CI, where
/// ci/test.sh sets it and toolchain/install.sh installs qemu-hexagon).
fn sim_service() -> Option<PathBuf> {
    let missing = |why: String| {
        support::skip(&format!("{why} (ci/test.sh builds the service with ci/sim-test.sh and sets HEXLORA_SIM_SERVICE)"));
        None
    };
    let Some(path) = std::env::var_os("HEXLORA_SIM_SERVICE").map(PathBuf::from) else {
        return missing("HEXLORA_SIM_SERVICE is not set".into());
    };
    if !path.is_file() {
        return missing(format!("HEXLORA_SIM_SERVICE={} does not exist", path.display()));
    }
    if std::process::Command::new("qemu-hexagon").arg("-version").output().is_err() {
        return missing("qemu-hexagon is not installed".into());
    }
    Some(path)
}

/// Outputs of forward and input-gradient for both precisions.
fn run_all(client: &Arc<NpuClient>) -> Vec<Vec<f32>> {
    let w = weight();
    let mut outs = Vec::new();
    for p in [Precision::Fp16, Precision::Q8_0] {
        let proj = client.load_weight(info(), &raw(&w), p).unwrap();
        let eff = effective(&w, p);
        for (dir, n_in, n_out) in [(Direction::Forward, IN, OUT), (Direction::InputGrad, OUT, IN)] {
            let x = input(n_in, n_out);
            let mut y = vec![0.0; TOKENS * n_out];
            proj.apply(dir, &x, TOKENS, &mut y).unwrap();
            check_against_f64(&eff, dir, &x, &y);
            outs.push(y);
        }
    }
    outs
}

#[test]
fn in_process_and_shared_memory_match_f64_and_each_other_bit_for_bit() {
    let a = run_all(&NpuClient::connect(TransportKind::InProcess, &options()).unwrap());
    let b = run_all(&NpuClient::connect(TransportKind::SharedMemory, &options()).unwrap());
    assert!(a.iter().zip(&b).all(|(x, y)| x.iter().map(|v| v.to_bits()).eq(y.iter().map(|v| v.to_bits()))));
}

#[test]
fn simulator_matches_f64_and_the_native_firmware_bit_for_bit() {
    let Some(service) = sim_service() else { return };
    let native = run_all(&NpuClient::connect(TransportKind::InProcess, &options()).unwrap());
    let sim = run_all(&NpuClient::connect(TransportKind::Simulator, &NpuOptions { sim_service: Some(service), ..options() }).unwrap());
    for (n, s) in native.iter().zip(&sim) {
        assert!(n.iter().map(|v| v.to_bits()).eq(s.iter().map(|v| v.to_bits())), "native and Hexagon firmware differ");
    }
}

#[test]
fn resident_bytes_counters_and_overlapped_side_work() {
    let client = NpuClient::connect(TransportKind::SharedMemory, &options()).unwrap();
    let w = weight();
    let p16 = client.load_weight(info(), &raw(&w), Precision::Fp16).unwrap();
    let _p8 = client.load_weight(info(), &raw(&w), Precision::Q8_0).unwrap();
    let r = client.resident_bytes();
    assert_eq!((r.f16, r.q8_0), ((OUT * IN * 2) as u64, (OUT * IN / 32 * 34) as u64));
    let x = input(IN, 1);
    let (mut y1, mut y2) = (vec![0.0; TOKENS * OUT], vec![0.0; TOKENS * OUT]);
    p16.apply(Direction::Forward, &x, TOKENS, &mut y1).unwrap();
    let mut ran = 0;
    p16.apply_overlapped(Product { dir: Direction::Forward, input: &x, tokens: TOKENS, out: &mut y2 }, &mut || {
        ran += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(ran, 1);
    assert_eq!(y1, y2);
    let s = client.stats();
    // capabilities + 2 loads + 2 ops
    assert_eq!((s.requests, s.restarts), (5, 0));
    assert!(s.in_flight > Duration::ZERO);
}

#[test]
fn bad_inputs_get_clear_errors() {
    let client = NpuClient::connect(TransportKind::InProcess, &options()).unwrap();
    let w = weight();
    let p = client.load_weight(info(), &raw(&w), Precision::Fp16).unwrap();
    let mut x = input(IN, 0);
    x[IN + 3] = f32::NAN;
    let mut y = vec![0.0; TOKENS * OUT];
    let e = p.apply(Direction::Forward, &x, TOKENS, &mut y).unwrap_err();
    assert!(matches!(&e, Error::NonFinite(m) if m.contains("token 1")), "{e}");
    let e = p.apply(Direction::Forward, &x[..IN], TOKENS, &mut y).unwrap_err();
    assert!(matches!(e, Error::Shape { .. }), "{e}");
    // Q8_0 needs in_features divisible by 32.
    let odd: Vec<f32> = (0..OUT * 40).map(|i| i as f32 / 1000.0).collect();
    let odd_raw = RawTensor { name: "odd.weight".into(), dtype: DType::F32, shape: vec![OUT, 40], bytes: bytemuck_bytes(&odd) };
    let odd_info = ProjectionInfo { in_features: 40, ..info() };
    let e = client.load_weight(odd_info, &odd_raw, Precision::Q8_0).err().unwrap();
    assert!(matches!(&e, Error::NpuNoSupport(m) if m.contains("divisible by 32")), "{e}");
    // Activations beyond the shared input buffer are refused, not truncated.
    let small = NpuClient::connect(TransportKind::InProcess, &NpuOptions { activation_bytes: 4096, ..options() }).unwrap();
    let p = small.load_weight(info(), &raw(&w), Precision::Fp16).unwrap();
    let big = vec![0.5; 100 * IN];
    let e = p.apply(Direction::Forward, &big, 100, &mut vec![0.0; 100 * OUT]).unwrap_err();
    assert!(e.to_string().contains("activation") || e.to_string().contains("buffer"), "{e}");
}

fn sim_options(service: PathBuf) -> NpuOptions {
    NpuOptions { sim_service: Some(service), timeout: Duration::from_secs(3), max_restarts: 2, ..options() }
}

fn kill(pid: u32, signal: &str) {
    let ok = std::process::Command::new("kill").args([signal, &pid.to_string()]).status().unwrap().success();
    assert!(ok, "kill {signal} {pid}");
}

/// Killing the qemu child mid-run: the client restarts it, reloads the
/// weights and retries; every result stays bit-identical.
#[test]
fn simulator_service_killed_mid_run_is_restarted_and_results_unchanged() {
    let Some(service) = sim_service() else { return };
    let client = NpuClient::connect(TransportKind::Simulator, &sim_options(service)).unwrap();
    let w = weight();
    let p = client.load_weight(info(), &raw(&w), Precision::Q8_0).unwrap();
    let x = input(IN, 3);
    let mut want = vec![0.0; TOKENS * OUT];
    p.apply(Direction::Forward, &x, TOKENS, &mut want).unwrap();
    let first = client.service_pid().unwrap();
    let killer = {
        let client = Arc::clone(&client);
        std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            kill(client.service_pid().unwrap_or(first), "-KILL");
        })
    };
    let mut y = vec![0.0; TOKENS * OUT];
    let started = std::time::Instant::now();
    while client.stats().restarts == 0 && started.elapsed() < Duration::from_secs(60) {
        p.apply(Direction::Forward, &x, TOKENS, &mut y).unwrap();
        assert_eq!(y, want);
    }
    killer.join().unwrap();
    p.apply(Direction::Forward, &x, TOKENS, &mut y).unwrap();
    assert_eq!(y, want);
    assert_eq!(client.stats().restarts, 1);
    assert_ne!(client.service_pid(), Some(first));
}

/// A hung service (SIGSTOP) is caught by the timeout and replaced.
#[test]
fn simulator_service_hung_is_detected_by_timeout() {
    let Some(service) = sim_service() else { return };
    let client = NpuClient::connect(TransportKind::Simulator, &sim_options(service)).unwrap();
    let w = weight();
    let p = client.load_weight(info(), &raw(&w), Precision::Fp16).unwrap();
    let x = input(OUT, 4);
    let mut want = vec![0.0; TOKENS * IN];
    p.apply(Direction::InputGrad, &x, TOKENS, &mut want).unwrap();
    let pid = client.service_pid().unwrap();
    kill(pid, "-STOP");
    let started = std::time::Instant::now();
    let mut y = vec![0.0; TOKENS * IN];
    p.apply(Direction::InputGrad, &x, TOKENS, &mut y).unwrap();
    assert!(started.elapsed() >= Duration::from_secs(3), "answered before the timeout: was the service really stopped?");
    assert_eq!(y, want);
    assert_eq!(client.stats().restarts, 1);
}

/// When every restart fails, the error says so (callers fall back to the
/// CPU).
#[test]
fn simulator_that_cannot_restart_gives_a_clear_error() {
    let Some(service) = sim_service() else { return };
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("sim_service");
    std::fs::copy(&service, &copy).unwrap();
    let client = NpuClient::connect(TransportKind::Simulator, &sim_options(copy.clone())).unwrap();
    let p = client.load_weight(info(), &raw(&weight()), Precision::Fp16).unwrap();
    std::fs::remove_file(&copy).unwrap();
    kill(client.service_pid().unwrap(), "-KILL");
    let x = input(IN, 0);
    let e = p.apply(Direction::Forward, &x, TOKENS, &mut vec![0.0; TOKENS * OUT]).unwrap_err();
    assert!(matches!(e, Error::NpuFailed { restarts: 2, .. }), "{e}");
    assert!(e.to_string().contains("CPU"), "{e}");
}

/// Every projection shape of the tiny fixtures (rows or columns below or
/// not a multiple of the 32-wide tile), both directions, FP16, 37 tokens.
#[test]
fn fixture_shapes_match_f64_in_both_directions() {
    let client = NpuClient::connect(TransportKind::InProcess, &options()).unwrap();
    for (out, inn) in [(4, 48), (64, 48), (32, 48), (48, 32), (80, 48), (48, 80), (96, 64), (64, 96), (24, 64)] {
        let w: Vec<f32> = (0..out * inn).map(|i| (((i * 7919) % 211) as f32 - 105.0) / 970.0).collect();
        let raw = RawTensor { name: "w".into(), dtype: DType::F32, shape: vec![out, inn], bytes: bytemuck_bytes(&w) };
        let info = ProjectionInfo { name: format!("w{out}x{inn}"), kind: ProjectionKind::Attention, out_features: out, in_features: inn };
        let p = client.load_weight(info, &raw, Precision::Fp16).unwrap();
        let eff: Vec<f64> = w.iter().map(|&v| half::f16::from_f32(v).to_f64()).collect();
        let tokens = 37;
        for (dir, n_in, n_out) in [(Direction::Forward, inn, out), (Direction::InputGrad, out, inn)] {
            let x: Vec<f32> = (0..tokens * n_in).map(|i| (((i * 31 + n_out) % 61) as f32 - 30.0) / 13.0).collect();
            let mut y = vec![0.0; tokens * n_out];
            p.apply(dir, &x, tokens, &mut y).unwrap();
            check_shape_against_f64(&eff, (out, inn), dir, &x, &y);
        }
    }
}
