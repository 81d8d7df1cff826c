// Matrix layout: ROWS consecutive rows per workgroup for one token, each row's blocks strided
// over the WG invocations and the partial sums added with wg_sum. The decode layout of GPUs
// (f32 and 8-bit bodies alike). Composed after a reduce/*.wgsl fragment (override WG,
// fn wg_sum) and a body (f32.wgsl, or q8.wgsl and an out/*.wgsl fragment: P, fn row_partial,
// fn store_y).
// Dispatch is 2-D when the number of workgroups exceeds the per-dimension limit:
// group = wid.x + wid.y * groups_x, and group = t * row_groups + row group. Several tokens
// make a batched matvec (small batches, where re-reading the weights per token is cheaper
// than a tiled matmul's staging).

// Rows per workgroup.
override ROWS: u32 = 2u;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let group = wid.x + wid.y * P.groups_x;
    let t = group / P.row_groups;
    // Surplus workgroups of a 2-D dispatch: the whole workgroup leaves together.
    if (t >= P.n_tokens) {
        return;
    }
    let row0 = (group % P.row_groups) * ROWS;
    for (var r = 0u; r < ROWS; r++) {
        // `row` is uniform over the workgroup, so every invocation reaches wg_sum.
        let row = row0 + r;
        var acc = 0.0;
        if (row < P.rows) {
            acc = row_partial(t, row, lid, WG);
        }
        let total = wg_sum(acc, lid);
        if (lid == 0u && row < P.rows) {
            store_y(t, row, total);
        }
    }
}
