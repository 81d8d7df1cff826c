//! Prepared dispatches for the element-wise and row ops of the llama forward pass: RoPE,
//! SwiGLU, residual add, softmax and argmax (shaders `rope`, `swiglu`, `add`, `softmax`,
//! `argmax`) and the token embedding lookup (`embedding`). Each op checks its buffers' sizes before any GPU work.

use crate::config::FfnAct;
use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::{grid, to_u32, upload_f32, Dispatch, GpuMatrix, Kernels, Launch};
use crate::gpu::registry::{
    act_code, BiasParams, ElementwiseParams, EmbeddingParams, KernelKey, RopeParams, RowParams,
    ACT_SILU, ADD_SCALED, QK, SCALE,
};

/// Rotary embedding settings (see kernels-ref's `rope`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RopeConfig {
    pub n_heads: usize,
    pub head_dim: usize,
    /// rotated dims per head (even, at most `head_dim`)
    pub n_rot: usize,
    pub freq_base: f32,
    pub freq_scale: f32,
    /// pairs `(i, i + n_rot/2)` instead of `(2i, 2i + 1)`
    pub neox: bool,
    /// multiplies the rotated values (`Config::rope_attn_factor`; 1 for most models)
    pub mscale: f32,
}

pub(crate) fn check_len(what: &str, buf: &wgpu::Buffer, n_f32: u64) -> Result<()> {
    if buf.size() < n_f32.saturating_mul(4) {
        return Err(Error::Gpu(format!(
            "{what}: buffer of {} bytes, need {n_f32} elements",
            buf.size()
        )));
    }
    Ok(())
}

/// RoPE's per-pair frequencies `[n_rot / 2]`, computed in f64 so the shader's angle error is
/// only that of `pos * freq` in f32; `factors` (`[n_rot / 2]`, Llama 3's `rope_freqs`) divide
/// them, as ggml's `ggml_rope_cache_init` (ggml/src/ggml-cpu/ops.cpp) divides theta by `ff`.
pub fn rope_freqs(cfg: &RopeConfig, factors: Option<&[f32]>) -> Vec<f32> {
    (0..cfg.n_rot / 2)
        .map(|i| {
            let e = -2.0 * i as f64 / cfg.n_rot as f64;
            let ff = factors
                .and_then(|f| f.get(i))
                .map_or(1.0, |&v| f64::from(v));
            (f64::from(cfg.freq_scale) * f64::from(cfg.freq_base).powf(e) / ff) as f32
        })
        .collect()
}

impl Kernels {
    /// Prepares RoPE in place on `x`: `[n_tokens, n_heads, head_dim]` f32, token `t` at
    /// position `pos0 + t`. The per-pair frequencies are computed here in f64 and uploaded
    /// (`[n_rot / 2]`), so the shader's angle error is only that of `pos * freq` in f32.
    pub fn rope(
        &self,
        ctx: &GpuContext,
        x: &wgpu::Buffer,
        cfg: &RopeConfig,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<Dispatch> {
        let freqs = upload_f32(ctx, "rope.freqs", &rope_freqs(cfg, None))?;
        self.prepare(ctx, self.rope_launch(x, &freqs, cfg, n_tokens, pos0)?)
    }

    /// The launch of [`Kernels::rope`] with the frequencies (`[n_rot / 2]`, from
    /// [`rope_freqs`]) already on the GPU.
    pub fn rope_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        freqs: &'a wgpu::Buffer,
        cfg: &RopeConfig,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<Launch<'a>> {
        // x is bound as the (unused) second buffer too.
        self.rope_pair_launch(x, x, 0, freqs, cfg, n_tokens, pos0)
    }

