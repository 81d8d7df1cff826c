//! A conversation: the KV cache and the tokens it holds (a [`Context`]), the sampler and the
//! generation settings, and the drafter of speculative decoding.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::chat::ChatMessage;
use crate::error::{Error, Result};
use crate::gpu::GpuBackend;
use crate::ground::PhasePlacement;
use crate::memory::ReaderStats;
use crate::model::Logits;
use crate::sampler::{Sampler, SamplerParams};
use crate::scheduler::policy::PolicyReport;
use crate::scheduler::{Exec, ExecStats, Fallback};

use super::context::Context;
use super::ctx_shift::{CtxOverflow, ShiftStats};
use super::generate::{Generator, Step};
use super::prompt_cache::PromptCache;
use super::speculative::{DraftParams, SpecStats, Speculator};
use super::stream::{Event, Finished, TokenStream};
use super::{Generation, Model, StopReason};

/// Stops a generation from any thread: the generation ends with [`StopReason::Cancelled`]
/// before its next token or
/// prompt batch. Each new prompt clears the flag, so a cancel stops the generation running
/// when it is called (or the next one, if none runs).
#[derive(Debug, Clone, Default)]
pub struct CancelHandle(Arc<AtomicBool>);

impl CancelHandle {
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// A conversation on a model: what was evaluated stays in the cache, so each prompt continues
/// the context. `Send`: it can move to a worker thread.
pub struct Session {
    ctx: Context,
    sampler: Sampler,
    max_tokens: usize,
    n_probs: usize,
    cancel: CancelHandle,
    /// Speculative decoding's drafter, when set.
    spec: Option<Speculator>,
}

impl Session {
    /// A new conversation on `model` with a context of `n_ctx` tokens (0: the model's
    /// training context, capped at 4096), greedy sampling and up to 256 new tokens per prompt.
    /// On a GPU model whose device cannot hold this session's KV cache and scratch (or is
    /// lost), the session runs on the CPU and reports the move in [`Session::fallbacks`].
    pub fn new(model: Model, n_ctx: usize) -> Result<Session> {
        Ok(Session {
            ctx: Context::new(model, n_ctx)?,
            sampler: Sampler::new(SamplerParams::greedy())?,
            max_tokens: 256,
            n_probs: 0,
            cancel: CancelHandle::default(),
            spec: None,
        })
    }

    /// Sampling from now on (default: greedy). The seed restarts the random sequence.
    pub fn set_sampler(&mut self, params: SamplerParams) -> Result<()> {
        self.sampler = Sampler::new(params.clone())?;
        if let Some(s) = &mut self.spec {
            s.set_sampling(params)?;
        }
        Ok(())
    }

    /// Speculative decoding with a draft model of the same vocabulary (checked here): its
    /// own session of this session's context proposes up to `params.max` tokens, and each
    /// pass of this model verifies them at once. Greedy output equals plain decoding's;
    /// sampled output follows the same distribution.
    pub fn set_draft_model(&mut self, draft: &Model, params: DraftParams) -> Result<()> {
        let draft = Context::new(draft.clone(), self.n_ctx())?;
        let sampling = self.sampler.params().clone();
        let model = self.ctx.model().clone();
        self.spec = Some(Speculator::with_model(draft, &model, sampling, params)?);
        Ok(())
    }

    /// Speculative decoding by prompt lookup: the latest earlier occurrence of the context's
    /// last n tokens (n from `ngram_max` down to `ngram_min`) proposes what followed it.
    pub fn set_draft_lookup(
        &mut self,
        ngram_min: usize,
        ngram_max: usize,
        params: DraftParams,
    ) -> Result<()> {
        self.spec = Some(Speculator::lookup(ngram_min, ngram_max, params)?);
        Ok(())
    }

    /// Plain decoding again (no drafts).
    pub fn clear_draft(&mut self) {
        self.spec = None;
    }

    /// What speculation did since the drafter was set (`None` without one).
    pub fn draft_stats(&self) -> Option<SpecStats> {
        self.spec.as_ref().map(Speculator::stats)
    }

    /// The most tokens one prompt generates (default 256).
    pub fn set_max_tokens(&mut self, n: usize) {
        self.max_tokens = n;
    }

    /// Report the `k` most likely tokens at each step in [`Finished::top_probs`].
    pub fn set_n_probs(&mut self, k: usize) {
        self.n_probs = k;
    }

    /// A handle that stops this session's generations from another thread.
    pub fn cancel_handle(&self) -> CancelHandle {
        self.cancel.clone()
    }

