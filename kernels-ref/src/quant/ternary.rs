//! Ternary formats (values in {-1, 0, 1} times an f16 scale): TQ1_0 (1.6875 bits per weight,
//! five trits per byte) and TQ2_0 (2 bits per weight).

use super::{bytes_at, f16_to_f32, f32_to_f16, u16_at, Block, QuantBlock};
use crate::QK_K;

/// `block_tq1_0`: 240 elements as base-3 digits, 5 per byte in `qs` and 4 per byte in `qh`.
///
/// A byte holds its digits as a fixed-point fraction: the digits read as a base-3 number `v`
/// (first digit most significant) are stored as `ceil(v * 256 / 243)`. Multiplying the byte by
/// `3^n` (mod 256) moves digit `n` to the top, and `(b * 3) >> 8` reads it.
/// Element order: `qs[0..32]` hold elements `32 * n + m` (digit n, byte m) for the first 160,
/// `qs[32..48]` hold `160 + 16 * n + m`, `qh[0..4]` hold `240 + 4 * n + m` (digits 0..4).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockTq1_0 {
    pub qs: [u8; (QK_K - 4 * QK_K / 64) / 5],
    pub qh: [u8; QK_K / 64],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockTq1_0>() == 54);

/// `block_tq2_0`: 2-bit fields holding `q + 1`; within each 128 elements, field `n` (shift
/// 2n) of byte `l` is element `32 * n + l`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockTq2_0 {
    pub qs: [u8; QK_K / 4],
    pub d: u16,
}
const _: () = assert!(std::mem::size_of::<BlockTq2_0>() == 66);

const POW3: [u8; 5] = [1, 3, 9, 27, 81];

/// Digit `n` of a TQ1_0 byte, as -1, 0 or 1.
fn trit(byte: u8, n: usize) -> i32 {
    let shifted = byte.wrapping_mul(POW3[n]);
    ((u32::from(shifted) * 3) >> 8) as i32 - 1
}

/// Packs up to 5 digits (each 0..3, first most significant) into one TQ1_0 byte.
fn pack_trits(digits: &[u8]) -> u8 {
    let v = digits.iter().fold(0u16, |acc, &t| acc * 3 + u16::from(t));
    // Pad to 5 digits so the first digit lands at 3^4 (the qh bytes carry only 4).
    let v = v * 3u16.pow(5 - digits.len() as u32);
    (v * 256).div_ceil(243) as u8
}

/// ggml's ternary rounding: `round(x / amax)` shifted to 0..3 (gguf-py's rule).
fn ternary_digits(x: &[f32]) -> (f32, Vec<u8>) {
    let d = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
    let id = if d == 0.0 { 0.0 } else { 1.0 / d };
    let q = x
        .iter()
        .map(|&v| ((v * id).round().clamp(-1.0, 1.0) as i8 + 1) as u8)
        .collect();
    (d, q)
}

impl Block for BlockTq1_0 {
    const SIZE: usize = 54;
    const QK: usize = QK_K;

    fn read(b: &[u8]) -> Self {
        BlockTq1_0 {
            qs: bytes_at(b, 0),
            qh: bytes_at(b, 48),
            d: u16_at(b, 52),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (e, o) in out.iter_mut().enumerate() {
            let q = if e < 160 {
                trit(self.qs[e % 32], e / 32)
            } else if e < 240 {
                let k = e - 160;
                trit(self.qs[32 + k % 16], k / 16)
            } else {
                let k = e - 240;
                trit(self.qh[k % 4], k / 4)
            };
            *o = d * q as f32;
        }
    }
}

impl QuantBlock for BlockTq1_0 {
    fn quant(x: &[f32]) -> Self {
        let (d, q) = ternary_digits(x);
        let mut qs = [0u8; 48];
        for (m, b) in qs[..32].iter_mut().enumerate() {
            let digits: Vec<u8> = (0..5).map(|n| q[32 * n + m]).collect();
            *b = pack_trits(&digits);
        }
        for (m, b) in qs[32..].iter_mut().enumerate() {
            let digits: Vec<u8> = (0..5).map(|n| q[160 + 16 * n + m]).collect();
            *b = pack_trits(&digits);
        }
        let mut qh = [0u8; 4];
        for (m, b) in qh.iter_mut().enumerate() {
            let digits: Vec<u8> = (0..4).map(|n| q[240 + 4 * n + m]).collect();
            *b = pack_trits(&digits);
        }
        BlockTq1_0 {
            qs,
            qh,
            d: f32_to_f16(d),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.qs);
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.d.to_le_bytes());
    }
}

impl Block for BlockTq2_0 {
    const SIZE: usize = 66;
    const QK: usize = QK_K;

    fn read(b: &[u8]) -> Self {
        BlockTq2_0 {
            qs: bytes_at(b, 0),
            d: u16_at(b, 64),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (e, o) in out.iter_mut().enumerate() {
            let byte = self.qs[(e / 128) * 32 + e % 32];
            let q = i32::from((byte >> (2 * ((e % 128) / 32))) & 3) - 1;
            *o = d * q as f32;
        }
    }
}

impl QuantBlock for BlockTq2_0 {
    fn quant(x: &[f32]) -> Self {
        let (d, q) = ternary_digits(x);
        let mut qs = [0u8; 64];
        for (e, &v) in q.iter().enumerate() {
            qs[(e / 128) * 32 + e % 32] |= v << (2 * ((e % 128) / 32));
        }
        BlockTq2_0 {
            qs,
            d: f32_to_f16(d),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.qs);
        out.extend_from_slice(&self.d.to_le_bytes());
    }
}
