//! Pipeline cache, weight upload and dispatch encoding for the registry's kernels.
//!
//! Pipelines are compiled once per context ([`Kernels::new`]); each op is prepared once as a
//! [`Dispatch`] (bind group, uniform parameters, workgroup counts) and then only encoded, so
//! nothing is created in a token loop.

pub mod attention;
pub mod matmul;
pub mod moe;
pub mod ops;
pub mod pipelines;
pub mod q8act;

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use wgpu::util::DeviceExt;

use crate::error::{Error, Result};
use crate::gpu::device::GpuContext;
use crate::gpu::health::layouts::{AdapterFacts, RowBalance};
use crate::gpu::kernels::pipelines::compile;
pub use crate::gpu::kernels::pipelines::reflect_bindings;
use crate::gpu::registry::{KernelKey, MatvecParams, RmsNormParams, WeightFormat, QK};
use crate::gpu::repack::PackedMatrix;
use crate::gpu::{health::selftest, health::variants};

/// Workgroup size used for every kernel when the device allows it (`override WG`).
pub const DEFAULT_WORKGROUP_SIZE: u32 = 64;
/// Matrix rows per matvec workgroup (`override ROWS`).
pub const MATVEC_ROWS_PER_WORKGROUP: u32 = 2;

/// Rows per workgroup of the integer matvec (`override ROWS` of `shaders/matrix/reduce.wgsl`
/// and `shaders/matrix/subgroups.wgsl` over the 8-bit body) on `ctx`: with subgroups, as many as the workgroup has
/// subgroups of the adapter's smallest size (the subgroup variant gives each its own rows);
/// else [`MATVEC_ROWS_PER_WORKGROUP`]. Both variants take the same value on one adapter, so
/// either can stand in for the other (`variants::fallbacks`) under the same launch grid.
pub fn matvec_q8_rows_per_group(ctx: &GpuContext, workgroup_size: u32) -> u32 {
    if ctx.has_subgroups() {
        (workgroup_size / ctx.info.subgroup_min_size.max(1)).max(1)
    } else {
        MATVEC_ROWS_PER_WORKGROUP
    }
}

/// A compiled kernel: its pipeline and the explicit layout of its bind group 0.
#[derive(Clone)]
pub struct Pipeline {
    pub pipeline: wgpu::ComputePipeline,
    /// Reflected from the WGSL: storage bindings as declared, the one uniform binding with a
    /// dynamic offset (the backend packs many launches' params into one uniform ring).
    pub layout: wgpu::BindGroupLayout,
}

/// Bytes reserved per launch in a params buffer: every params struct fits, and 256 is a
/// multiple of any adapter's `min_uniform_buffer_offset_alignment` (WebGPU caps it at 256).
pub const PARAMS_SLOT: u64 = 256;
/// Which variants a [`Kernels`] set compiles and launches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct KernelOptions {
    /// The `subgroupAdd` reductions (needs `SUBGROUP`) instead of workgroup memory.
    pub subgroup: bool,
    /// Native-f16 weight decoding (needs `SHADER_F16`) instead of `unpack2x16float`, for the
    /// formats that have it.
    pub f16: bool,
}

impl KernelOptions {
    /// The fastest variants `ctx`'s device has.
    pub fn best(ctx: &GpuContext) -> KernelOptions {
        KernelOptions {
            subgroup: ctx.has_subgroups(),
            f16: ctx.has_f16(),
        }
    }

    /// Whether a set with these options compiles `key` (keys without a choice always).
    pub fn compiles(&self, key: &KernelKey) -> bool {
        (!key.has_reduction_choice() || key.uses_subgroups() == self.subgroup)
            && (!key.has_f16_choice() || key.uses_f16() == self.f16)
    }
}

