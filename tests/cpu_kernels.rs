//! memwall::cpu matmul against an f64 oracle, for every weight format, odd shapes, 1/3/17
//! tokens, both the AVX2 and the portable path.

mod common;

use common::{random_weights, Rng};
use memwall::cpu::{self, Isa, MatmulScratch, PackedWeight, WeightView};
use memwall::GgmlType;

const QUANT_TYPES: [GgmlType; 13] = [
    GgmlType::Q4_0,
    GgmlType::Q4_1,
    GgmlType::Q5_0,
    GgmlType::Q5_1,
    GgmlType::Q8_0,
    GgmlType::IQ4_NL,
    GgmlType::IQ4_XS,
    GgmlType::Q2_K,
    GgmlType::Q3_K,
    GgmlType::Q4_K,
    GgmlType::Q5_K,
    GgmlType::Q6_K,
    GgmlType::TQ2_0,
];
const FLOAT_TYPES: [GgmlType; 3] = [GgmlType::F32, GgmlType::F16, GgmlType::BF16];
/// Formats without a fast kernel: dequantized a row at a time by kernels-ref, then f32 dots.
const FALLBACK_TYPES: [GgmlType; 1] = [GgmlType::TQ1_0];

/// The kernel paths this CPU runs, by the names `MEMWALL_EXPECT_ISA` uses.
const ISA_NAMES: [(Isa, &str); 4] = [
    (Isa::Scalar, "scalar"),
    (Isa::Avx2, "avx2"),
    (Isa::AvxVnni, "avxvnni"),
    (Isa::Avx512Vnni, "avx512vnni"),
];

/// Which kernel paths these tests exercise, stated on stderr; and with `MEMWALL_EXPECT_ISA` (a
/// comma list of `ISA_NAMES`, which `scripts/test.sh` derives from the CPU's flags in
/// /proc/cpuinfo) every path the CPU has must be detected, so the tests of an ISA the CPU has
/// cannot be skipped by a detection that went wrong. The scalar path runs on every CPU.
#[test]
fn isa_paths_tested_are_the_cpus() {
    let ran: Vec<&str> = ISA_NAMES
        .iter()
        .filter(|(i, _)| i.available())
        .map(|(_, n)| *n)
        .collect();
    eprintln!("CPU kernel paths tested: {}", ran.join(" "));
    assert!(ran.contains(&"scalar"));
    if let Ok(expect) = std::env::var("MEMWALL_EXPECT_ISA") {
        for name in expect.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            assert!(
                ISA_NAMES.iter().any(|(_, n)| *n == name),
                "MEMWALL_EXPECT_ISA names {name:?}, not one of {ISA_NAMES:?}"
            );
            assert!(
                ran.contains(&name),
                "the CPU's flags list {name} but memwall does not detect it: its kernels would \
                 go untested"
            );
        }
    }
}

fn isas() -> Vec<Isa> {
    [Isa::Scalar, Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni]
        .into_iter()
        .filter(|i| i.available())
        .collect()
}

/// Column counts: one block, a few blocks, and more than 128 chunks of 32 (the AVX2 kernel
/// flushes its offset terms every 64 or 128 chunks), none a multiple of a thread chunk. Float formats also get counts that
/// are not a multiple of the 8-lane vector, to reach the scalar tails.
fn col_cases(ty: GgmlType) -> Vec<usize> {
    let b = ty.block_size().max(32);
    if ty.block_size() == 1 {
        vec![1, 37, 2083]
    } else if b == 256 {
        vec![256, 768, 256 * 17]
    } else {
        vec![b, 3 * b, 32 * 133]
    }
}

