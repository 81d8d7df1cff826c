//! A conversation: the KV cache, the sampler and the generation settings.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::chat::ChatMessage;
use crate::engine::generate::Generator;
use crate::engine::speculative::{DraftParams, Speculator};
use crate::error::{Error, Result};
use crate::sampler::{Sampler, SamplerParams};

use super::stream::TokenStream;

/// Stops a generation from any thread: the generation ends with
/// [`StopReason::Cancelled`](crate::engine::StopReason::Cancelled) before its next token or
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
    inner: crate::engine::Session,
    sampler: Sampler,
    max_tokens: usize,
    n_probs: usize,
    cancel: CancelHandle,
    /// Speculative decoding's drafter, when set.
    spec: Option<Speculator>,
}

impl Session {
    pub(super) fn new(model: Arc<crate::engine::Model>, n_ctx: usize) -> Result<Session> {
        Ok(Session {
            inner: crate::engine::Session::new(model, n_ctx)?,
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
    pub fn set_draft_model(&mut self, draft: &super::Model, params: DraftParams) -> Result<()> {
        let session = crate::engine::Session::new(draft.engine().clone(), self.n_ctx())?;
        let sampling = self.sampler.params().clone();
        let model = self.inner.model().clone();
        self.spec = Some(Speculator::with_model(session, &model, sampling, params)?);
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
    pub fn draft_stats(&self) -> Option<crate::engine::speculative::SpecStats> {
        self.spec.as_ref().map(Speculator::stats)
    }

    /// The most tokens one prompt generates (default 256).
    pub fn set_max_tokens(&mut self, n: usize) {
        self.max_tokens = n;
    }

    /// Report the `k` most likely tokens at each step in [`super::Finished::top_probs`].
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
        let add_special = self.inner.tokens().is_empty();
        let ids = self
            .inner
            .model()
            .tokenizer()
            .encode(text, add_special, true);
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
        let text = self.inner.model().render_chat(messages)?;
        let ids = self.inner.model().tokenizer().encode(&text, true, true);
        let held = self.inner.tokens();
        let continues = ids.len() > held.len() && ids.starts_with(held);
        let new = if continues {
            ids[held.len()..].to_vec()
        } else {
            self.inner.reset();
            ids
        };
        self.prompt_tokens(&new)
    }

    /// Generates after token ids appended to the context.
    pub fn prompt_tokens(&mut self, ids: &[u32]) -> Result<TokenStream<'_>> {
        self.cancel.0.store(false, Ordering::Relaxed);
        let mut g = Generator::new(
            &mut self.inner,
            &mut self.sampler,
            ids,
            self.max_tokens,
            self.n_probs,
        )?;
        g.set_cancel(self.cancel.0.clone());
        if let Some(s) = self.spec.as_mut() {
            g.set_speculator(s);
        }
        Ok(TokenStream::new(g, ids.to_vec()))
    }

    /// The callback form of [`Session::prompt`]: `on_text` gets each piece of text as it is
    /// complete and returns false to stop.
    pub fn prompt_with(
        &mut self,
        text: &str,
        mut on_text: impl FnMut(&str) -> bool,
    ) -> Result<super::Finished> {
        let mut stream = self.prompt(text)?;
        while let Some(ev) = stream.next() {
            match ev? {
                super::Event::Done(done) => return Ok(*done),
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
        self.inner.reset();
    }

    /// Tokens in the context.
    pub fn tokens(&self) -> &[u32] {
        self.inner.tokens()
    }

    pub fn n_ctx(&self) -> usize {
        self.inner.n_ctx()
    }

    /// Every move of this session's stages to the CPU after a GPU failure (lost device, out
    /// of memory), oldest first; a stream also reports each as `Event::DeviceFallback`.
    pub fn fallbacks(&self) -> &[crate::scheduler::Fallback] {
        self.inner.exec().fallbacks()
    }

    /// The engine's session: the executor's placement, statistics and policy report.
    pub fn engine(&self) -> &crate::engine::Session {
        &self.inner
    }

    /// The engine's session, to evaluate tokens outside a stream (a prompt cache restores
    /// into it) or reach settings without a method here.
    pub fn engine_mut(&mut self) -> &mut crate::engine::Session {
        &mut self.inner
    }

    /// What a full context does: shift (default; keeps the first `keep` tokens and drops
    /// half of the rest) or stop the generation.
    pub fn set_ctx_overflow(&mut self, overflow: crate::engine::CtxOverflow, keep: Option<usize>) {
        self.inner.set_ctx_overflow(overflow);
        self.inner.set_keep(keep);
    }
}
