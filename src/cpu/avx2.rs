//! AVX2 + FMA + F16C kernels (x86_64). Every function here must only be reached after the
//! dispatcher in `mod.rs` has checked those features at runtime.
//!
//! Integer dot products follow ggml: `_mm256_maddubs_epi16` multiplies unsigned weight bytes by
//! signed activation bytes into i16 pairs (no overflow: |u| <= 63 or, after `abs`, 128, times 127,
//! times 2 stays below 32767), and `_mm256_madd_epi16` widens to i32 while applying the integer
//! per-half multiplier. Signed weights (Q8_0, IQ4_NL) use the sign trick: |w| times x·sign(w).
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::act::QAct;
use super::formats::{self as f, Format, KParams};
use super::TILE;

pub(crate) use super::avx2_float::dot_f;

/// One decoded chunk in registers (see `formats` for the meaning of each field).
pub(crate) struct V {
    u: __m256i,
    mul: __m256i,
    dw: f32,
    c: [f32; 2],
}

/// AVX2 decoding of a format's chunk; same values as `Format::unpack`.
pub(crate) trait FormatAvx2: Format {
    /// # Safety
    /// AVX2/FMA/F16C must be available; `blk.len() == Self::BYTES`, `c < BLOCK / 32`.
    unsafe fn unpack_avx2(blk: &[u8], p: &Self::P, c: usize) -> V;
    /// Every chunk's `mul` is 1, so the AVX-VNNI kernels may use one `vpdpbusd` (u8 x i8 summed
    /// four at a time into i32, no i16 step) for `maddubs` + `madd` by ones: the same sums,
    /// since the i16 pairs cannot saturate (see the module comment).
    const UNIT_MUL: bool = true;
    /// `Format::params` with F16C conversions.
    /// # Safety
    /// As `unpack_avx2`.
    unsafe fn params_avx2(blk: &[u8]) -> Self::P;
}

/// The two halves at blk[off..off + 4] as f32, by F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn h2(blk: &[u8], off: usize) -> (f32, f32) {
    let w = u32::from_le_bytes([blk[off], blk[off + 1], blk[off + 2], blk[off + 3]]);
    let v = _mm_cvtph_ps(_mm_cvtsi32_si128(w as i32));
    (_mm_cvtss_f32(v), _mm_cvtss_f32(_mm_movehdup_ps(v)))
}

/// The half at blk[off..off + 2] as f32, by F16C.
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn h1(blk: &[u8], off: usize) -> f32 {
    let w = u16::from_le_bytes([blk[off], blk[off + 1]]);
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(w as i32)))
}

const ONES: i16 = 1;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn nibbles(qs: &[u8]) -> __m256i {
    assert!(qs.len() >= 16);
    // SAFETY: 16 bytes are in bounds (checked above).
    let q = unsafe { _mm_loadu_si128(qs.as_ptr() as *const __m128i) };
    let m = _mm_set1_epi8(15);
    let lo = _mm_and_si128(q, m);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), m);
    _mm256_set_m128i(hi, lo)
}

/// 32 bytes in bounds of `b[off..]`.
#[inline]
#[target_feature(enable = "avx2")]
fn load32(b: &[u8], off: usize) -> __m256i {
    let s = &b[off..off + 32];
    // SAFETY: `s` is exactly 32 bytes.
    unsafe { _mm256_loadu_si256(s.as_ptr() as *const __m256i) }
}

/// Byte i of the result is 0xFF when bit i of `bits` is set.
#[inline]
#[target_feature(enable = "avx2")]
fn bytes_from_bits(bits: u32) -> __m256i {
    let x = _mm256_set1_epi32(bits as i32);
    let shuf = _mm256_setr_epi64x(
        0x0000_0000_0000_0000,
        0x0101_0101_0101_0101,
        0x0202_0202_0202_0202,
        0x0303_0303_0303_0303,
    );
    let b = _mm256_shuffle_epi8(x, shuf);
    let b = _mm256_or_si256(b, _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe));
    _mm256_cmpeq_epi8(b, _mm256_set1_epi64x(-1))
}

