// The routed experts' matrix-vector products: for each (token, slot) pair p of a routing
// (ids from moe_route.wgsl), y[p] = W_e x[p / X_DIV] with W_e the rows of expert e = ids[p]
// in a stack of every expert's matrix ([n_expert * rows, cols], expert e at rows e * rows..),
// so the expert ids never leave the GPU. Composed after a quant/*.wgsl fragment (bindings
// 0..1 for W, const QK, fn dq_block): one kernel per weight format, the K-quants included.
// One invocation per output row, no reduction or barrier (as matvec_rows.wgsl): each walks
// its row's blocks in order. A stack split across bindings by whole experts is one launch per
// part: a pair whose expert is outside the part's e_lo..e_hi is left to the other launches.
// group = wid.x + wid.y * groups_x; pair = group / row_groups.

override WG: u32 = 64u;

struct MatvecExpertsParams {
    // rows of one expert's matrix
    rows: u32,
    cols: u32,
    // ceil(cols / QK)
    blocks_per_row: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // (token, slot) pairs: n_tokens * k
    n_pairs: u32,
    // pairs per x row: k when every slot of a token reads the token's input (gate, up), 1
    // when each pair has its own (down)
    x_div: u32,
    // ceil(rows / WG)
    row_groups: u32,
    // the experts this launch's weight binding holds: e_lo..e_hi
    e_lo: u32,
    e_hi: u32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

// [n_pairs / x_div, cols]
@group(0) @binding(2) var<storage, read> x: array<f32>;
// [n_pairs, rows]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
// [n_pairs] expert ids
@group(0) @binding(4) var<storage, read> ids: array<u32>;
@group(0) @binding(5) var<uniform> P: MatvecExpertsParams;

// x[xo + c..xo + c + 4], with columns >= cols read as 0 (a partial last block of an F16/F32
// row).
fn load_x4(xo: u32, c: u32) -> vec4<f32> {
    if (c + 3u < P.cols) {
        return vec4<f32>(x[xo + c], x[xo + c + 1u], x[xo + c + 2u], x[xo + c + 3u]);
    }
    var v = vec4<f32>(0.0);
    for (var j = 0u; j < 4u; j++) {
        if (c + j < P.cols) {
            v[j] = x[xo + c + j];
        }
    }
    return v;
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let p = group / P.row_groups;
    let row = (group % P.row_groups) * WG + lid;
    if (p >= P.n_pairs || row >= P.rows) {
        return;
    }
    let e = ids[p];
    if (e < P.e_lo || e >= P.e_hi) {
        return;
    }
    let w_row = (e - P.e_lo) * P.rows + row;
    let xo = (p / P.x_div) * P.cols;
    var acc = 0.0;
    for (var b = 0u; b < P.blocks_per_row; b++) {
        let w = dq_block(w_row, b, P.cols);
        let c0 = b * QK;
        for (var k = 0u; k < 8u; k++) {
            acc += dot(w[k], load_x4(xo, c0 + 4u * k));
        }
    }
    y[p * P.rows + row] = acc;
}
