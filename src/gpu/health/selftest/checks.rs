//! One check per kernel: seeded inputs with outliers and odd sizes (not multiples of the
//! workgroup, the rows per workgroup or the block), one case on a small grid so the 2-D
//! dispatch and the skipping of its surplus workgroups run, outputs poisoned with NaN, and
//! kernels-ref as the oracle. Each tolerance is derived where it is computed.

use kernels_ref::RefError;

use super::{poisoned, prepare, read_guarded, run_read, Rng, Worst, U};
use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::ops::{rope_freqs, RopeConfig};
use crate::gpu::kernels::{self, Kernels};
use crate::gpu::registry::{KernelKey, WeightFormat};
use crate::gpu::repack::repack;

pub(crate) fn oracle<T>(r: std::result::Result<T, RefError>) -> Result<T> {
    r.map_err(|e| Error::Gpu(format!("kernels-ref: {e}")))
}

/// `[rows, cols]` seeded weights in `ty` (ggml layout). Formats kernels-ref can quantize are
/// quantized from [`Rng::values`] (outliers included). The K-quants, which memwall only reads,
/// are random bytes (every code and sub-scale bit pattern, so every decoding branch runs) with
/// their f16 super-scales set to finite normal values in [0.001, 0.05]: a random f16 could be
/// NaN or infinite, which no oracle comparison survives.
pub(crate) fn weights(ty: WeightFormat, rows: usize, cols: usize, seed: u64) -> Result<Vec<u8>> {
    let mut rng = Rng(seed ^ (rows * 31 + cols) as u64);
    let g = ty.ggml();
    if kernels_ref::can_quantize(g) {
        return oracle(kernels_ref::quantize(g, &rng.values(rows * cols, 2.0)));
    }
    // Byte offsets of the f16 scale fields in one block: Q4_K's d and dmin, Q6_K's d.
    let halves: &[usize] = match ty {
        WeightFormat::Q4_K => &[0, 2],
        WeightFormat::Q6_K => &[208],
        WeightFormat::F32
        | WeightFormat::F16
        | WeightFormat::Q4_0
        | WeightFormat::Q4_1
        | WeightFormat::Q8_0 => {
            return Err(Error::Gpu(format!(
                "selftest cannot make {} weights",
                g.name()
            )))
        }
    };
    let row_bytes = g
        .row_bytes(cols as u64)
        .filter(|_| cols.is_multiple_of(g.block_size()))
        .ok_or_else(|| Error::Gpu(format!("{} rows of {cols} columns", g.name())))?;
    let mut v: Vec<u8> = (0..row_bytes as usize * rows)
        .map(|_| (rng.uniform() * 256.0) as u8)
        .collect();
    for block in v.chunks_exact_mut(g.type_size()) {
        for &at in halves {
            let d = 0.001 + 0.049 * rng.uniform();
            let h = kernels_ref::f32_to_f16(d as f32).to_le_bytes();
            if let Some(b) = block.get_mut(at..at + 2) {
                b.copy_from_slice(&h);
            }
        }
    }
    Ok(v)
}

/// Smallest normal f16: below it a result may be subnormal or flushed to zero.
const F16_MIN_NORMAL: f64 = 1.0 / (1u32 << 14) as f64;
/// One ulp of f16 relative to the value (10 fraction bits). WGSL requires f16 products and sums
/// to be correctly rounded; a whole ulp also covers rounding toward zero.
const F16_ULP: f64 = 1.0 / (1u32 << 10) as f64;

