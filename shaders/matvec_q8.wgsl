// Batched decode matvec over 8-bit activations: y[t] = W x[t] with x[t] given as int8 chunks
// (shaders/quantize_act.wgsl), each chunk's dot product in integers as on the CPU
// (src/cpu/scalar.rs `dot_q_row`):
//   dw * d_x * f32(mul0 * s0 + mul1 * s1) + c0 * xs0 + c1 * xs1,   s_h = Σ_{half h} u * q (i32)
// accumulated over chunks in f32.
// Composed after a reduce/*.wgsl fragment (override WG, fn wg_sum), quant/chunk.wgsl (struct
// QChunk, fn dot_i8x4), a quant/*.wgsl fragment with an integer path (bindings 0..1 for W,
// fn dq_chunk) and q8_params.wgsl (MatvecQ8Params P, the qx / qd bindings, fn
// strided_partial), and before a matvec_q8_out/*.wgsl fragment: see src/gpu/registry/mod.rs.
// One workgroup computes ROWS consecutive rows for one token; its WG invocations stride over a
// row's chunks and the partial sums are added with wg_sum. Dispatch is 2-D when the number of
// workgroups exceeds the per-dimension limit: group = wid.x + wid.y * groups_x, and
// group = t * row_groups + row group (the contract of the f32 batched matvec).

// Rows per workgroup.
override ROWS: u32 = 2u;

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
            acc = strided_partial(row, c0, lid, WG);
        }
        let total = wg_sum(acc, lid);
        if (lid == 0u && row < P.rows) {
            store_y(t, row, total);
        }
    }
}
