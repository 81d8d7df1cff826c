//! The GPU's integer matvec path against the CPU's: `quantize_act` must give the very bytes and
//! scales of the CPU's activation quantizer (src/cpu/act.rs), and `matvec_q8` the CPU matmul's
//! results up to f32 summation order, on random weights and on the test model's.
//!
//! Needs a GPU adapter (lavapipe: `mesa-vulkan-drivers`; `WGPU_BACKEND=gl` tests the portable
//! path) and the test model: without either these tests FAIL.

#[path = "../common/mod.rs"]
mod common;
#[path = "../gpu_support/mod.rs"]
mod gpu_support;
mod platform;
mod reference;

use std::sync::Arc;

use gpu_support::{context, Rng};
use memwall::backend::{Backend, WeightId};
use memwall::cpu::{matmul_with, Isa, MatmulScratch, WeightView};
use memwall::cpu_backend::CpuBackend;
use memwall::gpu::kernels::q8act::{q8_supported, qd_vec4s, qx_words};
use memwall::gpu::kernels::{self, Kernels};
use memwall::gpu::{repack, GpuContext, KernelKey, WeightFormat};
use reference::{activations, cpu_matmuls, division_sweep, quantize_host, references, Want};

/// The reductions this adapter can run: always workgroup memory, plus subgroups if present.
pub(crate) fn kernel_sets(ctx: &GpuContext) -> Vec<Kernels> {
    let mut v = vec![Kernels::with_options(ctx, false).unwrap()];
    if ctx.has_subgroups() {
        v.push(Kernels::with_options(ctx, true).unwrap());
    }
    v
}

/// Portable kernels with at most `max` workgroups per dimension (exercises the 2-D dispatch).
fn small_grid(ctx: &GpuContext, max: u32) -> Kernels {
    let mut k = Kernels::with_options(ctx, false).unwrap();
    k.max_groups_per_dim = max;
    k
}

