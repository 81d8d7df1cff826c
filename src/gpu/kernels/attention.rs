//! Attention for the llama forward pass on the GPU: appending keys and values to a layer's KV
//! cache (`kv_store`), decode attention split over the sequence (flash-decoding:
//! `attention_split` then `attention_combine`) and tiled causal prefill attention with an
//! online softmax (`attention_prefill`). The semantics are kernels-ref's `ops::attention`.
//!
//! Everything here only plans [`Launch`]es (shapes, checks, grids); nothing is created. The
//! launches of one call are meant to be encoded in order into one compute pass (wgpu orders
//! the dispatches of a pass that share a buffer).

use crate::error::{Error, Result};
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words};
use crate::gpu::kernels::{grid, to_u32, Kernels, Launch};
use crate::gpu::registry::{AttentionParams, KernelKey, KvStoreParams, MAX_WORKGROUP_SIZE};
use crate::kv_type::{KvType, KvTypes};

/// Key positions per split workgroup: the `CHUNK` override of `attention_split.wgsl` and
/// `attention_combine.wgsl`, set by [`Kernels::with_options`].
pub const ATTENTION_CHUNK: u32 = 256;
/// `MAX_CHUNK` in `attention_split.wgsl` (its score array).
const MAX_CHUNK: u32 = 512;
const _: () = assert!(ATTENTION_CHUNK >= 1 && ATTENTION_CHUNK <= MAX_CHUNK);

/// Largest head dimension the kernels hold (`MAX_D4 * 4` in WGSL); it must be a multiple of 4.
pub const MAX_HEAD_DIM: usize = 256;

/// [`Kernels::attention_launches`] takes the split (decode) path up to this many query tokens
/// and the tiled prefill path above: a prefill tile reads the keys once for up to 16 queries,
/// the split path once per query, but the split path spreads a long context over many
/// workgroups.
pub const SPLIT_MAX_TOKENS: usize = 4;

// Workgroup arrays of attention_prefill.wgsl, in vec4 (Q_SH4, KV_SH4) and f32 (S_SH) units.
const PREFILL_Q_SH4: usize = 512;
const PREFILL_KV_SH4: usize = 256;
const PREFILL_S_SH: usize = 512;
/// `ACC4`: accumulator vec4s per prefill invocation.
const PREFILL_ACC4: usize = 8;
/// Most query tokens per prefill workgroup.
const PREFILL_MAX_TILE_Q: usize = 16;
/// The head dimension `attention_prefill_lanes.wgsl` is written for (`HD4 * 4`).
pub const PREFILL_LANES_HEAD_DIM: usize = 64;

/// Workgroup memory of each attention kernel, in bytes (mirrors the WGSL declarations; the
/// reduction fragments hold `MAX_WG` f32 and one atomic).
const REDUCE_BYTES: u32 = MAX_WORKGROUP_SIZE * 4 + 4;
const SPLIT_WORKGROUP_BYTES: u32 =
    (MAX_HEAD_DIM as u32 / 4) * 16 + MAX_CHUNK * 4 + MAX_WORKGROUP_SIZE * 16 + REDUCE_BYTES;
const COMBINE_WORKGROUP_BYTES: u32 = MAX_WORKGROUP_SIZE * 16 + REDUCE_BYTES;
const PREFILL_WORKGROUP_BYTES: u32 =
    ((PREFILL_Q_SH4 + PREFILL_KV_SH4) * 16 + PREFILL_S_SH * 4) as u32;
// WebGPU guarantees 16 KiB of workgroup storage: every kernel fits any device.
const _: () = assert!(SPLIT_WORKGROUP_BYTES <= 16384);
const _: () = assert!(COMBINE_WORKGROUP_BYTES <= 16384);
const _: () = assert!(PREFILL_WORKGROUP_BYTES <= 16384);

/// Checks the attention kernels' workgroup memory against the device's
/// `max_compute_workgroup_storage_size` (a device below WebGPU's 16 KiB minimum fails here
/// with a message, not at pipeline creation).
pub fn check_workgroup_storage(limits: &wgpu::Limits) -> Result<()> {
    let need = SPLIT_WORKGROUP_BYTES
        .max(COMBINE_WORKGROUP_BYTES)
        .max(PREFILL_WORKGROUP_BYTES);
    if need > limits.max_compute_workgroup_storage_size {
        return Err(Error::Gpu(format!(
            "attention kernels need {need} bytes of workgroup storage, the device has {}",
            limits.max_compute_workgroup_storage_size
        )));
    }
    Ok(())
}

