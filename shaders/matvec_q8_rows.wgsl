// Batched decode matvec over 8-bit activations, one invocation per output row: the
// barrier-free twin of matvec_q8.wgsl for CPU-like adapters (see matvec_rows.wgsl), with the
// same integer chunk arithmetic and operation order as the CPU (src/cpu/scalar.rs `dot_q_row`).
// Composed after quant/chunk.wgsl and a quant/*.wgsl fragment with an integer path.
// group = wid.x + wid.y * groups_x; t = group / row_groups; row = (group % row_groups) * WG +
// lid; rows outside row_offset..row_offset + rows of y untouched.

override WG: u32 = 64u;

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
    // ceil(rows / WG)
    row_groups: u32,
}

// [n_tokens, cols / 4] words: four int8 codes each (quantize_act.wgsl)
@group(0) @binding(2) var<storage, read> qx: array<u32>;
// [n_tokens, cols / 32]: (d, d * Σq half 0, d * Σq half 1, d * Σq)
@group(0) @binding(3) var<storage, read> qd: array<vec4<f32>>;
// [n_tokens, y_stride]
@group(0) @binding(4) var<storage, read_write> y: array<f32>;
@group(0) @binding(5) var<uniform> P: MatvecQ8Params;

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
    let c0 = t * P.blocks_per_row;
    var acc = 0.0;
    for (var b = 0u; b < P.blocks_per_row; b++) {
        let ch = dq_chunk(row, b, P.cols);
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
    y[t * P.y_stride + P.row_offset + row] = acc;
}
