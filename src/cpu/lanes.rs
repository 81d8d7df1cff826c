//! The AVX-512 VNNI GEMM's packed layouts and tile for Q5_0, Q5_1, IQ4_NL and the K-quants
//! Q2_K..Q6_K (x86_64, `Isa::Avx512Vnni`): the formats of the "Q4_K_M"-style files people
//! download. `lanes_avx2` reads the same panels on AVX2 and AVX-VNNI.
//!
//! As in `gemm512`, one zmm lane is one weight row: a panel of `PR` = 16 rows is stored so that
//! group `g` (weights 4g..4g+4 of a 32-weight chunk) of all 16 rows is one zmm of 4-byte lanes,
//! and 4 activation bytes broadcast to every lane feed one `vpdpbusd` (64 multiply-adds). What
//! differs from `gemm512`'s Q4_0 layout is how each chunk's codes and scales are found, so the
//! layouts here are built once at load by a portable packer (`pack_panel`) from the GGUF blocks
//! and never gathered per call: these formats take the GEMM only where the weight was packed
//! (`gemm::gemm_plan`), and the row kernels of `avx2` elsewhere, so one weight always runs one
//! kernel whatever the batch.
//!
//! Panel layout, per block of `cpb` chunks (1 for the 32-weight formats, 8 for the K-quants):
//! - header: [16 rows] f16 `d`; then [16 rows] f16 `m` (Q5_1) or `dmin` (Q2_K, Q4_K, Q5_K);
//! - per chunk, the base plane of the codes' low bits: 4 bits as [4][16 rows] dwords (byte i of
//!   a chunk's 16 holds weight i in its low nibble and weight i + 16 in its high one, as Q4_0
//!   stores them), or for Q2_K and Q3_K 2 bits as [2][16 rows] dwords (dword j, byte b, bits
//!   2k..2k+2 = weight 4(4j + k) + b, Q2_K's own arrangement);
//! - then the bits above them: Q5 formats and Q3_K one [16 rows] dword plane (bit g + 8b = bit
//!   4, or 2, of weight 4g + b), Q6_K two (dword k, byte b, bits 2j..2j+2 = bits 4..6 of weight
//!   4(4k + j) + b, Q6_K's own `qh` arrangement);
//! - then the K-quants' per-chunk integer scales: [16] u8 `sc` and [16] u8 `m` (Q4_K, Q5_K), or
//!   one scale per half chunk, [2 halves][16]: i8 `sc` (Q6_K; Q3_K's less 32) or Q2_K's bytes
//!   as stored (scale in the low nibble, min in the high one).
//!
//! Each layout holds exactly the bits of the GGUF blocks (Q4_K, Q5_K and Q3_K's 6-bit scale
//! tables widened to bytes: 2.8%, 2.3% and 3.6% more), so a packed weight costs what the file's
//! does.
//!
//! The per-chunk float scale `d * sc` (and `dmin * m`) is an exact f32 product (an f16 times an
//! integer of at most 8 bits), made once per chunk of a panel and shared by the tile's tokens.
//! The integer offsets of Q5_0 (16), IQ4_NL (the table shifted by 128 to unsigned bytes), Q6_K
//! (32) and Q3_K (4, these two per half chunk) are subtracted exactly in i32 from the
//! activations' integer sums; Q2_K's mins are float terms per half chunk.
#![allow(clippy::missing_safety_doc)]

use std::arch::x86_64::*;

use super::act::{IntOff, QAct};
use super::formats::{self, Chunk, Format, IQ4NL_VALUES};
use super::gemm512::PR;
use crate::GgmlType;

/// Formats packed by this module (the value is `tile`'s const parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub(crate) enum Lane {
    Q5_0 = 0,
    Q5_1 = 1,
    Iq4Nl = 2,
    Q4K = 3,
    Q5K = 4,
    Q6K = 5,
    Q2K = 6,
    Q3K = 7,
}

impl Lane {
    /// Every format, indexed by its `u8` value.
    pub(crate) const ALL: [Lane; 8] = [
        Lane::Q5_0,
        Lane::Q5_1,
        Lane::Iq4Nl,
        Lane::Q4K,
        Lane::Q5K,
        Lane::Q6K,
        Lane::Q2K,
        Lane::Q3K,
    ];