    /// One launch of RoPE on `x` (`[n_tokens, cfg.n_heads, head_dim]`) and on `x2`
    /// (`[n_tokens, n_heads2, head_dim]`, e.g. the keys beside the queries), at the same
    /// positions; `n_heads2 = 0` leaves `x2` alone.
    #[allow(clippy::too_many_arguments)]
    pub fn rope_pair_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        x2: &'a wgpu::Buffer,
        n_heads2: usize,
        freqs: &'a wgpu::Buffer,
        cfg: &RopeConfig,
        n_tokens: usize,
        pos0: usize,
    ) -> Result<Launch<'a>> {
        if cfg.n_rot > cfg.head_dim || !cfg.n_rot.is_multiple_of(2) {
            return Err(Error::Gpu(format!(
                "rope: n_rot {} must be even and at most head_dim {}",
                cfg.n_rot, cfg.head_dim
            )));
        }
        let n = (n_tokens as u64)
            .saturating_mul(cfg.n_heads as u64)
            .saturating_mul(cfg.head_dim as u64);
        check_len("rope x", x, n)?;
        let n2 = (n_tokens as u64)
            .saturating_mul(n_heads2 as u64)
            .saturating_mul(cfg.head_dim as u64);
        check_len("rope x2", x2, n2)?;
        let half = cfg.n_rot / 2;
        let pos0 = to_u32(pos0, "pos0")?;
        // The last position must fit too (the shader adds the token index to pos0).
        to_u32(pos0 as usize + n_tokens, "last position")?;
        check_len("rope freqs", freqs, half as u64)?;
        let pairs = to_u32(n_tokens, "n_tokens")?
            .checked_mul(
                to_u32(cfg.n_heads, "n_heads")?.saturating_add(to_u32(n_heads2, "n_heads2")?),
            )
            .and_then(|v| v.checked_mul(half as u32))
            .ok_or_else(|| Error::Gpu("rope: too many pairs for u32".into()))?;
        let groups = grid(pairs.div_ceil(self.workgroup_size), self.max_groups_per_dim)?;
        let params = RopeParams {
            n_tokens: to_u32(n_tokens, "n_tokens")?,
            n_heads: to_u32(cfg.n_heads, "n_heads")?,
            head_dim: to_u32(cfg.head_dim, "head_dim")?,
            n_rot: to_u32(cfg.n_rot, "n_rot")?,
            pos0,
            neox: u32::from(cfg.neox),
            groups_x: groups.0,
            n_heads2: to_u32(n_heads2, "n_heads2")?,
            mscale: cfg.mscale,
            pad: [0; 3],
        };
        let bufs = [(0, x), (1, freqs), (3, x2)];
        Ok(Launch::new(KernelKey::Rope, &params, &bufs, 2, groups))
    }

    /// The launch of `x[r][c] += bias[c]` on x: `[n_rows, width]`, bias `[width]`.
    pub fn add_bias_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        bias: &'a wgpu::Buffer,
        width: usize,
        n_rows: usize,
    ) -> Result<Launch<'a>> {
        let n = (width as u64).saturating_mul(n_rows as u64);
        check_len("add_bias x", x, n)?;
        check_len("add_bias bias", bias, width as u64)?;
        if width == 0 {
            return Err(Error::Gpu("add_bias: zero width".into()));
        }
        let n = to_u32(n as usize, "n")?;
        let groups = grid(n.div_ceil(self.workgroup_size), self.max_groups_per_dim)?;
        let params = BiasParams {
            n,
            groups_x: groups.0,
            width: to_u32(width, "width")?,
            pad0: 0,
        };
        Ok(Launch::new(
            KernelKey::AddBias,
            &params,
            &[(0, x), (1, bias)],
            2,
            groups,
        ))
    }

    /// The launch of an element-wise kernel (`Swiglu`, `Add`) over `a` and `b`, both `[n]`
    /// (`Swiglu` with SiLU, [`Kernels::glu_launch`] picks the activation; `Add` plain,
    /// [`Kernels::add_scaled_launch`] takes a factor).
    pub fn elementwise_launch<'a>(
        &self,
        key: KernelKey,
        a: &'a wgpu::Buffer,
        b: &'a wgpu::Buffer,
        n: usize,
    ) -> Result<Launch<'a>> {
        let mode = match key {
            KernelKey::Add => ADD_SCALED,
            _ => ACT_SILU,
        };
        self.elementwise_act_launch(key, mode, 1.0, a, b, n)
    }

    /// The launch of `x += s * y` in place (`s * y` rounded first, as kernels-ref's
    /// `add_scaled`); both `[n]` f32.
    pub fn add_scaled_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        y: &'a wgpu::Buffer,
        s: f32,
        n: usize,
    ) -> Result<Launch<'a>> {
        self.elementwise_act_launch(KernelKey::Add, ADD_SCALED, s, x, y, n)
    }

    /// The launch of `x *= s` in place; x `[n]` f32. The add kernel in its scale mode does
    /// not read its second binding, but a dispatch must bind one: `unread` is any buffer
    /// other than `x` (of any length).
    pub fn scale_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        unread: &'a wgpu::Buffer,
        s: f32,
        n: usize,
    ) -> Result<Launch<'a>> {
        check_len("scale", x, n as u64)?;
        self.elementwise_bound_launch(KernelKey::Add, SCALE, s, x, unread, n)
    }

    /// The launch of `gate = act(gate) * up` in place (SwiGLU or GeGLU); both `[n]` f32.
    pub fn glu_launch<'a>(
        &self,
        act: FfnAct,
        gate: &'a wgpu::Buffer,
        up: &'a wgpu::Buffer,
        n: usize,
    ) -> Result<Launch<'a>> {
        self.elementwise_act_launch(KernelKey::Swiglu, act_code(act), 1.0, gate, up, n)
    }

    fn elementwise_act_launch<'a>(
        &self,
        key: KernelKey,
        act: u32,
        scale: f32,
        a: &'a wgpu::Buffer,
        b: &'a wgpu::Buffer,
        n: usize,
    ) -> Result<Launch<'a>> {
        check_len(&key.label(), a, n as u64)?;
        check_len(&key.label(), b, n as u64)?;
        self.elementwise_bound_launch(key, act, scale, a, b, n)
    }

    /// An element-wise launch over `[n]` elements with `a` and `b` bound, their lengths
    /// checked by the caller (the scale mode binds a `b` it does not read).
    fn elementwise_bound_launch<'a>(
        &self,
        key: KernelKey,
        act: u32,
        scale: f32,
        a: &'a wgpu::Buffer,
        b: &'a wgpu::Buffer,
        n: usize,
    ) -> Result<Launch<'a>> {
        let n = to_u32(n, "n")?;
        let groups = grid(n.div_ceil(self.workgroup_size), self.max_groups_per_dim)?;
        let params = ElementwiseParams {
            n,
            groups_x: groups.0,
            act,
            scale,
        };
        let bufs = [(0, a), (1, b)];
        Ok(Launch::new(key, &params, &bufs, 2, groups))
    }

    /// Prepares `gate = silu(gate) * up` in place; both `[n]` f32.
    pub fn swiglu(
        &self,
        ctx: &GpuContext,
        gate: &wgpu::Buffer,
        up: &wgpu::Buffer,
        n: usize,
    ) -> Result<Dispatch> {
        self.prepare(
            ctx,
            self.elementwise_launch(KernelKey::Swiglu, gate, up, n)?,
        )
    }

    /// Prepares `x += y` in place; both `[n]` f32.
    pub fn add(
        &self,
        ctx: &GpuContext,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
        n: usize,
    ) -> Result<Dispatch> {
        self.prepare(ctx, self.elementwise_launch(KernelKey::Add, x, y, n)?)
    }

    fn rows_launch<'a>(
        &self,
        key: KernelKey,
        bufs: &[(u32, &'a wgpu::Buffer)],
        n: usize,
        n_rows: usize,
    ) -> Result<Launch<'a>> {
        let groups = grid(to_u32(n_rows, "n_rows")?, self.max_groups_per_dim)?;
        let params = RowParams {
            n: to_u32(n, "n")?,
            n_rows: to_u32(n_rows, "n_rows")?,
            groups_x: groups.0,
            pad0: 0,
        };
        let uniform = bufs.len() as u32;
        Ok(Launch::new(key, &params, bufs, uniform, groups))
    }

    /// Prepares softmax in place over each row of `x`: `[n_rows, n]` f32.
    pub fn softmax(
        &self,
        ctx: &GpuContext,
        x: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<Dispatch> {
        self.prepare(ctx, self.softmax_launch(x, n, n_rows)?)
    }

    /// The launch of [`Kernels::softmax`].
    pub fn softmax_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<Launch<'a>> {
        check_len("softmax x", x, (n as u64).saturating_mul(n_rows as u64))?;
        let key = KernelKey::Softmax {
            subgroup: self.subgroup,
        };
        self.rows_launch(key, &[(0, x)], n, n_rows)
    }

    /// Prepares the argmax of each row of `x` (`[n_rows, n]` f32) into `out` (`[n_rows]`
    /// u32): ties go to the lowest index, NaN entries are skipped.
    pub fn argmax(
        &self,
        ctx: &GpuContext,
        x: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<Dispatch> {
        self.prepare(ctx, self.argmax_launch(x, out, n, n_rows)?)
    }

    /// The launch of [`Kernels::argmax`].
    pub fn argmax_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        n: usize,
        n_rows: usize,
    ) -> Result<Launch<'a>> {
        check_len("argmax x", x, (n as u64).saturating_mul(n_rows as u64))?;
        check_len("argmax out", out, n_rows as u64)?;
        self.rows_launch(KernelKey::Argmax, &[(0, x), (1, out)], n, n_rows)
    }

    /// Prepares the embedding lookup `out[t] = table[ids[t]]` as f32: `ids` holds `[n_tokens]`
    /// u32, `out` `[n_tokens, table.cols]` f32. An id past the table gives a row of zeros.
    pub fn embedding(
        &self,
        ctx: &GpuContext,
        table: &GpuMatrix,
        ids: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n_tokens: usize,
    ) -> Result<Dispatch> {
        self.prepare(ctx, self.embedding_launch(table, ids, out, n_tokens)?)
    }

    /// The launch of [`Kernels::embedding`] for a whole table.
    pub fn embedding_launch<'a>(
        &self,
        table: &'a GpuMatrix,
        ids: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        n_tokens: usize,
    ) -> Result<Launch<'a>> {
        self.embedding_part_launch(table, 0, table.rows, ids, out, n_tokens, 1.0)
    }

    /// The lookup for one part of a table split by rows: `part` holds table rows
    /// `row0..row0 + part.rows` of `total_rows`. Each part writes the tokens whose ids it
    /// holds; the part at row 0 also writes the zero rows of ids past the table. Every value
    /// is multiplied by `scale` (the model's embedding scale).
    #[allow(clippy::too_many_arguments)]
    pub fn embedding_part_launch<'a>(
        &self,
        part: &'a GpuMatrix,
        row0: usize,
        total_rows: usize,
        ids: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        n_tokens: usize,
        scale: f32,
    ) -> Result<Launch<'a>> {
        let table = part;
        if row0.saturating_add(part.rows) > total_rows {
            return Err(Error::Gpu(format!(
                "embedding part at row {row0} of {} rows overruns a {total_rows}-row table",
                part.rows
            )));
        }

        check_len("embedding ids", ids, n_tokens as u64)?;
        check_len(
            "embedding out",
            out,
            (n_tokens as u64).saturating_mul(table.cols as u64),
        )?;
        // One invocation per block of 32 values of a token's row (shaders/embedding.wgsl).
        let blocks = (n_tokens as u64).saturating_mul(table.cols.div_ceil(QK as usize) as u64);
        let invocations = u32::try_from(blocks)
            .map_err(|_| Error::Gpu(format!("embedding of {n_tokens} tokens: too many blocks")))?;
        let groups = grid(
            invocations.div_ceil(self.workgroup_size),
            self.max_groups_per_dim,
        )?;
        let params = EmbeddingParams {
            rows: to_u32(table.rows, "rows")?,
            cols: to_u32(table.cols, "cols")?,
            n_tokens: to_u32(n_tokens, "n_tokens")?,
            groups_x: groups.0,
            row0: to_u32(row0, "row0")?,
            total_rows: to_u32(total_rows, "total_rows")?,
            scale,
            pad1: 0,
        };
        let mut bufs = vec![(0, &table.quants)];
        if let Some(s) = &table.scales {
            bufs.push((1, s));
        }
        bufs.push((2, ids));
        bufs.push((3, out));
        let key = KernelKey::Embedding {
            ty: table.ty,
            f16: self.f16 && table.ty.has_f16_variant(),
        };
        Ok(Launch::new(key, &params, &bufs, 4, groups))
    }
}