/// The error a matmul output may have, for weights `w` ([cols], dequantized by the oracle) and
/// activations `x` ([cols]).
///
/// Quantized formats: the kernel computes Σ w·x̂ exactly in integers, where x̂ = d·round(x/d)
/// is x quantized per chunk of 32 with d = max|x|/127, so |x - x̂| <= d/2 per element and
/// |Σ w·x - Σ w·x̂| <= Σ |w| d_chunk / 2. On top of that come f32 roundings of the per-chunk
/// products and their running sum: at most ~(chunks + 8) roundings of terms each bounded by
/// 3·max|w|·Σ|x| per chunk (a chunk's scale part is at most 2·max|w| and its offset part at most
/// max|w|, see `formats.rs`), so we allow 4·eps·(chunks + 8)·3·max|w|·Σ|x|.
/// Float formats (and the kernels-ref fallback, which dots exact dequantized rows with
/// unquantized x): only the f32 accumulation error, (cols/8 + 8) roundings of Σ|w·x|.
fn tolerance(ty: GgmlType, w: &[f32], x: &[f32]) -> f64 {
    let eps = f32::EPSILON as f64;
    let sum_wx: f64 = w
        .iter()
        .zip(x)
        .map(|(a, b)| (*a as f64 * *b as f64).abs())
        .sum();
    if !cpu::has_fast_kernel(ty) || matches!(ty, GgmlType::F32 | GgmlType::F16 | GgmlType::BF16) {
        return 2.0 * eps * (w.len() as f64 / 8.0 + 8.0) * sum_wx + 1e-30;
    }
    let mut quant = 0.0f64;
    for (wc, xc) in w.chunks(32).zip(x.chunks(32)) {
        let d = xc.iter().fold(0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
        quant += wc.iter().map(|v| v.abs() as f64).sum::<f64>() * d / 2.0;
    }
    let wmax = w.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
    let sum_x: f64 = x.iter().map(|v| v.abs() as f64).sum();
    let chunks = (w.len() / 32) as f64;
    quant * 1.0001 + 4.0 * eps * (chunks + 8.0) * 3.0 * wmax * sum_x + 1e-30
}

/// Runs matmul for one case on `isa` and checks every output against the f64 oracle.
/// Returns the worst err/tol ratio seen.
fn check_case(isa: Isa, ty: GgmlType, rows: usize, cols: usize, n: usize, seed: u64) -> f64 {
    let mut rng = Rng::new(seed);
    let data = random_weights(&mut rng, ty, rows, cols);
    let x = rng.activations(n * cols);
    let w = WeightView::new(ty, &data, rows, cols).unwrap();
    let mut y = vec![f32::NAN; n * rows]; // poisoned: every output must be written
    let mut scratch = MatmulScratch::default();
    cpu::matmul_with(isa, &w, &x, n, &mut y, &mut scratch).unwrap();
    check_outputs(&format!("{isa:?}"), &w, &x, n, &y)
}

/// Checks y: [n][rows] = x · wᵀ against the f64 oracle (kernels-ref's dequantization) within
/// `tolerance`. Returns the worst err/tol ratio seen.
fn check_outputs(what: &str, w: &WeightView, x: &[f32], n: usize, y: &[f32]) -> f64 {
    let (ty, rows, cols) = (w.ty, w.rows, w.cols);
    let wf = kernels_ref::dequantize_vec(ty, w.data, rows * cols).unwrap(); // [rows, cols]
    let mut worst = 0.0f64;
    for t in 0..n {
        let xt = &x[t * cols..(t + 1) * cols];
        for r in 0..rows {
            let wr = &wf[r * cols..(r + 1) * cols];
            let exact: f64 = wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
            let got = y[t * rows + r];
            let tol = tolerance(ty, wr, xt);
            let err = (got as f64 - exact).abs();
            assert!(
                got.is_finite() && err <= tol,
                "{what} {ty} {rows}x{cols} n={n}: y[{t}][{r}] = {got}, expected {exact}, \
                 err {err:e} > tol {tol:e}"
            );
            worst = worst.max(err / tol);
        }
    }
    worst
}

#[test]
fn every_format_matches_oracle() {
    for isa in isas() {
        for ty in QUANT_TYPES
            .iter()
            .chain(&FLOAT_TYPES)
            .chain(&FALLBACK_TYPES)
            .copied()
        {
            let mut worst = 0.0f64;
            for cols in col_cases(ty) {
                for (rows, n) in [(1, 1), (37, 3), (133, 17), (133, 1)] {
                    let seed = (rows * 31 + cols * 7 + n) as u64;
                    worst = worst.max(check_case(isa, ty, rows, cols, n, seed));
                }
            }
            // How much of the bound the worst output used (informative, see --nocapture).
            eprintln!("{isa:?} {ty}: worst err/tol {worst:.3}");
        }
    }
}

/// The AVX2 and portable paths quantize activations identically and differ only in f32
/// summation order, so they must agree to the f32 part of the tolerance.
#[test]
fn scalar_and_avx2_agree() {
    if !Isa::Avx2.available() {
        eprintln!("no AVX2 on this CPU: the scalar path is the only one and is checked above");
        return;
    }
    for ty in QUANT_TYPES
        .iter()
        .chain(&FLOAT_TYPES)
        .chain(&FALLBACK_TYPES)
        .copied()
    {
        let cols = col_cases(ty)[2];
        let (rows, n) = (61, 5);
        let mut rng = Rng::new(7);
        let data = random_weights(&mut rng, ty, rows, cols);
        let x = rng.activations(n * cols);
        let w = WeightView::new(ty, &data, rows, cols).unwrap();
        let mut ys = vec![f32::NAN; n * rows];
        let mut ya = vec![f32::NAN; n * rows];
        let mut scratch = MatmulScratch::default();
        cpu::matmul_with(Isa::Scalar, &w, &x, n, &mut ys, &mut scratch).unwrap();
        cpu::matmul_with(Isa::Avx2, &w, &x, n, &mut ya, &mut scratch).unwrap();
        assert_f32_close(&ty.to_string(), &w, &x, n, (&ys, "scalar"), (&ya, "avx2"));
    }
}

/// The AVX-VNNI kernels compute the very integer sums of the AVX2 ones (one `vpdpbusd` for
/// `maddubs` + `madd`) and the same float steps after them: results are bit-identical.
#[test]
fn avx_vnni_equals_avx2() {
    if !Isa::AvxVnni.available() {
        eprintln!("no AVX-VNNI on this CPU: the AVX2 and scalar paths are checked above");
        return;
    }
    for ty in QUANT_TYPES {
        for n in [1usize, 5, 8, 11] {
            let cols = col_cases(ty)[2];
            let rows = 37;
            let mut rng = Rng::new(11 + n as u64);
            let data = random_weights(&mut rng, ty, rows, cols);
            let x = rng.activations(n * cols);
            let w = WeightView::new(ty, &data, rows, cols).unwrap();
            let mut ya = vec![f32::NAN; n * rows];
            let mut yv = vec![f32::NAN; n * rows];
            let mut scratch = MatmulScratch::default();
            cpu::matmul_with(Isa::Avx2, &w, &x, n, &mut ya, &mut scratch).unwrap();
            cpu::matmul_with(Isa::AvxVnni, &w, &x, n, &mut yv, &mut scratch).unwrap();
            assert_eq!(ya, yv, "{ty} {rows}x{cols} n={n}");
        }
    }
}

/// The AVX-512 GEMM (prefill of Q4_0 / Q4_1 / Q8_0) against the f64 oracle on the shapes that
/// reach its edges: rows that fill no, one or several 16-row panels with a partial last one,
/// one token (decode), token counts not a multiple of its 8-token tile, and a full prefill; its
/// outputs equal the AVX-VNNI kernels' to the f32 part of the tolerance, and a token's outputs
/// are bit-identical whether it is computed alone or in a batch.
#[test]
fn avx512_gemm_matches_oracle_and_vnni() {
    if !Isa::Avx512Vnni.available() {
        eprintln!("no AVX-512 VNNI on this CPU: the other paths are checked above");
        return;
    }
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        for (rows, cols, n) in [
            (1, 32, 4),
            (15, 64, 5),
            (16, 96, 8),
            (17, 576, 9),
            (33, 32 * 133, 4),
            (37, 576, 1),
            (37, 576, 3),
            (40, 1536, 128),
        ] {
            check_case(Isa::Avx512Vnni, ty, rows, cols, n, gemm_seed(rows, cols, n));
            let (data, x) = gemm_inputs(ty, rows, cols, n);
            let w = WeightView::new(ty, &data, rows, cols).unwrap();
            let mut ya = vec![f32::NAN; n * rows];
            let mut yb = vec![f32::NAN; n * rows];
            let mut scratch = MatmulScratch::default();
            cpu::matmul_with(Isa::Avx512Vnni, &w, &x, n, &mut ya, &mut scratch).unwrap();
            cpu::matmul_with(Isa::AvxVnni, &w, &x, n, &mut yb, &mut scratch).unwrap();
            let t = n - 1;
            let mut y1 = vec![f32::NAN; rows];
            let x1 = &x[t * cols..];
            cpu::matmul_with(Isa::Avx512Vnni, &w, x1, 1, &mut y1, &mut scratch).unwrap();
            assert_eq!(
                y1,
                ya[t * rows..],
                "{ty} {rows}x{cols}: token {t} alone vs in a batch"
            );
            assert_f32_close(
                &format!("{ty} {rows}x{cols} n={n}"),
                &w,
                &x,
                n,
                (&ya, "avx512"),
                (&yb, "vnni"),
            );
        }
    }
}

