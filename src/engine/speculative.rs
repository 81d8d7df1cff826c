//! Speculative decoding: a cheap drafter proposes the next few tokens, the model verifies them
//! in one batched pass, and the longest accepted prefix plus the model's own next token are
//! kept. When decode is bound by the bytes of weights read per pass (always on a phone, and
//! more so when blocks stream from storage), a pass over 1 + k tokens costs about what a pass
//! over one costs, so accepted drafts come nearly free.
//!
//! Drafters: prompt lookup (the longest recent n-gram of the history that occurred earlier
//! proposes what followed it: code and edits repeat their input), or a smaller model of the
//! same vocabulary run in its own session. Acceptance is the speculative-sampling rule
//! (Leviathan et al., Chen et al.): draft token d, drafted with probability q(d), is kept with
//! probability min(1, p(d) / q(d)) where p is the model's sampling distribution at that
//! position; on a rejection the token is drawn from max(0, p - q) renormalized. The output
//! distribution is then exactly the model's; under greedy settings p is one-hot and the rule
//! keeps a draft exactly when it is the model's argmax, so the ids equal plain decoding's
//! wherever the batched pass gives the single-token pass's logits.

use crate::engine::context::Context;
use crate::error::{Error, Result};
use crate::model::Logits;
use crate::sampler::{Sampler, SamplerParams};

/// Where drafts come from.
pub enum Drafter {
    /// Prompt lookup: the last n tokens of the history (n from `ngram_max` down to
    /// `ngram_min`) are searched for earlier in it, latest occurrence first, and the tokens
    /// that followed are proposed.
    Lookup { ngram_min: usize, ngram_max: usize },
    /// A smaller model of the same vocabulary, in a session of its own (its cache follows the
    /// history from one pass to the next).
    Model {
        session: Box<Context>,
        /// Draws the draft's tokens when the model samples (its distribution is the `q` of
        /// the acceptance rule); unused under greedy settings.
        sampler: Sampler,
        /// The model's vocabulary size: a draft token past it ends the proposal.
        n_vocab: usize,
    },
}

/// How many tokens a pass may draft.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DraftParams {
    /// At most this many drafted tokens per pass.
    pub max: usize,
    /// Fewer drafted tokens than this are not worth a batched pass: the step decodes plainly.
    pub min: usize,
    /// A draft model stops proposing when its top token's probability falls below this.
    pub p_min: f64,
}

impl Default for DraftParams {
    fn default() -> DraftParams {
        // Long drafts while the draft model is confident: a confident draft is cheap to
        // verify, a doubtful one mostly wasted.
        DraftParams {
            max: 16,
            min: 0,
            p_min: 0.75,
        }
    }
}

/// What speculation did over a generation.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct SpecStats {
    /// Batched verification passes (each also yields the model's own next token).
    pub passes: usize,
    /// Tokens drafted and verified.
    pub drafted: usize,
    /// Drafted tokens kept.
    pub accepted: usize,
}

impl SpecStats {
    /// What was done between `start` and these statistics.
    pub fn since(&self, start: SpecStats) -> SpecStats {
        SpecStats {
            passes: self.passes - start.passes,
            drafted: self.drafted - start.drafted,
            accepted: self.accepted - start.accepted,
        }
    }

    /// Accepted drafted tokens per drafted token (0 when none was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
    /// Tokens each verification pass yielded on average: its accepted drafts plus one.
    pub fn tokens_per_pass(&self) -> f64 {
        if self.passes == 0 {
            0.0
        } else {
            (self.accepted + self.passes) as f64 / self.passes as f64
        }
    }
}

/// A drafted continuation: tokens and, for each, the distribution it was drawn from (`None`:
/// proposed with certainty, q = 1 on it).
pub(crate) struct Proposal {
    pub tokens: Vec<u32>,
    pub q: Vec<Option<Vec<(u32, f64)>>>,
}

/// A drafter with its settings and statistics, handed to a generation.
pub struct Speculator {
    drafter: Drafter,
    params: DraftParams,
    stats: SpecStats,
    pace: Pace,
}

