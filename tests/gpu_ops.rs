//! The forward pass's element-wise and row kernels (RoPE, SwiGLU, add, softmax, argmax) on a
//! real adapter against kernels-ref, on seeded random inputs with odd sizes and NaN-poisoned
//! guard elements past every output.
//!
//! Needs a GPU adapter (lavapipe; `WGPU_BACKEND=gl` for the GL path). With no adapter these
//! tests FAIL: a GPU test must never pass silently.

mod common;
mod gpu_support;

use gpu_support::{context, random_weights, Rng, U};
use memwall::config::FfnAct;
use memwall::gpu::health::selftest::rope_tolerance;
use memwall::gpu::kernels::ops::RopeConfig;
use memwall::gpu::kernels::{self, Kernels};
use memwall::gpu::{repack, GpuContext, WeightFormat};

/// Workgroup-memory kernels, the subgroup ones where available, and the portable ones on a
/// grid of at most `small` x `small` workgroups (so the 2-D dispatch and the skipping of
/// surplus workgroups run: callers pick `small` so the test's sizes need more than one line).
fn kernel_sets(ctx: &GpuContext, small: u32) -> Vec<Kernels> {
    let mut v = vec![Kernels::with_options(ctx, false).unwrap()];
    if ctx.has_subgroups() {
        v.push(Kernels::with_options(ctx, true).unwrap());
    }
    let mut k = Kernels::with_options(ctx, false).unwrap();
    k.max_groups_per_dim = small;
    v.push(k);
    v
}

fn label(k: &Kernels) -> String {
    format!(
        "subgroup={} max_groups={}",
        k.subgroup, k.max_groups_per_dim
    )
}

/// Runs one dispatch on `input` (uploaded with 3 NaN guards appended) and returns the first
/// `n` results, failing if a guard was overwritten.
fn run_in_place(ctx: &GpuContext, buf: &wgpu::Buffer, d: &kernels::Dispatch, n: usize) -> Vec<f32> {
    kernels::run(ctx, &[d]).unwrap();
    let got = kernels::read_f32(ctx, buf, n + 3).unwrap();
    assert!(
        got[n..].iter().all(|v| v.is_nan()),
        "wrote past the end: {:?}",
        &got[n..]
    );
    got[..n].to_vec()
}

fn poisoned(v: &[f32]) -> Vec<f32> {
    let mut p = v.to_vec();
    p.extend([f32::NAN; 3]);
    p
}

/// Largest err/tol over the elements (NaN counts as infinitely bad) and the largest error.
fn worst(got: &[f32], want: &[f32], tol: impl Fn(usize) -> f64) -> (usize, f64, f64) {
    let (mut at, mut ratio, mut max_err) = (0, 0f64, 0f64);
    for i in 0..want.len() {
        let err = (f64::from(got[i]) - f64::from(want[i])).abs();
        let r = if err.is_nan() {
            f64::INFINITY
        } else {
            err / tol(i)
        };
        if r > ratio || i == 0 {
            (at, ratio) = (i, r);
        }
        if err > max_err || err.is_nan() {
            max_err = err;
        }
    }
    (at, ratio, max_err)
}

