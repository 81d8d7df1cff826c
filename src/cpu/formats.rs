//! Weight block formats as the integer kernels see them.
//!
//! Every quantized format handled by the integer path is described as a sequence of 32-element
//! "chunks". For chunk `c` of a block the format yields small integers `u[0..32]`, one integer
//! multiplier per half (`mul[0]` for elements 0..16, `mul[1]` for 16..32), a float `dw` and one
//! float offset per half, such that the dequantized weight is
//!
//! ```text
//! w[i] = dw * mul[i / 16] * u[i] + c[i / 16]
//! ```
//!
//! With the activation chunk quantized as `x[i] ≈ dx * q[i]` this gives
//!
//! ```text
//! sum_i w[i] x[i] ≈ dw * dx * (mul[0] * Σ_{i<16} u q + mul[1] * Σ_{i≥16} u q)
//!                   + c[0] * (dx Σ_{i<16} q) + c[1] * (dx Σ_{i≥16} q)
//! ```
//!
//! so the hot loop is an integer dot product plus two per-half terms that only need the
//! activation's scaled half sums (precomputed once per matmul in `QAct::xs`). `u` is unsigned
//! (0..=63) except for `SIGNED` formats, whose `u` holds signed values and whose `c` is zero; the
//! AVX2 path multiplies those with the sign trick.

#![allow(non_camel_case_types)] // format names as ggml spells them

/// One decoded 32-element chunk (scalar form).
#[derive(Clone, Copy)]
pub(crate) struct Chunk {
    /// [32] integer weights (unsigned 0..=63, or signed for `SIGNED` formats).
    pub u: [i16; 32],
    /// Integer multiplier for elements 0..16 and 16..32.
    pub mul: [i32; 2],
    /// Float scale shared by the chunk.
    pub dw: f32,
    /// Float offset added to every weight of each half.
    pub c: [f32; 2],
}

impl Default for Chunk {
    fn default() -> Self {
        Chunk {
            u: [0; 32],
            mul: [1; 2],
            dw: 0.0,
            c: [0.0; 2],
        }
    }
}

/// A block format handled by the integer kernels.
pub(crate) trait Format {
    /// Elements per block.
    const BLOCK: usize;
    /// Bytes per block.
    const BYTES: usize;
    /// `u` holds signed values and `c` is always zero.
    const SIGNED: bool;
    /// The two halves of a chunk have different offsets `c` (else `c[0] == c[1]`).
    const SPLIT: bool = false;
    /// Per-block values decoded once and shared by the block's chunks.
    type P: Copy;
    /// Decodes the per-block values. `blk.len() == Self::BYTES`.
    fn params(blk: &[u8]) -> Self::P;
    /// Decodes chunk `c` (`c < BLOCK / 32`) into `out`.
    fn unpack(blk: &[u8], p: &Self::P, c: usize, out: &mut Chunk);
}

/// IEEE half to f32 without a lookup table or a runtime CPU check, so it inlines into hot loops.
#[inline(always)]
pub(crate) fn f16_to_f32(h: u16) -> f32 {
    let h = h as u32;
    let sign = (h & 0x8000) << 16;
    let em = h & 0x7fff;
    let bits = if em >= 0x7c00 {
        // Inf or NaN: keep the payload, saturate the exponent.
        0x7f80_0000 | ((em & 0x03ff) << 13)
    } else {
        // Normal and subnormal halves: aligning the fields and scaling by 2^(127-15) is exact
        // for both (a subnormal half lands on an f32 subnormal, which the multiply normalises).
        (f32::from_bits(em << 13) * f32::from_bits(0x7780_0000)).to_bits()
    };
    f32::from_bits(bits | sign)
}

#[inline(always)]
pub(crate) fn rd_f16(b: &[u8], off: usize) -> f32 {
    f16_to_f32(u16::from_le_bytes([b[off], b[off + 1]]))
}

/// Nibble layout shared by Q4_0, Q4_1, IQ4_NL: element i is `qs[i] & 15`, element i+16 is
/// `qs[i] >> 4`.
#[inline(always)]
fn nibbles(qs: &[u8], u: &mut [i16; 32]) {
    for i in 0..16 {
        u[i] = (qs[i] & 15) as i16;
        u[i + 16] = (qs[i] >> 4) as i16;
    }
}

