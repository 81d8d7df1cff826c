//! WGSL kernels on a real adapter against kernels-ref: matvec for every weight format and RMS
//! norm, on seeded random inputs with outliers, odd sizes, and NaN-poisoned outputs.
//!
//! Needs a GPU adapter (lavapipe is enough: `mesa-vulkan-drivers`; `WGPU_BACKEND=gl` tests the
//! portable GL path). With no adapter these tests FAIL: a GPU test must never pass silently.

mod common;
mod gpu_support;

use gpu_support::{context, random_weights, Rng, U};
use memwall::gpu::kernels::{self, KernelOptions, Kernels};
use memwall::gpu::{repack, DeviceSelector, GpuContext, WeightFormat};

/// The variants this adapter can run: always workgroup memory with u32-packed weights, plus
/// subgroups and native-f16 decoding (and both) where the adapter has them.
fn kernel_sets(ctx: &GpuContext) -> Vec<Kernels> {
    let mut v = Vec::new();
    for subgroup in [false, true] {
        for f16 in [false, true] {
            if (!subgroup || ctx.has_subgroups()) && (!f16 || ctx.has_f16()) {
                let opts = KernelOptions { subgroup, f16 };
                v.push(Kernels::with_config(ctx, opts).unwrap());
            }
        }
    }
    v
}

/// How far a weight decoded with native f16 arithmetic may be from the exact `w` (`m`: the
/// block's Q4_1 offset, else 0): Q4_0/Q8_0 round d * q once in f16, Q4_1 rounds d * q
/// (|d q| <= |w| + |m|) and then + m, at most an ulp (2^-10 relative) each; F16 widens exactly.
/// A result under the smallest normal f16 (2^-14) may be flushed: up to 2^-13 more per rounding.
fn f16_decode_err(ty: WeightFormat, w: f64, m: f64) -> f64 {
    let ulp = 1.0 / 1024.0;
    let flush = |v: f64| {
        if v < 2.0 / 16384.0 {
            2.0 / 16384.0
        } else {
            0.0
        }
    };
    let w = w.abs();
    match ty {
        WeightFormat::Q4_0 | WeightFormat::Q8_0 => ulp * w + flush(w),
        WeightFormat::Q4_1 => {
            ulp * (2.0 * w + m.abs()) * (1.0 + ulp) + flush(w + m.abs()) + flush(w)
        }
        WeightFormat::F16 => {
            if w < 1.0 / 16384.0 {
                w
            } else {
                0.0
            }
        }
        // No f16 decode variant (u32-packed only): exact.
        WeightFormat::Q4_K | WeightFormat::Q6_K | WeightFormat::F32 => 0.0,
    }
}

/// The portable kernels with at most `max` workgroups per dimension, so that the 2-D dispatch
/// tall matrices need (and the skipping of its surplus workgroups) runs on small inputs.
fn small_grid(ctx: &GpuContext, max: u32) -> Vec<Kernels> {
    let mut k = Kernels::with_options(ctx, false).unwrap();
    k.max_groups_per_dim = max;
    vec![k]
}

fn check_matvec(ctx: &GpuContext, ks: &[Kernels], ty: WeightFormat, rows: usize, cols: usize) {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15 ^ (rows * 31 + cols) as u64);
    let data = random_weights(&mut rng, ty.ggml(), rows, cols);
    check_matvec_data(ctx, ks, ty, &data, rows, cols);
}

