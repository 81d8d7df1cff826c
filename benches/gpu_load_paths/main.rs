//! Micro-measurement of the ways a compute shader can read memory, on the default adapter
//! (WGPU_BACKEND picks another): why the decode matvec reads its activations from a uniform
//! binding on lavapipe. Mesa 22.3's llvmpipe loads a storage
//! word lane by lane (a loop over the SIMD lanes with branches) unless its offset is
//! statically uniform; other paths may gather without the loop.
//!
//! Each kernel runs ROWS invocations (the decode matvec's shape: one per weight row) that loop
//! `REPS` times over `BPR` chunks and load either
//! - the activation pattern: 8 words per chunk at an index shared by all lanes (but not
//!   statically uniform: it depends on loop counters), from a storage `array<u32>` or
//!   `array<vec4<u32>>`, a uniform
//!   `array<vec4<u32>>`, or workgroup memory filled once per workgroup;
//! - the weight pattern: 4 words per chunk at a per-lane index (row r's chunk b), from a
//!   storage `array<u32>`, a storage `array<vec4<u32>>`, or an rgba32uint texture.
//!
//! Prints ns per word loaded per invocation-lane (total words / wall time), median of 5 runs of
//! `LAUNCHES` dispatches in one command buffer. Then the weight pattern at model sizes, storage
//! buffer against texture (large.rs). `cargo bench --bench gpu_load_paths`
//! (`MEMWALL_LOAD_MB=128` for a bigger model-size run; `-- large` for that part only;
//! `-- matvec [ROWS COLS]...` for the texture decode matvec prototype, matvec.rs).

mod large;
mod matvec;

use std::time::Instant;

use memwall::gpu::{DeviceSelector, GpuContext};
use wgpu::util::DeviceExt;

const ROWS: u32 = 1536;
const BPR: u32 = 18;
const REPS: u32 = 64;
const WG: u32 = 64;
const LAUNCHES: usize = 10;

const HEAD: &str = "
struct P { rows: u32, bpr: u32, reps: u32, pad: u32 }
@group(0) @binding(9) var<uniform> p: P;
// [rows] per-invocation sums, so that no load is optimised away
@group(0) @binding(8) var<storage, read_write> out: array<u32>;
";

/// (name, words loaded per chunk, bindings, body computing `acc` for row `r`)
fn kernels() -> Vec<(&'static str, u32, &'static str, &'static str)> {
    vec![
        (
            "act storage array<u32>",
            8,
            "@group(0) @binding(0) var<storage, read> xs: array<u32>;",
            "for (var k = 0u; k < 8u; k++) { acc += xs[c * 8u + k]; }",
        ),
        (
            "act storage array<vec4<u32>>",
            8,
            "@group(0) @binding(5) var<storage, read> xv: array<vec4<u32>>;",
            "let a = xv[c * 2u]; let b2 = xv[c * 2u + 1u];
             acc += a.x + a.y + a.z + a.w + b2.x + b2.y + b2.z + b2.w;",
        ),
        (
            "act uniform array<vec4<u32>>",
            8,
            "@group(0) @binding(1) var<uniform> xu: array<vec4<u32>, 64>;",
            "let a = xu[c * 2u]; let b2 = xu[c * 2u + 1u];
             acc += a.x + a.y + a.z + a.w + b2.x + b2.y + b2.z + b2.w;",
        ),
        (
            "act workgroup array<u32>",
            8,
            "@group(0) @binding(0) var<storage, read> xs: array<u32>;
             var<workgroup> xw: array<u32, 256>;",
            "for (var k = 0u; k < 8u; k++) { acc += xw[c * 8u + k]; }",
        ),
        (
            "weights storage array<u32>",
            4,
            "@group(0) @binding(2) var<storage, read> ws: array<u32>;",
            "let g = (r * p.bpr + c) * 4u;
             acc += ws[g] + ws[g + 1u] + ws[g + 2u] + ws[g + 3u];",
        ),
        (
            "weights storage array<vec4<u32>>",
            4,
            "@group(0) @binding(3) var<storage, read> wv: array<vec4<u32>>;",
            "let v = wv[r * p.bpr + c]; acc += v.x + v.y + v.z + v.w;",
        ),
        (
            "weights texture rgba32uint",
            4,
            "@group(0) @binding(4) var wt: texture_2d<u32>;",
            "let v = textureLoad(wt, vec2<i32>(i32(c), i32(r)), 0); acc += v.x + v.y + v.z + v.w;",
        ),
    ]
}

