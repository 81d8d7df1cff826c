//! AVX2 + FMA + F16C kernels for F32/F16/BF16 weights: f32 FMA dot products, weights widened
//! 8 at a time. Only reached after the dispatcher in `mod.rs` has checked those features.

use std::arch::x86_64::*;

use super::avx2::hsum;
use super::{FloatFormat, TILE};

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load_w8(fmt: FloatFormat, row: &[u8], i: usize) -> __m256 {
    let s = &row[fmt_bytes(fmt, i)..fmt_bytes(fmt, i + 8)];
    // SAFETY: `s` holds 8 values of `fmt`; this function enables load8's target features.
    unsafe { load8(fmt, s.as_ptr()) }
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
    let tail: f32 = (i..n)
        .map(|k| q[k] * super::scalar::float_at(fmt, kb, k))
        .sum();
    finish_dot(acc, tail)
}

/// The lane sum and tail of `kv_dot` (lanes added in order, then the tail), shared so the
/// batched scan below rounds exactly as `kv_dot` does.
#[inline]
fn finish_dot(acc: __m256, tail: f32) -> f32 {
    let mut lanes = [0f32; 8];
    // SAFETY: `lanes` holds 8 f32; storeu needs only AVX, which every caller has enabled.
    unsafe { _mm256_storeu_ps(lanes.as_mut_ptr(), acc) };
    lanes.iter().sum::<f32>() + tail
}

/// 8 values of `fmt` at `p`, widened to f32 (`load_w8` without the slice checks, for the
/// attention scans, which check their whole range once).
///
/// # Safety
/// AVX2/F16C must be available; `p` points at 8 readable values of `fmt`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn load8(fmt: FloatFormat, p: *const u8) -> __m256 {
    // SAFETY: forwarded from the caller.
    unsafe {
        match fmt {
            FloatFormat::F32 => _mm256_loadu_ps(p as *const f32),
            FloatFormat::F16 => _mm256_cvtph_ps(_mm_loadu_si128(p as *const __m128i)),
            FloatFormat::Bf16 => {
                let h = _mm_loadu_si128(p as *const __m128i);
                _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16))
            }
        }
    }
}

/// Bytes of `n` values of `fmt`.
fn fmt_bytes(fmt: FloatFormat, n: usize) -> usize {
    match fmt {
        FloatFormat::F32 => 4 * n,
        FloatFormat::F16 | FloatFormat::Bf16 => 2 * n,
    }
}

/// scores[j] = scale · (q · key j) for j < scores.len(), key j being the `q.len()` values of
/// `fmt` at byte offset j · row of `k`: the attention's key scan for one head. Four positions run
/// side by side (four independent add chains instead of one latency-bound chain per position),
/// each with `kv_dot`'s operations in `kv_dot`'s order, so every score is bit-identical to
/// `scale * kv_dot(..)`.
///
/// # Safety
/// AVX2/FMA/F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kv_scores(
    fmt: FloatFormat,
    q: &[f32],
    k: &[u8],
    row: usize,
    scale: f32,
    scores: &mut [f32],
) {
    let hd = q.len();
    let head = fmt_bytes(fmt, hd);
    let n = scores.len();
    // The rows scanned must lie in k (a short k panics here, not in the loads).
    let span = n.checked_sub(1).map_or(0, |l| l * row + head);
    let k = &k[..span];
    let mut j = 0;
    if hd.is_multiple_of(8) {
        // The empty tail sum of kv_dot when hd is whole vectors.
        let tail: f32 = std::iter::empty::<f32>().sum();
        let step = fmt_bytes(fmt, 8);
        while j + 4 <= n {
            let base = k[j * row..].as_ptr();
            let mut acc = [_mm256_setzero_ps(); 4];
            let mut i = 0;
            while i < hd {
                // SAFETY: i + 8 <= hd = q.len(); rows j..j + 4 of `head` bytes lie in k (span).
                unsafe {
                    let qv = _mm256_loadu_ps(q.as_ptr().add(i));
                    let off = (i / 8) * step;
                    for (t, a) in acc.iter_mut().enumerate() {
                        let kv = load8(fmt, base.add(t * row + off));
                        *a = _mm256_add_ps(*a, _mm256_mul_ps(qv, kv));
                    }
                }
                i += 8;
            }
            for (t, a) in acc.iter().enumerate() {
                scores[j + t] = scale * finish_dot(*a, tail);
            }
            j += 4;
        }
    }
    for (jj, s) in scores.iter_mut().enumerate().skip(j) {
        // SAFETY: forwarded from the caller.
        *s = scale * unsafe { kv_dot(fmt, q, &k[jj * row..][..head]) };
    }
}

