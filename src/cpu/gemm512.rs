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
//! The transposed layout (`gather_panel`: per chunk of 16 rows, the blocks' quant dwords
//! interleaved row by row, then their f16 scales) has exactly the bytes of the GGUF blocks, so
//! a weight can be packed once at load (`pack`, a `PackedWeight` held by the CPU backend, which
//! then no longer reads those mmap pages) and the kernel reads it with plain loads. Without a
//! packed copy (`--no-repack`, or weights not packed at load) each panel is packed per call into
//! a per-thread buffer by masked gathers, which costs about one extra pass over each weight per
//! call: prefill amortizes it over its `n_tokens / 8` tiles, decode does not. Both read the same
//! layout with the same kernel, so they give identical bits. Decode runs this kernel too, so
//! that every output is summed in the same order whatever the batch: a token's logits do not
//! depend on whether it came alone or in a prompt (8-bit activation rounding would turn
//! summation-order ulps into visible differences through the layers).
//!
//! Integer offsets are exact: a Q4_0 chunk's dot is `Σ u q - 8 Σ q` and a Q8_0 chunk's is
//! `Σ (w + 128) q - 128 Σ q` (unsigned bytes for `vpdpbusd`), both computed in i32 from the
//! activations' integer chunk sums (`QAct::off8`, `off128`: -O Σ q, the start of each chunk's
//! i32 sum), as ggml computes them; Q4_1's min term is `m · dx Σ q` (`QAct::xs32`), as in the
//! `avx2` kernels.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use rayon::prelude::*;

use super::act::{IntOff, QAct};
use super::lanes::{self, Lane};
use super::lanes_avx2;
use super::Isa;
use crate::GgmlType;

/// Rows per panel: one zmm lane per row.
pub(crate) const PR: usize = 16;
/// Tokens per micro-kernel tile: 8 f32 accumulators + 8 weight registers + scales and the two
/// i32 accumulators in flight fit the 32 zmm registers.
const TT: usize = 8;
/// Fewest tokens that run this GEMM: all (see the module comment).
pub(crate) const MIN_TOKENS: usize = 1;

/// Formats this GEMM handles (the value is `tile`'s const parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Fmt {
    Q4_0 = 0,
    Q4_1 = 1,
    Q8_0 = 2,
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

    /// O in w = d (u - O): subtracted in integers as O · Σ q (`None`: Q4_1, whose min term
    /// is a float one).
    fn int_off(self) -> Option<IntOff> {
        match self {
            Fmt::Q4_0 => Some(IntOff::O8),
            Fmt::Q4_1 => None,
            Fmt::Q8_0 => Some(IntOff::O128),
        }
    }
}

/// A format's GEMM layout: gathered from the GGUF rows by `gather_panel` (per call or at load),
/// or built by the portable packer of `lanes` (at load; per call only outside the hot path).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Gathered(Fmt),
    Packed(Lane),
}

impl Kind {
    pub(crate) fn of(ty: GgmlType) -> Option<Kind> {
        Fmt::of(ty)
            .map(Kind::Gathered)
            .or_else(|| Lane::of(ty).map(Kind::Packed))
    }
}

/// One weight of a GEMM call: `rows` rows of `rb` bytes in `data`, and the same weight packed
/// once at load (`pack`) when the caller holds it.
pub(crate) struct Part<'a> {
    pub fmt: Kind,
    pub data: &'a [u8],
    /// `pack(fmt, data, rows, nch)`'s bytes, or `None` to pack each panel per call.
    pub packed: Option<&'a [u8]>,
    pub rows: usize,
    pub rb: usize,
}

/// Bytes of one packed panel: nch chunks of 16 rows x one block each (the blocks' own bytes,
/// rearranged, so a packed weight is as large as its rows rounded up to 16).
pub(crate) fn panel_bytes(fmt: Kind, nch: usize) -> usize {
    match fmt {
        Kind::Gathered(f) => nch * PR * f.block_bytes(),
        Kind::Packed(l) => lanes::panel_bytes(l, nch),
    }
}

