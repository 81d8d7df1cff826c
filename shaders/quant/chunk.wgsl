// The integer chunk model shared by the quantized weight fragments (twin of src/cpu/formats.rs
// `Chunk`): composed before every quant/*.wgsl fragment that has an integer path, whose
// `fn dq_chunk(row, chunk, cols) -> QChunk` returns chunk `chunk` (32 columns) of `row` as
//   w[i] = dw * mul[i / 16] * u[i] + c[i / 16]
// so that with activations x[i] ~ d_x * q[i] (shaders/quantize_act.wgsl) the chunk's dot product
// is dw * d_x * (mul[0] * s0 + mul[1] * s1) + c[0] * xs0 + c[1] * xs1, where s_h = Σ u * q over
// half h is exact in i32 and xs_h = d_x * Σ q over half h.
// K-quants fit as: mul = the two halves' sub-block scales, c = -dmin * m (or -32 * d * scale).

struct QChunk {
    // [8] words: element 4k + j is byte j of word k, an 8-bit two's-complement code. Unsigned
    // formats' codes (0..=63) are below 128, so reading every byte as signed is exact for all.
    u: array<u32, 8>,
    // integer multiplier of elements 0..16 (x) and 16..32 (y)
    mul: vec2<i32>,
    // float scale of the chunk
    dw: f32,
    // float offset added to every weight of half 0 (x) and half 1 (y)
    c: vec2<f32>,
}

// The four bytes of `w` as signed integers, byte 0 first.
fn i8x4(w: u32) -> vec4<i32> {
    // Shift each byte to the top, then arithmetic-shift down to sign-extend it.
    return (vec4<i32>(bitcast<i32>(w)) << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u);
}

// Exact dot product of two words of four signed bytes (|result| <= 4 * 128 * 128).
fn dot_i8x4(a: u32, b: u32) -> i32 {
    return dot(i8x4(a), i8x4(b));
}