/// Compiled pipelines for every kernel the context can run.
pub struct Kernels {
    pipelines: HashMap<KernelKey, Pipeline>,
    /// Whether the `subgroupAdd` variants are used.
    pub subgroup: bool,
    /// Whether the native-f16 weight decoding variants are used.
    pub f16: bool,
    /// Workgroup size (a power of two).
    pub workgroup_size: u32,
    /// Most workgroups per dispatch dimension: the device limit. Tests lower it to exercise
    /// the 2-D dispatch that very tall matrices (large vocabularies) need.
    pub max_groups_per_dim: u32,
    /// Rows per workgroup of the integer matvec ([`matvec_q8_rows_per_group`]).
    pub q8_rows_per_group: u32,
    /// Matvec launches use `MatvecRows` (one invocation per row, no barriers) instead of the
    /// workgroup-reduction `Matvec`: chosen for CPU-like adapters (lavapipe runs a 64-wide
    /// workgroup as 8 SIMD passes and pays dearly for every barrier; see
    /// [`AdapterFacts::matvec_rows`]). Tests set it either way.
    pub matvec_rows: bool,
    /// Prefill attention of 64-dim heads uses `AttentionPrefillLanes` (a query per
    /// invocation, keys shared by subgroup broadcasts) instead of the workgroup-memory tiles,
    /// as [`AdapterFacts::attention_lanes`] decides. Only a set that chooses it compiles that
    /// key ([`AdapterFacts::keys`]), so tests may turn it off, never on.
    pub attention_lanes: bool,
    /// How the prefill integer matmul (`MatmulQ8Rows`) spreads rows over workgroups
    /// ([`AdapterFacts::row_balance`]). Tests may change it.
    pub row_balance: RowBalance,
    /// (requested, compiled) for every key compiled from a fallback variant.
    pub substitutions: Vec<(KernelKey, KernelKey)>,
    /// Keys these options choose that have no usable variant (not compiled).
    pub unavailable: Vec<KernelKey>,
    /// Keys left out of the start-up compilation ([`Kernels::with_health_for`]): key -> the
    /// variant to compile, chosen at start-up like the others, compiled on first use.
    deferred: HashMap<KernelKey, KernelKey>,
    /// The deferred keys compiled so far.
    lazy: Mutex<HashMap<KernelKey, Pipeline>>,
}

/// One prepared kernel launch: encode it into any compute pass, as often as needed.
pub struct Dispatch {
    pipeline: wgpu::ComputePipeline,
    bind_group: wgpu::BindGroup,
    /// Workgroups along x and y.
    groups: (u32, u32),
    /// Kept alive for the bind group.
    _params: wgpu::Buffer,
}

impl Dispatch {
    pub fn encode(&self, pass: &mut wgpu::ComputePass<'_>) {
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &self.bind_group, &[0]);
        pass.dispatch_workgroups(self.groups.0, self.groups.1, 1);
    }
}

/// One kernel launch described without creating anything: which pipeline, its uniform
/// parameters, the storage buffers by binding and the workgroup counts. Tests turn it into a
/// [`Dispatch`] with [`Kernels::prepare`]; the GPU backend records it into its uniform ring and
/// cached bind groups, so the same planning code (shapes, checks, grids) serves both.
pub struct Launch<'a> {
    pub key: KernelKey,
    /// The `#[repr(C)]` params struct's bytes (the kernel's one `var<uniform>`).
    pub params: Vec<u8>,
    /// (binding, buffer) for every storage binding.
    pub buffers: Vec<(u32, &'a wgpu::Buffer)>,
    /// Binding number of the uniform params.
    pub uniform_binding: u32,
    /// Workgroups along x and y.
    pub groups: (u32, u32),
}

impl<'a> Launch<'a> {
    pub fn new<P: bytemuck::Pod>(
        key: KernelKey,
        params: &P,
        buffers: &[(u32, &'a wgpu::Buffer)],
        uniform_binding: u32,
        groups: (u32, u32),
    ) -> Launch<'a> {
        Launch {
            key,
            params: bytemuck::bytes_of(params).to_vec(),
            buffers: buffers.to_vec(),
            uniform_binding,
            groups,
        }
    }
}

/// A weight matrix resident on the GPU, in [`PackedMatrix`]'s layout.
#[derive(Clone)]
pub struct GpuMatrix {
    pub ty: WeightFormat,
    pub rows: usize,
    pub cols: usize,
    /// WGSL binding 0.
    pub quants: wgpu::Buffer,
    /// WGSL binding 1 (formats with [`WeightFormat::has_scales`]).
    pub scales: Option<wgpu::Buffer>,
}

pub(crate) fn to_u32(v: usize, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Gpu(format!("{what} = {v} does not fit in u32")))
}

