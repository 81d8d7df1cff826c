enable f16;
// F16 weights read as native f16 (see f16/q4_0.wgsl for the conventions and ../f16.wgsl for the
// portable variant, which decodes with unpack2x16float). Widening f16 to f32 is exact.

const QK: u32 = 32u;

// [rows, ceil(cols / 2)] pairs: element c of a row is component (c & 1) of pair c / 2; an odd
// row is padded with a zero half so every row starts on a pair.
@group(0) @binding(0) var<storage, read> wq: array<vec2<f16>>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let base = row * ((cols + 1u) / 2u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let c = blk * QK + 4u * k; // even, so the 4 elements are 2 whole pairs
        if (c + 3u < cols) {
            let i = base + c / 2u;
            out[k] = vec4<f32>(vec4<f16>(wq[i], wq[i + 1u]));
        } else {
            var v = vec4<f32>(0.0);
            for (var j = 0u; j < 4u; j++) {
                if (c + j < cols) {
                    v[j] = f32(wq[base + (c + j) / 2u][(c + j) & 1u]);
                }
            }
            out[k] = v;
        }
    }
    return out;
}
