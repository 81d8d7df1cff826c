// Embedding lookup: out[t] = W[ids[t]] as f32 (twin of kernels-ref's ops::embedding).
// Composed after reduce/workgroup.wgsl (for override WG; wg_sum is unused) and a quant/*.wgsl
// fragment (bindings 0..1 for W, const QK, fn dq_block). One invocation per block of a
// token's row; 2-D dispatch of ceil(n_tokens * blocks / WG) workgroups as in matrix/reduce.wgsl.
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
    // multiplies every value (gemma's sqrt(n_embd); 1 otherwise)
    scale: f32,
    pad1: u32,
}

// [n_tokens]
@group(0) @binding(2) var<storage, read> ids: array<u32>;
// [n_tokens, cols]
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> P: EmbeddingParams;

// out[base + c .. + 4] = v, stopping at cols (a partial last block of an F16/F32 row). The
// caller passes dq_block's vec4 by constant index: indexing its array with a loop variable
// made llvmpipe keep it in scratch memory and gather every element lane by lane.
fn store4(base: u32, c: u32, v: vec4<f32>) {
    if (c + 4u <= P.cols) {
        out[base + c] = v.x;
        out[base + c + 1u] = v.y;
        out[base + c + 2u] = v.z;
        out[base + c + 3u] = v.w;
        return;
    }
    for (var j = 0u; j < 4u; j++) {
        if (c + j < P.cols) {
            out[base + c + j] = v[j];
        }
    }
}

// One invocation per (token, block): a row's blocks are spread over a workgroup's
// invocations, instead of one workgroup per token whose 64 invocations mostly had no block.
@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let n_blocks = (P.cols + QK - 1u) / QK;
    let i = (wid.x + wid.y * P.groups_x) * WG + lid;
    let t = i / n_blocks;
    let b = i % n_blocks;
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
    let base = t * P.cols;
    let c0 = b * QK;
    if (zero) {
        let z = vec4<f32>(0.0);
        for (var k = 0u; k < QK / 4u; k++) {
            store4(base, c0 + 4u * k, z);
        }
        return;
    }
    let w = dq_block(id - P.row0, b, P.cols);
    let s = P.scale;
    store4(base, c0, w[0] * s);
    store4(base, c0 + 4u, w[1] * s);
    store4(base, c0 + 8u, w[2] * s);
    store4(base, c0 + 12u, w[3] * s);
    store4(base, c0 + 16u, w[4] * s);
    store4(base, c0 + 20u, w[5] * s);
    store4(base, c0 + 24u, w[6] * s);
    store4(base, c0 + 28u, w[7] * s);
}
