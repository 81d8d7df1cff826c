//! A conversation's state on a model: the executor, whose KV cache holds the context, and
//! the tokens in it. Context shift (`ctx_shift`) and the prompt cache (`prompt_cache`) work on
//! it; [`Session`](super::Session) adds the generation settings.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::gpu::{GpuBackend, GpuModel};
use crate::ground::{Device, PhasePlacement, Placement};
use crate::model::Logits;
use crate::scheduler::exec::gpu_stages;
use crate::scheduler::{Exec, Fallback, FallbackCause, KvRebuild};

use super::ctx_shift::{CtxOverflow, ShiftStats};
use super::Model;

/// The state of a conversation on a model: the executor with its KV cache, and the tokens
/// the cache holds. [`Session`](super::Session) wraps one with its generation settings; a
/// draft model of speculative decoding runs in one of its own.
pub(crate) struct Context {
    model: Model,
    pub(crate) exec: Exec,
    /// The tokens whose keys and values are cached, at positions 0..len.
    pub(crate) tokens: Vec<u32>,
    pub(crate) n_ctx: usize,
    /// What happens when the context is full (`crate::engine::ctx_shift`).
    pub(crate) overflow: CtxOverflow,
    /// Tokens a context shift keeps (`None`: the BOS token, if the model adds one).
    pub(crate) n_keep: Option<usize>,
    pub(crate) shifts: ShiftStats,
    /// How many of the executor's fallbacks a token stream has reported.
    fallbacks_reported: usize,
}

/// Tokens per forward batch in prefill: large enough to read each weight once for many
/// tokens, small enough to keep the activations in cache.
pub(crate) const PREFILL_BATCH: usize = 64;

impl Context {
    pub(crate) fn new(model: Model, n_ctx: usize) -> Result<Context> {
        let m = &*model.0;
        let cfg = &m.config;
        let n_ctx = if n_ctx == 0 {
            cfg.n_ctx_train.min(4096)
        } else {
            n_ctx
        };
        let exec_on = |gpu: Option<Arc<GpuModel>>, placement: PhasePlacement| {
            Exec::new(
                cfg.clone(),
                m.gguf.clone(),
                m.pool.clone(),
                gpu,
                placement,
                n_ctx,
                m.prefill_batch,
                m.f32_activations,
                m.kv_types,
                m.cpu_weights.clone(),
            )
        };
        let mut exec = match exec_on(m.gpu.clone(), m.placement.clone()) {
            Ok(e) => e,
            // The GPU backend could not start (no memory left for this session's KV cache
            // and scratch, or the device is lost): this session runs on the CPU.
            Err(e) => match (&m.gpu, FallbackCause::of(&e)) {
                (Some(_), Some(cause)) => {
                    let cpu = PhasePlacement::same(Placement::all(Device::Cpu, cfg.n_layer));
                    let mut exec = exec_on(None, cpu)?;
                    exec.record_fallback(Fallback {
                        cause,
                        reason: e.to_string(),
                        from: Device::Gpu,
                        to: Device::Cpu,
                        stages: gpu_stages(&m.placement),
                        position: 0,
                        kv: KvRebuild::Empty,
                    });
                    exec
                }
                _ => return Err(e),
            },
        };
        if let Some(st) = &m.stream {
            exec.set_cpu_stream(st.clone())?;
        }
        if let Some(c) = &m.experts {
            exec.set_expert_cache(c.clone());
        }
        if let Some(f) = &m.load_fallback {
            // Reported by the session's first events too, not only by the model.
            exec.push_fallback(f.clone());
        }
        if let (Some(every), true) = (m.resample_every, exec.has_gpu()) {
            let mm =
                crate::plan::MemoryModel::from_gguf(&m.gguf, cfg, n_ctx, m.kv_types.mean_bits())?;
            if let Some((budget, blocks)) = &m.managed_residency {
                exec.manage_residency(*budget, blocks.clone())?;
            }
            exec.enable_policy(every, &mm)?;
        }
        Ok(Context {
            model,
            exec,
            tokens: Vec::new(),
            n_ctx,
            overflow: CtxOverflow::default(),
            n_keep: None,
            shifts: ShiftStats::default(),
            fallbacks_reported: 0,
        })
    }

