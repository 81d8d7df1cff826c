// Prefill (many-token) integer matmul for CPU-like adapters: the twin of matvec_q8_rows.wgsl
// (same bindings, parameters, grid and per-token result, bit for bit) tuned for batches.
// Composed after quant/chunk.wgsl, a quant/*.wgsl fragment with an integer path,
// q8_params.wgsl, q8_rows/header.wgsl and q8_rows/matmul_tile.wgsl, and before a
// matvec_q8_out/*.wgsl fragment (`fn store_y`). matmul_q8_rows_sg.wgsl is the variant for adapters with subgroups.
// group = wid.x + wid.y * groups_x; each invocation lid < S = P.row_stride computes 4 weight
// rows, group * 4 * S + lid + j * S (j < 4), for tiles of 8 tokens; no workgroup memory or
// barrier. Invocations lid >= S return at once (the host picks S so that the workgroups share
// out evenly over llvmpipe's threads).
// Why a register tile: llvmpipe (lavapipe) loads a storage buffer element per SIMD lane in a
// loop with a bounds check per lane, even when every lane reads the same address (it only
// broadcasts uniform loads outside control flow), so each u32 loaded costs tens of
// instructions and the loads, not the arithmetic, bound the kernel. Per chunk of 32 columns an
// invocation here loads its 4 rows' weight chunks once and each token's 8 code words and 3
// scales once, reusing each weight load for 8 tokens and each activation load for 4 rows
// (matvec_q8_rows.wgsl: 1 row x 4 tokens), ~3x fewer loads per multiply-add.

// MatvecQ8Params P and the qx / qd bindings: q8_params.wgsl; WG and MAX_TOKENS:
// q8_rows/header.wgsl.

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let row = group * 4u * P.row_stride + lid;
    if (group >= P.row_groups || lid >= P.row_stride || row >= P.rows) {
        return;
    }
    let w = rows4(row);
    let bpr = P.blocks_per_row;
    let n = launch_tokens();
    for (var t0 = 0u; t0 < n; t0 += 8u) {
        // A last partial tile recomputes token n - 1 in its surplus slots (valid reads, the
        // results are not stored): one loop body for every tile.
        let last = n - 1u;
        let i0 = t0 * bpr;
        let i1 = min(t0 + 1u, last) * bpr;
        let i2 = min(t0 + 2u, last) * bpr;
        let i3 = min(t0 + 3u, last) * bpr;
        let i4 = min(t0 + 4u, last) * bpr;
        let i5 = min(t0 + 5u, last) * bpr;
        let i6 = min(t0 + 6u, last) * bpr;
        let i7 = min(t0 + 7u, last) * bpr;
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        var a2 = vec4<f32>(0.0);
        var a3 = vec4<f32>(0.0);
        var a4 = vec4<f32>(0.0);
        var a5 = vec4<f32>(0.0);
        var a6 = vec4<f32>(0.0);
        var a7 = vec4<f32>(0.0);
        for (var b = 0u; b < bpr; b++) {
            let c0 = dq_chunk(w.w0, b, P.cols);
            let c1 = dq_chunk(w.w1, b, P.cols);
            let c2 = dq_chunk(w.w2, b, P.cols);
            let c3 = dq_chunk(w.w3, b, P.cols);
            a0 += tok4_at(c0, c1, c2, c3, i0 + b);
            a1 += tok4_at(c0, c1, c2, c3, i1 + b);
            a2 += tok4_at(c0, c1, c2, c3, i2 + b);
            a3 += tok4_at(c0, c1, c2, c3, i3 + b);
            a4 += tok4_at(c0, c1, c2, c3, i4 + b);
            a5 += tok4_at(c0, c1, c2, c3, i5 + b);
            a6 += tok4_at(c0, c1, c2, c3, i6 + b);
            a7 += tok4_at(c0, c1, c2, c3, i7 + b);
        }
        store_tile(t0, n, row, a0, a1, a2, a3, a4, a5, a6, a7);
    }
}
