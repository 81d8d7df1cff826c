//! kernels-ref: memwall's reference kernels.
//!
//! Slow and obvious on purpose: every fast CPU kernel and every WGSL shader is checked against
//! these. No GPU dependency, no unsafe code, f64 accumulation where a long sum would round.
#![forbid(unsafe_code)]

pub mod error;
pub mod ops;
pub mod quant;
pub mod types;

#[cfg(test)]
mod testutil;

pub use error::RefError;
pub use ops::*;
pub use quant::*;
pub use types::{GgmlType, QK_K};
