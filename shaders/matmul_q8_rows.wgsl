// Prefill (many-token) integer matmul for CPU-like adapters: the twin of matvec_q8_rows.wgsl
// (same bindings, parameters, grid and per-token result, bit for bit) tuned for batches.
// Composed after quant/chunk.wgsl, a quant/*.wgsl fragment with an integer path and a
// matvec_q8_out/*.wgsl fragment (`fn store_y`).
// group = wid.x + wid.y * groups_x; each invocation computes 4 weight rows,
// group * 4 * WG + lid + j * WG (j < 4), for tiles of 8 tokens; no workgroup memory or barrier.
// Why a register tile: llvmpipe (lavapipe) loads a storage buffer element per SIMD lane in a
// loop with a bounds check per lane, even when every lane reads the same address (it only
// broadcasts uniform loads outside control flow), so each u32 loaded costs tens of
// instructions and the loads, not the arithmetic, bound the kernel. Per chunk of 32 columns an
// invocation here loads its 4 rows' weight chunks once and each token's 8 code words and 3
// scales once, reusing each weight load for 8 tokens and each activation load for 4 rows
// (matvec_q8_rows.wgsl: 1 row x 4 tokens), ~3x fewer loads per multiply-add.
// The accumulators are named vec4s (one per token, a component per row), never an array
// indexed at run time (llvmpipe keeps those in scratch memory).

// WG, MAX_TOKENS, MatvecQ8Params P and the qx / qd bindings: q8_rows/header.wgsl.

// Chunk `ch` dotted with one token's chunk (codes x0..x7, scales xd = (d, d Σq half 0,
// d Σq half 1)): matvec_q8_rows.wgsl's `chunk_dot` (exact i32 half sums, then the same f32
// operations in the same order), so results match it bit for bit.
fn xdot(
    ch: QChunk,
    x0: vec4<i32>, x1: vec4<i32>, x2: vec4<i32>, x3: vec4<i32>,
    x4: vec4<i32>, x5: vec4<i32>, x6: vec4<i32>, x7: vec4<i32>,
    xd: vec3<f32>,
) -> f32 {
    let s0 = dot(i8x4(ch.u[0]), x0) + dot(i8x4(ch.u[1]), x1) + dot(i8x4(ch.u[2]), x2)
        + dot(i8x4(ch.u[3]), x3);
    let s1 = dot(i8x4(ch.u[4]), x4) + dot(i8x4(ch.u[5]), x5) + dot(i8x4(ch.u[6]), x6)
        + dot(i8x4(ch.u[7]), x7);
    return ch.dw * xd.x * f32(ch.mul.x * s0 + ch.mul.y * s1) + ch.c.x * xd.y + ch.c.y * xd.z;
}

// The four rows' chunks dotted with chunk ci = t * blocks_per_row + b of qx / qd: each
// activation word is loaded and sign-extended once for the four rows.
fn tok4(c0: QChunk, c1: QChunk, c2: QChunk, c3: QChunk, ci: u32) -> vec4<f32> {
    let qa = qx[ci * 2u];
    let qb = qx[ci * 2u + 1u];
    let x0 = i8x4(qa.x);
    let x1 = i8x4(qa.y);
    let x2 = i8x4(qa.z);
    let x3 = i8x4(qa.w);
    let x4 = i8x4(qb.x);
    let x5 = i8x4(qb.y);
    let x6 = i8x4(qb.z);
    let x7 = i8x4(qb.w);
    // Three scalar loads: the fourth component (d Σq) is not used.
    let xd = vec3<f32>(qd[ci].x, qd[ci].y, qd[ci].z);
    return vec4<f32>(
        xdot(c0, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c1, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c2, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c3, x0, x1, x2, x3, x4, x5, x6, x7, xd),
    );
}

// Token t's results for rows r, r + WG, r + 2 WG, r + 3 WG (those below P.rows).
fn store4(t: u32, r: u32, a: vec4<f32>) {
    store_y(t, r, a.x);
    if (r + WG < P.rows) {
        store_y(t, r + WG, a.y);
    }
    if (r + 2u * WG < P.rows) {
        store_y(t, r + 2u * WG, a.z);
    }
    if (r + 3u * WG < P.rows) {
        store_y(t, r + 3u * WG, a.w);
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let row = group * 4u * WG + lid;
    if (group >= P.row_groups || row >= P.rows) {
        return;
    }
    // Weight rows of the four (rows past the matrix read its last row; not stored).
    let last_row = P.w_row0 + P.rows - 1u;
    let w0 = P.w_row0 + row;
    let w1 = min(w0 + WG, last_row);
    let w2 = min(w0 + 2u * WG, last_row);
    let w3 = min(w0 + 3u * WG, last_row);
    let bpr = P.blocks_per_row;
    let n = min(P.n_tokens, MAX_TOKENS);
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
            let c0 = dq_chunk(w0, b, P.cols);
            let c1 = dq_chunk(w1, b, P.cols);
            let c2 = dq_chunk(w2, b, P.cols);
            let c3 = dq_chunk(w3, b, P.cols);
            a0 += tok4(c0, c1, c2, c3, i0 + b);
            a1 += tok4(c0, c1, c2, c3, i1 + b);
            a2 += tok4(c0, c1, c2, c3, i2 + b);
            a3 += tok4(c0, c1, c2, c3, i3 + b);
            a4 += tok4(c0, c1, c2, c3, i4 + b);
            a5 += tok4(c0, c1, c2, c3, i5 + b);
            a6 += tok4(c0, c1, c2, c3, i6 + b);
            a7 += tok4(c0, c1, c2, c3, i7 + b);
        }
        store4(t0, row, a0);
        if (t0 + 1u < n) {
            store4(t0 + 1u, row, a1);
        }
        if (t0 + 2u < n) {
            store4(t0 + 2u, row, a2);
        }
        if (t0 + 3u < n) {
            store4(t0 + 3u, row, a3);
        }
        if (t0 + 4u < n) {
            store4(t0 + 4u, row, a4);
        }
        if (t0 + 5u < n) {
            store4(t0 + 5u, row, a5);
        }
        if (t0 + 6u < n) {
            store4(t0 + 6u, row, a6);
        }
        if (t0 + 7u < n) {
            store4(t0 + 7u, row, a7);
        }
    }
}
