// Residual add in place: x += y (twin of kernels-ref's ops::add). Standalone module.
// One invocation per element; 2-D dispatch as in matvec.wgsl.

override WG: u32 = 64u;

struct ElementwiseParams {
    n: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // unused here (the gated units' activation)
    act: u32,
    pad1: u32,
}

// [n]
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
// [n]
@group(0) @binding(1) var<storage, read> y: array<f32>;
@group(0) @binding(2) var<uniform> P: ElementwiseParams;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * P.groups_x) * WG + lid;
    if (i >= P.n) {
        return;
    }
    x[i] = x[i] + y[i];
}
