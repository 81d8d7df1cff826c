//! memwall: LLM inference for phone and desktop GPUs through wgpu, with a CPU path that can run
//! any layer. See README.md for the tour and `../shared/DESIGN.md` for the architecture.

pub mod cpu;
pub mod error;
pub mod gguf;

pub use error::{Error, Result};
pub use kernels_ref::GgmlType;
