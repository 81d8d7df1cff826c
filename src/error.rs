//! Typed errors. Library code returns these; the CLI prints them and exits non-zero.

use std::path::PathBuf;

use crate::gguf::GgufError;

/// Any error memwall's library can return.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Gguf(#[from] GgufError),

    #[error("cannot open {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },

    #[error("model configuration: {0}")]
    Config(String),

    #[error("tokenizer: {0}")]
    Tokenizer(String),

    #[error("chat template: {0}")]
    ChatTemplate(String),

    #[error("tensor {name}: {msg}")]
    Tensor { name: String, msg: String },

    #[error("unsupported tensor type {ty} for {what}")]
    UnsupportedType {
        ty: kernels_ref::GgmlType,
        what: String,
    },

    #[error("prompt of {n_prompt} tokens does not fit the context of {n_ctx} tokens")]
    ContextOverflow { n_prompt: usize, n_ctx: usize },

    /// A prompt cache file was refused (`crate::prompt_cache`).
    #[error("prompt cache {path}: {kind}")]
    PromptCache {
        path: PathBuf,
        kind: crate::prompt_cache::PromptCacheError,
    },

    /// A memory budget below the smallest footprint that can run the model.
    #[error(
        "memory budget of {} is below the {} this model needs at the least ({detail})",
        crate::plan::format_size(*budget),
        crate::plan::format_size(*minimum)
    )]
    MemoryBudget {
        budget: u64,
        minimum: u64,
        detail: String,
    },

    #[error("out of memory: cannot allocate the {what}")]
    OutOfMemory { what: String },

    /// The GPU device was lost (driver reset, device removed, or destroyed): nothing on it
    /// can be read any more. A session goes on on the CPU (`scheduler::exec::failover`).
    #[error("GPU device lost: {reason}")]
    DeviceLost { reason: String },

    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// GPU bring-up or execution failed (no adapter, missing feature, validation, out of
    /// memory, lost device); the caller can go on on the CPU.
    #[error("GPU: {0}")]
    Gpu(String),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;
