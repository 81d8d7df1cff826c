//! memwall: LLM inference for phone and desktop GPUs through wgpu, with a CPU path that can run
//! any layer. See README.md for the tour and docs/ARCHITECTURE.md for the design.
//!
//! The API an app uses is [`api`] (its main types are also at the crate root) with [`Error`].
//! The other modules are the engine's parts: public so that the integration tests, the
//! benchmarks and the tools reach the kernels, the planner and the file format directly, but
//! left out of the documentation and with no promise of stability. The tools (benchmarks,
//! synthetic models, the file checker) are in [`tools`], behind the `tools` feature (on by
//! default); an app that links the engine alone turns it off.

pub mod api;
pub mod error;

pub use api::{Event, Model, ModelConfig, Session};
pub use error::{Error, Result};
pub use kernels_ref::GgmlType;

#[doc(hidden)]
pub mod backend;
#[doc(hidden)]
pub mod chat;
#[doc(hidden)]
pub mod config;
#[doc(hidden)]
pub mod cpu;
#[doc(hidden)]
pub mod cpu_backend;
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod gguf;
#[doc(hidden)]
pub mod gpu;
#[doc(hidden)]
pub mod ground;
#[doc(hidden)]
pub mod kv_type;
#[doc(hidden)]
pub mod logging;
#[doc(hidden)]
pub mod memory;
#[doc(hidden)]
pub mod model;
#[doc(hidden)]
pub mod plan;
#[doc(hidden)]
pub mod sampler;
#[doc(hidden)]
pub mod scheduler;
#[doc(hidden)]
pub mod tokenizer;
#[cfg(feature = "tools")]
pub mod tools;
