//! Checks of the mixture-of-experts kernels against kernels-ref: the routing (expert ids
//! exactly, ties included; weights to the softmax's rounding), the routed experts' matvecs
//! over f32 and 8-bit inputs, over a stack split across two bindings (every pair against kernels-ref's matvec of its
//! expert's rows), and the weighted sum with and without a shared expert (gated or not).

use super::checks::{matrix_cases, oracle, weights};
use super::checks_q8::block_offset;
use super::{poisoned, prepare, read_guarded, small_grid, Rng, Worst, U};
use crate::cpu::act::QAct;
use crate::cpu::{MatmulScratch, WeightView};
use crate::error::Result;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::moe::ExpertsInput;
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words};
use crate::gpu::kernels::{self, Kernels};
use crate::gpu::registry::{KernelKey, WeightFormat};
use crate::gpu::repack::repack;

pub(super) fn moe_route(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    // (tokens, experts, used, normalize, small grid)
    let cases = [
        (5usize, 8usize, 2usize, true, false),
        (70, 128, 8, true, false),
        (9, 60, 4, false, false),
        (200, 16, 3, true, true),
    ];
    for (n, ne, k, normalize, small) in cases {
        let mut rng = Rng(0x0e0e_7000 ^ (n * 131 + ne) as u64);
        let mut logits = rng.values(n * ne, 1.5); // [n, ne]
        for t in 0..n {
            // Ties: two experts of each token share a logit (the lower index goes first).
            logits[t * ne + ne - 1] = logits[t * ne + 1];
        }
        let mut want_ids = vec![0u32; n * k]; // [n, k]
        let mut want_w = vec![0f32; n * k]; // [n, k]
        for t in 0..n {
            kernels_ref::route_experts(
                &logits[t * ne..(t + 1) * ne],
                normalize,
                &mut want_ids[t * k..(t + 1) * k],
                &mut want_w[t * k..(t + 1) * k],
            );
        }
        let lb = kernels::upload_f32(ctx, "logits", &logits)?;
        let ib = poisoned(ctx, "ids", &vec![f32::NAN; n * k])?;
        let wb = poisoned(ctx, "weights", &vec![f32::NAN; n * k])?;
        if small {
            let probe = ks.moe_route_launch(&lb, &ib, &wb, n, ne, k, normalize)?;
            ks.max_groups_per_dim = small_grid(&[probe])?;
        }
        let launch = ks.moe_route_launch(&lb, &ib, &wb, n, ne, k, normalize)?;
        let d = prepare(ctx, ks, launch, key)?;
        kernels::run(ctx, &[&d])?;
        let ids = read_guarded(ctx, &ib, n * k, &mut worst)?;
        for (g, w) in ids.iter().zip(&want_ids) {
            worst.add(f64::from(g.to_bits()), f64::from(*w), 0.0);
        }
        let got = read_guarded(ctx, &wb, n * k, &mut worst)?;
        // exp of an argument up to |x| (the shift by the largest logit is exact or one
        // rounding) is within (3 + 2|x|) ulp in WGSL; the sum of ne terms adds ne u, the
        // division and the normalization two roundings each, with the kept sum's k u.
        let tol: Vec<f64> = (0..n * k)
            .map(|i| {
                let t = i / k;
                let row = &logits[t * ne..(t + 1) * ne];
                let m = row.iter().fold(f32::MIN, |a, &b| a.max(b));
                let span = row.iter().map(|&v| f64::from(m - v)).fold(0.0, f64::max);
                let ulps = 2.0 * (3.0 + 2.0 * span) + (ne + k) as f64 + 8.0;
                ulps * U * f64::from(want_w[i]).abs() + f64::MIN_POSITIVE
            })
            .collect();
        worst.add_all(&got, &want_w, |i| tol[i]);
    }
    Ok(worst)
}