#[test]
fn rope_matches_kernels_ref() {
    let ctx = context();
    let ks = kernel_sets(&ctx, 9);
    // (n_tokens, n_heads, head_dim, n_rot, pos0, base, scale, mscale): the test model's 64-dim
    // heads, partial rotation, odd head counts, positions near 4000, a scaled context, and
    // phi3's partial rotation with LongRoPE's attention factor.
    let cases = [
        (
            3usize, 9usize, 64usize, 64usize, 0usize, 10000.0f32, 1.0f32, 1.0f32,
        ),
        (5, 3, 64, 64, 3990, 100000.0, 1.0, 1.0),
        (2, 7, 80, 34, 4001, 10000.0, 1.0, 1.0),
        (4, 1, 6, 2, 17, 10000.0, 0.25, 1.0),
        (7, 5, 128, 96, 2047, 500000.0, 0.5, 1.0),
        (3, 6, 128, 96, 900, 10000.0, 1.0, 1.1902),
    ];
    for (n_tokens, n_heads, head_dim, n_rot, pos0, base, scale, mscale) in cases {
        for neox in [false, true] {
            let cfg = RopeConfig {
                n_heads,
                head_dim,
                n_rot,
                freq_base: base,
                freq_scale: scale,
                neox,
                mscale,
            };
            let n = n_tokens * n_heads * head_dim;
            let mut rng = Rng(0x0a0e ^ (n * 31 + pos0) as u64);
            let x = rng.values(n, 2.0);
            let mut want = x.clone();
            for (t, tok) in want.chunks_exact_mut(n_heads * head_dim).enumerate() {
                let r = kernels_ref::Rotation {
                    mscale,
                    ..kernels_ref::Rotation::new(n_rot, base, neox).scaled(scale)
                };
                kernels_ref::rope(tok, n_heads, head_dim, pos0 + t, &r);
            }
            let tol = rope_tolerance(&x, n_heads, &cfg, pos0);
            for k in &ks {
                let xb = kernels::upload_f32(&ctx, "x", &poisoned(&x)).unwrap();
                let d = k.rope(&ctx, &xb, &cfg, n_tokens, pos0).unwrap();
                let got = run_in_place(&ctx, &xb, &d, n);
                let (at, ratio, max_err) = worst(&got, &want, &tol);
                eprintln!(
                    "rope [{n_tokens}x{n_heads}x{head_dim}] n_rot={n_rot} pos0={pos0} neox={neox} \
                     {}: max err {max_err:.3e}, max err/tol {ratio:.3e}",
                    label(k)
                );
                assert!(
                    ratio <= 1.0,
                    "rope neox={neox} pos0={pos0} {}: index {at}: got {} want {} tol {:e}",
                    label(k),
                    got[at],
                    want[at],
                    tol(at)
                );
            }
        }
    }
}

#[test]
fn swiglu_and_add_match_kernels_ref() {
    let ctx = context();
    let ks = kernel_sets(&ctx, 9);
    for n in [1usize, 37, 1536, 4099] {
        let mut rng = Rng(0x5a1 ^ n as u64);
        // Gate values past +-88 (exp overflow) come from the outliers at scale 4.
        let gate = rng.values(n, 4.0);
        let up = rng.values(n, 2.0);
        let mut want_swiglu = vec![0f32; n];
        kernels_ref::swiglu(&gate, &up, &mut want_swiglu);
        let mut want_add = vec![0f32; n];
        kernels_ref::add(&gate, &up, &mut want_add);
        // SwiGLU tolerance, relative to |out|: WGSL/Vulkan allow exp (3 + 2|x|) ulp, the
        // 1 + e, the division (2.5 ulp) and the product add 4 roundings: (8 + 2|g|) u. The
        // relative error of 1 + e is at most that of e, so this bounds silu's too.
        let tol_swiglu = |i: usize| {
            (8.0 + 2.0 * f64::from(gate[i]).abs()) * U * f64::from(want_swiglu[i]).abs() + 1e-37
        };
        let upb = kernels::upload_f32(&ctx, "up", &up).unwrap();
        for k in &ks {
            let gb = kernels::upload_f32(&ctx, "gate", &poisoned(&gate)).unwrap();
            let d = k.swiglu(&ctx, &gb, &upb, n).unwrap();
            let got = run_in_place(&ctx, &gb, &d, n);
            let (at, ratio, max_err) = worst(&got, &want_swiglu, tol_swiglu);
            eprintln!(
                "swiglu [{n}] {}: max err {max_err:.3e}, max err/tol {ratio:.3e}",
                label(k)
            );
            assert!(
                ratio <= 1.0,
                "swiglu [{n}] {}: index {at}: got {} want {}",
                label(k),
                got[at],
                want_swiglu[at]
            );

            // f32 addition is correctly rounded everywhere: the result must be bit-exact.
            let xb = kernels::upload_f32(&ctx, "x", &poisoned(&gate)).unwrap();
            let d = k.add(&ctx, &xb, &upb, n).unwrap();
            let got = run_in_place(&ctx, &xb, &d, n);
            let bad = (0..n).find(|&i| got[i].to_bits() != want_add[i].to_bits());
            eprintln!("add [{n}] {}: first mismatch {bad:?}", label(k));
            assert!(bad.is_none(), "add [{n}] {}: index {bad:?}", label(k));

            // GeGLU: g sigmoid(t) with t = 2 sqrt(2/pi) (g + 0.044715 g^3): as SwiGLU's bound
            // with |t| for |g|, plus the 4 roundings of t (relative error of t, times |t|
            // through exp).
            let mut want_geglu = vec![0f32; n];
            kernels_ref::geglu(&gate, &up, &mut want_geglu);
            let tol_geglu = |i: usize| {
                let g = f64::from(gate[i]);
                let t = (1.5957691216057308 * (g + 0.044715 * g * g * g)).abs();
                (12.0 + 6.0 * t) * U * f64::from(want_geglu[i]).abs() + 1e-37
            };
            let gb = kernels::upload_f32(&ctx, "gate", &poisoned(&gate)).unwrap();
            let l = k.glu_launch(FfnAct::GeluTanh, &gb, &upb, n).unwrap();
            let d = k.prepare(&ctx, l).unwrap();
            let got = run_in_place(&ctx, &gb, &d, n);
            let (at, ratio, max_err) = worst(&got, &want_geglu, tol_geglu);
            eprintln!(
                "geglu [{n}] {}: max err {max_err:.3e}, max err/tol {ratio:.3e}",
                label(k)
            );
            assert!(
                ratio <= 1.0,
                "geglu [{n}] {}: index {at} (gate {}): got {} want {}",
                label(k),
                gate[at],
                got[at],
                want_geglu[at]
            );
        }
    }
}

