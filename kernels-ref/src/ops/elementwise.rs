//! Element-wise ops: SiLU, SwiGLU, tanh GELU, GeGLU, soft-capping, residual add.

/// `x * sigmoid(x)`, evaluated in f64.
pub fn silu(x: f32) -> f32 {
    let x = f64::from(x);
    (x / (1.0 + (-x).exp())) as f32
}

/// `out = silu(gate) * up`, element-wise; all three `[n]`.
///
/// # Panics
/// If the lengths differ (programmer error).
pub fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "swiglu: lengths differ (gate {}, up {}, out {})",
        gate.len(),
        up.len(),
        out.len()
    );
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        let g = f64::from(g);
        *o = (g / (1.0 + (-g).exp()) * f64::from(u)) as f32;
    }
}

/// GELU in its tanh form, `0.5 x (1 + tanh(z))` with `z = sqrt(2/pi) (x + 0.044715 x^3)`:
/// ggml's `ggml_gelu_f32` (ggml/src/ggml-cpu/vec.h, constants `GELU_COEF_A` and
/// `SQRT_2_OVER_PI`). Evaluated in f64 as `x / (1 + e^(-2z))`, the same function: `1 +
/// tanh(z)` would cancel to 0 for z below about -19 and lose the tail.
pub fn gelu_tanh(x: f32) -> f32 {
    let x = f64::from(x);
    let z = (2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x);
    (x / (1.0 + (-2.0 * z).exp())) as f32
}

/// `out = gelu_tanh(gate) * up`, element-wise; all three `[n]`.
///
/// # Panics
/// If the lengths differ (programmer error).
pub fn geglu(gate: &[f32], up: &[f32], out: &mut [f32]) {
    assert!(
        gate.len() == up.len() && up.len() == out.len(),
        "geglu: lengths differ (gate {}, up {}, out {})",
        gate.len(),
        up.len(),
        out.len()
    );
    for ((o, &g), &u) in out.iter_mut().zip(gate).zip(up) {
        *o = (f64::from(gelu_tanh(g)) * f64::from(u)) as f32;
    }
}

/// `x = cap * tanh(x / cap)` in place, in f64 (final-logit soft-capping, as llama.cpp's
/// gemma graphs build it from `ggml_scale`, `ggml_tanh`, `ggml_scale`).
pub fn softcap(x: &mut [f32], cap: f32) {
    let c = f64::from(cap);
    for v in x {
        *v = (c * (f64::from(*v) / c).tanh()) as f32;
    }
}

/// `out = a + s * b`, element-wise; all three `[n]` (granite's residual branches, scaled by
/// `residual_scale` before their add). `s * b` is rounded to f32 before the add, as ggml's
/// `ggml_scale` then `ggml_add` do.
///
/// # Panics
/// If the lengths differ (programmer error).
pub fn add_scaled(a: &[f32], b: &[f32], s: f32, out: &mut [f32]) {
    assert!(
        a.len() == b.len() && b.len() == out.len(),
        "add_scaled: lengths differ (a {}, b {}, out {})",
        a.len(),
        b.len(),
        out.len()
    );
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        let sy = s * y;
        *o = x + sy;
    }
}

/// `x *= s` in place, each product rounded to f32 (granite's logits, scaled by 1 / its logit
/// scale).
pub fn scale(x: &mut [f32], s: f32) {
    for v in x {
        *v *= s;
    }
}

/// `out = a + b`, element-wise; all three `[n]`.
///
/// # Panics
/// If the lengths differ (programmer error).
pub fn add(a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(
        a.len() == b.len() && b.len() == out.len(),
        "add: lengths differ (a {}, b {}, out {})",
        a.len(),
        b.len(),
        out.len()
    );
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = x + y;
    }
}
