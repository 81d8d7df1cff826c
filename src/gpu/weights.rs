//! The model's weights on the GPU, uploaded once at load and shared by every session.
//!
//! Matrices in the formats the kernels decode (Q4_0, Q4_1, Q8_0, F16, F32, ...) are repacked
//! from the mmap into the GPU layout; other formats are converted at load (to Q8_0, or F32 when
//! a row is not whole Q8_0 blocks) with a warning. A matrix whose packed buffers would exceed the
//! adapter's `max_storage_buffer_binding_size` is split by rows into parts that each fit one
//! binding: the kernels write each part's rows into the shared output (`row_offset`), so a big
//! tensor is never silently left on the CPU. Norm weights and biases become f32 buffers.

use std::collections::HashMap;

use kernels_ref::GgmlType;

use crate::backend::WeightId;
use crate::config::Config;
use crate::error::{Error, Result};
use crate::gguf::Gguf;
use crate::gpu::device::GpuContext;
use crate::gpu::kernels::ops::{rope_freqs, RopeConfig};
use crate::gpu::kernels::{flush_uploads, upload_f32, upload_matrix, GpuMatrix, Kernels};
use crate::gpu::registry::WeightFormat;
use crate::gpu::repack::repack;
use crate::ground::{Device, Placement};

/// Rows `row0..row0 + m.rows` of a weight matrix, read from rows `w_row0..w_row0 + m.rows`
/// of `m`'s buffers (0 unless the matrix is a row range of a fused one; only the 8-bit
/// activation kernels read such views).
#[derive(Clone)]
pub struct MatrixPart {
    pub m: GpuMatrix,
    pub row0: usize,
    pub w_row0: usize,
}

/// Matrices that read the same input stacked by rows into one buffer (Wq | Wk | Wv, or
/// Gate | Up), so one launch computes all of them; each member is also kept as a row-range
/// view of the same buffers (see [`GpuModel::matrix`]), so nothing is stored twice.
pub struct FusedMatrix {
    /// The stacked matrix, in one part.
    pub m: GpuMatrix,
    /// Where each member but the last ends (1 entry for gate/up, 2 for q/k/v).
    pub splits: Vec<usize>,
}

/// A weight matrix as one or more row ranges, each within one storage binding.
#[derive(Clone)]
pub struct GpuWeightMatrix {
    pub rows: usize,
    pub cols: usize,
    pub parts: Vec<MatrixPart>,
}

/// Options for the upload.
#[derive(Debug, Clone, Default)]
pub struct GpuLoadOptions {
    /// Caps the bytes of one storage binding below the adapter's limit (tests force splitting
    /// with it).
    pub max_binding_bytes: Option<u64>,
    /// Keep matmul activations in f32 instead of quantizing them to 8 bits per chunk of 32 as
    /// the CPU path (and llama.cpp) does. The default (false) makes the GPU compute the same
    /// integer dot products as the CPU for Q4_0/Q4_1/Q8_0 weights, so the two paths agree to
    /// f32 rounding; f32 activations are slightly closer to exact arithmetic.
    pub f32_activations: bool,
    /// The stages whose weights go to the GPU (those placed there in any phase); `None`
    /// uploads every weight. The others stay in the mmap for the CPU backend.
    pub resident: Option<Placement>,
    /// Time measured passes with the wall clock even when the adapter has timestamp queries
    /// (tests of the fallback; adapters whose timestamps are unreliable).
    pub no_timestamps: bool,
    /// Fault injection for the failover tests, installed on the context before the upload.
    #[doc(hidden)]
    pub faults: Option<std::sync::Arc<crate::gpu::faults::GpuFaults>>,
    /// Kernel variants not to use on this adapter (failed their start-up selftest or known
    /// bad): their fallbacks are compiled in their place.
    pub unusable_kernels: std::collections::HashSet<crate::gpu::KernelKey>,
    /// The KV cache types the model's sessions use: only their attention and store kernels
    /// (and only the model's weight formats' kernels) are compiled at load, the others on
    /// first use. `None` compiles every variant at load.
    pub kv_types: Option<crate::kv_type::KvTypes>,
}

