enable f16;
// Q4_1 weights with native f16 arithmetic (see f16/q4_0.wgsl for the conventions and
// ../q4_1.wgsl for the portable variant). Block (ggml): w = d * q + m, q in [0, 15] (exact in
// f16); d * q + m is computed in f16 (two roundings, or one if contracted to an fma).

const QK: u32 = 32u;

// [rows, cols / 32, 4] words: the block's 16 code bytes, little-endian.
@group(0) @binding(0) var<storage, read> wq: array<u32>;
// [rows * cols / 32] (d, m) pairs.
@group(0) @binding(1) var<storage, read> ws: array<vec2<f16>>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK) + blk;
    let dm = ws[g];
    let shifts = vec4<u32>(0u, 8u, 16u, 24u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let w = vec4<u32>(wq[g * 4u + k]) >> shifts;
        let lo = vec4<f16>(w & vec4<u32>(0xFu));
        let hi = vec4<f16>((w >> vec4<u32>(4u)) & vec4<u32>(0xFu));
        out[k] = vec4<f32>(dm.x * lo + dm.y);
        out[k + 4u] = vec4<f32>(dm.x * hi + dm.y);
    }
    return out;
}