fn gemm_seed(rows: usize, cols: usize, n: usize) -> u64 {
    (rows * 131 + cols + n) as u64
}

/// Random weights [rows][cols] of `ty` and activations [n][cols] for a GEMM case.
fn gemm_inputs(ty: GgmlType, rows: usize, cols: usize, n: usize) -> (Vec<u8>, Vec<f32>) {
    let mut rng = Rng::new(gemm_seed(rows, cols, n));
    let data = random_weights(&mut rng, ty, rows, cols);
    let x = rng.activations(n * cols);
    (data, x)
}

/// y: [n][rows] = x · wᵀ on `isa`.
fn mm(isa: Isa, w: &WeightView, x: &[f32], n: usize) -> Vec<f32> {
    let mut y = vec![f32::NAN; n * w.rows];
    cpu::matmul_with(isa, w, x, n, &mut y, &mut MatmulScratch::default()).unwrap();
    y
}

/// Weights packed at load for the AVX-512 GEMM give the same bits as the per-call packing
/// (itself checked against the oracle above), alone and fused in `matmul_many`, for odd row
/// counts and 1..128 tokens, and a token's outputs do not depend on its batch. Other ISAs
/// ignore the packed copy.
#[test]
fn avx512_packed_weights_match_per_call() {
    if !Isa::Avx512Vnni.available() {
        assert!(!PackedWeight::supported(Isa::best(), GgmlType::Q4_0));
        eprintln!("no AVX-512 VNNI on this CPU: nothing is packed");
        return;
    }
    let isa = Isa::Avx512Vnni;
    for ty in [GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0] {
        assert!(PackedWeight::supported(isa, ty) && !PackedWeight::supported(Isa::AvxVnni, ty));
        let mut cases = vec![(1, 32, 1), (17, 64, 3), (33, 32 * 133, 9), (16, 1536, 8)];
        cases.extend([1, 2, 7, 8, 9, 16, 31, 64, 127, 128].map(|n| (37, 576, n)));
        for (rows, cols, n) in cases {
            let (data, x) = gemm_inputs(ty, rows, cols, n);
            let w = WeightView::new(ty, &data, rows, cols).unwrap();
            let packed = PackedWeight::pack(isa, &w).unwrap().unwrap();
            assert_eq!(packed.bytes(), rows.div_ceil(16) * 16 * w.row_bytes());
            assert_eq!(
                PackedWeight::bytes_for(isa, ty, rows, cols),
                packed.bytes() as u64
            );
            let wp = w.with_packed(&packed).unwrap();
            let what = format!("{isa:?} {ty} {rows}x{cols} n={n}");
            let y = mm(isa, &wp, &x, n);
            assert_eq!(y, mm(isa, &w, &x, n), "{what}: packed vs per call");
            assert_eq!(mm(Isa::AvxVnni, &wp, &x, n), mm(Isa::AvxVnni, &w, &x, n));
            for t in [0, n / 2, n - 1] {
                let y1 = mm(isa, &wp, &x[t * cols..(t + 1) * cols], 1);
                assert_eq!(y1, y[t * rows..(t + 1) * rows], "{what}: token {t} alone");
            }
            // Fused with a second (unpacked) weight of the same format.
            let (d2, _) = gemm_inputs(ty, 5, cols, 1);
            let w2 = WeightView::new(ty, &d2, 5, cols).unwrap();
            let (mut ya, mut yb) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * 5]);
            let mut s = MatmulScratch::default();
            cpu::matmul_many_with(isa, &[wp, w2], &x, n, &mut [&mut ya, &mut yb], &mut s).unwrap();
            assert_eq!(ya, y, "{what}: fused");
            assert_eq!(yb, mm(isa, &w2, &x, n), "{what}: fused second weight");
        }
    }
    // A packed copy of another shape is refused.
    let (data, _) = gemm_inputs(GgmlType::Q4_0, 17, 64, 1);
    let w = WeightView::new(GgmlType::Q4_0, &data, 17, 64).unwrap();
    let p = PackedWeight::pack(isa, &w).unwrap().unwrap();
    let other = WeightView::new(GgmlType::Q4_0, &data, 34, 32).unwrap();
    assert!(other.with_packed(&p).is_err());
    // Formats without a packed layout are not packed.
    for ty in [GgmlType::TQ1_0, GgmlType::TQ2_0, GgmlType::F16] {
        let (d, _) = gemm_inputs(ty, 3, 256, 1);
        let w = WeightView::new(ty, &d, 3, 256).unwrap();
        assert!(PackedWeight::pack(isa, &w).unwrap().is_none(), "{ty}");
    }
}

