// Q4_K weights, repacked at upload (see src/gpu/repack.rs). Same interface as q4_0.wgsl:
// const QK, fn dq_block(row, blk, cols) -> array<vec4<f32>, 8>, a "block" being 32 columns:
// one of the 8 sub-blocks of a 256-column super-block.
// Super-block (ggml block_q4_K): w = d * sc_j * q - dmin * m_j for sub-block j, q a 4-bit code,
// (sc_j, m_j) 6-bit values packed in 12 bytes (ggml's get_scale_min_k4). Code bytes come in 4
// chunks of 32: sub-block 2i takes the low nibbles of chunk i, sub-block 2i + 1 the high ones.
// Every product here is exact in f32 (d and dmin are f16: 11 significant bits; sc, m < 64;
// q < 16), so the one rounding is the final subtraction's, with or without fma contraction:
// the result equals kernels-ref's bit for bit.

const QK: u32 = 32u;
const QK_K: u32 = 256u;

// [rows, cols / 256, 32] words: the super-block's 128 code bytes, little-endian.
@group(0) @binding(0) var<storage, read> wq: array<u32>;
// [rows, cols / 256, 4] words: word 0 = (d, dmin) as two f16, d in the low half; words 1..3 =
// the 12 packed scale bytes, little-endian.
@group(0) @binding(1) var<storage, read> ws: array<u32>;

// Byte i (0..12) of super-block g's packed scales.
fn q4k_scale_byte(g: u32, i: u32) -> u32 {
    return (ws[g * 4u + 1u + i / 4u] >> (8u * (i % 4u))) & 0xFFu;
}

// Sub-block j's 6-bit (scale, min) of super-block g (ggml's get_scale_min_k4).
fn q4k_scale_min(g: u32, j: u32) -> vec2<u32> {
    if (j < 4u) {
        return vec2<u32>(q4k_scale_byte(g, j) & 63u, q4k_scale_byte(g, j + 4u) & 63u);
    }
    let hi = q4k_scale_byte(g, j + 4u);
    return vec2<u32>(
        (hi & 0xFu) | ((q4k_scale_byte(g, j - 4u) >> 6u) << 4u),
        (hi >> 4u) | ((q4k_scale_byte(g, j) >> 6u) << 4u),
    );
}

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK_K) + blk / 8u;
    let j = blk % 8u;
    let dm = unpack2x16float(ws[g * 4u]);
    let sm = q4k_scale_min(g, j);
    let dl = dm.x * f32(sm.x);
    let ml = dm.y * f32(sm.y);
    // Chunk j / 2 of the code bytes (8 words), nibble j % 2.
    let base = g * 32u + (j / 2u) * 8u;
    let shifts = vec4<u32>(0u, 8u, 16u, 24u) + vec4<u32>(4u * (j % 2u));
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let q = (vec4<u32>(wq[base + k]) >> shifts) & vec4<u32>(0xFu);
        out[k] = dl * vec4<f32>(q) - ml;
    }
    return out;
}

// Integer path (shaders/quant/chunk.wgsl): chunk j of a super-block is sub-block j, so
// u = its 4-bit codes, mul = sc_j for both halves, dw = d, c = -dmin * m_j
// (src/cpu/formats.rs Q4_K). Masking the shifted code words keeps each nibble in its byte.
fn dq_chunk(row: u32, chunk: u32, cols: u32) -> QChunk {
    let g = row * (cols / QK_K) + chunk / 8u;
    let j = chunk % 8u;
    let dm = unpack2x16float(ws[g * 4u]);
    let sm = q4k_scale_min(g, j);
    let base = g * 32u + (j / 2u) * 8u;
    let shift = 4u * (j % 2u);
    var ch: QChunk;
    for (var k = 0u; k < 8u; k++) {
        ch.u[k] = (wq[base + k] >> shift) & 0x0F0F0F0Fu;
    }
    ch.mul = vec2<i32>(i32(sm.x));
    ch.dw = dm.x;
    ch.c = vec2<f32>(-dm.y * f32(sm.y));
    return ch;
}
