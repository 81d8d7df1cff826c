//! The original 32-element formats: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0.
//!
//! Element order (all 4/5-bit ones): byte `j` of `qs` holds element `j` in its low nibble and
//! element `j + 16` in its high nibble; for the 5-bit ones bit `j` of the little-endian u32
//! `qh` is the fifth bit of element `j`.
//!
//! Quantizers follow ggml's `quantize_row_*_ref` (and gguf-py, which copies them): the scale is
//! computed in f32, stored as f16, and the f32 scale (not the stored one) is used to round.

use super::{bytes_at, f16_to_f32, f32_to_f16, u16_at, Block, QuantBlock};

const QK: usize = 32;

/// `block_q4_0`: `x = d * (q - 8)`, q in 0..16.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ4_0 {
    pub d: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_0>() == 18);

/// `block_q4_1`: `x = d * q + m`, q in 0..16.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ4_1 {
    pub d: u16,
    pub m: u16,
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ4_1>() == 20);

/// `block_q5_0`: `x = d * (q - 16)`, q in 0..32.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ5_0 {
    pub d: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_0>() == 22);

/// `block_q5_1`: `x = d * q + m`, q in 0..32.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ5_1 {
    pub d: u16,
    pub m: u16,
    pub qh: [u8; 4],
    pub qs: [u8; QK / 2],
}
const _: () = assert!(std::mem::size_of::<BlockQ5_1>() == 24);

/// `block_q8_0`: `x = d * q`, q an i8.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockQ8_0 {
    pub d: u16,
    pub qs: [i8; QK],
}
const _: () = assert!(std::mem::size_of::<BlockQ8_0>() == 34);

/// The 4-bit value of element `i` (0..32) from nibble-packed `qs`.
fn nibble(qs: &[u8; 16], i: usize) -> u8 {
    if i < 16 {
        qs[i] & 0x0f
    } else {
        qs[i - 16] >> 4
    }
}

/// Packs 32 4-bit values (low 4 bits of each `q`) into ggml's nibble order.
fn pack_nibbles(q: &[u8; QK]) -> [u8; 16] {
    let mut qs = [0u8; 16];
    for (j, b) in qs.iter_mut().enumerate() {
        *b = (q[j] & 0x0f) | ((q[j + 16] & 0x0f) << 4);
    }
    qs
}

/// Packs bit 4 of each of 32 values into the little-endian u32 `qh`.
fn pack_high_bits(q: &[u8; QK]) -> [u8; 4] {
    let mut h = 0u32;
    for (j, &v) in q.iter().enumerate() {
        h |= u32::from((v >> 4) & 1) << j;
    }
    h.to_le_bytes()
}

/// The element with the largest magnitude, sign kept (the first one on ties), as ggml's
/// symmetric quantizers pick it.
fn signed_absmax(x: &[f32]) -> f32 {
    let mut amax = 0.0f32;
    let mut max = 0.0f32;
    for &v in x {
        if v.abs() > amax {
            amax = v.abs();
            max = v;
        }
    }
    max
}

fn min_max(x: &[f32]) -> (f32, f32) {
    let mut min = f32::INFINITY;
    let mut max = f32::NEG_INFINITY;
    for &v in x {
        min = min.min(v);
        max = max.max(v);
    }
    (min, max)
}

fn inverse(d: f32) -> f32 {
    if d == 0.0 {
        0.0
    } else {
        1.0 / d
    }
}

/// Symmetric rounding of Q4_0/Q5_0: ggml's C source computes `x*id + offset` in one fused
/// multiply-add (one rounding to f32), then truncates; gguf-py mimics that through f64. `x*id`
/// is exact in f64, so rounding the f64 sum to f32 is that single rounding.
fn fused_trunc(x: f32, id: f32, offset: f64, max_q: u8) -> u8 {
    let v = (f64::from(x) * f64::from(id) + offset) as f32;
    // `as u8` saturates (negative or NaN to 0), which is the clip to the low end.
    (v.trunc() as u8).min(max_q)
}

impl Block for BlockQ4_0 {
    const SIZE: usize = 18;
    const QK: usize = QK;

    fn read(b: &[u8]) -> Self {
        BlockQ4_0 {
            d: u16_at(b, 0),
            qs: bytes_at(b, 2),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * (i32::from(nibble(&self.qs, i)) - 8) as f32;
        }
    }
}

impl QuantBlock for BlockQ4_0 {
    fn quant(x: &[f32]) -> Self {
        let d = signed_absmax(x) / -8.0;
        let id = inverse(d);
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(x) {
            *qi = fused_trunc(v, id, 8.5, 15);
        }
        BlockQ4_0 {
            d: f32_to_f16(d),
            qs: pack_nibbles(&q),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend_from_slice(&self.qs);
    }
}

impl Block for BlockQ4_1 {
    const SIZE: usize = 20;
    const QK: usize = QK;

