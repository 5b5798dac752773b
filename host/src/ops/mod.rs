//! Layer kernels, llm.c style: each layer is a pure function over slices,
//! `xxx_forward(out, saved..., inp, weights..., dims)`, that writes its output
//! and exactly the statistics its backward needs (the `*_backward` functions
//! live next to the forwards in the same file). Buffer shapes are given in
//! comments, outermost first; no model state lives here.
//!
//! Frozen projection weights never come here: they sit behind
//! [`crate::projection::Projection`].
pub mod activation;
pub mod attention;
pub mod bf16_matmul;
pub mod cross_entropy;
pub mod embedding;
pub mod gdn;
pub mod matmul;
pub mod rmsnorm;
pub mod rope;
pub mod softmax;
pub mod swiglu;
