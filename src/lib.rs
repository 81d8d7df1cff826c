//! memwall: LLM inference for phone and desktop GPUs through wgpu, with a CPU path that can run
//! any layer. See README.md for the tour and `../shared/DESIGN.md` for the architecture.

pub mod chat;
pub mod check;
pub mod error;
pub mod gguf;
pub mod gguf_writer;
pub mod inspect;
pub mod tokenizer;

pub use error::{Error, Result};
pub use kernels_ref::GgmlType;
