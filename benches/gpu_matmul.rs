//! Prefill on the GPU: one tiled matmul (`shaders/matrix/tiles.wgsl`) against `n` matvec dispatches
//! for the same `[rows, cols]` weight matrix and `n` tokens, on the default adapter (lavapipe in
//! CI; WGPU_BACKEND picks another). Both are encoded into one command buffer and timed to the
//! end of the device wait; medians over repetitions after a warm-up.
//!
//! `cargo bench --bench gpu_matmul [-- ROWS COLS N]` (defaults: the model's FFN down-projection
//! shape, Q4_1, 1536 x 576, 64 tokens). Formats: MEMWALL_BENCH_FORMATS=q4_1,q8_0,... (those
//! kernels-ref can quantize).

use std::time::{Duration, Instant};

use memwall::gpu::kernels::{self, Dispatch, Kernels};
use memwall::gpu::{repack, DeviceSelector, GpuContext, WeightFormat};

/// Median time of `f` over `reps` runs after 2 warm-up runs.
fn time(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    f();
    let mut v: Vec<Duration> = (0..reps)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed()
        })
        .collect();
    v.sort();
    v[v.len() / 2]
}

fn values(seed: &mut u64, n: usize) -> Vec<f32> {
    (0..n)
        .map(|_| {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            (*seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, cols, n) = match args[..] {
        [r, c, n, ..] => (r, c, n),
        _ => (1536, 576, 64),
    };
    let formats: Vec<WeightFormat> = match std::env::var("MEMWALL_BENCH_FORMATS") {
        Ok(s) => WeightFormat::ALL
            .into_iter()
            .filter(|f| {
                s.split(',')
                    .any(|n| n.eq_ignore_ascii_case(f.ggml().name()))
            })
            .collect(),
        Err(_) => vec![WeightFormat::Q4_1],
    };
    let ctx = GpuContext::new(&DeviceSelector::Auto).expect("a GPU adapter");
    println!("adapter: {} ({})", ctx.info.name, ctx.info.backend);
    let ks = Kernels::new(&ctx).expect("kernels");
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    for ty in formats {
        let w = values(&mut seed, rows * cols);
        let data = kernels_ref::quantize(ty.ggml(), &w).expect("quantize");
        let m = kernels::upload_matrix(&ctx, &repack(ty, &data, rows, cols).expect("repack"))
            .expect("upload");
        let x = values(&mut seed, n * cols);
        // [n, cols] for matmul, and the same tokens as n separate [cols] buffers for matvec.
        let xb = kernels::upload_f32(&ctx, "x", &x).expect("x");
        let yb = kernels::upload_f32(&ctx, "y", &vec![0.0; n * rows]).expect("y");
        let xs: Vec<wgpu::Buffer> = x
            .chunks_exact(cols)
            .map(|c| kernels::upload_f32(&ctx, "x_t", c).expect("x_t"))
            .collect();
        let ys: Vec<wgpu::Buffer> = (0..n)
            .map(|_| kernels::upload_f32(&ctx, "y_t", &vec![0.0; rows]).expect("y_t"))
            .collect();
        let mm = ks.matmul(&ctx, &m, &xb, &yb, n, rows, 0).expect("matmul");
        let mvs: Vec<Dispatch> = xs
            .iter()
            .zip(&ys)
            .map(|(x, y)| ks.matvec(&ctx, &m, x, y).expect("matvec"))
            .collect();
        let mv_refs: Vec<&Dispatch> = mvs.iter().collect();
        let t_mm = time(9, || kernels::run(&ctx, &[&mm]).expect("run"));
        // MEMWALL_BENCH_MATMUL_ONLY=1 skips the (slow) matvec side when tuning the matmul.
        let t_mv = if std::env::var("MEMWALL_BENCH_MATMUL_ONLY").is_ok_and(|s| s == "1") {
            Duration::ZERO
        } else {
            time(9, || kernels::run(&ctx, &mv_refs).expect("run"))
        };
        let flop = 2.0 * (rows * cols * n) as f64;
        println!(
            "{:>5} [{rows} x {cols}] x {n} tokens: matmul {:8.2} ms ({:6.2} GFLOP/s), {n} x \
             matvec {:8.2} ms ({:6.2} GFLOP/s): {:.2}x",
            ty.ggml().name(),
            t_mm.as_secs_f64() * 1e3,
            flop / t_mm.as_secs_f64() / 1e9,
            t_mv.as_secs_f64() * 1e3,
            flop / t_mv.as_secs_f64() / 1e9,
            t_mv.as_secs_f64() / t_mm.as_secs_f64()
        );
    }
}
