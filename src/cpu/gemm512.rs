//! AVX-512 VNNI prefill GEMM for Q4_0, Q4_1 and Q8_0 weights (x86_64, `Isa::Avx512Vnni`).
//!
//! The `avx2` kernels give each (row, token) pair its own 8-lane accumulator: per 32 weights and
//! token they pay a load, a `vpdpbusd`, a conversion and an FMA for 32 multiply-adds, and a
//! horizontal sum per output. Here one zmm lane is one weight row instead (as in llama.cpp's
//! repacked q4_0 / q8_0 GEMMs): a panel of `PR` = 16 rows is transposed so that zmm `g` of chunk
//! `c` holds bytes 4g..4g+4 of that chunk for all 16 rows, and 4 activation bytes broadcast to
//! all lanes feed one `vpdpbusd` doing 64 multiply-adds for 16 rows at once. A chunk of one
//! token is 8 `vpdpbusd` + one conversion + one FMA (two for Q4_1) for 16 x 32 multiply-adds,
//! and the scales are a vector of the 16 rows' scales times one broadcast activation scale.
//!
//! The transpose is made per call, per panel, into a per-thread buffer (`Panel`, 40 bytes per
//! 32 weights of 16 rows: under 40 KiB for a 1536-column panel) by masked gathers, and is then
//! used by every token tile of the call: no copy of the weights is kept, the model's mmap is
//! read as before (memory cost: one panel per thread). The gathers cost about one extra pass
//! over each weight per call, which prefill amortizes over its `n_tokens / 8` tiles; decode
//! runs this kernel too (measured no slower than the `avx2` one for one token, see PERFLOG),
//! so that every output is summed in the same order whatever the batch: a token's logits do
//! not depend on whether it came alone or in a prompt (8-bit activation rounding would turn
//! summation-order ulps into visible differences through the layers).
//!
//! Integer offsets are exact: a Q4_0 chunk's dot is `Σ u q - 8 Σ q` and a Q8_0 chunk's is
//! `Σ (w + 128) q - 128 Σ q` (unsigned bytes for `vpdpbusd`), both computed in i32 from the
//! activations' integer chunk sums (`QAct::is32`), as ggml computes them; Q4_1's min term is
//! `m · dx Σ q` (`QAct::xs32`), as in the `avx2` kernels.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::act::QAct;
use crate::GgmlType;

/// Rows per panel: one zmm lane per row.
pub(crate) const PR: usize = 16;
/// Tokens per micro-kernel tile: 8 f32 accumulators + 8 weight registers + scales and the two
/// i32 accumulators in flight fit the 32 zmm registers.
const TT: usize = 8;
/// Fewest tokens that run this GEMM: all (see the module comment).
pub(crate) const MIN_TOKENS: usize = 1;

/// Formats this GEMM handles.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Fmt {
    Q4_0,
    Q4_1,
    Q8_0,
}

impl Fmt {
    pub(crate) fn of(ty: GgmlType) -> Option<Fmt> {
        match ty {
            GgmlType::Q4_0 => Some(Fmt::Q4_0),
            GgmlType::Q4_1 => Some(Fmt::Q4_1),
            GgmlType::Q8_0 => Some(Fmt::Q8_0),
            _ => None,
        }
    }

    /// Bytes per block of 32 weights.
    fn block_bytes(self) -> usize {
        match self {
            Fmt::Q4_0 => 18,
            Fmt::Q4_1 => 20,
            Fmt::Q8_0 => 34,
        }
    }

    /// O in w = d (u - O) (+ m): subtracted in integers as O · Σ q.
    fn int_off(self) -> i32 {
        match self {
            Fmt::Q4_0 => 8,
            Fmt::Q4_1 => 0,
            Fmt::Q8_0 => 128,
        }
    }
}

/// One weight of a GEMM call: `rows` rows of `rb` bytes in `data`.
pub(crate) struct Part<'a> {
    pub fmt: Fmt,
    pub data: &'a [u8],
    pub rows: usize,
    pub rb: usize,
}

/// One thread's transposed panel (16 rows x nch chunks of 32 weights).
#[derive(Default)]
struct Panel {
    /// [nch][8][16 rows][4] unsigned weight bytes, as [nch * 8] zmm.
    q: Vec<[u32; 16]>,
    /// [nch][16 rows] f32 scales.
    d: Vec<[f32; 16]>,
    /// [nch][16 rows] f32 mins (Q4_1 only).
    m: Vec<[f32; 16]>,
}

/// Gathers one dword per row at `base + r * rb + off` for the `mask` rows (others zero).
///
/// # Safety
/// AVX-512F; every masked-in address and the 3 bytes after it are in bounds.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn gather(idx: __m512i, mask: __mmask16, base: *const u8, off: usize) -> __m512i {
    // SAFETY: forwarded from the caller.
    unsafe {
        _mm512_mask_i32gather_epi32::<1>(
            _mm512_setzero_si512(),
            mask,
            idx,
            base.add(off) as *const i32,
        )
    }
}

