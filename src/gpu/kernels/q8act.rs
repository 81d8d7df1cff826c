//! The GPU's integer matvec path, the CPU's scheme (src/cpu/act.rs, src/cpu/formats.rs): the
//! activations are quantized once per matmul to int8 chunks of 32 (`shaders/quantize_act.wgsl`,
//! bit-identical to `QAct::quantize_scalar`), and each quantized weight format's chunk dot
//! product is computed in integers (`shaders/matrix/q8.wgsl`). GPU logits then differ from the
//! CPU path's only by f32 summation order, and the matvec reads 4x fewer activation bytes.
//!
//! Buffers, for `n_tokens` rows of `cols` activations (`cols` a multiple of 32):
//! - `qx`: `[n_tokens, cols / 4]` u32, four int8 codes per word, element 4k + j in byte j;
//! - `qd`: `[n_tokens, cols / 32]` vec4<f32>: (d, d·Σq over elements 0..16, over 16..32, over
//!   all 32) per chunk.

use crate::error::{Error, Result};
use crate::gpu::health::variants;
use crate::gpu::kernels::{grid, to_u32, GpuMatrix, Kernels, Launch};
use crate::gpu::registry::{
    ElementwiseParams, KernelKey, MatvecOut, MatvecQ8Params, QuantizeActParams, WeightFormat, QK,
};

/// Tokens one register-tile launch handles (`MAX_TOKENS` in `shaders/matrix/tiles_q8.wgsl`).
pub const MATVEC_Q8_ROWS_MAX_TOKENS: usize = 64;

/// Weight rows each invocation of the register-tile layout computes (`shaders/matrix/
/// tiles_q8.wgsl`), `row_stride` apart: a token's activation chunk is loaded once for all of
/// them.
const TILE_ROWS: u32 = 4;
/// Fewest tokens that take the 8-token tiles (`MatmulQ8Rows`) on CPU-like adapters: fewer
/// would compute a tile's surplus slots for nothing (the decode matvec's tiles of 4 and single
/// tokens serve them).
pub const MATMUL_Q8_ROWS_MIN_TOKENS: usize = 8;

/// Whether weights in `ty` have the integer path (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K); float
/// weights keep the f32 matvec, as on the CPU.
pub fn q8_supported(ty: WeightFormat) -> bool {
    ty.has_q8_path()
}

/// u32 words of `qx` for `n_tokens` rows of `cols` activations.
pub fn qx_words(n_tokens: usize, cols: usize) -> usize {
    n_tokens.saturating_mul(cols) / 4
}

/// vec4<f32> entries of `qd` (16 bytes each) for `n_tokens` rows of `cols` activations.
pub fn qd_vec4s(n_tokens: usize, cols: usize) -> usize {
    n_tokens.saturating_mul(cols) / QK as usize
}

/// Checks that `buf` holds at least `n` elements of `elem_bytes`.
fn check(what: &str, buf: &wgpu::Buffer, n: usize, elem_bytes: u64) -> Result<()> {
    let need = (n as u64).saturating_mul(elem_bytes);
    if buf.size() < need {
        return Err(Error::Gpu(format!(
            "{what}: buffer of {} bytes, need {need}",
            buf.size()
        )));
    }
    Ok(())
}

fn check_shape(what: &str, n_tokens: usize, cols: usize) -> Result<()> {
    if n_tokens == 0 || cols == 0 || !cols.is_multiple_of(QK as usize) {
        return Err(Error::Gpu(format!(
            "{what}: {n_tokens} tokens of {cols} columns (need at least one token and a \
             positive multiple of {QK} columns)"
        )));
    }
    Ok(())
}

