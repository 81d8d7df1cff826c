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

    /// A prompt cache file was refused (`crate::engine::prompt_cache`).
    #[error("prompt cache {path}: {kind}")]
    PromptCache {
        path: PathBuf,
        kind: PromptCacheError,
    },

    /// A memory budget below the smallest footprint that can run the model.
    #[error(
        "memory budget of {} is below the {} this model needs at the least ({detail})",
        crate::ground::format_size(*budget),
        crate::ground::format_size(*minimum)
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

/// Why a prompt cache file was refused.
#[derive(Debug, thiserror::Error)]
pub enum PromptCacheError {
    #[error("not a memwall prompt cache (the file starts with {found:?})")]
    BadMagic { found: Vec<u8> },
    #[error("version {found}; this memwall reads version {supported}")]
    Version { found: u32, supported: u32 },
    #[error("truncated at byte {at}: the {what} needs {needed} bytes")]
    Truncated {
        at: u64,
        needed: u64,
        what: &'static str,
    },
    #[error("{extra} bytes after the end of the cache")]
    TrailingBytes { extra: u64 },
    #[error(
        "checksum mismatch (stored {stored:016x}, computed {computed:016x}): the file is corrupt"
    )]
    Checksum { stored: u64, computed: u64 },
    #[error("made for another model (fingerprint {file:016x}; this model's is {model:016x})")]
    OtherModel { file: u64, model: u64 },
    #[error("KV types {file:?} differ from the session's {session:?}")]
    KvTypes { file: String, session: String },
    #[error("shape {file} differs from this model's {model} (layers x KV width)")]
    Shape { file: String, model: String },
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    Token { id: u32, n_vocab: usize },
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<crate::ground::SizeError> for Error {
    fn from(e: crate::ground::SizeError) -> Error {
        Error::InvalidArgument(e.0)
    }
}
