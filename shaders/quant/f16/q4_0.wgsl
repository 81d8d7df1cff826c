enable f16;
// Q4_0 weights with native f16 arithmetic: the variant for adapters with SHADER_F16 (see
// ../q4_0.wgsl for the portable one and the shared interface: const QK, fn dq_block(row, blk,
// cols) -> array<vec4<f32>, 8>). `enable f16;` is this fragment's first line, and the
// composition puts this fragment first, so it is the first line of the module.
// The packed words of src/gpu/repack.rs are read through f16-typed views of the same bytes
// (naga's bitcast cannot change a value's width, so u32 -> vec2<f16> is not expressible).
// Block (ggml): w = d * (q - 8). q - 8 is an integer in [-8, 7], exact in f16; the product
// d * (q - 8) is computed in f16 and rounds once; the matvec accumulates in f32.

const QK: u32 = 32u;

// [rows, cols / 32, 4] words: the block's 16 code bytes, little-endian.
@group(0) @binding(0) var<storage, read> wq: array<u32>;
// [ceil(rows * cols / 32 / 2) * 2] halves: block g's scale d is half g.
@group(0) @binding(1) var<storage, read> ws: array<f16>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK) + blk;
    let d = ws[g];
    let shifts = vec4<u32>(0u, 8u, 16u, 24u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let w = vec4<u32>(wq[g * 4u + k]) >> shifts;
        let lo = vec4<f16>(w & vec4<u32>(0xFu)) - 8.0h;
        let hi = vec4<f16>((w >> vec4<u32>(4u)) & vec4<u32>(0xFu)) - 8.0h;
        out[k] = vec4<f32>(d * lo);
        out[k + 4u] = vec4<f32>(d * hi);
    }
    return out;
}