/// Bound on how far each weight decoded by a native-f16 kernel (`key.uses_f16()`) may be from
/// its exact value `wd[i]` (kernels-ref's f32 dequantization): zeros for the other kernels.
/// - Q4_0, Q8_0: `d * q` rounds once in f16 (q is a small integer, exact in f16): one ulp.
/// - Q4_1: `d * q + m` rounds twice (once if contracted): an ulp of |d q| <= |w| + |m| and an
///   ulp of |w|.
/// - F16: widening to f32 is exact.
///
/// Any of these results below the smallest normal f16 may be flushed to zero, which costs up
/// to its magnitude (bounded by the smallest normal): that absolute term is added for each
/// rounding whose operand is that small.
pub(crate) fn f16_weight_err(
    key: &KernelKey,
    ty: WeightFormat,
    data: &[u8],
    wd: &[f32],
    cols: usize,
) -> Vec<f64> {
    if !key.uses_f16() {
        return vec![0.0; wd.len()];
    }
    let tiny = |v: f64| {
        if v < 2.0 * F16_MIN_NORMAL {
            2.0 * F16_MIN_NORMAL
        } else {
            0.0
        }
    };
    let block = ty.ggml().type_size();
    let blocks_per_row = cols / ty.ggml().block_size().max(1);
    wd.iter()
        .enumerate()
        .map(|(i, &w)| {
            let w = f64::from(w).abs();
            match ty {
                WeightFormat::Q4_0 | WeightFormat::Q8_0 => F16_ULP * w + tiny(w),
                WeightFormat::Q4_1 => {
                    // Block g's m is the f16 after its f16 d.
                    let g = (i / cols) * blocks_per_row + (i % cols) / 32;
                    let m = data
                        .get(g * block + 2..g * block + 4)
                        .map_or(f64::INFINITY, |b| {
                            f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32()).abs()
                        });
                    let dq = w + m;
                    F16_ULP * (dq + w) * (1.0 + F16_ULP) + tiny(dq) + tiny(w)
                }
                WeightFormat::F16 => {
                    if w < F16_MIN_NORMAL {
                        w
                    } else {
                        0.0
                    }
                }
                // No f16 decode variant: exact.
                WeightFormat::Q4_K | WeightFormat::Q6_K | WeightFormat::F32 => 0.0,
            }
        })
        .collect()
}

/// Matrix shapes (rows, cols, grid limit): rows not a multiple of the rows per workgroup,
/// columns from fewer blocks than invocations to more than one stride of them (129 blocks;
/// the K-quants, whose rows are whole 256-column super-blocks, 8 to 136 blocks and an odd
/// number of super-blocks in all, so Q6_K's last scale pair is half empty), and for the float
/// formats row lengths that end in a partial block.
pub(super) fn matrix_cases(ty: WeightFormat) -> Vec<(usize, usize, Option<u32>)> {
    if ty.ggml().block_size() == 256 {
        return vec![(37, 256, None), (3, 4352, None), (37, 768, Some(7))];
    }
    let mut v = vec![(37, 96, None), (3, 4128, None), (37, 64, Some(7))];
    if ty.ggml().block_size() == 1 {
        v.extend([(7, 101, None), (5, 1, None)]);
    }
    v
}

pub(super) fn matvec(
    ctx: &GpuContext,
    ks: &mut Kernels,
    key: KernelKey,
    ty: WeightFormat,
) -> Result<Worst> {
    let mut worst = Worst::new();
    for (rows, cols, grid) in matrix_cases(ty) {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let data = weights(ty, rows, cols, 0x9e37_79b9_7f4a_7c15)?;
        let x = Rng(0x1234_5678 ^ cols as u64).values(cols, 2.0);
        let mut want = vec![0f32; rows]; // [rows]
        oracle(kernels_ref::matvec(
            ty.ggml(),
            &data,
            rows,
            cols,
            &x,
            &mut want,
        ))?;
        let wd = oracle(kernels_ref::dequantize_vec(ty.ggml(), &data, rows * cols))?;
        let we = f16_weight_err(&key, ty, &data, &wd, cols);
        // Each product w*x is exact or one f32 rounding (the block formats' weights are f32
        // values computed as the oracle does), and `cols` of them are summed in f32 in some
        // order: |error| <= (cols - 1) u sum|w x| for any order (Higham's gamma_n), plus the
        // products' and the result's roundings: (cols + 2) u sum|w x|. A native-f16 kernel's
        // weights are each off by up to we[i] (scaled by |x|), and are up to 2^-9 larger.
        let tol: Vec<f64> = (0..rows)
            .map(|r| {
                let (mut abs, mut dec) = (0.0, 0.0);
                for c in 0..cols {
                    let xa = f64::from(x[c]).abs();
                    abs += f64::from(wd[r * cols + c]).abs() * xa;
                    dec += we[r * cols + c] * xa;
                }
                (cols as f64 + 2.0) * U * abs * (1.0 + 2.0 * F16_ULP) + dec + f64::MIN_POSITIVE
            })
            .collect();
        let m = kernels::upload_matrix(ctx, &repack(ty, &data, rows, cols)?)?;
        let xb = kernels::upload_f32(ctx, "x", &x)?;
        let yb = poisoned(ctx, "y", &vec![f32::NAN; rows])?;
        let d = prepare(ctx, ks, ks.matvec_launch(&m, &xb, &yb)?, key)?;
        let got = run_read(ctx, &d, &yb, rows, &mut worst)?;
        worst.add_all(&got, &want, |r| tol[r]);
    }
    Ok(worst)
}

