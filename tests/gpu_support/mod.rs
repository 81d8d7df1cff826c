//! What the GPU kernel tests share: the adapter (a test FAILS without one: a GPU test must
//! never pass silently) and seeded inputs with outliers.
#![allow(dead_code)]

use memwall::gpu::{DeviceSelector, GpuContext};

/// f32 unit roundoff.
pub const U: f64 = 1.0 / (1u64 << 24) as f64;

/// The adapter `auto` picks (honouring WGPU_BACKEND / WGPU_ADAPTER_NAME).
pub fn context() -> GpuContext {
    match GpuContext::new(&DeviceSelector::Auto) {
        Ok(c) => {
            eprintln!(
                "adapter: {} ({}, {}), subgroup: {}, f16: {}",
                c.info.name,
                c.info.backend,
                c.info.driver_info,
                c.has_subgroups(),
                c.has_f16()
            );
            c
        }
        Err(e) => panic!(
            "no usable GPU adapter ({e}); install Mesa lavapipe (apt-get install \
             mesa-vulkan-drivers libvulkan1) or set WGPU_BACKEND. MEMWALL_REQUIRE_GPU={:?}",
            std::env::var("MEMWALL_REQUIRE_GPU").ok()
        ),
    }
}

/// xorshift64*, seeded: reproducible inputs without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn uniform(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Roughly normal values scaled by `scale`; every 97th is a 50x outlier (activation
    /// outliers are real).
    pub fn values(&mut self, n: usize, scale: f64) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let v = (self.uniform() + self.uniform() + self.uniform() - 1.5) * scale;
                (if i % 97 == 13 { v * 50.0 } else { v }) as f32
            })
            .collect()
    }
}
