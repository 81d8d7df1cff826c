// The mixture's output: out[t] = sum_j weights[t, j] * y[t * k + j] over a token's K routed
// experts' outputs, plus sigmoid(gate[t]) * shared[t] when P.has_shared is 1 (qwen2moe's shared
// expert and its gate logit), or shared[t] when it is 2 (granitemoe's ungated shared expert).
// Standalone module. One invocation per output element; 2-D
// dispatch as in matrix/reduce.wgsl.

override WG: u32 = 64u;

struct MoeCombineParams {
    n_tokens: u32,
    // row length (n_embd)
    n: u32,
    // experts per token (K)
    k: u32,
    // 0: no shared expert; 1: add its gated output; 2: add its output
    has_shared: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

// [n_tokens * k, n] the routed experts' outputs, a token's K rows together
@group(0) @binding(0) var<storage, read> y: array<f32>;
// [n_tokens, k] the routing weights
@group(0) @binding(1) var<storage, read> weights: array<f32>;
// [n_tokens, n] the shared expert's output (any buffer when P.has_shared is 0)
@group(0) @binding(2) var<storage, read> shared_y: array<f32>;
// [n_tokens] the shared expert's gate logits (any buffer when P.has_shared is not 1)
@group(0) @binding(3) var<storage, read> shared_gate: array<f32>;
// [n_tokens, n]
@group(0) @binding(4) var<storage, read_write> out: array<f32>;
@group(0) @binding(5) var<uniform> P: MoeCombineParams;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * P.groups_x) * WG + lid;
    if (i >= P.n_tokens * P.n) {
        return;
    }
    let t = i / P.n;
    let c = i % P.n;
    var acc = 0.0;
    for (var j = 0u; j < P.k; j++) {
        let pair = t * P.k + j;
        acc += weights[pair] * y[pair * P.n + c];
    }
    if (P.has_shared == 1u) {
        let s = 1.0 / (1.0 + exp(-shared_gate[t]));
        acc += s * shared_y[i];
    } else if (P.has_shared == 2u) {
        acc += shared_y[i];
    }
    out[i] = acc;
}