/// Byte i is 0xFF when bit `c` of `b[i]` is set.
#[inline]
#[target_feature(enable = "avx2")]
fn bit_of_bytes(b: __m256i, c: usize) -> __m256i {
    let m = _mm256_set1_epi8((1u8 << c) as i8);
    _mm256_cmpeq_epi8(_mm256_and_si256(b, m), m)
}

/// Per-byte logical right shift by `s` (epi16 shift, then the caller masks).
#[inline]
#[target_feature(enable = "avx2")]
fn srl(v: __m256i, s: usize) -> __m256i {
    _mm256_srl_epi16(v, _mm_cvtsi32_si128(s as i32))
}

#[inline]
#[target_feature(enable = "avx2")]
fn mul2(a: i32, b: i32) -> __m256i {
    _mm256_set_m128i(_mm_set1_epi16(b as i16), _mm_set1_epi16(a as i16))
}

#[inline]
#[target_feature(enable = "avx2")]
fn v(u: __m256i, mul: __m256i, dw: f32, c: [f32; 2]) -> V {
    V { u, mul, dw, c }
}

impl FormatAvx2 for f::Q4_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h1(blk, 0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], d: &f32, _c: usize) -> V {
        v(
            nibbles(&blk[2..]),
            _mm256_set1_epi16(ONES),
            *d,
            [-8.0 * d; 2],
        )
    }
}
impl FormatAvx2 for f::Q4_1 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h2(blk, 0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], p: &(f32, f32), _c: usize) -> V {
        v(nibbles(&blk[4..]), _mm256_set1_epi16(ONES), p.0, [p.1; 2])
    }
}
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn q5(qh: &[u8], qs: &[u8]) -> __m256i {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    let hb = _mm256_and_si256(bytes_from_bits(h), _mm256_set1_epi8(16));
    _mm256_or_si256(nibbles(qs), hb)
}
impl FormatAvx2 for f::Q5_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h1(blk, 0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], d: &f32, _c: usize) -> V {
        v(
            q5(&blk[2..6], &blk[6..]),
            _mm256_set1_epi16(ONES),
            *d,
            [-16.0 * d; 2],
        )
    }
}
impl FormatAvx2 for f::Q5_1 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h2(blk, 0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], p: &(f32, f32), _c: usize) -> V {
        v(
            q5(&blk[4..8], &blk[8..]),
            _mm256_set1_epi16(ONES),
            p.0,
            [p.1; 2],
        )
    }
}
impl FormatAvx2 for f::Q8_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h1(blk, 0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], d: &f32, _c: usize) -> V {
        v(load32(blk, 2), _mm256_set1_epi16(ONES), *d, [0.0; 2])
    }
}
/// The 32 signed IQ4_NL levels of the nibbles in `qs[..16]` (IQ4_NL's and IQ4_XS's chunks).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn iq4_levels(qs: &[u8]) -> __m256i {
    let t = &f::IQ4NL_VALUES;
    // SAFETY: IQ4NL_VALUES has exactly 16 bytes.
    let t128 = unsafe { _mm_loadu_si128(t.as_ptr() as *const __m128i) };
    _mm256_shuffle_epi8(_mm256_set_m128i(t128, t128), nibbles(qs))
}