    fn read(b: &[u8]) -> Self {
        BlockQ4_1 {
            d: u16_at(b, 0),
            m: u16_at(b, 2),
            qs: bytes_at(b, 4),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * f32::from(nibble(&self.qs, i)) + m;
        }
    }
}

impl QuantBlock for BlockQ4_1 {
    fn quant(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 15.0;
        let id = inverse(d);
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(x) {
            *qi = (((v - min) * id + 0.5).trunc() as u8).min(15);
        }
        BlockQ4_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qs: pack_nibbles(&q),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend_from_slice(&self.m.to_le_bytes());
        out.extend_from_slice(&self.qs);
    }
}

/// The 5-bit value of element `i` (0..32).
fn five_bits(qs: &[u8; 16], qh: [u8; 4], i: usize) -> u8 {
    let h = u32::from_le_bytes(qh);
    nibble(qs, i) | ((((h >> i) & 1) as u8) << 4)
}

impl Block for BlockQ5_0 {
    const SIZE: usize = 22;
    const QK: usize = QK;

    fn read(b: &[u8]) -> Self {
        BlockQ5_0 {
            d: u16_at(b, 0),
            qh: bytes_at(b, 2),
            qs: bytes_at(b, 6),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (i, o) in out.iter_mut().enumerate() {
            let q = i32::from(five_bits(&self.qs, self.qh, i)) - 16;
            *o = d * q as f32;
        }
    }
}

impl QuantBlock for BlockQ5_0 {
    fn quant(x: &[f32]) -> Self {
        let d = signed_absmax(x) / -16.0;
        let id = inverse(d);
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(x) {
            *qi = fused_trunc(v, id, 16.5, 31);
        }
        BlockQ5_0 {
            d: f32_to_f16(d),
            qh: pack_high_bits(&q),
            qs: pack_nibbles(&q),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.qs);
    }
}

impl Block for BlockQ5_1 {
    const SIZE: usize = 24;
    const QK: usize = QK;

    fn read(b: &[u8]) -> Self {
        BlockQ5_1 {
            d: u16_at(b, 0),
            m: u16_at(b, 2),
            qh: bytes_at(b, 4),
            qs: bytes_at(b, 8),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        let m = f16_to_f32(self.m);
        for (i, o) in out.iter_mut().enumerate() {
            *o = d * f32::from(five_bits(&self.qs, self.qh, i)) + m;
        }
    }
}

impl QuantBlock for BlockQ5_1 {
    fn quant(x: &[f32]) -> Self {
        let (min, max) = min_max(x);
        let d = (max - min) / 31.0;
        let id = inverse(d);
        let mut q = [0u8; QK];
        for (qi, &v) in q.iter_mut().zip(x) {
            *qi = (((v - min) * id + 0.5).trunc() as u8).min(31);
        }
        BlockQ5_1 {
            d: f32_to_f16(d),
            m: f32_to_f16(min),
            qh: pack_high_bits(&q),
            qs: pack_nibbles(&q),
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend_from_slice(&self.m.to_le_bytes());
        out.extend_from_slice(&self.qh);
        out.extend_from_slice(&self.qs);
    }
}

impl Block for BlockQ8_0 {
    const SIZE: usize = 34;
    const QK: usize = QK;

    fn read(b: &[u8]) -> Self {
        let raw: [u8; QK] = bytes_at(b, 2);
        BlockQ8_0 {
            d: u16_at(b, 0),
            qs: raw.map(|v| v as i8),
        }
    }

    fn dequant(&self, out: &mut [f32]) {
        let d = f16_to_f32(self.d);
        for (o, &q) in out.iter_mut().zip(&self.qs) {
            *o = d * f32::from(q);
        }
    }
}

impl QuantBlock for BlockQ8_0 {
    fn quant(x: &[f32]) -> Self {
        let amax = x.iter().fold(0.0f32, |a, v| a.max(v.abs()));
        let d = amax / 127.0;
        let id = inverse(d);
        let mut qs = [0i8; QK];
        for (qi, &v) in qs.iter_mut().zip(x) {
            // f32::round is round-half-away-from-zero, as C's roundf; |v*id| <= 127.
            *qi = (v * id).round() as i8;
        }
        BlockQ8_0 {
            d: f32_to_f16(d),
            qs,
        }
    }

    fn write(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.d.to_le_bytes());
        out.extend(self.qs.iter().map(|&q| q as u8));
    }
}
