//! Loading a model and running it: [`Model`] (the loaded file, shared) and [`Session`] (a
//! conversation on it: its KV cache, sampler and drafter), the library API the CLI and apps
//! are built on. `memwall::api` re-exports it.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::WeightId;
use crate::config::Config;
use crate::cpu_backend::{CpuBackend, PreparedWeights};
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::gpu::{DeviceSelector, GpuLoadOptions, GpuModel};
use crate::ground::{Device, PhasePlacement};
use crate::kv_type::{KvType, KvTypes};
use crate::memory::experts::{ExpertCache, ExpertStats, SharedExpertCache};
use crate::scheduler::Fallback;
use crate::tokenizer::Tokenizer;
use context::PREFILL_BATCH;
pub use ctx_shift::{CtxOverflow, ShiftStats};
pub use prompt_cache::{PromptCache, PromptCacheError};
pub use session::{CancelHandle, Session};
pub use speculative::{DraftParams, SpecStats};
pub use stream::{Event, Finished, TokenStream};

mod budget;
mod context;
pub(crate) mod ctx_shift;
pub(crate) mod generate;
mod open;
mod perplexity;
mod prefault;
mod prompt_cache;
mod session;
pub(crate) mod speculative;
mod stream;

pub use budget::MemoryReport;

use open::{initial_placement, managed, open_gpu};
pub use perplexity::{perplexity, Perplexity};
use prefault::{prefault, prefault_plan};

/// Where the model runs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum DeviceChoice {
    /// The CPU path.
    Cpu,
    /// A GPU adapter (any, including software rasterizers such as lavapipe); failing to open
    /// it is an error.
    Gpu(DeviceSelector),
    /// A hardware GPU if there is one that works, else the CPU (with a note saying why).
    /// Software adapters (lavapipe, llvmpipe) are slower than the CPU path, so `auto` skips
    /// them.
    #[default]
    Auto,
}

impl DeviceChoice {
    /// Parses `cpu|gpu|auto|<adapter index>|<adapter name substring>`.
    pub fn parse(s: &str) -> Result<DeviceChoice> {
        match s.trim().to_lowercase().as_str() {
            "cpu" => Ok(DeviceChoice::Cpu),
            "auto" => Ok(DeviceChoice::Auto),
            _ => Ok(DeviceChoice::Gpu(DeviceSelector::parse(s)?)),
        }
    }
}

/// How to load a model.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Worker threads for the CPU backend; `None` uses every core.
    pub threads: Option<usize>,
    /// Where to run the model.
    pub device: DeviceChoice,
    /// GPU upload options (tests force tensor splitting with them).
    pub gpu: GpuLoadOptions,
    /// Matmul activations in f32 on every backend, instead of 8-bit chunks (the CPU's fast
    /// integer kernels and the GPU's matching path). Slower on the CPU; the mode in which the
    /// CPU and GPU paths agree to f32 rounding, used to validate one against the other.
    pub f32_activations: bool,
    /// `--no-repack`: keep the CPU's weights in the mmap only. By default the matrices of the
    /// stages placed on the CPU are packed once at load into the layout the CPU GEMM reads
    /// (AVX-512 VNNI, Q4_0/Q4_1/Q8_0 only; as many bytes as those weights, anonymous memory
    /// instead of file pages), so matmuls skip a per-call rearrangement. Also off with
    /// `stream` (memory tight enough to stream weights from storage) and `f32_activations`.
    pub no_repack: bool,
    /// `--gpu-layers N`: the last N blocks and the head on the GPU, the rest on the CPU
    /// (with a GPU device; `None` puts every stage on it).
    pub gpu_layers: Option<usize>,
    /// `--gpu-mem-budget`: bytes of GPU memory the model may use (weights, KV cache, scratch,
    /// staging); the stages that fit go to the GPU, the rest run on the CPU.
    pub gpu_mem_budget: Option<u64>,
    /// With `gpu_mem_budget`: run the blocks that do not fit on the GPU too, streaming their
    /// weights from the mmap through two block-sized slots, instead of on the CPU.
    pub stream: bool,
    /// The context the GPU budget is planned for (0: the model's, capped at 4096).
    pub n_ctx: usize,
    /// Re-decide the placement every N decoded tokens (and at each prompt) from measured
    /// stage times (`scheduler::policy`); `None` keeps it fixed.
    pub resample_every: Option<usize>,
    /// `--cache-type-k`: the keys' KV cache type; `None`: f16.
    pub cache_type_k: Option<KvType>,
    /// `--cache-type-v`: the values' KV cache type (`None` as for `cache_type_k`).
    pub cache_type_v: Option<KvType>,
    /// The start-up selftest of a GPU (cache directory, test hooks, known-bad entries).
    pub health: crate::gpu::HealthOptions,
    /// `--mem-budget`: the memory the process may hold (anonymous memory, the file pages it
    /// keeps mapped, the KV cache, the stream slots; a unified-memory GPU's buffers). Blocks
    /// that do not fit stream from storage. `None`: the process's cgroup limit, else
    /// `MemAvailable`, less a margin.
    pub mem_budget: Option<u64>,
    /// How streamed reads keep out of the page cache (`None`: `O_DIRECT` where the file
    /// system takes it, else drop-behind).
    pub stream_io: Option<crate::memory::IoMode>,
    /// Bytes of the budget another model of this process holds (a draft model loaded first,
    /// [`Model::planned_bytes`]): its plan counted what the process held before it, so this
    /// plan counts the larger of this and what the process holds now, and gets the rest.
    pub mem_held: u64,
}

