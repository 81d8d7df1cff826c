//! Prototype, not in the engine: the decode matvec (`matrix/tiles_q8.wgsl`, one token, 4 rows
//! per invocation) of a Q4_1 matrix whose code words are read from an rgba32uint texture
//! instead of the storage buffer, its (d, m) scales from the storage buffer or from an r32uint
//! texture. The kernel is the engine's, composed with a texture twin of `quant/q4_1.wgsl`'s
//! `dq_chunk`, and launched with the engine's own params and grid, so only the load path
//! differs: its output must equal the engine kernel's bit for bit (same integer sums, same f32
//! order), and both are checked against kernels-ref's f32 matvec.
//!
//! Block g = row * cols / 32 + chunk is texel (g % W, g / W) of a W-wide texture (W the largest
//! power of two within max_texture_dimension_2d), the last texture row padded with zeros.
//!
//! `cargo bench --bench gpu_load_paths -- matvec [prefill] [ROWS COLS]...` (default: the test
//! model's shapes and two 7B ones; `prefill`: 64 tokens, the prefill matmul kernel the engine
//! picks, composed the same way).

use std::time::Instant;

use memwall::gpu::kernels::q8act::{qd_vec4s, qx_words};
use memwall::gpu::kernels::{self, Dispatch, Kernels};
use memwall::gpu::{repack, GpuContext, WeightFormat};
use wgpu::util::DeviceExt;

/// Records one launch into a compute pass.
type Encode<'a> = dyn Fn(&mut wgpu::ComputePass<'_>) + 'a;

const REPS: usize = 10;
/// Timed rounds (after one warm-up round); medians are printed.
const ROUNDS: usize = 7;

/// The engine's Q4_1 fragment, replaced by [`fragment`] in the engine kernel's source.
const Q4_1: &str = include_str!("../../shaders/quant/q4_1.wgsl");

