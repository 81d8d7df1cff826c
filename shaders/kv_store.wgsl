// Appends n_tokens rows of keys or values to one layer's K or V cache, in the cache's type
// (TYPE: 0 f32, 1 f16, 2 q8_0, 3 q4_0; the layout is in shaders/kv/read.wgsl): rows
// pos0..pos0 + n_tokens of `cache` get `src`; every other row is left as it was. The
// quantizers are kernels-ref's (src/kv_type.rs), so the GPU's cache holds the CPU's bytes.
// Standalone module (no reduction); 2-D dispatch as in matrix/reduce.wgsl. One invocation per unit:
// a word for f32 and f16 (one or two values), a pair of blocks for q8_0 and q4_0 (68 or 36
// bytes: the first whole number of words), so no two invocations write the same word.
// One launch stores both K and V when their caches have the same type (issue 6: one launch
// fewer per layer): the first units_k invocations write (src, cache), the next units_v
// (src_v, cache_v). Caches of different types take one launch each, units_v = 0.

override WG: u32 = 64u;
override TYPE: u32 = 0u;

struct KvStoreParams {
    n_tokens: u32,
    // values per cache row: n_head_kv * head_dim
    row_len: u32,
    // cache row of the first token
    pos0: u32,
    // workgroups along x in the dispatch
    groups_x: u32,
    // invocations (units as above) of the first pair and of the second
    units_k: u32,
    units_v: u32,
    pad0: u32,
    pad1: u32,
}

// [n_tokens, n_head_kv, head_dim] f32
@group(0) @binding(0) var<storage, read> src: array<f32>;
// [n_ctx, n_head_kv, head_dim] in TYPE's layout, as u32 words
@group(0) @binding(1) var<storage, read_write> cache: array<u32>;
@group(0) @binding(2) var<uniform> P: KvStoreParams;
// The second pair, as src and cache (V when one launch stores both).
@group(0) @binding(3) var<storage, read> src_v: array<f32>;
@group(0) @binding(4) var<storage, read_write> cache_v: array<u32>;

// Whether this invocation writes the second pair (set once in main).
var<private> second: bool;

fn src_at(i: u32) -> f32 {
    if (second) {
        return src_v[i];
    }
    return src[i];
}

fn cache_get(i: u32) -> u32 {
    if (second) {
        return cache_v[i];
    }
    return cache[i];
}

fn cache_set(i: u32, w: u32) {
    if (second) {
        cache_v[i] = w;
    } else {
        cache[i] = w;
    }
}

// The words of one q8_0 (17) or q4_0 (9) block pair being assembled.
var<private> pw: array<u32, 17>;

// IEEE f32 -> f16 bits, round to nearest even (the `half` crate's conversion, which kernels-ref
// uses; WGSL's pack2x16float leaves the rounding to the implementation).
fn f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let sign = (b >> 16u) & 0x8000u;
    let e = (b >> 23u) & 0xffu;
    let m = b & 0x7fffffu;
    if (e == 255u) {
        return sign | 0x7c00u | select(0u, 0x200u | (m >> 13u), m != 0u);
    }
    let he = i32(e) - 112;
    if (he >= 31) {
        return sign | 0x7c00u;
    }
    if (he <= 0) {
        if (14 - he > 24) {
            return sign;
        }
        let mm = m | 0x800000u;
        let s = u32(14 - he);
        var hm = mm >> s;
        let rb = 1u << (s - 1u);
        if ((mm & rb) != 0u && (mm & (3u * rb - 1u)) != 0u) {
            hm += 1u;
        }
        return sign | hm;
    }
    var h = sign | (u32(he) << 10u) | (m >> 13u);
    if ((m & 0x1000u) != 0u && (m & 0x2fffu) != 0u) {
        h += 1u;
    }
    return h;
}

fn put_byte(off: u32, v: u32) {
    let w = off >> 2u;
    let sh = (off & 3u) * 8u;
    pw[w] = (pw[w] & ~(0xffu << sh)) | ((v & 0xffu) << sh);
}

