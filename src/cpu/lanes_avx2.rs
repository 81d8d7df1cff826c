//! The packed GEMM of `lanes` for CPUs with AVX2 (and AVX-VNNI) but no AVX-512: the same packed
//! panels, read as two halves of 8 rows (one ymm lane per row), up to 4 tokens per tile (AVX2
//! has 16 vector registers: 8 hold a half's unpacked groups, 4 the tokens' accumulators).
//!
//! The integer dot of 4 code bytes and 4 activation bytes is one `vpdpbusd` with AVX-VNNI and
//! `vpmaddubsw` + `vpmaddwd` without it. `vpmaddubsw` saturates its i16 pair sums, which codes
//! of at most 6 bits (63 * 127 * 2 = 16002) never reach but IQ4_NL's shifted levels (up to 241)
//! can, so IQ4_NL is packed for this kernel only with AVX-VNNI (`supported`).
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::act::{IntOff, QAct};
use super::gemm512::PR;
use super::lanes::{panel_bytes, prefetch_ahead, Lane, IQ4NL_LUT};

/// Tokens per tile.
pub(crate) const TT: usize = 4;

/// Whether this kernel runs `l` with (`vnni`) or without AVX-VNNI.
pub(crate) fn supported(l: Lane, vnni: bool) -> bool {
    vnni || l != Lane::Iq4Nl
}

#[inline]
#[target_feature(enable = "avx2")]
fn dot_avx2(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_add_epi32(
        acc,
        _mm256_madd_epi16(_mm256_maddubs_epi16(w, x), _mm256_set1_epi16(1)),
    )
}

#[inline]
#[target_feature(enable = "avx2,avxvnni")]
fn dot_vnni(acc: __m256i, w: __m256i, x: __m256i) -> __m256i {
    _mm256_dpbusd_avx_epi32(acc, w, x)
}

/// Bits 4.. of group `g`'s codes moved to bits 4.. of each byte (as `lanes::high_bits`).
#[inline(always)]
unsafe fn high_bits(h: &[__m256i; 2], hi: usize, g: usize) -> __m256i {
    // SAFETY: the callers run with AVX2 enabled.
    unsafe {
        if hi == 1 {
            let v = match g {
                0 => _mm256_slli_epi32(h[0], 4),
                1 => _mm256_slli_epi32(h[0], 3),
                2 => _mm256_slli_epi32(h[0], 2),
                3 => _mm256_slli_epi32(h[0], 1),
                4 => h[0],
                5 => _mm256_srli_epi32(h[0], 1),
                6 => _mm256_srli_epi32(h[0], 2),
                _ => _mm256_srli_epi32(h[0], 3),
            };
            _mm256_and_si256(v, _mm256_set1_epi8(0x10))
        } else {
            let hk = h[g / 4];
            let v = match g % 4 {
                0 => _mm256_slli_epi32(hk, 4),
                1 => _mm256_slli_epi32(hk, 2),
                2 => hk,
                _ => _mm256_srli_epi32(hk, 2),
            };
            _mm256_and_si256(v, _mm256_set1_epi8(0x30))
        }
    }
}

/// Bit 2 of group `g`'s codes moved to bit 2 of each byte (as `lanes::bit2`).
#[inline(always)]
unsafe fn bit2(h: __m256i, g: usize) -> __m256i {
    // SAFETY: the callers run with AVX2 enabled.
    unsafe {
        let v = match g {
            0 => _mm256_slli_epi32(h, 2),
            1 => _mm256_slli_epi32(h, 1),
            2 => h,
            3 => _mm256_srli_epi32(h, 1),
            4 => _mm256_srli_epi32(h, 2),
            5 => _mm256_srli_epi32(h, 3),
            6 => _mm256_srli_epi32(h, 4),
            _ => _mm256_srli_epi32(h, 5),
        };
        _mm256_and_si256(v, _mm256_set1_epi8(4))
    }
}

