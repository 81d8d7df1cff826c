//! Token sampling: greedy, temperature, top-k, top-p, min-p and repetition penalty, with a
//! seeded RNG so a run can be repeated exactly.
//!
//! The chain follows llama.cpp's default order (penalties, top-k, top-p, min-p, temperature,
//! then a draw), so the same settings mean the same thing in both engines.

use crate::error::{Error, Result};

/// Sampling settings. The defaults are llama.cpp's.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplerParams {
    /// 0 (or below) means greedy: always the most likely token.
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 keeps all.
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probabilities sum to at least p; 1 keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than min_p times the most likely one; 0 keeps all.
    pub min_p: f32,
    /// Divide positive logits (multiply negative ones) of recently seen tokens; 1 is off.
    pub repeat_penalty: f32,
    /// How many of the last tokens the penalty looks at.
    pub repeat_last_n: usize,
    pub seed: u64,
}

impl Default for SamplerParams {
    fn default() -> Self {
        SamplerParams {
            temperature: 0.8,
            top_k: 40,
            top_p: 0.95,
            min_p: 0.05,
            repeat_penalty: 1.0,
            repeat_last_n: 64,
            seed: 0x5eed,
        }
    }
}

impl SamplerParams {
    /// Greedy decoding: temperature 0, no penalty.
    pub fn greedy() -> Self {
        SamplerParams {
            temperature: 0.0,
            ..Default::default()
        }
    }

    /// Rejects settings that have no meaning (NaN, negative probabilities, ...).
    pub fn validate(&self) -> Result<()> {
        let bad = |m: &str| Err(Error::InvalidArgument(m.to_string()));
        if !self.temperature.is_finite() {
            return bad("temperature must be a finite number");
        }
        if !(0.0..=1.0).contains(&self.top_p) {
            return bad("top-p must be between 0 and 1");
        }
        if !(0.0..=1.0).contains(&self.min_p) {
            return bad("min-p must be between 0 and 1");
        }
        if !(self.repeat_penalty.is_finite() && self.repeat_penalty > 0.0) {
            return bad("repeat penalty must be a positive number");
        }
        Ok(())
    }
}

/// xoshiro256** seeded through splitmix64: small, fast, and the same on every platform, so a
/// seed reproduces a run anywhere.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng {
            s: [next(), next(), next(), next()],
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Index of the largest value (the first one on ties), as greedy decoding picks.
pub fn argmax(logits: &[f32]) -> usize {
    let mut best = 0;
    let mut best_v = f32::NEG_INFINITY;
    for (i, &v) in logits.iter().enumerate() {
        if v > best_v {
            best_v = v;
            best = i;
        }
    }
    best
}

/// Softmax probabilities of the raw logits, in f64 so tiny probabilities keep their digits.
pub fn softmax_f64(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    let mut p: Vec<f64> = logits.iter().map(|&l| (l as f64 - max).exp()).collect();
    let sum: f64 = p.iter().sum();
    if sum > 0.0 {
        p.iter_mut().for_each(|x| *x /= sum);
    }
    p
}

/// The k most likely tokens with their probabilities (softmax of the raw logits), most likely
/// first: what `--n-probs` reports.
pub fn top_probs(logits: &[f32], k: usize) -> Vec<(u32, f64)> {
    let p = softmax_f64(logits);
    let mut idx: Vec<u32> = (0..p.len() as u32).collect();
    let k = k.min(idx.len());
    if k == 0 {
        return Vec::new();
    }
    idx.select_nth_unstable_by(k - 1, |&a, &b| p[b as usize].total_cmp(&p[a as usize]));
    idx.truncate(k);
    idx.sort_by(|&a, &b| p[b as usize].total_cmp(&p[a as usize]).then(a.cmp(&b)));
    idx.into_iter().map(|i| (i, p[i as usize])).collect()
}

/// A stateful sampler: settings, RNG and a reusable candidate buffer.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplerParams,
    rng: Rng,
    /// [n_vocab] (token id, logit) candidates, reused between calls.
    cand: Vec<(u32, f32)>,
}

impl Sampler {
    pub fn new(params: SamplerParams) -> Result<Sampler> {
        params.validate()?;
        Ok(Sampler {
            rng: Rng::new(params.seed),
            params,
            cand: Vec::new(),
        })
    }

    pub fn params(&self) -> &SamplerParams {
        &self.params
    }

    /// Whether `sample` is a plain argmax of the logits (a backend can then pick the token on
    /// its own device and return only the id).
    pub fn is_greedy(&self) -> bool {
        let p = &self.params;
        p.temperature <= 0.0 && !(p.repeat_penalty != 1.0 && p.repeat_last_n > 0)
    }

