//! Tiled, dequant-fused matrix product for prefill (`shaders/matrix/tiles.wgsl` over the f32
//! body): a whole prompt's projections through one weight matrix, with each weight decoded
//! once per tile of tokens instead of once per token as `n_tokens` matvec calls would.

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{grid, to_u32, Dispatch, GpuMatrix, Kernels, Launch};
use crate::gpu::registry::{KernelKey, MatvecParams, QK};

/// Most weight rows per tile (`override TM`).
pub const MATMUL_MAX_TILE_ROWS: u32 = 64;
/// Most tokens per tile (`override TN`).
pub const MATMUL_MAX_TILE_TOKENS: u32 = 32;

/// The `(TM, TN)` tile (weight rows, tokens) for a workgroup of `workgroup_size` invocations
/// (a power of two): each invocation owns a 4 x 4 micro-tile, so TM / 4 * TN / 4 invocations
/// compute; with wider workgroups the rest only help staging. Workgroup memory is
/// (TM + TN) * 32 * 4 bytes: at most 12 KiB, within WebGPU's 16 KiB minimum.
pub fn matmul_tile(workgroup_size: u32) -> (u32, u32) {
    let wg = workgroup_size.max(1);
    let tm = MATMUL_MAX_TILE_ROWS.min(4 * wg);
    let tn = (4 * (wg / (tm / 4)).max(1)).min(MATMUL_MAX_TILE_TOKENS);
    (tm, tn)
}

impl Kernels {
    /// Prepares `y[t][row_offset + r] = sum_c W[r][c] x[t][c]` (see
    /// [`Kernels::matmul_launch`]).
    #[allow(clippy::too_many_arguments)]
    pub fn matmul(
        &self,
        ctx: &GpuContext,
        w: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n_tokens: usize,
        y_stride: usize,
        row_offset: usize,
    ) -> Result<Dispatch> {
        self.prepare(
            ctx,
            self.matmul_launch(w, x, y, n_tokens, y_stride, row_offset)?,
        )
    }

    /// y: [n_tokens, y_stride], rows row_offset..row_offset+w.rows written; x: [n_tokens, w.cols].
    ///
    /// The rest of `y` is left untouched, so a matrix split by rows into several buffers (one
    /// [`GpuMatrix`] per part) writes one output through one launch per part.
    pub fn matmul_launch<'a>(
        &self,
        w: &'a GpuMatrix,
        x: &'a wgpu::Buffer,
        y: &'a wgpu::Buffer,
        n_tokens: usize,
        y_stride: usize,
        row_offset: usize,
    ) -> Result<Launch<'a>> {
        let shape = || {
            format!(
                "matmul [{}, {}] x {n_tokens} tokens (y_stride {y_stride}, row_offset \
                 {row_offset})",
                w.rows, w.cols
            )
        };
        let end = row_offset
            .checked_add(w.rows)
            .filter(|&e| e <= y_stride)
            .ok_or_else(|| Error::Gpu(format!("{}: rows do not fit in y_stride", shape())))?;
        // Elements of x and y the kernel touches (y: up to the last token's last row).
        let x_len = (n_tokens as u64).saturating_mul(w.cols as u64);
        let y_len = match n_tokens {
            0 => 0,
            n => ((n - 1) as u64)
                .saturating_mul(y_stride as u64)
                .saturating_add(end as u64),
        };
        if x.size() < x_len.saturating_mul(4) || y.size() < y_len.saturating_mul(4) {
            return Err(Error::Gpu(format!(
                "{}: x is {} bytes, y {} bytes",
                shape(),
                x.size(),
                y.size()
            )));
        }
        // The shader indexes x and y with u32.
        to_u32(x_len as usize, "matmul x elements")?;
        to_u32(y_len as usize, "matmul y elements")?;
        let rows = to_u32(w.rows, "rows")?;
        let cols = to_u32(w.cols, "cols")?;
        let n = to_u32(n_tokens, "n_tokens")?;
        let (tm, tn) = matmul_tile(self.workgroup_size);
        let row_tiles = rows.div_ceil(tm);
        let tiles = row_tiles
            .checked_mul(n.div_ceil(tn))
            .ok_or_else(|| Error::Gpu(format!("{}: too many tiles", shape())))?;
        let groups = grid(tiles, self.max_groups_per_dim)?;
        let params = MatvecParams {
            rows,
            cols,
            blocks_per_row: cols.div_ceil(QK),
            groups_x: groups.0,
            n_tokens: n,
            y_stride: to_u32(y_stride, "y_stride")?,
            row_offset: to_u32(row_offset, "row_offset")?,
            row_groups: row_tiles,
        };
        let key = KernelKey::Matmul { ty: w.ty };
        let mut bufs = vec![(0, &w.quants)];
        if let Some(s) = &w.scales {
            bufs.push((1, s));
        }
        bufs.push((2, x));
        bufs.push((3, y));
        Ok(Launch::new(key, &params, &bufs, 4, groups))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tiles_fit_the_workgroup_and_16_kib() {
        for wg in [1u32, 2, 4, 8, 16, 32, 64, 128, 256] {
            let (tm, tn) = matmul_tile(wg);
            assert!(tm % 4 == 0 && tn % 4 == 0 && tm > 0 && tn > 0, "wg {wg}");
            // Every micro-tile has an invocation.
            assert!((tm / 4) * (tn / 4) <= wg, "wg {wg}: {tm} x {tn}");
            assert!((tm + tn) * 32 * 4 <= 16 * 1024, "wg {wg}");
        }
        assert_eq!(matmul_tile(64), (64, 16));
    }
}
