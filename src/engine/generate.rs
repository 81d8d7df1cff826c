//! Step-wise generation: [`Generator`] evaluates a prompt and yields one token per call, so a
//! caller can stream tokens through an iterator, stop between any two steps, and watch the
//! placement change. [`Session::generate`](super::Session::generate) is the callback form
//! built on it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use std::collections::VecDeque;

use crate::engine::context::Context;
use crate::engine::speculative::{accept, SpecStats, Speculator};
use crate::engine::{CtxOverflow, Generation, StopReason, Timings};
use crate::error::{Error, Result};
use crate::model::Logits;
use crate::sampler::{top_probs, Sampler};
use crate::tokenizer::Utf8Stream;

/// What one [`Generator::step`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// A batch of the prompt was evaluated: `done` of its `total` tokens are in the cache.
    Prefill { done: usize, total: usize },
    /// A token was generated; `text` is the text it completes (empty while a multi-byte
    /// character is split across tokens).
    Token { id: u32, text: String },
    /// The generation is over (every later step says so again); `text` is what the decoder
    /// still held (an incomplete character, as U+FFFD), usually empty.
    Done { stop: StopReason, text: String },
}

/// A generation in progress on a session: the prompt still to evaluate, the sampled token
/// whose forward pass is still to run, and what was generated so far.
pub struct Generator<'a> {
    session: &'a mut Context,
    sampler: &'a mut Sampler,
    prompt: Vec<u32>,
    /// Prompt tokens already in the cache.
    n_prefilled: usize,
    max_new: usize,
    n_probs: usize,
    /// Greedy decoding without top-k reporting needs only the argmax: the backend picks it
    /// where the logits are (on a GPU, one id comes back instead of the vocabulary).
    greedy: bool,
    /// The last pass's logits, [n_vocab] (empty when `picked` holds the argmax instead).
    logits: Vec<f32>,
    picked: Option<u32>,
    /// The last sampled token, whose pass runs at the start of the next step (so a token is
    /// handed out as soon as it is sampled).
    to_feed: Option<u32>,
    bytes: Utf8Stream,
    /// The session's tokens and the generated ones: what the repetition penalty sees.
    history: Vec<u32>,
    t0: Instant,
    t_prefill: Duration,
    t_decode: Duration,
    out: Generation,
    stop: Option<StopReason>,
    cancel: Option<Arc<AtomicBool>>,
    /// Drafts verified in batched passes, and the statistics it had when this generation
    /// started.
    spec: Option<(&'a mut Speculator, SpecStats)>,
    /// Tokens a speculative pass yielded that are still to hand out, in order.
    pending: VecDeque<Pending>,
    /// The last token handed out was an accepted draft (already in the cache).
    last_in_cache: bool,
}

/// A token a speculative pass yielded.
struct Pending {
    id: u32,
    /// The logits it was chosen from, [n_vocab] (kept only to report top probabilities).
    logits: Vec<f32>,
    /// An accepted draft is in the cache already; the pass's last token is not (it is fed
    /// next, as a sampled token is).
    in_cache: bool,
}

