//! Checks of the 8-bit activation path: `quantize_act` against the CPU's own quantizer (bit
//! for bit), and `matvec_q8` in both layouts against the CPU's integer matmul, which computes
//! every chunk's term from the same integers (so only the f32 summation order differs).

use super::checks::{oracle, weights};
use super::{poisoned, prepare, read_guarded, small_grid, Rng, Worst, U};
use crate::cpu::act::QAct;
use crate::cpu::{MatmulScratch, WeightView};
use crate::error::Result;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words, Q8Target};
use crate::gpu::kernels::{self, Kernels};
use crate::gpu::registry::{KernelKey, MatvecOut, WeightFormat};
use crate::gpu::repack::repack;

/// `n_tokens` rows of `cols` seeded activations with outliers; the first chunk all zeros (the
/// d = 0 case).
fn activations(n_tokens: usize, cols: usize) -> Vec<f32> {
    let mut x = Rng(0x5eed_0a17 ^ (n_tokens * 7 + cols) as u64).values(n_tokens * cols, 2.0);
    x[..32.min(cols)].fill(0.0);
    x
}

pub(super) fn quantize_act(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    for (n, cols, small) in [(3usize, 4128usize, false), (5, 96, false), (9, 2048, true)] {
        let x = activations(n, cols);
        let mut qa = QAct::default();
        qa.quantize_scalar(&x, n, cols);
        // [n, cols / 4] words of four int8, byte 0 first.
        let want_qx: Vec<u32> = qa
            .qs
            .chunks_exact(4)
            .map(|b| u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8]))
            .collect();
        // [n, cols / 32, 4]: d, d Σq of each half, d Σq.
        let want_qd: Vec<f32> = (0..n * cols / 32)
            .flat_map(|c| [qa.d[c], qa.xs[2 * c], qa.xs[2 * c + 1], qa.xs32[c]])
            .collect();
        let xb = kernels::upload_f32(ctx, "x", &x)?;
        let qxb = poisoned(ctx, "qx", &vec![f32::NAN; qx_words(n, cols)])?;
        let qdb = poisoned(ctx, "qd", &vec![f32::NAN; qd_vec4s(n, cols) * 4])?;
        if small {
            let l = ks.quantize_act_launch(&xb, &qxb, &qdb, n, cols)?;
            ks.max_groups_per_dim = small_grid(&[l])?;
        }
        let d = prepare(
            ctx,
            ks,
            ks.quantize_act_launch(&xb, &qxb, &qdb, n, cols)?,
            key,
        )?;
        kernels::run(ctx, &[&d])?;
        let qx = read_guarded(ctx, &qxb, want_qx.len(), &mut worst)?;
        let qd = read_guarded(ctx, &qdb, want_qd.len(), &mut worst)?;
        // Bit-identical to the CPU: tolerance 0 on the codes and on the scales and sums.
        for (g, w) in qx.iter().zip(&want_qx) {
            worst.add(f64::from(g.to_bits()), f64::from(*w), 0.0);
        }
        worst.add_all(&qd, &want_qd, |_| 0.0);
    }
    Ok(worst)
}

/// The offset coefficient |c| of 32-column chunk g (the per-half constant of the CPU's chunk
/// model, the larger half's where they differ): 8 d for Q4_0, |m| for Q4_1, 0 for Q8_0,
/// dmin m_j for Q4_K, 32 d |sc| for Q6_K.
pub(crate) fn block_offset(ty: WeightFormat, data: &[u8], g: usize) -> f64 {
    let half = |at: usize| {
        data.get(at..at + 2).map_or(f64::INFINITY, |b| {
            f64::from(half::f16::from_le_bytes([b[0], b[1]]).to_f32()).abs()
        })
    };
    match ty {
        WeightFormat::Q4_0 => 8.0 * half(g * 18),
        WeightFormat::Q4_1 => half(g * 20 + 2),
        WeightFormat::Q4_K => {
            let (b, j) = (g / 8 * 144, g % 8);
            data.get(b + 4..b + 16).map_or(f64::INFINITY, |s| {
                half(b + 2) * f64::from(crate::cpu::formats::k4_scales(s).1[j])
            })
        }
        WeightFormat::Q6_K => {
            let (b, j) = (g / 8 * 210, g % 8);
            data.get(b + 192 + 2 * j..b + 194 + 2 * j)
                .map_or(f64::INFINITY, |s| {
                    let sc = (s[0] as i8).unsigned_abs().max((s[1] as i8).unsigned_abs());
                    32.0 * half(b + 208) * f64::from(sc)
                })
        }
        _ => 0.0,
    }
}

