// Softmax over each row in place (twin of kernels-ref's ops::softmax): exp(x - max) / sum;
// a row that is all -inf (fully masked) becomes all 0. Composed after a reduce/*.wgsl fragment
// (override WG, MAX_WG, fn wg_sum, fn wg_max). One workgroup per row; 2-D dispatch as in
// matrix/reduce.wgsl.

struct RowParams {
    // row length
    n: u32,
    n_rows: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    pad0: u32,
}

// [n_rows, n]
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
@group(0) @binding(1) var<uniform> P: RowParams;

// Largest finite f32: stands in for -inf, which WGSL cannot write as a literal.
const F32_MAX: f32 = 3.40282347e38;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * P.groups_x;
    // Uniform over the workgroup, so no invocation is left waiting at a barrier.
    if (row >= P.n_rows) {
        return;
    }
    let base = row * P.n;
    var m = -F32_MAX;
    for (var i = lid; i < P.n; i += WG) {
        m = max(m, x[base + i]);
    }
    let row_max = wg_max(m, lid);
    var s = 0.0;
    for (var i = lid; i < P.n; i += WG) {
        s += exp(x[base + i] - row_max);
    }
    let total = wg_sum(s, lid);
    // Every entry is -inf (or below -F32_MAX): nothing to attend to, as in the oracle.
    let masked = row_max <= -F32_MAX;
    for (var i = lid; i < P.n; i += WG) {
        if (masked) {
            x[base + i] = 0.0;
        } else {
            x[base + i] = exp(x[base + i] - row_max) / total;
        }
    }
}