impl<'a> Generator<'a> {
    /// Starts generating up to `max_new` tokens after `prompt` (evaluated on top of what the
    /// session holds), reporting the `n_probs` most likely tokens at each step.
    pub fn new(
        session: &'a mut Context,
        sampler: &'a mut Sampler,
        prompt: &[u32],
        max_new: usize,
        n_probs: usize,
    ) -> Result<Generator<'a>> {
        if prompt.is_empty() {
            return Err(Error::InvalidArgument("the prompt is empty".into()));
        }
        // A session that shifts takes any prompt (evaluated in chunks with shifts); one that
        // stops refuses a prompt over the context before evaluating anything.
        if session.ctx_overflow() == CtxOverflow::Stop
            && session.tokens().len() + prompt.len() > session.n_ctx()
        {
            return Err(Error::ContextOverflow {
                n_prompt: session.tokens().len() + prompt.len(),
                n_ctx: session.n_ctx(),
            });
        }
        let out = Generation {
            generated_ids: Vec::new(),
            text: String::new(),
            top_probs: Vec::new(),
            stop: StopReason::Limit,
            speculative: None,
            timings: Timings {
                load_ms: session.model().load_time().as_secs_f64() * 1e3,
                n_prompt: prompt.len(),
                ..Default::default()
            },
        };
        let mut history = session.tokens().to_vec();
        history.extend_from_slice(prompt);
        Ok(Generator {
            greedy: n_probs == 0 && sampler.is_greedy(),
            session,
            sampler,
            prompt: prompt.to_vec(),
            n_prefilled: 0,
            max_new,
            n_probs,
            logits: Vec::new(),
            picked: None,
            to_feed: None,
            bytes: Utf8Stream::default(),
            history,
            t0: Instant::now(),
            t_prefill: Duration::ZERO,
            t_decode: Duration::ZERO,
            out,
            stop: None,
            cancel: None,
            spec: None,
            pending: VecDeque::new(),
            last_in_cache: false,
        })
    }

    /// Decodes speculatively with `spec`: each pass feeds the last token with the drafted
    /// ones and keeps the accepted prefix and the model's own next token.
    pub fn set_speculator(&mut self, spec: &'a mut Speculator) {
        let start = spec.stats();
        self.spec = Some((spec, start));
    }

    /// A flag that, once set (from any thread), ends the generation at its next step: between
    /// two tokens or two prefill batches.
    pub fn set_cancel(&mut self, flag: Arc<AtomicBool>) {
        self.cancel = Some(flag);
    }

    /// Ends the generation with `reason` at the next step (the callback form stops this way).
    pub fn stop(&mut self, reason: StopReason) {
        self.stop.get_or_insert(reason);
    }

    /// The session generating.
    pub fn session(&self) -> &Context {
        self.session
    }

    /// The session generating, to change it between steps (a stream marks what it
    /// reported).
    pub(crate) fn session_mut(&mut self) -> &mut Context {
        self.session
    }

    /// What was generated so far (complete once a step returned [`Step::Done`]).
    pub fn generation(&self) -> &Generation {
        &self.out
    }

    pub fn into_generation(self) -> Generation {
        self.out
    }

    /// Runs the next piece of work: a prompt batch, or one token's forward pass and sampling.
    pub fn step(&mut self) -> Result<Step> {
        if let Some(stop) = self.stop {
            return Ok(self.end(stop));
        }
        if self
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::Relaxed))
        {
            return Ok(self.end(StopReason::Cancelled));
        }
        if self.n_prefilled < self.prompt.len() {
            return self.prefill_batch();
        }
        if let Some(id) = self.to_feed.take() {
            if self.out.generated_ids.len() >= self.max_new {
                return Ok(self.end(StopReason::Limit));
            }
            // The one place where generation meets a full context: shift it
            // (`--ctx-overflow shift`, the default) or stop.
            if self.session.make_room(1)?.is_none() {
                return Ok(self.end(StopReason::ContextFull));
            }
            let t = Instant::now();
            let n = self.feed(id)?;
            self.t_decode += t.elapsed();
            self.out.timings.n_decoded += n;
        }
        if self.out.generated_ids.len() >= self.max_new {
            return Ok(self.end(StopReason::Limit));
        }
        let (id, in_cache) = match self.pending.pop_front() {
            Some(p) => {
                if self.n_probs > 0 {
                    self.out.top_probs.push(top_probs(&p.logits, self.n_probs));
                }
                (p.id, p.in_cache)
            }
            None => {
                let id = match self.picked.take() {
                    Some(id) => id,
                    None => self.sampler.sample(&self.logits, &self.history),
                };
                if self.n_probs > 0 {
                    self.out
                        .top_probs
                        .push(top_probs(&self.logits, self.n_probs));
                }
                (id, false)
            }
        };
        if self.out.generated_ids.is_empty() {
            self.out.timings.ttft_ms = self.t0.elapsed().as_secs_f64() * 1e3;
        }
        self.out.generated_ids.push(id);
        self.history.push(id);
        self.last_in_cache = in_cache;
        let tok = self.session.model().tokenizer();
        if tok.is_eog(id) {
            return Ok(self.end(StopReason::Eog));
        }
        let text = self.bytes.push(&tok.decode_token(id, false));
        self.out.text.push_str(&text);
        if !in_cache {
            self.to_feed = Some(id);
        }
        Ok(Step::Token { id, text })
    }

    /// Feeds the sampled token `id` (already in `history`): one pass over it alone, or with
    /// the drafted tokens, whose accepted prefix and the model's next token go to `pending`.
    /// Returns the tokens the pass decoded (fed and kept).
    fn feed(&mut self, id: u32) -> Result<usize> {
        let Some((spec, _)) = self.spec.as_mut() else {
            self.eval_last(&[id])?;
            return Ok(1);
        };
        // The pass yields up to 1 + k tokens and holds 1 + k positions.
        let left = self.max_new - self.out.generated_ids.len();
        let room = self.session.n_ctx() - self.session.tokens().len();
        // Within the exact batch, the pass's logits are those of plain decoding.
        let max = (left - 1).min(room - 1).min(self.session.exact_batch() - 1);
        let proposal = spec.propose(&self.history, max, self.sampler.is_greedy())?;
        if proposal.tokens.is_empty() {
            self.eval_last(&[id])?;
            return Ok(1);
        }
        let k = proposal.tokens.len();
        let mut input = Vec::with_capacity(k + 1);
        input.push(id);
        input.extend_from_slice(&proposal.tokens);
        // rows: [k + 1, n_vocab]; row i chooses the token after input[i].
        let rows = self.session.eval(&input, Logits::All)?;
        let n_vocab = rows.len() / (k + 1);
        let row = |i: usize| &rows[i * n_vocab..(i + 1) * n_vocab];
        // The repetition penalty of row i sees the accepted drafts before it: they go on the
        // history while verifying and come off again (they are pushed when handed out).
        let held_history = self.history.len();
        let mut last = None;
        for (i, &d) in proposal.tokens.iter().enumerate() {
            let p = self.sampler.distribution(row(i), &self.history);
            match accept(self.sampler, &p, d, proposal.q[i].as_deref()) {
                Ok(()) => self.history.push(d),
                Err(t) => {
                    last = Some(t);
                    break;
                }
            }
        }
        let accepted = self.history.len() - held_history;
        let t = last.unwrap_or_else(|| self.sampler.sample(row(k), &self.history));
        self.history.truncate(held_history);
        // Token i of the pass: the accepted drafts (in the cache), then the model's own.
        let ids = proposal.tokens[..accepted].iter().chain([&t]);
        for (i, &id) in ids.enumerate() {
            self.pending.push_back(Pending {
                id,
                logits: if self.n_probs > 0 {
                    row(i).to_vec()
                } else {
                    Vec::new()
                },
                in_cache: i < accepted,
            });
        }
        // The cache holds id and every draft: the rejected ones go.
        let held = self.session.tokens().len();
        self.session.truncate(held - (k - accepted));
        spec.record(k, accepted);
        self.picked = None;
        Ok(1 + accepted)
    }

    /// Evaluates the next batch of the prompt. Batches are the model's prefill batch, as the
    /// executor cuts them, so results do not depend on the cut; a last batch of one token
    /// joins the one before so every pass of the prompt runs with the prefill placement.
    fn prefill_batch(&mut self) -> Result<Step> {
        let total = self.prompt.len();
        let start = self.n_prefilled;
        let mut end = (start + self.session.model().prefill_batch()).min(total);
        if total - end == 1 {
            end = total;
        }
        let t = Instant::now();
        if end == total {
            let batch = self.prompt[start..end].to_vec();
            self.eval_last(&batch)?;
        } else {
            self.session.eval(&self.prompt[start..end], Logits::None)?;
        }
        self.t_prefill += t.elapsed();
        self.n_prefilled = end;
        if end == total {
            self.out.timings.prefill_tps = total as f64 / self.t_prefill.as_secs_f64().max(1e-9);
        }
        Ok(Step::Prefill { done: end, total })
    }

    /// Appends `ids` and keeps what sampling the next token needs: the argmax or the logits.
    fn eval_last(&mut self, ids: &[u32]) -> Result<()> {
        if self.greedy {
            self.picked = Some(self.session.eval_argmax(ids)?);
        } else {
            self.logits = self.session.eval(ids, Logits::Last)?;
        }
        Ok(())
    }

    fn end(&mut self, stop: StopReason) -> Step {
        // Accepted drafts not handed out leave the cache, and so does the last token handed
        // out: the cache then holds what plain decoding leaves (the last token unfed).
        let unsent = self.pending.iter().filter(|p| p.in_cache).count()
            + usize::from(std::mem::take(&mut self.last_in_cache));
        if unsent > 0 {
            let held = self.session.tokens().len();
            self.session.truncate(held - unsent);
        }
        self.pending.clear();
        if let Some((spec, start)) = &self.spec {
            self.out.speculative = Some(spec.stats().since(*start));
        }
        self.stop = Some(stop);
        self.out.stop = stop;
        let text = self.bytes.flush();
        self.out.text.push_str(&text);
        if self.out.timings.n_decoded > 0 {
            self.out.timings.decode_tps =
                self.out.timings.n_decoded as f64 / self.t_decode.as_secs_f64();
        }
        Step::Done { stop, text }
    }
}
