// Decode attention, second pass of flash-decoding: merges the per-chunk results of
// attention_split.wgsl. With chunk c's maximum m_c, sum s_c and weighted V a_c, and
// M = max_c m_c: out = sum_c exp(m_c - M) a_c / sum_c exp(m_c - M) s_c.
// Composed after a reduce/*.wgsl fragment (override WG, MAX_WG, fn wg_sum, fn wg_max) and
// attention/params.wgsl.
// One workgroup per (token, head): g = wid.x + wid.y * groups_x = token * n_head + head.

// [n_tokens, n_head, n_chunks, 1 + head_dim / 4] vec4, as attention_split.wgsl writes it
@group(0) @binding(0) var<storage, read> scratch: array<vec4<f32>>;
// [n_tokens, n_head, head_dim]
@group(0) @binding(1) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(2) var<uniform> P: AttentionParams;

// Key positions per chunk: the value attention_split.wgsl was compiled with.
override CHUNK: u32 = 256u;

// [n_groups, head_dim / 4] partial sums
var<workgroup> part: array<vec4<f32>, MAX_WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    // token * n_head + head
    let th = wid.x + wid.y * P.groups_x;
    // Uniform over the workgroup, so no invocation is left waiting at a barrier.
    if (th >= P.n_tokens * P.n_head) {
        return;
    }
    let tok = th / P.n_head;
    // Only the chunks that hold some of this token's positions first_key(pos)..=pos were
    // written: c0..nc.
    let nc = (P.pos0 + tok + 1u + CHUNK - 1u) / CHUNK;
    let c0 = first_key(P.pos0 + tok) / CHUNK;
    let d4 = P.head_dim / 4u;
    let stride = d4 + 1u;
    let base = th * P.n_chunks * stride;

    var m = -F32_MAX;
    for (var c = c0 + lid; c < nc; c += WG) {
        m = max(m, scratch[base + c * stride].x);
    }
    let big_m = wg_max(m, lid);
    var s = 0.0;
    for (var c = c0 + lid; c < nc; c += WG) {
        let h = scratch[base + c * stride];
        s += exp(h.x - big_m) * h.y;
    }
    let total = wg_sum(s, lid);

    // As in attention_split.wgsl: n_groups groups of d4 lanes, group r takes chunks r,
    // r + n_groups, ...
    let n_groups = max(WG / d4, 1u);
    for (var it = lid; it < n_groups * d4; it += WG) {
        let r = it / d4;
        let lane = it % d4;
        var acc = vec4<f32>(0.0);
        for (var c = c0 + r; c < nc; c += n_groups) {
            let e = base + c * stride;
            acc += exp(scratch[e].x - big_m) * scratch[e + 1u + lane];
        }
        part[it] = acc;
    }
    workgroupBarrier();
    let inv = 1.0 / total;
    for (var lane = lid; lane < d4; lane += WG) {
        var acc = vec4<f32>(0.0);
        for (var r = 0u; r < n_groups; r++) {
            acc += part[r * d4 + lane];
        }
        out[th * d4 + lane] = acc * inv;
    }
}
