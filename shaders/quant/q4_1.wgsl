// Q4_1 weights, repacked at upload (see src/gpu/repack.rs). Same interface as q4_0.wgsl:
// const QK, fn dq_block(row, blk, cols) -> array<vec4<f32>, 8>.
// Block (ggml): w = d * q + m, q a 4-bit code; elements 0..15 are the low nibbles of the 16
// code bytes, elements 16..31 their high nibbles.

const QK: u32 = 32u;

// [rows, cols / 32, 4] words: the block's 16 code bytes, little-endian.
@group(0) @binding(0) var<storage, read> wq: array<u32>;
// [rows * cols / 32] words: block g's (d, m) as two f16, d in the low half.
@group(0) @binding(1) var<storage, read> ws: array<u32>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK) + blk;
    let dm = unpack2x16float(ws[g]);
    let shifts = vec4<u32>(0u, 8u, 16u, 24u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let w = vec4<u32>(wq[g * 4u + k]) >> shifts;
        out[k] = dm.x * vec4<f32>(w & vec4<u32>(0xFu)) + dm.y;
        out[k + 4u] = dm.x * vec4<f32>((w >> vec4<u32>(4u)) & vec4<u32>(0xFu)) + dm.y;
    }
    return out;
}
