//! Rotary position embedding (twin of `shaders/rope.wgsl`).

/// RoPE on one token's heads, in place.
///
/// `x`: `[n_heads, head_dim]`. The first `n_rot` dims of each head are rotated in pairs by
/// `theta_i = pos * freq_scale * freq_base^(-2i / n_rot)`, `i` in `0..n_rot/2`; dims past
/// `n_rot` are left alone.
/// - `neox == false` (ggml "normal", llama arch): pair `i` is dims `(2i, 2i + 1)`.
/// - `neox == true` (qwen2, gpt-neox, ...): pair `i` is dims `(i, i + n_rot/2)`.
///
/// `(a, b)` becomes `(a cos - b sin, a sin + b cos)`. Angles and products are computed in f64
/// (ggml builds theta by repeated f32 multiplication; the oracle uses the exact value).
///
/// # Panics
/// If `x.len() != n_heads * head_dim`, `n_rot > head_dim` or `n_rot` is odd (programmer errors:
/// these come from the model config the caller validated).
#[allow(clippy::too_many_arguments)]
pub fn rope(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    pos: usize,
    freq_base: f32,
    freq_scale: f32,
    neox: bool,
) {
    rope_ext(
        x, n_heads, head_dim, n_rot, pos, freq_base, freq_scale, None, neox,
    )
}

/// [`rope`] with per-pair frequency factors (`[n_rot / 2]`, Llama 3's `rope_freqs.weight`):
/// pair `i`'s angle is divided by `factors[i]`, `theta_i = pos * freq_scale * freq_base^(-2i /
/// n_rot) / factors[i]`, as ggml's `ggml_rope_cache_init` (ggml/src/ggml-cpu/ops.cpp) passes
/// `theta / ff` to `rope_yarn`.
///
/// # Panics
/// As [`rope`], and if `factors` is not `n_rot / 2` long.
#[allow(clippy::too_many_arguments)]
pub fn rope_ext(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    pos: usize,
    freq_base: f32,
    freq_scale: f32,
    factors: Option<&[f32]>,
    neox: bool,
) {
    rope_scaled(
        x, n_heads, head_dim, n_rot, pos, freq_base, freq_scale, factors, 1.0, neox,
    )
}

/// [`rope_ext`] whose rotated values are multiplied by `mscale` (ggml's `rope_yarn` multiplies
/// cos and sin by it: phi3's LongRoPE attention factor, `rope.scaling.attn_factor`, with
/// YaRN's extrapolation off). Dims past `n_rot` keep their scale.
///
/// # Panics
/// As [`rope_ext`].
#[allow(clippy::too_many_arguments)]
pub fn rope_scaled(
    x: &mut [f32],
    n_heads: usize,
    head_dim: usize,
    n_rot: usize,
    pos: usize,
    freq_base: f32,
    freq_scale: f32,
    factors: Option<&[f32]>,
    mscale: f32,
    neox: bool,
) {
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
