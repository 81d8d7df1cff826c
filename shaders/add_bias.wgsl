// Bias add in place: x[r][c] += b[c] for every row r (the QKV biases of qwen2-style models).
// Standalone module. One invocation per element; 2-D dispatch as in matrix/reduce.wgsl.

override WG: u32 = 64u;

struct BiasParams {
    // elements of x: n_rows * width
    n: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // row length (the bias length)
    width: u32,
    pad0: u32,
}

// [n_rows, width]
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
// [width]
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<uniform> P: BiasParams;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * P.groups_x) * WG + lid;
    if (i >= P.n) {
        return;
    }
    x[i] = x[i] + b[i % P.width];
}
