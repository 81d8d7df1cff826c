// Bindings of the attention kernels that read the query and the caches
// (attention_split.wgsl, attention_prefill.wgsl, attention_prefill_lanes.wgsl; binding 3
// and any after 4 are the kernel's own). Composed after attention/params.wgsl; kv/read.wgsl
// decodes k_cache and v_cache.

// [n_tokens, n_head, head_dim]
@group(0) @binding(0) var<storage, read> q: array<vec4<f32>>;
// [n_ctx, n_head_kv, head_dim] in K_TYPE's layout, as u32 words
@group(0) @binding(1) var<storage, read> k_cache: array<u32>;
// [n_ctx, n_head_kv, head_dim] in V_TYPE's layout, as u32 words
@group(0) @binding(2) var<storage, read> v_cache: array<u32>;
@group(0) @binding(4) var<uniform> P: AttentionParams;