/// Storage buffer from `words` (at least one word: zero-sized bindings are invalid), checked
/// against the device's binding limit.
fn storage_buffer(ctx: &GpuContext, label: &str, bytes: &[u8]) -> Result<wgpu::Buffer> {
    let limit = ctx.limits.max_storage_buffer_binding_size;
    if bytes.len() as u64 > limit {
        // Splitting a tensor across bindings is not implemented yet: say so rather than fail
        // validation later.
        return Err(Error::Gpu(format!(
            "{label}: {} bytes exceeds max_storage_buffer_binding_size {limit}",
            bytes.len()
        )));
    }
    let padded;
    let contents = if bytes.is_empty() {
        padded = [0u8; 4];
        &padded[..]
    } else {
        bytes
    };
    ctx.before_alloc(label)?;
    ctx.scoped(label, || {
        Ok(ctx
            .device
            .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                label: Some(label),
                contents,
                usage: wgpu::BufferUsages::STORAGE
                    | wgpu::BufferUsages::COPY_SRC
                    | wgpu::BufferUsages::COPY_DST
                    | direct_write(ctx),
            }))
    })
}

/// `MAP_WRITE` where the device shares its memory with the host
/// (`MAPPABLE_PRIMARY_BUFFERS`, see `GpuContext::new`): `create_buffer_init` then writes the
/// contents in place instead of through a staging buffer and a queued copy.
fn direct_write(ctx: &GpuContext) -> wgpu::BufferUsages {
    if ctx
        .features
        .contains(wgpu::Features::MAPPABLE_PRIMARY_BUFFERS)
    {
        wgpu::BufferUsages::MAP_WRITE
    } else {
        wgpu::BufferUsages::empty()
    }
}

/// Uploads `data` as an f32 storage buffer (usable as input and output of the kernels).
pub fn upload_f32(ctx: &GpuContext, label: &str, data: &[f32]) -> Result<wgpu::Buffer> {
    storage_buffer(ctx, label, bytemuck::cast_slice(data))
}

/// Uploads `data` as a u32 storage buffer (token ids).
pub fn upload_u32(ctx: &GpuContext, label: &str, data: &[u32]) -> Result<wgpu::Buffer> {
    storage_buffer(ctx, label, bytemuck::cast_slice(data))
}

/// Uploads a repacked matrix.
pub fn upload_matrix(ctx: &GpuContext, m: &PackedMatrix) -> Result<GpuMatrix> {
    let quants = storage_buffer(ctx, "weights.quants", bytemuck::cast_slice(&m.quants))?;
    let scales = if m.ty.has_scales() {
        Some(storage_buffer(
            ctx,
            "weights.scales",
            bytemuck::cast_slice(&m.scales),
        )?)
    } else {
        None
    };
    Ok(GpuMatrix {
        ty: m.ty,
        rows: m.rows,
        cols: m.cols,
        quants,
        scales,
    })
}

/// Runs the copies wgpu has queued for buffers created with contents, and waits for them.
/// Why: `create_buffer_init` of a buffer the host cannot map fills a staging buffer and
/// queues a copy that only runs at the next submit. Without this, a load would keep staging
/// buffers as large as all its weights alive until the first forward pass (twice the
/// weights' memory at the peak), and that pass would pay for every copy.
pub fn flush_uploads(ctx: &GpuContext) -> Result<()> {
    ctx.before_submit()?;
    ctx.scoped("upload", || {
        ctx.queue.submit([]);
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("wait for the weight upload: {e}")))?;
        Ok(())
    })
}

