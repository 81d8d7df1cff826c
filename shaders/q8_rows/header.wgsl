// Shared head of the row-layout integer kernels for CPU-like adapters (matvec_q8_rows.wgsl,
// matmul_q8_rows.wgsl): the workgroup size, the token cap, the parameters and the activation
// bindings, so both take the same bindings and grid as src/gpu/q8act.rs plans them.
// Composed after quant/chunk.wgsl and a quant/*.wgsl fragment (bindings 0..1 for W) and
// before the kernel, which is followed by a matvec_q8_out/*.wgsl fragment (y at binding 4
// and, for split outputs, 6 and 7, and `fn store_y(t, row, v)`).

override WG: u32 = 64u;
// Tokens per launch (the host splits larger batches).
const MAX_TOKENS: u32 = 64u;

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
    // ceil(rows / (rows per workgroup)): the workgroups of the launch
    row_groups: u32,
    // first row of the weight buffers this launch reads (a row range of a fused matrix)
    w_row0: u32,
    // split outputs (matvec_q8_out/split*.wgsl): rows below split1 go to y, below split2 to
    // y1, the rest to y2 (global row = row_offset + row)
    split1: u32,
    split2: u32,
    // matvec_q8_rows: rows per invocation, ROWS for fewer than 4 tokens, else 1 (unused by
    // the matmul, which always takes 4)
    rows_per_inv: u32,
    // matmul_q8_rows*: live invocations per workgroup (a multiple of the subgroup size, at
    // most WG): the host picks it per launch so the workgroups share out evenly over
    // llvmpipe's worker threads (src/gpu/layouts.rs `RowBalance`); invocations
    // lid >= row_stride do no work. matvec_q8_rows: WG (unused)
    row_stride: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

// [n_tokens, cols / 16] vec4 of words of four int8 codes each (quantize_act.wgsl writes them
// as u32): chunk ci is qx[2 ci], qx[2 ci + 1]. Read as vec4: llvmpipe loads a storage word
// lane by lane, and two vec4 loads cost less than eight u32 loads (benches/gpu_load_paths.rs).
@group(0) @binding(2) var<storage, read> qx: array<vec4<u32>>;
// [n_tokens, cols / 32]: (d, d * Σq half 0, d * Σq half 1, d * Σq)
@group(0) @binding(3) var<storage, read> qd: array<vec4<f32>>;
@group(0) @binding(5) var<uniform> P: MatvecQ8Params;
