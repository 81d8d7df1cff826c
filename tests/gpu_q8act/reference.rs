//! Host references for the q8 tests: the CPU's activation quantizer re-implemented, test
//! inputs, and the CPU / kernels-ref results with their derived tolerances.

use crate::gpu_support::{Rng, U};
use memwall::cpu::{matmul_with, Isa, MatmulScratch, WeightView};
use memwall::gpu::WeightFormat;

/// The host twin of src/cpu/act.rs `QAct::quantize_scalar` (whose type is crate-private):
/// per chunk of 32, amax, d = amax / 127, id = 1 / d (0 if d == 0), q = round_ties_even(x * id),
/// and d * Σq per half and per chunk. Returns (qx words, qd entries, codes).
pub fn quantize_host(x: &[f32]) -> (Vec<u32>, Vec<[f32; 4]>, Vec<i8>) {
    let (mut words, mut qd, mut codes) = (Vec::new(), Vec::new(), Vec::new());
    for c in x.chunks_exact(32) {
        let amax = c.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        let d = amax / 127.0;
        let id = if d > 0.0 { 1.0 / d } else { 0.0 };
        let q: Vec<i32> = c
            .iter()
            .map(|v| (v * id).round_ties_even() as i32)
            .collect();
        let s0: i32 = q[..16].iter().sum();
        let s1: i32 = q[16..].iter().sum();
        for k in q.chunks_exact(4) {
            words.push(u32::from_le_bytes([
                k[0] as u8, k[1] as u8, k[2] as u8, k[3] as u8,
            ]));
        }
        codes.extend(q.iter().map(|&v| v as i8));
        qd.push([d, d * s0 as f32, d * s1 as f32, d * (s0 + s1) as f32]);
    }
    (words, qd, codes)
}

/// Activations with the cases the quantizer must get exactly right: outliers, a zero chunk,
/// exact rounding ties, a huge value, negative zeros and tiny (normal) values.
pub fn activations(seed: u64, n_tokens: usize, cols: usize) -> Vec<f32> {
    let mut rng = Rng(seed);
    let mut x = rng.values(n_tokens * cols, 2.0);
    if cols >= 160 {
        x[32..64].fill(0.0);
        // amax 127 gives d = 1, so i - 16.5 sits exactly on a rounding tie.
        for (i, v) in x[64..96].iter_mut().enumerate() {
            *v = i as f32 - 16.5;
        }
        x[64] = 127.0;
        x[100] = 1e6;
        x[128..144].fill(-0.0);
        for v in &mut x[144..160] {
            *v *= 1e-30;
        }
    }
    x
}

/// Chunks whose amax sweeps 2^-40..2^40 with random significands: the divisions' stress test.
pub fn division_sweep(n_chunks: usize) -> Vec<f32> {
    let mut rng = Rng(0xD1F);
    let mut x = Vec::with_capacity(n_chunks * 32);
    for _ in 0..n_chunks {
        let e = (rng.f() * 80.0) as i32 - 40;
        let amax = (1.0 + rng.f()) as f32 * 2f32.powi(e);
        let at = (rng.f() * 32.0) as usize;
        for i in 0..32 {
            let v = if i == at {
                amax
            } else {
                amax * (2.0 * rng.f() - 1.0) as f32
            };
            x.push(if rng.f() < 0.5 { v } else { -v });
        }
    }
    x
}

/// |c| of every block of a `[rows, cols]` matrix in ggml layout: the offset the chunk model
/// adds to each weight (Q4_0: 8 d, Q4_1: |m|, Q8_0: 0).
fn offsets(ty: WeightFormat, data: &[u8]) -> Vec<f64> {
    let h = |b: &[u8], o: usize| f64::from(half::f16::from_le_bytes([b[o], b[o + 1]]).to_f32());
    match ty {
        WeightFormat::Q4_0 => data.chunks_exact(18).map(|b| 8.0 * h(b, 0).abs()).collect(),
        WeightFormat::Q4_1 => data.chunks_exact(20).map(|b| h(b, 2).abs()).collect(),
        WeightFormat::Q8_0 => vec![0.0; data.len() / 34],
        _ => unreachable!("no integer path"),
    }
}

