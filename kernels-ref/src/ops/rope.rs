//! Rotary position embedding (twin of `shaders/rope.wgsl`).

/// One RoPE rotation's settings: which dims turn, how fast, and how they pair.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Rotation<'a> {
    /// Dims of each head that rotate (even, at most the head size); the rest are left alone.
    pub n_rot: usize,
    pub freq_base: f32,
    /// Multiplies positions (1 / a linear scaling factor).
    pub freq_scale: f32,
    /// Per-pair frequency factors (`[n_rot / 2]`, Llama 3's `rope_freqs.weight`, phi3's
    /// LongRoPE ones): pair `i`'s angle is divided by `factors[i]`, as ggml's
    /// `ggml_rope_cache_init` (ggml/src/ggml-cpu/ops.cpp) passes `theta / ff` to `rope_yarn`.
    pub factors: Option<&'a [f32]>,
    /// Multiplies the rotated values (ggml's `rope_yarn` multiplies cos and sin by it: phi3's
    /// LongRoPE attention factor, `rope.scaling.attn_factor`, with YaRN's extrapolation off).
    pub mscale: f32,
    /// Pairs `(i, i + n_rot/2)` (qwen2, gpt-neox, ...) instead of ggml's "normal" `(2i, 2i + 1)`
    /// (llama).
    pub neox: bool,
}

impl Rotation<'static> {
    /// `n_rot` dims turning at base `freq_base`, unscaled, without factors.
    pub fn new(n_rot: usize, freq_base: f32, neox: bool) -> Rotation<'static> {
        Rotation {
            n_rot,
            freq_base,
            freq_scale: 1.0,
            factors: None,
            mscale: 1.0,
            neox,
        }
    }
}

impl<'a> Rotation<'a> {
    /// The same rotation with positions multiplied by `freq_scale`.
    pub fn scaled(self, freq_scale: f32) -> Rotation<'a> {
        Rotation { freq_scale, ..self }
    }
    /// The same rotation with per-pair frequency factors.
    pub fn with_factors<'b>(self, factors: Option<&'b [f32]>) -> Rotation<'b>
    where
        'a: 'b,
    {
        Rotation { factors, ..self }
    }
}

/// RoPE on one token's heads, in place.
///
/// `x`: `[n_heads, head_dim]`. The first `r.n_rot` dims of each head are rotated in pairs by
/// `theta_i = pos * freq_scale * freq_base^(-2i / n_rot) / factors[i]`, `i` in `0..n_rot/2`,
/// and multiplied by `r.mscale`; dims past `n_rot` are left alone. `(a, b)` becomes
/// `(a cos - b sin, a sin + b cos)`. Angles and products are computed in f64 (ggml builds theta
/// by repeated f32 multiplication; the oracle uses the exact value).
///
/// # Panics
/// If `x.len() != n_heads * head_dim`, `n_rot > head_dim`, `n_rot` is odd or the factors are
/// not `n_rot / 2` (programmer errors: these come from the model config the caller
/// validated).
pub fn rope(x: &mut [f32], n_heads: usize, head_dim: usize, pos: usize, r: &Rotation) {
    let Rotation {
        n_rot,
        freq_base,
        freq_scale,
        factors,
        mscale,
        neox,
    } = *r;
    if let Some(f) = factors {
        assert_eq!(
            f.len(),
            n_rot / 2,
            "rope: {} factors for {n_rot} rotated dims",
            f.len()
        );
    }
    assert_eq!(
        Some(x.len()),
        n_heads.checked_mul(head_dim),
        "rope: x is not [n_heads, head_dim]"
    );
    assert!(
        n_rot <= head_dim,
        "rope: n_rot {n_rot} > head_dim {head_dim}"
    );
    assert!(n_rot.is_multiple_of(2), "rope: n_rot {n_rot} is odd");
    if head_dim == 0 {
        return;
    }
    let half = n_rot / 2;
    let p = pos as f64 * f64::from(freq_scale);
    for head in x.chunks_exact_mut(head_dim) {
        for i in 0..half {
            let ff = factors.map_or(1.0, |f| f64::from(f[i]));
            let theta = p * f64::from(freq_base).powf(-2.0 * i as f64 / n_rot as f64) / ff;
            let (sin, cos) = theta.sin_cos();
            let (sin, cos) = (sin * f64::from(mscale), cos * f64::from(mscale));
            let (ia, ib) = if neox {
                (i, i + half)
            } else {
                (2 * i, 2 * i + 1)
            };
            let a = f64::from(head[ia]);
            let b = f64::from(head[ib]);
            head[ia] = (a * cos - b * sin) as f32;
            head[ib] = (a * sin + b * cos) as f32;
        }
    }
}
