// Compute-throughput probe (the roofline's horizontal ceiling): every invocation runs 2
// independent vec4 fma chains (8 independent fmas per iteration) for P.iters iterations, no
// memory traffic in the loop, and writes one sum (so the chains cannot be optimised away).
// Independent fmas hide the fma latency; on a GPU the other resident invocations do too. Only
// 2 chains: llvmpipe runs 8 invocations per 256-bit SIMD register, so each vec4 takes 4
// registers and 8 chains (32 registers) spilled, measuring the spills (1.7 vs 4.8 GFLOP/s on
// lavapipe, measured back to back). The multiplier and addend come from the uniform, so the
// compiler cannot fold the loop. FLOPs per invocation: iters * 2 chains * 4 lanes * 2 (an fma
// counts as two).

struct FlopsParams {
    // loop iterations per invocation
    iters: u32,
    // fma multiplier (|a| < 1 keeps the chains bounded) and addend
    a: f32,
    b: f32,
    // workgroups along x in the dispatch (1-D here; the rows of a 2-D grid otherwise)
    groups_x: u32,
}

// [n_groups * 64] f32: one sum per invocation
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@group(0) @binding(1) var<uniform> P: FlopsParams;

@compute @workgroup_size(64)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * P.groups_x;
    let s = f32(lid) * 0.001;
    let a = vec4<f32>(P.a);
    let b = vec4<f32>(P.b);
    var c0 = vec4<f32>(s, s + 0.01, s + 0.02, s + 0.03);
    var c1 = c0 + 0.1;
    for (var i = 0u; i < P.iters; i++) {
        c0 = fma(c0, a, b);
        c1 = fma(c1, a, b);
    }
    let t = c0 + c1;
    out[g * 64u + lid] = t.x + t.y + t.z + t.w;
}
