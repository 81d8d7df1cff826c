//! What the platform itself gives: quantize_act with the platform's own division (the timing of
//! the integer matvec against the f32 one is `cargo bench --bench gpu_q8act`).

use memwall::gpu::kernels;
use memwall::gpu::registry::{KernelKey, QuantizeActParams};
use memwall::gpu::GpuContext;

/// quantize_act compiled with `EXACT_DIV = false` (the platform's `/` for amax / 127 and
/// 1 / d), through wgpu's automatic layout: returns (qx words, qd bits).
pub fn quantize_platform_division(ctx: &GpuContext, x: &[f32]) -> (Vec<u32>, Vec<u32>) {
    let n_chunks = x.len() / 32;
    let wg = 64u32;
    let src = KernelKey::QuantizeAct.source();
    let module = ctx
        .device
        .create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("quantize_act platform division"),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
    let pipeline = ctx
        .device
        .create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("quantize_act platform division"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &[("EXACT_DIV", 0.0), ("WG", f64::from(wg))],
                zero_initialize_workgroup_memory: true,
            },
            cache: None,
        });
    let groups = kernels::grid(
        (n_chunks as u32).div_ceil(wg),
        ctx.limits.max_compute_workgroups_per_dimension,
    )
    .unwrap();
    let params = QuantizeActParams {
        n_chunks: n_chunks as u32,
        groups_x: groups.0,
        pad0: 0,
        pad1: 0,
    };
    let pb = wgpu::util::DeviceExt::create_buffer_init(
        &ctx.device,
        &wgpu::util::BufferInitDescriptor {
            label: None,
            contents: bytemuck::bytes_of(&params),
            usage: wgpu::BufferUsages::UNIFORM,
        },
    );
    let xb = kernels::upload_f32(ctx, "x", x).unwrap();
    let qx = kernels::upload_u32(ctx, "qx", &vec![0; n_chunks * 8]).unwrap();
    let qd = kernels::upload_f32(ctx, "qd", &vec![0.0; n_chunks * 4]).unwrap();
    let bg = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
        label: None,
        layout: &pipeline.get_bind_group_layout(0),
        entries: &[
            wgpu::BindGroupEntry {
                binding: 0,
                resource: xb.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 1,
                resource: qx.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 2,
                resource: qd.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 3,
                resource: pb.as_entire_binding(),
            },
        ],
    });
    let mut enc = ctx
        .device
        .create_command_encoder(&wgpu::CommandEncoderDescriptor::default());
    {
        let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
        pass.set_pipeline(&pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.dispatch_workgroups(groups.0, groups.1, 1);
    }
    ctx.queue.submit([enc.finish()]);
    let bits = |b: &wgpu::Buffer, n: usize| -> Vec<u32> {
        kernels::read_f32(ctx, b, n)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    (bits(&qx, n_chunks * 8), bits(&qd, n_chunks * 4))
}
