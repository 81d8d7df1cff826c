//! The embedding API: what an app (and the `memwall` CLI) uses to run a model.
//!
//! ```no_run
//! use memwall::api::{Event, ModelConfig};
//!
//! let model = ModelConfig::new("model.gguf").n_ctx(2048).load()?;
//! let mut session = model.session()?;
//! for event in session.prompt("The three primary colors are")? {
//!     match event? {
//!         Event::Done(done) => println!("\n[{:?}, {:.1} tok/s]", done.stop, done.timings.decode_tps),
//!         other => print!("{}", other.text()),
//!     }
//! }
//! # Ok::<(), memwall::Error>(())
//! ```
//!
//! [`Model`] is `Send + Sync` and cheap to clone: share one between threads and give each its
//! own [`Session`] (a `Session` is `Send`: it can move to a worker thread). A
//! [`CancelHandle`] stops a generation from any thread.
//!
//! This module is the public surface: the types an app (and the CLI) needs, one of each;
//! they live in `engine` and the modules under it.

use std::path::{Path, PathBuf};

use crate::error::Result;

pub use crate::chat::ChatMessage;
pub use crate::engine::{
    default_model_path, perplexity, CancelHandle, CtxOverflow, DeviceChoice, DraftParams, Event,
    Finished, Generation, LoadOptions, MemoryReport, Model, Perplexity, PromptCache,
    PromptCacheError, Session, ShiftStats, SpecStats, StopReason, Timings, TokenStream,
};
pub use crate::gpu::device::adapters_table;
pub use crate::gpu::{list_adapters, AdapterInfoRow, HealthReport};
pub use crate::ground::{format_size, parse_size, Device, Phase, PhasePlacement, Placement};
pub use crate::kv_type::{KvType, KvTypes};
pub use crate::logging::{init as init_logging, init_from_env as init_logging_from_env};
pub use crate::memory::experts::ExpertStats;
pub use crate::memory::{detect_limit, measured_peak, IoMode, MemoryLimit, Peak, ReaderStats};
pub use crate::model::Logits;
pub use crate::sampler::SamplerParams;
pub use crate::scheduler::policy::PolicyReport;
pub use crate::scheduler::{ExecStats, Fallback, FallbackCause, KvRebuild};
pub use crate::tokenizer::Tokenizer;

/// The tokenizer of a GGUF file alone: works on vocabulary-only files and reads no weights.
pub fn open_tokenizer(path: impl AsRef<Path>) -> Result<Tokenizer> {
    let gguf = crate::gguf::Gguf::open(path)?;
    Tokenizer::from_gguf(&gguf)
}

/// How to load a model: a builder over [`LoadOptions`].
#[derive(Debug, Clone)]
pub struct ModelConfig {
    path: PathBuf,
    opts: LoadOptions,
}

impl ModelConfig {
    /// The GGUF file to load, with the defaults: device `auto`, every core, the model's
    /// context capped at 4096.
    pub fn new(path: impl AsRef<Path>) -> ModelConfig {
        ModelConfig::with_options(path, LoadOptions::default())
    }

    /// The file and every load option at once (the CLI maps its flags to them).
    pub fn with_options(path: impl AsRef<Path>, opts: LoadOptions) -> ModelConfig {
        ModelConfig {
            path: path.as_ref().to_path_buf(),
            opts,
        }
    }

    /// Where the model runs: cpu, a GPU (by index or name), or auto.
    pub fn device(mut self, device: DeviceChoice) -> Self {
        self.opts.device = device;
        self
    }

    /// Bytes of GPU memory the model may use; the stages that do not fit run on the CPU.
    pub fn gpu_mem_budget(mut self, bytes: u64) -> Self {
        self.opts.gpu_mem_budget = Some(bytes);
        self
    }

    /// Bytes of memory the model may hold on the CPU: anonymous memory, the weight pages it
    /// keeps mapped, the KV cache and the stream slots. Blocks that do not fit stream from
    /// storage; a budget below what the model needs at the least is refused at load, naming
    /// that minimum. Without it: the process's memory limit (cgroup, else available memory)
    /// less a margin.
    pub fn mem_budget(mut self, bytes: u64) -> Self {
        self.opts.mem_budget = Some(bytes);
        self
    }

    /// This model shares the memory budget with `other`, loaded first in this process (a
    /// draft model for speculative decoding): the plan counts what `other` planned to hold
    /// and gets the rest, so the two together stay within one budget. Load the model that
    /// must stay resident (the small draft) first.
    pub fn share_budget_with(mut self, other: &Model) -> Self {
        self.opts.mem_held = self.opts.mem_held.max(other.planned_bytes().unwrap_or(0));
        self
    }

    /// The context of sessions, in tokens (0: the model's, capped at 4096); the GPU budget is
    /// planned for it.
    pub fn n_ctx(mut self, n_ctx: usize) -> Self {
        self.opts.n_ctx = n_ctx;
        self
    }

    /// Where the GPU start-up caches live (the selftest record and the driver pipeline
    /// cache); default `$MEMWALL_CACHE_DIR`, else `$XDG_CACHE_HOME/memwall`, else
    /// `~/.cache/memwall`. Apps point it at their own cache directory.
    pub fn cache_dir(mut self, dir: impl AsRef<Path>) -> Self {
        self.opts.health.cache_dir = Some(dir.as_ref().to_path_buf());
        self
    }

    /// CPU worker threads (default: every core).
    pub fn threads(mut self, n: usize) -> Self {
        self.opts.threads = Some(n);
        self
    }

    /// The KV cache element types of keys and values (e.g. K `KvType::Q8_0`, V
    /// `KvType::Q4_0` for a 2.5x smaller cache than f16). Default: f16, on the CPU and the
    /// GPU.
    pub fn cache_types(mut self, k: KvType, v: KvType) -> Self {
        self.opts.cache_type_k = Some(k);
        self.opts.cache_type_v = Some(v);
        self
    }

    /// Every load option, including those without a builder method.
    pub fn options_mut(&mut self) -> &mut LoadOptions {
        &mut self.opts
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Maps the file, checks it, and brings up the device.
    pub fn load(&self) -> Result<Model> {
        self.load_with_progress(&mut |_, _| {})
    }

    /// [`ModelConfig::load`], reporting (bytes done, bytes total) while the weights are read
    /// in from storage.
    pub fn load_with_progress(&self, progress: &mut dyn FnMut(u64, u64)) -> Result<Model> {
        Model::load_with_progress(&self.path, &self.opts, progress)
    }
}
