// Shared body of the prefill integer matmuls (matmul_q8_rows.wgsl, matmul_q8_rows_sg.wgsl):
// an invocation computes 4 weight rows, r, r + S, r + 2 S, r + 3 S (S = P.row_stride, the
// workgroup's live invocations), for tiles of 8 tokens,
// with named vec4 accumulators (one per token, a component per row), never an array indexed
// at run time (llvmpipe keeps those in scratch memory). The two kernels differ only in how a
// tile's activation chunks reach the invocation; these helpers do the same f32 operations in
// the same order for both, so their results match each other and matvec_q8_rows.wgsl bit for
// bit. Their arithmetic (xdot, tok4) is q8_act.wgsl's.

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
