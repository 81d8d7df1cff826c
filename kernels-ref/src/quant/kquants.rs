//! The k-quants: 256-element super-blocks split into sub-blocks of 16 or 32, each with its own
//! small integer scale (and min) under an f16 super-scale.
//!
//! Dequantization only: memwall reads k-quant models but does not write them.

use super::{bytes_at, f16_to_f32, u16_at, Block};
use crate::QK_K;

/// `block_q2_K`: 16 sub-blocks of 16; `x = d * (sc & 15) * q - dmin * (sc >> 4)`, q in 0..4.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ2K {
    pub scales: [u8; QK_K / 16],
    pub qs: [u8; QK_K / 4],
    pub d: u16,
    pub dmin: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ2K>() == 84);

/// `block_q3_K`: 16 sub-blocks of 16 with 6-bit signed scales; `x = d * (sc - 32) * q`,
/// q = 2 low bits minus 4 when the `hmask` bit is clear (q in -4..4).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ3K {
    pub hmask: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 4],
    pub scales: [u8; 12],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ3K>() == 110);

/// `block_q4_K`: 8 sub-blocks of 32 with 6-bit scales and mins;
/// `x = d * sc * q - dmin * m`, q in 0..16.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ4K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4K>() == 144);

/// `block_q5_K`: as Q4_K with a fifth bit per element in `qh`; q in 0..32.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ5K {
    pub d: u16,
    pub dmin: u16,
    pub scales: [u8; 12],
    pub qh: [u8; QK_K / 8],
    pub qs: [u8; QK_K / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5K>() == 176);

/// `block_q6_K`: 16 sub-blocks of 16 with i8 scales; `x = d * sc * (q - 32)`, q in 0..64
/// (4 low bits in `ql`, 2 high bits in `qh`).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ6K {
    pub ql: [u8; QK_K / 2],
    pub qh: [u8; QK_K / 4],
    pub scales: [i8; QK_K / 16],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockQ6K>() == 210);

impl Block for BlockQ2K {
    const SIZE: usize = 84;
    const QK: usize = QK_K;

    fn read(b: &[u8]) -> Self {
        BlockQ2K {
            scales: bytes_at(b, 0),
            qs: bytes_at(b, 16),
            d: u16_at(b, 80),
            dmin: u16_at(b, 82),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        for (e, o) in out.iter_mut().enumerate() {
            // Each half of 128 elements uses 32 bytes of qs; inside a half, the 2-bit field
            // at shift 2*j of byte l is element 32*j + l.
            let half = e / 128;
            let j = (e % 128) / 32;
            let l = e % 32;
            let q = (self.qs[half * 32 + l] >> (2 * j)) & 3;
            let sc = self.scales[e / 16];
            let dl = d * f32::from(sc & 0x0f);
            let ml = dmin * f32::from(sc >> 4);
            *o = dl * f32::from(q) - ml;
        }
    }
}

/// The 16 6-bit scales of Q3_K (still biased by 32): the low 4 bits of scale `j` are nibble
/// `j / 8` of byte `j % 8`; the high 2 bits are field `j / 4` of byte `8 + j % 4`.
pub(crate) fn q3k_scales(s: &[u8; 12]) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (j, o) in out.iter_mut().enumerate() {
        let low = (s[j % 8] >> (4 * (j / 8))) & 0x0f;
        let high = (s[8 + j % 4] >> (2 * (j / 4))) & 0x03;
        *o = low | (high << 4);
    }
    out
}

impl Block for BlockQ3K {
    const SIZE: usize = 110;
    const QK: usize = QK_K;