    /// Generates after `text`, appended to the context as it is (the first prompt of a
    /// context starts with the model's BOS). Tokens come as the stream is iterated.
    pub fn prompt(&mut self, text: &str) -> Result<TokenStream<'_>> {
        let add_special = self.ctx.tokens().is_empty();
        let ids = self.ctx.model().tokenizer().encode(text, add_special, true);
        self.prompt_tokens(&ids)
    }

    /// Generates the assistant's reply to a conversation, rendered with the model's chat
    /// template. When the session already holds the start of this conversation (the previous
    /// turns), only the new part is evaluated; otherwise the context starts over.
    pub fn chat(&mut self, messages: &[ChatMessage]) -> Result<TokenStream<'_>> {
        if messages.is_empty() {
            return Err(Error::InvalidArgument(
                "the conversation has no message".into(),
            ));
        }
        let text = self.ctx.model().render_chat(messages)?;
        let ids = self.ctx.model().tokenizer().encode(&text, true, true);
        let held = self.ctx.tokens();
        let continues = ids.len() > held.len() && ids.starts_with(held);
        let new = if continues {
            ids[held.len()..].to_vec()
        } else {
            self.ctx.reset();
            ids
        };
        self.prompt_tokens(&new)
    }

    /// Generates after token ids appended to the context.
    pub fn prompt_tokens(&mut self, ids: &[u32]) -> Result<TokenStream<'_>> {
        let g = self.generator(ids)?;
        Ok(TokenStream::new(g, ids.to_vec()))
    }

    /// A generation after `ids` with this session's sampler, limits, drafter and cancel
    /// handle (cleared: a cancel stops the generation running when it is called).
    fn generator(&mut self, ids: &[u32]) -> Result<Generator<'_>> {
        self.cancel.0.store(false, Ordering::Relaxed);
        let mut g = Generator::new(
            &mut self.ctx,
            &mut self.sampler,
            ids,
            self.max_tokens,
            self.n_probs,
        )?;
        g.set_cancel(self.cancel.0.clone());
        if let Some(s) = self.spec.as_mut() {
            g.set_speculator(s);
        }
        Ok(g)
    }

    /// The callback form of [`Session::prompt`]: `on_text` gets each piece of text as it is
    /// complete and returns false to stop.
    pub fn prompt_with(
        &mut self,
        text: &str,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<Finished> {
        let mut stream = self.prompt(text)?;
        while let Some(ev) = stream.next() {
            match ev? {
                Event::Done(done) => return Ok(*done),
                ev => {
                    let t = ev.text();
                    if !t.is_empty() && !on_text(t) {
                        stream.stop();
                    }
                }
            }
        }
        Err(Error::InvalidArgument(
            "the generation ended without a summary".into(),
        ))
    }

    /// Forgets the context.
    pub fn reset(&mut self) {
        self.ctx.reset();
    }

    /// Tokens in the context.
    pub fn tokens(&self) -> &[u32] {
        self.ctx.tokens()
    }

    pub fn n_ctx(&self) -> usize {
        self.ctx.n_ctx()
    }

    /// Every move of this session's stages to the CPU after a GPU failure (lost device, out
    /// of memory), oldest first; a stream also reports each as `Event::DeviceFallback`.
    pub fn fallbacks(&self) -> &[Fallback] {
        self.ctx.exec().fallbacks()
    }

    /// Generates after token ids appended to the context, with this session's sampler,
    /// drafter and limits, calling `on_text` with each new piece of text as soon as it is
    /// complete UTF-8; `on_text` returns false to stop. The callback form of
    /// [`Session::prompt_tokens`], returning the generated ids (and, with `set_n_probs`,
    /// the top probabilities at each step).
    pub fn generate(
        &mut self,
        prompt: &[u32],
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<Generation> {
        let mut g = self.generator(prompt)?;
        loop {
            match g.step()? {
                Step::Prefill { .. } => {}
                Step::Token { text, .. } => {
                    if !text.is_empty() && !on_text(&text) {
                        g.stop(StopReason::Cancelled);
                    }
                }
                Step::Done { text, .. } => {
                    if !text.is_empty() {
                        on_text(&text);
                    }
                    return Ok(g.into_generation());
                }
            }
        }
    }

    /// Appends `ids` to the context and returns the wanted logits ([rows, n_vocab]): the
    /// forward pass alone, without sampling (perplexity, scoring, tests).
    pub fn eval(&mut self, ids: &[u32], want: Logits) -> Result<Vec<f32>> {
        self.ctx.eval(ids, want)
    }

    /// Appends `ids` to the context and returns the most likely next token (greedy decoding
    /// without reading the logits back from a GPU).
    pub fn eval_argmax(&mut self, ids: &[u32]) -> Result<u32> {
        self.ctx.eval_argmax(ids)
    }

    /// The model this session runs.
    pub fn model(&self) -> &Model {
        self.ctx.model()
    }

    /// What a full context does: shift (default; keeps the first [`Session::set_keep`]
    /// tokens and drops half of the rest) or stop the generation.
    pub fn set_ctx_overflow(&mut self, overflow: CtxOverflow) {
        self.ctx.set_ctx_overflow(overflow);
    }

    pub fn ctx_overflow(&self) -> CtxOverflow {
        self.ctx.ctx_overflow()
    }

    /// Tokens a context shift keeps at the start (`None`: the BOS token, if the model adds
    /// one).
    pub fn set_keep(&mut self, n_keep: Option<usize>) {
        self.ctx.set_keep(n_keep);
    }

    /// What context shifts did so far.
    pub fn shift_stats(&self) -> ShiftStats {
        self.ctx.shift_stats()
    }

    /// Drops the cached tokens from position `n` on.
    pub fn truncate(&mut self, n: usize) {
        self.ctx.truncate(n);
    }

    /// Keeps the longest prefix of the context that `tokens` starts with (dropping the rest)
    /// and returns its length: evaluate `tokens[n..]` next.
    pub fn reuse_prefix(&mut self, tokens: &[u32]) -> usize {
        self.ctx.reuse_prefix(tokens)
    }

    /// Replaces the context with the longest prefix of `cache` that `prompt` starts with (at
    /// most `prompt.len() - 1` tokens: the rest must yield logits). Returns its length:
    /// evaluate `prompt[n..]` next.
    pub fn restore_prefix(&mut self, cache: &PromptCache, prompt: &[u32]) -> Result<usize> {
        self.ctx.restore_prefix(cache, prompt)
    }

    /// Writes the context's tokens and their KV to `path` (a failed save leaves an existing
    /// file as it was). Returns the bytes written.
    pub fn save_prompt_cache(&mut self, path: impl AsRef<Path>) -> Result<u64> {
        self.ctx.save_prompt_cache(path)
    }

    /// The prompt-cache file image of the context.
    pub fn prompt_cache_image(&mut self) -> Result<Vec<u8>> {
        self.ctx.prompt_cache_image()
    }

    /// The KV cache format, e.g. "k=q8_0,v=q4_0" (prompt-cache files record it).
    pub fn kv_signature(&self) -> String {
        self.ctx.kv_signature()
    }

    /// What ran where, e.g. `cpu` or `cpu+gpu:... [c|cccGGG|G]`.
    pub fn backend_name(&self) -> String {
        self.ctx.backend_name()
    }

    /// Where each stage runs now, per phase (the offload policy and GPU failures move them).
    pub fn placement(&self) -> &PhasePlacement {
        self.ctx.exec().placement()
    }

    /// What the executor did: passes and tokens per device, stage moves, KV copies.
    pub fn exec_stats(&self) -> &ExecStats {
        &self.ctx.exec().stats
    }

    /// The offload policy's last decision and the timings it was made from (with
    /// `LoadOptions::resample_every` on a GPU model).
    pub fn policy_report(&self) -> Option<PolicyReport> {
        self.ctx.exec().policy_report()
    }

    /// What the storage reader did for this session's streamed blocks (bytes, GB/s, waits),
    /// when blocks stream.
    pub fn stream_stats(&self) -> Option<ReaderStats> {
        self.ctx.exec().stream_stats()
    }

    /// The executor: placement per phase, moves, stage timings, the policy's report and the
    /// streaming statistics.
    pub fn exec(&self) -> &Exec {
        self.ctx.exec()
    }

    /// The executor, to change the placement between calls (the next pass moves what
    /// changed).
    pub fn exec_mut(&mut self) -> &mut Exec {
        self.ctx.exec_mut()
    }

    /// The GPU backend, when the session runs on one (its launch statistics).
    pub fn gpu_backend(&self) -> Option<&GpuBackend> {
        self.ctx.gpu_backend()
    }

    /// The largest pass that gives each token the logits a pass over it alone gives (see
    /// `Context::exact_batch`).
    pub fn exact_batch(&self) -> usize {
        self.ctx.exact_batch()
    }
}
