//! Checks of the fused kernels that quantize what they write (`rmsnorm_quant`,
//! `swiglu_quant`): the f32 output against kernels-ref as for the plain kernels, and the
//! 8-bit codes and scales against the CPU's quantizer applied to that very output, bit for bit
//! (the fusion must give what `quantize_act` would make of the stored vector).

use super::checks::swiglu_tol;
use super::{poisoned, prepare, read_guarded, Rng, Worst, U};
use crate::cpu::act::QAct;
use crate::error::Result;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words};
use crate::gpu::kernels::{self, Kernels};
use crate::gpu::registry::KernelKey;

/// Reads the quantized `qx` / `qd` of `n_rows` rows of `cols` and demands exactly what the
/// CPU's quantizer makes of `x` (the kernel's own f32 output).
#[allow(clippy::too_many_arguments)]
pub(super) fn check_quantized(
    ctx: &GpuContext,
    qxb: &wgpu::Buffer,
    qdb: &wgpu::Buffer,
    x: &[f32],
    n_rows: usize,
    cols: usize,
    worst: &mut Worst,
) -> Result<()> {
    let mut qa = QAct::default();
    qa.quantize_scalar(x, n_rows, cols);
    // [n_rows, cols / 4] words of four int8, byte 0 first.
    let want_qx: Vec<u32> = qa
        .qs
        .chunks_exact(4)
        .map(|b| u32::from_le_bytes([b[0] as u8, b[1] as u8, b[2] as u8, b[3] as u8]))
        .collect();
    // [n_rows, cols / 32, 4]: d, d Σq of each half, d Σq.
    let want_qd: Vec<f32> = (0..n_rows * cols / 32)
        .flat_map(|c| [qa.d[c], qa.xs[2 * c], qa.xs[2 * c + 1], qa.xs32[c]])
        .collect();
    let qx = read_guarded(ctx, qxb, want_qx.len(), worst)?;
    let qd = read_guarded(ctx, qdb, want_qd.len(), worst)?;
    for (g, w) in qx.iter().zip(&want_qx) {
        worst.add(f64::from(g.to_bits()), f64::from(*w), 0.0);
    }
    worst.add_all(&qd, &want_qd, |_| 0.0);
    Ok(())
}

pub(super) fn rms_norm_quant(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    let eps = 1e-5f32;
    for (n_rows, n, grid) in [(3, 96, None), (2, 4128, None), (23, 64, Some(5))] {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let mut rng = Rng(0x005e_ed9a ^ (n_rows * 7919 + n) as u64);
        let mut x = rng.values(n_rows * n, 2.0); // [n_rows, n]
                                                 // A zero row: every chunk has d = 0.
        x[..n].fill(0.0);
        let weight = rng.values(n, 2.0); // [n]
        let mut want = vec![0f32; n_rows * n];
        for (xr, wr) in x.chunks_exact(n).zip(want.chunks_exact_mut(n)) {
            kernels_ref::rms_norm(xr, &weight, eps, wr);
        }
        // As the plain rms_norm check: (n / 2 + 8) u relative.
        let rel = (n as f64 / 2.0 + 8.0) * U;
        let xb = kernels::upload_f32(ctx, "x", &x)?;
        let wb = kernels::upload_f32(ctx, "weight", &weight)?;
        let ob = poisoned(ctx, "out", &vec![f32::NAN; n_rows * n])?;
        let qxb = poisoned(ctx, "qx", &vec![f32::NAN; qx_words(n_rows, n)])?;
        let qdb = poisoned(ctx, "qd", &vec![f32::NAN; qd_vec4s(n_rows, n) * 4])?;
        let launch = ks.rms_norm_quant_launch(&xb, &wb, &ob, &qxb, &qdb, n, n_rows, eps)?;
        let d = prepare(ctx, ks, launch, key)?;
        kernels::run(ctx, &[&d])?;
        let got = read_guarded(ctx, &ob, n_rows * n, &mut worst)?;
        worst.add_all(&got, &want, |i| rel * f64::from(want[i]).abs() + 1e-30);
        check_quantized(ctx, &qxb, &qdb, &got, n_rows, n, &mut worst)?;
    }
    Ok(worst)
}

pub(super) fn swiglu_quant(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    for (n, grid) in [(96usize, None), (4128, None), (32 * 301, Some(3))] {
        if let Some(g) = grid {
            ks.max_groups_per_dim = g;
        }
        let mut rng = Rng(0x0005_a19a ^ n as u64);
        // Gate outliers past +-88 overflow exp(-g).
        let gate = rng.values(n, 4.0); // [n]
        let up = rng.values(n, 2.0); // [n]
        let mut want = vec![0f32; n];
        kernels_ref::swiglu(&gate, &up, &mut want);
        let gb = poisoned(ctx, "gate", &gate)?;
        let ub = kernels::upload_f32(ctx, "up", &up)?;
        let qxb = poisoned(ctx, "qx", &vec![f32::NAN; qx_words(1, n)])?;
        let qdb = poisoned(ctx, "qd", &vec![f32::NAN; qd_vec4s(1, n) * 4])?;
        let launch =
            ks.swiglu_quant_launch(crate::config::FfnAct::Silu, &gb, &ub, &qxb, &qdb, n)?;
        let d = prepare(ctx, ks, launch, key)?;
        kernels::run(ctx, &[&d])?;
        let got = read_guarded(ctx, &gb, n, &mut worst)?;
        worst.add_all(&got, &want, |i| swiglu_tol(gate[i], want[i]));
        check_quantized(ctx, &qxb, &qdb, &got, 1, n, &mut worst)?;
    }
    Ok(worst)
}