/// The routed experts' products against kernels-ref's matvec of each pair's expert (f32
/// inputs) or the CPU's integer matmul of it (`q8`: the inputs quantized on the GPU first),
/// over a stack split in two bindings; the 8-bit kernel also over a prompt's pairs (several
/// tiles of a hot expert, partial tiles, a pair list cut in chunks) and a token's.
pub(super) fn matvec_experts(
    ctx: &GpuContext,
    ks: &mut Kernels,
    key: KernelKey,
    ty: WeightFormat,
    q8: bool,
) -> Result<Worst> {
    let mut worst = Worst::new();
    let (n_expert, k) = (5usize, 2usize);
    let tokens: &[usize] = if q8 { &[45, 1] } else { &[3] };
    for (case, (rows, cols, grid)) in matrix_cases(ty).into_iter().enumerate() {
        let data = weights(ty, n_expert * rows, cols, 0x3e3e_1234 ^ case as u64)?;
        let row_bytes = data.len() / (n_expert * rows);
        let wd = oracle(kernels_ref::dequantize_vec(
            ty.ggml(),
            &data,
            n_expert * rows * cols,
        ))?;
        // The stack in two bindings, by whole experts (0..2, 2..5), as a large one is split.
        let split = 2usize;
        let parts = [
            (0usize, &data[..split * rows * row_bytes], split),
            (split, &data[split * rows * row_bytes..], n_expert - split),
        ];
        let mut mats = Vec::new();
        for &(_, bytes, ne) in &parts {
            mats.push(kernels::upload_matrix(
                ctx,
                &repack(ty, bytes, ne * rows, cols)?,
            )?);
        }
        for &n in tokens {
            let n_pairs = n * k;
            let mut rng = Rng(0x0e1d_5eed ^ (rows * 7 + cols + n) as u64);
            // Pair p's expert: spread over the stack (both parts), one expert twice for a
            // token; in a prompt expert 1 takes every third pair besides (a hot expert).
            let ids: Vec<u32> = (0..n_pairs)
                .map(|p| {
                    if n > 1 && q8 && p % 3 == 0 {
                        1
                    } else {
                        ((p * 3 + case) % n_expert) as u32
                    }
                })
                .collect(); // [n_pairs]
            let idb = kernels::upload_u32(ctx, "ids", &ids)?;
            // Gate and up read each token's input (x_div = k); down one input per pair.
            for x_div in [k, 1] {
                let n_x = n_pairs / x_div;
                let x = rng.values(n_x * cols, 2.0); // [n_x, cols]
                let mut want = vec![0f32; n_pairs * rows]; // [n_pairs, rows]
                let mut qa = QAct::default();
                if q8 {
                    qa.quantize_scalar(&x, n_x, cols);
                }
                for p in 0..n_pairs {
                    let e = ids[p] as usize;
                    let w = &data[e * rows * row_bytes..(e + 1) * rows * row_bytes];
                    let xr = &x[(p / x_div) * cols..(p / x_div + 1) * cols];
                    let out = &mut want[p * rows..(p + 1) * rows];
                    if q8 {
                        let view = WeightView::new(ty.ggml(), w, rows, cols)?;
                        crate::cpu::matmul(&view, xr, 1, out, &mut MatmulScratch::default())?;
                    } else {
                        oracle(kernels_ref::matvec(ty.ggml(), w, rows, cols, xr, out))?;
                    }
                }
                let tol: Vec<f64> = (0..n_pairs * rows)
                    .map(|i| {
                        let (p, r) = (i / rows, i % rows);
                        let wr = (ids[p] as usize * rows + r) * cols;
                        let xr = (p / x_div) * cols;
                        if q8 {
                            // As the integer matvec check: 2 (nc + 8) u Σ (|w| + 2|c|)
                            // (|x| + d_x) for the same chunk terms added in any order.
                            let s: f64 = (0..cols)
                                .map(|c| {
                                    let dx = f64::from(qa.d[(xr + c) / 32]);
                                    let off = block_offset(ty, &data, (wr + c) / 32);
                                    (f64::from(wd[wr + c]).abs() + 2.0 * off)
                                        * (f64::from(x[xr + c]).abs() + dx)
                                })
                                .sum();
                            2.0 * ((cols / 32) as f64 + 8.0) * U * s + f64::MIN_POSITIVE
                        } else {
                            // As the matvec check: (cols + 2) u Σ |w x| for any order.
                            let abs: f64 = (0..cols)
                                .map(|c| f64::from(wd[wr + c]).abs() * f64::from(x[xr + c]).abs())
                                .sum();
                            (cols as f64 + 2.0) * U * abs + f64::MIN_POSITIVE
                        }
                    })
                    .collect();
                let xb = kernels::upload_f32(ctx, "x", &x)?;
                let qxb = kernels::upload_u32(ctx, "qx", &vec![0u32; qx_words(n_x, cols)])?;
                let qdb = kernels::upload_f32(ctx, "qd", &vec![0f32; qd_vec4s(n_x, cols) * 4])?;
                let input = if q8 {
                    ExpertsInput::Q8 { qx: &qxb, qd: &qdb }
                } else {
                    ExpertsInput::F32(&xb)
                };
                let yb = poisoned(ctx, "y", &vec![f32::NAN; n_pairs * rows])?;
                if let Some(g) = grid {
                    ks.max_groups_per_dim = g;
                }
                let mut ds = Vec::new();
                if q8 {
                    let launch = ks.quantize_act_launch(&xb, &qxb, &qdb, n_x, cols)?;
                    ds.push(ks.prepare(ctx, launch)?);
                }
                for (m, &(e_lo, _, _)) in mats.iter().zip(&parts) {
                    let launch =
                        ks.matvec_experts_launch(m, rows, e_lo, &idb, input, &yb, n_pairs, x_div)?;
                    ds.push(prepare(ctx, ks, launch, key)?);
                }
                kernels::run(ctx, &ds.iter().collect::<Vec<_>>())?;
                let got = read_guarded(ctx, &yb, n_pairs * rows, &mut worst)?;
                worst.add_all(&got, &want, |i| tol[i]);
            }
        }
    }
    Ok(worst)
}