/// Runs quantize_act on `x` ([n_tokens, cols]) and reads back (qx words, qd as f32 bits).
fn quantize_gpu(
    ctx: &GpuContext,
    k: &Kernels,
    x: &[f32],
    n_tokens: usize,
    cols: usize,
) -> (Vec<u32>, Vec<u32>) {
    let xb = kernels::upload_f32(ctx, "x", x).unwrap();
    // One poisoned word / entry past the end of each: must stay untouched.
    let words = qx_words(n_tokens, cols);
    let n_qd = qd_vec4s(n_tokens, cols) * 4;
    let qx = kernels::upload_u32(ctx, "qx", &vec![0xDEAD_BEEF; words + 1]).unwrap();
    let qd = kernels::upload_f32(ctx, "qd", &vec![f32::NAN; n_qd + 4]).unwrap();
    let d = k
        .prepare(
            ctx,
            k.quantize_act_launch(&xb, &qx, &qd, n_tokens, cols)
                .unwrap(),
        )
        .unwrap();
    kernels::run(ctx, &[&d]).unwrap();
    let bits = |b: &wgpu::Buffer, n: usize| -> Vec<u32> {
        kernels::read_f32(ctx, b, n)
            .unwrap()
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    let gx = bits(&qx, words + 1);
    let gd = bits(&qd, n_qd + 4);
    assert_eq!(gx[words], 0xDEAD_BEEF, "quantize_act wrote past qx");
    assert!(
        gd[n_qd..].iter().all(|&b| f32::from_bits(b).is_nan()),
        "quantize_act wrote past qd"
    );
    (gx[..words].to_vec(), gd[..n_qd].to_vec())
}

#[test]
fn quantize_act_is_bit_identical_to_the_cpu() {
    let ctx = context();
    for (n_tokens, cols, max_groups) in [(1, 576, 0), (3, 1536, 0), (5, 32, 0), (37, 576, 4)] {
        let x = activations(0xAC7 ^ (n_tokens * 7 + cols) as u64, n_tokens, cols);
        let (want_x, want_d, codes) = quantize_host(&x);
        let k = if max_groups == 0 {
            Kernels::new(&ctx).unwrap()
        } else {
            // 37 * 18 chunks = 11 workgroups on a 4 x 3 grid (one surplus workgroup).
            small_grid(&ctx, max_groups)
        };
        let (gx, gd) = quantize_gpu(&ctx, &k, &x, n_tokens, cols);
        for (i, (g, w)) in gx.iter().zip(&want_x).enumerate() {
            assert_eq!(
                g,
                w,
                "[{n_tokens}x{cols}] qx word {i} (chunk {}): {g:#010x} vs {w:#010x}",
                i / 8
            );
        }
        for (i, (g, w)) in gd.iter().zip(want_d.iter().flatten()).enumerate() {
            assert_eq!(
                *g,
                w.to_bits(),
                "[{n_tokens}x{cols}] qd chunk {} field {}: {} vs {w}",
                i / 4,
                i % 4,
                f32::from_bits(*g)
            );
        }
        // The host twin is the CPU's quantizer: a one-hot Q8_0 matrix (d = 1) makes the CPU's
        // own matmul return d_chunk * q[i] for every column i, which must equal ours bitwise.
        let mut w = Vec::with_capacity(cols * cols / 32 * 34);
        for r in 0..cols {
            for b in 0..cols / 32 {
                w.extend(half::f16::ONE.to_le_bytes());
                w.extend((0..32).map(|i| u8::from(b * 32 + i == r)));
            }
        }
        let view = WeightView::new(kernels_ref::GgmlType::Q8_0, &w, cols, cols).unwrap();
        for isa in [Isa::Scalar, Isa::best()] {
            let mut y = vec![0f32; n_tokens * cols];
            matmul_with(
                isa,
                &view,
                &x,
                n_tokens,
                &mut y,
                &mut MatmulScratch::default(),
            )
            .unwrap();
            for (i, yv) in y.iter().enumerate() {
                let want = want_d[i / 32][0] * f32::from(codes[i]);
                assert_eq!(yv.to_bits(), want.to_bits(), "{isa:?} element {i}");
            }
        }
    }
}

#[test]
fn quantize_act_division_is_exact_where_the_platform_s_may_not_be() {
    let ctx = context();
    // 3641 tokens of 576: 65538 chunks.
    let (n_tokens, cols) = (3641, 576);
    let x = division_sweep(n_tokens * cols / 32);
    let (want_x, want_d, want_q) = quantize_host(&x);
    // The exact path: bit-identical on every chunk.
    let k = Kernels::new(&ctx).unwrap();
    let (gx, gd) = quantize_gpu(&ctx, &k, &x, n_tokens, cols);
    let bad_x = gx.iter().zip(&want_x).filter(|(g, w)| g != w).count();
    let bad_d = gd
        .iter()
        .zip(want_d.iter().flatten())
        .filter(|(g, w)| **g != w.to_bits())
        .count();
    // The platform's division: measured, and bounded: a wrong last bit of d or id can only
    // move a product x * id across a rounding boundary by one code.
    let (px, pd) = platform::quantize_platform_division(&ctx, &x);
    let d_diff = pd
        .chunks_exact(4)
        .zip(&want_d)
        .filter(|(g, w)| g[0] != w[0].to_bits())
        .count();
    let (mut code_diff, mut worst) = (0usize, 0i32);
    for (i, w) in px.iter().enumerate() {
        for (j, b) in w.to_le_bytes().iter().enumerate() {
            let diff = (i32::from(*b as i8) - i32::from(want_q[4 * i + j])).abs();
            if diff != 0 {
                code_diff += 1;
                worst = worst.max(diff);
            }
        }
    }
    eprintln!(
        "{} chunks: exact division: {bad_x} words, {bad_d} qd fields differ; platform division \
         ({}): {d_diff} chunk scales d and {code_diff} of {} codes differ (max by {worst})",
        want_d.len(),
        ctx.info.backend,
        px.len() * 4,
    );
    assert_eq!((bad_x, bad_d), (0, 0), "exact division path differs");
    assert!(worst <= 1, "platform division moved a code by {worst}");
}

/// Runs quantize_act + matvec_q8 on every kernel set, into rows `row_offset..` of a NaN-poisoned
/// `[n_tokens, y_stride]` y, and checks it against every reference. Returns the largest
/// |gpu - cpu| seen, relative to the output range.
#[allow(clippy::too_many_arguments)]
fn check_q8(
    ctx: &GpuContext,
    ks: &[Kernels],
    ty: WeightFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    wants: &[Want],
) -> f64 {
    assert!(q8_supported(ty));
    let m = kernels::upload_matrix(ctx, &repack(ty, data, rows, cols).unwrap()).unwrap();
    let xb = kernels::upload_f32(ctx, "x", x).unwrap();
    let qx = kernels::upload_u32(ctx, "qx", &vec![0; qx_words(n_tokens, cols)]).unwrap();
    let qd = kernels::upload_f32(ctx, "qd", &vec![0.0; 4 * qd_vec4s(n_tokens, cols)]).unwrap();
    let (row_offset, y_stride) = (3, rows + 5);
    let n_y = n_tokens * y_stride;
    let range = {
        let y = &wants[0].y;
        let (lo, hi) = y
            .iter()
            .fold((f32::MAX, f32::MIN), |(a, b), &v| (a.min(v), b.max(v)));
        // One output has no spread: its magnitude stands in.
        f64::from(hi - lo)
            .max(f64::from(hi.abs().max(lo.abs())))
            .max(f64::MIN_POSITIVE)
    };
    let mut worst_rel = 0f64;
    for k in ks {
        let label = format!(
            "matvec_q8 {ty:?} [{rows}x{cols}] x {n_tokens} subgroup={} max_groups={}",
            k.subgroup, k.max_groups_per_dim
        );
        // Three guard elements past the end, and the rows outside the matrix's slice of each
        // token's stride: all must stay NaN.
        let yb = kernels::upload_f32(ctx, "y", &vec![f32::NAN; n_y + 3]).unwrap();
        let dq = k
            .prepare(
                ctx,
                k.quantize_act_launch(&xb, &qx, &qd, n_tokens, cols)
                    .unwrap(),
            )
            .unwrap();
        let launch = k
            .matvec_q8_launch(&m, &qx, &qd, &yb, n_tokens, y_stride, row_offset)
            .unwrap();
        let dm = k.prepare(ctx, launch).unwrap();
        kernels::run(ctx, &[&dq, &dm]).unwrap();
        let got = kernels::read_f32(ctx, &yb, n_y + 3).unwrap();
        for (i, v) in got.iter().enumerate() {
            let inside = i < n_y && (row_offset..row_offset + rows).contains(&(i % y_stride));
            assert!(
                inside || v.is_nan(),
                "{label}: wrote y[{i}] outside its rows: {v}"
            );
        }
        for want in wants {
            let (mut worst, mut worst_ratio, mut worst_err) = (0, 0f64, 0f64);
            for t in 0..n_tokens {
                for r in 0..rows {
                    let i = t * rows + r;
                    let g = got[t * y_stride + row_offset + r];
                    let err = (f64::from(g) - f64::from(want.y[i])).abs();
                    // NaN (an unwritten row) must fail: it gives the worst ratio.
                    let ratio = if err.is_nan() {
                        f64::INFINITY
                    } else {
                        err / want.tol[i]
                    };
                    if ratio > worst_ratio || i == 0 {
                        (worst, worst_ratio, worst_err) = (i, ratio, err);
                    }
                    if want.name.starts_with("cpu") && !err.is_nan() {
                        worst_rel = worst_rel.max(err / range);
                    }
                }
            }
            eprintln!(
                "{label} vs {}: max err/tol {worst_ratio:.3e} (token {} row {}: err \
                 {worst_err:.3e}, tol {:.3e}, output range {range:.3e})",
                want.name,
                worst / rows,
                worst % rows,
                want.tol[worst]
            );
            assert!(
                worst_ratio <= 1.0,
                "{label} vs {}: token {} row {}: got {} want {} (err {worst_err:e} > tol {:e})",
                want.name,
                worst / rows,
                worst % rows,
                got[(worst / rows) * y_stride + row_offset + worst % rows],
                want.y[worst],
                want.tol[worst]
            );
        }
    }
    worst_rel
}

#[test]
fn matvec_q8_matches_the_cpu_on_random_weights() {
    let ctx = context();
    let ks = kernel_sets(&ctx);
    let mut worst = 0f64;
    for ty in [WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q8_0] {
        // Rows not a multiple of the rows per workgroup; fewer chunks than invocations (3),
        // the model's shapes, and more than one stride of chunks (129).
        for (rows, cols, n_tokens) in [
            (37, 96, 3),
            (1, 32, 1),
            (1536, 576, 1),
            (576, 1536, 3),
            (3, 4128, 3),
            (77, 576, 64),
        ] {
            let mut rng = Rng(0x9e37_79b9 ^ (rows * 31 + cols) as u64);
            let w = rng.values(rows * cols, 2.0);
            let data = kernels_ref::quantize(ty.ggml(), &w).unwrap();
            let x = activations(0x1234 ^ (rows * 131 + cols) as u64, n_tokens, cols);
            let wants = references(
                ty,
                &data,
                rows,
                cols,
                &x,
                n_tokens,
                cpu_matmuls(ty, &data, rows, cols, &x, n_tokens),
            );
            worst = worst.max(check_q8(
                &ctx, &ks, ty, &data, rows, cols, &x, n_tokens, &wants,
            ));
        }
        // 37 rows x 3 tokens on a grid 8 workgroups wide: 57 workgroups of 2 rows (7 surplus
        // on the last line), or 15 of 8 rows (1 surplus) where the adapter has subgroups of 8.
        let (rows, cols, n_tokens) = (37, 64, 3);
        let mut rng = Rng(0x5151);
        let data = kernels_ref::quantize(ty.ggml(), &rng.values(rows * cols, 2.0)).unwrap();
        let x = activations(0x77, n_tokens, cols);
        let cpu = cpu_matmuls(ty, &data, rows, cols, &x, n_tokens);
        let wants = references(ty, &data, rows, cols, &x, n_tokens, cpu);
        check_q8(
            &ctx,
            &[small_grid(&ctx, 8)],
            ty,
            &data,
            rows,
            cols,
            &x,
            n_tokens,
            &wants,
        );
        // The prefill matmul on a 2-D grid (row layout, 8+ tokens): 600 rows = 3 groups of
        // 4 * 64 rows on a 2 x 2 grid (1 surplus), 3 tiles of 8 tokens (the last partial).
        let (rows, cols, n_tokens) = (600, 64, 17);
        let data = kernels_ref::quantize(ty.ggml(), &rng.values(rows * cols, 2.0)).unwrap();
        let x = activations(0x78, n_tokens, cols);
        let cpu = cpu_matmuls(ty, &data, rows, cols, &x, n_tokens);
        let wants = references(ty, &data, rows, cols, &x, n_tokens, cpu);
        let mut k = small_grid(&ctx, 2);
        k.matvec_rows = true;
        check_q8(&ctx, &[k], ty, &data, rows, cols, &x, n_tokens, &wants);
    }
    eprintln!("random weights: max |gpu - cpu| / output range = {worst:.3e}");
}

#[test]
fn matvec_q8_matches_the_cpu_backend_on_the_test_models_weights() {
    let path = memwall::engine::default_model_path();
    let g = memwall::gguf::Gguf::open(&path).unwrap_or_else(|e| {
        panic!(
            "test model {}: {e} (run scripts/fetch-model.sh)",
            path.display()
        )
    });
    let g = Arc::new(g);
    let cfg = memwall::config::Config::from_gguf(&g).unwrap();
    let mut cpu = CpuBackend::new(g.clone(), cfg, 8).unwrap();
    let ctx = context();
    let ks = kernel_sets(&ctx);
    let mut worst = 0f64;
    for (id, n_tokens) in [
        (WeightId::Down(0), 1),
        (WeightId::Down(0), 3),
        (WeightId::Down(0), 64),
        // The tied output projection: the logits, 49152 rows.
        (WeightId::TokEmbd, 1),
        (WeightId::TokEmbd, 3),
    ] {
        let t = g.require_tensor(&id.tensor_name()).unwrap();
        let ty = WeightFormat::from_ggml(t.ty).unwrap();
        let cols = t.dims[0] as usize;
        let rows = (t.n_elements / t.dims[0]) as usize;
        let data = g.tensor_data(t);
        // Hidden-state-like activations (roughly normal, 50x outliers; no 1e6 spike), so the
        // reported difference is relative to a realistic logit range.
        let x = Rng(0xBEEF ^ n_tokens as u64).values(n_tokens * cols, 1.0);
        let mut xa = cpu.alloc(n_tokens * cols).unwrap();
        cpu.write(&mut xa, &x).unwrap();
        let mut ya = cpu.alloc(n_tokens * rows).unwrap();
        cpu.matmul(id, &xa, n_tokens, &mut ya).unwrap();
        let mut y = vec![0f32; n_tokens * rows];
        cpu.read(&ya, &mut y).unwrap();
        let wants = references(
            ty,
            data,
            rows,
            cols,
            &x,
            n_tokens,
            vec![("cpu backend".into(), y)],
        );
        worst = worst.max(check_q8(
            &ctx, &ks, ty, data, rows, cols, &x, n_tokens, &wants,
        ));
    }
    eprintln!("test model: max |gpu - cpu backend| / output range = {worst:.3e}");
}

#[test]
fn launches_check_their_arguments() {
    let ctx = context();
    let k = Kernels::new(&ctx).unwrap();
    let data = kernels_ref::quantize(kernels_ref::GgmlType::Q4_1, &[0.5; 64]).unwrap();
    let m =
        kernels::upload_matrix(&ctx, &repack(WeightFormat::Q4_1, &data, 2, 32).unwrap()).unwrap();
    let f = kernels::upload_matrix(
        &ctx,
        &repack(WeightFormat::F32, bytemuck::cast_slice(&[0f32; 64]), 2, 32).unwrap(),
    )
    .unwrap();
    let x = kernels::upload_f32(&ctx, "x", &[0.0; 64]).unwrap();
    let qx = kernels::upload_u32(&ctx, "qx", &[0; 16]).unwrap();
    let qd = kernels::upload_f32(&ctx, "qd", &[0.0; 8]).unwrap();
    let y = kernels::upload_f32(&ctx, "y", &[0.0; 8]).unwrap();
    let small = kernels::upload_f32(&ctx, "small", &[0.0; 4]).unwrap();
    let err = |r: memwall::Result<kernels::Launch<'_>>| match r {
        Ok(_) => panic!("accepted"),
        Err(e) => e.to_string(),
    };
    // Fits: 2 tokens of 32 columns; 2 rows into a stride of 4 at offset 2.
    assert!(k.quantize_act_launch(&x, &qx, &qd, 2, 32).is_ok());
    assert!(k.matvec_q8_launch(&m, &qx, &qd, &y, 2, 4, 2).is_ok());
    assert!(err(k.quantize_act_launch(&x, &qx, &qd, 1, 48)).contains("multiple of 32"));
    assert!(err(k.quantize_act_launch(&x, &qx, &qd, 0, 32)).contains("tokens"));
    assert!(err(k.quantize_act_launch(&x, &qx, &qd, 3, 32)).contains("x: buffer"));
    assert!(err(k.quantize_act_launch(&x, &qx, &small, 2, 32)).contains("qd: buffer"));
    assert!(err(k.matvec_q8_launch(&f, &qx, &qd, &y, 2, 4, 2)).contains("no integer path"));
    assert!(err(k.matvec_q8_launch(&m, &qx, &qd, &y, 2, 4, 3)).contains("do not fit"));
    assert!(err(k.matvec_q8_launch(&m, &qx, &qd, &y, 3, 2, 0)).contains("qx: buffer"));
    assert!(err(k.matvec_q8_launch(&m, &qx, &qd, &y, 2, 8, 0)).contains("y: buffer"));
}