pub(super) fn embedding(
    ctx: &GpuContext,
    ks: &mut Kernels,
    key: KernelKey,
    ty: WeightFormat,
) -> Result<Worst> {
    let mut worst = Worst::new();
    for (rows, cols, grid) in matrix_cases(ty) {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let table = weights(ty, rows, cols, 0x0e3b)?;
        let last = rows as u32 - 1;
        // Repeats, the last row, and two ids past the end (rows of zeros).
        let mut ids = vec![0, last, 1 % rows as u32, last, rows as u32, u32::MAX, 0];
        if grid.is_some() {
            // More tokens than the grid limit: a 2-D dispatch.
            ids.extend((0..23).map(|i| (i * 7) % rows as u32));
        }
        let n = ids.len() * cols;
        let wd = oracle(kernels_ref::dequantize_vec(ty.ggml(), &table, rows * cols))?;
        let we = f16_weight_err(&key, ty, &table, &wd, cols);
        let mut want = vec![0f32; n]; // [ids, cols]
        for (t, &id) in ids.iter().enumerate() {
            if (id as usize) < rows {
                let out = &mut want[t * cols..(t + 1) * cols];
                oracle(kernels_ref::embedding(
                    ty.ggml(),
                    &table,
                    cols,
                    id as usize,
                    out,
                ))?;
            }
        }
        // Q8_0, F16 and F32 values are one f32 product (or exact), as in the oracle; Q4_1's
        // d * q + m may be contracted to an fma, which differs by at most one rounding of
        // d * q (|d q| = |w - m| <= 2 max|w| of the row, m being the value of code 0) plus
        // the final rounding: 3u max|w| of the row. A native-f16 kernel's values are off by up
        // to the decoding bound instead (their widening to f32 is exact). The K-quants' values
        // must equal the oracle's: every product in their decoding is exact in f32 (f16 scales
        // of 11 significant bits times 6- or 8-bit sub-scales times 4- or 6-bit codes) and
        // only Q4_K's final subtraction rounds, once, as the oracle's does, fused or not.
        let exact = matches!(ty, WeightFormat::Q4_K | WeightFormat::Q6_K);
        let row_max: Vec<f64> = want
            .chunks_exact(cols)
            .map(|r| r.iter().map(|v| f64::from(*v).abs()).fold(0.0, f64::max))
            .collect();
        let m = kernels::upload_matrix(ctx, &repack(ty, &table, rows, cols)?)?;
        let idb = kernels::upload_u32(ctx, "ids", &ids)?;
        let ob = poisoned(ctx, "out", &vec![f32::NAN; n])?;
        let d = prepare(ctx, ks, ks.embedding_launch(&m, &idb, &ob, ids.len())?, key)?;
        let got = run_read(ctx, &d, &ob, n, &mut worst)?;
        worst.add_all(&got, &want, |i| {
            let id = ids[i / cols] as usize;
            let dec = if id < rows {
                we[id * cols + i % cols]
            } else {
                0.0
            };
            if exact {
                0.0
            } else {
                3.0 * U * row_max[i / cols] + dec + f64::MIN_POSITIVE
            }
        });
    }
    Ok(worst)
}

pub(super) fn rms_norm(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    let eps = 1e-5f32;
    for (n_rows, n, grid) in [
        (3, 37, None),
        (2, 4099, None),
        (5, 1, None),
        (23, 64, Some(5)),
    ] {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let mut rng = Rng(0x5eed ^ (n_rows * 7919 + n) as u64);
        let x = rng.values(n_rows * n, 2.0); // [n_rows, n]
        let weight = rng.values(n, 2.0); // [n]
        let mut want = vec![0f32; n_rows * n];
        for (xr, wr) in x.chunks_exact(n).zip(want.chunks_exact_mut(n)) {
            kernels_ref::rms_norm(xr, &weight, eps, wr);
        }
        // Relative to |want|: the f32 sum of n squares is off by <= n u relative, which
        // halves through the square root; the division may be 2.5 ulp off and the sqrt's
        // error is inherited; two more roundings for the products: (n / 2 + 8) u.
        let rel = (n as f64 / 2.0 + 8.0) * U;
        let xb = kernels::upload_f32(ctx, "x", &x)?;
        let wb = kernels::upload_f32(ctx, "weight", &weight)?;
        let ob = poisoned(ctx, "out", &vec![f32::NAN; n_rows * n])?;
        let launch = ks.rms_norm_launch(&xb, &wb, &ob, n, n_rows, eps)?;
        let d = prepare(ctx, ks, launch, key)?;
        let got = run_read(ctx, &d, &ob, n_rows * n, &mut worst)?;
        worst.add_all(&got, &want, |i| rel * f64::from(want[i]).abs() + 1e-30);
    }
    Ok(worst)
}

