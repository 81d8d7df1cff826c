//! The mixture-of-experts kernels: routing (`shaders/moe_route.wgsl`), the routed experts'
//! products over a stack of every expert's matrix (`shaders/matvec_experts.wgsl` over f32
//! inputs; `shaders/experts_q8.wgsl` over 8-bit ones, the pairs grouped by expert) and the
//! weighted sum of their outputs (`shaders/moe_combine.wgsl`). The expert ids a routing writes
//! stay on the GPU: the matvecs read them there, so a token's pass needs no readback.
//!
//! Buffers, for `n` tokens routed to `k` experts each (pair p = t * k + j is token t's j-th):
//! - router logits `[n, n_expert]` f32; ids `[n, k]` u32; weights `[n, k]` f32;
//! - a stack `[n_expert * rows, cols]` in a weight format, expert e at rows `e * rows..`;
//! - expert outputs `[n * k, rows]` f32, a token's k rows together.

use crate::error::{Error, Result};
use crate::gpu::kernels::q8act::{qd_vec4s, qx_words};
use crate::gpu::kernels::{grid, to_u32, GpuMatrix, Kernels, Launch};
use crate::gpu::registry::{KernelKey, MatvecExpertsParams, MoeCombineParams, MoeRouteParams, QK};

/// Pairs of one expert that `shaders/experts_q8.wgsl` multiplies per decoded weight chunk.
pub const EXPERTS_TILE: u32 = 8;

/// The routed experts' inputs: f32 rows (`shaders/matvec_experts.wgsl`), or the same rows
/// quantized to 8-bit chunks by `quantize_act`/`swiglu_quant` (`shaders/experts_q8.wgsl`:
/// `qx` [rows * cols / 4] u32, `qd` [rows * cols / 32] vec4<f32>).
#[derive(Clone, Copy)]
pub enum ExpertsInput<'a> {
    F32(&'a wgpu::Buffer),
    Q8 {
        qx: &'a wgpu::Buffer,
        qd: &'a wgpu::Buffer,
    },
}

/// [`crate::gpu::kernels::ops`]'s length check, with the element count as these launches count it.
fn check_len(what: &str, buf: &wgpu::Buffer, n: usize) -> Result<()> {
    crate::gpu::kernels::ops::check_len(what, buf, n as u64)
}

