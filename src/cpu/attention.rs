//! Causal grouped-query attention over a KV cache of any `KvType`.
//!
//! Cache layout: `[pos, n_kv_head, hd]` (position-major), the same as kernels-ref's, each row
//! stored in its type's layout (see `kv_type`). Appending a token writes one contiguous row, and
//! a head's key at one position is one contiguous run of whole blocks; the scan over positions
//! strides by a row, which hardware prefetchers follow. Quantized keys and values are decoded a
//! head slice at a time into a small buffer as the scan reaches them: no dequantized copy of
//! the cache exists.

use super::ops::dot;
use crate::kv_type::KvType;
use crate::{Error, Result};
use kernels_ref::AttnScores;

/// A KV cache (keys or values) as stored: `data` holds at least `n_kv` rows of `n_kv_head * hd`
/// values in type `ty`'s layout.
#[derive(Clone, Copy)]
pub struct KvView<'a> {
    pub data: &'a [u8],
    pub ty: KvType,
}

/// out[i, h, :] = Σ_j softmax_j(cap(scale · q[i, h] · k[j, g])) v[j, g] with g = h / (n_head /
/// n_kv_head), over keys j = 0..=q_pos0 + i (causal; the last `s.window` of them), for f32
/// caches: kernels-ref's `attention`.
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
    s: AttnScores,
    out: &mut [f32],
) -> Result<()> {
    let k = KvView {
        data: bytemuck::cast_slice(k),
        ty: KvType::F32,
    };
    let v = KvView {
        data: bytemuck::cast_slice(v),
        ty: KvType::F32,
    };
    attention_kv(q, k, v, n_q, n_kv, n_head, n_kv_head, hd, q_pos0, s, out)
}

/// The float format whose cache rows the AVX2 scan reads directly (F16 widened by F16C, 8
/// values per instruction, instead of a table lookup per value into a buffer); `None` for
/// the 8-bit and 4-bit caches or without AVX2/FMA/F16C.
fn simd_format(ty: KvType) -> Option<super::FloatFormat> {
    if !super::Isa::Avx2.available() {
        return None;
    }
    match ty {
        KvType::F32 => Some(super::FloatFormat::F32),
        KvType::F16 => Some(super::FloatFormat::F16),
        _ => None,
    }
}

/// [`attention`] over caches of any type: each key (value) head slice is decoded from its
/// blocks when the scan reaches it. Requires hd to be a whole number of blocks of both types.
#[allow(clippy::too_many_arguments)]
pub fn attention_kv(
    q: &[f32],
    k: KvView,
    v: KvView,
    n_q: usize,
    n_kv: usize,
    n_head: usize,
    n_kv_head: usize,
    hd: usize,
    q_pos0: usize,
    s: AttnScores,
    out: &mut [f32],
) -> Result<()> {
    let AttnScores {
        scale,
        window,
        softcap,
    } = s;
    let bad = |msg: String| {
        Error::InvalidArgument(format!(
            "attention: {msg} (q {} out {} k {} bytes of {} v {} bytes of {} for n_q {n_q} n_kv \
             {n_kv} heads {n_head}/{n_kv_head} hd {hd} q_pos0 {q_pos0})",
            q.len(),
            out.len(),
            k.data.len(),
            k.ty,
            v.data.len(),
            v.ty
        ))
    };
    k.ty.check_head_dim(hd)?;
    v.ty.check_head_dim(hd)?;
    let ok = n_kv_head > 0
        && n_head.is_multiple_of(n_kv_head)
        && q.len() == n_q * n_head * hd
        && out.len() == q.len()
        && k.data.len() >= k.ty.bytes(n_kv * n_kv_head * hd)
        && v.data.len() >= v.ty.bytes(n_kv * n_kv_head * hd)
        && q_pos0 + n_q <= n_kv
        && window != Some(0)
        && softcap.is_none_or(|c| c > 0.0 && c.is_finite());
    if !ok {
        return Err(bad("shapes do not match".into()));
    }
    if n_q == 0 || n_head == 0 {
        return Ok(());
    }
    let group = n_head / n_kv_head;
    let (kf, vf) = (simd_format(k.ty), simd_format(v.ty));
    // Bytes per cache row and per head slice of a row.
    let (k_row, k_head) = (k.ty.bytes(n_kv_head * hd), k.ty.bytes(hd));
    let (v_row, v_head) = (v.ty.bytes(n_kv_head * hd), v.ty.bytes(hd));
    // scores: [n] for one (query, head); buf: [hd] one decoded head slice.
    let pair = |p: usize, o: &mut [f32], (scores, buf): &mut (Vec<f32>, Vec<f32>)| {
        let (i, h) = (p / n_head, p % n_head);
        let g = h / group;
        let qh = &q[p * hd..(p + 1) * hd];
        // Keys first..first + n: all up to the query's position, or its window's.
        let n_seen = q_pos0 + i + 1;
        let first = window.map_or(0, |w| n_seen.saturating_sub(w));
        let n = n_seen - first;
        buf.resize(hd, 0.0);
        scores.clear();
        scores.resize(n, 0.0);
        // This head's slices of the rows from key `first` on: key first + j at k_g[j * k_row..],
        // value first + j at v_g[j * v_row..].
        let (k_g, v_g) = (
            &k.data[first * k_row + g * k_head..],
            &v.data[first * v_row + g * v_head..],
        );
        match kf {
            // SAFETY: simd_format returned Some only after checking AVX2/FMA/F16C; the cache
            // holds n rows (checked above: n <= n_kv), so k_g holds (n - 1) rows plus a slice.
            #[cfg(target_arch = "x86_64")]
            Some(ff) => unsafe { super::avx2_float::kv_scores(ff, qh, k_g, k_row, scale, scores) },
            _ => {
                for (j, s) in scores.iter_mut().enumerate() {
                    k.ty.dequantize_into(&k_g[j * k_row..][..k_head], buf);
                    *s = scale * dot(qh, buf);
                }
            }
        }
        if let Some(c) = softcap {
            super::ops::softcap(scores, c);
        }
        super::ops::softmax(scores);
        match vf {
            // SAFETY: as for the keys.
            #[cfg(target_arch = "x86_64")]
            Some(ff) => unsafe { super::avx2_float::kv_weighted_sum(ff, scores, v_g, v_row, o) },
            _ => {
                o.fill(0.0);
                for (j, &pj) in scores.iter().enumerate() {
                    v.ty.dequantize_into(&v_g[j * v_row..][..v_head], buf);
                    for (ov, &x) in o.iter_mut().zip(buf.iter()) {
                        *ov += pj * x;
                    }
                }
            }
        }
    };
    let work = n_q * n_head * window.map_or(q_pos0 + n_q, |w| w.min(q_pos0 + n_q)) * hd;
    if work < 64 * 1024 {
        let mut scratch = (Vec::new(), Vec::new());
        for (p, o) in out.chunks_exact_mut(hd).enumerate() {
            pair(p, o, &mut scratch);
        }
    } else {
        super::par::for_each_item_init(
            out.chunks_exact_mut(hd).enumerate().collect(),
            || (Vec::new(), Vec::new()),
            |s, (p, o)| pair(p, o, s),
        );
    }
    Ok(())
}
