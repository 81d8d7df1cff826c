// Batched decode matvec over 8-bit activations, one invocation per output row: the
// barrier-free twin of matvec_q8.wgsl for CPU-like adapters (see matvec_rows.wgsl), with the
// same integer chunk arithmetic and operation order as the CPU (src/cpu/scalar.rs `dot_q_row`).
// Composed after quant/chunk.wgsl and a quant/*.wgsl fragment with an integer path.
// group = wid.x + wid.y * groups_x; row = group * WG + lid; each invocation computes its row
// for every token (up to MAX_TOKENS), decoding each weight chunk once for all of them: a
// prefill batch reads the weights once, not once per token. Rows outside
// row_offset..row_offset + rows of y are untouched.

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
    // ceil(rows / WG): the workgroups of the launch
    row_groups: u32,
    // first row of the weight buffers this launch reads (a row range of a fused matrix)
    w_row0: u32,
    // split outputs (matvec_q8_out/split*.wgsl): rows below split1 go to y, below split2 to
    // y1, the rest to y2 (global row = row_offset + row)
    split1: u32,
    split2: u32,
    pad0: u32,
}

// [n_tokens, cols / 4] words: four int8 codes each (quantize_act.wgsl)
@group(0) @binding(2) var<storage, read> qx: array<u32>;
// [n_tokens, cols / 32]: (d, d * Σq half 0, d * Σq half 1, d * Σq)
@group(0) @binding(3) var<storage, read> qd: array<vec4<f32>>;
// y (binding 4 and, for split outputs, 6 and 7) and `fn store_y(t, row, v)` come from a
// matvec_q8_out/*.wgsl fragment: plain store, accumulate or split by rows.
@group(0) @binding(5) var<uniform> P: MatvecQ8Params;

// Row `wrow` of the weights (chunk decode as in the batched loop) dotted with token 0 of qx/qd:
// the same integer chunk sums and f32 operation order as the batched loop, so a decode step's
// result does not depend on which path ran.
fn row_dot1(wrow: u32) -> f32 {
    var acc = 0.0;
    for (var b = 0u; b < P.blocks_per_row; b++) {
        let ch = dq_chunk(wrow, b, P.cols);
        var s0 = 0;
        var s1 = 0;
        for (var k = 0u; k < 4u; k++) {
            s0 += dot_i8x4(ch.u[k], qx[b * 8u + k]);
            s1 += dot_i8x4(ch.u[k + 4u], qx[b * 8u + 4u + k]);
        }
        let xd = qd[b];
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
    let row = group * WG + lid;
    if (group >= P.row_groups || row >= P.rows) {
        return;
    }
    // Decode (one token): a scalar accumulator. The batched loop below keeps `acc` in a
    // dynamically indexed private array, which llvmpipe (lavapipe) places in scratch memory
    // and reads and writes per SIMD lane on every chunk; this path measured ~1.4-1.7x faster
    // there (docs/PERFLOG.md, 2026-12-01). `P.n_tokens` is uniform, so no lane diverges.
    if (P.n_tokens == 1u) {
        store_y(0u, row, row_dot1(P.w_row0 + row));
        return;
    }
    let n = min(P.n_tokens, MAX_TOKENS);
    // [n] partial sums, one per token.
    var acc: array<f32, MAX_TOKENS>;
    for (var t = 0u; t < n; t++) {
        acc[t] = 0.0;
    }
    for (var b = 0u; b < P.blocks_per_row; b++) {
        let ch = dq_chunk(P.w_row0 + row, b, P.cols);
        for (var t = 0u; t < n; t++) {
            let ci = t * P.blocks_per_row + b;
            var s0 = 0;
            var s1 = 0;
            for (var k = 0u; k < 4u; k++) {
                s0 += dot_i8x4(ch.u[k], qx[ci * 8u + k]);
                s1 += dot_i8x4(ch.u[k + 4u], qx[ci * 8u + 4u + k]);
            }
            let xd = qd[ci];
            // The CPU's order: (dw * d_x) * isum, then + c0 * xs0, then + c1 * xs1.
            acc[t] += ch.dw * xd.x * f32(ch.mul.x * s0 + ch.mul.y * s1) + ch.c.x * xd.y
                + ch.c.y * xd.z;
        }
    }
    for (var t = 0u; t < n; t++) {
        store_y(t, row, acc[t]);
    }
}
