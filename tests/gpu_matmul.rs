//! The tiled prefill matmul (`shaders/matrix/tiles.wgsl`) on a real adapter against kernels-ref's
//! `matmul`: every weight format, shapes that are not multiples of the tile (rows, tokens, and
//! for F16/F32 columns not a multiple of 32), outputs written at a row offset inside a wider
//! NaN-poisoned `y` (everything else must stay NaN), a matrix split by rows writing one output,
//! a tiny dispatch grid, and the test model's real weights.
//!
//! Needs a GPU adapter (lavapipe, or `WGPU_BACKEND=gl` for the portable path); FAILS without.

mod common;
mod gpu_support;

use gpu_support::{context, random_weights, Rng, U};
use memwall::gpu::kernels::{self, GpuMatrix, Kernels};
use memwall::gpu::{repack, GpuContext, WeightFormat};

/// Both reductions where the adapter has subgroups (matmul itself uses none, but each context
/// compiles its own pipelines and both must work).
fn kernel_sets(ctx: &GpuContext) -> Vec<Kernels> {
    let mut v = vec![Kernels::with_options(ctx, false).unwrap()];
    if ctx.has_subgroups() {
        v.push(Kernels::with_options(ctx, true).unwrap());
    }
    v
}

/// The portable kernels with at most `max` workgroups per dimension (2-D dispatch with
/// surplus workgroups on small inputs).
fn small_grid(ctx: &GpuContext, max: u32) -> Vec<Kernels> {
    let mut k = Kernels::with_options(ctx, false).unwrap();
    k.max_groups_per_dim = max;
    vec![k]
}

/// Where the product lands in `y`: `[n_tokens, y_stride]`, weight row r at column
/// `row_offset + r`.
#[derive(Clone, Copy, Debug)]
struct Out {
    n_tokens: usize,
    y_stride: usize,
    row_offset: usize,
}

impl Out {
    fn dense(rows: usize, n_tokens: usize) -> Out {
        Out {
            n_tokens,
            y_stride: rows,
            row_offset: 0,
        }
    }
}

/// kernels-ref's product `[n, rows]` and, per element, the tolerance: the shader forms each
/// product w*x in f32 (the block formats' weights are the same f32 values the oracle
/// dequantizes) and sums `cols` of them in f32, so Higham's bound for any summation order,
/// (cols - 1) * u * sum|w x|, plus one rounding of each product and of the result.
fn oracle(
    ty: WeightFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n: usize,
) -> (Vec<f32>, Vec<f64>) {
    let g = ty.ggml();
    let mut want = vec![0f32; n * rows];
    kernels_ref::matmul(g, data, rows, cols, x, n, &mut want).unwrap();
    let wd = kernels_ref::dequantize_vec(g, data, rows * cols).unwrap();
    let mut tol = vec![0f64; n * rows];
    for t in 0..n {
        let xt = &x[t * cols..][..cols];
        for r in 0..rows {
            let abs: f64 = wd[r * cols..][..cols]
                .iter()
                .zip(xt)
                .map(|(w, x)| (f64::from(*w) * f64::from(*x)).abs())
                .sum();
            tol[t * rows + r] = (cols as f64 + 2.0) * U * abs + f64::MIN_POSITIVE;
        }
    }
    (want, tol)
}

/// Checks `got` (`y` read back, `[n_tokens, y_stride]` plus guard elements) against the
/// oracle: the written window within tolerance (a NaN fails), everything else still NaN.
fn compare(label: &str, got: &[f32], want: &[f32], tol: &[f64], rows: usize, out: Out) {
    let (mut worst, mut worst_ratio) = (None, 0f64);
    for (i, &v) in got.iter().enumerate() {
        let (t, c) = (i / out.y_stride, i % out.y_stride);
        let inside = t < out.n_tokens && c >= out.row_offset && c < out.row_offset + rows;
        if !inside {
            assert!(
                v.is_nan(),
                "{label}: wrote outside its window at y[{t}][{c}]: {v}"
            );
            continue;
        }
        let j = t * rows + (c - out.row_offset);
        let err = (f64::from(v) - f64::from(want[j])).abs();
        let ratio = if err.is_nan() {
            f64::INFINITY
        } else {
            err / tol[j]
        };
        if ratio > worst_ratio || worst.is_none() {
            (worst, worst_ratio) = (Some((i, j)), ratio);
        }
    }
    let Some((i, j)) = worst else {
        return;
    };
    eprintln!(
        "{label}: max err/tol {worst_ratio:.3e} (y[{}][{}])",
        i / out.y_stride,
        i % out.y_stride
    );
    assert!(
        worst_ratio <= 1.0,
        "{label}: y[{}][{}]: got {} want {} (tol {:e})",
        i / out.y_stride,
        i % out.y_stride,
        got[i],
        want[j],
        tol[j]
    );
}

