//! A frozen projection whose weight is resident in the DSP service.
use super::client::NpuClient;
use super::policy::Precision;
use crate::projection::{Direction, Product, Projection, ProjectionInfo};
use crate::{Error, Result};
use hexlora_proto::protocol::{BufferRef, ProjectionId};
use hexlora_proto::q8_0::{self, QK8_0};
use std::sync::Arc;

/// A projection served by the NPU: both directions are requests to the
/// service; the weight stays resident there (and in the client's shared
/// weights buffer) until the client is dropped.
pub struct NpuProjection {
    client: Arc<NpuClient>,
    info: ProjectionInfo,
    id: ProjectionId,
    precision: Precision,
    weights: BufferRef,
}

impl NpuProjection {
    pub(crate) fn new(client: Arc<NpuClient>, info: ProjectionInfo, id: ProjectionId, precision: Precision, weights: BufferRef) -> Self {
        NpuProjection { client, info, id, precision, weights }
    }

    /// The service's id of this weight.
    pub fn id(&self) -> ProjectionId {
        self.id
    }

    /// Resident precision.
    pub fn precision(&self) -> Precision {
        self.precision
    }

    /// The weight the NPU multiplies, `[out, in]` in f32: the FP16 values,
    /// or each Q8_0 block through the shared dequantizer (rounded to f16,
    /// as the kernels see it). The planner's CPU reference and the recompute
    /// of overflowed rows use it.
    pub fn effective_weight(&self) -> Result<Vec<f32>> {
        let bytes = self.client.weight_bytes_of(&self.weights)?;
        match self.precision {
            Precision::Fp16 => Ok(bytes.chunks_exact(2).map(|b| half::f16::from_le_bytes([b[0], b[1]]).to_f32()).collect()),
            Precision::Q8_0 => {
                let mut w = Vec::with_capacity(bytes.len() / q8_0::BLOCK_BYTES * QK8_0);
                let mut block = [half::f16::ZERO; QK8_0];
                for chunk in bytes.chunks_exact(q8_0::BLOCK_BYTES) {
                    let b = q8_0::BlockQ8_0::from_bytes(chunk.try_into().map_err(|_| Error::Npu("short Q8_0 block".into()))?);
                    q8_0::dequantize_block(&b, &mut block);
                    w.extend(block.iter().map(|v| v.to_f32()));
                }
                Ok(w)
            }
        }
    }

    fn run(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32], side: Option<&mut dyn FnMut() -> Result<()>>) -> Result<()> {
        self.info.check_io(dir, input, tokens, out)?;
        // The service rejects non-finite input; say where it came from.
        if let Some(i) = input.iter().position(|v| !v.is_finite()) {
            return Err(Error::NonFinite(format!("{} ({dir:?}) input, token {}", self.info.name, i / self.info.widths(dir).0)));
        }
        let failed = self.client.project(self, dir, input, tokens, out, side)?;
        if failed > 0 {
            self.recompute_failed_rows(dir, input, tokens, out)?;
        }
        Ok(())
    }

    /// Rows the service could not bring under the FP16 limit after three
    /// rescales come back NaN; they are computed here in f64 from the same
    /// effective weight.
    fn recompute_failed_rows(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        let w = self.effective_weight()?;
        let (n_in, n_out) = self.info.widths(dir);
        let cols = self.info.in_features;
        for t in 0..tokens {
            let row = &mut out[t * n_out..(t + 1) * n_out];
            if row.iter().all(|v| !v.is_nan()) {
                continue;
            }
            let x = &input[t * n_in..(t + 1) * n_in];
            for (j, o) in row.iter_mut().enumerate() {
                *o = match dir {
                    Direction::Forward => (0..n_in).map(|i| x[i] as f64 * w[j * cols + i] as f64).sum::<f64>() as f32,
                    Direction::InputGrad => (0..n_in).map(|i| x[i] as f64 * w[i * cols + j] as f64).sum::<f64>() as f32,
                };
            }
        }
        Ok(())
    }
}

impl Projection for NpuProjection {
    fn info(&self) -> &ProjectionInfo {
        &self.info
    }

    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()> {
        self.run(dir, input, tokens, out, None)
    }

    /// Sends the request, runs `side` while the service computes, then
    /// waits: real overlap on the queue transports (shared memory,
    /// simulator); the in-process transport is synchronous, so there `side`
    /// runs after the product.
    fn apply_overlapped(&self, p: Product<'_>, side: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        self.run(p.dir, p.input, p.tokens, p.out, Some(side))
    }
}