pub(super) fn softmax(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    for (n_rows, n, grid) in [(9, 37, None), (2, 4099, None), (7, 130, Some(4))] {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let mut x = Rng(0x50f7 ^ (n_rows * 977 + n) as u64).values(n_rows * n, 3.0);
        if grid.is_some() {
            // Causal-style masking, and a fully masked first row (all zeros out).
            for (i, v) in x.iter_mut().enumerate() {
                let (r, c) = (i / n, i % n);
                if r == 0 || c > 10 * r + 5 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        let mut want = x.clone(); // [n_rows, n]
        for row in want.chunks_exact_mut(n) {
            kernels_ref::softmax(row);
        }
        // Relative to |want|: exp(x - max) is (3 + 2|d|) ulp off (WGSL/Vulkan) plus the
        // subtraction's rounding amplified by |d| (d = x - max), for the entry and for the
        // largest |d| of the row's sum; the f32 sum of n positive terms adds n u; the division
        // 2.5 ulp. A masked entry (or a fully masked row) must be exactly 0; WGSL may flush
        // subnormal outputs to 0, hence the floor of twice the smallest normal.
        let tol = |i: usize| {
            let row = &x[i / n * n..(i / n + 1) * n];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            if !x[i].is_finite() || !m.is_finite() {
                return 0.0;
            }
            let dmax = row
                .iter()
                .filter(|v| v.is_finite())
                .map(|&v| f64::from(m) - f64::from(v))
                .fold(0.0, f64::max);
            let d = f64::from(m) - f64::from(x[i]);
            let rel = (8.0 + 3.0 * d + 3.0 * dmax + n as f64 + 3.0) * U;
            rel * f64::from(want[i]).abs() + 2.0 * f64::from(f32::MIN_POSITIVE)
        };
        let xb = poisoned(ctx, "x", &x)?;
        let launch = ks.softmax_launch(&xb, n, n_rows)?;
        let d = prepare(ctx, ks, launch, key)?;
        let got = run_read(ctx, &d, &xb, n_rows * n, &mut worst)?;
        worst.add_all(&got, &want, tol);
    }
    Ok(worst)
}

pub(super) fn rope(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    // (n_tokens, n_heads, head_dim, n_rot, pos0, base, scale, neox, grid, n_heads2): 64-dim
    // heads, partial rotation, odd head counts, positions near 4000, a scaled context; the
    // first and last also rotate a second buffer of n_heads2 heads in the same launch (the
    // queries and keys of a decode step).
    let cases = [
        (
            3usize, 9usize, 64usize, 64usize, 0usize, 1e4f32, 1f32, false, None, 3usize,
        ),
        (2, 7, 80, 34, 4001, 1e4, 1.0, true, None, 0),
        (7, 5, 128, 96, 2047, 5e5, 0.5, false, Some(7u32), 2),
    ];
    for (n_tokens, n_heads, head_dim, n_rot, pos0, base, scale, neox, grid, n_heads2) in cases {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let cfg = RopeConfig {
            n_heads,
            head_dim,
            n_rot,
            freq_base: base,
            freq_scale: scale,
            neox,
            mscale: 1.0,
        };
        // [n_tokens, heads, head_dim] inputs of x (n_heads) and x2 (n_heads2)
        let parts: Vec<(usize, Vec<f32>)> = [n_heads, n_heads2]
            .iter()
            .filter(|&&h| h > 0)
            .map(|&h| {
                let n = n_tokens * h * head_dim;
                (h, Rng(0x0a0e ^ (n * 31 + pos0) as u64).values(n, 2.0))
            })
            .collect();
        let bufs = parts
            .iter()
            .map(|(_, x)| poisoned(ctx, "x", x))
            .collect::<Result<Vec<_>>>()?;
        let fb = kernels::upload_f32(ctx, "freqs", &rope_freqs(&cfg, None))?;
        let launch = if n_heads2 > 0 {
            ks.rope_pair_launch(&bufs[0], &bufs[1], n_heads2, &fb, &cfg, n_tokens, pos0)?
        } else {
            ks.rope_launch(&bufs[0], &fb, &cfg, n_tokens, pos0)?
        };
        let d = prepare(ctx, ks, launch, key)?;
        kernels::run(ctx, &[&d])?;
        for ((h, x), b) in parts.iter().zip(&bufs) {
            let h = *h;
            let mut want = x.clone();
            for (t, tok) in want.chunks_exact_mut(h * head_dim).enumerate() {
                let r = kernels_ref::Rotation::new(n_rot, base, neox).scaled(scale);
                kernels_ref::rope(tok, h, head_dim, pos0 + t, &r);
            }
            let tol = rope_tolerance(x, h, &cfg, pos0);
            let got = read_guarded(ctx, b, x.len(), &mut worst)?;
            worst.add_all(&got, &want, tol);
        }
    }
    Ok(worst)
}

/// The tolerance of element j of RoPE's output for input `x`: [n_tokens, n_heads, head_dim]
/// rotated from position `pos0` under `cfg` (the selftest and tests/gpu_ops.rs check with it).
/// For pair (a, b) at angle theta = pos * f_i: the f32 frequency is off by u relative and
/// pos * f_i rounds once more (2u theta); the Cody-Waite reduction adds <= 4u (pi + 1) (its
/// k * TAU_HI is exact); the driver's sin/cos may be 2^-21 off on [-pi, pi]. An angle off by e
/// moves the output by <= e (|a| + |b|), four roundings of products and sums add 4u (|a| + |b|),
/// and `mscale` multiplies the error and adds one rounding of cos and sin. Unrotated dims must
/// be exact.
pub fn rope_tolerance<'a>(
    x: &'a [f32],
    n_heads: usize,
    cfg: &RopeConfig,
    pos0: usize,
) -> impl Fn(usize) -> f64 + 'a {
    let (head_dim, n_rot, neox) = (cfg.head_dim, cfg.n_rot, cfg.neox);
    let (base, scale, mscale) = (cfg.freq_base, cfg.freq_scale, cfg.mscale);
    move |j: usize| {
        let head = j / head_dim * head_dim;
        let dim = j % head_dim;
        if dim >= n_rot {
            return f64::MIN_POSITIVE;
        }
        let half = n_rot / 2;
        let (i, ia, ib) = if neox {
            (dim % half, head + dim % half, head + dim % half + half)
        } else {
            (dim / 2, head + dim / 2 * 2, head + dim / 2 * 2 + 1)
        };
        let t = j / (n_heads * head_dim);
        let f = f64::from(scale) * f64::from(base).powf(-2.0 * i as f64 / n_rot as f64);
        let theta = (pos0 + t) as f64 * f;
        let ab = f64::from(x[ia]).abs() + f64::from(x[ib]).abs();
        let angle =
            2.0 * U * theta + 4.0 * U * (std::f64::consts::PI + 1.0) + 1.0 / f64::from(1u32 << 21);
        (angle + 5.0 * U) * ab * f64::from(mscale) + f64::MIN_POSITIVE
    }
}