/// Submits the dispatches in one command buffer, in order, and waits for them.
pub fn run(ctx: &GpuContext, dispatches: &[&Dispatch]) -> Result<()> {
    ctx.before_submit()?;
    ctx.scoped("run", || {
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor { label: Some("run") });
        {
            let mut pass = enc.begin_compute_pass(&wgpu::ComputePassDescriptor::default());
            for d in dispatches {
                d.encode(&mut pass);
            }
        }
        ctx.queue.submit([enc.finish()]);
        ctx.device
            .poll(wgpu::PollType::wait_indefinitely())
            .map_err(|e| Error::Gpu(format!("wait for GPU: {e}")))?;
        Ok(())
    })
}

/// Copies the first `n` f32 of `buf` back to the host.
pub fn read_f32(ctx: &GpuContext, buf: &wgpu::Buffer, n: usize) -> Result<Vec<f32>> {
    let bytes = (n as u64).saturating_mul(4);
    if bytes > buf.size() {
        return Err(Error::Gpu(format!(
            "read {n} f32 from a {}-byte buffer",
            buf.size()
        )));
    }
    if n == 0 {
        return Ok(Vec::new());
    }
    ctx.before_submit()?;
    let staging = ctx.scoped("readback", || {
        let staging = ctx.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size: bytes,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = ctx
            .device
            .create_command_encoder(&wgpu::CommandEncoderDescriptor {
                label: Some("readback"),
            });
        enc.copy_buffer_to_buffer(buf, 0, &staging, 0, bytes);
        ctx.queue.submit([enc.finish()]);
        Ok(staging)
    })?;
    let (tx, rx) = std::sync::mpsc::channel();
    staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
        // The receiver outlives the poll below; a send error only means nobody waits.
        let _ = tx.send(r);
    });
    ctx.device
        .poll(wgpu::PollType::wait_indefinitely())
        .map_err(|e| Error::Gpu(format!("wait for readback: {e}")))?;
    rx.recv()
        .map_err(|_| Error::Gpu("readback callback never ran".into()))?
        .map_err(|e| Error::Gpu(format!("map readback buffer: {e}")))?;
    let out = {
        let view = staging
            .slice(..)
            .get_mapped_range()
            .map_err(|e| Error::Gpu(format!("read mapped buffer: {e}")))?;
        bytemuck::cast_slice::<u8, f32>(&view).to_vec()
    };
    staging.unmap();
    Ok(out)
}

/// Workgroup counts (x, y) covering `total` workgroups with at most `max` per dimension; the
/// shaders skip the up to x - 1 surplus workgroups of the last line.
pub fn grid(total: u32, max: u32) -> Result<(u32, u32)> {
    let max = max.max(1);
    let x = total.clamp(1, max);
    let y = total.div_ceil(x).max(1);
    if y > max {
        return Err(Error::Gpu(format!(
            "{total} workgroups exceed a 2-D dispatch of {max} x {max}"
        )));
    }
    Ok((x, y))
}

impl Kernels {
    /// Compiles every kernel variant this context can run: the `subgroupAdd` ones where the
    /// device has `SUBGROUP`, the workgroup-memory ones otherwise, with the u32-packed weight
    /// decoding. The native-f16 decoding ([`KernelOptions::best`]) is opt-in: it rounds
    /// `d * q + m` in f16, which costs Q4_1 about 4e-2 of a matvec's range on real weights,
    /// more than the forward pass may drift from the CPU path.
    pub fn new(ctx: &GpuContext) -> Result<Kernels> {
        Kernels::with_options(ctx, ctx.has_subgroups())
    }

    /// As [`Kernels::new`], choosing the reduction explicitly (`subgroup` needs `SUBGROUP`),
    /// with the portable u32-packed weight decoding.
    pub fn with_options(ctx: &GpuContext, subgroup: bool) -> Result<Kernels> {
        Kernels::with_config(
            ctx,
            KernelOptions {
                subgroup,
                f16: false,
            },
        )
    }

    /// As [`Kernels::new`], choosing every variant explicitly.
    pub fn with_config(ctx: &GpuContext, opts: KernelOptions) -> Result<Kernels> {
        Kernels::with_health(ctx, opts, &HashSet::new())
    }

