// Memory bandwidth probe: reads a large buffer once and writes one partial sum per workgroup
// (the reduction keeps the reads from being optimised away and gives the selftest a result to
// check). Composed after reduce/workgroup.wgsl for override WG and fn wg_sum.
// Invocation t of T = n_groups * WG reads src[t], src[t + T], src[t + 2T], ... (consecutive
// invocations read consecutive vec4s: coalesced). 2-D dispatch as in matrix/reduce.wgsl; surplus
// workgroups of the last line return before any barrier (a whole workgroup: uniform).

struct ProbeParams {
    // vec4s in src
    n_vec4: u32,
    // workgroups that read (the outputs)
    n_groups: u32,
    // vec4s each invocation reads at most: ceil(n_vec4 / (n_groups * WG))
    per_thread: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
}

// [n_vec4] vec4<f32>
@group(0) @binding(0) var<storage, read> src: array<vec4<f32>>;
// [n_groups]
@group(0) @binding(1) var<storage, read_write> out: array<f32>;
@group(0) @binding(2) var<uniform> P: ProbeParams;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * P.groups_x;
    if (g >= P.n_groups) {
        return;
    }
    let stride = P.n_groups * WG;
    var acc = vec4<f32>(0.0);
    var i = g * WG + lid;
    for (var k = 0u; k < P.per_thread; k++) {
        if (i < P.n_vec4) {
            acc += src[i];
        }
        i += stride;
    }
    let s = wg_sum(acc.x + acc.y + acc.z + acc.w, lid);
    if (lid == 0u) {
        out[g] = s;
    }
}
