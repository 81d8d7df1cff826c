// Q6_K weights, repacked at upload (see src/gpu/repack.rs). Same interface as q4_0.wgsl:
// const QK, fn dq_block(row, blk, cols) -> array<vec4<f32>, 8>, a "block" being 32 columns:
// one of the 8 quarters of a 256-column super-block.
// Super-block (ggml block_q6_K): w = d * sc_s * (q - 32) for 16-column sub-block s, sc_s a
// signed byte, q a 6-bit code: 4 low bits in ql (128 bytes), 2 high bits in qh (64 bytes).
// Each half of 128 columns uses 64 bytes of ql and 32 of qh; its quarter jj (32 columns)
// takes nibble jj / 2 of ql[32 * (jj % 2) + l] and bits 2 jj..2 jj + 1 of qh[l].
// d * sc * (q - 32) is exact in f32 (11 + 7 + 5 significant bits), so the result equals
// kernels-ref's bit for bit.

const QK: u32 = 32u;
const QK_K: u32 = 256u;

// [rows, cols / 256, 48] words: ql (32 words) then qh (16 words), little-endian.
@group(0) @binding(0) var<storage, read> wq: array<u32>;
// [ceil(rows * cols / 256 / 2), 9] words, super-blocks in pairs: words 0..4 = the 16 signed
// scale bytes of super-block 2p, words 4..8 those of 2p + 1, word 8 = their f16 d's (2p in the
// low half).
@group(0) @binding(1) var<storage, read> ws: array<u32>;

// Super-block g's f16 scale d.
fn q6k_d(g: u32) -> f32 {
    return unpack2x16float(ws[(g / 2u) * 9u + 8u])[g & 1u];
}

// The signed scales of sub-blocks 2j and 2j + 1 of super-block g: bytes 2j, 2j + 1 of its 16,
// shifted to the top and arithmetic-shifted down to sign-extend them.
fn q6k_scales(g: u32, j: u32) -> vec2<i32> {
    let sw = bitcast<i32>(ws[(g / 2u) * 9u + (g & 1u) * 4u + j / 2u]);
    let b = 16u * (j % 2u);
    return vec2<i32>((sw << (24u - b)) >> 24u, (sw << (16u - b)) >> 24u);
}

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK_K) + blk / 8u;
    let j = blk % 8u;
    let d = q6k_d(g);
    let sc = vec2<f32>(q6k_scales(g, j));
    let sc0 = sc.x;
    let sc1 = sc.y;
    let half = j / 4u;
    let jj = j % 4u;
    let ql = g * 48u + half * 16u + (jj % 2u) * 8u;
    let qh = g * 48u + 32u + half * 8u;
    let shifts = vec4<u32>(0u, 8u, 16u, 24u);
    let lo_shift = shifts + vec4<u32>(4u * (jj / 2u));
    let hi_shift = shifts + vec4<u32>(2u * jj);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let lo = (vec4<u32>(wq[ql + k]) >> lo_shift) & vec4<u32>(0xFu);
        let hi = (vec4<u32>(wq[qh + k]) >> hi_shift) & vec4<u32>(3u);
        let q = vec4<f32>(vec4<i32>(lo | (hi << vec4<u32>(4u)))) - 32.0;
        // Columns 0..15 (k < 4) are sub-block 2j, 16..31 sub-block 2j + 1.
        let dl = d * select(sc1, sc0, k < 4u);
        out[k] = dl * q;
    }
    return out;
}

// Integer path (shaders/quant/chunk.wgsl): u = the 6-bit codes (0..63), mul = the two
// 16-column sub-blocks' signed scales, dw = d, c = -32 d sc per half (src/cpu/formats.rs Q6_K).
fn dq_chunk(row: u32, chunk: u32, cols: u32) -> QChunk {
    let g = row * (cols / QK_K) + chunk / 8u;
    let j = chunk % 8u;
    let d = q6k_d(g);
    let sc = q6k_scales(g, j);
    let sc0 = sc.x;
    let sc1 = sc.y;
    let half = j / 4u;
    let jj = j % 4u;
    let ql = g * 48u + half * 16u + (jj % 2u) * 8u;
    let qh = g * 48u + 32u + half * 8u;
    let lo_shift = 4u * (jj / 2u);
    let hi_shift = 2u * jj;
    var ch: QChunk;
    for (var k = 0u; k < 8u; k++) {
        let lo = (wq[ql + k] >> lo_shift) & 0x0F0F0F0Fu;
        let hi = (wq[qh + k] >> hi_shift) & 0x03030303u;
        ch.u[k] = lo | (hi << 4u);
    }
    ch.mul = vec2<i32>(sc0, sc1);
    ch.dw = d;
    ch.c = vec2<f32>(-32.0 * d * f32(sc0), -32.0 * d * f32(sc1));
    return ch;
}