    pub(crate) fn of(ty: GgmlType) -> Option<Lane> {
        Some(match ty {
            GgmlType::Q5_0 => Lane::Q5_0,
            GgmlType::Q5_1 => Lane::Q5_1,
            GgmlType::IQ4_NL => Lane::Iq4Nl,
            GgmlType::Q4_K => Lane::Q4K,
            GgmlType::Q5_K => Lane::Q5K,
            GgmlType::Q6_K => Lane::Q6K,
            GgmlType::Q2_K => Lane::Q2K,
            GgmlType::Q3_K => Lane::Q3K,
            _ => return None,
        })
    }

    /// Chunks of 32 per block.
    pub(crate) const fn cpb(self) -> usize {
        match self {
            Lane::Q5_0 | Lane::Q5_1 | Lane::Iq4Nl => 1,
            Lane::Q4K | Lane::Q5K | Lane::Q6K | Lane::Q2K | Lane::Q3K => 8,
        }
    }

    /// f16 vectors in a block's header: `d`, and `m` or `dmin`.
    pub(crate) const fn hdr(self) -> usize {
        match self {
            Lane::Q5_1 | Lane::Q4K | Lane::Q5K | Lane::Q2K => 2,
            _ => 1,
        }
    }

    /// Dword planes of high bits per chunk.
    pub(crate) const fn hi(self) -> usize {
        match self {
            Lane::Q5_0 | Lane::Q5_1 | Lane::Q5K | Lane::Q3K => 1,
            Lane::Q6K => 2,
            _ => 0,
        }
    }

    /// Low bits of each code in the base plane: 4 (nibbles) or 2 (Q2_K, Q3_K).
    pub(crate) const fn low(self) -> usize {
        match self {
            Lane::Q2K | Lane::Q3K => 2,
            _ => 4,
        }
    }

    /// Whether each half chunk has its own scale (Q6_K, Q2_K, Q3_K).
    pub(crate) const fn split(self) -> bool {
        matches!(self, Lane::Q6K | Lane::Q2K | Lane::Q3K)
    }

    /// Bytes of per-chunk integer scales.
    pub(crate) const fn scb(self) -> usize {
        match self {
            Lane::Q4K | Lane::Q5K | Lane::Q6K | Lane::Q2K | Lane::Q3K => 32,
            _ => 0,
        }
    }

    /// Bytes of a chunk's base plane of codes (16 rows).
    pub(crate) const fn base(self) -> usize {
        4 * self.low() * PR
    }

    pub(crate) const fn chunk_bytes(self) -> usize {
        self.base() + 64 * self.hi() + self.scb()
    }

    /// Bytes of one block of a panel (16 rows).
    pub(crate) const fn block_bytes(self) -> usize {
        32 * self.hdr() + self.cpb() * self.chunk_bytes()
    }
}

/// Bytes of a panel of `nch` chunks (`nch` a multiple of `l`'s chunks per block).
pub(crate) fn panel_bytes(l: Lane, nch: usize) -> usize {
    nch / l.cpb() * l.block_bytes()
}

fn put_u32(out: &mut [u8], off: usize, v: u32) {
    out[off..off + 4].copy_from_slice(&v.to_le_bytes());
}

fn put_u16(out: &mut [u8], off: usize, v: u16) {
    out[off..off + 2].copy_from_slice(&v.to_le_bytes());
}

