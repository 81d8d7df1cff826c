//! What the platform itself gives: quantize_act with the platform's own division, and the
//! timing of the integer matvec against the f32 one.

use crate::gpu_support::{context, Rng};
use crate::kernel_sets;
use memwall::gpu::kernels::{self, Kernels};
use memwall::gpu::q8act::{qd_vec4s, qx_words};
use memwall::gpu::shaders::{KernelKey, QuantizeActParams};
use memwall::gpu::{repack, GpuContext, WeightFormat};

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

/// Time per call of a [1536 x 576] Q4_1 matvec: quantize_act + matvec_q8 against the f32
/// matvec, each launched `REPS` times in one command buffer (median of 5 after a warm-up).
/// A measurement: `cargo test --profile ci --test gpu_q8act -- --ignored --nocapture`.
#[test]
#[ignore]
fn bench_matvec_q8_against_f32() {
    let ctx = context();
    for k in kernel_sets(&ctx) {
        bench_one(&ctx, &k);
    }
}

fn bench_one(ctx: &GpuContext, k: &Kernels) {
    const REPS: usize = 50;
    let (rows, cols) = (1536, 576);
    let mut rng = Rng(0xBE);
    let data =
        kernels_ref::quantize(kernels_ref::GgmlType::Q4_1, &rng.values(rows * cols, 2.0)).unwrap();
    let m = kernels::upload_matrix(ctx, &repack(WeightFormat::Q4_1, &data, rows, cols).unwrap())
        .unwrap();
    let x = rng.values(cols, 2.0);
    let xb = kernels::upload_f32(ctx, "x", &x).unwrap();
    let qx = kernels::upload_u32(ctx, "qx", &vec![0; qx_words(1, cols)]).unwrap();
    let qd = kernels::upload_f32(ctx, "qd", &vec![0.0; 4 * qd_vec4s(1, cols)]).unwrap();
    let yq = kernels::upload_f32(ctx, "yq", &vec![0.0; rows]).unwrap();
    let yf = kernels::upload_f32(ctx, "yf", &vec![0.0; rows]).unwrap();
    let dq = k
        .prepare(ctx, k.quantize_act_launch(&xb, &qx, &qd, 1, cols).unwrap())
        .unwrap();
    let dm = k
        .prepare(
            ctx,
            k.matvec_q8_launch(&m, &qx, &qd, &yq, 1, rows, 0).unwrap(),
        )
        .unwrap();
    let df = k.matvec(ctx, &m, &xb, &yf).unwrap();
    let time = |ds: Vec<&kernels::Dispatch>| -> f64 {
        kernels::run(ctx, &ds).unwrap();
        let mut v: Vec<f64> = (0..5)
            .map(|_| {
                let t = std::time::Instant::now();
                kernels::run(ctx, &ds).unwrap();
                t.elapsed().as_secs_f64() / REPS as f64
            })
            .collect();
        v.sort_by(f64::total_cmp);
        v[2]
    };
    let mut q8 = Vec::new();
    for _ in 0..REPS {
        q8.extend([&dq, &dm]);
    }
    let t_q8 = time(q8);
    let t_quant = time(vec![&dq; REPS]);
    let t_f32 = time(vec![&df; REPS]);
    let a = kernels::read_f32(ctx, &yq, rows).unwrap();
    let b = kernels::read_f32(ctx, &yf, rows).unwrap();
    let diff = a
        .iter()
        .zip(&b)
        .map(|(p, q)| (p - q).abs())
        .fold(0f32, f32::max);
    eprintln!(
        "[{rows} x {cols}] Q4_1 on {} (subgroup={}): quantize_act + matvec_q8 {:.1} us/call \
         (quantize alone {:.1} us), f32 matvec {:.1} us/call; max |q8 - f32| = {diff:.3e}",
        ctx.info.name,
        k.subgroup,
        t_q8 * 1e6,
        t_quant * 1e6,
        t_f32 * 1e6
    );
    assert!(diff.is_finite());
}
