//! A plain dense f32 tensor: a shape and row-major data. Activations,
//! gradients, adapters and small parameters live in these; frozen base
//! weights do not (they sit behind [`crate::projection::Projection`]).
use crate::{Error, Result};
use rayon::prelude::*;
use std::mem::MaybeUninit;

mod spare;

/// Elements per rayon task of the helpers below; shorter slices stay on
/// the calling thread. Each element is computed on its own, so the bits do
/// not depend on the split.
const PAR_CHUNK: usize = 1 << 15;

/// A new vector of `n` values written by `fill(start, chunk)` for the
/// chunk of elements `start..start + chunk.len()`, which must write all of
/// it; chunks run on the rayon pool. The large buffers of a training step
/// (~400 MB a step) are made this way: made on one thread, with a zeroing
/// memset or a copy, they left the other core idle (perf, session 6).
/// The buffer is a dropped tensor's when the spare pool has one of this
/// length: made fresh while the pool kept such buffers, the pool filled
/// up to its cap with memory malloc could have reused (peak RSS 556 ->
/// 780 MiB in 6 steps on a machine without AMX, where the LoRA backward
/// makes its gradients here).
fn par_filled(n: usize, fill: impl Fn(usize, &mut [MaybeUninit<f32>]) + Sync) -> Vec<f32> {
    let mut v = spare::reuse(n).unwrap_or_else(|| Vec::with_capacity(n));
    // SAFETY: f32 needs no drop; the values are rewritten below.
    unsafe { v.set_len(0) };
    let spare = &mut v.spare_capacity_mut()[..n];
    if n < PAR_CHUNK {
        fill(0, spare);
    } else {
        spare.par_chunks_mut(PAR_CHUNK).enumerate().for_each(|(c, chunk)| fill(c * PAR_CHUNK, chunk));
    }
    // SAFETY: `fill` wrote every element of every chunk, i.e. all n.
    unsafe { v.set_len(n) };
    v
}

/// `n` zeros (see [`par_filled`]).
pub fn zeroed(n: usize) -> Vec<f32> {
    par_filled(n, |_, c| c.fill(MaybeUninit::new(0.0)))
}

/// A buffer of `n` values the caller overwrites in full: a dropped
/// tensor's when the spare pool has one (stale values, NaN in debug
/// builds), a zeroed one otherwise.
pub fn overwritable(n: usize) -> Vec<f32> {
    spare::reuse(n).unwrap_or_else(|| zeroed(n))
}

/// `acc[i] += g[i]`, large slices on the rayon pool.
pub fn add_assign(acc: &mut [f32], g: &[f32]) {
    assert_eq!(acc.len(), g.len(), "add_assign lengths");
    let add = |(a, g): (&mut [f32], &[f32])| a.iter_mut().zip(g).for_each(|(a, g)| *a += g);
    if acc.len() < PAR_CHUNK {
        add((acc, g));
    } else {
        acc.par_chunks_mut(PAR_CHUNK).zip(g.par_chunks(PAR_CHUNK)).for_each(add);
    }
}

/// `v[i] += 0.0` (turns -0.0 into +0.0, as a sum into zeros does), large
/// slices on the rayon pool.
pub fn add_zero(v: &mut [f32]) {
    let add = |c: &mut [f32]| c.iter_mut().for_each(|x| *x += 0.0);
    if v.len() < PAR_CHUNK {
        add(v);
    } else {
        v.par_chunks_mut(PAR_CHUNK).for_each(add);
    }
}

/// No NaN or infinity in `v` (large slices on the rayon pool; a fold
/// without early exit, so it vectorizes).
pub fn all_finite(v: &[f32]) -> bool {
    let finite = |c: &[f32]| c.iter().fold(true, |ok, x| ok & x.is_finite());
    if v.len() < PAR_CHUNK {
        finite(v)
    } else {
        v.par_chunks(PAR_CHUNK).all(finite)
    }
}

