// Workgroup sum with subgroupAdd: the variant used where the adapter has SUBGROUP. Same
// interface as reduce/workgroup.wgsl (override WG, fn wg_sum(v, lid) -> f32,
// fn wg_max(v, lid) -> f32).
// No subgroup size is assumed: each subgroup's elected invocation claims the next free slot,
// so any number of subgroups (up to WG, for a subgroup size of 1) fits.

override WG: u32 = 64u;
const MAX_WG: u32 = 256u;

// [number of subgroups] subgroup sums
var<workgroup> red: array<f32, MAX_WG>;
// slots of `red` in use
var<workgroup> n_red: atomic<u32>;

fn wg_sum(v: f32, lid: u32) -> f32 {
    if (lid == 0u) {
        atomicStore(&n_red, 0u);
    }
    workgroupBarrier();
    let s = subgroupAdd(v);
    // The lowest active invocation of each subgroup (naga has no subgroupElect yet).
    if (subgroupExclusiveAdd(1u) == 0u) {
        red[atomicAdd(&n_red, 1u)] = s;
    }
    workgroupBarrier();
    let n = atomicLoad(&n_red);
    var total = 0.0;
    for (var i = 0u; i < n; i++) {
        total += red[i];
    }
    // Everyone has read `red` before the next call overwrites it.
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, lid: u32) -> f32 {
    if (lid == 0u) {
        atomicStore(&n_red, 0u);
    }
    workgroupBarrier();
    let s = subgroupMax(v);
    if (subgroupExclusiveAdd(1u) == 0u) {
        red[atomicAdd(&n_red, 1u)] = s;
    }
    workgroupBarrier();
    let n = atomicLoad(&n_red);
    var m = red[0];
    for (var i = 1u; i < n; i++) {
        m = max(m, red[i]);
    }
    // Everyone has read `red` before the next call overwrites it.
    workgroupBarrier();
    return m;
}