/// Formats the GEMM reads only from a copy packed at load (the K-quants, Q5_0, Q5_1, IQ4_NL),
/// on each ISA that has a GEMM for them (AVX-512 VNNI, AVX-VNNI, AVX2): packed, every output is
/// within the oracle's tolerance and equals the row kernels' to the f32 part of it, for rows
/// that fill no, one or several 16-row panels, 1 to 128 tokens and several blocks; a token's
/// outputs are bit-identical alone or in a batch and alone or fused with other packed weights
/// (of another format too, as Q/K/V of a "Q4_K_M" file are); the packed copy is as large as the
/// plan counts. Unpacked, these formats run the row kernels for every batch size (one weight,
/// one summation order).
#[test]
fn packed_formats_match_oracle() {
    let packed_only = [
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::IQ4_NL,
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q6_K,
        GgmlType::Q2_K,
        GgmlType::Q3_K,
    ];
    let gemm_isas: Vec<Isa> = [Isa::Avx2, Isa::AvxVnni, Isa::Avx512Vnni]
        .into_iter()
        .filter(|i| i.available())
        .collect();
    for (isa, ty) in gemm_isas
        .iter()
        .flat_map(|&i| packed_only.iter().map(move |&t| (i, t)))
    {
        if !PackedWeight::supported(isa, ty) {
            // vpmaddubsw would saturate on IQ4_NL's shifted levels.
            assert_eq!((isa, ty), (Isa::Avx2, GgmlType::IQ4_NL));
            continue;
        }
        assert!(!PackedWeight::supported(Isa::Scalar, ty));
        let b = ty.block_size();
        let mut cases = vec![(1, b, 1), (17, 3 * b, 3), (33, 2048, 9), (16, 1536, 8)];
        cases.extend([1, 2, 7, 8, 9, 31, 128].map(|n| (37, 768, n)));
        let mut worst = 0.0f64;
        for (rows, cols, n) in cases {
            let (data, x) = gemm_inputs(ty, rows, cols, n);
            let w = WeightView::new(ty, &data, rows, cols).unwrap();
            let packed = PackedWeight::pack(isa, &w).unwrap().unwrap();
            let plain = w.row_bytes() * rows.div_ceil(16) * 16;
            // The file's bytes rearranged; the 6-bit scale tables of Q4_K, Q5_K and Q3_K
            // widened to bytes (+2.8%, +2.3%, +3.6%).
            let pb = packed.bytes();
            assert!(
                pb >= plain && pb <= plain + plain / 25,
                "{ty}: {pb} vs {plain}"
            );
            assert_eq!(
                PackedWeight::bytes_for(isa, ty, rows, cols),
                packed.bytes() as u64
            );
            let wp = w.with_packed(&packed).unwrap();
            let what = format!("{isa:?} {ty} {rows}x{cols} n={n}");
            let y = mm(isa, &wp, &x, n);
            worst = worst.max(check_outputs("packed", &wp, &x, n, &y));
            // Unpacked, the same ISA runs its row kernels (AVX-512 runs AVX-VNNI's), which stay
            // within the f32 part of the tolerance of the GEMM.
            let row_isa = if isa == Isa::Avx512Vnni {
                Isa::AvxVnni
            } else {
                isa
            };
            let yv = mm(isa, &w, &x, n);
            let mut s = MatmulScratch::default();
            let mut yr = vec![f32::NAN; n * rows];
            cpu::matmul_with(row_isa, &w, &x, n, &mut yr, &mut s).unwrap();
            assert_eq!(yv, yr, "{what}: unpacked runs the row kernels");
            assert_f32_close(&what, &w, &x, n, (&y, "gemm"), (&yv, "row kernel"));
            for t in [0, n / 2, n - 1] {
                let y1 = mm(isa, &wp, &x[t * cols..(t + 1) * cols], 1);
                assert_eq!(y1, y[t * rows..(t + 1) * rows], "{what}: token {t} alone");
            }
            // Fused with a packed weight of another format, as a file's Q/K/V are.
            let ty2 = if ty == GgmlType::Q6_K {
                GgmlType::Q4_K
            } else {
                GgmlType::Q6_K
            };
            if cols.is_multiple_of(256) {
                let (d2, _) = gemm_inputs(ty2, 5, cols, 1);
                let w2 = WeightView::new(ty2, &d2, 5, cols).unwrap();
                let p2 = PackedWeight::pack(isa, &w2).unwrap().unwrap();
                let w2p = w2.with_packed(&p2).unwrap();
                let (mut ya, mut yb) = (vec![f32::NAN; n * rows], vec![f32::NAN; n * 5]);
                let mut s = MatmulScratch::default();
                cpu::matmul_many_with(isa, &[wp, w2p], &x, n, &mut [&mut ya, &mut yb], &mut s)
                    .unwrap();
                assert_eq!(ya, y, "{what}: fused");
                assert_eq!(yb, mm(isa, &w2p, &x, n), "{what}: fused {ty2}");
            }
        }
        eprintln!("{isa:?} packed {ty}: worst err/tol {worst:.3}");
    }
}

