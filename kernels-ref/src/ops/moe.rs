//! Expert routing of a mixture-of-experts block (llama.cpp's `build_moe_ffn` with a softmax
//! gate, src/llama-graph.cpp).

use super::softmax::softmax_f64;

/// One token's routing: `ids` (`[n_used]`) = its `ids.len()` most probable experts by the
/// softmax of `logits` (`[n_expert]`), most probable first (ties to the lower index), and
/// `weights` (`[n_used]`) = their probabilities, divided by their sum when `normalize` (the
/// sum clamped below at 2^-14, the smallest normal f16, as `build_moe_ffn` clamps it).
///
/// # Panics
/// If `ids` and `weights` differ in length or ask for more experts than `logits` has.
pub fn route_experts(logits: &[f32], normalize: bool, ids: &mut [u32], weights: &mut [f32]) {
    assert!(
        ids.len() == weights.len() && ids.len() <= logits.len(),
        "routing {} (weights {}) of {} experts",
        ids.len(),
        weights.len(),
        logits.len()
    );
    let mut p: Vec<f64> = logits.iter().map(|&v| f64::from(v)).collect();
    softmax_f64(&mut p);
    let mut order: Vec<usize> = (0..p.len()).collect();
    // Descending, stable (ties keep the lower index first); NaN (a broken router) last.
    let key = |e: usize| {
        if p[e].is_nan() {
            f64::NEG_INFINITY
        } else {
            p[e]
        }
    };
    order.sort_by(|&a, &b| key(b).total_cmp(&key(a)));
    let chosen = &order[..ids.len()];
    let sum: f64 = chosen.iter().map(|&e| p[e]).sum();
    let div = if normalize {
        sum.max(6.103515625e-5)
    } else {
        1.0
    };
    for ((id, w), &e) in ids.iter_mut().zip(weights.iter_mut()).zip(chosen) {
        *id = e as u32;
        *w = (p[e] / div) as f32;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_most_probable_and_normalizes() {
        let logits = [0.0f32, 2.0, -1.0, 1.0];
        let (mut ids, mut w) = ([0u32; 2], [0f32; 2]);
        route_experts(&logits, false, &mut ids, &mut w);
        assert_eq!(ids, [1, 3]);
        let z: f64 = logits.iter().map(|&v| f64::from(v).exp()).sum();
        assert!((f64::from(w[0]) - 2f64.exp() / z).abs() < 1e-7);
        assert!((f64::from(w[1]) - 1f64.exp() / z).abs() < 1e-7);
        route_experts(&logits, true, &mut ids, &mut w);
        assert!((w[0] + w[1] - 1.0).abs() < 1e-6 && w[0] > w[1]);
        // Ties go to the lower index.
        route_experts(&[1.0, 1.0, 1.0], true, &mut ids, &mut w);
        assert_eq!(ids, [0, 1]);
        assert_eq!(w, [0.5, 0.5]);
    }
}