/// Checks the GPU matvec of `data` (`[rows, cols]` of `ty`, ggml layout) against kernels-ref.
fn check_matvec_data(
    ctx: &GpuContext,
    ks: &[Kernels],
    ty: WeightFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
) {
    let label = |k: &Kernels| {
        format!(
            "{ty:?} [{rows}x{cols}] subgroup={} f16={} max_groups={}",
            k.subgroup, k.f16, k.max_groups_per_dim
        )
    };
    let g = ty.ggml();
    let mut rng = Rng(0x1234_5678 ^ (rows * 131 + cols) as u64);
    let x = rng.values(cols, 2.0);
    // Oracle: kernels-ref dequantizes each row to f32 and accumulates in f64.
    let mut want = vec![0f32; rows];
    kernels_ref::matvec(g, data, rows, cols, &x, &mut want).unwrap();
    let wd = kernels_ref::dequantize_vec(g, data, rows * cols).unwrap();
    // Tolerance: the shader computes each product in f32 (exact for the block formats, whose
    // weights d*q / d*q+m are f32 values the oracle computes the same way) and sums `cols` of
    // them in f32 in some order; the classic bound for any summation order is
    // |error| <= (cols - 1) * u * sum|w*x| (Higham's gamma_n, u = 2^-24), plus one rounding of
    // the result and of each product.
    let tol: Vec<f64> = (0..rows)
        .map(|r| {
            let abs: f64 = (0..cols)
                .map(|c| (f64::from(wd[r * cols + c]) * f64::from(x[c])).abs())
                .sum();
            (cols as f64 + 2.0) * U * abs + f64::MIN_POSITIVE
        })
        .collect();
    // Native-f16 decoding: each weight is off by up to f16_decode_err (times |x|), and the f32
    // bound above grows by the weights' relative change (at most 2 ulp of f16, 2^-9).
    let m_of = |i: usize| -> f64 {
        if ty != WeightFormat::Q4_1 {
            return 0.0;
        }
        // Q4_1 block: f16 d, f16 m, 16 code bytes.
        let g = i / 32;
        half::f16::from_le_bytes([data[g * 20 + 2], data[g * 20 + 3]]).to_f64()
    };
    let tol_f16: Vec<f64> = (0..rows)
        .map(|r| {
            let dec: f64 = (0..cols)
                .map(|c| {
                    let i = r * cols + c;
                    f16_decode_err(ty, f64::from(wd[i]), m_of(i)) * f64::from(x[c]).abs()
                })
                .sum();
            tol[r] * (1.0 + 1.0 / 512.0) + dec
        })
        .collect();

    let m = kernels::upload_matrix(ctx, &repack(ty, data, rows, cols).unwrap()).unwrap();
    let xb = kernels::upload_f32(ctx, "x", &x).unwrap();
    for k in ks {
        let tol = if k.f16 && ty.has_f16_variant() {
            &tol_f16
        } else {
            &tol
        };
        // Three guard elements past the end: they must stay NaN (no stray writes).
        let yb = kernels::upload_f32(ctx, "y", &vec![f32::NAN; rows + 3]).unwrap();
        let d = k.matvec(ctx, &m, &xb, &yb).unwrap();
        kernels::run(ctx, &[&d]).unwrap();
        let got = kernels::read_f32(ctx, &yb, rows + 3).unwrap();
        assert!(
            got[rows..].iter().all(|v| v.is_nan()),
            "{}: wrote past the end: {:?}",
            label(k),
            &got[rows..]
        );
        let (mut worst, mut worst_ratio, mut worst_err) = (0, 0f64, 0f64);
        for r in 0..rows {
            let err = (f64::from(got[r]) - f64::from(want[r])).abs();
            // NaN (an unwritten row) must fail: compare so that NaN gives the worst ratio.
            let ratio = if err.is_nan() {
                f64::INFINITY
            } else {
                err / tol[r]
            };
            if ratio > worst_ratio || r == 0 {
                (worst, worst_ratio, worst_err) = (r, ratio, err);
            }
        }
        eprintln!(
            "matvec {}: max err/tol {worst_ratio:.3e} (row {worst}: err {worst_err:.3e}, tol \
             {:.3e})",
            label(k),
            tol[worst]
        );
        assert!(
            worst_ratio <= 1.0,
            "{}: row {worst}: got {} want {} (err {worst_err:e} > tol {:e})",
            label(k),
            got[worst],
            want[worst],
            tol[worst]
        );
    }
}