/// o = Σ_j p[j] · (value j), value j being the `o.len()` values of `fmt` at byte offset j · row
/// of `v`: the attention's value accumulation for one head. Each element takes the same adds
/// in the same order (j ascending, multiply then add, from 0) as the table path's
/// `o.fill(0)` and `o += p[j] · value j` per position, so the output is bit-identical; 64 outputs
/// stay in registers across all positions instead of being loaded and stored once per position.
///
/// # Safety
/// AVX2/FMA/F16C must be available.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn kv_weighted_sum(
    fmt: FloatFormat,
    p: &[f32],
    v: &[u8],
    row: usize,
    o: &mut [f32],
) {
    const B: usize = 8;
    if p.is_empty() {
        o.fill(0.0);
        return;
    }
    let hd = o.len();
    let head = fmt_bytes(fmt, hd);
    let span = p.len().checked_sub(1).map_or(0, |l| l * row + head);
    let v = &v[..span];
    let step = fmt_bytes(fmt, 8);
    let mut c = 0;
    while c + 8 * B <= hd {
        let mut acc = [_mm256_setzero_ps(); B];
        let base = v[fmt_bytes(fmt, c)..].as_ptr();
        for (j, &pj) in p.iter().enumerate() {
            let pv = _mm256_set1_ps(pj);
            for (b, a) in acc.iter_mut().enumerate() {
                // SAFETY: value j's vector b of this block lies in v (span covers p.len() rows).
                let x = unsafe { load8(fmt, base.add(j * row + b * step)) };
                *a = _mm256_add_ps(*a, _mm256_mul_ps(pv, x));
            }
        }
        for (b, a) in acc.iter().enumerate() {
            // SAFETY: c + 8 * B <= hd = o.len().
            unsafe { _mm256_storeu_ps(o[c + 8 * b..].as_mut_ptr(), *a) };
        }
        c += 8 * B;
    }
    // Whole vectors left (hd not a multiple of 64), then single values.
    while c + 8 <= hd {
        let mut a = _mm256_setzero_ps();
        for (j, &pj) in p.iter().enumerate() {
            let prod = _mm256_mul_ps(_mm256_set1_ps(pj), load_w8(fmt, &v[j * row..], c));
            a = _mm256_add_ps(a, prod);
        }
        // SAFETY: c + 8 <= hd = o.len().
        unsafe { _mm256_storeu_ps(o[c..].as_mut_ptr(), a) };
        c += 8;
    }
    for (i, ov) in o.iter_mut().enumerate().skip(c) {
        *ov = 0.0;
        for (j, &pj) in p.iter().enumerate() {
            *ov += pj * super::scalar::float_at(fmt, &v[j * row..], i);
        }
    }
}

/// e^x for 8 lanes, x clamped to [-87, 88] (the normal range of the result): Cephes' expf
/// (2^n by exponent bits times a degree-6 polynomial on |r| ≤ ln 2 / 2), within 2 ulp of
/// libm's.
#[inline]
#[target_feature(enable = "avx2,fma")]
fn exp8(x: __m256) -> __m256 {
    let x = _mm256_min_ps(
        _mm256_max_ps(x, _mm256_set1_ps(-87.0)),
        _mm256_set1_ps(88.0),
    );
    let n = _mm256_round_ps(
        _mm256_mul_ps(x, _mm256_set1_ps(std::f32::consts::LOG2_E)),
        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC,
    );
    // r = x - n ln 2 in two steps (ln 2 = 0.693359375 - 2.12194440e-4, the first exact).
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693_359_4), x);
    let r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.121_944_4e-4), r);
    let mut p = _mm256_set1_ps(1.987_569_1e-4);
    for c in [1.398_2e-3, 8.333_452e-3, 4.166_579_6e-2, 0.166_666_65, 0.5] {
        p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(c));
    }
    let y = _mm256_fmadd_ps(
        _mm256_mul_ps(p, r),
        r,
        _mm256_add_ps(r, _mm256_set1_ps(1.0)),
    );
    let bits = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)),
        23,
    );
    _mm256_mul_ps(y, _mm256_castsi256_ps(bits))
}