pub(crate) struct Q4_0;
impl Format for Q4_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 18;
    const SIGNED: bool = false;
    type P = f32;
    fn params(blk: &[u8]) -> f32 {
        rd_f16(blk, 0)
    }
    fn unpack(blk: &[u8], d: &f32, _c: usize, out: &mut Chunk) {
        nibbles(&blk[2..18], &mut out.u);
        out.mul = [1, 1];
        out.dw = *d;
        out.c = [-8.0 * d; 2];
    }
}

pub(crate) struct Q4_1;
impl Format for Q4_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = 20;
    const SIGNED: bool = false;
    type P = (f32, f32);
    fn params(blk: &[u8]) -> (f32, f32) {
        (rd_f16(blk, 0), rd_f16(blk, 2))
    }
    fn unpack(blk: &[u8], p: &(f32, f32), _c: usize, out: &mut Chunk) {
        nibbles(&blk[4..20], &mut out.u);
        out.mul = [1, 1];
        out.dw = p.0;
        out.c = [p.1; 2];
    }
}

/// Q5 layout: low nibbles as Q4, bit i of the little-endian u32 `qh` is bit 4 of element i.
fn q5_bits(qh: &[u8], qs: &[u8], u: &mut [i16; 32]) {
    let h = u32::from_le_bytes([qh[0], qh[1], qh[2], qh[3]]);
    nibbles(qs, u);
    for (i, v) in u.iter_mut().enumerate() {
        *v |= (((h >> i) & 1) << 4) as i16;
    }
}

pub(crate) struct Q5_0;
impl Format for Q5_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 22;
    const SIGNED: bool = false;
    type P = f32;
    fn params(blk: &[u8]) -> f32 {
        rd_f16(blk, 0)
    }
    fn unpack(blk: &[u8], d: &f32, _c: usize, out: &mut Chunk) {
        q5_bits(&blk[2..6], &blk[6..22], &mut out.u);
        out.mul = [1, 1];
        out.dw = *d;
        out.c = [-16.0 * d; 2];
    }
}

pub(crate) struct Q5_1;
impl Format for Q5_1 {
    const BLOCK: usize = 32;
    const BYTES: usize = 24;
    const SIGNED: bool = false;
    type P = (f32, f32);
    fn params(blk: &[u8]) -> (f32, f32) {
        (rd_f16(blk, 0), rd_f16(blk, 2))
    }
    fn unpack(blk: &[u8], p: &(f32, f32), _c: usize, out: &mut Chunk) {
        q5_bits(&blk[4..8], &blk[8..24], &mut out.u);
        out.mul = [1, 1];
        out.dw = p.0;
        out.c = [p.1; 2];
    }
}

pub(crate) struct Q8_0;
impl Format for Q8_0 {
    const BLOCK: usize = 32;
    const BYTES: usize = 34;
    const SIGNED: bool = true;
    type P = f32;
    fn params(blk: &[u8]) -> f32 {
        rd_f16(blk, 0)
    }
    fn unpack(blk: &[u8], d: &f32, _c: usize, out: &mut Chunk) {
        for (u, &b) in out.u.iter_mut().zip(&blk[2..34]) {
            *u = b as i8 as i16;
        }
        out.mul = [1, 1];
        out.dw = *d;
        out.c = [0.0; 2];
    }
}

/// The 16 non-linear levels of IQ4_NL.
pub(crate) const IQ4NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

pub(crate) struct IQ4_NL;
impl Format for IQ4_NL {
    const BLOCK: usize = 32;
    const BYTES: usize = 18;
    const SIGNED: bool = true;
    type P = f32;
    fn params(blk: &[u8]) -> f32 {
        rd_f16(blk, 0)
    }
    fn unpack(blk: &[u8], d: &f32, _c: usize, out: &mut Chunk) {
        nibbles(&blk[2..18], &mut out.u);
        for u in out.u.iter_mut() {
            *u = IQ4NL_VALUES[(*u & 15) as usize] as i16;
        }
        out.mul = [1, 1];
        out.dw = *d;
        out.c = [0.0; 2];
    }
}

/// IQ4_XS's 6-bit sub-block scale `ls` of chunk `c` (0..8), from the low nibbles in bytes 4..8
/// and the 2-bit high parts in the u16 at byte 2 (`dequantize_row_iq4_xs`).
#[inline(always)]
pub(crate) fn iq4xs_scale(blk: &[u8], c: usize) -> i32 {
    let lo = (blk[4 + c / 2] >> (4 * (c % 2))) & 15;
    let hi = (u16::from_le_bytes([blk[2], blk[3]]) >> (2 * c)) & 3;
    (lo as i32) | ((hi as i32) << 4)
}

