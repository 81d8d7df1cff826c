// RMS normalization out = x / sqrt(mean(x^2) + eps) * weight, per row (twin of kernels-ref's
// ops::rms_norm). Composed after a reduce/*.wgsl fragment (override WG, fn wg_sum).
// One workgroup per row; 2-D dispatch as in matrix/reduce.wgsl.

struct RmsNormParams {
    // row length
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
    for (var i = lid; i < P.n; i += WG) {
        out[base + i] = x[base + i] * scale * weight[i];
    }
}