/// The prefill matmul (8+ tokens on the row layout), with plain loads and, where the adapter
/// has subgroups of 8+ invocations, with subgroup broadcasts, gives the very bits of the
/// batched matvec (its launch fallback), which the tests above hold to the CPU.
#[test]
fn prefill_matmul_variants_match_the_batched_matvec_bit_for_bit() {
    let ctx = context();
    // 600 rows: 3 workgroups of 4 * 64 rows (the last partial) on a 2 x 2 grid (1 surplus);
    // 17 tokens: 3 tiles of 8 (the last partial); 3 chunks per row.
    let (rows, cols, n) = (600, 96, 17);
    let sg_ok = ctx.has_subgroups() && ctx.info.subgroup_min_size >= 8;
    for ty in [WeightFormat::Q4_0, WeightFormat::Q4_1, WeightFormat::Q8_0] {
        let mut rng = Rng(0xb17 ^ rows as u64);
        let data = kernels_ref::quantize(ty.ggml(), &rng.values(rows * cols, 2.0)).unwrap();
        let m = kernels::upload_matrix(&ctx, &repack(ty, &data, rows, cols).unwrap()).unwrap();
        let x = activations(0x79, n, cols);
        let xb = kernels::upload_f32(&ctx, "x", &x).unwrap();
        let run = |k: &Kernels, want_key: KernelKey| {
            let qx = kernels::upload_u32(&ctx, "qx", &vec![0; qx_words(n, cols)]).unwrap();
            let qd = kernels::upload_f32(&ctx, "qd", &vec![0.0; 4 * qd_vec4s(n, cols)]).unwrap();
            let y = kernels::upload_f32(&ctx, "y", &vec![f32::NAN; n * rows + 3]).unwrap();
            let dq = k
                .prepare(&ctx, k.quantize_act_launch(&xb, &qx, &qd, n, cols).unwrap())
                .unwrap();
            let l = k.matvec_q8_launch(&m, &qx, &qd, &y, n, rows, 0).unwrap();
            assert_eq!(l.key, want_key, "{ty:?}: launched {}", l.key.label());
            kernels::run(&ctx, &[&dq, &k.prepare(&ctx, l).unwrap()]).unwrap();
            let got = kernels::read_f32(&ctx, &y, n * rows + 3).unwrap();
            assert!(got[n * rows..].iter().all(|v| v.is_nan()), "{ty:?}: guard");
            got[..n * rows]
                .iter()
                .map(|v| v.to_bits())
                .collect::<Vec<u32>>()
        };
        let matmul = |subgroup| KernelKey::MatmulQ8Rows {
            ty,
            out: None,
            subgroup,
        };
        // The batched matvec: the matmul marked unavailable, as after a failed selftest.
        let mut base = Kernels::with_options(&ctx, false).unwrap();
        base.matvec_rows = true;
        base.unavailable.push(matmul(false));
        let want = run(&base, KernelKey::MatvecQ8Rows { ty });
        assert!(want.iter().all(|&b| !f32::from_bits(b).is_nan()), "{ty:?}");
        let mut sets = vec![(small_grid(&ctx, 2), false)];
        if ctx.has_subgroups() {
            let mut k = Kernels::with_options(&ctx, true).unwrap();
            k.max_groups_per_dim = 2;
            sets.push((k, true));
        }
        for (mut k, subgroup) in sets {
            k.matvec_rows = true;
            // The subgroup variant is compiled under its key where the adapter can run it,
            // else its plain fallback.
            let ran = if subgroup && !sg_ok {
                matmul(false)
            } else {
                matmul(subgroup)
            };
            let subst = k.substitutions.iter().find(|(a, _)| *a == matmul(subgroup));
            assert_eq!(subst.map_or(matmul(subgroup), |s| s.1), ran, "{ty:?}");
            // Whole workgroups (a GPU) and the fewer live invocations per workgroup chosen
            // for 1, 2 or 3 worker threads: the same bits.
            for threads in [0, 1, 2, 3] {
                k.row_balance.threads = threads;
                let stride = k.row_balance.stride(rows as u32, 4);
                assert_eq!(
                    stride < 64,
                    threads > 0,
                    "{threads} threads: stride {stride}"
                );
                let got = run(&k, matmul(subgroup));
                let diff = got.iter().zip(&want).position(|(a, b)| a != b);
                assert!(
                    diff.is_none(),
                    "{ty:?} {} stride {stride}: element {diff:?} differs from the batched matvec",
                    ran.label()
                );
            }
        }
    }
}