/// One layer's attention shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AttentionConfig {
    pub n_head: usize,
    /// kv heads (GQA: `n_head` is a multiple)
    pub n_head_kv: usize,
    /// multiple of 4, at most [`MAX_HEAD_DIM`]
    pub head_dim: usize,
    /// score scale (usually `1 / sqrt(head_dim)`)
    pub scale: f32,
    /// rows (positions) of the KV cache
    pub n_ctx: usize,
    /// the caches' element types (their GGUF layouts, see `shaders/kv/read.wgsl`)
    pub kv: KvTypes,
    /// a sliding-window layer's window: each query sees its last `window` positions
    pub window: Option<usize>,
    /// scores become `c * tanh(score / c)` before the softmax (gemma2)
    pub softcap: Option<f32>,
}

/// Bytes of a KV cache buffer of `values` values of type `ty`: the type's layout, rounded up
/// to whole words; the block types get room for one more pair of blocks (`kv_store` rewrites
/// whole pairs, the last one may be half past the end).
pub fn kv_cache_bytes(ty: KvType, values: usize) -> u64 {
    let spare = if ty.block_values() > 1 {
        2 * ty.block_bytes() as u64
    } else {
        0
    };
    (ty.bytes(values) as u64)
        .saturating_add(spare)
        .next_multiple_of(4)
}

/// Which attention kernels to run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionPath {
    /// Flash-decoding: `attention_split` over chunks of [`ATTENTION_CHUNK`] positions, then
    /// `attention_combine` (skipped when one chunk holds the context: the split pass then
    /// writes the output). Needs the scratch buffer.
    Split,
    /// Causal prefill in the set's layout: `attention_prefill_lanes` where
    /// [`Kernels::attention_lanes`] chose it (64-dim heads), else `attention_prefill`; the
    /// scratch buffer is not used.
    Prefill,
    /// The tiled causal prefill (`attention_prefill`) whatever the set's layout (the selftest
    /// checks it on adapters that take the lanes variant).
    PrefillTiled,
}

/// f32 elements of split scratch one query token needs at the full context:
/// `[n_head, ceil(n_ctx / chunk), head_dim + 4]`.
fn split_scratch_per_token(cfg: &AttentionConfig, chunk: usize) -> usize {
    cfg.n_head
        .saturating_mul(cfg.n_ctx.div_ceil(chunk.max(1)))
        .saturating_mul(cfg.head_dim + 4)
}

/// f32 elements of the scratch buffer [`Kernels::attention_launches`] needs for calls with up
/// to `max_tokens` queries (it only takes the split path up to [`SPLIT_MAX_TOKENS`] tokens);
/// `chunk` is [`ATTENTION_CHUNK`]. At least 4, so the buffer is never empty.
pub fn attention_scratch_len(cfg: &AttentionConfig, max_tokens: usize, chunk: usize) -> usize {
    split_scratch_len(cfg, max_tokens.min(SPLIT_MAX_TOKENS), chunk)
}

/// f32 elements of scratch the split path needs for `n_tokens` queries at any position (what
/// [`Kernels::attention_launches_with`] with [`AttentionPath::Split`] needs). At least 4.
pub fn split_scratch_len(cfg: &AttentionConfig, n_tokens: usize, chunk: usize) -> usize {
    n_tokens
        .saturating_mul(split_scratch_per_token(cfg, chunk))
        .max(4)
}

fn check_cache(what: &str, buf: &wgpu::Buffer, ty: KvType, values: usize) -> Result<()> {
    let need = kv_cache_bytes(ty, values);
    if buf.size() < need {
        return Err(Error::Gpu(format!(
            "{what}: buffer of {} bytes, a {ty} cache of {values} values needs {need} bytes",
            buf.size()
        )));
    }
    Ok(())
}

fn check_q8(what: &str, buf: &wgpu::Buffer, bytes: usize) -> Result<()> {
    if buf.size() < bytes as u64 {
        return Err(Error::Gpu(format!(
            "{what}: buffer of {} bytes, need {bytes}",
            buf.size()
        )));
    }
    Ok(())
}