#[test]
fn matvec_matches_kernels_ref() {
    let ctx = context();
    let ks = kernel_sets(&ctx);
    for ty in WeightFormat::ALL {
        // Rows not a multiple of the rows per workgroup (2) or the workgroup size; columns
        // from fewer blocks than invocations (96) to more than one stride of them (4128 = 129
        // blocks); the model's 576x1536 and 1536x576 shapes.
        let mut shapes: Vec<(usize, usize)> =
            vec![(37, 96), (1, 32), (576, 1536), (1536, 576), (3, 4128)];
        if ty.ggml().block_size() == 1 {
            // Float formats need no whole blocks: odd row lengths and partial last blocks.
            shapes.extend([(37, 37), (5, 1), (7, 101)]);
        }
        // K-quants need whole 256-column super-blocks: 96 and 32 become 256, 576 768, 4128
        // 4352 (17 super-blocks, 136 dq_block calls per row).
        let b = ty.ggml().block_size();
        for (rows, cols) in shapes {
            check_matvec(&ctx, &ks, ty, rows, cols.div_ceil(b) * b);
        }
        // 37 rows = 19 workgroups of 2 rows on a 7 x 3 grid (2 surplus workgroups).
        check_matvec(&ctx, &small_grid(&ctx, 7), ty, 37, 64usize.div_ceil(b) * b);
    }
}

#[test]
fn matvec_on_the_test_models_weights() {
    // Real weight distributions (and a tall 49152-row matrix: 24576 workgroups) from the test
    // model; fails, like every model test, when the model is missing.
    let path = memwall::engine::default_model_path();
    let g = memwall::gguf::Gguf::open(&path).unwrap_or_else(|e| {
        panic!(
            "test model {}: {e} (run scripts/fetch-model.sh)",
            path.display()
        )
    });
    let ctx = context();
    let ks = kernel_sets(&ctx);
    for name in [
        "blk.0.attn_q.weight",
        "blk.0.ffn_down.weight",
        "blk.29.ffn_gate.weight",
        "token_embd.weight",
    ] {
        let t = g.require_tensor(name).unwrap();
        let ty = WeightFormat::from_ggml(t.ty).unwrap();
        let cols = t.dims[0] as usize;
        let rows = (t.n_elements / t.dims[0]) as usize;
        check_matvec_data(&ctx, &ks, ty, g.tensor_data(t), rows, cols);
    }
}

#[test]
fn rms_norm_matches_kernels_ref() {
    let ctx = context();
    let eps = 1e-5f32;
    // The last case runs 23 rows on a 5 x 5 grid (two surplus workgroups).
    for (n_rows, n, max_groups) in [
        (1, 576, 0),
        (3, 37, 0),
        (5, 1, 0),
        (2, 4099, 0),
        (23, 64, 5),
    ] {
        let ks = if max_groups == 0 {
            kernel_sets(&ctx)
        } else {
            small_grid(&ctx, max_groups)
        };
        let mut rng = Rng(0x5eed ^ (n_rows * 7919 + n) as u64);
        let x = rng.values(n_rows * n, 2.0);
        let weight = rng.values(n, 2.0);
        let mut want = vec![0f32; n_rows * n];
        kernels_ref::rms_norm(&x, &weight, eps, &mut want);
        let xb = kernels::upload_f32(&ctx, "x", &x).unwrap();
        let wb = kernels::upload_f32(&ctx, "weight", &weight).unwrap();
        // Tolerance, relative to |want|: the f32 sum of n squares has relative error <= n*u;
        // the mean-square's error halves through the square root; WGSL allows 2.5 ulp for the
        // division and the sqrt's (1/inverseSqrt) error is inherited, and two more roundings
        // for the products. So (n/2 + 8) * u relative, plus an absolute floor for zeros.
        let rel = (n as f64 / 2.0 + 8.0) * U;
        for k in &ks {
            let ob = kernels::upload_f32(&ctx, "out", &vec![f32::NAN; n_rows * n + 3]).unwrap();
            let d = k.rms_norm(&ctx, &xb, &wb, &ob, n, n_rows, eps).unwrap();
            kernels::run(&ctx, &[&d]).unwrap();
            let got = kernels::read_f32(&ctx, &ob, n_rows * n + 3).unwrap();
            assert!(
                got[n_rows * n..].iter().all(|v| v.is_nan()),
                "wrote past the end"
            );
            let (mut worst, mut worst_ratio) = (0, 0f64);
            for i in 0..n_rows * n {
                let tol = rel * f64::from(want[i]).abs() + 1e-30;
                let err = (f64::from(got[i]) - f64::from(want[i])).abs();
                let ratio = if err.is_nan() {
                    f64::INFINITY
                } else {
                    err / tol
                };
                if ratio > worst_ratio || i == 0 {
                    (worst, worst_ratio) = (i, ratio);
                }
            }
            eprintln!(
                "rms_norm [{n_rows}x{n}] subgroup={} max_groups={}: max err/tol \
                 {worst_ratio:.3e} at {worst}",
                k.subgroup, k.max_groups_per_dim
            );
            assert!(
                worst_ratio <= 1.0,
                "rms_norm [{n_rows}x{n}] subgroup={} max_groups={}: index {worst}: got {} want {}",
                k.subgroup,
                k.max_groups_per_dim,
                got[worst],
                want[worst]
            );
        }
    }
}