/// Sizes of the element-wise checks; the last runs on a small grid.
const ELEMENTWISE: [(usize, Option<u32>); 3] = [(37, None), (4099, None), (1500, Some(5))];

/// The tolerance of one SwiGLU output `want` from gate value `g` (see [`swiglu`]).
pub(super) fn swiglu_tol(g: f32, want: f32) -> f64 {
    let g = f64::from(g);
    let w = f64::from(want).abs();
    let rel = (8.0 + 2.0 * g.abs()) * U * w;
    if 1.0 + (-g).exp() >= 2f64.powi(126) {
        w + rel + 1e-37
    } else {
        rel + 1e-37
    }
}

pub(super) fn swiglu(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    for (n, grid) in ELEMENTWISE {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let mut rng = Rng(0x5a1 ^ n as u64);
        // Gate outliers past +-88 overflow exp(-g).
        let gate = rng.values(n, 4.0); // [n]
        let up = rng.values(n, 2.0); // [n]
        let mut want = vec![0f32; n];
        kernels_ref::swiglu(&gate, &up, &mut want);
        // Relative to |want|: exp may be (3 + 2|g|) ulp off, then 1 + e, the division (2.5
        // ulp) and the product: (8 + 2|g|) u (1 + e's relative error is at most e's). The
        // division's precision is only specified for divisors up to 2^126 (WGSL, Vulkan);
        // past that (g < -87.3) it may flush, so up to |want| itself (< 1e-35 there) is
        // allowed.
        let tol = |i: usize| swiglu_tol(gate[i], want[i]);
        let gb = poisoned(ctx, "gate", &gate)?;
        let ub = kernels::upload_f32(ctx, "up", &up)?;
        let d = prepare(ctx, ks, ks.elementwise_launch(key, &gb, &ub, n)?, key)?;
        let got = run_read(ctx, &d, &gb, n, &mut worst)?;
        worst.add_all(&got, &want, tol);
    }
    Ok(worst)
}

