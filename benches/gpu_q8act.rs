//! Decode matvec on the GPU: the 8-bit-activation path (quantize_act + integer matvec_q8)
//! against the f32-activation matvec, for one `[rows, cols]` Q4_1 matrix on the default adapter
//! (WGPU_BACKEND picks another), for each reduction variant the adapter has. Each is launched
//! `REPS` times in one command buffer; the median of 5 such runs after a warm-up, per call.
//!
//! `cargo bench --bench gpu_q8act [-- ROWS COLS]` (default: the test model's FFN up shape,
//! 1536 x 576).

use std::time::Instant;

use memwall::gpu::kernels::q8act::{qd_vec4s, qx_words};
use memwall::gpu::kernels::{self, Dispatch, Kernels};
use memwall::gpu::{repack, DeviceSelector, GpuContext, WeightFormat};

const REPS: usize = 50;

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

/// Seconds per call of the dispatches in `ds` (each `REPS` times in `ds`).
fn per_call(ctx: &GpuContext, ds: &[&Dispatch]) -> f64 {
    kernels::run(ctx, ds).expect("warm-up");
    let mut v: Vec<f64> = (0..5)
        .map(|_| {
            let t = Instant::now();
            kernels::run(ctx, ds).expect("run");
            t.elapsed().as_secs_f64() / REPS as f64
        })
        .collect();
    v.sort_by(f64::total_cmp);
    v[2]
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, cols) = match args[..] {
        [r, c, ..] => (r, c),
        _ => (1536, 576),
    };
    let ctx = GpuContext::new(&DeviceSelector::Auto).expect("a GPU adapter");
    let mut seed = 0xBEu64;
    let data = kernels_ref::quantize(kernels_ref::GgmlType::Q4_1, &values(&mut seed, rows * cols))
        .expect("quantize");
    let m = kernels::upload_matrix(
        &ctx,
        &repack(WeightFormat::Q4_1, &data, rows, cols).unwrap(),
    )
    .expect("upload");
    // x: [cols] f32; qx/qd: its 8-bit blocks; yq, yf: [rows] outputs of the two paths.
    let xb = kernels::upload_f32(&ctx, "x", &values(&mut seed, cols)).unwrap();
    let qx = kernels::upload_u32(&ctx, "qx", &vec![0; qx_words(1, cols)]).unwrap();
    let qd = kernels::upload_f32(&ctx, "qd", &vec![0.0; 4 * qd_vec4s(1, cols)]).unwrap();
    let yq = kernels::upload_f32(&ctx, "yq", &vec![0.0; rows]).unwrap();
    let yf = kernels::upload_f32(&ctx, "yf", &vec![0.0; rows]).unwrap();
    let mut variants = vec![false];
    if ctx.has_subgroups() {
        variants.push(true);
    }
    for subgroup in variants {
        let k = Kernels::with_options(&ctx, subgroup).expect("kernels");
        let dq = k
            .prepare(&ctx, k.quantize_act_launch(&xb, &qx, &qd, 1, cols).unwrap())
            .unwrap();
        let dm = k
            .prepare(
                &ctx,
                k.matvec_q8_launch(&m, &qx, &qd, &yq, 1, rows, 0).unwrap(),
            )
            .unwrap();
        let df = k.matvec(&ctx, &m, &xb, &yf).unwrap();
        let q8: Vec<&Dispatch> = (0..REPS).flat_map(|_| [&dq, &dm]).collect();
        let t_q8 = per_call(&ctx, &q8);
        let t_quant = per_call(&ctx, &vec![&dq; REPS]);
        let t_f32 = per_call(&ctx, &vec![&df; REPS]);
        let a = kernels::read_f32(&ctx, &yq, rows).unwrap();
        let b = kernels::read_f32(&ctx, &yf, rows).unwrap();
        let diff = a
            .iter()
            .zip(&b)
            .map(|(p, q)| (p - q).abs())
            .fold(0f32, f32::max);
        println!(
            "[{rows} x {cols}] Q4_1 on {} (subgroup={subgroup}): quantize_act + matvec_q8 \
             {:.1} us/call (quantize alone {:.1} us), f32 matvec {:.1} us/call; \
             max |q8 - f32| = {diff:.3e}",
            ctx.info.name,
            t_q8 * 1e6,
            t_quant * 1e6,
            t_f32 * 1e6
        );
    }
}
