//! The fused kernels against the unfused sequences they replace, bit for bit: `rmsnorm_quant`
//! vs `rmsnorm` + `quantize_act`, `swiglu_quant` vs `swiglu` + `quantize_act`, the stacked
//! (split-output) integer matvec vs one matvec per member matrix, and the accumulating one vs
//! a matvec and `add`. Each pair computes every element with the same operations in the same
//! order, so any difference is a bug (a wrong row range, stride, or chunk), not rounding.
//! Odd sizes, several tokens, both matvec layouts, and NaN-poisoned outputs with guards.
//!
//! Needs a GPU adapter (lavapipe in CI; `WGPU_BACKEND=gl` for the portable path): with none,
//! these tests FAIL.

mod common;
mod gpu_support;

use gpu_support::{random_weights, Rng};
use kernels_ref::GgmlType;
use memwall::config::FfnAct;
use memwall::gpu::kernels::q8act::{qd_vec4s, qx_words, Q8Target};
use memwall::gpu::kernels::{self, Kernels};
use memwall::gpu::registry::{MatvecOut, WeightFormat};
use memwall::gpu::repack::repack;
use memwall::gpu::GpuContext;

const GUARDS: usize = 3;

/// The poisons of the two sides of a comparison: NaNs with different payloads, so an element
/// left unwritten on either side cannot match the other side's written value (or its poison).
const POISON_FUSED: u32 = 0x7fc0_0000;
const POISON_UNFUSED: u32 = 0x7fc0_0001;

/// A buffer of `n` poison words plus guards (NaNs either way).
fn poisoned(ctx: &GpuContext, n: usize, poison: u32) -> wgpu::Buffer {
    kernels::upload_f32(ctx, "poisoned", &vec![f32::from_bits(poison); n + GUARDS]).unwrap()
}

fn nan_buf(ctx: &GpuContext, n: usize) -> wgpu::Buffer {
    poisoned(ctx, n, POISON_FUSED)
}

fn nan_buf2(ctx: &GpuContext, n: usize) -> wgpu::Buffer {
    poisoned(ctx, n, POISON_UNFUSED)
}

/// The first `n` values' bits, after checking the guards stayed NaN.
fn bits(ctx: &GpuContext, b: &wgpu::Buffer, n: usize, what: &str) -> Vec<u32> {
    let v = kernels::read_f32(ctx, b, n + GUARDS).unwrap();
    assert!(
        v[n..].iter().all(|g| g.is_nan()),
        "{what}: guard overwritten"
    );
    v[..n].iter().map(|x| x.to_bits()).collect()
}

fn assert_same(a: &[u32], b: &[u32], what: &str) {
    assert_eq!(a.len(), b.len());
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
        panic!(
            "{what}: element {i} differs: fused {:e} ({:#x}), unfused {:e} ({:#x})",
            f32::from_bits(a[i]),
            a[i],
            f32::from_bits(b[i]),
            b[i]
        );
    }
}

/// Kernel sets for both matvec layouts, each also with the grid limit `small` (per dimension)
/// so the test's larger launches take the 2-D dispatch path.
fn kernel_sets(ctx: &GpuContext, small: u32) -> Vec<Kernels> {
    let mut v = Vec::new();
    for rows_layout in [false, true] {
        for small_grid in [false, true] {
            let mut k = Kernels::new(ctx).unwrap();
            k.matvec_rows = rows_layout;
            if small_grid {
                k.max_groups_per_dim = small;
            }
            v.push(k);
        }
    }
    v
}