/// The cache types a model loaded with `opts` uses: the chosen ones, f16 by default (on the
/// CPU and the GPU alike: both hold the same bytes, so layers move between them losslessly).
fn resolve_kv_types(opts: &LoadOptions, head_dim: usize) -> Result<KvTypes> {
    let default = KvType::F16;
    let t = KvTypes {
        k: opts.cache_type_k.unwrap_or(default),
        v: opts.cache_type_v.unwrap_or(default),
    };
    t.check_head_dim(head_dim)?;
    Ok(t)
}

/// A loaded model: the mapped file, its configuration and tokenizer, the weights prepared for
/// the devices it runs on, the memory plan. Clones share all of it (`Send + Sync`): share one
/// between threads and give each its own [`Session`].
#[derive(Clone)]
pub struct Model(Arc<Loaded>);

/// What a [`Model`] shares between its clones and sessions.
pub(crate) struct Loaded {
    gguf: Arc<Gguf>,
    config: Config,
    tokenizer: Tokenizer,
    chat_template: Option<String>,
    pool: Arc<crate::cpu::par::Workers>,
    load_time: Duration,
    /// The weights on the GPU when the model runs there.
    gpu: Option<Arc<GpuModel>>,
    /// Why `auto` chose what it chose (one line for the user), if it fell back.
    device_note: Option<String>,
    f32_activations: bool,
    /// Where each stage runs when a session starts.
    placement: PhasePlacement,
    /// The CPU's weights prepared at load: the 1-D weights dequantized, and the CPU stages'
    /// matrices packed (none with `LoadOptions::no_repack`).
    cpu_weights: Arc<PreparedWeights>,
    resample_every: Option<usize>,
    /// K and V cache types of every session.
    kv_types: KvTypes,
    /// With `--stream`, a budget and `--resample-every`: the budget and the blocks each
    /// session makes resident itself at start; the policy then decides residency.
    managed_residency: Option<(u64, Vec<bool>)>,
    /// Stages the load moved to the CPU because the GPU ran out of memory (or was lost)
    /// while uploading; every session reports it in its first events.
    load_fallback: Option<Fallback>,
    /// The memory plan of a CPU model (budget, resident and streamed blocks).
    memory: Option<MemoryReport>,
    /// The CPU blocks that stream and the reader bringing them (shared by the sessions).
    stream: Option<crate::scheduler::exec::BlockStream>,
    /// The expert cache of a mixture of experts that does not fit (shared by the sessions).
    experts: Option<SharedExpertCache>,
    /// Tokens per prefill batch.
    prefill_batch: usize,
    /// `--mem-budget`, as given.
    mem_budget: Option<u64>,
    /// The context of `Model::session` (`LoadOptions::n_ctx`).
    n_ctx: usize,
}