/// Whether weight `id` is needed on the GPU by the stages `p` puts there.
pub fn needed_on_gpu(id: WeightId, p: &Placement, tied_embeddings: bool) -> bool {
    let gpu = |d: Device| d == Device::Gpu;
    match id {
        WeightId::TokEmbd => gpu(p.embed) || (tied_embeddings && gpu(p.head)),
        WeightId::OutputNorm | WeightId::Output => gpu(p.head),
        other => other
            .layer_index()
            .and_then(|l| p.layers.get(l))
            .is_some_and(|&d| gpu(d)),
    }
}

/// The compiled kernels and resident weights of one model on one adapter.
pub struct GpuModel {
    pub ctx: GpuContext,
    pub kernels: Kernels,
    pub cfg: Config,
    mats: HashMap<WeightId, GpuWeightMatrix>,
    /// Stacked matrices by their first member (Wq(l), Gate(l)).
    fused: HashMap<WeightId, FusedMatrix>,
    /// Norm weights and biases: [len] f32 each.
    vecs: HashMap<WeightId, wgpu::Buffer>,
    /// RoPE frequencies: [n_rot / 2] f32 of the global blocks, then of the sliding-window
    /// blocks where their base differs (gemma3).
    rope_freqs: wgpu::Buffer,
    rope_freqs_local: Option<wgpu::Buffer>,
    /// [n_rot / 2] f32 with LongRoPE's long factors (phi3), for contexts past the original.
    rope_freqs_long: Option<wgpu::Buffer>,
    /// Bytes of storage one binding may hold here (the adapter's, or the forced cap).
    pub max_binding_bytes: u64,
    /// Bytes of weights resident on the GPU.
    pub weight_bytes: u64,
    /// What the upload had to change (converted formats).
    pub warnings: Vec<String>,
    /// See [`GpuLoadOptions::f32_activations`].
    pub f32_activations: bool,
    /// Whether sessions time measured passes with GPU timestamps (the adapter has
    /// `TIMESTAMP_QUERY` and [`GpuLoadOptions::no_timestamps`] is off).
    pub timestamps: bool,
    /// The upload that ran out of memory, when one did: the weights from it on are not here
    /// (a block is all here or not at all), and the stages needing them run on the CPU.
    pub upload_failure: Option<String>,
    /// What the start-up check found (empty when the model was loaded without one).
    pub health: crate::gpu::health::HealthReport,
}

/// Weight bytes a load uploads between two waits for the upload copies: the staging memory
/// it holds beyond the weights (see `flush_uploads`).
const FLUSH_BYTES: u64 = 32 << 20;

/// The weights uploaded so far by [`GpuModel::load`].
#[derive(Default)]
struct Uploads {
    mats: HashMap<WeightId, GpuWeightMatrix>,
    fused: HashMap<WeightId, FusedMatrix>,
    vecs: HashMap<WeightId, wgpu::Buffer>,
    warnings: Vec<String>,
    weight_bytes: u64,
}

