// Mixture-of-experts routing (twin of kernels-ref's ops::route_experts): for each token, the
// softmax of its router logits, its K most probable experts (descending; ties to the lower
// index; NaN logits last) and their probabilities, divided by their sum (clamped below at
// 2^-14, the smallest normal f16) when P.normalize is set. Standalone module.
// One invocation per token; 2-D dispatch as in matrix/reduce.wgsl. The experts are picked by K
// passes over the logits, each taking the best one ordered after the previous pick, so no
// per-invocation array is needed (llvmpipe spills dynamically indexed private arrays).

override WG: u32 = 64u;

struct MoeRouteParams {
    n_tokens: u32,
    n_expert: u32,
    // experts used per token (K)
    k: u32,
    // 1: divide the kept probabilities by their sum
    normalize: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

// [n_tokens, n_expert] router logits
@group(0) @binding(0) var<storage, read> logits: array<f32>;
// [n_tokens, k] expert ids, most probable first
@group(0) @binding(1) var<storage, read_write> ids: array<u32>;
// [n_tokens, k] their weights
@group(0) @binding(2) var<storage, read_write> weights: array<f32>;
@group(0) @binding(3) var<uniform> P: MoeRouteParams;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

// Whether expert (v, e) comes before (bv, be) in the routing order: a number before NaN, a
// larger logit first, equal ones by the lower index.
fn before(v: f32, e: u32, bv: f32, be: u32) -> bool {
    let n = is_nan(v);
    let bn = is_nan(bv);
    if (n != bn) {
        return bn;
    }
    if (!n && v != bv) {
        return v > bv;
    }
    return e < be;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = (wid.x + wid.y * P.groups_x) * WG + lid;
    if (t >= P.n_tokens) {
        return;
    }
    let l0 = t * P.n_expert;
    // The softmax's shift: the largest logit that is a number.
    var m = -3.4028234663852886e38;
    for (var e = 0u; e < P.n_expert; e++) {
        let v = logits[l0 + e];
        if (!is_nan(v)) {
            m = max(m, v);
        }
    }
    var z = 0.0;
    for (var e = 0u; e < P.n_expert; e++) {
        z += exp(logits[l0 + e] - m);
    }
    // K passes: the best expert ordered after the previous pass's pick.
    var prev_v = 0.0;
    var prev_e = 0xffffffffu;
    var kept = 0.0;
    for (var j = 0u; j < P.k; j++) {
        var best_v = 0.0;
        var best_e = 0xffffffffu;
        for (var e = 0u; e < P.n_expert; e++) {
            let v = logits[l0 + e];
            let after_prev = prev_e == 0xffffffffu || before(prev_v, prev_e, v, e);
            if (after_prev && (best_e == 0xffffffffu || before(v, e, best_v, best_e))) {
                best_v = v;
                best_e = e;
            }
        }
        let p = exp(best_v - m) / z;
        ids[t * P.k + j] = best_e;
        weights[t * P.k + j] = p;
        kept += p;
        prev_v = best_v;
        prev_e = best_e;
    }
    if (P.normalize == 1u) {
        let div = max(kept, 6.103515625e-5);
        for (var j = 0u; j < P.k; j++) {
            weights[t * P.k + j] = weights[t * P.k + j] / div;
        }
    }
}