/// gate[i] = act(gate[i]) · up[i] = gate / (1 + e^-t) · up, 8 lanes at a time (the
/// exponential by `exp8` instead of one libm call per value), with t = gate for SiLU and
/// t = 2 sqrt(2/pi) (gate + 0.044715 gate³) for tanh GELU (0.5 (1 + tanh z) = sigmoid(2z)). A
/// partial last vector goes through a padded copy, so every element gets the same arithmetic
/// wherever it sits.
///
/// # Safety
/// AVX2/FMA must be available; gate.len() == up.len().
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn glu(gelu: bool, gate: &mut [f32], up: &[f32]) {
    let one = _mm256_set1_ps(1.0);
    let f = |g: &mut [f32], u: &[f32]| {
        // SAFETY: g and u hold 8 f32 each (chunks_exact / the padded copies below).
        unsafe {
            let gv = _mm256_loadu_ps(g.as_ptr());
            let uv = _mm256_loadu_ps(u.as_ptr());
            let t = if gelu {
                let g3 = _mm256_mul_ps(_mm256_mul_ps(gv, gv), gv);
                let inner = _mm256_fmadd_ps(_mm256_set1_ps(super::ops::GELU_COEF_A), g3, gv);
                _mm256_mul_ps(_mm256_set1_ps(2.0 * super::ops::SQRT_2_OVER_PI), inner)
            } else {
                gv
            };
            let e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), t));
            let s = _mm256_div_ps(gv, _mm256_add_ps(one, e));
            _mm256_storeu_ps(g.as_mut_ptr(), _mm256_mul_ps(s, uv));
        }
    };
    let mut gc = gate.chunks_exact_mut(8);
    let mut uc = up.chunks_exact(8);
    for (g, u) in (&mut gc).zip(&mut uc) {
        f(g, u);
    }
    let (gt, ut) = (gc.into_remainder(), uc.remainder());
    if !gt.is_empty() {
        let (mut g8, mut u8) = ([0f32; 8], [0f32; 8]);
        g8[..gt.len()].copy_from_slice(gt);
        u8[..ut.len()].copy_from_slice(ut);
        f(&mut g8, &u8);
        let n = gt.len();
        gt.copy_from_slice(&g8[..n]);
    }
}

/// Softmax in place (max-subtracted), the exponentials by `exp8` 8 lanes at a time (a partial
/// last vector through a padded copy whose padding is left out of the sum). Values more than 87
/// below the maximum get e^-87 ≈ 1.6e-38 instead of less: nothing at f32 precision next to the
/// maximum's 1.
///
/// # Safety
/// AVX2/FMA must be available.
#[target_feature(enable = "avx2,fma")]
pub(crate) unsafe fn softmax(x: &mut [f32]) {
    if x.is_empty() {
        return;
    }
    let m = x.iter().fold(f32::NEG_INFINITY, |a, &b| a.max(b));
    let mv = _mm256_set1_ps(m);
    let ex = |c: &mut [f32]| {
        // SAFETY: c holds 8 f32 (chunks_exact / the padded copy below).
        unsafe {
            let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(c.as_ptr()), mv));
            _mm256_storeu_ps(c.as_mut_ptr(), e);
            e
        }
    };
    let mut acc = _mm256_setzero_ps();
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        acc = _mm256_add_ps(acc, ex(c));
    }
    let rest = chunks.into_remainder();
    let mut sum = super::avx2::hsum(acc);
    if !rest.is_empty() {
        let mut pad = [m; 8];
        pad[..rest.len()].copy_from_slice(rest);
        ex(&mut pad);
        let n = rest.len();
        rest.copy_from_slice(&pad[..n]);
        sum += rest.iter().sum::<f32>();
    }
    let inv = _mm256_set1_ps(1.0 / sum);
    let mut chunks = x.chunks_exact_mut(8);
    for c in &mut chunks {
        // SAFETY: c holds 8 f32.
        unsafe {
            _mm256_storeu_ps(
                c.as_mut_ptr(),
                _mm256_mul_ps(_mm256_loadu_ps(c.as_ptr()), inv),
            )
        };
    }
    let inv = 1.0 / sum;
    for v in chunks.into_remainder() {
        *v *= inv;
    }
}
