// Shared head of the attention kernels (attention_split.wgsl, attention_combine.wgsl,
// attention_prefill.wgsl, attention_prefill_lanes.wgsl): their one parameter struct, the
// twin of src/gpu/registry/params.rs's `AttentionParams` (tests/gpu_shaders.rs checks the two agree),
// and the constants they share. Each kernel binds `P` itself (its binding number differs).

struct AttentionParams {
    n_tokens: u32,
    n_head: u32,
    n_head_kv: u32,
    // multiple of 4; at most 4 * MAX_D4 (split), 64 (prefill lanes)
    head_dim: u32,
    // position of the first query token
    pos0: u32,
    // split and combine: chunks per (token, head), ceil((pos0 + n_tokens) / CHUNK)
    n_chunks: u32,
    // tiled prefill: query tokens per workgroup, tile_q * head_dim / 4 <= Q_SH4,
    // tile_q <= WG (lanes: WG, unused)
    tile_q: u32,
    // tiled prefill: key positions per tile, tile_k * head_dim / 4 <= KV_SH4,
    // tile_q * tile_k <= S_SH
    tile_k: u32,
    // score scale (usually 1 / sqrt(head_dim))
    scale: f32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // split: 1 quantizes the output (n_chunks = 1 only)
    quant: u32,
    // sliding window: a query at position p sees keys p - window + 1 ..= p; 0 = no window
    window: u32,
    // scores become softcap * tanh(score / softcap) before the softmax; 0 = no cap (gemma2)
    softcap: f32,
    pad0: u32,
    pad1: u32,
    pad2: u32,
}

// The first key position a query at position `pos` sees: 0, or its window's first.
fn first_key(pos: u32) -> u32 {
    if (P.window == 0u || pos + 1u <= P.window) {
        return 0u;
    }
    return pos + 1u - P.window;
}

// A score after the soft-cap, if any. tanh saturates to +-1 in f32 past |x| = 9.1; clamping
// first keeps a driver's exp-based tanh from overflowing to inf / inf.
fn cap_score(s: f32) -> f32 {
    if (P.softcap == 0.0) {
        return s;
    }
    return P.softcap * tanh(clamp(s / P.softcap, -10.0, 10.0));
}

fn cap_scores(s: vec4<f32>) -> vec4<f32> {
    if (P.softcap == 0.0) {
        return s;
    }
    return P.softcap * tanh(clamp(s / P.softcap, vec4<f32>(-10.0), vec4<f32>(10.0)));
}

const F32_MAX: f32 = 3.40282347e38;
