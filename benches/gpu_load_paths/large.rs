//! The weight pattern at model sizes: the same `MEMWALL_LOAD_MB` MiB (default 64, larger than
//! any cache) as a storage `array<vec4<u32>>` and as an rgba32uint texture, read once per launch
//! (XOR of every word) in three patterns:
//! - `rows`: invocation r reads row r's BPR consecutive vec4 (a 4096-column Q4 row's code
//!   words), the decode matvec with one row per invocation;
//! - `rows x4`: invocation j reads rows 4j..4j+3 chunk by chunk, as the engine's decode matvec
//!   reads 4 rows per invocation (`matrix/tiles_q8.wgsl`, there `row_stride` apart);
//! - `contiguous`: in step c invocation i reads vec4 c * rows + i (consecutive lanes,
//!   consecutive addresses).
//!
//! The texture is W texels wide (the largest power of two within the adapter's
//! max_texture_dimension_2d) and linear vec4 g is texel (g % W, g / W): a matrix maps to the
//! texture as its row-major vec4 stream, so any row length works.

use memwall::gpu::kernels::{read_f32, upload_u32};
use memwall::gpu::GpuContext;

use crate::matvec::{median, texture, time_once};
use wgpu::util::DeviceExt;

/// vec4 per row: a 4096-column Q4_0/Q4_1 row's code words (128 blocks x 16 bytes).
const BPR: u32 = 128;
const WG: u32 = 64;
const LAUNCHES: usize = 2;
/// Alternating timed runs per variant (medians printed).
const ROUNDS: usize = 5;

/// Reads vec4 g from the texture `wt` (W = 1 << p.log_w texels wide) or the buffer `wv`.
const LD_TEX: &str = "@group(0) @binding(4) var wt: texture_2d<u32>;
fn ld(g: u32) -> vec4<u32> {
    return textureLoad(wt, vec2<i32>(i32(g & ((1u << p.log_w) - 1u)), i32(g >> p.log_w)), 0);
}";
const LD_BUF: &str = "@group(0) @binding(3) var<storage, read> wv: array<vec4<u32>>;
fn ld(g: u32) -> vec4<u32> { return wv[g]; }";

/// (name, rows per invocation, body xoring into `acc` for invocation `i`)
const PATTERNS: [(&str, u32, &str); 3] = [
    (
        "rows",
        1,
        "for (var c = 0u; c < p.bpr; c++) { acc ^= ld(i * p.bpr + c); }",
    ),
    (
        "rows x4",
        4,
        "let g = i * 4u * p.bpr;
         for (var c = 0u; c < p.bpr; c++) {
             acc ^= ld(g + c) ^ ld(g + p.bpr + c) ^ ld(g + 2u * p.bpr + c) ^ ld(g + 3u * p.bpr + c);
         }",
    ),
    (
        "contiguous",
        1,
        "for (var c = 0u; c < p.bpr; c++) { acc ^= ld(c * p.rows + i); }",
    ),
];

fn source(ld: &str, body: &str) -> String {
    format!(
        "struct P {{ rows: u32, bpr: u32, log_w: u32, n_inv: u32 }}
@group(0) @binding(9) var<uniform> p: P;
// [n_inv] per-invocation XORs, so that no load is optimised away
@group(0) @binding(8) var<storage, read_write> out: array<u32>;
{ld}
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let i = min(gid.x, p.n_inv - 1u);
    var acc = vec4<u32>(0u);
    {body}
    if (gid.x < p.n_inv) {{ out[gid.x] = acc.x ^ acc.y ^ acc.z ^ acc.w; }}
}}"
    )
}

/// Largest power of two within `max`.
fn log2_floor(max: u32) -> u32 {
    31 - max.leading_zeros()
}

