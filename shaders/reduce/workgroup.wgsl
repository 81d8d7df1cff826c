// Workgroup sum through workgroup memory: the portable reduction (no subgroups needed).
// Interface (shared with reduce/subgroup.wgsl):
//   override WG: u32                 workgroup size (a power of two, at most MAX_WG)
//   fn wg_sum(v: f32, lid: u32) -> f32
//       sum of `v` over the workgroup, returned to every invocation. Call it from uniform
//       control flow; it may be called again right after it returns.
//   fn wg_max(v: f32, lid: u32) -> f32
//       maximum of `v` over the workgroup, with the same rules as wg_sum.

override WG: u32 = 64u;
const MAX_WG: u32 = 256u;

// [WG] partial sums
var<workgroup> red: array<f32, MAX_WG>;

fn wg_sum(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] += red[lid + s];
        }
        workgroupBarrier();
    }
    let total = red[0];
    // Everyone has read red[0] before the next call overwrites it.
    workgroupBarrier();
    return total;
}

fn wg_max(v: f32, lid: u32) -> f32 {
    red[lid] = v;
    workgroupBarrier();
    for (var s = WG / 2u; s > 0u; s >>= 1u) {
        if (lid < s) {
            red[lid] = max(red[lid], red[lid + s]);
        }
        workgroupBarrier();
    }
    let m = red[0];
    // Everyone has read red[0] before the next call overwrites it.
    workgroupBarrier();
    return m;
}
