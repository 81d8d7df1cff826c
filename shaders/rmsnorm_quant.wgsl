// RMS normalization fused with the 8-bit quantization of its output: `out` gets exactly what
// rmsnorm.wgsl writes (the same sum, scale and products), and qx / qd exactly what
// quantize_act.wgsl would make of `out` (the same `quantize_store`), so the matmuls that read
// the normalised vector skip their own pass over it. Rows of n values, n a multiple of 32.
// Composed after a reduce/*.wgsl fragment (override WG, fn wg_sum) and quantize_chunk.wgsl.
// One workgroup per row; 2-D dispatch as in matrix/reduce.wgsl.

struct RmsNormParams {
    // row length (a multiple of 32)
    n: u32,
    n_rows: u32,
    eps: f32,
    // workgroups along x in the dispatch
    groups_x: u32,
}

// [n_rows, n]
@group(0) @binding(0) var<storage, read> x: array<f32>;
// [n]
@group(0) @binding(1) var<storage, read> weight: array<f32>;
// [n_rows, n]
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<uniform> P: RmsNormParams;
// [n_rows, n / 4] words of four int8 codes (quantize_act.wgsl's layout)
@group(0) @binding(4) var<storage, read_write> qx: array<u32>;
// [n_rows, n / 32] chunk scales and sums
@group(0) @binding(5) var<storage, read_write> qd: array<vec4<f32>>;

// out[base + i] = x[base + i] * scale * weight[i] (rmsnorm.wgsl's product), also returned.
fn norm1(base: u32, i: u32, scale: f32) -> f32 {
    let y = x[base + i] * scale * weight[i];
    out[base + i] = y;
    return y;
}

fn norm4(base: u32, i: u32, scale: f32) -> vec4<f32> {
    return vec4<f32>(
        norm1(base, i, scale),
        norm1(base, i + 1u, scale),
        norm1(base, i + 2u, scale),
        norm1(base, i + 3u, scale),
    );
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * P.groups_x;
    // Uniform over the workgroup, so no invocation is left waiting in wg_sum.
    if (row >= P.n_rows) {
        return;
    }
    let base = row * P.n;
    var ss = 0.0;
    for (var i = lid; i < P.n; i += WG) {
        let v = x[base + i];
        ss += v * v;
    }
    let total = wg_sum(ss, lid);
    let scale = 1.0 / sqrt(total / f32(P.n) + P.eps);
    // Each invocation normalises and quantizes whole chunks of 32, in eight vec4 (no local
    // array: see quantize_store8).
    let nc = P.n / 32u;
    for (var c = lid; c < nc; c += WG) {
        let i = c * 32u;
        quantize_store8(
            row * nc + c,
            norm4(base, i, scale),
            norm4(base, i + 4u, scale),
            norm4(base, i + 8u, scale),
            norm4(base, i + 12u, scale),
            norm4(base, i + 16u, scale),
            norm4(base, i + 20u, scale),
            norm4(base, i + 24u, scale),
            norm4(base, i + 28u, scale),
        );
    }
}
