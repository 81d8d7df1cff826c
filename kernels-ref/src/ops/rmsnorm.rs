//! RMS normalization (twin of `shaders/rmsnorm.wgsl`).

/// `out[i] = x[i] / sqrt(mean(x_row^2) + eps) * weight[i % n]` for each row of
/// `n = weight.len()` elements.
///
/// `x`, `out`: `[n_rows, weight.len()]`. The mean of squares is accumulated in f64 and the
/// whole expression evaluated in f64, rounded once.
///
/// # Panics
/// If `x.len() != out.len()` or `x.len()` is not a multiple of `weight.len()` (a programmer
/// error: the caller sized these buffers).
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    assert_eq!(x.len(), out.len(), "rms_norm: x and out lengths differ");
    let n = weight.len();
    if n == 0 {
        assert!(x.is_empty(), "rms_norm: empty weight with non-empty x");
        return;
    }
    assert!(
        x.len().is_multiple_of(n),
        "rms_norm: x length {} is not a multiple of the row length {n}",
        x.len()
    );
    for (xr, or) in x.chunks_exact(n).zip(out.chunks_exact_mut(n)) {
        let sum_sq: f64 = xr.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
        let mean = sum_sq / n as f64;
        let scale = 1.0 / (mean + f64::from(eps)).sqrt();
        for ((o, &v), &w) in or.iter_mut().zip(xr).zip(weight) {
            *o = (f64::from(v) * scale * f64::from(w)) as f32;
        }
    }
}