fn rd_u16(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Writes lane `r` of one chunk's codes `u` (at most 6 bits each) at `co`: the base plane of
/// `low` bits per code, then `hi` planes of the bits above.
fn put_codes(out: &mut [u8], co: usize, r: usize, low: usize, hi: usize, u: &[u8; 32]) {
    if low == 4 {
        for g in 0..4 {
            let mut v = 0u32;
            for b in 0..4 {
                let byte = (u[4 * g + b] & 15) | ((u[16 + 4 * g + b] & 15) << 4);
                v |= (byte as u32) << (8 * b);
            }
            put_u32(out, co + g * 64 + r * 4, v);
        }
    } else {
        // Dword j, byte b, bits 2k..2k+2: weight 4(4j + k) + b (Q2_K's own arrangement).
        for j in 0..2 {
            let mut v = 0u32;
            for k in 0..4 {
                for b in 0..4 {
                    v |= ((u[4 * (4 * j + k) + b] & 3) as u32) << (2 * k + 8 * b);
                }
            }
            put_u32(out, co + j * 64 + r * 4, v);
        }
    }
    let hb = co + 4 * low * PR;
    match hi {
        1 => {
            let mut h = 0u32;
            for g in 0..8 {
                for b in 0..4 {
                    h |= (((u[4 * g + b] >> low) & 1) as u32) << (g + 8 * b);
                }
            }
            put_u32(out, hb + r * 4, h);
        }
        2 => {
            for k in 0..2 {
                let mut h = 0u32;
                for j in 0..4 {
                    for b in 0..4 {
                        h |= (((u[4 * (4 * k + j) + b] >> 4) & 3) as u32) << (2 * j + 8 * b);
                    }
                }
                put_u32(out, hb + k * 64 + r * 4, h);
            }
        }
        _ => {}
    }
}

/// Chunk `c` of `blk`'s codes as `F` decodes them (unsigned, at most 6 bits here).
fn codes<F: Format>(blk: &[u8], p: &F::P, c: usize, ch: &mut Chunk) -> [u8; 32] {
    F::unpack(blk, p, c, ch);
    std::array::from_fn(|i| ch.u[i] as u8)
}

/// Chunk scales a K-quant block stores per chunk: the two bytes `pack_row` writes for chunk k
/// (scale and min, or the two halves' scales), from the block's decoded values or its bytes.
type ChunkScales<P> = fn(&P, &[u8], usize) -> [u8; 2];

/// Writes block `bi` of `row` (blocks of format `F`) as lane `r` of the panel block at `o` in
/// `out`: the f16 fields at byte offsets `f16s` as the header, every chunk's codes, and the
/// K-quants' two scale bytes per chunk.
fn put_block<F: Format>(
    l: Lane,
    row: &[u8],
    bi: usize,
    r: usize,
    f16s: &[usize],
    scales: Option<ChunkScales<F::P>>,
    out: &mut [u8],
) {
    let blk = &row[F::BYTES * bi..F::BYTES * (bi + 1)];
    let o = bi * l.block_bytes();
    for (j, &f) in f16s.iter().enumerate() {
        put_u16(out, o + 32 * j + 2 * r, rd_u16(blk, f));
    }
    let p = F::params(blk);
    let mut ch = Chunk::default();
    for k in 0..l.cpb() {
        let co = o + 32 * l.hdr() + k * l.chunk_bytes();
        let u = if l == Lane::Iq4Nl {
            // The level indices, not the levels `unpack` gives: the tile maps them.
            let qs = &blk[2..18];
            std::array::from_fn(|i| (qs[i % 16] >> (4 * (i / 16))) & 15)
        } else {
            codes::<F>(blk, &p, k, &mut ch)
        };
        put_codes(out, co, r, l.low(), l.hi(), &u);
        if let Some(sc) = scales {
            let s = co + l.base() + 64 * l.hi();
            [out[s + r], out[s + 16 + r]] = sc(&p, blk, k);
        }
    }
}

/// Writes row `row` (one GGUF row of `nch` chunks) as lane `r` of the panel `out`.
fn pack_row(l: Lane, row: &[u8], r: usize, nch: usize, out: &mut [u8]) {
    use formats as f;
    for bi in 0..nch / l.cpb() {
        match l {
            Lane::Q5_0 => put_block::<f::Q5_0>(l, row, bi, r, &[0], None, out),
            Lane::Q5_1 => put_block::<f::Q5_1>(l, row, bi, r, &[0, 2], None, out),
            Lane::Iq4Nl => put_block::<f::IQ4_NL>(l, row, bi, r, &[0], None, out),
            Lane::Q4K => {
                let sc: ChunkScales<f::KParams> = |p, _, k| [p.sc[k], p.m[k]];
                put_block::<f::Q4_K>(l, row, bi, r, &[0, 2], Some(sc), out)
            }
            Lane::Q5K => {
                let sc: ChunkScales<f::KParams> = |p, _, k| [p.sc[k], p.m[k]];
                put_block::<f::Q5_K>(l, row, bi, r, &[0, 2], Some(sc), out)
            }
            Lane::Q6K => {
                let sc: ChunkScales<f32> = |_, b, k| [b[192 + 2 * k], b[193 + 2 * k]];
                put_block::<f::Q6_K>(l, row, bi, r, &[208], Some(sc), out)
            }
            Lane::Q2K => {
                // Each half's byte as stored: scale in the low nibble, min in the high one.
                let sc: ChunkScales<(f32, f32)> = |_, b, k| [b[2 * k], b[2 * k + 1]];
                put_block::<f::Q2_K>(l, row, bi, r, &[80, 82], Some(sc), out)
            }
            Lane::Q3K => {
                let sc: ChunkScales<(f32, [i8; 16])> =
                    |p, _, k| [p.1[2 * k] as u8, p.1[2 * k + 1] as u8];
                put_block::<f::Q3_K>(l, row, bi, r, &[108], Some(sc), out)
            }
        }
    }
}

/// Packs rows r0..r0 + nr (nr <= 16) of `data` (rows of `rb` bytes, `nch` chunks each) into the
/// panel `out` (`panel_bytes` long); lanes nr.. get zero codes and scales.
pub(crate) fn pack_panel(
    l: Lane,
    data: &[u8],
    rb: usize,
    r0: usize,
    nr: usize,
    nch: usize,
    out: &mut [u8],
) {
    assert!(nr <= PR && (r0 + nr) * rb <= data.len() && out.len() >= panel_bytes(l, nch));
    out[..panel_bytes(l, nch)].fill(0);
    for r in 0..nr {
        pack_row(l, &data[(r0 + r) * rb..(r0 + r + 1) * rb], r, nch, out);
    }
}

/// IQ4_NL's levels plus 128 (unsigned bytes for `vpdpbusd`), repeated in each 128-bit lane for
/// `vpshufb`.
pub(crate) const IQ4NL_LUT: [u8; 64] = {
    let mut a = [0u8; 64];
    let mut i = 0;
    while i < 64 {
        a[i] = (IQ4NL_VALUES[i % 16] as i16 + 128) as u8;
        i += 1;
    }
    a
};

/// Bits 4.. of group `g`'s codes moved to bits 4.. of each byte (see the module comment):
/// `h` holds the chunk's high-bit planes.
///
/// # Safety
/// AVX-512F must be available.
#[inline(always)]
unsafe fn high_bits<const HI: usize>(h: &[__m512i; 2], g: usize) -> __m512i {
    if HI == 1 {
        let v = match g {
            0 => _mm512_slli_epi32(h[0], 4),
            1 => _mm512_slli_epi32(h[0], 3),
            2 => _mm512_slli_epi32(h[0], 2),
            3 => _mm512_slli_epi32(h[0], 1),
            4 => h[0],
            5 => _mm512_srli_epi32(h[0], 1),
            6 => _mm512_srli_epi32(h[0], 2),
            _ => _mm512_srli_epi32(h[0], 3),
        };
        _mm512_and_si512(v, _mm512_set1_epi8(0x10))
    } else {
        let hk = h[g / 4];
        let v = match g % 4 {
            0 => _mm512_slli_epi32(hk, 4),
            1 => _mm512_slli_epi32(hk, 2),
            2 => hk,
            _ => _mm512_srli_epi32(hk, 2),
        };
        _mm512_and_si512(v, _mm512_set1_epi8(0x30))
    }
}

/// Bytes ahead of the chunk being read that a one-token tile asks the cache to fetch: a single
/// core's hardware prefetch keeps too few lines in flight to reach its share of DRAM bandwidth
/// (Qwen2.5-1.5B Q4_K_M decode on 2 threads: 16.5 tok/s without, 22.7 with 2 KiB, 21.7 with 1
/// KiB, 20.9 with 4 KiB). Prefill tiles reread their panel from L1 and skip it.
pub(crate) const PREFETCH: usize = 2048;

/// Asks the cache for the `bytes` bytes `PREFETCH` ahead of `base` (a one-token tile's chunk).
/// The addresses may lie past the weight: a prefetch never faults.
#[inline(always)]
pub(crate) fn prefetch_ahead(base: *const u8, bytes: usize) {
    let mut o = 0;
    while o < bytes {
        // SAFETY: a prefetch is a hint that reads nothing architecturally and cannot fault,
        // whatever the address; SSE is part of x86_64.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(PREFETCH + o) as *const i8) };
        o += 64;
    }
}

/// Bit 2 of group `g`'s codes (Q3_K's high bit plane: bit g + 8b of `h` is bit 2 of weight
/// 4g + b) moved to bit 2 of each byte.
///
/// # Safety
/// AVX-512F must be available.
#[inline(always)]
unsafe fn bit2(h: __m512i, g: usize) -> __m512i {
    let v = match g {
        0 => _mm512_slli_epi32(h, 2),
        1 => _mm512_slli_epi32(h, 1),
        2 => h,
        3 => _mm512_srli_epi32(h, 1),
        4 => _mm512_srli_epi32(h, 2),
        5 => _mm512_srli_epi32(h, 3),
        6 => _mm512_srli_epi32(h, 4),
        _ => _mm512_srli_epi32(h, 5),
    };
    _mm512_and_si512(v, _mm512_set1_epi8(4))
}

/// out[t * 16 + r] = panel row r · activation t0 + t, for T tokens; L is the format
/// (`Lane as u8`).
///
/// # Safety
/// AVX-512F/BW/VNNI must be available; `p` holds a panel of `nch` chunks in `pack_panel`'s
/// layout for format L; `act` has tokens t0..t0 + T of `nch * 32` columns; `out.len() >= T * 16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vnni,avx2,fma,f16c")]
pub(crate) unsafe fn tile<const T: usize, const L: u8>(
    p: &[u8],
    nch: usize,
    act: &QAct,
    t0: usize,
    out: &mut [f32],
) {
    let l = Lane::ALL[L as usize];
    let (cpb, hdr, cb, bb) = (l.cpb(), l.hdr(), l.chunk_bytes(), l.block_bytes());
    const { assert!(T <= 8) };
    assert!(out.len() >= T * PR && p.len() >= panel_bytes(l, nch) && nch.is_multiple_of(cpb));
    let mut qp = [std::ptr::null::<i32>(); T];
    let mut dp = [std::ptr::null::<f32>(); T];
    let mut xp = [std::ptr::null::<f32>(); T];
    let mut op = [std::ptr::null::<i32>(); T];
    for t in 0..T {
        let (q, d, xh) = act.token(t0 + t);
        // Q2_K's mins are per half chunk: the activations' scaled half sums.
        let xs = if l == Lane::Q2K { xh } else { act.xs32(t0 + t) };
        let os = match l {
            Lane::Q6K | Lane::Q2K | Lane::Q3K => act.h16(t0 + t),
            Lane::Iq4Nl => act.offs(t0 + t, IntOff::O128),
            _ => act.offs(t0 + t, IntOff::O8),
        };
        assert!(q.len() >= nch * 32 && d.len() >= nch && xs.len() >= nch && os.len() >= nch);
        if l.split() {
            assert!(os.len() >= 2 * nch);
        }
        if l == Lane::Q2K {
            assert!(xs.len() >= 2 * nch);
        }
        qp[t] = q.as_ptr() as *const i32;
        dp[t] = d.as_ptr();
        xp[t] = xs.as_ptr();
        op[t] = os.as_ptr();
    }
    let lo4 = _mm512_set1_epi8(15);
    // SAFETY: 64 bytes.
    let lut = unsafe { _mm512_loadu_si512(IQ4NL_LUT.as_ptr() as *const __m512i) };
    let mut f = [_mm512_setzero_ps(); T];
    for bi in 0..nch / cpb {
        // SAFETY: block bi of the panel is within p (asserted length); every chunk and token
        // index below is < nch, within the asserted activation lengths.
        unsafe {
            let blk = p.as_ptr().add(bi * bb);
            let dv = _mm512_cvtph_ps(_mm256_loadu_si256(blk as *const __m256i));
            let mv = if hdr == 2 {
                _mm512_cvtph_ps(_mm256_loadu_si256(blk.add(32) as *const __m256i))
            } else {
                _mm512_setzero_ps()
            };
            for k in 0..cpb {
                let c = bi * cpb + k;
                let base = blk.add(32 * hdr + k * cb);
                if T == 1 {
                    prefetch_ahead(base, cb);
                }
                let wq = base as *const __m512i;
                // The base plane: 4 (nibbles) or 2 (2-bit codes) zmm of 16 rows.
                let nv = l.low();
                let v: [__m512i; 4] = std::array::from_fn(|j| {
                    if j < nv {
                        _mm512_loadu_si512(wq.add(j))
                    } else {
                        _mm512_setzero_si512()
                    }
                });
                let mut w: [__m512i; 8] = if nv == 4 {
                    std::array::from_fn(|g| {
                        let x = if g < 4 {
                            v[g]
                        } else {
                            _mm512_srli_epi32(v[g - 4], 4)
                        };
                        _mm512_and_si512(x, lo4)
                    })
                } else {
                    // Group 4j + k: bits 2k.. of plane j.
                    std::array::from_fn(|g| {
                        let x = match g % 4 {
                            0 => v[g / 4],
                            1 => _mm512_srli_epi32(v[g / 4], 2),
                            2 => _mm512_srli_epi32(v[g / 4], 4),
                            _ => _mm512_srli_epi32(v[g / 4], 6),
                        };
                        _mm512_and_si512(x, _mm512_set1_epi8(3))
                    })
                };
                let hp = wq.add(nv);
                match (l.hi(), nv) {
                    (1, 4) => {
                        let h = [_mm512_loadu_si512(hp), _mm512_setzero_si512()];
                        for (g, wg) in w.iter_mut().enumerate() {
                            *wg = _mm512_or_si512(*wg, high_bits::<1>(&h, g));
                        }
                    }
                    (1, _) => {
                        let h = _mm512_loadu_si512(hp);
                        for (g, wg) in w.iter_mut().enumerate() {
                            *wg = _mm512_or_si512(*wg, bit2(h, g));
                        }
                    }
                    (2, _) => {
                        let h = [_mm512_loadu_si512(hp), _mm512_loadu_si512(hp.add(1))];
                        for (g, wg) in w.iter_mut().enumerate() {
                            *wg = _mm512_or_si512(*wg, high_bits::<2>(&h, g));
                        }
                    }
                    _ => {}
                }
                if l == Lane::Iq4Nl {
                    for wg in w.iter_mut() {
                        *wg = _mm512_shuffle_epi8(lut, *wg);
                    }
                }
                let sp = base.add(l.base() + 64 * l.hi()) as *const __m128i;
                let mut q2_mins = [_mm512_setzero_ps(); 2];
                let (s0, s1, mc) = match l {
                    Lane::Q4K | Lane::Q5K => {
                        let sc = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(sp)));
                        let m =
                            _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128(sp.add(1))));
                        let s = _mm512_mul_ps(dv, sc);
                        (s, s, _mm512_mul_ps(mv, m))
                    }
                    Lane::Q6K | Lane::Q3K => {
                        let a = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(sp)));
                        let b =
                            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(sp.add(1))));
                        (_mm512_mul_ps(dv, a), _mm512_mul_ps(dv, b), mv)
                    }
                    Lane::Q2K => {
                        // Half h's byte: scale in the low nibble, min in the high one.
                        let lo = _mm_set1_epi8(15);
                        let (h0, h1) = (_mm_loadu_si128(sp), _mm_loadu_si128(sp.add(1)));
                        let f = |v: __m128i| _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(v));
                        let sc0 = f(_mm_and_si128(h0, lo));
                        let sc1 = f(_mm_and_si128(h1, lo));
                        q2_mins = [
                            _mm512_mul_ps(mv, f(_mm_and_si128(_mm_srli_epi16(h0, 4), lo))),
                            _mm512_mul_ps(mv, f(_mm_and_si128(_mm_srli_epi16(h1, 4), lo))),
                        ];
                        (_mm512_mul_ps(dv, sc0), _mm512_mul_ps(dv, sc1), mv)
                    }
                    _ => (dv, dv, mv),
                };
                // One copy of the token body per token, written out (see `gemm512::tile`).
                macro_rules! tokens {
                    ($($t:literal)*) => {$(
                        if $t < T {
                            let q = qp[$t].add(8 * c);
                            let dx = _mm512_set1_ps(*dp[$t].add(c));
                            if l.split() {
                                // Halves kept apart: each has its own scale. Offsets: Q6_K 32,
                                // Q3_K 4, Q2_K none (its mins are float terms).
                                let o = match l {
                                    Lane::Q6K => -32,
                                    Lane::Q3K => -4,
                                    _ => 0,
                                };
                                let mut a = _mm512_set1_epi32(o * *op[$t].add(2 * c));
                                let mut b = _mm512_set1_epi32(o * *op[$t].add(2 * c + 1));
                                for g in 0..4 {
                                    let x0 = _mm512_set1_epi32(q.add(g).read_unaligned());
                                    a = _mm512_dpbusd_epi32(a, w[g], x0);
                                    let x1 = _mm512_set1_epi32(q.add(g + 4).read_unaligned());
                                    b = _mm512_dpbusd_epi32(b, w[g + 4], x1);
                                }
                                let fa = _mm512_cvtepi32_ps(a);
                                f[$t] = _mm512_fmadd_ps(fa, _mm512_mul_ps(s0, dx), f[$t]);
                                let fb = _mm512_cvtepi32_ps(b);
                                f[$t] = _mm512_fmadd_ps(fb, _mm512_mul_ps(s1, dx), f[$t]);
                                if l == Lane::Q2K {
                                    // w = d sc q - dmin m per half.
                                    let x0 = _mm512_set1_ps(*xp[$t].add(2 * c));
                                    f[$t] = _mm512_fnmadd_ps(q2_mins[0], x0, f[$t]);
                                    let x1 = _mm512_set1_ps(*xp[$t].add(2 * c + 1));
                                    f[$t] = _mm512_fnmadd_ps(q2_mins[1], x1, f[$t]);
                                }
                            } else {
                                // Two chains of 4 so more `vpdpbusd` are in flight; Q5_0 and
                                // IQ4_NL start from their exact offset term -O Σ q.
                                let mut a = match l {
                                    Lane::Q5_0 => _mm512_set1_epi32(2 * *op[$t].add(c)),
                                    Lane::Iq4Nl => _mm512_set1_epi32(*op[$t].add(c)),
                                    _ => _mm512_setzero_si512(),
                                };
                                let mut b = _mm512_setzero_si512();
                                for g in (0..8).step_by(2) {
                                    let x0 = _mm512_set1_epi32(q.add(g).read_unaligned());
                                    a = _mm512_dpbusd_epi32(a, w[g], x0);
                                    let x1 = _mm512_set1_epi32(q.add(g + 1).read_unaligned());
                                    b = _mm512_dpbusd_epi32(b, w[g + 1], x1);
                                }
                                let sum = _mm512_cvtepi32_ps(_mm512_add_epi32(a, b));
                                f[$t] = _mm512_fmadd_ps(sum, _mm512_mul_ps(s0, dx), f[$t]);
                                let xs = _mm512_set1_ps(*xp[$t].add(c));
                                match l {
                                    // w = d u + m.
                                    Lane::Q5_1 => f[$t] = _mm512_fmadd_ps(mc, xs, f[$t]),
                                    // w = d sc u - dmin m.
                                    Lane::Q4K | Lane::Q5K => {
                                        f[$t] = _mm512_fnmadd_ps(mc, xs, f[$t])
                                    }
                                    _ => {}
                                }
                            }
                        }
                    )*};
                }
                tokens!(0 1 2 3 4 5 6 7);
            }
        }
    }
    for (t, ft) in f.iter().enumerate() {
        // SAFETY: out holds T * 16 values (asserted above).
        unsafe { _mm512_storeu_ps(out[t * PR..].as_mut_ptr(), *ft) };
    }
}

