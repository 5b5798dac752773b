//! Kernel self-tests: run natively (`cargo test`) and under qemu-hexagon
//! (ci/sim-test.sh). Every kernel is checked against the f64 reference of
//! [`testbed::reference`]; shapes are kept small because qemu is slow.
use super::testbed::{digest, first_violation, fp16_weight, q8_weight, reference, Bench, Rng};
use super::plan::VTCM_BUFFERS;
use super::{Direction, KernelError, Plan, ResidentWeight, WeightData};
use crate::tile::hvx_float::HvxFloatTiles;
use crate::tile::hvx_model::Model;
use crate::tile::{DeviceTiles, TileEngine};
use crate::vtcm::VTCM_ALIGN;
use crate::selftest::{TestFailure, TestResult};
use crate::{check, check_eq};
use alloc::vec;
use alloc::vec::Vec;
use half::f16;
use hexlora_proto::q8_0::{self, QK8_0};

/// VTCM for the tests: small enough for the simulator heap.
const TEST_VTCM: usize = 1 << 20;

/// Runs `dir` on random input and checks every element against the bound.
fn check_against_reference(w: &ResidentWeight<'_>, dir: Direction, tokens: usize, seed: u64) -> TestResult {
    check_against_reference_on(&mut Bench::new(TEST_VTCM), w, dir, tokens, seed)
}

/// [`check_against_reference`] on a given bench (tile engine).
fn check_against_reference_on<T: TileEngine>(
    bench: &mut Bench<T>,
    w: &ResidentWeight<'_>,
    dir: Direction,
    tokens: usize,
    seed: u64,
) -> TestResult {
    let d = if dir == Direction::Forward { w.cols() } else { w.rows() };
    let input = Rng(seed).vec(tokens * d, 3.0);
    let (got, stats) = bench.run(w, dir, tokens, &input).map_err(fail)?;
    let (y, bound) = reference(w, dir, tokens, &input);
    check!(first_violation(&got, &y, &bound).is_none(), "{:?}", first_violation(&got, &y, &bound));
    check_eq!(stats.rows_retried, 0);
    check_eq!(stats.rows_failed, 0);
    Ok(())
}

fn fail(e: KernelError) -> crate::selftest::TestFailure {
    crate::selftest::TestFailure::new(file!(), line!(), format_args!("kernel error {e:?}"))
}

/// 45 tokens x (70 in, 50 out): no dimension a multiple of 32 (padding).
fn fp16_forward_matches_f64_reference_with_padding() -> TestResult {
    let w16 = fp16_weight(&mut Rng(1), 50, 70, 0.5);
    let w = ResidentWeight::fp16(&w16, 50, 70).map_err(fail)?;
    check_against_reference(&w, Direction::Forward, 45, 2)
}

fn fp16_input_grad_matches_f64_reference_with_padding() -> TestResult {
    let w16 = fp16_weight(&mut Rng(3), 50, 70, 0.5);
    let w = ResidentWeight::fp16(&w16, 50, 70).map_err(fail)?;
    check_against_reference(&w, Direction::InputGrad, 45, 4)
}

/// Q8_0 needs cols % 32 == 0; rows (50) and tokens (45) still pad.
fn q8_forward_matches_f64_reference_with_padding() -> TestResult {
    let wq = q8_weight(&mut Rng(5), 50, 96, 0.5);
    let w = ResidentWeight::q8_0(&wq, 50, 96).map_err(fail)?;
    check_against_reference(&w, Direction::Forward, 45, 6)
}

fn q8_input_grad_matches_f64_reference_with_padding() -> TestResult {
    let wq = q8_weight(&mut Rng(7), 50, 96, 0.5);
    let w = ResidentWeight::q8_0(&wq, 50, 96).map_err(fail)?;
    check_against_reference(&w, Direction::InputGrad, 45, 8)
}