    /// As [`Kernels::with_config`], never using a variant in `unusable` (one that failed its
    /// selftest on this adapter, or is known bad on its driver): each key `opts` chooses is
    /// compiled from the first usable variant of its [`variants::fallbacks`] chain, under the
    /// key itself, so launch planning stays unaware. A key with no usable variant is not
    /// compiled (launching it is an error): [`Kernels::unavailable`] lists them, and the
    /// caller keeps the stages that need them off this adapter.
    pub fn with_health(
        ctx: &GpuContext,
        opts: KernelOptions,
        unusable: &HashSet<KernelKey>,
    ) -> Result<Kernels> {
        Kernels::with_health_for(ctx, opts, unusable, |_| true)
    }

    /// As [`Kernels::with_health`], compiling at once only the keys `eager` accepts (what the
    /// model uses: its weight formats and KV cache types); the others are compiled on their
    /// first launch. Why: lavapipe has no pipeline cache, and compiling every variant (every
    /// KV type pair's attention, every weight format) was most of a warm start.
    pub fn with_health_for(
        ctx: &GpuContext,
        opts: KernelOptions,
        unusable: &HashSet<KernelKey>,
        eager: impl Fn(&KernelKey) -> bool,
    ) -> Result<Kernels> {
        let KernelOptions { subgroup, f16 } = opts;
        if subgroup && !ctx.has_subgroups() {
            return Err(Error::Gpu(format!(
                "{} has no SUBGROUP feature",
                ctx.info.name
            )));
        }
        attention::check_workgroup_storage(&ctx.limits)?;
        if f16 && !ctx.has_f16() {
            return Err(Error::Gpu(format!(
                "{} has no SHADER_F16 feature",
                ctx.info.name
            )));
        }
        let facts = AdapterFacts::of(ctx);
        let workgroup_size = facts.workgroup_size;
        let mut pipelines = HashMap::new();
        let mut compiled: HashMap<KernelKey, Pipeline> = HashMap::new();
        let mut substitutions = Vec::new();
        let mut unavailable = Vec::new();
        let mut deferred = HashMap::new();
        let usable = |k: &KernelKey| {
            selftest::runnable(ctx, k)
                && !unusable.contains(k)
                && variants::partner(*k).is_none_or(|p| !unusable.contains(&p))
        };
        for key in facts.keys(opts) {
            let Some(actual) = variants::fallbacks(key).into_iter().find(|k| usable(k)) else {
                unavailable.push(key);
                continue;
            };
            if actual != key {
                substitutions.push((key, actual));
            }
            if !eager(&key) {
                deferred.insert(key, actual);
                continue;
            }
            let pipeline = match compiled.get(&actual) {
                Some(p) => p.clone(),
                None => {
                    let p = compile(ctx, actual, workgroup_size)?;
                    compiled.insert(actual, p.clone());
                    p
                }
            };
            pipelines.insert(key, pipeline);
        }
        Ok(Kernels {
            pipelines,
            subgroup,
            f16,
            workgroup_size,
            max_groups_per_dim: ctx.limits.max_compute_workgroups_per_dimension,
            q8_rows_per_group: matvec_q8_rows_per_group(ctx, workgroup_size),
            matvec_rows: facts.matvec_rows(),
            attention_lanes: facts.attention_lanes(subgroup),
            row_balance: facts.row_balance(),
            substitutions,
            unavailable,
            deferred,
            lazy: Mutex::new(HashMap::new()),
        })
    }

    /// The compiled kernel for `key`, compiling a deferred one now (an error if this context
    /// has no usable variant of it).
    pub fn pipeline(&self, ctx: &GpuContext, key: KernelKey) -> Result<Pipeline> {
        if let Some(p) = self.pipelines.get(&key) {
            return Ok(p.clone());
        }
        let Some(&actual) = self.deferred.get(&key) else {
            return Err(Error::Gpu(format!("kernel {} not compiled", key.label())));
        };
        let mut lazy = self
            .lazy
            .lock()
            .map_err(|_| Error::Gpu("kernel cache lock poisoned".into()))?;
        if let Some(p) = lazy.get(&key) {
            return Ok(p.clone());
        }
        let p = compile(ctx, actual, self.workgroup_size)?;
        lazy.insert(key, p.clone());
        Ok(p)
    }

