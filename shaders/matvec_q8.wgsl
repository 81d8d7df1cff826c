// Batched decode matvec over 8-bit activations: y[t] = W x[t] with x[t] given as int8 chunks
// (shaders/quantize_act.wgsl), each chunk's dot product in integers as on the CPU
// (src/cpu/scalar.rs `dot_q_row`):
//   dw * d_x * f32(mul0 * s0 + mul1 * s1) + c0 * xs0 + c1 * xs1,   s_h = Σ_{half h} u * q (i32)
// accumulated over chunks in f32.
// Composed after a reduce/*.wgsl fragment (override WG, fn wg_sum), quant/chunk.wgsl (struct
// QChunk, fn dot_i8x4) and a quant/*.wgsl fragment with an integer path (bindings 0..1 for W,
// fn dq_chunk): see src/gpu/shaders.rs.
// One workgroup computes ROWS consecutive rows for one token; its WG invocations stride over a
// row's chunks and the partial sums are added with wg_sum. Dispatch is 2-D when the number of
// workgroups exceeds the per-dimension limit: group = wid.x + wid.y * groups_x, and
// group = t * row_groups + row group (the contract of the f32 batched matvec).

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
    // ceil(rows / ROWS)
    row_groups: u32,
    // first row of the weight buffers this launch reads (a row range of a fused matrix)
    w_row0: u32,
    // split outputs (matvec_q8_out/split*.wgsl): rows below split1 go to y, below split2 to
    // y1, the rest to y2 (global row = row_offset + row)
    split1: u32,
    split2: u32,
    pad0: u32,
    // row_stride of the row layouts (q8_rows/header.wgsl), unused here
    pad1: u32,
    pad2: u32,
    pad3: u32,
    pad4: u32,
}

// [n_tokens, cols / 4] words: four int8 codes each (quantize_act.wgsl)
@group(0) @binding(2) var<storage, read> qx: array<u32>;
// [n_tokens, cols / 32]: (d, d * Σq half 0, d * Σq half 1, d * Σq)
@group(0) @binding(3) var<storage, read> qd: array<vec4<f32>>;
// y (binding 4 and, for split outputs, 6 and 7) and `fn store_y(t, row, v)` come from a
// matvec_q8_out/*.wgsl fragment: plain store, accumulate or split by rows.
@group(0) @binding(5) var<uniform> P: MatvecQ8Params;

// Rows per workgroup.
override ROWS: u32 = 2u;

// This invocation's share of row `row`'s dot product with token t's chunks, which start at
// chunk index c0 of qx / qd.
fn row_partial(row: u32, c0: u32, lid: u32) -> f32 {
    var acc = 0.0;
    for (var b = lid; b < P.blocks_per_row; b += WG) {
        let ch = dq_chunk(P.w_row0 + row, b, P.cols);
        let ci = c0 + b;
        var s0 = 0;
        var s1 = 0;
        for (var k = 0u; k < 4u; k++) {
            s0 += dot_i8x4(ch.u[k], qx[ci * 8u + k]);
            s1 += dot_i8x4(ch.u[k + 4u], qx[ci * 8u + 4u + k]);
        }
        let xd = qd[ci];
        // The CPU's order: (dw * d_x) * isum, then + c0 * xs0, then + c1 * xs1.
        acc += ch.dw * xd.x * f32(ch.mul.x * s0 + ch.mul.y * s1) + ch.c.x * xd.y + ch.c.y * xd.z;
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
    let c0 = t * P.blocks_per_row;
    for (var r = 0u; r < ROWS; r++) {
        // `row` is uniform over the workgroup, so every invocation reaches wg_sum.
        let row = row0 + r;
        var acc = 0.0;
        if (row < P.rows) {
            acc = row_partial(row, c0, lid);
        }
        let total = wg_sum(acc, lid);
        if (lid == 0u && row < P.rows) {
            store_y(t, row, total);
        }
    }
}
