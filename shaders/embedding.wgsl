// Embedding lookup: out[t] = W[ids[t]] as f32 (twin of kernels-ref's ops::embedding).
// Composed after reduce/workgroup.wgsl (for override WG; wg_sum is unused) and a quant/*.wgsl
// fragment (bindings 0..1 for W, const QK, fn dq_block). One workgroup per token, its
// invocations striding over the row's blocks; 2-D dispatch as in matvec.wgsl.
// An id past the table's end gives a row of zeros (the host cannot check ids that a previous
// kernel, e.g. argmax, wrote on the GPU; a shader must not read out of bounds).
// A table split by rows across bindings runs once per part: a part writes only the tokens
// whose id falls in its rows, and the part at row0 = 0 also writes the zero rows.

struct EmbeddingParams {
    // rows of this part
    rows: u32,
    cols: u32,
    n_tokens: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // first table row of this part
    row0: u32,
    // rows of the whole table
    total_rows: u32,
    pad0: u32,
    pad1: u32,
}

// [n_tokens]
@group(0) @binding(2) var<storage, read> ids: array<u32>;
// [n_tokens, cols]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> P: EmbeddingParams;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let t = wid.x + wid.y * P.groups_x;
    if (t >= P.n_tokens) {
        return;
    }
    let id = ids[t];
    let zero = id >= P.total_rows;
    if (zero && P.row0 != 0u) {
        return;
    }
    if (!zero && (id < P.row0 || id - P.row0 >= P.rows)) {
        return;
    }
    // Any value >= P.rows marks a zero row below.
    let row = select(id - P.row0, P.rows, zero);
    let base = t * P.cols;
    let n_blocks = (P.cols + QK - 1u) / QK;
    for (var b = lid; b < n_blocks; b += WG) {
        let c0 = b * QK;
        if (row >= P.rows) {
            for (var j = 0u; j < QK; j++) {
                if (c0 + j < P.cols) {
                    out[base + c0 + j] = 0.0;
                }
            }
            continue;
        }
        let w = dq_block(row, b, P.cols);
        for (var k = 0u; k < 8u; k++) {
            for (var j = 0u; j < 4u; j++) {
                // A partial last block of an F16/F32 row stops at cols.
                let c = c0 + 4u * k + j;
                if (c < P.cols) {
                    out[base + c] = w[k][j];
                }
            }
        }
    }
}
