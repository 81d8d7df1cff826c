// Decode matvec y = W x (twin of kernels-ref's ops::matvec).
// Composed after a reduce/*.wgsl fragment (override WG, fn wg_sum) and a quant/*.wgsl fragment
// (bindings 0..1 for W, const QK, fn dq_block): see src/gpu/shaders.rs.
// One workgroup computes ROWS consecutive rows; its WG invocations stride over a row's blocks
// and the partial dot products are summed with wg_sum. Dispatch is 2-D when the number of
// workgroups exceeds the per-dimension limit: group = wid.x + wid.y * groups_x.

struct MatvecParams {
    rows: u32,
    cols: u32,
    // ceil(cols / QK)
    blocks_per_row: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
}

// [cols]
@group(0) @binding(2) var<storage, read> x: array<f32>;
// [rows]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> P: MatvecParams;

// Rows per workgroup.
override ROWS: u32 = 2u;

// x[c..c + 4], with columns >= cols read as 0 (a partial last block of an F16/F32 row).
fn load_x4(c: u32) -> vec4<f32> {
    if (c + 3u < P.cols) {
        return vec4<f32>(x[c], x[c + 1u], x[c + 2u], x[c + 3u]);
    }
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if (c + j < P.cols) {
            v[j] = x[c + j];
        }
    }
    return v;
}

// This invocation's share of row `row`'s dot product.
fn row_partial(row: u32, lid: u32) -> f32 {
    var acc = 0.0;
    for (var b = lid; b < P.blocks_per_row; b += WG) {
        var w = dq_block(row, b, P.cols);
        let c0 = b * QK;
        for (var k = 0u; k < 8u; k++) {
            acc += dot(w[k], load_x4(c0 + 4u * k));
        }
    }
    return acc;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row0 = (wid.x + wid.y * P.groups_x) * ROWS;
    for (var r = 0u; r < ROWS; r++) {
        // `row` is uniform over the workgroup, so every invocation reaches wg_sum.
        let row = row0 + r;
        var acc = 0.0;
        if (row < P.rows) {
            acc = row_partial(row, lid);
        }
        let total = wg_sum(acc, lid);
        if (lid == 0u && row < P.rows) {
            y[row] = total;
        }
    }
}
