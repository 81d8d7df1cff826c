//! Element-wise and row-wise ops: RMS norm, RoPE, softmax, SwiGLU, add, embedding lookup.
//!
//! These are a small share of a forward pass, so they are plain portable loops written so the
//! compiler vectorizes them (eight partial sums instead of one serial chain).

use super::formats as f;
use super::scalar::float_at;
use super::FloatFormat;
use crate::config::FfnAct;
use crate::{Error, GgmlType, Result};
use kernels_ref::Rotation;

fn len_err(what: &str, detail: String) -> Error {
    Error::InvalidArgument(format!("{what}: {detail}"))
}

/// Sum of squares with eight partial sums.
fn sum_sq(x: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let chunks = x.chunks_exact(8);
    let tail = chunks.remainder();
    for c in chunks {
        for (a, v) in acc.iter_mut().zip(c) {
            *a += v * v;
        }
    }
    acc.iter().sum::<f32>() + tail.iter().map(|v| v * v).sum::<f32>()
}

/// Dot product with eight partial sums.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 8];
    let ca = a.chunks_exact(8);
    let cb = b.chunks_exact(8);
    let tail: f32 = ca
        .remainder()
        .iter()
        .zip(cb.remainder())
        .map(|(x, y)| x * y)
        .sum();
    for (x, y) in ca.zip(cb) {
        for i in 0..8 {
            acc[i] += x[i] * y[i];
        }
    }
    acc.iter().sum::<f32>() + tail
}

/// RMS norm of each row: out = x / sqrt(mean(x²) + eps) * weight. `x` and `out` are
/// [n_rows, n] with n = weight.len().
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) -> Result<()> {
    let n = weight.len();
    if n == 0 || !x.len().is_multiple_of(n) || out.len() != x.len() {
        return Err(len_err(
            "rms_norm",
            format!("x {} / out {} not rows of {n}", x.len(), out.len()),
        ));
    }
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let scale = 1.0 / (sum_sq(xr) / n as f32 + eps).sqrt();
        for ((o, &v), &g) in or.iter_mut().zip(xr).zip(weight) {
            *o = v * scale * g;
        }
    }
    Ok(())
}

/// Rotary embedding in place for one token at position `pos`: `x` is [n_heads, head_dim],
/// rotated as `r` says (kernels-ref's `rope`, in f32 with angles from f64).
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    pos: usize,
    r: &Rotation,
) -> Result<()> {
    rope_tokens(x, 1, n_heads, head_dim, pos, r)
}

/// `rope` for `n_tokens` consecutive tokens at positions pos0, pos0+1, ...; `x` is
/// [n_tokens, n_heads, head_dim]. cos/sin are computed once per token (in f64, then rounded)
/// and applied to every head.
pub fn rope_tokens(
    x: &mut [f32],
    n_tokens: usize,
    n_heads: usize,
    head_dim: usize,
    pos0: usize,
    r: &Rotation,
) -> Result<()> {
    rope_tokens_cached(
        &mut RopeCache::default(),
        x,
        n_tokens,
        n_heads,
        head_dim,
        pos0,
        r,
    )
}

/// Rotates every token of x: [n_tokens, n_heads, head_dim] by `delta` positions (the same
/// angle for all of them): a context shift moves cached keys from position p to p + delta
/// (delta < 0) this way, RoPE rotations composing by adding angles. `r.mscale` is not applied:
/// the keys carry it from their first rotation.
pub fn rope_shift(
    x: &mut [f32],
    n_tokens: usize,
    n_heads: usize,
    head_dim: usize,
    delta: i64,
    r: &Rotation,
) -> Result<()> {
    let g = RopeGeom {
        n_tokens,
        n_heads,
        head_dim,
        n_rot: r.n_rot,
    };
    check_rope(x, g)?;
    check_factors(r)?;
    let mut table = Vec::new();
    let once = Rotation { mscale: 1.0, ..*r };
    rope_table(&mut table, n_tokens, delta as f64, 0.0, &once);
    rope_apply(x, g, &table, r.neox);
    Ok(())
}

/// The shape a rotation applies to.
#[derive(Clone, Copy)]
struct RopeGeom {
    n_tokens: usize,
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
}

/// Per-pair frequency factors must be one per rotated pair.
fn check_factors(r: &Rotation) -> Result<()> {
    match r.factors {
        Some(f) if f.len() != r.n_rot / 2 => Err(Error::InvalidArgument(format!(
            "rope: {} frequency factors for {} rotated dimensions",
            f.len(),
            r.n_rot
        ))),
        _ => Ok(()),
    }
}

