// Q4_1 weights, repacked at upload (see src/gpu/repack.rs). Same interface as q4_0.wgsl:
// const QK, fn dq_block(row, blk, cols) -> array<vec4<f32>, 8>.
// Block (ggml): w = d * q + m, q a 4-bit code; elements 0..15 are the low nibbles of the 16
// code bytes, elements 16..31 their high nibbles.

const QK: u32 = 32u;

// [rows, cols / 32] vec4 of words: the block's 16 code bytes, little-endian. One vec4 load
// per block: llvmpipe loads a storage word lane by lane, and one vec4 load costs less than
// four u32 loads (benches/gpu_load_paths).
@group(0) @binding(0) var<storage, read> wq: array<vec4<u32>>;
// [rows * cols / 32] words: block g's (d, m) as two f16, d in the low half.
@group(0) @binding(1) var<storage, read> ws: array<u32>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK) + blk;
    let dm = unpack2x16float(ws[g]);
    let shifts = vec4<u32>(0u, 8u, 16u, 24u);
    let w4 = wq[g];
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        let w = vec4<u32>(w4[k]) >> shifts;
        out[k] = dm.x * vec4<f32>(w & vec4<u32>(0xFu)) + dm.y;
        out[k + 4u] = dm.x * vec4<f32>((w >> vec4<u32>(4u)) & vec4<u32>(0xFu)) + dm.y;
    }
    return out;
}

// Integer path (shaders/quant/chunk.wgsl): u = the 4-bit codes, mul = 1, dw = d, c = m
// (src/cpu/formats.rs Q4_1); nibbles as in q4_0.wgsl.
fn dq_chunk(row: u32, chunk: u32, cols: u32) -> QChunk {
    let g = row * (cols / QK) + chunk;
    let dm = unpack2x16float(ws[g]);
    let w = wq[g];
    let lo = w & vec4<u32>(0x0F0F0F0Fu);
    let hi = (w >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    var ch: QChunk;
    ch.u = array<u32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    ch.mul = vec2<i32>(1);
    ch.dw = dm.x;
    ch.c = vec2<f32>(dm.y);
    return ch;
}
