//! Shared helpers for the CPU kernel tests: a seeded RNG and random weights for every format.

use half::{bf16, f16};
use memwall::GgmlType;

/// xorshift64* — small, seeded, reproducible.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 24) as f32
    }
    /// Approximately normal (sum of 4 uniforms, centred, unit variance).
    pub fn normal(&mut self) -> f32 {
        ((0..4).map(|_| self.unit()).sum::<f32>() - 2.0) * 3f32.sqrt()
    }
    /// Normal values with ~2% outliers 30-60x larger, as real activations have.
    pub fn activations(&mut self, n: usize) -> Vec<f32> {
        (0..n)
            .map(|_| {
                let v = self.normal();
                if self.unit() < 0.02 {
                    v * (30.0 + 30.0 * self.unit())
                } else {
                    v
                }
            })
            .collect()
    }
}

/// Byte offsets of the f16 scale fields inside one block of `ty` (the rest is random bits).
fn f16_fields(ty: GgmlType) -> &'static [usize] {
    match ty {
        GgmlType::Q4_0 | GgmlType::Q5_0 | GgmlType::Q8_0 | GgmlType::IQ4_NL => &[0],
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
