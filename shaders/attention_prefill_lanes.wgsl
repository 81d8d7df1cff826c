// Prefill attention for CPU-like adapters with subgroups of 8 or more (lavapipe): the twin of
// attention_prefill.wgsl (causal, online softmax, kernels-ref's ops::attention) for head_dim
// 64, with no workgroup memory and no barrier. Composed after attention/params.wgsl,
// attention/qkv.wgsl (bindings 0..2 and 4) and kv/read.wgsl (fn kv_vec4).
//
// Why another layout: llvmpipe runs a subgroup of 8 as one SIMD vector, and a load whose
// address is not statically uniform is a loop over the lanes. The tiled kernel has every lane
// of a query row read the same workgroup elements (8 loop trips for one useful value). Here
// every load delivers a distinct useful value per lane, and values are shared by
// `subgroupBroadcast` with a constant lane (an extract + splat on llvmpipe):
// - invocation lid owns query token t0 + lid of one head (its q row, running max m, sum l and
//   output accumulator live in its registers: the softmax needs no cross-lane reduction);
// - the keys go in blocks of 8: lane e = subgroup_invocation_id % 8 loads vec4 x of key row
//   j0 + e, and broadcast(k, K) hands row j0 + K's vec4 x to every lane (the same for V).
//   Subgroups wider than 8 load the same rows in each group of 8 lanes, so any size >= 8
//   works (the host only picks this kernel for such adapters).
// The 16 vec4 of a row are named variables and the code that touches them is written out:
// a private array indexed by a loop variable becomes scratch memory, whose loads are the
// per-lane loops this kernel avoids.

override WG: u32 = 64u;

// [n_tokens, n_head, head_dim]
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

// vec4 per head row
const HD4: u32 = 16u;