/// Bytes `pack` returns for `rows` rows of `nch` chunks.
pub(crate) fn packed_bytes(fmt: Kind, rows: usize, nch: usize) -> usize {
    rows.div_ceil(PR) * panel_bytes(fmt, nch)
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

/// Bytes of a packed chunk's weights (before its f16 scales): 16 rows x 32 weights as nibbles
/// (Q4) or bytes (Q8).
fn q_bytes(fmt: Fmt) -> usize {
    match fmt {
        Fmt::Q4_0 | Fmt::Q4_1 => 256,
        Fmt::Q8_0 => 512,
    }
}

/// Gathers rows r0..r0 + nr (nr <= 16) of `part` (format `fmt`) into one panel `out`
/// (`panel_bytes` long); rows nr.. get zero weights and scales. Panel layout, chunk c at
/// `c * 16 * block_bytes`:
/// - Q4_0/Q4_1: [4][16 rows] dwords, dword j of a row = its block's quant bytes 4j..4j+4 (byte
///   i holds weight i in the low nibble, i + 16 in the high one); Q8_0: [8][16 rows] dwords of
///   the quants plus 128 (unsigned, for `vpdpbusd`);
/// - then [16 rows] f16 scales d; Q4_1: then [16 rows] f16 mins m.
///
/// # Safety
/// AVX-512F/BW/VNNI and F16C must be available; `part.data` holds `part.rows >= r0 + nr` rows of
/// `part.rb = nch * block_bytes` bytes.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn gather_panel(fmt: Fmt, part: &Part, r0: usize, nr: usize, nch: usize, out: &mut [u8]) {
    let bb = fmt.block_bytes();
    let qb = q_bytes(fmt);
    assert!(nr <= PR && part.rb == nch * bb && (r0 + nr) * part.rb <= part.data.len());
    assert!(out.len() >= panel_bytes(part.fmt, nch));
    let mask: __mmask16 = ((1u32 << nr) - 1) as u16;
    let rb = part.rb as i32;
    let idx = _mm512_mullo_epi32(
        _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
        _mm512_set1_epi32(rb),
    );
    let base = part.data[r0 * part.rb..].as_ptr();
    for c in 0..nch {
        let o = c * bb;
        // SAFETY: every gathered dword lies inside block c of a masked-in row: offsets o..o+bb
        // of rows r0..r0+nr, in bounds by the caller's contract (the last dword read of a block
        // ends at its last byte); the stores stay inside chunk c of `out` (asserted length).
        unsafe {
            let dst = out[c * PR * bb..].as_mut_ptr();
            let q = dst as *mut __m512i;
            let hdr = gather(idx, mask, base, o);
            let hs = dst.add(qb) as *mut __m256i;
            _mm256_storeu_si256(hs, _mm512_cvtepi32_epi16(hdr));
            match fmt {
                Fmt::Q4_0 | Fmt::Q4_1 => {
                    let qs = if fmt == Fmt::Q4_0 { 2 } else { 4 };
                    if fmt == Fmt::Q4_1 {
                        let m = _mm512_cvtepi32_epi16(_mm512_srli_epi32(hdr, 16));
                        _mm256_storeu_si256(hs.add(1), m);
                    }
                    for j in 0..4 {
                        _mm512_storeu_si512(q.add(j), gather(idx, mask, base, o + qs + 4 * j));
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

/// `part`'s weights packed once: [rows.div_ceil(16) panels][nch chunks][16 * block_bytes] bytes
/// in `pack_panel`'s layout (as many bytes as the GGUF rows, rounded up to 16 rows), every
/// panel packed in parallel.
///
/// # Safety
/// As `pack_panel` for every panel: `part.data` holds `rows` rows of `rb = nch * block_bytes`;
/// AVX-512 as there for a `Kind::Gathered` part (a `Kind::Packed` one is packed by portable
/// code).
/// Packs rows r0..r0 + nr of `part` into one panel `out`: gathered (`gather_panel`) or, for
/// `Kind::Packed`, by `lanes`' portable packer (also what the AVX2 tiles of `lanes_avx2` read).
///
/// # Safety
/// As `gather_panel` for a `Kind::Gathered` part.
unsafe fn pack_panel(part: &Part, r0: usize, nr: usize, nch: usize, out: &mut [u8]) {
    match part.fmt {
        Kind::Packed(l) => lanes::pack_panel(l, part.data, part.rb, r0, nr, nch, out),
        // SAFETY: forwarded from the caller.
        Kind::Gathered(f) => unsafe { gather_panel(f, part, r0, nr, nch, out) },
    }
}

pub(crate) unsafe fn pack(part: &Part, nch: usize, out: &mut [u8]) {
    let pb = panel_bytes(part.fmt, nch);
    if pb == 0 {
        return;
    }
    out.par_chunks_mut(pb).enumerate().for_each(|(p, o)| {
        let r0 = p * PR;
        if r0 < part.rows {
            // SAFETY: forwarded from the caller; r0 + nr <= rows.
            unsafe { pack_panel(part, r0, PR.min(part.rows - r0), nch, o) };
        }
    });
}

/// out[t * 16 + r] = panel row r · activation t0 + t, for T tokens; F is the format
/// (`Fmt as u8`).
///
/// # Safety
/// AVX-512F/BW/VNNI must be available; `p` holds a panel of `nch` chunks in `pack_panel`'s
/// layout for format F; `act` has tokens t0..t0 + T of `nch * 32` columns; `out.len() >= T * 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
unsafe fn tile<const T: usize, const F: u8>(
    p: &[u8],
    nch: usize,
    act: &QAct,
    t0: usize,
    out: &mut [f32],
) {
    let fmt = [Fmt::Q4_0, Fmt::Q4_1, Fmt::Q8_0][F as usize];
    let (min, off, cs, qb) = (
        fmt == Fmt::Q4_1,
        fmt.int_off(),
        PR * fmt.block_bytes(),
        q_bytes(fmt),
    );
    const { assert!(T <= TT && TT == 8) };
    assert!(out.len() >= T * PR && p.len() >= nch * cs);
    let mut qp = [std::ptr::null::<i32>(); T];
    let mut dp = [std::ptr::null::<f32>(); T];
    let mut xp = [std::ptr::null::<f32>(); T];
    let mut op = [std::ptr::null::<i32>(); T];
    for t in 0..T {
        let (q, d, _) = act.token(t0 + t);
        let xs = act.xs32(t0 + t);
        assert!(q.len() >= nch * 32 && d.len() >= nch && xs.len() >= nch);
        qp[t] = q.as_ptr() as *const i32;
        dp[t] = d.as_ptr();
        xp[t] = xs.as_ptr();
        if let Some(o) = off {
            let os = act.offs(t0 + t, o);
            assert!(os.len() >= nch);
            op[t] = os.as_ptr();
        }
    }
    let lo4 = _mm512_set1_epi8(15);
    let mut f = [_mm512_setzero_ps(); T];
    for c in 0..nch {
        // SAFETY: c < nch, within every length asserted above.
        unsafe {
            let base = p.as_ptr().add(c * cs);
            if T == 1 {
                // As `lanes::tile`: decode streams each weight once.
                lanes::prefetch_ahead(base, cs);
            }
            let wq = base as *const __m512i;
            let w: [__m512i; 8] = if fmt == Fmt::Q8_0 {
                std::array::from_fn(|g| _mm512_loadu_si512(wq.add(g)))
            } else {
                let v: [__m512i; 4] = std::array::from_fn(|j| _mm512_loadu_si512(wq.add(j)));
                std::array::from_fn(|g| {
                    let x = if g < 4 {
                        v[g]
                    } else {
                        _mm512_srli_epi32(v[g - 4], 4)
                    };
                    _mm512_and_si512(x, lo4)
                })
            };
            let hs = base.add(qb) as *const __m256i;
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(hs));
            let mv = if min {
                _mm512_cvtph_ps(_mm256_loadu_si256(hs.add(1)))
            } else {
                _mm512_setzero_ps()
            };
            // One copy of the token body per token, written out: left as a loop, LLVM kept
            // Q4_0's (whose sum starts from the offset) rolled, with `f` in memory and the
            // pointers reloaded each token, ~25% slower than Q4_1's unrolled one.
            macro_rules! tokens {
                ($($t:literal)*) => {$(
                    if $t < T {
                        let q = qp[$t].add(8 * c);
                        // Two chains of 4 so more `vpdpbusd` are in flight; Q4_0 and Q8_0
                        // start from their exact offset term -O Σ q (one broadcast load).
                        let mut a = if off.is_some() {
                            _mm512_set1_epi32(*op[$t].add(c))
                        } else {
                            _mm512_setzero_si512()
                        };
                        let mut b = _mm512_setzero_si512();
                        for g in (0..8).step_by(2) {
                            let x0 = _mm512_set1_epi32(q.add(g).read_unaligned());
                            a = _mm512_dpbusd_epi32(a, w[g], x0);
                            let x1 = _mm512_set1_epi32(q.add(g + 1).read_unaligned());
                            b = _mm512_dpbusd_epi32(b, w[g + 1], x1);
                        }
                        let s = _mm512_mul_ps(dv, _mm512_set1_ps(*dp[$t].add(c)));
                        let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
                        f[$t] = _mm512_fmadd_ps(sum, s, f[$t]);
                        if min {
                            f[$t] = _mm512_fmadd_ps(mv, _mm512_set1_ps(*xp[$t].add(c)), f[$t]);
                        }
                    }
                )*};
            }
            tokens!(0 1 2 3 4 5 6 7);
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
/// As `tile`, with T = nt and F = fmt.
unsafe fn tile_n(p: &[u8], nch: usize, fmt: Kind, act: &QAct, t0: usize, nt: usize, o: &mut [f32]) {
    let fmt = match fmt {
        Kind::Gathered(f) => f,
        // SAFETY: forwarded from the caller.
        Kind::Packed(l) => return unsafe { lanes::tile_n(p, nch, l, act, t0, nt, o) },
    };
    const Q40: u8 = Fmt::Q4_0 as u8;
    const Q41: u8 = Fmt::Q4_1 as u8;
    const Q80: u8 = Fmt::Q8_0 as u8;
    macro_rules! go {
        ($($n:literal)*) => {
            match (nt, fmt) {
                $(
                    ($n, Fmt::Q4_0) => tile::<$n, Q40>(p, nch, act, t0, o),
                    ($n, Fmt::Q4_1) => tile::<$n, Q41>(p, nch, act, t0, o),
                    ($n, Fmt::Q8_0) => tile::<$n, Q80>(p, nch, act, t0, o),
                )*
                (_, Fmt::Q4_0) => tile::<TT, Q40>(p, nch, act, t0, o),
                (_, Fmt::Q4_1) => tile::<TT, Q41>(p, nch, act, t0, o),
                (_, Fmt::Q8_0) => tile::<TT, Q80>(p, nch, act, t0, o),
            }
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe { go!(1 2 3 4 5 6 7) }
}

/// ys[i]: [n_tokens, parts[i].rows] = activations · parts[i]ᵀ, every part's panels in one
/// parallel region, on `isa`'s tiles (AVX-512, or for `Kind::Packed` parts only, AVX2 or
/// AVX-VNNI). `act` holds n_tokens tokens of nch * 32 columns; yt is scratch.
///
/// # Safety
/// `isa` must be available (AVX2 and AVX-VNNI with `Kind::Packed` parts only, each with its
/// `packed` copy, in formats `lanes_avx2::supported` for it); each part holds `rows` rows of
/// `rb = nch * block_bytes` bytes, and `packed_bytes` packed bytes if it has `packed`; ys[i].len() ==
/// n_tokens * parts[i].rows.
pub(crate) unsafe fn run(
    isa: Isa,
    parts: &[Part],
    nch: usize,
    act: &QAct,
    n_tokens: usize,
    ys: &mut [&mut [f32]],
    yt: &mut Vec<f32>,
) {
    let tt = if isa == Isa::Avx512Vnni {
        TT
    } else {
        lanes_avx2::TT
    };
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
    let work = |buf: &mut Vec<u8>, (pi, r0, o): (usize, usize, &mut [f32])| {
        let part = &parts[pi];
        let pb = panel_bytes(part.fmt, nch);
        let panel: &[u8] = match part.packed {
            Some(p) => &p[r0 / PR * pb..(r0 / PR + 1) * pb],
            None => {
                buf.resize(pb, 0);
                // SAFETY: the caller checked the features (AVX-512 for a gathered part) and the
                // parts' sizes; r0 + nr <= rows.
                unsafe { pack_panel(part, r0, PR.min(part.rows - r0), nch, buf) };
                buf
            }
        };
        let mut t0 = 0;
        while t0 < n_tokens {
            let nt = tt.min(n_tokens - t0);
            let o = &mut o[t0 * PR..];
            // SAFETY: as above; the panel has nch chunks, o holds nt * 16 values; an AVX2 call
            // has only `Kind::Packed` parts.
            unsafe {
                match (isa, part.fmt) {
                    (Isa::Avx2, Kind::Packed(l)) => {
                        lanes_avx2::plain::tile_n(panel, nch, l, act, t0, nt, o)
                    }
                    (Isa::AvxVnni, Kind::Packed(l)) => {
                        lanes_avx2::vnni::tile_n(panel, nch, l, act, t0, nt, o)
                    }
                    _ => tile_n(panel, nch, part.fmt, act, t0, nt, o),
                }
            }
            t0 += nt;
        }
    };
    if super::par::threads() <= 1 {
        let mut buf = Vec::new();
        for job in jobs {
            work(&mut buf, job);
        }
    } else {
        super::par::for_each_item_init(jobs, Vec::new, work);
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