/// How long the next proposal may be, from what the model kept of the last ones. A pass over
/// 1 + k tokens costs more than a plain one wherever the model's matmuls are not bound by
/// reading the weights (small batches on a CPU: 7 tokens cost about 5 single passes on a 1.5B
/// model), so drafts the model throws away are not free. After a fully kept draft the next may
/// be twice as long (up to `DraftParams::max`); after a rejection, one longer than what was
/// kept; when even one drafted token is rejected, drafting pauses for a number of tokens that
/// doubles with each such failure in a row (up to `MAX_PAUSE`), then tries one token again.
/// Only the cost changes: what is kept is decided by the acceptance rule alone.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Pace {
    /// Most tokens the next proposal may hold.
    cap: usize,
    /// Plain decoding steps left before the next proposal.
    pause: usize,
    /// The pause after the next one-token draft that is rejected.
    backoff: usize,
}

/// The longest pause of drafting, in decoded tokens.
const MAX_PAUSE: usize = 64;

impl Pace {
    fn new(max: usize) -> Pace {
        Pace {
            cap: max,
            pause: 0,
            backoff: 1,
        }
    }

    /// The model kept `accepted` of `drafted` (> 0) tokens; drafts hold `min..=max` tokens
    /// (a shorter proposal is not verified).
    fn record(&mut self, drafted: usize, accepted: usize, min: usize, max: usize) {
        let min = min.max(1);
        if accepted == drafted {
            self.cap = (2 * self.cap).clamp(min, max);
        } else {
            self.cap = (accepted + 1).clamp(min, max);
        }
        if accepted > 0 {
            self.backoff = 1;
        } else if drafted <= min {
            self.pause = self.backoff;
            self.backoff = (2 * self.backoff).min(MAX_PAUSE);
        }
    }
}

impl Speculator {
    /// Prompt-lookup drafting with n-grams of `ngram_min..=ngram_max` tokens.
    pub fn lookup(ngram_min: usize, ngram_max: usize, params: DraftParams) -> Result<Speculator> {
        if ngram_min == 0 || ngram_max < ngram_min {
            return Err(Error::InvalidArgument(format!(
                "draft lookup n-grams of {ngram_min} to {ngram_max} tokens (need 1 <= min <= max)"
            )));
        }
        Speculator::new(
            Drafter::Lookup {
                ngram_min,
                ngram_max,
            },
            params,
        )
    }

    /// Drafting with `draft`, a session of a smaller model whose vocabulary must be the
    /// target's (`target`), checked here as llama.cpp's `common_speculative_are_compatible`
    /// does: token counts within 128 of each other (padding rows), the same text for every
    /// common token from id 5 on. `sampling` are the target's sampler settings (the draft
    /// samples with them).
    pub fn with_model(
        draft: Context,
        target: &crate::engine::Model,
        sampling: SamplerParams,
        params: DraftParams,
    ) -> Result<Speculator> {
        let (dt, tt) = (draft.model().tokenizer(), target.tokenizer());
        let (nd, nt) = (dt.n_vocab(), tt.n_vocab());
        if nd.abs_diff(nt) > 128 {
            return Err(Error::InvalidArgument(format!(
                "the draft model's vocabulary has {nd} tokens, the model's {nt}: speculative \
                 decoding needs the same vocabulary"
            )));
        }
        let common = nd.min(nt) as u32;
        if let Some(id) = (5..common).find(|&i| dt.token_text(i) != tt.token_text(i)) {
            return Err(Error::InvalidArgument(format!(
                "the draft model's token {id} is {:?}, the model's {:?}: speculative decoding \
                 needs the same vocabulary",
                dt.token_text(id),
                tt.token_text(id)
            )));
        }
        let sampler = draft_sampler(sampling)?;
        Speculator::new(
            Drafter::Model {
                session: Box::new(draft),
                sampler,
                n_vocab: nt,
            },
            params,
        )
    }