impl std::fmt::Debug for Model {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Model")
            .field("config", &self.0.config)
            .finish()
    }
}

impl Model {
    /// Maps and validates the GGUF file and reads the configuration and tokenizer. Weights stay
    /// in the map: the CPU backend reads them from there.
    pub fn load(path: impl AsRef<Path>, opts: &LoadOptions) -> Result<Model> {
        Self::load_with_progress(path, opts, &mut |_, _| {})
    }

    /// `load`, reporting (bytes done, bytes total) while it pages the weights in from storage,
    /// so the first token is not slowed by page faults and a slow disk shows as progress.
    pub fn load_with_progress(
        path: impl AsRef<Path>,
        opts: &LoadOptions,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model> {
        let t0 = Instant::now();
        let (gguf, config) = crate::config::open_model(path)?;
        let gguf = Arc::new(gguf);
        let tokenizer = Tokenizer::from_gguf(&gguf)?;
        let chat_template = crate::chat::template_from_gguf(&gguf);
        let pool = crate::cpu::par::Workers::new(opts.threads)?;
        // Check every weight the forward pass will touch now, so a bad file fails at load and
        // not in the middle of a generation.
        CpuBackend::check_weights(&gguf, &config)?;
        let (gpu, device_note, placement, load_fallback) = open_gpu(&gguf, &config, opts)?;
        let kv_types = resolve_kv_types(opts, config.head_dim)?;
        let managed_residency = match (&gpu, managed(opts, &config), opts.gpu_mem_budget) {
            (Some(_), true, Some(budget)) => {
                let fit = initial_placement(
                    &gguf,
                    &config,
                    &LoadOptions {
                        resample_every: None,
                        ..opts.clone()
                    },
                )?
                .1;
                let blocks = fit.layers.iter().map(|&d| d == Device::Gpu).collect();
                Some((budget, blocks))
            }
            _ => None,
        };
        let pool = Arc::new(pool);
        let pack = !(opts.no_repack || opts.stream || opts.f32_activations);
        // The CPU's memory plan when every stage runs on the CPU; a GPU model was planned by
        // `open_gpu` (`--gpu-mem-budget`, or a unified-memory GPU within `--mem-budget`).
        let mut memory = match &gpu {
            None => budget::decide(&gguf, &config, opts, kv_types, pack)?,
            Some(_) => None,
        };

        let streams = memory.as_ref().is_some_and(|(m, _)| m.residency.streams());
        // Experts held in a cache: the budget is as tight as when blocks stream, so what the
        // load reads is dropped from the page cache as it goes.
        let tight = streams || memory.as_ref().is_some_and(|(m, _)| m.experts.is_some());
        let (layers, head) = if streams {
            let r = memory.as_ref().map(|(m, _)| m.residency.resident.clone());
            let r = r.unwrap_or_default();
            // The resident blocks and the head packed (where packing is on); streamed blocks
            // run from their file layout as they arrive.
            (r.iter().map(|&x| x && pack).collect(), pack)
        } else if !pack {
            // No matrix packed: the 1-D weights only.
            (vec![false; config.n_layer], false)
        } else {
            let on_cpu = |l: usize| {
                placement.prefill.layers.get(l) == Some(&Device::Cpu)
                    || placement.decode.layers.get(l) == Some(&Device::Cpu)
            };
            let head =
                placement.prefill.head == Device::Cpu || placement.decode.head == Device::Cpu;
            ((0..config.n_layer).map(on_cpu).collect(), head)
        };
        let cpu_weights =
            pool.install(|| PreparedWeights::build(&gguf, &config, &layers, head, tight))?;
        // After packing, which read its tensors once and handed the packed ones' pages back,
        // and without them: paging them in would hold both copies at the peak (and a touch of a
        // norm maps the whole page-cache folio around it, packed neighbours included).
        let mut held: HashSet<String> = cpu_weights.tensor_names().collect();
        let mut stream = None;
        if let Some((report, spans)) = memory.as_mut().filter(|_| streams) {
            let spans = std::mem::take(spans);
            let st = budget::start_stream(&gguf, report, spans, opts.stream_io)?;
            // Streamed blocks are read by the reader only; the embedding table stays on
            // storage (a token reads one row) unless it is the head and was not packed.
            for l in (0..config.n_layer).filter(|&l| st.streamed[l]) {
                held.extend(budget::block_tensors(&gguf, l).map(|t| t.name.clone()));
            }
            let head_maps_table = config.tied_embeddings && !head;
            if !head_maps_table {
                held.insert(WeightId::TokEmbd.tensor_name());
            }
            stream = Some(st);
        }
        // Whether either phase's placement runs block l on device d.
        let runs_on = |l: usize, d: Device| {
            placement.prefill.layers.get(l) == Some(&d)
                || placement.decode.layers.get(l) == Some(&d)
        };
        let on_cpu = |l: usize| runs_on(l, Device::Cpu);
        let gpu_streams = gpu.as_ref().is_some_and(|g| {
            (0..config.n_layer).any(|l| runs_on(l, Device::Gpu) && !g.has_layer(l))
        });
        if let (Some(g), Some(_)) = (&gpu, opts.mem_budget) {
            // Under a budget, blocks the GPU holds and no placement runs on the CPU are not
            // also held as mapped file pages (the upload read them) or page cache.
            for l in (0..config.n_layer).filter(|&l| g.has_layer(l) && !on_cpu(l)) {
                for t in budget::block_tensors(&gguf, l) {
                    gguf.release_pages(t);
                    held.insert(t.name.clone());
                }
            }
            gguf.drop_file_cache();
        }
        if let (Some(g), None, true) = (&gpu, &stream, gpu_streams) {
            // A GPU that streams blocks reads them through the storage reader; blocks it
            // streams and no placement runs on the CPU are not paged in through the map.
            let st = budget::gpu_reader(&gguf, &config, opts.stream_io)?;
            for l in (0..config.n_layer).filter(|&l| !g.has_layer(l) && !on_cpu(l)) {
                held.extend(budget::block_tensors(&gguf, l).map(|t| t.name.clone()));
            }
            stream = Some(st);
        }
        let mut experts = None;
        // A mixture of experts that does not fit keeps its experts in a cache instead of
        // streaming whole blocks.
        let planned = memory
            .as_mut()
            .and_then(|(r, _)| Some((r.expert_layout.take()?, r)));
        if let Some((layout, report)) = planned {
            // The expert stacks are read by the cache only, never paged in through the map;
            // the embedding table stays on storage (a token reads one row) unless it is the
            // head and was not packed.
            if !config.tied_embeddings || head {
                held.insert(WeightId::TokEmbd.tensor_name());
            }
            for l in 0..config.n_layer {
                let stacks = crate::backend::block_matrices(&config, l);
                let stacks = stacks.into_iter().filter(|id| id.is_expert_stack());
                held.extend(stacks.map(|id| id.tensor_name()));
            }
            let path = gguf.path().ok_or_else(|| {
                Error::InvalidArgument("an expert cache needs a model opened from a file".into())
            })?;
            let capacity = report.experts.as_ref().map_or(0, |e| e.capacity_bytes);
            let cache = ExpertCache::open(path, opts.stream_io, layout, capacity)?;
            report.io_mode = Some(cache.mode());
            experts = Some(Arc::new(std::sync::Mutex::new(cache)));
        }
        prefault(&gguf, &prefault_plan(&gguf, &held), progress);
        if tight {
            // What the prefault's faults read ahead around the small tensors it maps (norms,
            // an f32 router) goes: megabytes per block of experts' bytes otherwise.
            gguf.drop_file_cache();
        }
        let prefill_batch = memory
            .as_ref()
            .map_or(PREFILL_BATCH, |(m, _)| m.prefill_batch);
        let memory = memory.map(|(m, _)| m);
        Ok(Model(Arc::new(Loaded {
            n_ctx: opts.n_ctx,
            mem_budget: opts.mem_budget,
            memory,
            stream,
            experts,
            prefill_batch,
            cpu_weights: Arc::new(cpu_weights),
            load_fallback,
            kv_types,
            managed_residency,
            placement,
            resample_every: opts.resample_every,
            gguf,
            config,
            tokenizer,
            chat_template,
            pool,
            load_time: t0.elapsed(),
            gpu,
            device_note,
            f32_activations: opts.f32_activations,
        })))
    }

    /// The memory plan of a model run on the CPU: the budget, the resident and streamed
    /// blocks, the stream ring (`None` with a GPU, or where no limit could be read).
    pub fn memory(&self) -> Option<&MemoryReport> {
        self.0.memory.as_ref()
    }

    /// The memory this model's plan holds at most (what the process held before the load,
    /// the KV cache, scratch, resident weights, stream slots), when it was planned against a
    /// budget: what a second model sharing the budget passes as [`LoadOptions::mem_held`].
    pub fn planned_bytes(&self) -> Option<u64> {
        self.memory().map(|m| m.residency.planned_bytes)
    }

    /// The memory budget the load was given (`LoadOptions::mem_budget`), if any.
    pub fn mem_budget(&self) -> Option<u64> {
        self.0.mem_budget
    }

    /// Tokens per prefill batch (larger when blocks stream: each is read once per batch).
    pub fn prefill_batch(&self) -> usize {
        self.0.prefill_batch
    }

    /// The K and V cache types of this model's sessions.
    pub fn kv_types(&self) -> KvTypes {
        self.0.kv_types
    }

    /// The device the model runs on, e.g. `cpu` or `gpu:NVIDIA ... (Vulkan)`.
    pub fn device_name(&self) -> String {
        match &self.0.gpu {
            Some(g) => format!("gpu:{} ({})", g.ctx.info.name, g.ctx.info.backend),
            None => "cpu".into(),
        }
    }

    /// Why `--device auto` fell back to the CPU, if it did.
    pub fn device_note(&self) -> Option<&str> {
        self.0.device_note.as_deref()
    }

    /// Where each stage runs when a session starts.
    pub fn placement(&self) -> &PhasePlacement {
        &self.0.placement
    }

    /// The stages the load moved to the CPU because the GPU failed (ran out of memory) while
    /// their weights were uploaded, if it did.
    pub fn load_fallback(&self) -> Option<&Fallback> {
        self.0.load_fallback.as_ref()
    }

    /// What the GPU load warned about (a variant the selftest turned down, a slow fallback),
    /// one line each; empty on the CPU.
    pub fn warnings(&self) -> &[String] {
        self.0.gpu.as_ref().map_or(&[], |g| &g.warnings)
    }

    /// The GPU's start-up check of this load (variants tested, the record and pipeline
    /// cache used), when the model runs on a GPU.
    pub fn gpu_startup(&self) -> Option<&crate::gpu::HealthReport> {
        self.0.gpu.as_ref().map(|g| &g.health)
    }

    /// The GPU copy of the weights, when the model runs on a GPU.
    pub fn gpu(&self) -> Option<&Arc<GpuModel>> {
        self.0.gpu.as_ref()
    }

    pub fn config(&self) -> &Config {
        &self.0.config
    }
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.0.tokenizer
    }
    pub fn gguf(&self) -> &Gguf {
        &self.0.gguf
    }
    pub fn chat_template(&self) -> Option<&str> {
        self.0.chat_template.as_deref()
    }
    pub fn cpu_weights(&self) -> &PreparedWeights {
        &self.0.cpu_weights
    }

