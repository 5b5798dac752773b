//! The check the bf16 tile kernels' tests share (`avx512bf16.rs`,
//! `neon_bfmmla.rs`): both directions against f64 of the bf16-rounded
//! operands, each kernel with its own error bound, and bit for bit the
//! same on one thread as on several.
use super::{round_bits, widen};

/// A kernel's direct entry: `(out, activation, tokens, w bits, rows, cols)`.
pub(super) type Direct = fn(&mut [f32], &[f32], usize, &[u16], usize, usize);

fn values(n: usize, f: f32) -> Vec<f32> {
    (0..n).map(|i| (i as f32 * f).sin() * 2.0).collect()
}

/// Runs `forward` and `input_grad` on `(tokens, out, in)` shapes, requiring
/// `within(got, want, sum |a b|, reduction)` of every output element.
pub(super) fn check_kernel(forward: Direct, input_grad: Direct, shapes: &[(usize, usize, usize)], within: impl Fn(f32, f64, f64, usize) -> bool) {
    let r = |v: f32| widen(round_bits(v)) as f64;
    let run_both = |tokens: usize, out_f: usize, in_f: usize, w: &[u16], x: &[f32], dy: &[f32]| {
        let (mut y, mut dx) = (vec![f32::NAN; tokens * out_f], vec![f32::NAN; tokens * in_f]);
        forward(&mut y, x, tokens, w, out_f, in_f);
        input_grad(&mut dx, dy, tokens, w, out_f, in_f);
        (y, dx)
    };
    let sums = |terms: &mut dyn Iterator<Item = f64>| terms.fold((0.0, 0.0), |(s, m), t| (s + t, m + t.abs()));
    for &(tokens, out_f, in_f) in shapes {
        let w: Vec<u16> = values(out_f * in_f, 0.37).into_iter().map(round_bits).collect();
        let (x, dy) = (values(tokens * in_f, 0.71), values(tokens * out_f, 0.53));
        let (y, dx) = run_both(tokens, out_f, in_f, &w, &x, &dy);
        for t in 0..tokens {
            for o in 0..out_f {
                let (want, mag) = sums(&mut (0..in_f).map(|i| r(x[t * in_f + i]) * widen(w[o * in_f + i]) as f64));
                let got = y[t * out_f + o];
                assert!(within(got, want, mag, in_f), "forward {tokens}x{in_f}->{out_f} [{t}][{o}]: {got} vs {want}");
            }
            for i in 0..in_f {
                let (want, mag) = sums(&mut (0..out_f).map(|o| r(dy[t * out_f + o]) * widen(w[o * in_f + i]) as f64));
                let got = dx[t * in_f + i];
                assert!(within(got, want, mag, out_f), "input grad {tokens}x{in_f}->{out_f} [{t}][{i}]: {got} vs {want}");
            }
        }
        let one = rayon::ThreadPoolBuilder::new().num_threads(1).build().unwrap();
        let (y1, dx1) = one.install(|| run_both(tokens, out_f, in_f, &w, &x, &dy));
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<u32>>();
        assert_eq!((bits(&y1), bits(&dx1)), (bits(&y), bits(&dx)), "{tokens}x{in_f}->{out_f}: thread count changed the bits");
    }
}