#[test]
fn softmax_matches_kernels_ref() {
    let ctx = context();
    let ks = kernel_sets(&ctx, 4);
    // (n_rows, n): attention rows of odd lengths, a single element, long rows; the last row
    // set includes masked (-inf) entries and a fully masked row.
    for (n_rows, n) in [(9usize, 37usize), (4, 1), (2, 4099), (7, 130)] {
        let mut rng = Rng(0x50f7 ^ (n_rows * 977 + n) as u64);
        let mut x = rng.values(n_rows * n, 3.0);
        if n == 130 {
            for (i, v) in x.iter_mut().enumerate() {
                // Causal-style masking in row r past column 10 r, and all of row 0.
                let (r, c) = (i / n, i % n);
                if r == 0 || c > 10 * r + 5 {
                    *v = f32::NEG_INFINITY;
                }
            }
        }
        let mut want = x.clone();
        for row in want.chunks_exact_mut(n) {
            kernels_ref::softmax(row);
        }
        // Tolerance, relative to |out|: exp(x - max) has (3 + 2|x - max|) ulp (WGSL/Vulkan)
        // plus the subtraction's rounding amplified by |x - max|; the f32 row sum of n
        // positive terms has relative error <= n u on top of the terms' own; the division
        // adds 2.5 ulp. So ((4 + 3|d|) * 2 + n + 3) u, with d = x - max.
        let tol = |i: usize| {
            let r = i / n;
            let row = &x[r * n..(r + 1) * n];
            let m = row.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let dmax = row
                .iter()
                .filter(|v| v.is_finite())
                .map(|&v| f64::from(m) - f64::from(v))
                .fold(0f64, f64::max);
            if !x[i].is_finite() || !m.is_finite() {
                // A masked entry (or a fully masked row) must be exactly 0.
                return f64::MIN_POSITIVE;
            }
            let d = (f64::from(x[i]) - f64::from(m)).abs();
            let rel = (4.0 + 3.0 * d) * U + (4.0 + 3.0 * dmax) * U + (n as f64 + 3.0) * U;
            // WGSL may flush subnormals to zero, so an output below the smallest normal may
            // read 0; the floor is twice that since exp's own error can take a value just
            // above it below it before the flush (measured worst ratio came from such a 0).
            rel * f64::from(want[i]).abs() + 2.0 * f64::from(f32::MIN_POSITIVE)
        };
        for k in &ks {
            let xb = kernels::upload_f32(&ctx, "x", &poisoned(&x)).unwrap();
            let d = k.softmax(&ctx, &xb, n, n_rows).unwrap();
            let got = run_in_place(&ctx, &xb, &d, n_rows * n);
            let (at, ratio, max_err) = worst(&got, &want, tol);
            eprintln!(
                "softmax [{n_rows}x{n}] {}: max err {max_err:.3e}, max err/tol {ratio:.3e} (at \
                 {at}: got {:e} want {:e})",
                label(k),
                got[at],
                want[at]
            );
            assert!(
                ratio <= 1.0,
                "softmax [{n_rows}x{n}] {}: index {at}: got {} want {}",
                label(k),
                got[at],
                want[at]
            );
        }
    }
}