/// Identity input makes each kernel print its effective weight exactly
/// (a single non-zero product, exact in f32): forward gives `W^T`, the
/// input-gradient gives `W`. Both must equal the shared dequantizer's output
/// bit for bit.
fn q8_forward_and_input_grad_see_bit_identical_weights() -> TestResult {
    let (rows, cols) = (40, 64);
    let wq = q8_weight(&mut Rng(9), rows, cols, 2.0);
    let w = ResidentWeight::q8_0(&wq, rows, cols).map_err(fail)?;
    let mut bench = Bench::new(TEST_VTCM);
    let eye = |n: usize| -> Vec<f32> { (0..n * n).map(|i| (i / n == i % n) as u8 as f32).collect() };
    let (fwd, _) = bench.run(&w, Direction::Forward, cols, &eye(cols)).map_err(fail)?;
    let (bwd, _) = bench.run(&w, Direction::InputGrad, rows, &eye(rows)).map_err(fail)?;
    for n in 0..rows {
        for b in 0..cols / QK8_0 {
            let mut v = [f16::ZERO; QK8_0];
            q8_0::dequantize_block(&q8_0::block_at(&wq, n * cols / QK8_0 + b), &mut v);
            for (j, x) in v.iter().enumerate() {
                let k = b * QK8_0 + j;
                check_eq!(fwd[k * rows + n].to_bits(), x.to_f32().to_bits());
                check_eq!(bwd[n * cols + k].to_bits(), x.to_f32().to_bits());
            }
        }
    }
    Ok(())
}

/// Same for FP16: forward and input-gradient reproduce W exactly.
fn fp16_identity_reproduces_w_in_both_directions() -> TestResult {
    let (rows, cols) = (33, 40);
    let w16 = fp16_weight(&mut Rng(10), rows, cols, 4.0);
    let w = ResidentWeight::fp16(&w16, rows, cols).map_err(fail)?;
    let mut bench = Bench::new(TEST_VTCM);
    let eye = |n: usize| -> Vec<f32> { (0..n * n).map(|i| (i / n == i % n) as u8 as f32).collect() };
    let (fwd, _) = bench.run(&w, Direction::Forward, cols, &eye(cols)).map_err(fail)?;
    let (bwd, _) = bench.run(&w, Direction::InputGrad, rows, &eye(rows)).map_err(fail)?;
    for n in 0..rows {
        for k in 0..cols {
            check_eq!(fwd[k * rows + n], w16[n * cols + k].to_f32());
            check_eq!(bwd[n * cols + k], w16[n * cols + k].to_f32());
        }
    }
    Ok(())
}

/// Shapes the kernels refuse, each with its own error, before touching data.
fn unsupported_shapes_are_refused() -> TestResult {
    let w16 = vec![f16::ONE; 40_000];
    let w = ResidentWeight::fp16(&w16, 1, 40_000).map_err(fail)?;
    let r = Bench::new(TEST_VTCM).run(&w, Direction::Forward, 1, &vec![0.0; 40_000]);
    check!(matches!(r, Err(KernelError::NoSupport(_))), "{r:?}");
    // 8192 input features need 16 KiB per resident token: 64 KiB VTCM is
    // too small even for one token block.
    let w16 = vec![f16::ONE; 8192];
    let w = ResidentWeight::fp16(&w16, 1, 8192).map_err(fail)?;
    let r = Bench::new(64 << 10).run(&w, Direction::Forward, 1, &vec![0.0; 8192]);
    check!(matches!(r, Err(KernelError::VtcmTooSmall { available: 65536, .. })), "{r:?}");
    // Wrong input length, Q8_0 columns not a multiple of 32, bad lengths.
    let r = Bench::new(TEST_VTCM).run(&w, Direction::Forward, 2, &vec![0.0; 8192]);
    check!(matches!(r, Err(KernelError::Shape(_))), "{r:?}");
    check!(matches!(ResidentWeight::q8_0(&[0; 34], 1, 31), Err(KernelError::Shape(_))));
    check!(matches!(ResidentWeight::q8_0(&[0; 33], 1, 32), Err(KernelError::Shape(_))));
    check!(matches!(ResidentWeight::fp16(&w16, 2, 8192), Err(KernelError::Shape(_))));
    let mut bad = vec![0u8; 34];
    bad[1] = 0x7e; // scale NaN
    check!(matches!(ResidentWeight::q8_0(&bad, 1, 32), Err(KernelError::BadWeights(_))));
    Ok(())
}

/// A NaN or infinity anywhere in the input is an error naming its place.
fn non_finite_input_is_an_error() -> TestResult {
    let w16 = fp16_weight(&mut Rng(11), 8, 8, 1.0);
    let w = ResidentWeight::fp16(&w16, 8, 8).map_err(fail)?;
    for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        let mut x = vec![1.0f32; 3 * 8];
        x[2 * 8 + 5] = bad;
        for dir in [Direction::Forward, Direction::InputGrad] {
            let r = Bench::new(TEST_VTCM).run(&w, dir, 3, &x);
            check_eq!(r.err(), Some(KernelError::NonFiniteInput { token: 2, feature: 5 }));
        }
    }
    Ok(())
}

