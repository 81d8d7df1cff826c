// Shared body of the prefill integer matmuls (matmul_q8_rows.wgsl, matmul_q8_rows_sg.wgsl):
// an invocation computes 4 weight rows, r, r + S, r + 2 S, r + 3 S (S = P.row_stride, the
// workgroup's live invocations), for tiles of 8 tokens,
// with named vec4 accumulators (one per token, a component per row), never an array indexed
// at run time (llvmpipe keeps those in scratch memory). The two kernels differ only in how a
// tile's activation chunks reach the invocation; these helpers do the same f32 operations in
// the same order for both, so their results match each other and matvec_q8_rows.wgsl bit for
// bit.

// The weight rows an invocation reads: w0 for output row `row` (below P.rows), w1..w3 for rows
// row + S, + 2 S, + 3 S (S = P.row_stride), clamped to the matrix's last row (read, never
// stored).
struct Rows4 {
    w0: u32,
    w1: u32,
    w2: u32,
    w3: u32,
}

fn rows4(row: u32) -> Rows4 {
    let last_row = P.w_row0 + P.rows - 1u;
    let w0 = P.w_row0 + row;
    let s = P.row_stride;
    return Rows4(w0, min(w0 + s, last_row), min(w0 + 2u * s, last_row), min(w0 + 3u * s, last_row));
}

// Tokens of this launch (the host splits larger batches).
fn launch_tokens() -> u32 {
    return min(P.n_tokens, MAX_TOKENS);
}

// Chunk `ch` dotted with one token's chunk (codes x0..x7, scales xd = (d, d Σq half 0,
// d Σq half 1)): matvec_q8_rows.wgsl's `chunk_dot` (exact i32 half sums, then the same f32
// operations in the same order).
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

// The four rows' chunks dotted with one token's activation chunk (code words qa = qx[2 ci],
// qb = qx[2 ci + 1], scales xd = qd[ci].xyz; the fourth, d Σq, is not used): each activation
// word is sign-extended once for the four rows.
fn tok4(c0: QChunk, c1: QChunk, c2: QChunk, c3: QChunk, qa: vec4<u32>, qb: vec4<u32>, xd: vec3<f32>) -> vec4<f32> {
    let x0 = i8x4(qa.x);
    let x1 = i8x4(qa.y);
    let x2 = i8x4(qa.z);
    let x3 = i8x4(qa.w);
    let x4 = i8x4(qb.x);
    let x5 = i8x4(qb.y);
    let x6 = i8x4(qb.z);
    let x7 = i8x4(qb.w);
    return vec4<f32>(
        xdot(c0, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c1, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c2, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c3, x0, x1, x2, x3, x4, x5, x6, x7, xd),
    );
}

// Token t's results for rows r, r + S, r + 2 S, r + 3 S (S = P.row_stride; those below
// P.rows).
fn store4(t: u32, r: u32, a: vec4<f32>) {
    let s = P.row_stride;
    store_y(t, r, a.x);
    if (r + s < P.rows) {
        store_y(t, r + s, a.y);
    }
    if (r + 2u * s < P.rows) {
        store_y(t, r + 2u * s, a.z);
    }
    if (r + 3u * s < P.rows) {
        store_y(t, r + 3u * s, a.w);
    }
}

// The tile of tokens t0..t0 + 8 (those below n) for rows r, r + S, ...: a0 is token t0's.
fn store_tile(
    t0: u32, n: u32, r: u32,
    a0: vec4<f32>, a1: vec4<f32>, a2: vec4<f32>, a3: vec4<f32>,
    a4: vec4<f32>, a5: vec4<f32>, a6: vec4<f32>, a7: vec4<f32>,
) {
    store4(t0, r, a0);
    if (t0 + 1u < n) {
        store4(t0 + 1u, r, a1);
    }
    if (t0 + 2u < n) {
        store4(t0 + 2u, r, a2);
    }
    if (t0 + 3u < n) {
        store4(t0 + 3u, r, a3);
    }
    if (t0 + 4u < n) {
        store4(t0 + 4u, r, a4);
    }
    if (t0 + 5u < n) {
        store4(t0 + 5u, r, a5);
    }
    if (t0 + 6u < n) {
        store4(t0 + 6u, r, a6);
    }
    if (t0 + 7u < n) {
        store4(t0 + 7u, r, a7);
    }
}
