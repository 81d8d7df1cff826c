//! What one compute launch costs on the default adapter (issue 5: on lavapipe the decode's
//! small kernels, ~0.2-0.4 ms each, are ~30% of a token). Each case records `CALLS` dispatches
//! of one trivial shader, each in its own compute pass as the recorder does, submits once and
//! waits; the figure is wall time / CALLS (median of 5 after a warm-up). Cases: an empty
//! kernel with 1 workgroup of 8, 64 and 256 invocations; 256 invocations with 1, 4 and 8
//! `workgroupBarrier()`s (llvmpipe runs a workgroup's SIMD groups as coroutines on one thread,
//! and each barrier switches between all of them); 18 and 64 workgroups of 64 (the spread
//! over llvmpipe's threads); and a tree sum of 576 values in 1 workgroup of 64 and 256 (the
//! shape of rmsnorm's reduction). WGPU_BACKEND picks another backend.
//!
//! `cargo bench --bench gpu_launch`

use std::time::Instant;

use memwall::gpu::{DeviceSelector, GpuContext};

const CALLS: usize = 200;

// A shader with workgroup size `wg` whose body is `body` (it may use lid, wid, buf, red).
fn shader(wg: u32, body: &str) -> String {
    format!(
        "@group(0) @binding(0) var<storage, read_write> buf: array<f32>;
var<workgroup> red: array<f32, 256>;
@compute @workgroup_size({wg})
fn main(@builtin(local_invocation_index) lid: u32, @builtin(workgroup_id) wid: vec3<u32>) {{
{body}
}}"
    )
}

fn barriers(n: usize) -> String {
    let mut s = String::from("red[lid] = f32(lid);\n");
    for _ in 0..n {
        s.push_str("workgroupBarrier();\nred[lid] = red[(lid + 1u) & 255u] + 1.0;\n");
    }
    s.push_str("if (lid == 0u) { buf[wid.x] = red[0]; }");
    s
}

// The portable workgroup tree sum of 576 values (reduce/workgroup.wgsl's shape).
fn tree_sum(wg: u32) -> String {
    format!(
        "var ss = 0.0;
for (var i = lid; i < 576u; i += {wg}u) {{ let v = buf[i]; ss += v * v; }}
red[lid] = ss;
workgroupBarrier();
for (var s = {wg}u / 2u; s > 0u; s >>= 1u) {{
    if (lid < s) {{ red[lid] += red[lid + s]; }}
    workgroupBarrier();
}}
if (lid == 0u) {{ buf[600u] = red[0]; }}"
    )
}

// Median ms per launch of `src` (overrides `constants`, buffers `binds`) over `groups`.
fn time_kernel(
    ctx: &GpuContext,
    src: &str,
    constants: &[(&str, f64)],
    binds: &[(u32, &wgpu::Buffer)],
    groups: u32,
) -> f64 {
    let dev = &ctx.device;
    let module = dev.create_shader_module(wgpu::ShaderModuleDescriptor {
        label: Some("launch"),
        source: wgpu::ShaderSource::Wgsl(src.into()),
    });
    let pipe = dev.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
        label: Some("launch"),
        layout: None,
        module: &module,
        entry_point: Some("main"),
        compilation_options: wgpu::PipelineCompilationOptions {
            constants,
            ..Default::default()
        },
        cache: None,
    });
    let entries: Vec<wgpu::BindGroupEntry> = binds
        .iter()
        .map(|&(binding, b)| wgpu::BindGroupEntry {
            binding,
            resource: b.as_entire_binding(),
        })
        .collect();
    let bg = dev.create_bind_group(&wgpu::BindGroupDescriptor {
        label: Some("launch"),
        layout: &pipe.get_bind_group_layout(0),
        entries: &entries,
    });
    let run = || {
        let t = Instant::now();
        let mut enc = dev.create_command_encoder(&Default::default());
        for _ in 0..CALLS {
            let mut pass = enc.begin_compute_pass(&Default::default());
            pass.set_pipeline(&pipe);
            pass.set_bind_group(0, &bg, &[]);
            pass.dispatch_workgroups(groups, 1, 1);
        }
        ctx.queue.submit([enc.finish()]);
        dev.poll(wgpu::PollType::wait_indefinitely()).expect("poll");
        t.elapsed().as_secs_f64() * 1e3 / CALLS as f64
    };
    run();
    let mut ts: Vec<f64> = (0..5).map(|_| run()).collect();
    ts.sort_by(f64::total_cmp);
    ts[2]
}

