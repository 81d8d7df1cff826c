//! Activation quantization: each token's input row is turned into 8-bit chunks of 32 once per
//! matmul, so every weight format's dot product is an integer one.
//!
//! One activation format serves all weight formats: a per-32 f32 scale `d` (finer than ggml's
//! per-256 Q8_K, so K-quant dot products lose less), and the scaled sum of each half chunk
//! `xs = d * Σ q` over 16 values, which pays for the offset (min / -8 / -32) terms of the weights.

/// The integer offsets O (w = d (u - O)) whose terms -O Σ q `QAct` holds precomputed: an
/// enum, so that a format without one cannot silently get another's.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum IntOff {
    /// Q4_0 (4-bit codes 0..15 around 8).
    O8,
    /// Q8_0 as unsigned bytes (signed codes + 128).
    O128,
}

/// Quantized activations for `n_tokens` rows of `cols` values.
#[derive(Default)]
pub(crate) struct QAct {
    /// [n_tokens, cols] quantized values, |q| <= 127.
    pub qs: Vec<i8>,
    /// [n_tokens, cols / 32] scale of each chunk: x ≈ d * q.
    pub d: Vec<f32>,
    /// [n_tokens, cols / 16] d * (sum of the 16 q values of each half chunk).
    pub xs: Vec<f32>,
    /// [n_tokens, cols / 32] d * (sum of the chunk's 32 q values).
    pub xs32: Vec<f32>,
    /// [n_tokens, cols / 32] -8 and -128 times the sum of the chunk's 32 q values: the exact
    /// integer offset terms of a Q4_0 and a Q8_0 chunk's dot in the AVX-512 GEMM, stored
    /// scaled so that its inner loop starts each sum from one broadcast load.
    pub off8: Vec<i32>,
    pub off128: Vec<i32>,
    /// [n_tokens, cols / 16] plain integer sum of each half chunk's 16 q values: the offset
    /// terms of formats with one scale per half chunk (Q6_K), exact in i32.
    pub h16: Vec<i32>,
    pub cols: usize,
    pub n_tokens: usize,
}

impl QAct {
    /// Sizes the buffers (growing only) for `n_tokens` rows of `cols` (a multiple of 32).
    fn reset(&mut self, n_tokens: usize, cols: usize) {
        let n = n_tokens * cols;
        self.qs.resize(n, 0);
        self.d.resize(n / 32, 0.0);
        self.xs.resize(n / 16, 0.0);
        self.xs32.resize(n / 32, 0.0);
        self.off8.resize(n / 32, 0);
        self.off128.resize(n / 32, 0);
        self.h16.resize(n / 16, 0);
        self.cols = cols;
        self.n_tokens = n_tokens;
    }

    /// Token `t`'s slices: (qs [cols], d [cols/32], xs [cols/16]).
    #[inline]
    pub fn token(&self, t: usize) -> (&[i8], &[f32], &[f32]) {
        let c = self.cols;
        (
            &self.qs[t * c..(t + 1) * c],
            &self.d[t * c / 32..(t + 1) * c / 32],
            &self.xs[t * c / 16..(t + 1) * c / 16],
        )
    }

    /// Token `t`'s chunk sums [cols / 32].
    #[inline]
    pub fn xs32(&self, t: usize) -> &[f32] {
        let c = self.cols / 32;
        &self.xs32[t * c..(t + 1) * c]
    }

    /// Token `t`'s integer chunk sums times -O [cols / 32] (`off8` or `off128`).
    #[inline]
    pub fn offs(&self, t: usize, off: IntOff) -> &[i32] {
        let c = self.cols / 32;
        let v = match off {
            IntOff::O8 => &self.off8,
            IntOff::O128 => &self.off128,
        };
        &v[t * c..(t + 1) * c]
    }

    /// Token `t`'s integer half-chunk sums [cols / 16].
    #[inline]
    pub fn h16(&self, t: usize) -> &[i32] {
        let c = self.cols / 16;
        &self.h16[t * c..(t + 1) * c]
    }

    /// Quantizes `x` ([n_tokens, cols]) with the portable code.
    pub fn quantize_scalar(&mut self, x: &[f32], n_tokens: usize, cols: usize) {
        self.reset(n_tokens, cols);
        let chunks = x
            .chunks_exact(32)
            .zip(self.qs.chunks_exact_mut(32))
            .zip(self.d.iter_mut())
            .zip(self.xs.chunks_exact_mut(2))
            .zip(self.xs32.iter_mut())
            .zip(self.off8.iter_mut().zip(self.off128.iter_mut()))
            .zip(self.h16.chunks_exact_mut(2));
        for ((((((xc, qc), d), xs), xs32), (o8, o128)), h16) in chunks {
            let amax = xc.iter().fold(0.0f32, |m, v| m.max(v.abs()));
            let dd = amax / 127.0;
            let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
            let mut sums = [0i32; 2];
            for (i, (q, &v)) in qc.iter_mut().zip(xc).enumerate() {
                // Ties to even, as the AVX2 rounding instruction does, so both paths agree.
                let r = (v * id).round_ties_even() as i32;
                *q = r as i8;
                sums[i / 16] += r;
            }
            *d = dd;
            xs[0] = dd * sums[0] as f32;
            xs[1] = dd * sums[1] as f32;
            *xs32 = dd * (sums[0] + sums[1]) as f32;
            (*o8, *o128) = (-8 * (sums[0] + sums[1]), -128 * (sums[0] + sums[1]));
            h16.copy_from_slice(&sums);
        }
    }

