// F32 weights, stored as their bit patterns (see src/gpu/repack.rs). Same interface as
// q4_0.wgsl: const QK, fn dq_block(row, blk, cols) -> array<vec4<f32>, 8>. A "block" is 32
// consecutive columns; the last block of a row may be partial (columns >= cols read as 0).

const QK: u32 = 32u;

// [rows, cols] words, row-major.
@group(0) @binding(0) var<storage, read> wq: array<u32>;

fn dq_block(row: u32, blk: u32, cols: u32) -> array<vec4<f32>, 8> {
    let base = row * cols;
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let c = blk * QK + 4u * k;
        var v = vec4<f32>(0.0);
        for (var j = 0u; j < 4u; j++) {
            if (c + j < cols) {
                v[j] = bitcast<f32>(wq[base + c + j]);
            }
        }
        out[k] = v;
    }
    return out;
}
