//! kernels-ref: memwall's reference kernels.
//!
//! Slow and obvious on purpose: every fast CPU kernel and every WGSL shader is checked against
//! these. No GPU dependency, no unsafe code, f64 accumulation where a long sum would round.
#![forbid(unsafe_code)]

pub mod types;

pub use types::{GgmlType, QK_K};