// Rounds half away from zero (C's roundf, as kernels-ref's Q8_0); WGSL's round() is half to
// even. t - trunc(t) is exact.
fn round_away(t: f32) -> f32 {
    let f = trunc(t);
    if (abs(t - f) >= 0.5) {
        return f + sign(t);
    }
    return f;
}

// Quantizes src[s..s + 32] into the pair's bytes at off.
fn quant_block(s: u32, off: u32) {
    if (TYPE == 2u) {
        var amax = 0.0;
        for (var k = 0u; k < 32u; k++) {
            amax = max(amax, abs(src_at(s + k)));
        }
        let d = amax / 127.0;
        let id = select(0.0, 1.0 / d, d != 0.0);
        let h = f16_bits(d);
        put_byte(off, h);
        put_byte(off + 1u, h >> 8u);
        for (var k = 0u; k < 32u; k++) {
            put_byte(off + 2u + k, bitcast<u32>(i32(round_away(src_at(s + k) * id))));
        }
    } else {
        // The signed value of largest magnitude (the first on ties), as ggml's.
        var amax = 0.0;
        var mx = 0.0;
        for (var k = 0u; k < 32u; k++) {
            let v = src_at(s + k);
            if (abs(v) > amax) {
                amax = abs(v);
                mx = v;
            }
        }
        let d = mx / -8.0;
        let id = select(0.0, 1.0 / d, d != 0.0);
        let h = f16_bits(d);
        put_byte(off, h);
        put_byte(off + 1u, h >> 8u);
        for (var k = 0u; k < 16u; k++) {
            // ggml rounds x * id + 8.5 once (a fused multiply-add), then truncates; clamp as
            // kernels-ref's saturating cast and min(15).
            let lo = u32(clamp(trunc(fma(src_at(s + k), id, 8.5)), 0.0, 15.0));
            let hi = u32(clamp(trunc(fma(src_at(s + k + 16u), id, 8.5)), 0.0, 15.0));
            put_byte(off + 2u + k, lo | (hi << 4u));
        }
    }
}

@compute @workgroup_size(WG)
fn main(
    @builtin(workgroup_id) wid: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
) {
    var i = (wid.x + wid.y * P.groups_x) * WG + lid;
    second = i >= P.units_k;
    if (second) {
        i -= P.units_k;
        if (i >= P.units_v) {
            return;
        }
    }
    let n = P.n_tokens * P.row_len;
    if (TYPE == 0u) {
        if (i < n) {
            cache_set(P.pos0 * P.row_len + i, bitcast<u32>(src_at(i)));
        }
        return;
    }
    if (TYPE == 1u) {
        if (i < n / 2u) {
            cache_set(P.pos0 * P.row_len / 2u + i, f16_bits(src_at(2u * i)) | (f16_bits(src_at(2u * i + 1u)) << 16u));
        }
        return;
    }
    // Blocks b0..b1 of the whole cache are written; invocation i takes the pair p.
    let b0 = P.pos0 * P.row_len / 32u;
    let b1 = b0 + n / 32u;
    let p = b0 / 2u + i;
    if (2u * p >= b1) {
        return;
    }
    let bs = select(18u, 34u, TYPE == 2u);
    let words = bs / 2u;
    // A pair half outside the range belongs to a row this dispatch does not write: keep its
    // bytes (no other invocation touches this pair's words).
    let whole = 2u * p >= b0 && 2u * p + 1u < b1;
    for (var w = 0u; w < words; w++) {
        pw[w] = select(cache_get(p * words + w), 0u, whole);
    }
    for (var t = 0u; t < 2u; t++) {
        let b = 2u * p + t;
        if (b >= b0 && b < b1) {
            quant_block((b - b0) * 32u, t * bs);
        }
    }
    for (var w = 0u; w < words; w++) {
        cache_set(p * words + w, pw[w]);
    }
}
