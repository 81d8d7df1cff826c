//! Plain float formats: F32, F16, BF16 (one element per "block").

use super::{f16_to_f32, f32_to_f16};

pub(super) fn dequant_f32(data: &[u8], out: &mut [f32]) {
    for (b, o) in data.chunks_exact(4).zip(out.iter_mut()) {
        *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    }
}

pub(super) fn dequant_f16(data: &[u8], out: &mut [f32]) {
    for (b, o) in data.chunks_exact(2).zip(out.iter_mut()) {
        *o = f16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(super) fn dequant_bf16(data: &[u8], out: &mut [f32]) {
    for (b, o) in data.chunks_exact(2).zip(out.iter_mut()) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

pub(super) fn quant_f32(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

pub(super) fn quant_f16(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|&v| f32_to_f16(v).to_le_bytes())
        .collect()
}

pub(super) fn quant_bf16(x: &[f32]) -> Vec<u8> {
    x.iter()
        .flat_map(|&v| f32_to_bf16(v).to_le_bytes())
        .collect()
}

/// bf16 bits to f32: the bits are the top half of an f32 (exact).
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits(u32::from(bits) << 16)
}

/// f32 to bf16 bits as ggml's `ggml_compute_fp32_to_bf16` does it: NaN becomes a quiet NaN
/// with the same sign, everything else rounds to nearest, ties to even (overflowing to inf).
pub fn f32_to_bf16(x: f32) -> u16 {
    let u = x.to_bits();
    if (u & 0x7fff_ffff) > 0x7f80_0000 {
        // Keep sign and top payload bits, force the quiet bit.
        return ((u >> 16) | 64) as u16;
    }
    let rounded = (u64::from(u) + 0x7fff + u64::from((u >> 16) & 1)) >> 16;
    rounded as u16
}
