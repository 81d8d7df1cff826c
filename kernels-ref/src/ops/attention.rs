//! Causal grouped-query attention (twin of `shaders/attention.wgsl`).

use super::softmax::softmax_f64;

/// How a query's scores are formed and which keys it sees.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttnScores {
    /// Multiplies `q . k` (usually `1 / sqrt(hd)`).
    pub scale: f32,
    /// `Some(w)`: a query at position `p` sees only keys `p - w + 1 ..= p` (llama.cpp's
    /// `is_masked_swa` masks key `p0` for query `p1` when `p1 - p0 >= n_swa`).
    pub window: Option<usize>,
    /// `Some(c)`: a scaled score `s` becomes `c * tanh(s / c)` before the softmax (gemma2's
    /// attention logit soft-capping: llama.cpp's `build_attn_mha` in src/llama-graph.cpp scales
    /// `kq` by 1/c, takes `tanh` and scales by c, on Q already multiplied by the scale).
    pub softcap: Option<f32>,
}

impl AttnScores {
    /// Scores `scale * q . k` over every earlier key.
    pub fn new(scale: f32) -> AttnScores {
        AttnScores {
            scale,
            window: None,
            softcap: None,
        }
    }
    /// The same scores over the last `window` keys (`None`: all).
    pub fn window(self, window: Option<usize>) -> AttnScores {
        AttnScores { window, ..self }
    }
    /// The same scores soft-capped at `softcap` (`None`: not capped).
    pub fn softcap(self, softcap: Option<f32>) -> AttnScores {
        AttnScores { softcap, ..self }
    }
}

/// Causal grouped-query attention.
///
/// - `q`: `[n_q, n_head, hd]`; query `i` sits at position `q_pos0 + i`.
/// - `k`, `v`: `[n_kv, n_kv_head, hd]`, key/value `j` at position `j`.
/// - `out`: `[n_q, n_head, hd]`.
///
/// Query `i` attends keys `0..=q_pos0 + i`, or the last `s.window` of them; head `h` uses kv
/// head `h / (n_head / n_kv_head)`. `out = softmax(cap(s.scale * q . k)) @ v`, all in f64.
///
/// # Panics
/// On shape mismatches (programmer errors): buffer lengths not matching the shapes,
/// `n_head` not a multiple of `n_kv_head`, a query whose position has no key
/// (`q_pos0 + n_q > n_kv`), a window of 0 keys or a cap that is not a positive number.
#[allow(clippy::too_many_arguments)]
pub fn attention(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    n_q: usize,
    n_kv: usize,
    n_head: usize,
    n_kv_head: usize,
    hd: usize,
    q_pos0: usize,
    s: AttnScores,
    out: &mut [f32],
) {
    let AttnScores {
        scale,
        window,
        softcap,
    } = s;
    assert!(
        softcap.is_none_or(|c| c > 0.0 && c.is_finite()),
        "attention: soft-cap {softcap:?}"
    );
    let cap = softcap.map(f64::from);
    assert!(window != Some(0), "attention: a window of 0 keys");
    assert_eq!(
        q.len(),
        n_q * n_head * hd,
        "attention: q is not [n_q, n_head, hd]"
    );
    assert_eq!(
        out.len(),
        q.len(),
        "attention: out is not [n_q, n_head, hd]"
    );
    assert_eq!(
        k.len(),
        n_kv * n_kv_head * hd,
        "attention: k is not [n_kv, n_kv_head, hd]"
    );
    assert_eq!(
        v.len(),
        k.len(),
        "attention: v is not [n_kv, n_kv_head, hd]"
    );
    assert!(
        n_kv_head > 0 && n_head.is_multiple_of(n_kv_head),
        "attention: n_head {n_head} is not a multiple of n_kv_head {n_kv_head}"
    );
    assert!(
        q_pos0 + n_q <= n_kv,
        "attention: query at position {} has no key (n_kv {n_kv})",
        q_pos0 + n_q.max(1) - 1
    );
    let group = n_head / n_kv_head;
    let scale = f64::from(scale);
    let mut scores = vec![0.0f64; n_kv]; // [n_kv], one query head at a time
    let mut acc = vec![0.0f64; hd]; // [hd]
    for i in 0..n_q {
        let n_keys = q_pos0 + i + 1;
        let first = window.map_or(0, |w| n_keys.saturating_sub(w));
        for h in 0..n_head {
            let kvh = h / group;
            let qv = &q[(i * n_head + h) * hd..][..hd];
            for (j, s) in scores[..n_keys].iter_mut().enumerate().skip(first) {
                let kv = &k[(j * n_kv_head + kvh) * hd..][..hd];
                let dot: f64 = qv
                    .iter()
                    .zip(kv)
                    .map(|(&a, &b)| f64::from(a) * f64::from(b))
                    .sum();
                *s = match cap {
                    Some(c) => c * (dot * scale / c).tanh(),
                    None => dot * scale,
                };
            }
            softmax_f64(&mut scores[first..n_keys]);
            acc.fill(0.0);
            for (j, &p) in scores[..n_keys].iter().enumerate().skip(first) {
                let vv = &v[(j * n_kv_head + kvh) * hd..][..hd];
                for (a, &x) in acc.iter_mut().zip(vv) {
                    *a += p * f64::from(x);
                }
            }
            let o = &mut out[(i * n_head + h) * hd..][..hd];
            for (o, &a) in o.iter_mut().zip(&acc) {
                *o = a as f32;
            }
        }
    }
}
