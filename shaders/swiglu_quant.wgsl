// SwiGLU or GeGLU in place fused with the 8-bit quantization of its result: gate =
// act(gate) * up as swiglu.wgsl computes it, and qx / qd exactly what quantize_act.wgsl would make of the new
// gate (the same `quantize_store`), so the down projection skips its own pass over it.
// n (the element count) is a multiple of 32. Composed after quantize_chunk.wgsl (no
// reduction): one invocation per chunk of 32; 2-D dispatch as in matrix/reduce.wgsl.

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
// [n / 4] words of four int8 codes (quantize_act.wgsl's layout)
@group(0) @binding(3) var<storage, read_write> qx: array<u32>;
// [n / 32] chunk scales and sums
@group(0) @binding(4) var<storage, read_write> qd: array<vec4<f32>>;


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

// gate[i] = act(gate[i]) * up[i], also returned.
fn swiglu1(i: u32) -> f32 {
    let y = act(gate[i]) * up[i];
    gate[i] = y;
    return y;
}

fn swiglu4(i: u32) -> vec4<f32> {
    return vec4<f32>(swiglu1(i), swiglu1(i + 1u), swiglu1(i + 2u), swiglu1(i + 3u));
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let c = (wid.x + wid.y * P.groups_x) * WG + lid;
    if (c >= P.n / 32u) {
        return;
    }
    // No local array (see quantize_store8): the chunk goes in eight vec4.
    let i = c * 32u;
    quantize_store8(
        c,
        swiglu4(i),
        swiglu4(i + 4u),
        swiglu4(i + 8u),
        swiglu4(i + 12u),
        swiglu4(i + 16u),
        swiglu4(i + 20u),
        swiglu4(i + 24u),
        swiglu4(i + 28u),
    );
}