/// Zero rows give exact zeros; rows of subnormal f32 values (which plain
/// FP16 conversion would flush to zero) and rows near the FP16 maximum both
/// come out right because of the per-row scaling, without retries.
fn edge_rows_zero_subnormal_and_near_fp16_max() -> TestResult {
    let (rows, cols) = (20, 64);
    let w16 = fp16_weight(&mut Rng(12), rows, cols, 1.0);
    let w = ResidentWeight::fp16(&w16, rows, cols).map_err(fail)?;
    let wq = q8_weight(&mut Rng(13), rows, cols, 1.0);
    let wq = ResidentWeight::q8_0(&wq, rows, cols).map_err(fail)?;
    let mut rng = Rng(14);
    let mut x = vec![0.0f32; 3 * cols];
    for (i, v) in rng.vec(cols, 1.0).into_iter().enumerate() {
        x[cols + i] = v * 1.0e-40; // subnormal f32, far below f16's 6e-8
        x[2 * cols + i] = v.signum() * (65504.0 - 3.0 * v.abs());
    }
    check!(f16::from_f32(x[cols + 1]).to_f32() == 0.0 || x[cols + 1] == 0.0);
    for weight in [&w, &wq] {
        let (got, stats) = Bench::new(TEST_VTCM).run(weight, Direction::Forward, 3, &x).map_err(fail)?;
        let (y, bound) = reference(weight, Direction::Forward, 3, &x);
        check!(got[..rows].iter().all(|&v| v == 0.0 && v.is_sign_positive()), "{:?}", &got[..4]);
        check!(got[rows..2 * rows].iter().any(|&v| v != 0.0));
        check!(first_violation(&got, &y, &bound).is_none(), "{:?}", first_violation(&got, &y, &bound));
        check_eq!(stats.rows_retried, 0);
    }
    Ok(())
}

/// Two input rows of `cols`: row 0 all ones, row 1 a single leading one.
fn ones_then_a_single_one(cols: usize) -> Vec<f32> {
    let mut x = vec![1.0f32; 2 * cols];
    x[cols + 1..].fill(0.0);
    x
}

/// The first scale comes from the bound |x|_1 max|W|: a row whose max-based
/// scale would overflow (64 ones at 2048 against ones sum to 131072 >= 60000)
/// is scaled lower at once, so nothing is re-sent, and the result is exact.
fn bounded_first_scale_needs_no_retry() -> TestResult {
    let (rows, cols) = (2, 64);
    let w16 = vec![f16::ONE; rows * cols];
    let w = ResidentWeight::fp16(&w16, rows, cols).map_err(fail)?;
    let x = ones_then_a_single_one(cols);
    let (got, stats) = Bench::new(TEST_VTCM).run(&w, Direction::Forward, 2, &x).map_err(fail)?;
    check_eq!(stats.rows_retried, 0);
    check_eq!(stats.weight_passes, 1);
    check_eq!(got, vec![64.0, 64.0, 1.0, 1.0]);
    Ok(())
}

/// `w16` viewed as resident, but with the maximum of `checked`: how the
/// service sees weights the host enlarged after they were loaded, the only
/// way past the first-scale bound. The retries are the safety net for it.
fn enlarged_after_load<'a>(checked: &[f16], w16: &'a [f16], rows: usize, cols: usize) -> Result<ResidentWeight<'a>, TestFailure> {
    let small = ResidentWeight::fp16(checked, rows, cols).map_err(fail)?;
    ResidentWeight::checked_earlier(WeightData::Fp16(w16), rows, cols, small.max_abs()).map_err(fail)
}

/// A row whose partial sums reach 60000 at the first scale is re-sent once
/// at 2^-8 and comes out right; the other rows are untouched.
fn overflowing_row_is_retried_and_exact() -> TestResult {
    let (rows, cols) = (2, 64);
    let w16 = vec![f16::ONE; rows * cols];
    let tiny = vec![f16::from_f32(1.0 / 1024.0); rows * cols];
    let w = enlarged_after_load(&tiny, &w16, rows, cols)?;
    // Row 0: all ones -> scaled to 2048 each, sum 131072 >= 60000: retry.
    // Row 1: one 1.0 -> sum 2048: fine.
    let x = ones_then_a_single_one(cols);
    let (got, stats) = Bench::new(TEST_VTCM).run(&w, Direction::Forward, 2, &x).map_err(fail)?;
    check_eq!(stats.rows_retried, 1);
    check_eq!(stats.rows_failed, 0);
    check_eq!(got, vec![64.0, 64.0, 1.0, 1.0]);
    Ok(())
}

