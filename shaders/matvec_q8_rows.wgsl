// Batched decode matvec over 8-bit activations, one invocation per output row: the
// barrier-free twin of matvec_q8.wgsl for CPU-like adapters (see matvec_rows.wgsl), with the
// same integer chunk arithmetic and operation order as the CPU (src/cpu/scalar.rs `dot_q_row`).
// Composed after quant/chunk.wgsl and a quant/*.wgsl fragment with an integer path.
// group = wid.x + wid.y * groups_x; row = group * WG + lid; each invocation computes its row
// for every token (up to MAX_TOKENS), in tiles of 4 tokens that share each decoded weight
// chunk, then the remaining tokens one at a time. Rows outside row_offset..row_offset + rows
// of y are untouched.
// The partial sums are four named scalars, not an array indexed by token: llvmpipe (lavapipe)
// keeps a dynamically indexed private array in scratch memory and gathers/scatters it per SIMD
// lane on every chunk; the scalars stay in registers (~2-3x decode on lavapipe, PERFLOG
// 2026-12-01).

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

// Chunk `ch` (chunk b of a row) dotted with chunk ci = t * blocks_per_row + b of qx/qd: the
// integer chunk sums and f32 operation order of the CPU (src/cpu/scalar.rs `dot_q_row`).
fn chunk_dot(ch: QChunk, ci: u32) -> f32 {
    var s0 = 0;
    var s1 = 0;
    for (var k = 0u; k < 4u; k++) {
        s0 += dot_i8x4(ch.u[k], qx[ci * 8u + k]);
        s1 += dot_i8x4(ch.u[k + 4u], qx[ci * 8u + 4u + k]);
    }
    let xd = qd[ci];
    return ch.dw * xd.x * f32(ch.mul.x * s0 + ch.mul.y * s1) + ch.c.x * xd.y + ch.c.y * xd.z;
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
    let wrow = P.w_row0 + row;
    let bpr = P.blocks_per_row;
    let n = min(P.n_tokens, MAX_TOKENS);
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
        store_y(t0, row, a0);
        store_y(t0 + 1u, row, a1);
        store_y(t0 + 2u, row, a2);
        store_y(t0 + 3u, row, a3);
    }
    for (; t0 < n; t0++) {
        var a = 0.0;
        for (var b = 0u; b < bpr; b++) {
            a += chunk_dot(dq_chunk(wrow, b, P.cols), t0 * bpr + b);
        }
        store_y(t0, row, a);
    }
}
