//! Checks of the attention kernels: the KV-cache store and both attention paths (the
//! flash-decoding split + combine pair and tiled prefill) against kernels-ref's `attention`.
//! Same rules as [`super::checks`]: seeded inputs with outliers, odd shapes, NaN-poisoned
//! outputs (and NaN cache rows past the last position, which the kernels must never read), a
//! small-grid case, and tolerances derived where computed. Each kernel comes in a variant
//! per KV cache type (pair): the caches hold kernels-ref's quantized blocks, the oracle runs
//! on their dequantized values (the kernels decode exactly), and the store must write
//! kernels-ref's bytes.

use super::checks_fused::check_quantized;
use super::{poisoned, prepare, read_guarded, small_grid, Rng, Worst, U};
use crate::error::Result;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::attention::{
    split_scratch_len, AttentionConfig, AttentionPath, ATTENTION_CHUNK, SPLIT_MAX_TOKENS,
};
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words};
use crate::gpu::kernels::{self, Dispatch, Kernels};
use crate::gpu::registry::KernelKey;
use crate::kv_type::{KvType, KvTypes};

/// `src` (whole blocks) in `ty`'s layout as kernels-ref writes it, followed by `spare_values`
/// values of 0xff bytes (NaN in every type: an f32 or f16 NaN, or a block with a NaN scale)
/// and padded to whole words with 0xff, as f32 words for upload.
pub(crate) fn cache_words(ty: KvType, src: &[f32], spare_values: usize) -> Result<Vec<f32>> {
    let mut b = vec![0u8; ty.bytes(src.len())];
    ty.quantize_into(src, &mut b)?;
    let total =
        crate::gpu::kernels::attention::kv_cache_bytes(ty, src.len() + spare_values) as usize;
    b.resize(total, 0xff);
    Ok(words(&b))
}