/// A row that overflows at every scale is re-sent exactly 3 times, then
/// reported failed with NaN outputs; the op still answers.
fn retries_are_bounded_at_three() -> TestResult {
    // After 3 retries a row's max is 2^11 * 2^-24 = 2^-13; with weights 65504
    // the sum over 7520 inputs is 7520 * 2^-13 * 65504 > 60000.
    let cols = 7520;
    let w16 = vec![f16::from_f32(65504.0); cols];
    let tiny = vec![f16::from_f32(1.0 / 16384.0); cols];
    let w = enlarged_after_load(&tiny, &w16, 1, cols)?;
    let x = ones_then_a_single_one(cols);
    let (got, stats) = Bench::new(2 * TEST_VTCM).run(&w, Direction::Forward, 2, &x).map_err(fail)?;
    // Row 0 is re-sent 3 times and fails; row 1 (a single 1.0, scaled to
    // 2048) overflows against 65504 until its second retry (2048 * 2^-16 *
    // 65504 < 60000): 3 + 2 re-sends.
    check_eq!(stats.rows_retried, 5);
    check_eq!(stats.rows_failed, 1);
    check!(got[0].is_nan());
    check_eq!(got[1], 65504.0);
    Ok(())
}

/// 200 tokens against VTCM that holds one 32-token block: the token side is
/// re-streamed for every window, yet every byte of W crosses DMA exactly
/// once per direction (counted by the DMA engine, compared with the bytes of
/// W), the input once per window, and the output bits equal those of a run
/// whose tokens all stay resident (the loop order changes no summation).
fn w_is_dmad_once_per_direction_for_many_token_chunks() -> TestResult {
    let (rows, cols, tokens) = (80, 96, 200);
    let w16 = fp16_weight(&mut Rng(30), rows, cols, 0.5);
    let wq = q8_weight(&mut Rng(31), rows, cols, 0.5);
    let fp16 = ResidentWeight::fp16(&w16, rows, cols).map_err(fail)?;
    let q8 = ResidentWeight::q8_0(&wq, rows, cols).map_err(fail)?;
    for (w, w_bytes) in [(&fp16, w16.len() * 2), (&q8, wq.len())] {
        for dir in [Direction::Forward, Direction::InputGrad] {
            let d = if dir == Direction::Forward { cols } else { rows };
            let probe = Plan::new(w.precision(), dir, rows, cols, tokens, TEST_VTCM).map_err(fail)?;
            // Room for one token block and one stripe: a window per stripe.
            let small = probe.fixed_bytes() + probe.block_bytes() + probe.stripe_bytes() + VTCM_BUFFERS * VTCM_ALIGN;
            let plan = Plan::new(w.precision(), dir, rows, cols, tokens, small).map_err(fail)?;
            check!(!plan.tokens_resident && plan.windows > 1, "{plan:?}");
            let x = Rng(32).vec(tokens * d, 3.0);
            let (got, stats) = Bench::new(small).run(w, dir, tokens, &x).map_err(fail)?;
            check_eq!(stats.dma_weight_bytes as usize, w_bytes);
            check_eq!(stats.weight_passes, 1);
            check_eq!(stats.dma_input_bytes as usize, plan.windows * tokens * d * 4);
            let (y, bound) = reference(w, dir, tokens, &x);
            check!(first_violation(&got, &y, &bound).is_none(), "{:?}", first_violation(&got, &y, &bound));
            let (resident, rstats) = Bench::new(TEST_VTCM).run(w, dir, tokens, &x).map_err(fail)?;
            check!(probe.tokens_resident);
            check_eq!(rstats.dma_weight_bytes as usize, w_bytes);
            check_eq!(rstats.dma_input_bytes as usize, tokens * d * 4);
            check!(got.iter().zip(&resident).all(|(a, b)| a.to_bits() == b.to_bits()));
        }
    }
    Ok(())
}