/// The texture twin of quant/q4_1.wgsl's integer path; `scales_tex`: (d, m) from an r32uint
/// texture (else the storage array, as in the engine).
fn fragment(log_w: u32, scales_tex: bool) -> String {
    let (decl, load) = if scales_tex {
        (
            "@group(0) @binding(1) var wst: texture_2d<u32>;",
            "textureLoad(wst, texel_of(g), 0).x",
        )
    } else {
        (
            "@group(0) @binding(1) var<storage, read> ws: array<u32>;",
            "ws[g]",
        )
    };
    format!(
        "const QK: u32 = 32u;
const TEX_LOG_W: u32 = {log_w}u;
// [rows * cols / 32] texels: block g's 16 code bytes (four little-endian words) at texel
// (g % W, g / W), W = 1 << TEX_LOG_W.
@group(0) @binding(0) var wq: texture_2d<u32>;
// [rows * cols / 32]: block g's (d, m) as two f16, d in the low half.
{decl}

fn texel_of(g: u32) -> vec2<i32> {{
    return vec2<i32>(i32(g & ((1u << TEX_LOG_W) - 1u)), i32(g >> TEX_LOG_W));
}}

fn dq_chunk(row: u32, chunk: u32, cols: u32) -> QChunk {{
    let g = row * (cols / QK) + chunk;
    let dm = unpack2x16float({load});
    let w = textureLoad(wq, texel_of(g), 0);
    let lo = w & vec4<u32>(0x0F0F0F0Fu);
    let hi = (w >> vec4<u32>(4u)) & vec4<u32>(0x0F0F0F0Fu);
    var ch: QChunk;
    ch.u = array<u32, 8>(lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    ch.mul = vec2<i32>(1);
    ch.dw = dm.x;
    ch.c = vec2<f32>(dm.y);
    return ch;
}}
"
    )
}

fn values(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            ((*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 4.0
        })
        .collect()
}

/// A `w`-wide texture of `format` holding `data` (`texel_words` u32 per texel), zero-padded
/// to whole rows.
pub fn texture(
    ctx: &GpuContext,
    format: wgpu::TextureFormat,
    texel_words: usize,
    w: u32,
    data: &[u32],
) -> wgpu::TextureView {
    let texels = data.len() / texel_words;
    let height = texels.div_ceil(w as usize);
    assert!(
        height <= ctx.limits.max_texture_dimension_2d as usize,
        "{texels} texels do not fit a {w}-wide texture"
    );
    let mut padded = data.to_vec();
    padded.resize(height * w as usize * texel_words, 0);
    let size = wgpu::Extent3d {
        width: w,
        height: height as u32,
        depth_or_array_layers: 1,
    };
    let tex = ctx.device.create_texture(&wgpu::TextureDescriptor {
        label: Some("weights"),
        size,
        mip_level_count: 1,
        sample_count: 1,
        dimension: wgpu::TextureDimension::D2,
        format,
        usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
        view_formats: &[],
    });
    ctx.queue.write_texture(
        wgpu::TexelCopyTextureInfo {
            texture: &tex,
            mip_level: 0,
            origin: wgpu::Origin3d::ZERO,
            aspect: wgpu::TextureAspect::All,
        },
        bytemuck::cast_slice(&padded),
        wgpu::TexelCopyBufferLayout {
            offset: 0,
            bytes_per_row: Some(w * 4 * texel_words as u32),
            rows_per_image: Some(height as u32),
        },
        size,
    );
    tex.create_view(&wgpu::TextureViewDescriptor::default())
}

/// CPU time of all this process's threads so far (lavapipe's and llvmpipe's workers are
/// threads of the process), in ns: less disturbed by the other jobs on a shared machine than
/// wall time.
pub fn cpu_ns() -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir("/proc/self/task")
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(s) = std::fs::read_to_string(task.path().join("schedstat")) {
            total += s
                .split(' ')
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    total
}

/// (wall, CPU) seconds per launch of one run of `reps` launches of `encode` in one pass.
pub fn time_once(ctx: &GpuContext, reps: usize, encode: &Encode) -> (f64, f64) {
    let (s, c) = (Instant::now(), cpu_ns());
    let mut enc = ctx.device.create_command_encoder(&Default::default());
    {
        let mut pass = enc.begin_compute_pass(&Default::default());
        for _ in 0..reps {
            encode(&mut pass);
        }
    }
    ctx.queue.submit([enc.finish()]);
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .expect("poll");
    (
        s.elapsed().as_secs_f64() / reps as f64,
        (cpu_ns() - c) as f64 * 1e-9 / reps as f64,
    )
}

pub fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn shape(ctx: &GpuContext, k: &Kernels, rows: usize, cols: usize, nt: usize) {
    let dev = &ctx.device;
    let mut seed = 0xBEu64 ^ (rows * 31 + cols) as u64;
    let data = kernels_ref::quantize(kernels_ref::GgmlType::Q4_1, &values(&mut seed, rows * cols))
        .expect("quantize");
    let packed = repack(WeightFormat::Q4_1, &data, rows, cols).expect("repack");
    let m = kernels::upload_matrix(ctx, &packed).expect("upload");
    let x = values(&mut seed, nt * cols);
    // x: [nt][cols] f32; qx/qd: its 8-bit chunks; y, yt: [nt][rows] outputs (engine, texture)
    let xb = kernels::upload_f32(ctx, "x", &x).unwrap();
    let qx = kernels::upload_u32(ctx, "qx", &vec![0; qx_words(nt, cols)]).unwrap();
    let qd = kernels::upload_f32(ctx, "qd", &vec![0.0; 4 * qd_vec4s(nt, cols)]).unwrap();
    let y = kernels::upload_f32(ctx, "y", &vec![0.0; nt * rows]).unwrap();
    let yt = kernels::upload_f32(ctx, "yt", &vec![0.0; nt * rows]).unwrap();
    let dq = k
        .prepare(ctx, k.quantize_act_launch(&xb, &qx, &qd, nt, cols).unwrap())
        .unwrap();
    kernels::run(ctx, &[&dq]).expect("quantize");
    let launch = k.matvec_q8_launch(&m, &qx, &qd, &y, nt, rows, 0).unwrap();
    let engine_src = launch.key.source();
    let label = launch.key.label();
    // The engine pipeline's override constants (the workgroup size and its layout's tile).
    let mut constants = vec![("WG", f64::from(k.workgroup_size))];
    constants.extend(launch.key.matrix_constants());
    assert!(
        engine_src.contains(Q4_1),
        "{label}: no Q4_1 fragment to replace"
    );
    let (params, groups) = (launch.params.clone(), launch.groups);
    let dm: Dispatch = k.prepare(ctx, launch).unwrap();
    let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
        label: Some("params"),
        contents: &params,
        usage: wgpu::BufferUsages::UNIFORM,
    });
    let log_w = 31 - ctx.limits.max_texture_dimension_2d.leading_zeros();
    let codes = texture(
        ctx,
        wgpu::TextureFormat::Rgba32Uint,
        4,
        1 << log_w,
        &packed.quants,
    );
    let scales_tex = texture(
        ctx,
        wgpu::TextureFormat::R32Uint,
        1,
        1 << log_w,
        &packed.scales,
    );
    // [nt][rows] f32
    let mut reference = vec![0f32; nt * rows];
    for (xt, yt) in x.chunks_exact(cols).zip(reference.chunks_exact_mut(rows)) {
        kernels_ref::matvec(kernels_ref::GgmlType::Q4_1, &data, rows, cols, xt, yt)
            .expect("reference");
    }
    let err = |v: &[f32]| {
        v.iter()
            .zip(&reference)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max)
    };
    kernels::run(ctx, &[&dm]).expect("engine matvec");
    let y_engine = kernels::read_f32(ctx, &y, nt * rows).unwrap();
    let mut pipes = Vec::new();
    for scales_in_tex in [false, true] {
        let src = engine_src.replace(Q4_1, &fragment(log_w, scales_in_tex));
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("matvec_q8_rows_tex"),
            source: wgpu::ShaderSource::Wgsl(src.into()),
        });
        let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some("matvec_q8_rows_tex"),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: wgpu::PipelineCompilationOptions {
                constants: &constants,
                ..Default::default()
            },
            cache: None,
        });
        let scales = if scales_in_tex {
            wgpu::BindingResource::TextureView(&scales_tex)
        } else {
            m.scales.as_ref().expect("Q4_1 scales").as_entire_binding()
        };
        let res = [
            (0, wgpu::BindingResource::TextureView(&codes)),
            (1, scales),
            (2, qx.as_entire_binding()),
            (3, qd.as_entire_binding()),
            (4, yt.as_entire_binding()),
            (5, params.as_entire_binding()),
        ];
        let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("matvec_q8_rows_tex"),
            layout: &pipe.get_bind_group_layout(0),
            entries: &res.map(|(binding, resource)| wgpu::BindGroupEntry { binding, resource }),
        });
        let encode = move |pass: &mut wgpu::ComputePass<'_>| {
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(groups.0, groups.1, 1);
        };
        // Correctness first: bit for bit the engine kernel's output.
        time_once(ctx, 1, &encode);
        let y_tex = kernels::read_f32(ctx, &yt, nt * rows).unwrap();
        let same = y_tex
            .iter()
            .zip(&y_engine)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "texture matvec differs from the engine's");
        assert_eq!(err(&y_tex), err(&y_engine));
        pipes.push(encode);
    }
    let mb = (packed.quants.len() + packed.scales.len()) as f64 * 4.0 / 1e6;
    println!(
        "[{rows} x {cols}] Q4_1 x {nt} tokens ({label}), {mb:.1} MB, max |y - kernels-ref| \
         {:.2e} (8-bit activations), texture outputs bit-identical to the engine's",
        err(&y_engine)
    );
    // Rounds of one run per variant, so that all see the same machine load.
    let variants: [(&str, &Encode<'_>); 3] = [
        ("engine (storage)", &|pass| dm.encode(pass)),
        ("codes texture", &pipes[0]),
        ("codes + scales texture", &pipes[1]),
    ];
    let mut wall = vec![Vec::new(); 3];
    let mut cpu = vec![Vec::new(); 3];
    for round in 0..ROUNDS + 1 {
        for (i, (_, encode)) in variants.iter().enumerate() {
            let (w, c) = time_once(ctx, REPS, *encode);
            if round > 0 {
                wall[i].push(w);
                cpu[i].push(c);
            }
        }
    }
    let base = (median(wall[0].clone()), median(cpu[0].clone()));
    for (i, (name, _)) in variants.iter().enumerate() {
        let (w, c) = (median(wall[i].clone()), median(cpu[i].clone()));
        println!(
            "  {name:24} wall {:8.3} ms ({:5.2} GB/s, {:.2}x)  CPU {:8.3} ms ({:.2}x)",
            w * 1e3,
            mb / 1e3 / w,
            base.0 / w,
            c * 1e3,
            base.1 / c
        );
    }
}

/// Decode (one token) at `args`' shapes (ROWS COLS pairs; default the test model's and two 7B
/// ones), or with `prefill` a 64-token batch (the prefill matmul) at the test model's shapes.
pub fn run(ctx: &GpuContext, args: &[usize], prefill: bool) {
    let nt = if prefill { 64 } else { 1 };
    let shapes: Vec<(usize, usize)> = if args.len() >= 2 {
        args.chunks_exact(2).map(|s| (s[0], s[1])).collect()
    } else if prefill {
        vec![(576, 576), (1536, 576), (576, 1536)]
    } else {
        vec![
            (576, 576),
            (1536, 576),
            (576, 1536),
            (49152, 576),
            (4096, 4096),
            (11008, 4096),
        ]
    };
    // The reduction variant the engine picks (the subgroup prefill matmul on lavapipe).
    let k = Kernels::with_options(ctx, ctx.has_subgroups()).expect("kernels");
    println!(
        "{} ({:?}): {nt}-token matvec, {REPS} launches per run, median of {ROUNDS} alternating runs",
        ctx.info.name, ctx.info.backend
    );
    for (rows, cols) in shapes {
        shape(ctx, &k, rows, cols, nt);
    }
}