/// IQ4_XS: super-blocks of 256 (d, 8 six-bit scales, 128 bytes of nibbles); chunk c is
/// `d * (ls_c - 32) * IQ4NL_VALUES[q]`, the signed scale as the chunk's integer multiplier.
pub(crate) struct IQ4_XS;
impl Format for IQ4_XS {
    const BLOCK: usize = 256;
    const BYTES: usize = 136;
    const SIGNED: bool = true;
    type P = f32;
    fn params(blk: &[u8]) -> f32 {
        rd_f16(blk, 0)
    }
    fn unpack(blk: &[u8], d: &f32, c: usize, out: &mut Chunk) {
        nibbles(&blk[8 + 16 * c..24 + 16 * c], &mut out.u);
        for u in out.u.iter_mut() {
            *u = IQ4NL_VALUES[(*u & 15) as usize] as i16;
        }
        let m = iq4xs_scale(blk, c) - 32;
        out.mul = [m, m];
        out.dw = *d;
        out.c = [0.0; 2];
    }
}

/// Per-block values of Q4_K / Q5_K: d, dmin and the eight 6-bit (scale, min) pairs.
#[derive(Clone, Copy)]
pub(crate) struct KParams {
    pub d: f32,
    pub dmin: f32,
    pub sc: [u8; 8],
    pub m: [u8; 8],
}

/// Unpacks the 12-byte 6-bit scale/min table of Q4_K and Q5_K.
pub(crate) fn k4_scales(s: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = s[j] & 63;
            m[j] = s[j + 4] & 63;
        } else {
            sc[j] = (s[j + 4] & 15) | ((s[j - 4] >> 6) << 4);
            m[j] = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
        }
    }
    (sc, m)
}

/// Q4_K: d, dmin (f16), scales[12], qs[128]. Chunk c uses the low (c even) or high nibbles of
/// qs[32*(c/2)..][..32], with scale sc[c] and min m[c]: w = d*sc*q - dmin*m.
pub(crate) struct Q4_K;
impl Format for Q4_K {
    const BLOCK: usize = 256;
    const BYTES: usize = 144;
    const SIGNED: bool = false;
    type P = KParams;
    fn params(blk: &[u8]) -> KParams {
        let (sc, m) = k4_scales(&blk[4..16]);
        KParams {
            d: rd_f16(blk, 0),
            dmin: rd_f16(blk, 2),
            sc,
            m,
        }
    }
    fn unpack(blk: &[u8], p: &KParams, c: usize, out: &mut Chunk) {
        let qs = &blk[16 + 32 * (c / 2)..][..32];
        let shift = 4 * (c & 1);
        for (u, &b) in out.u.iter_mut().zip(qs) {
            *u = ((b >> shift) & 15) as i16;
        }
        out.mul = [p.sc[c] as i32; 2];
        out.dw = p.d;
        out.c = [-p.dmin * p.m[c] as f32; 2];
    }
}

/// Q5_K: d, dmin, scales[12], qh[32], qs[128]. As Q4_K, plus bit c of qh[i] is bit 4 of element i
/// of chunk c.
pub(crate) struct Q5_K;
impl Format for Q5_K {
    const BLOCK: usize = 256;
    const BYTES: usize = 176;
    const SIGNED: bool = false;
    type P = KParams;
    fn params(blk: &[u8]) -> KParams {
        Q4_K::params(blk)
    }
    fn unpack(blk: &[u8], p: &KParams, c: usize, out: &mut Chunk) {
        let qh = &blk[16..48];
        let qs = &blk[48 + 32 * (c / 2)..][..32];
        let shift = 4 * (c & 1);
        for i in 0..32 {
            let hi = ((qh[i] >> c) & 1) << 4;
            out.u[i] = (((qs[i] >> shift) & 15) | hi) as i16;
        }
        out.mul = [p.sc[c] as i32; 2];
        out.dw = p.d;
        out.c = [-p.dmin * p.m[c] as f32; 2];
    }
}