    /// Keys compiled at start-up (the deferred ones are compiled on first use).
    pub fn n_compiled_at_start(&self) -> usize {
        self.pipelines.len()
    }

    /// Creates the bind group and params buffer of `launch` (test and one-off use; the
    /// backend's token loop never calls this).
    pub fn prepare(&self, ctx: &GpuContext, launch: Launch<'_>) -> Result<Dispatch> {
        let Launch {
            key,
            params,
            buffers,
            uniform_binding,
            groups,
        } = launch;
        let params = &params[..];
        let Pipeline { pipeline, layout } = self.pipeline(ctx, key)?;
        let label = key.label();
        ctx.scoped(&format!("prepare {label}"), || {
            let params_buf = ctx
                .device
                .create_buffer_init(&wgpu::util::BufferInitDescriptor {
                    label: Some(&label),
                    contents: params,
                    usage: wgpu::BufferUsages::UNIFORM,
                });
            let mut entries: Vec<wgpu::BindGroupEntry<'_>> = buffers
                .iter()
                .map(|&(binding, b)| wgpu::BindGroupEntry {
                    binding,
                    resource: b.as_entire_binding(),
                })
                .collect();
            entries.push(wgpu::BindGroupEntry {
                binding: uniform_binding,
                resource: params_buf.as_entire_binding(),
            });
            let bind_group = ctx.device.create_bind_group(&wgpu::BindGroupDescriptor {
                label: Some(&label),
                layout: &layout,
                entries: &entries,
            });
            Ok(Dispatch {
                pipeline,
                bind_group,
                groups,
                _params: params_buf,
            })
        })
    }

    /// Prepares `y = W x`: `x` holds at least `[cols]` f32, `y` at least `[rows]` f32.
    pub fn matvec(
        &self,
        ctx: &GpuContext,
        w: &GpuMatrix,
        x: &wgpu::Buffer,
        y: &wgpu::Buffer,
    ) -> Result<Dispatch> {
        self.prepare(ctx, self.matvec_launch(w, x, y)?)
    }

