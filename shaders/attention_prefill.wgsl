// Prefill attention, tiled and causal with an online softmax (twin of kernels-ref's
// ops::attention). Composed after attention/params.wgsl, attention/qkv.wgsl (bindings 0..2
// and 4) and kv/read.wgsl (the caches' types, fn kv_vec4: the tiles are decoded as they are
// staged); no reduction. One workgroup per (head, tile of tile_q query tokens):
// g = wid.x + wid.y * groups_x = query_tile * n_head + head, so neighbouring workgroups read
// the same keys. The workgroup walks the key positions in tiles of tile_k,
// staging each tile's K and then its V in workgroup memory, and stops after the last position
// its last query sees (tiles that are fully masked are never loaded).
//
// Invocation lid serves query row qi = lid / tpq (tpq = WG / tile_q invocations per query) and
// keeps that row's running maximum m, sum l and the vec4 lanes sub, sub + tpq, ... of its
// output accumulator (sub = lid % tpq); m and l are computed redundantly by the row's tpq
// invocations. The host picks tile_q and tile_k so every array below is big enough.
// Workgroup memory: 8 KiB + 4 KiB + 2 KiB, within WebGPU's 16 KiB minimum.

override WG: u32 = 64u;

// [n_tokens, n_head, head_dim]
@group(0) @binding(3) var<storage, read_write> out: array<vec4<f32>>;

const Q_SH4: u32 = 512u;
const KV_SH4: u32 = 256u;
const S_SH: u32 = 512u;
// Accumulator vec4s per invocation: ceil(head_dim / 4 / tpq) <= ACC4.
const ACC4: u32 = 8u;

// [tile_q, head_dim / 4] the query tile, times scale
var<workgroup> q_sh: array<vec4<f32>, Q_SH4>;
// [tile_k, head_dim / 4] the key tile, then the value tile
var<workgroup> kv_sh: array<vec4<f32>, KV_SH4>;
// [tile_q, tile_k] scores
var<workgroup> s_sh: array<f32, S_SH>;

// Stages cache rows kv0..kv0 + tk of this kv head into kv_sh.
fn load_tile(from_v: bool, kv0: u32, tk: u32, d4: u32, row4: u32, kv_off: u32, lid: u32) {
    for (var i = lid; i < tk * d4; i += WG) {
        let src = (kv0 + i / d4) * row4 + kv_off + i % d4;
        kv_sh[i] = kv_vec4(from_v, src * 4u);
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    let g = wid.x + wid.y * P.groups_x;
    let tq = P.tile_q;
    let n_qt = (P.n_tokens + tq - 1u) / tq;
    // Uniform over the workgroup, so no invocation is left waiting at a barrier.
    if (g >= P.n_head * n_qt) {
        return;
    }
    let head = g % P.n_head;
    let t0 = (g / P.n_head) * tq;
    // valid query rows in this tile
    let nq = min(tq, P.n_tokens - t0);
    let d4 = P.head_dim / 4u;
    let row4 = P.n_head_kv * d4;
    let kv_off = (head / (P.n_head / P.n_head_kv)) * d4;

    for (var i = lid; i < tq * d4; i += WG) {
        let r = i / d4;
        var v = vec4<f32>(0.0);
        if (r < nq) {
            v = q[((t0 + r) * P.n_head + head) * d4 + i % d4] * P.scale;
        }
        q_sh[i] = v;
    }

    let tpq = WG / tq;
    let qi = lid / tpq;
    let sub = lid % tpq;
    // Rows past the last token mirror the last valid row's position (never written out).
    let my_pos = P.pos0 + t0 + min(qi, nq - 1u);
    var m = -F32_MAX;
    var l = 0.0;
    var acc: array<vec4<f32>, ACC4>;
    for (var k = 0u; k < ACC4; k++) {
        acc[k] = vec4<f32>(0.0);
    }

    // Keys the tile's last valid query sees, from the first its first query sees (a sliding
    // window starts later for later queries: each row skips the keys before its own).
    let n_keys = P.pos0 + t0 + nq;
    let my_first = first_key(my_pos);
    for (var kv0 = first_key(P.pos0 + t0); kv0 < n_keys; kv0 += P.tile_k) {
        let tk = min(P.tile_k, n_keys - kv0);
        // The previous tile's values (and the q tile, first time) are done with.
        workgroupBarrier();
        load_tile(false, kv0, tk, d4, row4, kv_off, lid);
        workgroupBarrier();
        for (var i = lid; i < tq * tk; i += WG) {
            let r = i / tk;
            let j = i % tk;
            var s = 0.0;
            for (var x = 0u; x < d4; x++) {
                s += dot(q_sh[r * d4 + x], kv_sh[j * d4 + x]);
            }
            s_sh[r * P.tile_k + j] = cap_score(s);
        }
        workgroupBarrier();
        load_tile(true, kv0, tk, d4, row4, kv_off, lid);
        workgroupBarrier();
        if (qi < tq) {
            // Positions kv0 + j0..kv0 + nj of this tile are not after the query (causal mask)
            // nor before its window.
            var nj = 0u;
            if (my_pos >= kv0) {
                nj = min(tk, my_pos - kv0 + 1u);
            }
            var j0 = 0u;
            if (my_first > kv0) {
                j0 = min(my_first - kv0, nj);
            }
            var m_new = m;
            for (var j = j0; j < nj; j++) {
                m_new = max(m_new, s_sh[qi * P.tile_k + j]);
            }
            let alpha = exp(m - m_new);
            l *= alpha;
            for (var k = 0u; k < ACC4; k++) {
                acc[k] *= alpha;
            }
            for (var j = j0; j < nj; j++) {
                let p = exp(s_sh[qi * P.tile_k + j] - m_new);
                l += p;
                for (var k = 0u; k < ACC4; k++) {
                    let lane = sub + k * tpq;
                    if (lane < d4) {
                        acc[k] += p * kv_sh[j * d4 + lane];
                    }
                }
            }
            m = m_new;
        }
    }

    if (qi < nq) {
        let ob = ((t0 + qi) * P.n_head + head) * d4;
        let inv = 1.0 / l;
        for (var k = 0u; k < ACC4; k++) {
            let lane = sub + k * tpq;
            if (lane < d4) {
                out[ob + lane] = acc[k] * inv;
            }
        }
    }
}