/// One reference result and its per-element tolerance.
pub struct Want {
    pub name: String,
    pub y: Vec<f32>,
    pub tol: Vec<f64>,
}

/// References for `x` ([n_tokens, cols]) times `data` ([rows, cols] of `ty`): the CPU matmul's
/// (from `cpu`, one result per CPU path) and kernels-ref's f32 matvec.
///
/// Tolerances. Both sides compute each chunk's term t = (dw·dx)·isum + c0·xs0 + c1·xs1 from the
/// same integers and the same f32 inputs (dx, xs are the bit-identical quantizer outputs), and
/// differ only in rounding: four roundings per term and a sum of nc = cols / 32 terms in some
/// order (the GPU: strided partials and a tree; the CPU: 8 SIMD lanes, the offsets apart, a
/// horizontal sum). Each side is within (nc + 8)·u·S of the exact sum, where S bounds the
/// magnitudes of all parts: with w = dw·mul·u + c and u >= 0, |dw·mul·u| <= |w| + |c|, so
/// S = Σ_i (|w_i| + 2|c_i|)·|x̂_i| (x̂ = d·q). Hence |gpu - cpu| <= 2 (nc + 8) u S.
/// Against kernels-ref (f32 x, no quantization) add the activation rounding, at most d/2 per
/// element: Σ_i |w_i| d_i / 2, and kernels-ref's own f32 sum, (cols + 2) u Σ |w_i x_i|.
pub fn references(
    ty: WeightFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
    cpu: Vec<(String, Vec<f32>)>,
) -> Vec<Want> {
    let g = ty.ggml();
    let wd = kernels_ref::dequantize_vec(g, data, rows * cols).unwrap();
    let c = offsets(ty, data);
    let (_, qd, q) = quantize_host(x);
    let nc = cols / 32;
    let mut tol_cpu = vec![0f64; n_tokens * rows];
    let mut tol_ref = vec![0f64; n_tokens * rows];
    let mut y_ref = vec![0f32; n_tokens * rows];
    for t in 0..n_tokens {
        let xt = &x[t * cols..(t + 1) * cols];
        kernels_ref::matvec(
            g,
            data,
            rows,
            cols,
            xt,
            &mut y_ref[t * rows..(t + 1) * rows],
        )
        .unwrap();
        for r in 0..rows {
            let (mut s, mut act, mut abs) = (0f64, 0f64, 0f64);
            for i in 0..cols {
                let w = f64::from(wd[r * cols + i]);
                let d = f64::from(qd[t * nc + i / 32][0]);
                let xh = d * f64::from(q[t * cols + i]);
                s += (w.abs() + 2.0 * c[r * nc + i / 32]) * xh.abs();
                act += w.abs() * d / 2.0;
                abs += (w * f64::from(xt[i])).abs();
            }
            let e = 2.0 * (nc as f64 + 8.0) * U * s + 1e-30;
            tol_cpu[t * rows + r] = e;
            tol_ref[t * rows + r] = e + act * (1.0 + 1e-6) + (cols as f64 + 2.0) * U * abs;
        }
    }
    let mut wants: Vec<Want> = cpu
        .into_iter()
        .map(|(name, y)| Want {
            name,
            y,
            tol: tol_cpu.clone(),
        })
        .collect();
    wants.push(Want {
        name: "kernels-ref f32".into(),
        y: y_ref,
        tol: tol_ref,
    });
    wants
}

/// The CPU matmul of `data` on both CPU paths (scalar: the GPU's per-chunk operation order;
/// the best one, AVX2 where present).
pub fn cpu_matmuls(
    ty: WeightFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
    x: &[f32],
    n_tokens: usize,
) -> Vec<(String, Vec<f32>)> {
    let view = WeightView::new(ty.ggml(), data, rows, cols).unwrap();
    let mut out = Vec::new();
    for isa in [Isa::Scalar, Isa::best()] {
        let mut y = vec![0f32; n_tokens * rows];
        matmul_with(
            isa,
            &view,
            x,
            n_tokens,
            &mut y,
            &mut MatmulScratch::default(),
        )
        .unwrap();
        out.push((format!("cpu {isa:?}"), y));
    }
    out
}
