// Residual add in place: x += scale * y (twin of kernels-ref's ops::add, and of add_scaled
// for a scale other than 1), or in its scale mode x *= scale (kernels-ref's ops::scale), with
// y bound but not read. Standalone module. One invocation per element; 2-D dispatch as in
// matrix/reduce.wgsl.

override WG: u32 = 64u;

struct ElementwiseParams {
    n: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // 0: x += scale * y; 1: x *= scale
    act: u32,
    // 1 for a plain add: 1 * y is y exactly, so the sum is x + y's
    scale: f32,
}

// [n]
@group(0) @binding(0) var<storage, read_write> x: array<f32>;
// [n] (not read in the scale mode: any buffer other than x)
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
    if (P.act == 1u) {
        x[i] = P.scale * x[i];
        return;
    }
    // The product is its own statement so that it is rounded before the add (as ggml's
    // ggml_scale then ggml_add); a compiler may still contract it into a fused multiply-add,
    // which the selftest's tolerance for a scale other than 1 allows.
    let sy = P.scale * y[i];
    x[i] = x[i] + sy;
}