pub(super) fn add(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    for (n, grid) in ELEMENTWISE {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let mut rng = Rng(0xadd ^ n as u64);
        let a = rng.values(n, 4.0); // [n]
        let b = rng.values(n, 2.0); // [n]
        let mut want = vec![0f32; n];
        kernels_ref::add(&a, &b, &mut want);
        let ab = poisoned(ctx, "x", &a)?;
        let bb = kernels::upload_f32(ctx, "y", &b)?;
        let d = prepare(ctx, ks, ks.elementwise_launch(key, &ab, &bb, n)?, key)?;
        let got = run_read(ctx, &d, &ab, n, &mut worst)?;
        // f32 addition is correctly rounded everywhere: exact.
        worst.add_all(&got, &want, |_| 0.0);
        // Scaled (granite's residual branches): s * y rounded then added, or fused into one
        // multiply-add by the compiler: within one rounding of each.
        let s = 0.2197f32;
        kernels_ref::add_scaled(&a, &b, s, &mut want);
        let ab = poisoned(ctx, "x", &a)?;
        let d = prepare(ctx, ks, ks.add_scaled_launch(&ab, &bb, s, n)?, key)?;
        let got = run_read(ctx, &d, &ab, n, &mut worst)?;
        let ulp = f64::from(f32::EPSILON);
        worst.add_all(&got, &want, |i| {
            ulp * (f64::from(a[i].abs()) + f64::from((s * b[i]).abs()))
        });
        // The scale mode (granite's logits): one correctly rounded product, exact; its
        // second binding is not read (a one-value buffer here).
        let mut want = a.clone();
        kernels_ref::scale(&mut want, s);
        let ab = poisoned(ctx, "x", &a)?;
        let unread = kernels::upload_f32(ctx, "unread", &[f32::NAN])?;
        let d = prepare(ctx, ks, ks.scale_launch(&ab, &unread, s, n)?, key)?;
        let got = run_read(ctx, &d, &ab, n, &mut worst)?;
        worst.add_all(&got, &want, |_| 0.0);
    }
    Ok(worst)
}

/// The oracle kernels-ref does not have: first index of the largest non-NaN value
/// (`u32::MAX` when there is none).
fn argmax_ref(row: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(u32::MAX, |(i, _)| i as u32)
}

pub(super) fn argmax(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    for (n_rows, n, grid) in [(5usize, 4099usize, None), (9, 37, Some(4u32))] {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let mut x = Rng(0xa46 ^ n as u64).values(n_rows * n, 3.0); // [n_rows, n]
                                                                   // Row 1: the maximum tied at three far-apart indices (the lowest wins); row 2: all
                                                                   // equal; row 3: NaNs and the maximum at the end; row 4: values on a few levels.
        for c in [n - 2, n / 3, n / 2] {
            x[n + c] = 1000.0;
        }
        x[2 * n..3 * n].fill(-2.5);
        for c in (0..n).step_by(11) {
            x[3 * n + c] = f32::NAN;
        }
        x[4 * n - 1] = 1000.0;
        for v in &mut x[4 * n..5 * n] {
            *v = v.round().min(3.0);
        }
        let want: Vec<u32> = x.chunks_exact(n).map(argmax_ref).collect();
        let xb = kernels::upload_f32(ctx, "x", &x)?;
        let ob = poisoned(ctx, "idx", &vec![f32::NAN; n_rows])?;
        let d = prepare(ctx, ks, ks.argmax_launch(&xb, &ob, n, n_rows)?, key)?;
        let got = run_read(ctx, &d, &ob, n_rows, &mut worst)?;
        // Indices must match exactly (the error is the index distance).
        for (g, w) in got.iter().zip(&want) {
            worst.add(f64::from(g.to_bits()), f64::from(*w), 0.0);
        }
    }
    Ok(worst)
}