/// table: [n_tokens][n_rot / 2] (cos θ, sin θ) · mscale of token t's angles, token t at
/// position p0 + t · step (computed in f64, then rounded; ggml's `rope_yarn` multiplies
/// `cosf(theta)` by mscale likewise). The factors divide each pair's angle, as ggml's
/// `ggml_rope_cache_init` divides theta by `ff`.
fn rope_table(table: &mut Vec<(f32, f32)>, n_tokens: usize, p0: f64, step: f64, r: &Rotation) {
    let half = r.n_rot / 2;
    // [half] inverse frequencies, shared by all tokens.
    let inv_freq: Vec<f64> = (0..half)
        .map(|i| {
            let ff = r.factors.map_or(1.0, |f| f64::from(f[i]));
            f64::from(r.freq_base).powf(-2.0 * i as f64 / r.n_rot as f64) / ff
        })
        .collect();
    table.clear();
    for t in 0..n_tokens {
        let p = (p0 + t as f64 * step) * f64::from(r.freq_scale);
        table.extend(inv_freq.iter().map(|f| {
            let theta = p * f;
            (theta.cos() as f32 * r.mscale, theta.sin() as f32 * r.mscale)
        }));
    }
}

/// Rotates x: [n_tokens, n_heads, head_dim] by `table` (see `rope_table`).
fn rope_apply(x: &mut [f32], g: RopeGeom, table: &[(f32, f32)], neox: bool) {
    let half = g.n_rot / 2;
    let per_token = (g.n_heads * g.head_dim).max(1);
    for (xt, cs) in x.chunks_exact_mut(per_token).zip(table.chunks(half.max(1))) {
        for h in xt.chunks_exact_mut(g.head_dim.max(1)) {
            for (i, &(c, s)) in cs.iter().enumerate().take(half) {
                let (a, b) = if neox {
                    (i, i + half)
                } else {
                    (2 * i, 2 * i + 1)
                };
                let (x0, x1) = (h[a], h[b]);
                h[a] = x0 * c - x1 * s;
                h[b] = x0 * s + x1 * c;
            }
        }
    }
}

/// The cos/sin table of the last `rope_tokens_cached` call. A decode step rotates Q and K of
/// every layer at the same position: the table (powf, cos and sin per pair) is computed once
/// per token instead of twice per layer.
#[derive(Default)]
pub struct RopeCache {
    /// (pos0, n_tokens, n_rot, freq_base bits, freq_scale bits, factors' address, mscale
    /// bits) the table was made for.
    key: Option<(usize, usize, usize, u32, u32, usize, u32)>,
    /// [n_tokens][n_rot / 2] (cos, sin).
    table: Vec<(f32, f32)>,
}

/// `rope_tokens` with the angle table kept in `cache` between calls: the same values, computed
/// once per (positions, rotation) instead of once per call.
pub fn rope_tokens_cached(
    cache: &mut RopeCache,
    x: &mut [f32],
    n_tokens: usize,
    n_heads: usize,
    head_dim: usize,
    pos0: usize,
    r: &Rotation,
) -> Result<()> {
    let g = RopeGeom {
        n_tokens,
        n_heads,
        head_dim,
        n_rot: r.n_rot,
    };
    check_rope(x, g)?;
    check_factors(r)?;
    let key = (
        pos0,
        n_tokens,
        r.n_rot,
        r.freq_base.to_bits(),
        r.freq_scale.to_bits(),
        r.factors.map_or(0, |f| f.as_ptr() as usize),
        r.mscale.to_bits(),
    );
    if cache.key != Some(key) {
        cache.key = None;
        rope_table(&mut cache.table, n_tokens, pos0 as f64, 1.0, r);
        cache.key = Some(key);
    }
    rope_apply(x, g, &cache.table, r.neox);
    Ok(())
}

fn check_rope(x: &[f32], g: RopeGeom) -> Result<()> {
    let RopeGeom {
        n_tokens,
        n_heads,
        head_dim,
        n_rot,
    } = g;
    if x.len() != n_tokens * n_heads * head_dim || n_rot > head_dim || !n_rot.is_multiple_of(2) {
        return Err(len_err(
            "rope",
            format!(
                "x {} for {n_tokens}x{n_heads}x{head_dim}, n_rot {n_rot}",
                x.len()
            ),
        ));
    }
    Ok(())
}