    fn new(drafter: Drafter, params: DraftParams) -> Result<Speculator> {
        if params.max == 0 || params.min > params.max {
            return Err(Error::InvalidArgument(format!(
                "draft sizes min {} max {} (need 1 <= max and min <= max)",
                params.min, params.max
            )));
        }
        if !(0.0..=1.0).contains(&params.p_min) {
            return Err(Error::InvalidArgument(format!(
                "draft p_min {} is not a probability",
                params.p_min
            )));
        }
        Ok(Speculator {
            drafter,
            params,
            stats: SpecStats::default(),
            pace: Pace::new(params.max),
        })
    }

    /// The model's sampler settings changed: a draft model samples with them from now on.
    pub fn set_sampling(&mut self, sampling: SamplerParams) -> Result<()> {
        if let Drafter::Model { sampler, .. } = &mut self.drafter {
            *sampler = draft_sampler(sampling)?;
        }
        Ok(())
    }

    /// What speculation did since this speculator was made.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    pub(crate) fn record(&mut self, drafted: usize, accepted: usize) {
        self.stats.passes += 1;
        self.stats.drafted += drafted;
        self.stats.accepted += accepted;
        if drafted > 0 {
            self.pace
                .record(drafted, accepted, self.params.min, self.params.max);
        }
    }

    /// Up to `max` tokens to follow `history` (the model's context and the token about to be
    /// fed, last); `greedy` when the model samples greedily. Fewer than `params.min` give an
    /// empty proposal.
    pub(crate) fn propose(
        &mut self,
        history: &[u32],
        max: usize,
        greedy: bool,
    ) -> Result<Proposal> {
        let mut p = Proposal {
            tokens: Vec::new(),
            q: Vec::new(),
        };
        if self.pace.pause > 0 {
            self.pace.pause -= 1;
            return Ok(p);
        }
        let max = max.min(self.params.max).min(self.pace.cap);
        if max == 0 {
            return Ok(p);
        }
        match &mut self.drafter {
            Drafter::Lookup {
                ngram_min,
                ngram_max,
            } => {
                p.tokens = lookup(history, *ngram_min, *ngram_max, max);
                p.q = vec![None; p.tokens.len()];
            }
            Drafter::Model {
                session,
                sampler,
                n_vocab,
            } => {
                let d = Draft {
                    max,
                    greedy,
                    n_vocab: *n_vocab,
                    params: self.params,
                };
                draft_with_model(session, sampler, history, d, &mut p)?
            }
        }
        if p.tokens.len() < self.params.min {
            p.tokens.clear();
            p.q.clear();
        }
        Ok(p)
    }
}

/// The draft model's sampler: the model's settings with random numbers of its own (drawing
/// from the model's sampler would change the model's draws).
fn draft_sampler(sampling: SamplerParams) -> Result<Sampler> {
    Sampler::new(SamplerParams {
        seed: sampling.seed ^ 0x9e37_79b9_7f4a_7c15,
        ..sampling
    })
}

/// Prompt lookup: the tokens that followed the latest earlier occurrence of the history's last
/// n tokens, for the longest n in `n_min..=n_max` that occurs; at most `max` of them. Where
/// that continuation reaches the end of the history, the text is taken to go on repeating
/// with the period the match implies (the occurrence at s stands p = len - n - s tokens
/// before the tail), so a repeated line or token proposes `max` tokens, not just the ones
/// the history still holds.
fn lookup(history: &[u32], n_min: usize, n_max: usize, max: usize) -> Vec<u32> {
    let len = history.len();
    for n in (n_min..=n_max.min(len.saturating_sub(1))).rev() {
        let tail = &history[len - n..];
        // Occurrences starting at s < len - n, latest first.
        if let Some(s) = (0..len - n).rev().find(|&s| &history[s..s + n] == tail) {
            let p = len - n - s;
            // Token len + i is predicted as token len + i - p (its own prediction when that
            // is past the history too).
            let mut out: Vec<u32> = Vec::with_capacity(max);
            for i in 0..max {
                let j = len + i - p;
                out.push(if j < len { history[j] } else { out[j - len] });
            }
            return out;
        }
    }
    Vec::new()
}