    /// The launch of [`Kernels::matvec`].
    pub fn matvec_launch<'a>(
        &self,
        w: &'a GpuMatrix,
        x: &'a wgpu::Buffer,
        y: &'a wgpu::Buffer,
    ) -> Result<Launch<'a>> {
        self.matvec_batch_launch(w, x, y, 1, w.rows, 0)
    }

    /// Batched matvec: `y[t][row_offset + r] = W[r] · x[t]` for `t < n_tokens`, with `x`
    /// `[n_tokens, cols]` and `y` `[n_tokens, y_stride]` f32. Rows outside
    /// `row_offset..row_offset + rows` of y are not touched (the other parts of a matrix split
    /// by rows write them).
    pub fn matvec_batch_launch<'a>(
        &self,
        w: &'a GpuMatrix,
        x: &'a wgpu::Buffer,
        y: &'a wgpu::Buffer,
        n_tokens: usize,
        y_stride: usize,
        row_offset: usize,
    ) -> Result<Launch<'a>> {
        let x_need = (n_tokens as u64).saturating_mul(w.cols as u64);
        let y_need = (n_tokens as u64).saturating_mul(y_stride as u64);
        if n_tokens == 0
            || row_offset.saturating_add(w.rows) > y_stride
            || x.size() < x_need.saturating_mul(4)
            || y.size() < y_need.saturating_mul(4)
        {
            return Err(Error::Gpu(format!(
                "matvec [{}, {}] x {n_tokens} tokens into rows {row_offset}.. of a stride \
                 {y_stride}: x is {} bytes, y {} bytes",
                w.rows,
                w.cols,
                x.size(),
                y.size()
            )));
        }
        let rows = to_u32(w.rows, "rows")?;
        let cols = to_u32(w.cols, "cols")?;
        let per_group = if self.matvec_rows {
            self.workgroup_size
        } else {
            MATVEC_ROWS_PER_WORKGROUP
        };
        let row_groups = rows.div_ceil(per_group).max(1);
        let total = row_groups
            .checked_mul(to_u32(n_tokens, "n_tokens")?)
            .ok_or_else(|| Error::Gpu("matvec: too many workgroups".into()))?;
        let groups = grid(total, self.max_groups_per_dim)?;
        let params = MatvecParams {
            rows,
            cols,
            blocks_per_row: cols.div_ceil(QK),
            groups_x: groups.0,
            n_tokens: to_u32(n_tokens, "n_tokens")?,
            y_stride: to_u32(y_stride, "y_stride")?,
            row_offset: to_u32(row_offset, "row_offset")?,
            row_groups,
        };
        let key = if self.matvec_rows {
            KernelKey::MatvecRows { ty: w.ty }
        } else {
            KernelKey::Matvec {
                ty: w.ty,
                subgroup: self.subgroup,
                f16: self.f16 && w.ty.has_f16_variant(),
            }
        };
        let mut bufs = vec![(0, &w.quants)];
        if let Some(s) = &w.scales {
            bufs.push((1, s));
        }
        bufs.push((2, x));
        bufs.push((3, y));
        Ok(Launch::new(key, &params, &bufs, 4, groups))
    }

    /// Prepares RMS normalization of `n_rows` rows of `n` f32: `x` and `out` hold
    /// `[n_rows, n]`, `weight` holds `[n]`.
    #[allow(clippy::too_many_arguments)]
    pub fn rms_norm(
        &self,
        ctx: &GpuContext,
        x: &wgpu::Buffer,
        weight: &wgpu::Buffer,
        out: &wgpu::Buffer,
        n: usize,
        n_rows: usize,
        eps: f32,
    ) -> Result<Dispatch> {
        self.prepare(ctx, self.rms_norm_launch(x, weight, out, n, n_rows, eps)?)
    }

    /// The launch of [`Kernels::rms_norm`].
    pub fn rms_norm_launch<'a>(
        &self,
        x: &'a wgpu::Buffer,
        weight: &'a wgpu::Buffer,
        out: &'a wgpu::Buffer,
        n: usize,
        n_rows: usize,
        eps: f32,
    ) -> Result<Launch<'a>> {
        let need = (n as u64) * (n_rows as u64) * 4;
        if x.size() < need || out.size() < need || weight.size() < (n as u64) * 4 {
            return Err(Error::Gpu(format!(
                "rms_norm [{n_rows}, {n}]: buffers too small"
            )));
        }
        let groups = grid(to_u32(n_rows, "n_rows")?, self.max_groups_per_dim)?;
        let params = RmsNormParams {
            n: to_u32(n, "n")?,
            n_rows: to_u32(n_rows, "n_rows")?,
            eps,
            groups_x: groups.0,
        };
        let key = KernelKey::RmsNorm {
            subgroup: self.subgroup,
        };
        let bufs = [(0, x), (1, weight), (2, out)];
        Ok(Launch::new(key, &params, &bufs, 3, groups))
    }
}

#[cfg(test)]
mod tests {
    use super::grid;

    #[test]
    fn grid_covers_every_workgroup_within_the_limit() {
        for max in [1u32, 2, 7, 65535] {
            for total in [0u32, 1, 2, 6, 7, 8, 48, 49, 50] {
                match grid(total, max) {
                    Ok((x, y)) => {
                        assert!(x <= max && y <= max && x >= 1 && y >= 1);
                        assert!(u64::from(x) * u64::from(y) >= u64::from(total));
                        // No whole line of idle workgroups.
                        assert!(u64::from(x) * u64::from(y - 1) < u64::from(total.max(1)));
                    }
                    Err(_) => assert!(u64::from(total) > u64::from(max) * u64::from(max)),
                }
            }
        }
    }
}