/// Transposes rows r0..r0 + nr (nr <= 16) of `part` into `p`; lanes nr.. get zero weights and
/// scales.
///
/// # Safety
/// AVX-512F/BW/VNNI and F16C must be available; `part.data` holds `part.rows >= r0 + nr` rows of
/// `part.rb = nch * block_bytes` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn repack(part: &Part, r0: usize, nr: usize, nch: usize, p: &mut Panel) {
    let bb = part.fmt.block_bytes();
    debug_assert!(nr <= PR && part.rb == nch * bb && (r0 + nr) * part.rb <= part.data.len());
    p.q.resize(nch * 8, [0; 16]);
    p.d.resize(nch, [0.0; 16]);
    if part.fmt == Fmt::Q4_1 {
        p.m.resize(nch, [0.0; 16]);
    }
    let mask: __mmask16 = ((1u32 << nr) - 1) as u16;
    let rb = part.rb as i32;
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(rb),
    );
    let lo4 = _mm512_set1_epi8(15);
    let base = part.data[r0 * part.rb..].as_ptr();
    let halves = |v: __m512i| _mm512_cvtph_ps(_mm512_cvtepi32_epi16(v));
    for c in 0..nch {
        let o = c * bb;
        // SAFETY: every gathered dword lies inside block c of a masked-in row: offsets o..o+bb
        // of rows r0..r0+nr, in bounds by the caller's contract (the last dword read of a block
        // ends at its last byte).
        unsafe {
            let q = p.q[c * 8..c * 8 + 8].as_mut_ptr() as *mut __m512i;
            let hdr = gather(idx, mask, base, o);
            _mm512_storeu_ps(p.d[c].as_mut_ptr(), halves(hdr));
            match part.fmt {
                Fmt::Q4_0 | Fmt::Q4_1 => {
                    let qs = if part.fmt == Fmt::Q4_0 { 2 } else { 4 };
                    if part.fmt == Fmt::Q4_1 {
                        let m = halves(_mm512_srli_epi32(hdr, 16));
                        _mm512_storeu_ps(p.m[c].as_mut_ptr(), m);
                    }
                    // Byte i of qs holds weight i (low nibble) and weight i + 16 (high).
                    for j in 0..4 {
                        let v = gather(idx, mask, base, o + qs + 4 * j);
                        _mm512_storeu_si512(q.add(j), _mm512_and_si512(v, lo4));
                        let hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), lo4);
                        _mm512_storeu_si512(q.add(4 + j), hi);
                    }
                }
                Fmt::Q8_0 => {
                    let flip = _mm512_set1_epi8(-128);
                    for g in 0..8 {
                        let v = gather(idx, mask, base, o + 2 + 4 * g);
                        _mm512_storeu_si512(q.add(g), _mm512_xor_si512(v, flip));
                    }
                }
            }
        }
    }
}

/// out[t * 16 + r] = panel row r · activation t0 + t, for T tokens.
///
/// # Safety
/// AVX-512F/BW/VNNI must be available; `p` holds `nch` chunks; `act` has tokens t0..t0 + T of
/// `nch * 32` columns; `out.len() >= T * 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const T: usize, const MIN: bool>(
    p: &Panel,
    nch: usize,
    off: i32,
    act: &QAct,
    t0: usize,
    out: &mut [f32],
) {
    assert!(out.len() >= T * PR && p.q.len() >= nch * 8 && p.d.len() >= nch);
    assert!(!MIN || p.m.len() >= nch);
    let mut qp = [std::ptr::null::<i32>(); T];
    let mut dp = [std::ptr::null::<f32>(); T];
    let mut xp = [std::ptr::null::<f32>(); T];
    let mut ip = [std::ptr::null::<i32>(); T];
    for t in 0..T {
        let (q, d, _) = act.token(t0 + t);
        let (xs, is) = (act.xs32(t0 + t), act.is32(t0 + t));
        assert!(q.len() >= nch * 32 && d.len() >= nch && xs.len() >= nch && is.len() >= nch);
        qp[t] = q.as_ptr() as *const i32;
        dp[t] = d.as_ptr();
        xp[t] = xs.as_ptr();
        ip[t] = is.as_ptr();
    }
    let mut f = [_mm512_setzero_ps(); T];
    for c in 0..nch {
        // SAFETY: c < nch, within every length asserted above.
        unsafe {
            let wq = p.q[c * 8..].as_ptr() as *const __m512i;
            let w: [__m512i; 8] = std::array::from_fn(|g| _mm512_loadu_si512(wq.add(g)));
            let dv = _mm512_loadu_ps(p.d[c].as_ptr());
            let mv = if MIN {
                _mm512_loadu_ps(p.m[c].as_ptr())
            } else {
                _mm512_setzero_ps()
            };
            for t in 0..T {
                let q = qp[t].add(8 * c);
                // Two chains of 4 so more `vpdpbusd` are in flight.
                let mut a = _mm512_set1_epi32(-off * *ip[t].add(c));
                let mut b = _mm512_setzero_si512();
                for g in (0..8).step_by(2) {
                    a = _mm512_dpbusd_epi32(a, w[g], _mm512_set1_epi32(q.add(g).read_unaligned()));
                    let x1 = _mm512_set1_epi32(q.add(g + 1).read_unaligned());
                    b = _mm512_dpbusd_epi32(b, w[g + 1], x1);
                }
                let s = _mm512_mul_ps(dv, _mm512_set1_ps(*dp[t].add(c)));
                let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
                f[t] = _mm512_fmadd_ps(sum, s, f[t]);
                if MIN {
                    f[t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(*xp[t].add(c)), f[t]);
                }
            }
        }
    }
    for (t, ft) in f.iter().enumerate() {
        // SAFETY: out holds T * 16 values (asserted above).
        unsafe { _mm512_storeu_ps(out[t * PR..].as_mut_ptr(), *ft) };
    }
}