/// One scratch reused across shapes and formats (as the model does) gives the same results as
/// fresh scratch.
#[test]
fn scratch_reuse_across_shapes() {
    let mut scratch = MatmulScratch::default();
    for (i, (ty, rows, cols, n)) in [
        (GgmlType::Q4_1, 40, 1536, 9),
        (GgmlType::Q8_0, 70, 576, 2),
        (GgmlType::Q6_K, 9, 512, 17),
        (GgmlType::Q4_1, 40, 64, 1),
    ]
    .into_iter()
    .enumerate()
    {
        let mut rng = Rng::new(100 + i as u64);
        let data = random_weights(&mut rng, ty, rows, cols);
        let x = rng.activations(n * cols);
        let w = WeightView::new(ty, &data, rows, cols).unwrap();
        let mut y1 = vec![f32::NAN; n * rows];
        let mut y2 = vec![f32::NAN; n * rows];
        cpu::matmul(&w, &x, n, &mut y1, &mut scratch).unwrap();
        cpu::matmul(&w, &x, n, &mut y2, &mut MatmulScratch::default()).unwrap();
        assert_eq!(y1, y2, "{ty} {rows}x{cols} n={n}");
    }
}

/// `matmul_many` (one activation quantization, one parallel region for several weights) gives
/// the very values of one `matmul` per weight: mixed formats, a float weight (per-weight
/// fallback), one token (decode) and several tiles (prefill), sizes both below and above the
/// single-thread threshold.
#[test]
fn matmul_many_equals_separate_matmuls() {
    let sets: [&[(GgmlType, usize)]; 3] = [
        &[
            (GgmlType::Q4_1, 576),
            (GgmlType::Q4_1, 192),
            (GgmlType::Q4_1, 192),
        ],
        &[
            (GgmlType::Q8_0, 37),
            (GgmlType::Q6_K, 70),
            (GgmlType::Q4_0, 5),
        ],
        &[(GgmlType::Q4_0, 300), (GgmlType::F16, 40)],
    ];
    for isa in isas() {
        for (si, set) in sets.iter().enumerate() {
            let cols = 512;
            for n in [1usize, 3, 17] {
                let mut rng = Rng::new(300 + si as u64);
                let data: Vec<Vec<u8>> = set
                    .iter()
                    .map(|&(ty, rows)| random_weights(&mut rng, ty, rows, cols))
                    .collect();
                let ws: Vec<WeightView> = set
                    .iter()
                    .zip(&data)
                    .map(|(&(ty, rows), d)| WeightView::new(ty, d, rows, cols).unwrap())
                    .collect();
                let x = rng.activations(n * cols);
                let mut scratch = MatmulScratch::default();
                let mut fused: Vec<Vec<f32>> =
                    set.iter().map(|&(_, r)| vec![f32::NAN; n * r]).collect();
                let mut outs: Vec<&mut [f32]> = fused.iter_mut().map(|v| &mut v[..]).collect();
                cpu::matmul_many_with(isa, &ws, &x, n, &mut outs, &mut scratch).unwrap();
                for (w, got) in ws.iter().zip(&fused) {
                    let mut want = vec![f32::NAN; n * w.rows];
                    cpu::matmul_with(isa, w, &x, n, &mut want, &mut scratch).unwrap();
                    assert_eq!(got, &want, "{isa:?} set {si} {} n={n}", w.ty);
                }
            }
        }
    }
}