pub fn run(ctx: &GpuContext) {
    let dev = &ctx.device;
    let mb: u64 = std::env::var("MEMWALL_LOAD_MB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let l = &ctx.limits;
    let log_w = log2_floor(l.max_texture_dimension_2d);
    let w = 1u32 << log_w;
    let texels = (mb << 20) / 16;
    let rows = u32::try_from(texels / u64::from(BPR)).expect("rows");
    let height = u32::try_from(texels / u64::from(w)).expect("height");
    println!(
        "\nmodel-size weights: {mb} MiB = {rows} rows x {BPR} vec4; texture {w} x {height} \
         (max_texture_dimension_2d {}, max_storage_buffer_binding_size {} MiB, max_buffer_size {} MiB)",
        l.max_texture_dimension_2d,
        l.max_storage_buffer_binding_size >> 20,
        l.max_buffer_size >> 20
    );
    assert!(height <= l.max_texture_dimension_2d, "texture too tall");
    assert!(
        l.max_storage_buffer_binding_size >= mb << 20,
        "storage binding too small for {mb} MiB"
    );
    // weights: [rows][BPR] vec4<u32>, the same words in the buffer and the texture
    let words: Vec<u32> = (0..texels * 4)
        .map(|i| (i as u32).wrapping_mul(2654435761) ^ (i >> 32) as u32)
        .collect();
    let wv = upload_u32(ctx, "wv", &words).expect("weights buffer");
    let view = texture(ctx, wgpu::TextureFormat::Rgba32Uint, 4, w, &words);
    drop(words);
    let out = upload_u32(ctx, "out", &vec![0; rows as usize]).expect("out");
    for (name, per_inv, body) in PATTERNS {
        let n_inv = rows / per_inv;
        let params = dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some("p"),
            contents: bytemuck::cast_slice(&[rows, BPR, log_w, n_inv]),
            usage: wgpu::BufferUsages::UNIFORM,
        });
        let mut results = Vec::new();
        let mut encoders = Vec::new();
        for (src_name, ld) in [("storage vec4", LD_BUF), ("texture", LD_TEX)] {
            let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
                label: Some(name),
                source: wgpu::ShaderSource::Wgsl(source(ld, body).into()),
            });
            let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
                label: Some(name),
                layout: None,
                module: &module,
                entry_point: Some("main"),
                compilation_options: Default::default(),
                cache: None,
            });
            let weights = if ld == LD_TEX {
                (4, wgpu::BindingResource::TextureView(&view))
            } else {
                (3, wv.as_entire_binding())
            };
            let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(name),
                layout: &pipe.get_bind_group_layout(0),
                entries: &[
                    wgpu::BindGroupEntry {
                        binding: 8,
                        resource: out.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: 9,
                        resource: params.as_entire_binding(),
                    },
                    wgpu::BindGroupEntry {
                        binding: weights.0,
                        resource: weights.1,
                    },
                ],
            });
            let groups = n_inv.div_ceil(WG);
            let encode = move |pass: &mut wgpu::ComputePass<'_>| {
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &bg, &[]);
                pass.dispatch_workgroups(groups, 1, 1);
            };
            time_once(ctx, 1, &encode);
            let check = read_f32(ctx, &out, n_inv as usize).expect("read back");
            results.push(check.iter().map(|v| v.to_bits()).collect::<Vec<u32>>());
            encoders.push((src_name, encode));
        }
        // Alternating rounds, so that both see the same machine load.
        let mut times = vec![(Vec::new(), Vec::new()); 2];
        for _ in 0..ROUNDS {
            for (i, (_, encode)) in encoders.iter().enumerate() {
                let (w, c) = time_once(ctx, LAUNCHES, encode);
                times[i].0.push(w);
                times[i].1.push(c);
            }
        }
        for ((src_name, _), (w, c)) in encoders.iter().zip(times) {
            let (w, c) = (median(w), median(c));
            println!(
                "  {name:10} {src_name:12} wall {:8.2} ms/launch {:6.2} GB/s   CPU {:8.2} ms ({:.2} GB/s per CPU second)",
                w * 1e3,
                (mb << 20) as f64 / w / 1e9,
                c * 1e3,
                (mb << 20) as f64 / c / 1e9
            );
        }
        assert_eq!(results[0], results[1], "{name}: texture != storage words");
    }
}
