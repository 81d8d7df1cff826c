// The routed experts' products over f32 inputs (`--f32-activations`, and float weights):
// y[p] = W_e x[p / x_div] with one invocation per (pair, output row), no reduction or barrier
// (as matrix/rows.wgsl), each walking its row's blocks in order. Composed after a quant/*.wgsl
// fragment (bindings 0..1 for W, const QK, fn dq_block), load_x4.wgsl and experts/header.wgsl.
// group = wid.x + wid.y * groups_x; pair = group / row_groups.

// [n_pairs / x_div, cols]
@group(0) @binding(2) var<storage, read> x: array<f32>;
// [n_pairs, rows]
@group(0) @binding(3) var<storage, read_write> y: array<f32>;

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
