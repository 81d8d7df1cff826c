//! Shared helpers for the CPU kernel tests: a seeded RNG and random weights for every format.

use half::{bf16, f16};
use memwall::GgmlType;

use super::Rng;

/// Byte offsets of the f16 scale fields inside one block of `ty` (the rest is random bits).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL | GgmlType::IQ4_XS => {
            &[0]
        }
        GgmlType::Q4_1 | GgmlType::Q5_1 | GgmlType::Q4_K | GgmlType::Q5_K => &[0, 2],
        GgmlType::Q2_K => &[80, 82],
        GgmlType::Q3_K => &[108],
        GgmlType::Q6_K => &[208],
        GgmlType::TQ2_0 => &[64],
        GgmlType::TQ1_0 => &[52],
        _ => &[],
    }
}

/// Random `rows x cols` weights of `ty`: random quant bits with sane scales (random bits in a
/// scale field could be Inf/NaN), or random normal floats for float formats.
pub fn random_weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    let n = rows * cols;
    match ty {
        GgmlType::F32 => (0..n).flat_map(|_| rng.normal().to_le_bytes()).collect(),
        GgmlType::F16 => (0..n)
            .flat_map(|_| f16::from_f32(rng.normal()).to_le_bytes())
            .collect(),
        GgmlType::BF16 => (0..n)
            .flat_map(|_| bf16::from_f32(rng.normal()).to_le_bytes())
            .collect(),
        _ => {
            let bytes = ty.row_bytes(cols as u64).unwrap() as usize * rows;
            let mut v: Vec<u8> = (0..bytes).map(|_| rng.next_u64() as u8).collect();
            for blk in v.chunks_exact_mut(ty.type_size()) {
                for &o in f16_fields(ty) {
                    // Scales between 0.002 and 0.05, either sign for the min-like second field.
                    let mut s = 0.002 + 0.048 * rng.unit();
                    if o != 0 && rng.unit() < 0.5 {
                        s = -s;
                    }
                    blk[o..o + 2].copy_from_slice(&f16::from_f32(s).to_le_bytes());
                }
            }
            v
        }
    }
}
