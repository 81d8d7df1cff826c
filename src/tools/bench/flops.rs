//! The GPU compute-throughput probe (`shaders/flops.wgsl`): the horizontal ceiling of the
//! roofline `memwall bench-kernels --plot` draws, next to the read-bandwidth roof
//! ([`super::bandwidth`]).
//!
//! Each invocation of [`GROUPS`] workgroups of 64 runs 2 independent vec4 fma chains with no
//! memory traffic in its loop; the iteration count is sized after a warm-up so one launch lasts
//! about [`TARGET_LAUNCH_S`]. As the bandwidth probe: the host's wall clock around a
//! submission of [`LAUNCHES`] back-to-back launches, waited for, best of `runs` (the launches
//! are long, so the submit-and-wait overhead is a small fraction of the figure). The pipeline
//! is built here rather than through `KernelKey`, as it is a bench-only kernel with no selftest
//! and no place in the engine.

use std::time::Instant;

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;

/// Workgroups per launch: enough to fill every compute unit of a large GPU several times
/// (4096 x 64 = 262144 invocations) and every lavapipe thread.
pub const GROUPS: u32 = 4096;
/// Invocations per workgroup (the shader's `@workgroup_size`).
const WG: u32 = 64;
/// FLOPs per invocation and iteration: 2 chains x 4 lanes x 2 (an fma counts as two).
const FLOPS_PER_ITER: u64 = 16;
/// Wall time one launch aims at.
pub const TARGET_LAUNCH_S: f64 = 0.02;
/// Launches per timed submission.
pub const LAUNCHES: usize = 4;
/// fma multiplier and addend: the chains converge to b / (1 - a) = 1 (bounded, no denormals).
const A: f32 = 0.99;
const B: f32 = 0.01;

/// The uniform of `shaders/flops.wgsl`.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct FlopsParams {
    iters: u32,
    a: f32,
    b: f32,
    groups_x: u32,
}

/// One compute-probe measurement.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlopsProbe {
    /// FLOPs per launch.
    pub flops: u64,
    /// Best seconds per launch.
    pub seconds: f64,
    /// flops / seconds / 1e9.
    pub gflops: f64,
}

/// What invocation `lid` of any workgroup writes after `iters` iterations (f64 fma chains:
/// the reference the GPU's f32 result is compared with).
fn expected(lid: u32, iters: u32) -> f64 {
    let s = f64::from(lid as f32 * 0.001);
    let mut total = 0.0;
    for chain in 0..2 {
        for lane in 0..4 {
            let mut c = s + 0.01 * lane as f64 + 0.1 * chain as f64;
            for _ in 0..iters {
                c = c * f64::from(A) + f64::from(B);
            }
            total += c;
        }
    }
    total
}

/// Measures the adapter's f32 fma throughput: `runs` timed submissions after a sizing warm-up,
/// best kept. The outputs of the last launch are checked against [`expected`] (a probe whose
/// loop did not run would report an impossible figure).
pub fn gpu_flops(ctx: &GpuContext, runs: usize) -> Result<FlopsProbe> {
    if runs == 0 {
        return Err(Error::InvalidArgument(
            "compute probe needs at least one run".into(),
        ));
    }
    let n_out = (GROUPS * WG) as u64;
    let (pipeline, out) = ctx.scoped("compute probe pipeline", || {
        let module = ctx
            .device
            .create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some("flops probe"),
                source: wgpu::ShaderSource::Wgsl(
                    include_str!("../../../shaders/flops.wgsl").into(),
                ),
            });
        let pipeline = ctx
            .device
            .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some("flops probe"),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
        // [GROUPS * 64] f32: one sum per invocation.
        let out = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("flops.out"),
            size: n_out * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        Ok((pipeline, out))
    })?;
    // Seconds per launch of `iters` iterations, best of `runs` submissions of `launches`.
    let time = |iters: u32, launches: usize, runs: usize| -> Result<f64> {
        let params = FlopsParams {
            iters,
            a: A,
            b: B,
            groups_x: GROUPS,
        };
        let bind = ctx.scoped("compute probe bind group", || {
            let ub = wgpu::util::DeviceExt::create_buffer_init(
                &ctx.device,
                &wgpu::util::BufferInitDescriptor {
                    label: Some("flops.params"),
                    contents: bytemuck::bytes_of(&params),
                    usage: wgpu::BufferUsages::UNIFORM,
                },
            );
            Ok(ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some("flops probe"),
                layout: &pipeline.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 0,
                        resource: out.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 1,
                        resource: ub.as_entire_binding(),
                    },
                ],
            }))
        })?;
        let mut best = f64::INFINITY;
        for _ in 0..runs {
            ctx.before_submit()?;
            let t = Instant::now();
            ctx.scoped("compute probe", || {
                let mut enc = ctx
                    .device
                    .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                        label: Some("flops probe"),
                    });
                {
                    let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
                    pass.set_pipeline(&pipeline);
                    pass.set_bind_group(0, &bind, &[]);
                    for _ in 0..launches {
                        pass.dispatch_workgroups(GROUPS, 1, 1);
                    }
                }
                ctx.queue.submit([enc.finish()]);
                ctx.device
                    .poll(wgpu::PollType::wait_indefinitely())
                    .map_err(|e| Error::Gpu(format!("wait for the compute probe: {e}")))?;
                Ok(())
            })?;
            best = best.min(t.elapsed().as_secs_f64() / launches as f64);
        }
        Ok(best)
    };
    // Sizing: a short launch (the first also compiles), then iterations for TARGET_LAUNCH_S.
    let probe_iters = 8;
    time(probe_iters, 1, 1)?;
    let once = time(probe_iters, 1, 1)?;
    let iters =
        ((TARGET_LAUNCH_S / once.max(1e-9)) * f64::from(probe_iters)).clamp(8.0, 65536.0) as u32;
    time(iters, 1, 1)?; // warm-up at the timed size
    let seconds = time(iters, LAUNCHES, runs)?;
    check(ctx, &out, iters)?;
    let flops = n_out * u64::from(iters) * FLOPS_PER_ITER;
    Ok(FlopsProbe {
        flops,
        seconds,
        gflops: flops as f64 / seconds.max(1e-12) / 1e9,
    })
}

/// Reads workgroup 0's sums and compares them with [`expected`]: the chains converge, so the
/// f32 result is within a few ulps of the fixed point times 8 whatever the fma rounding.
fn check(ctx: &GpuContext, out: &wgpu::Buffer, iters: u32) -> Result<()> {
    let got = crate::gpu::kernels::read_f32(ctx, out, WG as usize)?;
    for (lid, &g) in got.iter().enumerate() {
        let want = expected(lid as u32, iters);
        if (f64::from(g) - want).abs() > 1e-3 * want.abs() {
            return Err(Error::Gpu(format!(
                "compute probe: invocation {lid} wrote {g}, expected {want} after {iters} \
                 iterations"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference converges to 8 (2 chains x 4 lanes at the fixed point 1) and starts at
    /// the seeds: the check compares against a figure that depends on the iterations.
    #[test]
    fn expected_sums_converge_to_the_fixed_point() {
        // (A and B are f32: the fixed point is 1 to about 1e-7.)
        assert!((expected(0, 5000) - 8.0).abs() < 1e-5);
        let start: f64 = (0..2)
            .flat_map(|c| (0..4).map(move |l| 0.01 * l as f64 + 0.1 * c as f64))
            .sum();
        assert!((expected(0, 0) - start).abs() < 1e-12);
        assert!((expected(3, 10) - expected(3, 11)).abs() > 1e-6);
    }
}
