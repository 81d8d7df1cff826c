//! AVX2 + FMA + F16C kernels for F32/F16/BF16 weights: f32 FMA dot products, weights widened
//! 8 at a time. Only reached after the dispatcher in `mod.rs` has checked those features.

use std::arch::x86_64::*;

use super::avx2::hsum;
use super::{FloatFormat, TILE};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_w8(fmt: FloatFormat, row: &[u8], i: usize) -> __m256 {
    match fmt {
        FloatFormat::F32 => {
            let s = &row[4 * i..4 * i + 32];
            // SAFETY: `s` holds 8 f32.
            unsafe { _mm256_loadu_ps(s.as_ptr() as *const f32) }
        }
        FloatFormat::F16 => {
            let s = &row[2 * i..2 * i + 16];
            // SAFETY: `s` holds 8 halves.
            _mm256_cvtph_ps(unsafe { _mm_loadu_si128(s.as_ptr() as *const __m128i) })
        }
        FloatFormat::Bf16 => {
            let s = &row[2 * i..2 * i + 16];
            // SAFETY: `s` holds 8 bf16.
            let h = unsafe { _mm_loadu_si128(s.as_ptr() as *const __m128i) };
            _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
        }
    }
}

#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f_t<const T: usize>(
    fmt: FloatFormat,
    rows: &[u8],
    rb: usize,
    x: &[f32],
    cols: usize,
    t0: usize,
    out: &mut [f32],
    stride: usize,
) {
    let mut xt: [&[f32]; T] = [&[]; T];
    for (t, s) in xt.iter_mut().enumerate() {
        *s = &x[(t0 + t) * cols..(t0 + t + 1) * cols];
    }
    for (r, row) in rows.chunks_exact(rb).enumerate() {
        // SAFETY: forwarded from the caller.
        unsafe { dot_f_row::<T>(fmt, row, &xt, cols, &mut out[r * stride..r * stride + T]) };
    }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f_row<const T: usize>(
    fmt: FloatFormat,
    row: &[u8],
    xt: &[&[f32]; T],
    cols: usize,
    out: &mut [f32],
) {
    let mut acc = [_mm256_setzero_ps(); T];
    let mut i = 0;
    while i + 8 <= cols {
        let w = load_w8(fmt, row, i);
        for t in 0..T {
            // SAFETY: i + 8 <= cols = xt[t].len().
            let xv = unsafe { _mm256_loadu_ps(xt[t][i..].as_ptr()) };
            acc[t] = _mm256_fmadd_ps(w, xv, acc[t]);
        }
        i += 8;
    }
    for t in 0..T {
        let mut s = hsum(acc[t]);
        for (k, &xv) in xt[t].iter().enumerate().skip(i) {
            s += super::scalar::float_at(fmt, row, k) * xv;
        }
        out[t] = s;
    }
}

/// Float-format row times `out.len()` (1..=TILE) f32 token rows.
///
/// # Safety
/// AVX2/FMA/F16C must be available.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn dot_f(
    fmt: FloatFormat,
    rows: &[u8],
    rb: usize,
    x: &[f32],
    cols: usize,
    t0: usize,
    nt: usize,
    out: &mut [f32],
    stride: usize,
) {
    // SAFETY: forwarded from the caller.
    unsafe {
        match nt {
            1 => dot_f_t::<1>(fmt, rows, rb, x, cols, t0, out, stride),
            2 => dot_f_t::<2>(fmt, rows, rb, x, cols, t0, out, stride),
            3 => dot_f_t::<3>(fmt, rows, rb, x, cols, t0, out, stride),
            4 => dot_f_t::<4>(fmt, rows, rb, x, cols, t0, out, stride),
            5 => dot_f_t::<5>(fmt, rows, rb, x, cols, t0, out, stride),
            6 => dot_f_t::<6>(fmt, rows, rb, x, cols, t0, out, stride),
            7 => dot_f_t::<7>(fmt, rows, rb, x, cols, t0, out, stride),
            _ => dot_f_t::<TILE>(fmt, rows, rb, x, cols, t0, out, stride),
        }
    }
}

/// q · (one head slice of an F32 or F16 KV cache row, `q.len()` values), 8 values per step
/// with the halves widened by F16C: the attention's key scan. Same operations in the same order
/// as `ops::dot` over the decoded values (8 lane sums of separate multiply and add, then the
/// lanes summed in order, then the tail), so the scores are bit-identical to the table path's.
///
/// # Safety
/// AVX2/FMA/F16C must be available; `kb` holds `q.len()` values of `fmt`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kv_dot(fmt: FloatFormat, q: &[f32], kb: &[u8]) -> f32 {
    let n = q.len();
    let mut acc = _mm256_setzero_ps();
    let mut i = 0;
    while i + 8 <= n {
        // SAFETY: i + 8 <= n = q.len().
        let qv = unsafe { _mm256_loadu_ps(q[i..].as_ptr()) };
        acc = _mm256_add_ps(acc, _mm256_mul_ps(qv, load_w8(fmt, kb, i)));
        i += 8;
    }
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    let tail: f32 = (i..n)
        .map(|k| q[k] * super::scalar::float_at(fmt, kb, k))
        .sum();
    lanes.iter().sum::<f32>() + tail
}

/// o += p · (one head slice of an F32 or F16 KV cache row, `o.len()` values): the attention's
/// value accumulation, multiply then add as the table path does (bit-identical results).
///
/// # Safety
/// AVX2/FMA/F16C must be available; `vb` holds `o.len()` values of `fmt`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kv_axpy(fmt: FloatFormat, p: f32, vb: &[u8], o: &mut [f32]) {
    let n = o.len();
    let pv = _mm256_set1_ps(p);
    let mut i = 0;
    while i + 8 <= n {
        let s = &mut o[i..i + 8];
        // SAFETY: `s` holds 8 f32.
        unsafe {
            let ov = _mm256_loadu_ps(s.as_ptr());
            let prod = _mm256_mul_ps(pv, load_w8(fmt, vb, i));
            _mm256_storeu_ps(s.as_mut_ptr(), _mm256_add_ps(ov, prod));
        }
        i += 8;
    }
    for (k, ov) in o.iter_mut().enumerate().skip(i) {
        *ov += p * super::scalar::float_at(fmt, vb, k);
    }
}
