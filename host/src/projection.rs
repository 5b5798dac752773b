//! The one interface through which anything touches a frozen base weight.
//!
//! With LoRA every training step multiplies by each frozen `W` (`[out, in]`,
//! PyTorch `nn.Linear` layout) in two directions:
//!
//! - [`Direction::Forward`]: `Y = X W^T`, `X: [tokens, in] -> Y: [tokens, out]`
//!   (also the activation recompute);
//! - [`Direction::InputGrad`]: `dX = dY W`, `dY: [tokens, out] -> dX: [tokens, in]`.
//!
//! There is never a weight gradient. Models, the training graph and the
//! hypernetwork hold `Arc<dyn Projection>` and nothing else of `W`, so the
//! split runtime can route each projection to the DSP service (or back to the
//! CPU) without touching model code.
use crate::{Error, Result};

/// Which product with the frozen weight is wanted.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `Y = X W^T`.
    Forward,
    /// `dX = dY W`.
    InputGrad,
}

/// What a projection belongs to; drives the precision policy (recurrent
/// projections stay FP16 on the NPU, attention and MLP go Q8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ProjectionKind {
    /// q/k/v/o of an attention block.
    Attention,
    /// gate/up/down of an MLP block.
    Mlp,
    /// Gated DeltaNet projections (in_proj_*, out_proj).
    Recurrent,
}

/// Static description of one frozen projection.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProjectionInfo {
    /// Checkpoint name without the `.weight` suffix, e.g.
    /// `model.layers.3.self_attn.q_proj` (the PEFT target names derive from it).
    pub name: String,
    /// Attention, MLP or recurrent.
    pub kind: ProjectionKind,
    /// Rows of `W`.
    pub out_features: usize,
    /// Columns of `W`.
    pub in_features: usize,
}

impl ProjectionInfo {
    /// `(input width, output width)` for a direction.
    pub fn widths(&self, dir: Direction) -> (usize, usize) {
        match dir {
            Direction::Forward => (self.in_features, self.out_features),
            Direction::InputGrad => (self.out_features, self.in_features),
        }
    }

    /// Checks buffer lengths for `tokens` rows in direction `dir`.
    pub fn check_io(&self, dir: Direction, input: &[f32], tokens: usize, out: &[f32]) -> Result<()> {
        let (w_in, w_out) = self.widths(dir);
        if input.len() != tokens * w_in || out.len() != tokens * w_out {
            return Err(Error::Shape {
                what: format!("{} ({dir:?})", self.name),
                expected: vec![tokens * w_in, tokens * w_out],
                got: vec![input.len(), out.len()],
            });
        }
        Ok(())
    }

    /// Checks a [`Projection::scaled_rows`] request: one scale per row,
    /// every row inside `W`, `out` holding `rows.len()` rows of `in_features`.
    pub fn check_rows(&self, rows: &[usize], scales: &[f32], out: &[f32]) -> Result<()> {
        if scales.len() != rows.len() || out.len() != rows.len() * self.in_features {
            return Err(Error::Shape {
                what: format!("{} (scaled rows)", self.name),
                expected: vec![rows.len(), rows.len() * self.in_features],
                got: vec![scales.len(), out.len()],
            });
        }
        match rows.iter().find(|&&r| r >= self.out_features) {
            Some(r) => Err(Error::invalid(&self.name, format!("row {r} of a weight with {} rows", self.out_features))),
            None => Ok(()),
        }
    }
}

/// One product with a frozen weight, as the calls that do more than the
/// product take it: `tokens` rows of `input` in direction `dir`, written
/// into `out` (overwritten). Shapes: the module docs.
pub struct Product<'a> {
    pub dir: Direction,
    pub input: &'a [f32],
    pub tokens: usize,
    pub out: &'a mut [f32],
}

/// A frozen weight and the two products with it.
pub trait Projection: Send + Sync {
    /// Name, kind and shape.
    fn info(&self) -> &ProjectionInfo;

    /// Computes the product for `tokens` rows of `input` into `out`
    /// (overwritten). See the module docs for shapes.
    fn apply(&self, dir: Direction, input: &[f32], tokens: usize, out: &mut [f32]) -> Result<()>;

    /// The product `p`, and runs `side` (CPU work that does not need
    /// `p.out`, e.g. the LoRA branch) while the product is computed.
    ///
    /// The default runs `side` first, then the product, on this thread. A
    /// projection served elsewhere (the NPU service) sends its request,
    /// runs `side` while the request is in flight, then waits: the overlap
    /// the split runtime measures. `side` runs exactly once either way, so
    /// results do not depend on which implementation serves the product.
    fn apply_overlapped(&self, p: Product<'_>, side: &mut dyn FnMut() -> Result<()>) -> Result<()> {
        side()?;
        self.apply(p.dir, p.input, p.tokens, p.out)
    }

    /// The product `p` with a LoRA branch (no dropout) carried on the same
    /// pass, when this implementation can: forward
    /// `out = X W^T + s xa B^T` writing `side = xa = X A^T: [tokens, r]`;
    /// input gradient `out = dY W + dxa A` writing
    /// `side = dxa = s dY B: [tokens, r]`, and with `db = Some((xa, db))`
    /// perhaps also `db = s dY^T xa: [out, r]` ([`Carried::BranchAndDb`]).
    /// [`Carried::No`] (the default): nothing written; the caller runs the
    /// branch itself.
    fn apply_carrying_lora(&self, p: Product<'_>, lora: LoraFactors<'_>, side: &mut [f32], db: Option<(&[f32], &mut [f32])>) -> Result<Carried> {
        let _ = (p, lora, side, db);
        Ok(Carried::No)
    }

    /// `out[i] = scales[i] * W[rows[i]]` (`out: [rows.len(), in]`): the
    /// input gradient of a `dY` that is one-hot per row, which is how the
    /// default computes it (so a projection served elsewhere answers it
    /// like any product). Implementations holding `W` read the rows
    /// instead: the vocabulary head's cross-entropy needs `W[target]` for
    /// most rows, and a one-hot product over a 4096-row slice does ~8000
    /// times the gather's arithmetic.
    fn scaled_rows(&self, rows: &[usize], scales: &[f32], out: &mut [f32]) -> Result<()> {
        let info = self.info();
        info.check_rows(rows, scales, out)?;
        let mut one_hot = vec![0.0f32; rows.len() * info.out_features];
        for (i, (&r, &s)) in rows.iter().zip(scales).enumerate() {
            one_hot[i * info.out_features + r] = s;
        }
        self.apply(Direction::InputGrad, &one_hot, rows.len(), out)
    }
}

/// What a LoRA-carrying product did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Carried {
    /// Nothing (nothing written): the caller runs the branch itself.
    No,
    /// The branch; the caller computes `dB` (input gradient).
    Branch,
    /// The branch and `dB` (input gradient only).
    BranchAndDb,
}

/// A LoRA branch `scale x A^T B^T` (`a: [rank, in]`, `b: [out, rank]`,
/// f32) to carry on a frozen product (`ops::bf16_matmul::forward_lora`, `input_grad_lora`).
#[derive(Clone, Copy)]
pub struct LoraFactors<'a> {
    /// `A: [rank, in]`.
    pub a: &'a [f32],
    /// `B: [out, rank]`.
    pub b: &'a [f32],
    /// `r`.
    pub rank: usize,
    /// `lora_alpha / r`.
    pub scale: f32,
}
