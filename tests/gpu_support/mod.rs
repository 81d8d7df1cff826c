//! What the GPU kernel tests share: the adapter (a test FAILS without one: a GPU test must
//! never pass silently) and seeded inputs with outliers.
#![allow(dead_code)]

pub use crate::common::Rng;

use kernels_ref::GgmlType;
use memwall::gpu::{DeviceSelector, GpuContext};

/// f32 unit roundoff.
#[allow(dead_code)]
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

/// A seeded `[rows, cols]` matrix of `ty` in ggml layout. Formats kernels-ref can quantize
/// are quantized from [`Rng::values`] (outliers included); the K-quants, which memwall only
/// reads, are random bytes (every quant and sub-scale bit pattern) with their f16 super-scales
/// set to finite values in [0.001, 0.05], as the shared fixtures are made.
#[allow(dead_code)]
pub fn random_weights(rng: &mut Rng, ty: GgmlType, rows: usize, cols: usize) -> Vec<u8> {
    if kernels_ref::can_quantize(ty) {
        return kernels_ref::quantize(ty, &rng.values(rows * cols, 2.0)).unwrap();
    }
    // Byte offsets of the f16 scale fields in one block.
    let halves: &[usize] = match ty {
        GgmlType::Q4_K => &[0, 2],
        GgmlType::Q6_K => &[208],
        other => panic!("no random weights for {other:?}"),
    };
    let bytes = ty.row_bytes(cols as u64).unwrap() as usize * rows;
    let mut v: Vec<u8> = (0..bytes).map(|_| (rng.f() * 256.0) as u8).collect();
    for block in v.chunks_exact_mut(ty.type_size()) {
        for &at in halves {
            let d = 0.001 + 0.049 * rng.f();
            let h = kernels_ref::f32_to_f16(d as f32);
            block[at..at + 2].copy_from_slice(&h.to_le_bytes());
        }
    }
    v
}
