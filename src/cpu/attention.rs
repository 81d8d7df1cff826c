//! Causal grouped-query attention over an f32 KV cache.
//!
//! Cache layout: `[pos, n_kv_head, hd]` (position-major), the same as kernels-ref's. Appending a
//! token writes one contiguous `n_kv_head * hd` run, and a head's key at one position is `hd`
//! contiguous floats; the scan over positions strides by `n_kv_head * hd`, which hardware
//! prefetchers follow.

use rayon::prelude::*;

use super::ops::dot;
use crate::{Error, Result};

/// out[i, h, :] = Σ_j softmax_j(scale · q[i, h] · k[j, g]) v[j, g] with g = h / (n_head /
/// n_kv_head), over keys j = 0..=q_pos0 + i (causal).
///
/// `q`: [n_q, n_head, hd]; `k`, `v`: at least [n_kv, n_kv_head, hd] (extra capacity is ignored);
/// `out`: [n_q, n_head, hd]. Requires q_pos0 + n_q <= n_kv. Threads split the (query, head) pairs.
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
    scale: f32,
    out: &mut [f32],
) -> Result<()> {
    let kv_len = n_kv * n_kv_head * hd;
    let ok = n_kv_head > 0
        && hd > 0
        && n_head.is_multiple_of(n_kv_head)
        && q.len() == n_q * n_head * hd
        && out.len() == q.len()
        && k.len() >= kv_len
        && v.len() >= kv_len
        && q_pos0 + n_q <= n_kv;
    if !ok {
        return Err(Error::InvalidArgument(format!(
            "attention: q {} out {} k {} v {} for n_q {n_q} n_kv {n_kv} heads {n_head}/{n_kv_head} \
             hd {hd} q_pos0 {q_pos0}",
            q.len(),
            out.len(),
            k.len(),
            v.len()
        )));
    }
    if n_q == 0 || n_head == 0 {
        return Ok(());
    }
    let group = n_head / n_kv_head;
    let stride = n_kv_head * hd;
    let pair = |p: usize, o: &mut [f32], scores: &mut Vec<f32>| {
        let (i, h) = (p / n_head, p % n_head);
        let g = h / group;
        let qh = &q[p * hd..(p + 1) * hd];
        let n = q_pos0 + i + 1;
        scores.clear();
        scores.extend((0..n).map(|j| scale * dot(qh, &k[j * stride + g * hd..][..hd])));
        super::ops::softmax(scores);
        o.fill(0.0);
        for (j, &pj) in scores.iter().enumerate() {
            let vj = &v[j * stride + g * hd..][..hd];
            for (ov, &x) in o.iter_mut().zip(vj) {
                *ov += pj * x;
            }
        }
    };
    let work = n_q * n_head * (q_pos0 + n_q) * hd;
    if work < 64 * 1024 {
        let mut scores = Vec::new();
        for (p, o) in out.chunks_exact_mut(hd).enumerate() {
            pair(p, o, &mut scores);
        }
    } else {
        out.par_chunks_exact_mut(hd)
            .enumerate()
            .for_each_init(Vec::new, |scores, (p, o)| pair(p, o, scores));
    }
    Ok(())
}
