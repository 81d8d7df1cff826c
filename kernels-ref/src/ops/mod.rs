//! Reference ops, one file per future shader (`shaders/<name>.wgsl`).
//!
//! Conventions: buffers are row-major with the shape given in each doc comment; long sums are
//! accumulated in f64 and rounded to f32 once. Ops that read quantized weights return
//! `RefError` for lengths that do not add up (those lengths come from files). The pure float
//! ops (`rms_norm`, `rope`, `softmax`, `attention`, `swiglu`, `geglu`, `add`) take shapes from the
//! caller's own code, so a mismatch there is a programmer error: they `assert!` and say so under
//! "Panics".

mod attention;
mod elementwise;
mod embedding;
mod matmul;
mod matvec;
mod moe;
mod rmsnorm;
mod rope;
mod softmax;

pub use attention::{attention, AttnScores};
pub use elementwise::{add, add_scaled, geglu, gelu_tanh, scale, silu, softcap, swiglu};
pub use embedding::embedding;
pub use matmul::matmul;
pub use matvec::{dot_f64, matvec};
pub use moe::route_experts;
pub use rmsnorm::rms_norm;
pub use rope::{rope, Rotation};
pub use softmax::softmax;

#[cfg(test)]
mod tests;