/// `matmul_each` (each weight over its own one-token input, one parallel region) gives the
/// very values of one one-token `matmul` per weight: the routed experts' down projections of
/// a token, with mixed formats and a float weight (per-weight fallback), small and large.
#[test]
fn matmul_each_equals_separate_one_token_matmuls() {
    let sets: [&[(GgmlType, usize)]; 3] = [
        &[(GgmlType::Q4_1, 576), (GgmlType::Q4_1, 576)],
        &[
            (GgmlType::Q8_0, 37),
            (GgmlType::Q6_K, 70),
            (GgmlType::Q4_K, 5),
            (GgmlType::Q4_0, 1000),
        ],
        &[(GgmlType::Q4_0, 300), (GgmlType::F16, 40)],
    ];
    for isa in isas() {
        for (si, set) in sets.iter().enumerate() {
            let cols = 512;
            let mut rng = Rng::new(400 + si as u64);
            let data: Vec<Vec<u8>> = set
                .iter()
                .map(|&(ty, rows)| random_weights(&mut rng, ty, rows, cols))
                .collect();
            let ws: Vec<WeightView> = set
                .iter()
                .zip(&data)
                .map(|(&(ty, rows), d)| WeightView::new(ty, d, rows, cols).unwrap())
                .collect();
            let x = rng.activations(ws.len() * cols); // [ws.len(), cols]
            let mut scratch = MatmulScratch::default();
            let mut each: Vec<Vec<f32>> = set.iter().map(|&(_, r)| vec![f32::NAN; r]).collect();
            let mut outs: Vec<&mut [f32]> = each.iter_mut().map(|v| &mut v[..]).collect();
            cpu::matmul_each_with(isa, &ws, &x, &mut outs, &mut scratch).unwrap();
            for (i, (w, got)) in ws.iter().zip(&each).enumerate() {
                let mut want = vec![f32::NAN; w.rows];
                let xi = &x[i * cols..(i + 1) * cols];
                cpu::matmul_with(isa, w, xi, 1, &mut want, &mut scratch).unwrap();
                assert_eq!(got, &want, "{isa:?} set {si} weight {i} {}", w.ty);
            }
            // An input count that does not match the weights is an error, not a panic.
            let mut outs: Vec<&mut [f32]> = each.iter_mut().map(|v| &mut v[..]).collect();
            assert!(cpu::matmul_each_with(isa, &ws, &x[cols..], &mut outs, &mut scratch).is_err());
        }
    }
}

