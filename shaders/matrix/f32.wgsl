// The f32-activation matrix body: what every layout of a product y[t] = W x[t] with f32
// inputs computes per (token, row), with its parameters, bindings and store (twin of
// kernels-ref's ops::matvec and ops::matmul; src/gpu/registry/params.rs `MatvecParams`).
// Composed after a quant/*.wgsl fragment (bindings 0..1 for W, const QK, fn dq_block) and
// load_x4.wgsl, and before a layout: reduce.wgsl, rows.wgsl or tiles.wgsl (see
// src/gpu/registry/mod.rs). A layout calls `row_partial` (or `dq_block` directly, as the
// staged tiles do) and `store_y`; it never touches x or y itself.

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
    // workgroups per token (reduce.wgsl, rows.wgsl: ceil(rows / rows per workgroup)), or row
    // tiles (tiles.wgsl: ceil(rows / TM))
    row_groups: u32,
}

// [n_tokens, cols]
@group(0) @binding(2) var<storage, read> x: array<f32>;
// [n_tokens, y_stride]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> P: MatvecParams;

// One reducer's share of row `row`'s dot product with token t: blocks first, first + step,
// ... (an invocation of a workgroup, a lane of a subgroup, or one invocation alone: 0, 1).
fn row_partial(t: u32, row: u32, first: u32, step: u32) -> f32 {
    let xo = t * P.cols;
    var acc = 0.0;
    for (var b = first; b < P.blocks_per_row; b += step) {
        let w = dq_block(row, b, P.cols);
        let c0 = b * QK;
        for (var k = 0u; k < 8u; k++) {
            acc += dot(w[k], load_x4(xo, c0 + 4u * k));
        }
    }
    return acc;
}

// y[t][row_offset + row] = v; rows outside row_offset..row_offset + rows of y are never
// written.
fn store_y(t: u32, row: u32, v: f32) {
    y[t * P.y_stride + P.row_offset + row] = v;
}