impl Uploads {
    /// Uploads weight `id` of shape `dims` (with its fused group, if it heads one).
    fn upload(
        &mut self,
        ctx: &GpuContext,
        gguf: &Gguf,
        id: WeightId,
        dims: &[usize],
        opts: &GpuLoadOptions,
        limit: u64,
    ) -> Result<()> {
        let group = match id {
            WeightId::Wq(l) => vec![id, WeightId::Wk(l), WeightId::Wv(l)],
            WeightId::Gate(l) => vec![id, WeightId::Up(l)],
            _ => Vec::new(),
        };
        // Fused only for the 8-bit activation path, the one with stacked-output kernels.
        if !group.is_empty() && !opts.f32_activations {
            if let Some((f, views)) = fuse(ctx, gguf, &group, limit)? {
                self.weight_bytes +=
                    f.m.quants.size() + f.m.scales.as_ref().map_or(0, |s| s.size());
                self.mats.extend(views);
                self.fused.insert(id, f);
                return Ok(());
            }
        }
        let t = gguf.require_tensor(&id.tensor_name())?;
        let data = gguf.tensor_data(t);
        let tensor_err = |msg: String| Error::Tensor {
            name: t.name.clone(),
            msg,
        };
        // The shared expert's gate is a vector the GPU applies as a one-row matrix (its logit
        // per token is a matvec).
        if dims.len() == 1 && !matches!(id, WeightId::GateInpShexp(_)) {
            let v = kernels_ref::dequantize_vec(t.ty, data, dims[0])
                .map_err(|e| tensor_err(e.to_string()))?;
            self.weight_bytes += (v.len() * 4) as u64;
            self.vecs.insert(id, upload_f32(ctx, &t.name, &v)?);
            return Ok(());
        }
        // An expert stack ([cols, rows, n_expert]) is its 2-D view of n_expert * rows rows,
        // split across bindings only between experts (the expert kernels bind one part per
        // launch and read whole experts from it).
        let (cols, rows, align) = match *dims {
            [c] => (c, 1, 1),
            [c, r] => (c, r, 1),
            [c, r, e] => (c, r * e, r),
            _ => return Err(tensor_err(format!("{} dimensions", dims.len()))),
        };
        let (ty, bytes, warning) = gpu_format(t.ty, &t.name, data, rows, cols)?;
        self.warnings.extend(warning);
        let m = upload_split_aligned(ctx, &t.name, ty, &bytes, (rows, cols), limit, align)?;
        self.weight_bytes += m
            .parts
            .iter()
            .map(|p| p.m.quants.size() + p.m.scales.as_ref().map_or(0, |s| s.size()))
            .sum::<u64>();
        self.mats.insert(id, m);
        Ok(())
    }

    /// Drops the weights uploaded with `id`'s stage: all of its block's, or `id` itself, so a
    /// stage is on the GPU whole or not at all.
    fn forget(&mut self, id: WeightId) {
        let same = |w: &WeightId| match id.layer_index() {
            Some(l) => w.layer_index() == Some(l),
            None => *w == id,
        };
        self.mats.retain(|w, _| !same(w));
        self.fused.retain(|w, _| !same(w));
        self.vecs.retain(|w, _| !same(w));
    }
}