/// Softmax in place (max-subtracted). An empty slice is left alone. AVX2 lanes where the CPU has
/// them (an exp within 2 ulp of libm's).
pub fn softmax(x: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if super::Isa::Avx2.available() {
        // SAFETY: Avx2 availability includes AVX2 and FMA.
        unsafe { super::avx2_float::softmax(x) };
        return;
    }
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mut sum = 0.0f32;
    for v in x.iter_mut() {
        *v = (*v - m).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// x · sigmoid(x).
#[inline]
pub fn silu(x: f32) -> f32 {
    x / (1.0 + (-x).exp())
}

/// out = silu(gate) * up, element-wise.
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> Result<()> {
    if gate.len() != up.len() || out.len() != gate.len() {
        return Err(len_err(
            "swiglu",
            format!("gate {} up {} out {}", gate.len(), up.len(), out.len()),
        ));
    }
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = silu(g) * u;
    }
    Ok(())
}

/// gate[i] = silu(gate[i]) * up[i] in place over the whole slices (the CPU backend's SwiGLU):
/// AVX2 lanes where the CPU has them (an exp within 2 ulp of libm's), else `silu`.
pub fn swiglu_in_place(gate: &mut [f32], up: &[f32]) -> Result<()> {
    glu_in_place(FfnAct::Silu, gate, up)
}

/// ggml's tanh-GELU constants (ggml/src/ggml-cpu/vec.h).
pub(crate) const GELU_COEF_A: f32 = 0.044715;
pub(crate) const SQRT_2_OVER_PI: f32 = 0.797_884_6;

/// GELU in its tanh form, 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x³))), computed as
/// x · sigmoid(2 sqrt(2/pi) (x + 0.044715 x³)): the same function, with no tanh to overflow.
pub fn gelu_tanh(x: f32) -> f32 {
    let t = 2.0 * SQRT_2_OVER_PI * (x + GELU_COEF_A * x * x * x);
    x / (1.0 + (-t).exp())
}

/// gate = act(gate) * up in place, element-wise: SwiGLU or GeGLU.
pub fn glu_in_place(act: FfnAct, gate: &mut [f32], up: &[f32]) -> Result<()> {
    if gate.len() != up.len() {
        return Err(len_err(
            "glu",
            format!("gate {} up {}", gate.len(), up.len()),
        ));
    }
    let gelu = act == FfnAct::GeluTanh;
    #[cfg(target_arch = "x86_64")]
    if super::Isa::Avx2.available() {
        // SAFETY: Avx2 availability includes AVX2 and FMA; the lengths match.
        unsafe { super::avx2_float::glu(gelu, gate, up) };
        return Ok(());
    }
    for (g, &u) in gate.iter_mut().zip(up) {
        *g = if gelu { gelu_tanh(*g) } else { silu(*g) } * u;
    }
    Ok(())
}

/// x = cap * tanh(x / cap) in place (final-logit soft-capping).
pub fn softcap(x: &mut [f32], cap: f32) {
    for v in x {
        *v = cap * (*v / cap).tanh();
    }
}

/// out = a + b, element-wise.
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<()> {
    if a.len() != b.len() || out.len() != a.len() {
        return Err(len_err(
            "add",
            format!("a {} b {} out {}", a.len(), b.len(), out.len()),
        ));
    }
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
    Ok(())
}

/// Dequantizes row `row` of an embedding table ([n_rows, n_embd] in format `ty`) into `out`.
pub fn embedding(
    ty: GgmlType,
    table: &[u8],
    n_embd: usize,
    row: usize,
    out: &mut [f32],
) -> Result<()> {
    let rb = ty
        .row_bytes(n_embd as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| len_err("embedding", format!("{n_embd} is not whole {ty} blocks")))?;
    let start = row.checked_mul(rb).filter(|s| s + rb <= table.len());
    let (Some(start), true) = (start, out.len() == n_embd) else {
        return Err(len_err(
            "embedding",
            format!(
                "row {row} of a {} byte {ty} table, out {}",
                table.len(),
                out.len()
            ),
        ));
    };
    dequantize_row(ty, &table[start..start + rb], out)
}

/// Dequantizes whole blocks of `ty` into `out` (fast formats here, others via kernels-ref).
pub(crate) fn dequantize_row(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    let ff = match ty {
        GgmlType::F32 => Some(FloatFormat::F32),
        GgmlType::F16 => Some(FloatFormat::F16),
        GgmlType::BF16 => Some(FloatFormat::Bf16),
        _ => None,
    };
    if let Some(ff) = ff {
        for (i, o) in out.iter_mut().enumerate() {
            *o = float_at(ff, data, i);
        }
        return Ok(());
    }
    match ty {
        GgmlType::Q4_0 => f::dequantize::<f::Q4_0>(data, out),
        GgmlType::Q4_1 => f::dequantize::<f::Q4_1>(data, out),
        GgmlType::Q5_0 => f::dequantize::<f::Q5_0>(data, out),
        GgmlType::Q5_1 => f::dequantize::<f::Q5_1>(data, out),
        GgmlType::Q8_0 => f::dequantize::<f::Q8_0>(data, out),
        GgmlType::IQ4_NL => f::dequantize::<f::IQ4_NL>(data, out),
        GgmlType::IQ4_XS => f::dequantize::<f::IQ4_XS>(data, out),
        GgmlType::Q2_K => f::dequantize::<f::Q2_K>(data, out),
        GgmlType::Q3_K => f::dequantize::<f::Q3_K>(data, out),
        GgmlType::Q4_K => f::dequantize::<f::Q4_K>(data, out),
        GgmlType::Q5_K => f::dequantize::<f::Q5_K>(data, out),
        GgmlType::Q6_K => f::dequantize::<f::Q6_K>(data, out),
        GgmlType::TQ2_0 => f::dequantize::<f::TQ2_0>(data, out),
        _ => return dequantize_ref(ty, data, out),
    }
    debug_assert_eq!(data.len() / ty.type_size() * ty.block_size(), out.len());
    Ok(())
}

/// Row dequantization by kernels-ref, for formats without a kernel here.
pub(crate) fn dequantize_ref(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<()> {
    kernels_ref::dequantize(ty, data, out).map_err(|e| Error::UnsupportedType {
        ty,
        what: format!("CPU dequantization: {e}"),
    })
}
