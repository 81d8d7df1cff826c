//! memwall: LLM inference for phone and desktop GPUs through wgpu, with a CPU path that can run
//! any layer. See README.md for the tour and `../shared/DESIGN.md` for the architecture.

pub mod api;
pub mod backend;
pub mod bench;
pub mod chat;
pub mod check;
pub mod config;
pub mod cpu;
pub mod cpu_backend;
pub mod engine;
pub mod error;
pub mod gguf;
pub mod gpu;
pub mod ground;
pub mod inspect;
pub mod kv_type;
pub mod logging;
pub mod memory;
pub mod model;
pub mod plan;
pub mod sampler;
pub mod scheduler;
pub mod tokenizer;

pub use error::{Error, Result};
pub use kernels_ref::GgmlType;
