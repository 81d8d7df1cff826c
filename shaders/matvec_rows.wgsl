// Decode matvec y = W x, one invocation per output row (twin of kernels-ref's ops::matvec).
// Composed after a quant/*.wgsl fragment (bindings 0..1 for W, const QK, fn dq_block),
// matvec_params.wgsl (MatvecParams P, x, y) and load_x4.wgsl.
// The variant for CPU-like adapters (lavapipe, llvmpipe, SwiftShader) and any device where
// workgroup barriers are expensive: no reduction, no barrier, each invocation walks its row's
// blocks in order, so a row's weights stream contiguously through one core's cache. Same
// contract as matvec.wgsl: group = wid.x + wid.y * groups_x; t = group / row_groups; rows
// outside row_offset..row_offset + rows of y untouched.

override WG: u32 = 64u;

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