/// Q6_K: ql[128], qh[64], scales[16] (i8), d (f16). Chunk c = 4n+k covers elements 32c..32c+32:
/// low 4 bits from ql[64n + 32(k&1) + i] (low nibble for k<2, high for k≥2), high 2 bits from
/// (qh[32n + i] >> 2k) & 3; w = d * scales[2c + i/16] * (q - 32).
pub(crate) struct Q6_K;
impl Format for Q6_K {
    const SPLIT: bool = true;
    const BLOCK: usize = 256;
    const BYTES: usize = 210;
    const SIGNED: bool = false;
    type P = f32;
    fn params(blk: &[u8]) -> f32 {
        rd_f16(blk, 208)
    }
    fn unpack(blk: &[u8], d: &f32, c: usize, out: &mut Chunk) {
        let (n, k) = (c / 4, c % 4);
        let ql = &blk[64 * n + 32 * (k & 1)..][..32];
        let qh = &blk[128 + 32 * n..][..32];
        let lshift = if k < 2 { 0 } else { 4 };
        for i in 0..32 {
            let lo = (ql[i] >> lshift) & 15;
            let hi = (qh[i] >> (2 * k)) & 3;
            out.u[i] = (lo | (hi << 4)) as i16;
        }
        let sa = blk[192 + 2 * c] as i8 as i32;
        let sb = blk[192 + 2 * c + 1] as i8 as i32;
        out.mul = [sa, sb];
        out.dw = *d;
        out.c = [-32.0 * d * sa as f32, -32.0 * d * sb as f32];
    }
}

/// Q2_K: scales[16] (low nibble scale, high nibble min), qs[64], d, dmin (f16). Chunk c = 4n+j:
/// q = (qs[32n + i] >> 2j) & 3, w = d * (s & 15) * q - dmin * (s >> 4) with s = scales[2c + i/16].
pub(crate) struct Q2_K;
impl Format for Q2_K {
    const SPLIT: bool = true;
    const BLOCK: usize = 256;
    const BYTES: usize = 84;
    const SIGNED: bool = false;
    type P = (f32, f32);
    fn params(blk: &[u8]) -> (f32, f32) {
        (rd_f16(blk, 80), rd_f16(blk, 82))
    }
    fn unpack(blk: &[u8], p: &(f32, f32), c: usize, out: &mut Chunk) {
        let (n, j) = (c / 4, c % 4);
        let qs = &blk[16 + 32 * n..][..32];
        for (u, &b) in out.u.iter_mut().zip(qs) {
            *u = ((b >> (2 * j)) & 3) as i16;
        }
        let (sa, sb) = (blk[2 * c], blk[2 * c + 1]);
        out.mul = [(sa & 15) as i32, (sb & 15) as i32];
        out.dw = p.0;
        out.c = [-p.1 * (sa >> 4) as f32, -p.1 * (sb >> 4) as f32];
    }
}

/// The sixteen 6-bit scales of Q3_K (already minus 32).
pub(crate) fn q3k_scales(s: &[u8]) -> [i8; 16] {
    let mut out = [0i8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        let low = if i < 8 { s[i] & 15 } else { s[i - 8] >> 4 };
        let high = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
        *o = (low | (high << 4)) as i8 - 32;
    }
    out
}

/// Q3_K: hmask[32], qs[64], scales[12], d (f16). Chunk c = 4n+j: low bits (qs[32n+i] >> 2j) & 3,
/// bit 2 set when bit c of hmask[i] is set; w = d * scale[2c + i/16] * (q - 4).
pub(crate) struct Q3_K;
impl Format for Q3_K {
    const SPLIT: bool = true;
    const BLOCK: usize = 256;
    const BYTES: usize = 110;
    const SIGNED: bool = false;
    type P = (f32, [i8; 16]);
    fn params(blk: &[u8]) -> (f32, [i8; 16]) {
        (rd_f16(blk, 108), q3k_scales(&blk[96..108]))
    }
    fn unpack(blk: &[u8], p: &(f32, [i8; 16]), c: usize, out: &mut Chunk) {
        let (n, j) = (c / 4, c % 4);
        let hm = &blk[0..32];
        let qs = &blk[32 + 32 * n..][..32];
        for i in 0..32 {
            let lo = (qs[i] >> (2 * j)) & 3;
            let hi = ((hm[i] >> c) & 1) << 2;
            out.u[i] = (lo | hi) as i16;
        }
        let (sa, sb) = (p.1[2 * c] as i32, p.1[2 * c + 1] as i32);
        out.mul = [sa, sb];
        out.dw = p.0;
        out.c = [-4.0 * p.0 * sa as f32, -4.0 * p.0 * sb as f32];
    }
}