impl FormatAvx2 for f::IQ4_NL {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h1(blk, 0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], d: &f32, _c: usize) -> V {
        v(iq4_levels(&blk[2..]), _mm256_set1_epi16(ONES), *d, [0.0; 2])
    }
}
impl FormatAvx2 for f::IQ4_XS {
    const UNIT_MUL: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h1(blk, 0)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], d: &f32, c: usize) -> V {
        let m = f::iq4xs_scale(blk, c) - 32;
        v(iq4_levels(&blk[8 + 16 * c..]), mul2(m, m), *d, [0.0; 2])
    }
}
#[inline]
#[target_feature(enable = "avx2,f16c")]
fn k_params(blk: &[u8]) -> KParams {
    let (d, dmin) = h2(blk, 0);
    let (sc, m) = f::k4_scales(&blk[4..16]);
    KParams { d, dmin, sc, m }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn k_common(qs: &[u8], c: usize, p: &KParams) -> (__m256i, V) {
    let q = load32(qs, 32 * (c / 2));
    let u = _mm256_and_si256(srl(q, 4 * (c & 1)), _mm256_set1_epi8(15));
    let s = p.sc[c] as i32;
    (u, v(u, mul2(s, s), p.d, [-p.dmin * p.m[c] as f32; 2]))
}
impl FormatAvx2 for f::Q4_K {
    const UNIT_MUL: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        k_params(blk)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], p: &KParams, c: usize) -> V {
        k_common(&blk[16..], c, p).1
    }
}
impl FormatAvx2 for f::Q5_K {
    const UNIT_MUL: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        k_params(blk)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], p: &KParams, c: usize) -> V {
        let (u, mut r) = k_common(&blk[48..], c, p);
        let hb = _mm256_and_si256(bit_of_bytes(load32(blk, 16), c), _mm256_set1_epi8(16));
        r.u = _mm256_or_si256(u, hb);
        r
    }
}
impl FormatAvx2 for f::Q6_K {
    const UNIT_MUL: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h1(blk, 208)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], d: &f32, c: usize) -> V {
        let (n, k) = (c / 4, c % 4);
        let ql = load32(blk, 64 * n + 32 * (k & 1));
        let lo = _mm256_and_si256(srl(ql, if k < 2 { 0 } else { 4 }), _mm256_set1_epi8(15));
        let qh = load32(blk, 128 + 32 * n);
        let hi = _mm256_and_si256(srl(qh, 2 * k), _mm256_set1_epi8(3));
        let u = _mm256_or_si256(lo, _mm256_slli_epi16(hi, 4));
        let sa = blk[192 + 2 * c] as i8 as i32;
        let sb = blk[192 + 2 * c + 1] as i8 as i32;
        v(
            u,
            mul2(sa, sb),
            *d,
            [-32.0 * d * sa as f32, -32.0 * d * sb as f32],
        )
    }
}
impl FormatAvx2 for f::Q2_K {
    const UNIT_MUL: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h2(blk, 80)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], p: &(f32, f32), c: usize) -> V {
        let (n, j) = (c / 4, c % 4);
        let u = _mm256_and_si256(srl(load32(blk, 16 + 32 * n), 2 * j), _mm256_set1_epi8(3));
        let (sa, sb) = (blk[2 * c], blk[2 * c + 1]);
        let cc = [-p.1 * (sa >> 4) as f32, -p.1 * (sb >> 4) as f32];
        v(u, mul2((sa & 15) as i32, (sb & 15) as i32), p.0, cc)
    }
}
impl FormatAvx2 for f::Q3_K {
    const UNIT_MUL: bool = false;
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        (h1(blk, 108), f::q3k_scales(&blk[96..108]))
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], p: &(f32, [i8; 16]), c: usize) -> V {
        let (n, j) = (c / 4, c % 4);
        let lo = _mm256_and_si256(srl(load32(blk, 32 + 32 * n), 2 * j), _mm256_set1_epi8(3));
        let hi = _mm256_and_si256(bit_of_bytes(load32(blk, 0), c), _mm256_set1_epi8(4));
        let (sa, sb) = (p.1[2 * c] as i32, p.1[2 * c + 1] as i32);
        let cc = [-4.0 * p.0 * sa as f32, -4.0 * p.0 * sb as f32];
        v(_mm256_or_si256(lo, hi), mul2(sa, sb), p.0, cc)
    }
}
impl FormatAvx2 for f::TQ2_0 {
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn params_avx2(blk: &[u8]) -> Self::P {
        h1(blk, 64)
    }
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    unsafe fn unpack_avx2(blk: &[u8], d: &f32, c: usize) -> V {
        let q = load32(blk, 32 * (c / 4));
        let u = _mm256_and_si256(srl(q, 2 * (c % 4)), _mm256_set1_epi8(3));
        v(u, _mm256_set1_epi16(ONES), *d, [-d; 2])
    }
}

#[inline]
#[target_feature(enable = "avx2,fma")]
pub(crate) fn hsum(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_movehdup_ps(s));
    _mm_cvtss_f32(s)
}

/// Chunks per correction segment (a power of two): the per-half offsets of a segment are
/// gathered into a stack buffer and dotted with each token's half sums afterwards, 8 lanes at a
/// time, instead of adding two scalar products per chunk per token in a serial chain.
const SEG: usize = 64;

