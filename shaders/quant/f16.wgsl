// F16 weights, stored as packed f16 pairs (see src/gpu/repack.rs). Same interface as
// q4_0.wgsl: const QK, fn dq_block(row, blk, cols) -> array<vec4<f32>, 8>. A "block" is 32
// consecutive columns; the last block of a row may be partial (columns >= cols read as 0).

const QK: u32 = 32u;

// [rows, ceil(cols / 2)] words: element c of a row is half (c & 1) of word c / 2; an odd row
// is padded with a zero half so every row starts on a word.
@group(0) @binding(0) var<storage, read> wq: array<u32>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let base = row * ((cols + 1u) / 2u);
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let c = blk * QK + 4u * k; // even, so the 4 elements are 2 whole words
        if (c + 3u < cols) {
            let i = base + c / 2u;
            out[k] = vec4<f32>(unpack2x16float(wq[i]), unpack2x16float(wq[i + 1u]));
        } else {
            var v = vec4<f32>(0.0);
            for (var j = 0u; j < 4u; j++) {
                if (c + j < cols) {
                    v[j] = unpack2x16float(wq[base + (c + j) / 2u])[(c + j) & 1u];
                }
            }
            out[k] = v;
        }
    }
    return out;
}
