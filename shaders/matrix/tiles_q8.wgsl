// Matrix layout over the 8-bit body for CPU-like adapters (lavapipe, llvmpipe), decode and
// prefill alike: register tiles, no workgroup memory, no barrier. Each invocation computes 4
// weight rows, r, r + D, r + 2 D, r + 3 D, for its launch's tokens in tiles: of 8 (when TILE is
// 8), then of 4, then one at a time. A workgroup's S = P.row_stride live invocations cover 4 S
// rows from group * 4 S, either strided (r = first + lid, D = S: the prefill matmul) or in
// runs of 4 (r = first + 4 lid, D = 1: the decode matvec), as P.inv_step and P.row_step say. Composed after quant/chunk.wgsl, a quant/*.wgsl fragment with
// an integer path, q8_act.wgsl and q8.wgsl, and before a tile8/*.wgsl fragment (the entry
// point and the 8-token tile) and an out/*.wgsl fragment (`fn store_y`).
// Every result is its row's chunks summed in order with q8_act.wgsl's xdot, whatever tile
// computed it: the same f32 operations in the same order as the CPU's integer dot product, so
// each tile shape gives the others' result bit for bit.
// Why register tiles: llvmpipe loads a storage buffer element per SIMD lane in a loop with a
// bounds check per lane, even when every lane reads the same address (it only broadcasts
// uniform loads outside control flow), so each u32 loaded costs tens of instructions and the
// loads, not the arithmetic, bound the kernel. Per chunk of 32 columns an 8-token tile loads
// its 4 rows' weight chunks once and each token's 8 code words and 3 scales once, reusing each
// weight load for 8 tokens and each activation load for 4 rows; a decode token's activation
// chunk is loaded once for 4 rows (a chunk's activations, 8 words of qx and the scales, cost
// more loads than its Q4 weights, 4 + 1 words). The accumulators are named vec4 (one per
// token, a component per row), never an array indexed at run time: llvmpipe keeps those in
// scratch memory and gathers/scatters them per SIMD lane on every chunk (~2-3x on lavapipe).

override WG: u32 = 64u;
// Tokens per launch (the host splits larger batches).
const MAX_TOKENS: u32 = 64u;
// Widest token tile: 8 (the prefill matmul) or 4 (the decode and small-batch matvec, and the
// stand-in where the 8-token kernel failed its selftest).
override TILE: u32 = 8u;

// The weight rows an invocation reads: w0 for output row `row` (below P.rows), w1..w3 for rows
// row + D, + 2 D, + 3 D (D = P.row_step), clamped to the matrix's last row (read, never
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
    let s = P.row_step;
    return Rows4(w0, min(w0 + s, last_row), min(w0 + 2u * s, last_row), min(w0 + 3u * s, last_row));
}

// Token t's results for rows r, r + D, r + 2 D, r + 3 D (D = P.row_step; those below
// P.rows).
fn store4(t: u32, r: u32, a: vec4<f32>) {
    let s = P.row_step;
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

// The tile of tokens t0..t0 + 8 (those below n) for rows r, r + D, ...: a0 is token t0's.
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

// Tokens t0..t0 + 4 for the rows of `w` (stored from `row` when `live`).
fn tile4(w: Rows4, t0: u32, row: u32, live: bool) {
    let bpr = P.blocks_per_row;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    for (var b = 0u; b < bpr; b++) {
        let c0 = dq_chunk(w.w0, b, P.cols);
        let c1 = dq_chunk(w.w1, b, P.cols);
        let c2 = dq_chunk(w.w2, b, P.cols);
        let c3 = dq_chunk(w.w3, b, P.cols);
        a0 += tok4_at(c0, c1, c2, c3, t0 * bpr + b);
        a1 += tok4_at(c0, c1, c2, c3, (t0 + 1u) * bpr + b);
        a2 += tok4_at(c0, c1, c2, c3, (t0 + 2u) * bpr + b);
        a3 += tok4_at(c0, c1, c2, c3, (t0 + 3u) * bpr + b);
    }
    if (live) {
        store4(t0, row, a0);
        store4(t0 + 1u, row, a1);
        store4(t0 + 2u, row, a2);
        store4(t0 + 3u, row, a3);
    }
}

// Token t for the rows of `w` (stored from `row` when `live`): the decode matvec. The
// activation chunk is loaded and sign-extended once, then each row's weight chunk is loaded
// and dotted in turn, so one row's chunk is live at a time (with tok4's four chunks at once,
// the 4096x4096 decode was slower in most rounds on lavapipe, 2.4 -> up to 5.5 ms). Same
// xdot calls, same sums: tok4's result bit for bit.
fn tile1(w: Rows4, t: u32, row: u32, live: bool) {
    let bpr = P.blocks_per_row;
    var a = vec4<f32>(0.0);
    for (var b = 0u; b < bpr; b++) {
        let ci = t * bpr + b;
        let qa = qx[ci * 2u];
        let qb = qx[ci * 2u + 1u];
        let xd = vec3<f32>(qd[ci].x, qd[ci].y, qd[ci].z);
        let x0 = i8x4(qa.x);
        let x1 = i8x4(qa.y);
        let x2 = i8x4(qa.z);
        let x3 = i8x4(qa.w);
        let x4 = i8x4(qb.x);
        let x5 = i8x4(qb.y);
        let x6 = i8x4(qb.z);
        let x7 = i8x4(qb.w);
        a.x += xdot(dq_chunk(w.w0, b, P.cols), x0, x1, x2, x3, x4, x5, x6, x7, xd);
        a.y += xdot(dq_chunk(w.w1, b, P.cols), x0, x1, x2, x3, x4, x5, x6, x7, xd);
        a.z += xdot(dq_chunk(w.w2, b, P.cols), x0, x1, x2, x3, x4, x5, x6, x7, xd);
        a.w += xdot(dq_chunk(w.w3, b, P.cols), x0, x1, x2, x3, x4, x5, x6, x7, xd);
    }
    if (live) {
        store4(t, row, a);
    }
}

// The launch's work for invocation `lid` of workgroup `wid`; `base` is the first lid of its
// subgroup and `lane` its lane there (lid and 0 where the entry point has no subgroups).
// An invocation is live when it has a row below P.rows; it is busy when its subgroup has a
// live invocation (the 8-token tile of tile8/lanes.wgsl needs every lane of a subgroup in
// it; lavapipe numbers a subgroup's lanes consecutively in lid). A busy invocation that is
// not live computes the matrix's last row and stores nothing.
fn tiles(wid: vec3<u32>, lid: u32, base: u32, lane: u32) {
    let group = wid.x + wid.y * P.groups_x;
    let first = group * 4u * P.row_stride;
    let mine = first + lid * P.inv_step;
    let live = group < P.row_groups && lid < P.row_stride && mine < P.rows;
    let busy = group < P.row_groups && base < P.row_stride && first + base * P.inv_step < P.rows;
    let row = min(mine, P.rows - 1u);
    let w = rows4(row);
    let n = select(0u, min(P.n_tokens, MAX_TOKENS), busy);
    var t0 = 0u;
    if (TILE == 8u) {
        // A last partial tile of 5..7 tokens repeats token n - 1 in its surplus slots.
        for (; t0 + 4u < n; t0 += 8u) {
            tile8(w, t0, n, row, lane, live);
        }
    }
    for (; t0 + 4u <= n; t0 += 4u) {
        tile4(w, t0, row, live);
    }
    for (; t0 < n; t0++) {
        tile1(w, t0, row, live);
    }
}