/// corr[t] += Σ_k cbuf[k] · xs_t[off + k] for k < n.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn flush_corr<const T: usize>(
    cbuf: &[f32; 2 * SEG],
    n: usize,
    xs: &[&[f32]; T],
    off: usize,
    corr: &mut [__m256; T],
) {
    for t in 0..T {
        let xs = &xs[t][off..off + n];
        let cb = &cbuf[..n];
        let mut k = 0;
        while k + 8 <= n {
            // SAFETY: k + 8 <= n = len of both slices.
            let (cv, xv) = unsafe {
                (
                    _mm256_loadu_ps(cb[k..].as_ptr()),
                    _mm256_loadu_ps(xs[k..].as_ptr()),
                )
            };
            corr[t] = _mm256_fmadd_ps(cv, xv, corr[t]);
            k += 8;
        }
        let tail: f32 = cb[k..].iter().zip(&xs[k..]).map(|(a, b)| a * b).sum();
        corr[t] = _mm256_add_ps(corr[t], _mm256_setr_ps(tail, 0., 0., 0., 0., 0., 0., 0.));
    }
}

/// i32 sums of u8 x i8 products by pairs, times the per-half multipliers (AVX2).
#[inline]
#[target_feature(enable = "avx2")]
fn mad_avx2(u: __m256i, x: __m256i, mul: __m256i, _unit: bool) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), mul)
}

/// `mad_avx2` with one AVX-VNNI instruction when the multipliers are all 1; the same i32 lanes
/// (lane k sums products 4k..4k+4, as madd(maddubs) does).
#[inline]
#[target_feature(enable = "avx2,avxvnni")]
fn mad_vnni(u: __m256i, x: __m256i, mul: __m256i, unit: bool) -> __m256i {
    if unit {
        _mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u, x)
    } else {
        _mm256_madd_epi16(_mm256_maddubs_epi16(u, x), mul)
    }
}