/// `a[i] + b[i]` in a new vector, in one pass (see [`par_filled`]).
pub fn sum(a: &[f32], b: &[f32]) -> Vec<f32> {
    assert_eq!(a.len(), b.len(), "sum lengths");
    par_filled(a.len(), |at, c| c.iter_mut().zip(&a[at..]).zip(&b[at..]).for_each(|((y, a), b)| *y = MaybeUninit::new(a + b)))
}

/// Dense row-major f32 tensor.
#[derive(Debug, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first (PyTorch order).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f32>,
}

/// Large tensors are copied by the rayon pool (see [`par_filled`]): the
/// tape clones activations (RoPE inputs, the adapter's factors).
impl Clone for Tensor {
    fn clone(&self) -> Self {
        // par_filled takes a pooled buffer of this length when there is one
        let data = par_filled(self.data.len(), |at, c| c.iter_mut().zip(&self.data[at..]).for_each(|(d, &s)| *d = MaybeUninit::new(s)));
        Tensor { shape: self.shape.clone(), data }
    }
}

/// A dropped tensor's large buffer goes to the spare pool ([`spare`]), for
/// the next [`Tensor::to_overwrite`] of its length.
impl Drop for Tensor {
    fn drop(&mut self) {
        spare::keep(std::mem::take(&mut self.data));
    }
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Tensor { shape: shape.to_vec(), data: zeroed(shape.iter().product()) }
    }

    /// A tensor whose every element the caller will write before anything
    /// reads it (a kernel's output): a dropped tensor's buffer of the same
    /// length, stale values and all (NaN in debug builds), when the spare
    /// pool has one; zeros otherwise. Saves the zeroing pass ([`spare`]).
    pub fn to_overwrite(shape: &[usize]) -> Self {
        let n = shape.iter().product();
        Tensor { shape: shape.to_vec(), data: overwritable(n) }
    }

    /// Wraps `data`, checking that its length matches `shape`.
    pub fn from_vec(shape: &[usize], data: Vec<f32>) -> Result<Self> {
        let n: usize = shape.iter().product();
        if n != data.len() {
            return Err(Error::Shape {
                what: "Tensor::from_vec".into(),
                expected: shape.to_vec(),
                got: vec![data.len()],
            });
        }
        Ok(Tensor { shape: shape.to_vec(), data })
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// True when the tensor holds no elements.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Size of the last dimension (1 for a scalar).
    pub fn last_dim(&self) -> usize {
        self.shape.last().copied().unwrap_or(1)
    }

    /// Number of rows when viewed as a 2-D matrix `[rows, last_dim]`.
    pub fn rows(&self) -> usize {
        self.data.len() / self.last_dim().max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A NaN or infinity anywhere in a pool-sized slice is found; finite
    /// values (zeros, subnormals, extremes) pass.
    #[test]
    fn all_finite_finds_every_non_finite_value() {
        let n = 3 * PAR_CHUNK + 17;
        let mut v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.1).sin() * 1e30).collect();
        v[5] = f32::MIN_POSITIVE / 2.0;
        v[6] = f32::MAX;
        assert!(all_finite(&v));
        for at in [0, PAR_CHUNK - 1, PAR_CHUNK, n - 1] {
            for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                let keep = std::mem::replace(&mut v[at], bad);
                assert!(!all_finite(&v), "{bad} at {at}");
                v[at] = keep;
            }
        }
        assert!(!all_finite(&[1.0, f32::NAN]));
    }

    #[test]
    fn add_zero_turns_negative_zero_positive_and_keeps_the_rest() {
        let mut v = vec![-0.0f32; 2 * PAR_CHUNK + 3];
        v[1] = -2.5;
        add_zero(&mut v);
        assert!(v.iter().enumerate().all(|(i, x)| if i == 1 { *x == -2.5 } else { x.to_bits() == 0 }));
    }
}
