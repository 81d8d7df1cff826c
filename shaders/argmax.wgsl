// Index of the largest entry of each row, ties to the lowest index (greedy decoding); NaN
// entries are never chosen, and a row of only NaN gives 0xffffffff. Composed after
// reduce/workgroup.wgsl for override WG and MAX_WG (wg_sum is unused).
// One workgroup per row; 2-D dispatch as in matrix/reduce.wgsl.

struct RowParams {
    // row length
    n: u32,
    n_rows: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    pad0: u32,
}

// [n_rows, n]
@group(0) @binding(0) var<storage, read> x: array<f32>;
// [n_rows]
@group(0) @binding(1) var<storage, read_write> out: array<u32>;
@group(0) @binding(2) var<uniform> P: RowParams;

const NONE: u32 = 0xffffffffu;

// [WG] best value and its index per invocation
var<workgroup> best_v: array<f32, MAX_WG>;
var<workgroup> best_i: array<u32, MAX_WG>;

// Whether (v, i) beats (bv, bi): larger value, or equal value at a lower index.
fn beats(v: f32, i: u32, bv: f32, bi: u32) -> bool {
    if (i == NONE) {
        return false;
    }
    return bi == NONE || v > bv || (v == bv && i < bi);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let row = wid.x + wid.y * P.groups_x;
    // Uniform over the workgroup, so no invocation is left waiting at a barrier.
    if (row >= P.n_rows) {
        return;
    }
    let base = row * P.n;
    var bv = 0.0;
    var bi = NONE;
    // Indices rise along each invocation's stride, so a strict `>` keeps the lowest of ties.
    for (var i = lid; i < P.n; i += WG) {
        let v = x[base + i];
        // v == v is false only for NaN.
        if (v == v && (bi == NONE || v > bv)) {
            bv = v;
            bi = i;
        }
    }
    best_v[lid] = bv;
    best_i[lid] = bi;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s && beats(best_v[lid + s], best_i[lid + s], best_v[lid], best_i[lid])) {
            best_v[lid] = best_v[lid + s];
            best_i[lid] = best_i[lid + s];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        out[row] = best_i[0];
    }
}