#[test]
fn bad_arguments_are_errors() {
    let data = vec![0u8; 20 * 2];
    assert!(WeightView::new(GgmlType::Q4_1, &data, 2, 32).is_ok());
    assert!(WeightView::new(GgmlType::Q4_1, &data, 3, 32).is_err());
    assert!(WeightView::new(GgmlType::Q4_1, &data, 1, 33).is_err());
    let w = WeightView::new(GgmlType::Q4_1, &data, 2, 32).unwrap();
    let mut s = MatmulScratch::default();
    let mut y = vec![0.0; 2];
    assert!(cpu::matmul(&w, &[0.0; 31], 1, &mut y, &mut s).is_err());
    assert!(cpu::matmul(&w, &[0.0; 32], 1, &mut y[..1], &mut s).is_err());
    assert!(cpu::matmul(&w, &[0.0; 32], 1, &mut y, &mut s).is_ok());
    // A type ggml knows but memwall cannot compute with is a typed error, not a panic.
    // Zero columns: every output is the empty sum (the poison must be overwritten).
    let w0 = WeightView::new(GgmlType::Q8_0, &[], 3, 0).unwrap();
    let mut y0 = vec![f32::NAN; 6];
    cpu::matmul(&w0, &[], 2, &mut y0, &mut s).unwrap();
    assert_eq!(y0, vec![0.0; 6]);
    let iq = vec![0u8; GgmlType::IQ2_XXS.type_size()];
    let w = WeightView::new(GgmlType::IQ2_XXS, &iq, 1, 256).unwrap();
    let err = cpu::matmul(&w, &[0.0; 256], 1, &mut y[..1], &mut s).unwrap_err();
    assert!(
        matches!(err, memwall::Error::UnsupportedType { .. }),
        "{err}"
    );
}

