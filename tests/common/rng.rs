//! The tests' one random number generator: xorshift64*, seeded, reproducible, no crates.
//! Used through `common::Rng`, or by `#[path]` from test support modules that do not include
//! `common` (`gpu_support`, `policy_sim`) and from the benches.
#![allow(dead_code)]

/// xorshift64* over its state; `Rng(seed)` takes a non-zero state as is, [`Rng::new`] scrambles
/// any seed into one.
pub struct Rng(pub u64);

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
    /// Uniform in 0..n (n = 0 is taken as 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
    /// Uniform in 0..n (n = 0 is taken as 1).
    pub fn below_usize(&mut self, n: usize) -> usize {
        self.below(n as u64) as usize
    }
    /// Uniform in [0, 1), 53 bits.
    pub fn f(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
    /// Uniform in [0, 1), 24 bits.
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
    /// Roughly normal values times `scale`, every 97th a 50x outlier (activation outliers are
    /// real).
    pub fn values(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (self.f() + self.f() + self.f() - 1.5) * scale;
                (if i % 97 == 13 { v * 50.0 } else { v }) as f32
            })
            .collect()
    }
}