#[test]
fn rmsnorm_quant_equals_rmsnorm_then_quantize_act() {
    let ctx = gpu_support::context();
    for k in kernel_sets(&ctx, 3) {
        for (n_rows, n) in [(3usize, 96usize), (5, 576), (2, 4128)] {
            let mut rng = Rng(0xf05e ^ (n_rows * 31 + n) as u64);
            let mut x = rng.values(n_rows * n, 2.0);
            x[..n].fill(0.0); // a zero row: d = 0 chunks
            let w = rng.values(n, 1.5);
            let xb = kernels::upload_f32(&ctx, "x", &x).unwrap();
            let wb = kernels::upload_f32(&ctx, "w", &w).unwrap();
            let run = |fused: bool| {
                let p = if fused { POISON_FUSED } else { POISON_UNFUSED };
                let out = poisoned(&ctx, n_rows * n, p);
                let qx = poisoned(&ctx, qx_words(n_rows, n), p);
                let qd = poisoned(&ctx, qd_vec4s(n_rows, n) * 4, p);
                let ds = if fused {
                    let l = k
                        .rms_norm_quant_launch(&xb, &wb, &out, &qx, &qd, n, n_rows, 1e-5)
                        .unwrap();
                    vec![k.prepare(&ctx, l).unwrap()]
                } else {
                    let l = k.rms_norm_launch(&xb, &wb, &out, n, n_rows, 1e-5).unwrap();
                    let q = k.quantize_act_launch(&out, &qx, &qd, n_rows, n).unwrap();
                    vec![k.prepare(&ctx, l).unwrap(), k.prepare(&ctx, q).unwrap()]
                };
                kernels::run(&ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
                [
                    bits(&ctx, &out, n_rows * n, "out"),
                    bits(&ctx, &qx, qx_words(n_rows, n), "qx"),
                    bits(&ctx, &qd, qd_vec4s(n_rows, n) * 4, "qd"),
                ]
            };
            let (f, u) = (run(true), run(false));
            for (i, what) in ["out", "qx", "qd"].iter().enumerate() {
                assert_same(
                    &f[i],
                    &u[i],
                    &format!("rmsnorm_quant [{n_rows}, {n}] {what}"),
                );
            }
        }
    }
}

#[test]
fn swiglu_quant_equals_swiglu_then_quantize_act() {
    let ctx = gpu_support::context();
    for k in kernel_sets(&ctx, 13) {
        for n in [32usize, 96, 32 * 301, 1536 * 3] {
            let mut rng = Rng(0x5e1f ^ n as u64);
            let gate = rng.values(n, 4.0);
            let up = rng.values(n, 2.0);
            let ub = kernels::upload_f32(&ctx, "up", &up).unwrap();
            for act in [FfnAct::Silu, FfnAct::GeluTanh] {
                let run = |fused: bool| {
                    let mut g = gate.clone();
                    g.extend([f32::NAN; GUARDS]);
                    let gb = kernels::upload_f32(&ctx, "gate", &g).unwrap();
                    let p = if fused { POISON_FUSED } else { POISON_UNFUSED };
                    let qx = poisoned(&ctx, qx_words(1, n), p);
                    let qd = poisoned(&ctx, qd_vec4s(1, n) * 4, p);
                    let ds = if fused {
                        let l = k.swiglu_quant_launch(act, &gb, &ub, &qx, &qd, n).unwrap();
                        vec![k.prepare(&ctx, l).unwrap()]
                    } else {
                        let q = k.quantize_act_launch(&gb, &qx, &qd, 1, n).unwrap();
                        let glu = k.glu_launch(act, &gb, &ub, n).unwrap();
                        vec![k.prepare(&ctx, glu).unwrap(), k.prepare(&ctx, q).unwrap()]
                    };
                    kernels::run(&ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
                    [
                        bits(&ctx, &gb, n, "gate"),
                        bits(&ctx, &qx, qx_words(1, n), "qx"),
                        bits(&ctx, &qd, qd_vec4s(1, n) * 4, "qd"),
                    ]
                };
                let (f, u) = (run(true), run(false));
                for (i, what) in ["gate", "qx", "qd"].iter().enumerate() {
                    assert_same(&f[i], &u[i], &format!("swiglu_quant {act:?} [{n}] {what}"));
                }
            }
        }
    }
}

/// x quantized into fresh qx / qd: [n_tokens, cols].
fn quantized(ctx: &GpuContext, k: &Kernels, x: &[f32], n: usize, cols: usize) -> [wgpu::Buffer; 2] {
    let xb = kernels::upload_f32(ctx, "x", x).unwrap();
    let qx = kernels::upload_u32(ctx, "qx", &vec![0; qx_words(n, cols)]).unwrap();
    let qd = kernels::upload_f32(ctx, "qd", &vec![0.0; qd_vec4s(n, cols) * 4]).unwrap();
    let d = k
        .prepare(ctx, k.quantize_act_launch(&xb, &qx, &qd, n, cols).unwrap())
        .unwrap();
    kernels::run(ctx, &[&d]).unwrap();
    [qx, qd]
}

#[test]
fn stacked_matvec_equals_one_matvec_per_matrix() {
    let ctx = gpu_support::context();
    let cols = 96;
    let n = 3;
    let sets = kernel_sets(&ctx, 18);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let f = WeightFormat::from_ggml(ty).unwrap();
        for sizes in [vec![37usize, 13], vec![37, 13, 11], vec![5, 70, 129]] {
            let mut rng = Rng(0x57ac ^ sizes.iter().sum::<usize>() as u64);
            let mats: Vec<Vec<u8>> = sizes
                .iter()
                .map(|&r| random_weights(&mut rng, ty, r, cols))
                .collect();
            let total: usize = sizes.iter().sum();
            let stacked =
                kernels::upload_matrix(&ctx, &repack(f, &mats.concat(), total, cols).unwrap())
                    .unwrap();
            let x = rng.values(n * cols, 2.0);
            for k in &sets {
                let [qx, qd] = quantized(&ctx, k, &x, n, cols);
                let what = format!("{ty:?} {sizes:?} rows_layout={}", k.matvec_rows);
                // Fused: one launch into poisoned outputs.
                let outs: Vec<wgpu::Buffer> = sizes.iter().map(|&r| nan_buf(&ctx, n * r)).collect();
                let mut ends: Vec<usize> = sizes
                    .iter()
                    .scan(0, |a, &r| {
                        *a += r;
                        Some(*a)
                    })
                    .collect();
                ends.pop();
                let target = Q8Target {
                    out: Some(if sizes.len() == 3 {
                        MatvecOut::Split3
                    } else {
                        MatvecOut::Split2
                    }),
                    ys: outs.iter().collect(),
                    y_stride: total,
                    row_offset: 0,
                    splits: [ends[0], ends.get(1).copied().unwrap_or(total)],
                };
                let l = k
                    .matvec_q8_target_launch(&stacked, 0, &qx, &qd, n, target)
                    .unwrap();
                kernels::run(&ctx, &[&k.prepare(&ctx, l).unwrap()]).unwrap();
                // Unfused: each matrix on its own, and each as a row-range view of the stack.
                let mut row0 = 0;
                for (i, (&r, data)) in sizes.iter().zip(&mats).enumerate() {
                    let own =
                        kernels::upload_matrix(&ctx, &repack(f, data, r, cols).unwrap()).unwrap();
                    let y = nan_buf2(&ctx, n * r);
                    let l = k.matvec_q8_launch(&own, &qx, &qd, &y, n, r, 0).unwrap();
                    kernels::run(&ctx, &[&k.prepare(&ctx, l).unwrap()]).unwrap();
                    let want = bits(&ctx, &y, n * r, "own");
                    assert_same(&bits(&ctx, &outs[i], n * r, "split"), &want, &what);
                    let view = memwall::gpu::GpuMatrix {
                        ty: f,
                        rows: r,
                        cols,
                        quants: stacked.quants.clone(),
                        scales: stacked.scales.clone(),
                    };
                    let yv = nan_buf(&ctx, n * r);
                    let target = Q8Target {
                        out: None,
                        ys: vec![&yv],
                        y_stride: r,
                        row_offset: 0,
                        splits: [r; 2],
                    };
                    let l = k
                        .matvec_q8_target_launch(&view, row0, &qx, &qd, n, target)
                        .unwrap();
                    kernels::run(&ctx, &[&k.prepare(&ctx, l).unwrap()]).unwrap();
                    assert_same(
                        &bits(&ctx, &yv, n * r, "view"),
                        &want,
                        &format!("{what} view"),
                    );
                    row0 += r;
                }
            }
        }
    }
}

#[test]
fn accumulating_matvec_equals_matvec_then_add() {
    let ctx = gpu_support::context();
    let n = 5;
    let sets = kernel_sets(&ctx, 38);
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        let f = WeightFormat::from_ggml(ty).unwrap();
        for (rows, cols) in [(37usize, 96usize), (576, 1536), (3, 4128)] {
            let mut rng = Rng(0xacc0 ^ (rows * 7 + cols) as u64);
            let data = random_weights(&mut rng, ty, rows, cols);
            let m = kernels::upload_matrix(&ctx, &repack(f, &data, rows, cols).unwrap()).unwrap();
            let x = rng.values(n * cols, 2.0);
            let mut y0 = rng.values(n * rows, 3.0);
            y0.extend([f32::NAN; GUARDS]);
            for k in &sets {
                let what = format!("{ty:?} [{rows}, {cols}] rows_layout={}", k.matvec_rows);
                let [qx, qd] = quantized(&ctx, k, &x, n, cols);
                let fused = kernels::upload_f32(&ctx, "y", &y0).unwrap();
                let target = Q8Target {
                    out: Some(MatvecOut::Add),
                    ys: vec![&fused],
                    y_stride: rows,
                    row_offset: 0,
                    splits: [rows; 2],
                };
                let l = k
                    .matvec_q8_target_launch(&m, 0, &qx, &qd, n, target)
                    .unwrap();
                kernels::run(&ctx, &[&k.prepare(&ctx, l).unwrap()]).unwrap();
                let plain = kernels::upload_f32(&ctx, "y", &y0).unwrap();
                let tmp = nan_buf(&ctx, n * rows);
                let l = k.matvec_q8_launch(&m, &qx, &qd, &tmp, n, rows, 0).unwrap();
                let d1 = k.prepare(&ctx, l).unwrap();
                let d2 = k.add(&ctx, &plain, &tmp, n * rows).unwrap();
                kernels::run(&ctx, &[&d1, &d2]).unwrap();
                assert_same(
                    &bits(&ctx, &fused, n * rows, "fused"),
                    &bits(&ctx, &plain, n * rows, "plain"),
                    &what,
                );
            }
        }
    }
}