/// The real model's weights (Q4_1 layers, Q8_0 token embedding used as the tied output) through
/// matmul against the oracle. Fails when the model is missing.
#[test]
fn real_model_weights_match_oracle() {
    let path = std::env::var("MEMWALL_MODEL").unwrap_or_else(|_| {
        format!(
            "{}/.cache/memwall/SmolLM2-135M-Instruct.Q4_1.gguf",
            std::env::var("HOME").unwrap()
        )
    });
    let g = memwall::gguf::Gguf::open(&path).unwrap_or_else(|e| panic!("model {path}: {e}"));
    let mut rng = Rng::new(9);
    let mut scratch = MatmulScratch::default();
    for name in [
        "blk.0.ffn_down.weight",
        "blk.3.attn_k.weight",
        "token_embd.weight",
    ] {
        let t = g.require_tensor(name).unwrap();
        let (cols, all_rows) = (t.dims[0] as usize, t.dims[1] as usize);
        // The first 300 rows are plenty for the 49152-row embedding.
        let rows = all_rows.min(300);
        let rb = t.ty.row_bytes(cols as u64).unwrap() as usize;
        let data = &g.tensor_data(t)[..rows * rb];
        let w = WeightView::new(t.ty, data, rows, cols).unwrap();
        let wf = kernels_ref::dequantize_vec(t.ty, data, rows * cols).unwrap();
        for n in [1, 5] {
            let x = rng.activations(n * cols);
            let mut y = vec![f32::NAN; n * rows];
            cpu::matmul(&w, &x, n, &mut y, &mut scratch).unwrap();
            for tk in 0..n {
                let xt = &x[tk * cols..(tk + 1) * cols];
                for r in 0..rows {
                    let wr = &wf[r * cols..(r + 1) * cols];
                    let exact: f64 = wr.iter().zip(xt).map(|(a, b)| *a as f64 * *b as f64).sum();
                    let tol = tolerance(t.ty, wr, xt);
                    let got = y[tk * rows + r];
                    assert!(
                        (got as f64 - exact).abs() <= tol,
                        "{name} y[{tk}][{r}] = {got}, expected {exact}, tol {tol:e}"
                    );
                }
            }
        }
    }
}

/// Two paths' outputs y: [n][rows] of x · wᵀ that differ only in f32 summation order agree to
/// the f32 part of the tolerance: 8 eps (cols / 8 + 8) 3 max|w| Σ|x|.
fn assert_f32_close(
    what: &str,
    w: &WeightView,
    x: &[f32],
    n: usize,
    (a, an): (&[f32], &str),
    (b, bn): (&[f32], &str),
) {
    let (rows, cols) = (w.rows, w.cols);
    let wf = kernels_ref::dequantize_vec(w.ty, w.data, rows * cols).unwrap();
    for i in 0..n * rows {
        let (t, r) = (i / rows, i % rows);
        let wr = &wf[r * cols..(r + 1) * cols];
        let xt = &x[t * cols..(t + 1) * cols];
        let eps = f32::EPSILON as f64;
        let wmax = wr.iter().fold(0f32, |m, v| m.max(v.abs())) as f64;
        let sum_x: f64 = xt.iter().map(|v| v.abs() as f64).sum();
        let tol = 8.0 * eps * (cols as f64 / 8.0 + 8.0) * 3.0 * wmax * sum_x;
        let d = (a[i] as f64 - b[i] as f64).abs();
        assert!(
            d <= tol,
            "{what} y[{t}][{r}]: {an} {} {bn} {} diff {d:e} > {tol:e}",
            a[i],
            b[i]
        );
    }
}
