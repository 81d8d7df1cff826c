// Q4_0 weights, repacked at upload (see src/gpu/repack.rs).
// Shared dequant interface (every shaders/quant/*.wgsl gives the same):
//   const QK: u32                      elements per block
//   fn dq_block(row, blk, cols) -> array<vec4<f32>, 8>
//                                      the 32 weights of block `blk` of `row`, in column order;
//                                      columns >= cols read as 0
// and, for the formats with an integer path (q4_0, q4_1, q8_0, q4_k, q6_k; composed after
// chunk.wgsl):
//   fn dq_chunk(row, chunk, cols) -> QChunk
//                                      chunk `chunk` (32 columns) of `row` in the integer
//                                      chunk model of src/cpu/formats.rs
// Block (ggml): w = d * (q - 8), q a 4-bit code; elements 0..15 are the low nibbles of the 16
// code bytes, elements 16..31 their high nibbles.

const QK: u32 = 32u;

// [rows, cols / 32] vec4 of words: the block's 16 code bytes, little-endian (one vec4 load
// per block, as in q4_1.wgsl).
@group(0) @binding(0) var<storage, read> wq: array<vec4<u32>>;
// [ceil(rows * cols / 32 / 2)] words: block g's f16 scale d is half (g & 1) of word g / 2.
@group(0) @binding(1) var<storage, read> ws: array<u32>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK) + blk;
    let d = unpack2x16float(ws[g >> 1u])[g & 1u];
    let shifts = vec4<u32>(0u, 8u, 16u, 24u);
    let w4 = wq[g];
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let w = vec4<u32>(w4[k]) >> shifts;
        out[k] = d * (vec4<f32>(w & vec4<u32>(0xFu)) - 8.0);
        out[k + 4u] = d * (vec4<f32>((w >> vec4<u32>(4u)) & vec4<u32>(0xFu)) - 8.0);
    }
    return out;
}

// Integer path (shaders/quant/chunk.wgsl): u = the 4-bit codes, mul = 1, dw = d, c = -8 d
// (src/cpu/formats.rs Q4_0). The low nibbles of code word k are elements 4k..4k+3, the high
// nibbles elements 16+4k..; masking keeps each nibble in its own byte.
fn dq_chunk(row: u32, chunk: u32, cols: u32) -> QChunk {
    let g = row * (cols / QK) + chunk;
    let d = unpack2x16float(ws[g >> 1u])[g & 1u];
    let w = wq[g];
    let lo = w & vec4<u32>(0x0F0F0F0Fu);
    let hi = (w >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    var ch: QChunk;
    ch.u = array<u32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    ch.mul = vec2<i32>(1);
    ch.dw = d;
    ch.c = vec2<f32>(-8.0 * d);
    return ch;
}