/// Runs the GPU matmul of `data` (`[rows, cols]` of `ty`, ggml layout) on seeded inputs with
/// every kernel set and compares with kernels-ref.
fn check_data(
    ctx: &GpuContext,
    ks: &[Kernels],
    ty: WeightFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
    out: Out,
) {
    let n = out.n_tokens;
    let mut rng = Rng(0x51ed_2701 ^ (rows * 7919 + cols * 31 + n) as u64);
    let x = rng.values(n * cols, 2.0);
    let (want, tol) = oracle(ty, data, rows, cols, &x, n);
    let m = kernels::upload_matrix(ctx, &repack(ty, data, rows, cols).unwrap()).unwrap();
    let xb = kernels::upload_f32(ctx, "x", &x).unwrap();
    // Three guard elements past the end.
    let len = n * out.y_stride + 3;
    for k in ks {
        let label = format!(
            "matmul {ty:?} [{rows}x{cols}] {out:?} subgroup={} max_groups={}",
            k.subgroup, k.max_groups_per_dim
        );
        let yb = kernels::upload_f32(ctx, "y", &vec![f32::NAN; len]).unwrap();
        let d = k
            .matmul(ctx, &m, &xb, &yb, n, out.y_stride, out.row_offset)
            .unwrap();
        kernels::run(ctx, &[&d]).unwrap();
        let got = kernels::read_f32(ctx, &yb, len).unwrap();
        compare(&label, &got, &want, &tol, rows, out);
    }
}

fn check(ctx: &GpuContext, ks: &[Kernels], ty: WeightFormat, rows: usize, cols: usize, out: Out) {
    let mut rng = Rng(0x9e37_79b9 ^ (rows * 131 + cols) as u64);
    let data = random_weights(&mut rng, ty.ggml(), rows, cols);
    check_data(ctx, ks, ty, &data, rows, cols, out);
}

/// Columns for a format: `c` rounded up to whole blocks.
fn cols_for(ty: WeightFormat, c: usize) -> usize {
    let b = ty.ggml().block_size();
    c.div_ceil(b) * b
}

#[test]
fn matmul_matches_kernels_ref() {
    let ctx = context();
    let ks = kernel_sets(&ctx);
    for ty in WeightFormat::ALL {
        // Rows below, at and past a 64-row tile; tokens below and past a 16-token tile.
        let small_cols = if ty.ggml().block_size() == 1 {
            37
        } else {
            cols_for(ty, 96)
        };
        for rows in [1, 7, 33, 576, 1536] {
            for n in [1, 5, 64, 67] {
                check(&ctx, &ks, ty, rows, small_cols, Out::dense(rows, n));
            }
        }
        // The model's projection shapes, and a long row (many blocks).
        check(&ctx, &ks, ty, 576, cols_for(ty, 1536), Out::dense(576, 67));
        check(&ctx, &ks, ty, 1536, cols_for(ty, 576), Out::dense(1536, 64));
        check(&ctx, &ks, ty, 7, cols_for(ty, 4128), Out::dense(7, 5));
        if ty.ggml().block_size() == 1 {
            // Partial last blocks: 1 column, 101 = 3 blocks + 5.
            check(&ctx, &ks, ty, 33, 1, Out::dense(33, 67));
            check(&ctx, &ks, ty, 7, 101, Out::dense(7, 5));
        }
    }
}

#[test]
fn matmul_writes_only_its_window_of_y() {
    let ctx = context();
    let ks = kernel_sets(&ctx);
    for ty in WeightFormat::ALL {
        let cols = cols_for(ty, 64);
        // Poisoned columns before the window (row_offset), after it (y_stride - row_offset -
        // rows) and past the last token; the last case fills whole lines (no gaps).
        for (rows, n, y_stride, row_offset) in [(33, 5, 50, 9), (7, 67, 7 + 3, 3), (70, 17, 70, 0)]
        {
            let out = Out {
                n_tokens: n,
                y_stride,
                row_offset,
            };
            check(&ctx, &ks, ty, rows, cols, out);
        }
    }
}

#[test]
fn matmul_of_a_matrix_split_by_rows_writes_one_output() {
    // How the engine runs a matrix larger than the binding limit: one GpuMatrix per block of
    // rows, each launch writing its rows of the shared y.
    let ctx = context();
    let ks = kernel_sets(&ctx);
    let (rows, cols, n) = (157, 96, 19);
    for ty in [WeightFormat::Q4_1, WeightFormat::F16] {
        let mut rng = Rng(0x5b1);
        let data = random_weights(&mut rng, ty.ggml(), rows, cols);
        let x = rng.values(n * cols, 2.0);
        let (want, tol) = oracle(ty, &data, rows, cols, &x, n);
        let row_bytes = ty.ggml().row_bytes(cols as u64).unwrap() as usize;
        let parts: Vec<(usize, GpuMatrix)> = [(0, 64), (64, 129), (129, 157)]
            .iter()
            .map(|&(r0, r1)| {
                let p = repack(ty, &data[r0 * row_bytes..r1 * row_bytes], r1 - r0, cols).unwrap();
                (r0, kernels::upload_matrix(&ctx, &p).unwrap())
            })
            .collect();
        let xb = kernels::upload_f32(&ctx, "x", &x).unwrap();
        for k in &ks {
            let yb = kernels::upload_f32(&ctx, "y", &vec![f32::NAN; n * rows + 3]).unwrap();
            let ds: Vec<_> = parts
                .iter()
                .map(|(r0, m)| k.matmul(&ctx, m, &xb, &yb, n, rows, *r0).unwrap())
                .collect();
            kernels::run(&ctx, &ds.iter().collect::<Vec<_>>()).unwrap();
            let got = kernels::read_f32(&ctx, &yb, n * rows + 3).unwrap();
            let label = format!("split {ty:?} subgroup={}", k.subgroup);
            compare(&label, &got, &want, &tol, rows, Out::dense(rows, n));
        }
    }
}

