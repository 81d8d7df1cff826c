// The 8-bit-activation matrix body: what every layout of a product y[t] = W x[t] with x[t]
// given as int8 chunks (shaders/quantize_act.wgsl) computes per (token, row), each chunk's dot
// product in integers as on the CPU (src/cpu/scalar.rs `dot_q_row`):
//   dw * d_x * f32(mul0 * s0 + mul1 * s1) + c0 * xs0 + c1 * xs1,   s_h = Σ_{half h} u * q (i32)
// accumulated over a row's chunks in f32, in chunk order wherever one invocation sums a row.
// Composed after quant/chunk.wgsl, a quant/*.wgsl fragment with an integer path (bindings
// 0..1 for W, fn dq_chunk) and q8_act.wgsl (the qx / qd bindings, chunk_dot, tok4), and before
// a layout (reduce.wgsl, lanes.wgsl or tiles_q8.wgsl) and an out/*.wgsl fragment (y at binding
// 4 and, for split outputs, 6 and 7, and `fn store_y(t, row, v)`): see
// src/gpu/registry/mod.rs. The parameters are src/gpu/kernels/q8act.rs's plan.

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
    // ceil(rows / (rows per workgroup)): the workgroups per token (reduce.wgsl, lanes.wgsl)
    // or of the launch (tiles_q8.wgsl)
    row_groups: u32,
    // first row of the weight buffers this launch reads (a row range of a fused matrix)
    w_row0: u32,
    // split outputs (out/split*.wgsl): rows below split1 go to y, below split2 to y1, the
    // rest to y2 (global row = row_offset + row)
    split1: u32,
    split2: u32,
    // tiles_q8.wgsl: live invocations per workgroup S (a multiple of the subgroup size, at
    // most WG): the host picks it per launch so the workgroups share out evenly over
    // llvmpipe's worker threads (src/gpu/health/layouts.rs `RowBalance`); invocations
    // lid >= S do no work. Unused by the other layouts.
    row_stride: u32,
    // tiles_q8.wgsl: rows between an invocation's 4 rows (S strided, 1 in runs of 4) and
    // between consecutive invocations' first rows (1 strided, 4 in runs of 4)
    row_step: u32,
    inv_step: u32,
    pad0: u32,
    pad1: u32,
}

@group(0) @binding(5) var<uniform> P: MatvecQ8Params;

// One reducer's share of row `row`'s dot product with token t: chunks first, first + step,
// ... (an invocation of a workgroup, or a lane of a subgroup, striding over the row).
fn row_partial(t: u32, row: u32, first: u32, step: u32) -> f32 {
    let c0 = t * P.blocks_per_row;
    var acc = 0.0;
    for (var b = first; b < P.blocks_per_row; b += step) {
        acc += chunk_dot(dq_chunk(P.w_row0 + row, b, P.cols), c0 + b);
    }
    return acc;
}