fn buffer(ctx: &GpuContext, usage: wgpu::BufferUsages, data: &[u32]) -> wgpu::Buffer {
    let b = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("launch buf"),
        size: (data.len() * 4) as u64,
        usage: usage | wgpu::BufferUsages::COPY_DST,
        mapped_at_creation: false,
    });
    let bytes: Vec<u8> = data.iter().flat_map(|w| w.to_le_bytes()).collect();
    ctx.queue.write_buffer(&b, 0, &bytes);
    b
}

const SUBGROUP: &str = include_str!("../shaders/reduce/subgroup.wgsl");
const WORKGROUP: &str = include_str!("../shaders/reduce/workgroup.wgsl");
const QUANTIZE_CHUNK: &str = include_str!("../shaders/quantize_chunk.wgsl");
const RMSNORM_QUANT: &str = include_str!("../shaders/rmsnorm_quant.wgsl");
const SWIGLU_QUANT: &str = include_str!("../shaders/swiglu_quant.wgsl");
const KV_STORE: &str = include_str!("../shaders/kv_store.wgsl");

// One row of 576 words read from a small and from a 30 MB storage buffer (the tied
// embedding table's size): whether a launch's cost grows with what it binds.
fn big_binding(ctx: &GpuContext) {
    use wgpu::BufferUsages as U;
    let src = "@group(0) @binding(0) var<storage, read> t: array<u32>;
@group(0) @binding(1) var<storage, read_write> o: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    for (var i = lid; i < 576u; i += 64u) { o[i] = t[1000u * 576u + i]; }
}";
    let out = buffer(ctx, U::STORAGE, &vec![0; 576]);
    for words in [1001 * 576, 30 << 18] {
        let t = buffer(ctx, U::STORAGE, &vec![7; words]);
        let ms = time_kernel(ctx, src, &[], &[(0, &t), (1, &out)], 1);
        let name = format!("one row from {} KiB", words / 256);
        println!("{name:<44} {ms:8.4} ms");
    }
}

