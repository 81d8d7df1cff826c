// The 8-bit quantization of one chunk of 32 activations (twin of src/cpu/act.rs
// `QAct::quantize_scalar`, bit for bit), shared by quantize_act.wgsl and the fused kernels that
// quantize what they write (rmsnorm_quant.wgsl, swiglu_quant.wgsl), so all give the same codes:
//   amax = max |x|, d = amax / 127, id = 1 / d (0 when d = 0), q = round_ties_even(x * id)
// and the scaled sums d * Σq over each half and over the chunk.
//
// Exactness: WGSL's `round` is ties-to-even and its f32 `*` is correctly rounded, as on the
// CPU; but WGSL allows 2.5 ulp for `/`, and phone GPUs divide through a reciprocal. So the two
// divisions are done by `div_rn` below, correctly rounded like the CPU's.

// Set to false to measure what the platform's own division gives (tests only).
override EXACT_DIV: bool = true;

// a / b rounded to nearest even, for finite a, b > 0 with a, b and the quotient normal, by
// integer long division of the significands (any rounding `/` may do is bypassed). Anything
// else (a subnormal input or result: |activations| below ~1.5e-36) uses the platform's `/`.
fn div_rn(a: f32, b: f32) -> f32 {
    let ab = bitcast<u32>(a);
    let bb = bitcast<u32>(b);
    let ea = i32(ab >> 23u);
    let eb = i32(bb >> 23u);
    if (!EXACT_DIV || ea == 0 || ea == 255 || eb == 0 || eb == 255) {
        return a / b;
    }
    let ma = (ab & 0x7FFFFFu) | 0x800000u;
    let mb = (bb & 0x7FFFFFu) | 0x800000u;
    // q = floor(ma / mb * 2^25): 26 quotient bits when ma >= mb, 25 otherwise.
    var r = ma;
    var q = 0u;
    for (var i = 0u; i < 26u; i++) {
        q <<= 1u;
        if (r >= mb) {
            r -= mb;
            q |= 1u;
        }
        r <<= 1u;
    }
    // Keep 24 significant bits; the dropped bits and the remainder decide the rounding.
    var shift = 1u;
    var e = ea - eb + 126;
    if (q >= 0x2000000u) {
        shift = 2u;
        e += 1;
    }
    if (e <= 0 || e >= 255) {
        return a / b;
    }
    var m = q >> shift;
    let rest = q & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    if (rest > half || (rest == half && (r != 0u || (m & 1u) == 1u))) {
        m += 1u;
    }
    // m is in [2^23, 2^24]; m = 2^24 carries into the exponent, as it should.
    return bitcast<f32>((u32(e) << 23u) + (m - 0x800000u));
}

// max(m, |v.x|, |v.y|, |v.z|, |v.w|) in that order (as
// src/cpu/act.rs scans the chunk).
fn amax4(m: f32, v: vec4<f32>) -> f32 {
    return max(max(max(max(m, abs(v.x)), abs(v.y)), abs(v.z)), abs(v.w));
}

// The four codes of `v` (round(v * id)) and their word: code j in byte j.
fn code_word(q: vec4<i32>) -> u32 {
    let b = bitcast<vec4<u32>>(q) & vec4<u32>(0xFFu);
    return b.x | (b.y << 8u) | (b.z << 16u) | (b.w << 24u);
}

fn hsum(q: vec4<i32>) -> i32 {
    return q.x + q.y + q.z + q.w;
}

// Quantizes chunk `ci`, its 32 values given as eight vec4 (element 4k + j is component j of
// vk), into qx[8 ci..8 ci + 8] and qd[ci] as described at the top of this file. The kernel
// composed after this fragment declares `qx: array<u32>` ([n_chunks, 8] words: element 4k + j
// in byte j of word k) and `qd: array<vec4<f32>>` ([n_chunks]: d, d * Σq over 0..16,
// d * Σq over 16..32, d * Σq) as read_write storage (their binding numbers are the kernel's).
// Why no array: on lavapipe a local array (and one returned by a function) lives in scratch
// memory addressed lane by lane, which cost the fused kernels most of their time; eight vec4
// arguments stay in registers.
fn quantize_store8(
    ci: u32,
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
) {
    var amax = amax4(0.0, v0);
    amax = amax4(amax, v1);
    amax = amax4(amax, v2);
    amax = amax4(amax, v3);
    amax = amax4(amax, v4);
    amax = amax4(amax, v5);
    amax = amax4(amax, v6);
    amax = amax4(amax, v7);
    let d = div_rn(amax, 127.0);
    var id = 0.0;
    if (d > 0.0) {
        id = div_rn(1.0, d);
    }
    let q0 = vec4<i32>(round(v0 * id));
    let q1 = vec4<i32>(round(v1 * id));
    let q2 = vec4<i32>(round(v2 * id));
    let q3 = vec4<i32>(round(v3 * id));
    let q4 = vec4<i32>(round(v4 * id));
    let q5 = vec4<i32>(round(v5 * id));
    let q6 = vec4<i32>(round(v6 * id));
    let q7 = vec4<i32>(round(v7 * id));
    let w = ci * 8u;
    qx[w] = code_word(q0);
    qx[w + 1u] = code_word(q1);
    qx[w + 2u] = code_word(q2);
    qx[w + 3u] = code_word(q3);
    qx[w + 4u] = code_word(q4);
    qx[w + 5u] = code_word(q5);
    qx[w + 6u] = code_word(q6);
    qx[w + 7u] = code_word(q7);
    let s0 = hsum(q0 + q1 + q2 + q3);
    let s1 = hsum(q4 + q5 + q6 + q7);
    qd[ci] = vec4<f32>(d, d * f32(s0), d * f32(s1), d * f32(s0 + s1));
}

// quantize_store8 of a chunk held in an array (attention_split.wgsl builds one).
fn quantize_store(ci: u32, v: array<f32, 32>) {
    quantize_store8(
        ci,
        vec4<f32>(v[0], v[1], v[2], v[3]),
        vec4<f32>(v[4], v[5], v[6], v[7]),
        vec4<f32>(v[8], v[9], v[10], v[11]),
        vec4<f32>(v[12], v[13], v[14], v[15]),
        vec4<f32>(v[16], v[17], v[18], v[19]),
        vec4<f32>(v[20], v[21], v[22], v[23]),
        vec4<f32>(v[24], v[25], v[26], v[27]),
        vec4<f32>(v[28], v[29], v[30], v[31]),
    );
}
