// Decode matvec y = W x, one invocation per output row (twin of kernels-ref's ops::matvec).
// Composed after a quant/*.wgsl fragment (bindings 0..1 for W, const QK, fn dq_block).
// The variant for CPU-like adapters (lavapipe, llvmpipe, SwiftShader) and any device where
// workgroup barriers are expensive: no reduction, no barrier, each invocation walks its row's
// blocks in order, so a row's weights stream contiguously through one core's cache. Same
// contract as matvec.wgsl: group = wid.x + wid.y * groups_x; t = group / row_groups; rows
// outside row_offset..row_offset + rows of y untouched.

override WG: u32 = 64u;

struct MatvecParams {
    rows: u32,
    cols: u32,
    // ceil(cols / QK)
    blocks_per_row: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    n_tokens: u32,
    // row length of y (>= row_offset + rows)
    y_stride: u32,
    // first row of y this matrix writes (a matrix split by rows across bindings)
    row_offset: u32,
    // ceil(rows / WG)
    row_groups: u32,
}

// [n_tokens, cols]
@group(0) @binding(2) var<storage, read> x: array<f32>;
// [n_tokens, y_stride]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> P: MatvecParams;

// x[xo + c..xo + c + 4], with columns >= cols read as 0 (a partial last block of an F16/F32
// row).
fn load_x4(xo: u32, c: u32) -> vec4<f32> {
    if (c + 3u < P.cols) {
        return vec4<f32>(x[xo + c], x[xo + c + 1u], x[xo + c + 2u], x[xo + c + 3u]);
    }
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if (c + j < P.cols) {
            v[j] = x[xo + c + j];
        }
    }
    return v;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let t = group / P.row_groups;
    let row = (group % P.row_groups) * WG + lid;
    if (t >= P.n_tokens || row >= P.rows) {
        return;
    }
    let xo = t * P.cols;
    var acc = 0.0;
    for (var b = 0u; b < P.blocks_per_row; b++) {
        let w = dq_block(row, b, P.cols);
        let c0 = b * QK;
        for (var k = 0u; k < 8u; k++) {
            acc += dot(w[k], load_x4(xo, c0 + 4u * k));
        }
    }
    y[t * P.y_stride + P.row_offset + row] = acc;
}