// Scores of one block of 8 keys: keys j0..j0 + 3 in lo, j0 + 4..j0 + 7 in hi.
struct Block {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

// `s` plus the block's 8 dot products of the query's vec4 `qx` with the keys' vec4 at this
// lane's element offset `e` of the K cache (each lane loads its own key's).
fn qk(s: Block, qx: vec4<f32>, e: u32) -> Block {
    let k = kv_vec4(false, e);
    return Block(
        s.lo + vec4<f32>(
            dot(qx, subgroupBroadcast(k, 0u)),
            dot(qx, subgroupBroadcast(k, 1u)),
            dot(qx, subgroupBroadcast(k, 2u)),
            dot(qx, subgroupBroadcast(k, 3u)),
        ),
        s.hi + vec4<f32>(
            dot(qx, subgroupBroadcast(k, 4u)),
            dot(qx, subgroupBroadcast(k, 5u)),
            dot(qx, subgroupBroadcast(k, 6u)),
            dot(qx, subgroupBroadcast(k, 7u)),
        ),
    );
}

// `a` plus the block's values' vec4 at this lane's element offset `e` of the V cache weighted
// by the probabilities `p`.
fn pv(a: vec4<f32>, p: Block, e: u32) -> vec4<f32> {
    let v = kv_vec4(true, e);
    return a + p.lo.x * subgroupBroadcast(v, 0u) + p.lo.y * subgroupBroadcast(v, 1u)
        + p.lo.z * subgroupBroadcast(v, 2u) + p.lo.w * subgroupBroadcast(v, 3u)
        + p.hi.x * subgroupBroadcast(v, 4u) + p.hi.y * subgroupBroadcast(v, 5u)
        + p.hi.z * subgroupBroadcast(v, 6u) + p.hi.w * subgroupBroadcast(v, 7u);
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) sg_lane: u32,
) {
    let g = wid.x + wid.y * P.groups_x;
    let n_qt = (P.n_tokens + WG - 1u) / WG;
    // Uniform over the workgroup: no subgroup is left partial.
    if (g >= P.n_head * n_qt) {
        return;
    }
    let head = g % P.n_head;
    let t_raw = (g / P.n_head) * WG + lid;
    // Lanes past the last token mirror it (all lanes take part in the broadcasts; only the
    // valid ones store).
    let t = min(t_raw, P.n_tokens - 1u);
    let my_pos = P.pos0 + t;
    let row4 = P.n_head_kv * HD4;
    let kv_off = (head / (P.n_head / P.n_head_kv)) * HD4;
    let e = sg_lane % 8u;

    let qb = (t * P.n_head + head) * HD4;
    let q0 = q[qb] * P.scale;
    let q1 = q[qb + 1u] * P.scale;
    let q2 = q[qb + 2u] * P.scale;
    let q3 = q[qb + 3u] * P.scale;
    let q4 = q[qb + 4u] * P.scale;
    let q5 = q[qb + 5u] * P.scale;
    let q6 = q[qb + 6u] * P.scale;
    let q7 = q[qb + 7u] * P.scale;
    let q8 = q[qb + 8u] * P.scale;
    let q9 = q[qb + 9u] * P.scale;
    let q10 = q[qb + 10u] * P.scale;
    let q11 = q[qb + 11u] * P.scale;
    let q12 = q[qb + 12u] * P.scale;
    let q13 = q[qb + 13u] * P.scale;
    let q14 = q[qb + 14u] * P.scale;
    let q15 = q[qb + 15u] * P.scale;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    var a8 = vec4<f32>(0.0);
    var a9 = vec4<f32>(0.0);
    var a10 = vec4<f32>(0.0);
    var a11 = vec4<f32>(0.0);
    var a12 = vec4<f32>(0.0);
    var a13 = vec4<f32>(0.0);
    var a14 = vec4<f32>(0.0);
    var a15 = vec4<f32>(0.0);
    var m = -F32_MAX;
    var l = 0.0;

    // Keys the subgroup's last query sees, from the first block its first query sees: the
    // same in every lane, so the loop (and its broadcasts) stays in uniform control flow.
    let n_keys = subgroupMax(my_pos) + 1u;
    let my_first = first_key(my_pos);
    let j_start = (subgroupMin(my_first) / 8u) * 8u;
    for (var j0 = j_start; j0 < n_keys; j0 += 8u) {
        // This lane's key row; past the end a written row stands in (its score is masked).
        let kb = (min(j0 + e, n_keys - 1u) * row4 + kv_off) * 4u;
        var s = Block(vec4<f32>(0.0), vec4<f32>(0.0));
        s = qk(s, q0, kb);
        s = qk(s, q1, kb + 4u);
        s = qk(s, q2, kb + 8u);
        s = qk(s, q3, kb + 12u);
        s = qk(s, q4, kb + 16u);
        s = qk(s, q5, kb + 20u);
        s = qk(s, q6, kb + 24u);
        s = qk(s, q7, kb + 28u);
        s = qk(s, q8, kb + 32u);
        s = qk(s, q9, kb + 36u);
        s = qk(s, q10, kb + 40u);
        s = qk(s, q11, kb + 44u);
        s = qk(s, q12, kb + 48u);
        s = qk(s, q13, kb + 52u);
        s = qk(s, q14, kb + 56u);
        s = qk(s, q15, kb + 60u);
        // Causal and window mask: keys after the query's position or before its window score
        // -F32_MAX and get probability 0 (explicitly: a block can hold no key of a query
        // whose window starts later, and then m_new is still -F32_MAX).
        let j_lo = vec4<u32>(j0) + vec4<u32>(0u, 1u, 2u, 3u);
        let j_hi = j_lo + vec4<u32>(4u);
        let in_lo = (j_lo <= vec4<u32>(my_pos)) & (j_lo >= vec4<u32>(my_first));
        let in_hi = (j_hi <= vec4<u32>(my_pos)) & (j_hi >= vec4<u32>(my_first));
        let lo = select(vec4<f32>(-F32_MAX), cap_scores(s.lo), in_lo);
        let hi = select(vec4<f32>(-F32_MAX), cap_scores(s.hi), in_hi);
        let mx = max(lo, hi);
        let m_new = max(m, max(max(mx.x, mx.y), max(mx.z, mx.w)));
        let alpha = exp(m - m_new);
        let zero = vec4<f32>(0.0);
        let p = Block(select(zero, exp(lo - m_new), in_lo), select(zero, exp(hi - m_new), in_hi));
        l = l * alpha + dot(p.lo + p.hi, vec4<f32>(1.0));
        m = m_new;
        a0 = pv(a0 * alpha, p, kb);
        a1 = pv(a1 * alpha, p, kb + 4u);
        a2 = pv(a2 * alpha, p, kb + 8u);
        a3 = pv(a3 * alpha, p, kb + 12u);
        a4 = pv(a4 * alpha, p, kb + 16u);
        a5 = pv(a5 * alpha, p, kb + 20u);
        a6 = pv(a6 * alpha, p, kb + 24u);
        a7 = pv(a7 * alpha, p, kb + 28u);
        a8 = pv(a8 * alpha, p, kb + 32u);
        a9 = pv(a9 * alpha, p, kb + 36u);
        a10 = pv(a10 * alpha, p, kb + 40u);
        a11 = pv(a11 * alpha, p, kb + 44u);
        a12 = pv(a12 * alpha, p, kb + 48u);
        a13 = pv(a13 * alpha, p, kb + 52u);
        a14 = pv(a14 * alpha, p, kb + 56u);
        a15 = pv(a15 * alpha, p, kb + 60u);
    }

    if (t_raw < P.n_tokens) {
        let inv = 1.0 / l;
        out[qb] = a0 * inv;
        out[qb + 1u] = a1 * inv;
        out[qb + 2u] = a2 * inv;
        out[qb + 3u] = a3 * inv;
        out[qb + 4u] = a4 * inv;
        out[qb + 5u] = a5 * inv;
        out[qb + 6u] = a6 * inv;
        out[qb + 7u] = a7 * inv;
        out[qb + 8u] = a8 * inv;
        out[qb + 9u] = a9 * inv;
        out[qb + 10u] = a10 * inv;
        out[qb + 11u] = a11 * inv;
        out[qb + 12u] = a12 * inv;
        out[qb + 13u] = a13 * inv;
        out[qb + 14u] = a14 * inv;
        out[qb + 15u] = a15 * inv;
    }
}