/// The register tiles of the row layout (tiles of 8 and of 4 tokens, then single tokens) give
/// every token of a batch the very bits that token gets alone (the decode path), for every
/// batch size from 2 to 13 and both kernels that take them (the decode matvec below 8 tokens,
/// the prefill matmul from 8): each tile shape sums a row's chunks in the same order.
#[test]
fn register_tiles_give_every_token_its_decode_bits() {
    let ctx = context();
    // 300 rows: a partial last workgroup, and rows r + 3 S past the matrix for some
    // invocations; 3 chunks per row.
    let (rows, cols, n_max) = (300, 96, 13);
    for ty in [WeightFormat::Q4_1, WeightFormat::Q8_0] {
        let mut rng = Rng(0x7e57 ^ rows as u64);
        let data = kernels_ref::quantize(ty.ggml(), &rng.values(rows * cols, 2.0)).unwrap();
        let m = kernels::upload_matrix(&ctx, &repack(ty, &data, rows, cols).unwrap()).unwrap();
        let x = activations(0x99, n_max, cols);
        // (the kernel launched, y as bits) for the first n tokens of xs.
        let run = |k: &Kernels, xs: &[f32], n: usize| {
            let xb = kernels::upload_f32(&ctx, "x", &xs[..n * cols]).unwrap();
            let qx = kernels::upload_u32(&ctx, "qx", &vec![0; qx_words(n, cols)]).unwrap();
            let qd = kernels::upload_f32(&ctx, "qd", &vec![0.0; 4 * qd_vec4s(n, cols)]).unwrap();
            let y = kernels::upload_f32(&ctx, "y", &vec![f32::NAN; n * rows]).unwrap();
            let dq = k
                .prepare(&ctx, k.quantize_act_launch(&xb, &qx, &qd, n, cols).unwrap())
                .unwrap();
            let l = k.matvec_q8_launch(&m, &qx, &qd, &y, n, rows, 0).unwrap();
            let key = l.key;
            kernels::run(&ctx, &[&dq, &k.prepare(&ctx, l).unwrap()]).unwrap();
            let got = kernels::read_f32(&ctx, &y, n * rows).unwrap();
            (key, got.iter().map(|v| v.to_bits()).collect::<Vec<u32>>())
        };
        let mut sets = vec![Kernels::with_options(&ctx, false).unwrap()];
        if ctx.has_subgroups() {
            sets.push(Kernels::with_options(&ctx, true).unwrap());
        }
        for mut k in sets {
            k.matvec_rows = true;
            let alone: Vec<Vec<u32>> = (0..n_max)
                .map(|t| {
                    let (key, y) = run(&k, &x[t * cols..], 1);
                    assert_eq!(key, KernelKey::MatvecQ8Rows { ty });
                    assert!(y.iter().all(|&b| !f32::from_bits(b).is_nan()), "{ty:?}");
                    y
                })
                .collect();
            for n in 2..=n_max {
                let (key, got) = run(&k, &x, n);
                assert_eq!(
                    matches!(key, KernelKey::MatmulQ8Rows { .. }),
                    n >= 8,
                    "{ty:?} x {n}: launched {}",
                    key.label()
                );
                for (t, want) in alone.iter().enumerate().take(n) {
                    let diff = got[t * rows..(t + 1) * rows]
                        .iter()
                        .zip(want)
                        .position(|(a, b)| a != b);
                    assert!(
                        diff.is_none(),
                        "{} x {n} tokens: token {t} row {diff:?} differs from the token alone",
                        key.label()
                    );
                }
            }
        }
    }
}