/// The oracle: first index of the largest non-NaN value (u32::MAX if none).
fn argmax_ref(row: &[f32]) -> u32 {
    let mut best: Option<(usize, f32)> = None;
    for (i, &v) in row.iter().enumerate() {
        if !v.is_nan() && best.is_none_or(|(_, b)| v > b) {
            best = Some((i, v));
        }
    }
    best.map_or(u32::MAX, |(i, _)| i as u32)
}

#[test]
fn argmax_matches_reference_with_ties() {
    let ctx = context();
    let ks = kernel_sets(&ctx, 4);
    let n = 49152; // the test model's vocabulary
    let n_rows = 5;
    let mut rng = Rng(0xa46 ^ n as u64);
    let mut x = rng.values(n_rows * n, 3.0);
    // Row 0: random. Row 1: the maximum tied at three indices (lowest wins), far apart so
    // different invocations hold them. Row 2: all equal (index 0 wins). Row 3: the maximum at
    // the last index, NaNs elsewhere. Row 4: ties quantized to a few levels.
    let top = 1000.0;
    for c in [40_001, 777, 30_000] {
        x[n + c] = top;
    }
    x[2 * n..3 * n].fill(-2.5);
    x[4 * n - 1] = top;
    for c in (0..n).step_by(101) {
        x[3 * n + c] = f32::NAN;
    }
    for v in &mut x[4 * n..] {
        *v = v.round().min(3.0);
    }
    let want: Vec<u32> = x.chunks_exact(n).map(argmax_ref).collect();
    assert_eq!(want[1], 777);
    assert_eq!(want[2], 0);
    assert_eq!(want[3], n as u32 - 1);
    let xb = kernels::upload_f32(&ctx, "logits", &x).unwrap();
    for k in &ks {
        let ob = kernels::upload_f32(&ctx, "idx", &[f32::NAN; 8]).unwrap();
        let d = k.argmax(&ctx, &xb, &ob, n, n_rows).unwrap();
        kernels::run(&ctx, &[&d]).unwrap();
        let got = kernels::read_f32(&ctx, &ob, 8).unwrap();
        assert!(
            got[n_rows..].iter().all(|v| v.is_nan()),
            "wrote past the end"
        );
        let got: Vec<u32> = got[..n_rows].iter().map(|v| v.to_bits()).collect();
        eprintln!(
            "argmax [{n_rows}x{n}] {}: got {got:?} want {want:?}",
            label(k)
        );
        assert_eq!(got, want, "{}", label(k));
    }
}

#[test]
fn undersized_buffers_are_errors() {
    let ctx = context();
    let ks = Kernels::new(&ctx).unwrap();
    let b = kernels::upload_f32(&ctx, "b", &[0.0; 10]).unwrap();
    let cfg = RopeConfig {
        n_heads: 1,
        head_dim: 8,
        n_rot: 8,
        freq_base: 10000.0,
        freq_scale: 1.0,
        neox: false,
        mscale: 1.0,
    };
    assert!(ks.rope(&ctx, &b, &cfg, 2, 0).is_err());
    assert!(ks
        .rope(&ctx, &b, &RopeConfig { n_rot: 9, ..cfg }, 1, 0)
        .is_err());
    assert!(ks.swiglu(&ctx, &b, &b, 11).is_err());
    assert!(ks.add(&ctx, &b, &b, 11).is_err());
    assert!(ks.softmax(&ctx, &b, 4, 3).is_err());
    assert!(ks.argmax(&ctx, &b, &b, 5, 11).is_err());
    let t = kernels::upload_matrix(
        &ctx,
        &repack(WeightFormat::F32, &[0u8; 4 * 8], 2, 4).unwrap(),
    )
    .unwrap();
    // Three tokens of 4 columns need 12 output floats; `b` holds 10.
    assert!(ks.embedding(&ctx, &t, &b, &b, 3).is_err());
    assert!(ks.embedding(&ctx, &t, &b, &b, 11).is_err());
}