    /// Picks the next token from `logits` ([n_vocab]); `history` holds the tokens so far
    /// (prompt and generated), which the repetition penalty looks at.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let max = match self.candidates(logits, history) {
            Picked::One(id) => return id,
            Picked::Candidates { max } => max,
        };
        // Temperature, then a draw from the renormalised distribution.
        let t = self.params.temperature as f64;
        let weights: Vec<f64> = self
            .cand
            .iter()
            .map(|c| ((c.1 - max) as f64 / t).exp())
            .collect();
        let total: f64 = weights.iter().sum();
        let mut r = self.rng.next_f64() * total;
        for (c, w) in self.cand.iter().zip(&weights) {
            if r < *w {
                return c.0;
            }
            r -= w;
        }
        self.cand[self.cand.len() - 1].0
    }

    /// The distribution [`Sampler::sample`] draws from: (token, probability) pairs, the
    /// probabilities summing to 1, every token not listed at probability 0 (a greedy sampler
    /// gives its one pick at 1). What speculative decoding's acceptance rule compares.
    pub fn distribution(&mut self, logits: &[f32], history: &[u32]) -> Vec<(u32, f64)> {
        let max = match self.candidates(logits, history) {
            Picked::One(id) => return vec![(id, 1.0)],
            Picked::Candidates { max } => max,
        };
        let t = self.params.temperature as f64;
        let mut d: Vec<(u32, f64)> = self
            .cand
            .iter()
            .map(|c| (c.0, ((c.1 - max) as f64 / t).exp()))
            .collect();
        let total: f64 = d.iter().map(|x| x.1).sum();
        d.iter_mut().for_each(|x| x.1 /= total);
        d
    }

    /// A draw from a distribution of (token, weight) pairs (weights need not sum to 1), with
    /// this sampler's random numbers.
    pub fn draw(&mut self, dist: &[(u32, f64)]) -> u32 {
        let total: f64 = dist.iter().map(|x| x.1).sum();
        let mut r = self.rng.next_f64() * total;
        for &(id, w) in dist {
            if r < w {
                return id;
            }
            r -= w;
        }
        dist.last().map_or(0, |x| x.0)
    }

    /// A uniform number in [0, 1) from this sampler's random numbers.
    pub fn uniform(&mut self) -> f64 {
        self.rng.next_f64()
    }

    /// Applies the penalty and the top-k, top-p and min-p filters, leaving the candidates in
    /// `self.cand` (sorted by logit, descending); or the one token a greedy setting picks.
    fn candidates(&mut self, logits: &[f32], history: &[u32]) -> Picked {
        let p = &self.params;
        let penalize = p.repeat_penalty != 1.0 && p.repeat_last_n > 0;
        if p.temperature <= 0.0 && !penalize {
            return Picked::One(argmax(logits) as u32);
        }
        self.cand.clear();
        self.cand
            .extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        if penalize {
            let start = history.len().saturating_sub(p.repeat_last_n);
            let mut seen = history[start..].to_vec();
            seen.sort_unstable();
            seen.dedup();
            for id in seen {
                if let Some(c) = self.cand.get_mut(id as usize) {
                    c.1 = if c.1 > 0.0 {
                        c.1 / p.repeat_penalty
                    } else {
                        c.1 * p.repeat_penalty
                    };
                }
            }
        }
        if p.temperature <= 0.0 {
            let best =
                self.cand.iter().fold(
                    (0u32, f32::NEG_INFINITY),
                    |b, &c| if c.1 > b.1 { c } else { b },
                );
            return Picked::One(best.0);
        }

        // Sort by logit, descending; top-k first so the sort is partial when k is small.
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < self.cand.len() {
            self.cand.select_nth_unstable_by(p.top_k - 1, by_logit);
            self.cand.truncate(p.top_k);
        }
        self.cand.sort_by(by_logit);

        // Probabilities at temperature 1 for the top-p and min-p filters, as llama.cpp does.
        let max = self.cand[0].1;
        let mut probs: Vec<f64> = self
            .cand
            .iter()
            .map(|c| ((c.1 - max) as f64).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);

        let mut keep = self.cand.len();
        if p.top_p < 1.0 {
            let mut cum = 0.0;
            for (i, &pr) in probs.iter().enumerate() {
                cum += pr;
                if cum >= p.top_p as f64 {
                    keep = keep.min(i + 1);
                    break;
                }
            }
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            let n = probs.iter().take_while(|&&pr| pr >= floor).count().max(1);
            keep = keep.min(n);
        }
        self.cand.truncate(keep);
        Picked::Candidates { max }
    }
}

