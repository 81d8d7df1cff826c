// The routed experts' products over 8-bit activations (quantize_act.wgsl's chunks, the CPU's
// integer arithmetic), for a token's pairs and a prompt's alike, the pairs grouped by expert on
// the GPU (the ids are never read back): a workgroup owns one expert, 4 WG of its rows and one
// chunk of the pair list. It scans the chunk's ids in order (the same for every invocation, so
// control flow stays uniform) and gathers the pairs routed to its expert 8 at a time. An
// invocation computes rows r, r + WG, r + 2 WG, r + 3 WG: a full tile of 8 pairs decodes each
// of the 4 rows' weight chunks once for the 8 pairs and loads each pair's activation chunk once
// for the 4 rows (as matrix/tiles_q8.wgsl); the pairs of a last partial tile run one at a
// time (a token's decode: each pair alone). Every pair's sum is its chunks' terms added in
// order, as the CPU's row kernels add them.
// Composed after quant/chunk.wgsl, a quant/*.wgsl fragment with an integer path, q8_act.wgsl
// (qx / qd at bindings 2 and 3: pair p reads row p / x_div) and experts/header.wgsl.
// group = wid.x + wid.y * groups_x = (chunk * experts + e - e_lo) * row_groups + row group,
// row_groups = ceil(rows / (4 WG)).
// The pairs and sums are named scalars and vec4s (a component per row), not arrays indexed at
// run time: llvmpipe keeps those in scratch memory and gathers them per SIMD lane.

// [n_pairs, rows]
@group(0) @binding(6) var<storage, read_write> y: array<f32>;

// Pair p's first chunk in qx / qd.
fn chunk0(p: u32) -> u32 {
    return (p / P.x_div) * P.blocks_per_row;
}

// Pair p's results for rows r, r + WG, r + 2 WG, r + 3 WG (those below P.rows).
fn store4(p: u32, r: u32, a: vec4<f32>) {
    let o = p * P.rows;
    y[o + r] = a.x;
    if (r + WG < P.rows) {
        y[o + r + WG] = a.y;
    }
    if (r + 2u * WG < P.rows) {
        y[o + r + 2u * WG] = a.z;
    }
    if (r + 3u * WG < P.rows) {
        y[o + r + 3u * WG] = a.w;
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let r = (group % P.row_groups) * 4u * WG + lid;
    let eg = group / P.row_groups;
    let n_e = P.e_hi - P.e_lo;
    let chunk = eg / n_e;
    if (chunk >= P.n_chunks || r >= P.rows) {
        return;
    }
    let e = P.e_lo + eg % n_e;
    // The 4 rows' stack rows; rows past the matrix read its last row and are not stored.
    let base = (e - P.e_lo) * P.rows;
    let last = base + P.rows - 1u;
    let w0 = base + r;
    let w1 = min(w0 + WG, last);
    let w2 = min(w0 + 2u * WG, last);
    let w3 = min(w0 + 3u * WG, last);
    let p_end = min((chunk + 1u) * P.chunk, P.n_pairs);
    let bpr = P.blocks_per_row;
    var p = chunk * P.chunk;
    loop {
        // The next (up to) 8 pairs of this chunk routed to e.
        var n = 0u;
        var p0 = 0u;
        var p1 = 0u;
        var p2 = 0u;
        var p3 = 0u;
        var p4 = 0u;
        var p5 = 0u;
        var p6 = 0u;
        var p7 = 0u;
        while (p < p_end && n < 8u) {
            if (ids[p] == e) {
                switch n {
                    case 0u: { p0 = p; }
                    case 1u: { p1 = p; }
                    case 2u: { p2 = p; }
                    case 3u: { p3 = p; }
                    case 4u: { p4 = p; }
                    case 5u: { p5 = p; }
                    case 6u: { p6 = p; }
                    default: { p7 = p; }
                }
                n++;
            }
            p++;
        }
        if (n < 8u) {
            // The last few pairs, one at a time.
            for (var i = 0u; i < n; i++) {
                var q = p0;
                switch i {
                    case 1u: { q = p1; }
                    case 2u: { q = p2; }
                    case 3u: { q = p3; }
                    case 4u: { q = p4; }
                    case 5u: { q = p5; }
                    case 6u: { q = p6; }
                    default: {}
                }
                let c = chunk0(q);
                var a = vec4<f32>(0.0);
                for (var b = 0u; b < bpr; b++) {
                    let k0 = dq_chunk(w0, b, P.cols);
                    let k1 = dq_chunk(w1, b, P.cols);
                    let k2 = dq_chunk(w2, b, P.cols);
                    let k3 = dq_chunk(w3, b, P.cols);
                    a += tok4_at(k0, k1, k2, k3, c + b);
                }
                store4(q, r, a);
            }
            break;
        }
        let c0 = chunk0(p0);
        let c1 = chunk0(p1);
        let c2 = chunk0(p2);
        let c3 = chunk0(p3);
        let c4 = chunk0(p4);
        let c5 = chunk0(p5);
        let c6 = chunk0(p6);
        let c7 = chunk0(p7);
        var a0 = vec4<f32>(0.0);
        var a1 = vec4<f32>(0.0);
        var a2 = vec4<f32>(0.0);
        var a3 = vec4<f32>(0.0);
        var a4 = vec4<f32>(0.0);
        var a5 = vec4<f32>(0.0);
        var a6 = vec4<f32>(0.0);
        var a7 = vec4<f32>(0.0);
        for (var b = 0u; b < bpr; b++) {
            let k0 = dq_chunk(w0, b, P.cols);
            let k1 = dq_chunk(w1, b, P.cols);
            let k2 = dq_chunk(w2, b, P.cols);
            let k3 = dq_chunk(w3, b, P.cols);
            a0 += tok4_at(k0, k1, k2, k3, c0 + b);
            a1 += tok4_at(k0, k1, k2, k3, c1 + b);
            a2 += tok4_at(k0, k1, k2, k3, c2 + b);
            a3 += tok4_at(k0, k1, k2, k3, c3 + b);
            a4 += tok4_at(k0, k1, k2, k3, c4 + b);
            a5 += tok4_at(k0, k1, k2, k3, c5 + b);
            a6 += tok4_at(k0, k1, k2, k3, c6 + b);
            a7 += tok4_at(k0, k1, k2, k3, c7 + b);
        }
        store4(p0, r, a0);
        store4(p1, r, a1);
        store4(p2, r, a2);
        store4(p3, r, a3);
        store4(p4, r, a4);
        store4(p5, r, a5);
        store4(p6, r, a6);
        store4(p7, r, a7);
    }
}
