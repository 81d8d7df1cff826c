// The entry point of tiles_q8.wgsl and its 8-token tile for adapters with subgroups of at
// least 8 invocations (lavapipe: 8): the same results bit for bit, only the activation loads
// differ. Why: llvmpipe loads a storage word in a loop over the 8 SIMD lanes even when every
// lane reads the same address, and the token-indexed activation loads are such loads (the
// same for every invocation). Here lane l of the subgroup loads token t0 + min(l, 7)'s chunk,
// so one lane loop delivers 8 tokens' words, and `subgroupBroadcast` with a constant lane (an
// extract + splat in llvmpipe) hands token t0 + k's chunk to every invocation: 12 lane loops
// per chunk and tile instead of 96 (matmuls ~2.4x on lavapipe).
// Subgroup operations need their subgroup's lanes to be active together: tiles_q8.wgsl runs
// a tile for every busy invocation, live or not, and a subgroup's lanes are all busy or all
// idle.

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    tiles(wid, lid, lid - lane, lane);
}

// Tokens t0..t0 + 8 (those below n) for the rows of `w` (stored from `row` when `live`).
fn tile8(w: Rows4, t0: u32, n: u32, row: u32, lane: u32, live: bool) {
    let bpr = P.blocks_per_row;
    // This lane's token of the tile; a last partial tile repeats token n - 1 (valid reads, the
    // results are not stored).
    let mine = min(t0 + min(lane, 7u), n - 1u) * bpr;
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
        let qa = qx[(mine + b) * 2u];
        let qb = qx[(mine + b) * 2u + 1u];
        // Three scalar loads (a vec4 load is four lane loops): d Σq is not used.
        let xd = vec3<f32>(qd[mine + b].x, qd[mine + b].y, qd[mine + b].z);
        a0 += tok4(c0, c1, c2, c3, subgroupBroadcast(qa, 0u), subgroupBroadcast(qb, 0u), subgroupBroadcast(xd, 0u));
        a1 += tok4(c0, c1, c2, c3, subgroupBroadcast(qa, 1u), subgroupBroadcast(qb, 1u), subgroupBroadcast(xd, 1u));
        a2 += tok4(c0, c1, c2, c3, subgroupBroadcast(qa, 2u), subgroupBroadcast(qb, 2u), subgroupBroadcast(xd, 2u));
        a3 += tok4(c0, c1, c2, c3, subgroupBroadcast(qa, 3u), subgroupBroadcast(qb, 3u), subgroupBroadcast(xd, 3u));
        a4 += tok4(c0, c1, c2, c3, subgroupBroadcast(qa, 4u), subgroupBroadcast(qb, 4u), subgroupBroadcast(xd, 4u));
        a5 += tok4(c0, c1, c2, c3, subgroupBroadcast(qa, 5u), subgroupBroadcast(qb, 5u), subgroupBroadcast(xd, 5u));
        a6 += tok4(c0, c1, c2, c3, subgroupBroadcast(qa, 6u), subgroupBroadcast(qb, 6u), subgroupBroadcast(xd, 6u));
        a7 += tok4(c0, c1, c2, c3, subgroupBroadcast(qa, 7u), subgroupBroadcast(qb, 7u), subgroupBroadcast(xd, 7u));
    }
    if (live) {
        store_tile(t0, n, row, a0, a1, a2, a3, a4, a5, a6, a7);
    }
}