/// What [`Sampler::candidates`] leaves.
enum Picked {
    /// A greedy setting's pick.
    One(u32),
    /// `Sampler::cand` holds the candidates; `max` is the largest logit.
    Candidates { max: f32 },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, 2.9, -1.0]
    }

    #[test]
    fn greedy_picks_argmax() {
        let mut s = Sampler::new(SamplerParams::greedy()).unwrap();
        assert_eq!(s.sample(&logits(), &[]), 1);
        assert_eq!(argmax(&[0.0, 5.0, 5.0]), 1);
    }

    #[test]
    fn repetition_penalty_changes_the_greedy_choice() {
        let mut s = Sampler::new(SamplerParams {
            repeat_penalty: 1.5,
            ..SamplerParams::greedy()
        })
        .unwrap();
        // Token 1 (3.0) was seen: 3.0 / 1.5 = 2.0 < 2.9, so token 4 wins.
        assert_eq!(s.sample(&logits(), &[1]), 4);
        // Negative logits are pushed further down, not up.
        let mut s = Sampler::new(SamplerParams {
            repeat_penalty: 2.0,
            ..SamplerParams::greedy()
        })
        .unwrap();
        assert_eq!(s.sample(&[-1.0, -1.5], &[0]), 1);
    }

    #[test]
    fn top_k_one_is_greedy_whatever_the_temperature() {
        let mut s = Sampler::new(SamplerParams {
            temperature: 5.0,
            top_k: 1,
            ..Default::default()
        })
        .unwrap();
        for _ in 0..100 {
            assert_eq!(s.sample(&logits(), &[]), 1);
        }
    }

    #[test]
    fn top_p_and_min_p_restrict_the_candidates() {
        // Probabilities of [3.0, 2.9, 2.0, 1.0, ...]: top-p 0.5 keeps token 1 and token 4
        // (0.39 + 0.35 >= 0.5), never the others.
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.5,
            min_p: 0.0,
            ..Default::default()
        })
        .unwrap();
        let mut seen = [0usize; 6];
        for _ in 0..2000 {
            seen[s.sample(&logits(), &[]) as usize] += 1;
        }
        assert!(seen[1] > 0 && seen[4] > 0, "{seen:?}");
        assert_eq!(seen[0] + seen[2] + seen[3] + seen[5], 0, "{seen:?}");

        // min-p 0.5: only tokens at least half as likely as token 1 (tokens 1 and 4).
        let mut s = Sampler::new(SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.5,
            ..Default::default()
        })
        .unwrap();
        let mut seen = [0usize; 6];
        for _ in 0..2000 {
            seen[s.sample(&logits(), &[]) as usize] += 1;
        }
        assert_eq!(seen[0] + seen[2] + seen[3] + seen[5], 0, "{seen:?}");
    }

    #[test]
    fn sampling_follows_the_distribution_and_the_seed() {
        let params = SamplerParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            seed: 42,
            ..Default::default()
        };
        let l = logits();
        let mut s = Sampler::new(params.clone()).unwrap();
        let n = 20000;
        let mut counts = [0usize; 6];
        let draws: Vec<u32> = (0..n).map(|_| s.sample(&l, &[])).collect();
        for &d in &draws {
            counts[d as usize] += 1;
        }
        let p = softmax_f64(&l);
        for i in 0..6 {
            let f = counts[i] as f64 / n as f64;
            // 5 standard deviations of a binomial proportion.
            let sd = (p[i] * (1.0 - p[i]) / n as f64).sqrt();
            assert!(
                (f - p[i]).abs() < 5.0 * sd + 1e-3,
                "token {i}: {f} vs {}",
                p[i]
            );
        }
        // Same seed, same sequence; another seed, another one.
        let mut again = Sampler::new(params.clone()).unwrap();
        assert!(draws.iter().all(|&d| d == again.sample(&l, &[])));
        let mut other = Sampler::new(SamplerParams { seed: 43, ..params }).unwrap();
        assert!(draws.iter().any(|&d| d != other.sample(&l, &[])));
    }

    #[test]
    fn low_temperature_sharpens() {
        let mut s = Sampler::new(SamplerParams {
            temperature: 0.05,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            ..Default::default()
        })
        .unwrap();
        let hits = (0..500).filter(|_| s.sample(&logits(), &[]) == 1).count();
        // p(token 1) at T=0.05 vs token 4: exp(0.1/0.05) = e^2 => about 0.88.
        assert!(hits > 400, "{hits}");
    }

    #[test]
    fn top_probs_sorted_and_normalised() {
        let t = top_probs(&logits(), 3);
        assert_eq!(t.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 4, 2]);
        let all: f64 = top_probs(&logits(), 100).iter().map(|x| x.1).sum();
        assert!((all - 1.0).abs() < 1e-12);
    }

    #[test]
    fn invalid_params_are_errors() {
        for p in [
            SamplerParams {
                top_p: 1.5,
                ..Default::default()
            },
            SamplerParams {
                temperature: f32::NAN,
                ..Default::default()
            },
            SamplerParams {
                repeat_penalty: 0.0,
                ..Default::default()
            },
        ] {
            assert!(Sampler::new(p).is_err());
        }
    }
}
