//! Checks that tie a message's shapes to its buffer references.
use super::buffer::{overlaps, validate_exact, BufferError, RegisteredBuffer};
use super::{Direction, LoadWeights, Precision, ProjectionOp, ServiceError, WeightShape};
use core::ops::Range;

/// Bytes of one f32 activation element.
const F32_BYTES: u64 = 4;
const Q8_0_BLOCK_BYTES: u64 = crate::q8_0::BLOCK_BYTES as u64;
const Q8_0_BLOCK_VALUES: u64 = crate::q8_0::QK8_0 as u64;

impl WeightShape {
    /// Element count `rows * cols`, or `None` on overflow.
    pub fn elements(&self) -> Option<u64> {
        (self.rows as u64).checked_mul(self.cols as u64)
    }
}

impl LoadWeights {
    /// Bytes `W` occupies in `precision`, or [`ServiceError::InvalidParams`]
    /// for an empty shape, or Q8_0 with `cols` not a multiple of 32.
    pub fn weight_bytes(&self) -> Result<u64, ServiceError> {
        let n = self.shape.elements().filter(|&n| n > 0).ok_or(ServiceError::InvalidParams)?;
        match self.precision {
            Precision::Fp16 => n.checked_mul(2).ok_or(ServiceError::InvalidParams),
            Precision::Q8_0 if self.shape.cols as u64 % Q8_0_BLOCK_VALUES == 0 => {
                Ok(n / Q8_0_BLOCK_VALUES * Q8_0_BLOCK_BYTES)
            }
            Precision::Q8_0 => Err(ServiceError::InvalidParams),
        }
    }

    /// Validates the weight reference; returns its byte range.
    pub fn validate(&self, registered: &[RegisteredBuffer]) -> Result<Range<usize>, ServiceError> {
        let bytes = self.weight_bytes()?;
        // f16 and Q8_0 blocks both start with a 2-byte f16.
        Ok(validate_exact(&self.weights, registered, 2, Some(bytes))?)
    }
}

/// The validated byte ranges of a [`ProjectionOp`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OpBuffers {
    /// Range of the input inside its buffer.
    pub input: Range<usize>,
    /// Range of the output inside its buffer.
    pub output: Range<usize>,
}

impl ProjectionOp {
    /// `(input features, output features)` of this op for weight `shape`.
    pub fn io_features(&self, shape: WeightShape) -> (u32, u32) {
        match self.direction {
            Direction::Forward => (shape.cols, shape.rows),
            Direction::InputGrad => (shape.rows, shape.cols),
        }
    }

    /// Validates both references against the registered buffers and the
    /// resident weight's shape: f32-aligned, exactly `tokens * features * 4`
    /// bytes each, not overlapping.
    pub fn validate(
        &self,
        shape: WeightShape,
        registered: &[RegisteredBuffer],
    ) -> Result<OpBuffers, ServiceError> {
        if self.tokens == 0 {
            return Err(ServiceError::InvalidParams);
        }
        let (in_f, out_f) = self.io_features(shape);
        let bytes = |features: u32| (self.tokens as u64).checked_mul(features as u64)?.checked_mul(F32_BYTES);
        let input = validate_exact(&self.input, registered, F32_BYTES, bytes(in_f))?;
        let output = validate_exact(&self.output, registered, F32_BYTES, bytes(out_f))?;
        if overlaps(&self.input, &self.output) {
            return Err(BufferError::Overlap { buffer: self.input.buffer }.into());
        }
        Ok(OpBuffers { input, output })
    }
}
