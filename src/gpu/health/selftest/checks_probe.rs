//! The bandwidth probe's check: its per-workgroup sums against f64 sums of the same elements.

use super::{poisoned, prepare, run_read, small_grid, Rng, Worst, U};
use crate::error::Result;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{self, Kernels};
use crate::gpu::registry::KernelKey;

/// Cases (vec4s, workgroups, small grid): a count that is not a multiple of the invocations
/// (the last stride is partial), one where some invocations read nothing, and one on a small
/// grid (2-D dispatch with surplus workgroups).
const CASES: [(usize, usize, bool); 3] = [(3001, 5, false), (77, 3, false), (1234, 7, true)];

pub(super) fn bandwidth_probe(ctx: &GpuContext, ks: &mut Kernels, key: KernelKey) -> Result<Worst> {
    let mut worst = Worst::new();
    let wg = ks.workgroup_size as usize;
    for (n_vec4, n_groups, small) in CASES {
        let x = Rng(0xb4d ^ n_vec4 as u64).values(n_vec4 * 4, 2.0); // [n_vec4, 4]
        let xb = kernels::upload_f32(ctx, "src", &x)?;
        let ob = poisoned(ctx, "out", &vec![f32::NAN; n_groups])?; // [n_groups]
        if small {
            ks.max_groups_per_dim =
                small_grid(&[ks.bandwidth_probe_launch(&xb, &ob, n_vec4, n_groups)?])?;
        }
        let launch = ks.bandwidth_probe_launch(&xb, &ob, n_vec4, n_groups)?;
        let d = prepare(ctx, ks, launch, key)?;
        let got = run_read(ctx, &d, &ob, n_groups, &mut worst)?;
        // Workgroup g's invocation l reads vec4s g * WG + l + k * (n_groups * WG).
        let stride = n_groups * wg;
        let per_thread = n_vec4.div_ceil(stride);
        for (g, &v) in got.iter().enumerate() {
            let (mut sum, mut abs) = (0f64, 0f64);
            for l in 0..wg {
                for k in 0..per_thread {
                    let i = g * wg + l + k * stride;
                    if let Some(q) = x.get(4 * i..4 * i + 4).filter(|_| i < n_vec4) {
                        sum += q.iter().map(|&e| f64::from(e)).sum::<f64>();
                        abs += q.iter().map(|&e| f64::from(e).abs()).sum::<f64>();
                    }
                }
            }
            // f32 sums: per_thread vec4 additions, 3 to fold the lanes, log2(WG) tree levels;
            // each element passes through at most that many roundings of relative error U.
            let depth = (per_thread + 3 + wg.ilog2() as usize) as f64;
            worst.add(f64::from(v), sum, depth * U * abs * (1.0 + depth * U));
        }
    }
    Ok(worst)
}
