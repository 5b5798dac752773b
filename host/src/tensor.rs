//! A plain dense f32 tensor: a shape and row-major data. Activations,
//! gradients, adapters and small parameters live in these; frozen base
//! weights do not (they sit behind [`crate::projection::Projection`]).
use crate::{Error, Result};

/// Dense row-major f32 tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor {
    /// Dimensions, outermost first (PyTorch order).
    pub shape: Vec<usize>,
    /// `shape.iter().product()` values, row-major.
    pub data: Vec<f32>,
}

impl Tensor {
    /// A tensor of zeros.
    pub fn zeros(shape: &[usize]) -> Self {
        Tensor { shape: shape.to_vec(), data: vec![0.0; shape.iter().product()] }
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