    /// Quantizes `x` ([n_tokens, cols]) with AVX2; same results as `quantize_scalar`.
    #[cfg(target_arch = "x86_64")]
    pub fn quantize_avx2(&mut self, x: &[f32], n_tokens: usize, cols: usize) {
        self.reset(n_tokens, cols);
        let chunks = x
            .chunks_exact(32)
            .zip(self.qs.chunks_exact_mut(32))
            .zip(self.d.iter_mut())
            .zip(self.xs.chunks_exact_mut(2))
            .zip(self.xs32.iter_mut())
            .zip(self.off8.iter_mut().zip(self.off128.iter_mut()))
            .zip(self.h16.chunks_exact_mut(2));
        for ((((((xc, qc), d), xs), xs32), (o8, o128)), h16) in chunks {
            // SAFETY: the caller selected this path after `is_x86_feature_detected!("avx2")`;
            // the slices are exactly 32 and 2 long, as quant_chunk_avx2 requires.
            unsafe { quant_chunk_avx2(xc, qc, d, xs, xs32, (o8, o128), h16) };
        }
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn quant_chunk_avx2(
    xc: &[f32],
    qc: &mut [i8],
    d: &mut f32,
    xs: &mut [f32],
    xs32: &mut f32,
    (o8, o128): (&mut i32, &mut i32),
    h16: &mut [i32],
) {
    use std::arch::x86_64::*;
    debug_assert!(xc.len() == 32 && qc.len() == 32 && xs.len() == 2 && h16.len() == 2);
    // SAFETY (loads/stores): xc has 32 f32 and qc 32 bytes, so every access below is in bounds.
    unsafe {
        let p = xc.as_ptr();
        let v = [
            _mm256_loadu_ps(p),
            _mm256_loadu_ps(p.add(8)),
            _mm256_loadu_ps(p.add(16)),
            _mm256_loadu_ps(p.add(24)),
        ];
        let sign = _mm256_set1_ps(-0.0);
        let mut m = _mm256_andnot_ps(sign, v[0]);
        for vi in &v[1..] {
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, *vi));
        }
        let m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        let m2 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
        let m1 = _mm_max_ss(m2, _mm_movehdup_ps(m2));
        let amax = _mm_cvtss_f32(m1);
        let dd = amax / 127.0;
        let id = if dd > 0.0 { 1.0 / dd } else { 0.0 };
        let idv = _mm256_set1_ps(id);
        let mut q = [_mm256_setzero_si256(); 4];
        for (qi, vi) in q.iter_mut().zip(v) {
            let r = _mm256_round_ps(
                _mm256_mul_ps(vi, idv),
                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
            );
            *qi = _mm256_cvtps_epi32(r);
        }
        let s0 = hsum_i32(_mm256_add_epi32(q[0], q[1]));
        let s1 = hsum_i32(_mm256_add_epi32(q[2], q[3]));
        // packs interleave 128-bit lanes; the final permute restores element order.
        let a = _mm256_packs_epi32(q[0], q[1]);
        let b = _mm256_packs_epi32(q[2], q[3]);
        let c = _mm256_packs_epi16(a, b);
        let c = _mm256_permutevar8x32_epi32(c, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256(qc.as_mut_ptr() as *mut __m256i, c);
        *d = dd;
        xs[0] = dd * s0 as f32;
        xs[1] = dd * s1 as f32;
        *xs32 = dd * (s0 + s1) as f32;
        (*o8, *o128) = (-8 * (s0 + s1), -128 * (s0 + s1));
        h16[0] = s0;
        h16[1] = s1;
    }
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn hsum_i32(v: std::arch::x86_64::__m256i) -> i32 {
    use std::arch::x86_64::*;
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b01_00_11_10));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0b10_11_00_01));
    _mm_cvtsi128_si32(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The AVX2 quantizer must produce the very bytes, scales and sums of the portable one
    /// (both round ties to even), so the two matmul paths see the same activations.
    #[test]
    fn avx2_quantizer_matches_scalar() {
        if !crate::cpu::Isa::Avx2.available() {
            return;
        }
        let mut s = 0x2545_f491_4f6c_dd1du64;
        let mut x: Vec<f32> = (0..3 * 320)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5)
                    * if s.is_multiple_of(50) { 80.0 } else { 2.0 }
            })
            .collect();
        // An all-zero chunk (d = 0), a chunk of exact ties, and a single huge outlier.
        x[32..64].fill(0.0);
        // amax 127 gives d = 1, so k + 0.5 sits exactly on a rounding tie.
        for (i, v) in x[64..96].iter_mut().enumerate() {
            *v = i as f32 - 16.5;
        }
        x[64] = 127.0;
        x[100] = 1e6;
        let (mut a, mut b) = (QAct::default(), QAct::default());
        a.quantize_scalar(&x, 3, 320);
        #[cfg(target_arch = "x86_64")]
        b.quantize_avx2(&x, 3, 320);
        assert_eq!(a.qs, b.qs);
        assert_eq!(a.d, b.d);
        assert_eq!(a.xs, b.xs);
        assert_eq!(a.xs32, b.xs32);
        assert_eq!((&a.off8, &a.off128), (&b.off8, &b.off128));
        assert_eq!(a.h16, b.h16);
        // Quantization error is at most d/2 per element.
        for (i, (&q, &v)) in a.qs.iter().zip(&x).enumerate() {
            let d = a.d[i / 32];
            assert!((d * q as f32 - v).abs() <= d * 0.5 * 1.0001, "element {i}");
        }
    }
}