/// The tile for `nt` (1..=TT) tokens.
///
/// # Safety
/// As `tile`, with T = nt.
unsafe fn tile_n(p: &Panel, nch: usize, fmt: Fmt, act: &QAct, t0: usize, nt: usize, o: &mut [f32]) {
    let off = fmt.int_off();
    macro_rules! go {
        ($($n:literal)*) => {
            match (nt, fmt == Fmt::Q4_1) {
                $(
                    ($n, false) => tile::<$n, false>(p, nch, off, act, t0, o),
                    ($n, true) => tile::<$n, true>(p, nch, off, act, t0, o),
                )*
                (_, false) => tile::<TT, false>(p, nch, off, act, t0, o),
                (_, true) => tile::<TT, true>(p, nch, off, act, t0, o),
            }
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe { go!(1 2 3 4 5 6 7) }
}

/// ys[i]: [n_tokens, parts[i].rows] = activations · parts[i]ᵀ, every part's panels in one
/// parallel region. `act` holds n_tokens tokens of nch * 32 columns; yt is scratch.
///
/// # Safety
/// `Isa::Avx512Vnni` must be available; each part holds `rows` rows of `rb = nch *
/// block_bytes` bytes; ys[i].len() == n_tokens * parts[i].rows.
pub(crate) unsafe fn run(
    parts: &[Part],
    nch: usize,
    act: &QAct,
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    yt: &mut Vec<f32>,
) {
    // [panel][n_tokens][16] outputs, panels of all parts in order.
    let panels: usize = parts.iter().map(|p| p.rows.div_ceil(PR)).sum();
    yt.clear();
    yt.resize(panels * n_tokens * PR, 0.0);
    let mut jobs: Vec<(usize, usize, &mut [f32])> = Vec::with_capacity(panels);
    let mut chunks = yt.chunks_mut(n_tokens * PR);
    for (pi, part) in parts.iter().enumerate() {
        for r0 in (0..part.rows).step_by(PR) {
            if let Some(o) = chunks.next() {
                jobs.push((pi, r0, o));
            }
        }
    }
    let work = |panel: &mut Panel, (pi, r0, o): (usize, usize, &mut [f32])| {
        let part = &parts[pi];
        let nr = PR.min(part.rows - r0);
        // SAFETY: the caller checked the features and the parts' sizes; r0 + nr <= rows.
        unsafe { repack(part, r0, nr, nch, panel) };
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = TT.min(n_tokens - t0);
            // SAFETY: as above; the panel has nch chunks, o holds n_tokens * 16 values.
            unsafe { tile_n(panel, nch, part.fmt, act, t0, nt, &mut o[t0 * PR..]) };
            t0 += nt;
        }
    };
    if rayon::current_num_threads() <= 1 {
        let mut panel = Panel::default();
        for job in jobs {
            work(&mut panel, job);
        }
    } else {
        jobs.into_par_iter().for_each_init(Panel::default, work);
    }
    let mut src = yt.chunks_exact(n_tokens * PR);
    for (part, y) in parts.iter().zip(ys.iter_mut()) {
        for r0 in (0..part.rows).step_by(PR) {
            let nr = PR.min(part.rows - r0);
            let Some(s) = src.next() else { return };
            for (t, st) in s.chunks_exact(PR).enumerate() {
                y[t * part.rows + r0..t * part.rows + r0 + nr].copy_from_slice(&st[..nr]);
            }
        }
    }
}
