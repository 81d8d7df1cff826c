//! The GPU backend's matrix products: the 8-bit activation path (quantize the input once,
//! then matvec_q8 / tiled matmul per weight part) and the f32 path, over weights split in
//! parts that fit the binding limit.

use std::sync::Arc;

use super::{GpuAct, GpuBackend, MATVEC_MAX_TOKENS};
use crate::backend::WeightId;
use crate::error::{Error, Result};
use crate::gpu::kernels::q8act::Q8Target;
use crate::gpu::registry::MatvecOut;

impl GpuBackend {
    /// Whether the 8-bit path takes matmuls over `w` (as `matmul_parts` decides).
    pub(super) fn q8_path(&self, w: &crate::gpu::kernels::GpuMatrix) -> bool {
        !self.m.f32_activations && w.ty.has_q8_path() && w.cols.is_multiple_of(32)
    }

    /// Makes qx / qd hold the quantization of x: [n, cols], unless they already do.
    pub(super) fn quantize_input(&mut self, x: &GpuAct, n: usize, cols: usize) -> Result<()> {
        let len = n.saturating_mul(cols);
        if self
            .quantized
            .as_ref()
            .is_some_and(|(b, have)| *b == x.buf && len <= *have)
        {
            return Ok(());
        }
        let m = Arc::clone(&self.m);
        let (qx, qd) = (self.qx.clone(), self.qd.clone());
        let launch = m.kernels.quantize_act_launch(&x.buf, &qx, &qd, n, cols)?;
        self.record(launch)?;
        self.quantized = Some((x.buf.clone(), len));
        Ok(())
    }

    /// One launch over a stacked matrix (`first`: Wq(l) or Gate(l)) writing each member's
    /// rows to its output; `Ok(false)` when the model has no such stack or the 8-bit path
    /// does not apply (the caller then runs the members one by one).
    pub(super) fn matmul_stacked(
        &mut self,
        first: WeightId,
        x: &GpuAct,
        n: usize,
        outs: &[&GpuAct],
    ) -> Result<bool> {
        let m = Arc::clone(&self.m);
        let Some(f) = m.fused(first) else {
            return Ok(false);
        };
        if !self.q8_path(&f.m) || f.splits.len() + 1 != outs.len() {
            return Ok(false);
        }
        if x.len < n * f.m.cols {
            return Err(Error::Gpu(format!(
                "stacked matmul {}: {n} tokens of {} columns in a buffer of {}",
                first.tensor_name(),
                f.m.cols,
                x.len
            )));
        }
        self.quantize_input(x, n, f.m.cols)?;
        let (qx, qd) = (self.qx.clone(), self.qd.clone());
        let out = if outs.len() == 3 {
            MatvecOut::Split3
        } else {
            MatvecOut::Split2
        };
        let target = Q8Target {
            out: Some(out),
            ys: outs.iter().map(|o| &o.buf).collect(),
            y_stride: f.m.rows,
            row_offset: 0,
            splits: [
                f.splits.first().copied().unwrap_or(0),
                f.splits.get(1).copied().unwrap_or(f.m.rows),
            ],
        };
        let launch = m
            .kernels
            .matvec_q8_target_launch(&f.m, 0, &qx, &qd, n, target)?;
        self.record(launch)?;
        for o in outs {
            self.written(&o.buf);
        }
        Ok(true)
    }

    /// Records `out = W x` (or `out += W x` with `add`) for `n` tokens, each part of a split
    /// matrix writing its rows.
    pub(super) fn matmul_parts(
        &mut self,
        w: WeightId,
        x: &GpuAct,
        n: usize,
        out: &GpuAct,
        add: bool,
    ) -> Result<()> {
        let m = Arc::clone(&self.m);
        let mat = &self.weight(w)?;
        if x.len < n * mat.cols || out.len < n * mat.rows {
            return Err(Error::Gpu(format!(
                "matmul {}: [{}, {}] x {n} tokens with buffers of {} and {} values",
                w.tensor_name(),
                mat.rows,
                mat.cols,
                x.len,
                out.len
            )));
        }
        let ty = mat.parts.first().map(|p| p.m.ty);
        let q8 = !m.f32_activations
            && ty.is_some_and(|t| t.has_q8_path())
            && mat.cols.is_multiple_of(32);
        if q8 {
            // The CPU's scheme: x to int8 chunks once, then integer dot products per part.
            self.quantize_input(x, n, mat.cols)?;
            let (qx, qd) = (self.qx.clone(), self.qd.clone());
            let mode = add.then_some(MatvecOut::Add);
            for p in &mat.parts {
                let target = Q8Target {
                    out: mode,
                    ys: vec![&out.buf],
                    y_stride: mat.rows,
                    row_offset: p.row0,
                    splits: [mat.rows; 2],
                };
                let launch = m
                    .kernels
                    .matvec_q8_target_launch(&p.m, p.w_row0, &qx, &qd, n, target)?;
                self.record(launch)?;
            }
            self.written(&out.buf);
            return Ok(());
        }
        if add || mat.parts.iter().any(|p| p.w_row0 != 0) {
            return Err(Error::Gpu(format!(
                "matmul {}: a fused output or a stacked-matrix view needs the 8-bit path",
                w.tensor_name()
            )));
        }
        self.written(&out.buf);
        for p in &mat.parts {
            // Batches past a few tokens take the tiled matmul, which decodes each weight
            // once per tile; CPU-like adapters run the batched row matvec at any size (their
            // barriers cost more than re-reading weights that sit in cache).
            let launch = if n <= MATVEC_MAX_TOKENS || m.kernels.matvec_rows {
                m.kernels
                    .matvec_batch_launch(&p.m, &x.buf, &out.buf, n, mat.rows, p.row0)?
            } else {
                m.kernels
                    .matmul_launch(&p.m, &x.buf, &out.buf, n, mat.rows, p.row0)?
            };
            self.record(launch)?;
        }
        Ok(())
    }
}