/// Bytes (a multiple of 4) as f32 words, bit for bit.
pub(crate) fn words(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// f32 words back to bytes.
pub(crate) fn bytes_of(w: &[f32]) -> Vec<u8> {
    w.iter().flat_map(|v| v.to_le_bytes()).collect()
}

/// `x` (whole blocks) after a round trip through `ty` (what a cache of `ty` holds).
fn through(ty: KvType, x: &[f32]) -> Result<Vec<f32>> {
    let mut b = vec![0u8; ty.bytes(x.len())];
    ty.quantize_into(x, &mut b)?;
    let mut out = vec![0.0; x.len()];
    ty.dequantize_into(&b, &mut out);
    Ok(out)
}

/// Cache rows past the last position (left NaN).
const SPARE_ROWS: usize = 7;

/// Per-element error bound for attention's `out` (`[n_q, n_head, hd]`), from f32 precision
/// and the reduction lengths (first order, doubled for the second-order terms):
/// - key j's score s_j = scale q.k_j is an hd-term f32 dot product plus the scale product:
///   |ds_j| <= (hd + 2) u sum_i |scale q_i k_ji| (Higham's gamma_n for any summation order);
/// - its weight exp(s_j - m_c) exp(m_c - M) (split: chunk max m_c, global max M) or
///   exp(s_j - m) times the online rescalings (prefill; they scale numerator and denominator
///   alike) is off by a relative (6 + 2 (M - s_j)) u: WGSL's exp is within 3 + 2|x| ulp, plus
///   the subtractions' and products' roundings;
/// - a relative weight error e_j moves out_d by <= sum_j p_j e_j (|v_jd| + |out_d|) (the
///   numerator's and the normalizing sum's shares);
/// - summing the weighted values and the weights over n_keys terms in f32 (any order and
///   blocking, with rescales) costs <= (n_keys + 8) u sum_j p_j (|v_jd| + |out_d|).
struct Problem {
    cfg: AttentionConfig,
    n: usize,
    pos0: usize,
    q: Vec<f32>, // [n, n_head, hd]
    // [pos0 + n, n_head_kv, hd]: the earlier rows, then the new ones; the values a cache of
    // cfg.kv.k holds (quantized and dequantized)
    k: Vec<f32>,
    v: Vec<f32>,    // [pos0 + n, n_head_kv, hd], likewise in cfg.kv.v
    want: Vec<f32>, // [n, n_head, hd]
    tol: Vec<f64>,  // [n, n_head, hd]
}

impl Problem {
    fn new(
        n_head: usize,
        n_head_kv: usize,
        hd: usize,
        n: usize,
        pos0: usize,
        kv: KvTypes,
    ) -> Result<Problem> {
        let cfg = AttentionConfig {
            n_head,
            n_head_kv,
            head_dim: hd,
            scale: 1.0 / (hd as f32).sqrt(),
            n_ctx: pos0 + n + SPARE_ROWS,
            kv,
            window: None,
            softcap: None,
        };
        let mut rng = Rng(0xa77e ^ ((n_head * 131 + hd) * 7919 + n * 31 + pos0) as u64);
        let row = n_head_kv * hd;
        let q = rng.values(n * n_head * hd, 1.0);
        let k = through(kv.k, &rng.values((pos0 + n) * row, 1.0))?;
        let v = through(kv.v, &rng.values((pos0 + n) * row, 1.0))?;
        let mut want = vec![0.0; q.len()];
        // The shapes above are consistent, so the oracle's shape asserts hold.
        kernels_ref::attention(
            &q,
            &k,
            &v,
            n,
            pos0 + n,
            n_head,
            n_head_kv,
            hd,
            pos0,
            kernels_ref::AttnScores::new(cfg.scale),
            &mut want,
        );
        let mut p = Problem {
            cfg,
            n,
            pos0,
            q,
            k,
            v,
            want,
            tol: Vec::new(),
        };
        p.tol = p.tolerance();
        Ok(p)
    }

    /// The bound described on [`Problem`], per element of `out`.
    fn tolerance(&self) -> Vec<f64> {
        let (nh, nkv, hd) = (self.cfg.n_head, self.cfg.n_head_kv, self.cfg.head_dim);
        let scale = f64::from(self.cfg.scale);
        let mut tol = vec![0.0; self.want.len()];
        for t in 0..self.n {
            let n_keys = self.pos0 + t + 1;
            for h in 0..nh {
                let kvh = h / (nh / nkv);
                let qv = &self.q[(t * nh + h) * hd..][..hd];
                // (score, sum of the |terms|) per key
                let sm: Vec<(f64, f64)> = (0..n_keys)
                    .map(|j| {
                        let kv = &self.k[(j * nkv + kvh) * hd..][..hd];
                        qv.iter().zip(kv).fold((0.0, 0.0), |(s, m), (&a, &b)| {
                            let p = f64::from(a) * f64::from(b) * scale;
                            (s + p, m + p.abs())
                        })
                    })
                    .collect();
                let m = sm.iter().map(|p| p.0).fold(f64::MIN, f64::max);
                let z: f64 = sm.iter().map(|&(s, _)| (s - m).exp()).sum();
                // (p_j, relative error of key j's weight)
                let pe: Vec<(f64, f64)> = sm
                    .iter()
                    .map(|&(s, mag)| {
                        let e = (hd as f64 + 2.0) * U * mag + (6.0 + 2.0 * (m - s)) * U;
                        ((s - m).exp() / z, e)
                    })
                    .collect();
                let o = (t * nh + h) * hd;
                for d in 0..hd {
                    let out_d = f64::from(self.want[o + d]).abs();
                    let (mut t1, mut t2) = (0.0, 0.0);
                    for (j, &(p, e)) in pe.iter().enumerate() {
                        let w = p * (f64::from(self.v[(j * nkv + kvh) * hd + d]).abs() + out_d);
                        t1 += w * e;
                        t2 += w;
                    }
                    tol[o + d] = 2.0 * (t1 + (n_keys as f64 + 8.0) * U * t2) + 1e-30;
                }
            }
        }
        tol
    }

    /// A cache `[n_ctx, n_head_kv, hd]` of type `ty` holding `src`'s first `rows` rows
    /// (exactly: `src` went through `ty`), NaN after.
    fn cache(
        &self,
        ctx: &GpuContext,
        ty: KvType,
        src: &[f32],
        rows: usize,
    ) -> Result<wgpu::Buffer> {
        let row = self.cfg.n_head_kv * self.cfg.head_dim;
        let c = cache_words(ty, &src[..rows * row], (self.cfg.n_ctx - rows) * row)?;
        kernels::upload_f32(ctx, "cache", &c)
    }

    /// Runs `path`'s launches, whose keys must be `keys` in order, over caches holding every
    /// position so far; feeds `out` to `worst`. With `grid`, under a limit that makes the
    /// largest launch a 2-D dispatch.
    fn run(
        &self,
        ctx: &GpuContext,
        ks: &mut Kernels,
        path: AttentionPath,
        keys: &[KernelKey],
        grid: bool,
        worst: &mut Worst,
    ) -> Result<()> {
        let (cfg, n, pos0) = (&self.cfg, self.n, self.pos0);
        let k_cache = self.cache(ctx, cfg.kv.k, &self.k, pos0 + n)?;
        let v_cache = self.cache(ctx, cfg.kv.v, &self.v, pos0 + n)?;
        let q = kernels::upload_f32(ctx, "q", &self.q)?;
        let out = poisoned(ctx, "out", &vec![f32::NAN; self.q.len()])?;
        let scratch_len = split_scratch_len(cfg, n, ATTENTION_CHUNK as usize);
        // [n, n_head, n_chunks, hd + 4]: NaN until the split kernel writes it.
        let scratch = kernels::upload_f32(ctx, "scratch", &vec![f32::NAN; scratch_len])?;
        // The split path's output quantized as quantize_act would (`[n, q_dim / 4]` words,
        // `[n, q_dim / 32]` vec4), NaN until written.
        let q_dim = cfg.n_head * cfg.head_dim;
        let qx = poisoned(ctx, "qx", &vec![f32::NAN; qx_words(n, q_dim)])?;
        let qd = poisoned(ctx, "qd", &vec![f32::NAN; qd_vec4s(n, q_dim) * 4])?;
        let split = path == AttentionPath::Split;
        if split && n > SPLIT_MAX_TOKENS {
            // attention_launches_quant would take the prefill path.
            worst.fail();
        }
        let plan = |ks: &Kernels| {
            if split {
                ks.attention_launches_quant(
                    &q,
                    &k_cache,
                    &v_cache,
                    &scratch,
                    &out,
                    Some((&qx, &qd)),
                    cfg,
                    n,
                    pos0,
                )
            } else {
                let l = ks.attention_launches_with(
                    path, &q, &k_cache, &v_cache, &scratch, &out, cfg, n, pos0,
                )?;
                Ok((l, false))
            }
        };
        if grid {
            ks.max_groups_per_dim = small_grid(&plan(ks)?.0)?;
        }
        let (launches, quantized) = plan(ks)?;
        // The split path skips its combine launch when one chunk holds the context, and then
        // quantizes its output when a head is whole chunks of 32.
        let one_chunk = split && pos0 + n <= ATTENTION_CHUNK as usize;
        let keys = if one_chunk { &keys[..1] } else { keys };
        if launches.len() != keys.len() || quantized != (one_chunk && cfg.head_dim % 32 == 0) {
            worst.fail();
        }
        let ds = launches
            .into_iter()
            .zip(keys)
            .map(|(l, &key)| prepare(ctx, ks, l, key))
            .collect::<Result<Vec<Dispatch>>>()?;
        kernels::run(ctx, &ds.iter().collect::<Vec<_>>())?;
        let got = read_guarded(ctx, &out, self.q.len(), worst)?;
        worst.add_all(&got, &self.want, |i| self.tol[i]);
        if quantized {
            check_quantized(ctx, &qx, &qd, &got, n, q_dim, worst)?;
        }
        Ok(())
    }
}

/// Runs `cases` ((n_head, n_head_kv, head_dim, n_tokens, pos0, small grid)) on `path` over
/// caches of types `kv` (the cases whose head_dim the types do not allow are skipped).
fn attention_cases(
    ctx: &GpuContext,
    ks: &mut Kernels,
    path: AttentionPath,
    keys: &[KernelKey],
    kv: KvTypes,
    cases: &[(usize, usize, usize, usize, usize, bool)],
) -> Result<Worst> {
    let mut worst = Worst::new();
    let device_limit = ks.max_groups_per_dim;
    for &(nh, nkv, hd, n, pos0, grid) in cases {
        if kv.check_head_dim(hd).is_err() {
            continue;
        }
        ks.max_groups_per_dim = device_limit;
        let p = Problem::new(nh, nkv, hd, n, pos0, kv)?;
        p.run(ctx, ks, path, keys, grid, &mut worst)?;
    }
    Ok(worst)
}

/// The split (flash-decoding) pair: `attention_split` then `attention_combine`, checked
/// together (the AttentionSplit and AttentionCombine rows both run this and report the pair).
pub(super) fn split_pair(
    ctx: &GpuContext,
    ks: &mut Kernels,
    split: KernelKey,
    combine: KernelKey,
    kv: KvTypes,
) -> Result<Worst> {
    let c = ATTENTION_CHUNK as usize;
    // GQA decode on a short context (one partial chunk: the split pass alone writes the
    // output), also with four queries on the small grid; 128-dim heads whose three queries
    // end just before, at and just after a chunk boundary (the first query's last chunk is
    // empty); 256-dim heads (the largest) with a one-key last chunk; and on the small grid
    // 80-dim heads (not a power of two) over two chunks (96-dim ones for the block types,
    // whose heads are whole blocks).
    let cases = [
        (9, 3, 64, 1, 37, false),
        (6, 2, 64, 4, c - 4, true),
        (4, 2, 128, 3, 2 * c - 2, false),
        (2, 1, 256, 1, c, false),
        (5, 1, 80, 2, 300, true),
        (3, 1, 96, 2, 300, true),
    ];
    attention_cases(ctx, ks, AttentionPath::Split, &[split, combine], kv, &cases)
}

pub(super) fn prefill(
    ctx: &GpuContext,
    ks: &mut Kernels,
    key: KernelKey,
    kv: KvTypes,
) -> Result<Worst> {
    // Token counts that are not a multiple of the query tile, from position 0 and after an
    // earlier context; head dims 64, 128, 4 (the smallest) and 192 (a tile of 10 queries);
    // the small-grid case with 80-dim heads and one kv head for five heads.
    let cases = [
        (9, 3, 64, 17, 0, false),
        (4, 2, 128, 23, 300, false),
        (3, 3, 4, 21, 5, false),
        (2, 2, 192, 9, 11, false),
        (5, 1, 80, 18, 37, true),
        (3, 1, 96, 18, 37, true),
    ];
    attention_cases(ctx, ks, AttentionPath::PrefillTiled, &[key], kv, &cases)
}

/// The lanes variant (head_dim 64 only): GQA prompts from position 0 and after a context,
/// token counts below, at and past a workgroup of queries (64 on every device that takes this
/// variant), a single query, and the small grid.
pub(super) fn prefill_lanes(
    ctx: &GpuContext,
    ks: &mut Kernels,
    key: KernelKey,
    kv: KvTypes,
) -> Result<Worst> {
    let cases = [
        (9, 3, 64, 17, 0, false),
        (9, 3, 64, 64, 37, false),
        (4, 2, 64, 70, 5, false),
        (2, 1, 64, 1, 9, false),
        (6, 6, 64, 130, 3, true),
    ];
    attention_cases(ctx, ks, AttentionPath::Prefill, &[key], kv, &cases)
}

/// The store of one cache type `ty` (the K and the V launch both use it): the new rows must
/// be kernels-ref's bytes, every other byte untouched.
pub(super) fn kv_store(
    ctx: &GpuContext,
    ks: &mut Kernels,
    key: KernelKey,
    ty: KvType,
) -> Result<Worst> {
    let mut worst = Worst::new();
    let device_limit = ks.max_groups_per_dim;
    // (n_head_kv, head_dim, n_tokens, pos0, small grid): one token after a context, a prompt
    // at position 0 (rows of 4 values), many tokens on the small grid (enough block pairs for
    // three workgroups of 256), and rows of an odd
    // number of blocks starting mid-pair (the block types write pairs of blocks).
    for (nkv, hd, n, pos0, grid) in [
        (3, 64, 1, 37, false),
        (1, 4, 23, 0, false),
        (2, 128, 200, 10, true),
        (1, 32, 5, 3, false),
        (3, 32, 3, 5, false),
    ] {
        if ty.check_head_dim(hd).is_err() {
            continue;
        }
        ks.max_groups_per_dim = device_limit;
        let cfg = AttentionConfig {
            n_head: nkv,
            n_head_kv: nkv,
            head_dim: hd,
            scale: 1.0,
            n_ctx: pos0 + n + SPARE_ROWS,
            kv: KvTypes { k: ty, v: ty },
            window: None,
            softcap: None,
        };
        let row = nkv * hd;
        let mut rng = Rng(0x57 ^ (row * 977 + n * 31 + pos0) as u64);
        // [pos0 + n, n_head_kv, hd] each; the caches hold the earlier rows, then 0xff bytes
        // (NaN) that the kernel must overwrite exactly for rows pos0..pos0 + n.
        let new_k = rng.values((pos0 + n) * row, 2.0);
        let new_v = rng.values((pos0 + n) * row, 2.0);
        let spare = (cfg.n_ctx - pos0) * row;
        let kc = poisoned(
            ctx,
            "k_cache",
            &cache_words(ty, &new_k[..pos0 * row], spare)?,
        )?;
        let vc = poisoned(
            ctx,
            "v_cache",
            &cache_words(ty, &new_v[..pos0 * row], spare)?,
        )?;
        let kb = kernels::upload_f32(ctx, "k", &new_k[pos0 * row..])?; // [n, n_head_kv, hd]
        let vb = kernels::upload_f32(ctx, "v", &new_v[pos0 * row..])?; // [n, n_head_kv, hd]
        let plan = |ks: &Kernels| ks.kv_store_launch(&kb, &vb, &kc, &vc, &cfg, n, pos0);
        if grid {
            ks.max_groups_per_dim = small_grid(&plan(ks)?)?;
        }
        let launches = plan(ks)?;
        // K and V of one type: a single launch stores both.
        if launches.len() != 1 {
            worst.fail();
        }
        let ds = launches
            .into_iter()
            .map(|l| prepare(ctx, ks, l, key))
            .collect::<Result<Vec<Dispatch>>>()?;
        kernels::run(ctx, &ds.iter().collect::<Vec<_>>())?;
        for (buf, src) in [(&kc, &new_k), (&vc, &new_v)] {
            let want = bytes_of(&cache_words(ty, src, spare - n * row)?);
            let got = bytes_of(&read_guarded(ctx, buf, want.len() / 4, &mut worst)?);
            // The values decoded from both (exact), and the bytes themselves (the padding
            // after the last position included: it must still be 0xff).
            let end = (pos0 + n) * row;
            let mut g = vec![0.0; end];
            let mut w = vec![0.0; end];
            ty.dequantize_into(&got[..ty.bytes(end)], &mut g);
            ty.dequantize_into(&want[..ty.bytes(end)], &mut w);
            worst.add_all(&g, &w, |_| 0.0);
            if got != want {
                worst.fail();
            }
        }
    }
    Ok(worst)
}
