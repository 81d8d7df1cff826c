// The 8-bit activations every integer kernel reads (quantize_act.wgsl's output) and a
// chunk's dot product with them (alone, or one activation chunk with four rows' chunks), so
// that every such kernel (the 8-bit matrix body matrix/q8.wgsl's layouts, the routed experts' experts_q8.wgsl) gives a
// chunk the CPU's sum.
// Composed after quant/chunk.wgsl and a quant/*.wgsl fragment with an integer path (bindings
// 0..1 for W, fn dq_chunk).

// [n_tokens, cols / 16] vec4 of words of four int8 codes each (quantize_act.wgsl writes them
// as u32, byte 0 first): chunk ci is qx[2 ci], qx[2 ci + 1]. Read as vec4: llvmpipe loads a
// storage word lane by lane, and two vec4 loads cost less than eight u32 loads
// (benches/gpu_load_paths.rs); a discrete GPU takes them as two 16-byte loads.
@group(0) @binding(2) var<storage, read> qx: array<vec4<u32>>;
// [n_tokens, cols / 32]: (d, d * Σq half 0, d * Σq half 1, d * Σq)
@group(0) @binding(3) var<storage, read> qd: array<vec4<f32>>;

// Chunk `ch` (chunk b of a row) dotted with chunk ci = t * blocks_per_row + b of qx/qd: exact
// i32 half sums, then the CPU's f32 operations in its order (src/cpu/scalar.rs `dot_q_row`):
// (dw * d_x) * isum, then + c0 * xs0, then + c1 * xs1.
fn chunk_dot(ch: QChunk, ci: u32) -> f32 {
    let xa = qx[ci * 2u];
    let xb = qx[ci * 2u + 1u];
    var s0 = 0;
    var s1 = 0;
    for (var k = 0u; k < 4u; k++) {
        s0 += dot_i8x4(ch.u[k], xa[k]);
        s1 += dot_i8x4(ch.u[k + 4u], xb[k]);
    }
    let xd = qd[ci];
    return ch.dw * xd.x * f32(ch.mul.x * s0 + ch.mul.y * s1) + ch.c.x * xd.y + ch.c.y * xd.z;
}

// Chunk `ch` dotted with one token's chunk (codes x0..x7, scales xd = (d, d Σq half 0,
// d Σq half 1)): `chunk_dot` (exact i32 half sums, then the same f32 operations in the same
// order).
fn xdot(
    ch: QChunk,
    x0: vec4<i32>, x1: vec4<i32>, x2: vec4<i32>, x3: vec4<i32>,
    x4: vec4<i32>, x5: vec4<i32>, x6: vec4<i32>, x7: vec4<i32>,
    xd: vec3<f32>,
) -> f32 {
    let s0 = dot(i8x4(ch.u[0]), x0) + dot(i8x4(ch.u[1]), x1) + dot(i8x4(ch.u[2]), x2)
        + dot(i8x4(ch.u[3]), x3);
    let s1 = dot(i8x4(ch.u[4]), x4) + dot(i8x4(ch.u[5]), x5) + dot(i8x4(ch.u[6]), x6)
        + dot(i8x4(ch.u[7]), x7);
    return ch.dw * xd.x * f32(ch.mul.x * s0 + ch.mul.y * s1) + ch.c.x * xd.y + ch.c.y * xd.z;
}

// The four rows' chunks dotted with one token's activation chunk (code words qa = qx[2 ci],
// qb = qx[2 ci + 1], scales xd = qd[ci].xyz; the fourth, d Σq, is not used): each activation
// word is sign-extended once for the four rows.
fn tok4(c0: QChunk, c1: QChunk, c2: QChunk, c3: QChunk, qa: vec4<u32>, qb: vec4<u32>, xd: vec3<f32>) -> vec4<f32> {
    let x0 = i8x4(qa.x);
    let x1 = i8x4(qa.y);
    let x2 = i8x4(qa.z);
    let x3 = i8x4(qa.w);
    let x4 = i8x4(qb.x);
    let x5 = i8x4(qb.y);
    let x6 = i8x4(qb.z);
    let x7 = i8x4(qb.w);
    return vec4<f32>(
        xdot(c0, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c1, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c2, x0, x1, x2, x3, x4, x5, x6, x7, xd),
        xdot(c3, x0, x1, x2, x3, x4, x5, x6, x7, xd),
    );
}

// tok4 of chunk ci of qx / qd, loaded here (three scalar scale loads: the fourth component is
// not used).
fn tok4_at(c0: QChunk, c1: QChunk, c2: QChunk, c3: QChunk, ci: u32) -> vec4<f32> {
    let xd = vec3<f32>(qd[ci].x, qd[ci].y, qd[ci].z);
    return tok4(c0, c1, c2, c3, qx[ci * 2u], qx[ci * 2u + 1u], xd);
}
