//! Checks of the prefill-only kernels: the tiled matmul and the bias add. Same rules as
//! [`super::checks`]: seeded inputs with outliers, odd sizes, NaN-poisoned outputs, a
//! small-grid case, kernels-ref as the oracle and tolerances derived where computed.

use super::checks::{matrix_cases, oracle, weights};
use super::{poisoned, prepare, run_read, small_grid, Rng, Worst, U};
use crate::error::Result;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::matmul::matmul_tile;
use crate::gpu::kernels::{self, Kernels};
use crate::gpu::registry::{KernelKey, WeightFormat};
use crate::gpu::repack::repack;

pub(super) fn matmul(
    ctx: &GpuContext,
    ks: &mut Kernels,
    key: KernelKey,
    ty: WeightFormat,
) -> Result<Worst> {
    let mut worst = Worst::new();
    let tn = matmul_tile(ks.workgroup_size).1 as usize;
    let device_limit = ks.max_groups_per_dim;
    for (rows, cols, grid) in matrix_cases(ty) {
        // Tokens: one full tile and a partial one; on the small grid a few more tiles than
        // fit one line, so the 2-D dispatch and its surplus workgroups run. The output is
        // written at a row offset inside wider rows: the columns around it must stay NaN.
        ks.max_groups_per_dim = device_limit;
        let (n_tokens, row_offset, y_stride) = if grid.is_some() {
            (2 * tn + 3, 0, rows)
        } else {
            (tn + 3, 3, rows + 8)
        };
        let data = weights(ty, rows, cols, 0x3a7_3a7)?;
        let x = Rng(0x3a7 ^ (cols * 131 + n_tokens) as u64).values(n_tokens * cols, 2.0); // [n_tokens, cols]
        let mut want = vec![0f32; n_tokens * rows]; // [n_tokens, rows]
        oracle(kernels_ref::matmul(
            ty.ggml(),
            &data,
            rows,
            cols,
            &x,
            n_tokens,
            &mut want,
        ))?;
        let wd = oracle(kernels_ref::dequantize_vec(ty.ggml(), &data, rows * cols))?;
        // As for matvec: every decoded weight is the oracle's f32 value (each format's decode
        // has exact products and at most one rounding, the oracle's), each product w * x is
        // one f32 rounding and `cols` of them are summed in f32 in some order (the 4-term
        // dots, the per-block partial sums): |error| <= (cols - 1) u sum|w x| by Higham's
        // gamma_n for any order, plus the products' and the result's roundings: (cols + 2) u
        // sum|w x|.
        let tol: Vec<f64> = (0..n_tokens * rows)
            .map(|i| {
                let (t, r) = (i / rows, i % rows);
                let abs: f64 = wd[r * cols..(r + 1) * cols]
                    .iter()
                    .zip(&x[t * cols..(t + 1) * cols])
                    .map(|(&w, &v)| (f64::from(w) * f64::from(v)).abs())
                    .sum();
                (cols as f64 + 2.0) * U * abs + f64::MIN_POSITIVE
            })
            .collect();
        let m = kernels::upload_matrix(ctx, &repack(ty, &data, rows, cols)?)?;
        let xb = kernels::upload_f32(ctx, "x", &x)?;
        let n = n_tokens * y_stride;
        let yb = poisoned(ctx, "y", &vec![f32::NAN; n])?; // [n_tokens, y_stride]
        if grid.is_some() {
            let planned = ks.matmul_launch(&m, &xb, &yb, n_tokens, y_stride, row_offset)?;
            ks.max_groups_per_dim = small_grid(&[planned])?;
        }
        let launch = ks.matmul_launch(&m, &xb, &yb, n_tokens, y_stride, row_offset)?;
        let d = prepare(ctx, ks, launch, key)?;
        let got = run_read(ctx, &d, &yb, n, &mut worst)?;
        for (t, line) in got.chunks_exact(y_stride).enumerate() {
            let (before, rest) = line.split_at(row_offset);
            let (out, after) = rest.split_at(rows);
            if !before.iter().chain(after).all(|v| v.is_nan()) {
                worst.fail();
            }
            let base = t * rows;
            worst.add_all(out, &want[base..base + rows], |r| tol[base + r]);
        }
    }
    Ok(worst)
}

pub(super) fn add_bias(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    // (width, n_rows, small grid): widths not a multiple of the workgroup, a single row, and
    // a case run as a 2-D dispatch.
    for (width, n_rows, grid) in [(37, 3, false), (4099, 1, false), (64, 23, true)] {
        let mut rng = Rng(0xb1a5 ^ (width * 31 + n_rows) as u64);
        let x = rng.values(n_rows * width, 4.0); // [n_rows, width]
        let bias = rng.values(width, 2.0); // [width]
        let mut want = vec![0f32; x.len()];
        for (xr, wr) in x.chunks_exact(width).zip(want.chunks_exact_mut(width)) {
            kernels_ref::add(xr, &bias, wr);
        }
        let xb = poisoned(ctx, "x", &x)?;
        let bb = kernels::upload_f32(ctx, "bias", &bias)?;
        if grid {
            ks.max_groups_per_dim = small_grid(&[ks.add_bias_launch(&xb, &bb, width, n_rows)?])?;
        }
        let launch = ks.add_bias_launch(&xb, &bb, width, n_rows)?;
        let d = prepare(ctx, ks, launch, key)?;
        let got = run_read(ctx, &d, &xb, x.len(), &mut worst)?;
        // f32 addition is correctly rounded everywhere: exact.
        worst.add_all(&got, &want, |_| 0.0);
    }
    Ok(worst)
}