/// Looks up `ids` in `table` (`[rows, cols]` of `ty`, ggml layout) on the GPU and compares
/// with kernels-ref; ids past the table must give zeros.
fn check_embedding(
    ctx: &GpuContext,
    ks: &[Kernels],
    ty: WeightFormat,
    table: &[u8],
    rows: usize,
    cols: usize,
    ids: &[u32],
) {
    let n = ids.len() * cols;
    let mut want = vec![0f32; n];
    for (t, &id) in ids.iter().enumerate() {
        if (id as usize) < rows {
            kernels_ref::embedding(
                ty.ggml(),
                table,
                cols,
                id as usize,
                &mut want[t * cols..][..cols],
            )
            .unwrap();
        }
    }
    // Tolerance: Q8_0, F16 and F32 values are one f32 product (or exact), computed the same
    // way as the oracle; Q4_1's d * q + m may be contracted to an fma, which differs by at
    // most one rounding of d * q (|d q| = |w - m| <= 2 max|w| of the row, as m is the value of
    // code 0) plus the final rounding: 3u * max|w| of the row. Q4_K and Q6_K decode exactly
    // (every product is exact in f32: see their shaders/quant fragments).
    let row_max: Vec<f64> = want
        .chunks_exact(cols.max(1))
        .map(|r| r.iter().map(|v| f64::from(*v).abs()).fold(0f64, f64::max))
        .collect();
    let tol = |i: usize| 3.0 * U * row_max[i / cols] + f64::MIN_POSITIVE;
    let m = kernels::upload_matrix(ctx, &repack(ty, table, rows, cols).unwrap()).unwrap();
    let idb = kernels::upload_u32(ctx, "ids", ids).unwrap();
    for k in ks {
        let ob = kernels::upload_f32(ctx, "out", &vec![f32::NAN; n + 3]).unwrap();
        let d = k.embedding(ctx, &m, &idb, &ob, ids.len()).unwrap();
        let got = run_in_place(ctx, &ob, &d, n);
        let (at, ratio, max_err) = worst(&got, &want, tol);
        eprintln!(
            "embedding {ty:?} [{rows}x{cols}] ids {} {}: max err {max_err:.3e}, max err/tol \
             {ratio:.3e}",
            ids.len(),
            label(k)
        );
        assert!(
            ratio <= 1.0,
            "embedding {ty:?} {}: index {at}: got {} want {}",
            label(k),
            got[at],
            want[at]
        );
    }
}

#[test]
fn embedding_matches_kernels_ref() {
    let ctx = context();
    let ks = kernel_sets(&ctx, 4);
    for ty in WeightFormat::ALL {
        let shapes: &[(usize, usize)] = match ty.ggml().block_size() {
            1 => &[(37, 37), (5, 1), (7, 96)],
            32 => &[(37, 96), (3, 4128)],
            _ => &[(37, 256), (3, 4352)],
        };
        for &(rows, cols) in shapes {
            let mut rng = Rng(0xe3b ^ (rows * 131 + cols) as u64);
            let table = random_weights(&mut rng, ty.ggml(), rows, cols);
            let last = rows as u32 - 1;
            // Repeats, the last row, and two ids past the end (zeros).
            let ids = [0, last, 1 % rows as u32, last, rows as u32, u32::MAX, 0];
            check_embedding(&ctx, &ks, ty, &table, rows, cols, &ids);
        }
    }
}

#[test]
fn embedding_of_the_test_models_token_table() {
    // The real Q8_0 token table (49152 x 576); fails, like every model test, when the model
    // is missing.
    let path = memwall::engine::default_model_path();
    let g = memwall::gguf::Gguf::open(&path).unwrap_or_else(|e| {
        panic!(
            "test model {}: {e} (run scripts/fetch-model.sh)",
            path.display()
        )
    });
    let ctx = context();
    let ks = kernel_sets(&ctx, 4);
    let t = g.require_tensor("token_embd.weight").unwrap();
    let ty = WeightFormat::from_ggml(t.ty).unwrap();
    let cols = t.dims[0] as usize;
    let rows = (t.n_elements / t.dims[0]) as usize;
    let ids = [1u32, 0, 49151, 12345, 2, 9000];
    check_embedding(&ctx, &ks, ty, g.tensor_data(t), rows, cols, &ids);
}
