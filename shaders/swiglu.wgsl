// SwiGLU or GeGLU in place: gate = act(gate) * up (twins of kernels-ref's ops::swiglu and
// ops::geglu). Standalone module. One invocation per element; 2-D dispatch as in
// matrix/reduce.wgsl.

override WG: u32 = 64u;

struct ElementwiseParams {
    n: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // 0: SiLU, 1: tanh GELU
    act: u32,
    pad1: u32,
}

// [n]
@group(0) @binding(0) var<storage, read_write> gate: array<f32>;
// [n]
@group(0) @binding(1) var<storage, read> up: array<f32>;
@group(0) @binding(2) var<uniform> P: ElementwiseParams;


// act(g): silu(g) = g * sigmoid(g), or (P.act == 1) tanh GELU 0.5 g (1 + tanh(z)) with
// z = sqrt(2/pi) (g + 0.044715 g^3), computed as g * sigmoid(2z): no tanh to overflow.
// exp(-t) overflows to +inf for t < -88: g / inf = -0, the right limit.
fn act(g: f32) -> f32 {
    var t = g;
    if (P.act == 1u) {
        t = 1.5957691216057308 * (g + 0.044715 * g * g * g);
    }
    return g / (1.0 + exp(-t));
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * P.groups_x) * WG + lid;
    if (i >= P.n) {
        return;
    }
    gate[i] = act(gate[i]) * up[i];
}
