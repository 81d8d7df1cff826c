// The parameters of the integer (8-bit activation) matrix kernels over one weight matrix:
// matvec_q8.wgsl, matvec_q8_sg.wgsl and the row layouts (q8_rows/header.wgsl,
// matvec_q8_rows.wgsl, matmul_q8_rows*.wgsl), so they take the same parameters as
// src/gpu/kernels/q8act.rs plans them, and a row's strided dot product.
// Composed after q8_act.wgsl and before the kernel, which is followed by a matvec_q8_out/*.wgsl
// fragment (y at binding 4 and, for split outputs, 6 and 7, and `fn store_y(t, row, v)`).

struct MatvecQ8Params {
    rows: u32,
    cols: u32,
    // cols / 32: chunks per row
    blocks_per_row: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    n_tokens: u32,
    // row length of y (>= row_offset + rows)
    y_stride: u32,
    // first row of y this matrix writes (a matrix split by rows across bindings)
    row_offset: u32,
    // ceil(rows / (rows per workgroup)): the workgroups per token (matvec_q8*) or of the
    // launch (the row layouts)
    row_groups: u32,
    // first row of the weight buffers this launch reads (a row range of a fused matrix)
    w_row0: u32,
    // split outputs (matvec_q8_out/split*.wgsl): rows below split1 go to y, below split2 to
    // y1, the rest to y2 (global row = row_offset + row)
    split1: u32,
    split2: u32,
    // matvec_q8_rows: rows per invocation, ROWS for fewer than 4 tokens, else 1 (unused by
    // the other kernels)
    rows_per_inv: u32,
    // matmul_q8_rows*: live invocations per workgroup (a multiple of the subgroup size, at
    // most WG): the host picks it per launch so the workgroups share out evenly over
    // llvmpipe's worker threads (src/gpu/health/layouts.rs `RowBalance`); invocations
    // lid >= row_stride do no work. Unused by the other kernels.
    row_stride: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

@group(0) @binding(5) var<uniform> P: MatvecQ8Params;

// One reducer's share of row `row`'s dot product with a token's chunks, which start at chunk
// index c0 of qx / qd: chunks first, first + step, ... (an invocation of a workgroup, or a
// lane of a subgroup, striding over the row).
fn strided_partial(row: u32, c0: u32, first: u32, step: u32) -> f32 {
    var acc = 0.0;
    for (var b = first; b < P.blocks_per_row; b += step) {
        acc += chunk_dot(dq_chunk(P.w_row0 + row, b, P.cols), c0 + b);
    }
    return acc;
}
