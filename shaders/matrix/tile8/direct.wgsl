// The entry point of tiles_q8.wgsl and its 8-token tile for any adapter: each invocation loads
// every token's activation chunk itself (tokens past n repeat token n - 1: valid reads, the
// results are not stored).

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    tiles(wid, lid, lid, 0u);
}

// Tokens t0..t0 + 8 (those below n) for the rows of `w` (stored from `row` when `live`).
fn tile8(w: Rows4, t0: u32, n: u32, row: u32, lane: u32, live: bool) {
    let bpr = P.blocks_per_row;
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
    if (live) {
        store_tile(t0, n, row, a0, a1, a2, a3, a4, a5, a6, a7);
    }
}