pub(super) fn moe_combine(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    // (tokens, width, used, shared expert: None, gated or not, small grid)
    for (n, d, k, shared, small) in [
        (1usize, 96usize, 8usize, None, false),
        (7, 200, 2, Some(true), false),
        (33, 64, 4, Some(true), true),
        (5, 80, 3, Some(false), false),
    ] {
        let mut rng = Rng(0x0c0b_1e00 ^ (n * 17 + d) as u64);
        let y = rng.values(n * k * d, 2.0); // [n * k, d]
        let w: Vec<f32> = (0..n * k).map(|_| rng.uniform() as f32).collect(); // [n, k]
        let sy = rng.values(n * d, 2.0); // [n, d]
        let sg = rng.values(n, 3.0); // [n]
        let mut want = vec![0f32; n * d]; // [n, d]
        let mut tol = vec![0f64; n * d];
        for t in 0..n {
            for c in 0..d {
                let (mut acc, mut abs) = (0f64, 0f64);
                for j in 0..k {
                    let v = f64::from(w[t * k + j]) * f64::from(y[(t * k + j) * d + c]);
                    acc += v;
                    abs += v.abs();
                }
                // k products and sums in f32: (2k + 1) u of the magnitudes.
                let mut e = (2 * k + 1) as f64 * U * abs;
                if shared == Some(false) {
                    let v = f64::from(sy[t * d + c]);
                    acc += v;
                    e += U * v.abs();
                }
                if shared == Some(true) {
                    let g = f64::from(sg[t]);
                    let s = 1.0 / (1.0 + (-g).exp());
                    let v = s * f64::from(sy[t * d + c]);
                    acc += v;
                    // exp within (3 + 2|g|) ulp, then the add, the division, the product
                    // and the sum: a few more roundings.
                    e += (2.0 * (3.0 + 2.0 * g.abs()) + 8.0) * U * v.abs();
                }
                want[t * d + c] = acc as f32;
                tol[t * d + c] = e + U * acc.abs() + f64::MIN_POSITIVE;
            }
        }
        let yb = kernels::upload_f32(ctx, "y", &y)?;
        let wb = kernels::upload_f32(ctx, "weights", &w)?;
        let syb = kernels::upload_f32(ctx, "shared y", &sy)?;
        let sgb = kernels::upload_f32(ctx, "shared gate", &sg)?;
        let ob = poisoned(ctx, "out", &vec![f32::NAN; n * d])?;
        let sh = shared.map(|gated| (&syb, gated.then_some(&sgb)));
        if small {
            let probe = ks.moe_combine_launch(&yb, &wb, sh, &ob, n, d, k)?;
            ks.max_groups_per_dim = small_grid(&[probe])?;
        }
        let launch = ks.moe_combine_launch(&yb, &wb, sh, &ob, n, d, k)?;
        let dsp = prepare(ctx, ks, launch, key)?;
        kernels::run(ctx, &[&dsp])?;
        let got = read_guarded(ctx, &ob, n * d, &mut worst)?;
        worst.add_all(&got, &want, |i| tol[i]);
    }
    Ok(worst)
}