    pub fn load_time(&self) -> Duration {
        self.0.load_time
    }

    /// What the expert cache has done so far (`None`: the model has none, its experts all
    /// fit or it has no experts).
    pub fn expert_stats(&self) -> Option<ExpertStats> {
        let c = self.0.experts.as_ref()?;
        let c = c.lock().unwrap_or_else(|e| e.into_inner());
        Some(c.stats())
    }

    /// Bytes of weights one decoded token must read: every matrix once (the embedding table
    /// only when it doubles as the output head; otherwise a token reads one row of it), and of
    /// an expert stack only the `n_expert_used` experts the token is routed to.
    pub fn weight_bytes_per_token(&self) -> u64 {
        let used = |t: &crate::gguf::TensorInfo| match (&self.0.config.moe, t.dims.len()) {
            (Some(m), 3) => t.n_bytes / m.n_expert as u64 * m.n_expert_used as u64,
            _ => t.n_bytes,
        };
        self.0
            .gguf
            .tensors()
            .iter()
            .filter(|t| t.dims.len() >= 2)
            .filter(|t| t.name != "token_embd.weight" || self.0.config.tied_embeddings)
            .map(used)
            .sum()
    }

    /// Renders chat messages with the model's own template, ending with the assistant's turn.
    pub fn render_chat(&self, messages: &[crate::chat::ChatMessage]) -> Result<String> {
        let tmpl = self.0.chat_template.as_deref().ok_or_else(|| {
            Error::ChatTemplate("the model has no tokenizer.chat_template".into())
        })?;
        let tok = &self.0.tokenizer;
        let piece = |id: Option<u32>| {
            id.map(|i| tok.token_text(i).to_string())
                .unwrap_or_default()
        };
        crate::chat::apply_chat_template(tmpl, messages, true, &piece(tok.bos()), &piece(tok.eos()))
    }

