// Decode attention, first pass of flash-decoding (twin, with attention_combine.wgsl, of
// kernels-ref's ops::attention): the key positions are cut into chunks of CHUNK, and each
// workgroup handles one (token, head, chunk). It writes that chunk's score maximum m, its sum
// of exp(score - m) and its unnormalised sum of exp(score - m) * v into `scratch`; the combine
// pass merges the chunks with log-sum-exp rescaling. Splitting keeps every workgroup short
// however long the context (GPU watchdogs) and gives a single decode token enough workgroups.
// Composed after a reduce/*.wgsl fragment (override WG, MAX_WG, fn wg_sum, fn wg_max),
// attention/params.wgsl, attention/qkv.wgsl (bindings 0..2 and 4) and kv/read.wgsl (the
// caches' types K_TYPE, V_TYPE and fn kv_vec4, decoding in the loops).
// Group g = wid.x + wid.y * groups_x = (token * n_head + head) * n_chunks + chunk.
// With a single chunk (n_chunks = 1: a context of at most CHUNK positions) the workgroup
// writes the finished output itself, acc * (1 / sum) as the combine pass would compute it
// (exp(m - m) = 1 exactly), and the host skips the combine launch (issue 5: one launch fewer
// per layer on a short context). With quant = 1 as well it quantizes that output for the
// output projection (head_dim a multiple of 32: a head is whole chunks of quantize_act's
// layout), through quantize_chunk.wgsl's `quantize_store`, composed before this kernel, so
// the quantize_act launch goes too.

// [n_tokens, n_head, n_chunks, 1 + head_dim / 4] vec4: (m, sum, 0, 0), then the weighted V
@group(0) @binding(3) var<storage, read_write> scratch: array<vec4<f32>>;
// [n_tokens, n_head, head_dim]: written only when n_chunks = 1 (else bound but unused)
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;
// [n_tokens, n_head * head_dim / 4] words of four int8 codes and [n_tokens, n_head *
// head_dim / 32] chunk scales and sums (quantize_act.wgsl's layout): written only when quant = 1
@group(0) @binding(6) var<storage, read_write> qx: array<u32>;
@group(0) @binding(7) var<storage, read_write> qd: array<vec4<f32>>;

// Key positions per workgroup (at most MAX_CHUNK).
override CHUNK: u32 = 256u;
const MAX_CHUNK: u32 = 512u;
// head_dim / 4 at most (head_dim 256).
const MAX_D4: u32 = 64u;

// [head_dim / 4] the query, times scale
var<workgroup> q_sh: array<vec4<f32>, MAX_D4>;
// [CHUNK] scores, then exp(score - m)
var<workgroup> p_sh: array<f32, MAX_CHUNK>;
// [n_groups, head_dim / 4] partial weighted V sums; n_groups * head_dim / 4 <= max(WG, MAX_D4)
var<workgroup> part: array<vec4<f32>, MAX_WG>;

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * P.groups_x;
    // Every early return below is uniform over the workgroup (it depends on g and P only), so
    // no invocation is left waiting at a barrier.
    if (g >= P.n_tokens * P.n_head * P.n_chunks) {
        return;
    }
    let chunk = g % P.n_chunks;
    // token * n_head + head
    let th = g / P.n_chunks;
    let head = th % P.n_head;
    let tok = th / P.n_head;
    // Causal: this token sees positions first_key(pos)..=pos, pos = pos0 + tok.
    let n_keys = P.pos0 + tok + 1u;
    let first = first_key(P.pos0 + tok);
    let chunk0 = chunk * CHUNK;
    if (chunk0 >= n_keys || chunk0 + CHUNK <= first) {
        // Past this token's position or before its window: the combine pass never reads this
        // entry.
        return;
    }
    // This chunk's part of the token's keys: start..start + len.
    let start = max(chunk0, first);
    let len = min(chunk0 + CHUNK, n_keys) - start;
    let d4 = P.head_dim / 4u;
    // vec4s per cache row, and this head's kv head offset in a row (GQA)
    let row4 = P.n_head_kv * d4;
    let kv_off = (head / (P.n_head / P.n_head_kv)) * d4;

    for (var i = lid; i < d4; i += WG) {
        q_sh[i] = q[th * d4 + i] * P.scale;
    }
    workgroupBarrier();

    // Scores: one key position per invocation at a time.
    var m = -F32_MAX;
    for (var j = lid; j < len; j += WG) {
        let kb = (start + j) * row4 + kv_off;
        var s = 0.0;
        for (var i = 0u; i < d4; i++) {
            s += dot(q_sh[i], kv_vec4(false, (kb + i) * 4u));
        }
        let c = cap_score(s);
        p_sh[j] = c;
        m = max(m, c);
    }
    let cm = wg_max(m, lid);
    var sum = 0.0;
    for (var j = lid; j < len; j += WG) {
        let p = exp(p_sh[j] - cm);
        p_sh[j] = p;
        sum += p;
    }
    // wg_sum's barriers also make every p_sh write visible to the whole workgroup.
    let cs = wg_sum(sum, lid);

    // Weighted V: the invocations split into n_groups groups of d4 lanes (one vec4 of the
    // head each); group r takes positions r, r + n_groups, ...
    let n_groups = max(WG / d4, 1u);
    for (var it = lid; it < n_groups * d4; it += WG) {
        let r = it / d4;
        let lane = it % d4;
        var acc = vec4<f32>(0.0);
        for (var j = r; j < len; j += n_groups) {
            acc += p_sh[j] * kv_vec4(true, ((start + j) * row4 + kv_off + lane) * 4u);
        }
        part[it] = acc;
    }
    workgroupBarrier();
    let direct = P.n_chunks == 1u;
    let inv = 1.0 / cs;
    let base = g * (d4 + 1u);
    if (lid == 0u && !direct) {
        scratch[base] = vec4<f32>(cm, cs, 0.0, 0.0);
    }
    for (var lane = lid; lane < d4; lane += WG) {
        var acc = vec4<f32>(0.0);
        for (var r = 0u; r < n_groups; r++) {
            acc += part[r * d4 + lane];
        }
        if (direct) {
            // g = th when there is one chunk.
            out[g * d4 + lane] = acc * inv;
            // q_sh is free again (the scores' barriers passed since its last read).
            q_sh[lane] = acc * inv;
        } else {
            scratch[base + 1u + lane] = acc;
        }
    }
    // Uniform over the workgroup (P only), so the barrier is reached by all or none.
    if (direct && P.quant == 1u) {
        workgroupBarrier();
        let nc = P.head_dim / 32u;
        for (var c = lid; c < nc; c += WG) {
            var v: array<f32, 32>;
            for (var k = 0u; k < 8u; k++) {
                let a = q_sh[c * 8u + k];
                v[4u * k] = a.x;
                v[4u * k + 1u] = a.y;
                v[4u * k + 2u] = a.z;
                v[4u * k + 3u] = a.w;
            }
            quantize_store(g * nc + c, v);
        }
    }
}