impl GpuModel {
    /// Compiles the kernels and uploads every weight of `cfg`'s forward pass.
    pub fn load(
        ctx: GpuContext,
        gguf: &Gguf,
        cfg: &Config,
        opts: &GpuLoadOptions,
    ) -> Result<GpuModel> {
        let mut ctx = ctx;
        if let Some(f) = &opts.faults {
            ctx.set_faults(f.clone());
        }
        let eager = match opts.kv_types {
            Some(kv) => Some(crate::gpu::health::startup::model_keys(
                &ctx, gguf, cfg, kv,
            )?),
            None => None,
        };
        let kernels = Kernels::with_health_for(
            &ctx,
            crate::gpu::health::startup::kernel_options(&ctx),
            &opts.unusable_kernels,
            |k| eager.as_ref().is_none_or(|e| e.contains(k)),
        )?;
        let limit = opts
            .max_binding_bytes
            .unwrap_or(u64::MAX)
            .min(ctx.limits.max_storage_buffer_binding_size)
            .min(ctx.limits.max_buffer_size);
        let mut up = Uploads::default();
        let mut upload_failure = None;
        let mut stage = (None, 0u64);
        // Weight bytes whose upload copies have run (see `flush_uploads`).
        let mut flushed = 0u64;
        for (id, dims) in crate::backend::expected_weights(cfg) {
            if let Some(p) = &opts.resident {
                // Norms and biases (a few KB a layer) stay on the GPU for every layer, so
                // a streamed layer only moves its matrices.
                if dims.len() >= 2 && !needed_on_gpu(id, p, cfg.tied_embeddings) {
                    continue;
                }
            }
            if up.mats.contains_key(&id) {
                // A member of a fused matrix, already in place as a view.
                continue;
            }
            // Bytes before this weight's stage (a block's first weight starts it).
            if id.layer_index().is_none() || id.layer_index() != stage.0 {
                stage = (id.layer_index(), up.weight_bytes);
            }
            match up.upload(&ctx, gguf, id, &dims, opts, limit) {
                Ok(()) => {
                    // Bounds the staging memory of a load to about FLUSH_BYTES beyond the
                    // largest weight.
                    if up.weight_bytes - flushed >= FLUSH_BYTES {
                        flush_uploads(&ctx)?;
                        flushed = up.weight_bytes;
                    }
                }
                // The memory is full: keep what fits, the stages missing a weight run on the
                // CPU (the caller re-places them, see `GpuModel::upload_failure`).
                Err(Error::OutOfMemory { what }) => {
                    up.forget(id);
                    up.weight_bytes = stage.1;
                    upload_failure = Some(what);
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        let Uploads {
            mats,
            vecs,
            fused,
            warnings,
            weight_bytes,
        } = up;
        let freqs_of = |rope: (f32, f32), factors: Option<&[f32]>| {
            rope_freqs(&rope_config_with(cfg, rope, cfg.n_head), factors)
        };
        let global = cfg.global_rope();
        let rope_freqs = upload_f32(
            &ctx,
            "rope.freqs",
            &freqs_of(global, cfg.rope_freq_factors.as_deref()),
        )?;
        // LongRoPE's long factors, for sessions past the original context.
        let rope_freqs_long = match &cfg.long_rope {
            Some(lr) => Some(upload_f32(
                &ctx,
                "rope.freqs.long",
                &freqs_of(global, Some(&lr.long)),
            )?),
            None => None,
        };
        let rope_freqs_local = match (0..cfg.n_layer).find(|&l| cfg.window(l).is_some()) {
            Some(l) => Some(upload_f32(
                &ctx,
                "rope.freqs.local",
                &freqs_of(cfg.rope_of(l), cfg.rope_freq_factors.as_deref()),
            )?),
            None => None,
        };
        flush_uploads(&ctx)?;
        let timestamps =
            !opts.no_timestamps && ctx.features.contains(wgpu::Features::TIMESTAMP_QUERY);
        Ok(GpuModel {
            ctx,
            kernels,
            cfg: cfg.clone(),
            mats,
            fused,
            vecs,
            rope_freqs,
            rope_freqs_local,
            rope_freqs_long,
            max_binding_bytes: limit,
            weight_bytes,
            warnings,
            f32_activations: opts.f32_activations,
            timestamps,
            upload_failure,
            health: Default::default(),
        })
    }

    /// The RoPE settings of `n_heads` heads of block `l` of this model.
    pub fn rope_config(&self, l: usize, n_heads: usize) -> RopeConfig {
        rope_config_of(&self.cfg, l, n_heads)
    }

    /// Block `l`'s RoPE frequencies on the GPU, in a context of `n_ctx` positions (which
    /// picks LongRoPE's long or short factors): `[n_rot / 2]` f32.
    pub fn rope_freqs(&self, l: usize, n_ctx: usize) -> &wgpu::Buffer {
        let long = self
            .cfg
            .long_rope
            .as_ref()
            .is_some_and(|lr| n_ctx > lr.orig_ctx);
        match (
            &self.rope_freqs_local,
            self.cfg.window(l),
            &self.rope_freqs_long,
        ) {
            (Some(local), Some(_), _) => local,
            (_, _, Some(lr)) if long => lr,
            _ => &self.rope_freqs,
        }
    }

    /// Whether transformer block `l`'s weights are on the GPU.
    pub fn has_layer(&self, l: usize) -> bool {
        self.mats.contains_key(&WeightId::Wq(l))
    }

    /// Whether the weight is on the GPU.
    pub fn has(&self, id: WeightId) -> bool {
        self.mats.contains_key(&id) || self.vecs.contains_key(&id)
    }

    pub fn matrix(&self, id: WeightId) -> Result<&GpuWeightMatrix> {
        self.mats
            .get(&id)
            .ok_or_else(|| Error::Gpu(format!("{} is not on the GPU", id.tensor_name())))
    }

    /// The stacked matrix whose first member is `first` (Wq(l) or Gate(l)), if the load
    /// fused that group.
    pub fn fused(&self, first: WeightId) -> Option<&FusedMatrix> {
        self.fused.get(&first)
    }

    pub fn vector(&self, id: WeightId) -> Result<&wgpu::Buffer> {
        self.vecs
            .get(&id)
            .ok_or_else(|| Error::Gpu(format!("{} is not on the GPU", id.tensor_name())))
    }
}

/// The format a matrix of ggml type `ty` takes on the GPU and its bytes in that format: the
/// mmap's bytes when a kernel decodes `ty`, else a conversion (to Q8_0, or F32 when a row is
/// not whole Q8_0 blocks) with the warning to show.
/// The format a weight of GGML type `ty` with rows of `cols` has on the GPU: its own when a
/// kernel decodes it, else what [`gpu_format`] converts it to.
pub fn gpu_weight_format(ty: GgmlType, cols: usize) -> WeightFormat {
    WeightFormat::from_ggml(ty).unwrap_or(if cols.is_multiple_of(32) {
        WeightFormat::Q8_0
    } else {
        WeightFormat::F32
    })
}

pub fn gpu_format<'a>(
    ty: GgmlType,
    name: &str,
    data: &'a [u8],
    rows: usize,
    cols: usize,
) -> Result<(WeightFormat, std::borrow::Cow<'a, [u8]>, Option<String>)> {
    if let Some(f) = WeightFormat::from_ggml(ty) {
        return Ok((f, std::borrow::Cow::Borrowed(data), None));
    }
    let tensor_err = |msg: String| Error::Tensor {
        name: name.into(),
        msg,
    };
    // No kernel decodes this format: convert once, at load.
    let f = kernels_ref::dequantize_vec(ty, data, rows * cols)
        .map_err(|e| tensor_err(e.to_string()))?;
    let to = gpu_weight_format(ty, cols);
    let owned = kernels_ref::quantize(to.ggml(), &f).map_err(|e| tensor_err(e.to_string()))?;
    let warning = format!(
        "{name}: {} has no GPU kernel; converted to {} at load",
        ty.name(),
        to.ggml().name()
    );
    Ok((to, std::borrow::Cow::Owned(owned), Some(warning)))
}

/// Repacks and uploads `data` (`[rows, cols]` of `ty`, ggml layout) in row ranges whose packed
/// buffers each fit `limit` bytes.
pub fn upload_split(
    ctx: &GpuContext,
    name: &str,
    ty: WeightFormat,
    data: &[u8],
    rows: usize,
    cols: usize,
    limit: u64,
) -> Result<GpuWeightMatrix> {
    upload_split_aligned(ctx, name, ty, data, (rows, cols), limit, 1)
}

/// [`upload_split`] with every part a whole number of `align` rows (an expert stack's parts
/// hold whole experts).
pub fn upload_split_aligned(
    ctx: &GpuContext,
    name: &str,
    ty: WeightFormat,
    data: &[u8],
    (rows, cols): (usize, usize),
    limit: u64,
    align: usize,
) -> Result<GpuWeightMatrix> {
    let g: GgmlType = ty.ggml();
    let row_bytes = g
        .row_bytes(cols as u64)
        .and_then(|b| usize::try_from(b).ok())
        .ok_or_else(|| Error::Tensor {
            name: name.into(),
            msg: format!(
                "{cols} columns is not a whole number of {} blocks",
                g.name()
            ),
        })?;
    if rows == 0 || data.len() != rows * row_bytes {
        return Err(Error::Tensor {
            name: name.into(),
            msg: format!("{} bytes for [{rows}, {cols}] of {}", data.len(), g.name()),
        });
    }
    // The packed size of one row bounds every row's (block packing only rounds up per part).
    let one = repack(ty, &data[..row_bytes], 1, cols)?;
    let per_row = (one.quants.len().max(one.scales.len()) as u64 * 4).max(4);
    let rows_per_part = usize::try_from(limit / per_row).unwrap_or(usize::MAX);
    // Each part is repacked on its own, so any row count works.
    let align = align.max(1);
    let rows_per_part = rows_per_part.min(rows) / align * align;
    if rows_per_part == 0 {
        return Err(Error::Gpu(format!(
            "{name}: {align} rows ({per_row} bytes each, packed) exceed the storage binding \
             limit of {limit} bytes"
        )));
    }
    let mut parts = Vec::new();
    let mut row0 = 0;
    while row0 < rows {
        let n = rows_per_part.min(rows - row0);
        let packed = repack(ty, &data[row0 * row_bytes..(row0 + n) * row_bytes], n, cols)?;
        parts.push(MatrixPart {
            m: upload_matrix(ctx, &packed)?,
            row0,
            w_row0: 0,
        });
        row0 += n;
    }
    Ok(GpuWeightMatrix { rows, cols, parts })
}

/// Stacks the matrices `ids` (which read the same input) by rows into one upload when they
/// share a format with the 8-bit integer path and a column count that is whole chunks of 32,
/// and the stack fits one binding; returns it with each member as a row-range view. `None`
/// leaves them to be uploaded apart.
#[allow(clippy::type_complexity)]
fn fuse(
    ctx: &GpuContext,
    gguf: &Gguf,
    ids: &[WeightId],
    limit: u64,
) -> Result<Option<(FusedMatrix, Vec<(WeightId, GpuWeightMatrix)>)>> {
    let mut ty = None;
    let mut cols = None;
    let mut rows = Vec::with_capacity(ids.len());
    let mut data: Vec<&[u8]> = Vec::with_capacity(ids.len());
    for id in ids {
        let t = gguf.require_tensor(&id.tensor_name())?;
        let f = match WeightFormat::from_ggml(t.ty) {
            Some(f) if f.has_q8_path() => f,
            _ => return Ok(None),
        };
        if t.dims.len() != 2 || ty.is_some_and(|g| g != f) || cols.is_some_and(|c| c != t.dims[0]) {
            return Ok(None);
        }
        let c = usize::try_from(t.dims[0]).ok();
        let r = usize::try_from(t.dims[1]).ok();
        let (Some(c), Some(r)) = (c, r) else {
            return Ok(None);
        };
        if !c.is_multiple_of(32) {
            return Ok(None);
        }
        ty = Some(f);
        cols = Some(t.dims[0]);
        rows.push(r);
        data.push(gguf.tensor_data(t));
    }
    let (Some(ty), Some(cols)) = (ty, cols) else {
        return Ok(None);
    };
    let cols = usize::try_from(cols).map_err(|_| Error::Gpu("columns overflow".into()))?;
    // The packed quants and scales are each smaller than the ggml blocks: a stack whose ggml
    // bytes fit one binding packs into one part.
    let bytes: usize = data.iter().map(|d| d.len()).sum();
    if bytes as u64 > limit {
        return Ok(None);
    }
    let stacked = data.concat();
    let total: usize = rows.iter().sum();
    let name = format!("{} (stacked)", ids[0].tensor_name());
    let mut m = upload_split(ctx, &name, ty, &stacked, total, cols, limit)?;
    if m.parts.len() != 1 {
        return Ok(None);
    }
    let Some(whole) = m.parts.pop() else {
        return Ok(None);
    };
    let mut views = Vec::with_capacity(ids.len());
    let mut splits = Vec::with_capacity(ids.len());
    let mut r0 = 0;
    for (&id, &r) in ids.iter().zip(&rows) {
        let view = GpuMatrix {
            ty,
            rows: r,
            cols,
            quants: whole.m.quants.clone(),
            scales: whole.m.scales.clone(),
        };
        views.push((
            id,
            GpuWeightMatrix {
                rows: r,
                cols,
                parts: vec![MatrixPart {
                    m: view,
                    row0: 0,
                    w_row0: r0,
                }],
            },
        ));
        r0 += r;
        splits.push(r0);
    }
    splits.pop();
    Ok(Some((FusedMatrix { m: whole.m, splits }, views)))
}

/// The RoPE settings of `n_heads` heads of block `l` (`Config::rope_of`).
fn rope_config_of(cfg: &Config, l: usize, n_heads: usize) -> RopeConfig {
    rope_config_with(cfg, cfg.rope_of(l), n_heads)
}

/// The RoPE settings of `n_heads` heads with base and position scale `rope`.
fn rope_config_with(
    cfg: &Config,
    (freq_base, freq_scale): (f32, f32),
    n_heads: usize,
) -> RopeConfig {
    RopeConfig {
        n_heads,
        head_dim: cfg.head_dim,
        n_rot: cfg.n_rot,
        freq_base,
        freq_scale,
        neox: matches!(cfg.rope_kind, crate::config::RopeKind::Neox),
        mscale: cfg.rope_attn_factor,
    }
}
