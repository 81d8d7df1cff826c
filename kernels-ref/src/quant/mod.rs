//! GGML block formats: dequantization for every type `GgmlType::is_supported` lists and
//! quantization for the simple ones.
//!
//! Each format is a `#[repr(C)]` struct laid out byte for byte as ggml's `block_*` struct
//! (f16 fields kept as their `u16` bits), with a compile-time size check. Blocks are parsed
//! from bytes field by field (no casts, no unsafe), so data at any alignment works.
//! Element order inside each block follows ggml's `dequantize_row_*` exactly; the layouts were
//! checked against gguf-py's independent implementation by the fixtures test.

mod float;
mod iq;
mod kquants;
mod legacy;
mod ternary;

pub use float::{bf16_to_f32, f32_to_bf16};
pub use iq::{BlockIq4Nl, BlockIq4Xs, KVALUES_IQ4NL};
pub use kquants::{BlockQ2K, BlockQ3K, BlockQ4K, BlockQ5K, BlockQ6K};
pub use legacy::{BlockQ4_0, BlockQ4_1, BlockQ5_0, BlockQ5_1, BlockQ8_0};
pub use ternary::{BlockTq1_0, BlockTq2_0};

use crate::error::{check_bytes, RefError};
use crate::GgmlType;

/// One block of a quantized format. Crate-private: `read` trusts its caller to pass exactly
/// `SIZE` bytes, which only the length-checked paths in this crate guarantee.
pub(crate) trait Block: Sized {
    /// Bytes per block in the file (equals `size_of::<Self>()`, checked at compile time).
    const SIZE: usize;
    /// Elements per block.
    const QK: usize;

    /// Parses one block. `b` must be exactly `SIZE` bytes; callers get it from `chunks_exact`.
    fn read(b: &[u8]) -> Self;

    /// Writes this block's `QK` values into `out` (`out.len() == QK`), in ggml's element order.
    fn dequant(&self, out: &mut [f32]);
}

/// A block format kernels-ref can also produce.
pub(crate) trait QuantBlock: Block {
    /// Quantizes `QK` values (`x.len() == QK`) with ggml's reference rounding rules.
    fn quant(x: &[f32]) -> Self;

    /// Appends the block's `SIZE` bytes to `out`.
    fn write(&self, out: &mut Vec<u8>);
}

/// Reads the little-endian `u16` at `off`.
pub(crate) fn u16_at(b: &[u8], off: usize) -> u16 {
    u16::from_le_bytes([b[off], b[off + 1]])
}

/// Copies `N` bytes starting at `off`.
pub(crate) fn bytes_at<const N: usize>(b: &[u8], off: usize) -> [u8; N] {
    let mut a = [0u8; N];
    a.copy_from_slice(&b[off..off + N]);
    a
}

/// IEEE half bits to f32 (exact).
pub fn f16_to_f32(bits: u16) -> f32 {
    half::f16::from_bits(bits).to_f32()
}

/// f32 to IEEE half bits, rounding to nearest even (as ggml and numpy do).
pub fn f32_to_f16(x: f32) -> u16 {
    half::f16::from_f32(x).to_bits()
}

fn dequant_blocks<B: Block>(data: &[u8], out: &mut [f32]) {
    // Lengths were checked by the caller: data = n_blocks * SIZE, out = n_blocks * QK.
    for (b, o) in data.chunks_exact(B::SIZE).zip(out.chunks_exact_mut(B::QK)) {
        B::read(b).dequant(o);
    }
}

fn quant_blocks<B: QuantBlock>(x: &[f32]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() / B::QK * B::SIZE);
    for chunk in x.chunks_exact(B::QK) {
        B::quant(chunk).write(&mut out);
    }
    out
}