/// The draft model's continuation of `history`: its cache is brought to the history (the
/// common prefix kept), then it proposes token by token, greedily when the model is greedy,
/// else drawing from its own distribution (kept as q); it stops early when its top token's
/// probability is below `params.p_min`.
/// What one draft-model proposal may hold.
struct Draft {
    max: usize,
    greedy: bool,
    /// The model's vocabulary size.
    n_vocab: usize,
    params: DraftParams,
}

fn draft_with_model(
    draft: &mut Context,
    sampler: &mut Sampler,
    history: &[u32],
    d: Draft,
    p: &mut Proposal,
) -> Result<()> {
    let Draft {
        max,
        greedy,
        n_vocab,
        params,
    } = d;
    // A draft context shorter than the history (or than what the proposal would add) drafts
    // nothing: the model decodes plainly.
    if history.len() + max > draft.n_ctx() {
        return Ok(());
    }
    let n = draft.reuse_prefix(history);
    let mut logits = draft.eval(&history[n..], Logits::Last)?;
    let mut seen = history.to_vec();
    for i in 0..max {
        let top = crate::sampler::top_probs(&logits, 1);
        if top.first().is_none_or(|&(_, pr)| pr < params.p_min) {
            break;
        }
        let (id, q) = if greedy {
            (top[0].0, None)
        } else {
            let d = sampler.distribution(&logits, &seen);
            (sampler.draw(&d), Some(d))
        };
        if id as usize >= n_vocab {
            break;
        }
        p.tokens.push(id);
        p.q.push(q);
        seen.push(id);
        // The last proposed token's own pass is not needed.
        if i + 1 < max {
            logits = draft.eval(&[id], Logits::Last)?;
        }
    }
    Ok(())
}