    /// A new conversation with the context the model was loaded for
    /// ([`LoadOptions::n_ctx`]), greedy sampling and up to 256 new tokens per prompt (see the
    /// session's setters).
    pub fn session(&self) -> Result<Session> {
        Session::new(self.clone(), self.0.n_ctx)
    }

    /// A new conversation with a context of `n_ctx` tokens (0: the model's training context,
    /// capped at 4096 as llama.cpp does by default).
    pub fn session_with_ctx(&self, n_ctx: usize) -> Result<Session> {
        Session::new(self.clone(), n_ctx)
    }

    /// Token ids of `text`; `add_special` adds the tokens the model wants at the start of a
    /// context (BOS). Special tokens written in the text (`<|im_start|>`) are parsed.
    pub fn tokenize(&self, text: &str, add_special: bool) -> Vec<u32> {
        self.0.tokenizer.encode(text, add_special, true)
    }

    /// The text of token ids (as a generation streams it: pieces joined as they are).
    pub fn detokenize(&self, ids: &[u32]) -> String {
        let tok = &self.0.tokenizer;
        let bytes: Vec<u8> = ids
            .iter()
            .flat_map(|&id| tok.decode_token(id, false))
            .collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }
}

/// The model used when none is given: `$MEMWALL_MODEL`, else the test model where
/// `scripts/fetch-model.sh` caches it.
pub fn default_model_path() -> std::path::PathBuf {
    if let Some(p) = std::env::var_os("MEMWALL_MODEL") {
        return p.into();
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| ".".into());
    Path::new(&home).join(".cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf")
}

/// Why a generation stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    /// An end-of-generation token (not part of the text).
    Eog,
    /// The requested number of tokens.
    Limit,
    /// The context is full.
    ContextFull,
    /// The caller stopped it (a callback returning false, a cancel handle).
    Cancelled,
}

/// Timings of one generation.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Timings {
    pub load_ms: f64,
    /// From the start of the prompt's evaluation to the first sampled token.
    pub ttft_ms: f64,
    pub prefill_tps: f64,
    pub decode_tps: f64,
    pub n_prompt: usize,
    pub n_decoded: usize,
}

/// What `generate` returns.
#[derive(Debug, Clone)]
pub struct Generation {
    pub generated_ids: Vec<u32>,
    pub text: String,
    /// For each generated token, the `n_probs` most likely tokens (softmax of raw logits).
    pub top_probs: Vec<Vec<(u32, f64)>>,
    pub stop: StopReason,
    pub timings: Timings,
    /// With a speculator: passes, drafted and accepted tokens of this generation.
    pub speculative: Option<speculative::SpecStats>,
}