/// Dequantizes `out.len()` elements of type `ty` from `data`.
///
/// `data.len()` must be exactly `ty.row_bytes(out.len())`; otherwise `BadLength`. Types outside
/// `GgmlType::is_supported` give `Unsupported`.
pub fn dequantize(ty: GgmlType, data: &[u8], out: &mut [f32]) -> Result<(), RefError> {
    if !ty.is_supported() {
        return Err(RefError::Unsupported(ty));
    }
    check_bytes(ty, out.len(), data)?;
    match ty {
        GgmlType::F32 => float::dequant_f32(data, out),
        GgmlType::F16 => float::dequant_f16(data, out),
        GgmlType::BF16 => float::dequant_bf16(data, out),
        GgmlType::Q4_0 => dequant_blocks::<BlockQ4_0>(data, out),
        GgmlType::Q4_1 => dequant_blocks::<BlockQ4_1>(data, out),
        GgmlType::Q5_0 => dequant_blocks::<BlockQ5_0>(data, out),
        GgmlType::Q5_1 => dequant_blocks::<BlockQ5_1>(data, out),
        GgmlType::Q8_0 => dequant_blocks::<BlockQ8_0>(data, out),
        GgmlType::Q2_K => dequant_blocks::<BlockQ2K>(data, out),
        GgmlType::Q3_K => dequant_blocks::<BlockQ3K>(data, out),
        GgmlType::Q4_K => dequant_blocks::<BlockQ4K>(data, out),
        GgmlType::Q5_K => dequant_blocks::<BlockQ5K>(data, out),
        GgmlType::Q6_K => dequant_blocks::<BlockQ6K>(data, out),
        GgmlType::TQ1_0 => dequant_blocks::<BlockTq1_0>(data, out),
        GgmlType::TQ2_0 => dequant_blocks::<BlockTq2_0>(data, out),
        GgmlType::IQ4_NL => dequant_blocks::<BlockIq4Nl>(data, out),
        GgmlType::IQ4_XS => dequant_blocks::<BlockIq4Xs>(data, out),
        other => return Err(RefError::Unsupported(other)),
    }
    Ok(())
}

/// Dequantizes `n` elements of type `ty` into a new vector (see [`dequantize`]).
pub fn dequantize_vec(ty: GgmlType, data: &[u8], n: usize) -> Result<Vec<f32>, RefError> {
    // Check before allocating so a bogus `n` from a file cannot ask for a huge buffer.
    if !ty.is_supported() {
        return Err(RefError::Unsupported(ty));
    }
    check_bytes(ty, n, data)?;
    let mut out = vec![0.0f32; n];
    dequantize(ty, data, &mut out)?;
    Ok(out)
}

/// Whether [`quantize`] accepts this type.
pub fn can_quantize(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        F32 | F16 | BF16 | Q8_0 | Q4_0 | Q4_1 | Q5_0 | Q5_1 | TQ1_0 | TQ2_0
    )
}

/// Quantizes `x` to type `ty` with ggml's reference rounding rules (the ones gguf-py
/// reproduces), returning `ty.row_bytes(x.len())` bytes.
///
/// `x.len()` must be a whole number of blocks (`PartialBlock` otherwise); types outside
/// [`can_quantize`] give `Unsupported`.
pub fn quantize(ty: GgmlType, x: &[f32]) -> Result<Vec<u8>, RefError> {
    if !can_quantize(ty) {
        return Err(RefError::Unsupported(ty));
    }
    if !x.len().is_multiple_of(ty.block_size()) {
        return Err(RefError::PartialBlock {
            ty,
            n_elements: x.len(),
        });
    }
    Ok(match ty {
        GgmlType::F32 => float::quant_f32(x),
        GgmlType::F16 => float::quant_f16(x),
        GgmlType::BF16 => float::quant_bf16(x),
        GgmlType::Q4_0 => quant_blocks::<BlockQ4_0>(x),
        GgmlType::Q4_1 => quant_blocks::<BlockQ4_1>(x),
        GgmlType::Q5_0 => quant_blocks::<BlockQ5_0>(x),
        GgmlType::Q5_1 => quant_blocks::<BlockQ5_1>(x),
        GgmlType::Q8_0 => quant_blocks::<BlockQ8_0>(x),
        GgmlType::TQ1_0 => quant_blocks::<BlockTq1_0>(x),
        GgmlType::TQ2_0 => quant_blocks::<BlockTq2_0>(x),
        other => return Err(RefError::Unsupported(other)),
    })
}

#[cfg(test)]
mod tests;
