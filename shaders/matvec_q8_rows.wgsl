// Batched decode matvec over 8-bit activations, one invocation per output row: the
// barrier-free twin of matvec_q8.wgsl for CPU-like adapters (see matvec_rows.wgsl), with the
// same integer chunk arithmetic and operation order as the CPU (src/cpu/scalar.rs `dot_q_row`).
// Composed after quant/chunk.wgsl, a quant/*.wgsl fragment with an integer path,
// q8_params.wgsl and q8_rows/header.wgsl.
// group = wid.x + wid.y * groups_x; each invocation computes P.rows_per_inv consecutive rows
// from (group * WG + lid) * rows_per_inv for every token (up to MAX_TOKENS). Batches of 4 or
// more tokens: one row, in tiles of 4 tokens that share each decoded weight chunk, then the
// remaining tokens one at a time. Fewer tokens (decode): ROWS rows together, so that each
// activation chunk is loaded and unpacked once for ROWS weight rows. Rows outside
// row_offset..row_offset + rows of y are untouched.
// Why ROWS: llvmpipe loads storage words lane by lane, and a chunk's activations (8 words of
// qx, a vec4 of qd) cost more loads than its Q4 weights (4 + 1 words); sharing them over 4
// rows cuts the loads per row by about half.
// The partial sums are four named scalars, not an array indexed by token: llvmpipe (lavapipe)
// keeps a dynamically indexed private array in scratch memory and gathers/scatters it per SIMD
// lane on every chunk; the scalars stay in registers (~2-3x decode on lavapipe).

// MatvecQ8Params P, the qx / qd bindings and fn chunk_dot: q8_params.wgsl; WG and MAX_TOKENS:
// q8_rows/header.wgsl.
// Rows per invocation for fewer than 4 tokens (MATVEC_Q8_ROWS_PER_INVOCATION in
// src/gpu/kernels/q8act.rs); P.rows_per_inv is ROWS or 1.
const ROWS: u32 = 4u;

// One activation chunk (chunk ci of qx/qd), unpacked once for several weight rows: its 32
// codes as eight vec4<i32> (named, not an array: see above) and its qd entry.
struct XChunk {
    q0: vec4<i32>,
    q1: vec4<i32>,
    q2: vec4<i32>,
    q3: vec4<i32>,
    q4: vec4<i32>,
    q5: vec4<i32>,
    q6: vec4<i32>,
    q7: vec4<i32>,
    d: vec4<f32>,
}

fn load_x(ci: u32) -> XChunk {
    let a = qx[ci * 2u];
    let b = qx[ci * 2u + 1u];
    return XChunk(
        i8x4(a.x), i8x4(a.y), i8x4(a.z), i8x4(a.w),
        i8x4(b.x), i8x4(b.y), i8x4(b.z), i8x4(b.w),
        qd[ci],
    );
}

// chunk_dot with the activation chunk already loaded: the same integer sums (exact in any
// order) and the same f32 operations, so the same result.
fn x_dot(ch: QChunk, x: XChunk) -> f32 {
    let s0 = dot(i8x4(ch.u[0]), x.q0) + dot(i8x4(ch.u[1]), x.q1) + dot(i8x4(ch.u[2]), x.q2)
        + dot(i8x4(ch.u[3]), x.q3);
    let s1 = dot(i8x4(ch.u[4]), x.q4) + dot(i8x4(ch.u[5]), x.q5) + dot(i8x4(ch.u[6]), x.q6)
        + dot(i8x4(ch.u[7]), x.q7);
    return ch.dw * x.d.x * f32(ch.mul.x * s0 + ch.mul.y * s1) + ch.c.x * x.d.y + ch.c.y * x.d.z;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let nr = P.rows_per_inv;
    let row0 = (group * WG + lid) * nr;
    if (group >= P.row_groups || row0 >= P.rows) {
        return;
    }
    let bpr = P.blocks_per_row;
    let n = min(P.n_tokens, MAX_TOKENS);
    if (nr == 1u) {
        // Batches (the host picks one row per invocation from 4 tokens on): 4-token tiles
        // share each decoded weight chunk, then the rest one token at a time.
        let wrow = P.w_row0 + row0;
        var t0 = 0u;
        for (; t0 + 4u <= n; t0 += 4u) {
            var a0 = 0.0;
            var a1 = 0.0;
            var a2 = 0.0;
            var a3 = 0.0;
            for (var b = 0u; b < bpr; b++) {
                let ch = dq_chunk(wrow, b, P.cols);
                a0 += chunk_dot(ch, t0 * bpr + b);
                a1 += chunk_dot(ch, (t0 + 1u) * bpr + b);
                a2 += chunk_dot(ch, (t0 + 2u) * bpr + b);
                a3 += chunk_dot(ch, (t0 + 3u) * bpr + b);
            }
            store_y(t0, row0, a0);
            store_y(t0 + 1u, row0, a1);
            store_y(t0 + 2u, row0, a2);
            store_y(t0 + 3u, row0, a3);
        }
        for (; t0 < n; t0++) {
            var a = 0.0;
            for (var b = 0u; b < bpr; b++) {
                a += chunk_dot(dq_chunk(wrow, b, P.cols), t0 * bpr + b);
            }
            store_y(t0, row0, a);
        }
        return;
    }
    // Decode (fewer than 4 tokens): ROWS rows at once, each activation chunk loaded once. A
    // row past the matrix's end reads the last row (in bounds) and is not stored.
    let last = P.rows - 1u;
    let w0 = P.w_row0 + row0;
    let w1 = P.w_row0 + min(row0 + 1u, last);
    let w2 = P.w_row0 + min(row0 + 2u, last);
    let w3 = P.w_row0 + min(row0 + 3u, last);
    for (var t = 0u; t < n; t++) {
        var a0 = 0.0;
        var a1 = 0.0;
        var a2 = 0.0;
        var a3 = 0.0;
        for (var b = 0u; b < bpr; b++) {
            let x = load_x(t * bpr + b);
            a0 += x_dot(dq_chunk(w0, b, P.cols), x);
            a1 += x_dot(dq_chunk(w1, b, P.cols), x);
            a2 += x_dot(dq_chunk(w2, b, P.cols), x);
            a3 += x_dot(dq_chunk(w3, b, P.cols), x);
        }
        store_y(t, row0, a0);
        if (row0 + 1u < P.rows) {
            store_y(t, row0 + 1u, a1);
        }
        if (row0 + 2u < P.rows) {
            store_y(t, row0 + 2u, a2);
        }
        if (row0 + 3u < P.rows) {
            store_y(t, row0 + 3u, a3);
        }
    }
}