fn source(bindings: &str, body: &str) -> String {
    let fill = if bindings.contains("xw") {
        // Workgroup copy of the activations, once per workgroup.
        "for (var i = lid; i < p.bpr * 8u; i += WG) { xw[i] = xs[i]; }
         workgroupBarrier();"
    } else {
        ""
    };
    format!(
        "const WG: u32 = {WG}u;\n{HEAD}\n{bindings}\n
@compute @workgroup_size(WG)
fn main(@builtin(global_invocation_id) gid: vec3<u32>,
        @builtin(local_invocation_index) lid: u32) {{
    {fill}
    let r = min(gid.x, p.rows - 1u);
    var acc = 0u;
    for (var rep = 0u; rep < p.reps; rep++) {{
        for (var b = 0u; b < p.bpr; b++) {{
            // chunk index varies with rep so that no load is loop-invariant
            let c = (b + rep) % p.bpr;
            {body}
        }}
    }}
    if (gid.x < p.rows) {{ out[gid.x] = acc; }}
}}"
    )
}

fn main() {
    let ctx = GpuContext::new(&DeviceSelector::Auto).expect("a GPU adapter");
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "large") {
        large::run(&ctx);
        return;
    }
    if args.iter().any(|a| a == "matvec") {
        let dims: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
        matvec::run(&ctx, &dims, args.iter().any(|a| a == "prefill"));
        return;
    }
    let dev = &ctx.device;
    let words: Vec<u32> = (0..ROWS * BPR * 4)
        .map(|i| i.wrapping_mul(2654435761))
        .collect();
    let storage = |label, contents: &[u8], usage| {
        dev.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents,
            usage,
        })
    };
    let su = wgpu::BufferUsages::STORAGE;
    // activations: [BPR * 8] words; padded to the uniform array's 64 vec4 (1 KiB)
    let xs = storage("xs", bytemuck::cast_slice(&words[..256]), su);
    let xu = storage(
        "xu",
        bytemuck::cast_slice(&words[..256]),
        wgpu::BufferUsages::UNIFORM,
    );
    // weights: [ROWS][BPR][4] words
    let ws = storage("ws", bytemuck::cast_slice(&words), su);
    let out = dev.create_buffer(&wgpu::BufferDescriptor {
        label: Some("out"),
        size: u64::from(ROWS) * 4,
        usage: su,
        mapped_at_creation: false,
    });
    let params = storage(
        "p",
        bytemuck::cast_slice(&[ROWS, BPR, REPS, 0u32]),
        wgpu::BufferUsages::UNIFORM,
    );
    // weights again as [ROWS][BPR] rgba32uint texels
    let view = matvec::texture(&ctx, wgpu::TextureFormat::Rgba32Uint, 4, BPR, &words);
    println!(
        "{} ({:?}): {ROWS} invocations x {REPS} x {BPR} chunks, {LAUNCHES} launches",
        ctx.info.name, ctx.info.backend
    );
    for (name, per_chunk, bindings, body) in kernels() {
        let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some(name),
            source: wgpu::ShaderSource::Wgsl(source(bindings, body).into()),
        });
        let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(name),
            layout: None,
            module: &module,
            entry_point: Some("main"),
            compilation_options: Default::default(),
            cache: None,
        });
        let mut entries = vec![
            wgpu::BindGroupEntry {
                binding: 8,
                resource: out.as_entire_binding(),
            },
            wgpu::BindGroupEntry {
                binding: 9,
                resource: params.as_entire_binding(),
            },
        ];
        for (b, res) in [
            (0, xs.as_entire_binding()),
            (1, xu.as_entire_binding()),
            (2, ws.as_entire_binding()),
            (3, ws.as_entire_binding()),
            (4, wgpu::BindingResource::TextureView(&view)),
            (5, xs.as_entire_binding()),
        ] {
            if bindings.contains(&format!("@binding({b})")) {
                entries.push(wgpu::BindGroupEntry {
                    binding: b,
                    resource: res,
                });
            }
        }
        let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some(name),
            layout: &pipe.get_bind_group_layout(0),
            entries: &entries,
        });
        let run = || {
            let mut enc = dev.create_command_encoder(&Default::default());
            {
                let mut pass = enc.begin_compute_pass(&Default::default());
                pass.set_pipeline(&pipe);
                pass.set_bind_group(0, &bg, &[]);
                for _ in 0..LAUNCHES {
                    pass.dispatch_workgroups(ROWS.div_ceil(WG), 1, 1);
                }
            }
            ctx.queue.submit([enc.finish()]);
            dev.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        };
        run();
        let mut t: Vec<f64> = (0..5)
            .map(|_| {
                let s = Instant::now();
                run();
                s.elapsed().as_secs_f64()
            })
            .collect();
        t.sort_by(f64::total_cmp);
        let loads = f64::from(ROWS * REPS * BPR * per_chunk) * LAUNCHES as f64;
        println!(
            "{name:34} {:8.3} ms/launch  {:6.3} ns/word  ({:.2} GB/s)",
            t[2] * 1e3 / LAUNCHES as f64,
            t[2] * 1e9 / loads,
            loads * 4.0 / t[2] / 1e9
        );
    }
    large::run(&ctx);
}