impl Kernels {
    /// Quantizes `x` (`[n_tokens, cols]` f32, `cols` a multiple of 32) into `qx` (at least
    /// [`qx_words`] u32) and `qd` (at least [`qd_vec4s`] vec4<f32>), as the CPU does.
    pub fn quantize_act_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        qx: &'a wgpu::Buffer,
        qd: &'a wgpu::Buffer,
        n_tokens: usize,
        cols: usize,
    ) -> Result<Launch<'a>> {
        check_shape("quantize_act", n_tokens, cols)?;
        check("quantize_act x", x, n_tokens.saturating_mul(cols), 4)?;
        check("quantize_act qx", qx, qx_words(n_tokens, cols), 4)?;
        check("quantize_act qd", qd, qd_vec4s(n_tokens, cols), 16)?;
        let n_chunks = to_u32(qd_vec4s(n_tokens, cols), "quantize_act chunks")?;
        // x is indexed by element in the shader: 32 * n_chunks must fit too.
        to_u32(n_tokens.saturating_mul(cols), "quantize_act elements")?;
        let groups = grid(
            n_chunks.div_ceil(self.workgroup_size),
            self.max_groups_per_dim,
        )?;
        let params = QuantizeActParams {
            n_chunks,
            groups_x: groups.0,
            pad0: 0,
            pad1: 0,
        };
        let bufs = [(0, x), (1, qx), (2, qd)];
        Ok(Launch::new(
            KernelKey::QuantizeAct,
            &params,
            &bufs,
            3,
            groups,
        ))
    }

    /// Batched integer matvec: `y[t][row_offset + r] = W[r] · x[t]` for `t < n_tokens`, with
    /// x given quantized (`qx`, `qd` from [`Kernels::quantize_act_launch`] over
    /// `[n_tokens, w.cols]`) and `y` `[n_tokens, y_stride]` f32. Rows of y outside
    /// `row_offset..row_offset + w.rows` are not touched. `w` must be in a format with
    /// [`q8_supported`].
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_q8_launch<'a>(
        &self,
        w: &'a GpuMatrix,
        qx: &'a wgpu::Buffer,
        qd: &'a wgpu::Buffer,
        y: &'a wgpu::Buffer,
        n_tokens: usize,
        y_stride: usize,
        row_offset: usize,
    ) -> Result<Launch<'a>> {
        let target = Q8Target {
            out: None,
            ys: vec![y],
            y_stride,
            row_offset,
            splits: [y_stride; 2],
        };
        self.matvec_q8_target_launch(w, 0, qx, qd, n_tokens, target)
    }

    /// The integer matvec of rows `w_row0..w_row0 + w.rows` of `w`'s buffers (a row range of
    /// a fused matrix; 0 for a whole one) into `target`: stored, accumulated, or split across
    /// outputs (see [`Q8Target`]).
    pub fn matvec_q8_target_launch<'a>(
        &self,
        w: &'a GpuMatrix,
        w_row0: usize,
        qx: &'a wgpu::Buffer,
        qd: &'a wgpu::Buffer,
        n_tokens: usize,
        target: Q8Target<'a>,
    ) -> Result<Launch<'a>> {
        let Q8Target {
            out,
            ys,
            y_stride,
            row_offset,
            splits,
        } = target;
        let what = format!(
            "matvec_q8 {:?} [{}, {}] x {n_tokens} tokens",
            w.ty, w.rows, w.cols
        );
        if !q8_supported(w.ty) {
            return Err(Error::Gpu(format!(
                "{what}: the format has no integer path (use the f32 matvec)"
            )));
        }
        check_shape(&what, n_tokens, w.cols)?;
        if w.rows == 0 || row_offset.saturating_add(w.rows) > y_stride {
            return Err(Error::Gpu(format!(
                "{what}: rows {row_offset}..{} do not fit a y stride of {y_stride}",
                row_offset.saturating_add(w.rows)
            )));
        }
        check(&format!("{what}: qx"), qx, qx_words(n_tokens, w.cols), 4)?;
        check(&format!("{what}: qd"), qd, qd_vec4s(n_tokens, w.cols), 16)?;
        // Each output's row width: one y of y_stride, or the split ranges.
        let widths: Vec<usize> = match out {
            None | Some(MatvecOut::Add) => vec![y_stride],
            Some(MatvecOut::Split2) => vec![splits[0], y_stride.saturating_sub(splits[0])],
            Some(MatvecOut::Split3) => vec![
                splits[0],
                splits[1].saturating_sub(splits[0]),
                y_stride.saturating_sub(splits[1]),
            ],
        };
        let split_ok = match out {
            Some(MatvecOut::Split2) => splits[0] > 0 && splits[0] < y_stride,
            Some(MatvecOut::Split3) => {
                splits[0] > 0 && splits[0] < splits[1] && splits[1] < y_stride
            }
            None | Some(MatvecOut::Add) => true,
        };
        if !split_ok || ys.len() != widths.len() {
            return Err(Error::Gpu(format!(
                "{what}: {} outputs split at {splits:?} of {y_stride} rows for {out:?}",
                ys.len()
            )));
        }
        let single = ys.len() == 1;
        for (i, (y, &width)) in ys.iter().zip(&widths).enumerate() {
            // One output is "y", as the unfused kernels name it; split outputs are y0, y1, ...
            let name = if single {
                "y".to_string()
            } else {
                format!("y{i}")
            };
            check(
                &format!("{what}: {name}"),
                y,
                n_tokens.saturating_mul(width),
                4,
            )?;
        }
        // The shader's y index t * y_stride + row must fit in u32.
        to_u32(n_tokens.saturating_mul(y_stride), "matvec_q8 y elements")?;
        to_u32(qx_words(n_tokens, w.cols), "matvec_q8 qx words")?;
        let rows = to_u32(w.rows, "rows")?;
        let cols = to_u32(w.cols, "cols")?;
        // The weight rows read must fit in u32 too (w_row0 + row indexes the buffers).
        to_u32(w_row0.saturating_add(w.rows), "matvec_q8 weight rows")?;
        // Batches of several tile widths on CPU-like adapters take the prefill matmul (4 rows
        // per invocation), or the kernel `variants::launch_fallback` names for it where it
        // failed its selftest here.
        let row_key = if self.matvec_rows && n_tokens >= MATMUL_Q8_ROWS_MIN_TOKENS {
            let k = KernelKey::MatmulQ8Rows {
                ty: w.ty,
                out,
                subgroup: self.subgroup,
            };
            if self.unavailable.contains(&k) {
                variants::launch_fallback(k)
                    .ok_or_else(|| Error::Gpu(format!("{what}: {} is unusable here", k.label())))?
            } else {
                k
            }
        } else {
            match out {
                None => KernelKey::MatvecQ8Rows { ty: w.ty },
                Some(out) => KernelKey::MatvecQ8RowsOut { ty: w.ty, out },
            }
        };
        // Live invocations per workgroup of the register tiles: fewer than the workgroup where
        // that shares the workgroups out evenly over a CPU adapter's threads (576 rows on 2
        // threads: 6 workgroups of 96 rows instead of 3 of 256, the last with 64 live rows);
        // the decode matvec keeps whole workgroups (balancing them gained nothing on
        // lavapipe). The prefill matmul strides an invocation's 4 rows over the workgroup's;
        // the matvec takes 4 consecutive rows, as its decode always did.
        let prefill = matches!(row_key, KernelKey::MatmulQ8Rows { .. });
        let row_stride = if self.matvec_rows && n_tokens >= 4 {
            self.row_balance.stride(rows, TILE_ROWS)
        } else {
            self.workgroup_size
        };
        let (row_step, inv_step) = if prefill {
            (row_stride, 1)
        } else {
            (1, TILE_ROWS)
        };
        let per_group = if self.matvec_rows {
            TILE_ROWS * row_stride
        } else {
            self.q8_rows_per_group
        };
        let row_groups = rows.div_ceil(per_group);
        let n_t = to_u32(n_tokens, "n_tokens")?;
        // The row layout loops over the tokens inside each invocation (all of a launch's
        // tokens share one decode of each weight chunk); the other has a workgroup per token.
        if self.matvec_rows && n_tokens > MATVEC_Q8_ROWS_MAX_TOKENS {
            return Err(Error::Gpu(format!(
                "{what}: {n_tokens} tokens in one launch (at most {MATVEC_Q8_ROWS_MAX_TOKENS})"
            )));
        }
        let total = if self.matvec_rows {
            Some(row_groups)
        } else {
            row_groups.checked_mul(n_t)
        }
        .ok_or_else(|| Error::Gpu(format!("{what}: too many workgroups")))?;
        let groups = grid(total, self.max_groups_per_dim)?;
        let params = MatvecQ8Params {
            rows,
            cols,
            blocks_per_row: cols / QK,
            groups_x: groups.0,
            n_tokens: n_t,
            y_stride: to_u32(y_stride, "y_stride")?,
            row_offset: to_u32(row_offset, "row_offset")?,
            row_groups,
            w_row0: to_u32(w_row0, "w_row0")?,
            split1: to_u32(splits[0], "split1")?,
            split2: to_u32(splits[1], "split2")?,
            row_stride,
            row_step,
            inv_step,
            pad0: 0,
            pad1: 0,
        };
        let key = match out {
            _ if self.matvec_rows => row_key,
            None => KernelKey::MatvecQ8 {
                ty: w.ty,
                subgroup: self.subgroup,
            },
            Some(out) => KernelKey::MatvecQ8Out {
                ty: w.ty,
                subgroup: self.subgroup,
                out,
            },
        };
        let mut bufs = vec![(0, &w.quants)];
        if let Some(s) = &w.scales {
            bufs.push((1, s));
        }
        bufs.extend([(2, qx), (3, qd)]);
        // Outputs at 4, 6, 7 (5 is the uniform, as in the plain kernel).
        for (y, binding) in ys.into_iter().zip([4, 6, 7]) {
            bufs.push((binding, y));
        }
        Ok(Launch::new(key, &params, &bufs, 5, groups))
    }

    /// RMS normalization of `n_rows` rows of `n` f32 (`n` a multiple of 32) from `x` into
    /// `out`, with `out` also quantized into `qx` / `qd` exactly as
    /// [`Kernels::quantize_act_launch`] would quantize it.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm_quant_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        weight: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        qx: &'a wgpu::Buffer,
        qd: &'a wgpu::Buffer,
        n: usize,
        n_rows: usize,
        eps: f32,
    ) -> Result<Launch<'a>> {
        check_shape("rms_norm_quant", n_rows, n)?;
        check("rms_norm_quant qx", qx, qx_words(n_rows, n), 4)?;
        check("rms_norm_quant qd", qd, qd_vec4s(n_rows, n), 16)?;
        to_u32(n_rows.saturating_mul(n), "rms_norm_quant elements")?;
        let mut launch = self.rms_norm_launch(x, weight, out, n, n_rows, eps)?;
        launch.key = KernelKey::RmsNormQuant {
            subgroup: self.subgroup,
        };
        launch.buffers.extend([(4, qx), (5, qd)]);
        Ok(launch)
    }

    /// `gate = act(gate) * up` in place over `n` f32 (`n` a multiple of 32; SwiGLU or GeGLU),
    /// with the result also quantized into `qx` / `qd` exactly as
    /// [`Kernels::quantize_act_launch`] would.
    pub fn swiglu_quant_launch<'a>(
        &self,
        act: crate::config::FfnAct,
        gate: &'a wgpu::Buffer,
        up: &'a wgpu::Buffer,
        qx: &'a wgpu::Buffer,
        qd: &'a wgpu::Buffer,
        n: usize,
    ) -> Result<Launch<'a>> {
        check_shape("swiglu_quant", 1, n)?;
        check("swiglu_quant gate", gate, n, 4)?;
        check("swiglu_quant up", up, n, 4)?;
        check("swiglu_quant qx", qx, qx_words(1, n), 4)?;
        check("swiglu_quant qd", qd, qd_vec4s(1, n), 16)?;
        let n_u = to_u32(n, "swiglu_quant n")?;
        let chunks = n_u / QK;
        let groups = grid(
            chunks.div_ceil(self.workgroup_size),
            self.max_groups_per_dim,
        )?;
        let params = ElementwiseParams {
            n: n_u,
            groups_x: groups.0,
            act: crate::gpu::registry::act_code(act),
            scale: 1.0,
        };
        let bufs = [(0, gate), (1, up), (3, qx), (4, qd)];
        Ok(Launch::new(
            KernelKey::SwigluQuant,
            &params,
            &bufs,
            2,
            groups,
        ))
    }
}

/// Where [`Kernels::matvec_q8_target_launch`] writes.
pub struct Q8Target<'a> {
    /// `None`: store into `ys[0]`; `Add`: accumulate into `ys[0]`; `Split2`/`Split3`: global
    /// row g = row_offset + r goes to `ys[i]` for the range of `splits` holding it, each
    /// output `[n_tokens, its range's width]`.
    pub out: Option<MatvecOut>,
    pub ys: Vec<&'a wgpu::Buffer>,
    /// Row length of `ys[0]` for a store or add; the stacked matrix's total rows for a split.
    pub y_stride: usize,
    /// Global row of the launch's first row.
    pub row_offset: usize,
    /// Split2: `[rows of the first matrix, unused]`; Split3: the first two matrices' end rows.
    pub splits: [usize; 2],
}
