//! Element-wise ops: SiLU, SwiGLU, residual add.

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