fn check_len(what: &str, buf: &wgpu::Buffer, n_f32: usize) -> Result<()> {
    let need = (n_f32 as u64).saturating_mul(4);
    if buf.size() < need {
        return Err(Error::Gpu(format!(
            "{what}: buffer of {} bytes, need {n_f32} f32 ({need} bytes)",
            buf.size()
        )));
    }
    Ok(())
}

/// Checks the shape and the position range; returns the f32 per cache row.
fn check_shape(cfg: &AttentionConfig, n_tokens: usize, pos0: usize) -> Result<usize> {
    if cfg.n_head == 0 || cfg.n_head_kv == 0 || !cfg.n_head.is_multiple_of(cfg.n_head_kv) {
        return Err(Error::Gpu(format!(
            "attention: n_head {} must be a positive multiple of n_head_kv {}",
            cfg.n_head, cfg.n_head_kv
        )));
    }
    if cfg.head_dim == 0 || !cfg.head_dim.is_multiple_of(4) || cfg.head_dim > MAX_HEAD_DIM {
        return Err(Error::Gpu(format!(
            "attention: head_dim {} unsupported (a multiple of 4, at most {MAX_HEAD_DIM})",
            cfg.head_dim
        )));
    }
    let end = pos0.checked_add(n_tokens);
    if end.is_none_or(|e| e > cfg.n_ctx) {
        return Err(Error::Gpu(format!(
            "attention: positions {pos0}..{pos0}+{n_tokens} exceed the KV cache's n_ctx {}",
            cfg.n_ctx
        )));
    }
    cfg.kv.check_head_dim(cfg.head_dim)?;
    let row = cfg.n_head_kv * cfg.head_dim;
    // Every index the shaders compute (u32) is below the cache or activation size.
    to_u32(
        cfg.n_ctx.saturating_mul(row),
        "n_ctx * n_head_kv * head_dim",
    )?;
    to_u32(
        n_tokens.saturating_mul(cfg.n_head * cfg.head_dim),
        "n_tokens * n_head * head_dim",
    )?;
    Ok(row)
}

/// Query tokens and key positions per prefill tile for `head_dim` with `wg` invocations, such
/// that the WGSL arrays hold them: tile_q * d4 <= Q_SH4, tile_k * d4 <= KV_SH4,
/// tile_q * tile_k <= S_SH and each invocation's lanes ceil(d4 / (wg / tile_q)) <= ACC4.
fn prefill_tiles(head_dim: usize, wg: usize) -> Result<(usize, usize)> {
    let d4 = head_dim / 4;
    let mut tq = PREFILL_MAX_TILE_Q.min(PREFILL_Q_SH4 / d4).min(wg);
    while tq > 1 && d4.div_ceil(wg / tq) > PREFILL_ACC4 {
        tq -= 1;
    }
    if tq == 0 || d4.div_ceil(wg / tq) > PREFILL_ACC4 {
        return Err(Error::Gpu(format!(
            "attention prefill: head_dim {head_dim} does not fit a workgroup of {wg}"
        )));
    }
    let tk = (PREFILL_KV_SH4 / d4).min(PREFILL_S_SH / tq);
    Ok((tq, tk))
}

