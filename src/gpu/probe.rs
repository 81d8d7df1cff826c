//! The GPU memory bandwidth probe (`shaders/bandwidth.wgsl`): how fast this adapter reads a
//! buffer much larger than its caches, the floor `memwall bench` compares decode against.
//!
//! Timing is the host's wall clock around a submission of several back-to-back launches,
//! waited for with `poll(wait)` (so the device is synchronized before the clock stops); the
//! best of several submissions is kept. Submission overhead is included, which makes the
//! figure a slight underestimate for small buffers: use at least ~64 MiB.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{grid, run, to_u32, Kernels, Launch};
use crate::gpu::registry::{KernelKey, ProbeParams};

/// vec4s each invocation reads in the bench's launches (enough in flight per invocation to
/// hide latency, few enough that every compute unit gets workgroups).
pub const PROBE_VEC4_PER_THREAD: usize = 32;

impl Kernels {
    /// The probe reading `n_vec4` vec4<f32> of `src` with `n_groups` workgroups, each writing
    /// the sum of what it read to `out[g]` (`out` holds at least `[n_groups]` f32).
    pub fn bandwidth_probe_launch<'a>(
        &self,
        src: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        n_vec4: usize,
        n_groups: usize,
    ) -> Result<Launch<'a>> {
        if n_vec4 == 0
            || n_groups == 0
            || src.size() < (n_vec4 as u64).saturating_mul(16)
            || out.size() < (n_groups as u64).saturating_mul(4)
        {
            return Err(Error::Gpu(format!(
                "bandwidth probe of {n_vec4} vec4 with {n_groups} workgroups: src is {} bytes, \
                 out {} bytes",
                src.size(),
                out.size()
            )));
        }
        let threads = n_groups.saturating_mul(self.workgroup_size as usize);
        let groups = grid(to_u32(n_groups, "n_groups")?, self.max_groups_per_dim)?;
        let params = ProbeParams {
            n_vec4: to_u32(n_vec4, "n_vec4")?,
            n_groups: to_u32(n_groups, "n_groups")?,
            per_thread: to_u32(n_vec4.div_ceil(threads), "per_thread")?,
            groups_x: groups.0,
        };
        let bufs = [(0, src), (1, out)];
        Ok(Launch::new(
            KernelKey::BandwidthProbe,
            &params,
            &bufs,
            2,
            groups,
        ))
    }
}

/// One probe measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GpuProbe {
    /// Bytes read per launch.
    pub bytes: u64,
    /// Best seconds per launch.
    pub seconds: f64,
    /// bytes / seconds / 1e9.
    pub gbs: f64,
}

/// Reads a `bytes`-byte buffer (capped by the binding limit) `launches` times per submission,
/// `runs` submissions after one warm-up, and returns the best.
pub fn read_bandwidth(
    ctx: &GpuContext,
    ks: &Kernels,
    bytes: u64,
    launches: usize,
    runs: usize,
) -> Result<GpuProbe> {
    let cap = ctx
        .limits
        .max_storage_buffer_binding_size
        .min(ctx.limits.max_buffer_size);
    let bytes = bytes.min(cap) / 16 * 16;
    if bytes < 16 * 1024 || launches == 0 || runs == 0 {
        return Err(Error::InvalidArgument(format!(
            "bandwidth probe of {bytes} bytes, {launches} launches, {runs} runs"
        )));
    }
    let n_vec4 = (bytes / 16) as usize;
    let wg = ks.workgroup_size as usize;
    let n_groups = n_vec4.div_ceil(wg * PROBE_VEC4_PER_THREAD);
    let buffer = |label: &str, size: u64| {
        ctx.scoped(&format!("allocate {label} ({size} bytes)"), || {
            // Zero-initialised by wgpu: the contents do not matter for timing.
            Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }))
        })
    };
    let src = buffer("probe.src", bytes)?; // [n_vec4] vec4<f32>
    let out = buffer("probe.out", (n_groups as u64 * 4).max(4))?; // [n_groups] f32
    let d = ks.prepare(
        ctx,
        ks.bandwidth_probe_launch(&src, &out, n_vec4, n_groups)?,
    )?;
    let batch: Vec<_> = std::iter::repeat_n(&d, launches).collect();
    run(ctx, &batch)?;
    let mut best = f64::INFINITY;
    for _ in 0..runs {
        let t = Instant::now();
        run(ctx, &batch)?;
        best = best.min(t.elapsed().as_secs_f64() / launches as f64);
    }
    let moved = n_vec4 as u64 * 16 + n_groups as u64 * 4;
    Ok(GpuProbe {
        bytes: moved,
        seconds: best,
        gbs: moved as f64 / best.max(1e-12) / 1e9,
    })
}
