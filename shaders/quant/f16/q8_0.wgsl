enable f16;
// Q8_0 weights with native f16 arithmetic (see f16/q4_0.wgsl for the conventions and
// ../q8_0.wgsl for the portable variant). Block (ggml): w = d * q, q a signed byte (exact in
// f16); d * q is computed in f16 and rounds once.

const QK: u32 = 32u;

// [rows, cols / 32, 8] words: the block's 32 code bytes, little-endian.
@group(0) @binding(0) var<storage, read> wq: array<u32>;
// [ceil(rows * cols / 32 / 2) * 2] halves: block g's scale d is half g.
@group(0) @binding(1) var<storage, read> ws: array<f16>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let g = row * (cols / QK) + blk;
    let d = ws[g];
    // Shift each byte to the top, then arithmetic-shift down to sign-extend it.
    let up = vec4<u32>(24u, 16u, 8u, 0u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let w = vec4<i32>(bitcast<i32>(wq[g * 8u + k]));
        out[k] = vec4<f32>(d * vec4<f16>((w << up) >> vec4<u32>(24u)));
    }
    return out;
}
