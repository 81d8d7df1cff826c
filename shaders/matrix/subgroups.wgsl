// Matrix layout for adapters with subgroups: the grid of reduce.wgsl (ROWS rows per workgroup
// and token) with each row summed by one subgroup: its lanes stride over the row's blocks and
// subgroupAdd totals them, so no workgroup memory or barrier sits between a row's loads and
// its result, and a workgroup has as many rows in flight as it has subgroups. Composed after
// a body (P, fn row_partial, fn store_y); the 8-bit decode layout of GPUs.
// The host sets ROWS to WG / the adapter's smallest subgroup size (src/gpu/kernels/mod.rs
// `matvec_q8_rows_per_group`); subgroups claim row slots from a counter rather than assume
// how invocations map to subgroups, and with larger subgroups than that each takes several
// rows in turn.

override WG: u32 = 64u;

// Rows per workgroup.
override ROWS: u32 = 8u;

// Row slots handed out to this workgroup's subgroups.
var<workgroup> n_slots: atomic<u32>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sg: u32,
) {
    if (lid == 0u) {
        atomicStore(&n_slots, 0u);
    }
    workgroupBarrier();
    var claimed = 0u;
    if (lane == 0u) {
        claimed = atomicAdd(&n_slots, 1u);
    }
    // Every lane of a subgroup takes its lane 0's slot: rows are uniform per subgroup.
    let slot = subgroupBroadcast(claimed, 0u);
    let n_subgroups = (WG + sg - 1u) / sg;
    let group = wid.x + wid.y * P.groups_x;
    let t = group / P.row_groups;
    // Surplus workgroups of a 2-D dispatch: the whole workgroup leaves together.
    if (t >= P.n_tokens) {
        return;
    }
    let row0 = (group % P.row_groups) * ROWS;
    for (var r = slot; r < ROWS; r += n_subgroups) {
        let row = row0 + r;
        if (row >= P.rows) {
            break;
        }
        let total = subgroupAdd(row_partial(t, row, lane, sg));
        if (lane == 0u) {
            store_y(t, row, total);
        }
    }
}
