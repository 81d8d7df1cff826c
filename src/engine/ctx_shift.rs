//! Context shift and prefix reuse: what a session does when its tokens outgrow the context,
//! and how it keeps the cached part of a prompt it has already seen.
//!
//! A shift (llama.cpp's "context shift") keeps the first `n_keep` cached positions, drops the
//! `discard` oldest positions after them and moves the rest down by `discard`. Cached keys
//! carry their position through RoPE, so the moved keys are rotated by `-discard` positions
//! (rotations compose by adding angles; in exact arithmetic this is the key RoPE would have
//! given at the new position). Values carry no position and are only moved. Each backend
//! does this on its own cache ([`Backend::shift_kv`]); the default here goes through the
//! backend's f32 `read_kv`/`write_kv` interface, so it holds whatever the cache stores.
//!
//! The moved keys keep what the dropped tokens contributed to them through attention in the
//! layers above the first: the shifted cache is not the cache of the kept tokens evaluated
//! alone (that would be a re-evaluation), exactly as in llama.cpp.

pub use crate::backend::KvShift;
use crate::engine::context::Context;
use crate::error::{Error, Result};
use crate::model::Logits;
use crate::scheduler::Exec;

/// What a session does when the next tokens do not fit its context.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CtxOverflow {
    /// Shift the context: keep the first `n_keep` tokens, drop half of the rest (the oldest),
    /// go on. A generation never fails for lack of room; a prompt longer than the context is
    /// processed with shifts.
    #[default]
    Shift,
    /// Stop: a generation ends with `StopReason::ContextFull`, an evaluation that does not fit
    /// is an `Error::ContextOverflow`.
    Stop,
}

impl CtxOverflow {
    /// Parses `shift|stop`.
    pub fn parse(s: &str) -> Result<CtxOverflow> {
        match s.trim().to_lowercase().as_str() {
            "shift" => Ok(CtxOverflow::Shift),
            "stop" => Ok(CtxOverflow::Stop),
            other => Err(Error::InvalidArgument(format!(
                "--ctx-overflow {other:?}: expected shift or stop"
            ))),
        }
    }
}

/// The logits a chunk (tokens off..off+n of a call of n_total) must yield for the call to
/// yield `want`.
fn want_in(want: Logits, n_total: usize, off: usize, n: usize) -> Logits {
    match want {
        Logits::Last if off + n == n_total => Logits::Last,
        Logits::Last | Logits::None => Logits::None,
        Logits::All => Logits::All,
        Logits::From(k) if k < off + n => Logits::From(k.saturating_sub(off)),
        Logits::From(_) => Logits::None,
    }
}

/// Counts of the shifts a session made.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ShiftStats {
    pub shifts: usize,
    /// Positions dropped, over all shifts.
    pub discarded: usize,
}

impl Context {
    /// What the session does when the context is full (default: shift).
    pub fn set_ctx_overflow(&mut self, o: CtxOverflow) {
        self.overflow = o;
    }

    pub fn ctx_overflow(&self) -> CtxOverflow {
        self.overflow
    }

    /// Tokens a shift keeps at the start (`--keep N`); `None`: the BOS token when the model
    /// adds one and the context starts with it, else none.
    pub fn set_keep(&mut self, n_keep: Option<usize>) {
        self.n_keep = n_keep;
    }

    /// The tokens a shift keeps now.
    pub fn n_keep(&self) -> usize {
        self.n_keep.unwrap_or_else(|| {
            let tok = self.model().tokenizer();
            let starts_with_bos = tok.bos().is_some() && self.tokens.first() == tok.bos().as_ref();
            usize::from(tok.add_bos() && starts_with_bos)
        })
    }

    /// The shifts made so far.
    pub fn shift_stats(&self) -> ShiftStats {
        self.shifts
    }

    /// How many of the next `n_new` tokens can be evaluated now, shifting the context when it
    /// is full and the session shifts; `None`: they do not fit and the session stops.
    pub fn make_room(&mut self, n_new: usize) -> Result<Option<usize>> {
        let n_past = self.tokens.len();
        let free = self.n_ctx.saturating_sub(n_past);
        if n_new <= free {
            return Ok(Some(n_new));
        }
        if self.overflow == CtxOverflow::Stop {
            return Ok(None);
        }
        if free > 0 {
            // Fill the context first: the shift then drops as little as it can.
            return Ok(Some(free));
        }
        let keep = self.n_keep();
        if keep >= n_past {
            return Err(Error::InvalidArgument(format!(
                "--keep {keep} leaves nothing to drop from a full context of {} tokens",
                self.n_ctx
            )));
        }
        // llama.cpp's rule: drop half of what is not kept.
        let discard = ((n_past - keep) / 2).max(1);
        self.shift(keep, discard)?;
        Ok(Some(n_new.min(self.n_ctx - self.tokens.len())))
    }

    /// Drops the cached tokens keep..keep+discard and moves the later ones down (their keys
    /// re-rotated), on every layer's device.
    pub fn shift(&mut self, keep: usize, discard: usize) -> Result<()> {
        let s = KvShift {
            keep,
            discard,
            n_pos: self.tokens.len(),
        };
        s.check()?;
        self.exec.shift_kv(s)?;
        self.tokens.drain(keep..keep + discard);
        self.shifts.shifts += 1;
        self.shifts.discarded += discard;
        log::debug!(
            "context shift: kept {keep}, dropped {discard}, {} left",
            self.tokens.len()
        );
        Ok(())
    }

    /// Forgets the cached tokens from index `n` on (their cache rows are overwritten next).
    pub fn truncate(&mut self, n: usize) {
        self.tokens.truncate(n);
    }

    /// Keeps the longest common prefix of the cached tokens and `tokens`, but at least one
    /// token of `tokens` short so that evaluating the rest yields logits. Returns its length:
    /// evaluate `tokens[n..]` next.
    pub fn reuse_prefix(&mut self, tokens: &[u32]) -> usize {
        let n = common_prefix(&self.tokens, tokens).min(tokens.len().saturating_sub(1));
        self.truncate(n);
        n
    }

    /// Evaluates `ids` in chunks that fit the context (shifting between them as needed),
    /// calling `f(exec, chunk, pos0, want of the chunk)`; `want` is what the whole call
    /// yields.
    pub(crate) fn eval_chunked(
        &mut self,
        ids: &[u32],
        want: Logits,
        mut f: impl FnMut(&mut Exec, &[u32], usize, Logits) -> Result<()>,
    ) -> Result<()> {
        let mut off = 0;
        while off < ids.len() {
            let rest = ids.len() - off;
            let n = self.make_room(rest)?.ok_or(Error::ContextOverflow {
                n_prompt: self.tokens.len() + rest,
                n_ctx: self.n_ctx,
            })?;
            let chunk = &ids[off..off + n];
            let pos0 = self.tokens.len();
            let w = want_in(want, ids.len(), off, n);
            if let Err(e) = f(&mut self.exec, chunk, pos0, w) {
                // A lost GPU or one out of memory: go on on the CPU from the same state and
                // run the pass again there (any other error comes back from `fail_over`).
                self.exec.fail_over(e, &self.tokens)?;
                f(&mut self.exec, chunk, pos0, w)?;
            }
            self.tokens.extend_from_slice(chunk);
            off += n;
        }
        Ok(())
    }
}

/// Length of the common prefix of a and b.
pub fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}
