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

// One quantized chunk: its eight words of four int8 codes (element 4k + j in byte j of word
// k) and (d, d * Σq over 0..16, d * Σq over 16..32, d * Σq).
struct QuantChunk {
    w: array<u32, 8>,
    d: vec4<f32>,
}

fn quantize_chunk(v: array<f32, 32>) -> QuantChunk {
    var amax = 0.0;
    for (var j = 0u; j < 32u; j++) {
        amax = max(amax, abs(v[j]));
    }
    let d = div_rn(amax, 127.0);
    var id = 0.0;
    if (d > 0.0) {
        id = div_rn(1.0, d);
    }
    var out: QuantChunk;
    var s = vec2<i32>(0);
    for (var k = 0u; k < 8u; k++) {
        var w = 0u;
        for (var j = 0u; j < 4u; j++) {
            let q = i32(round(v[4u * k + j] * id));
            s[k / 4u] += q;
            w |= (bitcast<u32>(q) & 0xFFu) << (8u * j);
        }
        out.w[k] = w;
    }
    out.d = vec4<f32>(d, d * f32(s.x), d * f32(s.y), d * f32(s.x + s.y));
    return out;
}

// Quantizes chunk `ci` (its 32 values `v`) into qx[8 ci..8 ci + 8] and qd[ci]. The kernel
// composed after this fragment declares `qx: array<u32>` ([n_chunks, 8] words: element 4k + j
// in byte j of word k) and `qd: array<vec4<f32>>` ([n_chunks], QuantChunk.d) as read_write
// storage (their binding numbers are the kernel's).
fn quantize_store(ci: u32, v: array<f32, 32>) {
    let q = quantize_chunk(v);
    for (var k = 0u; k < 8u; k++) {
        qx[ci * 8u + k] = q.w[k];
    }
    qd[ci] = q.d;
}