/// The integer-dot kernels, stamped out once per instruction set: target features are per
/// function, so the AVX-VNNI copy must be its own code (compiled with `avxvnni` enabled), and
/// the AVX2 copy must never be (it runs on CPUs without VNNI).
macro_rules! dot_q_kernels {
    ($m:ident, $feat:literal, $mad:ident) => {
        pub(crate) mod $m {
            use super::*;

            /// out[t] = row · x[t0 + t] for `T` tokens. `row` holds whole blocks of `F`.
            ///
            /// # Safety
            /// AVX2/FMA/F16C must be available.
            #[target_feature(enable = $feat)]
            unsafe fn dot_q_t<F: FormatAvx2, const T: usize>(
                rows: &[u8],
                rb: usize,
                act: &QAct,
                t0: usize,
                out: &mut [f32],
                stride: usize,
            ) {
                let cpb = F::BLOCK / 32;
                let nch = rb / F::BYTES * cpb;
                // Raw pointers for the hot loop, checked once here: chunk ci < nch reads qs[32ci..32ci+32]
                // and d[ci].
                let mut qp = [std::ptr::null::<i8>(); T];
                let mut dp = [std::ptr::null::<f32>(); T];
                // Offsets pair with half sums (xs16) for formats whose halves differ, else with chunk sums.
                let mut xs: [&[f32]; T] = [&[]; T];
                for t in 0..T {
                    let (q, d, x16) = act.token(t0 + t);
                    let x = if F::SPLIT { x16 } else { act.xs32(t0 + t) };
                    let per = if F::SPLIT { 2 } else { 1 };
                    assert!(q.len() >= nch * 32 && d.len() >= nch && x.len() >= per * nch);
                    qp[t] = q.as_ptr();
                    dp[t] = d.as_ptr();
                    xs[t] = x;
                }
                for (r, row) in rows.chunks_exact(rb).enumerate() {
                    let o = &mut out[r * stride..r * stride + T];
                    dot_q_row::<F, T>(row, &qp, &dp, &xs, o);
                }
            }

            /// One row of `dot_q_t`; `qp`, `dp`, `xs` were checked against the row's chunk count there.
            #[inline]
            #[target_feature(enable = $feat)]
            unsafe fn dot_q_row<F: FormatAvx2, const T: usize>(
                row: &[u8],
                qp: &[*const i8; T],
                dp: &[*const f32; T],
                xs: &[&[f32]; T],
                out: &mut [f32],
            ) {
                let cpb = F::BLOCK / 32;
                let mut acc = [_mm256_setzero_ps(); T];
                let mut corr = [_mm256_setzero_ps(); T];
                // Offsets per chunk stored in cbuf, and chunks per flush.
                let per = if F::SPLIT { 2 } else { 1 };
                let ch = 2 * SEG / per;
                let mut cbuf = [0f32; 2 * SEG];
                let mut ci = 0;
                for blk in row.chunks_exact(F::BYTES) {
                    // SAFETY: features checked by the dispatcher; blk is one whole block.
                    let p = unsafe { F::params_avx2(blk) };
                    for c in 0..cpb {
                        // SAFETY: as above, and c < cpb.
                        let v = unsafe { F::unpack_avx2(blk, &p, c) };
                        let (u, s) = if F::SIGNED {
                            (_mm256_sign_epi8(v.u, v.u), v.u)
                        } else {
                            (v.u, v.u)
                        };
                        for t in 0..T {
                            // SAFETY: ci < nch, and the lengths were asserted above.
                            let (x, dx) = unsafe {
                                (
                                    _mm256_loadu_si256(qp[t].add(ci * 32) as *const __m256i),
                                    *dp[t].add(ci),
                                )
                            };
                            let x = if F::SIGNED { _mm256_sign_epi8(x, s) } else { x };
                            let prod = $mad(u, x, v.mul, F::UNIT_MUL);
                            acc[t] = _mm256_fmadd_ps(
                                _mm256_cvtepi32_ps(prod),
                                _mm256_set1_ps(v.dw * dx),
                                acc[t],
                            );
                        }
                        if !F::SIGNED {
                            let k = ci % ch;
                            cbuf[per * k] = v.c[0];
                            if F::SPLIT {
                                cbuf[per * k + 1] = v.c[1];
                            }
                            if k == ch - 1 {
                                flush_corr(&cbuf, 2 * SEG, xs, per * (ci + 1 - ch), &mut corr);
                            }
                        }
                        ci += 1;
                    }
                }
                if !F::SIGNED && ci % ch != 0 {
                    flush_corr(&cbuf, per * (ci % ch), xs, per * (ci - ci % ch), &mut corr);
                }
                for t in 0..T {
                    out[t] = hsum(_mm256_add_ps(acc[t], corr[t]));
                }
            }

            /// out[r * stride + t] = rows[r] · x[t0 + t] for every row of `rb` bytes in `rows` and
            /// `nt` (1..=TILE) tokens.
            ///
            /// # Safety
            /// AVX2/FMA/F16C must be available.
            pub(crate) unsafe fn dot_q<F: FormatAvx2>(
                rows: &[u8],
                rb: usize,
                act: &QAct,
                t0: usize,
                nt: usize,
                out: &mut [f32],
                stride: usize,
            ) {
                // SAFETY: forwarded from the caller.
                unsafe {
                    match nt {
                        1 => dot_q_t::<F, 1>(rows, rb, act, t0, out, stride),
                        2 => dot_q_t::<F, 2>(rows, rb, act, t0, out, stride),
                        3 => dot_q_t::<F, 3>(rows, rb, act, t0, out, stride),
                        4 => dot_q_t::<F, 4>(rows, rb, act, t0, out, stride),
                        5 => dot_q_t::<F, 5>(rows, rb, act, t0, out, stride),
                        6 => dot_q_t::<F, 6>(rows, rb, act, t0, out, stride),
                        7 => dot_q_t::<F, 7>(rows, rb, act, t0, out, stride),
                        _ => dot_q_t::<F, TILE>(rows, rb, act, t0, out, stride),
                    }
                }
            }
        }
    };
}

dot_q_kernels!(plain, "avx2,fma,f16c", mad_avx2);
dot_q_kernels!(vnni, "avx2,fma,f16c,avxvnni", mad_vnni);

const _: () = assert!(TILE == 8, "dot_q / dot_f dispatch on tile sizes 1..=8");
