// Appends n_tokens rows of keys and values to one layer's KV cache: rows pos0..pos0 + n_tokens
// of k_cache and v_cache get k and v; every other row is left as it was. Standalone module
// (no reduction). One invocation per element; 2-D dispatch as in matvec.wgsl.

override WG: u32 = 64u;

struct KvStoreParams {
    n_tokens: u32,
    // f32 per cache row: n_head_kv * head_dim
    row_len: u32,
    // cache row of the first token
    pos0: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
}

// [n_tokens, n_head_kv, head_dim]
@group(0) @binding(0) var<storage, read> k: array<f32>;
// [n_tokens, n_head_kv, head_dim]
@group(0) @binding(1) var<storage, read> v: array<f32>;
// [n_ctx, n_head_kv, head_dim]
@group(0) @binding(2) var<storage, read_write> k_cache: array<f32>;
// [n_ctx, n_head_kv, head_dim]
@group(0) @binding(3) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(4) var<uniform> P: KvStoreParams;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let i = (wid.x + wid.y * P.groups_x) * WG + lid;
    if (i >= P.n_tokens * P.row_len) {
        return;
    }
    let dst = P.pos0 * P.row_len + i;
    k_cache[dst] = k[i];
    v_cache[dst] = v[i];
}
