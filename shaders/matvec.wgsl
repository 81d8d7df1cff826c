// Decode matvec y = W x (twin of kernels-ref's ops::matvec).
// Composed after a reduce/*.wgsl fragment (override WG, fn wg_sum), a quant/*.wgsl fragment
// (bindings 0..1 for W, const QK, fn dq_block), matvec_params.wgsl (MatvecParams P, x, y)
// and load_x4.wgsl: see src/gpu/registry/mod.rs.
// One workgroup computes ROWS consecutive rows for one token; its WG invocations stride over a
// row's blocks and the partial dot products are summed with wg_sum. Dispatch is 2-D when the
// number of workgroups exceeds the per-dimension limit: group = wid.x + wid.y * groups_x, and
// group = t * row_groups + row group. Several tokens make a batched matvec (small batches, where
// re-reading the weights per token is cheaper than a tiled matmul's staging).

// Rows per workgroup.
override ROWS: u32 = 2u;

// This invocation's share of row `row`'s dot product with token row x[xo..xo + cols].
fn row_partial(row: u32, xo: u32, lid: u32) -> f32 {
    var acc = 0.0;
    for (var b = lid; b < P.blocks_per_row; b += WG) {
        var w = dq_block(row, b, P.cols);
        let c0 = b * QK;
        for (var k = 0u; k < 8u; k++) {
            acc += dot(w[k], load_x4(xo, c0 + 4u * k));
        }
    }
    return acc;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let t = group / P.row_groups;
    // Surplus workgroups of a 2-D dispatch: the whole workgroup leaves together.
    if (t >= P.n_tokens) {
        return;
    }
    let row0 = (group % P.row_groups) * ROWS;
    let xo = t * P.cols;
    let yo = t * P.y_stride + P.row_offset;
    for (var r = 0u; r < ROWS; r++) {
        // `row` is uniform over the workgroup, so every invocation reaches wg_sum.
        let row = row0 + r;
        var acc = 0.0;
        if (row < P.rows) {
            acc = row_partial(row, xo, lid);
        }
        let total = wg_sum(acc, lid);
        if (lid == 0u && row < P.rows) {
            y[yo + row] = total;
        }
    }
}