/// FNV-1a digest of all four kernels on fixed inputs. The same constant must
/// come out of the native build and the Hexagon build under qemu: this is the
/// cross-build bit-identity check. If a deliberate numerical change moves it,
/// update it here (both builds run this same test).
pub const KERNEL_DIGEST: u64 = 1168067573695224474;

/// The digest of [`KERNEL_DIGEST`]'s fixed workload.
pub fn kernel_digest() -> Result<u64, KernelError> {
    kernel_digest_on(&mut Bench::new(TEST_VTCM))
}

/// [`kernel_digest`] on a given bench (tile engine).
fn kernel_digest_on<T: TileEngine>(bench: &mut Bench<T>) -> Result<u64, KernelError> {
    let (rows, cols, tokens) = (48, 96, 40);
    let w16 = fp16_weight(&mut Rng(20), rows, cols, 0.7);
    let wq = q8_weight(&mut Rng(21), rows, cols, 0.7);
    let fp16 = ResidentWeight::fp16(&w16, rows, cols)?;
    let q8 = ResidentWeight::q8_0(&wq, rows, cols)?;
    let mut h = 0xcbf2_9ce4_8422_2325;
    for w in [&fp16, &q8] {
        for (dir, d) in [(Direction::Forward, cols), (Direction::InputGrad, rows)] {
            let x = Rng(22 + d as u64).vec(tokens * d, 5.0);
            let (y, _) = bench.run(w, dir, tokens, &x)?;
            h = digest(h, &y);
        }
    }
    Ok(h)
}

fn kernel_outputs_match_committed_digest() -> TestResult {
    let h = kernel_digest().map_err(fail)?;
    check_eq!(h, KERNEL_DIGEST);
    Ok(())
}

/// The HVX float engine (over the instruction models) and this build's
/// device engine run the four kernels to the same committed digest: the
/// whole kernel path is bit-identical whichever engine does the tiles.
fn hvx_float_and_device_engines_give_the_committed_digest() -> TestResult {
    let model = kernel_digest_on(&mut Bench::with_tiles(TEST_VTCM, HvxFloatTiles::<Model>::new())).map_err(fail)?;
    check_eq!(model, KERNEL_DIGEST);
    let device = kernel_digest_on(&mut Bench::with_tiles(TEST_VTCM, DeviceTiles::new())).map_err(fail)?;
    check_eq!(device, KERNEL_DIGEST);
    Ok(())
}

/// The padded FP16 and Q8_0 fixtures of the tests above, forward and
/// input-gradient, on the HVX float engine over the instruction models,
/// against the f64 reference.
fn hvx_float_engine_matches_f64_reference_on_kernel_fixtures() -> TestResult {
    let mut bench = Bench::with_tiles(TEST_VTCM, HvxFloatTiles::<Model>::new());
    let w16 = fp16_weight(&mut Rng(1), 50, 70, 0.5);
    let w = ResidentWeight::fp16(&w16, 50, 70).map_err(fail)?;
    check_against_reference_on(&mut bench, &w, Direction::Forward, 45, 2)?;
    check_against_reference_on(&mut bench, &w, Direction::InputGrad, 45, 4)?;
    let wq = q8_weight(&mut Rng(5), 50, 96, 0.5);
    let w = ResidentWeight::q8_0(&wq, 50, 96).map_err(fail)?;
    check_against_reference_on(&mut bench, &w, Direction::Forward, 45, 6)?;
    check_against_reference_on(&mut bench, &w, Direction::InputGrad, 45, 8)?;
    check!(bench.tiles.tiles() > 0);
    Ok(())
}

crate::selftests!(
    fp16_forward_matches_f64_reference_with_padding,
    fp16_input_grad_matches_f64_reference_with_padding,
    q8_forward_matches_f64_reference_with_padding,
    q8_input_grad_matches_f64_reference_with_padding,
    q8_forward_and_input_grad_see_bit_identical_weights,
    fp16_identity_reproduces_w_in_both_directions,
    unsupported_shapes_are_refused,
    non_finite_input_is_an_error,
    edge_rows_zero_subnormal_and_near_fp16_max,
    bounded_first_scale_needs_no_retry,
    overflowing_row_is_retried_and_exact,
    retries_are_bounded_at_three,
    kernel_outputs_match_committed_digest,
    hvx_float_and_device_engines_give_the_committed_digest,
    hvx_float_engine_matches_f64_reference_on_kernel_fixtures,
    w_is_dmad_once_per_direction_for_many_token_chunks,
);
