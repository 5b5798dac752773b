//! A plain dense f32 tensor: a shape and row-major data. Activations,
//! gradients, adapters and small parameters live in these; frozen base
//! weights do not (they sit behind [`crate::projection::Projection`]).
use crate::{Error, Result};

/// `n` zeros. Large buffers are zeroed by the rayon pool: a training step
/// allocates ~400 MB of activations and gradients, and on one thread the
/// zeroing (a memset, or the page faults of fresh memory) was ~5% of the
/// step with the other core idle (perf, session 6).
pub fn zeroed(n: usize) -> Vec<f32> {
    use rayon::prelude::*;
    const SERIAL: usize = 1 << 16;
    if n < SERIAL {
        return vec![0.0; n];
    }
    let mut v = Vec::with_capacity(n);
    v.spare_capacity_mut().par_chunks_mut(SERIAL).for_each(|c| c.fill(std::mem::MaybeUninit::new(0.0)));
    // SAFETY: all n elements were just written.
    unsafe { v.set_len(n) };
    v
}

/// `acc[i] += g[i]`, large slices on the rayon pool (elements are
/// independent: the bits do not depend on the split).
pub fn add_assign(acc: &mut [f32], g: &[f32]) {
    use rayon::prelude::*;
    const SERIAL: usize = 1 << 15;
    assert_eq!(acc.len(), g.len(), "add_assign lengths");
    if acc.len() < SERIAL {
        acc.iter_mut().zip(g).for_each(|(a, g)| *a += g);
    } else {
        acc.par_chunks_mut(SERIAL).zip(g.par_chunks(SERIAL)).for_each(|(a, g)| a.iter_mut().zip(g).for_each(|(a, g)| *a += g));
    }
}

/// `a[i] + b[i]` in a new vector, in one pass (large slices on the rayon
/// pool; elements are independent, so the bits do not depend on the split).
pub fn sum(a: &[f32], b: &[f32]) -> Vec<f32> {
    use rayon::prelude::*;
    const SERIAL: usize = 1 << 15;
    assert_eq!(a.len(), b.len(), "sum lengths");
    if a.len() < SERIAL {
        return a.iter().zip(b).map(|(a, b)| a + b).collect();
    }
    let mut y = Vec::with_capacity(a.len());
    let spare = &mut y.spare_capacity_mut()[..a.len()];
    spare.par_chunks_mut(SERIAL).zip(a.par_chunks(SERIAL)).zip(b.par_chunks(SERIAL)).for_each(|((y, a), b)| {
        y.iter_mut().zip(a).zip(b).for_each(|((y, a), b)| *y = std::mem::MaybeUninit::new(a + b));
    });
    // SAFETY: every element up to the length was just written.
    unsafe { y.set_len(a.len()) };
    y
}

/// Dense row-major f32 tensor.
#[derive(Debug, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first (PyTorch order).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f32>,
}

/// Large tensors are copied by the rayon pool: the tape clones
/// activations (residual adds, RoPE, the adapter's factors), and serial
/// copies left the other core idle for ~3% of a training step.
impl Clone for Tensor {
    fn clone(&self) -> Self {
        use rayon::prelude::*;
        const SERIAL: usize = 1 << 16;
        if self.data.len() < SERIAL {
            return Tensor { shape: self.shape.clone(), data: self.data.clone() };
        }
        let mut data = Vec::with_capacity(self.data.len());
        let spare = &mut data.spare_capacity_mut()[..self.data.len()];
        spare.par_chunks_mut(SERIAL).zip(self.data.par_chunks(SERIAL)).for_each(|(d, s)| {
            d.iter_mut().zip(s).for_each(|(d, &s)| *d = std::mem::MaybeUninit::new(s));
        });
        // SAFETY: every element up to the length was just written.
        unsafe { data.set_len(self.data.len()) };
        Tensor { shape: self.shape.clone(), data }
    }
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Tensor { shape: shape.to_vec(), data: zeroed(shape.iter().product()) }
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