/// The acceptance rule for one drafted token `d` drawn with `q` (`None`: certainty) against
/// the model's distribution `p` (probabilities summing to 1): `Ok(())` keeps it, `Err(t)`
/// rejects it for `t`, drawn from max(0, p - q) renormalized.
pub(crate) fn accept(
    sampler: &mut Sampler,
    p: &[(u32, f64)],
    d: u32,
    q: Option<&[(u32, f64)]>,
) -> std::result::Result<(), u32> {
    let prob = |dist: &[(u32, f64)], id: u32| {
        dist.iter()
            .find(|&&(t, _)| t == id)
            .map_or(0.0, |&(_, w)| w)
    };
    let pd = prob(p, d);
    let qd = q.map_or(1.0, |q| prob(q, d));
    // A one-hot p (greedy) decides without a random draw, so greedy runs consume none.
    let keep = if pd >= qd {
        true
    } else if pd == 0.0 {
        false
    } else {
        sampler.uniform() < pd / qd
    };
    if keep {
        return Ok(());
    }
    let residual: Vec<(u32, f64)> = p
        .iter()
        .map(|&(t, w)| {
            let qt = match q {
                Some(q) => prob(q, t),
                None if t == d => 1.0,
                None => 0.0,
            };
            (t, (w - qt).max(0.0))
        })
        .filter(|&(_, w)| w > 0.0)
        .collect();
    Err(if residual.is_empty() {
        // Only when p <= q everywhere, i.e. p = q, where d would have been kept: rounding.
        sampler.draw(p)
    } else {
        sampler.draw(&residual)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lookup_finds_the_longest_latest_ngram() {
        let h = [1, 2, 3, 9, 1, 2, 3, 4, 5, 7, 2, 3];
        // "2 3" occurred at 1 and 5; the latest (5) is followed by 4 5 7.
        assert_eq!(lookup(&h, 1, 3, 3), [4, 5, 7]);
        // The 3-gram "7 2 3" never occurred before; "2 3" did.
        assert_eq!(lookup(&h, 3, 3, 3), Vec::<u32>::new());
        // Past the end of the history the continuation repeats with the match's period.
        assert_eq!(lookup(&[5, 6, 5], 1, 2, 4), [6, 5, 6, 5]);
        assert_eq!(lookup(&[7, 7, 7], 1, 2, 3), [7, 7, 7]);
        assert_eq!(lookup(&[1, 2, 3, 1, 2], 2, 2, 5), [3, 1, 2, 3, 1]);
        assert_eq!(lookup(&[5], 1, 2, 4), Vec::<u32>::new());
    }

    #[test]
    fn the_draft_length_follows_what_the_model_keeps() {
        let mut p = Pace::new(8);
        // A partly kept draft: the next may hold one more than was kept.
        p.record(8, 2, 0, 8);
        assert_eq!((p.cap, p.pause), (3, 0));
        // Fully kept: twice as long, up to the maximum.
        p.record(3, 3, 0, 8);
        assert_eq!(p.cap, 6);
        p.record(6, 6, 0, 8);
        assert_eq!(p.cap, 8);
        // Nothing kept: one token; a rejected single token pauses drafting 1, 2, 4 ... tokens.
        p.record(8, 0, 0, 8);
        assert_eq!((p.cap, p.pause), (1, 0));
        for want in [1, 2, 4, 8, 16, 32, 64, 64] {
            p.record(1, 0, 0, 8);
            assert_eq!((p.cap, p.pause), (1, want));
            p.pause = 0;
        }
        // A kept token ends the back-off.
        p.record(1, 1, 0, 8);
        assert_eq!((p.cap, p.backoff), (2, 1));
        // The cap never falls below the shortest draft worth verifying.
        let mut p = Pace::new(8);
        p.record(8, 0, 3, 8);
        assert_eq!((p.cap, p.pause), (3, 0));
        p.record(3, 0, 3, 8);
        assert_eq!((p.cap, p.pause), (3, 1));
    }

    #[test]
    fn a_paused_speculator_proposes_nothing_until_the_pause_ends() {
        let params = DraftParams {
            max: 4,
            min: 0,
            p_min: 0.0,
        };
        let mut s = Speculator::lookup(1, 2, params).unwrap();
        let h = [1, 2, 3, 1, 2];
        assert_eq!(s.propose(&h, 8, true).unwrap().tokens, [3, 1, 2, 3]);
        s.record(4, 0);
        assert_eq!(s.propose(&h, 8, true).unwrap().tokens, [3]);
        s.record(1, 0);
        // Paused for one token, then one token again.
        assert!(s.propose(&h, 8, true).unwrap().tokens.is_empty());
        assert_eq!(s.propose(&h, 8, true).unwrap().tokens, [3]);
    }

    #[test]
    fn acceptance_keeps_the_model_distribution() {
        // p over 3 tokens, drafts drawn from q: the kept-or-replaced token must follow p.
        let p = vec![(0u32, 0.5), (1, 0.3), (2, 0.2)];
        let q = vec![(0u32, 0.1), (1, 0.6), (2, 0.3)];
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            seed: 7,
            ..SamplerParams::default()
        })
        .unwrap();
        let n = 200_000;
        let mut count = [0usize; 3];
        for _ in 0..n {
            let d = s.draw(&q);
            let t = match accept(&mut s, &p, d, Some(&q)) {
                Ok(()) => d,
                Err(t) => t,
            };
            count[t as usize] += 1;
        }
        for (i, &(_, pi)) in p.iter().enumerate() {
            let f = count[i] as f64 / n as f64;
            // 5 standard deviations of a binomial proportion.
            let sd = (pi * (1.0 - pi) / n as f64).sqrt();
            assert!((f - pi).abs() < 5.0 * sd, "token {i}: {f} vs {pi}");
        }
        // A certain draft (prompt lookup) is kept with probability p(d).
        let mut kept = 0;
        for _ in 0..n {
            if accept(&mut s, &p, 1, None).is_ok() {
                kept += 1;
            }
        }
        let f = kept as f64 / n as f64;
        assert!(
            (f - 0.3).abs() < 5.0 * (0.3f64 * 0.7 / n as f64).sqrt(),
            "{f}"
        );
        // Greedy: one-hot p keeps exactly its argmax and replaces anything else with it.
        let g = vec![(2u32, 1.0)];
        assert_eq!(accept(&mut s, &g, 2, None), Ok(()));
        assert_eq!(accept(&mut s, &g, 0, None), Err(2));
    }
}