/// The tile, stamped out once per instruction set (target features are per function: the
/// AVX2 copy must never contain AVX-VNNI code).
macro_rules! tiles {
    ($m:ident, $feat:literal, $dot:ident) => {
        pub(crate) mod $m {
            use super::*;

            /// out[t * 16 + r] = panel row r · activation t0 + t, for T (<= 4) tokens; L is
            /// the format (`Lane as u8`).
            ///
            /// # Safety
            /// The target features must be available; `p` holds a panel of `nch` chunks in
            /// `lanes::pack_panel`'s layout for format L; `act` has tokens t0..t0 + T of
            /// `nch * 32` columns; `out.len() >= T * 16`.
            #[target_feature(enable = $feat)]
            unsafe fn tile<const T: usize, const L: u8>(
                p: &[u8],
                nch: usize,
                act: &QAct,
                t0: usize,
                out: &mut [f32],
            ) {
                let l = Lane::ALL[L as usize];
                let (cpb, hdr, hi) = (l.cpb(), l.hdr(), l.hi());
                let (cb, bb) = (l.chunk_bytes(), l.block_bytes());
                const { assert!(T <= TT) };
                assert!(out.len() >= T * PR && p.len() >= panel_bytes(l, nch));
                assert!(nch.is_multiple_of(cpb));
                let mut qp = [std::ptr::null::<i32>(); T];
                let mut dp = [std::ptr::null::<f32>(); T];
                let mut xp = [std::ptr::null::<f32>(); T];
                let mut op = [std::ptr::null::<i32>(); T];
                for t in 0..T {
                    let (q, d, xh) = act.token(t0 + t);
                    let xs = if l == Lane::Q2K { xh } else { act.xs32(t0 + t) };
                    let os = match l {
                        Lane::Q6K | Lane::Q2K | Lane::Q3K => act.h16(t0 + t),
                        Lane::Iq4Nl => act.offs(t0 + t, IntOff::O128),
                        _ => act.offs(t0 + t, IntOff::O8),
                    };
                    let per = if l.split() { 2 * nch } else { nch };
                    let xper = if l == Lane::Q2K { 2 * nch } else { nch };
                    assert!(q.len() >= nch * 32 && d.len() >= nch && xs.len() >= xper);
                    assert!(os.len() >= per);
                    qp[t] = q.as_ptr() as *const i32;
                    dp[t] = d.as_ptr();
                    xp[t] = xs.as_ptr();
                    op[t] = os.as_ptr();
                }
                let lo4 = _mm256_set1_epi8(15);
                // SAFETY: 32 of the table's 64 bytes (it repeats every 16).
                let lut = unsafe { _mm256_loadu_si256(IQ4NL_LUT.as_ptr() as *const __m256i) };
                for h in 0..2 {
                    let mut f = [_mm256_setzero_ps(); T];
                    for bi in 0..nch / cpb {
                        // SAFETY: block bi of the panel, and half h (rows 8h..8h + 8) of each
                        // of its 16-row vectors, lie within p (asserted length); chunk and
                        // token indices are < nch, within the asserted activation lengths.
                        unsafe {
                            let blk = p.as_ptr().add(bi * bb);
                            let f16s = |o: usize| {
                                _mm256_cvtph_ps(_mm_loadu_si128(
                                    blk.add(o + 16 * h) as *const __m128i
                                ))
                            };
                            let dv = f16s(0);
                            let mv = if hdr == 2 {
                                f16s(32)
                            } else {
                                _mm256_setzero_ps()
                            };
                            for k in 0..cpb {
                                let c = bi * cpb + k;
                                let base = blk.add(32 * hdr + k * cb);
                                let ld = |o: usize| {
                                    _mm256_loadu_si256(base.add(o + 32 * h) as *const __m256i)
                                };
                                if T == 1 {
                                    // As `lanes::tile`: decode streams each weight once.
                                    prefetch_ahead(base, cb);
                                }
                                let nv = l.low();
                                let v: [__m256i; 4] = std::array::from_fn(|j| {
                                    if j < nv {
                                        ld(64 * j)
                                    } else {
                                        _mm256_setzero_si256()
                                    }
                                });
                                let mut w: [__m256i; 8] = if nv == 4 {
                                    std::array::from_fn(|g| {
                                        let x = if g < 4 {
                                            v[g]
                                        } else {
                                            _mm256_srli_epi32(v[g - 4], 4)
                                        };
                                        _mm256_and_si256(x, lo4)
                                    })
                                } else {
                                    // Group 4j + k: bits 2k.. of plane j.
                                    std::array::from_fn(|g| {
                                        let x = match g % 4 {
                                            0 => v[g / 4],
                                            1 => _mm256_srli_epi32(v[g / 4], 2),
                                            2 => _mm256_srli_epi32(v[g / 4], 4),
                                            _ => _mm256_srli_epi32(v[g / 4], 6),
                                        };
                                        _mm256_and_si256(x, _mm256_set1_epi8(3))
                                    })
                                };
                                let hb = l.base();
                                if hi > 0 {
                                    let hv = [
                                        ld(hb),
                                        if hi == 2 {
                                            ld(hb + 64)
                                        } else {
                                            _mm256_setzero_si256()
                                        },
                                    ];
                                    for (g, wg) in w.iter_mut().enumerate() {
                                        let b = if nv == 4 {
                                            high_bits(&hv, hi, g)
                                        } else {
                                            bit2(hv[0], g)
                                        };
                                        *wg = _mm256_or_si256(*wg, b);
                                    }
                                }
                                if l == Lane::Iq4Nl {
                                    for wg in w.iter_mut() {
                                        *wg = _mm256_shuffle_epi8(lut, *wg);
                                    }
                                }
                                let sp = base.add(hb + 64 * hi + 8 * h);
                                let b8 = |o: usize| _mm_loadl_epi64(sp.add(o) as *const __m128i);
                                let mut q2_mins = [_mm256_setzero_ps(); 2];
                                let (s0, s1, mc) = match l {
                                    Lane::Q4K | Lane::Q5K => {
                                        let sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b8(0)));
                                        let m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(b8(16)));
                                        let s = _mm256_mul_ps(dv, sc);
                                        (s, s, _mm256_mul_ps(mv, m))
                                    }
                                    Lane::Q6K | Lane::Q3K => {
                                        let a = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8(0)));
                                        let b = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b8(16)));
                                        (_mm256_mul_ps(dv, a), _mm256_mul_ps(dv, b), mv)
                                    }
                                    Lane::Q2K => {
                                        // Scale in the low nibble, min in the high one.
                                        let lo = _mm_set1_epi8(15);
                                        let (h0, h1) = (b8(0), b8(16));
                                        let f = |v: __m128i| {
                                            _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v))
                                        };
                                        let nib = |v: __m128i| _mm_and_si128(v, lo);
                                        let top =
                                            |v: __m128i| _mm_and_si128(_mm_srli_epi16(v, 4), lo);
                                        q2_mins = [
                                            _mm256_mul_ps(mv, f(top(h0))),
                                            _mm256_mul_ps(mv, f(top(h1))),
                                        ];
                                        (
                                            _mm256_mul_ps(dv, f(nib(h0))),
                                            _mm256_mul_ps(dv, f(nib(h1))),
                                            mv,
                                        )
                                    }
                                    _ => (dv, dv, mv),
                                };
                                for t in 0..T {
                                    let q = qp[t].add(8 * c);
                                    let x = |g: usize| _mm256_set1_epi32(q.add(g).read_unaligned());
                                    let dx = _mm256_set1_ps(*dp[t].add(c));
                                    if l.split() {
                                        let o = match l {
                                            Lane::Q6K => -32,
                                            Lane::Q3K => -4,
                                            _ => 0,
                                        };
                                        let mut a = _mm256_set1_epi32(o * *op[t].add(2 * c));
                                        let mut b = _mm256_set1_epi32(o * *op[t].add(2 * c + 1));
                                        for g in 0..4 {
                                            a = $dot(a, w[g], x(g));
                                            b = $dot(b, w[g + 4], x(g + 4));
                                        }
                                        let fa = _mm256_cvtepi32_ps(a);
                                        f[t] = _mm256_fmadd_ps(fa, _mm256_mul_ps(s0, dx), f[t]);
                                        let fb = _mm256_cvtepi32_ps(b);
                                        f[t] = _mm256_fmadd_ps(fb, _mm256_mul_ps(s1, dx), f[t]);
                                        if l == Lane::Q2K {
                                            let x0 = _mm256_set1_ps(*xp[t].add(2 * c));
                                            f[t] = _mm256_fnmadd_ps(q2_mins[0], x0, f[t]);
                                            let x1 = _mm256_set1_ps(*xp[t].add(2 * c + 1));
                                            f[t] = _mm256_fnmadd_ps(q2_mins[1], x1, f[t]);
                                        }
                                    } else {
                                        let mut a = match l {
                                            Lane::Q5_0 => _mm256_set1_epi32(2 * *op[t].add(c)),
                                            Lane::Iq4Nl => _mm256_set1_epi32(*op[t].add(c)),
                                            _ => _mm256_setzero_si256(),
                                        };
                                        let mut b = _mm256_setzero_si256();
                                        for g in (0..8).step_by(2) {
                                            a = $dot(a, w[g], x(g));
                                            b = $dot(b, w[g + 1], x(g + 1));
                                        }
                                        let sum = _mm256_cvtepi32_ps(_mm256_add_epi32(a, b));
                                        f[t] = _mm256_fmadd_ps(sum, _mm256_mul_ps(s0, dx), f[t]);
                                        let xs = _mm256_set1_ps(*xp[t].add(c));
                                        match l {
                                            Lane::Q5_1 => f[t] = _mm256_fmadd_ps(mc, xs, f[t]),
                                            Lane::Q4K | Lane::Q5K => {
                                                f[t] = _mm256_fnmadd_ps(mc, xs, f[t])
                                            }
                                            _ => {}
                                        }
                                    }
                                }
                            }
                        }
                    }
                    for (t, ft) in f.iter().enumerate() {
                        // SAFETY: out holds T * 16 values (asserted above).
                        unsafe { _mm256_storeu_ps(out[t * PR + 8 * h..].as_mut_ptr(), *ft) };
                    }
                }
            }

            /// The tile for `nt` (1..=4) tokens.
            ///
            /// # Safety
            /// As `tile`, with T = nt and L = l.
            pub(crate) unsafe fn tile_n(
                p: &[u8],
                nch: usize,
                l: Lane,
                act: &QAct,
                t0: usize,
                nt: usize,
                o: &mut [f32],
            ) {
                macro_rules! go {
                    ($n:literal) => {
                        match l {
                            Lane::Q5_0 => tile::<$n, 0>(p, nch, act, t0, o),
                            Lane::Q5_1 => tile::<$n, 1>(p, nch, act, t0, o),
                            Lane::Iq4Nl => tile::<$n, 2>(p, nch, act, t0, o),
                            Lane::Q4K => tile::<$n, 3>(p, nch, act, t0, o),
                            Lane::Q5K => tile::<$n, 4>(p, nch, act, t0, o),
                            Lane::Q6K => tile::<$n, 5>(p, nch, act, t0, o),
                            Lane::Q2K => tile::<$n, 6>(p, nch, act, t0, o),
                            Lane::Q3K => tile::<$n, 7>(p, nch, act, t0, o),
                        }
                    };
                }
                // SAFETY: forwarded from the caller.
                unsafe {
                    match nt {
                        1 => go!(1),
                        2 => go!(2),
                        3 => go!(3),
                        _ => go!(4),
                    }
                }
            }
        }
    };
}

tiles!(plain, "avx2,fma,f16c", dot_avx2);
tiles!(vnni, "avx2,fma,f16c,avxvnni", dot_vnni);
