//! The CPU [`Projection`]: the frozen weight held dense in f32, row-major
//! `[out, in]`, and both products through [`crate::ops::matmul`]. Quantized
//! checkpoints are dequantized once at load, so the CPU sees exactly the
//! effective weight transformers computes with when it loads the same file.
//!
//! The weight may be a row window of a shared table (the vocabulary head's
//! slices over a tied embedding), so nothing is copied.
use crate::model::source::RawTensor;
use crate::ops::matmul::{matmul, matmul_bt};
use crate::projection::{Direction, Projection, ProjectionInfo};
use crate::{Error, Result};
use std::sync::Arc;

/// A frozen projection computed on the CPU in f32.
pub struct CpuProjection {
    info: ProjectionInfo,
    /// Holds `[out_features, in_features]` from row `first_row` on.
    table: Arc<Vec<f32>>,
    first_row: usize,
}

impl CpuProjection {
    /// Wraps an f32 weight `[out, in]`, checking its length against `info`.
    pub fn new(info: ProjectionInfo, weight: Vec<f32>) -> Result<Self> {
        if weight.len() != info.out_features * info.in_features {
            return Err(Error::Shape {
                what: info.name.clone(),
                expected: vec![info.out_features, info.in_features],
                got: vec![weight.len()],
            });
        }
        Ok(CpuProjection { info, table: Arc::new(weight), first_row: 0 })
    }

    /// Rows `first_row .. first_row + out_features` of a shared `[rows, in]`
    /// table, without copying it.
    pub fn window(info: ProjectionInfo, table: Arc<Vec<f32>>, first_row: usize) -> Result<Self> {
        let end = (first_row + info.out_features) * info.in_features;
        if info.in_features == 0 || table.len() % info.in_features != 0 || end > table.len() {
            return Err(Error::Shape {
                what: format!("{} (row window from {first_row})", info.name),
                expected: vec![first_row + info.out_features, info.in_features],
                got: vec![table.len()],
            });
        }
        Ok(CpuProjection { info, table, first_row })
    }

    /// Dequantizes a checkpoint tensor whose shape must be `[out, in]`.
    pub fn from_raw(info: ProjectionInfo, raw: &RawTensor<'_>) -> Result<Self> {
        if raw.shape != [info.out_features, info.in_features] {
            return Err(Error::Shape {
                what: raw.name.clone(),
                expected: vec![info.out_features, info.in_features],
                got: raw.shape.clone(),
            });
        }
        Self::new(info, raw.to_f32()?)
    }

    /// The weight, `[out, in]` (tests and the NPU planner's CPU reference).
    pub fn weight(&self) -> &[f32] {
        let n_in = self.info.in_features;
        &self.table[self.first_row * n_in..(self.first_row + self.info.out_features) * n_in]
    }
}

impl Projection for CpuProjection {
    fn info(&self) -> &ProjectionInfo {
        &self.info
    }

    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        self.info.check_io(dir, input, tokens, out)?;
        let (n_in, n_out) = (self.info.in_features, self.info.out_features);
        let w = self.weight();
        match dir {
            // Y[t, out] = X[t, in] W[out, in]^T
            Direction::Forward => matmul_bt(out, input, w, (tokens, n_in, n_out), 1.0, false),
            // dX[t, in] = dY[t, out] W[out, in]
            Direction::InputGrad => matmul(out, input, w, (tokens, n_out, n_in), 1.0, false),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::projection::ProjectionKind;

    #[test]
    fn both_directions_match_f64_and_shapes_are_checked() {
        let info = ProjectionInfo { name: "p".into(), kind: ProjectionKind::Mlp, out_features: 3, in_features: 2 };
        let w = vec![1.0, 2.0, -1.0, 0.5, 3.0, -2.0]; // [3, 2]
        let p = CpuProjection::new(info.clone(), w.clone()).unwrap();
        let x = [0.5f32, -1.0, 2.0, 1.0]; // [2 tokens, 2]
        let mut y = [0.0f32; 6];
        p.apply(Direction::Forward, &x, 2, &mut y).unwrap();
        for t in 0..2 {
            for o in 0..3 {
                let want = (0..2).map(|i| x[t * 2 + i] as f64 * w[o * 2 + i] as f64).sum::<f64>();
                assert!((y[t * 3 + o] as f64 - want).abs() < 1e-6);
            }
        }
        let mut dx = [0.0f32; 4];
        p.apply(Direction::InputGrad, &y, 2, &mut dx).unwrap();
        for t in 0..2 {
            for i in 0..2 {
                let want = (0..3).map(|o| y[t * 3 + o] as f64 * w[o * 2 + i] as f64).sum::<f64>();
                assert!((dx[t * 2 + i] as f64 - want).abs() < 1e-5);
            }
        }
        assert!(p.apply(Direction::Forward, &x, 3, &mut y).is_err());
        assert!(CpuProjection::new(info.clone(), vec![0.0; 5]).is_err());
        // a window of rows 1..3 of a [4, 2] table is the weight of those rows
        let table = Arc::new(vec![9.0, 9.0, 1.0, 2.0, -1.0, 0.5, 3.0, -2.0]);
        let two = ProjectionInfo { out_features: 2, ..info.clone() };
        assert_eq!(CpuProjection::window(two.clone(), table.clone(), 1).unwrap().weight(), &table[2..6]);
        assert!(CpuProjection::window(two, table.clone(), 3).is_err());
        assert!(CpuProjection::window(info, table, 2).is_err());
    }
}