    /// The fallbacks to the CPU (GPU lost or out of memory) no stream has reported yet,
    /// marked reported.
    pub fn take_unreported_fallbacks(&mut self) -> Vec<Fallback> {
        let all = self.exec.fallbacks();
        let new = all.get(self.fallbacks_reported..).unwrap_or(&[]).to_vec();
        self.fallbacks_reported = all.len();
        new
    }

    /// The backend's name ("cpu", "gpu:...").
    pub fn backend_name(&self) -> String {
        self.exec.name()
    }

    /// The KV cache format, e.g. "k=q8_0,v=q4_0" (prompt-cache files record it).
    pub fn kv_signature(&self) -> String {
        self.exec.kv_types().signature()
    }

    /// The executor: placement per phase, moves, stage timings.
    pub fn exec(&self) -> &Exec {
        &self.exec
    }

    /// The most tokens one pass may hold and still give each of them, bit for bit, the
    /// logits a pass over it alone gives: any number on the CPU (its kernels treat the rows of
    /// a batch alike); on a GPU the batches its decode kernels take (split attention and the
    /// batched matvec), past which the tiled prefill kernels sum in another order. Speculative
    /// decoding keeps its verification passes within it, so greedy output is plain decoding's.
    pub fn exact_batch(&self) -> usize {
        if self.exec.has_gpu() {
            crate::gpu::kernels::attention::SPLIT_MAX_TOKENS
                .min(crate::gpu::backend::MATVEC_MAX_TOKENS)
        } else {
            usize::MAX
        }
    }

    /// The executor, to change the placement between calls (the next pass moves what changed).
    pub fn exec_mut(&mut self) -> &mut Exec {
        &mut self.exec
    }

    /// The GPU backend, when the session runs on one (tests read its launch statistics).
    pub fn gpu_backend(&self) -> Option<&GpuBackend> {
        self.exec.gpu_backend()
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        let n_vocab = self.model.0.config.n_vocab;
        if let Some(&bad) = ids.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(Error::InvalidArgument(format!(
                "token id {bad} is outside the vocabulary of {n_vocab}"
            )));
        }
        Ok(())
    }

    /// Appends `ids` to the context and returns the most likely next token (greedy decoding
    /// without reading the logits back from a GPU).
    pub fn eval_argmax(&mut self, ids: &[u32]) -> Result<u32> {
        self.check_ids(ids)?;
        let mut id = None;
        let mut none = Vec::new();
        // A prompt longer than the context goes in chunks; only the last one yields the id.
        self.eval_chunked(ids, Logits::Last, |exec, chunk, pos0, want| {
            if matches!(want, Logits::Last) {
                id = Some(exec.forward_argmax(chunk, pos0)?);
                Ok(())
            } else {
                exec.forward(chunk, pos0, Logits::None, &mut none)
            }
        })?;
        id.ok_or_else(|| Error::InvalidArgument("no tokens to evaluate".into()))
    }

    pub fn model(&self) -> &Model {
        &self.model
    }
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }
    /// Tokens whose keys and values are in the cache.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }
    /// Forgets the cached tokens.
    pub fn reset(&mut self) {
        self.tokens.clear();
    }

    /// Appends `ids` to the context and returns the wanted logits ([rows, n_vocab]).
    pub fn eval(&mut self, ids: &[u32], want: Logits) -> Result<Vec<f32>> {
        self.check_ids(ids)?;
        let mut logits = Vec::new();
        self.eval_chunked(ids, want, |exec, chunk, pos0, want| {
            exec.forward(chunk, pos0, want, &mut logits)
        })?;
        Ok(logits)
    }
}