impl Kernels {
    /// ids, weights: `[n_tokens, k]` = each token's `k` most probable experts (descending,
    /// ties to the lower index) and their softmax probabilities over `logits` (`[n_tokens,
    /// n_expert]`), divided by their sum when `normalize`: kernels-ref's `route_experts`.
    #[allow(clippy::too_many_arguments)]
    pub fn moe_route_launch<'a>(
        &self,
        logits: &'a wgpu::Buffer,
        ids: &'a wgpu::Buffer,
        weights: &'a wgpu::Buffer,
        n_tokens: usize,
        n_expert: usize,
        k: usize,
        normalize: bool,
    ) -> Result<Launch<'a>> {
        if n_tokens == 0 || k == 0 || k > n_expert {
            return Err(Error::Gpu(format!(
                "moe_route: {n_tokens} tokens routed to {k} of {n_expert} experts"
            )));
        }
        check_len(
            "moe_route logits",
            logits,
            n_tokens.saturating_mul(n_expert),
        )?;
        check_len("moe_route ids", ids, n_tokens.saturating_mul(k))?;
        check_len("moe_route weights", weights, n_tokens.saturating_mul(k))?;
        to_u32(n_tokens.saturating_mul(n_expert), "moe_route logits")?;
        let n_t = to_u32(n_tokens, "n_tokens")?;
        let groups = grid(n_t.div_ceil(self.workgroup_size), self.max_groups_per_dim)?;
        let params = MoeRouteParams {
            n_tokens: n_t,
            n_expert: to_u32(n_expert, "n_expert")?,
            k: to_u32(k, "k")?,
            normalize: u32::from(normalize),
            groups_x: groups.0,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        let bufs = [(0, logits), (1, ids), (2, weights)];
        Ok(Launch::new(KernelKey::MoeRoute, &params, &bufs, 3, groups))
    }

    /// y: `[n_pairs, rows]`, y[p] = W_e x[p / x_div] for the pairs whose expert e = ids[p] is
    /// one of `part`'s experts `e_lo..e_lo + part.rows / rows` (`part`: rows `e_lo * rows..`
    /// of a stack of `rows`-row matrices); the other pairs' rows of y are untouched. x:
    /// `[n_pairs / x_div, part.cols]`, f32 or quantized ([`ExpertsInput`]); ids: `[n_pairs]`.
    #[allow(clippy::too_many_arguments)]
    pub fn matvec_experts_launch<'a>(
        &self,
        part: &'a GpuMatrix,
        rows: usize,
        e_lo: usize,
        ids: &'a wgpu::Buffer,
        x: ExpertsInput<'a>,
        y: &'a wgpu::Buffer,
        n_pairs: usize,
        x_div: usize,
    ) -> Result<Launch<'a>> {
        let q8 = matches!(x, ExpertsInput::Q8 { .. });
        let what = format!(
            "matvec_experts {:?} [{rows}, {}] x {n_pairs} pairs{}",
            part.ty,
            part.cols,
            if q8 { " (8-bit)" } else { "" }
        );
        if rows == 0 || !part.rows.is_multiple_of(rows) || n_pairs == 0 || x_div == 0 {
            return Err(Error::Gpu(format!(
                "{what}: a part of {} rows is not whole experts, or nothing to do",
                part.rows
            )));
        }
        if !n_pairs.is_multiple_of(x_div) {
            return Err(Error::Gpu(format!(
                "{what}: {n_pairs} pairs are not whole tokens of {x_div}"
            )));
        }
        let cols = part.cols;
        let n_x = n_pairs / x_div;
        match x {
            ExpertsInput::F32(x) => {
                check_len(&format!("{what}: x"), x, n_x.saturating_mul(cols))?;
            }
            ExpertsInput::Q8 { qx, qd } => {
                if !part.ty.has_q8_path() || !cols.is_multiple_of(QK as usize) {
                    return Err(Error::Gpu(format!(
                        "{what}: 8-bit inputs need a format with an integer path and whole \
                         chunks of {QK} columns"
                    )));
                }
                check_len(&format!("{what}: qx"), qx, qx_words(n_x, cols))?;
                check_len(&format!("{what}: qd"), qd, qd_vec4s(n_x, cols) * 4)?;
            }
        }
        check_len(&format!("{what}: y"), y, n_pairs.saturating_mul(rows))?;
        check_len(&format!("{what}: ids"), ids, n_pairs)?;
        to_u32(n_pairs.saturating_mul(rows), "matvec_experts y elements")?;
        to_u32(n_x.saturating_mul(cols), "matvec_experts x elements")?;
        let rows_u = to_u32(rows, "rows")?;
        let cols_u = to_u32(cols, "cols")?;
        // The 8-bit kernel's invocations take 4 rows each.
        let rows_per_group = self.workgroup_size * if q8 { 4 } else { 1 };
        let row_groups = rows_u.div_ceil(rows_per_group);
        let n_pairs_u = to_u32(n_pairs, "n_pairs")?;
        let experts = to_u32(part.rows / rows, "experts")?;
        // The 8-bit kernel's workgroups: (chunk of the pair list, expert, row group). A chunk
        // holds about 4 tiles of an expert's pairs when routing is even, so a tile cut by a
        // chunk's end wastes little, while a hot expert's pairs still spread over chunks.
        let (chunk, n_chunks) = if q8 {
            let chunk = experts
                .saturating_mul(4 * EXPERTS_TILE)
                .max(64)
                .min(n_pairs_u);
            (chunk, n_pairs_u.div_ceil(chunk))
        } else {
            (0, 0)
        };
        let units = if q8 {
            experts.checked_mul(n_chunks)
        } else {
            Some(n_pairs_u)
        };
        let total = units
            .and_then(|u| u.checked_mul(row_groups))
            .ok_or_else(|| Error::Gpu(format!("{what}: too many workgroups")))?;
        let groups = grid(total, self.max_groups_per_dim)?;
        let params = MatvecExpertsParams {
            rows: rows_u,
            cols: cols_u,
            blocks_per_row: cols_u.div_ceil(QK),
            groups_x: groups.0,
            n_pairs: n_pairs_u,
            x_div: to_u32(x_div, "x_div")?,
            row_groups,
            e_lo: to_u32(e_lo, "e_lo")?,
            e_hi: to_u32(e_lo + part.rows / rows, "e_hi")?,
            chunk,
            n_chunks,
            pad0: 0,
        };
        let mut bufs = vec![(0, &part.quants)];
        if let Some(s) = &part.scales {
            bufs.push((1, s));
        }
        match x {
            ExpertsInput::F32(x) => bufs.extend([(2, x), (3, y)]),
            ExpertsInput::Q8 { qx, qd } => bufs.extend([(2, qx), (3, qd), (6, y)]),
        }
        bufs.push((4, ids));
        Ok(Launch::new(
            KernelKey::MatvecExperts { ty: part.ty, q8 },
            &params,
            &bufs,
            5,
            groups,
        ))
    }

    /// out: `[n_tokens, n]` = Σ_j weights[t, j] · y[t * k + j] (y: `[n_tokens * k, n]`,
    /// weights: `[n_tokens, k]`), plus sigmoid(gate[t]) · shared[t] with `shared` = (its
    /// output `[n_tokens, n]`, its gate logits `[n_tokens]`).
    #[allow(clippy::too_many_arguments)]
    pub fn moe_combine_launch<'a>(
        &self,
        y: &'a wgpu::Buffer,
        weights: &'a wgpu::Buffer,
        shared: Option<(&'a wgpu::Buffer, Option<&'a wgpu::Buffer>)>,
        out: &'a wgpu::Buffer,
        n_tokens: usize,
        n: usize,
        k: usize,
    ) -> Result<Launch<'a>> {
        let len = n_tokens.saturating_mul(n);
        check_len("moe_combine y", y, len.saturating_mul(k))?;
        check_len("moe_combine weights", weights, n_tokens.saturating_mul(k))?;
        check_len("moe_combine out", out, len)?;
        if let Some((sy, sg)) = shared {
            check_len("moe_combine shared output", sy, len)?;
            if let Some(sg) = sg {
                check_len("moe_combine shared gate", sg, n_tokens)?;
            }
        }
        to_u32(len.saturating_mul(k), "moe_combine y elements")?;
        let total = to_u32(len, "moe_combine elements")?;
        let groups = grid(total.div_ceil(self.workgroup_size), self.max_groups_per_dim)?;
        let params = MoeCombineParams {
            n_tokens: to_u32(n_tokens, "n_tokens")?,
            n: to_u32(n, "n")?,
            k: to_u32(k, "k")?,
            has_shared: match shared {
                None => 0,
                Some((_, Some(_))) => 1,
                Some((_, None)) => 2,
            },
            groups_x: groups.0,
            pad0: 0,
            pad1: 0,
            pad2: 0,
        };
        // Without a shared expert (or its gate) its bindings take buffers the kernel never
        // reads.
        let (sy, sg) = shared.unwrap_or((y, None));
        let sg = sg.unwrap_or(weights);
        let bufs = [(0, y), (1, weights), (2, sy), (3, sg), (4, out)];
        Ok(Launch::new(
            KernelKey::MoeCombine,
            &params,
            &bufs,
            5,
            groups,
        ))
    }
}