// Dequantizing one row of 18 Q8_0-like blocks in 1 workgroup of 64, through a function that
// returns `array<vec4<f32>, 8>` indexed in loops (the quant fragments' dq_block) and with the
// words written straight: whether the local array is what costs (the embedding was ~10x
// slower on Vulkan than on GL).
fn local_array(ctx: &GpuContext) {
    use wgpu::BufferUsages as U;
    let head = "@group(0) @binding(0) var<storage, read> t: array<u32>;
@group(0) @binding(1) var<storage, read_write> o: array<f32>;
fn dq(b: u32) -> array<vec4<f32>, 8> {
    var out: array<vec4<f32>, 8>;
    for (var k = 0u; k < 8u; k++) {
        let w = vec4<i32>(bitcast<i32>(t[b * 8u + k]));
        out[k] = vec4<f32>((w << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
    }
    return out;
}
@compute @workgroup_size(64)
fn main(@builtin(local_invocation_index) lid: u32) {
    for (var b = lid; b < 18u; b += 64u) {
";
    let via_array = "let w = dq(b);
        for (var k = 0u; k < 8u; k++) { for (var j = 0u; j < 4u; j++) {
            let c = b * 32u + 4u * k + j;
            if (c < 576u) { o[c] = w[k][j]; }
        } }";
    let direct = "for (var k = 0u; k < 8u; k++) {
            let w = vec4<i32>(bitcast<i32>(t[b * 8u + k]));
            let v = vec4<f32>((w << vec4<u32>(24u, 16u, 8u, 0u)) >> vec4<u32>(24u));
            for (var j = 0u; j < 4u; j++) { o[b * 32u + 4u * k + j] = v[j]; }
        }";
    let t = buffer(ctx, U::STORAGE, &vec![0x01020304; 18 * 8]);
    let out = buffer(ctx, U::STORAGE, &vec![0; 576]);
    for (name, body) in [("via local array", via_array), ("direct", direct)] {
        let src = format!("{head}{body}\n}}\n}}");
        let ms = time_kernel(ctx, &src, &[], &[(0, &t), (1, &out)], 1);
        let name = format!("dequant 18 blocks, {name}");
        println!("{name:<44} {ms:8.4} ms");
    }
}

// The decode's embedding lookup (one token) from a Q8_0 table of 1001 and of 49152 rows of
// 576 (the test model's), each launch submitted and waited for alone as MEMWALL_GPU_PROFILE
// does, next to an empty submit + wait (the profile showed it at 2-7 ms a launch).
fn embedding(ctx: &GpuContext) {
    use memwall::gpu::kernels::{self, Kernels};
    use memwall::gpu::{PackedMatrix, WeightFormat};
    let ks = Kernels::with_options(ctx, false).expect("kernels");
    let out = kernels::upload_f32(ctx, "out", &[0.0; 576]).expect("out");
    let ids = kernels::upload_u32(ctx, "ids", &[1000]).expect("ids");
    let empty = || {
        let t = Instant::now();
        let enc = ctx.device.create_command_encoder(&Default::default());
        ctx.queue.submit([enc.finish()]);
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .expect("poll");
        t.elapsed().as_secs_f64() * 1e3
    };
    for rows in [1001usize, 49152] {
        let packed = PackedMatrix {
            ty: WeightFormat::Q8_0,
            rows,
            cols: 576,
            quants: vec![0x01020304; rows * 576 / 4],
            scales: vec![0x3c003c00; (rows * 576 / 32).div_ceil(2)],
        };
        let m = kernels::upload_matrix(ctx, &packed).expect("table");
        let d = ks.embedding(ctx, &m, &ids, &out, 1).expect("embedding");
        let mut ts: Vec<f64> = (0..21)
            .map(|_| {
                let t = Instant::now();
                kernels::run(ctx, &[&d]).expect("run");
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        ts.sort_by(f64::total_cmp);
        let mut es: Vec<f64> = (0..21).map(|_| empty()).collect();
        es.sort_by(f64::total_cmp);
        let name = format!("embedding q8_0 {rows} rows, alone");
        println!("{name:<44} {:8.4} ms (empty submit {:.4})", ts[10], es[10]);
    }
}

// The decode's kv_store into an f16 cache (3 KV heads of 64: 96 words each of K and V), both
// in one launch and K alone.
fn kv_store(ctx: &GpuContext) {
    use wgpu::BufferUsages as U;
    let src = buffer(ctx, U::STORAGE, &vec![1.5f32.to_bits(); 192]);
    let cache = buffer(ctx, U::STORAGE, &vec![0; 2048 * 96]);
    let cache_v = buffer(ctx, U::STORAGE, &vec![0; 2048 * 96]);
    for (name, units_v) in [("K and V", 96u32), ("K alone", 0)] {
        let groups = (96 + units_v).div_ceil(64);
        // KvStoreParams { n_tokens, row_len, pos0, groups_x, units_k, units_v, pad, pad }
        let p = buffer(ctx, U::UNIFORM, &[1, 192, 100, groups, 96, units_v, 0, 0]);
        let binds = [(0, &src), (1, &cache), (2, &p), (3, &src), (4, &cache_v)];
        let c = [("WG", 64.0), ("TYPE", 1.0)];
        let ms = time_kernel(ctx, KV_STORE, &c, &binds, groups);
        let name = format!("kv_store f16, {name}");
        println!("{name:<44} {ms:8.4} ms");
    }
}

// The decode's rmsnorm_quant (n 576, one row) and swiglu_quant (n 1536) at several
// workgroup sizes, with and without the exact division.
fn real_kernels(ctx: &GpuContext) {
    use wgpu::BufferUsages as U;
    let vals = |n: usize| -> Vec<u32> {
        (0..n)
            .map(|i| ((i as f32 * 0.37).sin() * 2.0).to_bits())
            .collect()
    };
    let x = buffer(ctx, U::STORAGE, &vals(1536));
    let w = buffer(ctx, U::STORAGE, &vals(1536));
    let out = buffer(ctx, U::STORAGE, &vals(1536));
    let qx = buffer(ctx, U::STORAGE, &vec![0; 1536 / 4]);
    let qd = buffer(ctx, U::STORAGE, &vec![0; 1536 / 8]);
    // RmsNormParams { n, n_rows, eps, groups_x }
    let rp = buffer(ctx, U::UNIFORM, &[576, 1, 1e-5f32.to_bits(), 1]);
    let rbinds = [(0, &x), (1, &w), (2, &out), (3, &rp), (4, &qx), (5, &qd)];
    let mut reduces = vec![("workgroup", WORKGROUP)];
    if ctx.has_subgroups() {
        reduces.push(("subgroup", SUBGROUP));
    }
    for (rname, reduce) in reduces {
        let src = format!("{reduce}\n{QUANTIZE_CHUNK}\n{RMSNORM_QUANT}");
        for wg in [64.0, 32.0, 8.0] {
            for exact in [1.0, 0.0] {
                let c = [("WG", wg), ("EXACT_DIV", exact)];
                let ms = time_kernel(ctx, &src, &c, &rbinds, 1);
                let name = format!("rmsnorm_quant {rname} WG {wg} exact {exact}");
                println!("{name:<44} {ms:8.4} ms");
            }
        }
    }
    let src = format!("{QUANTIZE_CHUNK}\n{SWIGLU_QUANT}");
    for wg in [64u32, 16, 8] {
        // ElementwiseParams { n, groups_x, pad, pad }: 48 chunks of 32
        let groups = 48u32.div_ceil(wg);
        let sp = buffer(ctx, U::UNIFORM, &[1536, groups, 0, 0]);
        let sbinds = [(0, &out), (1, &x), (2, &sp), (3, &qx), (4, &qd)];
        for exact in [1.0, 0.0] {
            let c = [("WG", f64::from(wg)), ("EXACT_DIV", exact)];
            let ms = time_kernel(ctx, &src, &c, &sbinds, groups);
            let name = format!("swiglu_quant WG {wg} x {groups} exact {exact}");
            println!("{name:<44} {ms:8.4} ms");
        }
    }
}

fn main() {
    let ctx = GpuContext::new(&DeviceSelector::Auto).expect("a GPU adapter");
    let buf = ctx.device.create_buffer(&wgpu::BufferDescriptor {
        label: Some("launch buf"),
        size: 4096 * 4,
        usage: wgpu::BufferUsages::STORAGE,
        mapped_at_creation: false,
    });
    let write = "if (lid == 0u) { buf[wid.x] = 1.0; }";
    let cases: Vec<(String, String, u32)> = vec![
        ("empty, 1 x 8".into(), shader(8, write), 1),
        ("empty, 1 x 64".into(), shader(64, write), 1),
        ("empty, 1 x 256".into(), shader(256, write), 1),
        ("1 barrier, 1 x 256".into(), shader(256, &barriers(1)), 1),
        ("4 barriers, 1 x 256".into(), shader(256, &barriers(4)), 1),
        ("8 barriers, 1 x 256".into(), shader(256, &barriers(8)), 1),
        ("8 barriers, 1 x 64".into(), shader(64, &barriers(8)), 1),
        ("empty, 18 x 64".into(), shader(64, write), 18),
        ("empty, 64 x 64".into(), shader(64, write), 64),
        ("tree sum 576, 1 x 64".into(), shader(64, &tree_sum(64)), 1),
        (
            "tree sum 576, 1 x 256".into(),
            shader(256, &tree_sum(256)),
            1,
        ),
    ];
    println!("adapter: {} ({})", ctx.info.name, ctx.info.backend);
    println!("{CALLS} launches per submit, each in its own pass; ms per launch (median of 5)");
    for (name, src, groups) in cases {
        let ms = time_kernel(&ctx, &src, &[], &[(0, &buf)], groups);
        println!("{name:<44} {ms:8.4} ms");
    }
    real_kernels(&ctx);
    kv_store(&ctx);
    big_binding(&ctx);
    embedding(&ctx);
    local_array(&ctx);
}
