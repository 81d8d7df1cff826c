//! Numerically stable softmax (twin of `shaders/softmax.wgsl`).

/// Softmax of `x` in place: `exp(x - max) / sum`, with the sum in f64.
///
/// An empty slice is left alone. Entries equal to `-inf` (masked) get 0; if every entry is
/// `-inf` the result is all 0 rather than NaN, since nothing can be attended to.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    if x.is_empty() || max == f32::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    let max = f64::from(max);
    let exps: Vec<f64> = x.iter().map(|&v| (f64::from(v) - max).exp()).collect();
    let sum: f64 = exps.iter().sum();
    for (o, e) in x.iter_mut().zip(&exps) {
        *o = (e / sum) as f32;
    }
}

/// f64 softmax used inside attention, same rules as [`softmax`].
pub(super) fn softmax_f64(x: &mut [f64]) {
    let max = x.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if x.is_empty() || max == f64::NEG_INFINITY {
        x.fill(0.0);
        return;
    }
    for v in x.iter_mut() {
        *v = (*v - max).exp();
    }
    let sum: f64 = x.iter().sum();
    for v in x.iter_mut() {
        *v /= sum;
    }
}