/// TQ2_0: qs[64], d (f16). Chunk c: q = (qs[32(c/4) + i] >> 2(c%4)) & 3, w = d * (q - 1).
pub(crate) struct TQ2_0;
impl Format for TQ2_0 {
    const BLOCK: usize = 256;
    const BYTES: usize = 66;
    const SIGNED: bool = false;
    type P = f32;
    fn params(blk: &[u8]) -> f32 {
        rd_f16(blk, 64)
    }
    fn unpack(blk: &[u8], d: &f32, c: usize, out: &mut Chunk) {
        let qs = &blk[32 * (c / 4)..][..32];
        for (u, &b) in out.u.iter_mut().zip(qs) {
            *u = ((b >> (2 * (c % 4))) & 3) as i16;
        }
        out.mul = [1, 1];
        out.dw = *d;
        out.c = [-d; 2];
    }
}

/// Dequantizes whole blocks of format `F` (used for embedding lookups).
pub(crate) fn dequantize<F: Format>(data: &[u8], out: &mut [f32]) {
    let mut ch = Chunk::default();
    for (blk, o) in data
        .chunks_exact(F::BYTES)
        .zip(out.chunks_exact_mut(F::BLOCK))
    {
        let p = F::params(blk);
        for (c, oc) in o.chunks_exact_mut(32).enumerate() {
            F::unpack(blk, &p, c, &mut ch);
            for (i, v) in oc.iter_mut().enumerate() {
                let h = i / 16;
                *v = ch.dw * (ch.mul[h] * ch.u[i] as i32) as f32 + ch.c[h];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every one of the 65536 halves converts exactly as the `half` crate does (NaNs stay NaN).
    #[test]
    fn f16_conversion_is_exact_for_all_halves() {
        for h in 0..=u16::MAX {
            let want = half::f16::from_bits(h).to_f32();
            let got = f16_to_f32(h);
            if want.is_nan() {
                assert!(got.is_nan(), "{h:#06x}");
            } else {
                assert_eq!(got.to_bits(), want.to_bits(), "{h:#06x}");
            }
        }
    }

    /// The chunk decomposition w = dw·mul·u + c reproduces kernels-ref's dequantization.
    #[test]
    fn chunk_dequant_matches_kernels_ref() {
        let mut s = 88172645463325252u64;
        let mut bytes = |n: usize| -> Vec<u8> {
            (0..n)
                .map(|_| {
                    s ^= s << 13;
                    s ^= s >> 7;
                    s ^= s << 17;
                    s as u8
                })
                .collect()
        };
        fn check<F: Format>(ty: GgmlType, data: &mut [u8], scale_offs: &[usize]) {
            for blk in data.chunks_exact_mut(F::BYTES) {
                for &o in scale_offs {
                    blk[o..o + 2].copy_from_slice(&half::f16::from_f32(0.0123).to_le_bytes());
                }
            }
            let n = data.len() / F::BYTES * F::BLOCK;
            let want = kernels_ref::dequantize_vec(ty, data, n).unwrap();
            let mut got = vec![f32::NAN; n];
            dequantize::<F>(data, &mut got);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (g - w).abs() <= 1e-6 * w.abs().max(1e-3),
                    "{ty} element {i}: {g} vs {w}"
                );
            }
        }
        use kernels_ref::GgmlType;
        check::<Q4_0>(GgmlType::Q4_0, &mut bytes(18 * 3), &[0]);
        check::<Q4_1>(GgmlType::Q4_1, &mut bytes(20 * 3), &[0, 2]);
        check::<Q5_0>(GgmlType::Q5_0, &mut bytes(22 * 3), &[0]);
        check::<Q5_1>(GgmlType::Q5_1, &mut bytes(24 * 3), &[0, 2]);
        check::<Q8_0>(GgmlType::Q8_0, &mut bytes(34 * 3), &[0]);
        check::<IQ4_NL>(GgmlType::IQ4_NL, &mut bytes(18 * 3), &[0]);
        check::<IQ4_XS>(GgmlType::IQ4_XS, &mut bytes(136 * 2), &[0]);
        check::<Q2_K>(GgmlType::Q2_K, &mut bytes(84 * 2), &[80, 82]);
        check::<Q3_K>(GgmlType::Q3_K, &mut bytes(110 * 2), &[108]);
        check::<Q4_K>(GgmlType::Q4_K, &mut bytes(144 * 2), &[0, 2]);
        check::<Q5_K>(GgmlType::Q5_K, &mut bytes(176 * 2), &[0, 2]);
        check::<Q6_K>(GgmlType::Q6_K, &mut bytes(210 * 2), &[208]);
        check::<TQ2_0>(GgmlType::TQ2_0, &mut bytes(66 * 2), &[64]);
    }
}
