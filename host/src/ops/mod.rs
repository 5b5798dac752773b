//! Layer kernels, llm.c style: each layer is a pure function over slices,
//! `xxx_forward(out, saved..., inp, weights..., dims)`, that writes its output
//! and exactly the statistics its backward needs (the `*_backward` functions
//! live next to the forwards in the same file). Buffer shapes are given in
//! comments, outermost first; no model state lives here.
//!
//! Frozen projection weights never come here: they sit behind
//! [`crate::projection::Projection`].
/// An output's base pointer shared by parallel tasks that each write their
/// own disjoint elements (rows, columns or blocks; each user says which).
#[derive(Clone, Copy)]
pub(crate) struct SharedMut(pub *mut f32);
// SAFETY: the tasks sharing it write disjoint elements (see each user).
unsafe impl Send for SharedMut {}
unsafe impl Sync for SharedMut {}

pub mod activation;
pub mod attention;
pub mod bf16_matmul;
pub mod cpu_projection;
pub mod cross_entropy;
pub mod embedding;
pub mod gdn;
pub mod geglu;
pub mod matmul;
pub mod quant_bf16;
pub mod quant_matvec;
pub mod rmsnorm;
pub mod rope;
pub mod softmax;
pub mod swiglu;