    fn read(b: &[u8]) -> Self {
        BlockQ3K {
            hmask: bytes_at(b, 0),
            qs: bytes_at(b, 32),
            scales: bytes_at(b, 96),
            d: u16_at(b, 108),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let scales = q3k_scales(&self.scales);
        for (e, o) in out.iter_mut().enumerate() {
            let half = e / 128;
            let j = (e % 128) / 32;
            let l = e % 32;
            let low = i32::from((self.qs[half * 32 + l] >> (2 * j)) & 3);
            // hmask byte l, bit 4*half + j; a clear bit means "subtract 4".
            let high_set = (self.hmask[l] >> (4 * half + j)) & 1 == 1;
            let q = if high_set { low } else { low - 4 };
            let dl = d * (i32::from(scales[e / 16]) - 32) as f32;
            *o = dl * q as f32;
        }
    }
}

/// Scale and min of sub-block `j` (0..8) from the 12 packed bytes of Q4_K/Q5_K
/// (ggml's `get_scale_min_k4`): sub-blocks 0..4 take the low 6 bits of bytes j and j+4;
/// sub-blocks 4..8 take a nibble of byte j+4 plus the top 2 bits of bytes j-4 and j.
pub(crate) fn scale_min_k4(j: usize, q: &[u8; 12]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        let sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        let m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
        (sc, m)
    }
}

impl Block for BlockQ4K {
    const SIZE: usize = 144;
    const QK: usize = QK_K;

    fn read(b: &[u8]) -> Self {
        BlockQ4K {
            d: u16_at(b, 0),
            dmin: u16_at(b, 2),
            scales: bytes_at(b, 4),
            qs: bytes_at(b, 16),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        for (e, o) in out.iter_mut().enumerate() {
            // 64 elements per 32 bytes: low nibbles first, then high nibbles.
            let chunk = e / 64;
            let hi = (e % 64) / 32;
            let l = e % 32;
            let q = (self.qs[chunk * 32 + l] >> (4 * hi)) & 0x0f;
            let (sc, m) = scale_min_k4(e / 32, &self.scales);
            *o = d * f32::from(sc) * f32::from(q) - dmin * f32::from(m);
        }
    }
}

impl Block for BlockQ5K {
    const SIZE: usize = 176;
    const QK: usize = QK_K;

    fn read(b: &[u8]) -> Self {
        BlockQ5K {
            d: u16_at(b, 0),
            dmin: u16_at(b, 2),
            scales: bytes_at(b, 4),
            qh: bytes_at(b, 16),
            qs: bytes_at(b, 48),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let dmin = f16_to_f32(self.dmin);
        for (e, o) in out.iter_mut().enumerate() {
            let chunk = e / 64;
            let hi = (e % 64) / 32;
            let l = e % 32;
            let low = (self.qs[chunk * 32 + l] >> (4 * hi)) & 0x0f;
            // Sub-block s = e / 32 takes its fifth bits from bit s of qh[l].
            let sub = e / 32;
            let high = (self.qh[l] >> sub) & 1;
            let q = low | (high << 4);
            let (sc, m) = scale_min_k4(sub, &self.scales);
            *o = d * f32::from(sc) * f32::from(q) - dmin * f32::from(m);
        }
    }
}

impl Block for BlockQ6K {
    const SIZE: usize = 210;
    const QK: usize = QK_K;

    fn read(b: &[u8]) -> Self {
        let raw: [u8; 16] = bytes_at(b, 192);
        BlockQ6K {
            ql: bytes_at(b, 0),
            qh: bytes_at(b, 128),
            scales: raw.map(|v| v as i8),
            d: u16_at(b, 208),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (e, o) in out.iter_mut().enumerate() {
            // Each half of 128 uses 64 bytes of ql and 32 of qh. Inside a half, quarter j
            // (32 elements) takes nibble j / 2 of ql[32 * (j % 2) + l] and the 2-bit field j
            // of qh[l].
            let half = e / 128;
            let j = (e % 128) / 32;
            let l = e % 32;
            let low = (self.ql[half * 64 + 32 * (j % 2) + l] >> (4 * (j / 2))) & 0x0f;
            let high = (self.qh[half * 32 + l] >> (2 * j)) & 0x03;
            let q = i32::from(low | (high << 4)) - 32;
            let sc = f32::from(self.scales[e / 16]);
            *o = d * sc * q as f32;
        }
    }
}
