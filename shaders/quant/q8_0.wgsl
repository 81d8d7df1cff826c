// Q8_0 weights, repacked at upload (see src/gpu/repack.rs). Same interface as q4_0.wgsl:
// const QK, fn dq_block(row, blk, cols) -> array<vec4<f32>, 8>.
// Block (ggml): w = d * q, q a signed byte; element i is byte i.

const QK: u32 = 32u;

// [rows, cols / 32, 2] vec4 of words: the block's 32 code bytes, little-endian (two vec4
// loads per block, as in q4_1.wgsl).
@group(0) @binding(0) var<storage, read> wq: array<vec4<u32>>;
// [ceil(rows * cols / 32 / 2)] words: block g's f16 scale d is half (g & 1) of word g / 2.
@group(0) @binding(1) var<storage, read> ws: array<u32>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK) + blk;
    let d = unpack2x16float(ws[g >> 1u])[g & 1u];
    // Both vec4 loaded once, as in dq_chunk: indexing wq inside the loop would load a whole
    // vec4 per word (llvmpipe loads a storage word lane by lane).
    let a = wq[g * 2u];
    let b = wq[g * 2u + 1u];
    // Shift each byte to the top, then arithmetic-shift down to sign-extend it.
    let up = vec4<u32>(24u, 16u, 8u, 0u);
    let down = vec4<u32>(24u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 4u; k++) {
        out[k] = d * vec4<f32>((vec4<i32>(bitcast<i32>(a[k])) << up) >> down);
        out[k + 4u] = d * vec4<f32>((vec4<i32>(bitcast<i32>(b[k])) << up) >> down);
    }
    return out;
}

// Integer path (shaders/quant/chunk.wgsl): u = the signed code bytes as stored, mul = 1,
// dw = d, c = 0 (src/cpu/formats.rs Q8_0).
fn dq_chunk(row: u32, chunk: u32, cols: u32) -> QChunk {
    let g = row * (cols / QK) + chunk;
    let a = wq[g * 2u];
    let b = wq[g * 2u + 1u];
    var ch: QChunk;
    ch.u = array<u32, 8>(a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w);
    ch.mul = vec2<i32>(1);
    ch.dw = unpack2x16float(ws[g >> 1u])[g & 1u];
    ch.c = vec2<f32>(0.0);
    return ch;
}