impl Kernels {
    /// Writes `k` and `v` (each `[n_tokens, n_head_kv, head_dim]` f32) into rows
    /// `pos0..pos0 + n_tokens` of `k_cache` and `v_cache` (each `[n_ctx, n_head_kv,
    /// head_dim]` in `cfg.kv`'s types, [`kv_cache_bytes`]), quantizing them; other rows are
    /// untouched. One launch when both caches have the same type, else one per cache; empty
    /// for `n_tokens == 0`.
    #[allow(clippy::too_many_arguments)]
    pub fn kv_store_launch<'a>(
        &self,
        k: &'a wgpu::Buffer,
        v: &'a wgpu::Buffer,
        k_cache: &'a wgpu::Buffer,
        v_cache: &'a wgpu::Buffer,
        cfg: &AttentionConfig,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<Vec<Launch<'a>>> {
        let row = check_shape(cfg, n_tokens, pos0)?;
        check_len("kv_store k", k, n_tokens * row)?;
        check_len("kv_store v", v, n_tokens * row)?;
        check_cache("kv_store k_cache", k_cache, cfg.kv.k, cfg.n_ctx * row)?;
        check_cache("kv_store v_cache", v_cache, cfg.kv.v, cfg.n_ctx * row)?;
        if n_tokens == 0 {
            return Ok(Vec::new());
        }
        let n = to_u32(n_tokens * row, "kv_store elements")?;
        // Invocations (shaders/kv_store.wgsl): a word each for f32 and f16, a pair of blocks
        // for the block types (one more pair when the range starts mid-pair).
        let units = |ty: KvType| match ty {
            KvType::F32 => n,
            KvType::F16 => n / 2,
            KvType::Q8_0 | KvType::Q4_0 => n / 64 + 1,
        };
        let launch = |ty: KvType,
                      first: (&'a wgpu::Buffer, &'a wgpu::Buffer),
                      second: (&'a wgpu::Buffer, &'a wgpu::Buffer),
                      units_v: u32|
         -> Result<Launch<'a>> {
            let units_k = units(ty);
            let total = units_k
                .checked_add(units_v)
                .ok_or_else(|| Error::Gpu("kv_store: too many invocations".into()))?;
            let groups = grid(total.div_ceil(self.workgroup_size), self.max_groups_per_dim)?;
            let params = KvStoreParams {
                n_tokens: to_u32(n_tokens, "n_tokens")?,
                row_len: to_u32(row, "n_head_kv * head_dim")?,
                pos0: to_u32(pos0, "pos0")?,
                groups_x: groups.0,
                units_k,
                units_v,
                pad0: 0,
                pad1: 0,
            };
            Ok(Launch::new(
                KernelKey::KvStore { ty },
                &params,
                &[(0, first.0), (1, first.1), (3, second.0), (4, second.1)],
                2,
                groups,
            ))
        };
        let (kp, vp) = ((k, k_cache), (v, v_cache));
        if cfg.kv.k == cfg.kv.v {
            // One launch: K's invocations, then V's.
            return Ok(vec![launch(cfg.kv.k, kp, vp, units(cfg.kv.v))?]);
        }
        // Different types: one launch each; the other pair is bound but not written.
        let launches = vec![launch(cfg.kv.k, kp, vp, 0)?, launch(cfg.kv.v, vp, kp, 0)?];
        Ok(launches)
    }

    /// Causal attention of `q` (`[n_tokens, n_head, head_dim]`, token `i` at position
    /// `pos0 + i`) over cache rows `0..=pos0 + i` into `out` (`[n_tokens, n_head, head_dim]`):
    /// the split path up to [`SPLIT_MAX_TOKENS`] tokens, the tiled prefill path above. The
    /// launches must be encoded in order; `scratch` holds at least [`attention_scratch_len`]
    /// f32. Empty for `n_tokens == 0`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_launches<'a>(
        &self,
        q: &'a wgpu::Buffer,
        k_cache: &'a wgpu::Buffer,
        v_cache: &'a wgpu::Buffer,
        scratch: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        cfg: &AttentionConfig,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<Vec<Launch<'a>>> {
        let (launches, _) = self.attention_launches_quant(
            q, k_cache, v_cache, scratch, out, None, cfg, n_tokens, pos0,
        )?;
        Ok(launches)
    }

    /// As [`Kernels::attention_launches`]; with `quant` = (qx, qd) (`[n_tokens, q_dim / 4]`
    /// u32 and `[n_tokens, q_dim / 32]` vec4, `shaders/quantize_act.wgsl`'s layout), when the
    /// split pass writes the output alone (one chunk, `head_dim` a multiple of 32) it also
    /// quantizes that output into them, exactly as `quantize_act` would: the flag says so.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_launches_quant<'a>(
        &self,
        q: &'a wgpu::Buffer,
        k_cache: &'a wgpu::Buffer,
        v_cache: &'a wgpu::Buffer,
        scratch: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        quant: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer)>,
        cfg: &AttentionConfig,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<(Vec<Launch<'a>>, bool)> {
        let path = if n_tokens <= SPLIT_MAX_TOKENS {
            AttentionPath::Split
        } else {
            AttentionPath::Prefill
        };
        let bufs = (q, k_cache, v_cache, scratch, out);
        self.plan_attention(path, bufs, quant, cfg, n_tokens, pos0)
    }

    /// As [`Kernels::attention_launches`] on the given path; the split path needs
    /// [`split_scratch_len`] f32 of `scratch` for `n_tokens`.
    #[allow(clippy::too_many_arguments)]
    pub fn attention_launches_with<'a>(
        &self,
        path: AttentionPath,
        q: &'a wgpu::Buffer,
        k_cache: &'a wgpu::Buffer,
        v_cache: &'a wgpu::Buffer,
        scratch: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        cfg: &AttentionConfig,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<Vec<Launch<'a>>> {
        let bufs = (q, k_cache, v_cache, scratch, out);
        Ok(self
            .plan_attention(path, bufs, None, cfg, n_tokens, pos0)?
            .0)
    }

    /// The launches of `path` over (q, k_cache, v_cache, scratch, out), quantizing the output
    /// into `quant` where the split pass can (the flag).
    #[allow(clippy::type_complexity)]
    fn plan_attention<'a>(
        &self,
        path: AttentionPath,
        (q, k_cache, v_cache, scratch, out): (
            &'a wgpu::Buffer,
            &'a wgpu::Buffer,
            &'a wgpu::Buffer,
            &'a wgpu::Buffer,
            &'a wgpu::Buffer,
        ),
        quant: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer)>,
        cfg: &AttentionConfig,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<(Vec<Launch<'a>>, bool)> {
        let row = check_shape(cfg, n_tokens, pos0)?;
        let act = n_tokens * cfg.n_head * cfg.head_dim;
        check_len("attention q", q, act)?;
        check_len("attention out", out, act)?;
        check_cache("attention k_cache", k_cache, cfg.kv.k, cfg.n_ctx * row)?;
        check_cache("attention v_cache", v_cache, cfg.kv.v, cfg.n_ctx * row)?;
        if n_tokens == 0 {
            return Ok((Vec::new(), false));
        }
        let mut params = AttentionParams {
            n_tokens: to_u32(n_tokens, "n_tokens")?,
            n_head: to_u32(cfg.n_head, "n_head")?,
            n_head_kv: to_u32(cfg.n_head_kv, "n_head_kv")?,
            head_dim: to_u32(cfg.head_dim, "head_dim")?,
            pos0: to_u32(pos0, "pos0")?,
            n_chunks: 0,
            tile_q: 0,
            tile_k: 0,
            scale: cfg.scale,
            groups_x: 0,
            quant: 0,
            window: match cfg.window {
                None => 0,
                Some(0) => return Err(Error::Gpu("attention: a window of 0 positions".into())),
                Some(w) => to_u32(w, "window")?,
            },
            softcap: match cfg.softcap {
                None => 0.0,
                Some(c) if c > 0.0 && c.is_finite() => c,
                Some(c) => return Err(Error::Gpu(format!("attention: soft-cap {c}"))),
            },
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let max = self.max_groups_per_dim;
        match path {
            AttentionPath::Split => {
                let chunk = ATTENTION_CHUNK as usize;
                let n_chunks = (pos0 + n_tokens).div_ceil(chunk);
                // [n_tokens, n_head, n_chunks, head_dim + 4]
                let need = n_tokens * cfg.n_head * n_chunks * (cfg.head_dim + 4);
                check_len("attention scratch", scratch, need)?;
                to_u32(need, "attention scratch elements")?;
                params.n_chunks = to_u32(n_chunks, "n_chunks")?;
                let split_groups = n_tokens
                    .checked_mul(cfg.n_head * n_chunks)
                    .ok_or_else(|| Error::Gpu("attention: too many workgroups".into()))?;
                let groups = grid(to_u32(split_groups, "split workgroups")?, max)?;
                params.groups_x = groups.0;
                // With one chunk the split pass writes `out` itself (see
                // attention_split.wgsl), and may quantize it; else qx / qd are bound to `out`,
                // unused.
                let quant = quant.filter(|_| n_chunks == 1 && cfg.head_dim.is_multiple_of(32));
                let (qx, qd) = match quant {
                    Some((qx, qd)) => {
                        check_q8("attention qx", qx, qx_words(n_tokens, act / n_tokens) * 4)?;
                        check_q8("attention qd", qd, qd_vec4s(n_tokens, act / n_tokens) * 16)?;
                        params.quant = 1;
                        (qx, qd)
                    }
                    None => (out, out),
                };
                let split = Launch::new(
                    KernelKey::AttentionSplit {
                        subgroup: self.subgroup,
                        kv: cfg.kv,
                    },
                    &params,
                    &[
                        (0, q),
                        (1, k_cache),
                        (2, v_cache),
                        (3, scratch),
                        (5, out),
                        (6, qx),
                        (7, qd),
                    ],
                    4,
                    groups,
                );
                if n_chunks == 1 {
                    return Ok((vec![split], quant.is_some()));
                }
                let groups = grid(to_u32(n_tokens * cfg.n_head, "combine workgroups")?, max)?;
                params.groups_x = groups.0;
                let combine = Launch::new(
                    KernelKey::AttentionCombine {
                        subgroup: self.subgroup,
                    },
                    &params,
                    &[(0, scratch), (1, out)],
                    2,
                    groups,
                );
                Ok((vec![split, combine], false))
            }
            AttentionPath::Prefill | AttentionPath::PrefillTiled => {
                // CPU-like adapters: a query per invocation, a workgroup per (WG queries,
                // head); where the lanes variant failed its selftest, its launch fallback.
                let lanes = KernelKey::AttentionPrefillLanes { kv: cfg.kv };
                if path == AttentionPath::Prefill
                    && self.attention_lanes
                    && cfg.head_dim == PREFILL_LANES_HEAD_DIM
                    && !self.unavailable.contains(&lanes)
                {
                    let wg = self.workgroup_size as usize;
                    params.tile_q = self.workgroup_size;
                    let n_groups = n_tokens.div_ceil(wg) * cfg.n_head;
                    let groups = grid(to_u32(n_groups, "prefill workgroups")?, max)?;
                    params.groups_x = groups.0;
                    let bufs = [(0, q), (1, k_cache), (2, v_cache), (3, out)];
                    return Ok((vec![Launch::new(lanes, &params, &bufs, 4, groups)], false));
                }
                let (tq, tk) = prefill_tiles(cfg.head_dim, self.workgroup_size as usize)?;
                params.tile_q = to_u32(tq, "tile_q")?;
                params.tile_k = to_u32(tk, "tile_k")?;
                let n_groups = n_tokens.div_ceil(tq) * cfg.n_head;
                let groups = grid(to_u32(n_groups, "prefill workgroups")?, max)?;
                params.groups_x = groups.0;
                let launch = Launch::new(
                    KernelKey::AttentionPrefill { kv: cfg.kv },
                    &params,
                    &[(0, q), (1, k_cache), (2, v_cache), (3, out)],
                    4,
                    groups,
                );
                Ok((vec![launch], false))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_tiles_fit_the_workgroup_arrays() {
        for wg in [1usize, 2, 8, 16, 32, 64, 128, 256] {
            for hd in (4..=MAX_HEAD_DIM).step_by(4) {
                let d4 = hd / 4;
                let Ok((tq, tk)) = prefill_tiles(hd, wg) else {
                    // Only when even one query per workgroup cannot hold the head: never for
                    // the workgroups of 8 or more every device gives.
                    assert!(d4 > wg * PREFILL_ACC4 && wg < 8, "hd {hd} wg {wg}");
                    continue;
                };
                assert!(tq >= 1 && tk >= 1 && tq <= wg, "hd {hd} wg {wg}");
                assert!(tq * d4 <= PREFILL_Q_SH4 && tk * d4 <= PREFILL_KV_SH4);
                assert!(tq * tk <= PREFILL_S_SH);
                assert!(d4.div_ceil(wg / tq) <= PREFILL_ACC4, "hd {hd} wg {wg}");
            }
        }
        // The test model's shape gets the full query tile.
        assert_eq!(prefill_tiles(64, 64).unwrap(), (16, 16));
    }

    #[test]
    fn workgroup_storage_is_checked_against_the_limit() {
        let mut l = wgpu::Limits::downlevel_defaults();
        l.max_compute_workgroup_storage_size = 16384;
        assert!(check_workgroup_storage(&l).is_ok());
        l.max_compute_workgroup_storage_size = 8192;
        assert!(check_workgroup_storage(&l).is_err());
    }

    #[test]
    fn scratch_len_covers_the_split_path_only() {
        let cfg = AttentionConfig {
            n_head: 9,
            n_head_kv: 3,
            head_dim: 64,
            scale: 0.125,
            n_ctx: 1000,
            kv: KvTypes::F32,
            window: None,
            softcap: None,
        };
        // ceil(1000 / 256) = 4 chunks of (64 + 4) f32 per (token, head)
        assert_eq!(split_scratch_len(&cfg, 2, 256), 2 * 9 * 4 * 68);
        assert_eq!(
            attention_scratch_len(&cfg, 512, 256),
            split_scratch_len(&cfg, SPLIT_MAX_TOKENS, 256)
        );
        assert_eq!(split_scratch_len(&cfg, 0, 256), 4);
    }
}