/// `matvec_q8` (`rows_layout`: one invocation per row) against the CPU's integer matmul;
/// with `out`, the fused output modes: accumulated onto a seeded y (the CPU's dot plus y,
/// one more rounding), or the rows split across two or three poisoned outputs.
pub(super) fn matvec_q8(
    ctx: &GpuContext,
    ks: &mut Kernels,
    key: KernelKey,
    ty: WeightFormat,
    rows_layout: bool,
    out: Option<MatvecOut>,
) -> Result<Worst> {
    ks.matvec_rows = rows_layout;
    let mut worst = Worst::new();
    // The row layout's paths: 5 tokens take one row per invocation (a 4-token tile, then one
    // token alone), 1 token 4 rows per invocation (decode's path); 777 rows: a few workgroups
    // of 4-row invocations (the last one's rows partly past the end) for the small-grid case.
    // The prefill matmul takes 8 tokens and more, in tiles of 8 (11: a full and a partial
    // tile) and 4 rows per invocation (its small-grid case needs 3 workgroups of 4 * WG rows).
    let prefill = matches!(key, KernelKey::MatmulQ8Rows { .. });
    // The K-quants' rows are whole 256-column super-blocks: 8 and 136 chunks (an odd number
    // of super-blocks, so Q6_K's last scale pair is half empty), then one super-block.
    let (c0, c1, c2) = if ty.ggml().block_size() == 256 {
        (256, 4352, 256)
    } else {
        (96, 4128, 64)
    };
    let cases: [(usize, usize, bool, usize); 3] = if prefill {
        [
            (37, c0, false, 11),
            (3, c1, false, 11),
            (1100, c2, true, 11),
        ]
    } else {
        [(37, c0, false, 5), (3, c1, false, 1), (777, c2, true, 1)]
    };
    for (rows, cols, small, n) in cases {
        let data = weights(ty, rows, cols, 0x0a11_ce55)?;
        let x = activations(n, cols);
        // [n, rows]
        let mut want = vec![0f32; n * rows];
        let view = WeightView::new(ty.ggml(), &data, rows, cols)?;
        crate::cpu::matmul(&view, &x, n, &mut want, &mut MatmulScratch::default())?;
        let wd = oracle(kernels_ref::dequantize_vec(ty.ggml(), &data, rows * cols))?;
        let mut qa = QAct::default();
        qa.quantize_scalar(&x, n, cols);
        // Both sides form each chunk's term dw * d_x * isum + c0 xs0 + c1 xs1 from the same
        // integers in the same order (<= 4 roundings each) and add cols/32 terms in some
        // order: |error| <= 2 (nc + 8) u S with S = Σ (|w| + 2|c|) (|x| + d_x), since
        // |d_x q| <= |x| + d_x / 2 and |dw mul u| <= |w| + |c|.
        let nc = cols / 32;
        let tol: Vec<f64> = (0..n * rows)
            .map(|i| {
                let (t, r) = (i / rows, i % rows);
                let mut s = 0.0;
                for c in 0..cols {
                    let dx = f64::from(qa.d[(t * cols + c) / 32]);
                    let off = block_offset(ty, &data, (r * cols + c) / 32);
                    let w = f64::from(wd[r * cols + c]).abs();
                    s += (w + 2.0 * off) * (f64::from(x[t * cols + c]).abs() + dx);
                }
                2.0 * (nc as f64 + 8.0) * U * s + f64::MIN_POSITIVE
            })
            .collect();
        let m = kernels::upload_matrix(ctx, &repack(ty, &data, rows, cols)?)?;
        let xb = kernels::upload_f32(ctx, "x", &x)?;
        let qxb = kernels::upload_u32(ctx, "qx", &vec![0u32; qx_words(n, cols)])?;
        let qdb = kernels::upload_f32(ctx, "qd", &vec![0f32; qd_vec4s(n, cols) * 4])?;
        // The output ranges of the stacked rows: [start, end) per output.
        let s1 = (rows / 3).max(1);
        let s2 = (2 * rows / 3).max(s1 + 1);
        let ranges: Vec<(usize, usize)> = match out {
            None | Some(MatvecOut::Add) => vec![(0, rows)],
            Some(MatvecOut::Split2) => vec![(0, s1), (s1, rows)],
            Some(MatvecOut::Split3) => vec![(0, s1), (s1, s2), (s2, rows)],
        };
        // Add: y starts from seeded values and the result is y0 + W x.
        let y0 = match out {
            Some(MatvecOut::Add) => Rng(0xacc ^ rows as u64).values(n * rows, 3.0),
            _ => vec![f32::NAN; n * rows],
        };
        let ybs = ranges
            .iter()
            .map(|&(a, b)| {
                // [n, b - a]: this output's rows of every token.
                let init: Vec<f32> = (0..n)
                    .flat_map(|t| y0[t * rows + a..t * rows + b].to_vec())
                    .collect();
                poisoned(ctx, "y", &init)
            })
            .collect::<Result<Vec<_>>>()?;
        let launch = |ks: &Kernels| {
            let target = Q8Target {
                out,
                ys: ybs.iter().collect(),
                y_stride: rows,
                row_offset: 0,
                splits: [s1, s2],
            };
            ks.matvec_q8_target_launch(&m, 0, &qxb, &qdb, n, target)
        };
        if small {
            ks.max_groups_per_dim = small_grid(&[launch(ks)?])?;
        }
        let dq = ks.prepare(ctx, ks.quantize_act_launch(&xb, &qxb, &qdb, n, cols)?)?;
        let dm = prepare(ctx, ks, launch(ks)?, key)?;
        kernels::run(ctx, &[&dq, &dm])?;
        // Reassemble [n, rows] from the outputs.
        let mut got = vec![f32::NAN; n * rows];
        for (yb, &(a, b)) in ybs.iter().zip(&ranges) {
            let part = read_guarded(ctx, yb, n * (b - a), &mut worst)?;
            for t in 0..n {
                got[t * rows + a..t * rows + b]
                    .copy_from_slice(&part[t * (b - a)..(t + 1) * (b - a)]);
            }
        }
        if out == Some(MatvecOut::Add) {
            // One more rounding for the addition: u |y0 + dot|.
            for (i, w) in want.iter_mut().enumerate() {
                *w += y0[i];
            }
            worst.add_all(&got, &want, |i| tol[i] + U * f64::from(want[i]).abs());
        } else {
            worst.add_all(&got, &want, |i| tol[i]);
        }
    }
    Ok(worst)
}