/// The tile for `nt` (1..=8) tokens.
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
        ($($n:literal)*) => {
            match nt {
                $( $n => match l {
                    Lane::Q5_0 => tile::<$n, 0>(p, nch, act, t0, o),
                    Lane::Q5_1 => tile::<$n, 1>(p, nch, act, t0, o),
                    Lane::Iq4Nl => tile::<$n, 2>(p, nch, act, t0, o),
                    Lane::Q4K => tile::<$n, 3>(p, nch, act, t0, o),
                    Lane::Q5K => tile::<$n, 4>(p, nch, act, t0, o),
                    Lane::Q6K => tile::<$n, 5>(p, nch, act, t0, o),
                    Lane::Q2K => tile::<$n, 6>(p, nch, act, t0, o),
                    Lane::Q3K => tile::<$n, 7>(p, nch, act, t0, o),
                }, )*
                _ => match l {
                    Lane::Q5_0 => tile::<8, 0>(p, nch, act, t0, o),
                    Lane::Q5_1 => tile::<8, 1>(p, nch, act, t0, o),
                    Lane::Iq4Nl => tile::<8, 2>(p, nch, act, t0, o),
                    Lane::Q4K => tile::<8, 3>(p, nch, act, t0, o),
                    Lane::Q5K => tile::<8, 4>(p, nch, act, t0, o),
                    Lane::Q6K => tile::<8, 5>(p, nch, act, t0, o),
                    Lane::Q2K => tile::<8, 6>(p, nch, act, t0, o),
                    Lane::Q3K => tile::<8, 7>(p, nch, act, t0, o),
                },
            }
        };
    }
    // SAFETY: forwarded from the caller.
    unsafe { go!(1 2 3 4 5 6 7) }
}