#[test]
fn bad_selector_is_an_error_not_a_panic() {
    // Needs the adapter list to be non-empty to mean anything, so it runs with the others.
    let _ = context();
    let e = GpuContext::new(&DeviceSelector::Index(10_000)).unwrap_err();
    assert!(e.to_string().contains("no adapter"), "{e}");
    let e = GpuContext::new(&DeviceSelector::Name("no such adapter zz".into())).unwrap_err();
    assert!(e.to_string().contains("no adapter name"), "{e}");
    assert_eq!(DeviceSelector::parse("auto").unwrap(), DeviceSelector::Auto);
    assert_eq!(DeviceSelector::parse("GPU").unwrap(), DeviceSelector::Auto);
    assert_eq!(
        DeviceSelector::parse("1").unwrap(),
        DeviceSelector::Index(1)
    );
    assert_eq!(
        DeviceSelector::parse("LLVMpipe").unwrap(),
        DeviceSelector::Name("llvmpipe".into())
    );
}

#[test]
fn gpu_errors_are_values() {
    let ctx = context();
    // A wgpu validation error (a buffer mapped at creation must have a size that is a
    // multiple of 4, whatever the features) comes back from the error scope as Error::Gpu
    // instead of reaching wgpu's default panicking handler.
    let r = ctx.scoped("bad buffer", || {
        Ok(ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("bad"),
            size: 6,
            usage: wgpu::BufferUsages::STORAGE,
            mapped_at_creation: true,
        }))
    });
    let Err(e) = r else {
        panic!("invalid buffer usage must be an error");
    };
    assert!(matches!(e, memwall::Error::Gpu(_)), "{e}");
    // The device stays usable afterwards, and nothing was left for the uncaptured handler.
    ctx.check_uncaptured("after bad buffer").unwrap();
    // Undersized operands are refused before any GPU work.
    let ks = Kernels::new(&ctx).unwrap();
    let data = kernels_ref::quantize(kernels_ref::GgmlType::Q8_0, &[0.5; 64]).unwrap();
    let m =
        kernels::upload_matrix(&ctx, &repack(WeightFormat::Q8_0, &data, 1, 64).unwrap()).unwrap();
    let x = kernels::upload_f32(&ctx, "x", &[1.0; 32]).unwrap();
    let y = kernels::upload_f32(&ctx, "y", &[0.0; 1]).unwrap();
    assert!(matches!(
        ks.matvec(&ctx, &m, &x, &y),
        Err(memwall::Error::Gpu(_))
    ));
}
