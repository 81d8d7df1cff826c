// Activation quantization for the integer matvec (twin of src/cpu/act.rs
// `QAct::quantize_scalar`, bit for bit): each chunk of 32 values through `quantize_store`.
// Composed after quantize_chunk.wgsl (no reduction): one invocation per chunk; 2-D dispatch as
// in matrix/reduce.wgsl.

override WG: u32 = 64u;

struct QuantizeActParams {
    // n_tokens * cols / 32
    n_chunks: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    pad0: u32,
    pad1: u32,
}

// [n_chunks * 32] = [n_tokens, cols] f32
@group(0) @binding(0) var<storage, read> x: array<f32>;
// [n_chunks, 8] words = [n_tokens, cols / 4]: four int8 codes per word, element 4k + j in
// byte j of word k
@group(0) @binding(1) var<storage, read_write> qx: array<u32>;
// [n_chunks] = [n_tokens, cols / 32]: (d, d * Σq over 0..16, d * Σq over 16..32, d * Σq)
@group(0) @binding(2) var<storage, read_write> qd: array<vec4<f32>>;
@group(0) @binding(3) var<uniform> P: QuantizeActParams;

fn load4(i: u32) -> vec4<f32> {
    return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let c = (wid.x + wid.y * P.groups_x) * WG + lid;
    if (c >= P.n_chunks) {
        return;
    }
    // No local array (see quantize_store8): the chunk goes in eight vec4.
    let i = c * 32u;
    quantize_store8(
        c,
        load4(i),
        load4(i + 4u),
        load4(i + 8u),
        load4(i + 12u),
        load4(i + 16u),
        load4(i + 20u),
        load4(i + 24u),
        load4(i + 28u),
    );
}