#[test]
fn matmul_on_a_small_dispatch_grid() {
    let ctx = context();
    // 576 rows x 67 tokens = 9 x 5 = 45 tiles of 64 x 16 on a 7 x 7 grid (4 surplus); 33 rows
    // x 67 tokens = 5 tiles on a 3 x 2 grid (1 surplus).
    for ty in WeightFormat::ALL {
        let cols = cols_for(ty, 64);
        check(
            &ctx,
            &small_grid(&ctx, 7),
            ty,
            576,
            cols,
            Out::dense(576, 67),
        );
        check(&ctx, &small_grid(&ctx, 3), ty, 33, cols, Out::dense(33, 67));
    }
}

#[test]
fn matmul_on_the_test_models_weights() {
    // Real weight distributions; fails, like every model test, when the model is missing.
    let path = memwall::engine::default_model_path();
    let g = memwall::gguf::Gguf::open(&path).unwrap_or_else(|e| {
        panic!(
            "test model {}: {e} (run scripts/fetch-model.sh)",
            path.display()
        )
    });
    let ctx = context();
    let ks = kernel_sets(&ctx);
    // (tensor, rows used: the first rows of the 49152-row token table), tokens.
    for (name, max_rows, n) in [
        ("blk.0.ffn_down.weight", usize::MAX, 67),
        ("blk.0.ffn_gate.weight", usize::MAX, 64),
        ("token_embd.weight", 1536, 67),
    ] {
        let t = g.require_tensor(name).unwrap();
        let ty = WeightFormat::from_ggml(t.ty).unwrap();
        let cols = t.dims[0] as usize;
        let rows = ((t.n_elements / t.dims[0]) as usize).min(max_rows);
        let row_bytes = t.ty.row_bytes(cols as u64).unwrap() as usize;
        let data = &g.tensor_data(t)[..rows * row_bytes];
        eprintln!("{name}: {ty:?} [{rows}x{cols}]");
        check_data(&ctx, &ks, ty, data, rows, cols, Out::dense(rows, n));
    }
}

#[test]
fn matmul_rejects_bad_shapes_and_skips_empty_prompts() {
    let ctx = context();
    let ks = Kernels::new(&ctx).unwrap();
    let (rows, cols) = (8, 64);
    let mut rng = Rng(3);
    let data = random_weights(&mut rng, kernels_ref::GgmlType::Q8_0, rows, cols);
    let m = kernels::upload_matrix(
        &ctx,
        &repack(WeightFormat::Q8_0, &data, rows, cols).unwrap(),
    )
    .unwrap();
    let x = kernels::upload_f32(&ctx, "x", &vec![1.0; 2 * cols]).unwrap();
    let y = kernels::upload_f32(&ctx, "y", &[f32::NAN; 40]).unwrap();
    let is_gpu_err =
        |r: memwall::Result<kernels::Dispatch>| matches!(r, Err(memwall::Error::Gpu(_)));
    // Rows past y_stride, y_stride below rows.
    assert!(is_gpu_err(ks.matmul(&ctx, &m, &x, &y, 2, 10, 3)));
    assert!(is_gpu_err(ks.matmul(&ctx, &m, &x, &y, 1, 7, 0)));
    // y (40) too small for 2 tokens of stride 33 (41); x too small for 3 tokens.
    assert!(is_gpu_err(ks.matmul(&ctx, &m, &x, &y, 2, 33, 0)));
    assert!(is_gpu_err(ks.matmul(&ctx, &m, &x, &y, 3, 8, 0)));
    // Exactly fitting is fine: the last token's window ends at the buffer's end.
    assert!(ks.matmul(&ctx, &m, &x, &y, 2, 32, 0).is_ok());
    assert!(ks.matmul(&ctx, &m, &x, &y, 2, 20, 12).is_ok());
    // No tokens: a valid launch that writes nothing.
    let d = ks.matmul(&ctx, &m, &x, &y, 0, 10, 0).unwrap();
    kernels::run(&ctx, &[&d]).unwrap();
    let got = kernels::read_f32(&ctx, &y, 40).unwrap();
    assert!(got.iter().all(|v| v.is_nan()), "{got:?}");
}
